"""Argument checks: NumPy scalars and 0-d tensors pass, errors name the argument and are typed."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from populora import InvalidIndexError, InvalidTypeError, InvalidValueError, PopuloraError
from populora.checks import check_bool, check_float, check_index, check_int, check_one_of, check_seed


@pytest.mark.parametrize("value", [3, np.int64(3), np.int32(3), torch.tensor(3)])
def test_ints_of_every_kind_pass_as_python_ints(value):
    out = check_int("n", value, low=1)
    assert out == 3 and type(out) is int


@pytest.mark.parametrize("value", [True, np.bool_(True), 3.0, "3", None, torch.tensor([3])])
def test_non_ints_raise_type_errors_naming_the_argument(value):
    with pytest.raises(InvalidTypeError, match="`n` must be an int") as info:
        check_int("n", value)
    assert isinstance(info.value, TypeError) and isinstance(info.value, PopuloraError)


def test_int_bounds():
    assert check_int("n", 5, low=5, high=5) == 5
    with pytest.raises(InvalidValueError, match=r"`n` must be an int in \[1, 4\], got 5"):
        check_int("n", 5, low=1, high=4)
    with pytest.raises(InvalidValueError, match=r"`n` must be an int <= 4, got 5"):
        check_int("n", 5, high=4)


@pytest.mark.parametrize("value", [0.25, np.float32(0.25), np.float64(0.25), torch.tensor(0.25), 1])
def test_floats_pass(value):
    out = check_float("eps", value, low=0)
    assert type(out) is float and out in (0.25, 1.0)


def test_float_errors():
    with pytest.raises(InvalidTypeError, match="`eps` must be a real number, got str 'a'"):
        check_float("eps", "a")
    with pytest.raises(InvalidValueError, match=r"`eps` must be a finite number >= 0, got -1.0"):
        check_float("eps", -1, low=0)
    with pytest.raises(InvalidValueError, match=r"`rho` must be a finite number in \(0, 1\], got 0.0"):
        check_float("rho", 0, low=0, high=1, low_open=True)
    with pytest.raises(InvalidValueError, match="`x` must be a finite number, got nan"):
        check_float("x", float("nan"))


def test_bool_index_seed_and_choices():
    assert check_bool("flag", np.bool_(False)) is False
    with pytest.raises(InvalidTypeError, match="`flag` must be a bool, got int 1"):
        check_bool("flag", 1)
    assert check_index("individual", np.int64(3), 4) == 3
    with pytest.raises(InvalidIndexError, match=r"`individual` must be an id in \[0, 4\), got 4") as info:
        check_index("individual", 4, 4)
    assert isinstance(info.value, IndexError)
    assert check_seed("seed", 2**64 - 1) == 2**64 - 1
    with pytest.raises(InvalidTypeError, match="`seed` must be an int, got float 1.5"):
        check_seed("seed", 1.5)
    with pytest.raises(InvalidValueError, match="`mode` must be one of \\['a', 'b'\\], got 'c'"):
        check_one_of("mode", "c", ["a", "b"])


def test_predicates_is_int_and_is_real():
    import numpy as np

    from populora.checks import is_int, is_real

    assert [is_int(v) for v in (3, np.int64(3), True, np.bool_(True), 3.0, "3", None)] == [
        True,
        True,
        False,
        False,
        False,
        False,
        False,
    ]
    assert [is_real(v) for v in (0.5, np.float32(0.5), 2, False, np.bool_(False), "0.5")] == [
        True,
        True,
        True,
        False,
        False,
        False,
    ]
    assert is_real(float("inf")) and not is_real(float("inf"), finite=True) and not is_real(float("nan"), finite=True)
