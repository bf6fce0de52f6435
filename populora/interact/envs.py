"""Environment slots: one env, a list, a vector env or a factory as ``N`` torch slots.

Every source is adapted by env-ssl-wrapper, whose per-simulator adapter
(``StandardizeWrapper``) turns gymnasium, dm_control (``TimeStep``, dict
observations), legacy gym and the other simulators it knows into
``(obs, reward, terminated, truncated, info)``. Vector envs also go through
its ``TensorWrapper`` (torch tensors, one call per timestep); single envs are
batched and converted here, once per timestep for all of them (the per-env
AutoBatched + Tensor layers cost several times a cheap env's step). This
module keeps one observation buffer over all slots and resets any chosen
slots with given seeds:

* a single env is one slot, reset with ``env_ssl_wrapper.reset_env`` (which
  seeds gymnasium's ``reset(seed=)`` or dm_control's task random state);
* a gymnasium ``SyncVectorEnv`` (not wrapped, its own ``step`` / ``reset``)
  is its list of sub-envs: only the slots that are playing are stepped, as
  its own loop would step them (``sub_env.step(action)``, observations
  batched with gymnasium's ``concatenate``, rewards through float32 like
  env-ssl-wrapper's TensorWrapper), and a slot is reset with
  ``sub_env.reset(seed=)``. A vector env steps every slot, so once the work
  queue runs dry most of its steps would go to idle slots; stepping the
  sub-envs also skips the vector env's autoreset and info bookkeeping, so
  it is not slower even when every slot is busy;
* a gymnasium ``AsyncVectorEnv`` (or a wrapped ``SyncVectorEnv``) steps
  every slot and resets several slots in one call through
  ``options['reset_mask']`` with one seed per slot;
* a vector env with ``reset_at`` / ``reset_one`` (env-ssl-wrapper's
  convention) resets one slot with a seed through
  ``env_ssl_wrapper.reset_env_at``;
* any other vector env (gymnasium's native ``CartPoleVectorEnv`` from
  ``gym.make_vec('CartPole-v1', num_envs=4)``, or any ``VectorEnv`` whose
  slots share one random generator) cannot reset one slot with a seed. It is
  **reset as a whole** instead, with one seed, at the start of every round
  of episodes (see :mod:`populora.interact.interactor` for the seeding
  scheme); every autoreset mode works: with ``NEXT_STEP`` and ``SAME_STEP``
  the env's own autoresets of slots whose episode ended are stepped through
  but never counted, and with ``DISABLED`` such slots are reset through
  ``options['reset_mask']`` without a seed (gymnasium 1.x's contract for
  that mode) before the next step.

Slots are assumed interchangeable (same environment and configuration): a
seeded episode must play the same in every slot.

The same env object listed several times (``[env for _ in range(16)]``) is
deep-copied (``copy.deepcopy``, which dm_control and gymnasium envs support)
so that every entry is its own slot, with one warning; an env that cannot
be copied stays one slot (with a warning).
"""

from __future__ import annotations

import copy
import warnings
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor
from torch.utils._pytree import tree_flatten, tree_map

from ..checks import check_int
from ..errors import InvalidTypeError, InvalidValueError, PopuloraError

__all__ = ["DEFAULT_NUM_ENVS", "EnvSlots", "EnvStepError", "build_slots", "is_factory"]

DEFAULT_NUM_ENVS = 16
"""Envs a factory makes when ``num_envs`` is not given to :func:`~populora.interact_with_env`."""


class EnvStepError(PopuloraError, RuntimeError):
    """An environment raised while being reset or stepped (the slot and individual are named)."""


class SlotFailure(Exception):
    """Internal: a source failed; carries the slots involved and the cause."""

    def __init__(self, slots: Sequence[int], what: str, cause: BaseException):
        super().__init__(what)
        self.slots = list(slots)
        self.what = what
        self.cause = cause


def is_factory(obj: Any) -> bool:
    """``obj`` makes envs (a gymnasium id string, an env class, a callable without ``reset`` / ``step``)."""
    if isinstance(obj, str) or isinstance(obj, type):
        return True
    return callable(obj) and not hasattr(obj, "reset") and not hasattr(obj, "step")


def _describe_env(env: Any) -> str:
    text = repr(env) if type(env).__repr__ is not object.__repr__ else type(env).__name__
    return text if len(text) <= 80 else text[:77] + "..."


def _masked_reset_capable(env: Any) -> bool:
    try:
        from gymnasium.vector import AsyncVectorEnv, SyncVectorEnv
    except ImportError:  # pragma: no cover - gymnasium is a dependency
        return False
    inner = getattr(env, "unwrapped", env)
    return isinstance(inner, (SyncVectorEnv, AsyncVectorEnv))


