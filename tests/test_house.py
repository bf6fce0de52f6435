"""Habits of the repository, checked on the source: imports point down the layers, no module uses another
module's underscored names, and no test compares elapsed time with a number.

The layers are those of ``docs/architecture.md``; a package may import its own modules and any package of a
LOWER layer, never one of its own layer or above (imports inside functions count too: nothing runs back up
the layers at run time). Only the package root (``populora/__init__.py``) sits above everything.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "populora"

LAYERS = {
    # 0-1: vocabulary every layer shares
    "errors": 0,
    "checks": 1,
    "adapters": 1,
    "stats": 1,
    # 2: infrastructure that knows nothing of populations
    "checkpoint": 2,
    "distributed": 2,
    "optim": 2,
    "plotting": 2,
    "targets": 2,
    "operators": 2,
    "routing": 2,
    "tasks": 2,
    # 3: helpers built on the infrastructure
    "snapshots": 3,
    "fitness": 3,
    "llm": 3,
    # 4
    "ratings": 4,
    # 5: the population joins routing, targets and operators
    "population": 5,
    # 6: ways to improve a model
    "es": 6,
    "train": 6,
    # 7: loops against environments and between populations
    "interact": 7,
    "coevolve": 7,
    # 8: the paper's loop
    "selfplay": 8,
}

# attributes of other libraries' objects that happen to start with an underscore
FOREIGN_PRIVATE = {
    "_replace",
    "_asdict",
    "_fields",
    "_make",
    "_version",
    "_getframe",
    "_parameters",
    "_modules",
    "_buffers",
}


def modules() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def unit_of(dotted: str) -> str | None:
    """The top-level unit (package or module directly under populora) of a dotted module name."""
    parts = dotted.split(".")
    if parts[0] != "populora":
        return None
    return parts[1] if len(parts) > 1 else "populora"


def imports_of(path: Path) -> list[tuple[int, str]]:
    """``(line, dotted module)`` of every populora import in ``path``, at any depth (functions included)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    package = ".".join(path.relative_to(ROOT).with_suffix("").parts[:-1])
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names if alias.name.startswith("populora")]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join(up + ([base] if base else []))
            if not base.startswith("populora"):
                continue
            if base == "populora":  # `from populora import fitness` imports the module populora.fitness
                found += [(node.lineno, f"populora.{alias.name}") for alias in node.names]
            else:
                found.append((node.lineno, base))
    return found


def test_every_unit_has_a_layer():
    units = {p.relative_to(PACKAGE).parts[0].removesuffix(".py") for p in modules()} - {"__init__", "py.typed"}
    assert units <= set(LAYERS), f"add {sorted(units - set(LAYERS))} to LAYERS (and to docs/architecture.md)"


def test_imports_point_down_the_layers():
    bad = []
    for path in modules():
        here = path.relative_to(PACKAGE).parts[0].removesuffix(".py")
        if here == "__init__":
            continue
        for line, target in imports_of(path):
            there = unit_of(target)
            if there is None or there == here:
                continue
            if there == "populora" or LAYERS.get(there, 99) >= LAYERS[here]:
                bad.append(f"{path.relative_to(ROOT)}:{line}: {here} (layer {LAYERS[here]}) imports {target}")
    assert not bad, "imports that do not point down the layers:\n" + "\n".join(bad)


def test_no_module_uses_another_modules_underscored_names():
    bad = []
    for path in modules():
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("populora"):
                bad += [
                    f"{path.relative_to(ROOT)}:{node.lineno}: imports {alias.name} from {node.module}"
                    for alias in node.names
                    if alias.name.startswith("_") and not alias.name.startswith("__")
                ]
            elif isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__"):
                owner = node.value
                if node.attr in FOREIGN_PRIVATE or (isinstance(owner, ast.Name) and owner.id in ("self", "cls")):
                    continue
                if isinstance(owner, ast.Call) and isinstance(owner.func, ast.Name) and owner.func.id == "super":
                    continue
                bad.append(f"{path.relative_to(ROOT)}:{node.lineno}: {ast.unparse(node)}")
    assert not bad, "uses of another object's underscored names:\n" + "\n".join(bad)


TIMED = re.compile(
    r"(monotonic|perf_counter|time)\(\)\s*-\s*\w+\s*[<>]"  # time.monotonic() - start < 30
    r"|\b\w*(elapsed|duration|seconds|wall)\w*\s*[<>]=?\s*[0-9]"  # elapsed < 30
    r"|[<>]=?\s*[0-9.]+\s*\*?\s*\w*(elapsed|duration)"  # 30 > elapsed
)


def test_no_test_compares_elapsed_time_with_a_number():
    """A wall-clock bound fails on a busy CI machine; bound work by a count, an event or a subprocess timeout."""
    bad = []
    for path in sorted((ROOT / "tests").rglob("*.py")):
        if path == Path(__file__):
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            code = line.split("#", 1)[0]
            if TIMED.search(code):
                bad.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    assert not bad, "tests comparing elapsed time with a number:\n" + "\n".join(bad)


@pytest.mark.parametrize(
    "line",
    ["assert time.monotonic() - start < 30", "assert elapsed < 30.0", "self.assertTrue(wall_s <= 5)"],
)
def test_the_elapsed_time_check_catches_the_usual_forms(line):
    assert TIMED.search(line)
