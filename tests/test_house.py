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
    "log": 2,
    "targets": 2,
    "operators": 2,
    "routing": 2,
    "tasks": 2,
    "transaction": 2,
    "config": 2,
    # 3: helpers built on the infrastructure
    "snapshots": 3,
    "fitness": 3,
    "llm": 3,
    # 5: the population joins routing, targets and operators
    "population": 5,
    # 6: ways to improve a model
    "es": 6,
    "train": 6,
    # 7: the environment adapter (episodes of a routed model; no GA, no ES)
    "envs": 7,
    # 8: every loop
    "loops": 8,
    # 9: the 0.5.0 faces (re-exports of what moved into envs/ and loops/, and the deprecated module paths)
    "interact": 9,
    "coevolve": 9,
    "selfplay": 9,
    "ratings": 9,
}

# inside loops/: the rooms a loop may build on (a room imports its own modules and lower rooms only)
LOOP_ROOMS = {"base": 0, "ratings": 0, "env": 1, "pbt": 1, "coevolve": 1, "selfplay": 2}

# the lazy re-exports that point UP the layers (a module `__getattr__` importing on first use), by file: a
# face keeps 0.5.0's import working without importing a higher layer when it is imported itself
LAZY_UPWARD = {
    "populora/train/__init__.py": {"populora.loops.pbt"},
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
    "_exit",  # os._exit: the sandbox runner ends without running a program's finalizers
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


def test_loop_rooms_point_down():
    bad = []
    for path in sorted((PACKAGE / "loops").rglob("*.py")):
        parts = path.relative_to(PACKAGE / "loops").parts
        here = parts[0].removesuffix(".py")
        if here == "__init__":
            continue
        for line, target in imports_of(path):
            bits = target.split(".")
            if bits[:2] != ["populora", "loops"] or len(bits) < 3 or bits[2] == here:
                continue
            if LOOP_ROOMS.get(bits[2], 99) >= LOOP_ROOMS[here]:
                bad.append(f"{path.relative_to(ROOT)}:{line}: loops/{here} imports {target}")
    assert set(LOOP_ROOMS) >= {
        p.relative_to(PACKAGE / "loops").parts[0].removesuffix(".py") for p in (PACKAGE / "loops").rglob("*.py")
    } - {"__init__"}
    assert not bad, "loop rooms that do not point down:\n" + "\n".join(bad)


def string_imports_of(path: Path) -> set[str]:
    """The populora modules ``path`` imports by name (``importlib.import_module("populora...")``)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "import_module"
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and str(node.args[0].value).startswith("populora")
        ):
            found.add(node.args[0].value)
    return found


def moved_module(path: Path) -> str | None:
    """The new home a deprecated 0.5.0 module path forwards to, or None when ``path`` is not such a shim."""
    text = path.read_text()
    if "DeprecationWarning" not in text or "sys.modules[__name__]" not in text:
        return None
    (target,) = string_imports_of(path)
    return target


def test_upward_imports_by_name_are_the_listed_lazy_faces_or_moved_paths():
    bad = []
    for path in modules():
        rel = str(path.relative_to(ROOT))
        here = path.relative_to(PACKAGE).parts[0].removesuffix(".py")
        for target in string_imports_of(path):
            there = unit_of(target)
            if moved_module(path) == target or target in LAZY_UPWARD.get(rel, ()):
                continue
            if here != "__init__" and there != here and LAYERS.get(there, 99) >= LAYERS.get(here, -1):
                bad.append(f"{rel}: imports {target} by name")
    assert not bad, "upward imports by name that no list allows:\n" + "\n".join(bad)


def test_every_moved_path_warns_once_and_is_the_new_module():
    import subprocess
    import sys

    shims = {p: moved_module(p) for p in modules() if moved_module(p)}
    assert len(shims) >= 28
    code = (
        "import importlib, warnings\n"
        f"pairs = {[('.'.join(p.relative_to(ROOT).with_suffix('').parts), new) for p, new in shims.items()]!r}\n"
        "for old, new in pairs:\n"
        "    with warnings.catch_warnings(record=True) as w:\n"
        "        warnings.simplefilter('always')\n"
        "        m = importlib.import_module(old)\n"
        "        again = importlib.import_module(old)\n"
        "    assert m is importlib.import_module(new) is again, old\n"
        "    msgs = [str(x.message) for x in w if x.category is DeprecationWarning]\n"
        "    assert len(msgs) == 1 and old in msgs[0] and new in msgs[0], (old, msgs)\n"
        "print('ok', len(pairs))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["ok", str(len(shims))]


def test_the_faces_and_new_paths_import_silently():
    import subprocess
    import sys

    code = (
        "import warnings; warnings.simplefilter('error')\n"
        "import populora, populora.interact, populora.selfplay, populora.selfplay.paper, populora.coevolve\n"
        "import populora.train, populora.envs, populora.loops.env, populora.loops.selfplay, populora.loops.pbt\n"
        "from populora.train import PBT; from populora.interact import evolve_with_env, EnvInteractor\n"
        "from populora.selfplay import PopuLoRA, SelfPlay; from populora.coevolve import Coevolve\n"
        "import sys; assert PBT.__module__ == 'populora.loops.pbt'\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert out.returncode == 0, out.stderr


# the only functions that catch BaseException (a bare `except:` counts too): the transaction (it restores and
# re-raises), atomic file writes (they remove a half-written file and re-raise), and the sandbox's runner (the
# child process that runs a program: whatever the program raises is its result), and the by-member ranks'
# `capture`, which holds a failure (a KeyboardInterrupt too) until every rank has been told, then re-raises it
CATCH_BASE_EXCEPTION = {
    ("populora/distributed/members.py", "capture"),
    ("populora/transaction.py", "transaction"),
    ("populora/checkpoint.py", "_write_atomically"),
    ("populora/llm/peft.py", "_write_folder"),
    ("populora/tasks/_runner.py", "*"),
}


def base_exception_handlers(path: Path) -> list[tuple[str, int]]:
    """``(function, line)`` of every handler in ``path`` that catches BaseException (or everything)."""
    found: list[tuple[str, int]] = []

    def catches_all(node: ast.ExceptHandler) -> bool:
        kinds = node.type.elts if isinstance(node.type, ast.Tuple) else [node.type]
        return node.type is None or any(isinstance(k, ast.Name) and k.id == "BaseException" for k in kinds)

    def walk(node: ast.AST, where: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                walk(child, child.name)
            else:
                if isinstance(child, ast.ExceptHandler) and catches_all(child):
                    found.append((where, child.lineno))
                walk(child, where)

    walk(ast.parse(path.read_text(), filename=str(path)), "<module>")
    return found


def test_only_the_listed_functions_catch_base_exception():
    bad = []
    for path in modules():
        rel = str(path.relative_to(ROOT))
        for where, line in base_exception_handlers(path):
            if (rel, where) not in CATCH_BASE_EXCEPTION and (rel, "*") not in CATCH_BASE_EXCEPTION:
                bad.append(f"{rel}:{line}: {where} catches BaseException (use populora.transaction)")
    assert not bad, "\n".join(bad)


def test_the_base_exception_check_sees_bare_and_tuple_handlers(tmp_path):
    src = tmp_path / "m.py"
    src.write_text(
        "def f():\n    try: pass\n    except: raise\ndef g():\n    try: pass\n    except (ValueError, BaseException): raise\n"
    )
    assert base_exception_handlers(src) == [("f", 3), ("g", 6)]


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


# the callables allowed more than 12 parameters: the seed contract, and the deprecated entry points (0.7.0 drops them)
MANY_PARAMETERS = {
    "populora/loops/env/evolve.py:evolve_with_env",  # the seed's 12 flat parameters + fitness= + the option objects
}
MAX_PARAMETERS = 12


def _parameter_count(node: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    a = node.args
    named = [*a.posonlyargs, *a.args, *a.kwonlyargs]
    if named and named[0].arg in ("self", "cls"):
        named = named[1:]
    return len(named) + (a.vararg is not None) + (a.kwarg is not None)


def _is_dataclass(node: ast.ClassDef) -> bool:
    for d in node.decorator_list:
        target = d.func if isinstance(d, ast.Call) else d
        name = target.attr if isinstance(target, ast.Attribute) else getattr(target, "id", "")
        if name == "dataclass":
            return True
    return False


def public_callables_over_the_cap(paths: list[Path]) -> list[str]:
    """``file:name (count)`` of every public function, method and (non-dataclass) class constructor over the cap."""
    bad = []
    for path in paths:
        parts = path.relative_to(ROOT).parts
        if any(p.startswith("_") and p != "__init__.py" for p in parts):
            continue  # a private module
        tree = ast.parse(path.read_text(), filename=str(path))
        for top in tree.body:
            scopes: list[tuple[str, ast.AST]] = []
            if isinstance(top, (ast.FunctionDef, ast.AsyncFunctionDef)) and not top.name.startswith("_"):
                scopes.append((top.name, top))
            elif isinstance(top, ast.ClassDef) and not top.name.startswith("_"):
                for item in top.body:
                    if not isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                        continue
                    if item.name == "__init__" and not _is_dataclass(top):
                        scopes.append((top.name, item))
                    elif not item.name.startswith("_"):
                        scopes.append((f"{top.name}.{item.name}", item))
            for name, fn in scopes:
                count = _parameter_count(fn)  # type: ignore[arg-type]
                key = f"{path.relative_to(ROOT)}:{name}"
                if count > MAX_PARAMETERS and key not in MANY_PARAMETERS:
                    bad.append(f"{key} ({count})")
    return bad


def test_no_public_callable_takes_more_than_12_parameters():
    bad = public_callables_over_the_cap(modules())
    assert not bad, f"over {MAX_PARAMETERS} parameters (take a typed config instead):\n" + "\n".join(bad)


def test_the_parameter_cap_check_sees_functions_methods_and_constructors(tmp_path):
    src = tmp_path / "populora" / "m.py"
    src.parent.mkdir()
    params = ", ".join(f"p{i}" for i in range(13))
    src.write_text(
        f"def f({params}): pass\ndef g(a, *args, **kw): pass\n"
        f"class C:\n    def __init__(self, {params}): pass\n    def m(self, *, {params}): pass\n"
        f"@dataclass(frozen=True)\nclass D:\n    def __init__(self, {params}): pass\n"
    )
    global ROOT
    root, ROOT = ROOT, tmp_path
    try:
        assert public_callables_over_the_cap([src]) == [
            "populora/m.py:f (13)",
            "populora/m.py:C (13)",
            "populora/m.py:C.m (13)",
        ]
    finally:
        ROOT = root
