"""PopuLoRA: the one self-play loop. Teacher and student LoRA populations on one frozen LM; teachers propose
problems, a verifier keeps the valid ones, matched students answer them; both roles learn.

Every option is one :class:`~populora.loops.selfplay.config.PopuLoRAConfig`. Its ``update`` picks how the
roles learn: ``"rl"`` (the paper, :data:`PAPER_PRESET` / :data:`CPU_PRESET`: REINFORCE++ for both roles every
step, the bottom of each role replaced every ``interval`` steps) or ``"evolve"`` (:data:`SELFPLAY_PRESET`,
what :func:`~populora.SelfPlay` builds: both populations evolve one generation every step on their fitnesses).

One :meth:`PopuLoRA.step` is the eight functions below, in this order, each reading and writing one
:class:`Round`:

1. :func:`pair`: matchmaking pairs every teacher with a student (``Ratings.pair``, PFSP by default, the
   loop's generator); with ``families="drawn"`` every teacher draws one member of a
   :class:`~populora.tasks.Mixture` for the step (a plain task is its own member);
2. :func:`propose`: the teachers propose ``proposals`` problems each in ONE routed ``teachers.generate``;
3. :func:`verify`: the family's verifier (``parse_proposal``) keeps the valid ones; a valid one whose
   question is ``reserved`` (held out) is not asked;
4. :func:`answer`: the matched student answers every valid problem ``attempts`` times, plus ``anchors``
   task-sampled problems each, in ONE routed ``students.generate``, each in a phrasing drawn from the
   task's (or the config's) phrasings;
5. :func:`score`: answers are checked (code in the sandbox) and read for form (``Task.well_formed``); RL:
   rewards by the paper's table (:mod:`~populora.loops.selfplay.rewards`); evolve: fitnesses
   (:func:`~populora.loops.selfplay.scores.selfplay_fitnesses`);
6. :func:`rate`: the step's matches update the ratings;
7. :func:`update`: RL: one :func:`~populora.train.policy_gradient_step_` per role on REINFORCE++ advantages
   (centred per group, whitened over the role's batch), each role with its own Adam; evolve: (optionally a
   policy-gradient step of the students, then) one ``evolve_`` per population, the ratings following the
   culled slots;
8. :func:`replace`: RL, every ``interval`` steps, each role's bottom ``fraction`` is replaced
   (:func:`~populora.loops.selfplay.replacement.replace_`).

All or nothing: a step that raises restores both populations (adapters, generators, counters), both
optimizers, the ratings and the loop's generator, so a retry is the step an untouched twin takes. A
:meth:`state_dict` holds everything but the base model and the tokenizer, and the config: a loaded loop
continues bit for bit, and a state written with another config is refused, naming the field.

Distributed (``step(distributed=True)`` / ``run(distributed=True)`` under torchrun), by member
(``sampler="member"``, the default; both updates): each role's members are cut into contiguous blocks, one per
rank (:func:`~populora.distributed.members.member_block`: the first ``P % world`` ranks own one member more; a
rank past ``P`` owns none and still joins every collective). Every rank holds the base and both populations
whole, but generates, checks (the sandbox) and trains only its own members' rows; a member's adapter rows,
optimizer rows and generator are authoritative on its owner alone (the other ranks' copies go stale and are
never read). Per step each rank sends: its members' reply token ids (an all-gather of int64 tensors, decoded
identically everywhere), its students' verdicts (an all-reduce of an ``(n,)`` int64 vector), one int per guarded
phase (a failure flag), and at a replacement the rows (adapter factors and optimizer state) of each parent whose
child another rank owns (point to point). Rewards, advantages (on the whole role's batch in the one-process row
order), ratings, matchmaking and the replacement's decisions are computed on every rank from the same values;
no adapter is all-reduced. Each member generates in a block of its own (its rows, its pad width, routed
``individual=i``) from its own generator, and trains in micro batches of its own rows, so a 2-rank run IS the
1-rank run: the same tokens, ratings, replacements and history, adapters equal to float rounding. At the first
distributed step rank 0's populations, generators, ratings, step and history are broadcast (once);
:meth:`state_dict` / :meth:`save` gather every member from its owner (collective), so a file written by N ranks
resumes on any number. A failure on one rank (generation, the sandbox, the update, a replacement; a
KeyboardInterrupt too) is raised on every rank (the others a ``RankFailure`` naming it) and every rank's step
is rolled back. With ``sampler="batch"`` (0.5.0's, kept by :data:`SELFPLAY_PRESET`) an evolving loop shards
rows instead (reproducible at a fixed world size only) and an RL loop refuses ``distributed=True``.
"""

from __future__ import annotations

import copy
import dataclasses
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from populora import distributed as pd
from populora.checkpoint import atomic_save
from populora.checks import check_float, check_index, check_int, check_one_of, is_int
from populora.config import config_from_legacy
from populora.distributed import members as pm
from populora.errors import CheckpointError, FitnessError, InvalidTypeError, InvalidValueError
from populora.llm.text import Replies, chat_text, generate_by_member, generate_replies, pad_id
from populora.loops.base import Budget, run_steps
from populora.loops.coevolve.specs import check_evolve_kwargs
from populora.loops.ratings import Ratings
from populora.loops.selfplay.checks import check_players
from populora.loops.selfplay.config import (
    CPU_PRESET,
    PAPER_PRESET,
    SELFPLAY_PRESET,
    PopuLoRAConfig,
    Preset,
    check_generation_keys,
)
from populora.loops.selfplay.replacement import PaperRatings, ReplacementRecord, replace_
from populora.loops.selfplay.rewards import match_outcomes, student_rewards, teacher_rewards
from populora.loops.selfplay.scores import SelfPlayRecord, match_scores, selfplay_fitnesses
from populora.population.optimizer_rows import OptimizerRows
from populora.population.population import Population, evaluating
from populora.snapshots import Snapshot
from populora.tasks import Mixture, Problem, Task, check_code_replies
from populora.tasks.base import proposal_prompt
from populora.train import PolicyGradient, advantages, policy_gradient_step_
from populora.transaction import Attributes, closing_on_failure, transaction

__all__ = [
    "CPU_PRESET",
    "PAPER_PRESET",
    "SELFPLAY_PRESET",
    "PopuLoRA",
    "PopuLoRAConfig",
    "PopuLoRAOutcome",
    "PopuLoRARecord",
    "Preset",
    "Round",
    "SelfPlay",
    "SelfPlayOutcome",
    "solve_rate",
]

FORMAT = "populora.PopuLoRA/3"
FORMAT_060 = "populora.PopuLoRA/2"  # 0.6.0's first files: no members' generators (they start fresh: see load)
FORMAT_050 = {"rl": "populora.PopuLoRA/1", "evolve": "populora.selfplay/1"}  # 0.5.0's two loops
NAMES = ("teachers", "students")
_SAMPLING = ("temperature", "top_p", "top_k")

Phrasing = Callable[[Problem], str]