def _can_reset_one_slot(env: Any) -> bool:
    """Whether ``env_ssl_wrapper.reset_env_at`` can reset one slot of ``env`` with a seed.

    Mirrors its paths without calling them: a ``reset_at`` / ``reset_one``
    method, gymnasium's masked reset of a Sync / Async vector env, or a list
    of sub-envs, on ``env`` or any wrapper below it.
    """
    if _masked_reset_capable(env):
        return True
    seen, layer = set(), env
    while layer is not None and id(layer) not in seen:
        seen.add(id(layer))
        if type(layer).__name__ == "AsyncVectorEnv":
            return True
        for name in ("reset_at", "reset_one"):
            try:
                if callable(getattr(layer, name, None)):
                    return True
            except Exception:  # noqa: BLE001 - a property that raises: not a per-slot reset
                pass
        if isinstance(vars(layer).get("envs") if hasattr(layer, "__dict__") else None, (list, tuple)):
            return True
        layer = vars(layer).get("env") if hasattr(layer, "__dict__") else None
    return False


class _VectorSource:
    """A vector env covering slots ``[start, start + num)``, through env-ssl-wrapper's TensorWrapper."""

    vector = True
    subset = False

    def __init__(self, env: Any, start: int):
        from env_ssl_wrapper import compose_env, get_adapter
        from env_ssl_wrapper.standardize.helpers import env_autoresets, env_num_envs

        self.raw = env
        self.start = start
        self.num = int(env_num_envs(env))
        self.stop = start + self.num
        # a vector wrapper hides gymnasium's `autoreset_mode` attribute, not the metadata entry it sets
        mode = getattr(env, "metadata", None) or {}
        mode = mode.get("autoreset_mode") if isinstance(mode, dict) else None
        disabled = mode is not None and str(getattr(mode, "value", mode)).lower() == "disabled"
        self.autoresets = bool(env_autoresets(env)) and not disabled
        self.masked_reset = _masked_reset_capable(env)
        # no seeded reset of one slot: reset as a whole, once per round of episodes (see EnvSlots.reset)
        self.whole = not _can_reset_one_slot(env)
        self._last_obs: Any = None
        self.env = compose_env(env, ("tensor", dict(device="cpu")), pad_episodes=False)
        self.action_space = get_adapter(env).action_space
        # slots that ended while nobody used them: reset before the next step unless the env autoresets
        self.stale = np.zeros(self.num, dtype=bool)
        self.started = False

    def reset_all(self, seed: int) -> Any:
        """Reset every slot of a vector env that cannot reset one, with one ``seed``: ``(num, ..)`` observations.

        ``reset(seed=seed)``; an env whose ``reset`` takes no seed is seeded
        the way ``env_ssl_wrapper.reset_env`` can (``seed()``, or not at all).
        """
        try:
            obs, _ = self.env.reset(seed=int(seed))
        except TypeError:
            from env_ssl_wrapper import reset_env

            obs, _ = reset_env(self.env, int(seed))
        self.stale[:] = False
        self.started = True
        self._last_obs = obs
        return obs

    def _reset_ended(self, local: np.ndarray) -> None:
        """Reset ended slots ``local`` of a whole-reset env in ``DISABLED`` mode: masked, without a seed.

        The observations of the other slots must come back unchanged (an env
        that ignores the mask would restart the episodes being played).
        """
        mask = np.zeros(self.num, dtype=np.bool_)
        mask[local] = True
        try:
            obs, _ = self.env.reset(options={"reset_mask": mask})
        except TypeError as error:
            raise InvalidTypeError(
                f"the vector env {_describe_env(self.raw)} does not autoreset and cannot reset some of its slots "
                f"(reset(options={{'reset_mask': mask}}) raised {type(error).__name__}: {error}); gymnasium 1.x's "
                "AutoresetMode.DISABLED needs that reset, or pass a list of envs or a factory"
            ) from error
        if self._last_obs is not None:
            keep = torch.from_numpy(np.flatnonzero(~mask))
            before, after = tree_flatten(self._last_obs)[0], tree_flatten(obs)[0]
            same = len(before) == len(after) and all(
                not isinstance(a, Tensor) or (a.shape == b.shape and torch.equal(a.index_select(0, keep),
                                                                                 b.index_select(0, keep)))
                for a, b in zip(before, after))
            if not same:
                raise InvalidTypeError(
                    f"the vector env {_describe_env(self.raw)} changed slots outside options['reset_mask'] when "
                    "resetting its ended slots (it restarted episodes being played); gymnasium 1.x's "
                    "AutoresetMode.DISABLED needs a masked reset, or pass a list of envs or a factory"
                )
        self.stale[local] = False

    def reset(self, local: np.ndarray, seeds: Sequence[int | None]) -> Any:
        """Reset local slots ``local`` with ``seeds``; their observations, batched ``(len(local), ..)``."""
        from env_ssl_wrapper import reset_env_at

        if self.whole:  # pragma: no cover - EnvSlots resets such an env with reset_all
            raise InvalidTypeError(f"the vector env {_describe_env(self.raw)} cannot reset one slot with a seed")
        self.stale[local] = False
        seeds = [None if seed is None else int(seed) for seed in seeds]
        if self.masked_reset:  # gymnasium: every chosen slot in one call, one seed each
            mask = np.zeros(self.num, dtype=np.bool_)
            mask[local] = True
            seed_list: list[int | None] = [None] * self.num
            for slot, seed in zip(local.tolist(), seeds):
                seed_list[slot] = seed
            if self.started:
                obs, _ = self.env.reset(seed=seed_list, options={"reset_mask": mask})
            else:  # a masked reset needs every slot reset once before
                obs, _ = self.env.reset(seed=seed_list)
                self.started = True
            index = torch.from_numpy(np.asarray(local, dtype=np.int64))
            return tree_map(lambda t: t.index_select(0, index) if isinstance(t, Tensor) else t, obs)
        rows = []
        for slot, seed in zip(local.tolist(), seeds):
            out = reset_env_at(self.env, slot, seed=seed)
            if out is None:
                raise InvalidTypeError(
                    f"the vector env {_describe_env(self.raw)} cannot reset one slot with a seed (no "
                    "`reset_at` and no gymnasium `options['reset_mask']`), which common random numbers "
                    "need; pass a gymnasium SyncVectorEnv (gym.make_vec(..., vectorization_mode='sync')), "
                    "a list of envs or a factory instead"
                )
            rows.append(tree_map(lambda t: t.unsqueeze(0) if isinstance(t, Tensor) else t, out[0]))
        return tree_map(lambda *ts: torch.cat(ts, 0), *rows) if len(rows) > 1 else rows[0]

    def step(self, actions: Any) -> tuple[Any, np.ndarray, np.ndarray]:
        """Step all slots with ``(num, ..)`` actions: ``(obs, reward (num,) float64, done (num,) bool)``."""
        if not self.autoresets and self.stale.any():
            local = np.flatnonzero(self.stale)
            if self.whole:
                self._reset_ended(local)
            else:
                self.reset(local, [None] * local.size)  # observations unused: nobody acts in those slots
        obs, reward, terminated, truncated, _ = self.env.step(actions)
        if self.whole and not self.autoresets:
            self._last_obs = obs
        reward = torch.as_tensor(reward).reshape(-1).numpy().astype(np.float64)
        done = (torch.as_tensor(terminated) | torch.as_tensor(truncated)).reshape(-1).numpy()
        if reward.size != self.num or done.size != self.num:
            raise InvalidValueError(f"env {_describe_env(self.raw)} returned {reward.size} rewards and {done.size} "
                                    f"done flags for {self.num} slots")
        if not self.autoresets:
            self.stale |= done
        return obs, reward, done


