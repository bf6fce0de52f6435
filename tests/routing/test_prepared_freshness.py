"""No routed call ever reads weights from before a write, whatever made the write (``routing.prepared``).

Each write a user can make to a base weight or an adapter (fused Adam / AdamW / SGD, which keep ``_version``
and the storage; ``param.data =`` twice, landing at the freed address; ``.data.copy_`` / ``.data.mul_``;
``half()`` then ``float()``; ``load_state_dict``; ``vector_to_parameters``) is made after the population
has run (and, in 0.5.0, prepared), and is followed by a no-grad forward, a ``generate`` and an environment
evaluation, each compared with a freshly built population of the same weights: bitwise where both run the
uncached path (the no-grad forward outside any scope), to 1e-5 relative elsewhere. The allocator cases first
show the address was reused (repeating until it was), and hold with and without reuse.

Also: targets whose weight is computed (``weight_norm``, ``prune``, before or after the population was
built) route under no grad in every layout, and ``budget=0`` turns preparation off.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from populora import Population
from populora.errors import InvalidTypeError, InvalidValueError

P, RANK = 8, 3
IDS = np.array([1, 3, 4, 6, 7, 3])  # one id per row, a subset, a repeat: gathered merged weights


class Policy(nn.Module):
    """A 4-32-32-2 policy (a CartPole policy) with a ``generate`` that feeds its outputs back ``steps`` times
    (the 32 x 32 layer: a size whose freed storage this allocator hands back to the next tensor of its size)."""

    def __init__(self, seed: int = 0):
        super().__init__()
        gen = torch.Generator().manual_seed(seed)
        self.net = nn.Sequential(nn.Linear(4, 32), nn.Tanh(), nn.Linear(32, 32), nn.Tanh(), nn.Linear(32, 2))
        with torch.no_grad():
            for p in self.net.parameters():
                p.copy_(torch.randn(p.shape, generator=gen) * 0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def generate(self, input_ids: torch.Tensor, attention_mask=None, steps: int = 4) -> torch.Tensor:
        """``(b, 4)`` float inputs -> ``(b, steps, 2)``: every step a forward of the whole batch."""
        x, outs = input_ids, []
        for _ in range(steps):
            out = self(x)
            outs.append(out)
            x = torch.tanh(torch.cat([out, out], -1))
        return torch.stack(outs, 1)


def build(seed: int = 0) -> Population:
    return Population(Policy(seed), pop_size=P, low_rank=RANK, seed=1, init_scale=1.0)


def fresh_copy(pop: Population) -> Population:
    """A population built now, holding ``pop``'s weights as they are (it never ran: nothing prepared)."""
    base = Policy(5)
    base.load_state_dict({k: v.detach().clone() for k, v in pop.model.state_dict().items()})
    twin = Population(base, pop_size=P, low_rank=RANK, seed=1, init_scale=1.0)
    with torch.no_grad():
        for mine, theirs in zip(twin.adapter_parameters(), pop.adapter_parameters(), strict=True):
            mine.copy_(theirs)
    return twin


X = torch.randn(len(IDS), 4, generator=torch.Generator().manual_seed(3))


def forward(pop: Population) -> torch.Tensor:
    with torch.no_grad():
        return pop(X, individuals=IDS)


def generate(pop: Population) -> torch.Tensor:
    return pop.generate(X, individuals=IDS, steps=4)


def env_fitness(pop: Population) -> torch.Tensor:
    import gymnasium as gym

    from populora import interact_with_env

    interactor = interact_with_env(gym.make_vec("CartPole-v1", num_envs=4, vectorization_mode="sync"))
    try:
        return interactor.evaluate(pop, horizon=40, num_episodes=2)
    finally:
        interactor.close()


CHECKS = {"no-grad forward": forward, "generate": generate, "env evaluation": env_fitness}


# ---------------------------------------------------------------------------------------------- writes


def _backward(pop: Population) -> None:
    x = torch.randn(16, 4, generator=torch.Generator().manual_seed(9))
    pop(x, individuals=torch.arange(16) % P).square().sum().backward()


def _fused(kind: str):
    def write(pop: Population) -> None:
        if kind == "SGD":  # unfrozen base weights, as a fine-tuning loop has them
            params = list(pop.model.parameters())
            opt: torch.optim.Optimizer = torch.optim.SGD(params, lr=0.5, fused=True)
        else:
            params = pop.adapter_parameters()
            cls = torch.optim.Adam if kind == "Adam" else torch.optim.AdamW
            opt = cls(params, lr=0.3, fused=True)
        for p in params:
            p.requires_grad_(True)
        _backward(pop)
        before = [p._version for p in params]
        opt.step()
        for p in params:
            p.requires_grad_(False)
            p.grad = None
        # (what makes this write invisible to a version counter, on this torch: none moved)
        assert [p._version for p in params] == before or kind != "Adam"

    return write


