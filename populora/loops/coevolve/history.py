"""Coevolve's history: one :class:`CoevolveRecord` per step (every population's fitness statistics).

``co.history`` is a list of records, as every loop's is. 0.5.0's ``{name: [GenerationStats, ...]}`` view is
``co.history.by_population()`` (or ``co.history.of(name)``); indexing the history by a name
(``co.history['solver']``) and its ``keys`` / ``values`` / ``items`` still give that view, with a
``DeprecationWarning`` (they go in 0.7.0).
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, SupportsIndex, overload

from populora.stats import GenerationStats

__all__ = ["CoevolveHistory", "CoevolveRecord"]


@dataclass(frozen=True)
class CoevolveRecord:
    """One :meth:`Coevolve.step <populora.Coevolve.step>` (an entry of ``Coevolve.history``).

    Attributes:
        step: the step's index (``Coevolve.generation`` before it).
        populations: ``{name: GenerationStats(generation, best, mean, std)}`` of the fitnesses each population
            evolved on (``generation``: the population's, evaluated before it evolved).
    """

    step: int
    populations: Mapping[str, GenerationStats]

    def __getitem__(self, name: str) -> GenerationStats:
        return self.populations[name]

    def as_dict(self) -> dict[str, Any]:
        """``{'step', '<name>_best', '<name>_mean', '<name>_std', ...}``: numbers only (a ``std`` a 0.5.0 file did
        not record is ``None``), one line of logging."""
        out: dict[str, Any] = {"step": self.step}
        for name, s in self.populations.items():
            out.update({f"{name}_best": s.best, f"{name}_mean": s.mean, f"{name}_std": s.std})
        return out


def _deprecated(what: str) -> None:
    warnings.warn(
        f"Coevolve.history{what} (0.5.0's dict view) is deprecated since 0.6.0 and goes in 0.7.0: the history is a "
        "list of CoevolveRecord, one per step; use history.of(name) or history.by_population()",
        DeprecationWarning,
        stacklevel=3,
    )


class CoevolveHistory(list[CoevolveRecord]):
    """A list of :class:`CoevolveRecord` that knows its populations' names (module docstring)."""

    def __init__(self, names: Sequence[str], records: Iterable[CoevolveRecord] = ()) -> None:
        super().__init__(records)
        self.names = list(names)

    def of(self, name: str) -> list[GenerationStats]:
        """Population ``name``'s statistics, one per step (0.5.0's ``history[name]``)."""
        if name not in self.names:
            raise KeyError(f"no population named {name!r}; populations: {self.names}")
        return [r.populations[name] for r in self]

    def by_population(self) -> dict[str, list[GenerationStats]]:
        """``{name: [GenerationStats, ...]}`` (0.5.0's form of the history)."""
        return {name: self.of(name) for name in self.names}

    @overload
    def __getitem__(self, key: SupportsIndex) -> CoevolveRecord: ...

    @overload
    def __getitem__(self, key: slice) -> list[CoevolveRecord]: ...

    @overload
    def __getitem__(self, key: str) -> list[GenerationStats]: ...

    def __getitem__(self, key: Any) -> Any:
        if isinstance(key, str):
            _deprecated(f"[{key!r}]")
            return self.of(key)
        return super().__getitem__(key)

    def keys(self) -> list[str]:
        _deprecated(".keys()")
        return list(self.names)

    def values(self) -> list[list[GenerationStats]]:
        _deprecated(".values()")
        return list(self.by_population().values())

    def items(self) -> list[tuple[str, list[GenerationStats]]]:
        _deprecated(".items()")
        return list(self.by_population().items())

    def __copy__(self) -> CoevolveHistory:
        return CoevolveHistory(self.names, self)

    def __deepcopy__(self, memo: dict[int, Any]) -> CoevolveHistory:
        return CoevolveHistory(self.names, self)  # the records are immutable

    def __reduce__(self) -> Any:
        return (CoevolveHistory, (self.names, list(self)))
