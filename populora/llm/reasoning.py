"""ES reasoning: :class:`~populora.EggrollES` on a causal LM with a programmatic verifier as the fitness.

Every ES member answers the same prompts with greedy decoding in ONE routed
``members.generate`` call; a verifier (``Problem.check`` of
:mod:`populora.tasks`, or any ``reward_fn(problem, reply) -> float``) scores
each reply; the ``(N, n)`` reward matrix is group-normalised per prompt and
the ES steps on it::

    from populora import EggrollES
    from populora.es.config import EggrollConfig
    from populora.llm.reasoning import ES_AT_SCALE, group_normalize, verifier_rewards

    N, sigma = 8, 1e-3                                              # ES_AT_SCALE.pop_size = 30 when it fits
    es = EggrollES(model, N, sigma, es_at_scale_lr(5e-4, sigma, N), rank=1,
                   config=EggrollConfig(fitness_shaping="zscore"), param_filter=block_weights)
    for step in range(steps):
        problems = task.sample(32, generator)
        rewards = verifier_rewards(es.ask(), tokenizer, problems, max_new_tokens=16, task=task)  # (N, n)
        es.tell(group_normalize(rewards))                                                           # (N,)

(:func:`verifier_step` does those two lines and returns both.)

Group normalisation (:func:`group_normalize`): the rewards of one prompt are
z-scored across the members that answered it (``(r - mean) / std``), a
prompt that every member solves, or every member fails, contributes exactly
0, and a member's fitness is the mean over its prompts. So an easy or
hopeless prompt adds no noise, and every informative prompt weighs the same
whatever its success rate (GRPO's per-prompt advantage, applied to members
instead of samples). The fitnesses of a group sum to 0.

Groups (``groups=``, the EGGROLL layout): by default every member answers
every prompt (one group of ``N``; the "ES at scale" layout). With
``EggrollES(..., group_size=G)`` pass ``groups=es.groups()``: the members
form ``N / G`` groups of ``G`` (whole antithetic pairs), group ``j``
answers only its own slice ``j`` of the problems (``n / (N / G)`` each), and
rewards are normalised within the group. ``group_size`` therefore counts
MEMBERS that share a prompt (EGGROLL's "group size 8 per prompt", and
``EggrollES``'s own ``group_size``): for the same number of generated rows
each step sees ``N / G`` times more prompts, at the price of comparing each
member with ``G - 1`` others only.

The "ES at scale" recipe (Qiu et al. 2025, "Evolution Strategies at Scale:
LLM Fine-Tuning Beyond Reinforcement Learning") is the documented starting
point, :data:`ES_AT_SCALE`: ``N = 30`` members, ``sigma = 1e-3``, greedy
decoding, 200 prompts per step, full-parameter noise, and the step
``theta += alpha / N * sum_i z_i eps_i`` with ``alpha = 5e-4`` (the ``1 / sigma``
of the gradient estimate folded into ``alpha``). populora's update is
``theta += lr * g``, ``g = sqrt(N) * mean_i(z_i * sigma * E_i)`` (``E_i`` the
member's unit perturbation, ``eps_i`` above), i.e.
``theta += lr * sigma / sqrt(N) * sum_i z_i E_i``; the same step therefore needs
``lr = alpha / (sigma * sqrt(N))`` (:func:`es_at_scale_lr`): about 0.0913 for
``alpha = 5e-4, sigma = 1e-3, N = 30``. With ``lr = 5e-4`` the step is 180
times too small: ES runs and never learns.

Shaping: ``es.tell(group_normalize(rewards))`` with the ES's default
``fitness_shaping="zscore"``, which rescales the (already centred)
per-prompt fitnesses to unit variance across members. The recipe's ``alpha``
is calibrated for unit-variance ``z`` (it z-scores the members' mean
rewards), while :func:`group_normalize`'s values have a much smaller spread
(prompts that nobody or everybody solves contribute 0, and the others
partly cancel: ``fitness_std`` in ``experiments/es_countdown.py``'s log was
0.13-0.33 on SmolLM2 Countdown(1) with N = 8, sigma = 1e-3 and 8 prompts, of
which only 0-3 separated the members). With
``"raw"`` the step would shrink by that factor, so the mapped ``lr`` would no
longer be the recipe's step; ``"raw"`` is the choice when the step should
scale with how many prompts separate the members. ``"centered_rank"`` has a
fixed spread of about 0.29 (ranks in [-0.5, 0.5]) and would shrink the step
likewise. ``z`` then keeps the ordering of the group-normalised fitnesses.

Which weights: the LM's block weights (every ``nn.Linear`` of the decoder
blocks, RMSNorm gains frozen, embeddings and head excluded as in EGGROLL:
``param_filter=`` :func:`block_weights`), or the ``lora_A`` / ``lora_B``
weights of a PEFT LoRA on the frozen base (``peft.get_peft_model`` freezes
the base, the ES selects what requires grad).

Rows and memory: one call generates ``N * n`` rows (``m * n / (N/G)`` with
groups); ``max_rows`` splits it into calls of whole members, which bounds the
KV cache (about 46 KB per row and token on SmolLM2-135M in float32).

Reproducibility: greedy decoding is deterministic, so the rewards and the ES
run are a function of the seeds (ES noise, problem sampling), bitwise on a
given machine for a given batch layout.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import torch
from torch import Tensor

from populora.checks import check_bool, check_float, check_int
from populora.errors import FitnessError, InvalidTypeError, InvalidValueError
from populora.llm.text import chat_text, encode, pad_id

__all__ = [
    "ES_AT_SCALE",
    "ESRecipe",
    "block_weights",
    "encode_prompts",
    "es_at_scale_lr",
    "generate_replies",
    "group_normalize",
    "problem_prompts",
    "verifier_accuracy",
    "verifier_rewards",
    "verifier_step",
]


class ESRecipe(NamedTuple):
    """An ES fine-tuning recipe in the paper's convention (``theta += alpha / N * sum_i z_i eps_i``).

    Attributes:
        pop_size: ``N`` members per step.
        sigma: noise scale (member ``i`` uses ``theta + sigma * eps_i``).
        alpha: the paper's step size (``1 / sigma`` folded in).
        prompts_per_step: prompts every member answers each step.
        greedy: greedy decoding (no sampling noise in the fitness).
    """

    pop_size: int
    sigma: float
    alpha: float
    prompts_per_step: int
    greedy: bool = True

    @property
    def lr(self) -> float:
        """populora's SGD learning rate for the same step: ``alpha / (sigma * sqrt(N))``."""
        return es_at_scale_lr(self.alpha, self.sigma, self.pop_size)


