"""SelfPlay.step(distributed=True) on two gloo processes: generation shared out, ranks in lockstep.

One spawn runs everything: each rank builds its SelfPlay with its OWN seeds (rank 0's state must win at
the first distributed step), runs two distributed steps, then a step
whose generation fails on rank 1 only (both ranks must raise, neither may hang).
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.distributed as dist

pytest.importorskip("transformers")
pytest.importorskip("openskill")

from ranks import init_gloo, save, spawn
from test_selfplay import adapters, make


def _worker(rank: int, world: int, store: str, out: str) -> None:
    init_gloo(rank, world, store)
    res: dict = {}
    sp = make(seed=10 + rank, pop_seed=1 + 3 * rank)
    model = sp.teachers.model
    rows: list[int] = []
    real = model.generate

    def counting(*args, **kwargs):
        rows.append(kwargs["input_ids"].shape[0])
        return real(*args, **kwargs)

    model.generate = counting
    outs = [sp.step(distributed=True) for _ in range(2)]
    res["rows"] = rows
    res["proposals"] = [o.proposals for o in outs]
    res["valid"] = [o.valid for o in outs]
    res["opponents"] = [o.opponents for o in outs]
    res["anchors"] = [o.anchors for o in outs]
    res["fitness"] = [(o.teacher_fitness, o.student_fitness) for o in outs]
    res["history"] = [r.deterministic for r in sp.history]
    res["adapters"] = {n: adapters(getattr(sp, n)) for n in ("teachers", "students")}
    res["generators"] = {n: getattr(sp, n).generator.get_state() for n in ("teachers", "students")}
    res["generator"] = sp.generator.get_state()
    res["ratings"] = copy.deepcopy(sp.ratings.state_dict())
    res["steps"] = sp.steps

    # the hybrid: each rank the gradients of its share of the rows, summed; every rank takes the same step
    hybrid = make(seed=10 + rank, pop_seed=1 + 3 * rank, student_pg_lr=0.05)
    hybrid.step(distributed=True)
    res["hybrid"] = adapters(hybrid.students)

    # a failure in one rank's share of the generation: every rank raises, then the group still works
    def failing(*args, **kwargs):
        raise RuntimeError("boom in generate")

    model.generate = failing if rank == 1 else real
    try:
        sp.step(distributed=True)
        res["failure"] = None
    except Exception as error:
        res["failure"] = (type(error).__name__, str(error))
    model.generate = real
    flag = torch.ones(1)
    dist.all_reduce(flag)
    res["after_failure"] = float(flag)
    save(res, out, rank)
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def ranks(tmp_path_factory) -> list[dict]:
    return spawn(_worker, tmp_path_factory.mktemp("selfplay_dist"))


@pytest.mark.distributed
class TestDistributed:
    def test_ranks_evolve_in_lockstep(self, ranks):
        zero, one = ranks
        assert zero["steps"] == one["steps"] == 2
        assert zero["proposals"] == one["proposals"] and zero["history"] == one["history"]
        for a, b in zip(zero["valid"], one["valid"]):
            assert torch.equal(a, b)
        for (ta, sa), (tb, sb) in zip(zero["fitness"], one["fitness"]):
            assert torch.equal(ta, tb) and torch.equal(sa, sb)
        for name in ("teachers", "students"):
            assert all(torch.equal(x, y) for x, y in zip(zero["adapters"][name], one["adapters"][name]))
            assert torch.equal(zero["generators"][name], one["generators"][name])
            for key in ("mu", "sigma", "matches"):
                assert torch.equal(zero["ratings"][key][name], one["ratings"][key][name])
        assert torch.equal(zero["generator"], one["generator"])
        assert all(torch.equal(x, y) for x, y in zip(zero["hybrid"], one["hybrid"]))
        assert sum(h[-3] for h in zero["history"]) > 0  # matches were played

    def test_rank_zeros_state_wins_at_the_first_step(self, ranks):
        """Rank 1 was built with other seeds; after the sync it plays rank 0's run: the first matchmaking and
        anchors (drawn from SelfPlay's generator before and between the generate calls) are those of a local
        run of rank 0's setup. The sampled proposals differ from it (each rank samples its share of the rows)."""
        local = make(seed=10, pop_seed=1).step()
        for res in ranks:
            assert torch.equal(res["opponents"][0], local.opponents)
            assert res["anchors"][0] == local.anchors

    def test_generation_rows_are_shared_between_the_ranks(self, ranks):
        zero, one = ranks
        per_step = [(zero["rows"][i], one["rows"][i]) for i in range(len(zero["rows"]))]
        assert len(per_step) == 4  # one teacher and one student call per step on each rank
        teachers = per_step[0::2]
        assert all(a == b == 4 for a, b in teachers)  # 4 teachers x 2 proposals = 8 rows, 4 per rank
        for (a, b), valid in zip(per_step[1::2], zero["valid"]):
            assert a + b == int(valid.sum()) + 4 * 2 and abs(a - b) <= 1  # valid problems + 2 anchors each

    def test_a_failing_generation_fails_every_rank_without_hanging(self, ranks):
        zero, one = ranks
        assert one["failure"] == ("RuntimeError", "boom in generate")
        assert zero["failure"] == ("RuntimeError", "generation failed on rank 1: RuntimeError: boom in generate")
        assert zero["after_failure"] == one["after_failure"] == 2.0
