"""TorchEggrollES: the torcheggroll 0.2.0 API on top of :class:`~populora.EggrollES`.

Same constructor, defaults, methods, return types and errors as torcheggroll
0.2.0; same semantics, not the same random streams. Differences that only
remove failure modes: the population is evaluated through the routed
low-rank forward (no ``(N, e, d)`` weights unless :meth:`prepare_population`
asks for them), ``loss_fn`` may be non-vmap-safe (a loop takes over),
fitnesses may be lists, and NaN fitnesses raise instead of writing NaN into
the weights. z-scores use the population standard deviation (torcheggroll
divides by the sample one, a step larger by ``sqrt(N / (N - 1))``).
Higher fitness is better.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from populora.checkpoint import atomic_save, load_checkpoint
from populora.checks import check_bool, check_float
from populora.errors import CheckpointError
from populora.es.config import EggrollConfig
from populora.es.core import EggrollES
from populora.es.members import ESStateError
from populora.es.params import call_filter
from populora.es.state import TORCHEGGROLL_FILES

__all__ = ["TorchEggrollES"]


class TorchEggrollES:
    """Evolution strategies with low-rank noise, torcheggroll 0.2.0 style.

    Args:
        model: the model to optimise, in place.
        pop_size: members per step (even when ``antithetic``).
        sigma: noise scale.
        lr: learning rate (plain SGD: ``theta += lr * sqrt(N) * mean(z * sigma * E)``).
        rank: rank of the noise on each matrix.
        device: where to run; inferred from the model when ``None``.
        param_filter: which parameters (among those requiring grad) to
            optimise: ``fn(param, name) -> bool`` in torcheggroll's argument
            order, or ``fn(name) -> bool``.
        normalize_fitness: z-score the fitnesses (``True``) or only subtract their mean.
        antithetic: mirrored pairs: member ``i + N/2`` uses ``-E_i``.

    The noise seed is fixed (0), so two processes building the same model
    draw the same noise. Works with any ``nn.Module``: every selected
    parameter is perturbed. ``nn.Linear`` weights and biases and
    ``nn.Embedding`` weights go through the routed low-rank forward (one
    batched forward for the whole population); any other parameter (a bare
    ``nn.Parameter`` used in any expression, a norm gain, a convolution
    kernel) gets low-rank noise if 2-D and full Gaussian noise otherwise, and
    the members are then evaluated with ``torch.func.functional_call``
    vectorised by ``torch.func.vmap`` (a loop when the model is not
    vmap-safe), as :class:`~populora.EggrollES` with ``perturb_unroutable=True``.

    Raises:
        ValueError: (:class:`~populora.errors.InvalidValueError`) odd
            ``pop_size`` with ``antithetic`` ("pop_size must be even..."), no
            parameter selected ("no parameters selected..."), another bad value.
        TypeError: (:class:`~populora.errors.InvalidTypeError`) an argument of the wrong type.
    """

    def __init__(
        self,
        model: nn.Module,
        pop_size: int = 32,
        sigma: float = 0.02,
        lr: float = 0.05,
        rank: int = 4,
        device: torch.device | None = None,
        param_filter: Callable[..., bool] | None = None,
        normalize_fitness: bool = True,
        antithetic: bool = True,
    ):
        wrapped = (
            None
            if param_filter is None
            else (lambda name, param: call_filter(param_filter, name, param, param_first=True))
        )
        normalize_fitness = check_bool("normalize_fitness", normalize_fitness)
        self.es = EggrollES(
            model,
            pop_size,
            sigma,
            lr,
            rank,
            EggrollConfig(
                seed=0,
                antithetic=antithetic,
                fitness_shaping="zscore" if normalize_fitness else "center",
                perturb_unroutable=True,
            ),
            param_filter=wrapped,
            device=device,
        )
        self.model = self.es.model
        self.pop_size, self.rank = self.es.pop_size, self.es.rank
        self.normalize_fitness, self.antithetic = normalize_fitness, antithetic
        self.device = self.es.device
        self.param_names = self.es.param_names
        self.param_shapes = self.es.param_shapes
        self._population: list[dict[str, Tensor]] | None = None
        self._stacked: dict[str, Tensor] | None = None

    @property
    def sigma(self) -> float:
        return self.es.sigma

    @sigma.setter
    def sigma(self, value: float) -> None:
        self.es.sigma = check_float("sigma", value, low=0.0, low_open=True)

    @property
    def lr(self) -> float:
        return self.es.lr

    @lr.setter
    def lr(self, value: float) -> None:
        value = check_float("lr", value, low=0.0)
        for group in self.es.optimizer.param_groups:
            group["lr"] = value

    @property
    def epoch(self) -> int:
        """Steps taken so far (the generation)."""
        return self.es.generation

    def step(self, inputs: Tensor, loss_fn: Callable[[Tensor, Tensor], Tensor], targets: Tensor) -> float:
        """One ES step on a batch shared by every member.

        Args:
            inputs: ``(batch, ...)``, broadcast to all members.
            loss_fn: ``loss_fn(outputs (batch, ...), targets) -> scalar``, lower is better.
            targets: passed to ``loss_fn``.

        Returns:
            Mean fitness over the population (fitness = -loss, higher is better).
        """
        stats = self.es.step(inputs, loss_fn, targets)
        self._population = self._stacked = None
        return stats.mean

    def prepare_population(self) -> list[dict[str, Tensor]]:
        """Materialise every member's perturbed parameters: one ``{name: tensor}`` per member.

        The dicts hold the evolved parameters only (``functional_call`` takes
        the others from the model); their tensors are views of
        :meth:`get_stacked_params`. This is the only place ``N`` copies of the
        weights are made.
        """
        self._stacked = self.es.population_params()
        self._population = [{name: t[i] for name, t in self._stacked.items()} for i in range(self.pop_size)]
        return self._population

    def get_stacked_params(self) -> dict[str, Tensor]:
        """``{name: (pop_size, *shape)}`` of the prepared population, for ``torch.func.vmap``.

        Computed in float64 for a float64 model.

        Raises:
            ESStateError: (a ``RuntimeError``) before :meth:`prepare_population` (or after the update it fed).
        """
        if self._stacked is None:
            raise ESStateError("Call prepare_population() first")
        return self._stacked

    def apply_fitness_scores(self, fitnesses: Tensor) -> float:
        """Update the parameters from the prepared population's fitnesses (higher is better).

        Args:
            fitnesses: ``(pop_size,)`` tensor (or sequence), in member order.

        Returns:
            The mean fitness.

        Raises:
            ESStateError: (a ``RuntimeError``) before :meth:`prepare_population`.
            FitnessError: (a ``ValueError``) wrong number of fitnesses ("Expected 32 fitness scores,
                got 31") or NaN.
        """
        if self._stacked is None:
            raise ESStateError("Call prepare_population() first")
        stats = self.es.tell(fitnesses)
        self._population = self._stacked = None
        return stats.mean

    def state_dict(self) -> dict[str, Any]:
        """Optimizer state for checkpointing: a snapshot (copies), tensors and plain values only,
        so ``torch.load`` reads it as is."""
        state = self.es.state_dict()
        state["epoch"] = self.es.generation
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Load :meth:`state_dict`: validated whole before anything changes.

        Raises:
            CheckpointError: (a ``ValueError``) a missing or bad key (named); nothing has changed.
        """
        self.es.load_state_dict(state)
        self._population = self._stacked = None

    def save(self, path: str | Path) -> Path:
        """Write :meth:`state_dict` to ``path`` atomically (a verified ``TorchEggrollES`` checkpoint)."""
        return atomic_save(self.state_dict(), path, kind="TorchEggrollES")

    def load(self, path: str | Path) -> None:
        """Resume from a file written by :meth:`save` (all or nothing).

        Only files written by :meth:`save` are read: a plain ``torch.save`` file (torcheggroll's own checkpoints
        are) is refused without being unpickled, saying that torcheggroll files are not supported.

        Raises:
            FileNotFoundError: nothing at ``path``.
            CheckpointError: empty, truncated, corrupted or foreign file (a plain ``torch.save`` file: torcheggroll
                checkpoints are not supported), or a state that does not fit (the file and the key are named).
        """
        state = load_checkpoint(path, kind="TorchEggrollES", foreign_hint=TORCHEGGROLL_FILES)
        try:
            self.load_state_dict(state)
        except CheckpointError as error:
            raise CheckpointError(f"checkpoint {str(path)!r}: {error}") from None

    def __repr__(self) -> str:
        return (
            f"TorchEggrollES(pop_size={self.pop_size}, sigma={self.sigma}, lr={self.lr}, rank={self.rank}, "
            f"epoch={self.epoch})"
        )
