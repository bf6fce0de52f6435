"""Survivor selection: the common contract for every registered selection, then each one's semantics."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from populora.errors import FitnessError, InvalidTypeError, InvalidValueError
from populora.operators import SELECTIONS, fuss_weights, zscore
from populora.operators.selection import deterministic, fuss, probabilistic


def gen(seed):
    return torch.Generator().manual_seed(seed)


class TestContract:
    @pytest.mark.parametrize("num", [0, 1, 4, 7])
    @pytest.mark.parametrize("fdtype", [torch.float32, torch.float64])
    def test_shape_range_distinct(self, selection_name, num, fdtype):
        """(g, m) -> (g, num) int64 local indices in [0, m), distinct per row."""
        f = torch.randn(3, 7, generator=gen(0), dtype=fdtype)
        out = SELECTIONS[selection_name](f, num, generator=gen(1))
        assert out.shape == (3, num) and out.dtype == torch.int64
        assert ((out >= 0) & (out < 7)).all()
        for row in out:
            assert len(set(row.tolist())) == num

    def test_global_rng_untouched(self, selection_name):
        state = torch.get_rng_state()
        SELECTIONS[selection_name](torch.randn(3, 9, generator=gen(0)), 4, generator=gen(1))
        assert torch.equal(torch.get_rng_state(), state)

    def test_pure(self, selection_name):
        f = torch.randn(2, 9, generator=gen(0))
        before = f.clone()
        SELECTIONS[selection_name](f, 4, generator=gen(1))
        assert torch.equal(f, before)

    def test_seeded(self, selection_name):
        """Same seed, bitwise same; a different seed, a different draw (unless deterministic)."""
        f = torch.randn(4, 20, generator=gen(0))
        fn = SELECTIONS[selection_name]
        a, b = fn(f, 6, generator=gen(5)), fn(f, 6, generator=gen(5))
        assert torch.equal(a, b)
        if selection_name != "deterministic":
            assert not torch.equal(a, fn(f, 6, generator=gen(6)))

    def test_nan_raises(self, selection_name):
        f = torch.tensor([[0.0, float("nan"), 1.0]])
        with pytest.raises(FitnessError, match="NaN"):
            SELECTIONS[selection_name](f, 1, generator=gen(0))

    def test_minus_inf_counts_as_worst(self, selection_name):
        """-inf (a NaN mapped to worst upstream) never breaks sampling and weighs no more than the worst."""
        f = torch.tensor([[1.0, -float("inf"), 2.0, 3.0]]).expand(2000, 4)
        out = SELECTIONS[selection_name](f, 3, generator=gen(0))
        assert ((out >= 0) & (out < 4)).all()
        assert (out.sort(-1).values.diff(dim=-1) > 0).all()  # distinct
        picked = torch.bincount(out.flatten(), minlength=4)
        assert picked[1] <= picked[0] + 100 and picked[1] < picked[3]
        if selection_name == "deterministic":
            assert picked[1] == 0

    @pytest.mark.parametrize(
        "num, error",
        [(-1, InvalidValueError), (5, InvalidValueError), (1.5, InvalidTypeError), ("2", InvalidTypeError)],
    )
    def test_bad_num(self, selection_name, num, error):
        with pytest.raises(error, match=r"`num` must be an int"):
            SELECTIONS[selection_name](torch.zeros(1, 4), num, generator=gen(0))

    def test_numpy_num_and_options(self, selection_name):
        f = torch.randn(2, 6, generator=gen(0))
        fn = SELECTIONS[selection_name]
        options = {"temperature": np.float32(0.5)} if selection_name == "probabilistic" else {}
        plain = {"temperature": 0.5} if selection_name == "probabilistic" else {}
        assert torch.equal(fn(f, np.int64(3), generator=gen(1), **options), fn(f, 3, generator=gen(1), **plain))

    def test_bad_shape(self, selection_name):
        with pytest.raises(InvalidValueError, match=r"\(groups, m\).*\(4,\)"):
            SELECTIONS[selection_name](torch.zeros(4), 1, generator=gen(0))

    @pytest.mark.parametrize("fitnesses, named", [([[1.0, 2.0]], "list"), ("ab", "str")])
    def test_non_tensor_fitnesses(self, selection_name, fitnesses, named):
        with pytest.raises(FitnessError, match=rf"`fitnesses` must be a torch.Tensor of real numbers, got {named}"):
            SELECTIONS[selection_name](fitnesses, 1, generator=gen(0))


def test_deterministic_keeps_exactly_the_top():
    f = torch.randn(5, 30, generator=gen(3))
    out = deterministic(f, 8, generator=gen(0))
    assert torch.equal(out, f.topk(8, dim=-1).indices)  # fittest first


def test_deterministic_ties_go_to_lower_index():
    out = deterministic(torch.tensor([[1.0, 2.0, 2.0, 2.0]]), 2, generator=gen(0))
    assert out.tolist() == [[1, 2]]


def frequencies(out: torch.Tensor, m: int) -> torch.Tensor:
    return torch.bincount(out.flatten(), minlength=m).double() / out.numel()


def test_probabilistic_frequencies_follow_softmax_of_zscore():
    """One draw per row over 20000 identical rows: frequencies ~ softmax(z / T)."""
    f = torch.tensor([0.0, 1.0, 2.0, 10.0])
    rows = f.expand(20000, 4)
    for temperature in (0.5, 1.0, 4.0):
        freq = frequencies(probabilistic(rows, 1, generator=gen(0), temperature=temperature), 4)
        expected = torch.softmax(zscore(f).double() / temperature, -1)
        assert torch.allclose(freq, expected, atol=0.015), (temperature, freq, expected)


def test_probabilistic_scale_invariant():
    """Z-scoring: multiplying the fitness by 1000 changes nothing."""
    f = torch.randn(3, 10, generator=gen(0))
    assert torch.equal(probabilistic(f, 4, generator=gen(1)), probabilistic(1000 * f, 4, generator=gen(1)))


def test_probabilistic_without_replacement_pair_probabilities():
    """Two of three: P({i, j}) = w_i w_j / (1 - w_i) + w_j w_i / (1 - w_j)."""
    f = torch.tensor([0.0, 1.0, 3.0])
    w = torch.softmax(zscore(f).double(), -1)
    out = probabilistic(f.expand(20000, 3), 2, generator=gen(0))
    missing = 3 - out.sum(-1)  # the index not chosen
    freq = torch.bincount(missing, minlength=3).double() / 20000
    expected = torch.stack([w[j] * w[k] / (1 - w[j]) + w[k] * w[j] / (1 - w[k]) for j, k in ((1, 2), (0, 2), (0, 1))])
    assert torch.allclose(freq, expected, atol=0.015)


def test_probabilistic_bad_temperature():
    with pytest.raises(ValueError, match="`temperature` must be > 0, got 0"):
        probabilistic(torch.zeros(1, 3), 1, generator=gen(0), temperature=0)


def test_fuss_frequencies_follow_cell_widths():
    f = torch.tensor([0.0, 0.1, 0.2, 5.0, 9.0])
    freq = frequencies(fuss(f.expand(20000, 5), 1, generator=gen(0)), 5)
    assert torch.allclose(freq, fuss_weights(f).double(), atol=0.015)
    assert freq[3] > freq[1]  # the isolated level beats the crowded one


class TestSelectSurvivors:
    """The population-level maths: islands, elites and the map back to population ids."""

    def test_group_sizes(self):
        from populora.operators import group_sizes

        assert group_sizes(16, 0.5, 0.1, 2) == (8, 4, 1)
        assert group_sizes(10, 0.3, 0.0, 1) == (10, 3, 0)
        with pytest.raises(InvalidValueError, match="`num_groups` must be an int >= 1 dividing pop_size=10, got 3"):
            group_sizes(10, 0.5, 0.1, 3)
        with pytest.raises(InvalidValueError, match="keeps all 1 individuals of each group"):
            group_sizes(4, 0.5, 0.0, 4)
        with pytest.raises(InvalidValueError, match="elites must survive"):
            group_sizes(10, 0.2, 0.5, 1)

    def test_elites_islands_and_ids(self):
        from populora.operators import select_survivors

        f = torch.tensor([0.0, 5.0, 1.0, 4.0, 9.0, 2.0, 8.0, 3.0], dtype=torch.float64)
        res = select_survivors(f, deterministic, 0.5, 0.25, 2, generator=gen(0))
        assert res.elite_indices.tolist() == [1, 4]
        assert res.selected_in_indices.tolist() == [1, 3, 4, 6]
        assert res.selected_out_indices.tolist() == [0, 2, 5, 7]

    def test_trusts_its_input_and_matches_the_operator(self):
        """The selection runs on the rest of each island, the draw of the operator itself."""
        from populora.operators import select_survivors

        f = torch.arange(12.0).flip(0)
        res = select_survivors(f, probabilistic, 0.5, 1 / 6, 2, generator=gen(3))
        rest = torch.tensor([[1, 2, 3, 4, 5], [7, 8, 9, 10, 11]])  # elites 0 and 6 are the island bests
        picked = probabilistic(f[rest], 2, generator=gen(3))
        assert res.selected_in_indices.view(2, 3)[:, 1:].tolist() == rest.gather(1, picked).tolist()
