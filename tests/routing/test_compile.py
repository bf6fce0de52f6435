"""A routed model under torch.compile: the routed outputs in every layout, and recompiles bounded when ids change.

The ``aot_eager`` backend traces through dynamo and AOTAutograd (every graph
break and guard a real backend meets) but runs the traced aten ops eagerly,
so it is fast and its outputs match eager mode's to rounding.
"""

import pytest
import torch
import torch._dynamo
from models import TinyTransformer, mlp
from torch._dynamo.utils import counters

from populora import Population

BACKEND = "aot_eager"


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    counters.clear()
    yield
    torch._dynamo.reset()


def graphs() -> int:
    """Graphs compiled so far (each recompile adds one)."""
    return counters["stats"]["unique_graphs"]


def close(a, b):
    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def mlp_population(P=4, requires_grad=False):
    torch.manual_seed(0)
    return Population(mlp(6, 16, 3), pop_size=P, low_rank=2, init_scale=0.5, seed=1, requires_grad=requires_grad)


def transformer_population(P=4):
    torch.manual_seed(0)
    model = TinyTransformer(vocab=11, dim=16, heads=2, depth=1, seq=8)
    return Population(
        model,
        pop_size=P,
        low_rank=2,
        init_scale=0.5,
        seed=1,
        lora_targets=["embed", "blocks.*.attn.*", "blocks.*.mlp.*", "head"],
    )


LAYOUTS = {  # name: (routing kwargs, rows)
    "individual": (dict(individual=2), 8),
    "ids_shuffled": (dict(individuals=torch.tensor([3, 0, 2, 1, 1, 0, 3, 2])), 8),
    "ids_unequal": (dict(individuals=[3, 3, 3, 0, 2, 0, 3, 2]), 8),
    "ids_split": (dict(individuals=[2, 0], split=True), 4),
    "all": (dict(all_individuals=True), 8),
    "all_split": (dict(all_individuals=True, split=True), 8),
    "broadcast": (dict(all_individuals=True, broadcast=True), 3),
    "ids_one_row": (dict(individuals=[1, 3]), 1),
}


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_compiled_population_gives_the_routed_outputs_mlp(layout):
    pop = mlp_population()
    routing, rows = LAYOUTS[layout]
    x = torch.randn(rows, 6)
    with torch.no_grad():
        ref = pop(x, **routing)
        base = pop(x)
        out = torch.compile(pop, backend=BACKEND)(x, **routing)
    assert out.shape == ref.shape
    close(out, ref)
    assert graphs() >= 1  # it was compiled, not skipped
    if "individual" not in routing:
        assert not torch.allclose(ref.reshape(-1, 3)[: len(base)], base)  # the adapters change the outputs


@pytest.mark.parametrize("layout", ["ids_unequal", "all"])
def test_compiled_population_gives_the_routed_outputs_transformer(layout):
    pop = transformer_population()
    routing, rows = LAYOUTS[layout]
    tokens = torch.randint(0, 11, (rows, 5), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ref = pop(tokens, **routing)
        out = torch.compile(pop, backend=BACKEND)(tokens, **routing)
    assert out.shape == ref.shape and out.shape[-1] == 11
    close(out, ref)


def test_compiled_function_calling_the_population():
    pop = mlp_population()
    x = torch.randn(8, 6)
    ids = torch.tensor([3, 0, 2, 1, 1, 0, 3, 2])

    @torch.compile(backend=BACKEND)
    def score(x, ids):
        return pop(x, individuals=ids).square().sum(-1)

    @torch.compile(backend=BACKEND)
    def score_all(x):
        return pop(torch.tanh(x), all_individuals=True).mean(-1)

    with torch.no_grad():
        close(score(x, ids), pop(x, individuals=ids).square().sum(-1))
        close(score_all(x), pop(torch.tanh(x), all_individuals=True).mean(-1))


def test_compiled_population_follows_adapter_updates():
    """The adapters are graph inputs, not constants: an in-place update (evolve_) shows in the next call."""
    pop = mlp_population()
    compiled = torch.compile(pop, backend=BACKEND)
    x = torch.randn(8, 6)
    with torch.no_grad():
        close(compiled(x, all_individuals=True), pop(x, all_individuals=True))
        for up in pop._ups:
            up.mul_(3.0)
        after = compiled(x, all_individuals=True)
    close(after, pop(x, all_individuals=True))
    assert graphs() == 1


def test_compiled_gradients_match_eager():
    pop = mlp_population(requires_grad=True)
    x = torch.randn(8, 6)
    ids = torch.tensor([3, 0, 2, 1, 1, 0, 3, 2])
    compiled = torch.compile(pop, backend=BACKEND)
    eager = torch.autograd.grad(pop(x, individuals=ids).square().sum(), list(pop._ups))
    got = torch.autograd.grad(compiled(x, individuals=ids).square().sum(), list(pop._ups))
    for a, b in zip(got, eager):
        close(a, b)
        assert a.abs().sum() > 0


def test_new_id_values_of_the_same_shape_do_not_recompile():
    pop = mlp_population(P=6)
    compiled = torch.compile(pop, backend=BACKEND)
    x = torch.randn(8, 6)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        compiled(x, individuals=torch.randperm(8, generator=gen) % 4)  # 4 ids present, 2 rows each
        first = graphs()
        for _ in range(4):  # other ids, other orders, the same group sizes
            ids = torch.randperm(6, generator=gen)[:4].repeat(2)[torch.randperm(8, generator=gen)]
            close(compiled(x, individuals=ids), pop(x, individuals=ids))
        assert graphs() == first
        for i in range(6):  # every individual=i: one graph for all of them
            close(compiled(x, individual=i), pop(x, individual=i))
        after_individual = graphs()
        for i in range(6):
            compiled(x, individual=i)
        assert graphs() == after_individual
        assert after_individual - first <= 2  # (a recompile making `i` dynamic at most)


def test_unequal_groups_recompile_a_bounded_number_of_times():
    pop = mlp_population(P=8)
    compiled = torch.compile(pop, backend=BACKEND)
    x = torch.randn(12, 6)
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for _ in range(8):  # random ids: group sizes (and so the route's chunk layout) change every call
            ids = torch.randint(0, 8, (12,), generator=gen)
            close(compiled(x, individuals=ids), pop(x, individuals=ids))
    assert graphs() <= 4  # the first graph, then a dynamic-shape one (not one per call)


def test_compiled_under_inference_mode():
    """Ids reach the graph as a tensor input (a NumPy array's guards break under inference_mode)."""
    pop = mlp_population()
    compiled = torch.compile(pop, backend=BACKEND)
    x = torch.randn(8, 6)
    with torch.inference_mode():
        for ids in ([3, 0, 2, 1, 1, 0, 3, 2], [0, 1, 2, 3, 3, 2, 1, 0], [3, 3, 3, 0, 2, 0, 3, 2]):
            close(compiled(x, individuals=ids), pop(x, individuals=ids))
        close(compiled(x, all_individuals=True), pop(x, all_individuals=True))
