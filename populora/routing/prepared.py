"""Prepared routes: the per-target work that depends only on who owns each row, done once per assignment.

An environment loop routes the same slots to the same individuals for hundreds of timesteps (a slot keeps
its individual until its episode ends), and a decode loop keeps its rows; each routed forward of such a
loop repeats the same gathers and forms. :class:`PreparedRoutes` keeps, per target layer and layout,

- for rows whose groups use gathered adapters (``individuals=``: a ``(k,)`` index): each group's factors
  ``down_g (k, r, d)``, ``up_g (k, r, e)``, gathered once, so a call runs the two products alone, the same
  kernels on the same values as the uncached path (bitwise equal outputs);
- for a small layer, where the cost model says so (:func:`~populora.routing.cost.choose_form`): every
  individual's merged weight ``W^T + down_i^T up_i`` (``(P, d, e)``, or the delta ``down_i^T up_i`` alone
  when the layer's own forward cannot be skipped) and, per index, the groups' merged weights gathered from
  it; a call is then ONE batched product ``x @ W_g + b`` (equal to the uncached path to float rounding,
  about ``1e-6`` relative in float32).

Freshness is by scope, not by version counters. Some writes leave no trace a cache could check: torch's
fused optimizers (``Adam(fused=True)``) keep ``_version`` and the storage, a write through ``param.data``
bumps no counter PyTorch keeps, and ``param.data = w`` twice (or ``half()`` then ``float()``) can land at
the freed address with the same version. So prepared work is made and used only inside a *scope*
(:meth:`PreparedRoutes.scope`), and everything is dropped when the outermost scope ends. Scopes are:

- one entry of a route block (``with pop.route(...)`` / :meth:`Population.loop_route
  <populora.Population.loop_route>`, from ``__enter__`` to ``__exit__``): a ``generate`` call is one;
- work the library runs start to end (one environment evaluation), through
  :meth:`RoutedModel.prepared_scope <populora.routing.front.RoutedModel.prepared_scope>`.

A routed call outside any scope (``pop(x, ...)`` under ``torch.no_grad``) runs the uncached path, so it
always reads the weights as they are. Writes made *inside* a scope, between two of its forwards, are not
seen until the next scope (the docstrings of the blocks say so). Inside a scope the entries are still
stamped with the version counters, storage and identity of the tensors they were made from (the
population's own writes, an optimizer's ``foreach`` step, a swapped parameter rebuild them), but the scope,
not the stamp, is what makes them fresh.

Preparation is used only while grad is disabled (``torch.no_grad`` / ``torch.inference_mode``), never
under ``torch.compile`` or autocast, never for inference tensors, and never for a layer whose weight is
computed (``torch.nn.utils.parametrize``, ``weight_norm``, ``torch.nn.utils.prune``: no ``weight``
parameter of its own): those take the uncached path, which reads the weight the layer's forward computes.
Entries are bounded in bytes (:attr:`PreparedRoutes.budget`, least recently used dropped first; ``0``
turns preparation off); merged weights are never formed for a layer larger than
:data:`~populora.routing.cost.MERGED_MAX_ELEMENTS`.

One :class:`PreparedRoutes` belongs to each :class:`~populora.routing.router.Router` (so to each
population); the population clears it on every write of its adapters.
"""

from __future__ import annotations

import contextlib
import weakref
from collections import OrderedDict
from collections.abc import Iterator
from functools import partial
from typing import NamedTuple

import torch
from torch import Tensor, nn

from populora.adapters import Adapter
from populora.checks import is_int
from populora.errors import InvalidTypeError, InvalidValueError
from populora.routing.cost import choose_form
from populora.routing.delta import add_product, down_product, gather_budget
from populora.routing.route import Route

__all__ = ["PREPARED_BYTES", "PreparedRoutes"]

PREPARED_BYTES = 8 << 20
"""Default bound of the bytes one :class:`PreparedRoutes` holds (merged weights and gathered factors)."""

_MAX_ENTRIES = 512  # entries of routes no longer in use are dropped with the least recently used


def _check_budget(value: object) -> int:
    """``value`` as a byte budget: an int ``>= 0`` (a bool, a float or a negative number is refused)."""
    if not is_int(value):
        raise InvalidTypeError(f"`budget` must be an int number of bytes (0 turns preparation off), got {value!r}")
    budget = int(value)  # type: ignore[call-overload]
    if budget < 0:
        raise InvalidValueError(f"`budget` must be >= 0 bytes (0 turns preparation off), got {budget}")
    return budget


