"""The rollout loop: every ``(individual, episode)`` item of one call, played on the env slots.

:class:`Rollout` is the episode scheduler (which slot plays which item, when
a slot is reset, rounds of vector envs reset as a whole) and the loop (one
routed forward of the playing slots per timestep); :func:`policy_mode` sets
the model up for it. The scheme is described in
:mod:`populora.envs.interactor`.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, nullcontext
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn
from torch.utils._pytree import tree_map

from populora.envs.actions import ActionFn, ActionFormat
from populora.envs.normalize import ObsStatistics
from populora.envs.schedule import WorkQueue, vector_reset_seed
from populora.envs.slots import EnvSlots, EnvStepError, SlotFailure
from populora.errors import FitnessError
from populora.population.population import Population

__all__ = ["ONE_THREAD_WORK", "Rollout", "is_es_individuals", "policy_mode"]

ONE_THREAD_WORK = 1 << 22
"""Largest ``parameters x slots`` whose rollouts run the forward on one CPU thread (see
:mod:`populora.envs.interactor`)."""


def is_es_individuals(model: Any) -> bool:
    """Whether ``model`` is the handle of an ES generation (:meth:`~populora.EggrollES.ask`)."""
    from populora.es.members import Individuals  # the ES package imports nothing of interact

    return isinstance(model, Individuals)


def _device_of(model: Any) -> torch.device:
    if isinstance(model, nn.Module):
        for t in (*model.parameters(), *model.buffers()):
            return t.device
    return torch.device("cpu")


@contextmanager
def policy_mode(module: Any, device: torch.device, num_slots: int) -> Iterator[None]:
    """Eval mode, inference mode and (for a small policy on CPU) one intra-op thread; all restored after."""
    modes = [(m, m.training) for m in module.modules()] if isinstance(module, nn.Module) else []
    threads = torch.get_num_threads()
    params = sum(p.numel() for p in module.parameters()) if isinstance(module, nn.Module) else 0
    one_thread = device.type == "cpu" and threads > 1 and params * num_slots <= ONE_THREAD_WORK
    try:
        if one_thread:
            torch.set_num_threads(1)
        for m, _ in modes:
            m.train(False)
        with torch.inference_mode():  # env tensors too: the observation buffer is written in place
            yield
    finally:
        if one_thread:
            torch.set_num_threads(threads)
        for m, mode in modes:
            m.train(mode)


class Rollout:
    """Plays ``individuals`` x ``seeds`` episodes of ``model`` on ``slots``.

    Args:
        slots: the env slots.
        action_format: converts and checks the actions of one step.
        model: a :class:`~populora.Population` or the individuals of an ES
            generation (:meth:`~populora.EggrollES.ask`; routed forwards), or
            a plain policy (every slot plays it; ``individuals`` is then ``[0]``).
        individuals: the ids (rows of the returns).
        seeds: one reset seed per episode (every individual meets it), or a
            ``(k, E)`` array: row ``j`` the seeds of ``individuals[j]``.
        base_seed: seeds the whole-env resets of rounds when a vector env
            cannot reset one slot.
        action: maps the model's outputs of ``k`` slots to ``k`` actions.
        horizon: maximum steps of one episode (``None``: until the env ends it).
        to_range: ``(lo, hi)`` rescale of Box actions, or ``None``.
        stats: the observation statistics that normalise (``None``: raw observations).
        module: the ES's model, with ES individuals (``es.model``: its device and threads).

    Attributes:
        env_steps, timesteps: steps inside episodes and routed forwards so far.
    """

    def __init__(
        self,
        slots: EnvSlots,
        action_format: ActionFormat,
        model: Any,
        individuals: Sequence[int],
        *,
        seeds: Sequence[int] | np.ndarray,
        base_seed: int,
        action: ActionFn,
        horizon: int | None,
        to_range: tuple[Tensor, Tensor] | None,
        stats: ObsStatistics | None,
        module: nn.Module | None = None,
    ):
        self.slots, self.action_format, self.model = slots, action_format, model
        self.individuals, self.seeds, self.base_seed = individuals, seeds, base_seed
        self.action, self.horizon, self.to_range, self.stats = action, horizon, to_range, stats
        self.routed = isinstance(model, Population)
        self.es = not self.routed and is_es_individuals(model)
        self.routed = self.routed or self.es
        self.nan_raise = self.routed and getattr(model, "nan_policy", "raise") == "raise"
        self.device = model.device if isinstance(model, Population) else _device_of(module if self.es else model)
        k, n_slots = len(individuals), slots.num
        self.per_row = isinstance(seeds, np.ndarray) and seeds.ndim == 2
        num_episodes = seeds.shape[1] if isinstance(seeds, np.ndarray) and self.per_row else len(seeds)
        self.returns = np.full((k, num_episodes), np.nan)  # (k, E); NaN until played (or a NaN reward)
        self.queue = WorkQueue(k, num_episodes)
        self.ids = np.asarray(list(individuals), dtype=np.int64)
        self.row = np.full(n_slots, -1, dtype=np.int64)  # row of `individuals` played by each slot, -1: idle
        self.ep = np.zeros(n_slots, dtype=np.int64)  # episode played by each slot
        self.steps = np.zeros(n_slots, dtype=np.int64)  # steps taken in it
        self.ret = np.zeros(n_slots, dtype=np.float64)  # return so far
        self.every_slot = np.arange(n_slots, dtype=np.int64)
        self.rounds = 0
        self.env_steps = self.timesteps = 0

    # ------------------------------------------------------------------ messages

    def who(self, slot: int, step: int | None) -> str:
        """``'slot 3 (individual 7, episode 0, step 12)'``, for messages."""
        if self.row[slot] < 0:
            return f"slot {slot} (idle)"
        what = f"individual {self.individuals[self.row[slot]]}" if self.routed else "the policy"
        when = "" if step is None else f", step {step}"
        return f"slot {slot} ({what}, episode {self.ep[slot]}{when})"

    def failure(self, failure: SlotFailure) -> EnvStepError:
        """The error of a failed reset or step, naming (up to four of) its slots."""
        stepping = failure.what == "step"
        shown = ", ".join(self.who(s, int(self.steps[s]) + 1 if stepping else None) for s in failure.slots[:4])
        shown += " ..." if len(failure.slots) > 4 else ""
        cause = failure.cause
        return EnvStepError(f"env {failure.what} failed at {shown}: {type(cause).__name__}: {cause}")

    # ------------------------------------------------------------------ scheduling

    def start(self, free: np.ndarray) -> None:
        """Give the next work items to slots ``free`` (idle if none left) and reset them.

        With vector envs reset as a whole, freed slots idle until every slot
        is free; then a new round starts on all of them.
        """
        row, slots = self.row, self.slots
        if slots.round_based:
            row[free] = -1
            if (row >= 0).any():
                return
            free = self.every_slot
        take = self.queue.take
        new_rows, new_eps = [], []
        for _ in range(free.size):
            item = take()
            if item is None:  # the queue is empty (and stays so): the other free slots idle
                break
            new_rows.append(item[0])
            new_eps.append(item[1])
        row[free[len(new_rows) :]] = -1
        if not new_rows:
            return
        chosen = free[: len(new_rows)]
        row[chosen] = new_rows
        self.ep[chosen] = new_eps
        if self.per_row:
            assert isinstance(self.seeds, np.ndarray)  # a (k, E) table
            new_seeds = [int(s) for s in self.seeds[new_rows, new_eps].tolist()]
        else:
            new_seeds = [int(self.seeds[e]) for e in new_eps]
        self.steps[chosen] = 0
        self.ret[chosen] = 0.0
        whole = None
        if slots.round_based:
            whole = [vector_reset_seed(self.base_seed, self.rounds, v) for v in range(len(slots.whole_sources))]
            self.rounds += 1
        try:
            slots.reset(chosen, new_seeds, whole)
        except SlotFailure as failure:
            raise self.failure(failure) from failure.cause

    def playing(self) -> tuple[np.ndarray, dict[str, Any]]:
        """The playing slots, grouped by individual, and the routing argument of their forward.

        Grouped rows need no permutation in the routed forward, and rows of
        one individual (the tail of long episodes) go through the cheaper
        ``individual=i`` route (the same arithmetic). Recomputed only when an
        episode ended: while the same slots play, the same array goes back to
        the slots, which then hand back the observations of the last step
        without touching their buffer.
        """
        active = np.flatnonzero(self.row >= 0)
        if not self.routed or active.size == 0:
            return active, {}
        ids = self.ids[self.row[active]]
        if active.size > 1 and (ids[1:] < ids[:-1]).any():
            order = np.argsort(ids, kind="stable")
            active, ids = active[order], ids[order]
        if ids[0] == ids[-1]:
            return active, {"individual": int(ids[0])}
        return active, {"individuals": ids}  # host ids as they are (the route plan is made on the host)

    # ------------------------------------------------------------------ the loop

    def run(self) -> np.ndarray:
        """Play every item (call inside :func:`policy_mode`); the ``(k, E)`` float64 returns (NaN: NaN reward)."""
        slots, model, stats, device, action = self.slots, self.model, self.stats, self.device, self.action
        convert, to_range, routed = self.action_format.convert, self.to_range, self.routed
        fmt = self.action_format
        default = to_range is None and action == fmt.default_action  # the argmax needs no checks (see there)
        limit = self.horizon if self.horizon is not None else math.inf
        bounded = self.horizon is not None
        self.start(self.every_slot)
        active, route = self.playing()
        ret_a, steps_a = self.ret[active], self.steps[active]  # of the playing slots, in their order
        # timesteps until the longest-running playing episode reaches the horizon (all steps move together)
        due = limit - int(steps_a.max()) if bounded and active.size else math.inf
        env_steps = timesteps = 0
        # A population's forward through its loop route of the playing slots' assignment, made once per change
        # of it (its plans, and the prepared routes of routing.prepared, reused every timestep until an episode
        # ends): the routed forward without the front end's per-call work, the same outputs.
        blocks = routed and not self.es
        block = None
        try:
            while active.size:
                n_act = active.size
                obs = slots.take(active)
                if stats is not None:
                    stats.observe(obs)
                    obs = stats.normalizer(obs.to(device))
                if self.es:  # an ES generation: one row per playing slot, each routed to its individual
                    out = (
                        model(obs, **route)
                        if "individual" in route
                        else model(_one_per_individual(obs), **route, per_individual=True).squeeze(1)
                    )
                elif blocks and type(obs) is Tensor:
                    if block is None:
                        block = model.loop_route(**route)
                        blocks = block is not None  # (else calling the population does more: call it)
                    if block is None:
                        out = model(obs, **route)
                    else:
                        with block:
                            out = model.model(obs if device is None or obs.device == device else obs.to(device))
                elif routed:
                    out = model(obs, **route)
                else:
                    out = model(obs.to(device) if isinstance(obs, Tensor) else obs)
                acts = fmt.default_actions(out, n_act) if default else convert(action(out), n_act, to_range)
                try:
                    rewards, done = slots.step(acts, active)
                except SlotFailure as failure:
                    self.steps[active] = steps_a
                    raise self.failure(failure) from failure.cause
                timesteps += 1
                env_steps += n_act
                ret_a += rewards
                steps_a += 1
                due -= 1
                finished = done | (steps_a >= limit) if due <= 0 else done
                total = rewards.sum()  # one reduction to rule out NaN and inf rewards
                if not math.isfinite(total) and not (ok := np.isfinite(rewards)).all():
                    finished = finished | self._bad_rewards(rewards, ok, active, steps_a)
                if finished.any():
                    block = None
                    active, route, ret_a, steps_a = self._end(active, finished, ret_a, steps_a)
                    if bounded and active.size:
                        due = limit - int(steps_a.max())
        finally:
            self.env_steps += env_steps
            self.timesteps += timesteps
            if stats is not None:
                stats.fold()  # every rollout's observations summed at its end, however it ended
        return self.returns

    def _end(
        self, active: np.ndarray, finished: np.ndarray, ret_a: np.ndarray, steps_a: np.ndarray
    ) -> tuple[np.ndarray, dict[str, Any], np.ndarray, np.ndarray]:
        """Record the episodes that ``finished``, start the next items; the new playing slots and their state."""
        self.ret[active], self.steps[active] = ret_a, steps_a
        ended = active[finished]
        self.returns[self.row[ended], self.ep[ended]] = ret_a[finished]
        for r in self.row[ended].tolist():
            self.queue.finish(r)
        self.start(ended)
        active, route = self.playing()
        return active, route, self.ret[active], self.steps[active]

    def _bad_rewards(self, rewards: np.ndarray, ok: np.ndarray, active: np.ndarray, steps_a: np.ndarray) -> np.ndarray:
        """Handle NaN / inf rewards of one step: raise naming env, slot and individual, or end those episodes.

        A NaN or -inf reward raises under ``nan_policy='raise'`` (``'worst'``
        ranks such an individual lowest, so that advice works); with
        ``'worst'`` the episode ends there, its return NaN or -inf. A +inf
        reward always raises: no policy can rank an infinite fitness, so the
        advice is to bound the env's rewards.

        Returns:
            ``(n,)`` bool: the episodes that end because of their reward.
        """
        positive = rewards == math.inf
        if positive.any() or self.nan_raise:
            j = int(np.flatnonzero(positive)[0] if positive.any() else np.flatnonzero(~ok)[0])
            slot = int(active[j])
            self.steps[active] = steps_a
            value = "+inf" if positive[j] else ("-inf" if rewards[j] == -math.inf else "NaN")
            if positive[j]:
                advice = (
                    "an infinite fitness cannot be ranked under any nan_policy; bound the env's rewards, e.g. "
                    "gymnasium.wrappers.ClipReward(env, min_reward, max_reward), or end the episode in the env"
                )
            else:
                advice = (
                    "pass nan_policy='worst' to the Population (population_kwargs=dict(nan_policy='worst') in "
                    "evolve_with_env) to score such individuals lowest instead"
                )
            raise FitnessError(
                f"env {self.slots.describe(slot)} returned a {value} reward at "
                f"{self.who(slot, int(self.steps[slot]))}; {advice}"
            )
        return ~ok


def _one_per_individual(obs: Any) -> Any:
    """``(k, ..)`` observations (a tensor or a pytree of them) as ``(k, 1, ..)``: one row per ES individual."""
    if isinstance(obs, Tensor):
        return obs.unsqueeze(1)
    return tree_map(lambda t: t.unsqueeze(1) if isinstance(t, Tensor) else t, obs)


def play(
    slots: EnvSlots,
    action_format: ActionFormat,
    model: Any,
    individuals: Sequence[int],
    counters: dict[str, Any],
    **options: Any,
) -> Tensor:
    """Run a :class:`Rollout` (``options`` are its keyword arguments) and add to ``counters``; ``(k, E)`` float64."""
    rollout = Rollout(slots, action_format, model, individuals, **options)
    if rollout.returns.size == 0:
        return torch.from_numpy(rollout.returns)
    module = options.get("module") if rollout.es else model.model if rollout.routed else model
    started = time.perf_counter()
    # one evaluation, run start to end, is one scope of a population's prepared routes (routing.prepared):
    # what was written before it is seen, and nothing it prepared outlives it
    scope = model.prepared_scope() if isinstance(model, Population) else nullcontext()
    try:
        with policy_mode(module, rollout.device, slots.num), scope:
            returns = rollout.run()
    finally:
        counters["env_steps"] += rollout.env_steps
        counters["timesteps"] += rollout.timesteps
        counters["episodes"] += int(np.isfinite(rollout.returns).sum())
        counters["seconds"] += time.perf_counter() - started
    return torch.from_numpy(returns)
