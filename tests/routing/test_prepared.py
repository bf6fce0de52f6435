"""Prepared routes (``routing.prepared``) and the cost model that picks their form (``routing.cost``).

- a prepared forward equals the uncached one: bitwise where the same kernels run (gathered factors), to
  1e-6 where a merged weight replaces the two products (every merged form, with or without the layer's own
  product), in every layout an env loop meets (one row per id, every id, ``individual=``, repeated ids);
- prepared work is made and used only inside a scope (``prepared_scope``, a route block's entry); inside
  one, the population's writes and the detectable ones rebuild it too: ``mutate_``, ``evolve_``,
  ``set_factors_``, ``load_state_dict``, a ``torch.optim`` step, ``param.data = ...``, a swapped stack
  (``forward_factors``) (every write outside a scope: ``test_prepared_freshness.py``);
- preparation is off while grad is enabled, for inference tensors, and it holds at most its budget;
- the cost model is a pure function of shapes, dtype and device (the same answer every time, no clock read).
"""

from __future__ import annotations

import contextlib
import time

import numpy as np
import pytest
import torch
from torch import nn

from populora import Population
from populora.adapters import Factors
from populora.routing import cost, prepared
from populora.routing.cost import MERGED_MAX_ELEMENTS, choose_form, form_costs

IDS = {
    "one row per id": np.array([1, 3, 4, 6, 7]),  # a subset: gathered per group
    "every id": np.arange(8),  # no gather
    "repeated ids": np.array([0, 0, 2, 5, 5, 5, 7]),  # unequal groups of a few rows: one row per group on CPU
}


def policy(seed: int = 0, hidden: int = 32) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(4, hidden), nn.Tanh(), nn.Linear(hidden, 2))


def population(model: nn.Module | None = None, P: int = 8, **kwargs) -> Population:
    return Population(policy() if model is None else model, pop_size=P, low_rank=3, seed=1, init_scale=1.0, **kwargs)


@contextlib.contextmanager
def uncached(pop: Population):
    """The router without preparation: every call takes the uncached path."""
    kept = pop._router.prepared
    pop._router.prepared = None
    try:
        yield
    finally:
        pop._router.prepared = kept


def routed(pop: Population, x: torch.Tensor, route: dict) -> torch.Tensor:
    with torch.inference_mode():
        return pop(x, **route)


def reference(pop: Population, x: torch.Tensor, route: dict) -> torch.Tensor:
    with uncached(pop), torch.inference_mode():
        return pop(x, **route)


def close(a: torch.Tensor, b: torch.Tensor) -> None:
    torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)


def routes():
    for name, ids in IDS.items():
        yield name, {"individuals": ids}, len(ids)
    yield "individual=", {"individual": 5}, 3


@pytest.mark.parametrize("form", ["merged", "merged-broadcast"])
@pytest.mark.parametrize("name, route, rows", list(routes()))
def test_merged_forms_equal_the_uncached_forward(monkeypatch, form, name, route, rows):
    monkeypatch.setattr(prepared, "choose_form", lambda *args: form)
    pop = population()
    x = torch.randn(rows, 4, generator=torch.Generator().manual_seed(2))
    want = reference(pop, x, route)
    with pop.prepared_scope():
        first, second = routed(pop, x, route), routed(pop, x, route)
        close(first, want)
        close(second, want)
        store = pop._router.prepared
        assert {entry.form for entry in store._entries.values()} >= {form, "stack"} or name == "every id"
        assert store.hits >= 2  # the second call used what the first prepared (both targets)


@pytest.mark.parametrize("form", ["merged", "merged-broadcast"])
def test_merged_forms_of_layers_without_bias_and_of_token_rows(monkeypatch, form):
    """No bias (bmm alone), and rows of several tokens each: ``(n, T, d)`` inputs, ``k`` groups of ``c T``."""
    monkeypatch.setattr(prepared, "choose_form", lambda *args: form)
    torch.manual_seed(0)
    pop = population(nn.Sequential(nn.Linear(4, 16, bias=False), nn.Tanh(), nn.Linear(16, 2)))
    x = torch.randn(5, 3, 4)  # 5 rows of 3 tokens
    with pop.prepared_scope():
        for route in ({"individuals": IDS["one row per id"]}, {"individual": 2}):
            want = reference(pop, x, route)
            close(routed(pop, x, route), want)
            close(routed(pop, x, route), want)
        assert pop._router.prepared.hits >= 4


