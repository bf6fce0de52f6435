"""Calling a user's fitness function in any of its three signatures.

Higher fitness is better, everywhere in populora. A fitness function takes the
population (opaque here: it is only passed through) and one of:

=============================================  =========  =====================================
signature                                      kind       called
=============================================  =========  =====================================
``fn(population, individuals=...)``            ``batch``  once per rank, with that rank's ids
``fn(population, idx)``                        ``single`` once per id, returns one number
``fn(population)``                             ``all``    once, on rank 0, returns ``(p,)``
=============================================  =========  =====================================

:func:`evaluate` partitions the ids across ranks (:func:`~populora.distributed.partition`),
calls the function accordingly and exchanges the values
(:func:`~populora.distributed.all_gather_values`), so every rank gets the same
``(p,)`` vector (float32 by default, ``dtype=torch.float64`` keeps Python
floats exactly). NaNs are kept: the population applies its NaN policy.
:func:`as_fitnesses` converts anything number-like to a tensor of its own
precision and names the type of anything else.

:func:`validate_fitnesses` is the one check of a fitness vector where it
enters populora (``Population.evolve_`` / ``select`` / ``select_parents`` /
``crossover_``, ``Coevolve``, ES ``tell``): shape, precision, NaN policy and
finiteness. The operators trust what it returns and do not check again.
"""

from __future__ import annotations

import inspect
import math
import numbers
from collections.abc import Callable, Mapping
from typing import Any, Literal

import torch
from torch import Tensor

from populora import distributed as _dist
from populora.checks import check_one_of
from populora.errors import FitnessError, InvalidTypeError, InvalidValueError

__all__ = ["NAN_POLICIES", "FitnessKind", "as_fitnesses", "evaluate", "fitness_kind", "validate_fitnesses"]

FitnessKind = Literal["batch", "single", "all"]

NAN_POLICIES = ("raise", "worst")
"""What a NaN fitness does: ``'raise'`` (an error) or ``'worst'`` (below the lowest finite fitness)."""

_FORMS = (
    "fn(population, individuals=...) (this rank's list of ids, returns that many values), "
    "fn(population, idx) (one id, returns a number) or "
    "fn(population) (all individuals at once, returns a (p,) vector)"
)


def _describe(fn: Callable[..., Any]) -> str:
    name = getattr(fn, "__name__", None) or type(fn).__name__
    try:
        return f"{name}{inspect.signature(fn)}"
    except (TypeError, ValueError):
        return name


def fitness_kind(fn: Callable[..., Any]) -> FitnessKind:
    """Which of the three accepted signatures ``fn`` has.

    ``'batch'`` if it has a parameter named ``individuals`` (passable by
    keyword) besides the population; otherwise ``'single'`` for two required
    positional parameters and ``'all'`` for one. Parameters with defaults are
    ignored; ``functools.partial`` and callable objects are fine.

    Args:
        fn: the fitness function.

    Returns:
        ``'batch'``, ``'single'`` or ``'all'``.

    Raises:
        TypeError: if ``fn`` is not callable, its signature cannot be read,
            takes ``*args``, needs other keyword-only arguments, or has a
            number of required parameters that fits none of the three forms.

    Example:
        >>> fitness_kind(lambda population, idx: 0.0)
        'single'
    """
    if not callable(fn):
        raise InvalidTypeError(f"a fitness function must be callable, got {type(fn).__name__}; expected {_FORMS}")
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError) as error:
        raise InvalidTypeError(
            f"cannot read the signature of fitness function {_describe(fn)} ({error}); expected {_FORMS}"
        ) from None

    def refuse(why: str) -> InvalidTypeError:
        return InvalidTypeError(f"cannot tell how to call fitness function {_describe(fn)}: {why}; expected {_FORMS}")

    if any(p.kind is p.VAR_POSITIONAL for p in params):
        raise refuse("it takes *args (a wrapper? decorate it with functools.wraps)")
    positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    by_keyword = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    has_individuals = any(p.name == "individuals" and p.kind in by_keyword for p in params)
    required = [p for p in params if p.kind in positional and p.default is p.empty and p.name != "individuals"]
    other_kw = [p.name for p in params if p.kind is p.KEYWORD_ONLY and p.default is p.empty and p.name != "individuals"]
    if other_kw:
        raise refuse(f"it requires keyword-only argument(s) {other_kw} that populora cannot supply")
    if has_individuals:
        if len(required) != 1:
            raise refuse(f"it takes `individuals` but {len(required)} other required positional parameters, not 1")
        return "batch"
    if len(required) == 2:
        return "single"
    if len(required) == 1:
        return "all"
    raise refuse(f"it has {len(required)} required positional parameters, not 1 or 2")


