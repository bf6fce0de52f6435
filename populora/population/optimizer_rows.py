"""An optimizer's state, per individual: the rows that move with the adapters when evolution replaces one.

An element-wise optimizer (SGD with momentum, Adam, AdamW, RMSprop, Adagrad) over
:meth:`Population.adapter_parameters <populora.Population.adapter_parameters>` keeps, for every stacked
parameter, state tensors of the parameter's own shape ``(P, ...)``: row ``i`` is individual ``i``'s
(momentum, first and second moments, ...). When ``evolve_`` / ``crossover_`` writes a child into slot ``c``
bred from parents ``(a, b)``, those rows follow the rule ``optimizer_state``:

- ``"inherit"`` (the default): the child gets its first parent's rows (``row[c] = row[a]``);
- ``"reset"``: the child's rows are zeros.

A 0-d state tensor (Adam's shared ``step``) is kept as it is: a reset row is therefore not a fresh optimizer
(Adam's bias correction reads the shared step). Any other state (a tensor of another shape, a per-parameter
matrix of a second-order method) cannot be split by individual and raises before anything is written.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import torch
from torch import Tensor, nn

from populora.errors import InvalidTypeError, InvalidValueError

__all__ = ["OPTIMIZER_STATES", "OptimizerRows", "check_optimizer_state"]

OPTIMIZER_STATES = ("inherit", "reset")


class OptimizerRows:
    """The per-individual state rows of one or several optimizers over a population's adapter parameters.

    Args:
        optimizers: a ``torch.optim.Optimizer`` or a sequence of them (``None``: nothing to move).
        params: the population's adapter parameters (first dimension ``P``).

    Raises:
        InvalidTypeError: something that is not an optimizer.
        InvalidValueError: a state entry of an adapter parameter that is neither of the parameter's shape nor
            0-d (named: the optimizer, the parameter's index and the state key).
    """

    def __init__(self, optimizers: Any, params: Sequence[nn.Parameter]):
        if optimizers is None:
            optimizers = []
        elif isinstance(optimizers, torch.optim.Optimizer):
            optimizers = [optimizers]
        elif not isinstance(optimizers, Iterable) or isinstance(optimizers, (str, bytes)):
            raise InvalidTypeError(
                f"`optimizer` must be a torch.optim.Optimizer or a sequence of them, got {type(optimizers).__name__}"
            )
        optimizers = list(optimizers)
        for opt in optimizers:
            if not isinstance(opt, torch.optim.Optimizer):
                raise InvalidTypeError(f"`optimizer` must hold torch.optim.Optimizer objects, got {type(opt).__name__}")
        index = {id(p): t for t, p in enumerate(params)}
        self.rows: list[Tensor] = []  # every state tensor with its parameter's shape: (P, ...), rows = individuals
        for opt in optimizers:
            for group in opt.param_groups:
                for p in group["params"]:
                    if id(p) not in index:
                        continue
                    for key, value in opt.state.get(p, {}).items():
                        if not isinstance(value, Tensor) or value.dim() == 0:
                            continue  # shared by every individual (Adam's step): kept
                        if value.shape == p.shape:
                            self.rows.append(value)
                        else:
                            raise InvalidValueError(
                                f"{type(opt).__name__}'s state {key!r} of adapter parameter {index[id(p)]} has shape "
                                f"{tuple(value.shape)}, neither the parameter's {tuple(p.shape)} nor 0-d: it cannot "
                                "be split by individual, so evolution cannot carry it (use an element-wise optimizer "
                                "such as SGD, Adam, AdamW, RMSprop or Adagrad, or pass no optimizer)"
                            )

    def __bool__(self) -> bool:
        return bool(self.rows)

    def save(self, ids: Tensor) -> list[Tensor]:
        """Copies of rows ``ids`` of every state tensor (for :meth:`restore`)."""
        return [t[ids.to(t.device)].clone() for t in self.rows]

    def restore(self, ids: Tensor, saved: list[Tensor]) -> None:
        """Put back what :meth:`save` copied."""
        with torch.no_grad():
            for t, old in zip(self.rows, saved):
                t[ids.to(t.device)] = old

    def at(self, ids: Tensor) -> RowsAt:
        """Rows ``ids`` as one :func:`~populora.transaction.transaction` entry."""
        return RowsAt(self, ids)

    def replace(self, children: Tensor, sources: Tensor | None) -> None:
        """Rows ``children`` become copies of rows ``sources`` (``"inherit"``), or zeros (``sources=None``)."""
        with torch.no_grad():
            for t in self.rows:
                dest = children.to(t.device)
                t[dest] = 0 if sources is None else t[sources.to(t.device)]


def check_optimizer_state(value: Any, choices: Sequence[str] = OPTIMIZER_STATES) -> str:
    """``optimizer_state`` checked: one of ``choices``."""
    if not isinstance(value, str) or value not in choices:
        raise InvalidValueError(f"`optimizer_state` must be one of {list(choices)}, got {value!r}")
    return value


class RowsAt:
    """Rows ``ids`` of an :class:`OptimizerRows` as one transaction entry."""

    def __init__(self, rows: OptimizerRows, ids: Tensor) -> None:
        self.rows, self.ids = rows, ids

    def transaction_state(self) -> list[Tensor]:
        return self.rows.save(self.ids)

    def restore_transaction_state(self, state: list[Tensor]) -> None:
        self.rows.restore(self.ids, state)
