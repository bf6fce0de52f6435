"""Low-rank linear algebra on LoRA factors, without ever forming ``dW``.

``dW = up @ down.T`` has shape ``(e, d)`` but rank at most ``r``. Its thin SVD
comes from two QR decompositions (``(d, r)`` and ``(e, r)``) and the SVD of an
``r x r`` core, so the cost is ``O((d + e) r^2)`` instead of ``O(d e r)``.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor
from torch.nn import functional as F

from populora.errors import InvalidValueError
from populora.operators.base import Factors


def compute_dtype(*tensors: Tensor) -> torch.dtype:
    """float64 if any input is float64, else float32 (QR/SVD/statistics run in it)."""
    return torch.float64 if any(t.dtype == torch.float64 for t in tensors) else torch.float32


def rms(t: Tensor, dims: int | Sequence[int] = (-2, -1)) -> Tensor:
    """Root mean square over ``dims`` (kept), in float32 (float64 for float64 input).

    Args:
        t: any shape, e.g. ``down (p, d, r)``.
        dims: the dimensions to reduce.

    Returns:
        ``t``'s shape with ``dims`` reduced to 1, e.g. ``(p, 1, 1)``.
    """
    dim = dims if isinstance(dims, int) else tuple(dims)
    return t.to(compute_dtype(t)).square().mean(dim=dim, keepdim=True).sqrt()


def effective_rank(down: Tensor, up: Tensor) -> int:
    """``min(r, d, e)`` for ``down (..., d, r)``, ``up (..., e, r)``: the most ``dW`` can have."""
    return min(down.shape[-1], down.shape[-2], up.shape[-2])


def svd_compute(down: Tensor, up: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """:func:`svd_factors` left in the compute dtype (callers cast once at the end)."""
    if down.shape[-1] != up.shape[-1] or down.shape[:-2] != up.shape[:-2]:
        raise InvalidValueError(
            f"`down` (..., d, r) and `up` (..., e, r) must share batch dims and r, "
            f"got {tuple(down.shape)} and {tuple(up.shape)}"
        )
    dtype = compute_dtype(down, up)
    q = down.shape[-1]
    q_down, r_down = torch.linalg.qr(down.to(dtype))  # (..., d, ka), (..., ka, r)
    q_up, r_up = torch.linalg.qr(up.to(dtype))  # (..., e, kb), (..., kb, r)
    core = r_up @ r_down.mT  # (..., kb, ka): dW = q_up core q_down^T
    w, s, zh = torch.linalg.svd(core, full_matrices=False)  # (kb, k), (k,), (k, ka)
    u = q_down @ zh.mT  # (..., d, k)
    v = q_up @ w  # (..., e, k)
    pad = q - s.shape[-1]
    if pad > 0:  # d or e < r: the surplus components are zero
        u, v, s = F.pad(u, (0, pad)), F.pad(v, (0, pad)), F.pad(s, (0, pad))
    return u, s, v


def svd_factors(down: Tensor, up: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Thin SVD of ``dW = up @ down.T``, computed from the factors.

    QR of ``down`` and of ``up``, then SVD of the small ``R_up R_down^T``;
    QR and SVD run in float32 (float64 for float64 input) and the results are
    cast back to the input dtype, so bf16/fp16 stacks work.

    Args:
        down: ``(..., d, r)``.
        up: ``(..., e, r)``.

    Returns:
        ``(U (..., d, r), s (..., r), V (..., e, r))`` with
        ``dW = V diag(s) U^T``, ``s`` descending and non-negative, ``U`` and
        ``V`` with orthonormal columns. When ``min(d, e) < r`` the last
        ``r - min(d, e)`` components are zero (zero columns, ``s = 0``).

    Example:
        >>> g = torch.Generator().manual_seed(0)
        >>> down, up = torch.randn(5, 2, generator=g), torch.randn(4, 2, generator=g)
        >>> u, s, v = svd_factors(down, up)
        >>> torch.allclose(v @ torch.diag(s) @ u.T, up @ down.T, atol=1e-5)
        True
    """
    u, s, v = svd_compute(down, up)
    dtype = down.dtype
    return u.to(dtype), s.to(dtype), v.to(dtype)


def rebuild_balanced(u: Tensor, s: Tensor, v: Tensor, dtype: torch.dtype | None = None) -> Factors:
    """Balanced factors of ``V diag(s) U^T``: ``down = U sqrt(s)``, ``up = V sqrt(s)``.

    Args:
        u: ``(..., d, r)``.  s: ``(..., r)``, non-negative.  v: ``(..., e, r)``.
        dtype: dtype of the result (default: ``u``'s).

    Returns:
        ``Factors(down (..., d, r), up (..., e, r))`` with ``up @ down.T = V diag(s) U^T``.
    """
    root = s.clamp_min(0).sqrt().unsqueeze(-2)  # (..., 1, r)
    dtype = u.dtype if dtype is None else dtype
    return Factors((u * root).to(dtype), (v * root).to(dtype))