def _scalar(value: Any, what: str) -> float:
    """One fitness value as a Python float (NaN kept)."""
    if isinstance(value, numbers.Real):  # int, float, bool, numpy scalars
        return float(value)
    if isinstance(value, Tensor) or hasattr(value, "__array__"):
        try:
            t = value.detach() if isinstance(value, Tensor) else torch.as_tensor(value)
        except (TypeError, ValueError, RuntimeError):
            t = None
        if t is not None:
            if t.numel() != 1:
                raise FitnessError(f"{what} must return one number, got shape {tuple(t.shape)}")
            if t.is_complex() or not (t.is_floating_point() or t.dtype in _REAL_DTYPES):
                raise FitnessError(f"{what} must return a real number, got dtype {t.dtype}")
            return float(t.reshape(()).item())
    raise FitnessError(f"{what} must return a number, got {type(value).__name__}: {value!r:.80}")


def as_fitnesses(values: Any, what: str = "fitnesses", *, returned: int | None = None) -> Tensor:
    """Fitness values as a real tensor in their own precision (higher is better; NaN kept).

    A tensor or NumPy array keeps its dtype; a list or tuple of numbers (Python,
    NumPy or one-element tensors) becomes float64, which holds Python floats
    exactly. Booleans and integers are accepted (a tensor of them keeps its
    integer dtype: convert as needed).

    Args:
        values: a tensor, NumPy array, or sequence of numbers.
        what: how the values are named in errors.
        returned: for a function's result: the number of values it should
            have returned (errors then say "must return ...").

    Returns:
        The values as a tensor (not reshaped, not moved; detached).

    Raises:
        FitnessError: ``values`` are not numbers: a string, a dict, an
            object, a complex tensor, ... (its type is named).

    Example:
        >>> as_fitnesses([1e8 + 1, 1e8]).dtype
        torch.float64
        >>> as_fitnesses("abc")
        Traceback (most recent call last):
        ...
        populora.errors.FitnessError: fitnesses must be real numbers (a tensor, array or list), got str: 'abc'
    """

    def refuse(kind: str) -> FitnessError:
        if returned is not None:
            return FitnessError(
                f"{what} must return {returned} numbers (sequence, array or tensor), got {kind}: {values!r:.80}"
            )
        return FitnessError(f"{what} must be real numbers (a tensor, array or list), got {kind}: {values!r:.80}")

    if isinstance(values, Tensor):
        t = values.detach()
    elif isinstance(values, (str, bytes, Mapping, set, frozenset)) or values is None:
        raise refuse(type(values).__name__)
    elif isinstance(values, (list, tuple)):
        bad = next((v for v in values if isinstance(v, (str, bytes, Mapping)) or v is None), None)
        if bad is not None:
            raise refuse(f"{type(values).__name__} holding {type(bad).__name__}")
        try:
            t = torch.tensor([_scalar(v, what) for v in values], dtype=torch.float64)
        except FitnessError:
            try:
                t = torch.as_tensor(values)  # e.g. a list of equal-length rows: the caller checks the shape
            except (TypeError, ValueError, RuntimeError):
                raise refuse(f"{type(values).__name__} of non-numbers") from None
    elif isinstance(values, numbers.Real):
        t = torch.tensor(float(values), dtype=torch.float64)
    else:
        try:
            t = torch.as_tensor(values)
        except (TypeError, ValueError, RuntimeError):
            raise refuse(type(values).__name__) from None
    if t.is_complex() or not (t.is_floating_point() or t.dtype in _REAL_DTYPES):
        raise FitnessError(
            f"{what} must {'return' if returned is not None else 'be'} real numbers, got dtype {t.dtype}"
        )
    return t


