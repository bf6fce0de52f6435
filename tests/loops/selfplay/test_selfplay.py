"""SelfPlay (populora.selfplay): the fitness rule on hand-made outcomes, steps on a tiny random Llama with a
char-level chat tokenizer, exact resume, argument checks, the example's smoke mode."""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("openskill")

from parity_task import BLOCK, ParityTask
from transformers import LlamaConfig, LlamaForCausalLM

from populora import Population
from populora.errors import CheckpointError, InvalidTypeError, InvalidValueError
from populora.llm import char_tokenizer
from populora.loops.ratings import Ratings
from populora.loops.selfplay.scores import match_scores, selfplay_fitnesses
from populora.loops.selfplay.selfplay import SelfPlay

ROOT = Path(__file__).resolve().parents[3]
PAD, EOS = 0, 1


# ---------------------------------------------------------------------------------------------- fixtures

_STATE: dict[str, torch.Tensor] = {}


def tiny_llama() -> LlamaForCausalLM:
    config = LlamaConfig(
        vocab_size=128,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        pad_token_id=PAD,
        eos_token_id=EOS,
        bos_token_id=EOS,
    )
    model = LlamaForCausalLM(config)
    if not _STATE:
        with torch.random.fork_rng():
            torch.manual_seed(0)
            _STATE.update({k: v.clone() for k, v in LlamaForCausalLM(config).state_dict().items()})
    model.load_state_dict(_STATE)
    return model.eval()


GEN_T = dict(max_new_tokens=6, do_sample=True, temperature=1.0)
GEN_S = dict(max_new_tokens=5, do_sample=False)


def make(seed: int = 0, pop_seed: int = 1, p_t: int = 4, p_s: int = 4, **kwargs) -> SelfPlay:
    model = tiny_llama()
    teachers = Population(model, p_t, 2, BLOCK, seed=pop_seed, init_scale=0.5)
    students = Population(model, p_s, 2, BLOCK, seed=pop_seed + 1, init_scale=0.5)
    opts = dict(
        proposals=2,
        anchors=2,
        teacher_generate=GEN_T,
        student_generate=GEN_S,
        seed=seed,
        evolve_kwargs={"teachers": {"epsilon": 0.2}, "students": {"epsilon": 0.2}},
    )
    opts.update(kwargs)
    return SelfPlay(teachers, students, char_tokenizer(), ParityTask(), **opts)


def adapters(pop: Population) -> list[torch.Tensor]:
    return [t.detach().clone() for f in pop.factors() for t in f]


# ---------------------------------------------------------------------------------------------- the rule


