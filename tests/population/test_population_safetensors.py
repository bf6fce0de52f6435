"""Population checkpoints in safetensors: the same state as the torch format, checked all or nothing."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
from models import TinyTransformer

from populora import Population
from populora.checkpoint import atomic_save_safetensors
from populora.errors import CheckpointError, InvalidValueError

pytest.importorskip("safetensors")
from safetensors.torch import load_file, save_file

TARGETS = ["embed", "blocks.*.attn.q", "head"]


def _model():
    torch.manual_seed(0)
    return TinyTransformer(depth=2)


def _pop(seed: int = 3, **kw) -> Population:
    return Population(_model(), pop_size=6, low_rank=3, lora_targets=TARGETS, seed=seed, **kw)


def _run(pop: Population, start: int, stop: int) -> None:
    for s in range(start, stop):
        pop.evolve_(
            torch.randn(pop.pop_size, generator=torch.Generator().manual_seed(s)),
            crossover_type="average",
            mutation_type="full_gaussian",
        )


def _same(a: Population, b: Population) -> bool:
    return all(
        torch.equal(x.down, y.down) and torch.equal(x.up, y.up) for x, y in zip(a.factors(), b.factors())
    ) and torch.equal(a.generator.get_state(), b.generator.get_state())


@pytest.mark.parametrize("how", ["suffix", "format"])
def test_save_load_continue_is_bitwise(tmp_path, how):
    a = _pop()
    _run(a, 0, 3)
    path = tmp_path / ("pop.safetensors" if how == "suffix" else "pop.bin")
    written = a.save(path) if how == "suffix" else a.save(path, format="safetensors")
    assert written == path and [p.name for p in tmp_path.iterdir()] == [path.name]  # atomic: no temp left
    _run(a, 3, 6)

    b = Population.from_checkpoint(path, _model())
    assert b.generation == 3 and b.eval_seed == 3 + 3 and len(b.history) == 3
    assert b.target_names == a.target_names and b.weight_scales == a.weight_scales
    _run(b, 3, 6)
    assert _same(a, b) and b.history == a.history

    c = _pop(seed=9)
    c.load(path)
    _run(c, 3, 6)
    assert _same(a, c)


def test_the_file_is_plain_safetensors_with_json_metadata(tmp_path):
    pop = _pop(dtype=torch.bfloat16)
    _run(pop, 0, 2)
    path = pop.save(tmp_path / "pop.safetensors")
    tensors = load_file(str(path))
    assert sorted(tensors) == sorted(
        [f"_downs.{i}" for i in range(4)] + [f"_ups.{i}" for i in range(4)] + ["_extra_state.generator"]
    )
    assert tensors["_downs.1"].dtype == torch.bfloat16
    assert torch.equal(tensors["_ups.3"], pop.state_dict()["_ups.3"].cpu())
    size = int.from_bytes(path.read_bytes()[:8], "little")
    meta = json.loads(json.loads(path.read_bytes()[8 : 8 + size])["__metadata__"]["populora"])
    assert meta["kind"] == "Population" and len(meta["sha256"]) == 64
    assert meta["meta"]["generation"] == 2 and meta["meta"]["config"]["lora_targets"] == pop.target_names
    assert "generator" not in meta["meta"]


def test_torch_format_stays_the_default_and_both_load(tmp_path):
    pop = _pop()
    _run(pop, 0, 1)
    pop.save(tmp_path / "a.pt")
    pop.save(tmp_path / "b.safetensors", format="torch")  # the explicit format wins over the suffix
    assert (tmp_path / "a.pt").read_bytes().startswith(b"populora-checkpoint\n")
    assert (tmp_path / "b.safetensors").read_bytes().startswith(b"populora-checkpoint\n")
    for name in ("a.pt", "b.safetensors"):
        other = _pop(seed=5)
        other.load(tmp_path / name)
        assert _same(pop, other)
    with pytest.raises(InvalidValueError, match=r"`format` must be one of \[None, 'torch', 'safetensors'\], got 'st'"):
        pop.save(tmp_path / "c.safetensors", format="st")
    assert not (tmp_path / "c.safetensors").exists()


def _flip_tensor_byte(path):
    data = bytearray(path.read_bytes())
    data[-3] ^= 0x40  # inside the last tensor's data, far from the header
    path.write_bytes(bytes(data))


def _edit_header(path):
    data = path.read_bytes()
    size = int.from_bytes(data[:8], "little")
    path.write_bytes(data[:8] + data[8 : 8 + size].replace(b'"dtype":"F32"', b'"dtype":"F64"', 1) + data[8 + size :])


CASES = {
    "flipped tensor byte": (_flip_tensor_byte, r"is corrupted: its tensors do not match the SHA-256"),
    "truncated": (lambda p: p.write_bytes(p.read_bytes()[:-10]), r"is not a valid safetensors file"),
    "damaged header": (_edit_header, r"is not a valid safetensors file"),
    "empty": (lambda p: p.write_bytes(b""), r"is empty"),
    "plain safetensors": (
        lambda p: save_file({"x": torch.zeros(2)}, str(p)),
        r"is a safetensors file but not a populora checkpoint",
    ),
    "another kind": (
        lambda p: atomic_save_safetensors({"x": torch.zeros(2)}, {}, p, kind="EggrollES"),
        r"holds a EggrollES checkpoint, expected a Population checkpoint",
    ),
    "no extra state": (
        lambda p: atomic_save_safetensors({"x": torch.zeros(2)}, {}, p, kind="Population"),
        r"without the population's extra state",
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_damaged_files_raise_checkpoint_error_and_change_nothing(tmp_path, case):
    damage, match = CASES[case]
    src = _pop()
    _run(src, 0, 2)
    path = src.save(tmp_path / "pop.safetensors")
    damage(path)
    pop = _pop(seed=7)
    before = _pop(seed=7)
    with pytest.raises(CheckpointError, match=match):
        pop.load(path)
    assert _same(pop, before) and pop.generation == 0
    model = _model()
    flags = [p.requires_grad for p in model.parameters()]
    with pytest.raises(CheckpointError, match=match):
        Population.from_checkpoint(path, model)
    assert [p.requires_grad for p in model.parameters()] == flags


def test_a_checkpoint_of_another_population_does_not_fit(tmp_path):
    path = _pop().save(tmp_path / "pop.safetensors")
    other = Population(_model(), pop_size=4, low_rank=3, lora_targets=TARGETS)
    with pytest.raises(CheckpointError, match=r"checkpoint '.*pop.safetensors': .*pop_size"):
        other.load(path)


def test_import_populora_does_not_import_safetensors():
    code = "import sys, populora; print('safetensors' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"