def _plain_sync_vector_env(env: Any) -> bool:
    """A gymnasium ``SyncVectorEnv`` with its own ``step`` / ``reset`` (no vector wrapper, no override)."""
    try:
        from gymnasium.vector import SyncVectorEnv
    except ImportError:  # pragma: no cover - gymnasium is a dependency
        return False
    cls = type(env)
    return (isinstance(env, SyncVectorEnv) and cls.step is SyncVectorEnv.step and cls.reset is SyncVectorEnv.reset
            and isinstance(getattr(env, "envs", None), list))


class _SubEnvSource:
    """The sub-envs of a gymnasium ``SyncVectorEnv`` covering slots ``[start, start + num)``.

    Steps and resets any subset of them, the way ``SyncVectorEnv`` steps each
    one (``iterate`` over the actions, ``concatenate`` of the observations in
    its ``single_observation_space``), so a playing slot sees exactly what it
    would see through the vector env; idle slots are left alone.
    """

    vector = False
    subset = True

    def __init__(self, env: Any, start: int):
        from env_ssl_wrapper import get_adapter
        from gymnasium.spaces import Box, Discrete, MultiBinary, MultiDiscrete
        from gymnasium.vector.utils import concatenate, create_empty_array, iterate

        self.raw = env
        self.envs = list(env.envs)
        self.num = len(self.envs)
        self.start = start
        self.stop = start + self.num
        self.action_space = get_adapter(env).action_space
        self._step = [sub.step for sub in self.envs]
        obs_space, batch_actions = env.single_observation_space, env.action_space
        # gymnasium's own batching (concatenate / iterate); for these spaces it is np.stack into an array of
        # the space's shape and dtype (np.array makes the same array 3x faster), and the iteration over a
        # batch of actions is over its rows
        if type(obs_space) in (Box, Discrete, MultiDiscrete, MultiBinary):
            shape, dtype = tuple(obs_space.shape), obs_space.dtype

            def batch(rows: Sequence[Any]) -> np.ndarray:
                out = np.array(rows, dtype=dtype)
                if out.shape[1:] != shape:
                    raise InvalidValueError(f"sub-envs returned observations of shape {out.shape[1:]}; the observation "
                                     f"space {obs_space} has shape {shape}")
                return out

            self._batch = batch
        else:
            self._batch = lambda rows: concatenate(obs_space, rows, create_empty_array(obs_space, len(rows), fn=np.empty))
        if type(batch_actions) in (Box, MultiDiscrete, MultiBinary):
            self._rows = iter
        else:
            self._rows = lambda actions: iterate(batch_actions, actions)

    def reset(self, local: np.ndarray, seeds: Sequence[int | None]) -> Any:
        """Reset local slots ``local`` with ``seeds``; their observations, batched ``(len(local), ..)``."""
        rows = []
        for slot, seed in zip(local.tolist(), seeds):
            try:
                rows.append(self.envs[slot].reset(seed=None if seed is None else int(seed))[0])
            except Exception as error:
                raise SlotFailure([self.start + slot], "reset", error) from error
        return self._batch(rows)

    def step(self, local: np.ndarray, actions: Any) -> tuple[Any, np.ndarray, np.ndarray]:
        """Step local slots ``local`` with their ``(k, ..)`` actions: ``(obs, reward (k,) float64, done (k,) bool)``."""
        if isinstance(actions, Tensor):
            actions = actions.numpy()
        elif not isinstance(actions, np.ndarray):  # as env-ssl-wrapper's TensorWrapper hands them to the env
            from env_ssl_wrapper.standardize.tensor_wrapper import torch_to_numpy

            actions = torch_to_numpy(actions)
        index = local.tolist()
        step = self._step
        outs = []
        try:
            for slot, act in zip(index, self._rows(actions)):
                outs.append(step[slot](act))
        except Exception as error:
            raise SlotFailure([self.start + index[len(outs)]], "step", error) from error
        k = len(index)
        if len(outs) != k:
            raise InvalidValueError(f"{len(outs)} actions for {k} slots")
        obs, reward, terminated, truncated, _ = zip(*outs)
        # the vector env's float64 rewards, through float32 like TensorWrapper's
        reward = np.array(reward, dtype=np.float32).reshape(k).astype(np.float64)
        done = np.logical_or(terminated, truncated)
        return self._batch(obs), reward, done if done.shape == (k,) else done.reshape(k)


