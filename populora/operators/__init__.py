"""Genetic operators: pure, vectorised tensor functions registered by name.

Higher fitness is better everywhere. See spec/operators.md for the
semantics and :mod:`populora.operators.base` for the four signatures.
"""

from . import crossover, mutation, parents, selection
from .base import (
    CROSSOVERS,
    MUTATIONS,
    PARENT_SELECTIONS,
    SELECTIONS,
    Factors,
    call_mutation,
    check_options,
    get_operator,
    option_names,
    register_crossover,
    register_mutation,
    register_parent_selection,
    register_selection,
)
from .linalg import rebuild_balanced, rms, svd_factors
from .shaping import centered_rank, fuss_weights, zscore

__all__ = [
    "CROSSOVERS",
    "MUTATIONS",
    "PARENT_SELECTIONS",
    "SELECTIONS",
    "Factors",
    "call_mutation",
    "centered_rank",
    "check_options",
    "crossover",
    "fuss_weights",
    "get_operator",
    "mutation",
    "option_names",
    "parents",
    "rebuild_balanced",
    "register_crossover",
    "register_mutation",
    "register_parent_selection",
    "register_selection",
    "rms",
    "selection",
    "svd_factors",
    "zscore",
]