@pytest.mark.parametrize("name, route, rows", list(routes()))
def test_a_target_whose_forward_cannot_be_skipped_adds_the_merged_delta(monkeypatch, name, route, rows):
    """A Linear subclass, or a layer another population wrapped first, keeps its forward; the merged weight
    then holds the delta alone."""

    class Sub(nn.Linear):
        pass

    model = policy()
    model[0] = Sub(4, 32)
    monkeypatch.setattr(prepared, "choose_form", lambda *args: "merged")
    first = population(model)  # wraps the model first: its targets' forwards are the layers' own
    pop = Population(model, pop_size=8, low_rank=2, seed=2, init_scale=1.0)  # wraps first's wrappers
    assert first._router._plain == [False, True] and pop._router._plain == [False, False]
    x = torch.randn(rows, 4, generator=torch.Generator().manual_seed(3))
    with first.prepared_scope(), pop.prepared_scope():
        for p in (first, pop):
            want = reference(p, x, route)
            close(routed(p, x, route), want)
            close(routed(p, x, route), want)
        stacks = [entry for key, entry in first._router.prepared._entries.items() if key[1] == "stack"]
        assert sorted(entry.plain for entry in stacks) == [False, True]
        assert all(not e.plain for key, e in pop._router.prepared._entries.items() if key[1] == "stack")


@pytest.mark.parametrize("name", ["one row per id", "repeated ids"])
def test_gathered_factors_give_bitwise_the_uncached_forward(name):
    """A layer too large to merge keeps each group's gathered factors: the same kernels, the same bits."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(300, 256), nn.ReLU(), nn.Linear(256, 300))
    assert 300 * 256 > MERGED_MAX_ELEMENTS
    pop = Population(model, pop_size=8, low_rank=4, seed=0, init_scale=1.0)
    ids = IDS[name]
    x = torch.randn(len(ids), 300, generator=torch.Generator().manual_seed(4))
    want = reference(pop, x, {"individuals": ids})
    with pop.prepared_scope():
        for _ in range(2):
            assert torch.equal(routed(pop, x, {"individuals": ids}), want)
        store = pop._router.prepared
        assert [entry.form for entry in store._entries.values()] == ["factors", "factors"]
        assert store.hits == 2


def test_the_policy_of_an_env_loop_is_merged_and_prepared_once_per_assignment():
    pop = population(P=64)
    store = pop._router.prepared
    x = torch.randn(16, 4)
    ids = np.sort(np.random.default_rng(0).choice(64, 16, replace=False))
    with pop.prepared_scope():
        for _ in range(5):
            routed(pop, x, {"individuals": ids})
        assert store.builds == 4  # per target: every individual's merged weights, then this assignment's
        assert store.hits == 8
        routed(pop, x, {"individuals": ids[::-1].copy()})  # a new assignment: gathered from the kept stacks
        assert store.builds == 6
        forms = {entry.form for entry in store._entries.values()}
        assert "factors" not in forms and forms & set(cost.FORMS)


def test_the_environment_loop_uses_prepared_routes_and_scores_as_without_them():
    """``EnvInteractor.evaluate``: one forward per timestep over the playing slots, in a route block of their
    assignment kept until an episode ends, each assignment prepared once. The fitness equals the uncached
    evaluation's and that of a routed call per timestep (the same episodes, the same actions)."""
    import gymnasium as gym

    from populora import interact_with_env

    def fitness(how: str) -> tuple[torch.Tensor, int, int, int]:
        interactor = interact_with_env(gym.make_vec("CartPole-v1", num_envs=6, vectorization_mode="sync"))
        pop = interactor.population(policy(), pop_size=8, low_rank=3, seed=0)
        store = pop._router.prepared
        if how == "uncached":
            pop._router.prepared = None
        calls = [0]
        if how == "routed call":  # an instance forward: the loop calls the population each timestep
            forward = pop.forward

            def counted(*args, **kwargs):
                calls[0] += 1
                return forward(*args, **kwargs)

            pop.forward = counted
        got = interactor.evaluate(pop, horizon=60, num_episodes=2)
        interactor.close()
        return got, store.hits, store.builds, calls[0]

    prepared_, hits, builds, calls = fitness("prepared")
    assert calls == 0 and hits > 5 * builds > 0  # many timesteps per assignment: prepared once, used many times
    assert prepared_.shape == (8,) and prepared_.min() > 0
    uncached_, hits, _, _ = fitness("uncached")
    assert torch.equal(prepared_, uncached_) and hits == 0
    called, hits, _, calls = fitness("routed call")
    assert torch.equal(prepared_, called) and calls > 60 and hits > 0


