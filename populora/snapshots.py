"""Snapshot: the checkpoint protocol of the stateful objects that are not modules.

``state_dict()`` returns a snapshot (tensors and plain values sharing no
storage with the live object), ``load_state_dict(state)`` checks everything
before it writes anything, and ``save(path)`` / ``load(path)`` are the file
helpers around them (:func:`populora.checkpoint.atomic_save` /
:func:`~populora.checkpoint.load_checkpoint`). ``state()`` / ``load_state()``
are the 0.1 names, deprecated. ``Population`` is a module and follows torch's
``state_dict`` instead (see :mod:`populora.population_state`).
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from populora.checkpoint import atomic_save, load_checkpoint
from populora.population.checkpointing import naming

__all__: list[str] = []


class Snapshot:
    """``save`` / ``load`` over a subclass's ``state_dict`` / ``load_state_dict``; the 0.1 aliases.

    Subclasses set ``_checkpoint_kind`` (the kind written into the file's
    header and checked on load) and define ``state_dict`` and
    ``load_state_dict``.
    """

    _checkpoint_kind: str

    def state_dict(self) -> dict[str, Any]:
        raise NotImplementedError

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        raise NotImplementedError

    def save(self, path: str | Path) -> Path:
        """Write :meth:`state_dict` atomically (temp file + rename).

        Returns:
            The ``Path`` written.
        """
        return atomic_save(self.state_dict(), path, kind=self._checkpoint_kind)

    def load(self, path: str | Path) -> None:
        """Restore what :meth:`save` wrote: all or nothing.

        Raises:
            FileNotFoundError: nothing at ``path``.
            CheckpointError: the file is empty, truncated, corrupted, of
                another kind, or does not fit this object (the file is
                named); nothing has changed.
        """
        state = load_checkpoint(path, kind=self._checkpoint_kind)
        with naming(path):
            self.load_state_dict(state)

    def state(self) -> dict[str, Any]:
        """Deprecated: use :meth:`state_dict`."""
        warnings.warn(
            f"`{type(self).__name__}.state()` is deprecated; use `state_dict()`", DeprecationWarning, stacklevel=2
        )
        return self.state_dict()

    def load_state(self, state: Mapping[str, Any]) -> None:
        """Deprecated: use :meth:`load_state_dict`."""
        warnings.warn(
            f"`{type(self).__name__}.load_state()` is deprecated; use `load_state_dict()`",
            DeprecationWarning,
            stacklevel=2,
        )
        self.load_state_dict(state)
