"""The loop surface's helpers: Budget, run_steps, save_state / load_state."""

import pytest

from populora.errors import CheckpointError, InvalidTypeError, InvalidValueError
from populora.loops.base import Budget, load_state, run_steps, save_state


class Counter:
    def __init__(self):
        self.history = []

    def step(self):
        self.history.append(len(self.history))

    def state_dict(self):
        return {"history": list(self.history)}

    def load_state_dict(self, state):
        if not isinstance(state.get("history"), list):
            raise CheckpointError("no history")
        self.history = list(state["history"])


def run(c, budget, callback=None):
    return run_steps(c.step, lambda: c.history, budget, callback, False, where="Counter.run", desc="c")


def test_budget_int_and_object_and_checks():
    c = Counter()
    assert run(c, 3) == [0, 1, 2]
    assert run(c, Budget(max_steps=2)) == [3, 4]
    assert run(c, Budget(max_seconds=1e-9)) == [5]  # at least one step
    with pytest.raises(InvalidValueError, match="Budget.max_steps"):
        Budget(max_steps=0)
    with pytest.raises(InvalidValueError, match="never stop"):
        run(c, None)
    with pytest.raises(InvalidTypeError, match="`budget`"):
        run(c, "3")
    with pytest.raises(InvalidValueError, match="max_env_steps"):
        run(c, Budget(max_env_steps=10))
    with pytest.raises(InvalidTypeError, match="callable"):
        run(c, 2, callback=3)
    assert c.history == [0, 1, 2, 3, 4, 5]  # refused runs took no step


def test_callback_rule():
    c = Counter()
    assert run(c, 10, callback=lambda r: r == 1) == [0, 1]
    with pytest.raises(InvalidTypeError, match="returned \\[2\\]"):
        run(c, 10, callback=lambda r: [r])


def test_save_load_round_trip(tmp_path):
    c = Counter()
    run(c, 4)
    path = save_state(c, tmp_path / "c.ckpt", "Counter")
    d = Counter()
    load_state(d, path, "Counter")
    assert d.history == [0, 1, 2, 3]
    with pytest.raises(CheckpointError, match="holds a Counter checkpoint"):
        load_state(d, path, "Other")
