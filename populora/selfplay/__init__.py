"""Self-play of teacher and student LoRA populations on one frozen language model.

- :class:`SelfPlay`: evolution only (both populations evolve every step, no gradient);
- :class:`PopuLoRA`: the paper's loop (REINFORCE++ for both roles every step, the bottom of each role replaced
  every ``k`` steps), with :data:`PAPER_PRESET` and :data:`CPU_PRESET`
  (all of it lives in :mod:`populora.loops.selfplay`).
"""

from populora.loops.selfplay import (
    CPU_PRESET,
    PAPER_PRESET,
    SELFPLAY_PRESET,
    PopuLoRA,
    PopuLoRAConfig,
    PopuLoRAOutcome,
    PopuLoRARecord,
    Preset,
    SelfPlay,
)

__all__ = [
    "CPU_PRESET",
    "PAPER_PRESET",
    "SELFPLAY_PRESET",
    "PopuLoRA",
    "PopuLoRAConfig",
    "PopuLoRAOutcome",
    "PopuLoRARecord",
    "Preset",
    "SelfPlay",
]