ES_AT_SCALE = ESRecipe(pop_size=30, sigma=1e-3, alpha=5e-4, prompts_per_step=200, greedy=True)
"""The "ES at scale" recipe: N = 30, sigma = 1e-3, alpha = 5e-4 (``lr`` about 0.0913), greedy, 200 prompts per step."""


def es_at_scale_lr(alpha: float, sigma: float, num_members: int) -> float:
    """populora's ``lr`` for the "ES at scale" step ``theta += alpha / N * sum_i z_i eps_i``.

    ``EggrollES`` with ``SGD(lr)`` updates ``theta += lr * sigma / sqrt(N) * sum_i z_i E_i``
    (``g = sqrt(N) * mean_i(z_i * sigma * E_i)``), so equal steps need
    ``lr = alpha / (sigma * sqrt(N))``.

    Args:
        alpha: the paper's step size (5e-4 in the recipe).
        sigma: the noise scale (1e-3).
        num_members: ``N`` (30).

    Returns:
        ``alpha / (sigma * sqrt(N))``, e.g. ``es_at_scale_lr(5e-4, 1e-3, 30)`` is about 0.0913.

    Raises:
        InvalidValueError: ``alpha`` negative, ``sigma`` not positive, ``num_members < 1``.

    Example:
        >>> round(es_at_scale_lr(5e-4, 1e-3, 30), 4)
        0.0913
    """
    alpha = check_float("alpha", alpha, low=0.0)
    sigma = check_float("sigma", sigma, low=0.0, low_open=True)
    num_members = check_int("num_members", num_members, low=1)
    return alpha / (sigma * math.sqrt(num_members))


def block_weights(name: str) -> bool:
    """``param_filter`` for ``EggrollES`` on a Llama-family LM: the decoder blocks' matrices only.

    Selects ``model.layers.{i}.*`` parameters that are not norms, i.e. the
    seven block linears (q, k, v, o, gate, up, down); the embeddings, the
    (tied) head and every RMSNorm gain stay frozen (EGGROLL's default). With
    a name filter the ES emits no warning about the unroutable norm gains.

    Example:
        >>> block_weights("model.layers.3.mlp.up_proj.weight"), block_weights("model.layers.3.input_layernorm.weight")
        (True, False)
        >>> block_weights("model.embed_tokens.weight"), block_weights("lm_head.weight")
        (False, False)
    """
    return ".layers." in f".{name}" and "norm" not in name