def _own_weights(params: dict) -> tuple[Tensor, Tensor | None] | None:
    """The layer's weight and bias when both are its own parameters (or it has no bias), else ``None``: a
    computed weight (parametrized, pruned, a plain attribute) is read by the layer's forward alone."""
    weight = params.get("weight")
    if weight is None or "bias" not in params:
        return None
    return weight, params["bias"]


class _Entry(NamedTuple):
    """Tensors prepared for one target, and what they were made from."""

    form: str  # "stack", "merged", "merged-broadcast", "factors" or "zero" (see PreparedRoutes)
    plain: bool  # merged weights replace the layer's own product (else they hold the delta alone)
    first: Tensor | None  # merged weights (k | P, d, e), or the gathered down_g (k, r, d)
    second: Tensor | None  # factors: the gathered up_g (k, r, e)
    refs: tuple  # weak references to down, up, weight, bias (or None) and the route's index (or None)
    stamp: tuple  # versions and storage of down, up, weight, bias; the dtype
    nbytes: int


def _stamp(down: Tensor, up: Tensor, weight: Tensor, bias: Tensor | None, dtype: torch.dtype) -> tuple:
    """What an entry made from these tensors is valid for (any in-place write bumps a version; ``.data =``
    swaps the storage)."""
    return (
        down._version,
        up._version,
        weight._version,
        down.data_ptr(),
        up.data_ptr(),
        weight.data_ptr(),
        None if bias is None else bias._version,
        None if bias is None else bias.data_ptr(),
        dtype,
    )


def _fresh(entry: _Entry, down: Tensor, up: Tensor, weight: Tensor, bias: Tensor | None, dtype: torch.dtype) -> bool:
    """Whether ``entry`` was made from exactly these tensors as they are now (the cheapest checks first)."""
    s, r = entry.stamp, entry.refs
    return (
        down._version == s[0]
        and up._version == s[1]
        and weight._version == s[2]
        and r[0]() is down
        and r[1]() is up
        and r[2]() is weight
        and down.data_ptr() == s[3]
        and up.data_ptr() == s[4]
        and weight.data_ptr() == s[5]
        and dtype == s[8]
        and (s[6] is None if bias is None else (r[3]() is bias and bias._version == s[6] and bias.data_ptr() == s[7]))
    )


def _ref(t: Tensor | None) -> weakref.ref | None:
    return None if t is None else weakref.ref(t)


