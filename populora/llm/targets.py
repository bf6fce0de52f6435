"""Target presets for Llama-family causal LMs (Llama, SmolLM2, Mistral, Qwen2, ...).

Glob tuples for :class:`~populora.Population`'s ``lora_targets`` (and
anything else that takes target patterns), matching the module names that
Hugging Face's Llama-style decoders use:
``model.layers.{i}.self_attn.{q,k,v,o}_proj`` and
``model.layers.{i}.mlp.{gate,up,down}_proj``. Combine them with each other
and with ``!`` exclusions (see :mod:`populora.targets`)::

    Population(model, 16, 8, LLAMA_ALL, init_scale=0)                       # every block linear
    Population(model, 16, 8, ("*.q_proj", "*.v_proj"))                      # the classic LoRA pair
    Population(model, 16, 8, (*LLAMA_ATTENTION, "!model.layers.0.*"))       # attention but the first block

``["!lm_head"]`` (every routable ``nn.Linear`` but the head) selects the
same layers as :data:`LLAMA_ALL` on these models; a tied ``lm_head`` (SmolLM2,
``tie_word_embeddings=True``) is never a target anyway.

Example:
    >>> from torch import nn
    >>> from populora.targets import find_targets
    >>> block = nn.Module()
    >>> block.self_attn = nn.ModuleDict({n: nn.Linear(8, 8) for n in ("q_proj", "k_proj", "v_proj", "o_proj")})
    >>> block.mlp = nn.ModuleDict({n: nn.Linear(8, 8) for n in ("gate_proj", "up_proj", "down_proj")})
    >>> lm = nn.ModuleDict({"model": nn.ModuleDict({"layers": nn.ModuleList([block])}), "lm_head": nn.Linear(8, 3)})
    >>> list(find_targets(lm, LLAMA_MLP))
    ['model.layers.0.mlp.gate_proj', 'model.layers.0.mlp.up_proj', 'model.layers.0.mlp.down_proj']
    >>> list(find_targets(lm, LLAMA_ALL)) == list(find_targets(lm, ["!lm_head"]))
    True
"""

from __future__ import annotations

__all__ = ["LLAMA_ALL", "LLAMA_ATTENTION", "LLAMA_MLP"]

LLAMA_ATTENTION: tuple[str, ...] = (
    "*.self_attn.q_proj",
    "*.self_attn.k_proj",
    "*.self_attn.v_proj",
    "*.self_attn.o_proj",
)
"""The four attention projections of every decoder block."""

LLAMA_MLP: tuple[str, ...] = ("*.mlp.gate_proj", "*.mlp.up_proj", "*.mlp.down_proj")
"""The three MLP projections of every decoder block."""

LLAMA_ALL: tuple[str, ...] = LLAMA_ATTENTION + LLAMA_MLP
"""Every block linear (attention and MLP); not the embeddings, not ``lm_head``."""
