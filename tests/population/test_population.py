"""Population construction, fitness hygiene, merge, save / load."""

import copy
from pathlib import Path

import pytest
import torch
from models import mlp
from torch import nn

from populora import Population
from populora.checkpoint import load_checkpoint
from populora.errors import FitnessError, InvalidIndexError, InvalidTypeError, PopuloraError, SpentPopulationError


def make(**kwargs):
    torch.manual_seed(0)
    model = mlp()
    kwargs = {"pop_size": 8, "low_rank": 2, **kwargs}
    return Population(model, **kwargs), model


class TestConstruction:
    def test_wraps_in_place_and_freezes(self):
        model = mlp()
        model[2].bias.requires_grad_(False)
        pop = Population(model, pop_size=4, low_rank=2)
        assert pop.model is model
        assert not any(p.requires_grad for p in model.parameters())
        assert pop.pop_size == 4 and pop.low_rank == 2
        assert [tuple(f.down.shape) for f in pop.factors()] == [(4, 6, 2), (4, 16, 2)]
        assert [tuple(f.up.shape) for f in pop.factors()] == [(4, 16, 2), (4, 3, 2)]

    def test_seeded_and_no_global_rng(self):
        model, other = mlp(), mlp()
        twins = [copy.deepcopy(model) for _ in range(2)]
        state = torch.get_rng_state()
        a = Population(model, pop_size=8, low_rank=2, seed=3)
        Population(other, pop_size=8, low_rank=2).evolve_(torch.arange(8.0))
        assert torch.equal(torch.get_rng_state(), state)
        b = Population(twins[0], pop_size=8, low_rank=2, seed=3)
        c = Population(twins[1], pop_size=8, low_rank=2, seed=4)
        assert all(torch.equal(x.down, y.down) and torch.equal(x.up, y.up) for x, y in zip(a.factors(), b.factors()))
        assert not torch.equal(a.factors()[0].down, c.factors()[0].down)

    def test_individuals_differ_but_stay_close(self):
        pop, model = make(init_scale=0.1, pop_size=64)
        x = torch.randn(256, 6)
        with torch.no_grad():
            h = model[0](x)
            outs = pop.model[0](x)
            deltas = torch.stack([pop.delta_weight(i)["0"] for i in range(64)])  # (p, e, d)
            rel = (x @ deltas.transpose(1, 2)).pow(2).mean((1, 2)).sqrt() / (h - model[0].bias).pow(2).mean().sqrt()
        assert torch.equal(outs, h)
        assert 0.05 < rel.mean().item() < 0.2  # init_scale is the expected relative change
        assert rel.std() > 0  # individuals differ

    def test_init_scale_zero_is_exactly_base(self):
        """Bitwise, but only between identical computations: the routed forward runs the model on the
        expanded batch, so the base model is run on that same batch (same shape, same layout).
        A 1-row base forward expanded afterwards may differ in the last bit (BLAS picks kernels by shape)."""
        pop, model = make(init_scale=0.0)
        base = copy.deepcopy(model)
        x = torch.randn(5, 6)
        with torch.no_grad():
            assert torch.equal(pop(x[:1], all_individuals=True), base(x[:1].repeat(8, 1)))  # (8, 3)
            assert torch.equal(pop(x, all_individuals=True, broadcast=True), base(x.repeat(8, 1)))  # (40, 3), (p b)
            assert torch.equal(pop(x, individual=3), base(x))

    def test_effective_rank(self):
        pop = Population(nn.Sequential(nn.Linear(32, 2)), pop_size=4, low_rank=16)
        assert pop.effective_ranks == [2] and pop.factors()[0].down.shape == (4, 32, 2)
        down, up = pop._full_factors()[0]  # (4, 32, 16), (4, 2, 16): surplus columns are zero
        assert torch.count_nonzero(down[..., 2:]) == 0 and torch.count_nonzero(up[..., 2:]) == 0
        pop.evolve_(torch.arange(4.0), mutation_type="full_gaussian")
        assert torch.count_nonzero(down[..., 2:]) == 0 and torch.count_nonzero(up[..., 2:]) == 0

    @pytest.mark.parametrize(
        "kwargs, message",
        [
            ({"pop_size": 0}, r"`pop_size` must be an int >= 1, got 0"),  # pop_size=1 is a single LoRA
            ({"pop_size": 4.0}, r"`pop_size` must be an int, got float 4.0"),
            ({"low_rank": 0}, r"`low_rank` must be an int >= 1, got 0"),
            ({"init_scale": -1.0}, r"`init_scale` must be a finite number >= 0.0, got -1.0"),
            ({"nan_policy": "ignore"}, r"`nan_policy` must be one of \['raise', 'worst'\], got 'ignore'"),
        ],
    )
    def test_bad_arguments(self, kwargs, message):
        with pytest.raises((ValueError, TypeError), match=message) as caught:
            make(**kwargs)
        assert isinstance(caught.value, PopuloraError)


