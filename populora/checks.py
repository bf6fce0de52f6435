"""Argument checks shared by every public entry point.

Each returns the value converted to a plain Python type (so NumPy scalars and
0-d tensors pass wherever Python numbers do) or raises an error that names the
argument, the value and what was expected: :class:`InvalidTypeError` for a
wrong type, :class:`InvalidValueError` for a wrong value, both
:class:`PopuloraError` subclasses.

Example:
    >>> import numpy as np
    >>> check_int("pop_size", np.int64(8), low=2)
    8
    >>> check_int("pop_size", 1, low=2)
    Traceback (most recent call last):
    ...
    populora.errors.InvalidValueError: `pop_size` must be an int >= 2, got 1
    >>> check_float("epsilon", np.float32(0.25), low=0.0)
    0.25
"""

from __future__ import annotations

import math
import numbers
from typing import Any

import torch

from populora.errors import InvalidIndexError, InvalidTypeError, InvalidValueError

__all__ = ["check_bool", "check_float", "check_index", "check_int", "check_one_of", "check_seed", "is_int", "is_real"]


def _scalar(value: Any) -> Any:
    """A 0-d tensor becomes its Python number; everything else is returned as is."""
    if isinstance(value, torch.Tensor) and value.ndim == 0 and not value.dtype.is_complex:
        return value.item()
    return value


def _is_bool(value: Any) -> bool:
    kind = type(value)
    return isinstance(value, bool) or (kind.__module__ == "numpy" and kind.__name__ in ("bool", "bool_"))


def is_int(value: Any) -> bool:
    """Whether ``value`` is a Python or NumPy integer (not a bool): a predicate, for checks that raise their own error.

    Example:
        >>> is_int(3), is_int(True), is_int(3.0)
        (True, False, False)
    """
    return isinstance(value, numbers.Integral) and not _is_bool(value)


def is_real(value: Any, *, finite: bool = False) -> bool:
    """Whether ``value`` is a Python or NumPy real number (not a bool), finite if asked.

    Example:
        >>> is_real(0.5), is_real(False), is_real(float("nan"), finite=True)
        (True, False, False)
    """
    if not isinstance(value, numbers.Real) or _is_bool(value):
        return False
    try:
        return not finite or math.isfinite(value)
    except OverflowError:  # an int beyond float64
        return False


def check_int(name: str, value: Any, *, low: int | None = None, high: int | None = None) -> int:
    """``value`` as an ``int`` in ``[low, high]`` (either bound optional); bools are refused."""
    value = _scalar(value)
    if _is_bool(value) or not isinstance(value, numbers.Integral):
        raise InvalidTypeError(f"`{name}` must be an int, got {type(value).__name__} {value!r}")
    value = int(value)
    if (low is not None and value < low) or (high is not None and value > high):
        if high is None:
            expect = f">= {low}"
        elif low is None:
            expect = f"<= {high}"
        else:
            expect = f"in [{low}, {high}]"
        raise InvalidValueError(f"`{name}` must be an int {expect}, got {value!r}")
    return value


def check_float(
    name: str,
    value: Any,
    *,
    low: float | None = None,
    high: float | None = None,
    low_open: bool = False,
    high_open: bool = False,
) -> float:
    """``value`` as a finite ``float`` within the bounds (open or closed); bools are refused."""
    value = _scalar(value)
    if _is_bool(value) or not isinstance(value, numbers.Real):
        raise InvalidTypeError(f"`{name}` must be a real number, got {type(value).__name__} {value!r}")
    try:
        value = float(value)
    except OverflowError:  # an int beyond float64
        raise InvalidValueError(
            f"`{name}` must be a finite number, got an int of {int(value).bit_length()} bits (beyond float64)"
        ) from None
    ok = math.isfinite(value)
    if ok and low is not None:
        ok = value > low if low_open else value >= low
    if ok and high is not None:
        ok = value < high if high_open else value <= high
    if not ok:
        if low is not None and high is not None:
            expect = f"in {'(' if low_open else '['}{low}, {high}{')' if high_open else ']'}"
        elif low is not None:
            expect = f"{'>' if low_open else '>='} {low}"
        elif high is not None:
            expect = f"{'<' if high_open else '<='} {high}"
        else:
            expect = "finite"
        raise InvalidValueError(
            f"`{name}` must be a finite number {expect}, got {value!r}".replace("finite number finite", "finite number")
        )
    return value


def check_bool(name: str, value: Any) -> bool:
    """``value`` as a ``bool`` (Python or NumPy bool only: ``1`` is not a bool)."""
    if not _is_bool(value):
        raise InvalidTypeError(f"`{name}` must be a bool, got {type(value).__name__} {value!r}")
    return bool(value)


def check_index(name: str, value: Any, size: int) -> int:
    """``value`` as an id in ``[0, size)``: :class:`InvalidIndexError` when out of range."""
    value = _scalar(value)
    if _is_bool(value) or not isinstance(value, numbers.Integral):
        raise InvalidTypeError(f"`{name}` must be an int id in [0, {size}), got {type(value).__name__} {value!r}")
    value = int(value)
    if not 0 <= value < size:
        raise InvalidIndexError(f"`{name}` must be an id in [0, {size}), got {value}")
    return value


def check_seed(name: str, value: Any) -> int:
    """A ``torch.Generator`` seed: an int in ``[-2**63, 2**64)``."""
    return check_int(name, value, low=-(2**63), high=2**64 - 1)


def check_one_of(name: str, value: Any, choices: Any) -> Any:
    """``value`` if it is one of ``choices``, else an error listing them."""
    choices = list(choices)
    if value not in choices:
        raise InvalidValueError(f"`{name}` must be one of {choices}, got {value!r}")
    return value