# ----------------------------------------------------------------------------- prompts and generation


def problem_prompts(problems: Sequence[Any], task: Any = None) -> list[str]:
    """The solver's user message of each problem: ``task.prompt(problem)``, or ``problem.question`` without a task.

    Raises:
        InvalidTypeError: a problem without ``question`` (and no ``task``), or a prompt that is not a string.
    """
    prompts = []
    for i, problem in enumerate(problems):
        if task is not None:
            text = task.prompt(problem)
        elif hasattr(problem, "question"):
            text = problem.question
        else:
            raise InvalidTypeError(
                f"problem {i} ({type(problem).__name__}) has no `question`; pass `task=` "
                "(an object with .prompt(problem)) to build its prompt"
            )
        if not isinstance(text, str):
            raise InvalidTypeError(f"the prompt of problem {i} must be a str, got {type(text).__name__}")
        prompts.append(text)
    return prompts


def encode_prompts(tokenizer: Any, prompts: Sequence[str], *, chat_template: bool | None = None) -> dict[str, Tensor]:
    """Left-padded ``input_ids`` / ``attention_mask`` ``(b, T)`` for generation.

    Args:
        tokenizer: a Hugging Face tokenizer (needs a pad token, or an eos token used as pad).
        prompts: ``b`` user messages.
        chat_template: wrap each prompt as one user turn with the tokenizer's chat template
            (``add_generation_prompt=True``); ``None`` (default): when the tokenizer has one.

    Raises:
        InvalidValueError: no prompts, ``chat_template=True`` for a tokenizer without one,
            or a tokenizer with neither pad nor eos token.
    """
    if isinstance(prompts, str) or not len(prompts):
        raise InvalidValueError(f"`prompts` must be a non-empty sequence of strings, got {prompts!r}")
    has_template = getattr(tokenizer, "chat_template", None) is not None
    if chat_template is None:
        chat_template = has_template
    elif check_bool("chat_template", chat_template) and not has_template:
        raise InvalidValueError(
            "chat_template=True but the tokenizer has no chat template; pass "
            "chat_template=False (or None) to use the prompts as they are"
        )
    if tokenizer.pad_token_id is None:
        if tokenizer.eos_token_id is None:
            raise InvalidValueError("the tokenizer has neither a pad nor an eos token: set tokenizer.pad_token")
        tokenizer.pad_token = tokenizer.eos_token
    input_ids, attention_mask = encode(tokenizer, [chat_text(tokenizer, p, chat_template) for p in prompts])
    return {"input_ids": input_ids, "attention_mask": attention_mask}


def _greedy_kwargs(tokenizer: Any, max_new_tokens: int, generate_kwargs: dict) -> dict:
    kwargs = dict(
        max_new_tokens=max_new_tokens,
        do_sample=False,
        pad_token_id=pad_id(tokenizer),
    )
    kwargs.update(generate_kwargs)
    return kwargs


def generate_replies(
    model: Any,
    tokenizer: Any,
    prompts: Sequence[str],
    *,
    max_new_tokens: int,
    batch_size: int | None = None,
    chat_template: bool | None = None,
    **generate_kwargs: Any,
) -> list[str]:
    """Greedy replies of a plain model (the ES centre, the base, a PEFT model) to ``prompts``.

    Runs ``model.generate`` in batches of ``batch_size`` prompts (default: all
    at once), left padded; the replies are decoded without special tokens.
    """
    max_new_tokens = check_int("max_new_tokens", max_new_tokens, low=1)
    batch_size = len(prompts) if batch_size is None else check_int("batch_size", batch_size, low=1)
    kwargs = _greedy_kwargs(tokenizer, max_new_tokens, generate_kwargs)
    device = next(model.parameters()).device
    replies: list[str] = []
    for start in range(0, len(prompts), batch_size):
        batch = encode_prompts(tokenizer, prompts[start : start + batch_size], chat_template=chat_template)
        with torch.no_grad():
            out = model.generate(**{k: v.to(device) for k, v in batch.items()}, **kwargs)
        width = batch["input_ids"].shape[1]
        replies += tokenizer.batch_decode(out[:, width:].cpu(), skip_special_tokens=True)
    return replies


