"""The 0.5.0 face of the paper's loop: everything here lives in :mod:`populora.loops.selfplay`."""

from populora.loops.selfplay.config import CPU_PRESET, PAPER_PRESET, Preset
from populora.loops.selfplay.loop import (
    PopuLoRA,
    PopuLoRAOutcome,
    PopuLoRARecord,
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