def test_work_prepared_for_a_route_goes_with_it():
    """Gathered work is keyed on the route's index tensor: when the route goes (a route block dropped at the
    end of an episode), so does the work (no stale entry waits for eviction); the end of the scope drops the
    rest."""
    pop = population(P=32)
    store = pop._router.prepared
    x = torch.randn(6, 4)
    ids = np.array([1, 5, 9, 12, 20, 31])
    want = reference(pop, x, {"individuals": ids})
    with pop.prepared_scope():  # (an env evaluation's: the block is entered once per timestep)
        with torch.inference_mode():
            block = pop.route(individuals=ids)
            for _ in range(3):
                with block:
                    close(pop.model(x), want)
        per_route = [key for key in store._entries if key[1] != "stack"]
        assert len(per_route) == 2 and store.hits == 4  # both targets, prepared on the first forward
        del block
        assert [key for key in store._entries if key[1] != "stack"] == []
        assert store.nbytes == sum(entry.nbytes for entry in store._entries.values()) > 0  # the stacks stay
    assert len(store) == 0 and store.nbytes == 0


WRITES = {
    "mutate_": lambda pop: pop.mutate_(all_individuals=True, epsilon=0.5),
    "evolve_": lambda pop: pop.evolve_(torch.arange(pop.pop_size, dtype=torch.float32)),
    "set_factors_": lambda pop: pop.set_factors_(
        3, [Factors(torch.randn_like(d[3]), torch.randn_like(u[3])) for d, u in pop.factors()]
    ),
    "load_state_dict": lambda pop: pop.load_state_dict(population(Population.__new__ and policy(9)).state_dict()),
    "optimizer step": lambda pop: _adam_step(pop),
    "param.data =": lambda pop: [setattr(p, "data", p.data + 0.25) for p in pop.adapter_parameters()],
    "in-place on the stack": lambda pop: _no_grad(pop.adapter_parameters()[-1].mul_, 2.0),
    "through a detached view": lambda pop: pop.factors()[0].up.detach().add_(1.0),
    "the base weight in place": lambda pop: _no_grad(pop.model[0].weight.add_, 0.5),
    "the base bias swapped": lambda pop: setattr(pop.model[2], "bias", nn.Parameter(torch.ones(2))),
}


def _no_grad(fn, *args):
    with torch.no_grad():
        fn(*args)


def _adam_step(pop: Population) -> None:
    for p in pop.adapter_parameters():
        p.requires_grad_(True)
    opt = torch.optim.Adam(pop.adapter_parameters(), lr=0.1)
    x, ids = torch.randn(8, 4), torch.arange(8)
    pop(x, individuals=ids).square().sum().backward()
    opt.step()


@pytest.mark.parametrize("write", list(WRITES))
@pytest.mark.parametrize("name", ["one row per id", "every id"])
def test_any_write_invalidates_what_was_prepared(write, name):
    pop = population()
    ids = IDS[name]
    x = torch.randn(len(ids), 4, generator=torch.Generator().manual_seed(5))
    with pop.prepared_scope():  # (the stamps, inside a scope)
        before = routed(pop, x, {"individuals": ids})
        routed(pop, x, {"individuals": ids})
        assert pop._router.prepared.hits > 0
        WRITES[write](pop)
        want = reference(pop, x, {"individuals": ids})
        assert not torch.allclose(want, before)  # the write changed the outputs
        close(routed(pop, x, {"individuals": ids}), want)
        close(routed(pop, x, {"individuals": ids}), want)


