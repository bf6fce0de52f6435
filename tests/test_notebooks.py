"""docs/notebooks/: stored without outputs (diffable), listed on the site, each with cells that check values, and
what they import is installed by the `docs` and `notebooks` extras. `.ci/run` executes them (`.ci/notebooks.py`)."""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((REPO / "docs" / "notebooks").glob("*.ipynb"))
# what a notebook imports -> the requirement (as the extras spell it) that installs it
PROVIDED_BY = {
    "matplotlib": "matplotlib",
    "gymnasium": "gymnasium",
    "peft": "populora[llm,log]",
    "transformers": "populora[llm,log]",
}


def code_cells(path: Path) -> list[str]:
    book = json.loads(path.read_text())
    return ["".join(cell["source"]) for cell in book["cells"] if cell["cell_type"] == "code"]


def test_there_are_the_four_notebooks():
    assert [p.name for p in NOTEBOOKS] == [
        "cartpole.ipynb",
        "first-population.ipynb",
        "llm-population.ipynb",
        "self-play.ipynb",
    ]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_a_notebook_is_stored_without_outputs(path):
    book = json.loads(path.read_text())
    for cell in book["cells"]:
        if cell["cell_type"] == "code":
            assert cell["outputs"] == [] and cell["execution_count"] is None, f"{path.name}: strip the outputs"
        assert "id" not in cell, f"{path.name}: cell ids (nbformat 4.5) only add noise to diffs"
    assert set(book["metadata"]) <= {"kernelspec", "language_info"}, sorted(book["metadata"])


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_a_notebook_checks_values_and_parses(path):
    cells = code_cells(path)
    for source in cells:
        ast.parse(source)
    asserts = sum(isinstance(node, ast.Assert) for source in cells for node in ast.walk(ast.parse(source)))
    assert asserts >= 2, f"{path.name}: cells that check values, not only that it ran"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_the_extras_install_what_a_notebook_imports(path):
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    modules = {
        (node.module if isinstance(node, ast.ImportFrom) else alias.name).split(".")[0]
        for source in code_cells(path)
        for node in ast.walk(ast.parse(source))
        if isinstance(node, (ast.Import, ast.ImportFrom))
        for alias in node.names
    }
    for module in sorted(modules & set(PROVIDED_BY)):
        for extra in ("docs", "notebooks"):
            assert any(r.startswith(PROVIDED_BY[module]) for r in extras[extra]), (path.name, module, extra)


def test_the_llm_notebooks_run_smollm2_when_cached_and_show_its_output():
    for name in ("llm-population.ipynb", "self-play.ipynb"):
        text = "\n".join(code_cells(REPO / "docs" / "notebooks" / name))
        assert "USE_SMOLLM2" in text and "load_smollm2()" in text, name
    for name, header in (("llm-population.ipynb", "individual "), ("self-play.ipynb", "step  validity")):
        book = json.loads((REPO / "docs" / "notebooks" / name).read_text())
        markdown = "\n".join("".join(c["source"]) for c in book["cells"] if c["cell_type"] == "markdown")
        assert "## With SmolLM2-135M-Instruct" in markdown and header in markdown, f"{name}: SmolLM2's expected output"


def test_the_site_lists_and_executes_the_notebooks():
    config = (REPO / "mkdocs.yml").read_text()
    for path in NOTEBOOKS:
        assert f"notebooks/{path.name}" in config, path.name
    assert re.search(r"mkdocs-jupyter:\n(?:\s+.*\n)*?\s+execute: true", config)
    assert re.search(r"allow_errors: false", config)
    ci = (REPO / ".ci" / "run").read_text()
    assert ".ci/notebooks.py" in ci and "--limit" in ci
