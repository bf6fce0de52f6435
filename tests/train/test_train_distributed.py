"""policy_gradient_step_ on two gloo processes: each rank its own rows, gradients summed, every rank the same
step (then evolve_ in lockstep); the result is the single-process step over all the rows.

The model is tests/models.py's TinyTransformer (no transformers import in the workers: a fast spawn); it takes
no attention mask, so every row has 6 tokens (no padding) while prompts and replies vary in length."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from ranks import init_gloo, save, spawn

PROMPTS = [[3, 4, 5, 1], [6, 7, 2, 2, 9], [8, 9, 10], [12, 13, 1, 1], [14, 15, 16, 7, 7], [17, 18]]
REPLIES = [[20, 21], [22], [23, 24, 25], [26, 27], [28], [29, 30, 31, 5]]
IDS = [0, 2, 1, 0, 1, 1]
ADV = [1.0, -0.5, 0.25, -1.0, 0.75, -0.25]
FITNESS = [0.3, 0.1, 0.2, 0.5]


def build():
    from models import TinyTransformer

    from populora import Population

    torch.manual_seed(0)
    model = TinyTransformer(vocab=32, dim=16, heads=2, depth=2, seq=8).double()
    pop = Population(model, 4, 2, seed=2, init_scale=0.5)
    return pop, torch.optim.Adam(pop.adapter_parameters(), lr=1e-2)


def steps(pop, opt, rows: list[int], later: list[int], distributed: bool) -> None:
    """A step on ``rows``, evolve_, a step on ``later`` (a rank may have none)."""
    from populora.train import PolicyGradient, policy_gradient_step_

    def step(share: list[int]) -> None:
        policy_gradient_step_(
            pop,
            opt,
            [PROMPTS[j] for j in share],
            [REPLIES[j] for j in share],
            [IDS[j] for j in share],
            [ADV[j] for j in share],
            PolicyGradient(micro_batch=2, kl_coef=0.1, pad_id=0),
            distributed=distributed,
        )

    step(rows)
    pop.evolve_(torch.tensor(FITNESS), optimizer=opt, survive_frac=0.5, elite_frac=0.25)
    step(later)


def _worker(rank: int, world: int, store: str, out: str) -> None:
    init_gloo(rank, world, store)
    pop, opt = build()
    steps(pop, opt, [0, 1, 2] if rank == 0 else [3, 4, 5], [0, 3, 5] if rank == 0 else [], distributed=True)
    res = {
        "adapters": [p.detach().clone() for p in pop.adapter_parameters()],
        "exp_avg": [opt.state[p]["exp_avg"].clone() for p in pop.adapter_parameters()],
    }
    if rank == 0:  # the same run in one process, every row
        ref, ref_opt = build()
        steps(ref, ref_opt, list(range(6)), [0, 3, 5], distributed=False)
        res["reference"] = [p.detach().clone() for p in ref.adapter_parameters()]
    save(res, out, rank)
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def ranks(tmp_path_factory) -> list[dict]:
    return spawn(_worker, tmp_path_factory.mktemp("train_dist"))


@pytest.mark.distributed
def test_ranks_take_the_same_step_bit_for_bit(ranks):
    zero, one = ranks
    assert all(torch.equal(a, b) for a, b in zip(zero["adapters"], one["adapters"]))
    assert all(torch.equal(a, b) for a, b in zip(zero["exp_avg"], one["exp_avg"]))


@pytest.mark.distributed
def test_the_summed_step_is_the_single_process_step_over_every_row(ranks):
    for got, want in zip(ranks[0]["adapters"], ranks[0]["reference"]):
        torch.testing.assert_close(got, want, rtol=0, atol=1e-12)
    assert any(not torch.equal(a, b) for a, b in zip(ranks[0]["adapters"], build()[0].adapter_parameters()))
