"""populora.train.advantages and kl_estimate: the maths against hand computations, and bad rewards named."""

from __future__ import annotations

import math

import pytest
import torch

from populora.errors import FitnessError, InvalidTypeError, InvalidValueError
from populora.train import advantages, kl_estimate

REWARDS = [1.0, 0.0, 0.0, 2.0, 2.0, 5.0]
GROUPS = [7, 7, 7, 3, 3, 9]  # prompt 7: three answers, prompt 3: two, prompt 9: one


def pstd(xs: list[float]) -> float:
    m = sum(xs) / len(xs)
    return math.sqrt(sum((x - m) ** 2 for x in xs) / len(xs))


def test_reinforce_plus_plus_centres_per_prompt_then_whitens_over_the_batch():
    centred = [1 - 1 / 3, -1 / 3, -1 / 3, 0.0, 0.0, 0.0]
    mean = sum(centred) / 6
    want = [(c - mean) / (pstd(centred) + 1e-8) for c in centred]
    got = advantages(REWARDS, groups=GROUPS, method="reinforce++")
    assert got.dtype == torch.float64 and got.tolist() == pytest.approx(want, rel=1e-12)
    assert float(got.mean()) == pytest.approx(0.0, abs=1e-12) and float(got.std(correction=0)) == pytest.approx(1.0)


def test_reinforce_plus_plus_without_groups_only_whitens():
    want = [(r - sum(REWARDS) / 6) / (pstd(REWARDS) + 1e-8) for r in REWARDS]
    assert advantages(torch.tensor(REWARDS), method="reinforce++").tolist() == pytest.approx(want, rel=1e-12)


def test_grpo_is_a_z_score_per_group_and_a_group_of_one_gets_zero():
    g7, g3 = [1.0, 0.0, 0.0], [2.0, 2.0]
    want = [(r - 1 / 3) / (pstd(g7) + 1e-8) for r in g7] + [0.0, 0.0] + [0.0]
    assert advantages(REWARDS, groups=GROUPS, method="grpo").tolist() == pytest.approx(want, rel=1e-12, abs=1e-12)
    assert pstd(g3) == 0.0  # an all-equal group: no signal, no division by zero


def test_baseline_subtracts_the_group_mean_and_keys_may_be_table_rows():
    got = advantages(REWARDS, groups=GROUPS, method="baseline")
    assert got.tolist() == pytest.approx([2 / 3, -1 / 3, -1 / 3, 0.0, 0.0, 0.0])
    # (prompt, individual) keys: rows 0 and 1 share a key, row 2 is alone
    table = torch.tensor([[7, 0], [7, 0], [7, 1], [3, 0], [3, 0], [9, 1]])
    got = advantages(REWARDS, groups=table, method="baseline")
    assert got.tolist() == pytest.approx([0.5, -0.5, 0.0, 0.0, 0.0, 0.0])
    assert advantages(REWARDS, method="baseline").tolist() == pytest.approx([r - 10 / 6 for r in REWARDS])


def test_empty_batch_gives_an_empty_vector():
    assert advantages([], method="grpo").shape == (0,)


@pytest.mark.parametrize("bad, row", [(float("nan"), 2), (float("inf"), 2), (-float("inf"), 2)])
def test_non_finite_rewards_name_the_row(bad, row):
    rewards = [0.0, 1.0, bad, 1.0]
    with pytest.raises(FitnessError, match=rf"`rewards` must be finite, got .* at row {row}"):
        advantages(rewards)


def test_bad_arguments_are_named():
    with pytest.raises(FitnessError, match="real numbers"):
        advantages("abc")
    with pytest.raises(FitnessError, match="1-D"):
        advantages(torch.zeros(2, 2))
    with pytest.raises(InvalidValueError, match="`groups` must have shape"):
        advantages([1.0, 2.0], groups=[0, 1, 2])
    with pytest.raises(InvalidTypeError, match="`groups` must hold integer keys"):
        advantages([1.0, 2.0], groups=[0.5, 1.0])
    with pytest.raises(InvalidValueError, match="`method` must be one of"):
        advantages([1.0], method="ppo")


def test_kl_estimators_against_their_formulas():
    logp = torch.tensor([-1.0, -2.0, -0.5], dtype=torch.float64)
    ref = torch.tensor([-1.5, -2.0, -0.1], dtype=torch.float64)
    d = ref - logp
    torch.testing.assert_close(kl_estimate(logp, ref, "k1"), logp - ref)
    torch.testing.assert_close(kl_estimate(logp, ref, "k2"), 0.5 * d**2)
    torch.testing.assert_close(kl_estimate(logp, ref, "k3"), torch.exp(d) - d - 1)
    assert bool((kl_estimate(logp, ref) >= 0).all()) and kl_estimate(logp, ref)[1] == 0
    # k3 is unbiased: under pi, E[k3] = KL(pi || ref), exactly, for a distribution over 3 tokens
    pi = torch.tensor([0.2, 0.5, 0.3], dtype=torch.float64)
    q = torch.tensor([0.4, 0.4, 0.2], dtype=torch.float64)
    exact = float((pi * (pi.log() - q.log())).sum())
    assert float((pi * kl_estimate(pi.log(), q.log(), "k3")).sum()) == pytest.approx(exact, rel=1e-12)
    assert float((pi * kl_estimate(pi.log(), q.log(), "k1")).sum()) == pytest.approx(exact, rel=1e-12)
