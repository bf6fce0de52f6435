"""Self-play of teacher and student LoRA populations on one frozen language model."""

from populora.selfplay.selfplay import SelfPlay

__all__ = ["SelfPlay"]
