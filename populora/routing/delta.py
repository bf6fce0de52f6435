"""The batched low-rank delta of each layout: what a target layer adds to its output under a route.

Inside a layer the rows are laid out as ``(k c)``: ``k`` groups of ``c`` rows,
group ``g`` using adapter ``index[g]``, so the delta is two batched matmuls
over ``(k, c*..., d)`` with no gather of weights per row:

    out[rows of group g] += (x[rows of g] @ down[index[g]]) @ up[index[g]].T

Rows of unequal groups (``individuals=`` routing) arrive sorted by id,
packed into chunks of equal size (padding at most one chunk per group; the
plan is made by :class:`~populora.routing.plan.Planner`). When the groups are
so small that gathering their adapters would cost more memory than the
activations (about one row per id), the gathered groups are processed in
blocks of bounded size (:func:`gather_budget`), so a routed forward never
holds a per-row copy of the weights.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor, nn

from populora.adapters import Adapter
from populora.routing.route import Index, Route

__all__ = [
    "BROADCAST",
    "FEW_ROWS",
    "UNBLOCKED",
    "add_delta",
    "add_product",
    "down_product",
    "factors",
    "gather_budget",
    "grouped_delta",
    "grouped_ok",
    "product",
]

_FUSED_CAPABILITY: dict[torch.device, bool] = {}


def grouped_ok(x: Tensor, out: Tensor, adapter: Adapter, grouped: bool | None) -> bool:
    """Whether this target's delta runs on ``grouped_mm`` (``grouped``: the route's switch, see
    :class:`~populora.routing.plan.Planner`)."""
    if grouped is False or adapter.bias is not None or not hasattr(nn.functional, "grouped_mm"):
        return False
    down = adapter.down
    if not (down.dtype == x.dtype == out.dtype) or x.dim() < 2:
        return False
    size = x.element_size()
    if any((v * size) % 16 for v in (down.shape[1], down.shape[2], adapter.up.shape[2])):
        return False
    if grouped:
        return True
    if x.device.type != "cuda" or x.dtype != torch.bfloat16:
        return False
    fused = _FUSED_CAPABILITY.get(x.device)
    if fused is None:
        fused = _FUSED_CAPABILITY[x.device] = torch.cuda.get_device_capability(x.device) in ((9, 0), (10, 0))
    return fused


def _take(stack: Tensor, index: Index) -> Tensor:
    if index is None:
        return stack
    return stack[index] if isinstance(index, slice) else stack.index_select(0, index)


def _offsets(index: Index, groups: int, device: torch.device) -> Tensor:
    """``(k,)`` adapter id of each group, as a tensor."""
    if index is None:
        return torch.arange(groups, device=device)
    if isinstance(index, slice):
        return torch.arange(index.start, index.stop, device=device)
    return index


def _rows_down(x: Tensor, module: nn.Module, adapter: Adapter, index: Index, k: int) -> Tensor:
    """``(k, c*.., r)``: the rows projected by each group's ``down``; ``x`` is ``(k*c, ..)``."""
    if isinstance(module, nn.Embedding):  # row `token` of each group's table, no copy of tables
        p, vocab, r = adapter.down.shape
        flat = x.reshape(k, -1) + _offsets(index, k, x.device)[:, None] * vocab
        return adapter.down.reshape(p * vocab, r)[flat]
    down = _take(adapter.down, index)  # (k, r, d)
    if down.dtype != x.dtype:
        down = down.to(x.dtype)
    return down_product(down, x, k)


UNBLOCKED = 400
"""ATen's CPU ``bmm`` runs a product of fewer than this many multiply-adds per batch entry (``m * n * k``) in
a plain scalar loop: about 1 ns per multiply-add for ``down`` (``x @ down.T``) and 5 ns for ``up`` here,
against a broadcast multiply's fixed 3-15 us. Such products are written as broadcast multiplies when
they hold at least :data:`BROADCAST` multiply-adds in all (measured: 327 us -> 9.5 us at 256 groups of
one row, rank 1, e = 256), and left to ``bmm`` below (a one-row env policy: 3 us against 11 us)."""

