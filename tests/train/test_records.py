"""The training records' ``as_dict()`` (issue 23): numbers only, so TensorBoard / W&B / CSV logging is one line."""

from __future__ import annotations

import csv
import io

import torch
from models import mlp

from populora import Population
from populora.loops.pbt import Replacement
from populora.train import PBT, PBTConfig
from populora.train.rl import PolicyGradientStats


def numbers_only(row: dict) -> bool:
    return all(isinstance(k, str) and isinstance(v, (int, float)) and not isinstance(v, bool) for k, v in row.items())


def test_policy_gradient_stats_as_dict():
    stats = PolicyGradientStats(
        loss=1.5,
        grad_norms=torch.tensor([1.0, 3.0, 2.0], dtype=torch.float64),
        tokens=torch.tensor([2, 0, 6]),
        kl=torch.tensor([0.5, 0.0, 0.25], dtype=torch.float64),
    )
    row = stats.as_dict()
    assert row == {"loss": 1.5, "grad_norm_mean": 2.0, "grad_norm_max": 3.0, "tokens": 8, "kl_mean": 0.3125}
    assert numbers_only(row)
    no_kl = PolicyGradientStats(0.0, torch.zeros(2, dtype=torch.float64), torch.tensor([1, 1]), None).as_dict()
    assert set(no_kl) == {"loss", "grad_norm_mean", "grad_norm_max", "tokens"}


def test_replacement_as_dict_from_a_pbt_step():
    torch.manual_seed(0)
    pop = Population(mlp(4, 8, 2), pop_size=8, low_rank=2, seed=0, init_scale=0.5)
    pbt = PBT(pop, None, PBTConfig(interval=1, fraction=0.25, crossover_rate=0.5, seed=1))
    fitness = torch.tensor([5.0, 1.0, 7.0, 0.0, 3.0, 6.0, -2.0, 4.0], dtype=torch.float64)
    result = pbt.step(fitness)
    row = result.as_dict()
    assert numbers_only(row)
    assert row == {
        "step": 1,
        "replaced": 2,
        "crossovers": int(result.crossed.sum()),
        "key_best": 7.0,
        "key_mean": 3.0,
        "key_worst": -2.0,
    }
    out = io.StringIO()  # the one-line CSV log
    writer = csv.DictWriter(out, fieldnames=list(row))
    writer.writeheader()
    writer.writerow(row)
    assert out.getvalue().splitlines()[1].startswith("1,2,")


def test_replacement_as_dict_counts_the_crossovers():
    r = Replacement(
        4, torch.tensor([0, 3]), torch.tensor([[1, 2], [1, 1]]), torch.tensor([True, False]), torch.tensor([0.0, 1.0])
    )
    assert r.as_dict() == {
        "step": 4,
        "replaced": 2,
        "crossovers": 1,
        "key_best": 1.0,
        "key_mean": 0.5,
        "key_worst": 0.0,
    }