class TestFitnessRule:
    def test_failures_counts_valid_problems_the_student_failed(self):
        opponents = torch.tensor([0, 0, 1])
        valid = torch.tensor([[True, False], [True, True], [False, False]])
        solved = torch.tensor([[[False], [True]], [[True], [False]], [[False], [False]]])
        t, s = selfplay_fitnesses(opponents, valid, solved, num_students=3)
        # teacher 0: one valid, failed -> 1/2; its invalid proposal scores 0 even though "solved" is True
        assert t.tolist() == [0.5, 0.5, 0.0]
        # student 0 got 3 valid problems, solved 1; students 1, 2 got none: neutral (the mean of the scored)
        assert s.tolist() == pytest.approx([1 / 3, 1 / 3, 1 / 3])
        assert t.dtype == s.dtype == torch.float32

    def test_anchors_score_every_student_and_count_with_its_problems(self):
        opponents = torch.tensor([1])
        valid = torch.tensor([[True]])
        solved = torch.tensor([[[True]]])
        anchors = torch.tensor([[[True], [False]], [[False], [False]]])  # (p_s=2, m=2, a=1)
        t, s = selfplay_fitnesses(opponents, valid, solved, 2, anchors)
        assert t.tolist() == [0.0]
        assert s.tolist() == pytest.approx([0.5, 1 / 3])  # student 1: its teacher's problem (1) + anchors (0, 0)

    def test_several_attempts_and_learnability(self):
        opponents = torch.tensor([0, 0])
        valid = torch.ones(2, 3, dtype=torch.bool)
        valid[1, 2] = False
        # solve rates: teacher 0: 0, 1/4, 1; teacher 1: 3/4, 1/2, (invalid)
        solved = torch.tensor(
            [[[0, 0, 0, 0], [1, 0, 0, 0], [1, 1, 1, 1]], [[1, 1, 1, 0], [1, 0, 1, 0], [0, 0, 0, 0]]], dtype=torch.bool
        )
        failures, s = selfplay_fitnesses(opponents, valid, solved, 1)
        assert failures.tolist() == pytest.approx([(1 + 0.75 + 0) / 3, (0.25 + 0.5) / 3])
        learn, s2 = selfplay_fitnesses(opponents, valid, solved, 1, teacher_reward="learnability")
        # r(s) = 1 - s for 0 < s < 1, else 0: never-solved and always-solved problems are worth nothing
        assert learn.tolist() == pytest.approx([0.75 / 3, (0.25 + 0.5) / 3])
        assert torch.equal(s, s2) and s.tolist() == pytest.approx([(0 + 1 + 4 + 3 + 2) / 20])

    def test_no_student_scored_gives_zeros(self):
        t, s = selfplay_fitnesses(
            torch.tensor([0]), torch.zeros(1, 2, dtype=torch.bool), torch.ones(1, 2, 1, dtype=torch.bool), 2
        )
        assert t.tolist() == [0.0] and s.tolist() == [0.0, 0.0]

    def test_match_scores_one_match_per_valid_problem(self):
        opponents = torch.tensor([2, 0])
        valid = torch.tensor([[True, False], [True, True]])
        solved = torch.tensor([[[False, False], [True, True]], [[True, True], [True, False]]])
        t, s, score = match_scores(opponents, valid, solved)
        assert t.tolist() == [0, 1, 1] and s.tolist() == [2, 0, 0]
        assert score.tolist() == [1.0, 0.0, 0.5]  # teacher won / student won / draw

    def test_bad_outcomes_raise(self):
        ok = dict(
            opponents=torch.tensor([0]),
            valid=torch.ones(1, 1, dtype=torch.bool),
            solved=torch.ones(1, 1, 1, dtype=torch.bool),
            num_students=1,
        )
        with pytest.raises(InvalidValueError, match=r"student ids in \[0, 1\), got \[3\]"):
            selfplay_fitnesses(**{**ok, "opponents": torch.tensor([3])})
        with pytest.raises(InvalidValueError, match=r"\(p_t, k\).*got \(1, 1\) and \(1, 2, 1\)"):
            selfplay_fitnesses(**{**ok, "solved": torch.ones(1, 2, 1, dtype=torch.bool)})
        with pytest.raises(InvalidTypeError, match="`valid` must be a bool tensor, got dtype torch.float32"):
            selfplay_fitnesses(**{**ok, "valid": torch.ones(1, 1)})
        with pytest.raises(InvalidValueError, match="teacher_reward"):
            selfplay_fitnesses(**ok, teacher_reward="wins")


# ---------------------------------------------------------------------------------------------- steps


