"""The slot source of a vector env that steps every slot at once.

Through env-ssl-wrapper's ``TensorWrapper`` (torch tensors, one call per
timestep). Slots nobody plays get a copy of the first action (their rewards
are never read). How a slot is reset depends on what the env can do:

* a gymnasium ``AsyncVectorEnv`` (or a wrapped ``SyncVectorEnv``) resets
  several slots in one call through ``options['reset_mask']`` with one seed
  per slot;
* ale-py's ``AtariVectorEnv`` resets chosen slots in one call through
  ``options['reset_mask']`` with an array of seeds, one per chosen slot;
* a vector env with ``reset_at`` / ``reset_one`` (env-ssl-wrapper's
  convention) resets one slot with a seed through
  ``env_ssl_wrapper.reset_env_at``;
* any other vector env (gymnasium's native ``CartPoleVectorEnv`` from
  ``gym.make_vec('CartPole-v1', num_envs=4)``, or any ``VectorEnv`` whose
  slots share one random generator) cannot reset one slot with a seed. It is
  **reset as a whole** instead (:attr:`VectorSource.whole`), with one seed,
  at the start of every round of episodes (see
  :mod:`populora.envs.interactor` for the seeding scheme); every
  autoreset mode works: with ``NEXT_STEP`` and ``SAME_STEP`` the env's own
  autoresets of slots whose episode ended are stepped through but never
  counted, and with ``DISABLED`` such slots are reset through
  ``options['reset_mask']`` without a seed (gymnasium 1.x's contract for
  that mode) before the next step. What must play the episodes its seeds
  name (validation, ``EnvInteractor.play``) runs on single envs made from
  such an env's specification instead (:func:`seeded_copies`).

Vector env forms (each tested in ``tests/interact/test_vector_forms.py``):

* gymnasium's ``SyncVectorEnv`` / ``AsyncVectorEnv`` / native vector envs
  (``gym.make_vec``, every autoreset mode), and any gymnasium ``VectorEnv``;
* ale-py's ``AtariVectorEnv`` (``batch_size`` equal to its envs), each slot
  reset with its own seed;
* envpool (``envpool.make_gymnasium``): a gymnasium vector env without a
  seeded reset of one slot, reset as a whole; envpool fixes its seeds when
  it is made (``seed=`` of ``make_gymnasium``) and ignores the seed of a
  reset, so its rounds do not replay from the run's seeds (the
  interactor's replay check names it in a warning), and no single envs can
  be made of it for validation (refused, naming the fix);
* pufferlib's ``pufferlib.vector.Serial`` and ``Multiprocessing`` (over
  ``pufferlib.emulation.GymnasiumPufferEnv``; the ``pufferlib-core`` package):
  they reset a finished env instead of stepping it at the next step (an
  autoreset), and take the reset protocol they need (a whole ``reset`` before
  the first step); a ``Serial`` env resets one slot with a seed through its
  sub-env, a ``Multiprocessing`` one is reset as a whole (its seeded
  episodes run on a ``Serial`` env over copies of its driver env). pufferlib packs a
  structured observation into one ``Box`` of its own layout
  (``single_observation_space``), which is what the model gets;
* any env-ssl-wrapper vector env.

Refused with an error naming the form: pufferlib envs with several agents
per env, a pufferlib ``Multiprocessing`` env or an ale-py ``AtariVectorEnv``
whose ``batch_size`` is smaller than its envs (each step would return other
slots), and stable-baselines3
``VecEnv`` objects (their ``reset`` takes no seed).

Third-party imports (gymnasium, env-ssl-wrapper) sit in the functions that use them: ``import
populora`` needs neither, and env-ssl-wrapper takes about 2 s to import.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor
from torch.utils._pytree import tree_flatten, tree_map

from populora.envs.sources import SlotFailure, SlotSource, SubEnvSource, describe_env, every_slot_in_order
from populora.envs.spaces import KeySelection, ObsLayout
from populora.errors import InvalidTypeError, InvalidValueError
from populora.transaction import closing_on_failure

__all__ = ["VectorSource", "seeded_copies"]


def _masked_reset_capable(env: Any) -> bool:
    from gymnasium.vector import AsyncVectorEnv, SyncVectorEnv

    inner = getattr(env, "unwrapped", env)
    return isinstance(inner, (SyncVectorEnv, AsyncVectorEnv))


def _is_ale_vector(env: Any) -> bool:
    """ale-py's ``AtariVectorEnv`` (maybe wrapped): one seed per slot through ``options['reset_mask']``."""
    inner = getattr(env, "unwrapped", env)
    return type(inner).__name__ == "AtariVectorEnv" and type(inner).__module__.startswith("ale_py")


