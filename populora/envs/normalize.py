"""Running observation normalisation, frozen within a generation.

:class:`ObsNormalizer` is the frozen map ``obs -> clamp((obs - mean) / std)``
the policy sees; :class:`ObsStatistics` gathers the observations met during
a generation and folds them in between generations (summed over ranks), so a
fitness never depends on how episodes were scheduled.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor, nn

from populora import distributed as dist
from populora.checks import is_int, is_real
from populora.errors import CheckpointError

__all__ = ["ObsNormalizer", "ObsStatistics"]


class ObsNormalizer(nn.Module):
    """``obs -> clamp((obs - mean) / sqrt(var + eps), -clip, clip)``, statistics frozen in buffers.

    The evolved policy returned by :func:`~populora.evolve_with_env` with
    ``normalize_obs=True`` is ``nn.Sequential(ObsNormalizer, model)``, so it
    takes raw observations.

    Args:
        dim: observation size ``D``.
        clip: bound of the normalised values.
        eps: added to the variance.
    """

    # the buffers registered in __init__ (declared: nn.Module's attribute lookup is untyped)
    mean: Tensor
    var: Tensor
    count: Tensor

    def __init__(self, dim: int, clip: float = 10.0, eps: float = 1e-8):
        super().__init__()
        self.clip = float(clip)
        self.eps = float(eps)
        self.register_buffer("mean", torch.zeros(dim, dtype=torch.float64))
        self.register_buffer("var", torch.ones(dim, dtype=torch.float64))
        self.register_buffer("count", torch.zeros((), dtype=torch.float64))
        self._cache: tuple[torch.dtype, torch.device, Tensor, Tensor] | None = None

    def forward(self, obs: Tensor) -> Tensor:
        """``(n, D)`` raw observations -> ``(n, D)`` normalised, in ``obs``' dtype."""
        cache = self._cache
        if cache is None or cache[0] != obs.dtype or cache[1] != obs.device:
            mean = self.mean.to(device=obs.device, dtype=obs.dtype)
            inv_std = torch.rsqrt(self.var + self.eps).to(device=obs.device, dtype=obs.dtype)
            cache = self._cache = (obs.dtype, obs.device, mean, inv_std)
        return ((obs - cache[2]) * cache[3]).clamp_(-self.clip, self.clip)

    def _load_from_state_dict(self, *args: Any, **kwargs: Any) -> None:
        self._cache = None
        super()._load_from_state_dict(*args, **kwargs)

    def update_(self, count: float, mean: Tensor, var: Tensor) -> None:
        """Fold in a batch's ``count``, ``mean (D,)`` and (population) ``var (D,)`` (Chan et al.)."""
        if count <= 0:
            return
        with torch.no_grad():
            total = self.count + count
            delta = mean - self.mean
            m2 = self.var * self.count + var * count + delta.pow(2) * self.count * count / total
            self.mean.add_(delta * count / total)
            self.var.copy_(m2 / total)
            self.count.copy_(total)
        self._cache = None

    def extra_repr(self) -> str:
        return f"dim={self.mean.numel()}, clip={self.clip}, count={int(self.count)}"


