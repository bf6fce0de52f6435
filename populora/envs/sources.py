"""Slot sources: the environments behind a run of consecutive slots, all with one interface.

:class:`~populora.envs.slots.EnvSlots` numbers its slots ``0..N-1`` and
hands each run of them to a source (:class:`SlotSource`); a source resets and
steps any subset of its slots and returns their observations batched as
torch tensors. Three kinds:

* :class:`SingleEnvs`: consecutive single envs, one slot each, adapted by
  env-ssl-wrapper's ``StandardizeWrapper`` only, reset with
  ``env_ssl_wrapper.reset_env`` (gymnasium's ``reset(seed=)`` or dm_control's
  task random state); their observations are batched here, once per step for
  all of them (the per-env AutoBatched + Tensor layers cost several times a
  cheap env's step);
* :class:`SubEnvSource`: a plain gymnasium ``SyncVectorEnv``, whose sub-envs
  are stepped and reset one by one, only those playing (see its docstring);
* :class:`~populora.envs.vector.VectorSource`: any other vector env,
  which steps every slot at once (see :mod:`populora.envs.vector`).

A source raises :class:`SlotFailure` naming the slots an env failed in;
configuration errors (observations of another size) pass through as they are.

Third-party imports (gymnasium, env-ssl-wrapper) sit in the functions that use them: ``import
populora`` needs neither, and env-ssl-wrapper takes about 2 s to import.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor
from torch.utils._pytree import tree_map

from populora.envs.spaces import KeySelection, ObsLayout
from populora.errors import InvalidTypeError, InvalidValueError

__all__ = [
    "SingleEnvs",
    "SlotFailure",
    "SlotSource",
    "SubEnvSource",
    "describe_env",
    "every_slot_in_order",
    "plain_sync_vector_env",
]


class SlotFailure(Exception):
    """Internal: an env failed; carries the (global) slots involved, ``'reset'`` or ``'step'``, and the cause."""

    def __init__(self, slots: Sequence[int], what: str, cause: BaseException):
        super().__init__(what)
        self.slots = list(slots)
        self.what = what
        self.cause = cause


def describe_env(env: Any) -> str:
    """``repr(env)`` (its class name without a repr of its own), cut to 80 characters."""
    text = repr(env) if type(env).__repr__ is not object.__repr__ else type(env).__name__
    return text if len(text) <= 80 else text[:77] + "..."


def every_slot_in_order(slots: np.ndarray, num: int) -> bool:
    """``slots`` is ``0, 1, .., num - 1`` (distinct slots of ``[0, num)``, increasing)."""
    return slots.size == num and bool((slots[1:] > slots[:-1]).all())


def _spec_keys(env: Any) -> list[str] | None:
    """The Dict observation keys an env without a gymnasium space tells (dm_control's ``observation_spec()``)."""
    spec = getattr(env, "observation_spec", None)
    if not callable(spec):
        return None
    try:
        spec = spec()
    except Exception:  # no spec to read: the keys are checked at the first observation
        return None
    return [key for key in spec if isinstance(key, str)] if isinstance(spec, dict) else None


# ---------------------------------------------------------------------- resets


def _reset_each(
    reset: Callable[[int, int | None], Any], local: np.ndarray, seeds: Sequence[int | None], start: int
) -> list[Any]:
    """``[reset(slot, seed), ...]`` over the local slots, a failure naming its (global) slot."""
    rows = []
    for slot, seed in zip(local.tolist(), seeds):
        try:
            rows.append(reset(slot, None if seed is None else int(seed)))
        except Exception as error:
            raise SlotFailure([start + slot], "reset", error) from error
    return rows


# ---------------------------------------------------------------------- the interface


class SlotSource:
    """The envs behind slots ``[start, stop)``; methods take local slots ``0..num-1`` (``np.int64`` arrays).

    Attributes:
        start, stop, num: the slots covered.
        action_space: the action space of one slot (as env-ssl-wrapper's adapter reports it).
        whole: resets only as a whole (:meth:`reset_all`), never one slot with a seed.
        flatten: observations come back as one ``(k, D)`` float32 tensor
            (``gymnasium.spaces.flatten`` of each slot's observation).
        keys: the Dict observation entries that stay.
        layout: how the observations become the model's input (made by the
            subclass from its observation space, see
            :class:`~populora.envs.spaces.ObsLayout`).
    """

    whole = False

    layout: ObsLayout
    action_space: Any  # set by each subclass

    def __init__(self, start: int, num: int, flatten: bool, keys: KeySelection | None = None):
        self.start = start
        self.num = num
        self.stop = start + num
        self.flatten = flatten
        self.keys = keys if keys is not None else KeySelection()

    def raw_env(self, local: int) -> Any:
        """The env object the user passed for local slot ``local``."""
        raise NotImplementedError

    def reset(self, local: np.ndarray, seeds: Sequence[int | None]) -> Any:
        """Reset ``local`` with ``seeds`` (``None``: unseeded); their first observations, ``(len(local), ..)``."""
        raise NotImplementedError

    def reset_all(self, seed: int) -> Any:
        """Reset every slot with one ``seed`` (only sources with :attr:`whole`); ``(num, ..)`` observations."""
        raise InvalidTypeError(f"{describe_env(self.raw_env(0))} resets one slot at a time, not as a whole")

    def step(self, local: np.ndarray, actions: Any) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray]:
        """Step ``local`` with their ``(k, ..)`` actions.

        Returns:
            ``(obs, written, reward (k,) float64, done (k,) bool)``: ``obs``
            holds the observations of the local slots ``written`` (``local``
            itself, or every slot for a source that steps them all).
        """
        raise NotImplementedError


