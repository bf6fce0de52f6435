"""README.md: every ```python block runs on its own, as a reader would paste it; the two commands are there, exactly
as `.ci/run` reads them; the README stays short.

The blocks run with the mechanism of the documentation site (``tests/test_docs.py``): a fresh namespace per block,
``<!-- readme: setup -->`` / ``<!-- readme: continues -->`` markers, smaller counts substituted. The API contract's
blocks (the seed READMEs) are tested on the site, where they now live.
"""

from __future__ import annotations

import re
import subprocess

import pytest
from test_docs import REPO, registries, run_unit, units  # noqa: F401 (registries: the fixture used below)

README = REPO / "README.md"
MAX_LINES = 200

TEST_COMMAND = (
    'python3 -m venv .venv && .venv/bin/pip install torch==2.13.0 -e ".[test]" && .venv/bin/python -m pytest -q'
)
EXAMPLE_COMMAND = (
    'python3 -m venv .venv && .venv/bin/pip install torch==2.13.0 -e ".[examples]" && '
    ".venv/bin/python examples/cartpole.py"
)


@pytest.mark.usefixtures("registries")
@pytest.mark.parametrize("unit", units(README), ids=lambda unit: f"line{unit[0].line}")
def test_readme_block_runs_on_its_own(unit, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # blocks that save write into a scratch folder
    run_unit(unit)


def test_readme_is_at_most_200_lines():
    lines = README.read_text().count("\n")
    assert lines <= MAX_LINES, f"README.md has {lines} lines; the long form belongs on the site (docs/)"


def test_the_two_commands_follow_their_markers():
    text = README.read_text()
    for marker, command in (("ci:test", TEST_COMMAND), ("ci:example", EXAMPLE_COMMAND)):
        assert f"<!-- {marker} -->\n```bash\n{command}\n```" in text, marker


def test_ci_reads_the_test_command():
    """`.ci/run`'s own extraction (awk over the README) gives the test command, verbatim."""
    script = (REPO / ".ci" / "run").read_text()
    awk = re.search(r"cmd=\$\(awk '([^']+)' README\.md\)", script)
    assert awk, "no awk extraction in .ci/run"
    out = subprocess.run(["awk", awk.group(1), str(README)], capture_output=True, text=True, timeout=30, check=True)
    assert out.stdout.strip() == TEST_COMMAND