def _heap_nudge(attempt: int) -> torch.Tensor:
    """A small tensor of a size varying with ``attempt``, held by the caller: after a miss the heap's free
    chunks are in another state, so the next try can land at the freed address (they stay the same otherwise)."""
    return torch.empty(1 + attempt * 97 % 3000)


def _data_twice(reuse: bool):
    """``param.data = torch.empty(0)`` then ``param.data = w2`` (memory-offloading code), with ``w2`` at the freed
    address (``reuse``: repeated until the allocator hands it back) or at another one (the old storage held)."""

    def write(pop: Population) -> None:
        p = pop.model.net[2].weight
        values = p.detach() * -1.5 + 0.25
        held = []  # (without reuse: every old storage stays alive, so its address cannot be handed back)
        for attempt in range(1000):  # until the allocator hands the freed address back to the next tensor
            ptr = p.data_ptr()
            if not reuse:
                held.append(p.data)
            p.data = torch.empty(0)
            p.data = values.clone()
            if (p.data_ptr() == ptr) == reuse:
                break
            held.append(_heap_nudge(attempt))
        assert (p.data_ptr() == ptr) == reuse, "the allocator never gave the address back"
        assert torch.equal(p, values)

    return write


def _data_copy(pop: Population) -> None:  # the soft-update idiom: target.data.copy_(online)
    online = build(seed=7)
    for target, source in zip(pop.adapter_parameters(), online.adapter_parameters(), strict=True):
        target.data.copy_(source.data)


def _data_mul(pop: Population) -> None:
    for p in pop.model.parameters():
        p.data.mul_(-1.25)


def _half_float(pop: Population) -> None:
    with torch.no_grad():  # weights that half precision rounds: the round trip changes them
        for p in pop.model.parameters():
            p.add_(1e-3 * torch.randn(p.shape, generator=torch.Generator().manual_seed(2)))
    weight = pop.model.net[2].weight
    ptr = weight.data_ptr()
    held = []
    for attempt in range(1000):  # until a round trip lands at the address it freed
        ptr = weight.data_ptr()
        pop.model.half()
        pop.model.float()
        if weight.data_ptr() == ptr:
            break
        held.append(_heap_nudge(attempt))
    assert weight.data_ptr() == ptr, "the allocator never gave the address back"


def _load_state_dict(pop: Population) -> None:
    pop.model.load_state_dict(Policy(seed=11).state_dict())


def _load_state_dict_assign(pop: Population) -> None:
    state = {k: nn.Parameter(v, requires_grad=False) for k, v in Policy(seed=12).state_dict().items()}
    pop.model.load_state_dict(state, assign=True)


def _population_load_state_dict(pop: Population) -> None:
    pop.load_state_dict(build(seed=13).state_dict())


def _vector_to_parameters(pop: Population) -> None:
    params = pop.adapter_parameters()
    vec = torch.nn.utils.parameters_to_vector(params)
    torch.nn.utils.vector_to_parameters(vec.flip(0) * 0.7, params)


WRITES = {
    "fused Adam": _fused("Adam"),
    "fused AdamW": _fused("AdamW"),
    "fused SGD on the base weights": _fused("SGD"),
    ".data = twice, address reused": _data_twice(reuse=True),
    ".data = twice, another address": _data_twice(reuse=False),
    ".data.copy_": _data_copy,
    ".data.mul_": _data_mul,
    "half() then float()": _half_float,
    "model.load_state_dict": _load_state_dict,
    "model.load_state_dict(assign=True)": _load_state_dict_assign,
    "Population.load_state_dict": _population_load_state_dict,
    "vector_to_parameters": _vector_to_parameters,
}


@pytest.mark.parametrize("check", list(CHECKS))
@pytest.mark.parametrize("write", list(WRITES))
def test_no_routed_call_reads_weights_from_before_a_write(write, check):
    run = CHECKS[check]
    pop = build()
    before = run(pop)
    again = run(pop)  # (0.5.0 prepared on the first call and used it on the second)
    assert torch.equal(before, again)
    WRITES[write](pop)
    got = run(pop)
    want = run(fresh_copy(pop))
    if check == "no-grad forward":  # both the uncached path, on identical shapes
        assert torch.equal(got, want)
        assert not torch.allclose(got, before)  # the write moved the outputs: a stale answer would show
    else:
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    if check == "generate":
        assert not torch.allclose(got, before)
    # and again: nothing the write's first call made is used stale by the next
    torch.testing.assert_close(run(pop), want, rtol=1e-5, atol=1e-6)