BROADCAST = (16384, 8192)
"""Multiply-adds, over every group, above which a product below :data:`UNBLOCKED` per group is a broadcast
multiply: ``(down, up)``."""

FEW_ROWS = 4
"""Groups of at most this many rows (tokens) project as ``x @ down.T``, larger ones as ``down @ x.T`` (see
:func:`down_product`)."""


def down_product(down: Tensor, x: Tensor, k: int) -> Tensor:
    """``(k, c*.., r)``: ``x (k*c.., d)`` projected by ``down (k, r, d)``.

    Three forms of the same product, by the size of each group's part:

    - a product ATen would loop over unblocked, large in all: a broadcast multiply and sum (:data:`UNBLOCKED`);
    - at most :data:`FEW_ROWS` rows (tokens) per group (one decode step, an env step): ``x @ down.T``;
    - more rows: ``(k, r, d) @ (k, d, c*..)`` with ``r`` on the rows, 2-5x faster for these skinny
      products (a prefill, a batch per individual); the transposed view feeds ``baddbmm`` as is.
    """
    xs = x.reshape(k, -1, x.shape[-1])  # (k, t, d)
    t, r = xs.shape[1], down.shape[1]
    macs = t * r * xs.shape[2]
    if macs < UNBLOCKED and k * macs >= BROADCAST[0] and xs.device.type == "cpu":
        return (xs.unsqueeze(2) * down.unsqueeze(1)).sum(-1)  # (k, t, 1, d) * (k, 1, r, d) -> (k, t, r)
    if t <= FEW_ROWS:
        return torch.bmm(xs, down.transpose(1, 2))
    return torch.bmm(down, xs.transpose(1, 2)).transpose(1, 2)


def _broadcast_up(h: Tensor, up: Tensor) -> bool:
    """Whether ``h (k, t, r) @ up (k, r, e)`` is a broadcast multiply (see :data:`UNBLOCKED`)."""
    macs = h.shape[1] * h.shape[2] * up.shape[2]
    return macs < UNBLOCKED and h.device.type == "cpu" and (h.shape[2] == 1 or h.shape[0] * macs >= BROADCAST[1])


def add_product(out: Tensor, h: Tensor, up: Tensor) -> Tensor:
    """``out (k, t, e) += h (k, t, r) @ up (k, r, e)`` in place; returns ``out``."""
    if _broadcast_up(h, up):
        if h.shape[2] == 1:
            return out.addcmul_(h, up)  # (k, t, 1) * (k, 1, e)
        return out.add_((h.unsqueeze(-1) * up.unsqueeze(1)).sum(2))  # (k, t, r, 1) * (k, 1, r, e)
    return out.baddbmm_(h, up)


def product(h: Tensor, up: Tensor) -> Tensor:
    """``h (k, t, r) @ up (k, r, e)`` as a new tensor (the same forms as :func:`add_product`)."""
    if _broadcast_up(h, up):
        return h * up if h.shape[2] == 1 else (h.unsqueeze(-1) * up.unsqueeze(1)).sum(2)
    return torch.bmm(h, up)


def factors(
    x: Tensor,
    module: nn.Module,
    adapter: Adapter,
    index: Index,
    k: int,
    dtype: torch.dtype,
) -> tuple[Tensor, Tensor]:
    """``h (k, c*.., r)`` and ``up (k, r, e)`` of ``k`` groups, so that their delta is ``h @ up``.

    A bias is folded into the same matmul: ``[h, 1] @ [up; bias]`` (``r + 1`` columns).
    """
    h = _rows_down(x, module, adapter, index, k)
    up = _take(adapter.up, index)
    if up.dtype != dtype:
        h, up = h.to(dtype), up.to(dtype)
    if adapter.bias is not None:
        bias = _take(adapter.bias, index).to(dtype)
        h = torch.cat((h, h.new_ones(*h.shape[:-1], 1)), dim=-1)  # (k, c*.., r+1)
        up = torch.cat((up, bias[:, None, :]), dim=1)  # (k, r+1, e)
    return h, up


