"""The individuals of an ES generation materialised on request: for inspection, tests and the torcheggroll API.

The routed forward never forms ``W + sigma * E_i``; these methods of
:class:`~populora.EggrollES` (its base :class:`MaterialisedIndividuals`) do,
``m`` copies of every evolved parameter at a time, computed in float64 for a
float64 parameter (float32 otherwise) and cast to the parameter's dtype.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from populora.checks import check_index

if TYPE_CHECKING:
    from populora.es.factors import MemberFactors
    from populora.es.noise import PairNoise
    from populora.es.params import ESParam

__all__ = ["MaterialisedIndividuals"]


class MaterialisedIndividuals:
    """Materialised perturbations and parameters of :class:`~populora.EggrollES` (its base class)."""

    # what EggrollES.__init__ sets and defines (declared for the type checker)
    pop_size: int
    _params: list[ESParam]
    _fallback: list[ESParam]
    _factors: MemberFactors

    if TYPE_CHECKING:

        def _noises(self) -> dict[str, PairNoise]: ...

        def _sigma_now(self) -> float: ...

    def individual_params(self, individual: int) -> dict[str, Tensor]:
        """``{name: W + sigma * E_i}`` of one individual ``i`` of the current generation (materialised).

        Raises:
            InvalidIndexError: (an ``IndexError``) ``individual`` outside ``[0, pop_size)``.
        """
        individual = check_index("individual", individual, self.pop_size)
        return {name: stack[0] for name, stack in self.population_params([individual]).items()}

    @torch.no_grad()
    def perturbations(self, individuals: Sequence[int] | None = None) -> dict[str, Tensor]:
        """``{name: (m, *shape)}``: ``sigma * E_i`` of the given individuals (default all ``N``), materialised.

        For inspection and tests; the routed forward never forms these.
        Individual ``i + N/2`` is exactly ``-1`` times individual ``i`` when
        antithetic.
        """
        ids = self._ids(individuals)
        noises, sigma = self._noises(), self._sigma_now()
        return {p.name: self._factors.perturbation(p, noises[p.name], sigma, ids) for p in self._params}

    def _ids(self, individuals: Sequence[int] | None) -> Tensor:
        if individuals is None:
            return torch.arange(self.pop_size)
        if isinstance(individuals, Tensor):
            individuals = individuals.tolist()
        return torch.tensor([check_index("individual", i, self.pop_size) for i in individuals], dtype=torch.long)

    @torch.no_grad()
    def _fallback_values(self, ids: Tensor) -> dict[str, Tensor]:
        """``{name: (m, *shape)}`` members' values of the unroutable parameters (the fallback forward's)."""
        noises, sigma = self._noises(), self._sigma_now()
        out = {}
        for p in self._fallback:
            delta = self._factors.perturbation(p, noises[p.name], sigma, ids)
            out[p.name] = (p.param.detach().to(delta.dtype) + delta).to(p.param.dtype)
        return out

    @torch.no_grad()
    def population_params(self, individuals: Sequence[int] | None = None) -> dict[str, Tensor]:
        """``{name: (m, *shape)}`` perturbed parameters ``W + sigma * E_i`` (default all ``N`` individuals).

        Materialises ``m`` copies of every evolved parameter: for inspection,
        tests and the torcheggroll API, never used by the routed forward.
        Computed in float64 for a float64 parameter (float32 otherwise), then
        cast to the parameter's dtype.
        """
        params = {p.name: p.param for p in self._params}
        return {
            name: (params[name].detach().to(delta.dtype) + delta).to(params[name].dtype)
            for name, delta in self.perturbations(individuals).items()
        }
