"""PopuLoRA: the paper's loop. Teachers and students train by REINFORCE++ every step; every ``k`` steps the
bottom of each role is replaced by mutations and crossovers of its top.

Each :meth:`PopuLoRA.step`:

1. matchmaking pairs every teacher with a student (``Ratings.pair``, PFSP by default, the loop's generator);
2. every teacher draws one task family for the step (a :class:`~populora.tasks.Mixture`'s members by their
   weights; a plain task is its own family) and proposes ``proposals`` problems of it in ONE routed
   ``teachers.generate`` (the family's ``proposal_prompt``, sampled);
3. the family's verifier (``parse_proposal``; the code tasks run the sandbox executor) keeps the valid ones (a valid
   one whose question is ``reserved``, e.g. held out, is not asked);
4. the matched student answers every valid problem ``attempts`` times, sampled (temperature 1), plus
   ``anchors`` task-sampled problems each, in ONE routed ``students.generate``; answers are checked (code
   answers in the sandbox, :func:`~populora.tasks.check_code_replies`) and read for form
   (:func:`~populora.loops.selfplay.rewards.well_formed`);
5. rewards by the paper's table (:mod:`populora.loops.selfplay.rewards`);
6. RL, both roles: REINFORCE++ advantages (centred per group, whitened over the role's batch), groups = the
   ``attempts`` answers of one problem by one student, and for teachers the ``proposals`` proposals of one
   teacher (they answer one prompt); one :func:`~populora.train.policy_gradient_step_` per role with its own
   Adam optimizer;
7. ratings: the step's matches (:func:`~populora.loops.selfplay.rewards.match_outcomes`: one per
   teacher-student pair by default, teacher score ``1 - solve rate``, no valid problem = the student's win);
8. every ``interval`` steps each role's bottom ``fraction`` is replaced
   (:func:`~populora.loops.selfplay.replacement.replace_`).

With ``proposals=0`` the teachers take no part (no generation, no RL, no matches): students alone on
``anchors`` task-sampled problems.

All or nothing: a step that raises restores both populations (adapters, generators, counters), both
optimizers, the ratings and the loop's generator, so a retry is the step an untouched twin takes. A
:meth:`state_dict` holds everything but the base model and the tokenizer: a loaded loop continues bit for bit.
"""

from __future__ import annotations

import copy
import difflib
import inspect
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field, fields
from types import MappingProxyType
from typing import Any

import torch
from torch import Tensor

from populora import operators as ops
from populora.checks import check_bool, check_float, check_int, check_one_of, check_seed, is_int
from populora.errors import CheckpointError, InvalidTypeError, InvalidValueError
from populora.llm.text import chat_text, generate_replies, pad_id
from populora.loops.ratings import PAIRING_MODES, Ratings
from populora.loops.selfplay.checks import check_players
from populora.loops.selfplay.replacement import (
    PAPER_CROSSOVERS,
    PAPER_MUTATIONS,
    PaperRatings,
    ReplacementRecord,
    replace_,
)
from populora.loops.selfplay.rewards import (
    MATCH_GRANULARITIES,
    STUDENT_REWARDS,
    TEACHER_REWARDS,
    match_outcomes,
    student_rewards,
    teacher_rewards,
    well_formed,
)
from populora.population.population import Population, evaluating
from populora.snapshots import Snapshot
from populora.tasks import Mixture, Problem, Task, check_code_replies
from populora.train import advantages, policy_gradient_step_
from populora.transaction import Attributes, closing_on_failure, transaction

__all__ = ["CPU_PRESET", "PAPER_PRESET", "PopuLoRA", "PopuLoRAOutcome", "PopuLoRARecord", "Preset", "solve_rate"]

_FORMAT = "populora.PopuLoRA/1"
NAMES = ("teachers", "students")
_ROUTING = ("individual", "individuals", "all_individuals", "generator", "input_ids", "attention_mask")

Phrasing = Callable[[Problem], str]


@dataclass(frozen=True)
class Preset:
    """Populations and loop options of a run (:meth:`PopuLoRA.from_preset`).

    Attributes:
        teachers, students: population sizes.
        rank: LoRA rank of every adapter.
        lora_targets: target patterns (``None``: :data:`populora.llm.LLAMA_ALL`, every block linear).
        loop: keyword arguments of :class:`PopuLoRA`.
    """

    teachers: int
    students: int
    rank: int
    lora_targets: tuple[str, ...] | None = None
    loop: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "loop", MappingProxyType(dict(self.loop)))  # a preset is shared: read-only

    def replace(self, **changes: Any) -> Preset:
        """A copy with some fields changed; ``loop=`` entries are merged into the loop options."""
        loop = {**self.loop, **dict(changes.pop("loop", {}))}
        values = {f.name: getattr(self, f.name) for f in fields(self)}
        values.update(changes)
        values["loop"] = loop
        return Preset(**values)


