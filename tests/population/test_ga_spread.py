"""The genetic algorithm on a population spread over devices (issue 12, item 6b).

A model loaded with ``device_map="auto"`` keeps each target's adapter stacks
on that target's device, while the population's ids, fitnesses and generator
live on its first device. CPU-only machines fake the second device with
``meta`` (shapes only): after building a population on CPU, the middle
target's layer and adapter stacks move to ``meta``. Every GA step then runs
under :class:`StrictDevices`, which raises on any op mixing tensors of two
devices except an explicit move (``.to`` / ``copy_``), the rule accelerators
apply between each other (``meta`` alone would let CPU ids index it). The
CPU targets must come out bit for bit as on a twin population kept entirely
on CPU (same seed, same calls): the draws made for the meta target consume
the generator as before, so the target after it sees the same numbers too.
"""

from __future__ import annotations

import pytest
import torch
from torch import Tensor, nn
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_leaves

from populora import Population, register_crossover, register_mutation
from populora.operators import CROSSOVERS, MUTATIONS, PARENT_SELECTIONS, SELECTIONS, Factors, crossover, mutation
from populora.operators.devices import PerDevice

CPU, META = torch.device("cpu"), torch.device("meta")
P, R = 8, 3
SPREAD = 1  # the index of the target (and layer) moved to meta
FITNESS = torch.tensor([3.0, 1.0, 4.0, 1.5, 5.0, 9.0, 2.0, 6.0])
_MOVES = {"to", "copy_", "cpu", "cuda", "_to_copy"}


def builtin(registry: dict, module) -> list[str]:
    """The operators a module registers (not those other tests register and remove)."""
    return sorted(name for name, fn in registry.items() if getattr(fn, "__module__", None) == module.__name__)


CROSSOVER_NAMES = builtin(CROSSOVERS, crossover)
MUTATION_NAMES = builtin(MUTATIONS, mutation)


class StrictDevices(TorchFunctionMode):
    """Raise on an op whose tensors sit on more than one device (CPU 0-dim scalars excepted), unless it moves data."""

    def __init__(self):
        super().__init__()
        self.seen: set[torch.device] = set()

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if getattr(func, "__name__", "") not in _MOVES:
            devices = {
                t.device
                for t in tree_leaves((args, kwargs))
                if isinstance(t, Tensor) and not (t.dim() == 0 and t.device.type == "cpu")
            }
            self.seen |= devices
            if len(devices) > 1:
                raise RuntimeError(
                    f"cross-device op {getattr(func, '__qualname__', func)} on {sorted(map(str, devices))}"
                )
        return func(*args, **kwargs)