def _score(problems: Sequence[Any], replies: Sequence[str], reward_fn: Callable[[Any, str], Any] | None) -> list[float]:
    scores = []
    for problem, reply in zip(problems, replies):
        value = problem.check(reply) if reward_fn is None else reward_fn(problem, reply)
        scores.append(_reward(value, reply))
    return scores


_FLOAT32_MAX = torch.finfo(torch.float32).max


def _reward(value: Any, reply: str) -> float:
    """A verifier's result as a finite float: a bool, a Python or NumPy real number, or a one-element real tensor.

    ``float()`` alone would also read the string ``"0.5"`` (or ``"inf"``) as a number; a string is a verifier
    bug, and an infinite reward would turn every z-score of its prompt into NaN.
    """
    if isinstance(value, Tensor) and value.numel() == 1 and not value.dtype.is_complex:
        value = value.item()
    if not (
        isinstance(value, (bool, numbers.Real))
        or (type(value).__module__ == "numpy" and type(value).__name__ in ("bool", "bool_"))
    ):
        raise FitnessError(
            f"the verifier must return a bool or a number, got {type(value).__name__} "
            f"{_short(value)} for reply {reply[:80]!r}"
        )
    try:
        value = float(value)
    except OverflowError:  # an int beyond float64
        value = math.inf
    if math.isnan(value):
        raise FitnessError(f"the verifier returned NaN for reply {reply[:80]!r}")
    if not abs(value) <= _FLOAT32_MAX:  # the reward matrix is float32
        raise FitnessError(
            f"the verifier returned {value}, beyond float32, for reply {reply[:80]!r}; rewards must "
            "be finite in float32 (group normalisation subtracts them)"
        )
    return value


def _short(value: Any) -> str:
    """``repr(value)``, at most 80 characters (a reward_fn may return anything)."""
    try:
        text = repr(value)
    except Exception:
        text = f"<{type(value).__name__}>"
    return text if len(text) <= 80 else text[:77] + "..."


def verifier_accuracy(
    model: Any,
    tokenizer: Any,
    problems: Sequence[Any],
    *,
    max_new_tokens: int,
    task: Any = None,
    batch_size: int | None = None,
    chat_template: bool | None = None,
    reward_fn: Callable[[Any, str], Any] | None = None,
) -> float:
    """Mean verifier reward (the accuracy, for ``Problem.check``) of a plain model's greedy replies.

    Args as :func:`verifier_rewards` and :func:`generate_replies`; ``model`` is
    any model with ``generate`` (the ES centre is the ES's model itself).
    """
    if not len(problems):
        raise InvalidValueError("`problems` is empty")
    replies = generate_replies(
        model,
        tokenizer,
        problem_prompts(problems, task),
        max_new_tokens=max_new_tokens,
        batch_size=batch_size,
        chat_template=chat_template,
    )
    return sum(_score(problems, replies, reward_fn)) / len(problems)


def _check_groups(groups: Any, num: int, n: int | None = None) -> Tensor:
    if not isinstance(groups, Tensor) or groups.dim() != 2 or groups.dtype not in (torch.int32, torch.int64):
        raise InvalidTypeError(
            "`groups` must be a (N/G, G) integer tensor of member ids (es.groups()), got "
            + (
                f"{groups.dtype} of shape {tuple(groups.shape)}"
                if isinstance(groups, Tensor)
                else type(groups).__name__
            )
        )
    flat = groups.flatten().sort().values
    if groups.numel() != num or not torch.equal(flat, torch.arange(num, dtype=flat.dtype)):
        raise InvalidValueError(
            f"`groups` must hold every member id 0..{num - 1} exactly once, got shape "
            f"{tuple(groups.shape)} for {num} members"
        )
    if n is not None and n % groups.shape[0]:
        raise InvalidValueError(
            f"with {groups.shape[0]} groups the number of problems must be a multiple of "
            f"{groups.shape[0]} (each group answers its own slice), got {n}"
        )
    return groups.long()


