"""populora.distributed: single-process behaviour and real 2-process gloo runs.

The multi-process tests spawn two CPU processes that meet through a FileStore
in ``tmp_path`` (no ports). Each worker runs many checks and saves what it saw
to ``rank{r}.pt``; the assertions run here, in the parent.
"""

from __future__ import annotations

import datetime
import json
import os
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from ranks import error_of, init_gloo, save

from populora import distributed as pd

WORLD = 2
REPO = Path(__file__).resolve().parents[2]


def _rank_tensors(rank: int) -> list[torch.Tensor]:
    """Tensors of several dtypes whose values depend on the rank (one non-contiguous)."""
    g = torch.Generator().manual_seed(100 + rank)
    base = torch.randn(4, 6, generator=g)
    return [
        torch.nn.Parameter(torch.randn(3, 5, generator=g)),  # requires grad
        torch.randint(0, 1000, (7,), generator=g),  # int64
        torch.rand(5, generator=g) > 0.5,  # bool
        torch.randn(2, 3, generator=g).to(torch.float16),
        base[:, ::2],  # strided view into `base`
        torch.tensor(float(rank)),  # 0-dim
    ]


def _distributed_worker(rank: int, world: int, store: str, out: str) -> None:
    init_gloo(rank, world, store)
    res: dict = {}

    res["is_distributed"] = pd.is_distributed()
    res["rank"], res["world"], res["local_rank"] = pd.process_rank(), pd.world_size(), pd.local_rank()
    res["is_main"] = pd.is_main_rank()
    res["init_again"] = pd.init_from_env()  # a group exists: no-op, still distributed
    res["local_device"] = str(pd.local_device())

    # partition + all_gather_values in id order, rank-dependent values, NaN/inf kept
    num = 7
    ids = pd.partition(num)
    res["partition"] = list(ids)
    values = torch.tensor([100.0 * rank + i for i in ids])
    if rank == 1:
        values[0] = float("nan")
        values[1] = float("-inf")
    before = pd.bytes_communicated
    res["gathered"] = pd.all_gather_values(ids, values, num)
    res["bytes"] = pd.bytes_communicated - before
    before = pd.bytes_communicated
    res["gathered_cover"] = pd.all_gather_values(ids, values, num, exact_cover=True)  # no per-id counts
    res["bytes_cover"] = pd.bytes_communicated - before

    # interleaved, reversed ids (rank 0 evens, rank 1 odds); float64 and a list input
    mine = list(range(rank, num, world))[::-1]
    res["interleaved64"] = pd.all_gather_values(mine, torch.tensor(mine, dtype=torch.float64) * 10, num)
    res["list_input"] = pd.all_gather_values(torch.tensor(mine), [i + 0.5 for i in mine], num)

    # ids missing or repeated across ranks: the same error on both ranks
    res["missing"] = error_of(pd.all_gather_values, [0] if rank == 0 else [], [1.0] if rank == 0 else [], 3)
    res["repeated"] = error_of(pd.all_gather_values, [0, 1] if rank == 0 else [1, 2], [1.0, 2.0], 3)
    # one rank fails: it raises its own error, the other quotes it
    failure = RuntimeError("boom in rank 1") if rank == 1 else None
    res["failed"] = error_of(pd.all_gather_values, list(pd.partition(4)), [0.0, 0.0], 4, error=failure)
    # invalid arguments on rank 0 only
    bad = [0.0] if rank == 0 else [0.0, 0.0]
    res["bad_args"] = error_of(pd.all_gather_values, list(pd.partition(4)), bad, 4)
    # the group still works after the errors above
    res["after_errors"] = pd.all_gather_values(pd.partition(2), [float(rank)], 2)

    # broadcast_tensors_ over several dtypes, in small buckets
    pd._BUCKET_BYTES = 16
    tensors = _rank_tensors(rank)
    pd.broadcast_tensors_(tensors, src=0)
    res["broadcast"] = [t.detach().clone() for t in tensors]
    res["broadcast_from_1"] = _rank_tensors(rank)
    pd.broadcast_tensors_(res["broadcast_from_1"], src=1)
    pd._BUCKET_BYTES = 64 * 1024 * 1024
    res["broadcast_shapes"] = error_of(pd.broadcast_tensors_, [torch.zeros(2 + rank)], what="adapters")

    # sync_if_different_: equal -> nothing; different -> warn once and repair
    same = [torch.arange(12.0).reshape(3, 4), torch.ones(3, dtype=torch.int64)]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        res["sync_equal"] = pd.sync_if_different_(same, "base model parameters")
    res["sync_equal_warnings"] = [str(w.message) for w in caught]
    differ = _rank_tensors(rank)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        res["sync_differ"] = pd.sync_if_different_(differ, "base model parameters")
        res["sync_again"] = pd.sync_if_different_(differ, "base model parameters")
    res["sync_warnings"] = [(w.category.__name__, str(w.message)) for w in caught]
    res["synced"] = [t.detach().clone() for t in differ]
    res["checksum"] = pd.checksum(differ)
    res["sync_shapes"] = error_of(pd.sync_if_different_, [torch.zeros(2 + rank)], "buffers")

    # broadcast_tensor_raw: shape and dtype unknown to the receivers
    raw_cases = [
        torch.arange(24, dtype=torch.int64).reshape(2, 3, 4).transpose(0, 2),
        torch.randn(5, 1, 2).to(torch.bfloat16),
        torch.tensor([True, False, True]),
        torch.tensor(3.25, dtype=torch.float64),
        torch.empty(0, 3),
        torch.randn(4, dtype=torch.complex64),
    ]
    res["raw_sent"] = raw_cases
    res["raw"] = [pd.broadcast_tensor_raw(t if rank == 0 else None) for t in raw_cases]
    res["raw_from_1"] = pd.broadcast_tensor_raw(torch.full((2,), 7) if rank == 1 else None, src=1)
    res["raw_none"] = error_of(pd.broadcast_tensor_raw, None)
    res["object"] = pd.broadcast_object({"seed": 1234, "from": rank} if rank == 0 else None)

    save(res, out, rank)
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory) -> list[dict]:
    """Results of ``_distributed_worker`` on ranks 0 and 1 (one spawn for the module)."""
    tmp = tmp_path_factory.mktemp("dist")
    mp.spawn(_distributed_worker, args=(WORLD, str(tmp / "store"), str(tmp)), nprocs=WORLD, join=True)
    return [torch.load(tmp / f"rank{r}.pt", weights_only=False) for r in range(WORLD)]


