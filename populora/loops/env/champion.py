"""Validated champions: which policy a run returns and when ``target_fitness`` is reached.

Training fitness is noisy (one or a few episodes per individual), so the
maximum over a population, and over generations, favours the individual
that was lucky on its training episodes. :class:`Validator` replays the
top candidates of each generation on validation episodes: a FIXED set of
``validation_episodes`` reset seeds of the run's own stream
(:func:`~populora.envs.schedule.stream_seeds` with
:data:`~populora.envs.schedule.VALIDATION_STREAM`), disjoint from the
training episodes and from the reporting episodes of
:meth:`EnvInteractor.play`, and the same every generation, so validated
scores of different generations are comparable. The champion is the best
validated candidate seen in the run, kept with the observation normaliser
of its own generation.

Validated scores are cached by the candidate's parameters (and the
normaliser's state): an elite carried over unchanged by the genetic
algorithm is not replayed.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor

from populora.distributed.broadcasts import broadcast_object
from populora.distributed.process_group import is_main_rank, world_size
from populora.envs.schedule import VALIDATION_STREAM, stream_seeds

__all__ = ["Champion", "Validator", "fingerprint", "top_candidates"]


@dataclass
class Champion:
    """The best validated candidate of a run so far.

    Attributes:
        score: its validated mean return (or custom fitness on the validation seeds).
        generation: the generation it was validated in.
        index: its id in that generation.
        state: what restores it (a population snapshot, or an ES model's parameters).
        interactor: the interactor's state then (the observation normaliser of its generation).
    """

    score: float
    generation: int
    index: int
    state: dict[str, Any]
    interactor: dict[str, Any]
    confirmed: bool = False  # its score is the mean over the confirmation episodes too
    lower: float = float("-inf")  # confirmed: score minus two standard errors (what target_fitness judges)


def top_candidates(fitnesses: Tensor, top: int) -> list[int]:
    """Ids of the ``top`` highest training fitnesses (NaN ranks lowest; ties by lower id)."""
    f = torch.nan_to_num(fitnesses.detach().double().cpu(), nan=-np.inf)
    order = sorted(range(f.numel()), key=lambda i: (-float(f[i]), i))
    return order[: min(top, f.numel())]


def fingerprint(state: dict[str, Any], index: int, num: int, extra: Any = None) -> str:
    """A digest of row ``index`` of every ``(num, ...)`` tensor in ``state`` (an individual's parameters)."""
    digest = hashlib.blake2b(digest_size=16)
    for key in sorted(state):
        value = state[key]
        if isinstance(value, Tensor) and value.dim() >= 1 and value.shape[0] == num:
            digest.update(key.encode())
            digest.update(value[index].detach().cpu().contiguous().numpy().tobytes())
    digest.update(repr(extra).encode())
    return digest.hexdigest()


class Validator:
    """Validation episodes of one run and its champion.

    Args:
        seed: the run's seed (the validation seeds are reproducible from it).
        episodes: validation episodes per candidate (``0``: no validation).
        top: candidates validated per generation.

    Attributes:
        seeds: the fixed reset seeds of the validation episodes.
        champion: the best validated :class:`Champion` so far (``None`` before any).
        cache: validated scores by :func:`fingerprint`.
    """

    def __init__(self, seed: int, episodes: int, top: int):
        self.episodes, self.top = int(episodes), int(top)
        both = stream_seeds(seed, VALIDATION_STREAM, 3 * self.episodes)
        self.seeds = both[: self.episodes]
        self.confirm_seeds = both[self.episodes :]  # 2x more, played once by a champion that reaches the target
        self.eval_seed = stream_seeds(seed, VALIDATION_STREAM + 16, 1)[0]  # a custom fitness's validation eval_seed
        self.champion: Champion | None = None
        self.previous: Champion | None = None  # the champion before the current one
        self.cache: dict[str, float] = {}

    @property
    def enabled(self) -> bool:
        return self.episodes > 0 and self.top > 0

    def scores(self, keys: list[str], play: Any) -> list[float]:
        """Validated scores of candidates named by ``keys``; ``play(positions) -> scores`` runs the new ones.

        ``play`` runs on the main rank only and its scores are broadcast, so
        every rank agrees bitwise (a run's ranks may hold different slots).
        """
        new = [j for j, key in enumerate(keys) if key not in self.cache]
        played: list[float] = []
        if new and is_main_rank():
            played = [float(s) for s in play(new)]
        if new and world_size() > 1:
            played = list(broadcast_object(played))
        for j, score in zip(new, played):
            self.cache[keys[j]] = score
        return [self.cache[key] for key in keys]

    def offer(self, generation: int, ids: list[int], scores: list[float], snapshot: Any) -> float | None:
        """Record this generation's validated ``scores``; a better one becomes champion.

        ``snapshot()`` returns ``(state, interactor_state)`` of the candidate
        generation and is called only when the champion changes. Returns the
        generation's best validated score (``None`` without candidates).
        NaN scores never win.
        """
        finite = [(s, i) for s, i in zip(scores, ids) if np.isfinite(s)]
        if not scores:
            return None
        if not finite:
            return float("nan")
        best_score, best_id = max(finite, key=lambda t: (t[0], -t[1]))
        if self.champion is None or best_score > self.champion.score:
            state, interactor = snapshot()
            self.previous = self.champion
            self.champion = Champion(best_score, generation, best_id, state, interactor)
        return best_score

    def confirm(self, generation: int, target: float | None, key: str, play: Any) -> float | None:
        """Before a run stops at ``target``: replay this generation's new champion on more episodes.

        A champion of ``generation`` whose validated score reaches ``target``
        plays the validation episodes and the ``2 * validation_episodes``
        confirmation episodes (fixed seeds of the same stream); its score
        becomes their mean and :attr:`Champion.lower` that mean minus two
        standard errors. The run stops only when ``lower`` reaches the target:
        a stop is judged on three times as many episodes as the ranking, with
        their spread (the best of several candidates on a few episodes is
        biased upwards, and an occasional failed episode shows in the spread).
        ``play(seeds) -> returns`` runs on the main rank. Returns the
        confirmed score, or ``None`` when nothing was confirmed.
        """
        c = self.champion
        if target is None or c is None or c.generation != generation or c.confirmed or c.score < target:
            return None

        def stats(_: list[int]) -> list[float]:
            r = np.asarray(play(self.seeds + self.confirm_seeds), dtype=np.float64)
            return [float(r.mean()), 2.0 * float(r.std() / np.sqrt(r.size))]  # two standard errors

        keys = [key + "/confirm-mean", key + "/confirm-se"]
        mean, se = self._pair(keys, stats)
        c.score, c.lower, c.confirmed = mean, mean - se, True
        return c.score

    def _pair(self, keys: list[str], stats: Any) -> tuple[float, float]:
        """Two numbers computed together on the main rank (cached, broadcast like :meth:`scores`)."""
        values: list[float] = []
        if not all(k in self.cache for k in keys):
            values = stats([]) if is_main_rank() else []
            if world_size() > 1:
                values = list(broadcast_object(values))
            self.cache.update(zip(keys, values))
        return self.cache[keys[0]], self.cache[keys[1]]

    def reconsider(self, generation: int, ids: list[int], scores: list[float], snapshot: Any) -> None:
        """After a confirmation lowered the champion's score: the best of it, the previous champion and
        this generation's other candidates (``ids`` / ``scores``) is the champion."""
        c, prev = self.champion, self.previous
        assert c is not None, "called after a champion was confirmed"
        others = [(s, i) for s, i in zip(scores, ids) if i != c.index and np.isfinite(s)]
        best_other = max(others, key=lambda t: (t[0], -t[1])) if others else None
        if best_other is not None and best_other[0] > c.score and (prev is None or best_other[0] > prev.score):
            state, interactor = snapshot()
            self.champion = Champion(best_other[0], generation, best_other[1], state, interactor)
        elif prev is not None and prev.score > c.score:
            self.champion = prev

    def state_dict(self) -> dict[str, Any]:
        """The champion and the cache (for checkpoints)."""
        c = self.champion
        return {
            "champion": None
            if c is None
            else dict(
                score=c.score,
                generation=c.generation,
                index=c.index,
                state=c.state,
                interactor=c.interactor,
                confirmed=c.confirmed,
                lower=c.lower,
            ),
            "cache": dict(self.cache),
        }

    def load_state_dict(self, state: dict[str, Any] | None) -> None:
        if not state:
            return
        c = state.get("champion")
        self.champion = (
            None
            if c is None
            else Champion(
                float(c["score"]),
                int(c["generation"]),
                int(c["index"]),
                c["state"],
                c["interactor"],
                bool(c.get("confirmed")),
                float(c.get("lower", float("-inf"))),
            )
        )
        self.cache = {str(k): float(v) for k, v in state.get("cache", {}).items()}
