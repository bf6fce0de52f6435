"""What every loop shares: the callback rule, the budget, ``run``, and saving to a file.

Every loop (:class:`~populora.PopuLoRA`, :class:`~populora.PBT`, :class:`~populora.Coevolve`,
:class:`~populora.loops.env.EnvLoop` behind :func:`~populora.evolve_with_env`) has one small surface, the
:class:`Loop` protocol:

- ``step()`` runs one step (all or nothing) and appends its record to ``history``;
- ``run(budget=, callback=, progress=)`` steps until the :class:`Budget` is spent or the callback says stop;
- ``history`` is a list of records, each with ``as_dict()`` (numbers only: one line of logging);
- ``state_dict()`` / ``load_state_dict()`` / ``save(path)`` / ``load(path)`` (a load checks everything before
  writing anything; the loop's config is stored and a different one is refused, naming the field).

It is a protocol, not a base class: a loop implements it with the helpers here (:func:`run_steps`,
:func:`save_state`, :func:`load_state`).

A loop that takes ``callback`` calls it after every step (or generation) with that step's record and reads
its return value by one rule, :func:`callback_says_stop`: ``None`` or ``False`` continues, ``True`` (a real
bool) stops, anything else raises :class:`~populora.errors.InvalidTypeError`. A truthy list or number is not
read as "stop": a logging lambda that returns what it logged would otherwise end the run silently.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from populora.checkpoint import atomic_save, load_checkpoint
from populora.checks import check_float, check_int, is_int
from populora.config import Config
from populora.errors import CheckpointError, InvalidTypeError, InvalidValueError

__all__ = ["Budget", "Loop", "callback_says_stop", "load_state", "run_steps", "save_state"]


def callback_says_stop(callback: Any, value: Any) -> bool:
    """Whether ``callback``'s return ``value`` stops the loop.

    ``None`` or ``False`` (Python or NumPy bool): continue; ``True``: stop.

    Raises:
        InvalidTypeError: any other value (a list, ``1``, a string, ...), naming the callback and the value.

    Example:
        >>> callback_says_stop(print, None), callback_says_stop(print, True)
        (False, True)
    """
    if value is None:
        return False
    kind = type(value)
    if isinstance(value, bool) or (kind.__module__ == "numpy" and kind.__name__ in ("bool", "bool_")):
        return bool(value)
    name = getattr(callback, "__qualname__", None) or repr(callback)
    raise InvalidTypeError(
        f"callback {name} returned {value!r:.80} ({kind.__name__}); expected None, False (continue) or True (stop)"
    )


@dataclass(frozen=True)
class Budget(Config):
    """When a loop's ``run`` stops (whichever comes first; at least one step always runs).

    Every budget is checked at the end of a step (a step or generation is never cut short), and with
    ``progress=True`` the bar counts in the unit of the budget closest to running out.

    Attributes:
        max_steps: steps (generations) this call runs at most.
        max_seconds: stop after the first step that ends this many wall-clock seconds or more after ``run``
            was called (rank 0's clock in a distributed run, so every rank stops together). A resumed run
            counts from its own call.
        max_env_steps: (loops over environments) stop after the first generation at which the run has taken
            this many env steps (all ranks, validation included).
    """

    max_steps: int | None = None
    max_seconds: float | None = None
    max_env_steps: int | None = None

    def __post_init__(self) -> None:
        if self.max_steps is not None:
            check_int("Budget.max_steps", self.max_steps, low=1)
        if self.max_env_steps is not None:
            check_int("Budget.max_env_steps", self.max_env_steps, low=1)
        if self.max_seconds is not None:
            check_float("Budget.max_seconds", self.max_seconds, low=0.0, low_open=True)

    @classmethod
    def of(cls, budget: Any, *, where: str) -> Budget:
        """``budget`` as a :class:`Budget`: an int is ``Budget(max_steps=n)``; ``None`` is refused (a run must stop)."""
        if isinstance(budget, Budget):
            return budget
        if is_int(budget):
            return cls(max_steps=int(budget))
        if budget is None:
            raise InvalidValueError(f"{where} needs a budget (steps as an int, or a Budget): it would never stop")
        raise InvalidTypeError(f"`budget` of {where} must be an int (steps) or a Budget, got {budget!r:.80}")


@runtime_checkable
class Loop(Protocol):
    """The surface every loop has (see the module docstring)."""

    history: list[Any]

    def step(self) -> Any: ...

    def run(
        self,
        budget: int | Budget | None = None,
        *,
        callback: Callable[[Any], Any] | None = None,
        progress: bool = False,
    ) -> list[Any]: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: Mapping[str, Any]) -> None: ...

    def save(self, path: str | Path) -> Path: ...

    def load(self, path: str | Path) -> None: ...


def run_steps(
    step: Callable[[], Any],
    history: Callable[[], list[Any]],
    budget: int | Budget | None,
    callback: Callable[[Any], Any] | None,
    progress: bool,
    *,
    where: str,
    desc: str,
    postfix: Callable[[Any], Mapping[str, str]] | None = None,
    env_steps: Callable[[], int] | None = None,
    main_rank: bool = True,
    sync_seconds: Callable[[float], float] | None = None,
) -> list[Any]:
    """``step()`` until ``budget`` is spent or ``callback(record)`` returns True; the records of this call.

    Everything is checked before the first step: the budget, the callback (callable). ``history()`` gives the
    loop's history after a step (its last entry is the step's record); ``env_steps()`` the run's env steps so
    far (loops over environments; a budget's ``max_env_steps`` is refused elsewhere); ``sync_seconds`` turns
    this rank's elapsed seconds into rank 0's (distributed loops).
    """
    from populora.stats import BudgetProgress

    budget = Budget.of(budget, where=where)
    if budget.max_env_steps is not None and env_steps is None:
        raise InvalidValueError(f"{where} takes no env steps: `Budget.max_env_steps` does not apply, got {budget}")
    if callback is not None and not callable(callback):
        raise InvalidTypeError(f"`callback` must be callable as callback(record), got {callback!r:.80}")
    started = time.monotonic()
    limits = {"seconds": budget.max_seconds, "env steps": budget.max_env_steps, "steps": budget.max_steps}
    used = {"env steps": env_steps()} if env_steps is not None else None
    bar = BudgetProgress(limits, used, show=bool(progress) and main_rank, desc=desc)
    records: list[Any] = []
    try:
        while True:
            step()
            record = history()[-1]
            records.append(record)
            elapsed = time.monotonic() - started
            if sync_seconds is not None and budget.max_seconds is not None:
                elapsed = sync_seconds(elapsed)
            now = {"steps": len(records), "seconds": elapsed}
            if env_steps is not None:
                now["env steps"] = env_steps()
            bar.update(now, postfix(record) if postfix is not None else None)
            stop = callback is not None and callback_says_stop(callback, callback(record))
            if stop or bar.spent():
                return records
    finally:
        bar.close()


def save_state(loop: Any, path: str | Path, kind: str) -> Path:
    """Write ``loop.state_dict()`` to ``path`` atomically as a checkpoint of ``kind``; returns the ``Path``."""
    return atomic_save(loop.state_dict(), path, kind=kind)


def load_state(loop: Any, path: str | Path, kind: str) -> None:
    """Resume ``loop`` from a file :func:`save_state` wrote (all or nothing, as its ``load_state_dict``).

    Raises:
        FileNotFoundError: nothing at ``path``.
        CheckpointError: the file is damaged, of another kind, or holds a state that does not fit (the file
            is named). Nothing has changed.
    """
    state = load_checkpoint(path, kind=kind)
    try:
        loop.load_state_dict(state)
    except CheckpointError as error:
        raise CheckpointError(f"checkpoint {str(path)!r}: {error}") from None
