"""One index tensor on every device a population's targets use (a model spread by ``device_map``).

A population whose model is spread over devices keeps each target's stacks
on that target's device, while its ids, fitnesses and generator live on the
population's device. A tensor on one accelerator cannot index (or be mixed
with) a tensor on another, so every operator and write reads its ids, masks
and per-child draws through :class:`PerDevice`: each target gets them on its
own stack's device, copied once per device per call. On a population on one
device nothing is copied (the tensor itself is returned), and copies are
exact, so results and random draws are bit for bit those of the single-device
code.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["PerDevice"]


class PerDevice:
    """A tensor and its copies on other devices, each made at most once.

    Example:
        >>> ids = PerDevice(torch.tensor([2, 0]))
        >>> ids.on(torch.device("cpu")) is ids.tensor
        True
        >>> ids.on(torch.device("meta")).device
        device(type='meta')
    """

    __slots__ = ("_copies", "tensor")

    def __init__(self, tensor: Tensor):
        self.tensor = tensor
        self._copies: dict[torch.device, Tensor] = {tensor.device: tensor}

    def on(self, device: torch.device | str) -> Tensor:
        """The tensor on ``device`` (the original when it is already there, else a cached copy)."""
        device = torch.device(device)
        copy = self._copies.get(device)
        if copy is None:
            copy = self._copies[device] = self.tensor.to(device)
        return copy

    def __repr__(self) -> str:
        return f"PerDevice({tuple(self.tensor.shape)}, devices={[str(d) for d in self._copies]})"
