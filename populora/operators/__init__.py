"""Genetic operators: pure, vectorised tensor functions registered by name.

Higher fitness is better everywhere. See spec/operators.md for the
semantics and :mod:`populora.operators.base` for the four signatures.
"""

from populora.operators import crossover, mutation, parents, selection
from populora.operators.base import (
    CROSSOVERS,
    MUTATIONS,
    PARENT_SELECTIONS,
    SELECTIONS,
    Factors,
    call_mutation,
    check_num_groups,
    check_options,
    get_operator,
    option_names,
    register_crossover,
    register_mutation,
    register_parent_selection,
    register_selection,
)
from populora.operators.linalg import rebuild_balanced, rms, svd_factors
from populora.operators.parents import parents_for_slots
from populora.operators.selection import SelectionResult, group_sizes, select_survivors
from populora.operators.shaping import centered_rank, check_real_tensor, fuss_weights, trusted_fitnesses, zscore

__all__ = [
    "CROSSOVERS",
    "MUTATIONS",
    "PARENT_SELECTIONS",
    "SELECTIONS",
    "Factors",
    "SelectionResult",
    "call_mutation",
    "centered_rank",
    "check_num_groups",
    "check_options",
    "check_real_tensor",
    "crossover",
    "fuss_weights",
    "get_operator",
    "group_sizes",
    "mutation",
    "option_names",
    "parents",
    "parents_for_slots",
    "rebuild_balanced",
    "register_crossover",
    "register_mutation",
    "register_parent_selection",
    "register_selection",
    "rms",
    "select_survivors",
    "selection",
    "svd_factors",
    "trusted_fitnesses",
    "zscore",
]