class TestFitness:
    def test_converts_lists_and_numpy(self):
        import numpy as np

        pop, _ = make()
        assert pop.validate_fitnesses(list(range(8))).is_floating_point()  # the dtype rules: see test_fitness.py
        assert pop.validate_fitnesses(np.arange(8.0)).tolist() == list(range(8))

    def test_wrong_shape_names_both(self):
        pop, _ = make()
        with pytest.raises(FitnessError, match=r"must have shape \(8,\), got \(4,\)"):
            pop.validate_fitnesses(torch.zeros(4))
        with pytest.raises(FitnessError, match=r"must have shape \(8,\), got \(8, 1\)"):
            pop.validate_fitnesses(torch.zeros(8, 1))

    def test_nan_raises_by_default(self):
        pop, _ = make()
        f = torch.arange(8.0)
        f[3] = float("nan")
        with pytest.raises(FitnessError, match=r"must be finite, got \[nan\] at ids \[3\]; pass nan_policy='worst'"):
            pop.evolve_(f)
        assert pop.generation == 0

    def test_nan_worst_never_elite(self):
        """NaN fitness under nan_policy='worst' becomes the lowest and is culled, never an elite."""
        pop, _ = make(nan_policy="worst")
        f = torch.arange(8.0)
        f[7] = float("nan")  # would be the best if it counted
        checked = pop.validate_fitnesses(f)
        assert checked[7] < checked[:7].min()
        result = pop.select(fitnesses=f, elite_frac=0.25)
        assert 7 in result.selected_out_indices.tolist() and 7 not in result.elite_indices.tolist()

    def test_inf_always_raises(self):
        pop, _ = make(nan_policy="worst")
        with pytest.raises(FitnessError, match=r"must be finite, got \[inf\] at ids \[0\]"):
            pop.validate_fitnesses(torch.tensor([float("inf")] + [0.0] * 7))


class TestMerge:
    def test_merge_equals_routed_individual_and_restores_flags(self):
        pop, model = make(init_scale=0.5)
        model[0].bias.requires_grad_(True)  # frozen by the population anyway
        x = torch.randn(5, 6)
        with torch.no_grad():
            expected = pop(x, individual=5)
        fitnesses = torch.zeros(8)
        fitnesses[5] = 1.0
        merged = pop.select_and_merge_best_(fitnesses)
        assert merged is model
        torch.testing.assert_close(merged(x), expected, rtol=1e-5, atol=1e-6)
        assert all(p.requires_grad for p in model.parameters())  # mlp() params all required grad before
        assert "forward" not in vars(model[0]) and "forward" not in vars(model[2])  # class forward back

    def test_spent_population_refuses(self):
        pop, _ = make()
        pop.merge_(0)
        with pytest.raises(SpentPopulationError, match="merged into its model"):
            pop(torch.randn(1, 6), all_individuals=True)
        with pytest.raises(SpentPopulationError):
            pop.evolve_(torch.zeros(8))

    def test_merge_bad_id(self):
        pop, model = make()
        with pytest.raises(InvalidIndexError, match=r"`individual` must be an id in \[0, 8\), got 8"):
            pop.merge_(8)
        assert "forward" in vars(model[0])  # nothing happened: still wrapped, still usable
        pop(torch.randn(1, 6), individual=7)


