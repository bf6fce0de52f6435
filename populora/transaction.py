"""All or nothing: the one transaction every loop step and every load goes through, and the one
close-on-failure helper of constructors that open resources.

``with transaction(a, b, ...):`` snapshots each object on entry; if the body raises anything (a
``KeyboardInterrupt`` too), every object is put back as it was, in reverse order, and the error goes on.
What an object's snapshot is depends on what it is:

- an object with ``transaction_state()`` / ``restore_transaction_state(state)`` (the protocol a class
  defines when it knows a cheaper snapshot than its whole state, e.g. a population's rows);
- a ``torch.Generator``: its state;
- a ``torch.Tensor``: a clone, copied back in place (a graph built before sees the restore);
- an ``nn.Module`` or any object with ``state_dict`` / ``load_state_dict`` (optimizers, ratings,
  normalisers, schedulers): a deep copy of its state dict, loaded back;
- :class:`Attributes`: named attributes of any object (counters, histories), shallow-copied.

A load is a transaction too: it checks everything before it writes anything, and the transaction makes a
write that fails half-way (a device out of memory, an interrupt) leave nothing behind.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Iterator
from typing import Any, Protocol, runtime_checkable

import torch

from populora.errors import InvalidTypeError

__all__ = ["Attributes", "Grads", "Transactional", "closing_on_failure", "transaction"]


@runtime_checkable
class Transactional(Protocol):
    """An object that knows its own snapshot (cheaper than a whole state dict)."""

    def transaction_state(self) -> Any: ...

    def restore_transaction_state(self, state: Any) -> None: ...


class Attributes:
    """Named attributes of ``owner`` as one transaction entry: ``Attributes(loop, "steps", "history")``.

    Each value is shallow-copied (a list or dict is copied, its elements are not: the records in a
    history are immutable), so appending to a history inside the transaction is undone.
    """

    def __init__(self, owner: object, *names: str) -> None:
        missing = [n for n in names if not hasattr(owner, n)]
        if missing:
            raise InvalidTypeError(f"{type(owner).__name__} has no attribute {missing[0]!r} to snapshot")
        self.owner, self.names = owner, names

    def transaction_state(self) -> dict[str, Any]:
        return {n: copy.copy(getattr(self.owner, n)) for n in self.names}

    def restore_transaction_state(self, state: dict[str, Any]) -> None:
        for name, value in state.items():
            setattr(self.owner, name, value)


class Grads:
    """The ``.grad`` of each parameter as one transaction entry: the gradient tensors themselves (not copies),
    so a failed step gives the caller back the very gradient objects it held (``None`` included)."""

    def __init__(self, params: list[torch.Tensor]) -> None:
        self.params = params

    def transaction_state(self) -> list[torch.Tensor | None]:
        return [p.grad for p in self.params]

    def restore_transaction_state(self, state: list[torch.Tensor | None]) -> None:
        for p, grad in zip(self.params, state):
            p.grad = grad


def _snapshot(obj: Any) -> Any:
    if isinstance(obj, Transactional):
        return obj.transaction_state()
    if isinstance(obj, torch.Generator):
        return obj.get_state()
    if isinstance(obj, torch.Tensor):
        return obj.detach().clone()
    if callable(getattr(obj, "state_dict", None)) and callable(getattr(obj, "load_state_dict", None)):
        if isinstance(obj, torch.nn.Module):
            return {k: v.detach().clone() for k, v in obj.state_dict(keep_vars=True).items()}
        return copy.deepcopy(obj.state_dict())  # an optimizer's state dict references its live tensors
    raise InvalidTypeError(
        f"transaction() cannot snapshot a {type(obj).__name__}: expected a torch.Generator, a Tensor, an object "
        "with state_dict / load_state_dict, populora.transaction.Attributes, or an object with "
        "transaction_state / restore_transaction_state"
    )


def _restore(obj: Any, state: Any) -> None:
    if isinstance(obj, Transactional):
        obj.restore_transaction_state(state)
    elif isinstance(obj, torch.Generator):
        obj.set_state(state)
    elif isinstance(obj, torch.Tensor):
        with torch.no_grad():
            obj.copy_(state)
    elif isinstance(obj, torch.nn.Module):
        with torch.no_grad():
            live = obj.state_dict(keep_vars=True)
            for key, value in state.items():
                live[key].copy_(value)
    else:
        obj.load_state_dict(state)


@contextlib.contextmanager
def transaction(*objects: Any) -> Iterator[None]:
    """Run the body all or nothing over ``objects`` (module docstring).

    Raises:
        InvalidTypeError: an object it cannot snapshot (before the body runs).
        Whatever the body raises, after every object is restored. If a restore itself fails, the body's
        error is raised with the restore's error as a note (the body's error is the cause a user acts on).
    """
    saved = [(obj, _snapshot(obj)) for obj in objects]
    try:
        yield
    except BaseException as error:
        for obj, state in reversed(saved):
            try:
                _restore(obj, state)
            except Exception as restore_error:  # keep restoring the others; report, do not mask
                if hasattr(error, "add_note"):  # Python 3.11+
                    error.add_note(f"populora.transaction: restoring a {type(obj).__name__} failed: {restore_error!r}")
        raise


@contextlib.contextmanager
def closing_on_failure() -> Iterator[contextlib.ExitStack]:
    """An ``ExitStack`` whose callbacks run only if the body raises: a constructor registers how to undo
    each resource it opens (``undo.callback(population.close)``) and keeps them all when it succeeds.

        >>> log = []
        >>> with closing_on_failure() as undo:
        ...     _ = undo.callback(log.append, "closed")
        >>> log
        []
    """
    with contextlib.ExitStack() as stack:
        yield stack
        stack.pop_all()  # success: the resources are the caller's now
