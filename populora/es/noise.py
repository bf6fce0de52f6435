"""EggRoll noise: low-rank factors regenerated from a seed, and the torcheggroll utilities.

Every perturbation is a pure function of ``(seed, parameter name, epoch, pair)``
(``epoch = generation // noise_reuse``): :func:`stable_seed` hashes the first
three with BLAKE2b (Python's ``hash()`` is salted per process, so it would
give every rank different noise) and seeds a ``torch.Generator`` on the
parameter's device, which draws the blocks of all antithetic pairs at once;
pair ``k``'s block is slice ``k`` of that draw. Nothing of size
``N * e * d`` is ever stored: :class:`PairNoise` holds ``pairs * r * (e + d)``
numbers per matrix.

A matrix ``W`` of shape ``(R, C)`` (``(e, d)`` for ``nn.Linear``, ``(V, e)``
for ``nn.Embedding``) is perturbed for pair ``k`` by
``E_k = A_k B_k^T / sqrt(r)`` with ``A_k (R, r)``, ``B_k (C, r)`` standard
normal, so every entry of ``E_k`` has unit variance whatever ``r``.

The four torcheggroll 0.2.0 utilities at the bottom keep its signatures and
semantics (not its random streams): they materialise noise, by contract.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping
from dataclasses import dataclass

import torch
from torch import Tensor

from populora.checks import check_float, check_int, check_seed
from populora.errors import FitnessError, InvalidValueError
from populora.operators.shaping import check_real_tensor, zscore

__all__ = [
    "PairNoise",
    "compute_es_gradient",
    "draw_noise",
    "generate_lora_noise",
    "generate_noise_for_shapes",
    "generate_standard_noise",
    "stable_seed",
]


def stable_seed(*parts: object) -> int:
    """A 63-bit seed from ``parts``, identical in every process and on every platform.

    Example:
        >>> stable_seed(0, "0.weight", 3) == stable_seed(0, "0.weight", 3)
        True
    """
    text = "\x1f".join(repr(p) for p in parts).encode()
    return int.from_bytes(hashlib.blake2b(text, digest_size=8).digest(), "little") & ((1 << 63) - 1)


@dataclass(frozen=True)
class PairNoise:
    """The noise of one parameter for one epoch, per antithetic pair.

    Attributes:
        at: ``(pairs, r, R)`` the row factors ``A_k`` transposed (matrices), else ``None``.
        bt: ``(pairs, r, C)`` the column factors ``B_k`` transposed (matrices), else ``None``.
        full: ``(pairs, *shape)`` full Gaussian noise (vectors), else ``None``.
    """

    at: Tensor | None = None
    bt: Tensor | None = None
    full: Tensor | None = None

    @property
    def rank(self) -> int:
        return 0 if self.at is None else self.at.shape[1]

    def dense(self, pair_weights: Tensor, dtype: torch.dtype = torch.float32) -> Tensor:
        """``sum_k w_k E_k`` from the factors: one matmul with inner size ``pairs * r``.

        Args:
            pair_weights: ``(pairs,)`` weight of each pair.
            dtype: the precision to compute in (the factors are float32 draws,
                cast up losslessly for float64).

        Returns:
            ``(R, C)`` for a matrix (``E_k = A_k B_k^T / sqrt(r)``), ``shape`` otherwise.
        """
        w = pair_weights.to(device=self._any.device, dtype=dtype)
        if self.full is not None:
            return torch.tensordot(w, self.full.to(dtype), dims=1)
        assert self.at is not None and self.bt is not None, "no full noise: low-rank factors"
        pairs, r, rows = self.at.shape
        weighted = (self.at.to(dtype) * (w / math.sqrt(r))[:, None, None]).reshape(pairs * r, rows)  # (k r, R)
        return weighted.T @ self.bt.to(dtype).reshape(pairs * r, -1)  # (R, k r) @ (k r, C) -> (R, C)

    @property
    def _any(self) -> Tensor:
        any_ = self.full if self.full is not None else self.at
        assert any_ is not None, "a PairNoise holds full noise or factors"
        return any_


def draw_noise(
    seed: int,
    name: str,
    epoch: int,
    pairs: int,
    shape: tuple[int, ...],
    rank: int | None,
    device: torch.device,
    out: Tensor | None = None,
) -> PairNoise:
    """Regenerate one parameter's noise for one epoch (float32, on ``device``).

    Args:
        seed: the run's seed.
        name: the parameter's name (``model.named_parameters()``).
        epoch: ``generation // noise_reuse``.
        pairs: number of antithetic pairs (members when not antithetic).
        shape: the parameter's shape.
        rank: low rank for a 2-D parameter (cut to ``min(rank, R, C)``), or
            ``None`` for full Gaussian noise.
        device: where to draw (the generator lives there too).
        out: optional float32 buffer of the drawn block's shape to draw into
            (``(pairs, r, R + C)`` or ``(pairs, *shape)``), reused across epochs.

    Returns:
        :class:`PairNoise`: factors ``(pairs, r, R)`` / ``(pairs, r, C)`` from one
        ``(pairs, r, R + C)`` draw, or ``(pairs, *shape)`` full noise.
    """
    device = torch.device(device)
    generator = torch.Generator(device=device).manual_seed(stable_seed("populora.es", seed, name, epoch))
    if rank is None:
        return PairNoise(full=torch.randn(pairs, *shape, generator=generator, device=device, out=out))
    rows, cols = shape
    r = min(rank, rows, cols)
    block = torch.randn(
        pairs, r, rows + cols, generator=generator, device=device, out=out
    )  # a (R + C, r) block per pair
    return PairNoise(at=block[:, :, :rows], bt=block[:, :, rows:])


def pair_signs(pop_size: int, antithetic: bool, device: torch.device) -> tuple[Tensor, Tensor]:
    """``(N,)`` pair of each member and ``(N,)`` sign: first half ``+``, second half ``-``."""
    if not antithetic:
        return torch.arange(pop_size, device=device), torch.ones(pop_size, device=device)
    half = pop_size // 2
    pair = torch.arange(pop_size, device=device) % half
    sign = torch.ones(pop_size, device=device)
    sign[half:] = -1
    return pair, sign


# ----------------------------------------------------------------------------- torcheggroll 0.2.0 utilities


def _check_device(device: torch.device | str | None, like: Tensor | None = None) -> torch.device:
    if device is None:
        return like.device if like is not None else torch.device("cpu")
    return torch.device(device)


def generate_lora_noise(param: Tensor, rank: int, sigma: float, seed: int, device: torch.device) -> Tensor:
    """Low-rank noise ``sigma * A @ B.T / sqrt(r)`` shaped like a 2-D ``param``.

    ``A (R, r)`` and ``B (C, r)`` are standard normal from a generator seeded
    with ``seed``; ``r = min(rank, R, C)``, so entries have standard deviation
    ``sigma`` whatever the rank. Same seed, same noise.

    Args:
        param: a 2-D tensor ``(R, C)`` (only its shape is read).
        rank: the rank ``r >= 1``.
        sigma: noise scale.
        seed: generator seed.
        device: where the noise is drawn.

    Returns:
        ``(R, C)`` float32 noise on ``device``.

    Raises:
        InvalidValueError: (a ``ValueError``) if ``param`` is not 2-D or ``rank < 1``.
        InvalidTypeError: (a ``TypeError``) a ``rank``, ``sigma`` or ``seed`` that is not a number.
    """
    if param.dim() != 2:
        raise InvalidValueError(
            f"`param` must be 2-D for low-rank noise, got shape {tuple(param.shape)}; "
            "use generate_standard_noise for other shapes"
        )
    rank = check_int("rank", rank, low=1)
    sigma = check_float("sigma", sigma)
    device = _check_device(device, param)
    rows, cols = param.shape
    r = min(rank, rows, cols)
    generator = torch.Generator(device=device).manual_seed(check_seed("seed", seed))
    block = torch.randn(rows + cols, r, generator=generator, device=device)
    return (sigma / math.sqrt(r)) * (block[:rows] @ block[rows:].T)


def generate_standard_noise(param: Tensor, sigma: float, seed: int, device: torch.device) -> Tensor:
    """Full Gaussian noise ``sigma * N(0, 1)`` shaped like ``param`` (float32, on ``device``)."""
    sigma = check_float("sigma", sigma)
    device = _check_device(device, param)
    generator = torch.Generator(device=device).manual_seed(check_seed("seed", seed))
    return sigma * torch.randn(param.shape, generator=generator, device=device)


def generate_noise_for_shapes(
    shapes: Mapping[str, tuple[int, ...]],
    ranks: Mapping[str, int | None],
    pop_size: int,
    sigma: float,
    epoch: int,
    device: torch.device,
    dtype: torch.dtype = torch.float32,
    antithetic: bool = True,
) -> dict[str, Tensor]:
    """Noise for a whole population over several tensors, materialised ``(N, *shape)``.

    A 2-D shape with an int rank in ``ranks`` gets low-rank noise
    ``sigma * A_k B_k^T / sqrt(r)``; any other shape, or rank ``None`` (or a
    missing key), gets full Gaussian noise. With ``antithetic`` the second half
    of the members are the negatives of the first half (member ``i + N/2`` of
    member ``i``). The noise is a pure function of ``(name, epoch)``:
    ``noise[name][i]`` is the perturbation ``sigma * E_i`` that
    :class:`~populora.EggrollES` (``seed=0``, same ``N`` and rank) gives the
    parameter called ``name`` at generation ``epoch``.

    Args:
        shapes: ``{name: shape}``.
        ranks: ``{name: rank or None}``.
        pop_size: ``N`` members (even when ``antithetic``).
        sigma: noise scale.
        epoch: generation (or ``generation // noise_reuse``).
        device: where to draw.
        dtype: dtype of the returned noise.
        antithetic: mirrored pairs.

    Returns:
        One ``(N, *shape)`` tensor per name (``{name -> noise}``).

    Raises:
        InvalidValueError: (a ``ValueError``) odd ``pop_size`` with ``antithetic``, ``pop_size < 1``,
            or a rank < 1.

    Example:
        >>> noise = generate_noise_for_shapes({"W": (3, 2), "b": (3,)}, {"W": 1, "b": None}, 4, 0.1, 0, "cpu")
        >>> noise["W"].shape, bool((noise["W"][:2] == -noise["W"][2:]).all())
        (torch.Size([4, 3, 2]), True)
    """
    pop_size = check_int("pop_size", pop_size, low=1)
    sigma = check_float("sigma", sigma)
    epoch = check_int("epoch", epoch)
    if antithetic and pop_size % 2:
        raise InvalidValueError(f"pop_size must be even when using antithetic sampling, got pop_size={pop_size}")
    device = torch.device(device)
    pairs = pop_size // 2 if antithetic else pop_size
    pair, sign = pair_signs(pop_size, antithetic, device)
    out = {}
    for name, shape in shapes.items():
        shape = tuple(int(s) for s in shape)
        rank = ranks.get(name)
        if rank is not None:
            rank = check_int(f"ranks[{name!r}]", rank, low=1)
        noise = draw_noise(0, name, epoch, pairs, shape, rank if len(shape) == 2 else None, device)
        work = torch.float64 if dtype == torch.float64 else torch.float32  # float64 asked: computed in float64
        if noise.full is not None:
            per_pair = noise.full.to(work)
        else:
            r = noise.rank
            assert noise.at is not None and noise.bt is not None, "no full noise: low-rank factors"
            per_pair = torch.bmm(noise.at.transpose(1, 2).to(work), noise.bt.to(work)) / math.sqrt(r)  # (pairs, R, C)
        per_member = per_pair[pair] * (sign.to(work) * sigma).view(-1, *[1] * len(shape))
        out[name] = per_member.to(dtype)
    return out


def compute_es_gradient(
    noise: Mapping[str, Tensor], rewards: Tensor, normalize_fitness: bool = True
) -> dict[str, Tensor]:
    """ES gradient ``sqrt(N) * mean_i(z_i * noise_i)`` for each tensor (higher reward is better).

    ``z`` is the z-score of ``rewards`` (population std, centring only when
    the std is ~0) or, with ``normalize_fitness=False``, the rewards minus
    their mean. Add ``lr`` times the result to the parameters to ascend.

    Args:
        noise: ``{name: (N, *shape)}``, e.g. from :func:`generate_noise_for_shapes`.
        rewards: ``(N,)`` fitness per member, higher is better.
        normalize_fitness: z-score (default) or mean-centre.

    Returns:
        One gradient per noise tensor, of that tensor's ``shape`` (``{name -> shape}``).

    Raises:
        FitnessError: (a ``ValueError``) if ``rewards`` is not ``(N,)`` for the
            ``N`` of every noise tensor, or contains NaN.
    """
    if not isinstance(rewards, Tensor):  # Python floats are doubles: keep their precision
        try:
            rewards = torch.as_tensor(rewards, dtype=torch.float64)
        except (TypeError, ValueError, RuntimeError):
            raise FitnessError(
                f"`rewards` must be a tensor or a sequence of numbers, got {type(rewards).__name__}"
            ) from None
    try:
        r = check_real_tensor(rewards, "rewards")
    except (TypeError, ValueError) as error:
        raise FitnessError(str(error)) from None
    if r.dim() != 1:
        raise FitnessError(f"`rewards` must be 1-D (one per member), got shape {tuple(r.shape)}")
    for name, n in noise.items():
        if n.dim() == 0 or n.shape[0] != r.shape[0]:
            raise FitnessError(
                f"`rewards` has {r.shape[0]} values but noise[{name!r}] has shape "
                f"{tuple(n.shape)}; expected ({r.shape[0]}, ...)"
            )
    z = zscore(r) if normalize_fitness else r - r.mean()  # in the rewards' precision (float64 stays float64)
    scale = 1.0 / math.sqrt(r.shape[0])  # sqrt(N) * mean = sum / sqrt(N)
    return {name: torch.tensordot(z.to(n.device, n.dtype) * scale, n, dims=1) for name, n in noise.items()}