def validate_fitnesses(
    values: Any,
    num: int,
    *,
    nan_policy: str = "raise",
    allow_inf: bool = False,
    device: str | torch.device | None = None,
    what: str = "fitnesses",
) -> Tensor:
    """The one validation of a fitness vector where it enters populora: ``(num,)``, real, in its precision.

    Higher is better. The precision is kept: float64 input (and Python
    floats, integers) gives float64, float32 gives float32, float16 /
    bfloat16 give float32 (float32 throughout on MPS, which has no float64);
    booleans are refused. Selection, parent selection, crossover and the
    merge's argmax all run in this precision and trust the result.

    Args:
        values: ``(num,)`` tensor, NumPy array, or sequence of numbers.
        num: the number of individuals ``p``.
        nan_policy: ``'raise'`` (NaN and ``-inf`` are errors) or ``'worst'``
            (they become ``min - max(max - min, 1)`` of the finite values, so
            never an elite).
        allow_inf: keep ``+inf`` / ``-inf`` as they are (for rank-based
            shapings); NaN still follows ``nan_policy``. Otherwise ``+inf``
            always raises.
        device: where the result lives (default: the CPU for non-tensors,
            the input's device for tensors).
        what: how the values are named in errors.

    Returns:
        ``(num,)`` float32 or float64 tensor on ``device``.

    Raises:
        FitnessError: ``values`` is None, not numbers (the type is named),
            of the wrong shape (both shapes named), or not finite.

    Example:
        >>> validate_fitnesses([1.0, float("nan"), 3.0], 3, nan_policy="worst")
        tensor([ 1., -1.,  3.], dtype=torch.float64)
    """
    check_one_of("nan_policy", nan_policy, NAN_POLICIES)
    if values is None:
        raise FitnessError(f"{what} are required: a ({num},) tensor, higher is better")
    f = as_fitnesses(values, what)
    if f.dtype == torch.bool:
        raise FitnessError(f"{what} must be real numbers, got dtype {f.dtype}")
    target = torch.device(device) if device is not None else f.device
    wide = f.dtype == torch.float64 or not f.is_floating_point()  # integers: float64 holds them exactly
    f = f.to(device=target, dtype=torch.float64 if wide and target.type != "mps" else torch.float32)
    if f.shape != (num,):
        raise FitnessError(f"{what} must have shape ({num},), got {tuple(f.shape)}")
    bad = torch.isnan(f) if allow_inf else ~torch.isfinite(f)
    if bool(bad.any()):
        ids = bad.nonzero().flatten().tolist()
        if nan_policy != "worst" or (not allow_inf and bool((f == math.inf).any())) or bool(bad.all()):
            hint = "; pass nan_policy='worst' to treat NaN as the lowest fitness" if nan_policy != "worst" else ""
            raise FitnessError(
                f"{what} must be {'free of NaN' if allow_inf else 'finite'}, got {f[bad].tolist()} at ids {ids}{hint}"
            )
        good = f[~bad & torch.isfinite(f)] if allow_inf else f[~bad]
        if good.numel() == 0:
            good = torch.zeros(1, dtype=f.dtype, device=f.device)
        worst = good.min() - torch.clamp(good.max() - good.min(), min=1.0)
        f = torch.where(bad, worst, f)
    return f