class TestSteps:
    def test_a_step_runs_two_generate_calls_and_fills_the_outcome(self, monkeypatch):
        sp = make()
        model = sp.teachers.model
        calls: list[tuple[int, dict]] = []
        real = model.generate

        def counting(*args, **kwargs):
            calls.append((kwargs["input_ids"].shape[0], dict(kwargs)))
            return real(*args, **kwargs)

        monkeypatch.setattr(model, "generate", counting)
        out = sp.step()
        assert len(calls) == 2  # one routed generate for the teachers, one for the students
        assert calls[0][0] == 4 * 2 and calls[0][1]["do_sample"] is True
        q = int(out.valid.sum())
        assert calls[1][0] == q + 4 * 2 and calls[1][1]["do_sample"] is False  # valid problems + anchors
        assert out.opponents.shape == (4,) and out.valid.shape == (4, 2) and out.solved.shape == (4, 2, 1)
        assert len(out.proposals) == 8 and len(out.anchors) == 2 and out.anchor_solved.shape == (4, 2, 1)
        assert [p is not None for p in out.problems] == out.valid.flatten().tolist()
        assert len(out.answers) == q + 4 * 2 and all(isinstance(t, str) for t in out.answers)
        rec = out.record
        assert rec.step == 0 and rec.validity == pytest.approx(q / 8) and rec.matches == q
        assert rec.student_mean == pytest.approx(float(out.student_fitness.mean()))
        assert rec.teacher_best == pytest.approx(float(out.teacher_fitness.max()))
        assert rec.tokens > 0 and rec.anchor_accuracy == pytest.approx(float(out.anchor_solved.float().mean()))
        assert sp.history == [rec] and sp.steps == 1
        assert sp.teachers.generation == sp.students.generation == 1

    def test_few_steps_move_ratings_adapters_and_history(self):
        sp = make()
        before = adapters(sp.students)
        outs = [sp.step() for _ in range(3)]
        matches = sum(o.record.matches for o in outs)
        assert matches > 0 and sp.ratings.played == matches
        assert len(sp.history) == 3 and [r.step for r in sp.history] == [0, 1, 2]
        assert any(not torch.equal(x, y) for x, y in zip(before, adapters(sp.students)))
        # the teacher that beat its student gained rating relative to the prior, unless culled afterwards
        mu = torch.cat([sp.ratings.mu("teachers"), sp.ratings.mu("students")])
        assert not torch.all(mu == 25.0)

    def test_matches_are_rated_teacher_first_and_culled_slots_reset(self):
        sp = make()
        out = sp.step()
        t_ids, s_ids, scores = match_scores(out.opponents, out.valid, out.solved)
        assert len(scores)
        # replaying the step's matches on fresh ratings gives the recorded means (before evolve_)
        fresh = Ratings({"teachers": 4, "students": 4})
        fresh.rate_many_("teachers", t_ids, "students", s_ids, scores)
        assert out.record.teacher_mu == pytest.approx(float(fresh.mu("teachers").mean()))
        assert out.record.student_mu == pytest.approx(float(fresh.mu("students").mean()))
        # after evolve_: survivors keep their rating, the culled slots (children) are back at the prior
        for name in ("teachers", "students"):
            mu, replay = sp.ratings.mu(name), fresh.mu(name)
            changed = mu != replay
            assert int(changed.sum()) <= 2  # P = 4, survive_frac 0.5: two children per population
            assert bool((mu[changed] == 25.0).all())
            assert bool((sp.ratings.matches(name)[changed] == 0).all())

    def test_same_seed_same_run(self):
        a, b, c = make(), make(), make(seed=5)
        runs = [[sp.step() for _ in range(2)] for sp in (a, b, c)]
        for ra, rb in zip(runs[0], runs[1]):
            assert ra.proposals == rb.proposals and ra.record.deterministic == rb.record.deterministic
            assert torch.equal(ra.opponents, rb.opponents)
        assert all(torch.equal(x, y) for x, y in zip(adapters(a.students), adapters(b.students)))
        assert [r.proposals for r in runs[0]] != [r.proposals for r in runs[2]]  # another seed, another run

    def test_an_option_evolve_rejects_at_the_first_step_changes_nothing(self):
        sp = make(evolve_kwargs={"students": {"survive_frac": 1.0}})  # teachers evolve, then students raise
        teachers, ratings, gen = adapters(sp.teachers), sp.ratings.state_dict(), sp.generator.get_state()
        with pytest.raises(ValueError, match="survive_frac"):
            sp.step()
        assert all(torch.equal(x, y) for x, y in zip(teachers, adapters(sp.teachers)))
        assert sp.teachers.generation == 0 and sp.steps == 0 and sp.history == []
        assert torch.equal(sp.ratings.mu("teachers"), ratings["mu"]["teachers"]) and sp.ratings.played == 0
        assert torch.equal(sp.generator.get_state(), gen)
        sp.evolve_kwargs["students"] = {}
        first = sp.step()
        assert torch.equal(first.opponents, make().step().opponents)  # the retry draws what a fresh run draws

    def test_learnability_with_sampled_attempts(self):
        sp = make(
            attempts=3,
            teacher_reward="learnability",
            student_generate=dict(max_new_tokens=5, do_sample=True, temperature=1.0),
        )
        out = sp.step()
        assert out.solved.shape == (4, 2, 3) and out.anchor_solved.shape == (4, 2, 3)
        rate = out.solved.float().mean(2)
        expected = torch.where((rate > 0) & (rate < 1), 1 - rate, torch.zeros_like(rate)) * out.valid
        assert out.teacher_fitness.tolist() == pytest.approx(expected.sum(1).div(2).tolist())

    def test_solve_rate_of_identical_students_is_identical_and_changes_no_state(self):
        model = tiny_llama()
        teachers = Population(model, 2, 2, BLOCK, seed=1, init_scale=0.5)
        students = Population(model, 3, 2, BLOCK, seed=2, init_scale=0.0)  # all at the base model
        sp = SelfPlay(teachers, students, char_tokenizer(), ParityTask(), student_generate=GEN_S)
        problems = ParityTask().sample(5, torch.Generator().manual_seed(0))
        state = sp.generator.get_state()
        right = sp.solve_rate(problems, batch_size=4)
        assert right.shape == (3, 5) and right.dtype == torch.bool
        assert torch.equal(right[0], right[1]) and torch.equal(right[0], right[2])
        assert torch.equal(sp.solve_rate(problems, [1]), right[1:2])
        assert torch.equal(sp.generator.get_state(), state) and sp.steps == 0


