"""Observations as gymnasium means them: ``gymnasium.spaces.flatten``, batched over slots, and Dict key selection.

An :class:`ObsLayout` turns the observations of a run of slots into what the
model gets, following the slot's observation space:

* ``flatten_obs=True``: one ``(k, D)`` float32 tensor whose row ``i`` holds
  the values of ``gymnasium.spaces.flatten(space, obs_i)``, so ``D`` is
  ``gymnasium.spaces.flatdim(space)``: a ``Box`` / ``MultiBinary`` is its
  values in C order, a ``Discrete(n, start)`` a one-hot of ``n``, a
  ``MultiDiscrete(nvec, start)`` the concatenated one-hots of its entries
  (``sum(nvec)``), a ``Tuple`` its parts in order and a ``Dict`` its entries
  in the space's key order (gymnasium sorts the keys of a plain dict), nested
  to any depth. Each leaf is converted with one vectorised torch op over the
  ``k`` rows (a one-hot is a ``scatter_``), never a Python loop per slot;
* ``flatten_obs=False``: the observations keep their structure, every leaf
  batched ``(k, ..)`` and float32 (booleans kept); a ``Discrete`` leaf stays
  its index.

A space with no numeric form (``Text``, ``Graph``, ``Sequence``, ``OneOf``,
MiniGrid's ``MissionSpace``, any custom space) raises when the slots are
built, naming where it sits in the observation and how to leave it out. For
Dict observations, ``obs_keys`` (the keys to keep) or ``drop_obs_keys`` (the
keys to drop) choose the entries that reach the model (:class:`KeySelection`;
the kept entries stay in the space's order, as after
``gymnasium.wrappers.FilterObservation``).

An env without a gymnasium observation space (dm_control, whose
observations are an ``OrderedDict`` of arrays) keeps the order its
observations list their entries in, every leaf flattened in C order.

Third-party imports (gymnasium, env-ssl-wrapper) sit in the functions that use them: ``import
populora`` needs neither.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor
from torch.utils._pytree import tree_flatten, tree_map

from populora.errors import InvalidTypeError, InvalidValueError

__all__ = ["KeySelection", "ObsLayout", "check_obs_keys", "gymnasium_space"]


# ---------------------------------------------------------------------- key selection


def _key_list(name: str, keys: Any) -> tuple[str, ...] | None:
    if keys is None:
        return None
    if isinstance(keys, (str, bytes, Mapping)) or not isinstance(keys, Iterable):
        raise InvalidTypeError(f"`{name}` must be a list of Dict observation keys, e.g. {name}=['image'], got {keys!r}")
    out = tuple(keys)
    for key in out:
        if not isinstance(key, str):
            raise InvalidTypeError(f"`{name}` holds {key!r} ({type(key).__name__}); Dict observation keys are strings")
    if not out:
        raise InvalidValueError(
            f"`{name}` is empty; pass the keys to {'keep' if name == 'obs_keys' else 'drop'}, or leave it None"
        )
    doubles = sorted({key for key in out if out.count(key) > 1})
    if doubles:
        raise InvalidValueError(f"`{name}` names {doubles} more than once")
    return out


class KeySelection:
    """Which entries of Dict observations reach the model.

    Args:
        keep: the keys to keep (``obs_keys``), or ``None``.
        drop: the keys to drop (``drop_obs_keys``), or ``None``.

    At most one of the two is given (see :func:`check_obs_keys`). The kept
    entries stay in the order of the observation space (or, without one, of
    the observation itself), whatever order ``keep`` lists them in.
    """

    def __init__(self, keep: tuple[str, ...] | None = None, drop: tuple[str, ...] | None = None):
        self.keep = keep
        self.drop = drop

    @property
    def active(self) -> bool:
        """Whether any key is chosen."""
        return self.keep is not None or self.drop is not None

    def describe(self) -> str:
        """``obs_keys=[...]`` / ``drop_obs_keys=[...]``, for messages."""
        return f"obs_keys={list(self.keep)}" if self.keep is not None else f"drop_obs_keys={list(self.drop or ())}"

    def kept(self, available: Sequence[str], where: str) -> list[str]:
        """The keys of ``available`` that stay, in ``available``'s order.

        Raises:
            InvalidValueError: a named key is not in ``available`` (all of
                them listed), or nothing would stay.
        """
        named = self.keep if self.keep is not None else self.drop or ()
        unknown = [key for key in named if key not in available]
        if unknown:
            raise InvalidValueError(
                f"{self.describe()} names {unknown}, which the observations of {where} do not "
                f"have; their keys are {list(available)}"
            )
        if self.keep is not None:
            out = [key for key in available if key in self.keep]
        else:
            out = [key for key in available if key not in named]
        if not out:
            raise InvalidValueError(
                f"{self.describe()} leaves no entry of the observations of {where} (keys {list(available)})"
            )
        return out


def check_obs_keys(obs_keys: Sequence[str] | None, drop_obs_keys: Sequence[str] | None) -> KeySelection:
    """Validate ``obs_keys`` / ``drop_obs_keys`` (before any env is made).

    Raises:
        InvalidTypeError: not a list of strings (a bare string included).
        InvalidValueError: both given, an empty list or a key named twice.
    """
    keep, drop = _key_list("obs_keys", obs_keys), _key_list("drop_obs_keys", drop_obs_keys)
    if keep is not None and drop is not None:
        raise InvalidValueError(
            f"pass either `obs_keys` (the Dict observation keys to keep, got {list(keep)}) or "
            f"`drop_obs_keys` (the keys to drop, got {list(drop)}), not both"
        )
    return KeySelection(keep, drop)


# ---------------------------------------------------------------------- the observation space


def gymnasium_space(space: Any) -> Any:
    """``space`` if it is a gymnasium space, else ``None`` (no space, or a stand-in such as env-ssl-wrapper's)."""
    if space is None:
        return None
    try:
        from gymnasium.spaces import Space
    except ImportError:  # pragma: no cover - gymnasium is a dependency
        return None
    return space if isinstance(space, Space) else None


def _where(path: tuple[Any, ...]) -> str:
    """``obs['a'][0]`` for the path ``('a', 0)``; ``the observation`` for ``()``."""
    return "obs" + "".join(f"[{key!r}]" for key in path) if path else "the observation"


def _space_text(space: Any) -> str:
    text = repr(space)
    return text if len(text) <= 100 else text[:97] + "..."


class _Leaf:
    """One numeric part of a flattened observation: where it sits and how it becomes ``width`` columns."""

    __slots__ = ("count", "kind", "mstart", "n", "name", "nvec", "offsets", "path", "space", "start", "width")

    def __init__(self, path: tuple[Any, ...], space: Any):
        from gymnasium.spaces import Box, Discrete, MultiBinary, MultiDiscrete

        self.path, self.name, self.space = path, _where(path), space
        if isinstance(space, (Box, MultiBinary)):
            self.kind, self.width = "values", int(np.prod(space.shape, dtype=np.int64))
        elif isinstance(space, Discrete):
            self.kind, self.n, self.width = "onehot", int(space.n), int(space.n)
            self.start = int(space.start)
        elif isinstance(space, MultiDiscrete):
            nvec = np.asarray(space.nvec, dtype=np.int64).reshape(-1)
            self.kind, self.count, self.width = "onehots", int(nvec.size), int(nvec.sum())
            self.nvec = torch.from_numpy(nvec)
            self.offsets = torch.from_numpy(np.concatenate([[0], np.cumsum(nvec)[:-1]]).astype(np.int64))
            start = np.asarray(space.start, dtype=np.int64).reshape(-1)
            self.mstart = torch.from_numpy(start) if start.any() else None
        else:  # pragma: no cover - _plan only makes leaves of the four kinds
            raise InvalidTypeError(f"no flat form for {space!r}")

    def encode(self, leaf: Any, rows: int) -> Tensor:
        """The ``(rows, width)`` float32 columns of a batched leaf (array or tensor, ``rows`` first)."""
        t = _tensor(leaf, self.name)
        if self.kind == "values":
            if t.numel() != rows * self.width:
                raise InvalidValueError(
                    f"{self.name} has shape {tuple(t.shape)} for {rows} slot(s); its space {_space_text(self.space)} "
                    f"holds {self.width} number(s) per slot"
                )
            t = t.reshape(rows, self.width)
            return t if t.dtype == torch.float32 else t.to(torch.float32)
        if self.kind == "onehot":
            if t.numel() != rows:
                raise InvalidValueError(
                    f"{self.name} has shape {tuple(t.shape)} for {rows} slot(s); its space "
                    f"{_space_text(self.space)} holds one integer per slot"
                )
            index = t.reshape(rows, 1).long()
            if self.start:
                index = index - self.start
            out = torch.zeros(rows, self.n)
            try:
                return out.scatter_(1, index, 1.0)
            except RuntimeError:
                raise InvalidValueError(
                    f"{self.name} holds values {t.reshape(-1).tolist()[:8]} outside its space "
                    f"{_space_text(self.space)} (valid: {self.start} to {self.start + self.n - 1})"
                ) from None
        if t.numel() != rows * self.count:
            raise InvalidValueError(
                f"{self.name} has shape {tuple(t.shape)} for {rows} slot(s); its space "
                f"{_space_text(self.space)} holds {self.count} integer(s) per slot"
            )
        local = t.reshape(rows, self.count).long()
        if self.mstart is not None:
            local = local - self.mstart
        if bool(((local < 0) | (local >= self.nvec)).any()):
            raise InvalidValueError(f"{self.name} holds values outside its space {_space_text(self.space)}")
        return torch.zeros(rows, self.width).scatter_(1, local + self.offsets, 1.0)


def _tensor(leaf: Any, name: str) -> Tensor:
    """A batched leaf as a tensor (sharing memory with a writable numpy array)."""
    if isinstance(leaf, Tensor):
        return leaf
    array = np.asarray(leaf)
    if array.dtype.kind not in "biuf":
        raise InvalidValueError(f"{name} holds {array.dtype} values, not numbers (first: {array.reshape(-1)[:1]!r})")
    if not array.flags.writeable:
        array = array.copy()
    return torch.from_numpy(array)


def _no_numeric_form(
    path: tuple[Any, ...], space: Any, flatten: bool, where: str, root_keys: Sequence[str] | None
) -> InvalidValueError:
    """The error for a part of the observation space with no numeric form, and how to leave it out."""
    from gymnasium.spaces import Text

    kind = type(space).__name__
    if flatten:
        why = (
            "gymnasium.spaces.flatten would give the indices of its characters, which are no features for a model"
            if isinstance(space, Text)
            else f"gymnasium.spaces.flatten has no numbers for a {kind}"
        )
    else:
        why = f"a {kind} has no tensor form"
    if path and isinstance(path[0], str) and root_keys is not None:
        others = [key for key in root_keys if key != path[0]]
        fix = (
            f"drop it with `drop_obs_keys=[{path[0]!r}]`"
            if len(path) == 1
            else f"drop the entry holding it with `drop_obs_keys=[{path[0]!r}]`"
        )
        if others:
            fix += f" (or keep the others with `obs_keys={others}`)"
    else:
        fix = "wrap the env to observe numbers (e.g. a gymnasium ObservationWrapper)"
    if flatten:
        fix += ", or pass `flatten_obs=False` and a model that takes the raw observation"
    return InvalidValueError(f"{_where(path)} of {where} is {_space_text(space)}: {why}; {fix}")


def _plan(
    space: Any,
    path: tuple[Any, ...],
    flatten: bool,
    where: str,
    out: list[_Leaf],
    root_keys: Sequence[str] | None = None,
) -> None:
    """The numeric leaves of ``space`` in gymnasium's flatten order (raising for a part with no numeric form).

    ``root_keys``: the keys of a Dict observation space, for the advice of the error.
    """
    from gymnasium.spaces import Box, Dict, Discrete, MultiBinary, MultiDiscrete, Tuple

    if isinstance(space, (Box, Discrete, MultiDiscrete, MultiBinary)):
        out.append(_Leaf(path, space))
    elif isinstance(space, Tuple):
        for i, sub in enumerate(space.spaces):
            _plan(sub, (*path, i), flatten, where, out, root_keys)
    elif isinstance(space, Dict):
        root_keys = list(space.spaces) if not path else root_keys
        for key, sub in space.spaces.items():
            _plan(sub, (*path, key), flatten, where, out, root_keys)
    else:
        raise _no_numeric_form(path, space, flatten, where, root_keys)


def _get(obs: Any, path: tuple[Any, ...]) -> Any:
    for depth, key in enumerate(path):
        try:
            obs = obs[key]
        except (KeyError, IndexError, TypeError):
            held = list(obs.keys()) if isinstance(obs, Mapping) else type(obs).__name__
            raise InvalidValueError(
                f"the observation has no {_where(path[: depth + 1])} (at {_where(path[:depth])}: "
                f"{held}), which its observation space declares"
            ) from None
    return obs


# ---------------------------------------------------------------------- the layout


class ObsLayout:
    """How the observations of one source's slots become the model's input.

    Args:
        space: the observation space of one slot (a gymnasium space; anything
            else, ``None`` included, means no space: dm_control).
        flatten: one ``(k, D)`` float32 tensor (gymnasium's ``flatten``);
            otherwise the structure is kept.
        keys: the Dict entries that stay.
        where: the env, for messages.
        spec_keys: the Dict keys of an env without a gymnasium space, when it
            tells them (dm_control's ``observation_spec()``): checked now
            rather than at the first observation.

    Attributes:
        space: the observation space after the key selection (``None``: no space).
        width: ``gymnasium.spaces.flatdim(space)`` when flattening a space, else ``None``.
        kept: the Dict keys that stay (``None``: no selection).

    Raises:
        InvalidValueError: a part of the space with no numeric form, or a key
            selection that does not fit the space (an unknown key, every key
            dropped, a space that is not a Dict).
    """

    def __init__(
        self, space: Any, flatten: bool, keys: KeySelection, where: str, spec_keys: Sequence[str] | None = None
    ):
        self.flatten = flatten
        self.where = where
        self.keys = keys
        self.kept: list[str] | None = None
        space = gymnasium_space(space)
        if keys.active:
            if space is not None:
                from gymnasium.spaces import Dict

                if not isinstance(space, Dict):
                    raise InvalidValueError(
                        f"{keys.describe()} selects entries of Dict observations; the observation "
                        f"space of {where} is {_space_text(space)}"
                    )
                self.kept = keys.kept(list(space.spaces), where)
                space = Dict(OrderedDict((key, space.spaces[key]) for key in self.kept))
            elif spec_keys is not None:
                self.kept = keys.kept(list(spec_keys), where)
        self.space = space
        self.leaves: list[_Leaf] = []
        if space is not None:
            _plan(space, (), flatten, where, self.leaves)  # raises for a part with no numeric form
        self.width = sum(leaf.width for leaf in self.leaves) if flatten and space is not None else None
        # a root Box / MultiBinary: the values themselves, the common and fast case
        self.plain = (
            space is not None
            and len(self.leaves) == 1
            and self.leaves[0].path == ()
            and self.leaves[0].kind == "values"
        )
        self._flat_values = self.plain and flatten  # from_batch's fast path

    # ------------------------------------------------------------------ key selection

    def select(self, obs: Any) -> Any:
        """``obs`` (one slot's or a batch) with only the kept Dict entries; as it is without a selection."""
        if not self.keys.active:
            return obs
        if not isinstance(obs, Mapping):
            raise InvalidValueError(
                f"{self.keys.describe()} selects entries of Dict observations; {self.where} "
                f"returned a {type(obs).__name__}"
            )
        if self.kept is None:  # no space told the keys: the first observation does
            self.kept = self.keys.kept(list(obs.keys()), self.where)
        try:
            return {key: obs[key] for key in self.kept}
        except KeyError:
            raise InvalidValueError(
                f"{self.where} returned an observation with keys {list(obs.keys())}; the slots keep {self.kept}"
            ) from None

    def wrapper(self) -> Callable[[Any], Any] | None:
        """An env-ssl-wrapper observation wrapper that selects the keys (for a vector env), or ``None``.

        It sits below the ``TensorWrapper``, so entries that are no numbers
        (MiniGrid's ``mission``) are gone before it converts observations,
        ``info['final_observation']`` included.
        """
        if not self.keys.active:
            return None
        from env_ssl_wrapper import TransformObservationWrapper

        layout = self

        class SelectObsKeys(TransformObservationWrapper):
            def transform_obs(self, obs: Any) -> Any:
                return layout.select(obs)

        return SelectObsKeys

    # ------------------------------------------------------------------ batching

    def from_batch(self, obs: Any, rows: int) -> Any:
        """A batched observation (array, tensor or pytree of them, ``rows`` first) as the model's input.

        Key selection already happened (see :meth:`wrapper`) or happens here.
        """
        if self._flat_values:
            t = obs if type(obs) is Tensor else _tensor(obs, "the observation")
            if t.shape == (rows, self.width):
                return t if t.dtype == torch.float32 else t.to(torch.float32)
            return self.leaves[0].encode(t, rows)
        obs = self.select(obs)
        if not self.flatten:
            return tree_map(lambda t: _as_float(t if isinstance(t, Tensor) else torch.as_tensor(np.asarray(t))), obs)
        if self.space is None:
            return _flatten_leaves(obs, rows)
        parts = [leaf.encode(_get(obs, leaf.path), rows) for leaf in self.leaves]
        return parts[0] if len(parts) == 1 else torch.cat(parts, dim=1)

    def from_rows(self, rows: list[Any]) -> Any:
        """The observations of single envs, one per slot, batched as the model's input."""
        k = len(rows)
        if self.keys.active:
            rows = [self.select(obs) for obs in rows]
        if not self.flatten:
            return tree_map(lambda *xs: _as_float(torch.as_tensor(np.stack([_leaf_array(x) for x in xs]))), *rows)
        if self.space is None:
            return _flatten_rows(rows)
        if self.plain:
            flat = [obs.reshape(-1) if type(obs) is np.ndarray else _leaf_array(obs).reshape(-1) for obs in rows]
            sizes = {a.size for a in flat}
            if len(sizes) > 1:
                raise InvalidValueError(
                    f"slots returned observations of different sizes {sorted(sizes)}; every slot "
                    "must run the same environment"
                )
            return self.leaves[0].encode(np.stack(flat), k)
        parts = [leaf.encode(np.stack([_leaf_array(_get(obs, leaf.path)) for obs in rows]), k) for leaf in self.leaves]
        return parts[0] if len(parts) == 1 else torch.cat(parts, dim=1)


# ---------------------------------------------------------------------- without a space


def _as_float(t: Tensor) -> Tensor:
    """float32 for every observation leaf but booleans, as env-ssl-wrapper's TensorWrapper does."""
    return t if t.dtype in (torch.float32, torch.bool) else t.to(torch.float32)


def _leaf_array(leaf: Any) -> np.ndarray:
    if isinstance(leaf, Tensor):
        return leaf.detach().cpu().numpy()
    return np.asarray(leaf)


def _flatten_leaves(obs: Any, rows: int) -> Tensor:
    """Every leaf of a batched observation without a space, in its own order, as one ``(rows, D)`` float32 tensor."""
    if isinstance(obs, Tensor) and obs.dim() == 2 and obs.dtype == torch.float32:
        return obs
    parts = []
    for leaf in tree_flatten(obs)[0]:
        t = leaf if isinstance(leaf, Tensor) else _tensor(leaf, "an observation leaf")
        if t.dim() == 0 or t.shape[0] != rows:
            raise InvalidValueError(
                f"observation leaf of shape {tuple(t.shape)} has no leading batch dim of {rows}; pass "
                "`flatten_obs=False` and a model that takes the raw observation"
            )
        parts.append(t.reshape(rows, -1).to(torch.float32))
    if not parts:
        raise InvalidTypeError(f"observation {obs!r:.80} holds no arrays to flatten")
    return parts[0] if len(parts) == 1 else torch.cat(parts, dim=1)


def _flatten_rows(rows: list[Any]) -> Tensor:
    """Single-env observations without a space flattened (every leaf, in its own order) and stacked to ``(n, D)``."""
    flat = []
    for obs in rows:
        if isinstance(obs, np.ndarray):
            flat.append(obs.reshape(-1))
            continue
        leaves = [_leaf_array(leaf).reshape(-1) for leaf in tree_flatten(obs)[0]]
        if not leaves:
            raise InvalidTypeError(f"observation {obs!r:.80} holds no arrays to flatten")
        flat.append(leaves[0] if len(leaves) == 1 else np.concatenate(leaves))
    sizes = {a.size for a in flat}
    if len(sizes) > 1:
        raise InvalidValueError(
            f"slots returned observations of different sizes {sorted(sizes)}; every slot must run the same environment"
        )
    stacked = np.stack(flat)
    if stacked.dtype.kind not in "biuf":
        raise InvalidValueError(
            f"observations hold {stacked.dtype} values, not numbers; give the env a gymnasium "
            "observation space, or pass `flatten_obs=False`"
        )
    return torch.from_numpy(stacked.astype(np.float32, copy=False))