class TestCheckpoint:
    def run(self, pop, generations, seed=0):
        gen = torch.Generator().manual_seed(seed)
        for _ in range(generations):
            pop.evolve_(
                torch.randn(pop.pop_size, generator=gen), crossover_type="average", mutation_type="full_gaussian"
            )

    def test_save_load_continue_is_bitwise(self, tmp_path):
        a, _ = make(seed=1)
        fitness_stream = [torch.randn(8, generator=torch.Generator().manual_seed(s)) for s in range(6)]
        for f in fitness_stream[:3]:
            a.evolve_(f)
        a.save(tmp_path / "pop.pt")
        for f in fitness_stream[3:]:
            a.evolve_(f)

        torch.manual_seed(0)
        b = Population.from_checkpoint(tmp_path / "pop.pt", mlp())
        assert b.generation == 3 and b.eval_seed == 1 + 3
        for f in fitness_stream[3:]:
            b.evolve_(f)
        assert all(torch.equal(x.down, y.down) and torch.equal(x.up, y.up) for x, y in zip(a.factors(), b.factors()))
        assert torch.equal(a.generator.get_state(), b.generator.get_state())

    def test_atomic_no_temp_left_and_loadable_weights_only(self, tmp_path):
        pop, _ = make()
        written = pop.save(tmp_path / "ckpt" / "pop.pt")
        assert written == tmp_path / "ckpt" / "pop.pt" and isinstance(written, Path)
        assert [p.name for p in (tmp_path / "ckpt").iterdir()] == ["pop.pt"]
        state = load_checkpoint(written, kind="Population")  # the payload is read with weights_only=True
        assert state["_extra_state"]["config"]["pop_size"] == 8

    def test_failed_save_keeps_previous_checkpoint(self, tmp_path, monkeypatch):
        pop, _ = make()
        path = tmp_path / "pop.pt"
        pop.save(path)
        before = path.read_bytes()

        def broken(obj, f, *a, **k):
            f.write(b"partial")
            raise OSError("disk full")

        monkeypatch.setattr(torch, "save", broken)
        with pytest.raises(OSError, match="disk full"):
            pop.save(path)
        assert path.read_bytes() == before
        assert [p.name for p in tmp_path.iterdir()] == ["pop.pt"]

    def test_load_mismatch_raises_before_change(self, tmp_path):
        pop, _ = make()
        pop.save(tmp_path / "pop.pt")
        other = Population(mlp(), pop_size=4, low_rank=2)
        before = other.factors()[0].down.clone()
        with pytest.raises(ValueError, match=r"checkpoint has pop_size=8, this population has 4"):
            other.load(tmp_path / "pop.pt")
        assert torch.equal(other.factors()[0].down, before)


def test_to_dtype_moves_model_and_adapters():
    pop, model = make(init_scale=0.5)
    x = torch.randn(8, 6)
    with torch.no_grad():
        expected = pop(x, all_individuals=True)
        pop.to(torch.float64)
        assert model[0].weight.dtype == torch.float64 and pop.factors()[0].down.dtype == torch.float64
        torch.testing.assert_close(pop(x.double(), all_individuals=True).float(), expected, rtol=1e-5, atol=1e-6)
    pop.evolve_(torch.arange(8.0))  # operators and generator still work after the move


