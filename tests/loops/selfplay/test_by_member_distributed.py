"""PopuLoRA by member across two gloo processes is the one-process run: token ids exactly, ratings, replacements
and history bitwise, adapters to 1e-5; checkpoints resume across world sizes (2 -> 1, 1 -> 2, 2 -> 2); a failure
on one rank is raised on both, each rank's step rolled back.

3 teachers and 3 students over 2 ranks: uneven blocks (rank 0 owns members 0 and 1, rank 1 member 2). The task
is a stub: every proposal is valid, a reply is right when its character codes sum to an even number (a fixed
pattern: mixed verdicts, so both roles have advantages), and every student answers one anchor.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

pytest.importorskip("transformers")
pytest.importorskip("openskill")

from ranks import init_gloo, save, spawn

from populora import Population
from populora.distributed import members as pm
from populora.llm import tiny_chat_model
from populora.loops.selfplay import PopuLoRA, PopuLoRAConfig
from populora.tasks import Problem, Task

BLOCK = ["model.layers.*.self_attn.*_proj", "model.layers.*.mlp.*_proj"]
STEPS = 4


class StubTask(Task):
    """Every proposal is valid; a reply is right when its character codes sum to an even number."""

    name = "stub"

    def _sample_one(self, generator: torch.Generator) -> Problem:
        code = int(torch.randint(0, 100, (1,), generator=generator))
        return Problem(task="stub", question=f"Anchor {code}?", answer=0, data={})

    @staticmethod
    def check_reply(problem: Problem, reply: str) -> bool:
        return sum(map(ord, reply)) % 2 == 0

    def proposal_prompt(self) -> str:
        return "Propose a code."

    def parse_proposal(self, text: str) -> Problem | None:
        return Problem(task="stub", question=f"Code {len(text)}?", answer=0, data={})


def make(members: int = 3, **changes) -> PopuLoRA:
    model, tokenizer = tiny_chat_model(seed=0)
    teachers = Population(model, members, 2, BLOCK, seed=1, init_scale=0.5)
    students = Population(model, members, 2, BLOCK, seed=2, init_scale=0.5)
    config = PopuLoRAConfig(
        proposals=2,
        attempts=2,
        anchors=1,
        interval=2,
        fraction=0.5,
        teacher_lr=1e-2,
        student_lr=1e-2,
        micro_batch=3,
        teacher_generate=dict(max_new_tokens=4),
        student_generate=dict(max_new_tokens=3),
        seed=3,
    )
    config = config.replace(**changes)
    return PopuLoRA(teachers, students, tokenizer, StubTask(), config=config)


# evolution only by member (the students' policy-gradient step on their owners, then every rank evolves the
# gathered population in lockstep), and 1 + 1 members on 2 ranks (rank 1 owns none and joins every collective)
EVOLVE = dict(update="evolve", attempts=1, teacher_reward="failures", match="proposal", student_pg_lr=0.05,
              student_generate=dict(max_new_tokens=3, do_sample=False), max_grad_norm=None)  # fmt: skip
OTHERS = {"evolve": (3, EVOLVE), "one_each": (1, {})}


def brief(loop: PopuLoRA, outs: list) -> dict:
    state = loop.state_dict()
    return {
        "tokens": [(o.proposal_ids, o.answer_ids) for o in outs],
        "history": [r.deterministic for r in loop.history],
        "matches": [r.matches for r in loop.history],
        "ratings": state["ratings"],
        "adapters": {n: {k: v for k, v in state[n].items() if k != "_extra_state"} for n in ("teachers", "students")},
    }


def summary(loop: PopuLoRA, outs: list) -> dict:
    state = loop.state_dict()
    return {
        "proposal_ids": [o.proposal_ids for o in outs],
        "answer_ids": [o.answer_ids for o in outs],
        "opponents": [o.opponents for o in outs],
        "history": [{k: v for k, v in r.as_dict().items() if not k.startswith("seconds")} for r in loop.history],
        "replacements": [r.as_dict() for r in loop.replacements],
        "ratings": state["ratings"],
        "samplers": state["samplers"],
        "optimizers": state["optimizers"],
        "teachers": state["teachers"],
        "students": state["students"],
    }


def _worker(rank: int, world: int, store: str, out: str, one_rank_ckpt: str) -> None:
    init_gloo(rank, world, store)
    res: dict = {}
    loop = make()
    pm.reset_traffic()
    outs = []
    for i in range(STEPS):
        outs.append(loop.step(distributed=True))
        if i == 1:
            loop.save(f"{out}/two_ranks_step2.pt")
    res["traffic"] = dict(pm.traffic)
    res["straight"] = summary(loop, outs)

    # a failure on one rank: rank 1's sandbox check raises, then rank 0's generation is interrupted
    before = summary(loop, [])
    real_check = loop.task.check
    if rank == 1:
        loop.task.check = lambda *a: (_ for _ in ()).throw(RuntimeError("boom in the check"))
    res["failure"] = _error_of(lambda: loop.step(distributed=True))
    loop.task.check = real_check
    res["rolled_back"] = _same(summary(loop, []), before)
    real_generate = loop.teachers.model.generate
    if rank == 0:
        loop.teachers.model.generate = lambda *a, **k: (_ for _ in ()).throw(KeyboardInterrupt())
    res["interrupt"] = _error_of(lambda: loop.step(distributed=True))
    loop.teachers.model.generate = real_generate
    res["rolled_back_interrupt"] = _same(summary(loop, []), before)
    retry = loop.step(distributed=True)
    res["retry"] = (retry.proposal_ids, retry.answer_ids, retry.record.deterministic[:-2])

    # the next step replaces: rank 1's replacement of the students fails, then rank 0's policy-gradient step
    from populora.loops.selfplay import loop as loop_module

    before = summary(loop, [])
    real_replace, real_pg = loop_module.replace_, loop_module.policy_gradient_step_

    def failing_replace(population, *args, **kwargs):
        if population is loop.students:
            raise RuntimeError("boom in the replacement")
        return real_replace(population, *args, **kwargs)

    def failing_pg(*args, **kwargs):
        raise RuntimeError("boom in the update")

    for key, patch in (
        ("replace", ("replace_", failing_replace, 1)),
        ("update", ("policy_gradient_step_", failing_pg, 0)),
    ):
        name, fn, where = patch
        if rank == where:
            setattr(loop_module, name, fn)
        res[f"{key}_failure"] = _error_of(lambda: loop.step(distributed=True))
        loop_module.replace_, loop_module.policy_gradient_step_ = real_replace, real_pg
        res[f"{key}_rolled_back"] = _same(summary(loop, []), before)

    # resume 2 -> 2 and 1 -> 2
    for name, path in (("resumed_2_2", f"{out}/two_ranks_step2.pt"), ("resumed_1_2", one_rank_ckpt)):
        again = make()
        again.load(path)
        more = [again.step(distributed=True) for _ in range(STEPS - 2)]
        res[name] = summary(again, more)
    for name, (members, changes) in OTHERS.items():
        other = make(members, **changes)
        res[name] = brief(other, [other.step(distributed=True) for _ in range(2)])
    batch = make(sampler="batch")
    res["batch_refused"] = (_error_of(lambda: batch.step(distributed=True)), batch.steps)
    flag = torch.ones(1)
    dist.all_reduce(flag)
    res["after"] = float(flag)
    save(res, out, rank)
    dist.destroy_process_group()


def _error_of(fn) -> tuple[str, str] | None:
    try:
        fn()
    except BaseException as error:  # KeyboardInterrupt too
        return type(error).__name__, str(error)
    return None


def _same(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return isinstance(b, (list, tuple)) and len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return a == b


def assert_same_run(got: dict, want: dict, start: int = 0) -> None:
    """Token ids exactly; history, ratings, replacements, generators bitwise; adapters and optimizer rows 1e-5."""
    assert got["proposal_ids"] == want["proposal_ids"][start:]
    assert got["answer_ids"] == want["answer_ids"][start:]
    assert got["history"] == want["history"] and got["replacements"] == want["replacements"]
    assert _same(got["ratings"], want["ratings"]) and _same(got["samplers"], want["samplers"])
    for name in ("teachers", "students"):
        mine, theirs = got[name], want[name]
        assert mine.keys() == theirs.keys() and _same(mine["_extra_state"], theirs["_extra_state"])
        for key in (k for k in mine if k != "_extra_state"):
            for i, (a, b) in enumerate(zip(mine[key], theirs[key])):  # each member's factor of each layer
                assert float((a - b).norm()) <= 1e-5 * max(float(b.norm()), 1e-12), (name, key, i)
        for param, row in want["optimizers"][name]["state"].items():
            for k, v in row.items():
                w = got["optimizers"][name]["state"][param][k]
                assert float((w - v).double().norm()) <= 1e-5 * max(float(v.double().norm()), 1e-12), (name, k)


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict:
    tmp = tmp_path_factory.mktemp("by_member")
    local = make()
    outs = [local.step()]
    outs.append(local.step())
    local.save(tmp / "one_rank_step2.pt")
    outs += [local.step() for _ in range(STEPS - 2)]
    one = summary(local, outs)
    retry = local.step()
    ranks = spawn(_worker, tmp, str(tmp / "one_rank_step2.pt"))
    resumed = make()
    resumed.load(tmp / "two_ranks_step2.pt")
    more = [resumed.step() for _ in range(STEPS - 2)]
    others = {}
    for name, (members, changes) in OTHERS.items():
        other = make(members, **changes)
        others[name] = brief(other, [other.step() for _ in range(2)])
    return {
        "others": others,
        "one": one,
        "retry": (retry.proposal_ids, retry.answer_ids, retry.record.deterministic[:-2]),
        "ranks": ranks,
        "resumed_2_1": summary(resumed, more),
    }


@pytest.mark.distributed
class TestByMember:
    def test_the_run_has_real_work_across_the_ranks(self, runs):
        one = runs["one"]
        assert all(h["matches"] > 0 for h in one["history"])
        for name in ("teachers", "students"):  # both roles took optimizer steps
            steps = [float(row["step"]) for row in one["optimizers"][name]["state"].values()]
            assert steps and min(steps) >= 1, name
        assert all(h["trained_tokens"] > 0 for h in one["history"])  # nonzero advantages every step
        owner = lambda i: pm.owner_of(i, 3, 2)
        crossed = [(t, int(s)) for o in one["opponents"] for t, s in enumerate(o.tolist()) if owner(t) != owner(s)]
        assert crossed, "no teacher met a student of the other rank"
        moved = [
            (r["name"], c, p)
            for r in one["replacements"]
            for c, p in zip(r["children"], r["parents"])
            if any(owner(x) != owner(c) for x in p)
        ]
        assert moved, "no child had a parent on the other rank"

    def test_two_ranks_are_the_one_process_run(self, runs):
        zero, one_rank = runs["ranks"]
        assert_same_run(zero["straight"], runs["one"])
        assert_same_run(one_rank["straight"], runs["one"])

    def test_bytes_were_counted_by_exchange(self, runs):
        for res in runs["ranks"]:
            traffic = res["traffic"]
            assert traffic["teacher replies"] > 0 and traffic["student replies"] > 0 and traffic["verdicts"] > 0
        assert sum(res["traffic"].get("replacement parents", 0) for res in runs["ranks"]) > 0

    def test_checkpoints_resume_across_world_sizes(self, runs):
        for res in runs["ranks"]:
            assert_same_run(res["resumed_2_2"], runs["one"], start=2)
            assert_same_run(res["resumed_1_2"], runs["one"], start=2)
        assert_same_run(runs["resumed_2_1"], runs["one"], start=2)

    def test_a_failure_on_one_rank_is_raised_on_both_and_rolled_back(self, runs):
        zero, one = runs["ranks"]
        assert one["failure"] == ("RuntimeError", "boom in the check")
        assert zero["failure"] == (
            "RankFailure",
            "checking the answers failed on rank 1: RuntimeError: boom in the check",
        )
        assert zero["interrupt"] == ("KeyboardInterrupt", "")
        assert one["interrupt"][0] == "RankFailure" and "rank 0: KeyboardInterrupt" in one["interrupt"][1]
        for res in (zero, one):
            assert res["rolled_back"] and res["rolled_back_interrupt"] and res["after"] == 2.0
            assert res["retry"] == runs["retry"]  # the retry is the step the one-process run takes next

    @pytest.mark.parametrize("name", sorted(OTHERS))
    def test_evolution_by_member_and_more_ranks_than_members_are_the_one_process_run(self, runs, name):
        want = runs["others"][name]
        for res in runs["ranks"]:
            got = res[name]
            assert got["tokens"] == want["tokens"] and got["history"] == want["history"]
            assert _same(got["ratings"], want["ratings"])
            for role in ("teachers", "students"):
                for key, value in want["adapters"][role].items():
                    for a, b in zip(got["adapters"][role][key], value):
                        assert float((a - b).norm()) <= 1e-5 * max(float(b.norm()), 1e-12), (name, role, key)
        assert all(m > 0 for m in want["matches"])
        fresh = make(OTHERS[name][0]).state_dict()["students"]
        assert any(not torch.equal(v, fresh[k]) for k, v in want["adapters"]["students"].items())  # they learnt

    def test_rl_with_the_batch_sampler_refuses_distributed_steps(self, runs):
        for res in runs["ranks"]:
            (kind, message), steps = res["batch_refused"]
            assert kind == "InvalidValueError" and "needs sampler='member'" in message and steps == 0

    def test_a_failing_replacement_or_update_on_one_rank_is_raised_on_both_and_rolled_back(self, runs):
        zero, one = runs["ranks"]
        assert one["replace_failure"] == ("RuntimeError", "boom in the replacement")
        assert zero["replace_failure"] == (
            "RankFailure",
            "replacing students failed on rank 1: RuntimeError: boom in the replacement",
        )
        assert zero["update_failure"] == ("RuntimeError", "boom in the update")
        assert one["update_failure"] == ("RankFailure", "the update failed on rank 0: RuntimeError: boom in the update")
        assert all(res["replace_rolled_back"] and res["update_rolled_back"] for res in (zero, one))
