"""Atomic, verified checkpoints.

A file is one header line naming its kind, the payload's size and its
SHA-256, followed by the payload (``torch.save`` of tensors and plain Python
values, read back with ``weights_only=True``). Writing goes to a temporary
file in the same folder and is renamed into place, so a crash never leaves
half a checkpoint; reading checks the size and hash before anything is
unpickled, so a truncated, empty, foreign or bit-flipped file raises
:class:`~populora.errors.CheckpointError` naming the file and what is wrong.

A crafted file fails the same way, never with a builtin error: a header
that is not exactly ``{kind: str, size: int >= 0, sha256: str}`` (a size
of ``1e400`` included), JSON nested past the parser's recursion limit, and
content (or safetensors metadata) whose containers nest more than
``MAX_NESTING`` deep or hold themselves, which the readers that walk a
state recursively could not take.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from populora.errors import CheckpointError

__all__ = [
    "atomic_save",
    "atomic_save_safetensors",
    "is_plain_torch_save",
    "is_safetensors_file",
    "load_checkpoint",
    "load_safetensors_checkpoint",
]

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
    header = (
        json.dumps(
            {"format": _FORMAT, "kind": kind, "size": len(payload), "sha256": hashlib.sha256(payload).hexdigest()}
        ).encode()
        + b"\n"
    )
    return _write_atomically(path, _MAGIC + header + payload)


def _write_atomically(path: Path, data: bytes) -> Path:
    """``data`` to ``path`` through a temp file in the same folder + ``os.replace`` (atomic on POSIX)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def _read(path: str | Path) -> tuple[bytes, str]:
    """The bytes of the checkpoint at ``path`` and how messages name it; missing or empty files raise."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no checkpoint at {str(path)!r}")
    data = path.read_bytes()
    where = f"checkpoint {str(path)!r}"
    if not data:
        raise CheckpointError(f"{where} is empty (0 bytes)")
    return data, where


def is_plain_torch_save(data: bytes) -> bool:
    """Whether ``data`` (a file's first bytes) is a plain ``torch.save`` file: a zip archive, or a pickle (legacy)."""
    return data.startswith(b"PK\x03\x04") or (len(data) > 1 and data[0] == 0x80 and 2 <= data[1] <= 5)


def load_checkpoint(
    path: str | Path, *, kind: str, map_location: str | torch.device = "cpu", foreign_hint: str = ""
) -> Any:
    """Read a checkpoint of ``kind`` written by :func:`atomic_save`.

    Args:
        path: the file.
        kind: the kind it must hold (``"Population"``, ...).
        map_location: where tensors are loaded.
        foreign_hint: added to the error for a plain ``torch.save`` file (what such a file probably is).

    Raises:
        FileNotFoundError: nothing at ``path``.
        CheckpointError: ``path`` is empty, truncated, corrupted, not a
            populora checkpoint (a plain ``torch.save`` file is named as
            such and never unpickled), a checkpoint of another kind (named),
            has a damaged header, or content nested more than ``MAX_NESTING``
            deep (or holding itself).
    """
    data, where = _read(path)
    if not data.startswith(_MAGIC):
        if is_plain_torch_save(data[:8]):
            raise CheckpointError(
                f"{where} is not a populora checkpoint but a plain torch.save file: populora reads only the "
                f"checkpoints it wrote ({kind}.save()){'; ' + foreign_hint if foreign_hint else ''}"
            )
        raise CheckpointError(f"{where} is not a populora checkpoint (it starts with {data[:16]!r})")
    end = data.find(b"\n", len(_MAGIC))
    header = _json(data[len(_MAGIC) : end], where, "header") if end > 0 else None
    found, size, digest = (
        (header.get(key) for key in ("kind", "size", "sha256")) if isinstance(header, dict) else (None, None, None)
    )
    # exact types: a size of 1e400 (JSON's inf), a float or a string is damage, not a size to convert
    if not (isinstance(found, str) and type(size) is int and size >= 0 and isinstance(digest, str)):
        raise CheckpointError(f"{where} has a damaged header")
    if found != kind:
        raise CheckpointError(f"{where} holds a {_cut(found)} checkpoint, expected a {kind} checkpoint")
    payload = data[end + 1 :]
    if len(payload) != size:
        raise CheckpointError(f"{where} is truncated or padded: {len(payload)} payload bytes, expected {size}")
    if hashlib.sha256(payload).hexdigest() != digest:
        raise CheckpointError(f"{where} is corrupted: its content does not match the SHA-256 recorded at save")
    try:
        state = torch.load(io.BytesIO(payload), map_location=map_location, weights_only=True)
    except Exception as err:  # a payload that hashes right but does not unpickle: written by a bug
        raise CheckpointError(f"{where} could not be read: {type(err).__name__}: {err}") from err
    check_nesting(state, where, "content")
    return state


MAX_NESTING = 100
"""The deepest nesting of containers (dicts, lists, tuples, sets) a loaded state, header or metadata may have:
readers and error messages walk states recursively, and no state written by populora comes near it."""


def _cut(text: str, limit: int = 80) -> str:
    """``text`` cut to ``limit`` characters, for messages quoting a file's strings."""
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _json(raw: bytes | str, where: str, what: str) -> Any:
    """``json.loads(raw)`` whose every failure (bad syntax or encoding, nesting beyond the parser's recursion
    limit, a number beyond Python's 4300-digit limit) is a :class:`CheckpointError` naming ``where``; the value
    is nested at most ``MAX_NESTING`` deep."""
    try:
        value = json.loads(raw)
    except (ValueError, RecursionError) as err:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise CheckpointError(f"{where} has a damaged {what} (not JSON: {type(err).__name__})") from None
    check_nesting(value, where, what)
    return value


def _containers(value: Any) -> list[Any] | None:
    """The contents of a container whose readers recurse into it (dict keys and values), else None."""
    if isinstance(value, dict):
        return [*value.keys(), *value.values()]
    if isinstance(value, (list, tuple, set, frozenset)):
        return list(value)
    return None


def check_nesting(value: Any, where: str, what: str, limit: int = MAX_NESTING) -> None:
    """Raise :class:`CheckpointError` if containers in ``value`` nest deeper than ``limit`` or hold themselves.

    An iterative depth-first walk that visits each container once (a shared one is measured once), so it
    takes time linear in the number of containers and never recurses itself.
    """
    if _containers(value) is None:
        return
    height: dict[int, int] = {}  # id -> levels of containers at and below it (explored ones)
    on_path: set[int] = set()
    stack: list[tuple[Any, Iterator[Any]]] = [(value, iter(_containers(value) or ()))]
    tallest = [1]  # per stack entry: its height so far
    on_path.add(id(value))
    while stack:
        node, children = stack[-1]
        child = next(children, _END)
        if child is _END:
            stack.pop()
            on_path.discard(id(node))
            mine = tallest.pop()
            height[id(node)] = mine
            if tallest:
                tallest[-1] = max(tallest[-1], mine + 1)
            continue
        inner = _containers(child)
        if inner is None:
            continue
        key = id(child)
        if key in on_path:
            raise CheckpointError(f"{where} is damaged: its {what} has a container that holds itself")
        below = height.get(key)
        if (below is None and len(stack) + 1 > limit) or (below is not None and len(stack) + below > limit):
            raise CheckpointError(f"{where} is damaged: its {what} has containers nested more than {limit} deep")
        if below is not None:
            tallest[-1] = max(tallest[-1], below + 1)
            continue
        on_path.add(key)
        stack.append((child, iter(inner)))
        tallest.append(1)


_END = object()


# ------------------------------------------------------------------------------------------- safetensors

_ST_KEY = "populora"  # the safetensors metadata entry that holds populora's JSON


def _tensor_digest(tensors: dict[str, torch.Tensor]) -> str:
    """SHA-256 of every tensor's name, dtype, shape and bytes, in sorted name order (layout-independent)."""
    h = hashlib.sha256()
    for name in sorted(tensors):
        t = tensors[name].detach().to("cpu").contiguous().reshape(-1)
        h.update(f"{name}\0{t.dtype}\0{tuple(tensors[name].shape)}\0".encode())
        h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()


def _safetensors(action: str) -> Any:
    try:
        import safetensors.torch
    except ImportError as err:  # pragma: no cover - safetensors ships with the llm and test extras
        raise ImportError(
            f"{action} needs the `safetensors` package: pip install safetensors "
            '(or, in a clone of the populora repository, pip install -e ".[llm]")'
        ) from err
    return safetensors.torch


def atomic_save_safetensors(
    tensors: dict[str, torch.Tensor], meta: dict[str, Any], path: str | Path, *, kind: str
) -> Path:
    """Write ``tensors`` and the JSON-able ``meta`` as a ``.safetensors`` file of ``kind``, atomically.

    ``meta`` goes into the file's metadata (as JSON, under ``"populora"``)
    with the kind and a SHA-256 of the tensors' contents, so flipped bytes in
    the tensor data are caught on load. Tensors are written from CPU copies.
    ``safetensors`` is imported here, not by ``import populora``.

    Returns the ``Path`` written.
    """
    st = _safetensors("a safetensors checkpoint")
    path = Path(path)
    cpu = {k: v.detach().to("cpu").contiguous() for k, v in tensors.items()}
    header = {"format": _FORMAT, "kind": kind, "sha256": _tensor_digest(cpu), "meta": meta}
    return _write_atomically(path, st.save(cpu, metadata={_ST_KEY: json.dumps(header), "format": "pt"}))


def is_safetensors_file(path: str | Path) -> bool:
    """Whether ``path`` looks like a safetensors file (an 8-byte header size, then a JSON object)."""
    try:
        with open(path, "rb") as f:
            head = f.read(9)
    except OSError:
        return False
    return len(head) == 9 and head[8:9] == b"{"


def load_safetensors_checkpoint(
    path: str | Path, *, kind: str, map_location: str | torch.device = "cpu"
) -> tuple[dict[str, torch.Tensor], Any]:
    """Read :func:`atomic_save_safetensors`'s file: ``(tensors, meta)``, every byte checked first.

    Raises:
        FileNotFoundError: nothing at ``path``.
        CheckpointError: empty, truncated, not a safetensors file (its header
            is validated by safetensors), not a populora safetensors
            checkpoint, of another kind, its tensors do not match the
            SHA-256 recorded at save (flipped bytes), or its populora
            metadata is damaged (not JSON, nested more than
            ``MAX_NESTING`` deep).
    """
    data, where = _read(path)
    st = _safetensors(f"reading {where}")
    try:
        size = int.from_bytes(data[:8], "little")
        raw = json.loads(data[8 : 8 + size]) if len(data) >= 8 + size else None
        tensors = st.load(data)
    except Exception as err:
        raise CheckpointError(f"{where} is not a valid safetensors file ({type(err).__name__}: {err})") from None
    entry = (
        raw.get("__metadata__", {}).get(_ST_KEY)
        if isinstance(raw, dict) and isinstance(raw.get("__metadata__"), dict)
        else None
    )
    if not isinstance(entry, str):
        raise CheckpointError(f"{where} is a safetensors file but not a populora checkpoint (no populora metadata)")
    header = _json(entry, where, "populora metadata")
    found, digest, meta = (
        (header.get(key) for key in ("kind", "sha256", "meta")) if isinstance(header, dict) else (None, None, None)
    )
    if not (isinstance(found, str) and isinstance(digest, str) and "meta" in header):
        raise CheckpointError(f"{where} has damaged populora metadata (it needs a kind, a sha256 and meta)")
    if found != kind:
        raise CheckpointError(f"{where} holds a {_cut(found)} checkpoint, expected a {kind} checkpoint")
    if _tensor_digest(tensors) != digest:
        raise CheckpointError(f"{where} is corrupted: its tensors do not match the SHA-256 recorded at save")
    return {k: v.to(map_location) for k, v in tensors.items()}, meta