class ObsStatistics:
    """Pending observation sums of the current generation, and the frozen normaliser.

    Sums are kept in float64, shifted by the frozen mean. :meth:`advance`
    folds them in when the population's generation changes, after summing
    them over ranks, so every rank keeps the same normaliser.
    """

    FOLD_ROWS = 4096
    """Observed rows kept before :meth:`fold` sums them (bounds the memory held within a rollout)."""

    def __init__(self, dim: int, clip: float = 10.0):
        self.normalizer = ObsNormalizer(dim, clip=clip)
        self.generation: int | None = None
        self._zero()

    def _zero(self) -> None:
        dim = self.normalizer.mean.numel()
        self._pending = torch.zeros(2 * dim + 1, dtype=torch.float64)  # [sum (D), sum sq (D), count]
        self._rows: list[Tensor] = []  # observed, not yet summed
        self._row_count = 0

    @property
    def pending(self) -> Tensor:
        """``(2D + 1,)`` float64: ``[sum (D), sum of squares (D), count]`` of the observations, shifted by the mean."""
        self.fold()
        return self._pending

    @pending.setter
    def pending(self, value: Tensor) -> None:
        self._rows, self._row_count = [], 0
        self._pending = value

    def observe(self, obs: Tensor) -> None:
        """Add ``(k, D)`` raw observations (kept as a float64 copy; summed by :meth:`fold`).

        One copy per timestep instead of the sums' dozen small ops; the rows
        are summed in batches of about :data:`FOLD_ROWS`, and at the end of
        every rollout (so the sums depend only on the observations and the
        rollouts that met them, never on when they are read).
        """
        self._rows.append(obs.detach().to(device="cpu", dtype=torch.float64, copy=True))
        self._row_count += obs.shape[0]
        if self._row_count >= self.FOLD_ROWS:
            self.fold()

    def fold(self) -> None:
        """Sum the observed rows into the pending sums (the end of a rollout calls it)."""
        if not self._rows:
            return
        rows = self._rows[0] if len(self._rows) == 1 else torch.cat(self._rows)
        self._rows, self._row_count = [], 0
        x = rows.sub_(self.normalizer.mean)
        dim = x.shape[1]
        self._pending[:dim] += x.sum(0)
        self._pending[dim : 2 * dim] += x.pow(2).sum(0)
        self._pending[-1] += x.shape[0]

    def advance(self, generation: int) -> None:
        """Fold the pending sums in (over all ranks) if ``generation`` differs from the last one seen.

        Every rank must call this at the same points (it may all-reduce).
        """
        if self.generation == generation:
            return
        if self.generation is not None:
            pending = sum_over_ranks(self.pending)
            dim = self.normalizer.mean.numel()
            count = float(pending[-1])
            if count > 0:
                shifted_mean = pending[:dim] / count
                var = (pending[dim : 2 * dim] / count - shifted_mean.pow(2)).clamp_(min=0.0)
                self.normalizer.update_(count, self.normalizer.mean + shifted_mean, var)
        self._zero()
        self.generation = generation

    def state_dict(self) -> dict[str, Any]:
        """A snapshot (copies) of everything an exact resume needs.

        ``{'normalizer': {'mean' (D,), 'var' (D,), 'count' ()}, 'clip',
        'pending' (2D + 1,), 'generation'}``, tensors float64.
        """
        return {
            "normalizer": {k: v.detach().clone() for k, v in self.normalizer.state_dict().items()},
            "clip": self.normalizer.clip,
            "pending": self.pending.clone(),
            "generation": self.generation,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore :meth:`state_dict` (copied in); everything is checked before anything is written.

        Raises:
            CheckpointError: a missing key, a tensor of another shape (``D``
                is this object's observation size), a bad clip or generation.
        """
        dim = self.normalizer.mean.numel()
        check_obs_state(state, dim)
        self.normalizer.load_state_dict({k: v.to(torch.float64) for k, v in state["normalizer"].items()})
        self.normalizer.clip = float(state["clip"])
        self.pending = state["pending"].detach().to(torch.float64, copy=True)
        self.generation = None if state["generation"] is None else int(state["generation"])


def check_obs_state(state: Any, dim: int | None) -> int:
    """Check an :meth:`ObsStatistics.state_dict` (of observation size ``dim``, any when ``None``); its ``D``."""
    if not isinstance(state, Mapping):
        raise CheckpointError(f"observation statistics state must be a dict, got {type(state).__name__}")
    missing = [k for k in ("normalizer", "clip", "pending", "generation") if k not in state]
    norm = state.get("normalizer")
    if not missing and isinstance(norm, Mapping):
        missing = [f"normalizer.{k}" for k in ("mean", "var", "count") if k not in norm]
    if missing:
        raise CheckpointError(f"observation statistics state lacks {missing}")
    if not isinstance(norm, Mapping) or not all(isinstance(norm[k], Tensor) for k in ("mean", "var", "count")):
        raise CheckpointError("observation statistics state's 'normalizer' must map mean / var / count to tensors")
    size = norm["mean"].numel() if dim is None else dim
    shapes = {
        "normalizer.mean": (norm["mean"], (size,)),
        "normalizer.var": (norm["var"], (size,)),
        "normalizer.count": (norm["count"], ()),
        "pending": (state["pending"], (2 * size + 1,)),
    }
    for name, (t, shape) in shapes.items():
        if not isinstance(t, Tensor) or tuple(t.shape) != shape:
            got = tuple(t.shape) if isinstance(t, Tensor) else type(t).__name__
            raise CheckpointError(
                f"observation statistics state's {name!r} has shape {got}, expected {shape} "
                f"(observations of size {size})"
            )
    clip, gen = state["clip"], state["generation"]
    if not is_real(clip) or not clip > 0:
        raise CheckpointError(f"observation statistics state's 'clip' must be a number > 0, got {clip!r}")
    if gen is not None and not is_int(gen):
        raise CheckpointError(f"observation statistics state's 'generation' must be an int or None, got {gen!r}")
    return size


def sum_over_ranks(values: Tensor) -> Tensor:
    """``values`` summed over the ranks (float64; ``values`` itself without torch.distributed)."""
    if not dist.is_distributed():
        return values
    world, me, n = dist.world_size(), dist.process_rank(), values.numel()
    gathered = dist.all_gather_values(range(me * n, (me + 1) * n), values, world * n)
    return gathered.to(torch.float64).view(world, n).sum(0)