def verifier_rewards(
    members: Any,
    tokenizer: Any,
    problems: Sequence[Any],
    *,
    max_new_tokens: int,
    task: Any = None,
    groups: Tensor | None = None,
    reward_fn: Callable[[Any, str], Any] | None = None,
    chat_template: bool | None = None,
    max_rows: int | None = None,
    return_replies: bool = False,
    **generate_kwargs: Any,
) -> Tensor | tuple[Tensor, list[list[str]]]:
    """``(N, k)`` verifier rewards of every member's greedy replies, from ONE routed ``members.generate`` call.

    Without ``groups`` every member answers all ``n`` problems (``k = n``):
    the prompts are tokenised once (left padded), repeated per member (rows
    ``(N n)``, member-major) and generated in one call routed with
    ``individuals=``. With ``groups`` (``(N/G, G)``, e.g. ``es.groups()``), the
    problems are cut into ``N/G`` consecutive slices of ``k = n / (N/G)`` and
    the members of group ``j`` answer slice ``j`` only; row ``i`` of the
    result then holds member ``i``'s rewards on its own group's slice.

    Args:
        members: a routed population handle with ``generate`` and ``pop_size``: ``es.ask()``
            (or a :class:`~populora.Population`).
        tokenizer: a Hugging Face tokenizer (``encode_prompts`` pads on the left).
        problems: ``n`` problems: objects with ``check(reply) -> bool`` (a
            :class:`populora.tasks.Problem`) and ``question`` (or pass ``task``).
        max_new_tokens: the reply budget.
        task: builds each prompt with ``task.prompt(problem)``; default ``problem.question``.
        groups: the member groups (see above); ``None``: one group of all members.
        reward_fn: ``(problem, reply) -> float`` instead of ``float(problem.check(reply))``.
        chat_template: see :func:`encode_prompts`.
        max_rows: at most this many rows per ``generate`` call (whole members, at least one):
            bounds the KV cache; default one call.
        return_replies: also return the ``(N, k)`` decoded replies (nested lists).
        **generate_kwargs: for ``model.generate`` (greedy ``do_sample=False`` is the default).

    Returns:
        ``(N, k)`` float32 rewards on the CPU (and the replies with ``return_replies``).

    Raises:
        InvalidValueError: no problems, ``max_new_tokens < 1``, bad ``groups``, ``max_rows < 1``.
        InvalidTypeError: ``members`` without ``generate``, a problem without a prompt.
        FitnessError: the verifier returned something that is not a bool or a number (a string such as
            ``"0.5"`` included), NaN, or a reward beyond float32 (inf included).
    """
    if not hasattr(members, "generate") or not hasattr(members, "pop_size"):
        raise InvalidTypeError(
            f"`members` must be a routed population handle (es.ask() or a Population), got {type(members).__name__}"
        )
    if isinstance(problems, (str, bytes)) or not len(problems):
        raise InvalidValueError("`problems` must be a non-empty sequence of problems")
    max_new_tokens = check_int("max_new_tokens", max_new_tokens, low=1)
    if max_rows is not None:
        max_rows = check_int("max_rows", max_rows, low=1)
    return_replies = check_bool("return_replies", return_replies)
    num, n = members.pop_size, len(problems)
    table = torch.arange(num).view(1, num) if groups is None else _check_groups(groups, num, n)
    k = n // table.shape[0]
    prompts = problem_prompts(problems, task)
    batch = encode_prompts(tokenizer, prompts, chat_template=chat_template)
    ids, mask = batch["input_ids"], batch["attention_mask"]
    # each member: (member id, indices of its problems); rows in member order 0..N-1
    group_of = torch.empty(num, dtype=torch.long)
    for j, row in enumerate(table):
        group_of[row] = j
    kwargs = _greedy_kwargs(tokenizer, max_new_tokens, generate_kwargs)
    per_call = num if max_rows is None else max(1, max_rows // k)
    width = ids.shape[1]
    replies: list[list[str]] = []
    for start in range(0, num, per_call):
        who = torch.arange(start, min(start + per_call, num))
        cols = torch.cat([int(group_of[i]) * k + torch.arange(k) for i in who])  # (m k,) problem per row
        out = members.generate(ids[cols], mask[cols], individuals=who.repeat_interleave(k), **kwargs)
        texts = tokenizer.batch_decode(out[:, width:].cpu(), skip_special_tokens=True)
        replies += [texts[j * k : (j + 1) * k] for j in range(len(who))]
    rewards = torch.tensor(
        [_score([problems[int(group_of[i]) * k + c] for c in range(k)], replies[i], reward_fn) for i in range(num)],
        dtype=torch.float32,
    )
    return (rewards, replies) if return_replies else rewards


def group_normalize(rewards: Tensor, groups: Tensor | None = None, *, eps: float = 1e-8) -> Tensor:
    """``(N,)`` fitness: per-prompt z-scores of the rewards across the members of a group, averaged over prompts.

    For each group (row of ``groups``; default one group of all ``N``) and each
    prompt column ``c``: ``z[i, c] = (r[i, c] - mean) / std`` with the mean and
    population std (``correction=0``) over the group's members; a column whose
    std is at most ``eps`` (every member solved it, or none did) gives 0.
    Member ``i``'s fitness is ``mean_c z[i, c]``. Each group's fitnesses sum to 0.

    Args:
        rewards: ``(N, k)`` rewards, row ``i`` member ``i`` (from :func:`verifier_rewards`).
        groups: ``(N/G, G)`` member ids (``es.groups()``), or ``None``.
        eps: a prompt's std at most this counts as zero.

    Returns:
        ``(N,)`` float64 fitnesses for ``es.tell`` (see the module docstring on shaping).

    Raises:
        InvalidTypeError: ``rewards`` not a 2-D real tensor.
        InvalidValueError: NaN rewards, bad ``groups``, ``eps < 0``.

    Example:
        >>> group_normalize(torch.tensor([[1.0, 1.0, 0.0], [0.0, 1.0, 0.0]]))
        tensor([ 0.3333, -0.3333], dtype=torch.float64)
    """
    if (
        not isinstance(rewards, Tensor)
        or rewards.dim() != 2
        or not (rewards.is_floating_point() or rewards.dtype in (torch.int32, torch.int64, torch.bool))
    ):
        raise InvalidTypeError(
            "`rewards` must be a real (N, k) tensor (members x prompts), got "
            + (
                f"{rewards.dtype} of shape {tuple(rewards.shape)}"
                if isinstance(rewards, Tensor)
                else type(rewards).__name__
            )
        )
    eps = check_float("eps", eps, low=0.0)
    r = rewards.detach().to("cpu", torch.float64)
    if bool(torch.isnan(r).any()):
        raise InvalidValueError(f"`rewards` holds NaN at (member, prompt) {torch.isnan(r).nonzero()[0].tolist()}")
    num, k = r.shape
    if k == 0:
        raise InvalidValueError("`rewards` has no prompt column (shape (N, 0))")
    table = torch.arange(num).view(1, num) if groups is None else _check_groups(groups, num)
    out = torch.empty(num, dtype=torch.float64)
    for row in table:
        g = r[row]  # (G, k)
        mean, std = g.mean(0, keepdim=True), g.std(0, correction=0, keepdim=True)
        z = torch.where(std > eps, (g - mean) / std.clamp_min(eps if eps > 0 else 1e-300), torch.zeros_like(g))
        out[row] = z.mean(1)
    return out


def verifier_step(
    es: Any,
    tokenizer: Any,
    problems: Sequence[Any],
    *,
    max_new_tokens: int,
    task: Any = None,
    grouped: bool = False,
    **kwargs: Any,
) -> tuple[Any, Tensor]:
    """One ES generation on the verifier: ``es.tell(group_normalize(verifier_rewards(es.ask(), ...)))``.

    Args:
        es: an :class:`~populora.EggrollES` (its ``fitness_shaping`` applies on top: see the module docstring).
        tokenizer, problems, max_new_tokens, task: as :func:`verifier_rewards`.
        grouped: use ``es.groups()`` (set by ``EggrollES(group_size=G)``) as the groups.
        **kwargs: more :func:`verifier_rewards` arguments (``max_rows``, ``reward_fn``, ...).

    Returns:
        ``(stats, rewards)``: the :class:`~populora.stats.GenerationStats` of ``tell`` (its fitnesses are the
        normalised ones) and the raw ``(N, k)`` rewards (``rewards.mean()`` is the members' accuracy).
    """
    grouped = check_bool("grouped", grouped)
    if kwargs.get("return_replies"):
        raise InvalidValueError(
            "verifier_step returns (stats, rewards) and takes no `return_replies=True`; call verifier_rewards("
            "es.ask(), ..., return_replies=True) and es.tell(...) for the replies"
        )
    groups = es.groups() if grouped else None
    rewards = verifier_rewards(
        es.ask(), tokenizer, problems, max_new_tokens=max_new_tokens, task=task, groups=groups, **kwargs
    )
    assert isinstance(rewards, Tensor)  # no replies asked for (checked above)
    return es.tell(group_normalize(rewards, groups)), rewards
