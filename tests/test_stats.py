"""BudgetProgress: a bar only where one is seen, counting a budget that moves, drawn on the budget that binds."""

from __future__ import annotations

import io
import sys

import pytest

from populora import stats
from populora.stats import BudgetProgress, bars_shown


class Terminal(io.StringIO):
    def isatty(self):
        return True


@pytest.fixture
def terminal(monkeypatch):
    """A terminal as stderr, set in the test's own phase (pytest's capture sets sys.stderr at each phase)."""

    def use():
        stream = Terminal()
        monkeypatch.setattr(sys, "stderr", stream)
        return stream

    return use


def frames(stream):
    """What a terminal shows at each redraw (tqdm redraws with a carriage return)."""
    return [f.strip() for f in stream.getvalue().replace("\n", "\r").split("\r") if f.strip()]


def test_no_bar_where_stderr_is_neither_a_terminal_nor_a_notebook(monkeypatch):
    stream = io.StringIO()  # a log file, a pipe
    monkeypatch.setattr(sys, "stderr", stream)
    monkeypatch.delitem(sys.modules, "IPython", raising=False)
    assert not bars_shown()
    bar = BudgetProgress({"generations": 3}, show=True)
    bar.update({"generations": 1})
    bar.close()
    assert bar.bar is None and stream.getvalue() == ""


def test_a_jupyter_kernel_shows_bars(monkeypatch):
    monkeypatch.setattr(sys, "stderr", io.StringIO())

    class Shell:
        config = {"IPKernelApp": {}}

    class FakeIPython:
        @staticmethod
        def get_ipython():
            return Shell()

    monkeypatch.setitem(sys.modules, "IPython", FakeIPython)
    assert bars_shown()
    Shell.config = {}  # IPython in a terminal: stderr decides
    assert not bars_shown()


def test_the_bar_starts_on_a_count_not_on_an_idle_clock(terminal):
    terminal = terminal()
    bar = BudgetProgress({"seconds": 600.0, "env steps": None, "generations": 10}, {"generations": 0}, show=True)
    assert bar.binding == "generations"
    for g in range(1, 4):
        bar.update({"generations": g, "seconds": 2.0 * g})
    bar.close()
    shown = frames(terminal)
    assert shown[0].startswith("generations:") and "0/10" in shown[0]
    assert not any(f.startswith("seconds") for f in shown), shown  # no `seconds 0/600` that never moves
    assert "3/10" in shown[-1]


def test_the_bar_switches_to_the_budget_that_binds_and_keeps_its_scale(terminal):
    terminal = terminal()
    bar = BudgetProgress({"seconds": 100.0, "generations": 10}, show=True)
    bar.update({"generations": 1, "seconds": 50.0})  # half the time, a tenth of the generations
    assert bar.binding == "seconds" and bar.bar.total == 100 and bar.bar.n == 50
    bar.update({"generations": 2, "seconds": 100.0})
    bar.close()
    assert frames(terminal)[-1].startswith("seconds:") and "100/100" in frames(terminal)[-1]


def test_bookkeeping_without_a_bar_is_the_same():
    bar = BudgetProgress({"seconds": 100.0, "generations": 10}, show=False)
    assert bar.binding == "generations" and bar.fraction() == 0.0
    bar.update({"generations": 5, "seconds": 10.0})
    assert bar.binding == "generations" and bar.fraction() == 0.5 and bar.spent() == []
    assert bar.update({"generations": 10}).spent() == ["generations"]
    assert stats.PREFERRED["generations"] < stats.PREFERRED["seconds"]
