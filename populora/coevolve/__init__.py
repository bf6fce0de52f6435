"""Coevolution of several populations, and the hall of fame of past champions."""

from populora.loops.coevolve.coevolve import Coevolve
from populora.loops.coevolve.hall_of_fame import HallOfFame

__all__ = ["Coevolve", "HallOfFame"]
