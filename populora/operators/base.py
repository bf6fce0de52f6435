"""Name registries of the genetic operators, and what they share.

Four kinds of operator, one registry each (name -> function):

- ``SELECTIONS``: survivor selection, ``fn(fitnesses (g, m), num, *, generator, **options) -> (g, num)``.
- ``PARENT_SELECTIONS``: ``fn(fitnesses (g, s), num_children, num_parents, *, generator, **options)
  -> (g, num_children, num_parents)``.
- ``CROSSOVERS``: ``fn(stacks, parents (c, k), *, fitnesses, generator, num_groups, **options)
  -> list[Factors]``.
- ``MUTATIONS``: ``fn(factors, *, epsilon, weight_scales, generator, **options) -> list[Factors]``
  (``weight_scales[t]``: the reference RMS of target ``t``'s weight; see
  :mod:`populora.operators.mutation`).

Higher fitness is better for every operator. Operators are pure, vectorised
and draw every random number from the ``generator`` they are given. A user's
function with the same signature slots in through ``register_<kind>``.

Every bad argument raises a :class:`~populora.errors.PopuloraError`:
:class:`~populora.errors.InvalidTypeError` (also a ``TypeError``) for a wrong
type, :class:`~populora.errors.InvalidValueError` (also a ``ValueError``) for a
wrong value. NumPy scalars and 0-d tensors pass wherever Python numbers do.
"""

from __future__ import annotations

import difflib
import inspect
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from torch import Tensor

from populora.adapters import Factors
from populora.checks import check_float, check_int
from populora.errors import InvalidTypeError, InvalidValueError

OperatorFn = Callable[..., Any]  # each kind returns its own (selection: a tensor of ids, mutation: Factors, ...)

SELECTIONS: dict[str, OperatorFn] = {}
PARENT_SELECTIONS: dict[str, OperatorFn] = {}
CROSSOVERS: dict[str, OperatorFn] = {}
MUTATIONS: dict[str, OperatorFn] = {}

# Optional value checks of an operator's options, ``validate(**options)``,
# keyed by (kind, name): run by ``check_options`` before anything changes.
_VALIDATORS: dict[tuple[str, str], Callable[..., object]] = {}

_REGISTRIES: dict[str, dict[str, OperatorFn]] = {
    "selection": SELECTIONS,
    "parent_selection": PARENT_SELECTIONS,
    "crossover": CROSSOVERS,
    "mutation": MUTATIONS,
}

# The arguments the population passes itself: (number of leading positional
# ones, names of the keyword ones). Everything else in a signature is an option.
_STANDARD: dict[str, tuple[int, frozenset[str]]] = {
    "selection": (2, frozenset({"generator"})),
    "parent_selection": (3, frozenset({"generator"})),
    "crossover": (2, frozenset({"fitnesses", "generator", "num_groups"})),
    "mutation": (1, frozenset({"epsilon", "weight_scales", "generator"})),
}


def _registry(kind: str) -> dict[str, OperatorFn]:
    if kind not in _REGISTRIES:
        raise InvalidValueError(f"`kind` must be one of {sorted(_REGISTRIES)}, got {kind!r}")
    return _REGISTRIES[kind]


def _register(kind: str, name: str, fn: OperatorFn | None, overwrite: bool, validate):
    registry = _registry(kind)
    if not isinstance(name, str) or not name:
        raise InvalidTypeError(f"`name` of a {kind} must be a non-empty str, got {name!r}")
    if validate is not None and not callable(validate):
        raise InvalidTypeError(f"`validate` of {kind} {name!r} must be callable, got {type(validate).__name__}")

    def add(f: OperatorFn, _stacklevel: int = 2) -> OperatorFn:  # the user frame, counted from add
        if not callable(f):
            raise InvalidTypeError(f"a {kind} must be callable, got {type(f).__name__} for {name!r}")
        if name in registry and not overwrite:
            raise InvalidValueError(f"{kind} {name!r} is already registered; pass `overwrite=True` to replace it")
        _check_keywords(kind, name, f, _stacklevel + 1)
        registry[name] = f
        _VALIDATORS.pop((kind, name), None)
        if validate is not None:
            _VALIDATORS[(kind, name)] = validate
        return f

    return add if fn is None else add(fn, 4)


def _check_keywords(kind: str, name: str, fn: OperatorFn, stacklevel: int = 2) -> None:
    """A registered function must accept the population's keyword arguments."""
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):  # builtins without a signature: trust them
        return
    if any(p.kind is p.VAR_KEYWORD for p in params.values()):
        return
    named = {n for n, p in params.items() if p.kind is not p.POSITIONAL_ONLY}
    missing = sorted(_STANDARD[kind][1] - named)
    if missing:
        raise InvalidTypeError(
            f"{kind} {name!r} must accept the keyword argument(s) {missing}; its signature is {inspect.signature(fn)}"
        )