class SingleEnvs(SlotSource):
    """Consecutive single envs, one slot each, through env-ssl-wrapper's StandardizeWrapper only.

    The adapter gives ``(obs, reward, terminated, truncated, info)`` for any
    simulator; batching and tensor conversion happen once per timestep over
    the slots stepped.
    """

    def __init__(self, envs: Sequence[Any], start: int, flatten: bool, keys: KeySelection | None = None):
        from env_ssl_wrapper import compose_env, get_adapter

        super().__init__(start, len(envs), flatten, keys)
        self.raws = list(envs)
        adapters = [get_adapter(env) for env in self.raws]
        self.layout = ObsLayout(
            adapters[0].observation_space,
            flatten,
            self.keys,
            describe_env(self.raws[0]),
            spec_keys=_spec_keys(self.raws[0]) if self.keys.active else None,
        )
        self.torch_native = [bool(getattr(adapter, "torch_native", False)) for adapter in adapters]
        self.envs = [compose_env(env, pad_episodes=False) for env in self.raws]
        self.action_space = adapters[0].action_space

    def raw_env(self, local: int) -> Any:
        return self.raws[local]

    def reset(self, local: np.ndarray, seeds: Sequence[int | None]) -> Any:
        from env_ssl_wrapper import reset_env

        rows = _reset_each(lambda slot, seed: reset_env(self.envs[slot], seed)[0], local, seeds, self.start)
        return self.layout.from_rows(rows)

    def step(self, local: np.ndarray, actions: Any) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray]:
        k = local.size
        rewards = np.empty(k, dtype=np.float64)
        dones = np.empty(k, dtype=bool)
        act_np = actions.numpy() if isinstance(actions, Tensor) else None
        rows = []
        for j, slot in enumerate(local.tolist()):
            if act_np is not None:
                act = act_np[j]
                act = act.item() if act.ndim == 0 else act.copy()
            else:
                act = tree_map(lambda t, j=j: t[j], actions)
            try:
                obs, rewards[j], dones[j] = self._step_one(slot, act)
            except Exception as error:
                raise SlotFailure([self.start + slot], "step", error) from error
            rows.append(obs)
        return self.layout.from_rows(rows), local, rewards, dones

    def _step_one(self, slot: int, action: Any) -> tuple[Any, float, bool]:
        if self.torch_native[slot] and isinstance(action, np.ndarray):
            action = torch.from_numpy(action)
        obs, reward, terminated, truncated, _ = self.envs[slot].step(action)
        # float32 like TensorWrapper's rewards, so a list and a vector env add up the same numbers;
        # dm_env's reward is None only at the FIRST step, which a step never returns
        reward = 0.0 if reward is None else float(np.float32(np.asarray(reward).reshape(())))
        return obs, reward, bool(np.asarray(terminated).any() or np.asarray(truncated).any())


def plain_sync_vector_env(env: Any) -> bool:
    """A gymnasium ``SyncVectorEnv`` with its own ``step`` / ``reset`` (no vector wrapper, no override)."""
    from gymnasium.vector import SyncVectorEnv

    cls = type(env)
    return (
        isinstance(env, SyncVectorEnv)
        and cls.step is SyncVectorEnv.step
        and cls.reset is SyncVectorEnv.reset
        and isinstance(getattr(env, "envs", None), list)
    )