class _SingleSource:
    """One single env (one slot), through env-ssl-wrapper's StandardizeWrapper only.

    The adapter gives ``(obs, reward, terminated, truncated, info)`` for any
    simulator; batching and tensor conversion happen once per timestep over
    all single slots (env-ssl-wrapper's per-env AutoBatched + Tensor layers
    would cost several times the step of a cheap env).
    """

    vector = False
    subset = False
    num = 1

    def __init__(self, env: Any, start: int):
        from env_ssl_wrapper import compose_env, get_adapter

        self.raw = env
        self.start = start
        self.stop = start + 1
        adapter = get_adapter(env)
        self.torch_native = bool(getattr(adapter, "torch_native", False))
        self.env = compose_env(env, pad_episodes=False)
        self.action_space = adapter.action_space

    def reset(self, seed: int | None) -> Any:
        from env_ssl_wrapper import reset_env

        obs, _ = reset_env(self.env, None if seed is None else int(seed))
        return obs

    def step(self, action: Any) -> tuple[Any, float, bool]:
        if self.torch_native and isinstance(action, np.ndarray):
            action = torch.from_numpy(action)
        obs, reward, terminated, truncated, _ = self.env.step(action)
        # float32 like TensorWrapper's rewards, so a list and a vector env add up the same numbers;
        # dm_env's reward is None only at the FIRST step, which a step never returns
        reward = 0.0 if reward is None else float(np.float32(np.asarray(reward).reshape(())))
        return obs, reward, bool(np.asarray(terminated).any() or np.asarray(truncated).any())


def _as_float(t: Tensor) -> Tensor:
    """float32 for every observation leaf but booleans, as env-ssl-wrapper's TensorWrapper does."""
    return t if t.dtype in (torch.float32, torch.bool) else t.to(torch.float32)