class PreparedRoutes:
    """Per-target prepared work of routed forwards without grad (see the module docstring).

    Entries, keyed by target, layout (the route's index tensor, its slice, or every individual) and input
    shape: ``stack`` (every individual's merged weight, or merged delta, ``(P, d, e)``); ``merged`` /
    ``merged-broadcast`` (the groups' merged weights, applied as one ``bmm`` or a broadcast multiply and
    sum); ``factors`` (the groups' gathered ``down_g``, ``up_g``); ``zero`` (every group's ``up`` is zero, as
    with ``init_scale=0`` before any change: the layer's own forward, exactly the base model). Which one a
    layout gets is :func:`~populora.routing.cost.choose_form`'s choice, then the byte bounds.

    When an entry has to be dropped before it was ever used again (a model whose targets' prepared work does
    not fit the budget together: an LLM's gathered factors, many small layers of a large population), making
    and dropping entries in turn would cost more than it saves: preparation stops until the next
    :meth:`clear` (the population's next write of its adapters) or change of the budget.

    Entries are made and used only inside a scope (:meth:`scope`; the module docstring says why), and the end
    of the outermost scope drops them all.

    Args:
        budget: most bytes held (least recently used entries dropped first); ``0`` turns preparation off:
            nothing is made or used, every call takes the uncached path.

    Attributes:
        budget: as above; lowering it drops entries until the rest fit (``0``: all of them).
        depth: scopes open now (``0``: no preparation).

    Raises:
        InvalidTypeError, InvalidValueError: a ``budget`` that is not an int ``>= 0`` (setting it too).
        nbytes: bytes held now (a view of a stack counts the whole stack: an upper bound).
        hits, builds: calls that used a prepared entry, and entries made (counts, for tests and benchmarks).
        stopped: whether preparation stopped for lack of room (see above).
    """

    def __init__(self, budget: int = PREPARED_BYTES):
        self._budget = _check_budget(budget)
        self.depth = 0
        self.nbytes = 0
        self.hits = self.builds = 0
        self._entries: OrderedDict[tuple, _Entry] = OrderedDict()
        self._self = weakref.ref(self)
        self._forms: dict[tuple, str | None] = {}  # layout shapes -> form (a pure function of them; memoised)
        self._skip: dict[tuple, tuple] = {}  # entry keys whose layout has no prepared form -> (down shape, dtype)
        self._unused: set[tuple] = set()  # keys of entries not used since they were made
        self.stopped = False

    @property
    def budget(self) -> int:
        return self._budget

    @budget.setter
    def budget(self, value: int) -> None:
        self._budget = _check_budget(value)
        self._forms.clear()  # (a form depends on the bytes allowed)
        self._skip.clear()
        if self._budget == 0:  # (zero-byte entries, the "zero" form, would fit a budget of 0)
            self.clear()
        self.stopped = False
        self._evict(0)

    def enter(self) -> None:
        """Open a scope (:meth:`scope` without the ``with``; pair each call with :meth:`exit`)."""
        self.depth += 1

    def exit(self) -> None:
        """Close a scope opened by :meth:`enter`; the outermost one drops every entry."""
        if self.depth > 0:
            self.depth -= 1
        if self.depth == 0 and (self._entries or self._skip):
            self.clear()
            self._skip.clear()  # (its keys hold ids of index tensors, which may be reused once freed)

    @contextlib.contextmanager
    def scope(self) -> Iterator[PreparedRoutes]:
        """A scope in which routed forwards without grad may keep prepared work across calls.

        Weights written inside the scope, between two of its forwards, may not be seen by the later ones:
        open one only around work that writes no weight (one environment evaluation, one ``generate``).
        Scopes nest; the end of the outermost drops everything prepared, even on error.
        """
        self.enter()
        try:
            yield self
        finally:
            self.exit()

    def __getstate__(self) -> dict:
        """A copy (``copy.deepcopy``, pickling a population) starts empty and outside any scope: entries hold
        weak references to the tensors they were made from, which neither pickle nor belong to the copy."""
        return {"_budget": self._budget}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["_budget"])  # type: ignore[misc]

    def clear(self) -> None:
        """Drop every entry (the population calls this when it writes its adapters); preparation starts again."""
        self._entries.clear()
        self._unused.clear()
        self.nbytes = 0
        self.stopped = False

    def __len__(self) -> int:
        return len(self._entries)

    def forward(
        self, i: int, module: nn.Module, inner, x: Tensor, route: Route, adapter: Adapter, plain: bool
    ) -> Tensor | None:
        """Target ``i``'s output under ``route`` from prepared work, or ``None`` when this call cannot use any
        (the caller then runs the uncached path, which gives the same result).

        Args:
            i: the target's index in its router.
            module: the target layer.
            inner: its forward without the route (the class's, or another router's wrapper).
            x: ``(n, ..., d)`` its input.
            route: the active route (resolved; ``route.n == n`` is checked here).
            adapter: the target's stacks.
            plain: ``inner`` is ``nn.Linear``'s own forward (a merged weight may replace it).

        Call only with grad disabled and outside ``torch.compile`` (the router checks). Outside a scope, or
        with a budget of ``0``, always ``None``.
        """
        if not self.depth or self.stopped or not self._budget:
            return None
        index = route.index
        layout: object
        if index is None:
            layout = None
        elif index.__class__ is slice:
            layout = (index.start, index.stop)
        else:
            layout = id(index)
        key = (i, layout, x.shape)
        entry = self._entries.get(key)
        if entry is None:
            if self._skip.get(key) == (adapter.down.shape, x.dtype):  # known to have no prepared form
                return None
            return self._miss(key, i, module, inner, x, route, adapter, plain)
        if route.dest is not None or route.base_rows is not None or adapter.bias is not None or x.shape[0] != route.n:
            return None
        # (the dict itself: Module.__getattr__ costs a microsecond a name)
        own = _own_weights(module._parameters)
        if own is None:  # (parametrized or pruned since the entry was made: the layer computes its weight)
            return None
        weight, bias = own
        if (
            not _fresh(entry, adapter.down, adapter.up, weight, bias, x.dtype)
            or (layout.__class__ is int and entry.refs[4]() is not index)
            or torch.is_autocast_enabled("cpu" if x.is_cpu else x.device.type)
        ):
            return self._miss(key, i, module, inner, x, route, adapter, plain)
        self.hits += 1
        self._entries.move_to_end(key)
        self._unused.discard(key)
        return _run(entry, bias, inner, x, route.groups)

    # ------------------------------------------------------------------ making entries

    def _miss(
        self, key: tuple, i: int, module: nn.Module, inner, x: Tensor, route: Route, adapter: Adapter, plain: bool
    ) -> Tensor | None:
        """:meth:`forward` without a fresh entry: make one if this call can use any, and run it."""
        index = route.index
        if (
            route.dest is not None
            or route.base_rows is not None
            or adapter.bias is not None
            or not route.n
            or x.dim() < 2
            or x.shape[0] != route.n
            or not isinstance(module, nn.Linear)
            or x.shape[-1] != module.in_features  # (the uncached path names the mismatch in its error)
            or torch.compiler.is_compiling()
            or self._budget <= 0
        ):
            return None
        down, up = adapter.down, adapter.up
        dtype, device = x.dtype, x.device
        own = _own_weights(module._parameters)
        if own is None:  # a computed weight: the uncached path, through the layer's own forward
            return None
        weight, bias = own
        if (
            down.dtype != dtype
            or up.dtype != dtype
            or weight.dtype != dtype
            or down.is_inference()
            or up.is_inference()
            or torch.is_autocast_enabled(device.type)
        ):
            return None
        k = route.groups
        gather = index if isinstance(index, Tensor) else None  # the groups' ids, when gathered
        tensor_index = gather is not None
        if (index is None and k != down.shape[0]) or (gather is not None and gather.device != device):
            return None
        t = x.numel() // (k * x.shape[-1])  # rows (tokens) per group
        form_key = (k, t, down.shape, up.shape[-1], dtype, device, plain, tensor_index)
        form = self._forms.get(form_key, "")
        if form == "":
            form = self._forms[form_key] = self._form(k, t, down, up, x, plain, tensor_index)
            if len(self._forms) > _MAX_ENTRIES:
                self._forms.clear()
        if form is None:
            if len(self._skip) > _MAX_ENTRIES:
                self._skip.clear()
            self._skip[key] = (down.shape, dtype)
            return None
        stamp = _stamp(down, up, weight, bias, dtype)
        # (an entry of gathered work goes when its route's index tensor does: a route block's, or a plan the
        # planner's cache let go)
        dead = None if gather is None else weakref.ref(gather, partial(_drop_dead, self._self, key))
        refs = (weakref.ref(down), weakref.ref(up), weakref.ref(weight), _ref(bias), dead)
        if gather is not None and form == "factors":
            first, second = down.index_select(0, gather), up.index_select(0, gather)
            nbytes = (first.numel() + second.numel()) * first.element_size()
        else:
            stack, stack_bytes = self._stack(i, plain, down, up, weight, bias, stamp)
            second, nbytes = None, stack_bytes
            if stack is None:  # every delta is zero (init_scale=0, before any change): the layer's own forward
                first, nbytes, form = None, 0, "zero"
            elif index is None:
                first = stack  # (counts the stack again: an upper bound)
            elif gather is not None:
                first = stack.index_select(0, gather)
                nbytes = first.numel() * first.element_size()
            else:
                first = stack[index]  # (a slice: a view, counted as the whole stack)
        entry = _Entry(form, plain, first, second, refs, stamp, nbytes)
        self._store(key, entry)
        return _run(entry, bias, inner, x, k)

    def _form(self, k: int, t: int, down: Tensor, up: Tensor, x: Tensor, plain: bool, tensor_index: bool) -> str | None:
        """The prepared form of a layout: a merged form of :func:`~populora.routing.cost.choose_form`,
        ``factors`` (gathered factors) or ``None`` (nothing to keep: the uncached path)."""
        p, r, d = down.shape
        e = up.shape[-1]
        size = down.element_size()
        chosen = choose_form(k, t, d, e, r, x.dtype, x.device.type, plain)
        if chosen != "products":
            stack_bytes = p * d * e * size
            gathered = k * d * e * size if tensor_index else 0
            if stack_bytes + gathered <= self._budget:
                return chosen
        if tensor_index:
            per_group = r * (d + e) * size
            # the uncached path gathers in blocks beyond this bound; one block only, so that the kernels match
            whole = k * per_group <= gather_budget(x.device, (x.numel() + k * t * e) * size)
            if whole and k * per_group <= self._budget:
                return "factors"
        return None

    def _stack(
        self, i: int, plain: bool, down: Tensor, up: Tensor, weight: Tensor, bias: Tensor | None, stamp: tuple
    ) -> tuple[Tensor | None, int]:
        """Every individual's merged weight ``W^T + down_i^T up_i`` (``plain``: it replaces the layer's own
        product) or merged delta ``down_i^T up_i``, ``(P, d, e)``, kept; and its bytes. ``None`` when every
        ``up`` is zero (checked once per write: the layer's own forward is then exactly the routed one)."""
        key = (i, "stack", plain)
        entry = self._entries.get(key)
        if entry is not None and _fresh(entry, down, up, weight, bias, stamp[-1]):
            self._entries.move_to_end(key)
            self._unused.discard(key)
            return entry.first, entry.nbytes
        refs = (weakref.ref(down), weakref.ref(up), weakref.ref(weight), _ref(bias), None)
        if not up.any():
            self._store(key, _Entry("zero", plain, None, None, refs, stamp, 0))
            return None, 0
        dt = down.transpose(1, 2)  # (P, d, r)
        stack = torch.baddbmm(weight.t().unsqueeze(0), dt, up) if plain else torch.bmm(dt, up)  # (P, d, e)
        nbytes = stack.numel() * stack.element_size()
        self._store(key, _Entry("stack", plain, stack, None, refs, stamp, nbytes))
        return stack, nbytes

    def drop_route(self, key: tuple, ref: weakref.ref) -> None:
        """Drop the entry under ``key`` if it was made for the index tensor ``ref`` referred to (now freed): the
        callback of that tensor's weak reference."""
        entry = self._entries.get(key)
        if entry is not None and entry.refs[4] is ref:
            del self._entries[key]
            self._unused.discard(key)
            self.nbytes -= entry.nbytes

    def _store(self, key: tuple, entry: _Entry) -> None:
        """Keep ``entry`` under ``key`` within the budget (least recently used dropped first)."""
        old = self._entries.pop(key, None)
        if old is not None:
            self.nbytes -= old.nbytes
        if entry.nbytes > self._budget:
            return
        self._evict(entry.nbytes)
        if self.stopped:  # (this entry's making dropped one never used: no room for the model's work)
            return
        self._entries[key] = entry
        self._unused.add(key)
        self.nbytes += entry.nbytes
        self.builds += 1

    def _evict(self, room: int) -> None:
        """Drop the least recently used entries until ``room`` more bytes fit the budget (and one more entry)."""
        entries = self._entries
        while entries and (self.nbytes + room > self._budget or len(entries) >= _MAX_ENTRIES):
            key, dropped = entries.popitem(last=False)
            self.nbytes -= dropped.nbytes
            if key in self._unused:
                self._unused.discard(key)
                if room > 0:  # (lowering the budget stops nothing)
                    self.stopped = True