@dataclass(frozen=True)
class PopuLoRARecord:
    """One step of an RL loop (``update="rl"``; an entry of ``history``).

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
        repeated: valid proposals not asked because they repeat a prompt example or a recent problem
            (``novelty_window``); distinct: distinct questions of the proposals asked this step (both ``None``
            in a history 0.5.0 wrote, which did not record them).
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
    repeated: int | None = None
    distinct: int | None = None

    def as_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_dict(cls, d: Any) -> PopuLoRARecord:
        """A record from :meth:`as_dict` (every field checked: ints >= 0, finite floats, fractions in [0, 1])."""
        names = [f.name for f in fields(cls)]
        new = ("repeated", "distinct")  # 0.6.0's: a 0.5.0 history has none
        if not isinstance(d, Mapping) or sorted(set(d) - set(new)) != sorted(set(names) - set(new)):
            raise InvalidValueError(f"a history entry must be a dict with the keys {names}, got {d!r}")
        if not set(d) <= set(names):
            raise InvalidValueError(f"a history entry must be a dict with the keys {names}, got {d!r}")
        values: dict[str, Any] = {}
        for name in names:
            value = d.get(name)
            if name in new and value is None:
                values[name] = None
            elif name in ("step", "matches", "reserved", "generated_tokens", "trained_tokens", "replaced", *new):
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
        teacher_rewards: (RL) ``(p_t, k)`` float64; ``None`` when evolving.
        tasks: the students' ``(student, problem)`` tasks: valid proposals (in proposal order), then anchors.
        answers: the decoded answers, ``a`` per task; right / formed: ``(len(tasks) * a,)`` bool.
        student_rewards: (RL) ``(len(tasks) * a,)`` float64; ``None`` when evolving.
        anchors: the step's anchor problems.
        replacements: the step's :class:`ReplacementRecord` s (RL; empty on most steps).
        record: the step's record (:class:`PopuLoRARecord`, or :class:`SelfPlayRecord` when evolving).
        reserved: ``(p_t, k)`` bool, verified but not asked (its question is ``reserved``).
        anchor_solved: ``(p_s, m, a)`` bool, each student's attempts at the anchors.
        teacher_fitness / student_fitness: (evolve) ``(p_t,)`` / ``(p_s,)`` float32 the populations evolved
            on; ``None`` under RL.
        proposal_ids / answer_ids: the sampled token ids of each proposal / answer (up to its eos).
    """

    opponents: Tensor
    families: list[str]
    proposals: list[str]
    problems: list[Problem | None]
    valid: Tensor
    solved: Tensor
    teacher_rewards: Tensor | None
    tasks: list[tuple[int, Problem]]
    answers: list[str]
    right: Tensor
    formed: Tensor
    student_rewards: Tensor | None
    anchors: list[Problem]
    replacements: list[ReplacementRecord]
    record: PopuLoRARecord | SelfPlayRecord
    reserved: Tensor
    anchor_solved: Tensor
    teacher_fitness: Tensor | None = None
    student_fitness: Tensor | None = None
    proposal_ids: list[list[int]] | None = None
    answer_ids: list[list[int]] | None = None


SelfPlayOutcome = PopuLoRAOutcome  # 0.5.0's name of the evolution-only loop's outcome


@dataclass
class Round:
    """One step in the making: what each of the step's functions reads and writes, in their order."""

    # pair
    opponents: Tensor = field(default_factory=lambda: torch.zeros(0, dtype=torch.int64))
    families: list[Task] = field(default_factory=list)
    # propose
    examples: list[list[Problem]] = field(default_factory=list)
    teacher_ids: list[int] = field(default_factory=list)
    proposed: Replies = field(default_factory=lambda: Replies([], [], [], 0))
    # verify
    problems: list[Problem | None] = field(default_factory=list)
    held: Tensor = field(default_factory=lambda: torch.zeros(0, 0, dtype=torch.bool))
    repeated: Tensor = field(default_factory=lambda: torch.zeros(0, 0, dtype=torch.bool))
    valid: Tensor = field(default_factory=lambda: torch.zeros(0, 0, dtype=torch.bool))
    # answer
    anchors: list[Problem] = field(default_factory=list)
    tasks: list[tuple[int, Problem]] = field(default_factory=list)
    student_ids: list[int] = field(default_factory=list)
    answered: Replies = field(default_factory=lambda: Replies([], [], [], 0))
    seconds_generate: float = 0.0
    # score
    right: Tensor = field(default_factory=lambda: torch.zeros(0, dtype=torch.bool))
    formed: Tensor = field(default_factory=lambda: torch.zeros(0, dtype=torch.bool))
    solved: Tensor = field(default_factory=lambda: torch.zeros(0, 0, 0, dtype=torch.bool))
    anchor_solved: Tensor = field(default_factory=lambda: torch.zeros(0, 0, 0, dtype=torch.bool))
    teacher_rewards: Tensor | None = None
    student_rewards: Tensor | None = None
    teacher_fitness: Tensor | None = None
    student_fitness: Tensor | None = None
    # rate
    matches: int = 0
    rating_summary: dict[str, tuple[float, float]] = field(default_factory=dict)
    # update, replace
    trained_tokens: int = 0
    seconds_train: float = 0.0
    replacements: list[ReplacementRecord] = field(default_factory=list)

    @property
    def num_valid(self) -> int:
        return int(self.valid.sum())


# ---------------------------------------------------------------------------------------------- the step


def pair(loop: PopuLoRA, r: Round) -> None:
    """Matchmaking (every teacher's opponent) and, with ``families="drawn"``, every teacher's family."""
    c = loop.config
    p_t = loop.teachers.pop_size
    if not c.proposals:
        r.opponents = torch.zeros(p_t, dtype=torch.int64)
        return
    r.opponents = torch.as_tensor(
        loop.ratings.pair("teachers", "students", loop.generator, mode=c.matchmaking, offset=loop.steps),
        dtype=torch.long,
    ).cpu()
    if c.families == "drawn":
        chosen = torch.multinomial(loop.family_weights, p_t, replacement=True, generator=loop.generator).tolist()
        r.families = [loop.families[i] for i in chosen]
    else:
        r.families = [loop.task] * p_t


def propose(loop: PopuLoRA, r: Round, distributed: bool) -> None:
    """``proposals`` proposals per teacher, ONE routed ``teachers.generate`` (sampled from the loop's generator)."""
    k = loop.config.proposals
    if not k:
        return
    r.examples = [draw_examples(loop, family) for family in r.families]
    prompts = [chat_text(loop.tokenizer, proposal_prompt(f, e), loop.chat) for f, e in zip(r.families, r.examples)]
    texts = [text for text in prompts for _ in range(k)]
    r.teacher_ids = torch.arange(loop.teachers.pop_size).repeat_interleave(k).tolist()
    start = time.perf_counter()
    r.proposed = loop.generate("teachers", r.teacher_ids, texts, distributed)
    r.seconds_generate += time.perf_counter() - start


def draw_examples(loop: PopuLoRA, family: Task) -> list[Problem]:
    """``prompt_examples`` past valid problems of ``family`` from the buffer (the loop's generator; none when off)."""
    n = loop.config.prompt_examples
    pool = [p for p in loop.buffer if isinstance(family, Mixture) or p.task == family.name]
    if not n or not pool:
        return []
    return [pool[i] for i in torch.randperm(len(pool), generator=loop.generator)[:n].tolist()]