def _leaf_array(leaf: Any) -> np.ndarray:
    if isinstance(leaf, Tensor):
        return leaf.detach().cpu().numpy()
    return np.asarray(leaf)


class EnvSlots:
    """``N`` environment slots over one or more sources, with one observation buffer.

    Args:
        sources: the sources, in slot order.
        flatten_obs: concatenate every observation leaf (dict / tuple
            observations) into one ``(N, D)`` float32 tensor; otherwise the
            observation keeps its structure, every leaf batched ``(N, ..)``
            and float32 (booleans kept).
        created: environments this object made (from a factory) and closes.
    """

    def __init__(self, sources: list[Any], *, flatten_obs: bool = True, created: Sequence[Any] = ()):
        self.sources = sources
        self.num = sum(s.num for s in sources)
        self.flatten_obs = flatten_obs
        self.created = list(created)
        self._buf: Any = None  # (N, D) tensor, or a pytree of (N, ..) tensors when not flattening
        # (slots, observations) of the last step, not yet written into the buffer: while the same slots
        # play on, `take` hands them back as they are (no copy into and out of the buffer)
        self._pending: tuple[np.ndarray, Any] | None = None
        self.source_of = np.concatenate([np.full(s.num, k, dtype=np.int64) for k, s in enumerate(sources)])
        self.action_space = sources[0].action_space
        self._one_vector = len(sources) == 1 and sources[0].vector
        self._one_subset = len(sources) == 1 and sources[0].subset
        self._all_single = all(not (s.vector or s.subset) for s in sources)
        # sources reset as a whole (no seeded per-slot reset): the interactor then plays rounds of episodes
        self.whole_sources = [k for k, s in enumerate(sources) if getattr(s, "whole", False)]
        self.round_based = bool(self.whole_sources)

    def describe(self, slot: int) -> str:
        """The env behind ``slot``, for messages (its repr, cut to 80 characters)."""
        return _describe_env(self.sources[int(self.source_of[int(slot)])].raw)

    # ------------------------------------------------------------------ observations

    @property
    def obs(self) -> Any:
        """Observations of every slot, ``(N, D)`` (or a pytree of ``(N, ..)``); rows of idle slots are stale."""
        self._flush()
        return self._buf

    def _flush(self) -> None:
        if self._pending is not None:
            slots, obs = self._pending
            self._pending = None
            self._write(slots, obs)

    def _batched(self, obs: Any, rows: int) -> Any:
        """A batched observation pytree of torch tensors, flattened to ``(rows, D)`` if asked."""
        if self.flatten_obs and isinstance(obs, np.ndarray) and obs.ndim and obs.shape[0] == rows \
                and obs.dtype.kind in "fiub":  # a sub-env batch (fresh, writable): no copy for float32
            t = torch.from_numpy(obs)
            t = t if t.dim() == 2 else t.reshape(rows, -1)
            return t if t.dtype == torch.float32 else t.to(torch.float32)
        if not self.flatten_obs:
            return tree_map(lambda t: _as_float(t if isinstance(t, Tensor) else torch.as_tensor(np.asarray(t))), obs)
        if isinstance(obs, Tensor) and obs.dim() == 2 and obs.dtype == torch.float32:
            return obs
        parts = []
        for leaf in tree_flatten(obs)[0]:
            t = leaf if isinstance(leaf, Tensor) else torch.as_tensor(np.asarray(leaf))
            if t.dim() == 0 or t.shape[0] != rows:
                raise InvalidValueError(
                    f"observation leaf of shape {tuple(t.shape)} has no leading batch dim of {rows}; pass "
                    "`flatten_obs=False` and a model that takes the raw observation"
                )
            parts.append(t.reshape(rows, -1).to(torch.float32))
        if not parts:
            raise InvalidTypeError(f"observation {obs!r:.80} holds no arrays to flatten")
        return parts[0] if len(parts) == 1 else torch.cat(parts, dim=1)

    def _stacked(self, rows: list[Any]) -> Any:
        """Single-env observations stacked into a batch (flattened to ``(n, D)`` if asked)."""
        if not self.flatten_obs:
            return tree_map(lambda *xs: _as_float(torch.as_tensor(np.stack([_leaf_array(x) for x in xs]))), *rows)
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
            raise InvalidValueError(f"slots returned observations of different sizes {sorted(sizes)}; every slot must run "
                             "the same environment")
        return torch.from_numpy(np.stack(flat).astype(np.float32, copy=False))

    def _write(self, slots: np.ndarray, rows: Any) -> None:
        if self._buf is None:
            self._buf = tree_map(lambda t: t.new_zeros((self.num, *t.shape[1:])), rows)
        index = torch.from_numpy(np.asarray(slots, dtype=np.int64))
        buf = self._buf
        if isinstance(buf, Tensor) and isinstance(rows, Tensor) and buf.shape[1:] == rows.shape[1:]:
            buf.index_copy_(0, index, rows if rows.dtype == buf.dtype else rows.to(buf.dtype))
            return

        def put(buf: Tensor, new: Tensor) -> Tensor:
            if buf.shape[1:] != new.shape[1:]:
                raise InvalidValueError(
                    f"slot(s) {slots.tolist()} returned observations of shape {tuple(new.shape[1:])}, other "
                    f"slots {tuple(buf.shape[1:])}; every slot must run the same environment"
                )
            return buf.index_copy_(0, index, new.to(buf.dtype))

        self._buf = tree_map(put, self._buf, rows)

    def take(self, slots: np.ndarray) -> Any:
        """Observations of ``slots``, in that order.

        Without a copy when ``slots`` is the very array the last :meth:`step`
        got (the same slots play on), or every slot in order.
        """
        pending = self._pending
        if pending is not None and pending[0] is slots:
            return pending[1]
        self._flush()
        if _every_slot_in_order(slots, self.num):
            return self._buf
        index = torch.from_numpy(slots)
        if isinstance(self._buf, Tensor):
            return self._buf.index_select(0, index)
        return tree_map(lambda t: t.index_select(0, index), self._buf)

    # ------------------------------------------------------------------ reset / step

    def reset(self, slots: np.ndarray, seeds: Sequence[int | None],
              whole_seeds: Sequence[int] | None = None) -> None:
        """Reset ``slots`` with ``seeds`` and store their first observations.

        With :attr:`round_based` sources, ``whole_seeds`` (one per entry of
        :attr:`whole_sources`) resets each of them as a whole, every slot of
        it, whichever of its slots are in ``slots``; the other slots get
        their ``seeds`` as usual.

        Raises:
            SlotFailure: a source raised (the caller names the individuals).
            TypeError: a vector env that cannot reset one slot with a seed.
        """
        self._flush()
        slots = np.asarray(slots, dtype=np.int64)
        seeds = list(seeds)
        if self.round_based:
            if whole_seeds is None or len(whole_seeds) != len(self.whole_sources):
                raise InvalidValueError(f"{len(self.whole_sources)} vector env(s) reset as a whole need as many "
                                        f"`whole_seeds`, got {whole_seeds!r}")
            for k, seed in zip(self.whole_sources, whole_seeds):
                src = self.sources[k]
                every = np.arange(src.start, src.stop, dtype=np.int64)
                try:
                    obs = src.reset_all(seed)
                except Exception as error:
                    raise SlotFailure(every.tolist(), "reset", error) from error
                self._write(every, self._batched(obs, src.num))
            keep = ~np.isin(self.source_of[slots], self.whole_sources)
            slots = slots[keep]
            seeds = [seed for seed, kept in zip(seeds, keep.tolist()) if kept]
            if slots.size == 0:
                return
        if self._one_subset:  # SlotFailure names the slot that failed
            self._write(slots, self._batched(self.sources[0].reset(slots, seeds), slots.size))
            return
        groups = self.source_of[slots]
        singles, single_rows = [], []
        for k in np.unique(groups).tolist():
            src = self.sources[k]
            pick = np.flatnonzero(groups == k)
            try:
                if src.vector or src.subset:
                    rows = src.reset(slots[pick] - src.start, [seeds[j] for j in pick.tolist()])
                else:
                    single_rows.append(src.reset(seeds[int(pick[0])]))
                    singles.append(int(slots[pick[0]]))
                    continue
            except SlotFailure:
                raise
            except TypeError as error:
                if "cannot reset one slot" in str(error):
                    raise
                raise SlotFailure(slots[pick].tolist(), "reset", error) from error
            except Exception as error:
                raise SlotFailure(slots[pick].tolist(), "reset", error) from error
            self._write(slots[pick], self._batched(rows, pick.size))
        if singles:
            self._write(np.asarray(singles, dtype=np.int64), self._stacked(single_rows))

    def step(self, actions: Any, slots: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Step the sources of ``slots`` with their ``(k, ..)`` actions.

        Vector sources step all their slots; slots nobody uses get a copy of
        the first action (their rewards are never read). Single envs and the
        sub-envs of a ``SyncVectorEnv`` step only when their slot is in ``slots``.

        Returns:
            ``(reward (k,) float64, done (k,) bool)`` for ``slots``, in order.

        Raises:
            SlotFailure: a source raised.
        """
        k = slots.size
        if self._one_subset:  # the common case: one SyncVectorEnv, only the playing slots step
            try:
                obs, reward, done = self.sources[0].step(slots, actions)
                obs = self._batched(obs, k)
            except SlotFailure:
                raise
            except Exception as error:
                raise SlotFailure(slots.tolist(), "step", error) from error
            if self._pending is not None and self._pending[0] is not slots:
                self._flush()  # else the same slots stepped again: their new observations replace the pending ones
            self._pending = (slots, obs)
            return reward, done
        self._flush()
        if self._one_vector:
            src = self.sources[0]
            every = _every_slot_in_order(slots, src.num)
            full = actions if every else _fill(actions, slots, src.num)
            try:
                obs, reward, done = src.step(full)
                self._buf = self._batched(obs, src.num)
            except Exception as error:
                raise SlotFailure(slots.tolist(), "step", error) from error
            return (reward, done) if every else (reward[slots], done[slots])

        rewards = np.empty(k, dtype=np.float64)
        dones = np.empty(k, dtype=bool)
        if self._all_single:
            picks = range(k)
            groups = None
        else:
            groups = self.source_of[slots]
            picks = [j for j in range(k) if not (self.sources[groups[j]].vector or self.sources[groups[j]].subset)]
            for k_src in np.unique(groups).tolist():
                src = self.sources[k_src]
                if not (src.vector or src.subset):
                    continue
                pick = np.flatnonzero(groups == k_src)
                local = slots[pick] - src.start
                act = _take_rows(actions, pick)
                try:
                    if src.subset:
                        obs, reward, done = src.step(local, act)
                        written = slots[pick]
                        rewards[pick], dones[pick] = reward, done
                    else:
                        obs, reward, done = src.step(act if _every_slot_in_order(local, src.num)
                                                     else _fill(act, local, src.num))
                        written = np.arange(src.start, src.stop, dtype=np.int64)
                        rewards[pick], dones[pick] = reward[local], done[local]
                    obs = self._batched(obs, written.size)
                except SlotFailure:
                    raise
                except Exception as error:
                    raise SlotFailure(slots[pick].tolist(), "step", error) from error
                self._write(written, obs)
        if picks:
            rows, stepped = [], []
            act_np = actions.numpy() if isinstance(actions, Tensor) else None
            for j in picks:
                slot = int(slots[j])
                src = self.sources[self.source_of[slot]]
                if act_np is not None:
                    act = act_np[j]
                    act = act.item() if act.ndim == 0 else act.copy()
                else:
                    act = tree_map(lambda t, j=j: t[j], actions)
                try:
                    obs, rewards[j], dones[j] = src.step(act)
                except Exception as error:
                    raise SlotFailure([slot], "step", error) from error
                rows.append(obs)
                stepped.append(slot)
            self._write(np.asarray(stepped, dtype=np.int64), self._stacked(rows))
        return rewards, dones

    def close(self) -> None:
        """Close the environments this object created from a factory."""
        for env in self.created:
            try:
                env.close()
            except Exception:  # noqa: BLE001 - closing is best effort
                pass
        self.created = []


def _every_slot_in_order(slots: np.ndarray, num: int) -> bool:
    """``slots`` is ``0, 1, .., num - 1`` (distinct slots of ``[0, num)``, increasing)."""
    return slots.size == num and bool((slots[1:] > slots[:-1]).all())


def _take_rows(actions: Any, pick: np.ndarray) -> Any:
    index = torch.from_numpy(pick)
    return tree_map(lambda t: t.index_select(0, index) if isinstance(t, Tensor) else t[pick], actions)


def _fill(actions: Any, slots: np.ndarray, num: int) -> Any:
    """``(num, ..)`` actions: ``actions`` at ``slots``, a copy of the first action elsewhere."""
    index = torch.from_numpy(slots)

    def fill(t: Tensor) -> Tensor:
        full = t[:1].expand(num, *t.shape[1:]).clone()
        return full.index_copy_(0, index, t)

    return tree_map(fill, actions)


def build_slots(envs: Any, *, num_envs: int | None = None, flatten_obs: bool = True) -> EnvSlots:
    """Adapt ``envs`` into :class:`EnvSlots`.

    Args:
        envs: one env, a list / tuple of envs, a vector env, or a factory (a
            callable returning one env, an env class, or a gymnasium id
            string, which becomes a ``SyncVectorEnv`` of ``num_envs`` envs).
            The same object listed several times is deep-copied so that every
            entry is its own slot (one warning); an object that cannot be
            copied is one slot (with a warning).
        num_envs: number of envs a factory makes (default
            :data:`DEFAULT_NUM_ENVS`, 16; refused for anything but a factory).
        flatten_obs: concatenate dict / tuple observations into one vector.

    Raises:
        InvalidValueError: an empty list, ``num_envs < 1`` or ``num_envs``
            with something that is not a factory.
        InvalidTypeError: a list entry that is a factory rather than an env,
            a ``num_envs`` that is not an int.
    """
    created: list[Any] = []
    if isinstance(envs, (list, tuple)):
        if len(envs) == 0:
            raise InvalidValueError("`envs` is an empty list; pass at least one environment, a vector env or a factory")
        if num_envs is not None:
            raise InvalidValueError(f"`num_envs={num_envs}` only applies to a factory; `envs` is a list of "
                                    f"{len(envs)} envs")
        for i, env in enumerate(envs):
            if env is None or is_factory(env):
                raise InvalidTypeError(
                    f"`envs[{i}]` is {type(env).__name__}, not an environment; pass env objects in the list, "
                    "or the factory itself (with `num_envs=`)"
                )
        raw, created = _distinct(list(envs), "`envs`")
    elif is_factory(envs):
        num_envs = DEFAULT_NUM_ENVS if num_envs is None else check_int("num_envs", num_envs, low=1)
        if isinstance(envs, str):
            import gymnasium as gym

            raw = [gym.make_vec(envs, num_envs=num_envs, vectorization_mode="sync")]
            created = list(raw)
        else:
            made = [envs() for _ in range(num_envs)]
            raw, copies = _distinct(made, "the factory's products")
            created = [*{id(e): e for e in made}.values(), *copies]
    elif envs is None:
        raise InvalidValueError("`envs` is None; pass an environment, a list of them, a vector env or a factory")
    else:
        if num_envs is not None:
            raise InvalidValueError(f"`num_envs={num_envs}` only applies to a factory; `envs` is one env")
        raw = [envs]

    from env_ssl_wrapper.standardize.helpers import is_vectorized

    sources, start = [], 0
    try:
        for env in raw:
            if _plain_sync_vector_env(env):
                src: Any = _SubEnvSource(env, start)
            elif is_vectorized(env):
                src = _VectorSource(env, start)
            else:
                src = _SingleSource(env, start)
            sources.append(src)
            start += src.num
    except BaseException:
        _close_all(created)
        raise
    return EnvSlots(sources, flatten_obs=flatten_obs, created=created)


def _close_all(envs: Sequence[Any]) -> None:
    for env in envs:
        try:
            env.close()
        except Exception:  # noqa: BLE001 - closing is best effort
            pass


def _caller_stacklevel() -> int:
    """``warnings.warn``'s stacklevel of the first frame outside populora (the user's call)."""
    import sys

    frame, level = sys._getframe(1), 1
    while frame is not None and frame.f_globals.get("__name__", "").startswith("populora."):
        frame, level = frame.f_back, level + 1
    return level


def _distinct(envs: list[Any], what: str) -> tuple[list[Any], list[Any]]:
    """``envs`` with every repeat of an object replaced by a deep copy of it, and the copies made.

    One warning names the repeated objects: those copied, and those that
    could not be copied (they stay one slot, their repeats dropped).
    """
    count: dict[int, int] = {}
    for env in envs:
        count[id(env)] = count.get(id(env), 0) + 1
    if all(c == 1 for c in count.values()):
        return envs, []
    seen: set[int] = set()
    failed: dict[int, str] = {}
    out, copies = [], []
    for env in envs:
        if id(env) not in seen:
            seen.add(id(env))
            out.append(env)
            continue
        if id(env) in failed:
            continue
        try:
            twin = copy.deepcopy(env)
            if twin is env:
                raise TypeError("copy.deepcopy returned the same object")
        except Exception as error:  # noqa: BLE001 - any failure: the object stays one slot
            failed[id(env)] = f"{type(error).__name__}: {str(error)[:80]}"
            continue
        out.append(twin)
        copies.append(twin)
    firsts = {id(e): e for e in envs}
    copied = [f"{_describe_env(e)} x{count[i]}" for i, e in firsts.items() if count[i] > 1 and i not in failed]
    kept = [f"{_describe_env(e)} x{count[i]} ({failed[i]})" for i, e in firsts.items() if i in failed]
    parts = []
    if copied:
        parts.append(f"each repeat of {', '.join(copied)} was replaced by a deep copy (copy.deepcopy) so that every "
                     "entry is its own slot")
    if kept:
        parts.append(f"{', '.join(kept)} could not be copied: an env runs one episode at a time, so each such "
                     "object is ONE slot")
    warnings.warn(
        f"{what} holds the same environment object several times; " + "; ".join(parts)
        + f" ({len(out)} slot(s) from {len(envs)} entries). Pass distinct env objects, or a factory, to choose "
        "the slots yourself.",
        UserWarning,
        stacklevel=_caller_stacklevel(),
    )
    return out, copies
