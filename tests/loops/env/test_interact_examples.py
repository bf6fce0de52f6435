"""Examples write their plots and files under a folder git ignores (``outputs/``), never the repo root.

Every example's source is scanned for the calls that write files; the only
one that writes (``coevolve_sine.py``, its plot) must default to
``outputs/`` in the repository, which ``.gitignore`` lists, and must create
the folder it writes to.
"""

from __future__ import annotations

import ast
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
EXAMPLES = sorted((REPO / "examples").glob("*.py"))
WRITERS = {"savefig", "save", "write_text", "write_bytes", "to_csv", "imwrite", "atomic_save", "mkdir"}


def writes(path: Path) -> set[str]:
    """Names of file-writing calls in a script (``open(..., 'w')`` counts as ``open``)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call):
            name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
            if name in WRITERS:
                found.add(name)
            if name == "open" and any(
                isinstance(a, ast.Constant) and isinstance(a.value, str) and set(a.value) & set("wax")
                for a in node.args[1:]
            ):
                found.add("open")
            if name == "Checkpointing" and (node.args or any(k.arg == "dir" for k in node.keywords)):
                found.add("Checkpointing")  # evolve_with_env(checkpointing=Checkpointing(dir)) writes a checkpoint
    return found


def test_only_known_examples_write_files_and_they_default_to_the_ignored_outputs_folder():
    writers = {path.name: writes(path) for path in EXAMPLES}
    assert {name for name, calls in writers.items() if calls - {"mkdir"}} == {
        "coevolve_sine.py",
        "llm_population.py",
        "selfplay_arithmetic.py",
        "selfplay_distributed.py",  # only with --save PATH (no default: it writes nowhere unless asked)
    }, writers  # the experiment drivers (experiments/) write their results under experiments/results/<version>/
    for name in ("llm_population", "selfplay_arithmetic"):
        text = (REPO / "examples" / f"{name}.py").read_text()
        assert f'DEFAULT_OUT = Path(__file__).resolve().parents[1] / "outputs" / "{name}"' in text, name
        assert "default=DEFAULT_OUT" in text, name
        if (REPO / ".git").exists():
            out = REPO / "outputs" / name / "results.json"
            assert subprocess.run(["git", "check-ignore", "-q", str(out)], cwd=REPO).returncode == 0


def test_the_default_plot_goes_to_the_git_ignored_outputs_folder():
    spec = importlib.util.spec_from_file_location("coevolve_sine", REPO / "examples" / "coevolve_sine.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.DEFAULT_PLOT == REPO / "outputs" / "coevolve_sine.png"
    assert "/outputs/" in (REPO / ".gitignore").read_text().split()
    if (REPO / ".git").exists():
        ignored = subprocess.run(["git", "check-ignore", "-q", str(module.DEFAULT_PLOT)], cwd=REPO)
        assert ignored.returncode == 0  # git ignores the file the example writes


def test_coevolve_sine_creates_the_folder_of_its_plot(tmp_path):
    pytest.importorskip("matplotlib")
    plot = tmp_path / "outputs" / "sub" / "sine.png"
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
        "OMP_NUM_THREADS": "1",
        "MPLBACKEND": "Agg",
    }
    proc = subprocess.run(
        [
            sys.executable,
            str(REPO / "examples" / "coevolve_sine.py"),
            "--generations",
            "2",
            "--solvers",
            "4",
            "--proposers",
            "2",
            "--judges",
            "2",
            "--plot",
            str(plot),
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert plot.is_file() and plot.stat().st_size > 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["outputs"]  # nothing else in the working folder
