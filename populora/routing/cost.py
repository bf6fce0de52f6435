"""The cost model of a target's routed work: low-rank products or per-individual merged weights.

A target layer ``W (e, d)`` (bias ``b``) with adapters of rank ``r`` can add each row's delta in two ways:

- ``products``: the base product ``x W^T + b`` over the ``n`` rows, then two batched low-rank products over
  the ``k`` groups of ``t`` rows (tokens) each, ``(x @ down_g^T) @ up_g`` (what
  :func:`~populora.routing.delta.add_delta` does);
- ``merged``: one batched product with each group's merged weight, ``x @ (W^T + down_g^T up_g) + b``
  (``bmm`` over the ``k`` groups), the merged weights kept by :class:`~populora.routing.prepared.PreparedRoutes`;
- ``merged-broadcast``: the same as a broadcast multiply and sum (no per-group cost: many groups of one row).

For a small layer the merged weight is cheaper: one tensor operation instead of three, and ``d e`` multiply-adds
per row against ``r (d + e)`` for the two skinny products; for a large one it reads ``k d e`` weights where
the base product reads ``d e`` once. :func:`choose_form` decides, as a pure function of the shapes, the dtype
and the device type, from constants measured once by ``benchmarks/cost_model.py`` and committed in
:mod:`populora.routing.cost_constants` (never a timing at run time: a run is reproducible). Where no
constants were measured (a dtype or device type the table lacks) the answer is ``products``, the form
that needs no extra memory.

Each operation costs ``fixed + k * per_group + macs * per_mac`` (microseconds); ``per_mac`` of ``bmm``
differs below and above :data:`~populora.routing.delta.UNBLOCKED` multiply-adds per group (ATen's CPU
``bmm`` runs such products in a scalar loop).
"""

from __future__ import annotations

import math

import torch

from populora.routing.cost_constants import CONSTANTS
from populora.routing.delta import BROADCAST, UNBLOCKED

__all__ = ["BROADCAST_MAX_ELEMENTS", "FORMS", "MERGED_MAX_ELEMENTS", "choose_form", "form_costs"]

MERGED_MAX_ELEMENTS = 1 << 16
"""Largest ``d * e`` of a target whose merged weights may be formed (256 x 256): an LLM's layers never are."""

BROADCAST_MAX_ELEMENTS = 1 << 20
"""Largest ``k t d e`` of the ``merged-broadcast`` form (its multiply holds that many elements at once)."""

FORMS = ("products", "merged", "merged-broadcast")
"""The forms :func:`choose_form` picks from: the low-rank products; the merged weights as one ``bmm`` over the
groups; the merged weights as a broadcast multiply and sum (no per-group cost: many groups of few rows)."""


def _bmm(c: dict, k: int, t: int, p: int, q: int) -> float:
    """Microseconds of ``bmm`` over ``k`` groups of ``(t, p) @ (p, q)``."""
    macs = t * p * q
    fixed, per_group, small, large = c["bmm"]
    return fixed + k * per_group + k * macs * (small if macs < UNBLOCKED else large)


def _ew(c: dict, ops: int, elements: int) -> float:
    """Microseconds of ``ops`` elementwise operations over ``elements`` elements each."""
    fixed, per_element = c["ew"]
    return ops * (fixed + elements * per_element)


def _linear(c: dict, n: int, d: int, e: int) -> float:
    """Microseconds of ``F.linear`` of ``n`` rows, ``d -> e``."""
    fixed, per_mac = c["linear"]
    return fixed + n * d * e * per_mac


def _products(c: dict, k: int, t: int, d: int, e: int, r: int, cpu: bool) -> float:
    """The two low-rank products in the forms :func:`~populora.routing.delta.down_product` and
    :func:`~populora.routing.delta.add_product` pick."""
    macs = t * r * d
    if cpu and macs < UNBLOCKED and k * macs >= BROADCAST[0]:
        down = _ew(c, 2, k * macs)
    else:
        down = _bmm(c, k, t, d, r)
    macs = t * r * e
    if cpu and macs < UNBLOCKED and (r == 1 or k * macs >= BROADCAST[1]):
        up = _ew(c, 1, k * t * e) if r == 1 else _ew(c, 2, k * macs) + _ew(c, 1, k * t * e)
    else:
        up = _bmm(c, k, t, r, e)
    return down + up


def form_costs(
    groups: int,
    rows: int,
    d: int,
    e: int,
    r: int,
    dtype: torch.dtype,
    device_type: str,
    replaces_base: bool,
) -> dict[str, float] | None:
    """Modelled microseconds per call of each of :data:`FORMS` for one target, or ``None`` without constants.

    Args:
        groups: ``k`` groups (individuals) of the layout.
        rows: ``t`` rows (tokens) of each group.
        d, e: the target's in and out features.
        r: adapter rank.
        dtype: the activations' (and adapters') dtype.
        device_type: ``"cpu"``, ``"cuda"``, ...
        replaces_base: the merged forms replace the base product (``x W_g + b``); otherwise they are added to
            it (``x W^T + b`` then ``+= x dW_g``: the target's own forward cannot be skipped).
    """
    c = CONSTANTS.get((device_type, str(dtype).removeprefix("torch.")))
    if c is None:
        return None
    k, t = groups, rows
    base = _linear(c, k * t, d, e)
    added = 0.0 if replaces_base else base
    broadcast = _ew(c, 2, k * t * d * e) + _ew(c, 1, k * t * e) + added  # multiply, sum, add
    return {
        "products": base + _products(c, k, t, d, e, r, device_type == "cpu"),
        "merged": _bmm(c, k, t, d, e) + added,  # (the bias: baddbmm's input, or the product added in place)
        # (its (k, t, d, e) product is held at once: never beyond BROADCAST_MAX_ELEMENTS, whatever it costs)
        "merged-broadcast": broadcast if k * t * d * e <= BROADCAST_MAX_ELEMENTS else math.inf,
    }


def choose_form(
    groups: int,
    rows: int,
    d: int,
    e: int,
    r: int,
    dtype: torch.dtype,
    device_type: str,
    replaces_base: bool,
) -> str:
    """The cheapest of :data:`FORMS` for one target's routed work (see the module docstring).

    A pure function of its arguments. A merged form only where the constants say it is cheaper and the layer
    is small (``d * e <= MERGED_MAX_ELEMENTS``); the bytes it would hold are bounded separately, by the cache
    that holds them.

    Example:
        >>> choose_form(16, 4096, 4096, 4096, 16, torch.float32, "cpu", True)  # an LLM layer: never merged
        'products'
        >>> choose_form(16, 1, 4, 32, 4, torch.float32, "tpu", True)  # no constants for this device
        'products'
    """
    if d * e > MERGED_MAX_ELEMENTS or groups <= 0 or rows <= 0:
        return "products"
    costs = form_costs(groups, rows, d, e, r, dtype, device_type, replaces_base)
    if costs is None:
        return "products"
    return min(FORMS, key=costs.__getitem__)  # (ties: the first, the products)
