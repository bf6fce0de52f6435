"""Where a population's adapters live: one device, or each target's own (a model spread by ``device_map``).

A model loaded with ``device_map="auto"`` (accelerate) has its layers on
several devices, and accelerate's hooks move activations from one to the
next. Moving such a model to one device would undo that, so when no
``device`` is given and the model's tensors sit on more than one device, the
model is left where it is and each target's adapters are created on the
device of that target's weight; the population's own device (its generator,
the inputs it moves) is the device of the model's input embeddings (the first
parameter's if it has none). A target whose weight is on the ``meta`` device
(offloaded to disk or CPU by accelerate: not in memory) is refused. With an
explicit ``device`` (or under torch.distributed) everything goes to that one
device, as before.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import nn

from populora.distributed.process_group import resolve_device, world_size
from populora.errors import InvalidValueError

__all__ = ["Placement", "model_devices", "place"]


class Placement(NamedTuple):
    """Attributes: ``device`` (the population's), ``targets`` (each target's adapter device), ``spread``
    (the model stays where it is, on several devices)."""

    device: torch.device
    targets: dict[str, torch.device]
    spread: bool


def model_devices(model: nn.Module) -> list[torch.device]:
    """The distinct devices of the model's parameters and buffers, in first-seen order."""
    seen: dict[torch.device, None] = {}
    for t in (*model.parameters(), *model.buffers()):
        seen.setdefault(t.device, None)
    return list(seen)


def place(model: nn.Module, targets: dict[str, nn.Module], device: str | torch.device | None) -> Placement:
    """Decide where the adapters go (nothing is moved here).

    Raises:
        InvalidValueError: a spread model with a target on the ``meta``
            device (named, with the devices found).
    """
    where = resolve_device(device, model)  # joins torchrun's process group first, if there is one
    devices = model_devices(model)
    if device is not None or len(devices) <= 1 or world_size() > 1:
        return Placement(where, {name: where for name in targets}, False)
    on: dict[str, torch.device] = {}
    for name, module in targets.items():
        target_weight = module.weight
        assert isinstance(target_weight, torch.Tensor)  # a target is an nn.Linear or an nn.Embedding
        on[name] = target_weight.device
    meta = [name for name, d in on.items() if d.type == "meta"]
    if meta:
        raise InvalidValueError(
            f"the model is spread over {[str(d) for d in devices]} and target(s) {meta[:5]} "
            f"{'(and more) ' if len(meta) > 5 else ''}sit on the meta device (offloaded, not in memory), so they "
            "cannot carry adapters; load the model with enough memory for every target, pass `device=` to put "
            "everything on one device, or exclude them ('!pattern' entries in `lora_targets`)"
        )
    get_embeddings = getattr(model, "get_input_embeddings", None)  # a transformers model's
    embeddings = get_embeddings() if get_embeddings is not None else None
    weight = getattr(embeddings, "weight", None)
    first = (
        weight.device
        if isinstance(weight, torch.Tensor) and weight.device.type != "meta"
        else next(d for d in devices if d.type != "meta")
    )
    return Placement(first, on, True)
