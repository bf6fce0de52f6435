"""Environment slots: one env, a list, a vector env or a factory as ``N`` torch slots.

Every source is adapted by env-ssl-wrapper, whose per-simulator adapter
(``StandardizeWrapper``) turns gymnasium, dm_control (``TimeStep``, dict
observations), legacy gym and the other simulators it knows into
``(obs, reward, terminated, truncated, info)``. :class:`EnvSlots` keeps one
observation buffer over all slots and resets any chosen slots with given
seeds; the slots are split into runs, each served by one slot source (one
interface, :class:`~populora.envs.sources.SlotSource`):

* consecutive single envs: :class:`~populora.envs.sources.SingleEnvs`;
* a gymnasium ``SyncVectorEnv`` (not wrapped, its own ``step`` / ``reset``):
  its sub-envs, only those playing stepped
  (:class:`~populora.envs.sources.SubEnvSource`);
* any other vector env: :class:`~populora.envs.vector.VectorSource`,
  which steps every slot; one that cannot reset one slot with a seed is
  reset as a whole per round of episodes.

Slots are assumed interchangeable (same environment and configuration): a
seeded episode must play the same in every slot.

The same env object listed several times (``[env for _ in range(16)]``) is
deep-copied (``copy.deepcopy``, which dm_control and gymnasium envs support)
so that every entry is its own slot, with one warning; an env that cannot
be copied stays one slot (with a warning).

Third-party imports (gymnasium, env-ssl-wrapper) sit in the functions that use them: ``import
populora`` needs neither, and env-ssl-wrapper takes about 2 s to import.
"""

from __future__ import annotations

import copy
import sys
import warnings
from collections.abc import Sequence
from types import FrameType
from typing import Any

import numpy as np
import torch
from torch import Tensor
from torch.utils._pytree import tree_flatten, tree_map

from populora.checks import check_int
from populora.envs.sources import (
    SingleEnvs,
    SlotFailure,
    SlotSource,
    SubEnvSource,
    describe_env,
    every_slot_in_order,
    plain_sync_vector_env,
)
from populora.envs.spaces import KeySelection, check_obs_keys
from populora.envs.vector import VectorSource, seeded_copies
from populora.errors import InvalidTypeError, InvalidValueError, PopuloraError
from populora.transaction import closing_on_failure

__all__ = [
    "DEFAULT_NUM_ENVS",
    "REPLAY_RUNS",
    "REPLAY_STEPS",
    "EnvSlots",
    "EnvStepError",
    "SlotFailure",
    "build_slots",
    "caller_stacklevel",
    "is_factory",
]

DEFAULT_NUM_ENVS = 16
"""Envs a factory makes when ``num_envs`` is not given to :func:`~populora.interact_with_env`."""


REPLAY_STEPS = 8
"""Steps of each run of the replay check (:meth:`EnvSlots.replay_problem`)."""

REPLAY_RUNS = 3
"""Runs from one seed in the replay check: two are not enough (Box2D's BipedalWalker replays its second
episode from a seed and departs from it on the third)."""

_REPLAY_SEED = 2_024_917
_REPLAY_ACTIONS_SEED = 11


class EnvStepError(PopuloraError, RuntimeError):
    """An environment raised while being reset or stepped (the slot and individual are named)."""


def is_factory(obj: Any) -> bool:
    """``obj`` makes envs (a gymnasium id string, an env class, a callable without ``reset`` / ``step``)."""
    if isinstance(obj, str) or isinstance(obj, type):
        return True
    return callable(obj) and not hasattr(obj, "reset") and not hasattr(obj, "step")


