"""Atomic checkpoints: write to a temporary file in the same folder, then rename.

A crash mid-write leaves the previous checkpoint intact, never half a file.
Checkpoints hold tensors and plain Python values only, so ``torch.load``
reads them with ``weights_only=True``.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

import torch

__all__ = ["atomic_save", "load_checkpoint"]


def atomic_save(obj: Any, path: str | Path) -> Path:
    """``torch.save(obj, path)`` through a temp file + ``os.replace`` (atomic on POSIX)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            torch.save(obj, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def load_checkpoint(path: str | Path, map_location: str | torch.device = "cpu") -> Any:
    """Load a checkpoint written by :func:`atomic_save` (``weights_only=True``)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no checkpoint at {str(path)!r}")
    return torch.load(path, map_location=map_location, weights_only=True)