def register_selection(
    name: str,
    fn: OperatorFn | None = None,
    *,
    overwrite: bool = False,
    validate: Callable[..., object] | None = None,
):
    """Register a survivor selection; use directly or as ``@register_selection('name')``.

    Args:
        name: the registry key (the built-ins use their function name).
        fn: ``fn(fitnesses (g, m), num, *, generator, **options) -> (g, num)``;
            omit it to use the call as a decorator.
        overwrite: replace an operator already registered under ``name``.
        validate: optional ``validate(**options)`` raising ``TypeError`` /
            ``ValueError`` (best: :class:`~populora.errors.InvalidTypeError` /
            :class:`~populora.errors.InvalidValueError`) on bad option values; :func:`check_options` runs it.

    Raises:
        InvalidValueError: ``name`` is taken and ``overwrite`` is False.
        InvalidTypeError: ``fn`` does not accept the keyword ``generator``.
    """
    return _register("selection", name, fn, overwrite, validate)


def register_parent_selection(
    name: str,
    fn: OperatorFn | None = None,
    *,
    overwrite: bool = False,
    validate: Callable[..., object] | None = None,
):
    """Register a parent selection; use directly or as a decorator. See :func:`register_selection`.

    ``fn(fitnesses (g, s), num_children, num_parents, *, generator, **options) -> (g, c, k)``.
    """
    return _register("parent_selection", name, fn, overwrite, validate)


def register_crossover(
    name: str,
    fn: OperatorFn | None = None,
    *,
    overwrite: bool = False,
    validate: Callable[..., object] | None = None,
):
    """Register a crossover; use directly or as a decorator. See :func:`register_selection`.

    ``fn(stacks, parents (c, k), *, fitnesses, generator, num_groups, **options) -> list[Factors]``
    must accept the keywords ``fitnesses``, ``generator`` and ``num_groups``.
    """
    return _register("crossover", name, fn, overwrite, validate)


def register_mutation(
    name: str,
    fn: OperatorFn | None = None,
    *,
    overwrite: bool = False,
    validate: Callable[..., object] | None = None,
):
    """Register a mutation; use directly or as a decorator. See :func:`register_selection`.

    ``fn(factors, *, epsilon, weight_scales, generator, **options) -> list[Factors]``
    must accept the keywords ``epsilon``, ``weight_scales`` and ``generator``
    (see :mod:`populora.operators.mutation` for what they mean).

    Example:
        >>> @register_mutation("identity_example")
        ... def identity_example(factors, *, epsilon, weight_scales, generator):
        ...     return [Factors(f.down.clone(), f.up.clone()) for f in factors]
        >>> get_operator("mutation", "identity_example") is identity_example
        True
        >>> del MUTATIONS["identity_example"]
    """
    return _register("mutation", name, fn, overwrite, validate)


def get_operator(kind: str, name: str) -> OperatorFn:
    """The operator registered as ``name`` under ``kind``.

    Args:
        kind: ``'selection'``, ``'parent_selection'``, ``'crossover'`` or ``'mutation'``.
        name: a registered name.

    Raises:
        InvalidValueError: unknown ``kind`` or ``name``; the message lists the
            available names and suggests the closest one.
    """
    registry = _registry(kind)
    if name not in registry:
        names = sorted(registry)
        close = difflib.get_close_matches(str(name), names, n=1)
        hint = f" Did you mean `{close[0]}`?" if close else ""
        raise InvalidValueError(f"Unknown {kind} `{name}`; available: {names}.{hint}")
    return registry[name]


def option_names(kind: str, name: str) -> list[str]:
    """Names of the options (keywords beyond the standard arguments) of an operator."""
    fn = get_operator(kind, name)
    n_positional, keywords = _STANDARD[kind]
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return []
    names = []
    for i, p in enumerate(params):
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD, p.POSITIONAL_ONLY):
            continue
        if p.kind is p.POSITIONAL_OR_KEYWORD and i < n_positional:
            continue
        if p.name not in keywords:
            names.append(p.name)
    return names


def check_options(kind: str, name: str, options: Mapping[str, object] | None) -> OperatorFn:
    """Check ``options`` against an operator's signature and value rules, without running it.

    The population calls this before changing any state, so a bad option
    never leaves a generation half done.

    Args:
        kind: the operator kind (see :func:`get_operator`).
        name: the operator's registered name.
        options: the keyword options the caller means to pass (``None`` = none).

    Returns:
        The operator.

    Raises:
        InvalidValueError: unknown ``kind`` or ``name``, or an option value out of
            range (e.g. ``rho=2``).
        InvalidTypeError: ``options`` is not a mapping, or names a keyword the operator
            does not take (the message lists the ones it does take), or one the
            population passes itself, or an option has the wrong type.
    """
    fn = get_operator(kind, name)
    if options is None:
        return fn
    if not isinstance(options, Mapping):
        raise InvalidTypeError(f"options of {kind} `{name}` must be a dict, got {type(options).__name__}")
    accepted = option_names(kind, name)
    try:
        params = inspect.signature(fn).parameters.values()
        takes_any = any(p.kind is p.VAR_KEYWORD for p in params)
    except (TypeError, ValueError):
        takes_any = True
    reserved = sorted(set(options) & _STANDARD[kind][1])
    if reserved:
        raise InvalidTypeError(
            f"{kind} `{name}` option(s) {reserved} are passed by the population itself, "
            f"not as options; accepted options: {accepted}"
        )
    unknown = sorted(k for k in options if k not in accepted)
    if unknown and not takes_any:
        raise InvalidTypeError(f"{kind} `{name}` got unexpected option(s) {unknown}; accepted options: {accepted}")
    validate = _VALIDATORS.get((kind, name))
    if validate is not None:
        validate(**options)
    return fn


