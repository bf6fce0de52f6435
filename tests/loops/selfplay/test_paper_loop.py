"""PopuLoRA (populora.loops.selfplay): a step end to end on a tiny random Llama, the replacement schedule,
all or nothing, exact resume, 1T+1S, students alone, the presets and the argument checks."""

from __future__ import annotations

import math

import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("openskill")

from parity_task import BLOCK, AnyProposal, ParityTask, parity

from populora import Population
from populora.errors import CheckpointError, InvalidTypeError, InvalidValueError
from populora.llm import tiny_chat_model
from populora.loops.ratings import Ratings
from populora.loops.selfplay import CPU_PRESET, PAPER_PRESET, PopuLoRA, student_rewards, teacher_rewards
from populora.loops.selfplay import loop as loop_module
from populora.tasks import Task


def make(p_t: int = 2, p_s: int = 2, task: Task | None = None, **kwargs) -> PopuLoRA:
    model, tokenizer = tiny_chat_model(seed=0)
    teachers = Population(model, p_t, 2, BLOCK, seed=1, init_scale=0.5)
    students = Population(model, p_s, 2, BLOCK, seed=2, init_scale=0.5)
    opts = dict(
        proposals=2,
        attempts=2,
        interval=2,
        teacher_lr=1e-2,
        student_lr=1e-2,
        teacher_generate=dict(max_new_tokens=4),
        student_generate=dict(max_new_tokens=3),
        seed=3,
    )
    opts.update(kwargs)
    return PopuLoRA(teachers, students, tokenizer, task or ParityTask(), **opts)


def assert_equal_states(a, b, where: str = "") -> None:
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b), where
    elif isinstance(a, dict):
        assert isinstance(b, dict) and a.keys() == b.keys(), where
        for key in a:
            assert_equal_states(a[key], b[key], f"{where}.{key}")
    elif isinstance(a, (list, tuple)):
        assert isinstance(b, (list, tuple)) and len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            assert_equal_states(x, y, f"{where}[{i}]")
    elif isinstance(a, float) and math.isnan(a):
        assert isinstance(b, float) and math.isnan(b), where
    else:
        assert a == b, where


def deterministic(loop: PopuLoRA) -> dict:
    state = loop.state_dict()
    for record in state["history"]:
        record["seconds_generate"] = record["seconds_train"] = 0.0
    return state


def adapters(pop: Population) -> list[torch.Tensor]:
    return [t.detach().clone() for f in pop.factors() for t in f]


