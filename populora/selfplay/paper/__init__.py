"""PopuLoRA's loop as the paper runs it: RL for both roles every step, the paper's reward table, openskill
Thurstone-Mosteller ratings, and every ``k`` steps the bottom of each role replaced by its top's children.

- :mod:`~populora.selfplay.paper.loop`: :class:`PopuLoRA`, :data:`PAPER_PRESET`, :data:`CPU_PRESET`,
  :func:`solve_rate`;
- :mod:`~populora.selfplay.paper.rewards`: the reward table, :func:`well_formed`, rating matches,
  :func:`draw_margin`;
- :mod:`~populora.selfplay.paper.replacement`: :class:`PaperRatings`, :func:`replace_` and the paper's four
  mutations and four crossovers.
"""

from populora.selfplay.paper.loop import (
    CPU_PRESET,
    PAPER_PRESET,
    PopuLoRA,
    PopuLoRAOutcome,
    PopuLoRARecord,
    Preset,
    solve_rate,
)
from populora.selfplay.paper.replacement import (
    PAPER_CROSSOVERS,
    PAPER_MUTATIONS,
    PaperRatings,
    ReplacementRecord,
    replace_,
)
from populora.selfplay.paper.rewards import (
    draw_margin,
    match_outcomes,
    student_rewards,
    teacher_rewards,
    well_formed,
)

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
    "draw_margin",
    "match_outcomes",
    "replace_",
    "solve_rate",
    "student_rewards",
    "teacher_rewards",
    "well_formed",
]
