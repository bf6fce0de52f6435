"""Prompts in, replies out: the one home of chat wrapping, left padding and routed generation of text.

:class:`~populora.PopuLoRA` (self-play) and :mod:`populora.llm.reasoning` (ES / RL on verifiable tasks) both
encode and decode through here.

:func:`encode` applies the tokenizer's chat template and left-pads by hand
(whatever the tokenizer's ``padding_side``); :func:`generate_replies` runs
ONE routed ``generate`` over the rows (locally, or each rank its contiguous
share of rows under ``torch.distributed``, the replies then gathered on every
rank) and decodes the new tokens.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import torch
import torch.distributed as dist
from torch import Tensor

from populora import distributed as pd

__all__ = ["Replies", "chat_text", "encode", "generate_replies", "new_tokens", "pad_id"]


def pad_id(tokenizer: Any) -> int:
    """The tokenizer's pad id, else its eos id."""
    pid = getattr(tokenizer, "pad_token_id", None)
    if pid is None:
        pid = getattr(tokenizer, "eos_token_id", None)
    if pid is None:
        raise ValueError("the tokenizer has neither `pad_token_id` nor `eos_token_id`")
    return int(pid)


def chat_text(tokenizer: Any, message: str, chat: bool) -> str:
    """``message`` as the user turn of the chat template (with the assistant's generation prompt)."""
    if not chat:
        return message
    return tokenizer.apply_chat_template(
        [{"role": "user", "content": message}], tokenize=False, add_generation_prompt=True
    )


def encode(tokenizer: Any, texts: Sequence[str]) -> tuple[Tensor, Tensor]:
    """``(input_ids (n, T), attention_mask (n, T))``, left padded, no special tokens added."""
    rows = [list(tokenizer(t, add_special_tokens=False)["input_ids"]) for t in texts]
    width = max((len(r) for r in rows), default=0)
    pid = pad_id(tokenizer)
    ids = torch.full((len(rows), width), pid, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, r in enumerate(rows):
        if r:
            ids[i, width - len(r) :] = torch.tensor(r, dtype=torch.long)
            mask[i, width - len(r) :] = 1
    return ids, mask


def new_tokens(out: Tensor, width: int, eos: int | None) -> tuple[Tensor, list[int]]:
    """The generated part ``(n, new)`` and each row's length up to and including its first eos."""
    gen = out[:, width:]
    if eos is None or gen.shape[1] == 0:
        return gen, [gen.shape[1]] * gen.shape[0]
    hit = gen == eos
    first = torch.where(hit.any(1), hit.int().argmax(1) + 1, torch.full((gen.shape[0],), gen.shape[1]))
    return gen, first.tolist()


class Replies(NamedTuple):
    """Decoded replies of a routed generate, row by row, with what a policy-gradient step needs.

    Attributes:
        texts: the decoded new tokens of each row (special tokens skipped).
        prompt_ids: each row's prompt token ids (no padding).
        reply_ids: each row's new token ids up to and including its first eos.
        tokens: total new tokens (``sum(len(r) for r in reply_ids)``).
    """

    texts: list[str]
    prompt_ids: list[list[int]]
    reply_ids: list[list[int]]
    tokens: int


def _generate_local(
    population: Any, tokenizer: Any, ids: Sequence[int], texts: Sequence[str], seed: int, kwargs: dict[str, Any]
) -> Replies:
    if not texts:
        return Replies([], [], [], 0)
    input_ids, mask = encode(tokenizer, texts)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        out = population.generate(
            input_ids, mask, individuals=torch.as_tensor(list(ids), dtype=torch.long), generator=generator, **kwargs
        )
    if not isinstance(out, Tensor):
        out = out.sequences
    eos = getattr(tokenizer, "eos_token_id", None)
    gen, lengths = new_tokens(out.cpu(), input_ids.shape[1], eos)
    replies = [tokenizer.decode(row[:n], skip_special_tokens=True) for row, n in zip(gen, lengths)]
    prompts = [row[m.bool()].tolist() for row, m in zip(input_ids, mask)]
    return Replies(replies, prompts, [row[:n].tolist() for row, n in zip(gen, lengths)], int(sum(lengths)))


def generate_replies(
    population: Any,
    tokenizer: Any,
    ids: Sequence[int],
    texts: Sequence[str],
    seed: int,
    kwargs: dict[str, Any],
    distributed: bool,
) -> Replies:
    """Row ``j`` (``texts[j]``) answered by individual ``ids[j]``: the :class:`Replies`.

    Locally: one ``population.generate`` call over every row, sampling seeded
    from ``seed``. Distributed: rank ``r`` generates its :func:`~populora.distributed.partition`
    of the rows (one call, sampling seeded from ``seed + r``) and every rank
    receives every reply (one ``all_gather_object``); a failure on one rank is
    raised on every rank (that rank its own error, the others a RuntimeError
    quoting it), so none waits forever.
    """
    if not distributed:
        return _generate_local(population, tokenizer, ids, texts, seed, kwargs)
    world, me = pd.world_size(), pd.process_rank()
    share = pd.partition(len(texts), me, world)
    payload: tuple[bool, Any]
    failure: BaseException | None = None
    try:
        payload = (
            True,
            tuple(
                _generate_local(
                    population,
                    tokenizer,
                    [ids[i] for i in share],
                    [texts[i] for i in share],
                    (seed + me) % 2**62,
                    kwargs,
                )
            ),
        )
    except Exception as error:
        payload, failure = (False, f"{type(error).__name__}: {error}"), error
    gathered: list[Any] = [None] * world
    dist.all_gather_object(gathered, payload)
    for rank, (ok, value) in enumerate(gathered):
        if not ok:
            if rank == me and failure is not None:
                raise failure
            raise RuntimeError(f"generation failed on rank {rank}: {value}")
    parts = [Replies(*value) for _, value in gathered]
    return Replies(
        [t for p in parts for t in p.texts],
        [t for p in parts for t in p.prompt_ids],
        [t for p in parts for t in p.reply_ids],
        int(sum(p.tokens for p in parts)),
    )
