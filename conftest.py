"""Collection rules of the whole checkout (tests/conftest.py holds the test fixtures)."""

from pathlib import Path

# the deprecated 0.5.0 module paths replace themselves with their new homes in sys.modules: their doctests
# are the new modules' and are collected there
collect_ignore = [
    str(path)
    for path in Path(__file__).parent.joinpath("populora").rglob("*.py")
    if "sys.modules[__name__] = importlib.import_module(" in path.read_text()
]