class Three(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.a, self.b, self.c = nn.Linear(6, 5), nn.Linear(5, 7), nn.Linear(7, 4)


def pair(seed: int = 1, **kwargs) -> tuple[Population, Population]:
    """``(spread, twin)``: the same population, one with target ``b`` (layer and stacks) on meta."""
    spread = Population(Three(), pop_size=P, low_rank=R, seed=seed, init_scale=0.5, **kwargs)
    twin = Population(Three(), pop_size=P, low_rank=R, seed=seed, init_scale=0.5, **kwargs)
    spread.model.b.to(META)
    for stacks in (spread._downs, spread._ups):
        stacks[SPREAD] = nn.Parameter(torch.empty_like(stacks[SPREAD], device=META), requires_grad=False)
    return spread, twin


def check_same(spread: Population, twin: Population) -> None:
    """CPU targets bitwise equal to the twin's, the meta target still meta of its shape, same generator."""
    for t in range(len(spread.target_names)):
        for mine, theirs in ((spread._downs[t], twin._downs[t]), (spread._ups[t], twin._ups[t])):
            if t == SPREAD:
                assert mine.device == META and mine.shape == theirs.shape and mine.dtype == theirs.dtype
            else:
                assert mine.device == CPU and torch.equal(mine, theirs), spread.target_names[t]
    assert torch.equal(spread.generator.get_state(), twin.generator.get_state())
    assert (spread.generation, spread.eval_seed, spread.history) == (twin.generation, twin.eval_seed, twin.history)


def both(spread: Population, twin: Population, op, stacks: bool = True):
    """Run ``op`` on the spread population under StrictDevices and on the twin; compare.

    ``stacks``: the op reads or writes the stacks (so the meta target must have taken part).
    """
    with StrictDevices() as strict:
        out = op(spread)
    assert (META in strict.seen) == stacks
    expected = op(twin)
    check_same(spread, twin)
    return out, expected


def snapshot(pop: Population) -> list[Tensor]:
    return [p.detach().clone() for p in (*pop._downs, *pop._ups)] + [pop.generator.get_state()]


def test_strict_devices_catches_an_index_across_devices():
    """The guard itself: CPU ids on meta stacks raise (meta alone would accept them), moves pass."""
    stack, ids = torch.empty(5, 3, device=META), torch.tensor([1, 0])
    assert stack[ids].device == META  # why the guard is needed
    with StrictDevices(), pytest.raises(RuntimeError, match=r"cross-device op .*\['cpu', 'meta'\]"):
        stack[ids]
    with StrictDevices():
        assert stack[ids.to(META)].shape == (2, 3)
        assert (torch.ones(3) * torch.tensor(2.0)).shape == (3,)  # a CPU scalar goes anywhere, as on CUDA


def test_per_device_copies_once_and_returns_the_original_in_place():
    ids = torch.tensor([2, 0, 1])
    per = PerDevice(ids)
    assert per.on(CPU) is ids and per.on("cpu") is ids
    first = per.on(META)
    assert first.device == META and first.shape == (3,) and per.on(META) is first
    assert "meta" in repr(per) and "(3,)" in repr(per)


def test_the_spread_population_has_its_layout():
    spread, twin = pair()
    assert spread.device == CPU
    assert [d.device for d in spread._downs] == [CPU, META, CPU]
    assert [tuple(f.down.shape) for f in spread.factors()] == [tuple(f.down.shape) for f in twin.factors()]


@pytest.mark.parametrize("name", sorted(PARENT_SELECTIONS))
def test_select_parents(name):
    spread, twin = pair()
    out, expected = both(spread, twin, lambda pop: pop.select_parents(name, FITNESS, culled=[1, 3, 6]), stacks=False)
    assert out.device == CPU and torch.equal(out, expected)


@pytest.mark.parametrize("name", sorted(SELECTIONS))
def test_select(name):
    spread, twin = pair()
    out, expected = both(spread, twin, lambda pop: pop.select(name, FITNESS, survive_frac=0.5), stacks=False)
    assert torch.equal(out.selected_out_indices, expected.selected_out_indices)


@pytest.mark.parametrize("name", CROSSOVER_NAMES)
def test_crossover(name):
    spread, twin = pair()
    k = 2 if name in ("svd_subspace", "extrapolative") else 3
    table = torch.tensor([[5, 2, 7], [4, 0, 5], [7, 7, 2]])[:, :k]
    before = spread._downs[0].detach().clone()
    for _ in range(2):  # twice: the second reads children written by the first
        both(spread, twin, lambda pop: pop.crossover_(name, table, [1, 3, 6], fitnesses=FITNESS))
    changed = (spread._downs[0] != before).flatten(1).any(1)
    assert changed.tolist() == [i in (1, 3, 6) for i in range(P)]  # only the children's slots, all of them


def test_crossover_with_islands():
    spread, twin = pair()
    both(spread, twin, lambda pop: pop.crossover_("xes", [[0, 2], [5, 7]], [1, 4], fitnesses=FITNESS, num_groups=2))


@pytest.mark.parametrize("name", MUTATION_NAMES)
@pytest.mark.parametrize("selector", [dict(individuals=[6, 1, 3, 1]), dict(individual=2), dict(all_individuals=True)])
def test_mutate(name, selector):
    spread, twin = pair()
    for _ in range(2):
        both(spread, twin, lambda pop: pop.mutate_(name, epsilon=0.3, **selector))


@pytest.mark.parametrize(
    "crossover_type, mutation_type",
    [
        ("average", "full_gaussian"),
        ("xes", "layer_selective_gaussian"),
        ("layer_wise", "svd_structured"),
        ("extrapolative", "neftune_style"),
        ("svd_subspace", "component_masking"),
        ("dare", "full_gaussian"),
        ("average_delta", "full_gaussian"),
    ],
)
def test_evolve(crossover_type, mutation_type):
    spread, twin = pair(seed=4)
    for generation in range(3):
        f = FITNESS.roll(generation)
        out, expected = both(
            spread,
            twin,
            lambda pop: pop.evolve_(f, crossover_type=crossover_type, mutation_type=mutation_type, epsilon=0.2),
        )
        assert torch.equal(out.selected_out_indices, expected.selected_out_indices)
    assert spread.generation == 3 and len(spread.history) == 3


def test_evolve_with_islands():
    spread, twin = pair(seed=2)
    for _ in range(2):
        both(
            spread,
            twin,
            lambda pop: pop.evolve_(
                FITNESS, num_groups=2, crossover_type="xes", mutation_type="layer_selective_gaussian"
            ),
        )


def test_set_factors():
    spread, twin = pair()
    new = [
        (torch.full((d.shape[1], d.shape[2]), 0.25), torch.full((u.shape[1], u.shape[2]), -0.5))
        for d, u in twin.factors()
    ]
    both(spread, twin, lambda pop: pop.set_factors_(5, new))
    assert torch.equal(twin.factors()[0].down[5], new[0][0])


def test_select_and_merge_best():
    spread, twin = pair()
    spread.evolve_(FITNESS)
    twin.evolve_(FITNESS)
    with StrictDevices():
        model = spread.select_and_merge_best_(FITNESS)
    expected = twin.select_and_merge_best_(FITNESS)
    assert model.b.weight.device == META and model.b.weight.shape == (7, 5)
    for name in ("a", "c"):
        assert torch.equal(getattr(model, name).weight, getattr(expected, name).weight)
    assert not torch.equal(expected.a.weight, Three().a.weight)  # something was merged


# ---------------------------------------------------------------- undo on error


@pytest.fixture
def raising():
    @register_mutation("test_spread_raises")
    def raises_after_drawing(factors, *, epsilon, weight_scales, generator):
        torch.randn(50, generator=generator)
        raise RuntimeError("mutation failed on purpose")

    @register_crossover("test_spread_raises")
    def crossover_raises(stacks, parents, *, fitnesses, generator, num_groups):
        torch.randn(50, generator=generator)
        raise RuntimeError("crossover failed on purpose")

    yield
    del MUTATIONS["test_spread_raises"], CROSSOVERS["test_spread_raises"]


@pytest.mark.parametrize(
    "call",
    [
        lambda pop: pop.mutate_("test_spread_raises", individuals=[1, 3]),
        lambda pop: pop.crossover_("test_spread_raises", [[0, 2], [4, 5]], [1, 3]),
        lambda pop: pop.evolve_(FITNESS, mutation_type="test_spread_raises"),
        lambda pop: pop.evolve_(FITNESS, crossover_type="test_spread_raises"),
    ],
    ids=["mutate_", "crossover_", "evolve_ mutation", "evolve_ crossover"],
)
def test_undo_on_error(raising, call):
    spread, twin = pair()
    both(spread, twin, lambda pop: pop.evolve_(FITNESS))  # something to roll back to
    before = snapshot(spread)
    with StrictDevices(), pytest.raises(RuntimeError, match="failed on purpose"):
        call(spread)
    after = snapshot(spread)
    for t, (old, new) in enumerate(zip(before, after)):
        if old.device == META:
            assert new.device == META and new.shape == old.shape
        else:
            assert torch.equal(old, new), t
    assert spread.generation == twin.generation
    both(spread, twin, lambda pop: pop.evolve_(FITNESS.flip(0)))  # and it carries on as the untouched twin


# ---------------------------------------------------------------- the operators called directly


def stacks_on(devices: list[torch.device], seed: int = 0) -> list[Factors]:
    gen = torch.Generator().manual_seed(seed)
    out = []
    for (d, e), device in zip([(6, 5), (5, 7), (7, 4)], devices):
        down, up = torch.randn(P, d, R, generator=gen), torch.randn(P, e, R, generator=gen)
        out.append(Factors(down.to(device), up.to(device)))
    return out


@pytest.mark.parametrize("name", CROSSOVER_NAMES)
def test_crossover_operator_keeps_each_target_on_its_device(name):
    k = 2 if name in ("svd_subspace", "extrapolative") else 3
    table = torch.tensor([[5, 2, 7], [4, 0, 5], [7, 7, 2]])[:, :k]
    cpu, mixed = stacks_on([CPU, CPU, CPU]), stacks_on([CPU, META, CPU])
    g1, g2 = torch.Generator().manual_seed(3), torch.Generator().manual_seed(3)
    expected = CROSSOVERS[name](cpu, table, fitnesses=FITNESS, generator=g1)
    with StrictDevices():
        out = CROSSOVERS[name](mixed, table, fitnesses=FITNESS, generator=g2)
    assert [f.down.device for f in out] == [CPU, META, CPU] and [f.up.device for f in out] == [CPU, META, CPU]
    for t in (0, 2):
        assert torch.equal(out[t].down, expected[t].down) and torch.equal(out[t].up, expected[t].up)
    assert out[1].down.shape == expected[1].down.shape and out[1].up.shape == expected[1].up.shape
    assert torch.equal(g1.get_state(), g2.get_state())


@pytest.mark.parametrize("name", MUTATION_NAMES)
def test_mutation_operator_keeps_each_target_on_its_device(name):
    cpu, mixed = stacks_on([CPU, CPU, CPU]), stacks_on([CPU, META, CPU])
    g1, g2 = torch.Generator().manual_seed(3), torch.Generator().manual_seed(3)
    scales = [0.3, 0.2, 0.4]
    expected = MUTATIONS[name](cpu, epsilon=0.2, weight_scales=scales, generator=g1)
    with StrictDevices():
        out = MUTATIONS[name](mixed, epsilon=0.2, weight_scales=scales, generator=g2)
    assert [f.down.device for f in out] == [CPU, META, CPU]
    for t in (0, 2):
        assert torch.equal(out[t].down, expected[t].down) and torch.equal(out[t].up, expected[t].up)
    assert torch.equal(g1.get_state(), g2.get_state())


def test_a_dtype_change_keeps_the_device_and_generator_of_a_spread_population():
    """``.double()`` moves no stack across devices: the population keeps its device and is not reseeded."""
    spread, twin = pair()
    state = spread.generator.get_state().clone()
    spread.double()
    assert spread.device == CPU and torch.equal(spread.generator.get_state(), state)
    assert spread._downs[0].dtype == torch.float64 and spread._downs[SPREAD].device == META
