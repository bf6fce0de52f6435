"""The callback rule of every loop that takes a callback: None / False go on, True stops, anything else raises."""

from __future__ import annotations

import numpy as np
import pytest

from populora.errors import InvalidTypeError
from populora.loops.base import callback_says_stop
from tests.loops.env.test_options import run as env_run
from tests.loops.selfplay.test_selfplay import make as make_selfplay

GO_ON = [None, False, np.bool_(False)]
BAD = [[], [1, 2], 1, 0, "x", 1.0]


def test_the_rule_itself():
    assert [callback_says_stop(print, v) for v in GO_ON] == [False, False, False]
    assert callback_says_stop(print, True) and callback_says_stop(print, np.bool_(True))

    def my_logger(info):
        return [1, 2]

    with pytest.raises(
        InvalidTypeError, match=r"callback .*my_logger returned \[1, 2\] \(list\); expected None, False"
    ):
        callback_says_stop(my_logger, [1, 2])
    with pytest.raises(InvalidTypeError, match=r"callback .*<lambda> returned 'x' \(str\)"):
        callback_says_stop(lambda info: "x", "x")


@pytest.mark.parametrize("algorithm", ["ga", "es"])
@pytest.mark.parametrize("value", GO_ON, ids=repr)
def test_evolve_with_env_goes_on(algorithm, value):
    result = env_run(algorithm=algorithm, callback=lambda info: value)
    assert len(result.history) == 2


@pytest.mark.parametrize("algorithm", ["ga", "es"])
def test_evolve_with_env_stops_on_true(algorithm):
    calls = []
    result = env_run(algorithm=algorithm, callback=lambda info: calls.append(1) or True)
    assert len(result.history) == 1 and len(calls) == 1


@pytest.mark.parametrize("value", BAD, ids=repr)
def test_evolve_with_env_refuses_other_values(value):
    with pytest.raises(InvalidTypeError, match=rf"callback .*<lambda> returned .* \({type(value).__name__}\)"):
        env_run(callback=lambda info: value)


@pytest.mark.parametrize("value", GO_ON, ids=repr)
def test_selfplay_run_goes_on(value):
    sp = make_selfplay()
    assert len(sp.run(2, callback=lambda record: value)) == 2


def test_selfplay_run_stops_on_true():
    sp = make_selfplay()
    assert len(sp.run(3, callback=lambda record: True)) == 1


@pytest.mark.parametrize("value", BAD, ids=repr)
def test_selfplay_run_refuses_other_values(value):
    sp = make_selfplay()
    with pytest.raises(InvalidTypeError, match=rf"callback .*<lambda> returned .* \({type(value).__name__}\)"):
        sp.run(3, callback=lambda record: value)
    assert sp.steps == 1  # raised after the first step, not read as "stop" or "go on"