def _can_reset_one_slot(env: Any) -> bool:
    """Whether ``env`` can reset one slot with a seed.

    ale-py's ``AtariVectorEnv`` (a masked reset with an array of seeds), or
    what ``env_ssl_wrapper.reset_env_at`` can do, mirrored without calling
    it: a ``reset_at`` / ``reset_one`` method, gymnasium's masked reset of a
    Sync / Async vector env, or a list of sub-envs, on ``env`` or any wrapper
    below it.
    """
    if _masked_reset_capable(env) or _is_ale_vector(env):
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
            except Exception:  # a property that raises: not a per-slot reset
                pass
        if isinstance(vars(layer).get("envs") if hasattr(layer, "__dict__") else None, (list, tuple)):
            return True
        layer = vars(layer).get("env") if hasattr(layer, "__dict__") else None
    return False


def _is_pufferlib_vector(env: Any) -> bool:
    """A ``pufferlib.vector`` env (``Serial``, ``Multiprocessing``, ...): pufferlib's send / recv protocol."""
    return type(env).__module__.startswith("pufferlib") and all(
        callable(getattr(env, name, None)) for name in ("async_reset", "send", "recv")
    )


def _check_form(env: Any) -> None:
    """Refuse the vector env forms this source cannot serve, naming the form and what to pass instead."""
    name = describe_env(env)
    if _is_pufferlib_vector(env):
        driver = getattr(env, "driver_env", None)
        agents = int(getattr(driver, "num_agents", 1) or 1)
        if agents != 1:
            raise InvalidTypeError(
                f"the pufferlib vector env {name} runs {agents} agents per env; a slot is one env with one agent, "
                "so multi-agent pufferlib envs are not supported: pass single-agent envs "
                "(pufferlib.emulation.GymnasiumPufferEnv over a gymnasium env)"
            )
        total, batch = getattr(env, "num_agents", None), getattr(env, "agents_per_batch", None)
        if total is not None and batch is not None and int(total) != int(batch):
            raise InvalidTypeError(
                f"the pufferlib vector env {name} returns {batch} of its {total} envs per step (batch_size < "
                "num_envs), a different set each time; make it with batch_size=num_envs"
            )
        return
    if _is_ale_vector(env):
        inner = env.unwrapped
        if int(getattr(inner, "batch_size", inner.num_envs)) != int(inner.num_envs):
            raise InvalidTypeError(
                f"the ale-py vector env {name} returns {inner.batch_size} of its {inner.num_envs} envs per step "
                "(batch_size < num_envs), a different set each time; make it with batch_size=0 (all envs)"
            )
        return
    if all(callable(getattr(env, attr, None)) for attr in ("step_async", "step_wait", "env_method")):
        raise InvalidTypeError(
            f"{name} is a stable-baselines3 VecEnv, which is not supported (its reset takes no seed, so episodes "
            "cannot be replayed with common random numbers); pass its env factory, a list of envs, or a gymnasium "
            "vector env (gym.make_vec(..., vectorization_mode='sync'))"
        )


def _fill(actions: Any, slots: np.ndarray, num: int) -> Any:
    """``(num, ..)`` actions: ``actions`` at ``slots``, a copy of the first action elsewhere."""
    index = torch.from_numpy(slots)

    def fill(t: Tensor) -> Tensor:
        full = t[:1].expand(num, *t.shape[1:]).clone()
        return full.index_copy_(0, index, t)

    return tree_map(fill, actions)