def gather_budget(device: torch.device, activation_bytes: int) -> int:
    """Most bytes of gathered adapters a target layer holds at once in an ``individuals=`` forward.

    Gathering the adapters of ``k`` groups copies ``k * r * (d + e)`` values;
    with about one row per group that is ``r`` times the activations.
    Groups are therefore processed in blocks whose gathered adapters fit
    ``max(floor, activation_bytes)``, ``activation_bytes`` being the bytes of
    the layer's input and output (so the extra memory stays of the order of
    the activations whatever ``r``); the floor (1 MiB on CPU, 32 MiB on
    accelerators, where each block costs kernel launches) keeps small
    forwards in one block.

    Example:
        >>> gather_budget(torch.device("cpu"), 4096)
        1048576
    """
    return max(1 << 20 if device.type == "cpu" else 32 << 20, activation_bytes)


def add_delta(module: nn.Module, x: Tensor, out: Tensor, route: Route, adapter: Adapter) -> Tensor:
    """``out`` plus each row's delta under ``route`` (in place when the layout allows); returns the output.

    Rows of the base model (``route.base_rows``) keep their base output exactly (it is put back after the
    delta), and get no gradient through the adapters.

    Args:
        module: the target layer (``nn.Linear`` or ``nn.Embedding``).
        x: ``(n, ..., d)`` its input (token ids for an embedding); ``n == route.n``.
        out: ``(n, ..., e)`` its output.
        route: the route, its index tensors on ``out``'s device.
        adapter: the target's stacks (``down (p, r, d)``, ``up (p, r, e)``, optional ``bias (p, e)``).
    """
    if route.base_rows is None:
        return _add_delta(module, x, out, route, adapter)
    if route.base_rows.shape[0] == route.n and not torch.is_grad_enabled():
        return out  # every row is the base model's (no adapter at all)
    kept = out.index_select(0, route.base_rows)  # the base model's rows: put back after the delta
    return _add_delta(module, x, out, route, adapter).index_copy(0, route.base_rows, kept)


