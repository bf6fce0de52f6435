"""EnvInteractor / evolve_with_env with 2 real gloo processes.

Each rank plays its share of the individuals on its own CartPole envs; the
fitness is all-gathered, identical on every rank and equal to a
single-process evaluation; evolve_with_env (with observation normalisation,
whose statistics are summed over ranks) returns the same policy on every rank
as a single process does. Workers meet through a FileStore in ``tmp_path``
and save what they saw; the assertions run in the parent.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from ranks import init_gloo
from torch import nn

WORLD = 2
POP, EPISODES, HORIZON, GENERATIONS = 6, 2, 60, 3  # seed 2: no near-tie action (margin 9e-3)


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 16), nn.Tanh(), nn.Linear(16, 2))


def _envs(num: int):
    import gymnasium as gym

    return [gym.make("CartPole-v1") for _ in range(num)]


class _Argmax:
    """``argmax(-1)`` that records the smallest gap between the two top outputs.

    Ranks play other slot counts than the single process (other batch shapes,
    so other BLAS kernels, last-bit differences): their actions, and so the
    integer returns, agree exactly only where no output is a near tie; the
    test asserts that first.
    """

    def __init__(self):
        self.margin = float("inf")

    def __call__(self, out: torch.Tensor) -> torch.Tensor:
        top = out.topk(2, dim=-1).values
        self.margin = min(self.margin, float((top[..., 0] - top[..., 1]).min()))
        return out.argmax(-1)


SAFE_MARGIN = 1e-4  # float32 forwards of other shapes differ by ~1e-6


def _run(num_envs: int) -> dict:
    """What every process computes, distributed or not."""
    from populora import evolve_with_env, interact_with_env
    from populora.interact import EnvOptions, Episodes

    interactor = interact_with_env(_envs(num_envs))
    pop = interactor.population(_model(), POP, 2, seed=2)
    act = _Argmax()
    fitness = interactor.evaluate(pop, action=act, horizon=HORIZON, num_episodes=EPISODES)
    policy, history = evolve_with_env(
        _envs(num_envs),
        _model(),
        POP,
        2,
        action=act,
        num_generations=GENERATIONS,
        horizon=HORIZON,
        seed=2,
        episodes=Episodes(num_episodes=EPISODES),
        env_options=EnvOptions(normalize_obs=True),
    )
    return {
        "fitness": fitness,
        "episodes_here": interactor.counters["episodes"],
        "history": [tuple(h) for h in history],
        "policy": {k: v.clone() for k, v in policy.state_dict().items()},
        "margin": act.margin,
    }


def _worker(rank: int, world: int, store: str, out: str) -> None:
    init_gloo(rank, world, store)
    try:
        torch.save(_run(num_envs=2 + rank), f"{out}/rank{rank}.pt")  # ranks may hold different env counts
    finally:
        dist.destroy_process_group()


@pytest.mark.distributed
def test_two_ranks_split_individuals_and_agree_with_one_process(tmp_path):
    context = mp.spawn(_worker, args=(WORLD, str(tmp_path / "store"), str(tmp_path)), nprocs=WORLD, join=False)
    alone = _run(num_envs=3)  # the single-process reference, while the ranks start
    while not context.join():
        pass
    ranks = [torch.load(tmp_path / f"rank{r}.pt", weights_only=True) for r in range(WORLD)]

    assert [r["episodes_here"] for r in ranks] == [3 * EPISODES, 3 * EPISODES]  # each rank played its half
    assert alone["episodes_here"] == POP * EPISODES
    assert min(r["margin"] for r in [*ranks, alone]) > SAFE_MARGIN  # no action can flip between shapes
    for r in ranks:
        assert torch.equal(r["fitness"], alone["fitness"])  # integer episode lengths
        assert [h[0] for h in r["history"]] == [h[0] for h in alone["history"]] == list(range(GENERATIONS))
        assert [h[1:] for h in r["history"]] == [pytest.approx(h[1:]) for h in alone["history"]]
        assert r["policy"].keys() == alone["policy"].keys()
        for key, value in alone["policy"].items():
            torch.testing.assert_close(r["policy"][key], value, rtol=1e-6, atol=1e-7, msg=key)
    for key in ranks[0]["policy"]:
        assert torch.equal(ranks[0]["policy"][key], ranks[1]["policy"][key]), key  # same policy on every rank