class VectorSource(SlotSource):
    """A vector env covering slots ``[start, start + num)``, through env-ssl-wrapper's TensorWrapper."""

    def __init__(self, env: Any, start: int, flatten: bool, keys: KeySelection | None = None):
        from env_ssl_wrapper import compose_env, get_adapter
        from env_ssl_wrapper.standardize.helpers import env_autoresets, env_num_envs

        _check_form(env)
        super().__init__(start, int(env_num_envs(env)), flatten, keys)
        self.raw = env
        adapter = get_adapter(env)
        self.layout = ObsLayout(adapter.observation_space, flatten, self.keys, describe_env(env))
        # pufferlib resets a finished env at the next step instead of stepping it (its own autoreset), and
        # steps only after a reset of the whole vector env
        self.puffer = _is_pufferlib_vector(env)
        # a vector wrapper hides gymnasium's `autoreset_mode` attribute, not the metadata entry it sets
        mode = getattr(env, "metadata", None) or {}
        mode = mode.get("autoreset_mode") if isinstance(mode, dict) else None
        disabled = mode is not None and str(getattr(mode, "value", mode)).lower() == "disabled"
        self.autoresets = (bool(env_autoresets(env)) or self.puffer) and not disabled
        self.masked_reset = _masked_reset_capable(env)
        self.ale = _is_ale_vector(env)
        # no seeded reset of one slot: reset as a whole, once per round of episodes (see EnvSlots.reset)
        self.whole = not _can_reset_one_slot(env)
        self._last_obs: Any = None
        # the key selection sits below the TensorWrapper: entries that are no numbers never reach it
        select = self.layout.wrapper()
        self.env = compose_env(env, ("tensor", dict(device="cpu")), *([select] if select else []), pad_episodes=False)
        self.action_space = adapter.action_space
        # slots that ended while nobody used them: reset before the next step unless the env autoresets
        self.stale = np.zeros(self.num, dtype=bool)
        self.started = False
        self.every = np.arange(self.num, dtype=np.int64)

    def raw_env(self, local: int) -> Any:
        return self.raw

    def reset_all(self, seed: int) -> Any:
        """Reset every slot with one ``seed``: ``(num, ..)`` observations.

        ``reset(seed=seed)``; an env whose ``reset`` takes no seed is seeded
        the way ``env_ssl_wrapper.reset_env`` can (``seed()``, or not at all).
        """
        try:
            try:
                obs, _ = self.env.reset(seed=int(seed))
            except TypeError:
                from env_ssl_wrapper import reset_env

                obs, _ = reset_env(self.env, int(seed))
            self.stale[:] = False
            self.started = True
            self._last_obs = obs
            return self.layout.from_batch(obs, self.num)
        except Exception as error:
            raise SlotFailure((self.every + self.start).tolist(), "reset", error) from error

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
                f"the vector env {describe_env(self.raw)} does not autoreset and cannot reset some of its slots "
                f"(reset(options={{'reset_mask': mask}}) raised {type(error).__name__}: {error}); gymnasium 1.x's "
                "AutoresetMode.DISABLED needs that reset, or pass a list of envs or a factory"
            ) from error
        if self._last_obs is not None:
            keep = torch.from_numpy(np.flatnonzero(~mask))
            before, after = tree_flatten(self._last_obs)[0], tree_flatten(obs)[0]
            same = len(before) == len(after) and all(
                not isinstance(a, Tensor)
                or (a.shape == b.shape and torch.equal(a.index_select(0, keep), b.index_select(0, keep)))
                for a, b in zip(before, after)
            )
            if not same:
                raise InvalidTypeError(
                    f"the vector env {describe_env(self.raw)} changed slots outside options['reset_mask'] when "
                    "resetting its ended slots (it restarted episodes being played); gymnasium 1.x's "
                    "AutoresetMode.DISABLED needs a masked reset, or pass a list of envs or a factory"
                )
        self.stale[local] = False

    def reset(self, local: np.ndarray, seeds: Sequence[int | None]) -> Any:
        """Reset ``local`` with ``seeds``.

        Raises:
            TypeError: the env cannot reset one slot with a seed (passed through, not a :class:`SlotFailure`).
        """
        try:
            return self.layout.from_batch(self._reset(local, seeds), local.size)
        except TypeError as error:
            if "cannot reset one slot" in str(error):
                raise
            raise SlotFailure((local + self.start).tolist(), "reset", error) from error
        except Exception as error:
            raise SlotFailure((local + self.start).tolist(), "reset", error) from error

    def _reset(self, local: np.ndarray, seeds: Sequence[int | None]) -> Any:
        from env_ssl_wrapper import reset_env_at

        if self.whole:  # pragma: no cover - EnvSlots resets such an env with reset_all
            raise InvalidTypeError(f"the vector env {describe_env(self.raw)} cannot reset one slot with a seed")
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
        if self.ale:  # ale-py: a masked reset takes one seed per chosen slot (-1: unseeded), in slot order
            order = np.argsort(local, kind="stable")
            chosen = np.asarray(local, dtype=np.int64)[order]
            seed_array = np.asarray([-1 if seeds[j] is None else seeds[j] for j in order.tolist()], dtype=np.int64)
            mask = np.zeros(self.num, dtype=np.bool_)
            mask[chosen] = True
            if self.started:
                obs, _ = self.env.reset(seed=seed_array, options={"reset_mask": mask})
            else:  # a masked reset needs every slot reset once before
                every = np.full(self.num, -1, dtype=np.int64)
                every[chosen] = seed_array
                obs, _ = self.env.reset(seed=every)
                self.started = True
            index = torch.from_numpy(np.asarray(local, dtype=np.int64))
            return tree_map(lambda t: t.index_select(0, index) if isinstance(t, Tensor) else t, obs)
        if self.puffer and not self.started:  # pufferlib steps only after a reset of the whole vector env
            self.env.reset()
            self.started = True
        rows = []
        for slot, seed in zip(local.tolist(), seeds):
            out = reset_env_at(self.env, slot, seed=seed)
            if out is None:
                raise InvalidTypeError(
                    f"the vector env {describe_env(self.raw)} cannot reset one slot with a seed (no "
                    "`reset_at` and no gymnasium `options['reset_mask']`), which common random numbers "
                    "need; pass a gymnasium SyncVectorEnv (gym.make_vec(..., vectorization_mode='sync')), "
                    "a list of envs or a factory instead"
                )
            # one row per slot (a pufferlib sub-env returns its (1, ..) buffer of one agent)
            rows.append(tree_map(lambda t: t.unsqueeze(0) if isinstance(t, Tensor) and not self.puffer else t, out[0]))
        return tree_map(lambda *ts: torch.cat(ts, 0), *rows) if len(rows) > 1 else rows[0]

    def step(self, local: np.ndarray, actions: Any) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray]:
        """Step every slot (``written`` is all of them); ``reward`` and ``done`` of ``local`` only."""
        every = every_slot_in_order(local, self.num)
        try:
            obs, reward, done = self._step_all(actions if every else _fill(actions, local, self.num))
            obs = self.layout.from_batch(obs, self.num)
        except Exception as error:
            raise SlotFailure((local + self.start).tolist(), "step", error) from error
        return (obs, self.every, reward, done) if every else (obs, self.every, reward[local], done[local])

    def _step_all(self, actions: Any) -> tuple[Any, np.ndarray, np.ndarray]:
        """Step all slots with ``(num, ..)`` actions: ``(obs, reward (num,) float64, done (num,) bool)``."""
        if not self.autoresets and self.stale.any():
            local = np.flatnonzero(self.stale)
            if self.whole:
                self._reset_ended(local)
            else:
                self._reset(local, [None] * local.size)  # observations unused: nobody acts in those slots
        obs, reward, terminated, truncated, _ = self.env.step(actions)
        if self.whole and not self.autoresets:
            self._last_obs = obs
        reward = torch.as_tensor(reward).reshape(-1).numpy().astype(np.float64)
        done = (torch.as_tensor(terminated) | torch.as_tensor(truncated)).reshape(-1).numpy()
        if reward.size != self.num or done.size != self.num:
            raise InvalidValueError(
                f"env {describe_env(self.raw)} returned {reward.size} rewards and {done.size} "
                f"done flags for {self.num} slots"
            )
        if not self.autoresets:
            self.stale |= done
        return obs, reward, done