# The paper's main setting: 4 teachers + 4 students, rank 32, replacement every 10 steps of the bottom 25%,
# crossover rate 0.5, 4 sampled attempts per problem. Learning rates, lengths and epsilon are ours.
PAPER_PRESET = Preset(
    teachers=4,
    students=4,
    rank=32,
    loop=dict(
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
    ),
)
# The same loop sized for 2 CPU cores and SmolLM2-135M: rank 8, replacement every 5 steps, shorter replies,
# a larger learning rate (a run is tens of steps, not 200).
CPU_PRESET = PAPER_PRESET.replace(
    rank=8,
    loop=dict(
        proposals=2,
        interval=5,
        teacher_lr=1e-4,
        student_lr=1e-4,
        epsilon=0.05,
        micro_batch=16,
        teacher_generate=dict(max_new_tokens=40, do_sample=True, temperature=1.0),
        student_generate=dict(max_new_tokens=24, do_sample=True, temperature=1.0),
    ),
)


@dataclass(frozen=True)
class PopuLoRARecord:
    """One :meth:`PopuLoRA.step` (an entry of ``history``).

    Attributes:
        step: the step's index.
        validity: fraction of the teachers' proposals that passed the verifier (0 without teachers).
        teacher_reward / student_reward: mean reward per proposal / per attempt.
        solve_rate: fraction of the attempts at valid proposals that were right (0 without any).
        format_rate: fraction of all attempts that were well formed.
        anchor_accuracy: fraction of the anchor attempts that were right (``None`` without anchors).
        matches: rated matches.
        reserved: valid proposals not asked because their question is reserved (held out).
        generated_tokens: new tokens generated (teachers and students, up to each row's eos).
        trained_tokens: reply tokens that took part in a policy-gradient forward and backward.
        teacher_mu / student_mu: mean ``mu`` after the matches; teacher / student_ordinal_best: best
            ``mu - 3 sigma``.
        replaced: children written by replacements this step (both roles).
        seconds_generate / seconds_train: wall clock of generation / of the two RL steps (never compared).
    """

    step: int
    validity: float
    teacher_reward: float
    student_reward: float
    solve_rate: float
    format_rate: float
    anchor_accuracy: float | None
    matches: int
    reserved: int
    generated_tokens: int
    trained_tokens: int
    teacher_mu: float
    student_mu: float
    teacher_ordinal_best: float
    student_ordinal_best: float
    replaced: int
    seconds_generate: float
    seconds_train: float

    def as_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_dict(cls, d: Any) -> PopuLoRARecord:
        """A record from :meth:`as_dict` (every field checked: ints >= 0, finite floats, fractions in [0, 1])."""
        names = [f.name for f in fields(cls)]
        if not isinstance(d, Mapping) or sorted(d) != sorted(names):
            raise InvalidValueError(f"a history entry must be a dict with the keys {names}, got {d!r}")
        values: dict[str, Any] = {}
        for name in names:
            value = d[name]
            if name in ("step", "matches", "reserved", "generated_tokens", "trained_tokens", "replaced"):
                values[name] = check_int(name, value, low=0)
            elif name in ("validity", "solve_rate", "format_rate"):
                values[name] = check_float(name, value, low=0.0, high=1.0)
            elif name == "anchor_accuracy":
                values[name] = None if value is None else check_float(name, value, low=0.0, high=1.0)
            elif name.startswith("seconds"):
                values[name] = check_float(name, value, low=0.0)
            else:
                values[name] = check_float(name, value)
        return cls(**values)

    @property
    def deterministic(self) -> tuple:
        """Every field but the wall-clock ones: equal across identical runs."""
        return tuple(getattr(self, f.name) for f in fields(self) if not f.name.startswith("seconds"))


