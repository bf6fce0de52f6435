"""Each generation's noise, drawn into reused buffers, laid out per member for the routed forward.

Member ``i`` (pair ``k``, sign ``s_i``) perturbs a matrix by
``sigma * s_i * A_k B_k^T / sqrt(r)``: in routing terms an adapter whose
``down`` carries ``sigma * s_i / sqrt(r)`` and the column factor, and whose
``up`` is the row factor (for ``nn.Embedding`` the roles swap: ``down`` is
the ``(V, r)`` table gathered by token). Biases get ``sigma * s_i * eps_k``.
The stacks are written half by half (``+`` then ``-``) into buffers kept
from one generation to the next, so a step allocates nothing of size
``N * r * (d + e)``.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from populora.adapters import Adapter
from populora.es.noise import PairNoise, draw_noise, pair_signs
from populora.es.params import ESParam

__all__ = ["MemberFactors", "compute_dtype"]


class MemberFactors:
    """The factors of every generation of one ES run.

    Args:
        params: the evolved parameters.
        targets: ``{path: module}`` the layers the router wraps (their adapters are built here), in model order.
        pop_size: ``N``.
        antithetic: mirrored pairs (``pairs = N / 2``), else ``pairs = N``.
        device: where noise and stacks live.
    """

    def __init__(
        self,
        params: list[ESParam],
        targets: dict[str, nn.Module],
        pop_size: int,
        antithetic: bool,
        device: torch.device,
    ):
        self.params, self.targets = params, targets
        self.pop_size, self.antithetic, self.device = pop_size, antithetic, device
        self.pairs = pop_size // 2 if antithetic else pop_size
        self._by_use = {(o.path, o.attr): p for p in params if p.routed for o in p.owners}
        self._buffers: dict[tuple, Tensor] = {}
        self._noise: tuple[tuple[int, int], dict[str, PairNoise]] | None = None

    def noises(self, seed: int, noise_epoch: int) -> dict[str, PairNoise]:
        """``{name: PairNoise}`` of noise epoch ``noise_epoch`` (drawn once per noise epoch, into reused buffers)."""
        if self._noise is None or self._noise[0] != (seed, noise_epoch):
            noises = {}
            for p in self.params:
                shape = tuple(p.param.shape)
                size = (self.pairs, *shape) if p.rank is None else (self.pairs, p.rank, sum(shape))
                buf = self._buffer(("noise", p.name), size, torch.float32)
                noises[p.name] = draw_noise(seed, p.name, noise_epoch, self.pairs, shape, p.rank, self.device, out=buf)
            self._noise = ((seed, noise_epoch), noises)
        return self._noise[1]

    def clear(self) -> None:
        """Forget the drawn noise (the next :meth:`noises` draws again)."""
        self._noise = None

    def _buffer(self, key: tuple, size: tuple[int, ...], dtype: torch.dtype) -> Tensor:
        buf = self._buffers.get(key)
        if buf is None or tuple(buf.shape) != tuple(size) or buf.dtype != dtype:
            buf = self._buffers[key] = torch.empty(size, dtype=dtype, device=self.device)
        return buf

    def _stack(
        self, key: tuple, per_pair: Tensor, scale: float | None, dtype: torch.dtype, out: Tensor | None = None
    ) -> Tensor:
        """``(pairs, ...) -> (N, ...)``: member ``i`` gets ``s_i * scale * per_pair[k(i)]`` (``scale=None``: no sign).

        Written into ``out`` when given (a view of a larger buffer), else into the buffer ``key``.
        """
        if out is None:
            out = self._buffer(key, (self.pop_size, *per_pair.shape[1:]), dtype)
        halves = (out[: self.pairs], out[self.pairs :]) if self.antithetic else (out,)
        if per_pair.dtype != dtype:  # e.g. float64 stacks from float32 draws: scale in float64
            per_pair = per_pair.to(dtype)
        for half, sign in zip(halves, (1.0, -1.0)):
            if scale is None:
                half.copy_(per_pair)
            else:
                torch.mul(per_pair, sign * scale, out=half)
        return out

    def adapters(self, noises: dict[str, PairNoise], sigma: float) -> list[Adapter]:
        """Every target's member stacks in the routing layout (:class:`~populora.routing.Adapter`).

        Linear: ``down (N, r, d)``, ``up (N, r, e)``; Embedding: ``down (N, V, r)``,
        ``up (N, r, e)``; ``bias (N, e)`` for a perturbed bias. A Linear whose
        weight is not evolved (bias only) gets rank-0 stacks.
        """
        adapters = []
        for path, module in self.targets.items():
            assert isinstance(module, (nn.Linear, nn.Embedding)), "the router wraps only these"
            weight, bias = self._by_use.get((path, "weight")), self._by_use.get((path, "bias"))
            dtype = module.weight.dtype
            folded = None
            if bias is not None and bias.param.dtype == dtype and not isinstance(module, nn.Embedding):
                # up and the bias noise in ONE (N, r+1, e) buffer: up = rows [:r], bias = row r, the layout in
                # which the routed forward adds both with one product (see fold.folded_stack), read in place
                rank = 0 if weight is None else noises[weight.name].rank
                folded = self._buffer((path, "folded"), (self.pop_size, rank + 1, module.out_features), dtype)
            if weight is None:
                assert isinstance(module, nn.Linear), "an Embedding is a target only for its weight"
                down = self._buffer((path, "down"), (self.pop_size, 0, module.in_features), dtype)
                up = (
                    self._buffer((path, "up"), (self.pop_size, 0, module.out_features), dtype)
                    if folded is None
                    else folded[:, :0]
                )
            else:
                noise = noises[weight.name]
                assert noise.at is not None and noise.bt is not None, "a weight matrix's noise is low-rank"
                coef = sigma / math.sqrt(noise.rank)  # sigma * s_i / sqrt(r), the sign added per half
                if isinstance(module, nn.Embedding):  # W (V, e): down (N, V, r) from A, up (N, r, e) from B
                    down = self._stack((path, "down"), noise.at.transpose(1, 2), coef, dtype)
                    up = self._stack((path, "up"), noise.bt, None, dtype)
                else:  # W (e, d): down (N, r, d) from B, up (N, r, e) from A
                    down = self._stack((path, "down"), noise.bt, coef, dtype)
                    up = self._stack(
                        (path, "up"), noise.at, None, dtype, out=None if folded is None else folded[:, : noise.rank]
                    )
            bias_noise = None
            if bias is not None:  # (N, e)
                full = noises[bias.name].full
                assert full is not None, "a bias's noise is full"
                bias_noise = self._stack(
                    (path, "bias"),
                    full,
                    sigma,
                    bias.param.dtype,
                    out=None if folded is None else folded[:, -1],
                )
            adapters.append(Adapter(down, up, bias_noise))
        return adapters

    def perturbation(self, p: ESParam, noise: PairNoise, sigma: float, members: Tensor | None = None) -> Tensor:
        """``(m, *shape)``: ``sigma * E_i`` of the given members (default all ``N``), materialised.

        Computed in :func:`compute_dtype` of the parameter (float64 for a float64 parameter).
        """
        pair, sign = pair_signs(self.pop_size, self.antithetic, self.device)
        if members is not None:
            members = members.to(self.device)
            pair, sign = pair[members], sign[members]
        dtype = compute_dtype(p.param.dtype)
        if noise.full is not None:
            per_member = noise.full[pair].to(dtype)
        else:  # (u, R, r) @ (u, r, C) over the u distinct pairs asked for: mirrors are exact negatives
            assert noise.at is not None and noise.bt is not None, "no full noise: low-rank factors"
            used, inverse = torch.unique(pair, return_inverse=True)
            per_pair = torch.bmm(noise.at[used].transpose(1, 2).to(dtype), noise.bt[used].to(dtype))
            per_member = (per_pair / math.sqrt(noise.rank))[inverse]
        return per_member * (sign.to(dtype) * sigma).view(-1, *[1] * p.param.dim())


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """The precision ES computes a parameter's noise and update in: float64 for float64, else float32."""
    return torch.float64 if dtype == torch.float64 else torch.float32