# ---------------------------------------------------------------------- single envs of a whole-reset vector env

# make_vec's own entries of a spec's kwargs: how the vector env was made, not arguments of the single env
_VECTOR_KWARGS = ("num_envs", "vectorization_mode", "vector_kwargs", "wrappers")


def _gymnasium_single_maker(env: Any) -> tuple[Callable[[], Any] | None, str]:
    """``make()`` of one env of a gymnasium vector env made by ``gym.make_vec``, or ``None`` and why not."""
    import gymnasium as gym
    from gymnasium.envs.registration import EnvSpec
    from gymnasium.vector import VectorEnv

    inner = getattr(env, "unwrapped", env)
    if not isinstance(inner, VectorEnv):
        return None, "it is not a gymnasium VectorEnv"
    if inner is not env:
        return None, "it is wrapped (a wrapper may change what its slots see, which single envs would not)"
    spec = getattr(inner, "spec", None)
    if not isinstance(spec, EnvSpec) or spec.id not in gym.registry:
        return None, "it has no gymnasium spec of a registered id (it was not made by gym.make_vec)"
    kwargs = {k: v for k, v in dict(spec.kwargs).items() if k not in _VECTOR_KWARGS}
    limit = kwargs.pop("max_episode_steps", spec.max_episode_steps)
    return (lambda: gym.make(spec.id, max_episode_steps=limit, **kwargs)), f"gym.make({spec.id!r})"


