"""EggrollES under torch.distributed: 2 real gloo processes (spawned, FileStore in tmp_path).

Each rank evaluates its slice of members and only the fitnesses are exchanged; every rank applies the
same update, so the parameters stay bitwise identical. Ranks that start from different weights are
repaired from rank 0 with a warning at the first step; ranks whose ES configuration differs (noise rank,
pop_size, sigma, seed, antithetic, parameter set or shapes) raise ConfigMismatchError on every rank,
naming the field. The workers record what they saw; the assertions run here, in the parent.
"""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.distributed as dist
from ranks import error_of, init_gloo, save, spawn
from torch import nn

from populora import EggrollES, TorchEggrollES
from populora import distributed as pd

POP, STEPS = 8, 4


def model_for(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(5, 12), nn.Tanh(), nn.Linear(12, 3))


def data():
    gen = torch.Generator().manual_seed(123)
    return torch.randn(6, 5, generator=gen), torch.randn(6, 3, generator=gen), torch.randn(POP, 2, 5, generator=gen)


def mse(out, target):
    return ((out - target) ** 2).mean()


def train(es: EggrollES) -> list[float]:
    x, y, xs = data()
    means = []
    for step in range(STEPS):
        if step % 2:
            stats = es.step(xs, mse, torch.zeros(POP, 2, 3), per_individual=True)
        else:
            stats = es.step(x, mse, y)
        means.append(stats.mean)
    return means


def _worker(rank: int, world: int, store: str, out: str) -> None:
    init_gloo(rank, world, store)
    res: dict = {}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        # rank-dependent weights: repaired from rank 0 at the first step
        es = EggrollES(model_for(rank), POP, 0.1, 0.2, 2, seed=0)
        before = pd.bytes_communicated
        res["means"] = train(es)
        res["bytes_per_generation"] = (pd.bytes_communicated - before) / STEPS
    res["warnings"] = [str(w.message) for w in caught]
    res["params"] = {n: p.detach().clone() for n, p in es.model.named_parameters()}
    res["seed"], res["generation"] = es.seed, es.generation

    # a fitness function in the batch form is called with this rank's ids only
    calls = []

    def fitness(members, individuals):
        calls.append(list(individuals))
        return members(data()[0], individuals=individuals).mean(dim=(1, 2))

    res["fitness"] = es.evaluate(fitness)
    res["fitness_ids"] = calls

    es.debug_sync = True
    es.step(data()[0], mse, data()[1])  # in sync: passes
    if rank == 1:
        with torch.no_grad():
            es.model[0].weight[0, 0] += 1.0
    try:
        es.check_sync()
        res["check_sync"] = None
    except RuntimeError as error:
        res["check_sync"] = str(error)

    def failing(out, target):
        if dist.get_rank() == 1:
            raise ZeroDivisionError("loss blew up on rank 1")
        return mse(out, target)

    try:
        es.losses(data()[0], failing, data()[1])
        res["failure"] = None
    except Exception as error:  # recorded for the parent
        res["failure"] = f"{type(error).__name__}: {error}"
    torch.save(res, f"{out}/rank{rank}.pt")
    dist.destroy_process_group()


@pytest.mark.distributed
def test_two_ranks_stay_in_lockstep_exchanging_only_fitnesses(tmp_path):
    r0, r1 = spawn(_worker, tmp_path)

    for name in r0["params"]:
        assert torch.equal(r0["params"][name], r1["params"][name]), name
    assert r0["means"] == r1["means"]
    assert r1["seed"] == 0 and r1["generation"] == STEPS
    assert any("ES model parameters differ across ranks" in w for w in r1["warnings"])

    # the same run in one process, from rank 0's start, reaches the same parameters
    single = EggrollES(model_for(0), POP, 0.1, 0.2, 2, seed=0)
    means = train(single)
    for name, p in single.model.named_parameters():
        torch.testing.assert_close(r0["params"][name], p.detach(), rtol=1e-5, atol=1e-6)
    assert means == pytest.approx(r0["means"], rel=1e-5)

    # only the N fitnesses cross the network: (N + world) float32 per generation
    assert r0["bytes_per_generation"] == (POP + 2) * 4  # N float32 fitnesses + one failure flag per rank
    assert r0["fitness_ids"] == [[0, 1, 2, 3]] and r1["fitness_ids"] == [[4, 5, 6, 7]]
    assert torch.equal(r0["fitness"], r1["fitness"])

    for res in (r0, r1):
        assert res["check_sync"] is not None and "ES parameters differ across ranks" in res["check_sync"]
    assert r1["failure"].startswith("ZeroDivisionError: loss blew up on rank 1")
    assert r0["failure"].startswith("RuntimeError") and "loss blew up on rank 1" in r0["failure"]


# rank 1's arguments differ from rank 0's in one field: (fields named in the error, rank 1's overrides)
MISMATCHES = [
    (["rank"], {"rank": 1}),
    (["pop_size"], {"pop_size": 12}),
    (["sigma"], {"sigma": 0.2}),
    (["seed"], {"seed": 1}),
    (["antithetic"], {"antithetic": False}),
    (["params", "shapes", "dtypes"], {"param_filter": lambda name: "bias" not in name}),
    (["shapes"], {"hidden": 13}),
    (["lr"], {"lr": 0.3}),
]


def _mismatch_worker(rank: int, world: int, store: str, out: str) -> None:
    init_gloo(rank, world, store)
    x, y, _ = data()
    res = []
    for _, overrides in MISMATCHES:
        kwargs = dict(pop_size=POP, sigma=0.1, lr=0.2, rank=2, seed=0, antithetic=True, param_filter=None, hidden=12)
        if rank == 1:
            kwargs.update(overrides)
        torch.manual_seed(0)
        hidden = kwargs.pop("hidden")
        model = nn.Sequential(nn.Linear(5, hidden), nn.Tanh(), nn.Linear(hidden, 3))
        es = EggrollES(
            model, kwargs.pop("pop_size"), kwargs.pop("sigma"), kwargs.pop("lr"), kwargs.pop("rank"), **kwargs
        )
        before = [p.detach().clone() for p in model.parameters()]
        res.append(
            (
                error_of(es.step, x, mse, y),
                es.generation,
                all(torch.equal(a, b) for a, b in zip(before, model.parameters())),
            )
        )
    # the torcheggroll class goes through the same check
    tegg = TorchEggrollES(model_for(0), pop_size=POP if rank == 0 else POP + 2, rank=2)
    res.append((error_of(tegg.step, x, mse, y), tegg.epoch, True))
    # and after all these errors the ranks are still in step: an agreeing run trains
    es = EggrollES(model_for(0), POP, 0.1, 0.2, 2)
    res.append((error_of(es.step, x, mse, y), es.generation, True))
    save(res, out, rank)
    dist.destroy_process_group()


@pytest.mark.distributed
def test_configuration_mismatch_raises_on_every_rank_naming_the_field(tmp_path):
    r0, r1 = spawn(_mismatch_worker, tmp_path)
    for res in (r0, r1):
        for (fields, _), (error, generation, unchanged) in zip(MISMATCHES, res):
            assert error is not None, fields
            kind, message = error
            assert kind == "ConfigMismatchError", (fields, error)
            assert f"differs across ranks in {fields}" in message, (fields, message)
            assert generation == 0 and unchanged  # raised before any update
        kind, message = res[len(MISMATCHES)][0]
        assert kind == "ConfigMismatchError" and "TorchEggrollES" not in message and "['pop_size']" in message
        assert res[-1] == (None, 1, True)
    seed_message = r0[3][0][1]
    assert "seed: rank 0: 0, rank 1: 1" in seed_message
