"""One checkpoint protocol (issue 14, items 1, 4 and 10): state_dict / load_state_dict, save / load, history.

Population keeps torch's semantics (base weights, adapters and, via extra
state, the generator and counters); HallOfFame and Coevolve return
snapshots. Version 0.1's ``Population.state()`` dicts and files are still read.
"""

import copy
import warnings
from pathlib import Path

import pytest
import torch
from models import mlp
from torch import nn

import populora
from populora import CheckpointError, Coevolve, GenerationStats, HallOfFame, Population
from populora.checkpoint import atomic_save, load_checkpoint


def make(seed=0, pop_size=8, **kwargs):
    torch.manual_seed(0)
    return Population(mlp(), pop_size=pop_size, low_rank=2, seed=seed, init_scale=0.5, **kwargs)


def fitness(g):
    return torch.randn(8, generator=torch.Generator().manual_seed(100 + g))


def everything(pop):
    """Every tensor and counter of a population, comparable bit for bit."""
    return (
        [t.detach().clone() for t in [*pop._downs, *pop._ups, *pop.model.parameters()]],
        pop.generator.get_state().clone(),
        pop.generation,
        pop.eval_seed,
        list(pop.history),
        list(pop.weight_scales),
    )


def assert_same(a, b):
    (ta, ga, *ca), (tb, gb, *cb) = a, b
    assert len(ta) == len(tb) and all(torch.equal(x, y) for x, y in zip(ta, tb))
    assert torch.equal(ga, gb) and ca == cb


def run(pop, generations, start=0):
    for g in range(start, start + generations):
        pop.evolve_(fitness(g))
        pop.mutate_("full_gaussian", individual=g % 8, epsilon=0.2)


class TestPopulationStateDict:
    def test_load_state_dict_of_another_resumes_bitwise(self):
        """An interrupted run resumed through state_dict equals the uninterrupted twin, bit for bit."""
        straight, source = make(seed=3), make(seed=3)
        run(straight, 5)
        run(source, 2)
        resumed = make(seed=9)  # another seed and another base model: everything comes from the state dict
        with torch.no_grad():
            for p in resumed.model.parameters():
                p.add_(1.0)
        resumed.load_state_dict(source.state_dict())
        run(resumed, 3, start=2)
        assert_same(everything(resumed), everything(straight))
        x = torch.randn(8, 6)
        with torch.no_grad():
            assert torch.equal(resumed(x, all_individuals=True), straight(x, all_individuals=True))

    def test_state_dict_is_torchs_with_extra_state(self):
        pop = make()
        run(pop, 1)
        state = pop.state_dict()
        assert set(state) == {
            "_extra_state",
            "_downs.0",
            "_downs.1",
            "_ups.0",
            "_ups.1",
            "model.0.weight",
            "model.0.bias",
            "model.2.weight",
            "model.2.bias",
        }
        assert state["_downs.0"].data_ptr() == pop._downs[0].data_ptr()  # references, as for any module
        extra = state["_extra_state"]
        assert extra["generation"] == 1 and extra["eval_seed"] == 1 and extra["config"]["pop_size"] == 8
        assert torch.equal(extra["generator"], pop.generator.get_state())
        assert extra["history"] == [list(pop.history[0])] and extra["weight_scales"] == pop.weight_scales

    def test_without_the_model_leaves_the_base_weights(self):
        source, pop = make(seed=1), make(seed=2)
        run(source, 2)
        with torch.no_grad():
            source.model[0].weight.add_(1.0)
        state = source.state_dict(include_model=False)
        assert not [k for k in state if k.startswith("model.")]
        base = pop.model[0].weight.clone()
        pop.load_state_dict(state)
        assert torch.equal(pop.model[0].weight, base)
        assert torch.equal(pop._downs[0], source._downs[0]) and pop.generation == 2

    def test_a_population_inside_another_module_round_trips(self):
        """A parent's state_dict / load_state_dict reach the population's extra state (set_extra_state)."""
        straight, source, target = make(seed=4), make(seed=4), make(seed=5)
        run(straight, 3)
        run(source, 1)
        holder = nn.ModuleDict(dict(inner=target))
        holder.load_state_dict(nn.ModuleDict(dict(inner=source)).state_dict())
        run(target, 2, start=1)
        assert_same(everything(target), everything(straight))

    def test_partial_non_strict_load_writes_what_it_has(self):
        source, pop = make(seed=1), make(seed=2)
        run(source, 1)
        generator = pop.generator.get_state()
        pop.load_state_dict({"_downs.0": source._downs[0].detach().clone()}, strict=False)
        assert torch.equal(pop._downs[0], source._downs[0]) and not torch.equal(pop._downs[1], source._downs[1])
        assert torch.equal(pop.generator.get_state(), generator) and pop.generation == 0
        with pytest.raises(
            CheckpointError, match=r"holds adapters for 1 target\(s\), this population has 2: \['0', '2'\]"
        ):
            pop.load_state_dict({"_downs.0": source._downs[0].detach().clone()})


