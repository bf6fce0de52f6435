"""Reinforcement learning on routed replies: log-probs, advantages, a KL term to the base, one policy-gradient step.

Rows are ``(prompt, reply, individual)`` triples of token ids: individual ``ids[j]`` wrote ``reply[j]`` to
``prompt[j]`` (a routed ``pop.generate`` gives them). Everything here is tokenizer-agnostic and never imports
``transformers``: the model is called as ``pop(input_ids, attention_mask=..., position_ids=..., use_cache=False,
individuals=ids)`` (the keywords it accepts) and its ``.logits`` (or the tensor it returns) are read.

- :func:`token_logprobs`: ``log p(reply token | prompt, reply so far)`` of every row through ONE routed
  forward per micro batch (left padding, with attention mask and position ids, so a padded row computes what
  it computes alone). :data:`~populora.BASE` rows give the frozen base model's log-probs.
- :func:`advantages`: REINFORCE++ (centred per prompt group, then whitened over the batch), GRPO (z-score per
  group) or plain REINFORCE with a baseline (the group mean).
- :func:`kl_estimate` / :func:`kl_to_base`: the per-token KL of an individual to the base model.
- :func:`policy_gradient_step_`: one optimizer step of every individual on its own rows' REINFORCE loss
  (plus ``kl_coef`` times the KL to the base), checked before anything moves, and under ``torch.distributed``
  with every rank's gradients summed so all ranks take the same step.

Each individual's loss is normalised by its OWN rows (``reduction``), so the step of an individual does not
depend on how many rows the others had: one batched step equals ``P`` separate single-individual steps.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch
import torch.distributed as dist
from torch import Tensor, nn

from populora import distributed as pd
from populora.checks import check_float, check_index, check_int, check_one_of, is_int
from populora.config import Config, config_from_legacy
from populora.errors import FitnessError, InvalidIndexError, InvalidTypeError, InvalidValueError
from populora.fitness import as_fitnesses
from populora.routing import BASE
from populora.train.lr import LRMultipliers
from populora.transaction import Grads, transaction

__all__ = [
    "ADVANTAGE_METHODS",
    "KL_ESTIMATORS",
    "REDUCTIONS",
    "PolicyGradient",
    "PolicyGradientStats",
    "TokenLogprobs",
    "advantages",
    "check_individuals",
    "kl_estimate",
    "kl_to_base",
    "policy_gradient_step_",
    "token_logprobs",
]

ADVANTAGE_METHODS = ("reinforce++", "grpo", "baseline")
KL_ESTIMATORS = ("k1", "k2", "k3")
REDUCTIONS = ("token_mean", "sequence_mean", "sum")


class TokenLogprobs(NamedTuple):
    """Per-token log-probs of replies, left aligned: column ``t`` is reply token ``t``.

    Attributes:
        logprobs: ``(n, T)`` (``T`` the longest reply), 0 past a row's reply; float32 at least (float64 for a
            float64 model).
        mask: ``(n, T)`` bool, True on reply tokens.
    """

    logprobs: Tensor
    mask: Tensor


@dataclass(frozen=True)
class PolicyGradient(Config):
    """The options of :func:`policy_gradient_step_`, checked when built (a bad field is named).

    Attributes:
        pad_id: the left padding id (``>= 0``; checked against the model's vocabulary at the step).
        micro_batch: rows per forward / backward (``>= 1``).
        reduction: ``"token_mean"``, ``"sequence_mean"`` or ``"sum"`` (see :func:`policy_gradient_step_`).
        kl_coef: weight ``>= 0`` of the KL-to-base term.
        kl_estimator: ``"k1"``, ``"k2"`` or ``"k3"`` (:func:`kl_estimate`).
        max_grad_norm: clip each individual's gradient to this L2 norm (``> 0``; ``None``: no clipping).

    Example:
        >>> PolicyGradient(kl_coef=0.01, max_grad_norm=1.0).reduction
        'token_mean'
        >>> PolicyGradient(reduction="mean")
        Traceback (most recent call last):
        ...
        populora.errors.InvalidValueError: `PolicyGradient.reduction` must be one of ...
    """

    pad_id: int = 0
    micro_batch: int = 8
    reduction: str = "token_mean"
    kl_coef: float = 0.0
    kl_estimator: str = "k3"
    max_grad_norm: float | None = None

    def __post_init__(self) -> None:  # each field stored as checked (a NumPy int as an int, ...): JSON-safe
        checked = {
            "pad_id": check_int("PolicyGradient.pad_id", self.pad_id, low=0),
            "micro_batch": check_int("PolicyGradient.micro_batch", self.micro_batch, low=1),
            "reduction": check_one_of("PolicyGradient.reduction", self.reduction, REDUCTIONS),
            "kl_coef": check_float("PolicyGradient.kl_coef", self.kl_coef, low=0.0),
            "kl_estimator": check_one_of("PolicyGradient.kl_estimator", self.kl_estimator, KL_ESTIMATORS),
            "max_grad_norm": None
            if self.max_grad_norm is None
            else check_float("PolicyGradient.max_grad_norm", self.max_grad_norm, low=0.0, low_open=True),
        }
        for name, value in checked.items():
            object.__setattr__(self, name, value)


@dataclass(frozen=True)
class PolicyGradientStats:
    """What one :func:`policy_gradient_step_` did (global over the ranks under ``torch.distributed``).

    Attributes:
        loss: the value of the loss that was differentiated (the sum of every individual's loss).
        grad_norms: ``(P,)`` float64, each individual's gradient L2 norm before clipping.
        tokens: ``(P,)`` int64, reply tokens of each individual's rows.
        kl: ``(P,)`` float64 mean per-token KL estimate to the base (``None`` when ``kl_coef == 0``).
    """

    loss: float
    grad_norms: Tensor
    tokens: Tensor
    kl: Tensor | None

    def as_dict(self) -> dict[str, float]:
        """The step's numbers, ``{name: number}``: ``loss``, ``grad_norm_mean`` / ``grad_norm_max`` over the
        individuals, ``tokens`` (their sum) and, with a KL term, ``kl_mean`` (token-weighted: every reply token of
        every individual counts once).

        Numbers only, so logging is one line: ``writer.add_scalars("pg", stats.as_dict(), step)`` (TensorBoard),
        ``wandb.log(stats.as_dict())``, a ``csv.DictWriter`` row.
        """
        norms = self.grad_norms.double()
        out = {
            "loss": float(self.loss),
            "grad_norm_mean": float(norms.mean()) if norms.numel() else 0.0,
            "grad_norm_max": float(norms.max()) if norms.numel() else 0.0,
            "tokens": int(self.tokens.sum()),
        }
        if self.kl is not None:
            weights = self.tokens.double()
            total = float(weights.sum())
            out["kl_mean"] = float((self.kl.double() * weights).sum()) / total if total > 0 else 0.0
        return out


# ---------------------------------------------------------------------------------------------- checks


def check_individuals(individuals: Any, pop_size: int, *, allow_base: bool, name: str = "individuals") -> list[int]:
    """``individuals`` as a list of int ids in ``[0, pop_size)`` (and :data:`~populora.BASE` if ``allow_base``).

    Raises:
        InvalidTypeError: not a 1-D sequence or integer tensor, or an entry that is not an integer (named).
        InvalidIndexError: an id out of range (named with its position).
    """
    if not isinstance(individuals, (Tensor, Sequence)) and hasattr(individuals, "__array__"):
        individuals = torch.as_tensor(individuals)  # a NumPy array
    if isinstance(individuals, Tensor):
        if individuals.dtype.is_floating_point or individuals.dtype.is_complex or individuals.dtype == torch.bool:
            raise InvalidTypeError(f"`{name}` must hold integer ids, got a tensor of dtype {individuals.dtype}")
        if individuals.dim() != 1:
            raise InvalidValueError(f"`{name}` must be 1-D, got shape {tuple(individuals.shape)}")
        values = individuals.tolist()
    elif isinstance(individuals, Sequence) and not isinstance(individuals, (str, bytes)):
        values = list(individuals)
    else:
        raise InvalidTypeError(
            f"`{name}` must be a sequence or 1-D integer tensor of ids, got {type(individuals).__name__}"
        )
    out = []
    for k, v in enumerate(values):
        if isinstance(v, Tensor) and v.numel() == 1 and not v.dtype.is_floating_point:
            v = v.item()
        if is_int(v) and int(v) == BASE:
            if not allow_base:
                raise InvalidIndexError(
                    f"`{name}[{k}]` is BASE, the frozen base model: it has no adapters to train "
                    f"(ids must be in [0, {pop_size}))"
                )
            out.append(BASE)
            continue
        out.append(check_index(f"{name}[{k}]", v, pop_size))
    return out


def _token_rows(name: str, rows: Any, *, allow_empty: bool) -> list[Tensor]:
    """Each row of token ids as a 1-D int64 CPU tensor (a list of ints or a 1-D integer tensor)."""
    if isinstance(rows, (str, bytes)) or not isinstance(rows, Sequence):
        if not (isinstance(rows, Tensor) and rows.dim() == 2):
            raise InvalidTypeError(
                f"`{name}` must be a sequence of token id rows (lists of ints or 1-D integer tensors), "
                f"got {type(rows).__name__}"
            )
    out = []
    for k, row in enumerate(rows):
        if isinstance(row, Tensor):
            if row.dtype.is_floating_point or row.dtype.is_complex or row.dtype == torch.bool or row.dim() != 1:
                raise InvalidTypeError(
                    f"`{name}[{k}]` must be a 1-D integer tensor, got {row.dtype} of shape {tuple(row.shape)}"
                )
            t = row.detach().to("cpu", torch.int64)
        elif isinstance(row, Sequence) and not isinstance(row, (str, bytes)):
            bad = [v for v in row if not is_int(v)]
            if bad:
                raise InvalidTypeError(f"`{name}[{k}]` must hold int token ids, got {type(bad[0]).__name__} {bad[0]!r}")
            t = torch.tensor([int(v) for v in row], dtype=torch.int64)
        else:
            raise InvalidTypeError(
                f"`{name}[{k}]` must be a list of ints or a 1-D integer tensor, got {type(row).__name__}"
            )
        if t.numel() and int(t.min()) < 0:
            raise InvalidValueError(f"`{name}[{k}]` holds the negative token id {int(t.min())}")
        if not allow_empty and t.numel() == 0:
            raise InvalidValueError(f"`{name}[{k}]` is empty: a reply's first token needs a prompt token before it")
        out.append(t)
    return out


def _rows(population: Any, prompts: Any, replies: Any, individuals: Any, *, allow_base: bool) -> tuple:
    if not isinstance(population, nn.Module) or not hasattr(population, "adapter_parameters"):
        raise InvalidTypeError(f"`population` must be a populora Population, got {type(population).__name__}")
    if getattr(population, "spent", False):
        raise InvalidValueError("`population` was merged or closed: it cannot be used any more")
    p = _token_rows("prompts", prompts, allow_empty=False)
    r = _token_rows("replies", replies, allow_empty=True)
    # a Population's int (nn.Module's __getattr__ types an attribute as a tensor or a module)
    pop_size: int = population.pop_size  # type: ignore[assignment]
    ids = check_individuals(individuals, pop_size, allow_base=allow_base)
    if not len(p) == len(r) == len(ids):
        raise InvalidValueError(
            f"`prompts`, `replies` and `individuals` must have one entry per row, got {len(p)}, {len(r)} and {len(ids)}"
        )
    return p, r, ids


def _vocab_size(model: nn.Module) -> int | None:
    """The number of token ids ``model`` embeds, where it says: its input embedding's ``num_embeddings``
    (``get_input_embeddings()``), else ``config.vocab_size``; ``None`` when neither is known."""
    get = getattr(model, "get_input_embeddings", None)
    if callable(get):
        try:
            embedding = get()
        except (NotImplementedError, AttributeError):
            embedding = None
        if isinstance(embedding, nn.Embedding):
            return int(embedding.num_embeddings)
    size: Any = getattr(getattr(model, "config", None), "vocab_size", None)
    return int(size) if is_int(size) and size > 0 else None


def _check_vocab(population: Any, rows: dict[str, list[Tensor]], pad_id: int) -> None:
    """Every token id (and ``pad_id``) below the model's vocabulary size, where it is known; the first id
    beyond it is named with its row, before any forward (torch's embedding would raise a bare IndexError)."""
    size = _vocab_size(population.model)
    if size is None:
        return
    for name, table in rows.items():
        for k, row in enumerate(table):
            if row.numel() and int(row.max()) >= size:
                bad = int(row.max())
                at = int((row == bad).nonzero()[0])
                raise InvalidIndexError(
                    f"`{name}[{k}]` holds the token id {bad} (position {at}), out of the model's vocabulary "
                    f"[0, {size}) (its input embedding's num_embeddings / config.vocab_size)"
                )
    if pad_id >= size:
        raise InvalidIndexError(f"`pad_id` is {pad_id}, out of the model's vocabulary [0, {size})")


def _real_rows(name: str, values: Any, n: int, error: type[Exception]) -> Tensor:
    """``(n,)`` finite float64 values; a non-finite one is named by its row."""
    t = as_fitnesses(values, name)
    if t.dtype == torch.bool:
        raise error(f"`{name}` must be real numbers, got dtype {t.dtype}")
    t = t.to("cpu", torch.float64)
    if t.shape != (n,):
        raise error(f"`{name}` must have shape ({n},) (one value per row), got {tuple(t.shape)}")
    bad = (~torch.isfinite(t)).nonzero().flatten().tolist()
    if bad:
        raise error(f"`{name}` must be finite, got {float(t[bad[0]])} at row {bad[0]} (rows {bad})")
    return t


# ---------------------------------------------------------------------------------------------- log-probs


def _accepts(model: nn.Module) -> dict[str, bool]:
    """Which of the keywords a routed LM forward wants the model's ``forward`` takes."""
    params: Mapping[str, inspect.Parameter]
    try:
        params = inspect.signature(model.forward).parameters
    except (TypeError, ValueError):
        params = {}
    anything = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    return {k: anything or k in params for k in ("attention_mask", "position_ids", "use_cache")}


def _reply_logprobs(
    population: Any, prompts: list[Tensor], replies: list[Tensor], ids: list[int], pad_id: int
) -> tuple[Tensor, Tensor]:
    """One routed forward over left-padded ``prompt + reply`` rows: ``(m, T)`` left-aligned log-probs and mask."""
    lengths = torch.tensor([len(r) for r in replies], dtype=torch.int64)
    reply_width = int(lengths.max()) if len(replies) else 0
    if reply_width == 0:
        return torch.zeros(len(replies), 0, dtype=torch.float64), torch.zeros(len(replies), 0, dtype=torch.bool)
    seqs = [torch.cat([p, r]) for p, r in zip(prompts, replies)]
    width = max(len(s) for s in seqs)
    x = torch.full((len(seqs), width), pad_id, dtype=torch.int64)
    mask = torch.zeros(len(seqs), width, dtype=torch.int64)
    for j, s in enumerate(seqs):
        x[j, width - len(s) :] = s
        mask[j, width - len(s) :] = 1
    accepts = _accepts(population.model)
    kwargs: dict[str, Any] = {}
    if accepts["attention_mask"]:
        kwargs["attention_mask"] = mask.to(population.device)
    elif not bool(mask.all()):
        raise InvalidValueError(
            f"the model's forward takes no `attention_mask`, so rows of different lengths cannot be left padded "
            f"(got lengths {sorted({len(s) for s in seqs})}): pass rows of one length, or micro_batch=1"
        )
    if accepts["position_ids"]:  # a left-padded row's first real token is at position 0, as alone
        kwargs["position_ids"] = (mask.cumsum(-1) - 1).clamp(min=0).to(population.device)
    if accepts["use_cache"]:
        kwargs["use_cache"] = False
    out = population(x.to(population.device), individuals=torch.tensor(ids, dtype=torch.int64), **kwargs)
    logits = out if isinstance(out, Tensor) else out.logits  # (m, width, V)
    # logits at position t predict token t + 1: the window before the last reply_width tokens
    window = logits[:, width - 1 - reply_width : width - 1]
    window = window.to(torch.promote_types(window.dtype, torch.float32))
    target = x[:, width - reply_width :].to(window.device)
    right = torch.log_softmax(window, -1).gather(-1, target[..., None]).squeeze(-1)  # (m, Tr), right aligned
    k = torch.arange(reply_width)
    valid = k[None, :] < lengths[:, None]
    source = (reply_width - lengths[:, None] + k[None, :]).clamp(max=reply_width - 1)
    left = right.gather(1, source.to(right.device))
    valid = valid.to(right.device)
    return torch.where(valid, left, torch.zeros_like(left)), valid


def token_logprobs(
    population: Any,
    prompts: Sequence[Sequence[int] | Tensor],
    replies: Sequence[Sequence[int] | Tensor],
    individuals: Sequence[int] | Tensor,
    *,
    pad_id: int = 0,
    micro_batch: int = 8,
) -> TokenLogprobs:
    """Log-probs of every reply token under the individual that wrote it (``BASE``: the base model).

    Rows are left padded with ``pad_id`` and run ``micro_batch`` at a time, each micro batch ONE routed forward
    (with ``attention_mask`` and ``position_ids`` when the model takes them, so padding changes nothing). Runs
    under the caller's grad mode: inside ``torch.no_grad()`` for reference values, with grad for a loss.

    Args:
        population: a live :class:`~populora.Population` over a causal LM.
        prompts: ``n`` rows of prompt token ids (lists of ints or 1-D integer tensors), none empty.
        replies: ``n`` rows of reply token ids (may be empty).
        individuals: ``(n,)`` the individual of each row, in ``[0, P)`` or :data:`~populora.BASE`.
        pad_id: the id left padding uses (any id: padded positions are masked).
        micro_batch: rows per forward.

    Returns:
        :class:`TokenLogprobs` ``(logprobs (n, T), mask (n, T))``, ``T`` the longest reply.

    Raises:
        InvalidTypeError, InvalidValueError: malformed rows (the row is named), lengths that differ.
        InvalidIndexError: an id out of range, a token id (or ``pad_id``) beyond the model's vocabulary.
    """
    prompt_rows, reply_rows, ids = _rows(population, prompts, replies, individuals, allow_base=True)
    micro_batch = check_int("micro_batch", micro_batch, low=1)
    pad_id = check_int("pad_id", pad_id, low=0)
    _check_vocab(population, {"prompts": prompt_rows, "replies": reply_rows}, pad_id)
    n = len(ids)
    width = max((len(r) for r in reply_rows), default=0)
    parts, masks = [], []
    for start in range(0, n, micro_batch):
        chunk = slice(start, start + micro_batch)
        lp, m = _reply_logprobs(population, prompt_rows[chunk], reply_rows[chunk], ids[chunk], pad_id)
        pad = width - lp.shape[1]
        parts.append(nn.functional.pad(lp, (0, pad)))
        masks.append(nn.functional.pad(m, (0, pad)))
    if not parts:
        return TokenLogprobs(torch.zeros(0, 0), torch.zeros(0, 0, dtype=torch.bool))
    dtype = max((p.dtype for p in parts), key=lambda d: torch.finfo(d).bits)
    return TokenLogprobs(torch.cat([p.to(dtype) for p in parts]), torch.cat(masks))


# ---------------------------------------------------------------------------------------------- advantages


def _group_index(groups: Any, n: int) -> Tensor:
    """``(n,)`` int64 group number of each row: rows with equal keys (1-D ids or rows of a 2-D table) share one."""
    if groups is None:
        return torch.zeros(n, dtype=torch.int64)
    try:
        g = torch.as_tensor(groups)
    except (TypeError, ValueError, RuntimeError):
        raise InvalidTypeError(
            f"`groups` must be a (n,) or (n, k) integer table of keys, got {type(groups).__name__}"
        ) from None
    if g.dtype.is_floating_point or g.dtype.is_complex or g.dtype == torch.bool:
        raise InvalidTypeError(f"`groups` must hold integer keys, got dtype {g.dtype}")
    if g.dim() not in (1, 2) or g.shape[0] != n:
        raise InvalidValueError(f"`groups` must have shape ({n},) or ({n}, k), one key per row, got {tuple(g.shape)}")
    if n == 0:
        return torch.zeros(0, dtype=torch.int64)
    return torch.unique(g.cpu().long(), dim=0, return_inverse=True)[1]


def _group_stats(x: Tensor, index: Tensor) -> tuple[Tensor, Tensor]:
    """Each row's group mean and group standard deviation (``correction=0``), both ``(n,)``."""
    k = int(index.max()) + 1 if index.numel() else 0
    count = torch.zeros(k, dtype=x.dtype).index_add_(0, index, torch.ones_like(x))
    mean = torch.zeros(k, dtype=x.dtype).index_add_(0, index, x) / count
    var = torch.zeros(k, dtype=x.dtype).index_add_(0, index, (x - mean[index]).square()) / count
    return mean[index], var.sqrt()[index]


def advantages(rewards: Any, groups: Any = None, *, method: str = "reinforce++", eps: float = 1e-8) -> Tensor:
    """``(n,)`` float64 advantages of ``n`` rows from their rewards.

    ``groups`` gives each row a key (``(n,)`` ids, or an ``(n, k)`` table whose equal rows are one key): the
    rows that answered one prompt (in a population: key the prompt AND the individual, e.g.
    ``torch.stack([prompt_ids, individuals], 1)``, for a baseline of that individual's own answers).
    ``None`` makes the whole batch one group. Standard deviations are population ones (``correction=0``).

    - ``"reinforce++"`` (REINFORCE++, the paper's): ``a = r - mean_group(r)``, then whitened over the batch:
      ``(a - mean(a)) / (std(a) + eps)``.
    - ``"grpo"``: ``(r - mean_group(r)) / (std_group(r) + eps)`` (a group of one gets 0).
    - ``"baseline"``: REINFORCE with the group mean as baseline, ``r - mean_group(r)``, not rescaled.

    For global statistics under ``torch.distributed``, pass every rank's rows (gathered) and keep your share.

    Raises:
        FitnessError: rewards that are not real numbers, of another length, or not finite (the row is named).
        InvalidTypeError, InvalidValueError: bad ``groups``, ``method`` or ``eps``.

    Example:
        >>> advantages([1.0, 0.0, 1.0, 1.0], groups=[0, 0, 1, 1], method="baseline")
        tensor([ 0.5000, -0.5000,  0.0000,  0.0000], dtype=torch.float64)
    """
    method = check_one_of("method", method, ADVANTAGE_METHODS)
    eps = check_float("eps", eps, low=0.0)
    probe = as_fitnesses(rewards, "rewards")
    if probe.dim() != 1:
        raise FitnessError(f"`rewards` must be 1-D, one reward per row, got shape {tuple(probe.shape)}")
    r = _real_rows("rewards", probe, probe.numel(), FitnessError)
    index = _group_index(groups, r.numel())
    if r.numel() == 0:
        return r
    mean, std = _group_stats(r, index)
    centred = r - mean
    if method == "baseline":
        return centred
    if method == "grpo":
        return centred / (std + eps)
    return (centred - centred.mean()) / (centred.std(correction=0) + eps)


# ---------------------------------------------------------------------------------------------- KL to the base


def kl_estimate(logprobs: Tensor, ref_logprobs: Tensor, estimator: str = "k3") -> Tensor:
    """Per-token estimates of ``KL(pi || ref)`` from tokens sampled by ``pi`` (Schulman's k1, k2, k3).

    With ``d = ref - logp``: ``k1 = -d`` (unbiased, can be negative), ``k2 = d**2 / 2`` (biased, non-negative),
    ``k3 = exp(d) - d - 1`` (unbiased, non-negative: GRPO's, the default). All are 0 where ``pi == ref``.

    Example:
        >>> kl_estimate(torch.tensor([-1.0, -2.0]), torch.tensor([-1.0, -2.0])).tolist()
        [0.0, 0.0]
    """
    estimator = check_one_of("estimator", estimator, KL_ESTIMATORS)
    d = ref_logprobs - logprobs
    if estimator == "k1":
        return -d
    if estimator == "k2":
        return 0.5 * d.square()
    return torch.expm1(d) - d


def kl_to_base(
    population: Any,
    prompts: Sequence[Sequence[int] | Tensor],
    replies: Sequence[Sequence[int] | Tensor],
    individuals: Sequence[int] | Tensor,
    *,
    pad_id: int = 0,
    micro_batch: int = 8,
    estimator: str = "k3",
) -> TokenLogprobs:
    """Per-token KL estimates of each row's individual to the frozen base model, without grad.

    The base's log-probs come from the same rows routed to :data:`~populora.BASE` (one extra routed forward
    per micro batch); see :func:`kl_estimate` for the estimators.

    Returns:
        :class:`TokenLogprobs` whose ``logprobs`` holds the ``(n, T)`` estimates (0 off the mask).
    """
    estimator = check_one_of("estimator", estimator, KL_ESTIMATORS)
    ids = check_individuals(individuals, getattr(population, "pop_size", 0), allow_base=True)
    with torch.no_grad():
        own = token_logprobs(population, prompts, replies, ids, pad_id=pad_id, micro_batch=micro_batch)
        ref = token_logprobs(population, prompts, replies, [BASE] * len(ids), pad_id=pad_id, micro_batch=micro_batch)
    kl = kl_estimate(own.logprobs, ref.logprobs.to(own.logprobs.dtype), estimator)
    return TokenLogprobs(torch.where(own.mask, kl, torch.zeros_like(kl)), own.mask)


# ---------------------------------------------------------------------------------------------- the step


def _optimizers(optimizer: Any) -> list[torch.optim.Optimizer]:
    if isinstance(optimizer, torch.optim.Optimizer):
        return [optimizer]
    if isinstance(optimizer, Sequence) and not isinstance(optimizer, (str, bytes)) and optimizer:
        if all(isinstance(o, torch.optim.Optimizer) for o in optimizer):
            return list(optimizer)
    raise InvalidTypeError(
        f"`optimizer` must be a torch.optim.Optimizer (or a non-empty sequence of them), got {type(optimizer).__name__}"
    )


def _all_reduce_(tensors: list[Tensor]) -> None:
    """Sum every tensor over the ranks, in place (one flat buffer per dtype)."""
    device = pd.comm_device()
    for dtype in sorted({t.dtype for t in tensors}, key=str):
        group = [t for t in tensors if t.dtype == dtype]
        flat = torch.cat([t.reshape(-1).to(device) for t in group])
        dist.all_reduce(flat)
        offset = 0
        for t in group:
            t.copy_(flat[offset : offset + t.numel()].view_as(t))
            offset += t.numel()


def policy_gradient_step_(
    population: Any,
    optimizer: torch.optim.Optimizer | Sequence[torch.optim.Optimizer],
    prompts: Sequence[Sequence[int] | Tensor],
    replies: Sequence[Sequence[int] | Tensor],
    individuals: Sequence[int] | Tensor,
    advantages: Any,
    config: PolicyGradient | None = None,
    *,
    lr_multipliers: LRMultipliers | None = None,
    distributed: bool | None = None,
    by_member: bool = False,
    **legacy: Any,
) -> PolicyGradientStats:
    """One optimizer step of every individual on the REINFORCE loss of its own rows, in place.

    Individual ``i``'s loss, over its rows ``j`` (reply tokens ``t``), ``A_j`` the row's advantage::

        L_i = sum_j sum_t w_jt * (-A_j * log p_i(y_jt) + kl_coef * KL_jt)

    (the options, ``kl_coef`` and the rest, are the fields of ``config``, a :class:`PolicyGradient`)

    with ``w_jt = 1 / (reply tokens of i)`` for ``reduction="token_mean"``, ``1 / (len_j * rows of i)`` for
    ``"sequence_mean"`` (each row's mean, averaged over i's rows) and ``1`` for ``"sum"``; ``KL_jt`` the
    :func:`kl_estimate` to the base model (its log-probs from :data:`~populora.BASE` rows, no grad). The sum of
    the ``L_i`` is differentiated, ``micro_batch`` rows per routed forward and backward; individual ``i``'s
    gradient is that of ``L_i`` alone. Then, optionally, each individual's gradient is clipped to
    ``max_grad_norm`` (per individual), and ``optimizer.step()`` runs once (through ``lr_multipliers`` when
    given: individual ``i``'s update scaled by its multiplier). Every adapter parameter the optimizer holds
    gets a gradient, zero for an individual without rows, so a call is one optimizer step of every individual
    (Adam's moments of an individual without rows still decay and move it, as in a step of that individual
    alone with a zero gradient).

    The adapters the optimizer holds take part in the backward whatever their ``requires_grad`` (flags are
    restored after), so a population built without ``requires_grad=True`` trains too. The model's train / eval
    mode is the caller's (eval switches dropout off; HF gradient checkpointing needs train). Rows whose
    advantage is 0 skip the forward when ``kl_coef == 0`` (their gradient is exactly 0; their tokens count).

    Distributed (``distributed=None``: whenever ``torch.distributed`` is initialised): each rank passes ITS
    rows; the per-individual token and row counts and then the gradients are summed over the ranks before the
    step, so every rank takes the same step (the step a single process would take on all the rows). Every
    rank must call it, with or without rows (its checks run before the first collective: a rank
    that refuses its input leaves the others waiting until the process group's timeout).

    Args:
        population: a live :class:`~populora.Population` over a causal LM.
        optimizer: a ``torch.optim.Optimizer`` over (some of) ``population.adapter_parameters()``, or several.
            Element-wise optimizers (SGD, Adam, AdamW, RMSprop, Adagrad, ``ClipUp(per_individual=True)``) keep
            the individuals independent; one with a norm over a whole parameter couples them.
        prompts, replies: ``n`` rows of token ids (see :func:`token_logprobs`).
        individuals: ``(n,)`` ids in ``[0, P)`` (:data:`~populora.BASE` has nothing to train).
        advantages: ``(n,)`` finite per-row advantages (:func:`advantages`).
        config: a :class:`PolicyGradient` (``pad_id``, ``micro_batch``, ``reduction``, ``kl_coef``,
            ``kl_estimator``, ``max_grad_norm``); ``None``: its defaults.
        lr_multipliers: per-individual learning-rate multipliers (:class:`~populora.train.LRMultipliers`).
        distributed: sum over the ranks (``None``: when a process group is initialised).
        by_member: micro batches never mix individuals: individual ``i``'s rows (in row order) are cut into
            ``micro_batch`` chunks of their own, individuals in id order, so the shapes an individual's rows run
            in do not depend on the other individuals' rows (what makes its gradient the same, bit for bit,
            whichever rows a process holds; :class:`~populora.PopuLoRA` trains members on their own ranks so).
        legacy: 0.5.0's flat keywords (``kl_coef=0.01, ...``): deprecated, applied over ``config`` with a
            ``DeprecationWarning`` (the same step, bit for bit); they go in 0.7.0.

    Returns:
        :class:`PolicyGradientStats`.

    Raises:
        InvalidTypeError: rows or ids of the wrong type (a float id), not an optimizer.
        InvalidIndexError: an id out of ``[0, P)`` (its row named); a token id, or ``pad_id``, beyond the
            model's vocabulary where it is known (``get_input_embeddings().num_embeddings``,
            ``config.vocab_size``; the id and its row named).
        FitnessError: a non-finite advantage (its row named).
        InvalidValueError: lengths that differ, an optimizer holding none of the adapters, a bad option.

    Every check runs before anything is written: on a bad input no parameter, gradient or optimizer state has
    changed. The caller's ``.grad`` tensors (of every parameter the optimizers hold) are kept, and put back
    as they were if the forward or the backward raises.
    """
    config = config_from_legacy(PolicyGradient, config, legacy, where="policy_gradient_step_")
    pad_id, micro_batch, reduction = config.pad_id, config.micro_batch, config.reduction
    kl_coef, kl_estimator, max_grad_norm = config.kl_coef, config.kl_estimator, config.max_grad_norm
    prompt_rows, reply_rows, ids = _rows(population, prompts, replies, individuals, allow_base=False)
    n, size = len(ids), population.pop_size
    adv = _real_rows("advantages", advantages, n, FitnessError)
    optimizers = _optimizers(optimizer)
    _check_vocab(population, {"prompts": prompt_rows, "replies": reply_rows}, pad_id)
    if lr_multipliers is not None:
        if not isinstance(lr_multipliers, LRMultipliers):
            raise InvalidTypeError(
                f"`lr_multipliers` must be a populora.train.LRMultipliers, got {type(lr_multipliers).__name__}"
            )
        if lr_multipliers.pop_size != size:
            raise InvalidValueError(
                f"`lr_multipliers` holds {lr_multipliers.pop_size} multipliers, the population has {size} individuals"
            )
    held_ids = {id(p) for opt in optimizers for g in opt.param_groups for p in g["params"]}
    params = [p for p in population.adapter_parameters() if id(p) in held_ids]
    if not params:
        raise InvalidValueError(
            "`optimizer` holds none of the population's adapter parameters: build it over "
            "population.adapter_parameters()"
        )
    use_dist = pd.is_distributed() if distributed is None else bool(distributed) and pd.is_distributed()

    # every individual's normaliser, over every rank's rows
    lengths = torch.tensor([len(r) for r in reply_rows], dtype=torch.float64)
    index = torch.tensor(ids, dtype=torch.int64)
    counts = torch.zeros(2, size, dtype=torch.float64)
    counts[0].index_add_(0, index, lengths)
    counts[1].index_add_(0, index, (lengths > 0).to(torch.float64))
    if use_dist:
        _all_reduce_([counts])
    tokens, rows_of = counts[0], counts[1]
    if reduction == "token_mean":
        weight = 1.0 / tokens.clamp(min=1)[index]
    elif reduction == "sequence_mean":
        weight = 1.0 / (lengths.clamp(min=1) * rows_of.clamp(min=1)[index])
    else:
        weight = torch.ones(n, dtype=torch.float64)

    flags = [p.requires_grad for p in params]
    # (zero_grad drops every held parameter's .grad: the caller's, put back if the forward or backward raises)
    held = list({id(p): p for opt in optimizers for g in opt.param_groups for p in g["params"]}.values())
    loss_total = torch.zeros((), dtype=torch.float64)
    kl_sum = torch.zeros(size, dtype=torch.float64)
    work = [j for j in range(n) if len(reply_rows[j]) and (kl_coef > 0 or adv[j] != 0)]
    try:
        with transaction(Grads(held)):
            for opt in optimizers:
                opt.zero_grad(set_to_none=True)
            for p in params:
                p.requires_grad_(True)
            with torch.enable_grad():
                if by_member:
                    chunks = [
                        part[start : start + micro_batch]
                        for part in ([j for j in work if ids[j] == i] for i in sorted({ids[j] for j in work}))
                        for start in range(0, len(part), micro_batch)
                    ]
                else:
                    chunks = [work[start : start + micro_batch] for start in range(0, len(work), micro_batch)]
                for chunk in chunks:
                    chunk_p, chunk_r = [prompt_rows[j] for j in chunk], [reply_rows[j] for j in chunk]
                    chunk_ids = [ids[j] for j in chunk]
                    lp, mask = _reply_logprobs(population, chunk_p, chunk_r, chunk_ids, pad_id)
                    w = weight[chunk].to(lp.device, lp.dtype)[:, None] * mask
                    loss = -(adv[chunk].to(lp.device, lp.dtype)[:, None] * lp * w).sum()
                    if kl_coef > 0:
                        with torch.no_grad():
                            ref, _ = _reply_logprobs(population, chunk_p, chunk_r, [BASE] * len(chunk), pad_id)
                        kl = kl_estimate(lp, ref.to(lp.dtype), kl_estimator) * mask
                        loss = loss + kl_coef * (kl * w).sum()
                        kl_sum.index_add_(0, index[chunk], kl.detach().double().sum(1).cpu())
                    loss.backward()
                    loss_total += loss.detach().double().cpu()
            for p in params:
                if p.grad is None:  # an individual (or a rank) without rows: a zero gradient, stepped all the same
                    p.grad = torch.zeros_like(p)
            if use_dist:
                stats = torch.cat([loss_total.view(1), kl_sum])
                _all_reduce_([p.grad for p in params] + [stats])
                loss_total, kl_sum = stats[0], stats[1:]
            with torch.no_grad():
                norms = torch.zeros(size, dtype=torch.float64, device=population.device)
                for p in params:
                    norms += p.grad.detach().double().flatten(1).square().sum(1).to(norms.device)
                norms = norms.sqrt()
                if max_grad_norm is not None:  # torch's clip_grad_norm_ rule, per individual
                    scale = (max_grad_norm / (norms + 1e-6)).clamp(max=1.0)
                    for p in params:
                        p.grad.mul_(scale.to(p.grad.device, p.grad.dtype).view(-1, *[1] * (p.dim() - 1)))
    finally:
        for p, flag in zip(params, flags):
            p.requires_grad_(flag)
    if lr_multipliers is not None:
        lr_multipliers.step(optimizers, params)
    else:
        for opt in optimizers:
            opt.step()
    mean_kl = (kl_sum / tokens.clamp(min=1)) if kl_coef > 0 else None
    return PolicyGradientStats(float(loss_total), norms.cpu(), tokens.round().to(torch.int64), mean_kl)
