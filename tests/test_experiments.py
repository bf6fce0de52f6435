"""The experiment drivers of ``experiments/`` from outside: their command line and a tiny run of each.

What a driver computes is the library's (tested where the library is); here each script is run as a user runs it:
``--help`` says where its results go, a bad value is refused with a message naming the option, a tiny run writes a
result file with sane values, and a rerun continues instead of starting over or overwriting other settings. Every
test starts a Python process (seconds each): the whole file is ``slow`` (``tests/conftest.py``).
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from populora import __version__

REPO = Path(__file__).resolve().parents[1]
EXPERIMENTS = REPO / "experiments"
DRIVERS = ("paper_loop.py", "rl_llm.py", "es_countdown.py", "pbt_digits.py")
NEEDS = {  # modules a tiny run needs beyond the core
    "paper_loop.py": ["transformers", "openskill"],
    "rl_llm.py": ["transformers"],
    "es_countdown.py": ["transformers", "matplotlib"],
    "pbt_digits.py": ["sklearn"],
}


def run(script: str, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
        "OMP_NUM_THREADS": "1",
        "PYTHONWARNINGS": "ignore",
    }
    return subprocess.run(
        [sys.executable, str(EXPERIMENTS / script), *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


def ok(proc: subprocess.CompletedProcess) -> str:
    assert proc.returncode == 0, (proc.stdout[-2000:], proc.stderr[-3000:])
    return proc.stdout


def needs(script: str) -> None:
    for module in NEEDS[script]:
        if importlib.util.find_spec(module) is None:
            pytest.skip(f"{script} needs {module}")


def without_time(rows: list[dict]) -> list[dict]:
    return [{k: v for k, v in row.items() if "time" not in k and "seconds" not in k} for row in rows]


# ----------------------------------------------------------------------------- the command line


@pytest.mark.parametrize("script", DRIVERS)
def test_help_says_what_the_driver_runs_and_that_results_go_under_the_version(script, tmp_path):
    text = ok(run(script, "--help", cwd=tmp_path))
    assert text.startswith("usage: ") and "--out" in text
    folded = " ".join(text.split())  # argparse wraps lines
    assert f"experiments/results/{__version__}/" in folded, folded
    assert list(tmp_path.iterdir()) == []  # --help writes nothing


@pytest.mark.parametrize(
    "script, args, message",
    [
        ("paper_loop.py", ["--tokens", "0"], "--tokens must be at least 1, got 0"),
        ("paper_loop.py", ["--arm", "z"], "argument --arm: invalid choice: 'z'"),
        ("rl_llm.py", ["--samples", "0"], "--samples must be at least 1, got 0"),
        ("rl_llm.py", ["--pop-size", "1"], "PBT needs --pop-size 2 or more"),
        ("es_countdown.py", ["--heldout", "0"], "--heldout must be at least 1, got 0"),
        ("pbt_digits.py", ["--fraction", "0.9"], "--fraction must be in (0, 0.5], got 0.9"),
        ("pbt_digits.py", ["--no-such-option"], "unrecognized arguments: --no-such-option"),
    ],
)
def test_a_bad_argument_is_refused_naming_it(script, args, message, tmp_path):
    proc = run(script, *args, cwd=tmp_path)
    assert proc.returncode == 2 and message in proc.stderr, proc.stderr[-2000:]
    assert proc.stderr.startswith("usage: ")
    assert list(tmp_path.iterdir()) == []


def test_queues_are_portable_and_parse():
    queues = sorted((EXPERIMENTS / "queues").glob("*.sh"))
    assert {q.name for q in queues} >= {"paper_loop.sh", "paper_cost.sh", "envs_presets.sh", "_common.sh"}
    for queue in queues:
        text = queue.read_text()
        assert not re.search(r"/work/|/tmp/|/home/|\.venv/", text), queue.name  # no machine's paths
        if queue.name != "_common.sh":
            assert 'source "$(dirname "$0")/_common.sh"' in text, queue.name
        assert subprocess.run(["bash", "-n", str(queue)]).returncode == 0, queue.name
    common = (EXPERIMENTS / "queues" / "_common.sh").read_text()
    assert "PY=${PYTHON:-python}" in common and 'cd "$(dirname "${BASH_SOURCE[0]}")/../.."' in common


# ----------------------------------------------------------------------------- tiny runs


def test_pbt_digits_tiny_run_writes_its_results_and_a_rerun_keeps_the_finished_seeds(tmp_path):
    needs("pbt_digits.py")
    tiny = ["--steps", "8", "--interval", "4", "--subset", "400", "--pop-size", "4", "--hidden", "32"]
    out = tmp_path / "results" / "pbt.json"
    ok(run("pbt_digits.py", *tiny, "--seeds", "0", "--out", str(out), cwd=tmp_path))
    saved = json.loads(out.read_text())
    assert saved["status"] == "finished" and saved["populora"] == __version__
    assert saved["command"].startswith("python experiments/pbt_digits.py ")
    (seed,) = saved["seeds"]
    assert seed["seed"] == 0 and [r["step"] for r in seed["pbt"]["replacements"]] == [4, 8]
    assert 0 <= seed["pbt"]["test_accuracy"] <= 1 and len(seed["independent"]["runs"]) == 4
    best = max(r["test_accuracy"] for r in seed["independent"]["runs"])
    assert seed["independent"]["best_test_accuracy"] == best
    assert saved["summary"]["gap_to_best_points"] == pytest.approx(100 * (seed["pbt"]["test_accuracy"] - best))

    again = ok(run("pbt_digits.py", *tiny, "--seeds", "0", "1", "--out", str(out), cwd=tmp_path))
    assert f"seed 0: taken from {out}" in again
    more = json.loads(out.read_text())
    assert [s["seed"] for s in more["seeds"]] == [0, 1] and more["seeds"][0] == seed

    refused = run("pbt_digits.py", *tiny, "--seeds", "1", "--out", str(out), cwd=tmp_path)
    assert refused.returncode != 0 and "holds finished seeds [0] that --seeds leaves out" in refused.stderr
    refused = run("pbt_digits.py", *tiny, "--lr", "1e-2", "--seeds", "0", "--out", str(out), cwd=tmp_path)
    assert refused.returncode != 0 and "holds results of other options {'lr': (0.003, 0.01)}" in refused.stderr
    assert json.loads(out.read_text()) == more  # neither refusal touched the file


def test_rl_llm_tiny_run_resumes_to_the_uninterrupted_run_and_scores_as_es_countdown(tmp_path):
    needs("rl_llm.py")
    needs("es_countdown.py")
    tiny = ["--model", "tiny", "--kl-coef", "0.01"]
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    ok(run("rl_llm.py", *tiny, "--steps", "2", "--out", str(a), "--checkpoint", str(tmp_path / "ca"), cwd=tmp_path))
    ok(run("rl_llm.py", *tiny, "--steps", "1", "--out", str(b), "--checkpoint", str(tmp_path / "cb"), cwd=tmp_path))
    assert json.loads(b.read_text())["steps"] == 1
    resumed = ok(
        run("rl_llm.py", *tiny, "--steps", "2", "--out", str(b), "--checkpoint", str(tmp_path / "cb"), cwd=tmp_path)
    )
    assert "resumed" in resumed and "at step 1" in resumed
    straight, again = json.loads(a.read_text()), json.loads(b.read_text())
    assert straight["status"] == again["status"] == "finished" and straight["steps"] == again["steps"] == 2
    assert straight["populora"] == __version__ and straight["command"].startswith("python experiments/rl_llm.py ")
    assert without_time(straight["curve"]) == without_time(again["curve"])
    assert straight["replacements"] == again["replacements"] != []  # PBT every 2 validations: at step 2
    assert straight["heldout"] == again["heldout"]
    h = straight["heldout"]
    assert h["n"] == 8 and 0 <= h["before"] <= 1 and 0 <= h["after"] <= 1
    assert h["exposure"]["rows_trained_on"] == 0 and h["exposure"]["rows_in_validation"] == 0

    refused = run(
        "rl_llm.py", *tiny, "--lr", "1e-3", "--out", str(a), "--checkpoint", str(tmp_path / "c"), cwd=tmp_path
    )
    assert refused.returncode != 0 and f"{a} holds results of other options" in refused.stderr

    # ES at equal time is compared with it on the results page: same problems, same greedy replies of the base
    ok(
        run(
            "es_countdown.py",
            "--model",
            "tiny",
            "--steps",
            "1",
            "--no-shrink",
            "--out",
            str(tmp_path / "es"),
            cwd=tmp_path,
        )
    )
    es = json.loads((tmp_path / "es" / "results.json").read_text())["heldout"]
    for key in ("n", "prompts_sha256", "replies_before", "before_interval"):
        assert es[key] == h[key], key
    assert es["right"]["before"] == h["right"]["before"]


def test_es_countdown_tiny_run_with_almost_no_budget_still_takes_one_step(tmp_path):
    needs("es_countdown.py")
    out = tmp_path / "es"
    text = ok(run("es_countdown.py", "--model", "tiny", "--minutes", "1e-6", "--out", str(out), cwd=tmp_path))
    assert text.startswith("loading the model (tiny); budget 1e-06 min")
    saved = json.loads((out / "results.json").read_text())
    assert saved["steps"] == 1 and [row["step"] for row in saved["curve"]] == [0, 1]
    assert saved["populora"] == __version__ and saved["command"].startswith("python experiments/es_countdown.py ")
    for key in ("before", "after", "chosen"):
        assert 0.0 <= saved["heldout"][key] <= 1.0
    assert saved["tokens_per_s"] > 0 and saved["wall_s"] > 0
    assert (out / "curve.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    refused = run(
        "es_countdown.py", "--model", "tiny", "--mode", "lora", "--minutes", "1e-6", "--out", str(out), cwd=tmp_path
    )
    assert refused.returncode != 0 and "holds results of other settings" in refused.stderr
    # too few distinct problems for the sets asked: refused, naming the option (Countdown(1) has 138)
    few = run(
        "es_countdown.py",
        "--model",
        "tiny",
        "--task",
        "countdown",
        "--heldout",
        "150",
        "--out",
        str(tmp_path / "c"),
        cwd=tmp_path,
    )
    assert few.returncode != 0 and "fewer than --heldout 150" in few.stderr


def test_paper_loop_tiny_run_continues_with_a_larger_budget_refuses_other_settings_and_reports(tmp_path):
    needs("paper_loop.py")
    tiny = ["--arm", "b", "--model", "tiny", "--threads", "1"]
    run_dir, fresh_dir = tmp_path / "run", tmp_path / "fresh"
    ok(run("paper_loop.py", *tiny, "--tokens", "100", "--out", str(run_dir), cwd=tmp_path))
    result = run_dir / "results" / "tiny-arithmetic-b-seed0.json"
    first = json.loads(result.read_text())
    assert first["populora"] == __version__ and first["command"].startswith("python experiments/paper_loop.py ")
    assert first["counted_tokens"] >= 100 and first["heldout_seen_in_training"] == 0 and first["invocations"] == 1
    assert sorted(first["scores"]) == ["bare", "neighbour", "paraphrase", "template"]
    assert all(0 <= v <= 1 for v in first["scores"].values()) and all(
        len(v) == 8 for v in first["per_problem"].values()
    )
    assert (run_dir / "results" / "base-tiny-arithmetic.json").exists()

    # a larger budget continues the same run: step for step the run a fresh invocation with that budget takes
    ok(run("paper_loop.py", *tiny, "--tokens", "200", "--out", str(run_dir), cwd=tmp_path))
    ok(run("paper_loop.py", *tiny, "--tokens", "200", "--out", str(fresh_dir), cwd=tmp_path))
    more = json.loads(result.read_text())
    fresh = json.loads((fresh_dir / "results" / "tiny-arithmetic-b-seed0.json").read_text())
    assert more["invocations"] == 2 and len(more["history"]) > len(first["history"])
    assert without_time(more["history"]) == without_time(fresh["history"])
    assert more["counted_tokens"] == fresh["counted_tokens"]

    refused = run("paper_loop.py", *tiny, "--tokens", "200", "--lr", "1e-3", "--out", str(run_dir), cwd=tmp_path)
    assert refused.returncode != 0 and "other settings" in refused.stderr
    table = ok(run("paper_loop.py", "--report", "--out", str(run_dir), cwd=tmp_path))
    assert "| arithmetic | b | 0 | " in table and "| arithmetic | base |" in table
