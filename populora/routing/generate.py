"""Routed generation: ONE ``model.generate`` call for a whole population.

See :meth:`~populora.routing.front.RoutedModel.generate`.

The prompts are laid out as the routing arguments say (``individuals=``: one
id per prompt row; ``all_individuals=True``: every individual gets every
prompt, rows ``(p b)``), then ``model.generate`` runs inside a
:class:`~populora.routing.block.RouteBlock`: greedy, sampling, beams and
``num_return_sequences`` all work, because Hugging Face expands the batch as
``(b k)`` (each row repeated ``k`` times in place) and never moves rows
across prompts (beam search reorders beams within a prompt's block, which
belongs to one individual). Left padding is the model's business: pass
left-padded ``input_ids`` with their ``attention_mask``.

Sampling is drawn from the global torch RNG (transformers' ``generate`` takes
no generator): with ``generator=`` the call forks the RNG
(``torch.random.fork_rng``) and seeds it from one draw of ``generator``, so
the tokens are reproducible from its seed and the global RNG is untouched.

One call is one scope of prepared routes (:mod:`populora.routing.prepared`): every decode step may reuse
what the first prepared, and the next call reads the weights as they are then.

Generic: ``model`` only needs a ``generate`` method.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import Tensor

from populora.errors import InvalidTypeError, InvalidValueError, RouteError
from populora.routing.block import RouteBlock
from populora.routing.request import RouteRequest, RoutingTarget
from populora.routing.rows import map_tensors

__all__ = ["generate"]


def generate(
    target: RoutingTarget,
    request: RouteRequest,
    input_ids: Tensor,
    attention_mask: Tensor | None = None,
    *,
    generator: torch.Generator | None = None,
    split: bool = False,
    **generate_kwargs: Any,
) -> Any:
    """Run ``target.model.generate`` once with every prompt row routed as ``request`` says.

    Args:
        target: the model (with a ``generate`` method), router and adapters.
        request: checked routing arguments; one of ``individual`` / ``ids`` / ``all_individuals``.
        input_ids: ``(b, T)`` prompts (left padded).
        attention_mask: ``(b, T)`` or ``None``.
        generator: seeds the sampling (``None``: the global RNG as it is).
        split: with ``all_individuals``, tensor outputs leading with the rows come back
            ``(p, b*k, ...)`` (``k = num_return_sequences``) instead of ``(p b k, ...)``.
        **generate_kwargs: passed to ``model.generate``.

    Returns:
        What ``model.generate`` returns: ``(rows, T + new)`` sequences, or its output
        object with ``return_dict_in_generate=True``. Rows are ``(b k)`` in prompt order
        (``individual`` / ``individuals``), ``(p b k)`` with ``all_individuals``.

    Raises:
        InvalidTypeError: the model has no ``generate`` method (named with its class).
        RouteError: no routing argument, ``individuals=`` with other than one id per
            prompt row, ``split=True`` without ``all_individuals``, or routing keywords
            in ``generate_kwargs``.
        InvalidTypeError: ``input_ids`` not a 2-D tensor, ``generator`` not a ``torch.Generator``.
    """
    if not callable(getattr(target.model, "generate", None)):
        raise InvalidTypeError(
            f"generate() runs the model's own `generate` method, and {type(target.model).__name__} has none: "
            "routed generation needs a model with a Hugging Face style generate(input_ids, attention_mask, "
            "**kwargs) (a transformers causal LM, say); for any other model call the population itself, "
            "pop(x, individuals=ids), and decode step by step"
        )
    if not request.routed:
        raise RouteError(
            "generate() needs one of `individual=`, `individuals=` (one id per prompt row) or "
            "`all_individuals=True` (for the base model, call `model.generate`)"
        )
    for name in ("broadcast", "per_individual"):
        if name in generate_kwargs:
            raise RouteError(
                f"generate() takes no `{name}=`: `all_individuals=True` gives every individual "
                "every prompt, `individuals=` takes one id per prompt row"
            )
    if not isinstance(input_ids, Tensor) or input_ids.dim() != 2:
        raise InvalidTypeError(
            "`input_ids` must be a (b, T) tensor of token ids, got "
            + (f"shape {tuple(input_ids.shape)}" if isinstance(input_ids, Tensor) else type(input_ids).__name__)
        )
    if attention_mask is not None and (
        not isinstance(attention_mask, Tensor) or attention_mask.shape != input_ids.shape
    ):
        raise InvalidValueError(
            f"`attention_mask` must have the shape of `input_ids` {tuple(input_ids.shape)}, got "
            + (
                str(tuple(attention_mask.shape))
                if isinstance(attention_mask, Tensor)
                else type(attention_mask).__name__
            )
        )
    if generator is not None and not isinstance(generator, torch.Generator):
        raise InvalidTypeError(f"`generator` must be a torch.Generator, got {type(generator).__name__}")
    if split and not request.all_individuals:
        raise RouteError("`split=True` needs `all_individuals=True` (rows (p b) split as (p, b, ...))")
    b, num = input_ids.shape[0], target.num
    if request.ids is not None and request.ids.size != b:
        raise RouteError(
            f"generate() with `individuals=` takes one id per prompt row: got {request.ids.size} ids "
            f"for {b} prompt rows (use `all_individuals=True` to give every individual every prompt)"
        )
    inputs = (
        {"input_ids": input_ids}
        if attention_mask is None
        else {"input_ids": input_ids, "attention_mask": attention_mask}
    )
    if target.device is not None:
        inputs = map_tensors(inputs, lambda t: t.to(target.device))
    block_request = request
    if request.all_individuals:  # every individual sees every prompt: rows (p b), ids repeated b times
        inputs = map_tensors(inputs, lambda t: t.repeat(num, 1))
        block_request = RouteRequest(ids=np.repeat(np.arange(num, dtype=np.int64), b))
    block = RouteBlock(target, block_request)
    model: Any = target.model  # (a transformers model: `generate` is its own method, not an nn.Module attribute)
    if generator is None:
        with block:
            out = model.generate(**inputs, **generate_kwargs)
    else:
        seed = int(torch.randint(0, 2**62, (), generator=generator))
        device = inputs["input_ids"].device
        devices = [device] if device.type == "cuda" else []
        with torch.random.fork_rng(devices=devices, device_type=device.type if devices else "cuda"):
            torch.manual_seed(seed)
            with block:
                out = model.generate(**inputs, **generate_kwargs)
    if split:
        rows = (out if isinstance(out, Tensor) else out.sequences).shape[0]

        def view(t: Tensor) -> Tensor:
            return t.reshape(num, rows // num, *t.shape[1:]) if t.dim() and t.shape[0] == rows else t

        if isinstance(out, Tensor):
            out = view(out)
        else:  # a transformers ModelOutput (a dataclass over a dict): rebuilt field by field
            out = type(out)(**{key: map_tensors(value, view) for key, value in out.items()})
    return out