@dataclass(frozen=True)
class PopuLoRAOutcome:
    """What one :meth:`PopuLoRA.step` saw and did.

    Attributes:
        opponents: ``(p_t,)`` the student matched with each teacher.
        families: the family each teacher proposed this step.
        proposals: decoded proposals, rows ``(p_t k)``; problems: the verified problem of each (or ``None``).
        valid: ``(p_t, k)`` bool, verified and asked; solved: ``(p_t, k, a)`` bool (False where not asked).
        teacher_rewards: ``(p_t, k)`` float64.
        tasks: the students' ``(student, problem)`` tasks: valid proposals (in proposal order), then anchors.
        answers: the decoded answers, ``a`` per task; right / formed / student_rewards: ``(len(tasks) * a,)``.
        anchors: the step's anchor problems.
        replacements: the step's :class:`ReplacementRecord` (empty on most steps).
        record: the step's :class:`PopuLoRARecord`.
        reserved: ``(p_t, k)`` bool, verified but not asked (its question is ``reserved``).
    """

    opponents: Tensor
    families: list[str]
    proposals: list[str]
    problems: list[Problem | None]
    valid: Tensor
    solved: Tensor
    teacher_rewards: Tensor
    tasks: list[tuple[int, Problem]]
    answers: list[str]
    right: Tensor
    formed: Tensor
    student_rewards: Tensor
    anchors: list[Problem]
    replacements: list[ReplacementRecord]
    record: PopuLoRARecord
    reserved: Tensor


def _generate_options(name: str, value: Any, defaults: dict[str, Any]) -> dict[str, Any]:
    if value is None:
        return dict(defaults)
    if not isinstance(value, Mapping):
        raise InvalidTypeError(f"`{name}` must be a dict of generate() options, got {type(value).__name__}")
    bad = [k for k in value if k in _ROUTING]
    if bad:
        raise InvalidValueError(f"`{name}` may not set {bad}: PopuLoRA routes the rows and seeds the sampling itself")
    return {**defaults, **value}


def _zero_where_centred_zero(rewards: Tensor, groups: Tensor) -> Tensor:
    """REINFORCE++ advantages, exactly 0 for rows whose group-centred reward is 0 (the whitening's shift of
    the batch mean is 0 in exact arithmetic: without this, float rounding would train rows that carry no signal)."""
    adv = advantages(rewards, groups=groups, method="reinforce++")
    centred = advantages(rewards, groups=groups, method="baseline")
    return torch.where(centred == 0, torch.zeros_like(adv), adv)


def solve_rate(
    population: Population,
    tokenizer: Any,
    problems: Sequence[Problem],
    individuals: Sequence[int],
    *,
    prompt: Phrasing,
    chat: bool = True,
    max_new_tokens: int = 24,
    batch_size: int = 64,
) -> Tensor:
    """Whether each listed individual answers each problem right, greedily: ``(m, n)`` bool.

    Rows ``(individual, problem)``, ``batch_size`` per routed ``generate``; the user message of a problem is
    ``prompt(problem)`` (the task's template or another phrasing). Answers are checked like training answers
    (code in the sandbox). Changes no state.
    """
    batch_size = check_int("batch_size", batch_size, low=1)
    ids = [int(i) for i in individuals]
    rows = [(i, p) for i in ids for p in problems]
    kwargs = dict(max_new_tokens=check_int("max_new_tokens", max_new_tokens, low=1), do_sample=False)
    kwargs["pad_token_id"] = pad_id(tokenizer)
    out: list[bool] = []
    with evaluating([population]):
        for start in range(0, len(rows), batch_size):
            chunk = rows[start : start + batch_size]
            texts = [chat_text(tokenizer, prompt(p), chat) for _, p in chunk]
            replies = generate_replies(population, tokenizer, [i for i, _ in chunk], texts, 0, kwargs, False).texts
            out += check_code_replies([p for _, p in chunk], replies).tolist()
    return torch.tensor(out, dtype=torch.bool).view(len(ids), len(problems))


