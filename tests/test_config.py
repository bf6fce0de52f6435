"""The config base: JSON round trip, replace, field checks, mismatch naming the field, legacy keywords."""

import dataclasses
import json
import math
import os.path
import warnings
from dataclasses import dataclass

import pytest

from populora.checks import check_float, check_int
from populora.config import Config, config_from_legacy
from populora.errors import CheckpointError, InvalidTypeError, InvalidValueError


@dataclass(frozen=True)
class Inner(Config):
    width: int = 4

    def __post_init__(self):
        check_int("Inner.width", self.width, low=1)


@dataclass(frozen=True)
class Outer(Config):
    steps: int = 10
    lr: float = 0.1
    clip: float = math.inf
    inner: Inner = Inner()
    maybe: Inner | None = None
    sizes: tuple[int, ...] = (1, 2)
    fn: object = None

    def __post_init__(self):
        check_int("Outer.steps", self.steps, low=1)
        check_float("Outer.lr", self.lr, low=0.0)


def test_round_trip_through_json_is_equal():
    c = Outer(steps=3, inner=Inner(7), maybe=Inner(2), sizes=(3, 4, 5), fn=os.path.join)
    d = json.loads(json.dumps(c.to_dict()))
    assert d["inner"] == {"width": 7} and d["sizes"] == [3, 4, 5] and d["clip"] == "inf"
    back = Outer.from_dict(d)
    assert back == c and back.fn is os.path.join and isinstance(back.inner, Inner)


def test_from_dict_refuses_unknown_key_with_suggestion_and_checks_fields():
    with pytest.raises(InvalidValueError, match="'stepz'.*did you mean 'steps'"):
        Outer.from_dict({"stepz": 3})
    with pytest.raises(InvalidValueError, match="Inner.width"):
        Outer.from_dict({"inner": {"width": 0}})
    with pytest.raises(InvalidTypeError, match="takes a dict"):
        Outer.from_dict([1])


def test_lambda_field_cannot_be_rebuilt():
    d = Outer(fn=lambda x: x).to_dict()
    with pytest.raises(InvalidValueError, match="Outer.fn.*lambda"):
        Outer.from_dict(d)


def test_replace_checks_and_frozen():
    with pytest.raises(InvalidValueError, match="Outer.lr"):
        dataclasses.replace(Outer(), lr=-1.0)
    with pytest.raises(dataclasses.FrozenInstanceError):
        Outer().steps = 2  # type: ignore[misc]


def test_check_matches_names_nested_field():
    Outer().check_matches(Outer().to_dict(), "x")
    with pytest.raises(CheckpointError, match=r"Outer.inner.width=4; this run has Outer.inner.width=5"):
        Outer(inner=Inner(5)).check_matches(Outer().to_dict(), "the checkpoint")
    with pytest.raises(CheckpointError, match="holds no Outer"):
        Outer().check_matches(None, "the checkpoint")


def test_config_from_legacy():
    assert config_from_legacy(Outer, None, {}, where="f") == Outer()
    with pytest.warns(DeprecationWarning, match=r"config=Outer\(steps=...\)"):
        assert config_from_legacy(Outer, Outer(lr=0.5), {"steps": 2}, where="f") == Outer(steps=2, lr=0.5)
    with pytest.raises(InvalidTypeError, match="'stepz'.*'steps'"), warnings.catch_warnings():
        config_from_legacy(Outer, None, {"stepz": 2}, where="f")
    with pytest.raises(InvalidTypeError, match="must be a Outer"):
        config_from_legacy(Outer, Inner(), {}, where="f")