def test_stacks_swapped_between_calls_are_never_mixed_up():
    """``forward_factors`` with new stacks each call (possibly at a freed one's address) gets its own."""
    pop = population()
    x = torch.randn(5, 4)
    ids = IDS["one row per id"]
    with pop.prepared_scope():
        for seed in range(4):
            gen = torch.Generator().manual_seed(seed)
            stacks = [
                Factors(torch.randn(d.shape, generator=gen), torch.randn(u.shape, generator=gen))
                for d, u in pop.factors()
            ]
            with torch.inference_mode():
                got = pop.forward_factors(stacks, x, individuals=ids)
            with uncached(pop), torch.inference_mode():
                want = pop.forward_factors(stacks, x, individuals=ids)
            close(got, want)
            del stacks


def test_preparation_is_off_while_grad_is_enabled():
    pop = population(requires_grad=True)
    x = torch.randn(5, 4)
    for _ in range(3):
        out = pop(x, individuals=IDS["one row per id"])
    out.sum().backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in pop.adapter_parameters())
    with pop.prepared_scope():
        with torch.no_grad():  # no_grad counts like inference_mode
            pop(x, individuals=IDS["one row per id"])
        store = pop._router.prepared
        assert store.builds > 0 and store.hits == 0
        store.clear()
        with torch.enable_grad():
            pop(x, individuals=IDS["one row per id"])
        assert store.builds > 0 and len(store) == 0


def test_a_plan_made_under_inference_mode_is_not_reused_with_grad():
    """The planner's cache keeps plans made under inference_mode apart: their index tensors cannot be saved
    for backward (an env evaluation, then a gradient step on the same ids)."""
    ids = np.array([6, 1, 3, 3, 0])
    x = torch.randn(5, 4)
    with torch.inference_mode():
        population()(x, individuals=ids)
    pop = population(requires_grad=True)
    pop(x, individuals=ids).sum().backward()
    assert pop.adapter_parameters()[0].grad.abs().sum() > 0


@pytest.mark.parametrize("name, route, rows", list(routes()))
def test_zero_adapters_give_exactly_the_base_model(name, route, rows):
    """``init_scale=0`` before any change: every delta is zero, the prepared forward is the layer's own."""
    model = policy()
    base = policy()
    pop = Population(model, pop_size=8, low_rank=3, seed=1, init_scale=0.0)
    x = torch.randn(rows, 4, generator=torch.Generator().manual_seed(6))
    with pop.prepared_scope():
        for _ in range(2):
            assert torch.equal(routed(pop, x, route), base(x))
        assert {entry.form for key, entry in pop._router.prepared._entries.items() if key[1] != "stack"} == {"zero"}
        pop.mutate_(all_individuals=True, epsilon=0.1)
        close(routed(pop, x, route), reference(pop, x, route))
        assert not torch.allclose(routed(pop, x, route), base(x))


def test_inference_tensors_are_never_prepared():
    """A population made under inference_mode has adapters without version counters: nothing is kept."""
    with torch.inference_mode():
        pop = population()
        x = torch.randn(5, 4)
        got = pop(x, individuals=IDS["one row per id"])
    assert len(pop._router.prepared) == 0
    close(got, reference(pop, x, {"individuals": IDS["one row per id"]}))


@pytest.mark.parametrize("budget", [0, 3000, 40_000])
def test_the_prepared_bytes_stay_within_the_budget(budget):
    pop = population(P=32)
    store = pop._router.prepared
    store.budget = budget
    gen = np.random.default_rng(0)
    with pop.prepared_scope():
        for step in range(20):  # many assignments, as an env loop's ends of episodes make
            ids = np.sort(gen.choice(32, 6, replace=False))
            x = torch.randn(6, 4)
            close(routed(pop, x, {"individuals": ids}), reference(pop, x, {"individuals": ids}))
            held = sum(entry.nbytes for entry in store._entries.values())
            assert store.nbytes == held <= budget
        if budget == 0:
            assert len(store) == 0 and store.builds == 0
        else:
            assert store.builds > 0
        store.budget = 0  # lowering it drops what no longer fits
        assert store.nbytes == 0 and len(store) == 0


def test_the_population_drops_its_prepared_work_when_it_writes():
    pop = population()
    with pop.prepared_scope():
        routed(pop, torch.randn(5, 4), {"individuals": IDS["one row per id"]})
        assert len(pop._router.prepared) > 0
        pop.mutate_(individual=2, epsilon=0.1)
        assert len(pop._router.prepared) == 0 and pop._router.prepared.nbytes == 0


