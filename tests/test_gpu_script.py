"""benchmarks/gpu.sh: the GPU benchmark script, run on CPU with tiny sizes (``--cpu-smoke``).

No timing is asserted: only that the same script path runs end to end, reads every stage's output
(forward, the checks of ``gpu_checks.py``, ES) and prints one summary table of the expected shape (and the
same table to summary.md). The decode step's count of GEMM operators is a count, not a timing: it is
asserted (two per target at every P).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "benchmarks" / "gpu.sh"
pytestmark = pytest.mark.skipif(
    shutil.which("bash") is None or shutil.which("timeout") is None, reason="needs bash and coreutils' timeout"
)

OVERHEAD = ["overhead: routing off", "overhead: every row BASE"]
DECODE = "decode: GEMM operators per target beyond the plain step"
GENERATE = "generate: routed / plain batched generation, tokens/s"
TRAIN = "train: training step, P individuals / one LoRA over the same rows"
MEASURES = [
    "forward all / pure, geometric mean, judged points",
    "forward all / pure, worst judged point",
    "forward all / pure, geometric mean, all points",
    "forward ids / all, geometric mean",
    "forward all / pure, transformer",
    "forward all / pure, geometric mean at P=16",
    *OVERHEAD,
    *OVERHEAD,
    DECODE,
    DECODE,
    DECODE,
    "decode: per-target GEMMs at P=64 / at P=4 (1: no product per individual)",
    GENERATE,
    GENERATE,
    GENERATE,
    TRAIN,
    TRAIN,
    "ES step throughput / plain inference",
    "ES step throughput / plain inference + the same loss",
    "ES step throughput / plain inference + the same loss, first layer per member",
    "ES step throughput / plain inference + the same loss, own rows per member",
    "selfplay: loop step, 8 adapters / 1 at equal rows per adapter, one routed batch",
    "selfplay: loop step, 8 adapters / 1 at equal rows per adapter, per-member blocks",
    "selfplay: 2 ranks by member, token ids equal to 1 process (1 = yes)",
    "selfplay: 2 ranks by member, step wall clock / 1 process",
]


def _run(*args: str, out: Path, timeout: float = 600, **env: str) -> subprocess.CompletedProcess:
    environ = dict(os.environ, PYTHON=sys.executable, GPU_BENCH_OUT=str(out), **env)
    return subprocess.run(
        ["bash", str(SCRIPT), *args], capture_output=True, text=True, timeout=timeout, env=environ, cwd=REPO
    )


def _table(text: str) -> list[list[str]]:
    return [
        [cell.strip() for cell in line.strip().strip("|").split("|")]
        for line in text.splitlines()
        if line.startswith("|")
    ]


@pytest.fixture(scope="module")
def smoke(tmp_path_factory) -> tuple[subprocess.CompletedProcess, Path]:
    out = tmp_path_factory.mktemp("gpu")
    no_wheels = tmp_path_factory.mktemp("evox-wheels")  # a folder without EvoX's wheel: EvoX is skipped
    return _run("--cpu-smoke", out=out, EVOX_WHEELS=str(no_wheels)), out


def test_cpu_smoke_prints_one_summary_table(smoke):
    proc, out = smoke
    assert proc.returncode == 0, proc.stdout + proc.stderr
    table = _table(proc.stdout)
    assert table[0] == ["measure", "point", "value", "target"]
    assert table[1] == ["---", "---", "---:", "---"]
    body = table[2:]
    assert [row[0] for row in body] == MEASURES  # one transformer point and one N in the smoke grid
    assert all(len(row) == 4 for row in body)
    for measure, point, value, target in body:
        assert float(value) > 0, (measure, value)  # every cell filled: both benchmarks were read
    rows = {row[0]: row for row in body}
    assert rows["forward all / pure, geometric mean, judged points"][1].startswith("mlp d=256 (")
    assert rows["forward all / pure, geometric mean at P=16"][3] == "<= 1.10"
    # the decode step of many individuals runs the two low-rank products as one launch each, at every P
    decode = [row for row in body if row[0] == DECODE]
    assert [row[1] for row in decode] == ["P=4, 8 rows", "P=16, 32 rows", "P=64, 128 rows"]
    assert all(float(row[2]) == 2.0 for row in decode)
    assert [row[1] for row in body if row[0] == GENERATE] == [f"P={P}, {2 * P} rows, 4 new tokens" for P in (4, 16, 64)]
    assert {row[3] for row in body if row[0] in OVERHEAD} == {"<= 1.02"}
    assert rows["forward all / pure, worst judged point"][1].startswith("mlp d=256 r=")
    assert rows["ES step throughput / plain inference + the same loss"][1] == "N=4"
    assert rows["ES step throughput / plain inference + the same loss"][3] == ">= 0.90"
    assert rows["selfplay: 2 ranks by member, token ids equal to 1 process (1 = yes)"][1:] == [
        "gloo, 4 + 4 members",
        "1.000",
        "= 1",
    ]
    assert "note:" not in proc.stdout
    # EvoX skipped with its reason, in the log and under the table, and neither a row nor a failure
    assert re.search(r"gpu\.sh: evox: skipped \(no evox-\*\.whl in EVOX_WHEELS=\S*evox-wheels", proc.stderr)
    assert re.search(r"^evox: skipped \(no evox-\*\.whl in EVOX_WHEELS=\S*evox-wheels\S*\)$", proc.stdout, re.M)
    assert not (out / "evox.json").exists() and not (out / "evox.log").exists()
    assert proc.stdout.splitlines()[0].startswith("device: torch ")
    assert (out / "summary.md").read_text() == proc.stdout  # the table is kept with the logs


def test_cpu_smoke_keeps_both_benchmarks_output(smoke):
    proc, out = smoke
    assert {
        "forward.log",
        "forward.json",
        "checks.log",
        "checks.json",
        "es.log",
        "es.json",
        "summary.md",
        "env.txt",
    } <= {p.name for p in out.iterdir()}
    for stage in ("forward", "checks", "es", "selfplay", "ranks"):
        assert (out / f"{stage}.rc").read_text().strip() == "0", stage
    checks = json.loads((out / "checks.json").read_text())
    assert checks["failures"] == {} and {r["check"] for r in checks["rows"]} == {
        "overhead",
        "decode",
        "generate",
        "train",
    }
    assert all(r["value"] > 0 for r in checks["rows"])
    report = json.loads((out / "es.json").read_text())
    assert report["device"] == "cpu" and report["pops"] == [4]
    assert sorted(r["method"] for r in report["results"]) == ["ours", "ours_pm", "ours_unshared", "plain", "plain_loss"]
    assert all(r["seconds"] > 0 and r["steps"] >= 2 for r in report["results"])
    ratios = report["ratios"]
    assert set(ratios) == {
        f"{m} {kind} N=4" for m in ("ours", "ours_unshared", "ours_pm") for kind in ("thr", "thr+loss")
    }
    times = {r["method"]: r["seconds"] for r in report["results"]}
    assert ratios["ours thr+loss N=4"] == pytest.approx(times["plain_loss"] / times["ours"])
    assert "geometric mean all/pure" in (out / "forward.log").read_text()


def test_unknown_argument_is_refused(tmp_path):
    proc = _run("--fast", out=tmp_path, timeout=60)
    assert proc.returncode == 2
    assert "unknown argument '--fast' (expected --cpu-smoke or --help)" in proc.stderr
    assert proc.stdout == ""


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message given when no GPU is visible")
def test_without_a_gpu_it_says_so_and_points_to_the_smoke_run(tmp_path):
    proc = _run(out=tmp_path, timeout=120)
    assert proc.returncode == 2
    assert "no CUDA device visible to torch" in proc.stderr and "--cpu-smoke" in proc.stderr
    assert not (tmp_path / "forward.log").exists()  # nothing was started


def test_es_benchmark_refuses_unknown_methods():
    proc = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "es.py"), "--methods", "plain,fast"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    assert "unknown --methods ['fast']" in proc.stderr
