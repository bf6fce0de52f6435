"""Parent selection: the common contract for every registered one, then each one's semantics."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from populora.errors import FitnessError, InvalidTypeError, InvalidValueError
from populora.operators import PARENT_SELECTIONS, fuss_weights, zscore
from populora.operators.parents import fuss, queen_bee, roulette, tournament


def gen(seed):
    return torch.Generator().manual_seed(seed)


class TestContract:
    @pytest.mark.parametrize("s", [1, 2, 6])
    @pytest.mark.parametrize("k", [1, 2, 3])
    def test_shape_and_range(self, parent_selection_name, s, k):
        """(g, s) -> (g, c, k) int64 local indices in [0, s)."""
        f = torch.randn(3, s, generator=gen(0))
        out = PARENT_SELECTIONS[parent_selection_name](f, 5, k, generator=gen(1))
        assert out.shape == (3, 5, k) and out.dtype == torch.int64
        assert ((out >= 0) & (out < s)).all()

    def test_no_children(self, parent_selection_name):
        out = PARENT_SELECTIONS[parent_selection_name](torch.randn(2, 4), 0, 2, generator=gen(0))
        assert out.shape == (2, 0, 2)

    def test_global_rng_untouched(self, parent_selection_name):
        state = torch.get_rng_state()
        PARENT_SELECTIONS[parent_selection_name](torch.randn(3, 9, generator=gen(0)), 4, 2, generator=gen(1))
        assert torch.equal(torch.get_rng_state(), state)

    def test_pure(self, parent_selection_name):
        f = torch.randn(2, 9, generator=gen(0))
        before = f.clone()
        PARENT_SELECTIONS[parent_selection_name](f, 4, 2, generator=gen(1))
        assert torch.equal(f, before)

    def test_seeded(self, parent_selection_name):
        f = torch.randn(2, 12, generator=gen(0))
        fn = PARENT_SELECTIONS[parent_selection_name]
        a = fn(f, 10, 2, generator=gen(5))
        assert torch.equal(a, fn(f, 10, 2, generator=gen(5)))
        assert not torch.equal(a, fn(f, 10, 2, generator=gen(6)))

    def test_nan_raises(self, parent_selection_name):
        with pytest.raises(FitnessError, match="NaN"):
            PARENT_SELECTIONS[parent_selection_name](torch.tensor([[float("nan"), 1.0]]), 1, 2, generator=gen(0))

    def test_bad_counts(self, parent_selection_name):
        fn = PARENT_SELECTIONS[parent_selection_name]
        with pytest.raises(InvalidValueError, match="`num_parents` must be an int >= 1, got 0"):
            fn(torch.zeros(1, 3), 2, 0, generator=gen(0))
        with pytest.raises(InvalidTypeError, match="`num_children` must be an int, got float 2.0"):
            fn(torch.zeros(1, 3), 2.0, 2, generator=gen(0))
        with pytest.raises(InvalidValueError, match=r"\(groups, s\) with s >= 1"):
            fn(torch.zeros(1, 0), 2, 2, generator=gen(0))

    def test_numpy_counts(self, parent_selection_name):
        fn = PARENT_SELECTIONS[parent_selection_name]
        f = torch.randn(2, 6, generator=gen(0))
        assert torch.equal(fn(f, np.int64(4), np.int32(2), generator=gen(1)), fn(f, 4, 2, generator=gen(1)))


def test_tournament_covering_everyone_returns_the_best_first():
    """With tournament_size >= s every contender fights: parents are the global top-k, fittest first."""
    f = torch.randn(4, 7, generator=gen(0))
    out = tournament(f, 6, 3, generator=gen(1), tournament_size=50)
    top = f.topk(3, dim=-1).indices.unsqueeze(1).expand(4, 6, 3)
    assert torch.equal(out, top)


def test_tournament_parents_are_ordered_and_distinct():
    f = torch.randn(1, 10, generator=gen(0))
    out = tournament(f, 500, 3, generator=gen(1), tournament_size=4)
    fit = f[0][out[0]]  # (c, k)
    assert (fit[:, :-1] >= fit[:, 1:]).all()
    assert (out[0].sort(-1).values.diff(dim=-1) > 0).all()


def test_tournament_winner_repeats_when_too_few_contenders():
    f = torch.randn(2, 5, generator=gen(0))
    out = tournament(f, 100, 3, generator=gen(1), tournament_size=1)
    assert (out == out[..., :1]).all()
    assert len(out[0, :, 0].unique()) > 1  # size 1: uniform, not always the best


def test_tournament_selection_pressure():
    """P(the best is parent 0) = size / s for one tournament of distinct contenders."""
    f = torch.arange(10.0).unsqueeze(0)
    out = tournament(f, 20000, 1, generator=gen(0), tournament_size=3)
    assert abs((out == 9).double().mean().item() - 0.3) < 0.015
    assert (out == 0).sum() == 0  # the worst can never win a 3-way tournament


def test_roulette_frequencies_follow_softmax_of_zscore():
    f = torch.tensor([[0.0, 1.0, 2.0, 5.0]])
    out = roulette(f, 10000, 2, generator=gen(0), temperature=0.7)
    freq = torch.bincount(out.flatten(), minlength=4).double() / out.numel()
    assert torch.allclose(freq, torch.softmax(zscore(f[0]).double() / 0.7, -1), atol=0.015)
    assert (out[0, :, 0] == out[0, :, 1]).any()  # with replacement


def test_fuss_frequencies_follow_cell_widths():
    f = torch.tensor([[0.0, 0.1, 0.2, 5.0, 9.0]])
    out = fuss(f, 20000, 1, generator=gen(0))
    freq = torch.bincount(out.flatten(), minlength=5).double() / out.numel()
    assert torch.allclose(freq, fuss_weights(f[0]).double(), atol=0.015)


def test_queen_bee_first_parent_is_the_best_and_not_repeated():
    f = torch.randn(3, 8, generator=gen(0))
    out = queen_bee(f, 200, 3, generator=gen(1))
    best = f.argmax(-1)
    assert (out[..., 0] == best[:, None]).all()
    assert (out[..., 1:] != best[:, None, None]).all()
    others = f.gather(1, out[..., 1:].flatten(1)).view(3, 200, 2)
    assert (others[..., 0] >= others[..., 1]).all()  # the others come from a tournament


def test_queen_bee_single_survivor_and_single_parent():
    assert (queen_bee(torch.zeros(2, 1), 4, 3, generator=gen(0)) == 0).all()
    out = queen_bee(torch.tensor([[0.0, 3.0, 1.0]]), 4, 1, generator=gen(0))
    assert out.shape == (1, 4, 1) and (out == 1).all()


def test_bad_tournament_size():
    with pytest.raises(ValueError, match="`tournament_size` must be an int >= 1, got 0"):
        tournament(torch.zeros(1, 3), 2, 2, generator=gen(0), tournament_size=0)


class TestParentsForSlots:
    """Parent ids for culled slots, island by island."""

    def test_single_group_maps_back_to_survivor_ids(self):
        from populora.operators import parents_for_slots

        f = torch.tensor([0.0, 3.0, 1.0, 2.0])
        ids = parents_for_slots(f, tournament, torch.tensor([0, 2]), 3, 2, generator=gen(0), tournament_size=2)
        assert ids.shape == (3, 2) and set(ids.flatten().tolist()) <= {1, 3}
        local = tournament(torch.tensor([[3.0, 2.0]]), 3, 2, generator=gen(0), tournament_size=2)[0]
        assert ids.tolist() == torch.tensor([1, 3])[local].tolist()

    def test_islands_keep_children_home(self):
        from populora.operators import parents_for_slots

        f = torch.arange(8.0)
        culled = torch.tensor([5, 0, 6, 1])
        ids = parents_for_slots(f, roulette, culled, 4, 3, 2, generator=gen(1))
        island = (culled // 4)[:, None]
        assert (ids // 4 == island).all() and not torch.isin(ids, culled).any()

    def test_errors(self):
        from populora.operators import parents_for_slots

        f = torch.arange(4.0)
        with pytest.raises(InvalidValueError, match="covers a whole island"):
            parents_for_slots(f, tournament, torch.tensor([0, 1]), 2, 2, 2, generator=gen(0))
        with pytest.raises(InvalidValueError, match="every island needs the same number of survivors"):
            parents_for_slots(f, tournament, torch.tensor([0]), 1, 2, 2, generator=gen(0))
        with pytest.raises(InvalidValueError, match=r"`num_children` must equal len\(culled\)=2, got 3"):
            parents_for_slots(f, tournament, torch.tensor([0, 2]), 3, 2, 2, generator=gen(0))
        with pytest.raises(InvalidValueError, match="dividing pop_size=4, got 3"):
            parents_for_slots(f, tournament, torch.tensor([0]), 1, 2, 3, generator=gen(0))