# ----------------------------------------------------------------- single process


class TestWithoutGroup:
    def test_defaults(self, monkeypatch):
        for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
            monkeypatch.delenv(name, raising=False)
        assert not pd.is_distributed()
        assert (pd.process_rank(), pd.world_size(), pd.local_rank(), pd.is_main_rank()) == (0, 1, 0, True)
        assert pd.local_device() == (torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu"))
        assert pd.init_from_env() is False
        assert not dist.is_initialized()

    def test_reads_torchrun_env_before_init(self, monkeypatch):
        monkeypatch.setenv("RANK", "3")
        monkeypatch.setenv("WORLD_SIZE", "4")
        monkeypatch.setenv("LOCAL_RANK", "1")
        assert (pd.process_rank(), pd.world_size(), pd.local_rank(), pd.is_main_rank()) == (3, 4, 1, False)
        assert not pd.is_distributed()

    def test_init_from_env_refuses_incomplete_env(self, monkeypatch):
        monkeypatch.setenv("WORLD_SIZE", "2")
        monkeypatch.setenv("RANK", "0")
        monkeypatch.delenv("MASTER_ADDR", raising=False)
        monkeypatch.delenv("MASTER_PORT", raising=False)
        with pytest.raises(RuntimeError, match="WORLD_SIZE=2 .* lacks MASTER_ADDR, MASTER_PORT"):
            pd.init_from_env()
        assert not dist.is_initialized()

    def test_default_timeout(self, monkeypatch):
        monkeypatch.delenv("POPULORA_DIST_TIMEOUT", raising=False)
        assert pd.default_timeout() == datetime.timedelta(seconds=600)
        monkeypatch.setenv("POPULORA_DIST_TIMEOUT", "12.5")
        assert pd.default_timeout() == datetime.timedelta(seconds=12.5)
        for bad in ("0", "-3", "soon", "inf"):
            monkeypatch.setenv("POPULORA_DIST_TIMEOUT", bad)
            with pytest.raises(ValueError, match="POPULORA_DIST_TIMEOUT"):
                pd.default_timeout()

    def test_bad_env_int(self, monkeypatch):
        monkeypatch.setenv("RANK", "zero")
        with pytest.raises(ValueError, match="`RANK` must be an integer, got 'zero'"):
            pd.process_rank()

    @pytest.mark.parametrize("num", [0, 1, 5, 7, 16, 17])
    @pytest.mark.parametrize("world", [1, 2, 3, 8])
    def test_partition_covers_every_id_once(self, num, world):
        blocks = [pd.partition(num, r, world) for r in range(world)]
        assert [i for b in blocks for i in b] == list(range(num))
        sizes = [len(b) for b in blocks]
        assert max(sizes) - min(sizes) <= 1
        assert sizes == sorted(sizes, reverse=True)  # the first ranks get the extra ids

    def test_partition_errors(self):
        with pytest.raises(ValueError, match=r"`rank` must be in \[0, 2\), got 2"):
            pd.partition(4, 2, 2)
        with pytest.raises(ValueError, match="`world` must be >= 1, got 0"):
            pd.partition(4, 0, 0)
        with pytest.raises(ValueError, match="`num` must be >= 0, got -1"):
            pd.partition(-1, 0, 1)

    def test_all_gather_values_orders_by_id(self):
        out = pd.all_gather_values([2, 0, 1], torch.tensor([2.0, 0.0, float("nan")]), 3)
        assert out.dtype == torch.float32
        torch.testing.assert_close(out, torch.tensor([0.0, float("nan"), 2.0]), equal_nan=True)
        assert pd.all_gather_values(range(2), torch.tensor([1.0, 2.0], dtype=torch.float64), 2).dtype == torch.float64
        assert pd.all_gather_values(range(2), [1, 2], 2).dtype == torch.float32
        half = pd.all_gather_values(range(2), torch.tensor([1.5, 2.5], dtype=torch.float16), 2)
        assert half.dtype == torch.float16 and half.tolist() == [1.5, 2.5]

    def test_all_gather_values_errors(self):
        with pytest.raises(ValueError, match=r"missing ids \[1\], ids given more than once \[0\]"):
            pd.all_gather_values([0, 0], [1.0, 2.0], 2)
        with pytest.raises(ValueError, match=r"`local_values` must have shape \(2,\) to match `local_ids`, got \(3,\)"):
            pd.all_gather_values([0, 1], [1.0, 2.0, 3.0], 2)
        with pytest.raises(ValueError, match=r"`local_ids` must lie in \[0, 2\), got ids from 0 to 2"):
            pd.all_gather_values([0, 2], [1.0, 2.0], 2)
        with pytest.raises(TypeError, match="`local_ids` must be integers"):
            pd.all_gather_values([0.0, 1.0], [1.0, 2.0], 2)
        with pytest.raises(KeyError, match="given error"):
            pd.all_gather_values([0, 1], [1.0, 2.0], 2, error=KeyError("given error"))

    def test_collectives_are_noops(self):
        t = torch.arange(3.0)
        pd.broadcast_tensors_([t])
        assert t.tolist() == [0.0, 1.0, 2.0]
        assert pd.sync_if_different_([t], "weights") is False
        assert pd.broadcast_object({"a": 1}) == {"a": 1}
        assert pd.broadcast_tensor_raw(t) is t
        with pytest.raises(TypeError, match="`tensor` must be a tensor, got NoneType"):
            pd.broadcast_tensor_raw(None)

    def test_checksum_sees_every_change(self):
        a = [torch.arange(12.0).reshape(3, 4), torch.ones(5, dtype=torch.int64)]
        ref = pd.checksum(a)
        assert ref.shape == (3,) and ref.dtype == torch.int64
        assert torch.equal(pd.checksum([t.clone() for t in a]), ref)
        changed = [a[0].clone(), a[1]]
        changed[0][1, 2] += 1e-6  # one ulp-scale change
        assert not torch.equal(pd.checksum(changed), ref)
        swapped = [a[0][[1, 0, 2]], a[1]]  # same multiset of values, other positions
        assert not torch.equal(pd.checksum(swapped), ref)
        assert not torch.equal(pd.checksum([a[0].reshape(4, 3), a[1]]), ref)  # same bytes, other shape
        assert not torch.equal(pd.checksum([a[1], a[0]]), ref)  # order matters
        # a non-contiguous view checksums like its contiguous copy
        view = torch.arange(20.0).reshape(4, 5)[:, ::2]
        assert torch.equal(pd.checksum([view]), pd.checksum([view.contiguous()]))


# --------------------------------------------------------------- two processes


@pytest.mark.distributed
class TestTwoRanks:
    def test_rank_queries(self, two_ranks):
        for r, res in enumerate(two_ranks):
            assert res["is_distributed"] and res["init_again"]
            assert (res["rank"], res["world"], res["local_rank"], res["is_main"]) == (r, WORLD, r, r == 0)
            assert res["local_device"] == "cpu"

    def test_partition_covers_every_id_once(self, two_ranks):
        assert two_ranks[0]["partition"] + two_ranks[1]["partition"] == list(range(7))
        assert two_ranks[0]["partition"] == [0, 1, 2, 3]

    def test_all_gather_values_in_id_order_on_both_ranks(self, two_ranks):
        expected = torch.tensor([0.0, 1.0, 2.0, 3.0, float("nan"), float("-inf"), 106.0])
        for res in two_ranks:
            torch.testing.assert_close(res["gathered"], expected, equal_nan=True)
            assert res["gathered"].dtype == torch.float32
            torch.testing.assert_close(res["interleaved64"], torch.arange(7, dtype=torch.float64) * 10)
            torch.testing.assert_close(res["list_input"], torch.arange(7.0) + 0.5)
            assert res["bytes"] == (2 * 7 + WORLD) * 4  # values, counts, failure flags in float32
            torch.testing.assert_close(res["gathered_cover"], expected, equal_nan=True)
            assert res["bytes_cover"] == (7 + WORLD) * 4  # values and failure flags only
        assert torch.equal(two_ranks[0]["gathered"].nan_to_num(), two_ranks[1]["gathered"].nan_to_num())

    def test_coverage_errors_are_raised_on_every_rank(self, two_ranks):
        for res in two_ranks:
            assert res["missing"] == (
                "InvalidValueError",
                "every id in [0, 3) must get exactly one value across all ranks; "
                "missing ids [1, 2], ids given more than once []",
            )
            assert res["repeated"][0] == "InvalidValueError" and "ids given more than once [1]" in res["repeated"][1]

    def test_a_failing_rank_fails_every_rank(self, two_ranks):
        assert two_ranks[1]["failed"] == ("RuntimeError", "boom in rank 1")
        kind, message = two_ranks[0]["failed"]
        assert kind == "RuntimeError"
        assert message == "rank(s) [1] failed while evaluating (rank 1: RuntimeError: boom in rank 1)"
        assert two_ranks[0]["bad_args"][0] == "InvalidValueError"
        assert "`local_values` must have shape (2,)" in two_ranks[0]["bad_args"][1]
        assert two_ranks[1]["bad_args"][0] == "RuntimeError"
        assert "rank 0: InvalidValueError: `local_values` must have shape (2,)" in two_ranks[1]["bad_args"][1]
        for res in two_ranks:
            assert res["after_errors"].tolist() == [0.0, 1.0]

    def test_broadcast_tensors_(self, two_ranks):
        for name, src in (("broadcast", 0), ("broadcast_from_1", 1)):
            expected = _rank_tensors(src)
            for res in two_ranks:
                for got, want in zip(res[name], expected, strict=True):
                    assert got.dtype == want.dtype and torch.equal(got.detach(), want.detach())
        assert not torch.equal(_rank_tensors(0)[0], _rank_tensors(1)[0])  # the test would notice
        for res in two_ranks:  # a layout mismatch fails on every rank instead of corrupting or aborting
            assert res["broadcast_shapes"][0] == "InvalidValueError"
            assert res["broadcast_shapes"][1].startswith("adapters have different shapes or dtypes across ranks")

    def test_sync_if_different_(self, two_ranks):
        expected = _rank_tensors(0)
        for res in two_ranks:
            assert res["sync_equal"] is False and res["sync_equal_warnings"] == []
            assert res["sync_differ"] is True and res["sync_again"] is False
            assert len(res["sync_warnings"]) == 1
            category, message = res["sync_warnings"][0]
            assert category == "UserWarning"
            assert message.startswith("base model parameters differ across ranks (rank(s) [1] differ from rank 0;")
            assert "broadcasting rank 0's. Seed their construction (torch.manual_seed)" in message
            for got, want in zip(res["synced"], expected, strict=True):
                assert torch.equal(got.detach(), want.detach())
            assert res["sync_shapes"][0] == "InvalidValueError"
            assert "buffers have different shapes or dtypes across ranks" in res["sync_shapes"][1]
        assert torch.equal(two_ranks[0]["checksum"], two_ranks[1]["checksum"])

    def test_broadcast_tensor_raw(self, two_ranks):
        sent = two_ranks[0]["raw_sent"]
        for res in two_ranks:
            for got, want in zip(res["raw"], sent, strict=True):
                assert got.dtype == want.dtype and got.shape == want.shape
                assert torch.equal(got, want)
            assert torch.equal(res["raw_from_1"], torch.full((2,), 7))
            assert res["object"] == {"seed": 1234, "from": 0}
        # rank 0 sent nothing: both ranks raise instead of waiting for a payload
        assert two_ranks[0]["raw_none"] == ("InvalidTypeError", "`tensor` must be a tensor on rank 0, got NoneType")
        assert two_ranks[1]["raw_none"] == (
            "InvalidTypeError",
            "rank 0 had no valid tensor to send in broadcast_tensor_raw",
        )


_TORCHRUN_SCRIPT = """
import json, os, sys
import torch
from populora import distributed as pd

before = dict(rank=pd.process_rank(), world=pd.world_size(), local_rank=pd.local_rank(),
              main=pd.is_main_rank(), distributed=pd.is_distributed())
first = pd.init_from_env(timeout=60)
second = pd.init_from_env()
ids = pd.partition(5)
values = pd.all_gather_values(ids, torch.tensor([10.0 * pd.process_rank() + i for i in ids]), 5)
with open(os.path.join(sys.argv[1], f"rank{pd.process_rank()}.json"), "w") as f:
    json.dump(dict(before=before, first=first, second=second, values=values.tolist(),
                   backend=torch.distributed.get_backend(), device=str(pd.local_device())), f)
"""


@pytest.mark.distributed
def test_init_from_env_under_torchrun(tmp_path):
    """The real torchrun CLI: env vars are read before init, then one gloo group is made."""
    script = tmp_path / "check.py"
    script.write_text(textwrap.dedent(_TORCHRUN_SCRIPT))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            f"--nproc-per-node={WORLD}",
            str(script),
            str(tmp_path),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(WORLD)]
    for r, res in enumerate(results):
        assert res["before"] == dict(rank=r, world=WORLD, local_rank=r, main=r == 0, distributed=False)
        assert res["first"] is True and res["second"] is True
        assert res["backend"] == "gloo" and res["device"] == "cpu"
        assert res["values"] == [0.0, 1.0, 2.0, 13.0, 14.0]


