"""`individuals=` routing over many tiny groups: gathered adapters are processed in blocks of bounded size.

With about one row per id, gathering each group's adapters copies ``r * (d + e)`` values per row, ``r``
times the activations (DESIGN.md rules such a per-row copy of the weights out). The router processes the
gathered groups in blocks whose adapters fit :func:`populora.routing.gather_budget`; these tests check that
the blocked path routes exactly like the one-block path, and that the memory it holds is bounded
(allocator events of the torch profiler: sizes, not time).
"""

import copy

import numpy as np
import pytest
import torch
from models import TinyTransformer, mlp, routed_call
from torch import nn
from torch._C._profiler import _EventType

import populora.routing.delta as delta_module  # add_delta reads gather_budget from its own module
from populora import Population
from populora.adapters import Adapter
from populora.routing.delta import gather_budget
from populora.routing.plan import PLANNER
from populora.routing.router import Router


def allocations(fn) -> tuple[int, int]:
    """``(peak, largest)``: the most bytes torch held on the CPU during ``fn()`` above the level at its start,
    and the largest single allocation (from the profiler's allocator events, in time order)."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    stack, events = list(prof.profiler.kineto_results.experimental_event_tree()), []
    while stack:
        node = stack.pop()
        stack.extend(node.children)
        if node.tag == _EventType.Allocation and node.extra_fields.device.type == "cpu":
            events.append((node.start_time_ns, node.extra_fields.alloc_size))
    held = peak = 0
    for _, size in sorted(events):
        held += size
        peak = max(peak, held)
    return peak, max(size for _, size in events)


def tiny_groups(r: int, P: int = 1024, d: int = 64):
    """P individuals, P rows with random ids (about 1.6 rows per id present, ids missing): the gather path."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(d, d), nn.GELU(), nn.Linear(d, d)).eval()
    pop = Population(model, pop_size=P, low_rank=r)
    x = torch.randn(P, d)
    ids = torch.randint(0, P, (P,), generator=torch.Generator().manual_seed(0))
    return pop, x, ids


def test_gathered_adapters_are_bounded_whatever_the_rank():
    """r = 16 holds at most one gather budget more than r = 1 (before: 2.5x the peak, an 11x copy of the rows)."""
    peaks = {}
    for r in (1, 16):
        pop, x, ids = tiny_groups(r)
        with torch.inference_mode():
            pop(x, individuals=ids)  # the plan is cached: the profiled call allocates only the forward's tensors
            peaks[r], largest = allocations(lambda: pop(x, individuals=ids))
    n, d = x.shape
    budget = gather_budget(torch.device("cpu"), 3 * n * d * 4)  # packed input (< 2n rows) and output of a layer
    assert budget == 1 << 20  # the floor: these activations are smaller
    assert largest <= budget, largest  # no allocation holds more gathered adapters than one block
    h_growth = 2 * n * (16 - 1) * 4  # the (k, c, r) low-rank activations grow with r, as in every layout
    assert peaks[16] <= peaks[1] + budget + h_growth, peaks


def merged_reference(pop, base, x, ids):
    """Row j through individual ids[j]'s merged weights."""
    outs = []
    for j, i in enumerate(ids):
        clone = copy.deepcopy(base)
        modules = dict(clone.named_modules())
        for name, dw in pop.delta_weight(int(i)).items():
            modules[name].weight.data += dw
        outs.append(clone(x[j : j + 1]))
    return torch.cat(outs)


@pytest.mark.parametrize("per_row", [0, 4])  # the padded (k c) layout; a few rows per id: one row per group
@pytest.mark.parametrize("kind", ["mlp", "transformer"])
@pytest.mark.parametrize("budget", [1, 2000])  # one group per block, a few groups per block
def test_blocked_gather_routes_like_one_block(kind, budget, per_row, monkeypatch):
    monkeypatch.setattr(PLANNER, "per_row", per_row)
    torch.manual_seed(0)
    if kind == "mlp":
        model, x = mlp(), torch.randn(12, 6)
        targets = None
    else:
        model, x = TinyTransformer(), torch.randint(0, 11, (12, 8))
        targets = ["embed", "*.q", "*.k", "*.v", "*.o", "*.mlp.*", "head"]
    base = copy.deepcopy(model)
    pop = Population(model, pop_size=6, low_rank=3, lora_targets=targets, init_scale=0.5)
    layouts = [
        [3, 0, 5, 5, 1, 3, 3, 0, 2, 5, 5, 5],  # unequal groups, id 4 absent (padded (k c) layout)
        [4, 1, 2, 4, 1, 2, 4, 1, 2, 4, 1, 2],
    ]  # equal groups of a subset (in place)
    with torch.no_grad():
        one_block = [pop(x, individuals=ids) for ids in layouts]
        monkeypatch.setattr(delta_module, "gather_budget", lambda device, activation_bytes: budget)
        for ids, want in zip(layouts, one_block):
            out = pop(x, individuals=ids)
            torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-6)  # block shapes differ: tolerance
            torch.testing.assert_close(out, merged_reference(pop, base, x, ids), rtol=1e-5, atol=1e-5)
            # rows kept in input order (as with a KV cache): each block gathers its rows through `order`
            route, perm = PLANNER.plan(np.asarray(ids), 6, torch.device("cpu"), keep_order=True)
            if ids == layouts[0] and per_row:  # unequal, 2.4 rows per id: every row its own group, in input order
                assert perm is None and route.order is None and route.dest is None
                assert (route.groups, route.chunk) == (12, 1) and route.index.tolist() == ids
            else:
                assert perm is None and route.order is not None
            kept = pop._router.run(route, pop.adapters(), pop.model, (x,))
            torch.testing.assert_close(kept, want, rtol=1e-5, atol=1e-6)


def test_blocked_gather_with_bias_and_grad(monkeypatch):
    """Bias adapters (as ES uses them) and gradients go through the blocks like through one block."""
    torch.manual_seed(0)
    model = mlp()
    for p in model.parameters():
        p.requires_grad_(False)
    layers = {"0": model[0], "2": model[2]}
    router = Router(layers)
    P = 5
    adapters = [
        Adapter(
            torch.randn(P, 2, layer.in_features, requires_grad=True),
            torch.randn(P, 2, layer.out_features, requires_grad=True),
            torch.randn(P, layer.out_features, requires_grad=True),
        )
        for layer in layers.values()
    ]
    x = torch.randn(9, 6)
    ids = [4, 0, 0, 2, 4, 4, 0, 2, 2]  # id 1, 3 absent

    def run():
        out = routed_call(model, router, adapters, P, (x,), {}, individuals=ids)
        grads = torch.autograd.grad(out.square().sum(), [t for a in adapters for t in a])
        return out.detach(), grads

    want, want_grads = run()
    expected = []
    for j, i in enumerate(ids):  # row j by hand: each layer's base output + x @ down[i].T @ up[i] + bias[i]
        h = x[j : j + 1]
        for k, layer in enumerate(layers.values()):
            a = adapters[k]
            h = layer(h) + h @ a.down[i].T @ a.up[i] + a.bias[i]
            h = nn.functional.gelu(h) if k == 0 else h
        expected.append(h)
    torch.testing.assert_close(want, torch.cat(expected).detach(), rtol=1e-5, atol=1e-5)
    monkeypatch.setattr(delta_module, "gather_budget", lambda device, activation_bytes: 1)
    out, grads = run()
    torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-5)
    for g, w in zip(grads, want_grads):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)