class TestStep:
    def test_one_step_end_to_end(self, monkeypatch):
        loop = make(interval=100, task=AnyProposal())
        calls: list[dict] = []
        real = loop.teachers.model.generate

        def counting(*args, **kwargs):
            calls.append(kwargs)
            return real(*args, **kwargs)

        monkeypatch.setattr(loop.teachers.model, "generate", counting)
        before = {n: adapters(p) for n, p in (("t", loop.teachers), ("s", loop.students))}
        out = loop.step()
        q = int(out.valid.sum())
        # sampler="member": one generate per member with rows (teachers 0 and 1, then each asked student), greedy
        # over Gumbel noise from the member's generator
        asked = sorted({s for s, _ in out.tasks})
        assert q > 0 and len(calls) == 2 + len(asked)
        assert all(not c["do_sample"] and len(c["logits_processor"]) == 1 for c in calls)
        assert [c["input_ids"].shape[0] for c in calls[:2]] == [2, 2]
        assert [c["input_ids"].shape[0] for c in calls[2:]] == [2 * sum(s == i for s, _ in out.tasks) for i in asked]
        assert out.valid.shape == (2, 2) and out.solved.shape == (2, 2, 2)
        assert [p is not None for p in out.problems] == out.valid.flatten().tolist()
        assert len(out.tasks) == q and len(out.answers) == q * 2 and out.families == ["parity", "parity"]
        # the tables, applied to what the step saw
        assert torch.equal(out.teacher_rewards, teacher_rewards(out.valid, out.solved))
        assert torch.equal(out.student_rewards, student_rewards(out.right, out.formed))
        for j, (s, _) in enumerate(out.tasks):
            assert s == int(out.opponents[[i for i in range(2) for k in range(2) if out.valid[i, k]][j]])
        rec = out.record
        assert rec.step == 0 and loop.steps == 1 and loop.history == [rec]
        assert rec.matches == 2 and loop.ratings.played == 2  # one match per teacher-student pair
        assert rec.validity == float(out.valid.float().mean()) and rec.generated_tokens > 0
        assert rec.replaced == 0 and out.replacements == []
        # RL moved an individual exactly when its rows carried a signal
        t_moved = any(not torch.equal(x, y) for x, y in zip(adapters(loop.teachers), before["t"]))
        assert t_moved == bool((out.teacher_rewards != out.teacher_rewards.mean(1, keepdim=True)).any())
        assert (rec.trained_tokens > 0) == (
            t_moved or any(not torch.equal(x, y) for x, y in zip(adapters(loop.students), before["s"]))
        )

    def test_replacement_schedule(self):
        loop = make(interval=2, fraction=0.5)
        replaced = []
        for _ in range(4):
            out = loop.step()
            replaced.append([(r.name, r.step) for r in out.replacements])
        assert replaced == [[], [("teachers", 1), ("students", 1)], [], [("teachers", 3), ("students", 3)]]
        assert [r.replaced for r in loop.history] == [0, 2, 0, 2]
        # a child restarts at the prior; it has played no match since
        last = loop.replacements[-1]
        assert loop.ratings.mu("students")[last.children[0]] == 25.0
        assert loop.ratings.matches("students")[last.children[0]] == 0

    def test_evolve_false_never_replaces(self):
        loop = make(interval=1, evolve=False)
        loop.step()
        loop.step()
        assert loop.replacements == [] and [r.replaced for r in loop.history] == [0, 0]

    def test_one_teacher_one_student(self):
        loop = make(p_t=1, p_s=1, interval=1)
        for _ in range(3):
            out = loop.step()
        assert out.opponents.tolist() == [0] and loop.replacements == []  # nothing to replace in a population of 1
        assert loop.ratings.played == 3

    def test_students_alone(self):
        loop = make(proposals=0, anchors=2, interval=1)
        before = adapters(loop.teachers)
        out = loop.step()
        assert out.proposals == [] and out.valid.shape == (2, 0) and len(out.tasks) == 2 * 2
        assert out.record.matches == 0 and loop.ratings.played == 0 and out.record.anchor_accuracy is not None
        assert all(torch.equal(x, y) for x, y in zip(adapters(loop.teachers), before))
        assert [r.name for r in out.replacements] == ["students"]

    def test_reserved_problems_are_never_asked(self):
        # AnyProposal's problem is the parity of the proposal's length: reserve one of the two questions
        loop = make(interval=100, task=AnyProposal(), reserved={parity(4).question}, proposals=4)
        twin = make(interval=100, task=AnyProposal(), proposals=4)
        out, free = loop.step(), twin.step()
        assert out.proposals == free.proposals  # the same draws: only what is asked differs
        held = torch.tensor([p is not None and p.question == parity(4).question for p in out.problems]).view(2, 4)
        assert torch.equal(out.reserved, held) and held.any() and not (out.valid & out.reserved).any()
        assert torch.equal(out.valid | out.reserved, free.valid)
        assert all(p.question != parity(4).question for _, p in out.tasks)
        assert bool((out.teacher_rewards[held] == 0).all())  # neither the invalid -1 nor a solve-based reward
        assert out.record.reserved == int(held.sum()) and out.record.validity == float(free.valid.float().mean())

    def test_reserved_anchors_are_redrawn(self):
        reserved = {parity(c).question for c in range(100) if c % 3}
        loop = make(proposals=0, anchors=5, reserved=reserved)
        out = loop.step()
        assert len(out.anchors) == 5 and all(p.question not in reserved for p in out.anchors)
        everything = make(proposals=0, anchors=1, reserved={parity(c).question for c in range(100)})
        before = deterministic(everything)
        with pytest.raises(InvalidValueError, match="reserved"):
            everything.step()
        assert_equal_states(deterministic(everything), before)  # all or nothing
        with pytest.raises(InvalidTypeError, match="reserved"):
            make(reserved="What?")
        with pytest.raises(InvalidTypeError, match="reserved"):
            make(reserved={1, 2})

    def test_phrasings_are_drawn_per_task(self, monkeypatch):
        seen: list[str] = []

        def phrase(tag):
            def message(p):
                seen.append(tag)
                return f"{tag} {p.question}"

            return message

        loop = make(proposals=0, anchors=3, phrasings=[phrase("A"), phrase("B")])
        out = loop.step()
        assert len(seen) == len(out.tasks) * 2  # one message per attempt row
        assert all(seen[2 * j] == seen[2 * j + 1] for j in range(len(out.tasks)))  # the attempts share a prompt