def _drop_dead(owner: weakref.ref, key: tuple, ref: weakref.ref) -> None:
    """The callback of an entry's index tensor: its entry goes with it (``owner``: the PreparedRoutes, weakly,
    so that a plan the planner caches does not keep a population's prepared work alive)."""
    routes = owner()
    if routes is not None:
        routes.drop_route(key, ref)


def _run(entry: _Entry, bias: Tensor | None, inner, x: Tensor, k: int) -> Tensor:
    """The target's output from a prepared entry: ``k`` groups of the rows of ``x (n, ..., d)``."""
    form, first = entry.form, entry.first
    if first is None:  # ("zero": every group's delta is zero)
        return inner(x)
    if form == "factors":  # the uncached path's kernels, without its gathers
        out = inner(x)
        if not out.is_contiguous():
            out = out.contiguous()
        add_product(out.view(k, -1, out.shape[-1]), down_product(first, x, k), entry.second)  # type: ignore[arg-type]
        return out
    d, e = first.shape[1], first.shape[2]
    if form != "merged" and entry.plain and x.dim() == 2 and x.shape[0] == k:  # one row per group (an env step)
        out = (x.unsqueeze(-1) * first).sum(1)  # (k, d, 1) * (k, d, e) -> (k, e): three tensor operations
        return out if bias is None else out.add_(bias)
    xs = x.reshape(k, -1, d)  # (k, t, d)
    if entry.plain:  # x @ W_g + b
        if form == "merged":
            out = torch.bmm(xs, first) if bias is None else torch.baddbmm(bias, xs, first)
        else:
            out = (xs.unsqueeze(-1) * first.unsqueeze(1)).sum(2)  # (k, t, d, 1) * (k, 1, d, e) -> (k, t, e)
            if bias is not None:
                out.add_(bias)
        return out.view(*x.shape[:-1], e)
    out = inner(x)  # x W^T + b, then + x @ dW_g
    if not out.is_contiguous():
        out = out.contiguous()
    view = out.view(k, -1, e)
    if form == "merged":
        view.baddbmm_(xs, first)
    else:
        view.add_((xs.unsqueeze(-1) * first.unsqueeze(1)).sum(2))
    return out