def _add_delta(module: nn.Module, x: Tensor, out: Tensor, route: Route, adapter: Adapter) -> Tensor:
    index = route.index
    if (index is None or index.__class__ is slice) and route.dest is None:
        down = adapter.down  # the commonest cases first, with the fewest checks: every individual or one,
        if (  # equal groups, one dtype (an env loop pays this per target and timestep)
            route.n
            and adapter.bias is None
            and down.dtype == out.dtype == x.dtype
            and out.is_contiguous()
            and type(module) is not nn.Embedding
        ):
            k, up = route.groups, adapter.up
            if index is not None:
                down, up = down[index], up[index]
            add_product(out.view(k, -1, out.shape[-1]), down_product(down, x, k), up)  # += (k, c*.., r) @ (k, r, e)
            return out
    if route.n == 0:  # an empty batch: nothing to add (the base output is already (0, ..))
        if torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in adapter):
            out = out + sum(t.sum() for t in adapter if t is not None) * 0  # still a function of the adapters
        return out
    k, c = route.groups, route.chunk
    down, up = adapter.down, adapter.up
    index, e = route.index, out.shape[-1]
    block = k  # groups per block
    if isinstance(index, Tensor):  # adapters are gathered per group: bound the copy (gather_budget)
        rank = up.shape[1]
        per_group = (
            rank * e
            + (0 if isinstance(module, nn.Embedding) else rank * down.shape[-1])
            + (0 if adapter.bias is None else e)
        ) * down.element_size()
        budget = gather_budget(out.device, (x.numel() + out.numel()) * out.element_size())
        block = max(1, min(k, budget // per_group))
    if not out.is_contiguous():
        out = out.contiguous()
    if route.dest is None:  # rows already (k c): add each block's delta in place
        view = out.view(k, -1, e)
        if block == k:
            h, up = factors(x, module, adapter, index, k, out.dtype)
            add_product(view, h, up)  # (k, c*.., e) += (k, c*.., r) @ (k, r, e)
            return out
        for g0 in range(0, k, block):  # (blocks: the groups gather adapters, `index` is a tensor)
            g1 = min(k, g0 + block)
            h, up = factors(x[g0 * c : g1 * c], module, adapter, index[g0:g1], g1 - g0, out.dtype)  # type: ignore[index]
            add_product(view[g0:g1], h, up)
        return out
    if (
        block == k
        and route.offs is not None
        and type(module) is not nn.Embedding
        and grouped_ok(x, out, adapter, route.grouped)
    ):
        return grouped_delta(x, out, adapter, route)
    # unequal groups: pack each block's rows into (k c), padded, and add its delta to those rows in place;
    # rows are sorted by group, so a block of groups owns a contiguous range of rows
    # (rows in input order, `route.order` set: the same, each block's rows gathered through `order`)
    for g0 in range(0, k, block):
        g1 = min(k, g0 + block)
        rows = None
        if block == k:
            j0, j1, pos, part = 0, route.n, route.dest, index
            xs = x
        else:
            j0, j1 = (int(j) for j in np.searchsorted(route.dest_host, (g0 * c, g1 * c)))  # type: ignore[arg-type]
            part = index[g0:g1]  # type: ignore[index]
            if route.order is None:
                pos, xs = route.dest[j0:j1] - g0 * c, x[j0:j1]
            else:
                rows = route.order[j0:j1]
                pos, xs = route.dest.index_select(0, rows) - g0 * c, x.index_select(0, rows)
        packed = x.new_zeros(((g1 - g0) * c, *x.shape[1:])).index_copy_(0, pos, xs)
        h, up = factors(packed, module, adapter, part, g1 - g0, out.dtype)
        del packed, xs
        delta = product(h, up).reshape((g1 - g0) * c, *out.shape[1:]).index_select(0, pos)
        if block == k:
            out.add_(delta)
        elif rows is None:
            out[j0:j1] += delta
        else:
            out.index_add_(0, rows, delta)
    return out


def grouped_delta(x: Tensor, out: Tensor, adapter: Adapter, route: Route) -> Tensor:
    """``out`` plus the delta of unequal groups in two ``grouped_mm`` calls (rows sorted by id, no padding).

    ``x`` is ``(n, .., d)``, ``out`` ``(n, .., e)`` (contiguous); the rows of
    id ``route.ids[j]`` are the sorted rows ``offs[j-1] .. offs[j]`` (through
    ``route.order`` when the rows stay in input order).
    """
    ids, offs = route.ids, route.offs
    assert ids is not None and offs is not None  # (unequal groups: the planner sets both)
    d, e = x.shape[-1], out.shape[-1]
    rows = x if route.order is None else x.index_select(0, route.order)
    per_row = rows.numel() // (route.n * d)  # tokens of each row
    if per_row != 1:
        offs = offs * per_row
    down, up = adapter.down, adapter.up
    if ids.shape[0] != down.shape[0]:  # (sorted distinct ids: all P of them are arange(P))
        down, up = down.index_select(0, ids), up.index_select(0, ids)
    h = nn.functional.grouped_mm(rows.reshape(-1, d), down.transpose(1, 2), offs=offs)  # (n.., r)
    delta = nn.functional.grouped_mm(h, up, offs=offs)  # (n.., e)
    if route.order is None:
        out.view(-1, e).add_(delta)
    else:
        out.index_add_(0, route.order, delta.view(route.n, *out.shape[1:]))
    return out
