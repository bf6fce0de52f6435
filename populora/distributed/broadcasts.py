"""Broadcasts from one rank: tensors in place, checksum repair, small objects, raw tensors.

Weights only travel once, before the first evaluation
(:func:`broadcast_tensors_`, :func:`sync_if_different_`). Every function is a
no-op (or the identity) without a distributed group. Re-exported by
:mod:`populora.distributed`, the module to import.
"""

from __future__ import annotations

import hashlib
import warnings
from collections.abc import Sequence
from typing import Any, TypeVar

import torch
import torch.distributed as dist
from torch import Tensor

from populora.distributed.process_group import comm_device, is_distributed, process_rank, world_size
from populora.errors import InvalidTypeError, InvalidValueError

# Broadcasts of many weights go out in buckets of at most this many bytes, so
# syncing a large model never needs a second copy of all of it at once.
_BUCKET_BYTES = 64 * 1024 * 1024
_ALIGN = 16  # bytes; the largest element size (complex128)

# Checksums convert the words of a tensor to int64 in chunks of this many words.
_CHECKSUM_CHUNK = 1 << 22

# dtype codes for broadcast_tensor_raw's header; append only (codes are positions).
_DTYPES: tuple[torch.dtype, ...] = (
    torch.float32,
    torch.float64,
    torch.float16,
    torch.bfloat16,
    torch.uint8,
    torch.int8,
    torch.int16,
    torch.int32,
    torch.int64,
    torch.bool,
    torch.complex64,
    torch.complex128,
)
_MAX_NDIM = 64
_NO_TENSOR = -1  # header code: src had no tensor to send


# ---------------------------------------------------------------------- weight sync


def _byte_view(t: Tensor) -> Tensor:
    """``t``'s bytes as a flat uint8 tensor (a copy only if ``t`` is not contiguous)."""
    t = t.detach()
    if t.dim() == 0:
        t = t.reshape(1)
    return t.contiguous().view(-1).view(torch.uint8)


def broadcast_tensors_(tensors: Sequence[Tensor], src: int = 0, what: str = "tensors") -> None:
    """Overwrite ``tensors`` in place with rank ``src``'s, on every rank.

    The tensors are packed as raw bytes into few flat buffers (any mix of
    dtypes and devices; buckets of at most 64 MiB, a larger tensor goes
    alone), so a whole model goes in a handful of collectives. Every rank must
    pass tensors of the same shapes and dtypes in the same order; one small
    all-gather of a layout hash checks that first. No-op without a
    distributed group.

    Args:
        tensors: tensors or parameters to overwrite (``requires_grad`` is fine).
        src: the rank whose values everyone receives.
        what: plural noun phrase for the error, e.g. ``"population adapters"``.

    Raises:
        TypeError: if an entry is not a tensor (before any communication).
        ValueError: (on every rank) if the shapes or dtypes differ between ranks.
    """
    tensors = list(tensors)
    for t in tensors:
        if not isinstance(t, Tensor):
            raise InvalidTypeError(f"`tensors` must hold tensors, got {type(t).__name__}")
    if not is_distributed():
        return
    _check_layout(_all_gather_rows(torch.tensor([_layout_hash(tensors)]))[:, 0], what, src)
    _broadcast(tensors, src)


def _check_layout(hashes: Tensor, what: str, src: int) -> None:
    if bool((hashes != hashes[src]).any()):
        raise InvalidValueError(
            f"{what} have different shapes or dtypes across ranks (layout hashes per rank "
            f"{[f'{v & 0xFFFFFFFF:08x}' for v in hashes.tolist()]}); cannot copy rank {src}'s"
        )


def _broadcast(tensors: list[Tensor], src: int) -> None:
    device = comm_device()
    bucket: list[Tensor] = []
    size = 0
    for t in tensors:
        nbytes = t.numel() * t.element_size()
        if bucket and size + nbytes > _BUCKET_BYTES:
            _broadcast_bucket(bucket, src, device)
            bucket, size = [], 0
        bucket.append(t)
        size += nbytes
    if bucket:
        _broadcast_bucket(bucket, src, device)