def test_a_block_sees_weights_written_between_its_entries_and_not_inside_one():
    """The freshness rule of ``route(...)`` / ``loop_route(...)``: a write between two entries is seen at the
    next entry; a write between two forwards of one entry is not seen by the second (documented)."""
    pop = build()
    opt = torch.optim.Adam(pop.adapter_parameters(), lr=0.3, fused=True)
    block = pop.loop_route(individuals=IDS)
    for p in pop.adapter_parameters():
        p.requires_grad_(True)
    _backward(pop)  # gradients kept: each opt.step() below moves the adapters again

    with torch.no_grad():
        with block:
            first = pop.model(X)
        opt.step()
    want = forward(fresh_copy(pop))
    with torch.no_grad():
        with block:  # a new entry: the new weights
            second = pop.model(X)
            opt.step()
            inside = pop.model(X)  # the same entry: what its first forward prepared
    torch.testing.assert_close(second, want, rtol=1e-5, atol=1e-6)
    assert not torch.allclose(first, second)
    assert torch.equal(inside, second)
    third = forward(pop)  # outside the block: the weights as they are
    assert torch.equal(third, forward(fresh_copy(pop))) and not torch.allclose(third, second)
    with torch.no_grad(), block:  # entered again: seen
        torch.testing.assert_close(pop.model(X), third, rtol=1e-5, atol=1e-6)


# ---------------------------------------------------------------------------------------------- computed weights


LAYOUTS = {
    "individual=": {"individual": 2},
    "individuals=, one per row": {"individuals": IDS},
    "all_individuals": {"all_individuals": True},
    "broadcast": {"individuals": np.array([0, 5, 5]), "broadcast": True},
}


def _weight_norm(model: nn.Module) -> None:
    torch.nn.utils.parametrizations.weight_norm(model.net[0])


def _prune(model: nn.Module) -> None:
    import torch.nn.utils.prune as prune

    prune.l1_unstructured(model.net[0], "weight", amount=0.5)
    prune.random_unstructured(model.net[2], "bias", amount=0.5)


@pytest.mark.parametrize("when", ["before", "after"])
@pytest.mark.parametrize("how", ["weight_norm", "prune"])
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_targets_with_computed_weights_route_without_grad(how, when, layout):
    compute = _weight_norm if how == "weight_norm" else _prune
    model = Policy()
    if when == "before":
        compute(model)
    pop = Population(model, pop_size=P, low_rank=RANK, seed=1, init_scale=1.0)
    route = LAYOUTS[layout]
    x = X if layout != "all_individuals" else torch.randn(2 * P, 4, generator=torch.Generator().manual_seed(4))
    with pop.prepared_scope():
        with torch.no_grad():
            pop(x, **route)  # (prepared while the weight was a parameter, for "after")
        if when == "after":
            compute(model)
        with torch.enable_grad():
            want = pop(x, **route).detach()  # with grad: the uncached path, which always routed
        with torch.no_grad():
            got = pop(x, **route)
            assert torch.equal(pop(x, **route), got)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)  # (the other layers may be merged)
    with torch.no_grad():
        assert torch.equal(pop(x, **route), want)  # outside any scope: the uncached path, bitwise
    if layout == "individuals=, one per row":
        torch.testing.assert_close(pop.generate(x, **route, steps=1)[:, 0], want, rtol=1e-5, atol=1e-6)
    if how == "prune":  # the mask is applied: zeroing the pruned weights moves nothing
        assert (model.net[0].weight == 0).sum() >= 64


# ---------------------------------------------------------------------------------------------- budget


def test_a_budget_of_zero_turns_preparation_off():
    """``init_scale=0``: zero-byte entries would fit a budget of 0; none is made, kept or used."""
    pop = Population(Policy(), pop_size=P, low_rank=RANK, seed=1, init_scale=0.0)
    store = pop._router.prepared
    with pop.prepared_scope(), torch.no_grad():
        pop(X, individuals=IDS)
        assert len(store) > 0 and store.nbytes == 0  # the "zero" entries of a budget > 0
        store.budget = 0
        assert len(store) == 0
        hits, builds = store.hits, store.builds
        for _ in range(3):
            assert torch.equal(pop(X, individuals=IDS), pop.model(X))
        with pop.route(individuals=IDS):
            pop.model(X)
        assert len(store) == 0 and store.hits == hits and store.builds == builds


@pytest.mark.parametrize("bad", [-1, 1.5, True, "8", None])
def test_a_budget_that_is_not_a_byte_count_is_refused(bad):
    store = build()._router.prepared
    with pytest.raises((InvalidTypeError, InvalidValueError), match=r"`budget` must be .*got"):
        store.budget = bad
    assert store.budget > 0  # unchanged
