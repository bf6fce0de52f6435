"""SelfPlay: teacher and student LoRA populations on one frozen LLM (PopuLoRA's setting).

Each :meth:`SelfPlay.step`:

1. matchmaking pairs every teacher with a student (``Ratings.pair``,
   prioritised fictitious self-play by default, drawn from SelfPlay's own
   generator);
2. the teachers propose ``proposals`` problems each in ONE routed
   ``teachers.generate`` call (the task's proposal prompt in the chat
   template, sampled, reproducible from SelfPlay's generator);
3. the verifier (``Task.parse_proposal``) turns each proposal into a
   :class:`~populora.tasks.Problem` or rejects it;
4. the matched students answer the valid problems, plus ``anchors``
   task-sampled problems each (the same for every student), in ONE routed
   ``students.generate`` call (greedy by default; ``attempts`` sampled
   answers per problem when asked);
5. fitnesses follow :func:`~populora.loops.selfplay.scores.selfplay_fitnesses`
   (student: fraction of its answers right; teacher: valid problems its
   student failed, or AZR's learnability);
6. every valid problem is a rated match (teacher wins when the student fails,
   :func:`~populora.loops.selfplay.scores.match_scores`);
7. (optional, ``student_pg_lr > 0``) every student takes a policy-gradient step
   on its own answers (PopuLoRA's hybrid, through
   :func:`populora.train.policy_gradient_step_`); then each population evolves one
   generation (``evolve_kwargs`` per population);
8. the ratings follow the culled slots (``Ratings.follow_``).

Distributed (``step(distributed=True)`` under torchrun): each rank generates
its contiguous share of the teacher rows, then of the student rows; the
replies are gathered on every rank, so every rank verifies the same texts,
derives the same fitnesses and ratings and evolves in lockstep (bitwise-equal
adapters). At the first distributed step rank 0's populations, generator,
ratings, step and history are broadcast. Sampled tokens depend on which rows
share a batch, so a distributed run is reproducible (same seed, same world
size) but not token-equal to a one-process run.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from populora import distributed as pd
from populora.checks import check_float, check_index, check_int, check_one_of, check_seed, is_int
from populora.errors import CheckpointError, FitnessError, InvalidTypeError, InvalidValueError
from populora.llm.text import chat_text, generate_replies, pad_id
from populora.loops.base import callback_says_stop
from populora.loops.coevolve.specs import check_evolve_kwargs
from populora.loops.ratings import PAIRING_MODES, Ratings
from populora.loops.selfplay.checks import check_players
from populora.loops.selfplay.scores import TEACHER_REWARDS, SelfPlayRecord, match_scores, selfplay_fitnesses
from populora.population.population import Population, evaluating
from populora.snapshots import Snapshot
from populora.stats import BudgetProgress
from populora.tasks import Problem, Task
from populora.train import advantages, policy_gradient_step_
from populora.transaction import Attributes, transaction

__all__ = ["MATCHMAKING", "SelfPlay", "SelfPlayOutcome", "SelfPlayRecord", "selfplay_fitnesses"]

_FORMAT = "populora.selfplay/1"
NAMES = ("teachers", "students")
MATCHMAKING = PAIRING_MODES
_ROUTING = (
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


@dataclass(frozen=True)
class SelfPlayOutcome:
    """What one :meth:`SelfPlay.step` saw and decided.

    Attributes:
        opponents: ``(p_t,)`` the student matched with each teacher.
        proposals: the teachers' decoded proposals, rows ``(p_t k)`` (teacher ``i``'s at ``i*k .. i*k+k-1``).
        problems: the verified problem of each proposal, ``None`` where rejected (same order).
        valid: ``(p_t, k)`` bool.
        solved: ``(p_t, k, a)`` bool, the matched student's attempts (False where invalid).
        anchors: the step's anchor problems (the same for every student).
        anchor_solved: ``(p_s, m, a)`` bool.
        teacher_fitness / student_fitness: ``(p_t,)`` / ``(p_s,)`` float32, as the populations evolved on them.
        record: the step's :class:`SelfPlayRecord` (also appended to ``history``).
        answers: the students' decoded answers: ``a`` per valid problem (in proposal order), then
            ``a`` per anchor for student 0, 1, ...
    """

    opponents: Tensor
    proposals: list[str]
    problems: list[Problem | None]
    valid: Tensor
    solved: Tensor
    anchors: list[Problem]
    anchor_solved: Tensor
    teacher_fitness: Tensor
    student_fitness: Tensor
    record: SelfPlayRecord
    answers: list[str]


def _check_generate_kwargs(name: str, value: Any, defaults: dict[str, Any]) -> dict[str, Any]:
    if value is None:
        return dict(defaults)
    if not isinstance(value, Mapping):
        raise InvalidTypeError(f"`{name}` must be a dict of generate() options, got {type(value).__name__}")
    bad = [k for k in value if k in _ROUTING]
    if bad:
        raise InvalidValueError(f"`{name}` may not set {bad}: SelfPlay routes the rows and seeds the sampling itself")
    return {**defaults, **value}


class SelfPlay(Snapshot):
    """Teachers propose problems, a verifier filters them, matched students solve them; both evolve.

    Args:
        teachers: the teacher :class:`Population`.
        students: the student :class:`Population`, on the SAME base model
            (``teachers.model is students.model``), another object.
        tokenizer: a Hugging Face tokenizer (``__call__``, ``decode``,
            ``apply_chat_template`` when ``chat``, and a pad or eos id).
        task: a :class:`~populora.tasks.Task`: its ``proposal_prompt`` asks
            the teachers, ``parse_proposal`` verifies their proposals,
            ``prompt`` / ``Problem.check`` ask and check the students, and
            ``sample`` draws the anchors.
        ratings: a :class:`~populora.loops.ratings.Ratings` over
            ``{'teachers': p_t, 'students': p_s}`` (default: a new one).
        proposals: ``k >= 1`` problems each teacher proposes per step.
        anchors: ``m >= 0`` task-sampled problems every student also answers
            per step, so that a student whose teachers proposed nothing valid
            (or that no teacher was matched with) is still scored. They do
            not count for the teachers and are no rated match.
        attempts: ``a >= 1`` answers per student and problem (``a >= 2``
            needs sampling: ``student_generate=dict(do_sample=True)``).
        teacher_reward: ``'failures'`` (valid problems the student failed) or
            ``'learnability'`` (AZR's ``1 - s`` for a solve rate ``0 < s < 1``,
            needs ``attempts >= 2``); see :func:`selfplay_fitnesses`.
        matchmaking: ``Ratings.pair`` mode: ``'pfsp'``, ``'pfsp_hard'``, ``'uniform'`` or
            ``'round_robin'`` (rotated by the step count).
        teacher_generate: ``model.generate`` options of the teachers (default
            ``max_new_tokens=48, do_sample=True, temperature=1.0``).
        student_generate: options of the students (default
            ``max_new_tokens=24, do_sample=False``: greedy).
        chat: wrap every prompt in the tokenizer's chat template.
        student_pg_lr: ``> 0`` turns on PopuLoRA's hybrid: before ``evolve_``, every
            student takes one plain SGD step (no momentum, so SelfPlay keeps no
            optimizer state) of learning rate ``student_pg_lr`` on the REINFORCE
            loss of its own answers of the step:
            ``-mean_j A_j * mean_t log p(reply_jt)`` over its answers ``j``, with
            reward 1 right / 0 wrong and advantage ``A_j`` the reward minus the
            student's mean reward of the step (so a student whose answers all
            scored alike does not move), in eval mode
            (:func:`populora.train.policy_gradient_step_` with
            ``reduction="sequence_mean"``; under ``step(distributed=True)`` each
            rank differentiates its share of the answers and the gradients are
            summed). ``0`` (default): evolution only.
        pg_micro_batch: rows per forward / backward of that step.
        evolve_kwargs: ``{'teachers': {...}, 'students': {...}}``, options of each ``evolve_``.
        seed: seeds SelfPlay's generator (matchmaking, sampling seeds, anchors).

    Attributes:
        history: one :class:`SelfPlayRecord` per step.
        steps: completed steps.
        generator: SelfPlay's ``torch.Generator``.

    Checkpoints: :meth:`state_dict` / :meth:`load_state_dict` (both
    populations' adapters, generators and counters, the ratings, the
    generator, ``steps`` and ``history``; no base model) and ``save`` /
    ``load`` for files; a loaded run continues bit for bit.

    Raises:
        InvalidTypeError: an argument of the wrong type.
        InvalidValueError: populations on different models (or the same
            population twice, or a spent one), ratings that do not hold
            ``teachers`` / ``students`` of the populations' sizes, an option
            out of range, ``learnability`` with one attempt, several greedy
            attempts, routing options in the generate options.
    """

    _checkpoint_kind = "SelfPlay"

    def __init__(
        self,
        teachers: Population,
        students: Population,
        tokenizer: Any,
        task: Task,
        ratings: Ratings | None = None,
        *,
        proposals: int = 2,
        anchors: int = 4,
        attempts: int = 1,
        teacher_reward: str = "failures",
        matchmaking: str = "pfsp",
        teacher_generate: Mapping[str, Any] | None = None,
        student_generate: Mapping[str, Any] | None = None,
        chat: bool = True,
        student_pg_lr: float = 0.0,
        pg_micro_batch: int = 8,
        evolve_kwargs: Mapping[str, Mapping[str, Any]] | None = None,
        seed: int = 0,
    ):
        ratings, pad, chat = check_players(teachers, students, tokenizer, task, ratings, chat, Ratings)
        self.proposals = check_int("proposals", proposals, low=1)
        self.anchors = check_int("anchors", anchors, low=0)
        self.attempts = check_int("attempts", attempts, low=1)
        self.teacher_reward = check_one_of("teacher_reward", teacher_reward, TEACHER_REWARDS)
        self.matchmaking = check_one_of("matchmaking", matchmaking, MATCHMAKING)
        self.teacher_generate = _check_generate_kwargs(
            "teacher_generate", teacher_generate, dict(max_new_tokens=48, do_sample=True, temperature=1.0)
        )
        self.student_generate = _check_generate_kwargs(
            "student_generate", student_generate, dict(max_new_tokens=24, do_sample=False)
        )
        for options in (self.teacher_generate, self.student_generate):
            options.setdefault("pad_token_id", pad)
        if self.teacher_reward == "learnability" and self.attempts < 2:
            raise InvalidValueError(
                "teacher_reward='learnability' needs attempts >= 2 (a solve rate strictly "
                f"between 0 and 1), got attempts={self.attempts}"
            )
        if self.attempts > 1 and not self.student_generate.get("do_sample", False):
            raise InvalidValueError(
                f"attempts={self.attempts} with greedy students gives {self.attempts} identical "
                "answers: pass student_generate=dict(do_sample=True)"
            )
        populations = dict(zip(NAMES, (teachers, students)))
        self.evolve_kwargs: dict[str, dict[str, Any]] = check_evolve_kwargs(evolve_kwargs, populations)
        self.student_pg_lr = check_float("student_pg_lr", student_pg_lr, low=0.0)
        self.pg_micro_batch = check_int("pg_micro_batch", pg_micro_batch, low=1)
        self.seed = check_seed("seed", seed)
        self.teachers, self.students, self.ratings = teachers, students, ratings
        self.tokenizer, self.task = tokenizer, task
        self.chat = chat
        self.generator = torch.Generator().manual_seed(self.seed)
        self.steps = 0
        self.history: list[SelfPlayRecord] = []
        self._synced = False

    def __repr__(self) -> str:
        return (
            f"SelfPlay(teachers P={self.teachers.pop_size}, students P={self.students.pop_size}, "
            f"task={getattr(self.task, 'name', type(self.task).__name__)!r}, proposals={self.proposals}, "
            f"anchors={self.anchors}, attempts={self.attempts}, teacher_reward={self.teacher_reward!r}, "
            f"steps={self.steps})"
        )

    # ------------------------------------------------------------------ one step

    def step(self, distributed: bool = False) -> SelfPlayOutcome:
        """One round of self-play and one generation of each population (see the module docstring).

        Args:
            distributed: under ``torch.distributed``, share the generation among
                the ranks (each its contiguous share of the rows; replies gathered
                on every rank); every rank then evolves in lockstep. Without a
                process group (or with one rank) the step runs locally.

        Returns:
            A :class:`SelfPlayOutcome`; its ``record`` is appended to :attr:`history`.

        All or nothing, at every step: if the step raises (a generate call, the
        verifier, the policy-gradient step, ``evolve_``, the ratings), both
        populations (adapters, generators, counters, history), the ratings and
        SelfPlay's generator are restored to where they were before it, so a
        retry draws the same matches and sampling seeds and gives what the step
        would have given (``steps`` and ``history`` are only written once the
        step has succeeded).

        Raises:
            FitnessError: a fitness could not be used by ``evolve_`` (nothing evolved).
            RuntimeError: (distributed) on every rank when generation fails on one.
        """
        use_dist = bool(distributed) and pd.is_distributed()
        if use_dist and not self._synced:
            self._sync_from_rank0()
        pops = {"teachers": self.teachers, "students": self.students}
        # every write of a step is undone if it raises (copies: the live adapters are updated in place)
        # (the generator too: a retry draws the same matches and seeds)
        with transaction(*pops.values(), self.ratings, self.generator, Attributes(self, "steps", "history")):
            return self._step(use_dist)

    def run(
        self,
        steps: int | None = None,
        *,
        max_seconds: float | None = None,
        callback: Callable[[SelfPlayRecord], Any] | None = None,
        progress: bool = False,
        distributed: bool = False,
    ) -> list[SelfPlayRecord]:
        """:meth:`step` in a loop: ``steps`` steps, or until ``max_seconds`` have passed, whichever comes first.

        Args:
            steps: steps to run at most (``None``: until ``max_seconds``).
            max_seconds: stop after the first step that ends this many wall-clock seconds or more after the
                call (rank 0's clock under ``distributed``, so every rank stops together); at least one step runs.
            callback: ``callback(record)`` after every step (the step's :class:`SelfPlayRecord`, also appended to
                :attr:`history`); it returns ``None`` or ``False`` to go on and ``True`` to stop, and any other value
                (a list, ``1``) raises ``InvalidTypeError`` (:func:`populora.loops.base.callback_says_stop`).
                ``record.as_dict()`` is numbers only, so
                logging is one line, e.g. ``writer.add_scalars("selfplay", record.as_dict(), record.step)``.
            progress: a tqdm bar (main rank) over the steps or the seconds, whichever budget is closer to
                running out, with the students' and teachers' mean fitness and the validity rate.
            distributed: passed to :meth:`step`.

        Returns:
            The records of this call's steps.

        Raises:
            InvalidValueError / InvalidTypeError: neither ``steps`` nor ``max_seconds``, a bad value, or a
                ``callback`` that is not callable (before any step), or a callback that returned something other
                than ``None``, ``False`` or ``True``.
        """
        if steps is None and max_seconds is None:
            raise InvalidValueError("SelfPlay.run needs `steps` or `max_seconds` (or both): it would never stop")
        steps = None if steps is None else check_int("steps", steps, low=1)
        max_seconds = None if max_seconds is None else check_float("max_seconds", max_seconds, low=0.0, low_open=True)
        if callback is not None and not callable(callback):
            raise InvalidTypeError(f"`callback` must be callable as callback(record), got {callback!r:.80}")
        started = time.monotonic()
        use_dist = bool(distributed) and pd.is_distributed()
        bar = BudgetProgress(
            {"seconds": max_seconds, "steps": steps}, show=bool(progress) and pd.is_main_rank(), desc="self-play"
        )
        records: list[SelfPlayRecord] = []
        try:
            while True:
                record = self.step(distributed=distributed).record
                records.append(record)
                elapsed = time.monotonic() - started
                if use_dist and max_seconds is not None:  # every rank judges the time by rank 0's clock
                    elapsed = float(pd.broadcast_object(elapsed))
                post = dict(students=f"{record.student_mean:.3g}", teachers=f"{record.teacher_mean:.3g}")
                post["validity"] = f"{record.validity:.2f}"
                bar.update({"steps": len(records), "seconds": elapsed}, post)
                stop = callback is not None and callback_says_stop(callback, callback(record))
                if stop or bar.spent():
                    return records
        finally:
            bar.close()

    def _step(self, use_dist: bool) -> SelfPlayOutcome:
        t_pop, s_pop = self.teachers, self.students
        p_t, p_s, k, a = t_pop.pop_size, s_pop.pop_size, self.proposals, self.attempts
        tokens, seconds = 0, 0.0
        opponents = torch.as_tensor(
            self.ratings.pair("teachers", "students", self.generator, mode=self.matchmaking, offset=self.steps),
            dtype=torch.long,
        ).cpu()
        with self._evaluating():
            # teachers: one routed generate over p_t * k rows of the same proposal prompt
            prompt = chat_text(self.tokenizer, self.task.proposal_prompt(), self.chat)
            start = time.perf_counter()
            proposed = generate_replies(
                t_pop,
                self.tokenizer,
                torch.arange(p_t).repeat_interleave(k).tolist(),
                [prompt] * (p_t * k),
                self._draw_seed(),
                self.teacher_generate,
                use_dist,
            )
            seconds += time.perf_counter() - start
            tokens += proposed.tokens
            proposals = proposed.texts
            problems = [self.task.parse_proposal(text) for text in proposals]
            valid = torch.tensor([p is not None for p in problems], dtype=torch.bool).view(p_t, k)
            anchors = self.task.sample(self.anchors, self.generator) if self.anchors else []
            # students: the valid problems (each by its teacher's opponent), then every student's anchors
            rows: list[tuple[int, Problem]] = [
                (int(opponents[i // k]), p) for i, p in enumerate(problems) if p is not None
            ]
            rows += [(s, p) for s in range(p_s) for p in anchors]
            ids = [s for s, _ in rows for _ in range(a)]
            texts = [chat_text(self.tokenizer, self.task.prompt(p), self.chat) for _, p in rows for _ in range(a)]
            start = time.perf_counter()
            answers = generate_replies(
                s_pop, self.tokenizer, ids, texts, self._draw_seed(), self.student_generate, use_dist
            )
            seconds += time.perf_counter() - start
            tokens += answers.tokens
        replies = answers.texts
        asked = [p for _, p in rows for _ in range(a)]
        right = torch.tensor([self.task.check(p, reply) for p, reply in zip(asked, replies)], dtype=torch.bool).view(
            len(rows), a
        )
        q = int(valid.sum())
        solved = torch.zeros(p_t, k, a, dtype=torch.bool)
        solved[valid] = right[:q]
        anchor_solved = right[q:].view(p_s, self.anchors, a)
        teacher_f, student_f = selfplay_fitnesses(
            opponents, valid, solved, p_s, anchor_solved if self.anchors else None, teacher_reward=self.teacher_reward
        )
        t_ids, s_ids, scores = match_scores(opponents, valid, solved)
        fitnesses = {name: self._validated(name, f) for name, f in (("teachers", teacher_f), ("students", student_f))}
        pops = {"teachers": t_pop, "students": s_pop}
        # the writes below are undone by step() if anything raises
        if q:
            self.ratings.rate_many_("teachers", t_ids, "students", s_ids, scores)
        record = self._record(valid, teacher_f, student_f, anchor_solved, q, tokens, seconds)
        if self.student_pg_lr > 0 and ids:
            self._policy_gradient_step(ids, answers.prompt_ids, answers.reply_ids, right.flatten(), use_dist)
        results = {n: p.evolve_(fitnesses[n], **self.evolve_kwargs.get(n, {})) for n, p in pops.items()}
        for n, result in results.items():
            self.ratings.follow_(n, result)
        self.history.append(record)
        self.steps += 1
        return SelfPlayOutcome(
            opponents, proposals, problems, valid, solved, anchors, anchor_solved, teacher_f, student_f, record, replies
        )

    def _policy_gradient_step(
        self, ids: list[int], prompts: list[list[int]], replies: list[list[int]], right: Tensor, use_dist: bool
    ) -> None:
        """``student_pg_lr``'s step (see the class docstring); distributed, each rank its share of the rows."""
        adv = advantages(right.double(), groups=ids, method="baseline")
        rows = list(pd.partition(len(ids), pd.process_rank(), pd.world_size())) if use_dist else list(range(len(ids)))
        model = self.students.model
        training = model.training
        model.eval()  # the answers were generated without dropout
        try:
            policy_gradient_step_(
                self.students,
                torch.optim.SGD(self.students.adapter_parameters(), lr=self.student_pg_lr),
                [prompts[j] for j in rows],
                [replies[j] for j in rows],
                [ids[j] for j in rows],
                adv[rows],
                pad_id=pad_id(self.tokenizer),
                micro_batch=self.pg_micro_batch,
                reduction="sequence_mean",
                distributed=use_dist,
            )
        finally:
            model.train(training)

    def _draw_seed(self) -> int:
        return int(torch.randint(0, 2**62, (), generator=self.generator))

    def _evaluating(self) -> Any:
        return evaluating((self.teachers, self.students))

    def _record(
        self,
        valid: Tensor,
        teacher_f: Tensor,
        student_f: Tensor,
        anchor_solved: Tensor,
        matches: int,
        tokens: int,
        seconds: float,
    ) -> SelfPlayRecord:
        r = self.ratings
        return SelfPlayRecord(
            step=self.steps,
            validity=float(valid.float().mean()),
            student_mean=float(student_f.mean()),
            student_best=float(student_f.max()),
            anchor_accuracy=float(anchor_solved.float().mean()) if self.anchors else None,
            teacher_mean=float(teacher_f.mean()),
            teacher_best=float(teacher_f.max()),
            teacher_mu=float(r.mu("teachers").double().mean()),
            student_mu=float(r.mu("students").double().mean()),
            teacher_ordinal_best=float(r.ordinal("teachers").max()),
            student_ordinal_best=float(r.ordinal("students").max()),
            matches=matches,
            tokens=int(tokens),
            seconds=float(seconds),
            tokens_per_s=float(tokens / seconds) if seconds > 0 else 0.0,
        )

    def _validated(self, name: str, f: Tensor) -> Tensor:
        pop = self.teachers if name == "teachers" else self.students
        try:
            return pop.validate_fitnesses(f)
        except (FitnessError, TypeError, ValueError) as error:
            raise FitnessError(f"fitness of the {name} is invalid: {error}") from error

    # ------------------------------------------------------------------ evaluation

    def solve_rate(
        self,
        problems: Sequence[Problem],
        individuals: Sequence[int] | None = None,
        *,
        population: str = "students",
        batch_size: int = 64,
    ) -> Tensor:
        """Whether each listed individual answers each problem right, greedily: ``(m, n)`` bool.

        For held-out and validation sets: rows ``(individual, problem)`` are
        generated ``batch_size`` at a time (one routed ``generate`` per batch)
        with the students' generate options, sampling switched off. Changes
        no state (no generator is advanced).

        Args:
            problems: ``n`` problems of the task.
            individuals: ``m`` ids (default every individual).
            population: ``'students'`` or ``'teachers'`` (whose adapters answer).
            batch_size: rows per generate call.
        """
        population = check_one_of("population", population, NAMES)
        pop = self.students if population == "students" else self.teachers
        batch_size = check_int("batch_size", batch_size, low=1)
        ids = (
            list(range(pop.pop_size))
            if individuals is None
            else [check_index("individuals", i, pop.pop_size) for i in individuals]
        )
        problems = list(problems)
        if not all(isinstance(p, Problem) for p in problems):
            raise InvalidTypeError("`problems` must be a sequence of populora.tasks.Problem")
        kwargs = {k: v for k, v in self.student_generate.items() if k not in ("temperature", "top_p", "top_k")}
        kwargs["do_sample"] = False
        rows = [(i, p) for i in ids for p in problems]
        out: list[bool] = []
        with self._evaluating():
            for start in range(0, len(rows), batch_size):
                chunk = rows[start : start + batch_size]
                texts = [chat_text(self.tokenizer, self.task.prompt(p), self.chat) for _, p in chunk]
                replies = generate_replies(pop, self.tokenizer, [i for i, _ in chunk], texts, 0, kwargs, False).texts
                out += [self.task.check(p, r) for (_, p), r in zip(chunk, replies)]
        return torch.tensor(out, dtype=torch.bool).view(len(ids), len(problems))

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
            }
        )
        self.generator.set_state(small["generator"])
        self.ratings.load_state_dict(small["ratings"])
        self.steps = small["steps"]
        self.history = [SelfPlayRecord.from_dict(d) for d in small["history"]]
        self._synced = True

    # ------------------------------------------------------------------ state

    def state_dict(self) -> dict[str, Any]:
        """Everything an exact resume needs but the base model (CPU copies, no shared storage).

        ``{'format', 'steps', 'seed', 'generator', 'teachers', 'students',
        'ratings', 'history'}``: each population as
        ``Population.state_dict(include_model=False)``, the ratings as
        ``Ratings.state_dict()``, the history as plain dicts.
        """
        return {
            "format": _FORMAT,
            "steps": self.steps,
            "seed": self.seed,
            "generator": self.generator.get_state().clone(),
            "teachers": self.teachers.snapshot("cpu"),
            "students": self.students.snapshot("cpu"),
            "ratings": self.ratings.state_dict(),
            "history": [r.as_dict() for r in self.history],
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore :meth:`state_dict`: all or nothing (every part is checked before anything is written).

        Raises:
            CheckpointError: not a SelfPlay state, a missing key, a bad step count,
                generator state or history (every field of every record is checked,
                see :meth:`SelfPlayRecord.from_dict`; their steps must increase and
                stay below ``steps``), or a population or ratings state that does
                not fit (nothing has changed).
        """
        if not isinstance(state, Mapping) or state.get("format") != _FORMAT:
            raise CheckpointError(f"not a populora self-play checkpoint (missing format {_FORMAT!r})")
        missing = [k for k in ("steps", "generator", "teachers", "students", "ratings", "history") if k not in state]
        if missing:
            raise CheckpointError(f"the self-play state lacks the key(s) {missing}")
        if not is_int(state["steps"]) or state["steps"] < 0:
            raise CheckpointError(f"the self-play state's 'steps' must be an int >= 0, got {state['steps']!r}")
        probe = torch.Generator()
        try:
            probe.set_state(state["generator"])
        except (TypeError, RuntimeError, ValueError) as error:
            raise CheckpointError(f"the self-play state's 'generator' is not a generator state: {error}") from None
        history = _checked_history(state["history"], int(state["steps"]))
        checked = {
            n: p.check_state_dict(state[n]) for n, p in (("teachers", self.teachers), ("students", self.students))
        }
        self.ratings.load_state_dict(state["ratings"])  # all or nothing; the last check before any write
        self.teachers.load_checked_state_dict(checked["teachers"])
        self.students.load_checked_state_dict(checked["students"])
        self.generator.set_state(probe.get_state())
        self.history = history
        self.steps = int(state["steps"])


def _checked_history(rows: Any, steps: int) -> list[SelfPlayRecord]:
    """A state's ``history`` as records, every field checked; their steps increase and stay below ``steps``.

    Raises:
        CheckpointError: naming the first bad entry and field.
    """
    if not isinstance(rows, (list, tuple)):
        raise CheckpointError(
            f"the self-play state's 'history' must be a list of SelfPlayRecord dicts, got {type(rows).__name__}"
        )
    history: list[SelfPlayRecord] = []
    for i, row in enumerate(rows):
        try:
            record = SelfPlayRecord.from_dict(dict(row) if isinstance(row, Mapping) else row)
        except (TypeError, ValueError) as error:
            raise CheckpointError(f"the self-play state's 'history' entry {i} is malformed: {error}") from None
        last = history[-1].step if history else -1
        if not last < record.step < steps:
            raise CheckpointError(
                f"the self-play state's 'history' entry {i} has step={record.step}: the steps of the history "
                f"must increase (the entry before has step={last}) and stay below the state's steps={steps}"
            )
        history.append(record)
    return history