def _broadcast_bucket(bucket: list[Tensor], src: int, device: torch.device) -> None:
    # Each tensor starts at a multiple of 16 bytes, so every slice can be viewed
    # back as its dtype (views need offsets divisible by the element size).
    sizes = [t.numel() * t.element_size() for t in bucket]
    starts = [0]
    for nbytes in sizes:
        starts.append(starts[-1] + -(-nbytes // _ALIGN) * _ALIGN)
    flat = torch.empty(starts[-1], dtype=torch.uint8, device=device)
    if process_rank() == src:
        for t, start, nbytes in zip(bucket, starts, sizes):
            flat[start : start + nbytes] = _byte_view(t)
    dist.broadcast(flat, src=src)
    if process_rank() == src:
        return
    with torch.no_grad():
        for t, start, nbytes in zip(bucket, starts, sizes):
            t.copy_(flat[start : start + nbytes].view(t.dtype).view(t.shape))


def _words(t: Tensor) -> Tensor:
    """``t``'s bytes as the widest integer words that tile them."""
    raw = _byte_view(t)
    n = raw.numel()
    if n % 4 == 0:
        return raw.view(torch.int32)
    if n % 2 == 0:
        return raw.view(torch.int16)
    return raw


def checksum(tensors: Sequence[Tensor]) -> Tensor:
    """Deterministic fingerprint of a list of tensors, exact to the bit.

    Integer sums (wrapping in int64) of the tensors' raw bytes, plain and
    weighted by position, plus a hash of the shapes and dtypes. Integer
    addition does not depend on reduction order, so equal tensors give equal
    checksums on any device and thread count; any changed element changes the
    plain sum, swapped elements change the weighted one.

    Args:
        tensors: dense tensors on any devices.

    Returns:
        ``(3,)`` int64 CPU tensor: ``[structure hash, byte sum, weighted byte sum]``.
    """
    tensors = list(tensors)
    for t in tensors:
        if not isinstance(t, Tensor):
            raise InvalidTypeError(f"`tensors` must hold tensors, got {type(t).__name__}")
    structure = _layout_hash(tensors)
    sums = []
    for k, t in enumerate(tensors):
        words = _words(t)
        plain = torch.zeros((), dtype=torch.int64, device=words.device)
        weighted = torch.zeros((), dtype=torch.int64, device=words.device)
        for start in range(0, words.numel(), _CHECKSUM_CHUNK):
            w = words[start : start + _CHECKSUM_CHUNK].to(torch.int64)
            position = torch.arange(start + 1, start + 1 + w.numel(), dtype=torch.int64, device=w.device)
            plain += w.sum()
            weighted += (w * position).sum()
        sums.append(torch.stack([plain, weighted]).cpu() * (2 * k + 1))
    total = torch.stack(sums).sum(0) if sums else torch.zeros(2, dtype=torch.int64)
    return torch.cat([torch.tensor([structure], dtype=torch.int64), total])


def _layout_hash(tensors: list[Tensor]) -> int:
    layout = repr([(tuple(t.shape), str(t.dtype)) for t in tensors]).encode()
    return int.from_bytes(hashlib.blake2b(layout, digest_size=8).digest(), "little", signed=True)


def _all_gather_rows(row: Tensor) -> Tensor:
    device = comm_device()
    row = row.to(device)
    rows = [torch.empty_like(row) for _ in range(world_size())]
    dist.all_gather(rows, row)
    return torch.stack(rows).cpu()


def sync_if_different_(tensors: Sequence[Tensor], what: str, src: int = 0) -> bool:
    """Make ``tensors`` equal across ranks, warning once if they were not.

    All-gathers a :func:`checksum` (three integers per rank). If any rank's
    differs from rank ``src``'s, broadcasts ``src``'s tensors into everyone's
    and emits one ``UserWarning`` on every rank naming ``what`` and the ranks
    that differed. Does nothing without a distributed group.

    Args:
        tensors: the same list of tensors on every rank (e.g. a model's parameters).
        what: plural noun phrase for the warning, e.g. ``"base model parameters"``.
        src: the rank whose tensors win.

    Returns:
        Whether tensors were repaired.

    Raises:
        ValueError: (on every rank) if the shapes or dtypes differ between
            ranks, so that no broadcast can repair them.
    """
    tensors = list(tensors)
    if not is_distributed():
        return False
    table = _all_gather_rows(checksum(tensors))  # (world, 3)
    if bool((table == table[src]).all()):
        return False
    _check_layout(table[:, 0], what, src)
    _broadcast(tensors, src)
    differing = [r for r in range(table.shape[0]) if bool((table[r] != table[src]).any())]
    digests = [f"{(a ^ b) & 0xFFFFFFFF:08x}" for a, b in table[:, 1:].tolist()]
    warnings.warn(
        f"{what} differ across ranks (rank(s) {differing} differ from rank {src}; checksums per rank "
        f"{digests}); broadcasting rank {src}'s. Seed their construction (torch.manual_seed) "
        f"identically on every rank to avoid this.",
        UserWarning,
        stacklevel=2,
    )
    return True


# ------------------------------------------------------------------ object transfer


_T = TypeVar("_T")


def broadcast_object(obj: _T, src: int = 0) -> _T:
    """Send a small picklable object from rank ``src`` to every rank.

    Args:
        obj: the object on ``src``; ignored on the other ranks.
        src: the sending rank.

    Returns:
        ``src``'s object (``obj`` itself without a distributed group).
    """
    if not is_distributed():
        return obj
    box: list[Any] = [obj if process_rank() == src else None]
    dist.broadcast_object_list(box, src=src, device=comm_device())
    return box[0]  # src's object: of the type every rank passes


def broadcast_tensor_raw(tensor: Tensor | None, src: int = 0, device: torch.device | str | None = None) -> Tensor:
    """Send a tensor of any shape and dtype from rank ``src``, without pickling.

    A fixed-size int64 header (dtype code, ndim, shape) goes first, then the
    tensor's bytes in one broadcast. The receivers need not know the shape or
    dtype in advance.

    Args:
        tensor: the tensor on ``src``; ignored (may be ``None``) elsewhere.
        src: the sending rank.
        device: where to put the result; default the tensor's own device on
            ``src`` and the communication device (CPU for gloo, the current GPU
            for NCCL) on the others.

    Returns:
        ``src``'s tensor on every rank (on ``src``, the argument itself when
        no ``device`` is given).

    Raises:
        TypeError: on every rank, if ``src`` passed something that is not a
            tensor of a supported dtype.
        ValueError: on every rank, if ``src``'s tensor has more than 64 dims.
    """
    me_is_src = process_rank() == src
    if not is_distributed():
        if not isinstance(tensor, Tensor):
            raise InvalidTypeError(f"`tensor` must be a tensor, got {type(tensor).__name__}")
        return tensor if device is None else tensor.to(device)
    comm = comm_device()
    header = torch.zeros(2 + _MAX_NDIM, dtype=torch.int64)
    problem = ""
    sent: Tensor | None = None  # src's tensor, once it passed the checks
    if me_is_src:
        if not isinstance(tensor, Tensor):
            problem = f"`tensor` must be a tensor on rank {src}, got {type(tensor).__name__}"
        elif tensor.dtype not in _DTYPES:
            problem = f"`tensor` has unsupported dtype {tensor.dtype}; supported: {[str(d) for d in _DTYPES]}"
        elif tensor.dim() > _MAX_NDIM:
            problem = f"`tensor` may have at most {_MAX_NDIM} dims, got {tensor.dim()}"
        else:
            sent = tensor
        if sent is None:
            header[0] = _NO_TENSOR
        else:
            header[0] = _DTYPES.index(sent.dtype)
            header[1] = sent.dim()
            header[2 : 2 + sent.dim()] = torch.tensor(sent.shape, dtype=torch.int64)
    header = header.to(comm)
    dist.broadcast(header, src=src)
    fields = header.cpu().tolist()
    if fields[0] == _NO_TENSOR:
        raise InvalidTypeError(problem or f"rank {src} had no valid tensor to send in broadcast_tensor_raw")
    dtype = _DTYPES[fields[0]]
    shape = tuple(fields[2 : 2 + fields[1]])
    if sent is not None:
        payload = _byte_view(sent).to(comm)
    else:
        payload = torch.empty(
            torch.Size(shape).numel() * torch.empty((), dtype=dtype).element_size(), dtype=torch.uint8, device=comm
        )
    if payload.numel():
        dist.broadcast(payload, src=src)
    if sent is not None:
        return sent if device is None else sent.to(device)
    out = payload.view(dtype).view(shape)
    return out if device is None else out.to(device)
