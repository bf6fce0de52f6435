"""Population under faults and bad input: all-or-nothing, damaged checkpoints, rollbacks, precision, types.

Each test fails on the version before the fix it names (issues 9 and 10).
"""

import copy
import re
import warnings

import numpy as np
import pytest
import torch
from models import mlp
from torch import nn

from populora import HallOfFame, Population, register_mutation
from populora.checkpoint import atomic_save
from populora.errors import CheckpointError, InvalidIndexError, InvalidTypeError, InvalidValueError, PopuloraError
from populora.operators import MUTATIONS


def make(pop_size=8, seed=0, **kwargs):
    torch.manual_seed(0)
    model = mlp()
    return Population(model, pop_size=pop_size, low_rank=2, seed=seed, init_scale=0.5, **kwargs), model


def snapshot(pop):
    """Every tensor and counter of the population, cloned (bitwise comparable)."""
    return (
        [p.detach().clone() for p in [*pop._downs, *pop._ups]],
        pop.generator.get_state().clone(),
        pop.generation,
        pop.eval_seed,
    )


def assert_same(a, b):
    (ta, ga, *ca), (tb, gb, *cb) = a, b
    assert len(ta) == len(tb) and all(torch.equal(x, y) for x, y in zip(ta, tb))
    assert torch.equal(ga, gb) and ca == cb


def plain(model):
    """No populora wrapper left on any module."""
    return all("forward" not in vars(m) for m in model.modules())


def flags(model):
    return {name: p.requires_grad for name, p in model.named_parameters()}


class TiedLM(nn.Module):
    """A tiny LM whose head shares the embedding table (tie_word_embeddings=True)."""

    def __init__(self, vocab=11, dim=8):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.mid = nn.Linear(dim, dim)
        self.head = nn.Linear(dim, vocab, bias=False)
        self.head.weight = self.embed.weight

    def forward(self, tokens):
        return self.head(torch.tanh(self.mid(self.embed(tokens))))


# ---------------------------------------------------------------- issue 9.6: tied weights


class TestTiedWeights:
    def test_auto_discovery_skips_the_tied_head_and_merge_equals_routed(self):
        torch.manual_seed(0)
        model = TiedLM()
        table = model.embed.weight.detach().clone()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            pop = Population(model, pop_size=4, low_rank=2, init_scale=1.0)
        tied = [str(w.message) for w in caught if "tied" in str(w.message)]
        assert len(tied) == 1 and "'head.weight' is the same tensor as 'embed.weight'" in tied[0]
        assert pop.target_names == ["mid"]
        tokens = torch.randint(0, 11, (3, 5))
        with torch.no_grad():
            routed = pop(tokens, individual=2)
            assert not torch.allclose(routed, pop.model(tokens))  # the individual differs from the base
        merged = pop.merge_(2)
        with torch.no_grad():
            torch.testing.assert_close(merged(tokens), routed, rtol=1e-5, atol=1e-6)
        assert torch.equal(model.embed.weight, table) and model.head.weight is model.embed.weight

    @pytest.mark.parametrize("target", ["head", "embed"])
    def test_explicit_tied_target_raises_naming_both_and_leaves_the_model(self, target):
        model = TiedLM()
        before = flags(model)
        other = "embed" if target == "head" else "head"
        with pytest.raises(
            ValueError,
            match=rf"lora target '{target}' cannot be a target: '{target}.weight' is "
            rf"the same tensor as '{other}.weight' \(tied weights\)",
        ) as caught:
            Population(model, pop_size=4, low_rank=2, lora_targets=[target, "mid"])
        assert isinstance(caught.value, PopuloraError)
        assert flags(model) == before and plain(model)


# ---------------------------------------------------------------- issue 10.1: damaged or foreign files


