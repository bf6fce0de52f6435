"""Which (individual, episode) a free env slot plays next, and the seed it starts from.

:class:`WorkQueue` hands out the work items; :func:`episode_seed` and
:func:`vector_reset_seed` are the seeding scheme described in
:mod:`populora.envs.interactor`.
"""

from __future__ import annotations

from collections import deque

import numpy as np

__all__ = [
    "EPISODE_SEEDINGS",
    "VALIDATION_STREAM",
    "REPORTING_STREAM",
    "WorkQueue",
    "episode_seed",
    "episode_seeds",
    "stream_seeds",
    "training_seeds",
    "vector_reset_seed",
]

EPISODE_SEEDINGS = ("independent", "common")
"""``episode_seeding`` choices: every individual its own episodes, or all of a generation the same ones."""

VALIDATION_STREAM = 1
"""Stream of the validation episodes (see :func:`stream_seeds`)."""

REPORTING_STREAM = 2
"""Stream of fresh reporting episodes (benchmarks, examples; see :func:`stream_seeds`)."""

_MASK64 = (1 << 64) - 1


def episode_seed(eval_seed: int, episode: int) -> int:
    """Reset seed of episode ``episode`` in the generation whose eval seed is ``eval_seed``.

    A splitmix64 mix of both numbers, cut to 31 bits (valid for gymnasium,
    numpy and dm_control). Every individual of a generation meets the same
    seeds; the next generation (``eval_seed + 1``) meets new ones.

    Example:
        >>> episode_seed(0, 0) == episode_seed(0, 0) != episode_seed(1, 0)
        True
    """
    return _splitmix(int(eval_seed) * 0x9E3779B97F4A7C15 + (int(episode) + 1) * 0xD1B54A32D192ED03) >> 33


def _splitmix(z: int) -> int:
    z &= _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return z ^ (z >> 31)


def vector_reset_seed(eval_seed: int, round: int, vector: int = 0) -> int:
    """Seed of the whole-env reset of round ``round`` of a vector env that cannot reset one slot.

    ``vector`` numbers such vector envs in slot order (0 for a single one).
    A splitmix64 mix of the three numbers cut to 31 bits, independent of
    :func:`episode_seed`.

    Example:
        >>> vector_reset_seed(0, 0) == vector_reset_seed(0, 0) != vector_reset_seed(0, 1)
        True
    """
    z = _splitmix(int(eval_seed) * 0x9E3779B97F4A7C15 + 0x632BE59BD9B4E019)
    z = _splitmix(z + (int(round) + 1) * 0xD1B54A32D192ED03)
    z = _splitmix(z + (int(vector) + 1) * 0x8CB92BA72F3D8DD7)
    return z >> 33


def episode_seeds(eval_seed: int, num_episodes: int) -> list[int]:
    """``[episode_seed(eval_seed, e) for e in range(num_episodes)]``."""
    return [episode_seed(eval_seed, e) for e in range(num_episodes)]


def training_seeds(eval_seed: int, individuals: list[int], num_episodes: int, seeding: str) -> list[int] | np.ndarray:
    """The training episodes' seeds of ``individuals`` in the generation of ``eval_seed``.

    ``'common'`` (common random numbers): the list :func:`episode_seeds`,
    the same episodes for everyone. ``'independent'``: a ``(k, E)`` array,
    individual ``i`` meeting ``episode_seed(eval_seed, (i + 1) * E + e)``
    (disjoint from the common seeds of its generation and from every other
    individual's; independent of which rank or slot plays it).
    """
    if seeding == "common":
        return episode_seeds(eval_seed, num_episodes)
    return np.asarray(
        [[episode_seed(eval_seed, (i + 1) * num_episodes + e) for e in range(num_episodes)] for i in individuals],
        dtype=np.int64,
    ).reshape(len(individuals), num_episodes)


def stream_seeds(seed: int, stream: int, num_episodes: int) -> list[int]:
    """``num_episodes`` reset seeds of stream ``stream`` of the run seeded ``seed``.

    Streams are separate splitmix64 mixes of ``(seed, stream, e)``, apart from
    the training episodes' :func:`episode_seed` mixes: the validation
    episodes (:data:`VALIDATION_STREAM`) are one FIXED set per run, the same
    every generation, and the fresh reporting episodes
    (:data:`REPORTING_STREAM`) are never met by training or validation.

    Example:
        >>> stream_seeds(0, VALIDATION_STREAM, 3) == stream_seeds(0, VALIDATION_STREAM, 3)
        True
        >>> set(stream_seeds(0, VALIDATION_STREAM, 3)) & set(stream_seeds(0, REPORTING_STREAM, 3))
        set()
    """
    base = _splitmix(int(seed) * 0xC2B2AE3D27D4EB4F + (int(stream) + 1) * 0x165667B19E3779F9 + 0x27D4EB2F165667C5)
    return [_splitmix(base + (e + 1) * 0x9E3779B97F4A7C15) >> 33 for e in range(int(num_episodes))]


class WorkQueue:
    """``(row, episode)`` work items for ``k`` individuals x ``num_episodes`` episodes.

    A free slot takes the next individual that is not playing (first in,
    first out), so the rows of one routed forward belong to distinct
    individuals whenever possible (the cheapest routing layout). Only when
    every individual with episodes left is already playing does a slot take
    another episode of one of them (the one with most episodes left): no slot
    idles while work remains.

    Args:
        k: individuals, numbered ``0..k-1`` (rows of the caller's id list).
        num_episodes: episodes per individual, each played exactly once.
    """

    def __init__(self, k: int, num_episodes: int):
        # plain lists: the loop reads and writes single entries, which numpy scalars make several times slower
        self.num_episodes = num_episodes
        self.next_episode = [0] * k
        self.playing = [0] * k
        self.ready: deque[int] = deque(range(k))
        self._queued = [True] * k  # whether a row is in `ready` (a membership test of a deque is a scan)
        self.left = k * num_episodes

    def take(self) -> tuple[int, int] | None:
        """The next ``(row, episode)``, or ``None`` when every item was handed out."""
        if self.left == 0:
            return None
        if self.ready:
            row = self.ready.popleft()
            self._queued[row] = False
        else:  # everyone with episodes left is playing: double up on the one with most left (the first such)
            started = self.next_episode
            row = started.index(min(started))
        episode = self.next_episode[row]
        self.next_episode[row] = episode + 1
        self.playing[row] += 1
        self.left -= 1
        return row, episode

    def finish(self, row: int) -> None:
        """An episode of ``row`` ended; it is ready again if it has episodes left and no other running."""
        self.playing[row] -= 1
        if self.playing[row] == 0 and self.next_episode[row] < self.num_episodes and not self._queued[row]:
            self.ready.append(row)
            self._queued[row] = True