def _pufferlib_single_maker(env: Any) -> tuple[Callable[..., Any] | None, str]:
    """A creator of pufferlib ``GymnasiumPufferEnv`` copies of a pufferlib vector env's driver env."""
    driver = getattr(env, "driver_env", None)
    inner = getattr(driver, "env", None)
    if inner is None or type(driver).__name__ != "GymnasiumPufferEnv":
        return None, "its driver env is not a pufferlib GymnasiumPufferEnv over a gymnasium env"
    import gymnasium as gym
    import pufferlib.emulation

    spec = getattr(inner, "spec", None)
    registered = spec is not None and getattr(spec, "id", None) in gym.registry

    def make_inner() -> Any:
        return gym.make(spec) if registered and spec is not None else copy.deepcopy(inner)

    try:
        make_inner().close()
    except Exception as error:  # any failure: no copies
        return None, f"its gymnasium env could not be remade or copied ({type(error).__name__}: {error})"

    def creator(*args: Any, buf: Any = None, seed: Any = 0, **kwargs: Any) -> Any:
        return pufferlib.emulation.GymnasiumPufferEnv(env=make_inner(), buf=buf, seed=seed)

    return creator, "pufferlib.vector.Serial over copies of its driver env"


def seeded_copies(source: VectorSource) -> tuple[SlotSource, list[Any]]:
    """Single envs standing for the slots of a vector env reset as a whole, each reset with its own seed.

    For what must play the episodes its seeds name (the validation episodes,
    :meth:`~populora.EnvInteractor.play`): ``source.num`` envs made from the
    vector env's own specification, as a source over the same slots:

    * a gymnasium vector env made by ``gym.make_vec`` (its native vector
      env, e.g. ``CartPoleVectorEnv``): ``gym.make(spec.id, **kwargs)`` with
      the kwargs it was made with, in a ``SyncVectorEnv`` whose sub-envs are
      reset one by one;
    * a pufferlib vector env (``Multiprocessing``): a ``pufferlib.vector.Serial``
      over ``GymnasiumPufferEnv`` copies of its driver env (pufferlib's
      observation layout kept).

    The copies must have the vector env's observation and action spaces.

    Returns:
        ``(source, created)``: the source over slots ``[source.start, source.stop)``
        and the env objects made (to close).

    Raises:
        InvalidTypeError: the vector env cannot be remade that way (the reason named).
    """
    if source.puffer:
        creator, how = _pufferlib_single_maker(source.raw)
    else:
        creator, how = _gymnasium_single_maker(source.raw)
    if creator is None:
        raise InvalidTypeError(f"no single envs can be made of it: {how}")
    if source.puffer:
        import pufferlib.vector

        made = pufferlib.vector.make(creator, num_envs=source.num, backend=pufferlib.vector.Serial)
        kind: type[SlotSource] = VectorSource
    else:
        from gymnasium.vector import SyncVectorEnv

        made = SyncVectorEnv([creator for _ in range(source.num)])
        kind = SubEnvSource
    with closing_on_failure() as undo:
        undo.callback(made.close)
        twin = kind(made, source.start, source.flatten, source.keys)
        if twin.layout.space != source.layout.space or twin.action_space != source.action_space:
            raise InvalidTypeError(
                f"the single envs made of it ({how}) have observation space "
                f"{twin.layout.space} and action space {twin.action_space}; the vector env "
                f"{source.layout.space} and {source.action_space}"
            )
    return twin, [made]