# ---------------------------------------------------------------------------------------------- hybrid


def _reply_logp(pop: Population, individual: int, prompt: list[int], reply: list[int]) -> float:
    x = torch.tensor([prompt + reply])
    with torch.no_grad():
        logits = pop(x, use_cache=False, individual=individual).logits
    logp = torch.log_softmax(logits[0, :-1].double(), -1).gather(-1, x[0, 1:, None]).squeeze(-1)
    return float(logp[-len(reply) :].mean())


class TestPolicyGradient:
    """SelfPlay's hybrid runs on populora.train (its own tests are in tests/train): what SelfPlay asks of it."""

    def test_the_students_step_is_an_sgd_step_on_each_students_baseline_subtracted_reinforce_loss(self):
        pop = Population(tiny_llama(), 3, 2, BLOCK, seed=4, init_scale=0.5)
        before = [(d.clone(), u.clone()) for d, u in pop.factors()]
        prompt, good, bad = [2, 40, 41, 42, 98], [50, 51, 52, 1], [60, 61, 1]
        logp_good, logp_bad = _reply_logp(pop, 0, prompt, good), _reply_logp(pop, 0, prompt[1:], bad)
        sp = make(student_pg_lr=0.5)
        sp.students = pop
        # individual 0: one rewarded and one unrewarded reply; individual 1: all alike (no move); 2: no rows
        sp.student_policy_gradient_step(
            [0, 0, 1, 1],
            [prompt, prompt[1:], prompt, prompt],
            [good, bad, good, bad],
            torch.tensor([1, 0, 1, 1]),
            False,
        )
        moved = [any(not torch.equal(d[i], d0[i]) for (d, _), (d0, _) in zip(pop.factors(), before)) for i in range(3)]
        assert moved == [True, False, False]
        assert _reply_logp(pop, 0, prompt, good) > logp_good
        assert _reply_logp(pop, 0, prompt[1:], bad) < logp_bad
        assert not any(p.requires_grad for p in pop.parameters())

    def test_selfplay_hybrid_step_is_deterministic_and_differs_from_evolution_only(self):
        a, b, plain = make(student_pg_lr=0.05), make(student_pg_lr=0.05), make()
        for sp in (a, b, plain):
            sp.step()
        assert all(torch.equal(x, y) for x, y in zip(adapters(a.students), adapters(b.students)))
        assert any(not torch.equal(x, y) for x, y in zip(adapters(a.students), adapters(plain.students)))
        assert all(torch.equal(x, y) for x, y in zip(adapters(a.teachers), adapters(plain.teachers)))
        with pytest.raises(InvalidValueError, match="student_pg_lr"):
            make(student_pg_lr=-1.0)


# ---------------------------------------------------------------------------------------------- resume