class EnvSlots:
    """``N`` environment slots over one or more sources, with one observation buffer.

    Args:
        sources: the sources, in slot order (each covers ``[start, stop)``).
        flatten_obs: observations are one ``(N, D)`` float32 tensor, row
            ``i`` the values of ``gymnasium.spaces.flatten(space, obs_i)``
            (``D = gymnasium.spaces.flatdim(space)``; see
            :mod:`populora.envs.spaces`); otherwise they keep their
            structure, every leaf batched ``(N, ..)`` and float32 (booleans
            kept). The sources were built with the same setting.
        created: environments this object made (from a factory) and closes.

    Attributes:
        obs_space: the observation space of one slot after the key selection
            (a gymnasium space; ``None`` for envs without one, e.g. dm_control).
    """

    def __init__(self, sources: list[SlotSource], *, flatten_obs: bool = True, created: Sequence[Any] = ()):
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
        self.obs_space = sources[0].layout.space
        self._only = sources[0] if len(sources) == 1 else None  # the common case: its local slots are the slots
        # sources reset as a whole (no seeded per-slot reset): the interactor then plays rounds of episodes
        self.whole_sources = [k for k, s in enumerate(sources) if s.whole]
        self.round_based = bool(self.whole_sources)

    def raw_env(self, slot: int) -> Any:
        """The env object behind ``slot`` (for a vector env, the vector env)."""
        src = self.sources[int(self.source_of[int(slot)])]
        return src.raw_env(int(slot) - src.start)

    def describe(self, slot: int) -> str:
        """The env behind ``slot``, for messages (its repr, cut to 80 characters)."""
        return describe_env(self.raw_env(slot))

    # ------------------------------------------------------------------ observations

    @property
    def obs(self) -> Any:
        """Observations of every slot, ``(N, D)`` (or a pytree of ``(N, ..)``); rows of idle slots are stale."""
        with torch.inference_mode():  # the buffer is an inference tensor, written in place
            self._flush()
        return self._buf

    def _flush(self) -> None:
        if self._pending is not None:
            slots, obs = self._pending
            self._pending = None
            self._write(slots, obs)

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
        if every_slot_in_order(slots, self.num):
            return self._buf
        index = torch.from_numpy(slots)
        if isinstance(self._buf, Tensor):
            return self._buf.index_select(0, index)
        return tree_map(lambda t: t.index_select(0, index), self._buf)

    # ------------------------------------------------------------------ reset / step

    def reset(self, slots: np.ndarray, seeds: Sequence[int | None], whole_seeds: Sequence[int] | None = None) -> None:
        """Reset ``slots`` with ``seeds`` and store their first observations.

        With :attr:`round_based` sources, ``whole_seeds`` (one per entry of
        :attr:`whole_sources`) resets each of them as a whole, every slot of
        it, whichever of its slots are in ``slots``; the other slots get
        their ``seeds`` as usual.

        Raises:
            SlotFailure: an env raised (the caller names the individuals).
            TypeError: a vector env that cannot reset one slot with a seed.
        """
        self._flush()
        slots = np.asarray(slots, dtype=np.int64)
        seeds = list(seeds)
        if self.round_based:
            if whole_seeds is None or len(whole_seeds) != len(self.whole_sources):
                raise InvalidValueError(
                    f"{len(self.whole_sources)} vector env(s) reset as a whole need as many "
                    f"`whole_seeds`, got {whole_seeds!r}"
                )
            for k, seed in zip(self.whole_sources, whole_seeds):
                src = self.sources[k]
                self._write(np.arange(src.start, src.stop, dtype=np.int64), src.reset_all(seed))
            keep = ~np.isin(self.source_of[slots], self.whole_sources)
            slots = slots[keep]
            seeds = [seed for seed, kept in zip(seeds, keep.tolist()) if kept]
            if slots.size == 0:
                return
        if self._only is not None:
            self._write(slots, self._only.reset(slots, seeds))
            return
        for src, pick in self._by_source(slots):
            self._write(slots[pick], src.reset(slots[pick] - src.start, [seeds[j] for j in pick.tolist()]))

    def step(self, actions: Any, slots: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Step the sources of ``slots`` with their ``(k, ..)`` actions.

        Each source steps the slots it is given (a vector env steps all of
        its slots, see :class:`~populora.envs.vector.VectorSource`).

        Returns:
            ``(reward (k,) float64, done (k,) bool)`` for ``slots``, in order.

        Raises:
            SlotFailure: an env raised.
        """
        if self._only is not None:
            obs, written, reward, done = self._only.step(slots, actions)
            if written is slots:  # only the playing slots stepped: keep their observations pending
                if self._pending is not None and self._pending[0] is not slots:
                    self._flush()  # else the same slots stepped again: their new observations replace those
                self._pending = (slots, obs)
            else:
                self._flush()
                self._buf = obs  # every slot, in order
            return reward, done
        self._flush()
        rewards = np.empty(slots.size, dtype=np.float64)
        dones = np.empty(slots.size, dtype=bool)
        for src, pick in self._by_source(slots):
            obs, written, rewards[pick], dones[pick] = src.step(slots[pick] - src.start, _take_rows(actions, pick))
            self._write(written + src.start, obs)
        return rewards, dones

    def _by_source(self, slots: np.ndarray) -> list[tuple[SlotSource, np.ndarray]]:
        """``(source, positions in slots of its slots)`` for every source ``slots`` touch, in slot order."""
        groups = self.source_of[slots]
        return [(self.sources[k], np.flatnonzero(groups == k)) for k in np.unique(groups).tolist()]

    def close(self) -> None:
        """Close the environments this object created from a factory."""
        _close_all(self.created)
        self.created = []

    # ------------------------------------------------------------------ seeds that mean what they say

    def seeded_twin(self) -> EnvSlots:
        """Slots like these whose every slot resets with its own seed.

        Sources reset as a whole are replaced by single envs made from the
        vector env's specification
        (:func:`~populora.envs.vector.seeded_copies`); the other sources
        are shared (every slot is reset before it plays, so sharing them
        changes no episode). The returned object closes the envs it made.

        Raises:
            InvalidTypeError: a vector env reset as a whole that cannot be
                remade as single envs (the reason named).
        """
        sources: list[SlotSource] = []
        created: list[Any] = []
        with closing_on_failure() as undo:
            undo.callback(_close_all, created)
            for src in self.sources:
                if src.whole:
                    assert isinstance(src, VectorSource)  # the one source reset as a whole
                    twin, made = seeded_copies(src)
                    sources.append(twin)
                    created += made
                else:
                    sources.append(src)
        return EnvSlots(sources, flatten_obs=self.flatten_obs, created=created)

    def replay_problem(self, action_space: Any) -> tuple[str | None, int]:
        """Whether the first source replays an episode from its reset seed: what went wrong (or ``None``), and
        the env steps the check took (over the slots it compares).

        :data:`REPLAY_RUNS` runs of its first slot (every slot of a source
        reset as a whole), each a reset with one fixed seed then the same
        :data:`REPLAY_STEPS` random actions (fewer if the episode ends),
        must see the same observations, rewards and ends. Costs three resets
        and at most 24 steps of one slot (of every slot of a source reset as a
        whole); the slots are left mid-episode (every slot is reset
        before it plays). ``None`` too when it cannot be tested: actions of
        an unknown space, or an env that raises here (the episodes that
        follow report such an error with its slot).
        """
        src = self.sources[0]
        runs: list[list[Any]] = []
        steps = 0
        try:
            for _ in range(REPLAY_RUNS):
                run, taken = _replay_run(src, action_space)
                steps += taken
                if run is None:
                    return None, steps
                runs.append(run)
        except Exception:  # untestable here; a real failure shows in the first episode, naming its slot
            return None, steps
        first = runs[0]
        for j, other in enumerate(runs[1:], start=2):
            for t, (a, b) in enumerate(zip(first, other)):  # the done flags are compared too: same lengths
                if not _same(a, b):
                    if t == 0:
                        return (
                            f"reset(seed={_REPLAY_SEED}) gave other first observations on reset {j} than on "
                            "reset 1: it ignores the seed"
                        ), steps
                    return (
                        f"reset(seed={_REPLAY_SEED}) and the same actions gave other observations, rewards or ends at "
                        f"step {t} of run {j} than of run 1"
                    ), steps
        return None, steps


def _same(a: Any, b: Any) -> bool:
    """Bitwise equality of two pytrees of tensors / arrays (NaN equal to NaN)."""
    left, right = tree_flatten(a)[0], tree_flatten(b)[0]
    if len(left) != len(right):
        return False
    for x, y in zip(left, right):
        x, y = torch.as_tensor(x), torch.as_tensor(y)
        if x.shape != y.shape or x.dtype != y.dtype:
            return False
        if x.is_floating_point():
            if not torch.equal(torch.nan_to_num(x, nan=0.0), torch.nan_to_num(y, nan=0.0)) or not torch.equal(
                x.isnan(), y.isnan()
            ):
                return False
        elif not torch.equal(x, y):
            return False
    return True


def _probe_actions(space: Any, k: int, generator: torch.Generator) -> Any:
    """``k`` random actions of ``space`` drawn from ``generator`` (``None``: no actions known for it)."""
    from populora.envs.actions import ActionFormat

    fmt = ActionFormat(space)
    if fmt.kind == "unknown":
        return None
    if fmt.kind == "box":
        bounds = (
            np.asarray(getattr(space, "low", getattr(space, "minimum", -1.0)), dtype=np.float64),
            np.asarray(getattr(space, "high", getattr(space, "maximum", 1.0)), dtype=np.float64),
        )
        low, high = (torch.from_numpy(np.broadcast_to(np.clip(b, -1.0, 1.0), fmt.shape).copy()) for b in bounds)
        u = torch.rand((k, *fmt.shape), generator=generator, dtype=torch.float64)
        actions = low + u * (high - low)
        return actions.long() if fmt.integer else actions.float()
    assert fmt.width is not None  # a known kind has a width
    outputs = torch.randn((k, int(fmt.width)), generator=generator)
    return fmt.default_actions(outputs, k)


def _replay_run(src: SlotSource, action_space: Any) -> tuple[list[Any] | None, int]:
    """One run of the replay check: ``[first obs, (obs, reward, done) of each step, ...]`` (``None``: no
    actions known for the space) and the env steps it took over the slots it compares."""
    generator = torch.Generator().manual_seed(_REPLAY_ACTIONS_SEED)
    if src.whole:
        local = np.arange(src.num, dtype=np.int64)
        obs = src.reset_all(_REPLAY_SEED)
    else:
        local = np.zeros(1, dtype=np.int64)
        obs = src.reset(local, [_REPLAY_SEED])
    out = [obs]
    steps = 0
    for _ in range(REPLAY_STEPS):
        actions = _probe_actions(action_space, local.size, generator)
        if actions is None:
            return None, steps
        obs, written, reward, done = src.step(local, actions)
        steps += local.size
        if written is not local and written.size != local.size:  # a source that steps every slot
            index = torch.from_numpy(local)
            obs = tree_map(lambda t: t.index_select(0, index) if isinstance(t, Tensor) else t, obs)
        out.append((obs, np.asarray(reward, dtype=np.float64), np.asarray(done, dtype=bool)))
        if np.asarray(done).any():
            break
    return out, steps


def _take_rows(actions: Any, pick: np.ndarray) -> Any:
    index = torch.from_numpy(pick)
    return tree_map(lambda t: t.index_select(0, index) if isinstance(t, Tensor) else t[pick], actions)


def _sources(raw: Sequence[Any], flatten: bool, keys: KeySelection) -> list[SlotSource]:
    """One source per vector env, one per run of consecutive single envs, in slot order."""
    from env_ssl_wrapper.standardize.helpers import is_vectorized

    sources: list[SlotSource] = []
    singles: list[Any] = []
    start = 0
    for env in [*raw, None]:
        if env is not None and not plain_sync_vector_env(env) and not is_vectorized(env):
            singles.append(env)
            continue
        if singles:
            sources.append(SingleEnvs(singles, start, flatten, keys))
            start, singles = start + len(singles), []
        if env is not None:
            kind = SubEnvSource if plain_sync_vector_env(env) else VectorSource
            src = kind(env, start, flatten, keys)
            sources.append(src)
            start += src.num
    return sources


def build_slots(
    envs: Any,
    *,
    num_envs: int | None = None,
    flatten_obs: bool = True,
    obs_keys: Sequence[str] | None = None,
    drop_obs_keys: Sequence[str] | None = None,
) -> EnvSlots:
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
        flatten_obs: each observation becomes the values of
            ``gymnasium.spaces.flatten(space, obs)`` as float32 (a
            ``Discrete(n)`` observation a one-hot of ``n``; a Dict its entries
            in the space's key order), so a model sized by
            ``gymnasium.spaces.flatdim(space)`` fits; an env without a
            gymnasium space (dm_control) has every leaf of its observation
            concatenated in the order it lists them.
        obs_keys: for Dict observations, the keys to keep (the others never
            reach the model); they stay in the space's key order.
        drop_obs_keys: for Dict observations, the keys to drop (MiniGrid's
            text ``mission``: ``drop_obs_keys=['mission']``). At most one of
            ``obs_keys`` and ``drop_obs_keys``.

    Raises:
        InvalidValueError: an empty list, ``num_envs < 1`` or ``num_envs``
            with something that is not a factory; an observation space with
            a part that has no numeric form (``Text``, ``Graph``,
            ``Sequence``, MiniGrid's ``MissionSpace``: the error names it and
            how to drop it); an ``obs_keys`` / ``drop_obs_keys`` key the
            observations do not have (their keys listed), both given, or
            given for observations that are not a Dict.
        InvalidTypeError: a list entry that is a factory rather than an env,
            a ``num_envs`` that is not an int, keys that are not a list of
            strings; a vector env form that is not supported (named).
    """
    keys = check_obs_keys(obs_keys, drop_obs_keys)
    created: list[Any] = []
    if isinstance(envs, (list, tuple)):
        if len(envs) == 0:
            raise InvalidValueError("`envs` is an empty list; pass at least one environment, a vector env or a factory")
        if num_envs is not None:
            raise InvalidValueError(
                f"`num_envs={num_envs}` only applies to a factory; `envs` is a list of {len(envs)} envs"
            )
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

    with closing_on_failure() as undo:
        undo.callback(_close_all, created)
        sources = _sources(raw, flatten_obs, keys)
    return EnvSlots(sources, flatten_obs=flatten_obs, created=created)


def _close_all(envs: Sequence[Any]) -> None:
    for env in envs:
        try:
            env.close()
        except Exception:  # closing is best effort
            pass


def caller_stacklevel() -> int:
    """``warnings.warn``'s stacklevel of the first frame outside populora (the user's call)."""
    frame: FrameType | None = sys._getframe(1)
    level = 1
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
        except Exception as error:  # any failure: the object stays one slot
            failed[id(env)] = f"{type(error).__name__}: {str(error)[:80]}"
            continue
        out.append(twin)
        copies.append(twin)
    firsts = {id(e): e for e in envs}
    copied = [f"{describe_env(e)} x{count[i]}" for i, e in firsts.items() if count[i] > 1 and i not in failed]
    kept = [f"{describe_env(e)} x{count[i]} ({failed[i]})" for i, e in firsts.items() if i in failed]
    parts = []
    if copied:
        parts.append(
            f"each repeat of {', '.join(copied)} was replaced by a deep copy (copy.deepcopy) so that every "
            "entry is its own slot"
        )
    if kept:
        parts.append(
            f"{', '.join(kept)} could not be copied: an env runs one episode at a time, so each such object is ONE slot"
        )
    warnings.warn(
        f"{what} holds the same environment object several times; "
        + "; ".join(parts)
        + f" ({len(out)} slot(s) from {len(envs)} entries). Pass distinct env objects, or a factory, to choose "
        "the slots yourself.",
        UserWarning,
        stacklevel=caller_stacklevel(),
    )
    return out, copies
