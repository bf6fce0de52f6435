"""Snapshot: the checkpoint protocol of the stateful objects that are not modules.

``state_dict()`` returns a snapshot (tensors and plain values sharing no
storage with the live object), ``load_state_dict(state)`` checks everything
before it writes anything, and ``save(path)`` / ``load(path)`` are the file
helpers around them (:func:`populora.checkpoint.atomic_save` /
:func:`~populora.checkpoint.load_checkpoint`). ``Population`` is a module and
follows torch's ``state_dict`` instead (see :mod:`populora.population.checkpointing`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from populora.checkpoint import atomic_save, load_checkpoint
from populora.errors import CheckpointError

__all__ = ["Snapshot", "naming"]


@contextlib.contextmanager
def naming(path: str | Path) -> Iterator[None]:
    """Re-raise a CheckpointError about a loaded state with the file it came from."""
    try:
        yield
    except CheckpointError as err:
        raise CheckpointError(f"checkpoint {str(path)!r}: {err}") from err


class Snapshot:
    """``save`` / ``load`` over a subclass's ``state_dict`` / ``load_state_dict``.

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