class SubEnvSource(SlotSource):
    """The sub-envs of a gymnasium ``SyncVectorEnv``, stepped and reset one by one.

    Only the slots that are playing are stepped, the way ``SyncVectorEnv``
    steps each one (``iterate`` over the actions, ``concatenate`` of the
    observations in its ``single_observation_space``, rewards through float32
    like env-ssl-wrapper's TensorWrapper), so a playing slot sees exactly
    what it would see through the vector env; idle slots are left alone, and
    a slot is reset with ``sub_env.reset(seed=)``. Stepping every slot would
    spend most steps on idle slots once the work queue runs dry; stepping the
    sub-envs also skips the vector env's autoreset and info bookkeeping, so
    it is not slower even when every slot is busy.
    """

    def __init__(self, env: Any, start: int, flatten: bool, keys: KeySelection | None = None):
        from env_ssl_wrapper import get_adapter
        from gymnasium.spaces import Box, Discrete, MultiBinary, MultiDiscrete
        from gymnasium.vector.utils import concatenate, create_empty_array, iterate

        super().__init__(start, len(env.envs), flatten, keys)
        self.raw = env
        self.envs = list(env.envs)
        self.action_space = get_adapter(env).action_space
        self._step = [sub.step for sub in self.envs]
        self.layout = ObsLayout(env.single_observation_space, flatten, self.keys, describe_env(env))
        # the kept entries only: gymnasium's concatenate of a Dict takes the keys of the space it is given
        obs_space, batch_actions = self.layout.space, env.action_space
        # gymnasium's own batching (concatenate / iterate); for these spaces it is np.stack into an array of
        # the space's shape and dtype (np.array makes the same array 3x faster), and the iteration over a
        # batch of actions is over its rows
        if type(obs_space) in (Box, Discrete, MultiDiscrete, MultiBinary):
            shape, dtype = tuple(obs_space.shape), obs_space.dtype

            def batch(rows: Sequence[Any]) -> np.ndarray:
                out = np.array(rows, dtype=dtype)
                if out.shape[1:] != shape:
                    raise InvalidValueError(
                        f"sub-envs returned observations of shape {out.shape[1:]}; the "
                        f"observation space {obs_space} has shape {shape}"
                    )
                return out

            self._batch: Callable[[Sequence[Any]], Any] = batch
            # the observations as they go to the model: one (k, D) float32 tensor straight from the batch
            self._direct = flatten and len(shape) == 1 and np.dtype(dtype) == np.float32
        else:
            self._direct = False
            # gymnasium's own pairing, as in SyncVectorEnv (create_empty_array's None: a space it cannot batch)
            self._batch = lambda rows: concatenate(
                obs_space,
                rows,
                create_empty_array(obs_space, len(rows), fn=np.empty),  # type: ignore[arg-type]
            )
        self._rows: Callable[[Any], Iterator[Any]]
        if type(batch_actions) in (Box, MultiDiscrete, MultiBinary):
            self._rows = iter
        else:
            self._rows = lambda actions: iterate(batch_actions, actions)

    def raw_env(self, local: int) -> Any:
        return self.raw

    def reset(self, local: np.ndarray, seeds: Sequence[int | None]) -> Any:
        rows = _reset_each(lambda slot, seed: self.envs[slot].reset(seed=seed)[0], local, seeds, self.start)
        try:
            return self.layout.from_batch(self._batch(rows), len(rows))
        except Exception as error:
            raise SlotFailure((local + self.start).tolist(), "reset", error) from error

    def step(self, local: np.ndarray, actions: Any) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray]:
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
            raise SlotFailure(
                (local + self.start).tolist(), "step", InvalidValueError(f"{len(outs)} actions for {k} slots")
            )
        obs, rewards, terminated, truncated, _ = zip(*outs)
        # the vector env's float64 rewards, through float32 like TensorWrapper's
        reward = np.array(rewards, dtype=np.float32).reshape(k).astype(np.float64)
        done = np.logical_or(terminated, truncated)
        try:
            rows = self._batch(obs)
            batch = torch.from_numpy(rows) if self._direct else self.layout.from_batch(rows, k)
        except Exception as error:
            raise SlotFailure((local + self.start).tolist(), "step", error) from error
        return batch, local, reward, done if done.shape == (k,) else done.reshape(k)