def test_the_cost_model_is_a_pure_function_of_shapes(monkeypatch):
    args = [
        (64, 1, 4, 32, 4, torch.float32, "cpu", True),
        (16, 1, 32, 2, 4, torch.float32, "cpu", False),
        (16, 4, 256, 256, 16, torch.float32, "cpu", True),
        (4, 32, 1024, 1024, 8, torch.float32, "cpu", True),
        (64, 1, 4, 32, 4, torch.bfloat16, "cuda", True),
    ]
    first = [choose_form(*a) for a in args]

    def no_clock(*_):
        raise AssertionError("the cost model read a clock")

    for name in ("perf_counter", "perf_counter_ns", "thread_time", "process_time", "monotonic", "time"):
        monkeypatch.setattr(time, name, no_clock)
    assert [choose_form(*a) for a in args] == first  # the same answers, no timing
    assert first[3] == "products"  # too large to merge
    assert form_costs(1024, 64, 64, 64, 4, torch.float32, "cpu", True)["merged-broadcast"] == float("inf")
    assert first[4] == "products"  # no constants measured for this (device, dtype)
    assert form_costs(*args[4]) is None
    assert all(f in cost.FORMS for f in first)
    costs = form_costs(*args[0])
    assert set(costs) == set(cost.FORMS) and all(v > 0 for v in costs.values())
    assert first[0] == min(costs, key=costs.__getitem__)
    # an LLM's layer is never merged, whatever the constants say
    assert choose_form(1, 1, 4096, 4096, 16, torch.float32, "cpu", True) == "products"
    # with the clock gone, a prepared forward still runs (its choice reads no clock either)
    pop = population()
    x = torch.randn(5, 4)
    with torch.inference_mode():
        pop(x, individuals=IDS["one row per id"])


def test_the_committed_constants_choose_merged_weights_for_a_small_policy():
    """The measured constants say what the design expects: a 4-32-2 policy's layers are cheaper merged at an
    env loop's sizes, a transformer's are not."""
    for groups in (1, 16, 64, 256):
        assert choose_form(groups, 1, 4, 32, 4, torch.float32, "cpu", True) != "products"
        assert choose_form(groups, 1, 32, 2, 4, torch.float32, "cpu", True) != "products"
    assert choose_form(8, 128, 256, 256, 4, torch.float32, "cpu", True) == "products"


def test_rows_without_adapters_run_the_plain_model_alone():
    """Routing off, or every row BASE (no grad): the base model's output, bitwise, and no delta computed (the
    GEMM operators run are the plain model's, counted with the profiler)."""
    from populora import BASE

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 8))
    pop = Population(model, pop_size=4, low_rank=2, seed=0, init_scale=1.0)
    x = torch.randn(6, 64)
    base = np.full(6, BASE)

    def gemms(fn):
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            out = fn()
        names = ("aten::mm", "aten::bmm", "aten::baddbmm", "aten::addmm", "aten::mul", "aten::addcmul")
        return out, sum(e.count for e in prof.key_averages() if e.key in names)

    with torch.inference_mode():
        want, plain = gemms(lambda: model(x))
        for call in (lambda: pop(x), lambda: pop(x, individuals=base), lambda: pop(x, individual=BASE)):
            got, count = gemms(call)
            assert torch.equal(got, want) and count == plain
        one, count = gemms(lambda: pop(x[:1], individuals=base[:1]))  # (one row: the general path)
        assert torch.equal(one, model(x[:1])) and count == plain
        assert len(pop._router.prepared) == 0  # nothing routed, nothing prepared
        mixed = pop(x, individuals=np.array([BASE, 1, BASE, 2, 3, BASE]))
        assert torch.equal(mixed[[0, 2, 5]], want[[0, 2, 5]]) and not torch.allclose(mixed[1], want[1])