class TestCheckpoint:
    def test_a_checkpoint_written_by_050_resumes_bitwise(self):
        """tests/loops/data/selfplay_050.ckpt: step 0 of this run, written by populora 0.5.0 (populora.selfplay/1,
        commit 1496bc6); loaded here and stepped twice, it is this version's uninterrupted 3 steps."""
        straight = make()
        for _ in range(3):
            straight.step()
        resumed = make(seed=9, pop_seed=7)  # other seeds: everything must come from the file
        resumed.load(ROOT / "tests" / "loops" / "data" / "selfplay_050.ckpt")
        assert resumed.steps == 1 and len(resumed.history) == 1
        for _ in range(2):
            resumed.step()
        for pop in ("teachers", "students"):
            assert all(
                torch.equal(x, y) for x, y in zip(adapters(getattr(straight, pop)), adapters(getattr(resumed, pop)))
            )
        assert [r.deterministic for r in straight.history] == [r.deterministic for r in resumed.history]
        assert torch.equal(straight.generator.get_state(), resumed.generator.get_state())

    def test_resume_is_bitwise_the_uninterrupted_run(self, tmp_path):
        straight = make()
        for _ in range(3):
            straight.step()
        first = make()
        first.step()
        path = first.save(tmp_path / "sp.ckpt")
        resumed = make(seed=9, pop_seed=7)  # other seeds: everything must come from the file
        resumed.load(path)
        assert resumed.steps == 1 and len(resumed.history) == 1
        for _ in range(2):
            resumed.step()
        for pop in ("teachers", "students"):
            assert all(
                torch.equal(x, y) for x, y in zip(adapters(getattr(straight, pop)), adapters(getattr(resumed, pop)))
            )
            one, two = getattr(straight, pop), getattr(resumed, pop)
            assert torch.equal(one.generator.get_state(), two.generator.get_state())
        assert [r.deterministic for r in straight.history] == [r.deterministic for r in resumed.history]
        for name in ("teachers", "students"):
            assert torch.equal(straight.ratings.mu(name), resumed.ratings.mu(name))
            assert torch.equal(straight.ratings.sigma(name), resumed.ratings.sigma(name))
        assert torch.equal(straight.generator.get_state(), resumed.generator.get_state())

    def test_state_dict_shares_no_storage(self):
        sp = make()
        sp.step()
        before = adapters(sp.students) + adapters(sp.teachers)
        state = sp.state_dict()
        for part in (state["teachers"], state["students"], state["ratings"]["mu"], {"g": state["generator"]}):
            for value in part.values():
                if isinstance(value, torch.Tensor) and value.is_floating_point():
                    value.add_(1.0)
                elif isinstance(value, torch.Tensor):
                    value.zero_()
        assert all(torch.equal(x, y) for x, y in zip(before, adapters(sp.students) + adapters(sp.teachers)))
        assert not torch.equal(sp.generator.get_state(), state["generator"])
        assert bool((sp.ratings.mu("students") != state["ratings"]["mu"]["students"]).all())

    def test_mismatched_or_damaged_state_raises_and_changes_nothing(self, tmp_path):
        sp = make()
        sp.step()
        other = make(p_s=2)
        before, gen = adapters(other.students), other.generator.get_state()
        with pytest.raises(CheckpointError):
            other.load_state_dict(sp.state_dict())
        assert all(torch.equal(x, y) for x, y in zip(before, adapters(other.students)))
        assert torch.equal(gen, other.generator.get_state()) and other.steps == 0
        with pytest.raises(CheckpointError, match="not a populora self-play checkpoint"):
            other.load_state_dict({"format": "populora.coevolve/1"})
        state = sp.state_dict()
        del state["ratings"]
        with pytest.raises(CheckpointError, match=r"lacks the key\(s\) \['ratings'\]"):
            sp.load_state_dict(state)
        state = sp.state_dict()
        state["steps"] = -1
        with pytest.raises(CheckpointError, match="'steps' must be an int >= 0, got -1"):
            sp.load_state_dict(state)
        path = sp.save(tmp_path / "x.ckpt")
        path.write_bytes(path.read_bytes()[:-10])
        with pytest.raises(CheckpointError):
            sp.load(path)


