"""The work queue: which (individual, episode) a free env slot plays next."""

from __future__ import annotations

from collections import deque

import numpy as np

__all__ = ["WorkQueue"]


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
        self.num_episodes = num_episodes
        self.next_episode = np.zeros(k, dtype=np.int64)
        self.playing = np.zeros(k, dtype=np.int64)
        self.ready: deque[int] = deque(range(k))
        self.left = k * num_episodes

    def take(self) -> tuple[int, int] | None:
        """The next ``(row, episode)``, or ``None`` when every item was handed out."""
        if self.left == 0:
            return None
        if self.ready:
            row = self.ready.popleft()
        else:  # everyone with episodes left is playing: double up on the one with most left
            row = int(np.argmax(self.num_episodes - self.next_episode))
        episode = int(self.next_episode[row])
        self.next_episode[row] += 1
        self.playing[row] += 1
        self.left -= 1
        return row, episode

    def finish(self, row: int) -> None:
        """An episode of ``row`` ended; it is ready again if it has episodes left and no other running."""
        self.playing[row] -= 1
        if self.playing[row] == 0 and self.next_episode[row] < self.num_episodes and row not in self.ready:
            self.ready.append(row)