class TestAllOrNothing:
    @pytest.mark.parametrize("where", ["replacement", "ratings", "students_rl"])
    def test_a_late_failure_restores_everything_and_the_retry_is_the_twins_step(self, monkeypatch, where):
        loop, twin = make(interval=2), make(interval=2)
        loop.step()
        twin.step()
        before = deterministic(loop)
        if where == "replacement":
            real = loop_module.replace_

            def failing(*args, **kwargs):
                rec = real(*args, **kwargs)
                if kwargs.get("optimizer") is loop.optimizers["students"]:
                    raise RuntimeError("injected")
                return rec

            monkeypatch.setattr(loop_module, "replace_", failing)
        elif where == "ratings":
            real_rate = loop.ratings.rate_many_

            def failing(*args, **kwargs):
                real_rate(*args, **kwargs)
                raise RuntimeError("injected")

            monkeypatch.setattr(loop.ratings, "rate_many_", failing)
        else:
            real_rl = loop_module.policy_gradient_step_

            def failing(pop, *args, **kwargs):
                out = real_rl(pop, *args, **kwargs)
                if pop is loop.students:
                    raise RuntimeError("injected")
                return out

            monkeypatch.setattr(loop_module, "policy_gradient_step_", failing)
            # make sure the students have a signal to train on: every reward differs within a group
            monkeypatch.setattr(loop_module, "student_rewards", lambda r, f, rule: torch.arange(len(r)).double())
        with pytest.raises(RuntimeError, match="injected"):
            loop.step()
        assert_equal_states(deterministic(loop), before)
        monkeypatch.undo()
        if where == "students_rl":  # the twin takes the same (patched-rewards) step
            monkeypatch.setattr(loop_module, "student_rewards", lambda r, f, rule: torch.arange(len(r)).double())
        a, b = loop.step(), twin.step()
        assert a.proposals == b.proposals and a.answers == b.answers
        assert a.record.deterministic == b.record.deterministic
        assert_equal_states(deterministic(loop), deterministic(twin))


class TestResume:
    def test_n_steps_equal_k_then_load_then_n_minus_k(self, tmp_path):
        full = make(interval=2)
        for _ in range(4):
            full.step()
        first = make(interval=2)
        for _ in range(2):
            first.step()
        first.save(tmp_path / "loop.pt")
        second = make(interval=2)
        second.load(tmp_path / "loop.pt")
        for _ in range(2):
            second.step()
        assert_equal_states(deterministic(second), deterministic(full))
        assert len(full.replacements) == 4

    def test_a_checkpoint_written_by_050_loads_and_continues_as_this_versions_run(self):
        """tests/loops/data/populora_050.pt: steps 0-1 of this run, written by populora 0.5.0 (populora.PopuLoRA/1,
        commit 1496bc6); loaded here and stepped twice, it is this version's uninterrupted 4 steps with 0.5.0's
        sampler (``sampler="batch"``; the default "member" sampler continues it with other draws)."""
        from pathlib import Path

        full = make(interval=2, sampler="batch")
        for _ in range(4):
            full.step()
        second = make(interval=2, sampler="batch")
        second.load(Path(__file__).parents[1] / "data" / "populora_050.pt")
        assert second.steps == 2
        for _ in range(2):
            second.step()
        # what 0.5.0 did not keep: the distinct / repeated counts of its steps, and the questions asked in them
        ours, theirs = deterministic(second), deterministic(full)
        assert [r["distinct"] for r in ours["history"][:2]] == [None, None]
        for state in (ours, theirs):
            for record in state["history"][:2]:
                record["distinct"] = record["repeated"] = None
            state["questions"] = state["recent"] = None
        assert_equal_states(ours, theirs)

    def test_a_bad_state_changes_nothing(self):
        loop = make()
        loop.step()
        state = loop.state_dict()
        fresh = make()
        before = deterministic(fresh)
        bad = dict(state, history=state["history"][:0])
        with pytest.raises(CheckpointError, match="history"):
            fresh.load_state_dict(bad)
        with pytest.raises(CheckpointError, match="format"):
            fresh.load_state_dict({"format": "nope"})
        assert_equal_states(deterministic(fresh), before)


