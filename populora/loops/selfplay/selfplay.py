"""SelfPlay: the evolution-only self-play loop, a thin constructor of :class:`~populora.loops.selfplay.loop.PopuLoRA`.

``SelfPlay(teachers, students, tokenizer, task)`` is ``PopuLoRA(teachers, students, tokenizer, task,
config=SELFPLAY_PRESET)``: both populations evolve one generation every step on their fitnesses
(:func:`~populora.loops.selfplay.scores.selfplay_fitnesses`), greedy students answer each valid proposal and
``anchors`` task-sampled problems; every step is the named functions of :mod:`populora.loops.selfplay.loop`.
"""

from populora.loops.ratings import PAIRING_MODES
from populora.loops.selfplay.config import SELFPLAY_PRESET
from populora.loops.selfplay.loop import SelfPlay, SelfPlayOutcome
from populora.loops.selfplay.scores import SelfPlayRecord, selfplay_fitnesses

__all__ = ["MATCHMAKING", "SELFPLAY_PRESET", "SelfPlay", "SelfPlayOutcome", "SelfPlayRecord", "selfplay_fitnesses"]

MATCHMAKING = PAIRING_MODES
