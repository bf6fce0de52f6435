"""A per-individual policy-gradient step on a population's adapters (PopuLoRA's hybrid: RL plus evolution).

:func:`policy_gradient_step_` takes rows that individuals generated (prompt
ids, reply ids, the individual, a reward), computes REINFORCE's loss
``-sum_j A_j * mean_t log p(reply_jt)`` through ONE routed forward per micro
batch (each row through its own individual's adapters, so each individual's
gradient comes from its own rows only), and moves every individual with a
non-zero gradient by a step of L2 norm ``lr`` along its own negative
gradient: ``theta_i -= lr * g_i / ||g_i||`` (the norm over all of that
individual's adapter factors). The advantage is the reward minus the mean
reward of the same individual's rows in the batch, so an individual whose
rows all scored alike does not move. Under ``torch.distributed`` each rank
computes the gradients of its share of the rows and they are summed
(all-reduce) before the update, so every rank takes the same step.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from populora import distributed as pd
from populora.checks import check_float, check_int
from populora.errors import InvalidValueError

__all__ = ["advantages", "policy_gradient_step_"]


def advantages(ids: Sequence[int], rewards: Tensor, num: int) -> Tensor:
    """``(n,)`` float64: each row's reward minus the mean reward of its individual's rows."""
    ids_t = torch.as_tensor(list(ids), dtype=torch.long)
    r = rewards.double()
    total = torch.zeros(num, dtype=torch.float64).index_add_(0, ids_t, r)
    count = torch.zeros(num, dtype=torch.float64).index_add_(0, ids_t, torch.ones_like(r))
    return r - (total / count.clamp(min=1))[ids_t]


def _batch(prompts: list[list[int]], replies: list[list[int]], pad: int) -> tuple[Tensor, Tensor, Tensor]:
    """Left-padded ``(ids, mask, reply_mask)``, each ``(n, T)``; ``reply_mask`` marks the reply tokens."""
    seqs = [p + r for p, r in zip(prompts, replies)]
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), pad, dtype=torch.long)
    mask = torch.zeros_like(ids)
    reply = torch.zeros_like(ids, dtype=torch.bool)
    for i, (s, r) in enumerate(zip(seqs, replies)):
        ids[i, width - len(s) :] = torch.tensor(s, dtype=torch.long)
        mask[i, width - len(s) :] = 1
        if r:
            reply[i, width - len(r) :] = True
    return ids, mask, reply


def policy_gradient_step_(
    population: Any,
    ids: Sequence[int],
    prompt_ids: Sequence[Sequence[int]],
    reply_ids: Sequence[Sequence[int]],
    rewards: Tensor,
    *,
    lr: float,
    pad: int,
    micro_batch: int = 8,
    distributed: bool = False,
) -> Tensor:
    """One REINFORCE step per individual on ``population``'s adapters, in place (see the module docstring).

    Args:
        population: a live :class:`~populora.Population` over a causal LM (``logits`` in its output).
        ids: ``(n,)`` the individual of each row.
        prompt_ids / reply_ids: each row's prompt and generated token ids (no padding).
        rewards: ``(n,)`` the rows' rewards.
        lr: the L2 norm of each individual's step (``> 0``).
        pad: the pad token id.
        micro_batch: rows per forward / backward.
        distributed: under ``torch.distributed``, every rank its share of the rows, gradients summed.

    Returns:
        ``(P,)`` float64, each individual's gradient norm (0: it did not move).
    """
    lr = check_float("lr", lr, low=0.0, low_open=True)
    micro_batch = check_int("micro_batch", micro_batch, low=1)
    n = len(ids)
    if not (len(prompt_ids) == len(reply_ids) == n == rewards.numel()):
        raise InvalidValueError(
            f"ids, prompt_ids, reply_ids and rewards must have one entry per row, got {n}, "
            f"{len(prompt_ids)}, {len(reply_ids)} and {rewards.numel()}"
        )
    use_dist = distributed and pd.is_distributed()
    adv = advantages(ids, rewards, population.pop_size)
    rows = list(pd.partition(n, pd.process_rank(), pd.world_size())) if use_dist else list(range(n))
    rows = [j for j in rows if adv[j] != 0 and len(reply_ids[j]) > 0]
    downs, ups = population._stacks()
    params = [*downs, *ups]
    flags = [p.requires_grad for p in params]
    grads = [torch.zeros_like(p) for p in params]
    model = population.model
    training = model.training
    try:
        model.eval()
        for p in params:
            p.requires_grad_(True)
        with torch.enable_grad():
            for start in range(0, len(rows), micro_batch):
                chunk = rows[start : start + micro_batch]
                x, mask, reply = _batch([list(prompt_ids[j]) for j in chunk], [list(reply_ids[j]) for j in chunk], pad)
                x, mask, reply = x.to(population.device), mask.to(population.device), reply.to(population.device)
                position_ids = (mask.cumsum(-1) - 1).clamp(min=0)
                out = population(
                    x,
                    attention_mask=mask,
                    position_ids=position_ids,
                    use_cache=False,
                    individuals=torch.tensor([ids[j] for j in chunk], dtype=torch.long),
                )
                logp = torch.log_softmax(out.logits[:, :-1].float(), -1).gather(-1, x[:, 1:, None]).squeeze(-1)
                target = reply[:, 1:].float()
                per_row = (logp * target).sum(1) / target.sum(1).clamp(min=1)
                a = adv[chunk].to(per_row.dtype).to(per_row.device)
                loss = -(a * per_row).sum()
                for g, d in zip(grads, torch.autograd.grad(loss, params, allow_unused=True)):
                    if d is not None:
                        g += d
    finally:
        for p, flag in zip(params, flags):
            p.requires_grad_(flag)
        model.train(training)
    if use_dist:
        flat = torch.cat([g.reshape(-1) for g in grads]).to(pd.comm_device())
        dist.all_reduce(flat)
        flat = flat.to(population.device)
        offset = 0
        for g in grads:
            g.copy_(flat[offset : offset + g.numel()].view_as(g))
            offset += g.numel()
    norms = torch.zeros(population.pop_size, dtype=torch.float64, device=population.device)
    for g in grads:
        norms += g.double().square().flatten(1).sum(1)
    norms = norms.sqrt()
    scale = torch.where(norms > 0, lr / norms.clamp(min=1e-30), torch.zeros_like(norms))
    with torch.no_grad():
        for p, g in zip(params, grads):
            p -= (scale.view(-1, *[1] * (g.dim() - 1)) * g).to(p.dtype)
    return norms.cpu()