def test_copies_and_pickles_of_a_population_start_with_nothing_prepared():
    import copy
    import pickle

    pop = population()
    x, route = torch.randn(5, 4), {"individuals": IDS["one row per id"]}
    with pop.prepared_scope():
        want = routed(pop, x, route)
        assert len(pop._router.prepared) > 0
        for twin in (copy.deepcopy(pop), pickle.loads(pickle.dumps(pop))):
            assert len(twin._router.prepared) == 0 and twin._router.prepared.budget == pop._router.prepared.budget
            assert twin._router.prepared.depth == 0  # (the copy is outside its original's scope)
            close(routed(twin, x, route), want)
            twin.mutate_(all_individuals=True, epsilon=0.5)  # its own adapters: the original's entries stay valid
            close(routed(pop, x, route), want)


def test_the_cost_model_script_fits_every_constant_and_writes_the_committed_file(tmp_path, monkeypatch):
    """``benchmarks/cost_model.py`` (a smoke run: its timings are not asserted): every constant the model reads
    is fitted, non-negative, and the file it writes is the committed one for the same constants."""
    import importlib.util
    from pathlib import Path

    from populora.routing import cost_constants

    path = Path(__file__).resolve().parents[2] / "benchmarks" / "cost_model.py"
    spec = importlib.util.spec_from_file_location("cost_model_script", path)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    fits = script.measure(torch.device("cpu"), torch.float32, repeats=1, min_block=0.0002, quick=True)
    committed = cost_constants.CONSTANTS[("cpu", "float32")]
    assert set(fits) == set(committed) == {"linear", "bmm", "ew"}
    assert all(len(fits[name]) == len(committed[name]) and min(fits[name]) >= 0 for name in fits)
    out = tmp_path / "cost_constants.py"
    monkeypatch.setattr(script, "CONSTANTS_FILE", out)
    script.write(cost_constants.CONSTANTS)
    assert out.read_text() == Path(cost_constants.__file__).read_text()


def test_a_loop_route_stands_in_for_the_routed_call_unless_the_call_does_more():
    pop = population()
    x = torch.randn(5, 4)
    for route in ({"individuals": IDS["one row per id"]}, {"individual": 6}):
        want = routed(pop, x, route)
        block = pop.loop_route(**route)
        with torch.inference_mode():
            for _ in range(2):
                with block:  # (merged weights inside the block, the products outside: to rounding)
                    close(pop.model(x), want)
            assert pop._router.active is None  # routing only while entered
    handle = pop.register_forward_hook(lambda module, args, out: out * 2)
    assert pop.loop_route(individual=1) is None
    handle.remove()
    pop.forward = lambda *args, **kwargs: None  # an instance's forward
    assert pop.loop_route(individual=1) is None
    del pop.forward

    class Scaled(Population):
        def forward(self, *args, **kwargs):
            return super().forward(*args, **kwargs) * 2

    assert Scaled(policy(), pop_size=4, low_rank=2).loop_route(individual=0) is None
    assert pop.loop_route(individual=1) is not None


def test_preparation_stops_when_the_models_work_does_not_fit_together():
    """Four large targets whose gathered factors fit the budget one or two at a time (an LLM's, in small): the
    first forward finds an entry dropped before it was used again and stops preparing, instead of making and
    dropping one per target and call; the outputs stay the uncached ones. A write starts it again."""
    torch.manual_seed(0)
    model = nn.Sequential(*(nn.Linear(300, 300) for _ in range(4)))
    pop = Population(model, pop_size=8, low_rank=4, seed=0, init_scale=1.0)
    store = pop._router.prepared
    ids = IDS["one row per id"]
    per_target = len(ids) * 4 * (300 + 300) * 4  # gathered down_g and up_g, float32
    store.budget = int(2.5 * per_target)
    x = torch.randn(len(ids), 300, generator=torch.Generator().manual_seed(7))
    want = reference(pop, x, {"individuals": ids})
    with pop.prepared_scope():
        assert torch.equal(routed(pop, x, {"individuals": ids}), want)
        assert store.stopped and store.builds == 2 and store.nbytes <= store.budget
        for _ in range(3):
            assert torch.equal(routed(pop, x, {"individuals": ids}), want)
        assert store.builds == 2 and store.hits == 0  # nothing made or used once stopped
        pop.mutate_(all_individuals=True, epsilon=0.1)
        assert not store.stopped
        store.budget = 4 * per_target  # now all fit: prepared once, then used
        for _ in range(2):
            close(routed(pop, x, {"individuals": ids}), reference(pop, x, {"individuals": ids}))
        assert not store.stopped and store.hits == 4
