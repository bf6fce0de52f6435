"""Population: P individuals as per-individual LoRA adapters on one shared model."""

from populora.population.evolution import Evolution
from populora.population.population import Population, SelectionResult

__all__ = ["Evolution", "Population", "SelectionResult"]