class TestOptions:
    def test_presets(self):
        assert (PAPER_PRESET.teachers, PAPER_PRESET.students, PAPER_PRESET.rank) == (4, 4, 32)
        assert PAPER_PRESET.loop["interval"] == 10 and PAPER_PRESET.loop["fraction"] == 0.25
        assert PAPER_PRESET.loop["attempts"] == 4 and PAPER_PRESET.loop["crossover_rate"] == 0.5
        assert PAPER_PRESET.loop["anchors"] == 0
        assert CPU_PRESET.rank == 8 and CPU_PRESET.loop["interval"] == 5 and CPU_PRESET.teachers == 4
        model, tokenizer = tiny_chat_model(seed=0)
        loop = PopuLoRA.from_preset(
            model, tokenizer, ParityTask(), CPU_PRESET.replace(teachers=2, students=3), seed=5, micro_batch=4
        )
        assert (loop.teachers.pop_size, loop.students.pop_size, loop.students.low_rank) == (2, 3, 8)
        assert loop.interval == 5 and loop.attempts == 4 and loop.micro_batch == 4 and loop.seed == 5
        assert all(bool((f.up == 0).all()) for f in loop.students.factors())  # every member starts as the base

    @pytest.mark.parametrize(
        "bad, error, match",
        [
            (dict(interval=0), InvalidValueError, "interval"),
            (dict(attempts=1), InvalidValueError, "attempts"),
            (dict(intervall=3), InvalidTypeError, "no option 'intervall' \\(did you mean 'interval'\\?\\)"),
        ],
    )
    def test_a_refused_preset_option_leaves_the_model_as_it_was(self, bad, error, match):
        model, tokenizer = tiny_chat_model(seed=0)
        flags = {n: p.requires_grad for n, p in model.named_parameters()}
        x = torch.tensor([[1, 2, 3, 4]])
        with torch.no_grad():
            before = model(x).logits
        with pytest.raises(error, match=match):
            PopuLoRA.from_preset(model, tokenizer, ParityTask(), CPU_PRESET.replace(teachers=2, students=2), **bad)
        assert {n: p.requires_grad for n, p in model.named_parameters()} == flags
        assert not any(
            "lora" in n.lower() or "population" in type(m).__name__.lower() for n, m in model.named_modules()
        )
        with torch.no_grad():
            assert torch.equal(model(x).logits, before)
        PopuLoRA.from_preset(model, tokenizer, ParityTask(), CPU_PRESET.replace(teachers=2, students=2))  # wraps again

    def test_bad_arguments(self):
        with pytest.raises(InvalidValueError, match="attempts"):
            make(attempts=1)
        with pytest.raises(InvalidValueError, match="do_sample=True"):
            make(student_generate=dict(do_sample=False))
        with pytest.raises(InvalidValueError, match="anchors >= 1"):
            make(proposals=0, anchors=0)
        with pytest.raises(InvalidValueError, match="teacher_reward"):
            make(teacher_reward="wins")
        with pytest.raises(InvalidValueError, match="may not set"):
            make(student_generate=dict(generator=None))
        with pytest.raises(ValueError, match="Unknown mutation `no_such_mutation`"):
            make(mutations=("no_such_mutation",))
        with pytest.raises(InvalidTypeError, match="phrasings"):
            make(phrasings=["not callable"])

    def test_the_players_are_checked_as_selfplay_checks_them(self):
        model, tokenizer = tiny_chat_model(seed=0)
        pop = Population(model, 2, 2, BLOCK, seed=1)
        with pytest.raises(InvalidValueError, match="are the same Population"):
            PopuLoRA(pop, pop, tokenizer, ParityTask())
        other = Population(tiny_chat_model(seed=0)[0], 2, 2, BLOCK, seed=2)
        with pytest.raises(InvalidValueError, match="must be populations on the SAME base model"):
            PopuLoRA(pop, other, tokenizer, ParityTask())
        students = Population(model, 3, 2, BLOCK, seed=2)
        with pytest.raises(InvalidValueError, match=r"must rate 'students' with 3 players .* got 2 players"):
            PopuLoRA(pop, students, tokenizer, ParityTask(), Ratings({"teachers": 2, "students": 2}))
        with pytest.raises(InvalidTypeError, match="`task` must be a populora.tasks.Task, got str"):
            PopuLoRA(pop, students, tokenizer, "parity")