def _vector(result: Any, n: int, what: str, dtype: torch.dtype = torch.float32) -> Tensor:
    """A fitness result as an ``(n,)`` CPU tensor of ``dtype`` (NaN kept)."""
    if result is None:
        raise FitnessError(f"{what} returned None; expected {n} values (did it forget to `return`?)")
    if isinstance(result, (list, tuple)):
        values = torch.tensor([_scalar(v, f"each value of {what}") for v in result], dtype=torch.float64)
    else:
        values = as_fitnesses(result, what, returned=n)
    shape = tuple(values.shape)
    long_dims = [s for s in shape if s != 1]
    if values.numel() != n or len(long_dims) > 1:
        raise FitnessError(
            f"{what} returned {values.numel()} values (shape {shape}) for {n} individuals; expected shape ({n},)"
        )
    return values.reshape(n).to(device="cpu", dtype=dtype)


_REAL_DTYPES = (torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64)


def evaluate(
    fn: Callable[..., Any],
    population: Any,
    num: int,
    *,
    distributed: bool = True,
    dtype: torch.dtype = torch.float32,
) -> Tensor:
    """Fitness of every individual, the same ``(num,)`` vector on every rank.

    Higher is better. With a distributed group and ``distributed=True`` the
    ids are split across ranks with :func:`~populora.distributed.partition`:
    ``batch`` functions get this rank's ids as a list (not called when the
    rank's share is empty), ``single`` functions are called once per id, and
    ``all`` functions are called on rank 0 only. Otherwise this process
    evaluates every id itself. The values are then exchanged with
    :func:`~populora.distributed.all_gather_values`.

    If ``fn`` raises on one rank, every rank raises (that rank the original
    error, the others a ``RuntimeError`` quoting it), so none is left waiting.

    Args:
        fn: fitness function in one of the three forms (:func:`fitness_kind`).
        population: passed through to ``fn`` untouched.
        num: number of individuals ``p``.
        distributed: split the work across ranks when a group exists.
        dtype: ``torch.float32`` (default) or ``torch.float64`` (keeps Python
            floats exactly, e.g. fitnesses ``1e8 + i``); the same on every rank.

    Returns:
        ``(num,)`` CPU tensor of ``dtype`` in id order; NaNs are kept.

    Raises:
        TypeError: if ``fn`` has none of the three signatures.
        FitnessError: if ``fn`` returns the wrong number of values, or something
            that is not numbers.
        ValueError: if ``num`` is not a positive int.

    Example:
        >>> evaluate(lambda population, idx: idx * 0.5, None, 3)
        tensor([0.0000, 0.5000, 1.0000])
    """
    if not isinstance(num, int) or isinstance(num, bool) or num < 1:
        raise InvalidValueError(f"`num` must be a positive int (the number of individuals), got {num!r}")
    if dtype not in (torch.float32, torch.float64):
        raise InvalidValueError(f"`dtype` must be torch.float32 or torch.float64, got {dtype!r}")
    kind = fitness_kind(fn)
    spread = distributed and _dist.is_distributed()
    me, world = (_dist.process_rank(), _dist.world_size()) if spread else (0, 1)

    what = f"fitness function {_describe(fn)}"
    none = torch.empty(0, dtype=dtype)

    def share() -> tuple[list[int], Tensor]:  # this rank's ids (partition, or all of them on rank 0) and values
        if kind == "all":
            return (list(range(num)), _vector(fn(population), num, what, dtype)) if me == 0 else ([], none)
        ids = list(_dist.partition(num, me, world))
        if kind == "batch":
            return (ids, _vector(fn(population, individuals=list(ids)), len(ids), what, dtype)) if ids else (ids, none)
        return ids, torch.tensor([_scalar(fn(population, i), f"{what} (individual {i})") for i in ids], dtype=dtype)

    return _dist.gather_shares(share, num, spread=spread)
