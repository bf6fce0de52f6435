"""The typed options of one generation of :meth:`Population.evolve_ <populora.Population.evolve_>`.

:class:`Evolution` holds every option of ``evolve_`` (the optimizer aside: it is an object bound to the
model's parameters, not configuration). It is passed whole, ``pop.evolve_(fitnesses, Evolution(...))``, and
the keywords ``evolve_`` still takes flat (those the seed README passes, and the operator names) override it::

    >>> from populora.population.evolution import Evolution
    >>> config = Evolution(crossover_type="layer_wise", num_parents_per_child=2, epsilon=0.2)
    >>> Evolution.from_dict(config.to_dict()) == config
    True
    >>> config.with_overrides(epsilon=0.3).epsilon
    0.3

The operators' own options (``selection_kwargs``, ``parent_kwargs``, ``crossover_kwargs``,
``mutation_kwargs``) stay dicts, checked key by key against the operator they are for (a registered
operator declares what it takes).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from populora import operators as ops
from populora.checks import check_float, check_int
from populora.config import Config, config_from_legacy
from populora.errors import InvalidTypeError
from populora.population.optimizer_rows import check_optimizer_state

__all__ = ["EVOLVE_KEYWORDS", "Evolution", "resolve_config"]

_KINDS = (
    ("selection", "selection_type", "selection_kwargs"),
    ("parent_selection", "parent_selection_type", "parent_kwargs"),
    ("crossover", "crossover_type", "crossover_kwargs"),
    ("mutation", "mutation_type", "mutation_kwargs"),
)


@dataclass(frozen=True)
class Evolution(Config):
    """Every option of one ``evolve_`` generation (select -> parents -> crossover -> mutate).

    Attributes:
        survive_frac: per island, ``S = max(1, floor(m * survive_frac))`` survivors, in ``(0, 1)``.
        elite_frac: of which the top ``E = floor(m * elite_frac)`` (at least 1 when ``> 0``) are never changed.
        selection_type: the survivor selection (a registered ``selection`` operator).
        parent_selection_type: how parents are drawn among the survivors (``parent_selection``).
        crossover_type: how a child is bred from its parents (``crossover``).
        mutation_type: how the children are mutated (``mutation``).
        epsilon: mutation scale ``>= 0`` (the expected relative change of a mutated layer's output).
        num_groups: contiguous equal islands (it must divide the population's size).
        num_parents_per_child: parents per child.
        selection_kwargs: options of the selection operator (checked against it).
        parent_kwargs: options of the parent selection operator.
        crossover_kwargs: options of the crossover operator.
        mutation_kwargs: options of the mutation operator.
        optimizer_state: with ``evolve_(optimizer=)``: a child's optimizer rows are its first parent's
            (``'inherit'``) or zeros (``'reset'``).
    """

    survive_frac: float = 0.5
    elite_frac: float = 0.1
    selection_type: str = "deterministic"
    parent_selection_type: str = "tournament"
    crossover_type: str = "average"
    mutation_type: str = "full_gaussian"
    epsilon: float = 0.1
    num_groups: int = 1
    num_parents_per_child: int = 2
    selection_kwargs: Mapping[str, Any] = field(default_factory=dict)
    parent_kwargs: Mapping[str, Any] = field(default_factory=dict)
    crossover_kwargs: Mapping[str, Any] = field(default_factory=dict)
    mutation_kwargs: Mapping[str, Any] = field(default_factory=dict)
    optimizer_state: str = "inherit"

    def __post_init__(self) -> None:
        for name in ("selection_kwargs", "parent_kwargs", "crossover_kwargs", "mutation_kwargs"):
            value = getattr(self, name)
            if value is None:  # 0.5.0's default of the flat keyword
                object.__setattr__(self, name, {})
            elif not isinstance(value, Mapping):
                raise InvalidTypeError(f"`Evolution.{name}` must be a dict of operator options, got {value!r:.80}")
            else:
                object.__setattr__(self, name, dict(value))
        check_fields({f.name: getattr(self, f.name) for f in dataclasses.fields(self)}, "Evolution.")

    def with_overrides(self, **overrides: Any) -> Evolution:
        """This config with the fields given (those that are not ``None``) replaced.

        The values are checked first under their own names (``evolve_(fitnesses, survive_frac=1.0)`` says
        "`survive_frac` must be ...", as in 0.5.0).
        """
        given = {k: v for k, v in overrides.items() if v is not None}
        if not given:
            return self
        merged = {**{k: getattr(self, k) for k in _OPERATOR_NAMES}, **given}
        check_fields(given, "", operators=merged)
        return dataclasses.replace(self, **given)


_OPERATOR_NAMES = tuple(name for _, type_field, options in _KINDS for name in (type_field, options))


def check_fields(values: Mapping[str, Any], prefix: str, *, operators: Mapping[str, Any] | None = None) -> None:
    """Check the :class:`Evolution` fields in ``values``, naming each ``prefix + field``.

    ``operators`` gives the operator names and options an operator check reads (default: ``values``).
    """
    operators = values if operators is None else operators
    if "survive_frac" in values:
        check_float(f"{prefix}survive_frac", values["survive_frac"], low=0, high=1, low_open=True, high_open=True)
    if "elite_frac" in values:
        check_float(f"{prefix}elite_frac", values["elite_frac"], low=0, high=1, high_open=True)
    for kind, type_field, options_field in _KINDS:
        if type_field in values or options_field in values:
            ops.check_options(kind, operators[type_field], operators[options_field] or {})
    if "epsilon" in values:
        ops.mutation.check_epsilon(values["epsilon"])
    if "num_groups" in values:
        check_int(f"{prefix}num_groups", values["num_groups"], low=1)
    if "num_parents_per_child" in values:
        check_int(f"{prefix}num_parents_per_child", values["num_parents_per_child"], low=1)
    if "optimizer_state" in values:
        check_optimizer_state(values["optimizer_state"])


EVOLVE_KEYWORDS: tuple[str, ...] = (*(f.name for f in dataclasses.fields(Evolution)), "optimizer", "config")
"""Every keyword :meth:`Population.evolve_ <populora.Population.evolve_>` takes, the flat 0.5.0 ones it
still accepts (deprecated) included: what a dict of ``evolve_`` options is checked against."""


def resolve_config(
    cls: Any, config: Any, legacy: Mapping[str, Any], explicit: Mapping[str, Any], *, where: str, stacklevel: int
) -> Any:
    """The config of a call that takes ``config=``, keywords that override it and 0.5.0's flat ``**legacy``.

    ``cls`` is a config class with ``with_overrides`` (:class:`Evolution`, :class:`~populora.es.EggrollConfig`).
    The legacy keywords warn (:func:`~populora.config.config_from_legacy`); legacy and explicit values are
    checked under their own names first, so their errors read as 0.5.0's.
    """
    base = config_from_legacy(cls, config, {}, where=where)  # the type of `config`
    names = {f.name for f in dataclasses.fields(cls)}
    if all(k in names for k in legacy):
        base.with_overrides(**legacy)  # checked under the keyword's name; an unknown one is named below
    base = config_from_legacy(cls, base, legacy, where=where, stacklevel=stacklevel + 1)
    return base.with_overrides(**explicit)
