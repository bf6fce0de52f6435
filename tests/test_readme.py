"""Every ```python block of README.md runs on its own, as a reader would paste it.

A block runs in a fresh namespace. Two markers, visible in the README's
source only as HTML comments, say what a block needs:

- ``<!-- readme: setup -->`` before a block: a setup block the README shows
  to say what the NEXT block assumes; both run together.
- ``<!-- readme: continues -->`` before a block: it continues the block above
  (the prose says so) and runs in that block's namespace.

Only smaller counts are substituted, so the suite stays fast.
"""

import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"

SMALLER = [  # (pattern, replacement): smaller counts only
    (r"num_generations = \d+", "num_generations = 2"),
    (r"horizon = \d+", "horizon = 20"),
    (r"range\(100\)", "range(3)"),
    (r"range\(10\)", "range(2)"),
    (r"sleep\(0\.1\)", "sleep(0.001)"),
]

_BLOCK = re.compile(r"(?:<!-- readme: (setup|continues) -->\n)?```python\n(.*?)```", re.S)


def blocks() -> list[tuple[str | None, str, int]]:
    """``(marker, code, line)`` for every python block, in order."""
    text = README.read_text()
    return [(m.group(1), m.group(2), text[: m.start(2)].count("\n") + 1) for m in _BLOCK.finditer(text)]


def units() -> list[list[tuple[str, int]]]:
    """Groups of blocks that run in one namespace: a fresh one per group."""
    groups: list[list[tuple[str, int]]] = []
    pending_setup = False
    for marker, code, line in blocks():
        if marker == "continues" or pending_setup:
            assert groups, f"README line {line}: nothing above to continue"
            groups[-1].append((code, line))
        else:
            groups.append([(code, line)])
        pending_setup = marker == "setup"
    assert not pending_setup, "the README's last block is a setup block with nothing after it"
    return groups


def test_readme_has_the_contract_blocks():
    text = "\n".join(code for _, code, _ in blocks())
    for needle in (
        "pop.select_and_merge_best_(fitnesses)",
        "pop.evaluate_distributed(eval_env)",
        "policy, history = evolve_with_env(",
        "interactor.evaluate(",
        "coevolve.step(distributed = True)",
        "es.step(x_train, mse_loss, y_train)",
        "es.apply_fitness_scores(fitnesses)",
        "compute_es_gradient(noise, rewards)",
        'torch.save(state, "checkpoint.pt")',
    ):
        assert needle in text, needle


def test_markers_are_well_formed():
    text = README.read_text()
    assert re.findall(r"<!-- readme: (\w+) -->", text) == re.findall(
        r"<!-- readme: (setup|continues) -->\n```python", text
    ), "a readme marker not right above a block"


@pytest.mark.parametrize("unit", units(), ids=lambda unit: f"line{unit[0][1]}")
def test_readme_block_runs_on_its_own(unit, tmp_path, monkeypatch):
    if any("dm_control" in code for code, _ in unit):
        pytest.importorskip("dm_control")
    monkeypatch.chdir(tmp_path)  # blocks that save write into a scratch folder
    namespace = {"__name__": "readme"}
    for code, line in unit:
        for pattern, replacement in SMALLER:
            code = re.sub(pattern, replacement, code)
        exec(compile("\n" * (line - 1) + code, str(README), "exec"), namespace)
