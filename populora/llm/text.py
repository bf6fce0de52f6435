"""Prompts in, replies out: the one home of chat wrapping, left padding and routed generation of text.

:class:`~populora.PopuLoRA` (self-play) and :mod:`populora.llm.reasoning` (ES / RL on verifiable tasks) both
encode and decode through here.

:func:`encode` applies the tokenizer's chat template and left-pads by hand
(whatever the tokenizer's ``padding_side``); :func:`generate_replies` runs
ONE routed ``generate`` over the rows (locally, or each rank its contiguous
share of rows under ``torch.distributed``, the replies then gathered on every
rank) and decodes the new tokens.

:func:`generate_by_member` is the self-play loop's world-size invariant generation: each member's rows run in
ONE ``generate`` of their own (a block whose rows, pad width and routing do not depend on who else generates),
sampled by Gumbel-max noise drawn from the MEMBER's own generator (:class:`GumbelNoise` under greedy
decoding), so a member's tokens depend only on its rows, its adapter and its generator. Under
``torch.distributed`` each rank generates its members' blocks and the reply token ids are all-gathered as
int64 tensors; every rank decodes them identically.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import torch
import torch.distributed as dist
from torch import Tensor

from populora import distributed as pd
from populora.distributed import members as pm

__all__ = [
    "GumbelNoise",
    "Replies",
    "chat_text",
    "encode",
    "generate_by_member",
    "generate_replies",
    "new_tokens",
    "pad_id",
]


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


class GumbelNoise:
    """A ``transformers`` logits processor that turns greedy decoding into sampling from one generator.

    Each call warps the ``(b, V)`` scores as sampling would (``temperature``, then ``top_k``, then ``top_p``,
    transformers' rules) and adds Gumbel noise ``-log(E)``, ``E ~ Exp(1)`` drawn on the CPU from ``generator``
    (shape ``(b, V)``, every row, finished or not): the greedy argmax of the result is a draw from the warped
    softmax. The draws depend only on the generator and the block's shape, never on a global RNG.
    """

    def __init__(self, generator: torch.Generator, temperature: float = 1.0, top_k: int | None = None,
                 top_p: float | None = None) -> None:  # fmt: skip
        if not temperature > 0:
            raise ValueError(f"`temperature` must be > 0 to sample, got {temperature!r}")
        if top_p is not None and not 0 < top_p <= 1:
            raise ValueError(f"`top_p` must be in (0, 1], got {top_p!r}")
        self.generator, self.temperature = generator, float(temperature)
        self.top_k = int(top_k) if top_k else None
        self.top_p = float(top_p) if top_p is not None and top_p < 1 else None

    def __call__(self, input_ids: Tensor, scores: Tensor) -> Tensor:
        s = scores.float() / self.temperature
        if self.top_k is not None and self.top_k < s.shape[-1]:
            kth = torch.topk(s, self.top_k, dim=-1).values[..., -1:]
            s = s.masked_fill(s < kth, float("-inf"))
        if self.top_p is not None:  # transformers' TopPLogitsWarper: drop the low tail of mass 1 - top_p
            ordered, index = torch.sort(s, descending=False, dim=-1)
            tail = ordered.softmax(-1).cumsum(-1) <= 1 - self.top_p
            tail[..., -1:] = False
            s = s.masked_fill(tail.scatter(-1, index, tail), float("-inf"))
        e = torch.empty(s.shape, dtype=torch.float32).exponential_(generator=self.generator)
        return s - e.log().to(s.device)


def _sampling(population: Any, kwargs: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """(greedy generate options, the sampling warpers or None): ``do_sample``/``temperature``/``top_k``/``top_p``
    become a :class:`GumbelNoise` (unset ones read from the model's ``generation_config``, as transformers does)."""
    rest = {k: v for k, v in kwargs.items() if k not in ("do_sample", "temperature", "top_k", "top_p")}
    config = getattr(getattr(population, "model", None), "generation_config", None)
    sample = kwargs.get("do_sample", getattr(config, "do_sample", False))
    if not sample:
        return {**rest, "do_sample": False}, None
    warp = {k: kwargs.get(k, getattr(config, k, None)) for k in ("temperature", "top_k", "top_p")}
    warp["temperature"] = 1.0 if warp["temperature"] is None else warp["temperature"]
    return {**rest, "do_sample": False, "temperature": None, "top_k": None, "top_p": None}, warp


def generate_by_member(
    population: Any,
    tokenizer: Any,
    ids: Sequence[int],
    texts: Sequence[str],
    generators: Sequence[torch.Generator],
    kwargs: dict[str, Any],
    distributed: bool = False,
    what: str = "replies",
) -> Replies:
    """Row ``j`` (``texts[j]``) answered by member ``ids[j]``, one ``generate`` per member (module docstring).

    Member ``i``'s rows, in row order, are one left-padded block (pad width: its own longest prompt) routed
    ``individual=i``; sampling options become :class:`GumbelNoise` on ``generators[i]`` (advanced by that block
    only). Distributed: each rank generates the members it owns (:func:`~populora.distributed.members.member_block`),
    the reply ids are all-gathered (int64 tensors) and decoded on every rank; a failure on one rank is raised on
    every rank (the others a :class:`~populora.distributed.members.RankFailure` quoting it).
    """
    n = len(texts)
    if len(ids) != n:
        raise ValueError(f"`ids` and `texts` must have one entry per row, got {len(ids)} and {n}")
    prompts = [list(tokenizer(t, add_special_tokens=False)["input_ids"]) for t in texts]
    greedy, warp = _sampling(population, kwargs)
    owned = set(pm.member_block(population.pop_size)) if distributed else set(range(population.pop_size))
    eos = getattr(tokenizer, "eos_token_id", None)
    local: dict[int, list[int]] = {}

    def run() -> None:
        for member in sorted(set(int(i) for i in ids) & owned):
            rows = [j for j in range(n) if int(ids[j]) == member]
            input_ids, mask = encode(tokenizer, [texts[j] for j in rows])
            options = dict(greedy)
            if warp is not None:
                from transformers import LogitsProcessorList

                noise = GumbelNoise(generators[member], **warp)
                options["logits_processor"] = LogitsProcessorList([*options.get("logits_processor", []), noise])
            with torch.no_grad():
                out = population.generate(input_ids, mask, individual=member, **options)
            if not isinstance(out, Tensor):
                out = out.sequences
            gen, lengths = new_tokens(out.cpu(), input_ids.shape[1], eos)
            for j, row, length in zip(rows, gen, lengths):
                local[j] = row[:length].tolist()

    _, error = pm.capture(run)  # held (a KeyboardInterrupt too) until the other ranks know
    replies = pm.all_gather_rows(local, n, what, error, phase=f"generating the {what}") if distributed else None
    if replies is None:
        if error is not None:
            raise error
        replies = [local[j] for j in range(n)]
    texts_out = [tokenizer.decode(r, skip_special_tokens=True) for r in replies]
    return Replies(texts_out, prompts, replies, int(sum(len(r) for r in replies)))
