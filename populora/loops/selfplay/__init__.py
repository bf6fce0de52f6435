"""Self-play of teacher and student LoRA populations on one frozen language model.

One loop, :class:`PopuLoRA`, with one typed config, :class:`PopuLoRAConfig`, whose instances are the usual
settings: :data:`PAPER_PRESET` and :data:`CPU_PRESET` (the paper's loop: REINFORCE++ for both roles every
step, the bottom of each role replaced every ``interval`` steps) and :data:`SELFPLAY_PRESET` (evolution only:
both populations evolve every step, no gradient; :func:`SelfPlay` builds it).

Modules: ``config`` (:class:`PopuLoRAConfig` and the presets), ``loop`` (:class:`PopuLoRA` and its step's
named functions: pair, propose, verify, answer, score, rate, update, replace), ``checks`` (the players'
argument checks), ``scores`` (the evolution-only fitness rule and its record), ``rewards`` (the paper's reward
table, rating matches), ``replacement`` (:class:`PaperRatings`, :func:`replace_`, the paper's mutations and
crossovers), ``selfplay`` (:func:`SelfPlay`). Prompt encoding and routed generation live in
:mod:`populora.llm.text`.
"""

from populora.loops.selfplay.config import CPU_PRESET, PAPER_PRESET, SELFPLAY_PRESET, PopuLoRAConfig, Preset
from populora.loops.selfplay.loop import (
    PopuLoRA,
    PopuLoRAOutcome,
    PopuLoRARecord,
    Round,
    SelfPlay,
    SelfPlayOutcome,
    solve_rate,
)
from populora.loops.selfplay.replacement import (
    PAPER_CROSSOVERS,
    PAPER_MUTATIONS,
    PaperRatings,
    ReplacementRecord,
    replace_,
)
from populora.loops.selfplay.rewards import (
    draw_margin,
    match_outcomes,
    student_rewards,
    teacher_rewards,
    well_formed,
)
from populora.loops.selfplay.scores import SelfPlayRecord

__all__ = [
    "CPU_PRESET",
    "PAPER_CROSSOVERS",
    "PAPER_MUTATIONS",
    "PAPER_PRESET",
    "PaperRatings",
    "PopuLoRA",
    "PopuLoRAConfig",
    "PopuLoRAOutcome",
    "PopuLoRARecord",
    "Preset",
    "ReplacementRecord",
    "Round",
    "SELFPLAY_PRESET",
    "SelfPlay",
    "SelfPlayOutcome",
    "SelfPlayRecord",
    "draw_margin",
    "match_outcomes",
    "replace_",
    "solve_rate",
    "student_rewards",
    "teacher_rewards",
    "well_formed",
]
