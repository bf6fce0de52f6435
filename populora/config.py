"""Typed configs: one frozen dataclass per loop or algorithm, checked when built, stored in checkpoints.

A config is passed whole (as PEFT's ``LoraConfig``), checks every field in ``__post_init__`` (a bad field is
named with its value and what was expected, before any model is wrapped), supports
``dataclasses.replace``, and round-trips through a JSON-safe dict::

    >>> from dataclasses import dataclass, replace
    >>> from populora.checks import check_float, check_int
    >>> @dataclass(frozen=True)
    ... class Toy(Config):
    ...     steps: int = 10
    ...     lr: float = 0.1
    ...     def __post_init__(self):
    ...         check_int("Toy.steps", self.steps, low=1)
    ...         check_float("Toy.lr", self.lr, low=0.0)
    >>> Toy.from_dict(Toy(steps=3).to_dict()) == Toy(steps=3)
    True
    >>> replace(Toy(), steps=0)
    Traceback (most recent call last):
    ...
    populora.errors.InvalidValueError: `Toy.steps` must be an int >= 1, got 0
    >>> try:
    ...     Toy().check_matches(Toy(lr=0.5).to_dict(), "the checkpoint")
    ... except CheckpointError as exc:
    ...     print(str(exc)[:60])
    the checkpoint was written with Toy.lr=0.5; this run has Toy

A field holding a function is written as ``{"callable": "module:qualname"}`` and rebuilt by importing it; a
lambda or a local function cannot be rebuilt from a dict (``from_dict`` says so, naming the field).
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib
import math
import types
import typing
import warnings
from collections.abc import Collection, Mapping
from typing import Any, TypeVar

from populora.errors import CheckpointError, InvalidTypeError, InvalidValueError

__all__ = ["Config", "config_from_legacy"]

C = TypeVar("C", bound="Config")

_CALLABLE = "callable"


def _json_value(name: str, value: Any) -> Any:
    if isinstance(value, Config):
        return value.to_dict()
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else repr(value)  # JSON has no inf / nan
    if isinstance(value, (tuple, list)):
        return [_json_value(f"{name}[{i}]", v) for i, v in enumerate(value)]
    if isinstance(value, Mapping):
        return {str(k): _json_value(f"{name}[{k!r}]", v) for k, v in value.items()}
    if callable(value):
        return {_CALLABLE: f"{getattr(value, '__module__', '?')}:{getattr(value, '__qualname__', repr(value))}"}
    raise InvalidTypeError(f"config field `{name}` holds {type(value).__name__}, which has no JSON form")


def _import_callable(name: str, spec: str) -> Any:
    module, _, qualname = spec.partition(":")
    if "<" in qualname or not module or not qualname:
        raise InvalidValueError(
            f"config field `{name}` was the function {spec!r}, which cannot be rebuilt from a dict "
            "(a lambda or a local function); pass the config object itself"
        )
    try:
        obj: Any = importlib.import_module(module)
        for part in qualname.split("."):
            obj = getattr(obj, part)
    except (ImportError, AttributeError) as exc:
        raise InvalidValueError(f"config field `{name}`: cannot import the function {spec!r} ({exc})") from None
    return obj


def _config_types(annotation: Any) -> list[type[Config]]:
    """The Config subclasses an annotation names (``X``, ``X | None``, ``Union[X, Y]``)."""
    options = (
        typing.get_args(annotation)
        if typing.get_origin(annotation) in (typing.Union, types.UnionType)
        else (annotation,)
    )
    return [t for t in options if isinstance(t, type) and issubclass(t, Config)]


def _from_json(name: str, value: Any, annotation: Any) -> Any:
    if isinstance(value, Mapping):
        if set(value) == {_CALLABLE}:
            return _import_callable(name, value[_CALLABLE])
        kinds = _config_types(annotation)
        if len(kinds) == 1:
            return kinds[0].from_dict(value)
        return dict(value)
    if isinstance(value, list):
        return tuple(_from_json(f"{name}[{i}]", v, Any) for i, v in enumerate(value))
    if isinstance(value, str) and value in ("inf", "-inf", "nan") and float in _plain_types(annotation):
        return float(value)
    return value


def _plain_types(annotation: Any) -> tuple[Any, ...]:
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return typing.get_args(annotation)
    return (annotation,)


def _differences(path: str, stored: Any, current: Any) -> list[tuple[str, Any, Any]]:
    if isinstance(stored, Mapping) and isinstance(current, Mapping) and _CALLABLE not in current:
        out = []
        for key in list(current) + [k for k in stored if k not in current]:
            out += _differences(f"{path}.{key}", stored.get(key, "<absent>"), current.get(key, "<absent>"))
        return out
    return [] if stored == current else [(path, stored, current)]


@dataclasses.dataclass(frozen=True)
class Config:
    """The base of every config: inherit with ``@dataclass(frozen=True)`` and check fields in ``__post_init__``."""

    def to_dict(self) -> dict[str, Any]:
        """Every field by name, JSON-safe (nested configs as dicts, tuples as lists, functions by import path)."""
        name = type(self).__name__
        return {f.name: _json_value(f"{name}.{f.name}", getattr(self, f.name)) for f in dataclasses.fields(self)}

    @classmethod
    def from_dict(cls: type[C], data: Any) -> C:
        """The config :meth:`to_dict` wrote (missing fields take their defaults; an unknown key is refused)."""
        if not isinstance(data, Mapping):
            raise InvalidTypeError(f"{cls.__name__}.from_dict takes a dict, got {type(data).__name__}")
        fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
        unknown = [k for k in data if k not in fields]
        if unknown:
            close = difflib.get_close_matches(str(unknown[0]), fields, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise InvalidValueError(
                f"{cls.__name__} has no field {unknown[0]!r}{hint}; its fields are {sorted(fields)}"
            )
        hints = typing.get_type_hints(cls)
        kwargs = {k: _from_json(f"{cls.__name__}.{k}", v, hints.get(k, Any)) for k, v in data.items()}
        return cls(**kwargs)

    def check_matches(self, stored: Any, what: str, *, ignore: Collection[str] = ()) -> None:
        """Raise :class:`~populora.errors.CheckpointError` naming the first field where ``stored`` (a dict
        :meth:`to_dict` wrote, e.g. into a checkpoint) differs from this config (fields in ``ignore`` aside:
        e.g. a seed, when the state restores the generator it seeded)."""
        if not isinstance(stored, Mapping):
            raise CheckpointError(f"{what} holds no {type(self).__name__} (got {type(stored).__name__})")
        name = type(self).__name__
        current = {k: v for k, v in self.to_dict().items() if k not in ignore}
        diff = _differences(name, {k: v for k, v in stored.items() if k not in ignore}, current)
        if diff:
            path, old, new = diff[0]
            raise CheckpointError(
                f"{what} was written with {path}={old!r}; this run has {path}={new!r} "
                "(resume with the same config, or start a new run)"
            )


def config_from_legacy(
    cls: type[C],
    config: C | None,
    legacy: Mapping[str, Any],
    *,
    where: str,
    renamed: Mapping[str, str] | None = None,
    stacklevel: int = 3,
) -> C:
    """The config of a call that may still use 0.5.0's flat keywords (deprecated for one release).

    ``legacy`` holds the flat keywords the caller passed; with none, ``config`` (or the defaults) is returned.
    ``renamed`` maps a 0.5.0 keyword to the field it became.
    With some, a ``DeprecationWarning`` names the config to pass instead, and the keywords are applied over
    ``config`` with ``dataclasses.replace`` (an unknown keyword is refused, with the closest field).
    """
    if config is not None and not isinstance(config, cls):
        raise InvalidTypeError(f"`config` of {where} must be a {cls.__name__}, got {type(config).__name__}")
    base = config if config is not None else cls()
    if not legacy:
        return base
    renamed = dict(renamed or {})
    given = list(legacy)
    legacy = {renamed.get(k, k): v for k, v in legacy.items()}
    names = {f.name for f in dataclasses.fields(cls) if f.init}
    unknown = [k for k in legacy if k not in names]
    if unknown:
        close = difflib.get_close_matches(unknown[0], names, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise InvalidTypeError(
            f"{where} takes no option {unknown[0]!r}{hint}; its options are the fields of {cls.__name__}"
        )
    warnings.warn(
        f"{where}({', '.join(f'{k}=' for k in given)}) is deprecated since 0.6.0 and goes in 0.7.0: pass "
        f"config={cls.__name__}({', '.join(f'{k}=...' for k in legacy)})",
        DeprecationWarning,
        stacklevel=stacklevel,
    )
    return dataclasses.replace(base, **legacy)
