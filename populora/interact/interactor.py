"""EnvInteractor: every individual of a population plays episodes in ``N`` env slots.

Scheduling: the ``(individual, episode)`` work items of this rank go into a
queue; each slot takes the next item as soon as its episode ends, so every
slot stays busy until the queue is empty. Every timestep is ONE routed
forward over the slots that are playing (``population(obs, individuals=ids)``).

Seeding: episode ``e`` of every individual in a generation starts from the
same seed, :func:`episode_seed` ``(population.eval_seed, e)`` (common random
numbers), and the slot is reset with it before the work item starts,
whatever the env's own autoreset does. Evaluation is therefore reproducible
and does not depend on which slot ran which episode.

Fitness of an individual is the mean return of its episodes (higher is
better). An episode ends when the env says terminated or truncated, or after
``horizon`` steps; rewards after the end are never counted, and no autoreset
step is ever taken inside an episode.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from ..errors import FitnessError
from ..population import Population
from .actions import ActionFn, ActionFormat, check_to_range
from .envs import EnvSlots, EnvStepError, SlotFailure, build_slots
from .normalize import ObsNormalizer, ObsStatistics
from .schedule import WorkQueue

__all__ = ["EnvInteractor", "episode_seed", "episode_seeds", "interact_with_env"]

_MASK64 = (1 << 64) - 1

ENV_INIT_SCALE = 1.0
"""Default ``init_scale`` of populations built for environments (see :meth:`EnvInteractor.population`)."""


def episode_seed(eval_seed: int, episode: int) -> int:
    """Reset seed of episode ``episode`` in the generation whose eval seed is ``eval_seed``.

    A splitmix64 mix of both numbers, cut to 31 bits (valid for gymnasium,
    numpy and dm_control). Every individual of a generation meets the same
    seeds; the next generation (``eval_seed + 1``) meets new ones.

    Example:
        >>> episode_seed(0, 0) == episode_seed(0, 0) != episode_seed(1, 0)
        True
    """
    z = (int(eval_seed) * 0x9E3779B97F4A7C15 + (int(episode) + 1) * 0xD1B54A32D192ED03) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return (z ^ (z >> 31)) >> 33


def episode_seeds(eval_seed: int, num_episodes: int) -> list[int]:
    """``[episode_seed(eval_seed, e) for e in range(num_episodes)]``."""
    return [episode_seed(eval_seed, e) for e in range(num_episodes)]


def _check_positive_int(name: str, value: Any, allow_none: bool = False) -> None:
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"`{name}` must be an int >= 1{' or None' if allow_none else ''}, got {value!r}")


class EnvInteractor:
    """Evaluates populations (or plain policies) on ``N`` environment slots.

    Build it with :func:`interact_with_env`. Slots must run the same
    environment (a seeded episode plays the same in every slot).

    Attributes:
        num_slots: ``N``, episodes that run at once on this rank.
        device: device of the populations built by :meth:`population`
            (``None``: Population's default).
        normalize_obs: whether observations are normalised (see
            :class:`~populora.interact.normalize.ObsNormalizer`).
        counters: cumulative ``env_steps`` (steps inside episodes),
            ``timesteps`` (routed forwards), ``episodes`` and ``seconds``
            spent in rollouts on this rank.
    """

    def __init__(
        self,
        slots: EnvSlots,
        *,
        device: str | torch.device | None = None,
        normalize_obs: bool = False,
        obs_clip: float = 10.0,
    ):
        self._slots = slots
        self.num_slots = slots.num
        self.device = torch.device(device) if device is not None else None
        self.normalize_obs = bool(normalize_obs)
        self.obs_clip = float(obs_clip)
        self.action_format = ActionFormat(slots.action_space)
        self._stats: ObsStatistics | None = None
        self.counters = {"env_steps": 0, "timesteps": 0, "episodes": 0, "seconds": 0.0}
        if self.normalize_obs:  # learn the observation size now, so every rank holds statistics from the start
            try:
                with torch.inference_mode():
                    slots.reset(np.zeros(1, dtype=np.int64), [0])
            except SlotFailure as failure:
                raise EnvStepError(f"env reset failed at slot 0: {type(failure.cause).__name__}: "
                                   f"{failure.cause}") from failure.cause
            obs = slots.obs
            if not isinstance(obs, Tensor) or obs.dim() != 2:
                raise TypeError("`normalize_obs=True` needs flat observations (leave `flatten_obs=True`)")
            self._stats = ObsStatistics(obs.shape[1], clip=self.obs_clip)

    def __repr__(self) -> str:
        return (f"EnvInteractor(num_slots={self.num_slots}, action_space={self.action_format.name}, "
                f"normalize_obs={self.normalize_obs})")

    # ------------------------------------------------------------------ building

    def population(
        self,
        backbone: nn.Module,
        pop_size: int,
        low_rank: int,
        lora_targets: str | Sequence[str] | None = None,
        **kwargs: Any,
    ) -> Population:
        """A :class:`~populora.Population` over ``backbone`` on the interactor's device.

        ``lora_targets=None`` targets every ``nn.Linear``; ``kwargs`` go to
        the Population constructor (``seed``, ``nan_policy``, ...). The
        default ``init_scale`` here is :data:`ENV_INIT_SCALE` (1.0, not the
        Population's 0.1): evolving against an environment usually starts from
        an untrained model, and individuals must act differently at generation
        0 for selection to see anything (with 0.1 they all take the same
        actions). Pass ``init_scale=`` to choose, e.g. 0 for a pretrained policy.
        """
        if self.device is not None:
            kwargs.setdefault("device", self.device)
        kwargs.setdefault("init_scale", ENV_INIT_SCALE)
        return Population(backbone, pop_size, low_rank, lora_targets, **kwargs)

    # ------------------------------------------------------------------ normalisation

    @property
    def normalizer(self) -> ObsNormalizer | None:
        """The frozen observation normaliser in use (``None`` until the first episode, or when off)."""
        return None if self._stats is None else self._stats.normalizer

    def normalizer_state(self) -> dict[str, Any] | None:
        """State of the observation statistics, for checkpoints (``None`` when not normalising)."""
        return None if self._stats is None else self._stats.state_dict()

    def load_normalizer_state(self, state: dict[str, Any] | None) -> None:
        """Restore :meth:`normalizer_state`."""
        if state is None:
            self._stats = None
            return
        mean = state["normalizer"]["mean"]
        self._stats = ObsStatistics(mean.numel(), clip=state["clip"])
        self._stats.load_state_dict(state)

    def wrap_policy(self, model: nn.Module) -> nn.Module:
        """``model`` itself, or ``nn.Sequential(frozen normaliser copy, model)`` when normalising."""
        if self._stats is None:
            return model
        norm = ObsNormalizer(self._stats.normalizer.mean.numel(), clip=self._stats.normalizer.clip)
        norm.load_state_dict(self._stats.normalizer.state_dict())
        device = next((t.device for t in (*model.parameters(), *model.buffers())), torch.device("cpu"))
        return nn.Sequential(norm.to(device), model)

    # ------------------------------------------------------------------ evaluation

    def evaluate(
        self,
        population: Population,
        action: ActionFn | None = None,
        horizon: int | None = None,
        num_episodes: int = 1,
        *,
        fitness: Callable[..., Any] | None = None,
        to_range: tuple[Any, Any] | None = None,
    ) -> Tensor:
        """Fitness of every individual: the mean return of its ``num_episodes`` episodes.

        Higher fitness is better. Under torch.distributed each rank plays its
        share of the individuals on its own slots and the ``(P,)`` fitness is
        all-gathered, the same on every rank. A NaN reward raises (naming the
        slot, individual, episode and step) when the population's
        ``nan_policy`` is ``'raise'``; with ``'worst'`` that individual's
        fitness is NaN, which ``evolve_`` ranks lowest.

        Args:
            population: the population to evaluate.
            action: ``action(outputs) -> actions`` maps the routed outputs of
                ``k`` slots to ``k`` env actions; default ``argmax(-1)`` for a
                Discrete space, the outputs themselves otherwise. A ``(k,)``
                action for a 1-dim Box is reshaped to ``(k, 1)``.
            horizon: maximum steps of one episode; ``None`` lets the env end
                it (set it for envs without a time limit).
            num_episodes: episodes per individual (common random numbers:
                episode ``e`` has the same seed for everyone).
            fitness: a custom fitness instead of the episode return, in any of
                the three signatures ``fn(population, individuals=...)``,
                ``fn(population, idx)`` or ``fn(population)``; the episode
                arguments are then unused.
            to_range: ``(lo, hi)``: rescale Box actions from ``(-1, 1)`` to it.

        Returns:
            ``(P,)`` float32 fitness on the population's device.

        Raises:
            ValueError / TypeError: bad arguments or actions (before any episode runs).
            EnvStepError: an env raised while resetting or stepping.
            FitnessError: a NaN reward under ``nan_policy='raise'``.
        """
        _check_population(population)
        if fitness is not None:
            from ..fitness import fitness_kind

            fitness_kind(fitness)  # TypeError before anything runs
            self.update_obs_stats(population)
            return population.evaluate_distributed(fitness)
        run = self._prepare(action, horizon, num_episodes, to_range)
        self.update_obs_stats(population)

        def rollouts(pop: Population, individuals: list[int]) -> Tensor:
            returns = self._play(pop, individuals, seeds=episode_seeds(pop.eval_seed, num_episodes), **run)
            return returns.mean(dim=1)

        return population.evaluate_distributed(rollouts)

    def episode_returns(
        self,
        population: Population,
        individuals: Sequence[int] | Tensor,
        action: ActionFn | None = None,
        horizon: int | None = None,
        num_episodes: int = 1,
        *,
        to_range: tuple[Any, Any] | None = None,
    ) -> Tensor:
        """Returns of ``individuals`` (this process only, no communication): ``(k, num_episodes)`` float64.

        Episode ``e`` uses :func:`episode_seed` ``(population.eval_seed, e)``,
        as in :meth:`evaluate`; handy inside a custom fitness function. With
        ``normalize_obs`` the observations seen here count towards the next
        generation's statistics (only :meth:`evaluate` moves them forward).
        """
        _check_population(population)
        run = self._prepare(action, horizon, num_episodes, to_range)
        ids_t = torch.as_tensor(individuals)
        if ids_t.dim() != 1 or ids_t.is_floating_point() or ids_t.dtype == torch.bool:
            raise ValueError(f"`individuals` must be a 1-D list or integer tensor of ids, got {individuals!r}")
        ids = ids_t.tolist()
        bad = [i for i in ids if not 0 <= i < population.pop_size]
        if bad:
            raise ValueError(f"`individuals` holds id {bad[0]}, out of range [0, {population.pop_size})")
        return self._play(population, ids, seeds=episode_seeds(population.eval_seed, num_episodes), **run)

    def play(
        self,
        policy: nn.Module | Callable[[Tensor], Any],
        action: ActionFn | None = None,
        horizon: int | None = None,
        num_episodes: int = 1,
        *,
        seed: int = 0,
        to_range: tuple[Any, Any] | None = None,
    ) -> Tensor:
        """Returns of a plain policy (e.g. the evolved one) over ``num_episodes`` episodes: ``(E,)`` float64.

        Episode ``e`` starts from :func:`episode_seed` ``(seed, e)``; pick a
        ``seed`` far from the population's eval seeds for fresh episodes. The
        policy gets raw observations (an evolved policy carries its
        normaliser) and runs in ``torch.inference_mode()``.
        """
        if not callable(policy):
            raise TypeError(f"`policy` must be callable (an nn.Module), got {type(policy).__name__}")
        run = self._prepare(action, horizon, num_episodes, to_range)
        run["normalize"] = False
        return self._play(policy, [0], seeds=episode_seeds(seed, num_episodes), **run)[0]

    def close(self) -> None:
        """Close the environments the interactor made from a factory."""
        self._slots.close()

    # ------------------------------------------------------------------ the loop

    def _prepare(self, action: Any, horizon: Any, num_episodes: Any, to_range: Any) -> dict[str, Any]:
        if action is not None and not callable(action):
            raise TypeError(f"`action` must be a callable mapping model outputs to env actions, got {action!r}")
        _check_positive_int("horizon", horizon, allow_none=True)
        _check_positive_int("num_episodes", num_episodes)
        bounds = check_to_range(to_range, self.action_format)
        return {"action": action or self.action_format.default_action, "horizon": horizon,
                "to_range": bounds, "normalize": self.normalize_obs}

    def _play(
        self,
        model: Any,
        individuals: Sequence[int],
        *,
        seeds: Sequence[int],
        action: ActionFn,
        horizon: int | None,
        to_range: tuple[Tensor, Tensor] | None,
        normalize: bool,
    ) -> Tensor:
        """Play every ``(individual, episode)`` item; ``(k, E)`` float64 returns (NaN: NaN reward)."""
        routed = isinstance(model, Population)
        k, num_ep = len(individuals), len(seeds)
        returns = np.full((k, num_ep), np.nan)
        if k == 0:
            return torch.from_numpy(returns)
        slots, fmt, n_slots = self._slots, self.action_format, self.num_slots
        nan_raise = routed and model.nan_policy == "raise"
        device = model.device if routed else _device_of(model)
        ids_np = np.asarray(list(individuals), dtype=np.int64)
        queue = WorkQueue(k, num_ep)
        row = np.full(n_slots, -1, dtype=np.int64)  # row of `individuals` played by each slot, -1: idle
        ep = np.zeros(n_slots, dtype=np.int64)
        steps = np.zeros(n_slots, dtype=np.int64)
        ret = np.zeros(n_slots, dtype=np.float64)
        limit = horizon if horizon is not None else math.inf
        bounded = horizon is not None
        module = model.model if routed else model
        modes = [(m, m.training) for m in module.modules()] if isinstance(module, nn.Module) else []
        started = time.perf_counter()
        env_steps = timesteps = 0

        def who(slot: int, step: int | None) -> str:
            if row[slot] < 0:
                return f"slot {slot} (idle)"
            what = f"individual {individuals[row[slot]]}" if routed else "the policy"
            when = "" if step is None else f", step {step}"
            return f"slot {slot} ({what}, episode {ep[slot]}{when})"

        def fail(failure: SlotFailure) -> EnvStepError:
            stepping = failure.what == "step"
            shown = ", ".join(who(s, int(steps[s]) + 1 if stepping else None) for s in failure.slots[:4])
            shown += " ..." if len(failure.slots) > 4 else ""
            cause = failure.cause
            return EnvStepError(f"env {failure.what} failed at {shown}: {type(cause).__name__}: {cause}")

        def start(free: np.ndarray) -> None:
            """Give the next work items to slots ``free`` (idle if none left) and reset them."""
            new, new_seeds = [], []
            for slot in free.tolist():
                item = queue.take()
                if item is None:
                    row[slot] = -1
                    continue
                row[slot], ep[slot] = item
                new.append(slot)
                new_seeds.append(seeds[item[1]])
            if new:
                chosen = np.asarray(new, dtype=np.int64)
                steps[chosen] = 0
                ret[chosen] = 0.0
                try:
                    slots.reset(chosen, new_seeds)
                except SlotFailure as failure:
                    raise fail(failure) from failure.cause

        def playing() -> tuple[np.ndarray, dict[str, Any]]:
            """The playing slots, grouped by individual, and the routing argument of their forward.

            Grouped rows need no permutation in the routed forward, and rows of
            one individual (the tail of long episodes) go through the cheaper
            ``individual=i`` route (the same arithmetic). Recomputed only when
            an episode ended: while the same slots play, the same array goes
            back to the slots, which then hand back the observations of the
            last step without touching their buffer.
            """
            active = np.flatnonzero(row >= 0)
            if not routed or active.size == 0:
                return active, {}
            ids = ids_np[row[active]]
            if active.size > 1 and (ids[1:] < ids[:-1]).any():
                order = np.argsort(ids, kind="stable")
                active, ids = active[order], ids[order]
            if ids[0] == ids[-1]:
                return active, {"individual": int(ids[0])}
            return active, {"individuals": torch.from_numpy(ids)}

        stats = self._stats if normalize else None
        try:
            for m, _ in modes:
                m.train(False)
            with torch.inference_mode():  # env tensors too: the observation buffer is written in place
                start(np.arange(n_slots, dtype=np.int64))
                active, route = playing()
                ret_a, steps_a = ret[active], steps[active]  # of the playing slots, in their order
                while active.size:
                    n_act = active.size
                    obs = slots.take(active)
                    if stats is not None:
                        stats.observe(obs)
                        obs = stats.normalizer(obs.to(device))
                    if routed:
                        out = model(obs, **route)
                    else:
                        out = model(obs.to(device) if isinstance(obs, Tensor) else obs)
                    acts = fmt.convert(action(out), n_act, to_range)
                    try:
                        rewards, done = slots.step(acts, active)
                    except SlotFailure as failure:
                        steps[active] = steps_a
                        raise fail(failure) from failure.cause
                    timesteps += 1
                    env_steps += n_act
                    ret_a += rewards
                    steps_a += 1
                    finished = done | (steps_a >= limit) if bounded else done
                    total = rewards.sum()  # one reduction to rule out NaN rewards (NaN also for inf - inf)
                    if total != total and (bad := np.isnan(rewards)).any():
                        if nan_raise:
                            steps[active] = steps_a
                            first_bad = int(active[np.flatnonzero(bad)[0]])
                            raise FitnessError(
                                f"env returned a NaN reward at {who(first_bad, int(steps[first_bad]))}; pass nan_policy='worst' to "
                                "the Population to score such individuals lowest instead"
                            )
                        finished = finished | bad
                    if finished.any():
                        ret[active], steps[active] = ret_a, steps_a
                        ended = active[finished]
                        returns[row[ended], ep[ended]] = ret_a[finished]
                        for r in row[ended].tolist():
                            queue.finish(r)
                        start(ended)
                        active, route = playing()
                        ret_a, steps_a = ret[active], steps[active]
        finally:
            for m, mode in modes:
                m.train(mode)
            self.counters["env_steps"] += env_steps
            self.counters["timesteps"] += timesteps
            self.counters["episodes"] += int(np.isfinite(returns).sum())
            self.counters["seconds"] += time.perf_counter() - started
        return torch.from_numpy(returns)

    def update_obs_stats(self, population: Population) -> None:
        """Fold the observations of past generations into the normaliser if ``population.generation`` moved.

        :meth:`evaluate` calls it first; it may all-reduce, so every rank must
        call it at the same points. A no-op without ``normalize_obs``.
        """
        if self._stats is not None:
            self._stats.advance(population.generation)


def _check_population(population: Any) -> None:
    if not isinstance(population, Population):
        raise TypeError(f"`population` must be a populora Population, got {type(population).__name__}")


def _device_of(model: Any) -> torch.device:
    if isinstance(model, nn.Module):
        for t in (*model.parameters(), *model.buffers()):
            return t.device
    return torch.device("cpu")


def interact_with_env(
    envs: Any,
    device: str | torch.device | None = None,
    *,
    num_envs: int | None = None,
    flatten_obs: bool = True,
    normalize_obs: bool = False,
    obs_clip: float = 10.0,
) -> EnvInteractor:
    """Build an :class:`EnvInteractor` over ``envs``.

    Args:
        envs: one env, a list of envs, a vector env (gymnasium
            ``SyncVectorEnv`` / ``AsyncVectorEnv`` or any env-ssl-wrapper
            vector env with ``reset_at``), or a factory (a callable returning
            one env, an env class, or a gymnasium id string) with
            ``num_envs``. Any simulator env-ssl-wrapper adapts works
            (gymnasium, dm_control, ...). The same object listed several
            times is one slot (with a warning).
        device: where :meth:`EnvInteractor.population` puts populations.
        num_envs: how many envs a factory makes.
        flatten_obs: concatenate dict / tuple observations into one float
            vector (dm_control's ``position`` + ``velocity`` -> 5 numbers).
        normalize_obs: normalise observations with running statistics,
            frozen within a generation and updated between generations
            (synchronised across ranks).
        obs_clip: bound of normalised observations.

    Returns:
        the interactor (``num_slots`` episodes run at once).

    Raises:
        ValueError: an empty list, ``num_envs`` missing for a factory.
        TypeError: a list entry that is not an env.
    """
    if normalize_obs and not flatten_obs:
        raise ValueError("`normalize_obs=True` needs `flatten_obs=True` (it normalises one observation vector)")
    slots = build_slots(envs, num_envs=num_envs, flatten_obs=flatten_obs)
    try:
        return EnvInteractor(slots, device=device, normalize_obs=normalize_obs, obs_clip=obs_clip)
    except BaseException:
        slots.close()  # the envs a factory made would otherwise leak
        raise