def test_split_modules_reexported_and_one_comm_device():
    """populora.distributed keeps every public name; the split modules are the same objects."""
    from populora.distributed import broadcasts, process_group

    for name in pd.__all__:
        assert hasattr(pd, name), name
    assert pd.partition is process_group.partition and pd.broadcast_tensors_ is broadcasts.broadcast_tensors_
    assert pd.comm_device() == torch.device("cpu")  # no group: the CPU
    assert pd.comm_device is process_group.comm_device is broadcasts.comm_device


def test_sync_from_main_rank_is_a_no_op_without_a_group():
    from populora import Population

    pop = Population(torch.nn.Sequential(torch.nn.Linear(3, 3)), 4, 2, seed=0)
    before = [f.down.clone() for f in pop.factors()]
    pop.sync_from_main_rank_()
    assert not pop._synced and all(torch.equal(b, f.down) for b, f in zip(before, pop.factors()))


def test_all_gather_values_num_checked_by_the_shared_checks():
    import numpy as np

    from populora.errors import InvalidTypeError, InvalidValueError

    assert pd.all_gather_values([1, 0], [2.0, 1.0], np.int64(2)).tolist() == [1.0, 2.0]
    with pytest.raises(InvalidValueError, match="`num` must be an int >= 0, got -1"):
        pd.all_gather_values([], [], -1)
    with pytest.raises(InvalidTypeError, match="`num` must be an int, got bool True"):
        pd.all_gather_values([0], [1.0], True)


def test_gather_shares_without_a_group_runs_compute_here():
    assert pd.gather_shares(lambda: ([1, 0], torch.tensor([2.0, 1.0])), 2, spread=False).tolist() == [2.0, 1.0]

    def fails():
        raise KeyError("no env")

    with pytest.raises(KeyError, match="no env"):
        pd.gather_shares(fails, 2)
