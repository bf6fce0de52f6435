""":class:`PopuLoRAConfig`: every option of the self-play loop, in one frozen, checked, JSON-safe object.

The three settings a run usually starts from are instances of it: :data:`PAPER_PRESET` (the paper's main
setting), :data:`CPU_PRESET` (the same loop sized for 2 CPU cores and SmolLM2-135M) and
:data:`SELFPLAY_PRESET` (evolution only: both populations evolve every step, no gradient; what
:func:`~populora.SelfPlay` builds). Vary one with ``dataclasses.replace(CPU_PRESET, interval=3)``.

A config is checked whole when built (every field, and the fields that depend on each other), so a bad
option is refused before any population wraps a model.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from populora import operators as ops
from populora.checks import check_bool, check_float, check_int, check_one_of, check_seed
from populora.config import Config
from populora.errors import InvalidTypeError, InvalidValueError
from populora.loops.ratings import PAIRING_MODES
from populora.loops.selfplay.replacement import PAPER_CROSSOVERS, PAPER_MUTATIONS
from populora.loops.selfplay.rewards import STUDENT_REWARDS, TEACHER_REWARDS
from populora.loops.selfplay.scores import TEACHER_REWARDS as EVOLVE_TEACHER_REWARDS

__all__ = ["CPU_PRESET", "PAPER_PRESET", "SELFPLAY_PRESET", "PopuLoRAConfig", "Preset"]

UPDATES = ("rl", "evolve")
SAMPLERS = ("member", "batch")
MATCHES = ("pair", "problem", "proposal")
FAMILY_RULES = ("drawn", "whole")
# generate options the loop sets itself (it routes the rows and seeds the sampling)
ROUTING = (
    "individual",
    "individuals",
    "all_individuals",
    "generator",
    "split",
    "num_return_sequences",
    "input_ids",
    "attention_mask",
    "return_dict_in_generate",
)
# the generate options a loop starts from (a config's own are merged over them)
GENERATE_DEFAULTS: dict[str, dict[str, dict[str, Any]]] = {
    "rl": {
        "teacher_generate": dict(max_new_tokens=48, do_sample=True, temperature=1.0),
        "student_generate": dict(max_new_tokens=24, do_sample=True, temperature=1.0),
    },
    "evolve": {
        "teacher_generate": dict(max_new_tokens=48, do_sample=True, temperature=1.0),
        "student_generate": dict(max_new_tokens=24, do_sample=False),
    },
}
# the fields that size the populations (used by PopuLoRA.from_preset); every other field is a loop option
POPULATION_FIELDS = ("teachers", "students", "rank", "lora_targets")


def _generate(name: str, value: Any) -> Mapping[str, Any]:
    """A ``generate`` options dict (or a ``transformers.GenerationConfig``) as a read-only dict, routing refused."""
    if hasattr(value, "to_diff_dict") and type(value).__name__ == "GenerationConfig":
        value = {k: v for k, v in value.to_diff_dict().items() if k != "transformers_version"}
    if not isinstance(value, Mapping):
        raise InvalidTypeError(
            f"PopuLoRAConfig's `{name}` must be a dict of generate() options or a GenerationConfig, "
            f"got {type(value).__name__}"
        )
    bad = [k for k in value if k in ROUTING]
    if bad:
        raise InvalidValueError(
            f"PopuLoRAConfig's `{name}` may not set {bad}: the loop routes the rows and seeds the sampling itself"
        )
    return MappingProxyType(dict(value))


def check_generation_keys(config: PopuLoRAConfig) -> None:
    """Refuse a ``generate`` option Hugging Face's ``GenerationConfig`` does not know (a misspelt key), naming it.

    Run by :class:`~populora.PopuLoRA` before it builds anything (transformers is imported here, lazily).
    """
    try:
        from transformers import GenerationConfig
    except ImportError:  # no transformers: the model's own generate() judges its options
        return
    import difflib

    known = set(GenerationConfig().to_dict()) | {"pad_token_id", "eos_token_id", "bos_token_id", "streamer"}
    for name in ("teacher_generate", "student_generate"):
        for key in getattr(config, name):
            if key not in known:
                close = difflib.get_close_matches(str(key), sorted(known), n=1)
                hint = f" (did you mean {close[0]!r}?)" if close else ""
                raise InvalidValueError(f"`{name}` has {key!r}, which is no generation option{hint}")


@dataclass(frozen=True)
class PopuLoRAConfig(Config):
    """Every option of :class:`~populora.PopuLoRA` (defaults: the paper's loop, RL for both roles).

    Population sizes (used by :meth:`PopuLoRA.from_preset <populora.PopuLoRA.from_preset>`; when set, the
    populations a loop is given must have them):
        teachers, students: population sizes (``None``: whatever the populations are).
        rank: LoRA rank of every adapter (``None``: any).
        lora_targets: target patterns (``None``: :data:`populora.llm.LLAMA_ALL`, every block linear).

    The step:
        update: ``"rl"`` (the paper: REINFORCE++ for both roles every step, the bottom of each role
            replaced every ``interval`` steps) or ``"evolve"`` (evolution only: both populations evolve one
            generation every step on their fitnesses, optionally after a policy-gradient step of the
            students, ``student_pg_lr``).
        proposals: ``k`` proposals per teacher per step (``0``, RL only: no teachers, students alone on
            ``anchors``).
        attempts: ``a`` answers per problem (RL: ``>= 2``, the advantage group; evolve: ``>= 1``).
        anchors: ``m >= 0`` task-sampled problems every student answers per step.
        families: ``"drawn"`` (each teacher draws one member of a :class:`~populora.tasks.Mixture` per
            step, by its weight, and proposes from that member's prompt) or ``"whole"`` (the task's own
            proposal prompt; a Mixture's lists every member).
        teacher_reward: RL: ``"paper"``, ``"failures"`` or ``"learnability"``, per proposal
            (:mod:`~populora.loops.selfplay.rewards`); evolve: ``"failures"`` or ``"learnability"``, per
            teacher (:func:`~populora.loops.selfplay.scores.selfplay_fitnesses`).
        student_reward: (RL) ``"paper"`` (+1 / -0.5 / -1) or ``"binary"``.
        match: rated matches: ``"pair"`` (one per teacher and step), ``"problem"`` (one per valid proposal,
            a teacher without one loses a match) or ``"proposal"`` (one per valid proposal scored 1 / 0.5 / 0
            as the student failed all / some / none of its attempts; none without: evolution only's rule).
        matchmaking: ``Ratings.pair`` mode (``"pfsp"``, ``"pfsp_hard"``, ``"uniform"``, ``"round_robin"``).
        phrasings: user messages of a student's problem (one drawn per problem and step); ``None``: the
            task's :meth:`~populora.tasks.Task.phrasings` (by default its template alone).
        reserved: questions the loop never trains on (held-out and validation sets): a proposal of one is
            valid but not asked (reward 0, no match); a reserved anchor is redrawn.
        teacher_generate, student_generate: ``generate`` options (dicts, or ``GenerationConfig`` s), merged
            over the mode's defaults (teachers: 48 new tokens sampled at temperature 1; students: 24 new
            tokens, sampled under RL, greedy when evolving); RL students must sample.
        sampler: ``"member"`` (0.6.0's default): each member's rows are generated in a block of their own,
            sampled by Gumbel-max noise from the member's own generator (seeded by ``(seed, role, member)``,
            :func:`~populora.llm.text.generate_by_member`): a member's tokens depend on nothing but its rows,
            adapter and generator, so a run under torchrun (:meth:`PopuLoRA.step` ``distributed=True``,
            members partitioned across the ranks) is the one-process run. ``"batch"``: 0.5.0's ONE routed
            ``generate`` over every row, sampled by transformers from a seed the loop draws per call (the
            fastest on a GPU: one mixed batch); distributed only when evolving (rows sharded across ranks,
            reproducible at a fixed world size only).
        chat: wrap prompts in the chat template.
        seed: seeds the loop's generator (matches, families, sampling seeds, anchors, phrasings).

    RL (``update="rl"``):
        teacher_lr, student_lr: Adam learning rates (one optimizer per role, unless given).
        train_teachers: RL for the teachers too; ``False`` freezes them.
        kl_coef: weight of a KL-to-base term (0: none, the paper's).
        max_grad_norm: per-individual gradient clipping (``None``: none).
        micro_batch: rows per policy-gradient forward / backward (both updates).
        evolve: replace at all; interval, fraction, crossover_rate, mutations, crossovers, epsilon: the
            replacement (:func:`~populora.loops.selfplay.replacement.replace_`) every ``interval`` steps.

    Teachers that explore (off by default: the paper's loop; either mode):
        novelty_window: ``k >= 0``: a valid proposal whose question was shown as an example in its prompt or
            was asked in the loop's last ``k`` steps earns no teacher reward (0, not the invalid -1) and is not
            asked again (no match); ``0``: off. A departure from the paper's reward: without it a teacher is
            paid for re-asking the few problems it finds first (24 of 33 asks were its prompt's two examples).
        prompt_examples: ``n >= 0`` past valid problems of the teacher's family, drawn (the loop's generator)
            from a buffer the loop keeps, are shown in its proposal prompt instead of the fixed example
            (``Task.proposal_prompt(examples=)``, AZR's reference tasks); ``0``: the task's fixed prompt.
        buffer_size: the most past valid problems the buffer keeps (the oldest leave first).

    Evolution only (``update="evolve"``):
        student_pg_lr: ``> 0``: before evolving, every student takes one plain SGD step of this learning
            rate on the REINFORCE loss of its own answers (reward 1 right / 0 wrong, minus its mean).
        evolve_kwargs: ``{"teachers": {...}, "students": {...}}``, options of each ``Population.evolve_``
            (checked against ``evolve_`` by the loop).
    """

    teachers: int | None = None
    students: int | None = None
    rank: int | None = None
    lora_targets: tuple[str, ...] | None = None
    update: str = "rl"
    proposals: int = 4
    attempts: int = 4
    anchors: int = 0
    families: str = "drawn"
    teacher_reward: str = "paper"
    student_reward: str = "paper"
    match: str = "pair"
    matchmaking: str = "pfsp"
    phrasings: tuple[Callable[..., str], ...] | None = None
    reserved: tuple[str, ...] = ()
    teacher_generate: Mapping[str, Any] = dataclasses.field(default_factory=lambda: MappingProxyType({}))
    student_generate: Mapping[str, Any] = dataclasses.field(default_factory=lambda: MappingProxyType({}))
    sampler: str = "member"
    chat: bool = True
    seed: int = 0
    teacher_lr: float = 1e-5
    student_lr: float = 1e-5
    train_teachers: bool = True
    kl_coef: float = 0.0
    max_grad_norm: float | None = 1.0
    micro_batch: int = 8
    evolve: bool = True
    interval: int = 10
    fraction: float = 0.25
    crossover_rate: float = 0.5
    mutations: tuple[str, ...] = PAPER_MUTATIONS
    crossovers: tuple[str, ...] = PAPER_CROSSOVERS
    epsilon: float = 0.1
    novelty_window: int = 0
    prompt_examples: int = 0
    buffer_size: int = 64
    student_pg_lr: float = 0.0
    evolve_kwargs: Mapping[str, Mapping[str, Any]] = dataclasses.field(default_factory=lambda: MappingProxyType({}))

    def __post_init__(self) -> None:
        put = lambda name, value: object.__setattr__(self, name, value)
        for name in ("teachers", "students", "rank"):
            if getattr(self, name) is not None:
                put(name, check_int(name, getattr(self, name), low=1))
        if self.lora_targets is not None:
            if isinstance(self.lora_targets, str) or not all(isinstance(t, str) for t in self.lora_targets):
                raise InvalidTypeError(
                    f"`lora_targets` must be a sequence of target patterns, got {self.lora_targets!r}"
                )
            put("lora_targets", tuple(self.lora_targets))
        update = check_one_of("update", self.update, UPDATES)
        rl = update == "rl"
        put("proposals", check_int("proposals", self.proposals, low=0 if rl else 1))
        put("attempts", check_int("attempts", self.attempts, low=2 if rl else 1))
        put("anchors", check_int("anchors", self.anchors, low=0))
        if self.proposals == 0 and self.anchors == 0:
            raise InvalidValueError(
                "PopuLoRAConfig: with proposals=0 (no teachers) the students need anchors >= 1 to train on"
            )
        check_one_of("families", self.families, FAMILY_RULES)
        rules = TEACHER_REWARDS if rl else EVOLVE_TEACHER_REWARDS
        check_one_of("teacher_reward", self.teacher_reward, rules)
        check_one_of("student_reward", self.student_reward, STUDENT_REWARDS)
        check_one_of("match", self.match, MATCHES)
        check_one_of("matchmaking", self.matchmaking, PAIRING_MODES)
        if self.phrasings is not None:
            phrasings = (self.phrasings,) if callable(self.phrasings) else self.phrasings
            if isinstance(phrasings, str) or not isinstance(phrasings, Collection):
                raise InvalidTypeError(f"`phrasings` must be a sequence of callables problem -> str, got {phrasings!r}")
            phrasings = tuple(phrasings)
            if not phrasings or not all(callable(p) for p in phrasings):
                raise InvalidTypeError("`phrasings` must be a non-empty sequence of callables")
            put("phrasings", phrasings)
        reserved = self.reserved
        if isinstance(reserved, str) or not isinstance(reserved, Collection):
            raise InvalidTypeError(
                f"`reserved` must be a collection of question strings, got {type(reserved).__name__}"
            )
        bad = next((q for q in reserved if not isinstance(q, str)), None)
        if bad is not None:
            raise InvalidTypeError(f"`reserved` must hold question strings, got {type(bad).__name__} {bad!r}")
        put("reserved", tuple(sorted(set(reserved))))  # a set's order is not stable across processes
        for name in ("teacher_generate", "student_generate"):  # merged over the mode's defaults, as in 0.5.0
            put(name, MappingProxyType({**GENERATE_DEFAULTS[update][name], **_generate(name, getattr(self, name))}))
        sampled = bool(self.student_generate.get("do_sample", False))
        if rl and not sampled:
            raise InvalidValueError(
                f"the students sample their {self.attempts} attempts: student_generate needs do_sample=True"
            )
        if not rl and self.attempts > 1 and not sampled:
            raise InvalidValueError(
                f"attempts={self.attempts} with greedy students gives {self.attempts} identical "
                "answers: pass student_generate=dict(do_sample=True)"
            )
        if not rl and self.teacher_reward == "learnability" and self.attempts < 2:
            raise InvalidValueError(
                "teacher_reward='learnability' needs attempts >= 2 (a solve rate strictly "
                f"between 0 and 1), got attempts={self.attempts}"
            )
        check_one_of("sampler", self.sampler, SAMPLERS)
        put("chat", check_bool("chat", self.chat))
        put("seed", check_seed("seed", self.seed))
        put("teacher_lr", check_float("teacher_lr", self.teacher_lr, low=0.0, low_open=True))
        put("student_lr", check_float("student_lr", self.student_lr, low=0.0, low_open=True))
        put("train_teachers", check_bool("train_teachers", self.train_teachers))
        put("kl_coef", check_float("kl_coef", self.kl_coef, low=0.0))
        if self.max_grad_norm is not None:
            put("max_grad_norm", check_float("max_grad_norm", self.max_grad_norm, low=0.0, low_open=True))
        put("micro_batch", check_int("micro_batch", self.micro_batch, low=1))
        put("evolve", check_bool("evolve", self.evolve))
        put("interval", check_int("interval", self.interval, low=1))
        put("fraction", check_float("fraction", self.fraction, low=0.0, high=0.5, low_open=True))
        put("crossover_rate", check_float("crossover_rate", self.crossover_rate, low=0.0, high=1.0))
        put("epsilon", check_float("epsilon", self.epsilon, low=0.0))
        for kind, names in (("mutation", self.mutations), ("crossover", self.crossovers)):
            if isinstance(names, str) or not isinstance(names, Collection) or not names:
                raise InvalidTypeError(f"`{kind}s` must be a non-empty sequence of operator names, got {names!r}")
            for op in names:
                ops.get_operator(kind, op)
            put(f"{kind}s", tuple(names))
        put("novelty_window", check_int("novelty_window", self.novelty_window, low=0))
        put("prompt_examples", check_int("prompt_examples", self.prompt_examples, low=0))
        put("buffer_size", check_int("buffer_size", self.buffer_size, low=1))
        put("student_pg_lr", check_float("student_pg_lr", self.student_pg_lr, low=0.0))
        if rl and self.student_pg_lr > 0:
            raise InvalidValueError(
                "`student_pg_lr` is evolution only's policy-gradient step (update='evolve'); "
                f"update='rl' trains both roles by REINFORCE++ already, got student_pg_lr={self.student_pg_lr}"
            )
        kwargs = self.evolve_kwargs
        if not isinstance(kwargs, Mapping) or not all(isinstance(v, Mapping) for v in kwargs.values()):
            raise InvalidTypeError(
                f"`evolve_kwargs` must map 'teachers' / 'students' to dicts of evolve_ options, got {kwargs!r:.80}"
            )
        unknown = [k for k in kwargs if k not in ("teachers", "students")]
        if unknown:
            raise InvalidValueError(
                f"`evolve_kwargs` has options for {unknown[0]!r}, which is not a population; "
                "populations: ['teachers', 'students']"
            )
        put("evolve_kwargs", MappingProxyType({k: MappingProxyType(dict(v)) for k, v in kwargs.items()}))

    # ------------------------------------------------------------------ 0.5.0's Preset surface

    @property
    def loop(self) -> Mapping[str, Any]:
        """The loop options (every field but the population sizes), read-only: 0.5.0's ``Preset.loop``."""
        return MappingProxyType(
            {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name not in POPULATION_FIELDS}
        )

    def replace(self, **changes: Any) -> PopuLoRAConfig:
        """``dataclasses.replace`` that also takes 0.5.0's ``loop={...}`` (its entries are fields)."""
        loop = dict(changes.pop("loop", None) or {})
        return dataclasses.replace(self, **{**loop, **changes})


def Preset(
    teachers: int,
    students: int,
    rank: int,
    lora_targets: tuple[str, ...] | None = None,
    loop: Mapping[str, Any] | None = None,
) -> PopuLoRAConfig:
    """Deprecated since 0.6.0 (goes in 0.7.0): ``PopuLoRAConfig(teachers=, students=, rank=, **loop)``."""
    import warnings

    warnings.warn(
        "Preset(...) is deprecated since 0.6.0 and goes in 0.7.0: pass "
        "PopuLoRAConfig(teachers=, students=, rank=, lora_targets=, <loop options>)",
        DeprecationWarning,
        stacklevel=2,
    )
    return PopuLoRAConfig(
        teachers=teachers, students=students, rank=rank, lora_targets=lora_targets, **dict(loop or {})
    )


# The paper's main setting: 4 teachers + 4 students, rank 32, replacement every 10 steps of the bottom 25%,
# crossover rate 0.5, 4 sampled attempts per problem. Learning rates, lengths and epsilon are ours.
PAPER_PRESET = PopuLoRAConfig(
    teachers=4,
    students=4,
    rank=32,
    proposals=4,
    attempts=4,
    anchors=0,
    interval=10,
    fraction=0.25,
    crossover_rate=0.5,
    teacher_lr=1e-5,
    student_lr=1e-5,
    epsilon=0.1,
    teacher_generate=dict(max_new_tokens=64, do_sample=True, temperature=1.0),
    student_generate=dict(max_new_tokens=64, do_sample=True, temperature=1.0),
)
# The same loop sized for 2 CPU cores and SmolLM2-135M: rank 8, replacement every 5 steps, shorter replies,
# a larger learning rate (a run is tens of steps, not 200).
CPU_PRESET = dataclasses.replace(
    PAPER_PRESET,
    rank=8,
    proposals=2,
    interval=5,
    teacher_lr=1e-4,
    student_lr=1e-4,
    epsilon=0.05,
    micro_batch=16,
    teacher_generate=dict(max_new_tokens=40, do_sample=True, temperature=1.0),
    student_generate=dict(max_new_tokens=24, do_sample=True, temperature=1.0),
)
# Evolution only (0.5.0's SelfPlay): both populations evolve every step on their fitnesses; greedy students
# answer each valid proposal once, plus 4 anchors each; any population sizes; 0.5.0's batch sampler.
SELFPLAY_PRESET = PopuLoRAConfig(
    update="evolve",
    sampler="batch",  # 0.5.0's SelfPlay samples so (its runs and files continue bit for bit); "member" to partition
    proposals=2,
    attempts=1,
    anchors=4,
    families="whole",
    teacher_reward="failures",
    match="proposal",
    max_grad_norm=None,
)