class PopuLoRA(Snapshot):
    """Teacher and student LoRA populations on one frozen LM, trained by RL and renewed by evolution.

    Args:
        teachers, students: :class:`~populora.Population` s on the SAME base model (two objects).
        tokenizer: a Hugging Face tokenizer (``apply_chat_template`` when ``chat``).
        task: a :class:`~populora.tasks.Task` (a :class:`~populora.tasks.Mixture`: each teacher draws one
            member per step).
        ratings: ratings of ``teachers`` and ``students`` (default :class:`PaperRatings`: openskill's
            Thurstone-Mosteller, TrueSkill's defaults and draw probability 0.1).
        proposals: ``k >= 0`` proposals per teacher per step (``0``: no teachers, see the module docstring).
        attempts: ``a >= 2`` sampled answers per problem (its group for the advantages).
        anchors: ``m >= 0`` task-sampled problems every student answers per step.
        teacher_reward: ``"paper"`` (default), ``"failures"`` or ``"learnability"``.
        student_reward: ``"paper"`` (+1 / -0.5 / -1) or ``"binary"`` (1 / 0).
        match: rating granularity, ``"pair"`` (one match per teacher and step) or ``"problem"``.
        matchmaking: ``Ratings.pair`` mode (``"pfsp"``, ``"pfsp_hard"``, ``"uniform"``, ``"round_robin"``).
        teacher_lr, student_lr: Adam learning rates (one optimizer per role over its ``adapter_parameters``).
        optimizers: ``{"teachers": opt, "students": opt}`` to use instead (element-wise optimizers).
        train_teachers: RL for the teachers too (default); ``False`` freezes them.
        kl_coef: weight of a KL-to-base term in both roles' losses (0: none, the paper's).
        max_grad_norm: per-individual gradient clipping (``None``: none).
        micro_batch: rows per RL forward / backward.
        interval, fraction, crossover_rate, mutations, crossovers, epsilon: the replacement
            (:func:`~populora.loops.selfplay.replacement.replace_`) every ``interval`` steps.
        evolve: replace at all (``False``: RL only).
        phrasings: user messages of a student's problem: one is drawn per task and step (the loop's
            generator); ``None``: the task's template (``task.prompt``).
        reserved: questions (``Problem.question``) the loop never trains on, e.g. held-out and validation
            sets: a teacher's proposal of one passes the verifier (it counts in ``validity``) but is not asked:
            its reward is 0 (not the invalid -1) and it plays no match; a task-sampled anchor that is reserved
            is redrawn (the loop's generator, at most 1,000 draws per anchor).
        teacher_generate, student_generate: ``generate`` options (students must sample).
        chat: wrap prompts in the chat template.
        seed: seeds the loop's generator (matches, families, sampling seeds, anchors, phrasings).

    Raises:
        InvalidTypeError, InvalidValueError: a bad argument (named), before anything is built.
    """

    _checkpoint_kind = "PopuLoRA"

    def __init__(
        self,
        teachers: Population,
        students: Population,
        tokenizer: Any,
        task: Task,
        ratings: Ratings | None = None,
        *,
        proposals: int = 4,
        attempts: int = 4,
        anchors: int = 0,
        teacher_reward: str = "paper",
        student_reward: str = "paper",
        match: str = "pair",
        matchmaking: str = "pfsp",
        teacher_lr: float = 1e-5,
        student_lr: float = 1e-5,
        optimizers: Mapping[str, torch.optim.Optimizer] | None = None,
        train_teachers: bool = True,
        kl_coef: float = 0.0,
        max_grad_norm: float | None = 1.0,
        micro_batch: int = 8,
        interval: int = 10,
        fraction: float = 0.25,
        crossover_rate: float = 0.5,
        mutations: Sequence[str] = PAPER_MUTATIONS,
        crossovers: Sequence[str] = PAPER_CROSSOVERS,
        epsilon: float = 0.1,
        evolve: bool = True,
        phrasings: Sequence[Phrasing] | None = None,
        reserved: Collection[str] | None = None,
        teacher_generate: Mapping[str, Any] | None = None,
        student_generate: Mapping[str, Any] | None = None,
        chat: bool = True,
        seed: int = 0,
    ) -> None:
        ratings, self.pad_id, self.chat = check_players(
            teachers, students, tokenizer, task, ratings, chat, PaperRatings
        )
        self.proposals = check_int("proposals", proposals, low=0)
        self.attempts = check_int("attempts", attempts, low=2)
        self.anchors = check_int("anchors", anchors, low=0)
        if self.proposals == 0 and self.anchors == 0:
            raise InvalidValueError("with proposals=0 (no teachers) the students need anchors >= 1 to train on")
        self.teacher_reward = check_one_of("teacher_reward", teacher_reward, TEACHER_REWARDS)
        self.student_reward = check_one_of("student_reward", student_reward, STUDENT_REWARDS)
        self.match = check_one_of("match", match, MATCH_GRANULARITIES)
        self.matchmaking = check_one_of("matchmaking", matchmaking, PAIRING_MODES)
        self.train_teachers = check_bool("train_teachers", train_teachers)
        self.kl_coef = check_float("kl_coef", kl_coef, low=0.0)
        self.max_grad_norm = (
            None if max_grad_norm is None else check_float("max_grad_norm", max_grad_norm, low=0.0, low_open=True)
        )
        self.micro_batch = check_int("micro_batch", micro_batch, low=1)
        self.interval = check_int("interval", interval, low=1)
        self.fraction = check_float("fraction", fraction, low=0.0, high=0.5, low_open=True)
        self.crossover_rate = check_float("crossover_rate", crossover_rate, low=0.0, high=1.0)
        self.epsilon = check_float("epsilon", epsilon, low=0.0)
        self.evolve = check_bool("evolve", evolve)
        for kind, names in (("mutation", mutations), ("crossover", crossovers)):
            if isinstance(names, str) or not isinstance(names, Sequence) or not names:
                raise InvalidTypeError(f"`{kind}s` must be a non-empty sequence of operator names, got {names!r}")
            for op in names:
                ops.get_operator(kind, op)
        self.mutations, self.crossovers = tuple(mutations), tuple(crossovers)
        if phrasings is not None:
            phrasings = list(phrasings)
            if not phrasings or not all(callable(p) for p in phrasings):
                raise InvalidTypeError("`phrasings` must be a non-empty sequence of callables problem -> str")
        self.phrasings: list[Phrasing] | None = phrasings
        if reserved is None:
            reserved = ()
        if isinstance(reserved, str) or not isinstance(reserved, Collection):
            raise InvalidTypeError(
                f"`reserved` must be a collection of question strings, got {type(reserved).__name__}"
            )
        bad = next((q for q in reserved if not isinstance(q, str)), None)
        if bad is not None:
            raise InvalidTypeError(f"`reserved` must hold question strings, got {type(bad).__name__} {bad!r}")
        self.reserved: frozenset[str] = frozenset(reserved)
        self.teacher_generate = _generate_options(
            "teacher_generate", teacher_generate, dict(max_new_tokens=48, do_sample=True, temperature=1.0)
        )
        self.student_generate = _generate_options(
            "student_generate", student_generate, dict(max_new_tokens=24, do_sample=True, temperature=1.0)
        )
        if not self.student_generate.get("do_sample", False):
            raise InvalidValueError(
                f"the students sample their {self.attempts} attempts: student_generate needs do_sample=True"
            )
        for options in (self.teacher_generate, self.student_generate):
            options.setdefault("pad_token_id", self.pad_id)
        if optimizers is None:
            self.teacher_lr = check_float("teacher_lr", teacher_lr, low=0.0, low_open=True)
            self.student_lr = check_float("student_lr", student_lr, low=0.0, low_open=True)
            optimizers = {
                "teachers": torch.optim.Adam(teachers.adapter_parameters(), lr=self.teacher_lr),
                "students": torch.optim.Adam(students.adapter_parameters(), lr=self.student_lr),
            }
        elif not isinstance(optimizers, Mapping) or sorted(optimizers) != sorted(NAMES):
            raise InvalidValueError(
                f"`optimizers` must map 'teachers' and 'students' to optimizers, got {optimizers!r}"
            )
        for name, opt in optimizers.items():
            if not isinstance(opt, torch.optim.Optimizer):
                raise InvalidTypeError(f"`optimizers[{name!r}]` must be a torch optimizer, got {type(opt).__name__}")
        self.optimizers: dict[str, torch.optim.Optimizer] = dict(optimizers)
        self.families: tuple[Task, ...] = task.tasks if isinstance(task, Mixture) else (task,)
        self.family_weights = task.weights.clone() if isinstance(task, Mixture) else torch.ones(1, dtype=torch.float64)
        self.seed = check_seed("seed", seed)
        self.teachers, self.students, self.ratings = teachers, students, ratings
        self.tokenizer, self.task = tokenizer, task
        self.generator = torch.Generator().manual_seed(self.seed)
        self.steps = 0
        self.history: list[PopuLoRARecord] = []
        self.replacements: list[ReplacementRecord] = []

    @classmethod
    def from_preset(
        cls, model: Any, tokenizer: Any, task: Task, preset: Preset = CPU_PRESET, *, seed: int = 0, **loop: Any
    ) -> PopuLoRA:
        """Build the populations (``init_scale=0``: every individual starts as the base model) and the loop.

        ``loop`` entries override the preset's loop options. Teachers are seeded ``seed``, students ``seed + 1``,
        the loop ``seed``.
        """
        if not isinstance(preset, Preset):
            raise InvalidTypeError(f"`preset` must be a Preset, got {type(preset).__name__}")
        targets = preset.lora_targets
        if targets is None:
            from populora.llm.targets import LLAMA_ALL

            targets = LLAMA_ALL
        options = {**preset.loop, **loop, "seed": seed}
        known = set(inspect.signature(cls.__init__).parameters) - {"self", "teachers", "students", "tokenizer", "task"}
        unknown = sorted(set(options) - known)
        if unknown:  # before any population wraps the model
            close = difflib.get_close_matches(unknown[0], sorted(known), n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise InvalidTypeError(f"PopuLoRA takes no option {unknown[0]!r}{hint}; its options are {sorted(known)}")
        with closing_on_failure() as undo:  # a refused option gives the model back unwrapped, its flags restored
            teachers = Population(model, preset.teachers, preset.rank, list(targets), init_scale=0, seed=seed)
            undo.callback(teachers.close)
            students = Population(model, preset.students, preset.rank, list(targets), init_scale=0, seed=seed + 1)
            undo.callback(students.close)
            return cls(teachers, students, tokenizer, task, **options)

    def __repr__(self) -> str:
        return (
            f"PopuLoRA(teachers P={self.teachers.pop_size}, students P={self.students.pop_size}, "
            f"proposals={self.proposals}, attempts={self.attempts}, anchors={self.anchors}, "
            f"interval={self.interval}, evolve={self.evolve}, steps={self.steps})"
        )

    # ------------------------------------------------------------------ one step

    def step(self) -> PopuLoRAOutcome:
        """One step of the loop (module docstring), all or nothing.

        Returns:
            A :class:`PopuLoRAOutcome`; its record is appended to :attr:`history`.
        """
        with transaction(
            self.teachers,
            self.students,
            *self.optimizers.values(),
            self.ratings,
            self.generator,
            Attributes(self, "steps", "history", "replacements"),
        ):
            return self._step()

    def _anchors(self) -> list[Problem]:
        """``anchors`` task-sampled problems, each reserved one redrawn (the loop's generator)."""
        out = self.task.sample(self.anchors, self.generator) if self.anchors else []
        for i, problem in enumerate(out):
            draws = 1
            while problem.question in self.reserved:
                if draws >= 1000:
                    raise InvalidValueError(
                        f"1,000 draws of {self.task!r} were all reserved (last {problem.question!r}): "
                        "`reserved` covers (almost) the whole task"
                    )
                problem = self.task.sample(1, self.generator)[0]
                draws += 1
            out[i] = problem
        return out

    def _draw_seed(self) -> int:
        return int(torch.randint(0, 2**62, (), generator=self.generator))

    def _prompt(self, problem: Problem, which: int) -> str:
        message = self.task.prompt(problem) if self.phrasings is None else self.phrasings[which](problem)
        return chat_text(self.tokenizer, message, self.chat)

    def _step(self) -> PopuLoRAOutcome:
        t_pop, s_pop = self.teachers, self.students
        p_t, p_s, k, a = t_pop.pop_size, s_pop.pop_size, self.proposals, self.attempts
        generated, trained, t_generate = 0, 0, 0.0
        if k:
            opponents = self.ratings.pair(
                "teachers", "students", self.generator, mode=self.matchmaking, offset=self.steps
            ).long()
            chosen = torch.multinomial(self.family_weights, p_t, replacement=True, generator=self.generator).tolist()
        else:
            opponents, chosen = torch.zeros(p_t, dtype=torch.int64), []
        families = [self.families[c] for c in chosen]
        with evaluating((t_pop, s_pop)):
            start = time.perf_counter()
            if k:
                texts = [chat_text(self.tokenizer, f.proposal_prompt(), self.chat) for f in families for _ in range(k)]
                t_ids = torch.arange(p_t).repeat_interleave(k).tolist()
                t_out = generate_replies(
                    t_pop, self.tokenizer, t_ids, texts, self._draw_seed(), self.teacher_generate, False
                )
                generated += t_out.tokens
                proposals = t_out.texts
                problems = [families[j // k].parse_proposal(text) for j, text in enumerate(proposals)]
            else:
                t_ids, proposals, problems = [], [], []
            held = torch.tensor(
                [p is not None and p.question in self.reserved for p in problems], dtype=torch.bool
            ).view(p_t, k)
            asked_problems = [None if bool(h) else p for p, h in zip(problems, held.flatten())]
            valid = torch.tensor([p is not None for p in asked_problems], dtype=torch.bool).view(p_t, k)
            anchors = self._anchors()
            tasks: list[tuple[int, Problem]] = [
                (int(opponents[j // k]), p) for j, p in enumerate(asked_problems) if p is not None
            ]
            tasks += [(s, p) for s in range(p_s) for p in anchors]
            many = self.phrasings is not None and len(self.phrasings) > 1
            which = (
                torch.randint(len(self.phrasings), (len(tasks),), generator=self.generator).tolist()  # type: ignore[arg-type]
                if many
                else [0] * len(tasks)
            )
            s_ids = [s for s, _ in tasks for _ in range(a)]
            s_texts = [self._prompt(p, w) for (_, p), w in zip(tasks, which) for _ in range(a)]
            s_out = generate_replies(
                s_pop, self.tokenizer, s_ids, s_texts, self._draw_seed(), self.student_generate, False
            )
            t_generate = time.perf_counter() - start
            generated += s_out.tokens
        asked = [p for _, p in tasks for _ in range(a)]
        right = check_code_replies(asked, s_out.texts) if asked else torch.zeros(0, dtype=torch.bool)
        formed = torch.tensor([well_formed(p, r) for p, r in zip(asked, s_out.texts)], dtype=torch.bool)
        q = int(valid.sum())
        solved = torch.zeros(p_t, k, a, dtype=torch.bool)
        if q:
            solved[valid] = right[: q * a].view(q, a)
        t_reward = teacher_rewards(valid, solved, self.teacher_reward)
        t_reward = torch.where(held, torch.zeros_like(t_reward), t_reward)  # reserved: not -1, not solve-based
        s_reward = student_rewards(right, formed, self.student_reward)

        # every write below is undone by step() if anything raises
        start = time.perf_counter()
        if k and self.train_teachers:
            trained += self._rl(
                "teachers", t_out.prompt_ids, t_out.reply_ids, t_ids, t_reward.flatten(), torch.tensor(t_ids)
            )
        if s_ids:
            groups = torch.arange(len(tasks)).repeat_interleave(a)
            trained += self._rl("students", s_out.prompt_ids, s_out.reply_ids, s_ids, s_reward, groups)
        t_train = time.perf_counter() - start
        matches = 0
        if k:
            m_t, m_s, scores = match_outcomes(opponents, valid, solved, self.match)
            self.ratings.rate_many_("teachers", m_t, "students", m_s, scores)
            matches = int(scores.numel())
        record_ratings = {n: (self.ratings.mu(n).mean(), self.ratings.ordinal(n).max()) for n in NAMES}
        replaced: list[ReplacementRecord] = []
        if self.evolve and (self.steps + 1) % self.interval == 0:
            for name, pop in (("teachers", t_pop), ("students", s_pop)):
                if name == "teachers" and not k:
                    continue
                rec = replace_(
                    pop,
                    self.ratings,
                    name,
                    optimizer=self.optimizers[name],
                    fraction=self.fraction,
                    crossover_rate=self.crossover_rate,
                    mutations=self.mutations,
                    crossovers=self.crossovers,
                    epsilon=self.epsilon,
                    step=self.steps,
                )
                if rec is not None:
                    replaced.append(rec)
        n_anchor = len(anchors) * p_s * a
        record = PopuLoRARecord(
            step=self.steps,
            validity=float((valid | held).float().mean()) if k else 0.0,
            reserved=int(held.sum()),
            teacher_reward=float(t_reward.mean()) if k else 0.0,
            student_reward=float(s_reward.mean()) if s_ids else 0.0,
            solve_rate=float(right[: q * a].float().mean()) if q else 0.0,
            format_rate=float(formed.float().mean()) if s_ids else 0.0,
            anchor_accuracy=float(right[q * a :].float().mean()) if n_anchor else None,
            matches=matches,
            generated_tokens=int(generated),
            trained_tokens=int(trained),
            teacher_mu=float(record_ratings["teachers"][0]),
            student_mu=float(record_ratings["students"][0]),
            teacher_ordinal_best=float(record_ratings["teachers"][1]),
            student_ordinal_best=float(record_ratings["students"][1]),
            replaced=sum(len(r.children) for r in replaced),
            seconds_generate=float(t_generate),
            seconds_train=float(t_train),
        )
        self.history.append(record)
        self.replacements.extend(replaced)
        self.steps += 1
        return PopuLoRAOutcome(
            opponents,
            [f.name for f in families],
            proposals,
            problems,
            valid,
            solved,
            t_reward,
            tasks,
            s_out.texts,
            right,
            formed,
            s_reward,
            anchors,
            replaced,
            record,
            held,
        )

    def _rl(
        self,
        name: str,
        prompts: list[list[int]],
        replies: list[list[int]],
        ids: list[int],
        rewards: Tensor,
        groups: Tensor,
    ) -> int:
        """One REINFORCE++ step of ``name`` on its rows; returns the reply tokens trained (0: no step taken)."""
        adv = _zero_where_centred_zero(rewards.double(), groups)
        if self.kl_coef == 0 and not bool((adv != 0).any()):
            return 0  # no signal: no optimizer step (Adam's momentum alone would still move the adapters)
        pop = self.teachers if name == "teachers" else self.students
        model = pop.model
        training = model.training
        model.eval()  # replies were generated without dropout
        try:
            policy_gradient_step_(
                pop,
                self.optimizers[name],
                prompts,
                replies,
                ids,
                adv,
                pad_id=self.pad_id,
                micro_batch=self.micro_batch,
                reduction="token_mean",
                kl_coef=self.kl_coef,
                max_grad_norm=self.max_grad_norm,
                distributed=False,
            )
        finally:
            model.train(training)
        return int(sum(len(r) for r, x in zip(replies, adv.tolist()) if x != 0 or self.kl_coef > 0))

    # ------------------------------------------------------------------ evaluation

    def solve_rate(
        self,
        problems: Sequence[Problem],
        individuals: Sequence[int] | None = None,
        *,
        prompt: Phrasing | None = None,
        max_new_tokens: int | None = None,
        batch_size: int = 64,
    ) -> Tensor:
        """Greedy ``(m, n)`` bool: student ``individuals[i]`` answers ``problems[j]`` (:func:`solve_rate`).

        ``prompt``: the user message of a problem (default the task's template); ``max_new_tokens``: default
        the students' training length.
        """
        ids = list(range(self.students.pop_size)) if individuals is None else list(individuals)
        return solve_rate(
            self.students,
            self.tokenizer,
            problems,
            ids,
            prompt=self.task.prompt if prompt is None else prompt,
            chat=self.chat,
            max_new_tokens=max_new_tokens or int(self.student_generate.get("max_new_tokens", 24)),
            batch_size=batch_size,
        )

    # ------------------------------------------------------------------ state

    def state_dict(self) -> dict[str, Any]:
        """Everything an exact resume needs but the base model and tokenizer (copies, CPU tensors)."""
        return {
            "format": _FORMAT,
            "steps": self.steps,
            "seed": self.seed,
            "generator": self.generator.get_state().clone(),
            "teachers": self.teachers.snapshot("cpu"),
            "students": self.students.snapshot("cpu"),
            "optimizers": {n: copy.deepcopy(o.state_dict()) for n, o in self.optimizers.items()},
            "ratings": self.ratings.state_dict(),
            "history": [r.as_dict() for r in self.history],
            "replacements": [r.as_dict() for r in self.replacements],
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore :meth:`state_dict`; every part is checked before anything is written.

        Raises:
            CheckpointError: not a PopuLoRA state, a missing key or a part that does not fit (nothing changed).
        """
        if not isinstance(state, Mapping) or state.get("format") != _FORMAT:
            raise CheckpointError(f"not a PopuLoRA checkpoint (missing format {_FORMAT!r})")
        keys = ("steps", "generator", "teachers", "students", "optimizers", "ratings", "history", "replacements")
        missing = [key for key in keys if key not in state]
        if missing:
            raise CheckpointError(f"the PopuLoRA state lacks {missing}")
        steps = state["steps"]
        if not is_int(steps) or steps < 0:
            raise CheckpointError(f"the PopuLoRA state's 'steps' must be an int >= 0, got {steps!r}")
        probe = torch.Generator()
        try:
            probe.set_state(state["generator"])
        except (TypeError, RuntimeError, ValueError) as error:
            raise CheckpointError(f"the PopuLoRA state's 'generator' is not a generator state: {error}") from None
        try:
            history = [PopuLoRARecord.from_dict(r) for r in state["history"]]
            replacements = [ReplacementRecord.from_dict(r) for r in state["replacements"]]
        except (TypeError, ValueError) as error:
            raise CheckpointError(f"the PopuLoRA state's history is malformed: {error}") from None
        if [r.step for r in history] != list(range(int(steps))):
            raise CheckpointError(f"the PopuLoRA state's history must hold steps 0 .. {int(steps) - 1}")
        opts = state["optimizers"]
        if not isinstance(opts, Mapping) or sorted(opts) != sorted(NAMES):
            raise CheckpointError("the PopuLoRA state's 'optimizers' must map 'teachers' and 'students'")
        checked = {
            n: p.check_state_dict(state[n]) for n, p in (("teachers", self.teachers), ("students", self.students))
        }
        ratings_before = self.ratings.state_dict()
        optim_before = {n: copy.deepcopy(o.state_dict()) for n, o in self.optimizers.items()}
        self.ratings.load_state_dict(state["ratings"])
        try:
            for n, opt in self.optimizers.items():
                opt.load_state_dict(copy.deepcopy(opts[n]))
        except (KeyError, TypeError, ValueError, RuntimeError) as error:
            self.ratings.load_state_dict(ratings_before)
            for n, opt in self.optimizers.items():
                opt.load_state_dict(optim_before[n])
            raise CheckpointError(f"the PopuLoRA state's optimizer state does not fit: {error}") from None
        self.teachers.load_checked_state_dict(checked["teachers"])
        self.students.load_checked_state_dict(checked["students"])
        self.generator.set_state(probe.get_state())
        self.history, self.replacements = history, replacements
        self.steps = int(steps)