class TestFiles:
    def test_a_file_holds_adapters_and_counters_not_the_base_model(self, tmp_path):
        pop = make()
        run(pop, 2)
        path = pop.save(tmp_path / "pop.pt")
        assert path == tmp_path / "pop.pt" and isinstance(path, Path)
        state = load_checkpoint(path, kind="Population")
        assert set(state) == {"_extra_state", "_downs.0", "_downs.1", "_ups.0", "_ups.1"}
        assert all(t.device.type == "cpu" for k, t in state.items() if k != "_extra_state")
        twin = make(seed=7)
        twin.load(path)
        assert_same(everything(twin), everything(pop))
        again = Population.from_checkpoint(path, mlp())
        assert again.generation == 2 and again.history == pop.history

    def test_a_version_0_1_file_still_loads(self, tmp_path):
        pop = make(seed=1)
        run(pop, 2)
        state = pop.state_dict(include_model=False)
        extra = state["_extra_state"]
        legacy = {  # the 0.1 layout of Population.state(): downs / ups lists beside the counters, no history
            "format": "populora.population/1",
            "config": extra["config"],
            "downs": [state["_downs.0"].clone(), state["_downs.1"].clone()],
            "ups": [state["_ups.0"].clone(), state["_ups.1"].clone()],
            "generator": extra["generator"].clone(),
            "generation": extra["generation"],
            "eval_seed": extra["eval_seed"],
        }
        path = atomic_save(legacy, tmp_path / "old.pt", kind="Population")
        twin = make(seed=5)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            twin.load(path)
            built = Population.from_checkpoint(path, mlp())
        for other in (twin, built):
            assert torch.equal(other._downs[1], pop._downs[1]) and torch.equal(other._ups[0], pop._ups[0])
            assert torch.equal(other.generator.get_state(), pop.generator.get_state()) and other.generation == 2
        assert twin.history == []  # a 0.1 file has no history: the population keeps its own

    def test_hall_of_fame_files_and_state_dict(self, tmp_path):
        pop = make()
        hall = HallOfFame(dict(p=pop), capacity=3, seed=2)
        for g in range(4):
            hall.add_champion("p", fitness(g), generation=g)
        hall.sample(2)
        path = hall.save(tmp_path / "hall.pt")
        assert path == tmp_path / "hall.pt"
        other = HallOfFame(dict(p=pop))
        other.load(path)
        assert [c.generation for c in other.champions()] == [1, 2, 3] and other.capacity == 3
        assert torch.equal(other.generator.get_state(), hall.generator.get_state())
        copy_ = HallOfFame(dict(p=pop))
        copy_.load_state_dict(hall.state_dict())
        assert [c.individual for c in copy_.champions()] == [c.individual for c in hall.champions()]


def probe_a(coevolve):
    return coevolve.a(torch.ones(1, 6), all_individuals=True)


def probe_b(coevolve, a_outputs):
    return coevolve.b(torch.ones(1, 6), all_individuals=True) + a_outputs.mean()


def fitness_a(a_outputs, b_outputs):
    return -(a_outputs.sum(-1) - b_outputs.mean()).abs()


def fitness_b(b_outputs):
    return b_outputs.sum(-1)


def coevolve(seed=0, hall=True):
    a, b = make(seed=seed), make(seed=seed + 1)
    hof = HallOfFame(dict(a=a), seed=seed) if hall else None
    return Coevolve(
        dict(
            a=dict(population=a, probe=probe_a, fitness=fitness_a),
            b=dict(population=b, probe=probe_b, fitness=fitness_b),
        ),
        hall_of_fame=hof,
    )


