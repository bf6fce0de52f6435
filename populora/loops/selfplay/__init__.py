"""Self-play of teacher and student LoRA populations on one frozen language model.

- :class:`PopuLoRA`: the paper's loop (REINFORCE++ for both roles every step, the bottom of each role
  replaced every ``k`` steps), with :data:`PAPER_PRESET` and :data:`CPU_PRESET`;
- :class:`SelfPlay`: evolution only (both populations evolve every step, no gradient).

Modules: ``checks`` (argument checks of both), ``text`` (prompts and routed generation), ``scores`` (the
evolution-only fitness rule and its record), ``rewards`` (the paper's reward table, :func:`well_formed`,
rating matches), ``replacement`` (:class:`PaperRatings`, :func:`replace_`, the paper's mutations and
crossovers), ``selfplay`` (:class:`SelfPlay`), ``loop`` (:class:`PopuLoRA`).
"""

from populora.loops.selfplay.loop import (
    CPU_PRESET,
    PAPER_PRESET,
    PopuLoRA,
    PopuLoRAOutcome,
    PopuLoRARecord,
    Preset,
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
from populora.loops.selfplay.selfplay import SelfPlay

__all__ = [
    "CPU_PRESET",
    "PAPER_CROSSOVERS",
    "PAPER_MUTATIONS",
    "PAPER_PRESET",
    "PaperRatings",
    "PopuLoRA",
    "PopuLoRAOutcome",
    "PopuLoRARecord",
    "Preset",
    "ReplacementRecord",
    "SelfPlay",
    "draw_margin",
    "match_outcomes",
    "replace_",
    "solve_rate",
    "student_rewards",
    "teacher_rewards",
    "well_formed",
]