class TestRegressions:
    """Each test names the bug it keeps fixed."""

    def test_assigned_parameters_are_the_ones_routed(self):
        """load_state_dict(assign=True) swaps the Parameter objects: the forward must use the new ones."""
        pop, model = make(init_scale=1.0)
        x = torch.randn(3, 6)
        zeroed = {
            k: torch.zeros_like(v) if k.startswith(("_downs", "_ups")) else v for k, v in pop.state_dict().items()
        }
        pop.load_state_dict(zeroed, assign=True)
        with torch.no_grad():
            torch.testing.assert_close(pop(x, individual=0), pop.model(x))

    def test_mutation_invalidates_a_graph_built_before(self):
        """Adapters are written in place through autograd's version counter, never through `.data`."""
        pop = Population(mlp(), pop_size=4, low_rank=2, requires_grad=True)
        out = pop(torch.randn(4, 6), all_individuals=True)
        pop.mutate_("full_gaussian", all_individuals=True, epsilon=1.0)
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            out.sum().backward()

    def test_failed_load_changes_nothing(self, tmp_path):
        pop, _ = make()
        state = pop.state_dict(include_model=False)
        state["_ups.0"] = torch.zeros(8, 2, 5)  # wrong up shape for target '0' (stored layout (P, r, e))
        before = [(f.down.clone(), f.up.clone()) for f in pop.factors()]
        # the error quotes the public layout of factors(): up (P, e, r)
        with pytest.raises(
            ValueError,
            match=r"checkpoint up adapter of '0' has shape \(8, 5, 2\), "
            r"expected \(8, 16, 2\)",
        ):
            pop.load_state_dict(state)
        assert all(torch.equal(d, f.down) and torch.equal(u, f.up) for (d, u), f in zip(before, pop.factors()))

    def test_evolve_error_leaves_generator_untouched(self):
        pop, _ = make()
        state = pop.generator.get_state()
        with pytest.raises(ValueError, match="svd_subspace"):
            pop.evolve_(torch.arange(8.0), crossover_type="svd_subspace", num_parents_per_child=3)
        with pytest.raises(ValueError, match=r"`num_parents_per_child` must be an int >= 1, got 0"):
            pop.evolve_(torch.arange(8.0), num_parents_per_child=0)
        assert torch.equal(pop.generator.get_state(), state) and pop.generation == 0

    def test_deepcopy_of_a_population_routes_on_its_own(self):
        pop, model = make(init_scale=0.5)
        twin = copy.deepcopy(pop)
        x = torch.randn(5, 6)
        with torch.no_grad():
            torch.testing.assert_close(twin(x, individual=3), pop(x, individual=3))
            assert not torch.allclose(twin(x, individual=3), twin.model(x))
            twin.mutate_("full_gaussian", all_individuals=True, epsilon=1.0)
            assert not torch.allclose(twin(x, individual=3), pop(x, individual=3))  # independent adapters

    def test_close_unwraps_without_merging(self):
        model = mlp()
        base = copy.deepcopy(model)
        pop = Population(model, pop_size=4, low_rank=2, init_scale=1.0)
        assert pop.close() is model
        x = torch.randn(3, 6)
        torch.testing.assert_close(model(x), base(x))
        assert all(p.requires_grad for p in model.parameters()) and "forward" not in vars(model[0])

    def test_missing_fitnesses_and_numpy_ids(self):
        import numpy as np

        pop, _ = make()
        with pytest.raises(FitnessError, match=r"fitnesses are required: a \(8,\) tensor"):
            pop.select()
        pop.merge_(np.argmax(np.arange(8.0)))  # a numpy integer is an id
        with pytest.raises(InvalidTypeError, match=r"`individual` must be an int id in \[0, 8\), got float 1.0"):
            make()[0].merge_(1.0)


def test_sliced_adapter_views_are_reused_without_grad_and_follow_swapped_data():
    """Targets below ``low_rank`` get views cut to their rank: cut once per storage under no_grad, never
    reused with grad (a view made with grad belongs to one graph), re-cut when `.data` is swapped."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 32), nn.Tanh(), nn.Linear(32, 2))  # ranks [4, 2]: the head is cut
    pop = Population(model, pop_size=6, low_rank=4, seed=0)
    assert pop.effective_ranks == [4, 2]
    with torch.no_grad():
        first = pop.adapters()
        assert pop.adapters() is first
        pop._ups[1].data = pop._ups[1].data.clone() * 2  # what Module.to() does: same Parameter, new storage
    with torch.no_grad():
        again = pop.adapters()
    up = pop._stacks()[1][1]
    assert again is not first and again[1].up.data_ptr() == up.data_ptr()
    with torch.enable_grad():
        assert pop.adapters() is not pop.adapters()  # fresh views, each in its own graph
    x = torch.randn(6, 4)
    with torch.no_grad():
        out = pop(x, individuals=torch.arange(6))
    down, upt = pop.factors()[1]
    hidden = torch.tanh(model[0](x) + torch.einsum("pd,pdr,per->pe", x, *pop.factors()[0]))
    expected = model[2](hidden) + torch.einsum("pd,pdr,per->pe", hidden, down, upt)
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)
