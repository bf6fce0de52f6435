"""Atomic, verified checkpoints.

A file is one header line naming its kind, the payload's size and its
SHA-256, followed by the payload (``torch.save`` of tensors and plain Python
values, read back with ``weights_only=True``). Writing goes to a temporary
file in the same folder and is renamed into place, so a crash never leaves
half a checkpoint; reading checks the size and hash before anything is
unpickled, so a truncated, empty, foreign or bit-flipped file raises
:class:`~populora.errors.CheckpointError` naming the file and what is wrong.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import tempfile
from pathlib import Path
from typing import Any

import torch

from .errors import CheckpointError

__all__ = ["atomic_save", "load_checkpoint"]

_MAGIC = b"populora-checkpoint\n"
_FORMAT = 1


def atomic_save(obj: Any, path: str | Path, *, kind: str) -> Path:
    """Write ``obj`` as a checkpoint of ``kind`` (e.g. ``"Population"``) to ``path``, atomically.

    Returns the ``Path`` written.
    """
    path = Path(path)
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    payload = buffer.getvalue()
    header = json.dumps({"format": _FORMAT, "kind": kind, "size": len(payload),
                         "sha256": hashlib.sha256(payload).hexdigest()}).encode() + b"\n"
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(_MAGIC + header + payload)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def load_checkpoint(path: str | Path, *, kind: str, map_location: str | torch.device = "cpu") -> Any:
    """Read a checkpoint of ``kind`` written by :func:`atomic_save`.

    Raises:
        FileNotFoundError: nothing at ``path``.
        CheckpointError: ``path`` is empty, truncated, corrupted, not a
            populora checkpoint, or a checkpoint of another kind (named).
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no checkpoint at {str(path)!r}")
    data = path.read_bytes()
    where = f"checkpoint {str(path)!r}"
    if not data:
        raise CheckpointError(f"{where} is empty (0 bytes)")
    if not data.startswith(_MAGIC):
        raise CheckpointError(f"{where} is not a populora checkpoint (it starts with {data[:16]!r})")
    end = data.find(b"\n", len(_MAGIC))
    try:
        header = json.loads(data[len(_MAGIC):end]) if end > 0 else None
        found, size, digest = header["kind"], int(header["size"]), header["sha256"]
    except (ValueError, TypeError, KeyError):
        raise CheckpointError(f"{where} has a damaged header") from None
    if found != kind:
        raise CheckpointError(f"{where} holds a {found} checkpoint, expected a {kind} checkpoint")
    payload = data[end + 1:]
    if len(payload) != size:
        raise CheckpointError(f"{where} is truncated or padded: {len(payload)} payload bytes, expected {size}")
    if hashlib.sha256(payload).hexdigest() != digest:
        raise CheckpointError(f"{where} is corrupted: its content does not match the SHA-256 recorded at save")
    try:
        return torch.load(io.BytesIO(payload), map_location=map_location, weights_only=True)
    except Exception as err:  # a payload that hashes right but does not unpickle: written by a bug
        raise CheckpointError(f"{where} could not be read: {type(err).__name__}: {err}") from err