def verify(loop: PopuLoRA, r: Round) -> None:
    """Each proposal through its family's verifier; a valid one of a reserved question is held, and one that
    repeats its prompt's examples or a recent problem (``novelty_window``) is repeated: neither is asked."""
    p_t, k = loop.teachers.pop_size, loop.config.proposals
    r.problems = [r.families[j // k].parse_proposal(text) for j, text in enumerate(r.proposed.texts)]
    held = [p is not None and p.question in loop.reserved for p in r.problems]
    seen: list[set[str]] = [set() for _ in range(p_t)]
    if loop.config.novelty_window:
        recent = {q for _, q in loop.recent}
        seen = [recent | {e.question for e in examples} for examples in (r.examples or [[]] * p_t)]
    repeated = [
        p is not None and not h and p.question in seen[j // k] for j, (p, h) in enumerate(zip(r.problems, held))
    ]
    r.held = torch.tensor(held, dtype=torch.bool).view(p_t, k)
    r.repeated = torch.tensor(repeated, dtype=torch.bool).view(p_t, k)
    asked = [p is not None and not h and not x for p, h, x in zip(r.problems, held, repeated)]
    r.valid = torch.tensor(asked, dtype=torch.bool).view(p_t, k)


def answer(loop: PopuLoRA, r: Round, distributed: bool) -> None:
    """The students' ``attempts`` answers at every valid problem (by its teacher's opponent) and their anchors."""
    k, a = loop.config.proposals, loop.config.attempts
    r.anchors = draw_anchors(loop)
    asked = r.valid.flatten().tolist()
    r.tasks = [(int(r.opponents[j // k]), p) for j, p in enumerate(r.problems) if p is not None and asked[j]]
    r.tasks += [(s, p) for s in range(loop.students.pop_size) for p in r.anchors]
    phrasings = loop.phrasings
    which = (
        torch.randint(len(phrasings), (len(r.tasks),), generator=loop.generator).tolist()
        if len(phrasings) > 1
        else [0] * len(r.tasks)
    )
    r.student_ids = [s for s, _ in r.tasks for _ in range(a)]
    texts = [
        chat_text(loop.tokenizer, phrasings[w](p), loop.chat) for (_, p), w in zip(r.tasks, which) for _ in range(a)
    ]
    start = time.perf_counter()
    r.answered = loop.generate("students", r.student_ids, texts, distributed)
    r.seconds_generate += time.perf_counter() - start


def draw_anchors(loop: PopuLoRA) -> list[Problem]:
    """``anchors`` task-sampled problems, each reserved one redrawn (the loop's generator)."""
    m = loop.config.anchors
    out = loop.task.sample(m, loop.generator) if m else []
    for i, problem in enumerate(out):
        draws = 1
        while problem.question in loop.reserved:
            if draws >= 1000:
                raise InvalidValueError(
                    f"1,000 draws of {loop.task!r} were all reserved (last {problem.question!r}): "
                    "`reserved` covers (almost) the whole task"
                )
            problem = loop.task.sample(1, loop.generator)[0]
            draws += 1
        out[i] = problem
    return out


def check_answers(task: Task, problems: Sequence[Problem], replies: Sequence[str]) -> Tensor:
    """``(n,)`` bool: code problems through the sandbox (batched), every other through ``task.check``."""
    code = [i for i, p in enumerate(problems) if p.task in ("code_i", "code_f")]
    sandboxed = set(code)
    pairs = enumerate(zip(problems, replies))
    out = torch.tensor([i not in sandboxed and task.check(p, reply) for i, (p, reply) in pairs])
    if code:
        out[code] = check_code_replies([problems[i] for i in code], [replies[i] for i in code])
    return out.bool()


def score(loop: PopuLoRA, r: Round, distributed: bool = False) -> None:
    """Answers checked and read for form; the paper's rewards (RL) or the populations' fitnesses (evolve).

    By member under torch.distributed: each rank checks (the sandbox) its own students' rows; the verdicts are
    summed into one ``(n,)`` int64 vector on every rank."""
    c = loop.config
    p_t, p_s, k, a = loop.teachers.pop_size, loop.students.pop_size, c.proposals, c.attempts
    asked = [p for _, p in r.tasks for _ in range(a)]
    replies = r.answered.texts
    if distributed and loop.by_member:
        block = set(pm.member_block(p_s))
        own = [j for j, s in enumerate(r.student_ids) if s in block]
        mine = pm.guarded(
            lambda: check_answers(loop.task, [asked[j] for j in own], [replies[j] for j in own]) if own else None,
            "checking the answers",
        )
        verdicts = torch.zeros(len(asked), dtype=torch.int64)
        if mine is not None:
            verdicts[own] = mine.to(torch.int64)
        r.right = pm.all_reduce_sum_(verdicts, "verdicts").bool()
    else:
        r.right = check_answers(loop.task, asked, replies) if asked else torch.zeros(0, dtype=torch.bool)
    r.formed = torch.tensor([loop.task.well_formed(p, t) for p, t in zip(asked, replies)], dtype=torch.bool)
    q = r.num_valid
    r.solved = torch.zeros(p_t, k, a, dtype=torch.bool)
    if q:
        r.solved[r.valid] = r.right[: q * a].view(q, a)
    r.anchor_solved = r.right[q * a :].view(p_s, c.anchors, a)
    if c.update == "rl":
        t_reward = teacher_rewards(r.valid, r.solved, c.teacher_reward)
        # reserved or repeated: no reward (not the invalid -1, not a solve-based one)
        r.teacher_rewards = torch.where(r.held | r.repeated, torch.zeros_like(t_reward), t_reward)
        r.student_rewards = student_rewards(r.right, r.formed, c.student_reward)
        return
    teacher_f, student_f = selfplay_fitnesses(
        r.opponents, r.valid, r.solved, p_s, r.anchor_solved if c.anchors else None, teacher_reward=c.teacher_reward
    )
    r.teacher_fitness, r.student_fitness = (
        loop.checked_fitness("teachers", teacher_f),
        loop.checked_fitness("students", student_f),
    )


def rate(loop: PopuLoRA, r: Round) -> None:
    """The step's matches (``config.match``) update the ratings."""
    c = loop.config
    if c.proposals:
        if c.match == "proposal":
            m_t, m_s, scores = match_scores(r.opponents, r.valid, r.solved)
        else:
            m_t, m_s, scores = match_outcomes(r.opponents, r.valid, r.solved, c.match)
        if scores.numel():
            loop.ratings.rate_many_("teachers", m_t, "students", m_s, scores)
        r.matches = int(scores.numel())
    rt = loop.ratings
    r.rating_summary = {n: (float(rt.mu(n).double().mean()), float(rt.ordinal(n).max())) for n in NAMES}


def update(loop: PopuLoRA, r: Round, distributed: bool) -> None:
    """RL: one REINFORCE++ step per role. Evolve: the students' optional policy-gradient step, one ``evolve_``
    per population, the ratings following the culled slots."""
    c = loop.config
    start = time.perf_counter()
    if c.update == "rl":
        assert r.teacher_rewards is not None and r.student_rewards is not None  # score() set them
        if c.proposals and c.train_teachers:
            groups = torch.tensor(r.teacher_ids)  # a teacher's proposals answer one prompt
            r.trained_tokens += loop.rl_step(
                "teachers", r.proposed, r.teacher_ids, r.teacher_rewards.flatten(), groups, distributed
            )
        if r.student_ids:
            groups = torch.arange(len(r.tasks)).repeat_interleave(c.attempts)  # one problem, one student
            r.trained_tokens += loop.rl_step(
                "students", r.answered, r.student_ids, r.student_rewards, groups, distributed
            )
    else:
        if c.student_pg_lr > 0 and r.student_ids:
            ids, prompts, replies = r.student_ids, r.answered.prompt_ids, r.answered.reply_ids
            pg = lambda: loop.student_policy_gradient_step(ids, prompts, replies, r.right.flatten(), distributed)
            if distributed and loop.by_member:  # evolve_ reads every member: the trained ones from their owners
                pm.guarded(pg, "the students' policy-gradient step")
                loop.consolidate_("students", optimizer=False)
            else:
                pg()
        fitness = {"teachers": r.teacher_fitness, "students": r.student_fitness}
        for name in NAMES:
            result = loop.population(name).evolve_(fitness[name], **loop.evolve_kwargs.get(name, {}))
            loop.ratings.follow_(name, result)
    r.seconds_train = time.perf_counter() - start


def replace(loop: PopuLoRA, r: Round, distributed: bool = False) -> None:
    """RL, every ``interval`` steps: each role's bottom ``fraction`` replaced by children of its top.

    With ``sampler="member"`` each child's noise comes from ``(seed, step, child)``; under torch.distributed
    only the child's owner writes it, after receiving the rows of a parent another rank owns."""
    c = loop.config
    if c.update != "rl" or not c.evolve or (loop.steps + 1) % c.interval:
        return
    for name in NAMES:
        if name == "teachers" and not c.proposals:
            continue
        options: dict[str, Any] = dict(
            optimizer=loop.optimizers[name],
            fraction=c.fraction,
            crossover_rate=c.crossover_rate,
            mutations=c.mutations,
            crossovers=c.crossovers,
            epsilon=c.epsilon,
            step=loop.steps,
        )
        if not loop.by_member:
            rec = replace_(loop.population(name), loop.ratings, name, **options)
        else:
            fetch = (lambda plan, name=name: loop.fetch_parents(name, plan)) if distributed else None
            options.update(noise_seed=loop.noise_seed(name), fetch=fetch)
            rec = (
                pm.guarded(lambda: replace_(loop.population(name), loop.ratings, name, **options), f"replacing {name}")
                if distributed
                else replace_(loop.population(name), loop.ratings, name, **options)
            )
        if rec is not None:
            r.replacements.append(rec)


def record_of(loop: PopuLoRA, r: Round) -> PopuLoRARecord | SelfPlayRecord:
    """The step's record: named fields, numbers only (:meth:`as_dict` is one line of logging)."""
    c = loop.config
    k, a, q = c.proposals, c.attempts, r.num_valid
    teachers, students = r.rating_summary["teachers"], r.rating_summary["students"]
    n_anchor = len(r.anchors) * loop.students.pop_size * a
    tokens = r.proposed.tokens + r.answered.tokens
    if c.update == "evolve":
        assert r.teacher_fitness is not None and r.student_fitness is not None
        seconds = r.seconds_generate
        return SelfPlayRecord(
            step=loop.steps,
            validity=float(r.valid.float().mean()),
            student_mean=float(r.student_fitness.mean()),
            student_best=float(r.student_fitness.max()),
            anchor_accuracy=float(r.anchor_solved.float().mean()) if c.anchors else None,
            teacher_mean=float(r.teacher_fitness.mean()),
            teacher_best=float(r.teacher_fitness.max()),
            teacher_mu=teachers[0],
            student_mu=students[0],
            teacher_ordinal_best=teachers[1],
            student_ordinal_best=students[1],
            matches=r.matches,
            tokens=int(tokens),
            seconds=float(seconds),
            tokens_per_s=float(tokens / seconds) if seconds > 0 else 0.0,
        )
    assert r.teacher_rewards is not None and r.student_rewards is not None
    return PopuLoRARecord(
        step=loop.steps,
        validity=float((r.valid | r.held | r.repeated).float().mean()) if k else 0.0,
        teacher_reward=float(r.teacher_rewards.mean()) if k else 0.0,
        student_reward=float(r.student_rewards.mean()) if r.student_ids else 0.0,
        solve_rate=float(r.right[: q * a].float().mean()) if q else 0.0,
        format_rate=float(r.formed.float().mean()) if r.student_ids else 0.0,
        anchor_accuracy=float(r.right[q * a :].float().mean()) if n_anchor else None,
        matches=r.matches,
        reserved=int(r.held.sum()),
        generated_tokens=int(tokens),
        trained_tokens=int(r.trained_tokens),
        teacher_mu=teachers[0],
        student_mu=students[0],
        teacher_ordinal_best=teachers[1],
        student_ordinal_best=students[1],
        replaced=sum(len(x.children) for x in r.replacements),
        seconds_generate=float(r.seconds_generate),
        seconds_train=float(r.seconds_train),
        repeated=int(r.repeated.sum()),
        distinct=len({p.question for p, v in zip(r.problems, r.valid.flatten().tolist()) if p is not None and v}),
    )


def remember(loop: PopuLoRA, r: Round) -> None:
    """The step's asked proposals join the recent window, the examples' buffer and each teacher's questions."""
    c = loop.config
    asked = [(j // max(c.proposals, 1), p) for j, (p, v) in enumerate(zip(r.problems, r.valid.flatten().tolist())) if v]
    known = {p.question for p in loop.buffer}
    for teacher, problem in asked:
        assert problem is not None
        loop.questions[teacher].append(problem.question)
        if c.novelty_window and (loop.steps, problem.question) not in loop.recent:
            loop.recent.append((loop.steps, problem.question))
        family = loop.family_of(problem)
        if c.prompt_examples and family is not None and problem.question not in known and family.proposal_line(problem):
            loop.buffer.append(problem)
            known.add(problem.question)
    loop.recent = [(s, q) for s, q in loop.recent if s > loop.steps - c.novelty_window]
    loop.buffer = loop.buffer[-c.buffer_size :]


def _zero_where_centred_zero(rewards: Tensor, groups: Tensor) -> Tensor:
    """REINFORCE++ advantages, exactly 0 for rows whose group-centred reward is 0 (the whitening's shift of
    the batch mean is 0 in exact arithmetic: without this, float rounding would train rows that carry no signal)."""
    adv = advantages(rewards, groups=groups, method="reinforce++")
    centred = advantages(rewards, groups=groups, method="baseline")
    return torch.where(centred == 0, torch.zeros_like(adv), adv)


# ---------------------------------------------------------------------------------------------- evaluation


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
    generate: Mapping[str, Any] | None = None,
    check: Callable[[Sequence[Problem], Sequence[str]], Tensor] = check_code_replies,
) -> Tensor:
    """Whether each listed individual answers each problem right, greedily: ``(m, n)`` bool.

    Rows ``(individual, problem)``, ``batch_size`` per routed ``generate``; the user message of a problem is
    ``prompt(problem)`` (the task's template or another phrasing); ``generate``: more ``generate`` options
    (sampling ones are dropped). Answers are checked like training answers (code in the sandbox). Changes no
    state.
    """
    batch_size = check_int("batch_size", batch_size, low=1)
    ids = [int(i) for i in individuals]
    rows = [(i, p) for i in ids for p in problems]
    kwargs = {k: v for k, v in dict(generate or {}).items() if k not in _SAMPLING}
    kwargs.update(max_new_tokens=check_int("max_new_tokens", max_new_tokens, low=1), do_sample=False)
    kwargs.setdefault("pad_token_id", pad_id(tokenizer))
    out: list[bool] = []
    with evaluating([population]):
        for start in range(0, len(rows), batch_size):
            chunk = rows[start : start + batch_size]
            texts = [chat_text(tokenizer, prompt(p), chat) for _, p in chunk]
            replies = generate_replies(population, tokenizer, [i for i, _ in chunk], texts, 0, kwargs, False).texts
            out += check([p for _, p in chunk], replies).tolist()
    return torch.tensor(out, dtype=torch.bool).view(len(ids), len(problems))


# ---------------------------------------------------------------------------------------------- the loop


class PopuLoRA(Snapshot):
    """Teacher and student LoRA populations on one frozen LM, trained by RL (or evolved) against each other.

    Args:
        teachers, students: :class:`~populora.Population` s on the SAME base model (two objects).
        tokenizer: a Hugging Face tokenizer (``apply_chat_template`` when ``config.chat``).
        task: a :class:`~populora.tasks.Task` (a :class:`~populora.tasks.Mixture`: each teacher draws one
            member per step); it proposes, verifies, phrases, checks and judges the form of answers.
        ratings: ratings of ``teachers`` and ``students`` (default: RL :class:`PaperRatings`, openskill's
            Thurstone-Mosteller with TrueSkill's defaults; evolve: :class:`~populora.Ratings`).
        config: a :class:`PopuLoRAConfig` (default ``PopuLoRAConfig()``: the paper's loop; see
            :data:`PAPER_PRESET`, :data:`CPU_PRESET`, :data:`SELFPLAY_PRESET`).
        optimizers: (RL) ``{"teachers": opt, "students": opt}`` instead of one Adam per role over its
            ``adapter_parameters`` (element-wise optimizers).
        legacy: 0.5.0's flat keywords (``proposals=4, interval=5, ...``): deprecated, applied over ``config``.

    Attributes:
        config: the loop's config; history: one record per step; steps: completed steps; generator: the
        loop's ``torch.Generator``; replacements: every :class:`ReplacementRecord` of the run.

    Raises:
        InvalidTypeError, InvalidValueError: a bad argument or config field (named), before anything is built.
    """

    def __init__(
        self,
        teachers: Population,
        students: Population,
        tokenizer: Any,
        task: Task,
        ratings: Ratings | None = None,
        config: PopuLoRAConfig | None = None,
        *,
        optimizers: Mapping[str, torch.optim.Optimizer] | None = None,
        **legacy: Any,
    ) -> None:
        config = config_from_legacy(PopuLoRAConfig, config, legacy, where="PopuLoRA")
        check_generation_keys(config)
        default = PaperRatings if config.update == "rl" else Ratings
        ratings, self.pad_id, self.chat = check_players(
            teachers, students, tokenizer, task, ratings, config.chat, default
        )
        for name, pop in (("teachers", teachers), ("students", students)):
            size = getattr(config, name)
            if size is not None and size != pop.pop_size:
                raise InvalidValueError(
                    f"`PopuLoRAConfig.{name}` is {size} but the {name} population has {pop.pop_size} individuals "
                    f"(pass dataclasses.replace(config, {name}=None) to take any size)"
                )
            if config.rank is not None and pop.low_rank != config.rank:
                raise InvalidValueError(
                    f"`PopuLoRAConfig.rank` is {config.rank} but the {name}' adapters have rank {pop.low_rank}"
                )
        self.evolve_kwargs: dict[str, dict[str, Any]] = check_evolve_kwargs(
            {k: dict(v) for k, v in config.evolve_kwargs.items()}, {"teachers": teachers, "students": students}
        )
        self.teacher_generate = {"pad_token_id": self.pad_id, **config.teacher_generate}
        self.student_generate = {"pad_token_id": self.pad_id, **config.student_generate}
        if config.update == "evolve":
            if optimizers is not None:
                raise InvalidValueError("`optimizers` are the RL loop's (update='rl'); an evolving loop keeps none")
            optimizers = {}
        elif optimizers is None:
            optimizers = {
                "teachers": torch.optim.Adam(teachers.adapter_parameters(), lr=config.teacher_lr),
                "students": torch.optim.Adam(students.adapter_parameters(), lr=config.student_lr),
            }
        elif not isinstance(optimizers, Mapping) or sorted(optimizers) != sorted(NAMES):
            raise InvalidValueError(
                f"`optimizers` must map 'teachers' and 'students' to optimizers, got {optimizers!r}"
            )
        for name, opt in optimizers.items():
            if not isinstance(opt, torch.optim.Optimizer):
                raise InvalidTypeError(f"`optimizers[{name!r}]` must be a torch optimizer, got {type(opt).__name__}")
            owned = {id(p) for p in (teachers if name == "teachers" else students).adapter_parameters()}
            if not all(id(p) in owned for g in opt.param_groups for p in g["params"]):
                raise InvalidValueError(
                    f"`optimizers[{name!r}]` holds parameters that are not the {name}' adapters "
                    "(optimizers swapped between the roles?)"
                )
        self.config = config
        self.optimizers: dict[str, torch.optim.Optimizer] = dict(optimizers)
        self.families: tuple[Task, ...] = task.tasks if isinstance(task, Mixture) else (task,)
        self.family_weights = task.weights.clone() if isinstance(task, Mixture) else torch.ones(1, dtype=torch.float64)
        self.phrasings: tuple[Phrasing, ...] = config.phrasings if config.phrasings is not None else task.phrasings()
        self.reserved: frozenset[str] = frozenset(config.reserved)
        self.seed = config.seed
        self.teachers, self.students, self.ratings = teachers, students, ratings
        self.tokenizer, self.task = tokenizer, task
        self.generator = torch.Generator().manual_seed(self.seed)
        self.steps = 0
        self.history: list[Any] = []
        self.replacements: list[ReplacementRecord] = []
        self.buffer: list[Problem] = []  # past valid problems shown as prompt examples (prompt_examples)
        self.recent: list[tuple[int, str]] = []  # (step, question) asked in the last novelty_window steps
        self.questions: list[list[str]] = [[] for _ in range(teachers.pop_size)]  # every question each teacher asked
        # each member's sampling generator (sampler="member"), seeded by (seed, role, member)
        self.samplers: dict[str, list[torch.Generator]] = {
            n: [torch.Generator().manual_seed(member_seed(self.seed, n, i)) for i in range(self.population(n).pop_size)]
            for n in NAMES
        }
        self._synced = False

    def __getattr__(self, name: str) -> Any:
        """A config field read through the loop (``loop.interval`` is ``loop.config.interval``), as in 0.5.0."""
        config = self.__dict__.get("config")
        if config is not None and name in {f.name for f in dataclasses.fields(config)}:
            return getattr(config, name)
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    @property
    def _checkpoint_kind(self) -> str:  # type: ignore[override]
        """A file's kind: 0.5.0's two loops wrote "PopuLoRA" and "SelfPlay"; each mode keeps its own."""
        return "PopuLoRA" if self.config.update == "rl" else "SelfPlay"

    @classmethod
    def from_preset(
        cls,
        model: Any,
        tokenizer: Any,
        task: Task,
        config: PopuLoRAConfig = CPU_PRESET,
        *,
        seed: int | None = None,
        **legacy: Any,
    ) -> PopuLoRA:
        """Build both populations on ``model`` (``init_scale=0``: every individual starts as the base model) and
        the loop, from a config that sizes them (``teachers``, ``students``, ``rank``).

        ``seed`` (default ``config.seed``): teachers are seeded ``seed``, students ``seed + 1``, the loop
        ``seed``. ``legacy``: 0.5.0's loop keywords, deprecated. The whole config is checked before any
        population wraps the model; a refusal after that gives the model back unwrapped.
        """
        if not isinstance(config, PopuLoRAConfig):
            raise InvalidTypeError(f"`config` must be a PopuLoRAConfig, got {type(config).__name__}")
        config = config_from_legacy(PopuLoRAConfig, config, legacy, where="PopuLoRA.from_preset")
        if seed is not None:
            config = dataclasses.replace(config, seed=seed)
        missing = [n for n in ("teachers", "students", "rank") if getattr(config, n) is None]
        if missing:
            raise InvalidValueError(f"from_preset needs a config that sizes the populations: {missing} are None")
        check_generation_keys(config)
        targets = config.lora_targets
        if targets is None:
            from populora.llm.targets import LLAMA_ALL

            targets = LLAMA_ALL
        assert config.teachers is not None and config.students is not None and config.rank is not None
        with closing_on_failure() as undo:  # a refused option gives the model back unwrapped, its flags restored
            teachers = Population(model, config.teachers, config.rank, list(targets), init_scale=0, seed=config.seed)
            undo.callback(teachers.close)
            students = Population(
                model, config.students, config.rank, list(targets), init_scale=0, seed=config.seed + 1
            )
            undo.callback(students.close)
            return cls(teachers, students, tokenizer, task, config=config)

    def __repr__(self) -> str:
        c = self.config
        return (
            f"PopuLoRA(update={c.update!r}, teachers P={self.teachers.pop_size}, students P={self.students.pop_size}, "
            f"proposals={c.proposals}, attempts={c.attempts}, anchors={c.anchors}, "
            + (f"interval={c.interval}, evolve={c.evolve}, " if c.update == "rl" else "")
            + f"steps={self.steps})"
        )

    def family_of(self, problem: Problem) -> Task | None:
        """The member task ``problem`` belongs to (``None``: none of this loop's families)."""
        return next((f for f in self.families if f.name == problem.task), None)

    def distinct_asked(self) -> tuple[int, list[int]]:
        """Distinct questions the teachers had asked over the run: ``(all teachers, [per teacher])``."""
        return len({q for qs in self.questions for q in qs}), [len(set(qs)) for qs in self.questions]

    def population(self, name: str) -> Population:
        return self.teachers if name == "teachers" else self.students

    # ------------------------------------------------------------------ one step

    def step(self, distributed: bool = False) -> PopuLoRAOutcome:
        """One step of the loop (module docstring), all or nothing.

        Args:
            distributed: under ``torch.distributed``, with ``sampler="member"`` (either update): each rank
                generates, checks and trains its own members (module docstring), the same step as one process;
                with ``sampler="batch"`` (evolving only) the rows are shared out. Every rank must call it. Without
                a process group (or with one rank) the step runs locally.

        Returns:
            A :class:`PopuLoRAOutcome`; its record is appended to :attr:`history`.

        Raises:
            FitnessError: (evolve) a fitness ``evolve_`` could not use (nothing changed).
            InvalidValueError: ``distributed=True`` for an RL loop with ``sampler="batch"`` (nothing changed).
            RankFailure: (distributed) another rank failed in this step (every rank's step is rolled back).
        """
        use_dist = bool(distributed) and pd.is_distributed()
        if use_dist and self.config.update == "rl" and not self.by_member:
            raise InvalidValueError(
                "step(distributed=True) of an RL loop needs sampler='member' (members partitioned across the "
                "ranks); sampler='batch' shards rows only when evolving (update='evolve')"
            )
        if use_dist and not self._synced:
            self._sync_from_rank0()
        with transaction(
            self.teachers,
            self.students,
            *self.optimizers.values(),
            self.ratings,
            self.generator,
            *self.samplers["teachers"],
            *self.samplers["students"],
            Attributes(self, "steps", "history", "replacements", "buffer", "recent", "questions"),
        ):
            out = self._step(use_dist)
            if use_dist and self.by_member:
                pm.raise_if_any_failed(None, "the step")  # every rank got here: the step stands everywhere
            return out

    def _step(self, distributed: bool) -> PopuLoRAOutcome:
        r = Round()
        pair(self, r)
        with evaluating((self.teachers, self.students)):
            propose(self, r, distributed)
            verify(self, r)
            answer(self, r, distributed)
        score(self, r, distributed)
        rate(self, r)  # every write from here on is undone by step() if anything raises
        if distributed and self.by_member and self.config.update == "rl":
            pm.guarded(lambda: update(self, r, distributed), "the update")
        else:
            update(self, r, distributed)
        replace(self, r, distributed)
        record = record_of(self, r)
        remember(self, r)
        self.history.append(record)
        self.replacements.extend(r.replacements)
        self.steps += 1
        return PopuLoRAOutcome(
            opponents=r.opponents,
            families=[f.name for f in r.families],
            proposals=r.proposed.texts,
            problems=r.problems,
            valid=r.valid,
            solved=r.solved,
            teacher_rewards=r.teacher_rewards,
            tasks=r.tasks,
            answers=r.answered.texts,
            right=r.right,
            formed=r.formed,
            student_rewards=r.student_rewards,
            anchors=r.anchors,
            replacements=r.replacements,
            record=record,
            reserved=r.held,
            anchor_solved=r.anchor_solved,
            teacher_fitness=r.teacher_fitness,
            student_fitness=r.student_fitness,
            proposal_ids=r.proposed.reply_ids,
            answer_ids=r.answered.reply_ids,
        )

    @property
    def by_member(self) -> bool:
        """``sampler="member"``: members generate in blocks of their own; distributed, partitioned by member."""
        return self.config.sampler == "member"

    def generate(self, name: str, ids: list[int], texts: list[str], distributed: bool) -> Replies:
        """Row ``j`` (``texts[j]``) answered by member ``ids[j]`` of ``name``, by the config's sampler."""
        pop = self.population(name)
        kwargs = self.teacher_generate if name == "teachers" else self.student_generate
        if self.by_member:
            return generate_by_member(
                pop, self.tokenizer, ids, texts, self.samplers[name], kwargs, distributed, what=f"{name[:-1]} replies"
            )
        return generate_replies(pop, self.tokenizer, ids, texts, self.draw_seed(), kwargs, distributed)

    def noise_seed(self, name: str) -> int:
        """The seed of ``name``'s children's operator noise (with the step and the child: ``child_seed``)."""
        return member_seed(self.seed, f"{name}.children", 0)

    def _rows_of(self, name: str, optimizer: bool = True) -> list[Tensor]:
        """Every tensor with a row per member of ``name``: its adapter stacks and (``optimizer``) its
        optimizer's per-member state rows."""
        pop = self.population(name)
        params = [p.data for p in pop.adapter_parameters()]
        if not optimizer or name not in self.optimizers:
            return params
        return params + OptimizerRows(self.optimizers[name], pop.adapter_parameters()).rows

    def fetch_parents(self, name: str, plan: list[tuple[int, tuple[int, int]]]) -> list[int]:
        """(replacement, by member) Each child's parents' rows (adapter factors, optimizer state) sent from the
        parents' owners to the child's owner; returns the children this rank writes."""
        pm.raise_if_any_failed(None, f"replacing {name}")  # every rank is here before any row travels
        size = self.population(name).pop_size
        tensors = self._rows_of(name)
        for child, parents in plan:
            dst = pm.owner_of(child, size)
            for parent in dict.fromkeys(parents):
                pm.send_rows(tensors, parent, pm.owner_of(parent, size), dst, "replacement parents")
        mine = set(pm.member_block(size))
        return [child for child, _ in plan if child in mine]

    def consolidate_(self, name: str | None = None, *, optimizer: bool = True) -> None:
        """(by member, under torch.distributed) Every rank's copy of every member made its owner's: adapter
        factors, (``optimizer``) optimizer rows and members' generators, each block broadcast from its owner.
        Collective: every rank calls it. :meth:`state_dict` runs it, so a checkpoint is complete."""
        if not (pd.is_distributed() and pd.world_size() > 1):
            return
        pm.raise_if_any_failed(None, "gathering the members")
        for n in NAMES if name is None else (name,):
            size = self.population(n).pop_size
            states = torch.stack([g.get_state() for g in self.samplers[n]])
            tensors = [*self._rows_of(n, optimizer), states]
            for rank in range(pd.world_size()):
                pm.broadcast_rows_(tensors, pm.member_block(size, rank, pd.world_size()), rank, "consolidation")
            for g, state in zip(self.samplers[n], states):
                g.set_state(state.clone())

    def draw_seed(self) -> int:
        """A sampling seed from the loop's generator (one per routed generate)."""
        return int(torch.randint(0, 2**62, (), generator=self.generator))

    def checked_fitness(self, name: str, f: Tensor) -> Tensor:
        try:
            return self.population(name).validate_fitnesses(f)
        except (FitnessError, TypeError, ValueError) as error:
            raise FitnessError(f"fitness of the {name} is invalid: {error}") from error

    def rl_step(
        self, name: str, replies: Replies, ids: list[int], rewards: Tensor, groups: Tensor, distributed: bool = False
    ) -> int:
        """One REINFORCE++ step of ``name`` on its rows; returns the reply tokens trained (0: no step taken).

        The advantages are computed on every row (every rank holds every reward, in the one-process row order);
        distributed (by member), each rank trains its own members' rows and steps its optimizer (members it
        does not own take a zero-gradient step there: their rows are their owner's)."""
        c = self.config
        adv = _zero_where_centred_zero(rewards.double(), groups)
        if c.kl_coef == 0 and not bool((adv != 0).any()):
            return 0  # no signal: no optimizer step (Adam's momentum alone would still move the adapters)
        pop = self.population(name)
        rows = list(range(len(ids)))
        if self.by_member and distributed:  # this rank's members' rows: all of each member's rows
            block = set(pm.member_block(pop.pop_size))
            rows = [j for j, i in enumerate(ids) if i in block]
        model = pop.model
        training = model.training
        model.eval()  # replies were generated without dropout
        try:
            policy_gradient_step_(
                pop,
                self.optimizers[name],
                [replies.prompt_ids[j] for j in rows],
                [replies.reply_ids[j] for j in rows],
                [ids[j] for j in rows],
                adv[rows],
                PolicyGradient(
                    pad_id=self.pad_id,
                    micro_batch=c.micro_batch,
                    reduction="token_mean",
                    kl_coef=c.kl_coef,
                    max_grad_norm=c.max_grad_norm,
                ),
                distributed=False,  # a member's rows are all on its owner: its normaliser and step are local
                by_member=self.by_member,
            )
        finally:
            model.train(training)
        return int(sum(len(t) for t, x in zip(replies.reply_ids, adv.tolist()) if x != 0 or c.kl_coef > 0))

    def student_policy_gradient_step(
        self, ids: list[int], prompts: list[list[int]], replies: list[list[int]], right: Tensor, use_dist: bool
    ) -> None:
        """Evolve's ``student_pg_lr`` step: plain SGD on each student's baseline-subtracted REINFORCE loss of its
        own answers (``reduction="sequence_mean"``); distributed, each rank its share of the rows."""
        adv = advantages(right.double(), groups=ids, method="baseline")
        rows = list(pd.partition(len(ids), pd.process_rank(), pd.world_size())) if use_dist else list(range(len(ids)))
        if self.by_member and use_dist:  # this rank's members' rows; each member's step is local
            block = set(pm.member_block(self.students.pop_size))
            rows = [j for j, i in enumerate(ids) if i in block]
        model = self.students.model
        training = model.training
        model.eval()  # the answers were generated without dropout
        try:
            policy_gradient_step_(
                self.students,
                torch.optim.SGD(self.students.adapter_parameters(), lr=self.config.student_pg_lr),
                [prompts[j] for j in rows],
                [replies[j] for j in rows],
                [ids[j] for j in rows],
                adv[rows],
                PolicyGradient(pad_id=self.pad_id, micro_batch=self.config.micro_batch, reduction="sequence_mean"),
                distributed=use_dist and not self.by_member,
                by_member=self.by_member,
            )
        finally:
            model.train(training)

    def run(
        self,
        budget: int | Budget | None = None,
        *,
        callback: Callable[[Any], Any] | None = None,
        progress: bool = False,
        distributed: bool = False,
        **legacy: Any,
    ) -> list[Any]:
        """:meth:`step` until ``budget`` is spent (an int: steps; a :class:`~populora.loops.base.Budget`: steps
        and / or seconds, whichever comes first; at least one step runs) or ``callback`` says stop.

        Args:
            budget: steps (int) or a ``Budget(max_steps=, max_seconds=)``.
            callback: ``callback(record)`` after every step; ``None`` / ``False`` continue, ``True`` stops,
                anything else raises ``InvalidTypeError`` naming the callback and the value.
                ``record.as_dict()`` is numbers only: one line of logging.
            progress: a tqdm bar (main rank) over the budget closest to running out.
            distributed: passed to :meth:`step` (``max_seconds`` then judged by rank 0's clock).
            legacy: 0.5.0's ``steps=`` / ``max_seconds=`` (deprecated: pass ``budget``).

        Returns:
            The records of this call's steps (also appended to :attr:`history`).
        """
        if legacy:
            budget = _legacy_budget(budget, legacy)
        use_dist = bool(distributed) and pd.is_distributed()
        rl = self.config.update == "rl"

        def postfix(record: Any) -> dict[str, str]:
            if rl:
                return {"students": f"{record.student_reward:.3g}", "teachers": f"{record.teacher_reward:.3g}",
                        "validity": f"{record.validity:.2f}"}  # fmt: skip
            return {"students": f"{record.student_mean:.3g}", "teachers": f"{record.teacher_mean:.3g}",
                    "validity": f"{record.validity:.2f}"}  # fmt: skip

        return run_steps(
            lambda: self.step(distributed=distributed),
            lambda: self.history,
            budget,
            callback,
            progress,
            where="PopuLoRA.run",
            desc="self-play",
            postfix=postfix,
            main_rank=pd.is_main_rank(),
            sync_seconds=(lambda s: float(pd.broadcast_object(s))) if use_dist else None,
        )

    # ------------------------------------------------------------------ evaluation

    def solve_rate(
        self,
        problems: Sequence[Problem],
        individuals: Sequence[int] | None = None,
        *,
        population: str = "students",
        prompt: Phrasing | None = None,
        max_new_tokens: int | None = None,
        batch_size: int = 64,
    ) -> Tensor:
        """Greedy ``(m, n)`` bool: individual ``individuals[i]`` of ``population`` answers ``problems[j]``.

        For held-out and validation sets (:func:`solve_rate`): the students' generate options with sampling
        off; ``prompt``: the user message of a problem (default the task's template); ``max_new_tokens``:
        default the students' training length. Changes no state (no generator is advanced).
        """
        population = check_one_of("population", population, NAMES)
        pop = self.population(population)
        ids = (
            list(range(pop.pop_size))
            if individuals is None
            else [check_index("individuals", i, pop.pop_size) for i in individuals]
        )
        problems = list(problems)
        if not all(isinstance(p, Problem) for p in problems):
            raise InvalidTypeError("`problems` must be a sequence of populora.tasks.Problem")
        return solve_rate(
            pop,
            self.tokenizer,
            problems,
            ids,
            prompt=self.task.prompt if prompt is None else prompt,
            chat=self.chat,
            max_new_tokens=max_new_tokens or int(self.student_generate.get("max_new_tokens", 24)),
            batch_size=batch_size,
            generate=self.student_generate,
            check=lambda ps, rs: check_answers(self.task, ps, rs),
        )

    # ------------------------------------------------------------------ distributed

    def _sync_from_rank0(self) -> None:
        """Every rank starts from rank 0's populations, generator, ratings, step and history."""
        self.teachers.sync_from_main_rank_(name="teachers")
        self.students.sync_from_main_rank_(name="students")
        small: dict[str, Any] = pd.broadcast_object(
            {
                "generator": self.generator.get_state(),
                "ratings": self.ratings.state_dict(),
                "steps": self.steps,
                "history": [r.as_dict() for r in self.history],
                "samplers": {n: [g.get_state() for g in gs] for n, gs in self.samplers.items()},
            }
        )
        self.generator.set_state(small["generator"])
        for n, states in small["samplers"].items():
            for g, state in zip(self.samplers[n], states):
                g.set_state(state)
        self.ratings.load_state_dict(small["ratings"])
        self.steps = small["steps"]
        self.history = [self._record_type().from_dict(d) for d in small["history"]]
        self._synced = True

    def _record_type(self) -> type[PopuLoRARecord] | type[SelfPlayRecord]:
        return PopuLoRARecord if self.config.update == "rl" else SelfPlayRecord

    # ------------------------------------------------------------------ state

    def state_dict(self) -> dict[str, Any]:
        """Everything an exact resume needs but the base model and tokenizer (copies, CPU tensors), with the
        config (``config.to_dict()``) and every member's generator.

        After a distributed step (``sampler="member"``) this is collective: every rank calls it, each member's
        rows (adapters, optimizer state, generator) are first gathered from its owner (:meth:`consolidate_`),
        and every rank gets the same, complete state: a file any world size resumes."""
        if self._synced and self.by_member:
            self.consolidate_()
        return {
            "format": FORMAT,
            "config": self.config.to_dict(),
            "steps": self.steps,
            "seed": self.seed,
            "generator": self.generator.get_state().clone(),
            "teachers": self.teachers.snapshot("cpu"),
            "students": self.students.snapshot("cpu"),
            "optimizers": {n: copy.deepcopy(o.state_dict()) for n, o in self.optimizers.items()},
            "ratings": self.ratings.state_dict(),
            "history": [r.as_dict() for r in self.history],
            "replacements": [r.as_dict() for r in self.replacements],
            "buffer": [(p.task, self.family_of(p).proposal_line(p)) for p in self.buffer],  # type: ignore[union-attr]
            "recent": [list(x) for x in self.recent],
            "questions": [list(qs) for qs in self.questions],
            "samplers": {n: [g.get_state().clone() for g in gs] for n, gs in self.samplers.items()},
        }

    def save(self, path: str | Path) -> Path:
        """Write :meth:`state_dict` atomically. After a distributed step (``sampler="member"``) it is collective:
        every rank gathers the complete state, the main rank alone writes it, and a failure to write is raised on
        every rank."""
        if not (self._synced and self.by_member and pd.is_distributed() and pd.world_size() > 1):
            return super().save(path)
        state = self.state_dict()
        error = (
            pm.capture(lambda: atomic_save(state, path, kind=self._checkpoint_kind))[1] if pd.is_main_rank() else None
        )
        pm.raise_if_any_failed(error, f"saving {str(path)!r}")
        return Path(path)

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore :meth:`state_dict` (or a file of 0.5.0's loop of this mode); every part is checked before
        anything is written.

        Raises:
            CheckpointError: not a state of this loop's mode, a state written with another config (the field
                is named), a missing key or a part that does not fit (nothing changed).
        """
        mode = self.config.update
        what = "PopuLoRA" if mode == "rl" else "populora self-play"
        fmt = state.get("format") if isinstance(state, Mapping) else None
        if fmt not in (FORMAT, FORMAT_060, FORMAT_050[mode]):
            raise CheckpointError(
                f"not a {what} checkpoint (format {fmt!r:.60}; this loop reads {FORMAT!r}, {FORMAT_060!r} and "
                f"0.5.0's {FORMAT_050[mode]!r})"
            )
        ours = fmt in (FORMAT, FORMAT_060)
        keys = ["steps", "generator", "teachers", "students", "ratings", "history"]
        keys += ["optimizers", "replacements"] if mode == "rl" or ours else []
        keys += ["config"] if ours else []
        keys += ["samplers"] if fmt == FORMAT else []
        missing = [key for key in keys if key not in state]
        if missing:
            raise CheckpointError(f"the {what} state lacks the key(s) {missing}")
        if ours:
            # the seed only seeded the generators the state restores: another seed resumes the same run; a /2
            # file had no sampler (it sampled as "batch" does) and continues with this loop's
            ignore = ("seed",) if fmt == FORMAT else ("seed", "sampler")
            self.config.check_matches(state["config"], f"the {what} state", ignore=ignore)
        steps = state["steps"]
        if not is_int(steps) or steps < 0:
            raise CheckpointError(f"the {what} state's 'steps' must be an int >= 0, got {steps!r}")
        probe = torch.Generator()
        try:
            probe.set_state(state["generator"])
        except (TypeError, RuntimeError, ValueError) as error:
            raise CheckpointError(f"the {what} state's 'generator' is not a generator state: {error}") from None
        history = _checked_history(state["history"], int(steps), self._record_type(), what)
        try:
            replacements = [ReplacementRecord.from_dict(r) for r in state.get("replacements", [])]
        except (TypeError, ValueError) as error:
            raise CheckpointError(f"the {what} state's replacements are malformed: {error}") from None
        opts = state.get("optimizers", {})
        if not isinstance(opts, Mapping) or sorted(opts) != sorted(self.optimizers):
            raise CheckpointError(f"the {what} state's 'optimizers' must map {sorted(self.optimizers)}")
        buffer, recent, questions = self._checked_memory(state, what)
        samplers = self._checked_samplers(state.get("samplers"), what)
        checked = {n: self.population(n).check_state_dict(state[n]) for n in NAMES}
        with transaction(self.ratings, *self.optimizers.values()):
            self.ratings.load_state_dict(state["ratings"])
            try:
                for n, opt in self.optimizers.items():
                    opt.load_state_dict(copy.deepcopy(opts[n]))
            except (KeyError, TypeError, ValueError, RuntimeError) as error:
                raise CheckpointError(f"the {what} state's optimizer state does not fit: {error}") from None
        self.teachers.load_checked_state_dict(checked["teachers"])
        self.students.load_checked_state_dict(checked["students"])
        self.generator.set_state(probe.get_state())
        for n, states in samplers.items():
            for g, st in zip(self.samplers[n], states):
                g.set_state(st)
        self.history, self.replacements = history, replacements
        self.buffer, self.recent, self.questions = buffer, recent, questions
        self.steps = int(steps)

    def _checked_samplers(self, stored: Any, what: str) -> dict[str, list[Tensor]]:
        """The members' generator states of a state (``None``, a file before /3: each member's generator
        starts as a fresh loop's, from ``(seed, role, member)``)."""
        if stored is None:
            return {
                n: [torch.Generator().manual_seed(member_seed(self.seed, n, i)).get_state() for i in range(len(gs))]
                for n, gs in self.samplers.items()
            }
        if not isinstance(stored, Mapping) or sorted(stored) != sorted(NAMES):
            raise CheckpointError(f"the {what} state's 'samplers' must map {list(NAMES)} to generator states")
        out: dict[str, list[Tensor]] = {}
        for n in NAMES:
            states = stored[n]
            size = self.population(n).pop_size
            if not isinstance(states, (list, tuple)) or len(states) != size:
                raise CheckpointError(
                    f"the {what} state's 'samplers[{n!r}]' must hold {size} generator states (one per member), "
                    f"got {len(states) if isinstance(states, (list, tuple)) else type(states).__name__}"
                )
            probe = torch.Generator()
            try:
                for st in states:
                    probe.set_state(st)
            except (TypeError, RuntimeError, ValueError) as error:
                raise CheckpointError(
                    f"the {what} state's 'samplers[{n!r}]' holds a bad generator state: {error}"
                ) from None
            out[n] = [st.clone() for st in states]
        return out

    def _checked_memory(self, state: Mapping[str, Any], what: str) -> tuple[list[Problem], list, list[list[str]]]:
        """The state's examples' buffer (re-read through each family's verifier), recent window and questions."""
        p_t = self.teachers.pop_size
        try:
            buffer = []
            for name, line in state.get("buffer", []):
                family = next(f for f in self.families if f.name == name)
                problem = family.parse_proposal(f"Problem: {line}")
                if problem is None:
                    raise ValueError(f"{name!r} reads no problem from {line!r:.60}")
                buffer.append(problem)
            recent = [(check_int("step", s, low=0), str(q)) for s, q in state.get("recent", [])]
            questions = [[str(q) for q in qs] for qs in state.get("questions", [[] for _ in range(p_t)])]
        except (StopIteration, TypeError, ValueError) as error:
            raise CheckpointError(f"the {what} state's examples' buffer or questions are malformed: {error}") from None
        if len(questions) != p_t:
            raise CheckpointError(f"the {what} state's 'questions' must hold {p_t} lists (one per teacher)")
        return buffer, recent, questions


def member_seed(seed: int, role: str, member: int) -> int:
    """The seed of ``role``'s member ``member``'s generator in a loop seeded ``seed`` (a stable 63-bit hash)."""
    import hashlib

    digest = hashlib.sha256(f"populora.member/{int(seed)}/{role}/{int(member)}".encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1


def _checked_history(rows: Any, steps: int, kind: type[PopuLoRARecord] | type[SelfPlayRecord], what: str) -> list[Any]:
    """A state's ``history`` as records, every field checked; their steps increase and stay below ``steps``."""
    if not isinstance(rows, (list, tuple)):
        raise CheckpointError(
            f"the {what} state's 'history' must be a list of {kind.__name__} dicts, got {type(rows).__name__}"
        )
    history: list[Any] = []
    for i, row in enumerate(rows):
        try:
            record = kind.from_dict(dict(row) if isinstance(row, Mapping) else row)
        except (TypeError, ValueError) as error:
            raise CheckpointError(f"the {what} state's 'history' entry {i} is malformed: {error}") from None
        last = history[-1].step if history else -1
        if not last < record.step < steps:
            raise CheckpointError(
                f"the {what} state's 'history' entry {i} has step={record.step}: the steps of the history "
                f"must increase (the entry before has step={last}) and stay below the state's steps={steps}"
            )
        history.append(record)
    if kind is PopuLoRARecord and [r.step for r in history] != list(range(steps)):
        raise CheckpointError(f"the {what} state's history must hold steps 0 .. {steps - 1}")
    return history


def _legacy_budget(budget: Any, legacy: dict[str, Any]) -> Budget:
    """0.5.0's ``run(steps=, max_seconds=)`` as a Budget, with a DeprecationWarning."""
    import warnings

    unknown = sorted(set(legacy) - {"steps", "max_seconds"})
    if unknown:
        raise InvalidTypeError(f"PopuLoRA.run got an unexpected keyword argument {unknown[0]!r}")
    if budget is not None and "steps" in legacy:
        raise InvalidValueError("pass the steps once: `budget` or 0.5.0's `steps=`, not both")
    warnings.warn(
        "run(steps=, max_seconds=) is deprecated since 0.6.0 and goes in 0.7.0: pass "
        "budget=Budget(max_steps=, max_seconds=) (or an int of steps)",
        DeprecationWarning,
        stacklevel=3,
    )
    steps = legacy.get("steps", budget)
    if isinstance(steps, Budget):
        return dataclasses.replace(steps, max_seconds=legacy.get("max_seconds"))
    if steps is None and legacy.get("max_seconds") is None:
        raise InvalidValueError("PopuLoRA.run needs `budget` (steps or a Budget): it would never stop")
    return Budget(max_steps=steps, max_seconds=legacy.get("max_seconds"))


def SelfPlay(
    teachers: Population,
    students: Population,
    tokenizer: Any,
    task: Task,
    ratings: Ratings | None = None,
    config: PopuLoRAConfig | None = None,
    **legacy: Any,
) -> PopuLoRA:
    """The evolution-only loop: :class:`PopuLoRA` with :data:`SELFPLAY_PRESET` (or ``config``).

    Both populations evolve every step (``Population.evolve_`` on their fitnesses), greedy students answer the
    valid proposals and ``anchors`` task-sampled problems; see :class:`PopuLoRAConfig` (``update="evolve"``).
    0.5.0's keywords (``proposals=``, ``pg_micro_batch=``, ``evolve_kwargs=``, ...) still work for one release,
    deprecated, applied over the config.
    """
    base = SELFPLAY_PRESET if config is None else config
    config = config_from_legacy(
        PopuLoRAConfig, base, legacy, where="SelfPlay", renamed={"pg_micro_batch": "micro_batch"}
    )
    return PopuLoRA(teachers, students, tokenizer, task, ratings, config)