# ---------------------------------------------------------------------------------------------- arguments


class TestArguments:
    def test_populations_must_share_one_model_and_be_two(self):
        a = Population(tiny_llama(), 2, 2, BLOCK)
        b = Population(tiny_llama(), 2, 2, BLOCK)
        with pytest.raises(InvalidValueError, match="must be populations on the SAME base model"):
            SelfPlay(a, b, char_tokenizer(), ParityTask())
        with pytest.raises(InvalidValueError, match="are the same Population"):
            SelfPlay(a, a, char_tokenizer(), ParityTask())
        with pytest.raises(InvalidTypeError, match="`students` must be a Population, got Linear"):
            SelfPlay(a, torch.nn.Linear(2, 2), char_tokenizer(), ParityTask())
        c = Population(a.model, 2, 2, BLOCK)
        c.close()
        with pytest.raises(InvalidValueError, match="`students` was merged or closed"):
            SelfPlay(a, c, char_tokenizer(), ParityTask())

    def test_ratings_must_fit_the_populations(self):
        model = tiny_llama()
        t, s = Population(model, 2, 2, BLOCK), Population(model, 3, 2, BLOCK)
        with pytest.raises(
            InvalidValueError,
            match=r"rate 'students' with 3 players \(the population's pop_size\), "
            "got 2 players",
        ):
            SelfPlay(t, s, char_tokenizer(), ParityTask(), Ratings({"teachers": 2, "students": 2}))
        with pytest.raises(InvalidValueError, match="rate 'teachers' with 2 players .*got no such name"):
            SelfPlay(t, s, char_tokenizer(), ParityTask(), Ratings({"teacher": 2, "students": 3}))
        with pytest.raises(InvalidTypeError, match="`ratings` must be a populora.Ratings"):
            SelfPlay(t, s, char_tokenizer(), ParityTask(), {"teachers": 2})

    def test_option_checks(self):
        model = tiny_llama()
        t, s = Population(model, 2, 2, BLOCK), Population(model, 2, 2, BLOCK)
        tok, task = char_tokenizer(), ParityTask()
        cases = [
            (dict(teacher_reward="learnability"), InvalidValueError, "needs attempts >= 2"),
            (dict(attempts=2), InvalidValueError, "attempts=2 with greedy students"),
            (dict(proposals=0), InvalidValueError, "proposals"),
            (dict(anchors=-1), InvalidValueError, "anchors"),
            (dict(matchmaking="elo"), InvalidValueError, "matchmaking"),
            (
                dict(teacher_generate=dict(num_return_sequences=2)),
                InvalidValueError,
                r"`teacher_generate` may not set \['num_return_sequences'\]",
            ),
            (dict(student_generate=[1]), InvalidTypeError, "`student_generate` must be a dict"),
            (dict(evolve_kwargs={"students": {"epsilom": 0.1}}), InvalidValueError, "Did you mean `epsilon`"),
            (dict(evolve_kwargs={"judges": {}}), InvalidValueError, "'judges', which is not a population"),
            (dict(chat="yes"), InvalidTypeError, "`chat` must be a bool"),
        ]
        for kwargs, error, message in cases:
            with pytest.raises(error, match=message):
                SelfPlay(t, s, tok, task, **kwargs)
        with pytest.raises(InvalidTypeError, match="`task` must be a populora.tasks.Task"):
            SelfPlay(t, s, tok, object())
        with pytest.raises(InvalidTypeError, match="`tokenizer` must have a `apply_chat_template` method"):
            SelfPlay(
                t, s, object.__new__(type("Tok", (), {"decode": lambda self: 0, "__call__": lambda self: 0})), task
            )


# ---------------------------------------------------------------------------------------------- example


