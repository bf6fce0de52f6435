"""Install hints and extras (issue 23): every hint names the repository install, and the `dm` extra gives a
dm_control that works (mujoco pinned below 4)."""

import importlib.util
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SOURCES = sorted(
    [
        *(ROOT / "populora").rglob("*.py"),
        *(p for folder in ("examples", "experiments", "benchmarks") for p in (ROOT / folder).glob("*.py")),
    ]
)


def extras() -> dict[str, list[str]]:
    tomllib = pytest.importorskip("tomllib")
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]


def test_no_hint_installs_the_pypi_name_populora():
    """`populora` on PyPI is an unrelated, newer release line: `pip install 'populora[llm]'` installs the wrong package."""
    wrong = re.compile(r"pip install (-U |--upgrade )?['\"]?populora\b")
    found = [
        (p.relative_to(ROOT), i + 1)
        for p in SOURCES
        for i, line in enumerate(p.read_text().splitlines())
        if wrong.search(line)
    ]
    assert found == []


def test_every_repository_install_hint_names_an_extra_that_exists():
    hint = re.compile(r"""pip install -e \\?["']\.\[([a-z,\-]+)\]\\?["']""")
    named = {
        (p.relative_to(ROOT), extra)
        for p in SOURCES
        for m in hint.finditer(p.read_text())
        for extra in m.group(1).split(",")
    }
    assert {extra for _, extra in named} >= {"llm", "examples"}  # the hints are there
    known = extras()
    assert [(where, extra) for where, extra in sorted(named) if extra not in known] == []


def test_the_dm_extra_pins_mujoco_below_4():
    dm = extras()["dm"]
    assert "dm-control" in dm and "mujoco<4" in dm


def test_dm_control_works_with_the_pinned_mujoco():
    if importlib.util.find_spec("dm_control") is None:
        pytest.skip("dm_control is not installed (pip install -e '.[dm]')")
    import mujoco
    import numpy as np
    from dm_control import suite

    assert int(mujoco.__version__.split(".")[0]) < 4
    env = suite.load("cartpole", "balance", task_kwargs={"random": 0})
    env.reset()
    step = env.step(np.zeros(env.action_spec().shape))
    assert set(step.observation) == {"position", "velocity"} and 0.0 <= step.reward <= 1.0