def damage(path, how):
    data = path.read_bytes()
    if how == "truncated":
        path.write_bytes(data[: len(data) // 2])
    elif how == "empty":
        path.write_bytes(b"")
    elif how == "text":
        path.write_text("pop_size: 8\nlow_rank: 2\n")
    elif how == "flipped":
        flipped = bytearray(data)
        flipped[len(data) - 200] ^= 0x10  # inside the last tensor record
        path.write_bytes(bytes(flipped))


DAMAGES = {
    "truncated": "truncated",
    "empty": "is empty",
    "text": "not a populora checkpoint",
    "flipped": "corrupted",
}


class TestDamagedFiles:
    @pytest.mark.parametrize("how", DAMAGES)
    def test_population_load_and_from_checkpoint(self, tmp_path, how):
        pop, _ = make()
        path = pop.save(tmp_path / "pop.pt")
        damage(path, how)
        before = snapshot(pop)
        pattern = rf"checkpoint {re.escape(repr(str(path)))} .*{DAMAGES[how]}"
        with pytest.raises(CheckpointError, match=pattern):
            pop.load(path)
        assert_same(snapshot(pop), before)
        model = mlp()
        model[0].bias.requires_grad_(False)
        expected = flags(model)
        with pytest.raises(CheckpointError, match=pattern):
            Population.from_checkpoint(path, model)
        assert flags(model) == expected and plain(model)

    @pytest.mark.parametrize("how", DAMAGES)
    def test_hall_of_fame_load(self, tmp_path, how):
        pop, _ = make()
        hall = HallOfFame(dict(p=pop), seed=0)
        hall.add_champion("p", torch.arange(8.0), generation=0)
        path = hall.save(tmp_path / "hall.pt")
        damage(path, how)
        fresh = HallOfFame(dict(p=pop), seed=1)
        state = fresh.generator.get_state()
        with pytest.raises(CheckpointError, match=rf"checkpoint {re.escape(repr(str(path)))} .*{DAMAGES[how]}"):
            fresh.load(path)
        assert len(fresh) == 0 and torch.equal(fresh.generator.get_state(), state)

    def test_foreign_kinds_name_the_kind_found(self, tmp_path):
        pop, model = make()
        hall = HallOfFame(dict(p=pop))
        hall_path, pop_path = hall.save(tmp_path / "hall.pt"), pop.save(tmp_path / "pop.pt")
        co_path = atomic_save({"format": "populora.coevolve/1"}, tmp_path / "co.pt", kind="Coevolve")
        for path, found in ((hall_path, "HallOfFame"), (co_path, "Coevolve")):
            with pytest.raises(
                CheckpointError,
                match=rf"{re.escape(repr(str(path)))} holds a {found} checkpoint, "
                "expected a Population checkpoint",
            ):
                pop.load(path)
            other = mlp()
            with pytest.raises(CheckpointError, match=f"holds a {found} checkpoint"):
                Population.from_checkpoint(path, other)
            assert all(p.requires_grad for p in other.parameters()) and plain(other)
        with pytest.raises(CheckpointError, match="holds a Population checkpoint, expected a HallOfFame checkpoint"):
            hall.load(pop_path)

    def test_from_checkpoint_that_does_not_fit_the_model_gives_it_back(self, tmp_path):
        """The state is valid but the model differs (3 -> 4 outputs): the model ends as it came."""
        pop, _ = make()
        path = pop.save(tmp_path / "pop.pt")
        model = mlp(d_out=4)
        model[2].weight.requires_grad_(False)
        expected = flags(model)
        with pytest.raises(
            CheckpointError,
            match=rf"checkpoint {re.escape(repr(str(path)))}: checkpoint up adapter "
            r"of '2' has shape \(8, 3, 2\), expected \(8, 4, 2\)",
        ):
            Population.from_checkpoint(path, model)
        assert flags(model) == expected and plain(model)

    def test_save_returns_the_path(self, tmp_path):
        pop, _ = make()
        assert pop.save(str(tmp_path / "a" / "pop.pt")) == tmp_path / "a" / "pop.pt"


# ---------------------------------------------------------------- issue 10.2: all-or-nothing load_state


def adapters_and_counters(pop):
    """A snapshot in the state_dict layout without the base model (what a checkpoint file holds)."""
    return copy.deepcopy(pop.state_dict(include_model=False))


def legacy_state(pop):
    """Version 0.1's ``state()`` layout, built by hand: the format tag, the config, ``downs`` / ``ups`` lists of
    the stored stacks and the counters (no history, no weight scales); load_state_dict still reads it."""
    state = adapters_and_counters(pop)
    extra = state["_extra_state"]
    targets = range(len(extra["config"]["lora_targets"]))
    return {
        "format": "populora.population/1",
        "config": extra["config"],
        "downs": [state[f"_downs.{t}"] for t in targets],
        "ups": [state[f"_ups.{t}"] for t in targets],
        "generator": extra["generator"],
        "generation": extra["generation"],
        "eval_seed": extra["eval_seed"],
    }


class TestLoadStateAllOrNothing:
    @pytest.mark.parametrize(
        "key, where",
        [
            ("generation", "_extra_state"),
            ("eval_seed", "_extra_state"),
            ("generator", "_extra_state"),
            ("config", "_extra_state"),
            ("_downs.0", None),
            ("_ups.1", None),
            ("_extra_state", None),
        ],
    )
    def test_missing_key_raises_naming_it_before_any_write(self, key, where):
        source, _ = make(seed=1)
        source.evolve_(torch.arange(8.0))
        state = adapters_and_counters(source)
        del (state[where] if where else state)[key]
        pop, _ = make(seed=0)
        before = snapshot(pop)
        with pytest.raises(CheckpointError, match=rf"lacks the key\(s\) \['{key}'"):
            pop.load_state_dict(state)
        assert_same(snapshot(pop), before)

    @pytest.mark.parametrize("key", ["generation", "eval_seed", "generator", "downs", "ups", "config"])
    def test_legacy_layout_missing_key_raises_naming_it(self, key):
        source, _ = make(seed=1)
        state = legacy_state(source)
        del state[key]
        pop, _ = make(seed=0)
        before = snapshot(pop)
        with pytest.raises(CheckpointError, match=rf"lacks the key\(s\) \['{key}'"):
            pop.load_state_dict(state)
        assert_same(snapshot(pop), before)

    @pytest.mark.parametrize(
        "edit, message",
        [
            (lambda s: s["_extra_state"].update(generation="3"), r"'generation' must be an int >= 0, got '3'"),
            (lambda s: s["_extra_state"].update(eval_seed=1.5), r"'eval_seed' must be an int, got 1.5"),
            (
                lambda s: s.update({"_downs.1": s["_downs.1"].long()}),
                r"down adapter of '2' must be a 3-D floating-point tensor, got torch.int64",
            ),
            (
                lambda s: s.update({"_ups.0": s["_ups.0"][:, :1]}),
                r"checkpoint up adapter of '0' has shape \(8, 16, 1\), expected \(8, 16, 2\)",
            ),
            (lambda s: s.update(extra=torch.zeros(1)), r"unexpected key\(s\) \['extra'\]"),
            (lambda s: s["_extra_state"]["config"].pop("low_rank"), r"'config' lacks the key\(s\) \['low_rank'\]"),
            (
                lambda s: s["_extra_state"]["config"].update(low_rank=3),
                r"checkpoint has low_rank=3, this population "
                r"has 2",
            ),
            (lambda s: s["_extra_state"]["config"].update(nan_policy="ignore"), r"`nan_policy` must be one of"),
            (
                lambda s: s["_extra_state"].update(generator=s["_extra_state"]["generator"][:100]),
                r"'generator' holds 100 bytes, which is no generator state \(a cpu generator's has 5056\): it is "
                r"truncated or damaged",
            ),
            (
                lambda s: s["_extra_state"].update(generator=s["_extra_state"]["generator"].float()),
                r"'generator' must be a 1-D uint8 tensor",
            ),
            (
                lambda s: s["_extra_state"].update(format="populora.population/0"),
                r"'format' is 'populora.population/0'",
            ),
            (lambda s: s["_extra_state"].update(history=[[0, 1.0]]), r"'history' must be a list of \[generation, "),
            (
                lambda s: s["_extra_state"].update(weight_scales=[1.0]),
                r"'weight_scales' must be a list of one "
                r"positive float per target \(2\)",
            ),
        ],
    )
    def test_bad_values_raise_before_any_write(self, edit, message):
        source, _ = make(seed=1)
        source.evolve_(torch.arange(8.0))
        state = adapters_and_counters(source)
        edit(state)
        pop, _ = make(seed=0)
        before = snapshot(pop)
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # a truncated generator state is an error, not a warning
            with pytest.raises(CheckpointError, match=message):
                pop.load_state_dict(state)
        assert_same(snapshot(pop), before)

    def test_a_bad_base_weight_in_a_full_state_dict_writes_no_adapter(self):
        """torch's own load copies every matching tensor before it reports a mismatch; this one checks first."""
        source, _ = make(seed=1)
        source.evolve_(torch.arange(8.0))
        state = dict(source.state_dict())
        state["model.2.weight"] = torch.zeros(5, 5)
        pop, _ = make(seed=0)
        before = snapshot(pop)
        with pytest.raises(CheckpointError, match=r"checkpoint 'model.2.weight' has shape \(5, 5\), expected"):
            pop.load_state_dict(state)
        assert_same(snapshot(pop), before)

    @pytest.mark.parametrize(
        "edit, message",
        [
            (lambda s: s.update(generation="3"), r"'generation' must be an int >= 0, got '3'"),
            (
                lambda s: s["downs"].__setitem__(1, s["downs"][1].long()),
                r"'downs' entry of '2' must be a 3-D floating-point tensor, got torch.int64",
            ),
            (lambda s: s["ups"].pop(), r"'ups' must be a list of one tensor per target \(2\), got list of 1"),
            (lambda s: s.update(format="populora.population/0"), r"'format' is 'populora.population/0'"),
        ],
    )
    def test_legacy_layout_bad_values_raise_before_any_write(self, edit, message):
        source, _ = make(seed=1)
        state = legacy_state(source)
        edit(state)
        pop, _ = make(seed=0)
        before = snapshot(pop)
        with pytest.raises(CheckpointError, match=message):
            pop.load_state_dict(state)
        assert_same(snapshot(pop), before)

    def test_not_a_dict(self):
        pop, _ = make()
        with pytest.raises(CheckpointError, match="a population state must be a dict"):
            pop.load_state_dict([1, 2])


# ---------------------------------------------------------------- issue 10.3: state_dict() and snapshots


class TestSnapshot:
    def test_state_dict_holds_references_like_torch_and_a_copy_restores(self):
        pop, _ = make()
        before = snapshot(pop)
        live = pop.state_dict()
        assert live["_downs.0"].data_ptr() == pop._downs[0].data_ptr()  # torch's semantics: references
        saved = copy.deepcopy(live)
        pop.mutate_("full_gaussian", all_individuals=True, epsilon=1.0)
        pop.generation += 1
        pop.load_state_dict(saved)
        assert_same(snapshot(pop), before)

    def test_hall_of_fame_state_is_a_snapshot(self):
        pop, _ = make()
        hall = HallOfFame(dict(p=pop))
        champion = hall.add_champion("p", torch.arange(8.0), generation=0)
        state = hall.state_dict()
        entry = state["champions"]["p"][0]
        entry["downs"][0].zero_()
        assert champion.factors[0].down.abs().sum() > 0  # the archive is untouched
        restored = HallOfFame(dict(p=pop))
        restored.load_state_dict(hall.state_dict())
        state["champions"]["p"][0]["ups"][0].zero_()
        again = restored.champions("p")[0]
        assert torch.equal(again.factors[0].down, champion.factors[0].down)
        restored_state = restored.state_dict()
        restored_state["champions"]["p"][0]["ups"][0].zero_()
        assert torch.equal(restored.champions("p")[0].factors[0].up, champion.factors[0].up)


# ---------------------------------------------------------------- issue 10.5: rollback of a generation


@pytest.fixture
def raising_mutation():
    calls = []

    @register_mutation("test_raises_after_drawing")
    def raises_after_drawing(factors, *, epsilon, generator, **standard):
        calls.append(len(factors))
        torch.randn(100, generator=generator)  # advances the generator before failing
        raise RuntimeError("mutation failed on purpose")

    yield calls
    del MUTATIONS["test_raises_after_drawing"]


class TestRollback:
    def test_raising_mutation_rolls_back_the_whole_generation(self, raising_mutation):
        pop, _ = make(seed=3)
        twin, _ = make(seed=3)
        pop.evolve_(torch.arange(8.0))
        twin.evolve_(torch.arange(8.0))
        before = snapshot(pop)
        f = torch.tensor([3.0, 1.0, 4.0, 1.5, 5.0, 9.0, 2.0, 6.0])
        with pytest.raises(RuntimeError, match="mutation failed on purpose"):
            pop.evolve_(f, mutation_type="test_raises_after_drawing")
        assert raising_mutation == [2]  # it really ran, after crossover wrote the culled slots
        assert_same(snapshot(pop), before)
        pop.evolve_(f)
        twin.evolve_(f)
        assert_same(snapshot(pop), snapshot(twin))

    def test_raising_mutation_in_mutate_changes_nothing(self, raising_mutation):
        pop, _ = make()
        before = snapshot(pop)
        with pytest.raises(RuntimeError, match="on purpose"):
            pop.mutate_("test_raises_after_drawing", individuals=[1, 3])
        assert_same(snapshot(pop), before)


# ---------------------------------------------------------------- issue 10.6: failed constructor


class TestFailedConstructor:
    @pytest.mark.parametrize(
        "kwargs, error, message",
        [
            ({"dtype": "float32"}, InvalidTypeError, r"`dtype` must be None or a torch.dtype .*got str 'float32'"),
            (
                {"dtype": torch.int64, "requires_grad": True},
                InvalidValueError,
                r"`dtype` must be a floating-point dtype .*got torch.int64",
            ),
            ({"dtype": torch.int64}, InvalidValueError, r"`dtype` must be a floating-point dtype"),
            ({"seed": "abc"}, InvalidTypeError, r"`seed` must be an int, got str 'abc'"),
            ({"seed": 1.5}, InvalidTypeError, r"`seed` must be an int, got float 1.5"),
            ({"seed": 2**64}, InvalidValueError, r"`seed` must be an int in"),
            ({"requires_grad": "yes"}, InvalidTypeError, r"`requires_grad` must be a bool"),
            ({"device": "gpu:0"}, InvalidValueError, r"`device` must be None, a torch.device or a device string"),
            ({"pop_size": 0}, InvalidValueError, r"`pop_size` must be an int >= 1, got 0"),
            ({"low_rank": 2.0}, InvalidTypeError, r"`low_rank` must be an int, got float 2.0"),
            ({"init_scale": "big"}, InvalidTypeError, r"`init_scale` must be a real number"),
            ({"nan_policy": "skip"}, InvalidValueError, r"`nan_policy` must be one of"),
            ({"lora_targets": ["0", "9"]}, ValueError, r"lora target '9' is not a module"),
            ({"lora_targets": 3}, InvalidTypeError, r"`lora_targets` must be None, a str or a list of str"),
        ],
    )
    def test_leaves_the_model_as_it_was(self, kwargs, error, message):
        model = mlp()
        model[2].bias.requires_grad_(False)
        expected = flags(model)
        kwargs = {"pop_size": 4, "low_rank": 2, **kwargs}
        with pytest.raises(error, match=message) as caught:
            Population(model, **kwargs)
        assert isinstance(caught.value, PopuloraError)
        assert flags(model) == expected and plain(model)

    def test_numpy_scalars_are_numbers(self):
        model = mlp()
        pop = Population(
            copy.deepcopy(model),
            pop_size=np.int64(4),
            low_rank=np.int32(2),
            seed=np.int64(7),
            init_scale=np.float32(0.25),
            requires_grad=np.bool_(False),
        )
        twin = Population(model, pop_size=4, low_rank=2, seed=7, init_scale=float(np.float32(0.25)))
        assert type(pop.pop_size) is int and type(pop.low_rank) is int and type(pop.seed) is int
        assert all(
            torch.equal(a.down, b.down) and torch.equal(a.up, b.up) for a, b in zip(pop.factors(), twin.factors())
        )


# ---------------------------------------------------------------- issue 10.7: two populations on one model


ORDERS = [
    ("a.merge", "b.close"),
    ("b.close", "a.merge"),
    ("a.close", "b.merge"),
    ("b.merge", "a.close"),
    ("a.close", "b.close"),
    ("b.close", "a.close"),
    ("a.merge", "b.merge"),
    ("b.merge", "a.merge"),
]


class TestTwoPopulationsOneModel:
    @pytest.mark.parametrize("order", ORDERS, ids=["-".join(o) for o in ORDERS])
    def test_any_order_gives_back_flags_and_a_plain_model(self, order):
        torch.manual_seed(0)
        model = mlp()
        model[0].bias.requires_grad_(False)
        expected = flags(model)
        pops = {
            "a": Population(model, pop_size=4, low_rank=2, init_scale=0.5, seed=1),
            "b": Population(model, pop_size=6, low_rank=1, lora_targets=["2"], init_scale=0.5, seed=2),
        }
        x = torch.randn(3, 6)
        (first, _), (second, _) = (step.split(".") for step in order)
        with torch.no_grad():
            routed = {name: pop(x, individual=1) for name, pop in pops.items()}
        for i, step in enumerate(order):
            name, action = step.split(".")
            getattr(pops[name], "merge_" if action == "merge" else "close")(*([1] if action == "merge" else []))
            if i == 0:  # the other population still routes, on a frozen model
                assert not any(p.requires_grad for p in model.parameters())
                other = pops[second]
                if action == "close":
                    with torch.no_grad():
                        torch.testing.assert_close(other(x, individual=1), routed[second])
        assert flags(model) == expected
        assert plain(model)
        merged = [step.split(".")[0] for step in order if step.endswith("merge")]
        if merged == [first] or merged == [second]:
            with torch.no_grad():
                torch.testing.assert_close(model(x), routed[merged[0]], rtol=1e-5, atol=1e-6)

    def test_deep_copy_of_a_wrapped_model_pair(self):
        model = mlp()
        a = Population(model, pop_size=4, low_rank=2)
        twin = copy.deepcopy(a)
        b = Population(twin.model, pop_size=4, low_rank=2)
        twin.close()
        assert not any(p.requires_grad for p in twin.model.parameters())  # b still lives on it
        b.close()
        assert all(p.requires_grad for p in twin.model.parameters()) and plain(twin.model)
        a.close()
        assert all(p.requires_grad for p in model.parameters()) and plain(model)


# ---------------------------------------------------------------- issue 10.10: float64 merges in float64


def test_float64_model_merges_in_float64():
    torch.manual_seed(0)
    model = mlp().double()
    pop = Population(model, pop_size=4, low_rank=2, init_scale=1.0)
    x = torch.randn(5, 6, dtype=torch.float64)
    with torch.no_grad():
        routed = pop(x, individual=3)
        assert all(dw.dtype == torch.float64 for dw in pop.delta_weight(3).values())
        merged = pop.merge_(3)(x)
    assert merged.dtype == torch.float64
    torch.testing.assert_close(merged, routed, rtol=1e-12, atol=1e-12)


# ---------------------------------------------------------------- issue 10.11 / 10.15: NumPy ids, one error class


class TestIdsAndErrorClasses:
    def test_numpy_scalars_everywhere(self):
        pop, _ = make()
        twin, _ = make()
        x = torch.randn(2, 6)
        for d_np, d_py in zip(pop.delta_weight(np.int64(3)).values(), pop.delta_weight(3).values()):
            assert torch.equal(d_np, d_py)
        pop.mutate_("full_gaussian", individual=np.int64(3), epsilon=np.float32(0.25))
        twin.mutate_("full_gaussian", individual=3, epsilon=0.25)
        assert_same(snapshot(pop), snapshot(twin))
        pop.evolve_(
            torch.arange(8.0),
            survive_frac=np.float64(0.5),
            elite_frac=np.float32(0.25),
            num_groups=np.int64(2),
            num_parents_per_child=np.int64(2),
            epsilon=np.float64(0.1),
        )
        twin.evolve_(
            torch.arange(8.0), survive_frac=0.5, elite_frac=0.25, num_groups=2, num_parents_per_child=2, epsilon=0.1
        )
        assert_same(snapshot(pop), snapshot(twin))
        with torch.no_grad():
            expected = pop(x, individual=5)
        torch.testing.assert_close(pop.merge_(np.int32(5))(x), expected, rtol=1e-5, atol=1e-6)

    def test_out_of_range_id_is_an_index_error_everywhere(self):
        pop, _ = make()
        calls = {
            "delta_weight": lambda: pop.delta_weight(99),
            "merge_": lambda: pop.merge_(99),
            "mutate_ individual": lambda: pop.mutate_(individual=99),
            "mutate_ individuals": lambda: pop.mutate_(individuals=[0, 99]),
            "crossover_": lambda: pop.crossover_("average", [[0, 99]], [1]),
            "negative": lambda: pop.delta_weight(-1),
        }
        for name, call in calls.items():
            with pytest.raises(InvalidIndexError, match="99|-1") as caught:
                call()
            assert isinstance(caught.value, IndexError) and isinstance(caught.value, PopuloraError), name

    def test_wrong_types_are_type_errors(self):
        pop, _ = make()
        for call in (
            lambda: pop.delta_weight(1.0),
            lambda: pop.merge_("3"),
            lambda: pop.mutate_(individuals=[0.5, 1.0]),
            lambda: pop.mutate_(all_individuals=True, epsilon="a"),
        ):
            with pytest.raises(TypeError) as caught:
                call()
            assert isinstance(caught.value, PopuloraError)
        with pytest.raises(InvalidValueError, match=r"`num_groups` must be an int >= 1 dividing pop_size=8, got 3"):
            pop.evolve_(torch.arange(8.0), num_groups=3)


class TestHallOfFameArguments:
    def test_numpy_scalars_and_error_classes(self):
        pop, _ = make()
        hall = HallOfFame(dict(p=pop), capacity=np.int64(2), seed=np.int64(5))
        assert hall.capacity == 2 and type(hall.capacity) is int
        for g in range(3):
            hall.add_champion("p", torch.arange(8.0), generation=np.int64(g))
        assert [c.generation for c in hall.champions()] == [1, 2]
        assert len(hall.sample(np.int64(2))) == 2
        cases = [
            (lambda: HallOfFame(dict(p=pop), capacity=0), InvalidValueError, r"`capacity` must be an int >= 1, got 0"),
            (lambda: HallOfFame(dict(p=pop), capacity=2.5), InvalidTypeError, r"`capacity` must be an int"),
            (lambda: HallOfFame(dict(p=pop), seed="x"), InvalidTypeError, r"`seed` must be an int, got str 'x'"),
            (lambda: HallOfFame({}), InvalidValueError, r"`populations` must be a non-empty dict"),
            (lambda: HallOfFame([pop]), InvalidTypeError, r"`populations` must be a non-empty dict"),
            (lambda: hall.sample(0), InvalidValueError, r"`k` must be an int >= 1, got 0"),
            (lambda: hall.sample(3), InvalidValueError, r"cannot sample 3 distinct champions"),
            (
                lambda: hall.add_champion("p", torch.arange(8.0), generation=-1),
                InvalidValueError,
                r"`generation` must be an int >= 0, got -1",
            ),
            (lambda: hall.run([]), InvalidTypeError, r"`champions` must be a Champion"),
        ]
        for call, error, message in cases:
            with pytest.raises(error, match=message):
                call()

    def test_load_state_is_all_or_nothing(self):
        pop, _ = make()
        hall = HallOfFame(dict(p=pop), seed=0)
        for g in range(2):
            hall.add_champion("p", torch.arange(8.0), generation=g)
        good = hall.state_dict()
        fresh = HallOfFame(dict(p=pop), seed=1)
        fresh.add_champion("p", torch.arange(8.0), generation=7)
        generator = fresh.generator.get_state()
        edits = [
            (lambda s: s.pop("seed"), r"lacks the key\(s\) \['seed'\]"),
            (lambda s: s.update(generator=s["generator"][:10]), r"'generator' is not a CPU generator state"),
            (lambda s: s["champions"]["p"][1].pop("fitness"), r"champion 1 of 'p' must hold"),
            (lambda s: s["champions"]["p"][1]["ups"].pop(), r"champion of 'p' has factor shapes"),
            (lambda s: s.update(capacity=0), r"'capacity' must be None or an int >= 1, got 0"),
        ]
        for edit, message in edits:
            state = hall.state_dict()
            edit(state)
            with pytest.raises(CheckpointError, match=message):
                fresh.load_state_dict(state)
            assert [c.generation for c in fresh.champions()] == [7] and torch.equal(
                fresh.generator.get_state(), generator
            )
        fresh.load_state_dict(good)
        assert [c.generation for c in fresh.champions()] == [0, 1]