def check_number(name: str, value, ok: Callable[[float], bool], expect: str, *, integer: bool = False):
    """Validate a numeric option and return it as a Python ``int`` / ``float``.

    A thin wrapper over :func:`populora.checks.check_int` /
    :func:`~populora.checks.check_float` (so NumPy scalars and 0-d tensors
    pass) plus the rule ``ok``.

    Raises:
        InvalidTypeError: not a (real or integer) number.
        InvalidValueError: not finite, or ``ok(value)`` is False.

    Example:
        >>> check_number("rho", 0.5, lambda v: 0 <= v <= 1, "in [0, 1]")
        0.5
        >>> check_number("rho", 2, lambda v: 0 <= v <= 1, "in [0, 1]")
        Traceback (most recent call last):
        ...
        populora.errors.InvalidValueError: `rho` must be in [0, 1], got 2
    """
    try:
        number = check_int(name, value) if integer else check_float(name, value)
    except InvalidTypeError:
        what = "an int" if integer else "a real number"
        raise InvalidTypeError(f"`{name}` must be {what} {expect}, got {type(value).__name__} {value!r}") from None
    except InvalidValueError:
        number = None
    if number is None or not ok(number):
        shown = value.item() if isinstance(value, Tensor) else value
        raise InvalidValueError(f"`{name}` must be {'an int ' if integer else ''}{expect}, got {shown!r}")
    return number


def call_mutation(
    fn: OperatorFn,
    factors: Sequence[Factors],
    *,
    epsilon: float,
    weight_scales: Sequence[float],
    generator: torch.Generator,
    **options,
) -> list[Factors]:
    """Run mutation ``fn`` with the population's standard arguments.

    Args:
        fn: a mutation (see :func:`register_mutation`).
        factors: per target ``Factors(down (m, d, r), up (m, e, r))``.
        epsilon: the mutation strength.
        weight_scales: per target reference RMS of the weight.
        generator: the source of randomness.
        **options: the mutation's own options.
    """
    return fn(factors, epsilon=epsilon, weight_scales=weight_scales, generator=generator, **options)


# Random draws. Every draw happens on the generator's device (so a CPU
# generator drives CUDA stacks reproducibly) and then moves to ``device``.


def check_stacks(stacks: Sequence[Factors], name: str, arg: str = "stacks", size: str = "P") -> int:
    """Every target's ``Factors(down (n, d, r), up (n, e, r))`` with one ``n``; returns ``n``.

    ``arg`` and ``size`` name the argument and ``n`` in errors (``stacks`` /
    ``P`` for crossovers, ``factors`` / ``m`` for mutations).

    Raises:
        InvalidValueError: no target, or a target's shapes do not fit.
    """
    if len(stacks) == 0:
        raise InvalidValueError(f"`{arg}` of {name} must hold at least one target, got none")
    n = stacks[0].down.shape[0]
    for t, (down, up) in enumerate(stacks):
        if down.dim() != 3 or up.dim() != 3 or down.shape[0] != n or up.shape[0] != n or down.shape[2] != up.shape[2]:
            raise InvalidValueError(
                f"{arg}[{t}] must be down ({size}, d, r) and up ({size}, e, r) with {size}={n}, "
                f"got {tuple(down.shape)} and {tuple(up.shape)}"
            )
    return n


def check_num_groups(pop_size: int, num_groups, label: str = "pop_size") -> int:
    """``num_groups`` as an int >= 1 dividing ``pop_size`` (islands are contiguous equal blocks).

    Example:
        >>> check_num_groups(8, 4)
        4
    """
    num_groups = check_int("num_groups", num_groups, low=1)
    if pop_size % num_groups:
        raise InvalidValueError(f"`num_groups` must be an int >= 1 dividing {label}={pop_size}, got {num_groups!r}")
    return num_groups


def uniform(shape, *, generator: torch.Generator, device, dtype=torch.float32) -> Tensor:
    """``U[0, 1)`` of ``shape`` drawn from ``generator``, returned on ``device``."""
    return torch.rand(shape, generator=generator, device=generator.device, dtype=dtype).to(device)


def normal(shape, *, generator: torch.Generator, device, dtype=torch.float32) -> Tensor:
    """``N(0, 1)`` of ``shape`` drawn from ``generator``, returned on ``device``."""
    return torch.randn(shape, generator=generator, device=generator.device, dtype=dtype).to(device)


def randint(low: int, high: int, shape, *, generator: torch.Generator, device) -> Tensor:
    """int64 uniform on ``[low, high)`` of ``shape`` drawn from ``generator``."""
    out = torch.randint(low, high, shape, generator=generator, device=generator.device)
    return out.to(device)