def test_example_smoke_mode_writes_json_and_plot(tmp_path):
    pytest.importorskip("matplotlib")
    spec = importlib.util.spec_from_file_location("selfplay_arithmetic", ROOT / "examples" / "selfplay_arithmetic.py")
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    example.main(
        ["--model", "tiny", "--steps", "2", "--out", str(tmp_path), "--quiet", "--threads", "1", "--pg-lr", "0.05"]
    )
    result = json.loads((tmp_path / "results.json").read_text())
    assert result["model"] == "tiny random Llama" and result["steps"] == 2 and result["pg_lr"] == 0.05
    assert len(result["history"]) == 2
    for key in (
        "base_heldout",
        "mean_student_heldout_before",
        "mean_student_heldout_after",
        "chosen_student_heldout",
        "validity",
        "tokens_per_s",
        "wall_s",
    ):
        assert key in result
    assert 0.0 <= result["chosen_student_heldout"] <= 1.0
    assert (tmp_path / "accuracy.png").stat().st_size > 0
    assert re.fullmatch(r"\d+", str(result["chosen_student"]))


# ---------------------------------------------------------------------------------------------- run (the loop)


class _FakeTime:
    """populora.loops.base's ``time`` (``run`` is ``run_steps``): ``monotonic`` moved on by the test, ``perf_counter`` the real one."""

    def __init__(self):
        import time

        self.now, self.perf_counter = 50.0, time.perf_counter

    def monotonic(self):
        return self.now


def test_run_steps_callback_and_records(capsys, monkeypatch):
    from populora import stats

    monkeypatch.setattr(stats, "bars_shown", lambda: True)  # pytest's stderr is no terminal: drawn all the same
    sp = make()
    seen = []
    records = sp.run(2, callback=seen.append, progress=True)
    assert records == seen == sp.history and [r.step for r in records] == [0, 1]
    bar = capsys.readouterr().err.replace("\r", "\n").strip().splitlines()[-1]
    assert bar.startswith("self-play steps:") and "2/2 [" in bar and "validity=" in bar, bar
    assert sp.run(5, callback=lambda record: True) == sp.history[2:] and sp.steps == 3  # True stops the loop


def test_run_stops_after_the_first_step_past_max_seconds(monkeypatch):
    from populora.loops import base as module

    clock = _FakeTime()
    monkeypatch.setattr(module, "time", clock)
    sp = make()

    def tick(record):
        clock.now += 10.0

    # steps are judged 0, 10, 20, 30 fake seconds after the call: the fourth is the first at or past 25
    assert len(sp.run(max_seconds=25.0, callback=tick)) == 4
    assert len(sp.run(2, max_seconds=1e6, callback=tick)) == 2  # the steps bind first


def test_record_as_dict_is_numbers_only_and_reads_back():
    from populora.loops.selfplay.scores import SelfPlayRecord

    for anchors in (2, 0):
        record = make(anchors=anchors).run(1)[0]
        row = record.as_dict()
        assert all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in row.values())
        assert ("anchor_accuracy" in row) == (anchors > 0)  # None is left out
        assert SelfPlayRecord.from_dict(row) == record


def test_run_checks_its_arguments_before_any_step():
    sp = make()
    with pytest.raises(InvalidValueError, match=r"PopuLoRA.run needs a budget .* it would never stop"):
        sp.run()
    with pytest.raises(InvalidValueError, match=r"`Budget.max_steps` must be an int >= 1, got 0"):
        sp.run(0)
    with pytest.raises(InvalidValueError, match=r"`Budget.max_seconds` must be a finite number > 0"):
        sp.run(max_seconds=-1.0)
    with pytest.raises(InvalidTypeError, match=r"`callback` must be callable"):
        sp.run(1, callback=3)
    assert sp.steps == 0 and sp.history == []


def test_example_honours_a_tiny_budget_with_one_step_and_progress_from_the_start(tmp_path, capsys):
    """--minutes far below what the run takes: still one training step, and output before the model loads."""
    pytest.importorskip("matplotlib")
    spec = importlib.util.spec_from_file_location("selfplay_arithmetic", ROOT / "examples" / "selfplay_arithmetic.py")
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    result = example.main(["--model", "tiny", "--minutes", "1e-6", "--out", str(tmp_path), "--threads", "1"])
    assert result["steps"] == 1 and len(result["history"]) == 1  # the budget is spent: one step, then stop
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("loading the model (tiny); budget 1e-06 min")
    assert any(line.startswith("step 0: validity") for line in lines)
    assert any(line.startswith("final evaluation: 4 students") for line in lines)