class TestCoevolve:
    def test_state_dict_resumes_bitwise_and_is_a_snapshot(self):
        straight, source = coevolve(), coevolve()
        for _ in range(4):
            straight.step()
        for _ in range(2):
            source.step()
        state = source.state_dict()
        live = {t.data_ptr() for pop in source.populations.values() for t in [*pop._downs, *pop._ups]}
        assert not live & {
            t.data_ptr() for s in state["populations"].values() for t in s.values() if isinstance(t, torch.Tensor)
        }
        resumed = coevolve(seed=5)
        resumed.load_state_dict(state)
        for _ in range(2):
            resumed.step()
        for name in ("a", "b"):
            assert_same(everything(resumed[name]), everything(straight[name]))
        assert resumed.history == straight.history and resumed.generation == 4
        assert all(s.std is not None and s.std >= 0 for s in resumed.history.of("a"))
        assert [c.generation for c in resumed.hall_of_fame.champions()] == [0, 1, 2, 3]

    def test_a_bad_part_changes_nothing(self):
        source, co = coevolve(), coevolve(seed=3)
        source.step()
        co.step()
        before = {n: everything(co[n]) for n in ("a", "b")}
        hall_before, history = co.hall_of_fame.champions(), copy.deepcopy(co.history)
        for edit, message in [
            (
                lambda s: s["populations"]["b"]["_extra_state"].update(generation=-1),
                r"'generation' must be an int >= 0",
            ),
            (lambda s: s["history"]["b"].append([1, "x", 0.0]), r"history of 'b' must be a list of"),
            (lambda s: s["hall_of_fame"]["champions"]["a"][0].pop("downs"), r"champion 0 of 'a' must hold"),
            (lambda s: s.pop("generation"), r"lacks the key\(s\) \['generation'\]"),
        ]:
            state = source.state_dict()
            edit(state)
            with pytest.raises(CheckpointError, match=message):
                co.load_state_dict(state)
            for n in ("a", "b"):
                assert_same(everything(co[n]), before[n])
            assert co.hall_of_fame.champions() == hall_before and co.history == history

    def test_files(self, tmp_path):
        co = coevolve()
        co.step()
        path = co.save(tmp_path / "co.pt")
        assert path == tmp_path / "co.pt"
        other = coevolve(seed=2)
        other.load(path)
        assert other.history == co.history and other.generation == 1
        assert_same(everything(other["a"]), everything(co["a"]))


class TestNoWarnings:
    def test_no_internal_call_warns(self, tmp_path):
        """Coevolve steps, rollbacks, files and the hall use the new names only."""
        with warnings.catch_warnings():
            warnings.simplefilter("error", DeprecationWarning)
            co = coevolve()
            co.step()
            co.load(co.save(tmp_path / "co.pt"))
            co.hall_of_fame.load(co.hall_of_fame.save(tmp_path / "hall.pt"))
            co["a"].load(co["a"].save(tmp_path / "a.pt"))
            repr(co["a"])


class TestHistory:
    def test_evolve_records_best_mean_std(self):
        pop = make()
        f = torch.tensor([0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0])
        pop.evolve_(f)
        pop.evolve_(f.flip(0) * 2)
        assert pop.history == [
            GenerationStats(0, 7.0, 3.5, pytest.approx(f.std(correction=0).item())),
            GenerationStats(1, 14.0, 7.0, pytest.approx(2 * f.std(correction=0).item())),
        ]
        assert pop.history[0][:3] == (0, 7.0, 3.5)  # the first three fields, as before

    def test_a_failed_generation_records_nothing(self):
        pop = make()
        with pytest.raises(populora.FitnessError):
            pop.evolve_(torch.zeros(3))
        with pytest.raises(ValueError):
            pop.evolve_(torch.zeros(8), survive_frac=2.0)
        assert pop.history == []

    def test_generation_stats_stays_positional(self):
        s = GenerationStats(2, 1.0, 0.5)
        assert s.std is None and tuple(s) == (2, 1.0, 0.5, None, None, None, None, None, None)
        g, best, mean, *_ = s
        assert (g, best, mean) == (2, 1.0, 0.5)


class TestRepr:
    def test_shows_the_public_layout(self):
        torch.manual_seed(0)
        model = nn.Sequential(nn.Embedding(11, 6), nn.Linear(6, 5))
        pop = Population(model, pop_size=4, low_rank=3, lora_targets=["0", "1"])
        pop.evolve_(torch.arange(4.0))
        text = repr(pop)
        assert text.startswith("Population(pop_size=4, low_rank=3, generation=1, targets={")
        assert "'0': Embedding down (4, 11, 3), up (4, 6, 3), torch.float32" in text
        assert "'1': Linear down (4, 6, 3), up (4, 5, 3), torch.float32" in text  # public (P, d, r), (P, e, r)
        assert "(4, 3, 6)" not in text  # not the stored, transposed layout
        pop.close()
        assert repr(pop) == "Population(pop_size=4, low_rank=3, generation=1, spent: merged or closed)"


def test_py_typed_is_shipped():
    root = Path(populora.__file__).parent
    assert (root / "py.typed").is_file()
    pyproject = (root.parent / "pyproject.toml").read_text()
    assert "[tool.setuptools.package-data]" in pyproject and 'populora = ["py.typed"]' in pyproject
