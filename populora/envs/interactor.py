"""EnvInteractor: every individual of a population plays episodes in ``N`` env slots.

Scheduling: the ``(individual, episode)`` work items of this rank go into a
queue; each slot takes the next item as soon as its episode ends, so every
slot stays busy until the queue is empty. Every timestep is ONE routed
forward over the slots that are playing (``population(obs, individuals=ids)``).

Seeding: episode ``e`` of every individual in a generation starts from the
same seed, :func:`episode_seed` ``(population.eval_seed, e)`` (common random
numbers), and the slot is reset with it before the work item starts,
whatever the env's own autoreset does. Evaluation is therefore reproducible:
the same seed, population, number of slots and ranks give the same returns,
bitwise.

Slot count and rounding: which slot runs an episode does not change its
start, but the actions come from one batched forward over the slots playing
at each step, and a batch of another size (another number of slots, other
episodes alongside) may round the last bit of an output differently (about
``1e-7`` relative; a plain torch loop over the rows does the same). Most
envs never notice; a chaotic simulator amplifies it over an episode:
HalfCheetah-v5's generation-0 returns moved by up to 67 between one env and
a list of 4. Compare runs made with the same number of slots and ranks.

Replay check: before its first episode the interactor resets its first slot
:data:`~populora.envs.slots.REPLAY_RUNS` times with one seed and plays
the same few random actions; if the observations, rewards or ends differ
(an env that ignores ``reset(seed=)``, as envpool does, or one that does not
replay an episode from its seed, as Box2D's BipedalWalker does on its third
reset) one warning names the env: its episodes are then not reproducible
from their seeds.

Vector envs that cannot reset one slot with a seed (gymnasium's native
``CartPoleVectorEnv`` from ``gym.make_vec('CartPole-v1', num_envs=4)``, or
any ``VectorEnv`` whose slots share one random generator) are played in
**rounds** instead: at the start of round ``j`` of a generation the whole
vector env is reset once, with :func:`vector_reset_seed`
``(population.eval_seed, j, v)`` (``v`` numbers such vector envs in slot
order, 0 for a single one), the next ``N`` work items of the queue take its
slots ``0..N-1``, and the round lasts until every one of them ended; slots
whose episode ended idle (the env steps them and autoresets them in
``NEXT_STEP`` / ``SAME_STEP`` mode, resets them unseeded in ``DISABLED``
mode) and none of those steps counts, in the fitness or in ``env_steps``.
Such a run is reproducible (the same seed, population, number of slots and
ranks give the same fitness), but the individuals of a generation do not
meet the same starting states: which state an episode starts from depends
on its round and slot.

What names its episodes by their seeds plays exactly those, on any env
form: :meth:`EnvInteractor.play`, ``episode_returns(seeds=...)`` and the
validation episodes of :func:`~populora.evolve_with_env` (fixed, apart from
training). On a vector env reset as a whole they run on single envs made
from its specification (:meth:`EnvInteractor.seeded_slots`: a gymnasium
``make_vec`` env's spec, a pufferlib env's driver env), each reset with
``reset(seed=s)`` as a plain loop would; a vector env that cannot be remade
so is refused there, naming it and what to pass instead (a list of envs or
a factory; ``Validation(episodes=0)``). ale-py's ``AtariVectorEnv`` resets
one slot with a seed itself (a masked reset), so it plays no rounds.

Threads: on CPU, while episodes play, a small policy (parameters x slots
at most :data:`ONE_THREAD_WORK`) runs its per-timestep forward on one
intra-op thread (the previous ``torch.get_num_threads()`` is restored
afterwards): env steps run one after the other anyway, and with other
processes on the cores the thread pool's synchronisation costs more than
such a forward (measured on a shared 2-core machine: 27 ms instead of well
under 1 ms per routed forward of 16 rows through a 5-32-2 MLP).

Fitness of an individual is the mean return of its episodes (higher is
better). An episode ends when the env says terminated or truncated, or after
``horizon`` steps; rewards after the end are never counted, and no autoreset
step is ever taken inside an episode.
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from populora.checks import check_one_of, check_seed
from populora.envs.actions import ActionFn, ActionFormat, check_to_range
from populora.envs.normalize import ObsNormalizer, ObsStatistics
from populora.envs.rollout import ONE_THREAD_WORK, play
from populora.envs.schedule import (
    EPISODE_SEEDINGS,
    REPORTING_STREAM,
    episode_seed,
    episode_seeds,
    stream_seeds,
    training_seeds,
    vector_reset_seed,
)
from populora.envs.slots import EnvSlots, EnvStepError, SlotFailure, build_slots, caller_stacklevel
from populora.errors import CheckpointError, InvalidIndexError, InvalidTypeError, InvalidValueError
from populora.fitness import fitness_kind
from populora.population.population import Population
from populora.transaction import closing_on_failure

__all__ = [
    "ENV_INIT_SCALE",
    "ONE_THREAD_WORK",
    "EnvInteractor",
    "episode_seed",
    "episode_seeds",
    "interact_with_env",
    "vector_reset_seed",
]

ENV_INIT_SCALE = 1.0
"""Default ``init_scale`` of populations built for environments (see :meth:`EnvInteractor.population`)."""


def _check_positive_int(name: str, value: Any, allow_none: bool = False) -> None:
    if value is None and allow_none:
        return
    value = value.item() if isinstance(value, (np.integer, Tensor)) and np.ndim(value) == 0 else value
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidTypeError(f"`{name}` must be an int >= 1{' or None' if allow_none else ''}, got {value!r}")
    if value < 1:
        raise InvalidValueError(f"`{name}` must be an int >= 1{' or None' if allow_none else ''}, got {value!r}")


class EnvInteractor:
    """Evaluates populations (or plain policies) on ``N`` environment slots.

    Build it with :func:`interact_with_env`. Slots must run the same
    environment (a seeded episode plays the same in every slot).

    Attributes:
        num_slots: ``N``, episodes that run at once on this rank.
        device: device of the populations built by :meth:`population`
            (``None``: Population's default).
        normalize_obs: whether observations are normalised (see
            :class:`~populora.envs.normalize.ObsNormalizer`).
        counters: cumulative ``env_steps`` (steps inside episodes),
            ``timesteps`` (routed forwards), ``episodes`` and ``seconds``
            spent in rollouts on this rank; ``check_steps``: the steps of
            the replay check (:meth:`check_replay`), outside any episode.
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
        self.counters = {"env_steps": 0, "timesteps": 0, "episodes": 0, "seconds": 0.0, "check_steps": 0}
        self._seeded: EnvSlots | None = None  # slots that reset one by one, for seeds that name episodes
        self._replay_checked = False
        self._replay_problem: str | None = None
        if self.normalize_obs:  # learn the observation size now, so every rank holds statistics from the start
            try:
                with torch.inference_mode():
                    slots.reset(np.zeros(1, dtype=np.int64), [0], [0] * len(slots.whole_sources) or None)
            except SlotFailure as failure:
                raise EnvStepError(
                    f"env reset failed at slot 0: {type(failure.cause).__name__}: {failure.cause}"
                ) from failure.cause
            obs = slots.obs
            if not isinstance(obs, Tensor) or obs.dim() != 2:
                raise InvalidTypeError("`normalize_obs=True` needs flat observations (leave `flatten_obs=True`)")
            self._stats = ObsStatistics(obs.shape[1], clip=self.obs_clip)

    def __repr__(self) -> str:
        return (
            f"EnvInteractor(num_slots={self.num_slots}, action_space={self.action_format.name}, "
            f"normalize_obs={self.normalize_obs})"
        )

    # ------------------------------------------------------------------ building

    def population(
        self,
        backbone: nn.Module,
        pop_size: int,
        low_rank: int,
        lora_targets: str | re.Pattern[str] | Sequence[str | re.Pattern[str]] | None = None,
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

    # ------------------------------------------------------------------ state

    def state_dict(self) -> dict[str, Any]:
        """A snapshot (copies) of the state evaluation depends on: ``{'obs_stats': ...}``.

        ``obs_stats`` is the observation statistics' state
        (:meth:`~populora.envs.normalize.ObsStatistics.state_dict`), or
        ``None`` without ``normalize_obs``. The envs and the ``counters`` are
        not part of it.
        """
        return {"obs_stats": None if self._stats is None else self._stats.state_dict()}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore :meth:`state_dict`; everything is checked before anything is written.

        Raises:
            CheckpointError: not such a dict, statistics given to an
                interactor without ``normalize_obs`` (or none to one with it),
                or statistics of another observation size.
        """
        if not isinstance(state, Mapping) or "obs_stats" not in state:
            raise CheckpointError(
                f"an EnvInteractor state must be a dict with 'obs_stats' (from state_dict()), got {state!r:.80}"
            )
        saved = state["obs_stats"]
        if (saved is None) != (self._stats is None):
            raise CheckpointError(
                f"the state holds {'no ' if saved is None else ''}observation statistics; this "
                f"interactor has normalize_obs={self.normalize_obs}"
            )
        if saved is not None and self._stats is not None:  # both or neither (checked above)
            self._stats.load_state_dict(saved)  # checked first, then written

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
        episode_seeding: str = "common",
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
            num_episodes: episodes per individual.
            episode_seeding: ``'common'`` (common random numbers: episode
                ``e`` has the same seed for everyone) or ``'independent'``
                (each individual its own episodes; see
                :func:`~populora.envs.schedule.training_seeds`).
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
            fitness_kind(fitness)  # TypeError before anything runs
            self.update_obs_stats(population)
            return population.evaluate_distributed(fitness)
        run = self._prepare(action, horizon, num_episodes, to_range)
        seeding = check_one_of("episode_seeding", episode_seeding, EPISODE_SEEDINGS)
        self.update_obs_stats(population)

        def rollouts(pop: Population, individuals: list[int]) -> Tensor:
            seeds = training_seeds(pop.eval_seed, list(individuals), num_episodes, seeding)
            returns = self._play(pop, individuals, seeds=seeds, base_seed=pop.eval_seed, **run)
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
        seeds: Sequence[int] | None = None,
    ) -> Tensor:
        """Returns of ``individuals`` (this process only, no communication): ``(k, num_episodes)`` float64.

        Episode ``e`` uses :func:`episode_seed` ``(population.eval_seed, e)``,
        as in :meth:`evaluate` (or ``seeds[e]`` when ``seeds`` is given, then
        ``num_episodes`` is ``len(seeds)``, each episode started from
        ``reset(seed=seeds[e])`` on any env form, see :meth:`seeded_slots`); handy inside a custom fitness
        function. With
        ``normalize_obs`` the observations seen here count towards the next
        generation's statistics (only :meth:`evaluate` moves them forward).
        """
        _check_population(population)
        if seeds is not None:
            seeds, num_episodes = _check_seeds(seeds), len(seeds)
        run = self._prepare(action, horizon, num_episodes, to_range)
        ids_t = torch.as_tensor(individuals)
        if ids_t.dim() != 1 or ids_t.is_floating_point() or ids_t.dtype == torch.bool:
            raise InvalidTypeError(f"`individuals` must be a 1-D list or integer tensor of ids, got {individuals!r}")
        ids = ids_t.tolist()
        bad = [i for i in ids if not 0 <= i < population.pop_size]
        if bad:
            raise InvalidIndexError(f"`individuals` holds id {bad[0]}, out of range [0, {population.pop_size})")
        exact = "episode_returns(seeds=...)" if seeds is not None else False
        if seeds is None:
            seeds = episode_seeds(population.eval_seed, num_episodes)
        return self._play(population, ids, seeds=seeds, base_seed=population.eval_seed, exact=exact, **run)

    def play(
        self,
        policy: nn.Module | Callable[[Tensor], Any],
        action: ActionFn | None = None,
        horizon: int | None = None,
        num_episodes: int = 1,
        *,
        seed: int = 0,
        to_range: tuple[Any, Any] | None = None,
        seeds: Sequence[int] | None = None,
    ) -> Tensor:
        """Play ``policy`` on ``num_episodes`` fresh episodes; their returns, ``(E,)`` float64.

        The documented way to judge an evolved policy (and to write a custom
        loop): the policy, e.g. ``evolve_with_env(...).policy``, gets raw
        observations (an evolved policy carries its normaliser), runs in
        ``torch.inference_mode()`` with the interactor's slot scheduler, and
        every episode ends as in :meth:`evaluate` (env end or ``horizon``).

        Episode ``e`` starts from reporting seed ``e`` of ``seed``
        (:func:`~populora.envs.schedule.stream_seeds` with
        :data:`~populora.envs.schedule.REPORTING_STREAM`): a stream apart
        from the training and validation episodes of a run seeded ``seed``,
        so the episodes are fresh for it. ``seeds=[...]`` plays exactly those
        reset seeds instead (``num_episodes`` is then ``len(seeds)``): each
        episode starts from ``reset(seed=s)`` as a plain loop's would, also on
        a vector env reset as a whole (on single envs made from its spec, see
        :meth:`seeded_slots`; one that cannot be remade so raises, naming it).

        Example::

            policy, history = evolve_with_env('CartPole-v1', model, 64, 4, seed=0)
            with interact_with_env('CartPole-v1') as interactor:
                returns = interactor.play(policy, num_episodes=20)   # (20,) float64
        """
        if not callable(policy):
            raise InvalidTypeError(f"`policy` must be callable (an nn.Module), got {type(policy).__name__}")
        seed = check_seed("seed", seed)
        if seeds is not None:
            seeds, num_episodes = _check_seeds(seeds), len(seeds)
        run = self._prepare(action, horizon, num_episodes, to_range)
        run["normalize"] = False
        what = "play(seeds=...)" if seeds is not None else "play()"
        if seeds is None:
            seeds = stream_seeds(seed, REPORTING_STREAM, num_episodes)
        return self._play(policy, [0], seeds=seeds, base_seed=seed, exact=what, **run)[0]

    def __enter__(self) -> EnvInteractor:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self) -> None:
        """Close the environments the interactor made (from a factory, or the single envs of :meth:`seeded_slots`)."""
        self._slots.close()
        if self._seeded is not None:
            self._seeded.close()
            self._seeded = None

    def seeded_slots(self, what: str = "playing given reset seeds") -> EnvSlots:
        """The slots that play episodes by their reset seeds: every slot reset with its own seed.

        The interactor's own slots, unless a vector env among them resets only
        as a whole (:attr:`EnvSlots.round_based`, which plays rounds seeded
        apart from the episodes' seeds): then, once, slots where that vector
        env is replaced by single envs made from its specification (gymnasium
        ``make_vec``'s spec, pufferlib's driver env; see
        :func:`~populora.envs.vector.seeded_copies`). :meth:`play`, the
        ``seeds=`` of :meth:`episode_returns` and the validation of
        :func:`~populora.evolve_with_env` play on these.

        Args:
            what: what needs them, for the error message.

        Raises:
            InvalidTypeError: such a vector env cannot be remade as single
                envs; the message names it and what to pass instead.
        """
        slots = self._slots
        if not slots.round_based:
            return slots
        if self._seeded is None:
            try:
                self._seeded = slots.seeded_twin()
            except InvalidTypeError as error:
                raise InvalidTypeError(
                    f"{what} plays the episodes its reset seeds name, but the vector env "
                    f"{slots.describe(slots.sources[slots.whole_sources[0]].start)} resets only as a whole (no "
                    f"seeded reset of one slot), and {error}; pass a list of envs or a factory (e.g. "
                    "`lambda: gym.make(...)`), or a gymnasium SyncVectorEnv (gym.make_vec(..., "
                    "vectorization_mode='sync'))"
                    + (", or turn validation off (Validation(episodes=0))" if "valid" in what else "")
                ) from None
        return self._seeded

    def check_replay(self) -> str | None:
        """Whether the env replays an episode from its reset seed; what went wrong, or ``None``.

        Runs by itself before the interactor's first episode (once): the first
        slot is reset :data:`~populora.envs.slots.REPLAY_RUNS` times with
        one seed and plays the same few random actions (see
        :meth:`EnvSlots.replay_problem`); if the observations, rewards or ends
        differ, one ``UserWarning`` names the env. Its steps (at most 24 per
        slot compared) are counted in ``counters['check_steps']``, not in
        ``env_steps`` (they are in no episode). Calling it first runs it now;
        later calls return the first answer.
        """
        if self._replay_checked:
            return self._replay_problem
        self._replay_checked = True
        with torch.inference_mode():
            problem, steps = self._slots.replay_problem(self._slots.action_space)
        self.counters["check_steps"] += steps
        self._replay_problem = problem
        if problem is not None:
            warnings.warn(
                f"env {self._slots.describe(0)} does not replay an episode from its reset seed: {problem}. Episodes "
                "are then not reproducible from their seeds: the individuals of a generation do not meet the same "
                "episodes (common random numbers), validated scores of different generations are not comparable, "
                "play(seeds=...) plays other episodes each time and a run is not reproducible from its seed",
                UserWarning,
                stacklevel=caller_stacklevel(),
            )
        return problem

    # ------------------------------------------------------------------ rollouts

    def play_episodes(
        self,
        model: Any,
        individuals: Sequence[int],
        seeds: Sequence[int] | np.ndarray,
        *,
        action: ActionFn | None = None,
        horizon: int | None = None,
        to_range: tuple[Any, Any] | None = None,
        base_seed: int = 0,
        normalize: bool = True,
        module: nn.Module | None = None,
        exact: bool = False,
    ) -> Tensor:
        """Play each ``(individual, episode seed)`` item; the returns, ``(k, E)`` float64 (NaN: a NaN reward).

        The building block of :meth:`evaluate`, the validation of
        :func:`~populora.evolve_with_env` and the ES loop: individual
        ``individuals[j]`` plays the episodes reset with ``seeds[e]`` (or
        ``seeds[j, e]`` for a ``(k, E)`` array: its own episodes), all items on
        the interactor's slots, one routed forward per timestep.

        Args:
            model: a routed model (a :class:`~populora.Population`, an ES
                generation's individuals) or a plain policy (``individuals=[0]``).
            individuals: ``(k,)`` ids of ``model``.
            seeds: ``(E,)`` reset seeds shared by the individuals, or ``(k, E)``.
            action, horizon, to_range: as in :meth:`evaluate`.
            base_seed: seeds the slots' action sampling and the envs a seed cannot reach.
            normalize: observations through the interactor's normaliser (if any).
            module: the ``nn.Module`` behind ``model`` when it is not one (ES individuals).
            exact: every episode starts from ``reset(seed=seeds[e])``, also on a
                vector env reset as a whole (through :meth:`seeded_slots`);
                ``False``: such an env plays rounds seeded from ``base_seed``
                (training).
        """
        run = self._prepare(action, horizon, 1, to_range)
        return self._play(
            model,
            individuals,
            seeds=seeds,
            base_seed=base_seed,
            action=run["action"],
            horizon=run["horizon"],
            to_range=run["to_range"],
            normalize=normalize and run["normalize"],
            module=module,
            exact="play_episodes(exact=True)" if exact else False,
        )

    def _prepare(self, action: Any, horizon: Any, num_episodes: Any, to_range: Any) -> dict[str, Any]:
        if action is not None and not callable(action):
            raise InvalidTypeError(f"`action` must be a callable mapping model outputs to env actions, got {action!r}")
        _check_positive_int("horizon", horizon, allow_none=True)
        _check_positive_int("num_episodes", num_episodes)
        bounds = check_to_range(to_range, self.action_format)
        return {
            "action": action or self.action_format.default_action,
            "horizon": horizon,
            "to_range": bounds,
            "normalize": self.normalize_obs,
        }

    def _play(
        self,
        model: Any,
        individuals: Sequence[int],
        *,
        seeds: Sequence[int] | np.ndarray,
        base_seed: int,
        action: ActionFn,
        horizon: int | None,
        to_range: tuple[Tensor, Tensor] | None,
        normalize: bool,
        module: nn.Module | None = None,
        exact: bool | str = False,
    ) -> Tensor:
        """Play every ``(individual, episode)`` item (see :class:`~populora.envs.rollout.Rollout`).

        ``exact`` (or the name of what needs it, for messages): on
        :meth:`seeded_slots`, each episode reset with its own seed.

        Returns:
            ``(k, E)`` float64 returns (NaN: a NaN reward).
        """
        if not self._replay_checked:
            self.check_replay()
        if exact:
            slots = self.seeded_slots(exact if isinstance(exact, str) else "playing given reset seeds")
        else:
            slots = self._slots
        return play(
            slots,
            self.action_format,
            model,
            individuals,
            self.counters,
            seeds=seeds,
            base_seed=base_seed,
            action=action,
            horizon=horizon,
            to_range=to_range,
            stats=self._stats if normalize else None,
            module=module,
        )

    def update_obs_stats(self, population: Population) -> None:
        """Fold the observations of past generations into the normaliser if ``population.generation`` moved.

        :meth:`evaluate` calls it first; it may all-reduce, so every rank must
        call it at the same points. A no-op without ``normalize_obs``.
        """
        self.advance_obs_stats(population.generation)

    def advance_obs_stats(self, generation: int) -> None:
        """:meth:`update_obs_stats` for a run whose generation counter is ``generation`` (e.g. an ES's)."""
        if self._stats is not None:
            self._stats.advance(generation)


def _check_seeds(seeds: Any) -> list[int]:
    """A non-empty list of reset seeds (each checked by :func:`~populora.checks.check_seed`)."""
    if isinstance(seeds, (str, bytes)) or not isinstance(seeds, (Sequence, np.ndarray, Tensor)) or len(seeds) == 0:
        raise InvalidTypeError(f"`seeds` must be a non-empty list of int reset seeds, got {seeds!r:.80}")
    return [check_seed("seeds[]", s) for s in (seeds.tolist() if isinstance(seeds, (np.ndarray, Tensor)) else seeds)]


def _check_population(population: Any) -> None:
    if not isinstance(population, Population):
        raise InvalidTypeError(f"`population` must be a populora Population, got {type(population).__name__}")


def interact_with_env(
    envs: Any,
    device: str | torch.device | None = None,
    *,
    num_envs: int | None = None,
    flatten_obs: bool = True,
    normalize_obs: bool = False,
    obs_clip: float = 10.0,
    obs_keys: Sequence[str] | None = None,
    drop_obs_keys: Sequence[str] | None = None,
) -> EnvInteractor:
    """Build an :class:`EnvInteractor` over ``envs``.

    Args:
        envs: one env, a list of envs, a vector env (gymnasium
            ``SyncVectorEnv`` / ``AsyncVectorEnv``, gymnasium's native vector
            envs such as ``gym.make_vec('CartPole-v1', num_envs=4)`` in any
            autoreset mode, which train in rounds reset as a whole and play
            given seeds on single envs made from their spec (see the module
            docstring), ale-py's ``AtariVectorEnv``, pufferlib's vector envs,
            or any env-ssl-wrapper vector env), or
            a factory (a callable returning one env, an env class, or a
            gymnasium id string). Any simulator env-ssl-wrapper adapts works
            (gymnasium, dm_control, ...). The same object listed several
            times (``[env for _ in range(16)]``) is deep-copied so that each
            entry is its own slot, with one warning; an env that cannot be
            copied stays one slot (with a warning).
        device: where :meth:`EnvInteractor.population` puts populations.
        num_envs: how many envs a factory makes (default
            :data:`~populora.envs.slots.DEFAULT_NUM_ENVS`, 16; refused for
            anything but a factory).
        flatten_obs: each observation as ``gymnasium.spaces.flatten(space, obs)``
            gives it (one float32 vector; a ``Discrete(n)`` is a one-hot of
            ``n``); observations without a gymnasium space (dm_control) are
            their entries concatenated in their own order.
        normalize_obs: normalise observations with running statistics,
            frozen within a generation and updated between generations
            (synchronised across ranks).
        obs_clip: bound of normalised observations.
        obs_keys: the Dict observation keys to keep (in the space's order), or
        drop_obs_keys: the keys to drop (e.g. MiniGrid's ``["mission"]`` text).

    Returns:
        the interactor (``num_slots`` episodes run at once).

    Raises:
        InvalidValueError: an empty list, ``num_envs < 1``, ``num_envs``
            given with something that is not a factory.
        InvalidTypeError: a list entry that is not an env.
    """
    if normalize_obs and not flatten_obs:
        raise InvalidValueError("`normalize_obs=True` needs `flatten_obs=True` (it normalises one observation vector)")
    slots = build_slots(
        envs, num_envs=num_envs, flatten_obs=flatten_obs, obs_keys=obs_keys, drop_obs_keys=drop_obs_keys
    )
    with closing_on_failure() as undo:
        undo.callback(slots.close)  # the envs a factory made would otherwise leak
        return EnvInteractor(slots, device=device, normalize_obs=normalize_obs, obs_clip=obs_clip)
