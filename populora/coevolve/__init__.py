"""Coevolution of several populations, and the hall of fame of past champions."""

from populora.coevolve.coevolve import Coevolve
from populora.coevolve.hall_of_fame import HallOfFame

__all__ = ["Coevolve", "HallOfFame"]
