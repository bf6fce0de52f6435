"""The checkpoint file format: atomic writes, and every kind of damage detected before unpickling."""

from __future__ import annotations

import re

import pytest
import torch

from populora import CheckpointError, PopuloraError
from populora.checkpoint import atomic_save, load_checkpoint

STATE = {"format": "x/1", "weights": torch.arange(1000, dtype=torch.float32), "step": 3}


@pytest.fixture
def saved(tmp_path):
    return atomic_save(STATE, tmp_path / "ck.pt", kind="Thing")


def test_round_trip_is_exact_and_leaves_no_temp_file(saved):
    state = load_checkpoint(saved, kind="Thing")
    assert state["step"] == 3 and state["format"] == "x/1"
    assert torch.equal(state["weights"], STATE["weights"])
    assert [p.name for p in saved.parent.iterdir()] == ["ck.pt"]


def test_overwrite_keeps_the_old_file_when_serialisation_fails(saved):
    class Unpicklable:
        def __reduce__(self):
            raise RuntimeError("no pickling")

    with pytest.raises(RuntimeError, match="no pickling"):
        atomic_save({"bad": Unpicklable()}, saved, kind="Thing")
    assert load_checkpoint(saved, kind="Thing")["step"] == 3
    assert [p.name for p in saved.parent.iterdir()] == ["ck.pt"]


@pytest.mark.parametrize(
    "damage, message",
    [
        (lambda d: b"", "is empty"),
        (lambda d: d[: len(d) // 2], "is truncated"),
        (lambda d: d[:-1], "is truncated"),
        (lambda d: d + b"\0", "is truncated or padded"),
        (lambda d: b"just some text\n" * 4, "is not a populora checkpoint"),
        (lambda d: d[:-500] + bytes([d[-500] ^ 0x01]) + d[-499:], "is corrupted"),
        (lambda d: d[:30] + b"{" + d[31:], "damaged header"),
    ],
)
def test_damage_raises_checkpoint_error_naming_the_file(saved, damage, message):
    saved.write_bytes(damage(saved.read_bytes()))
    with pytest.raises(CheckpointError, match=re.escape(f"checkpoint {str(saved)!r}") + ".*" + message) as info:
        load_checkpoint(saved, kind="Thing")
    assert isinstance(info.value, PopuloraError) and isinstance(info.value, ValueError)


def test_a_plain_torch_file_is_not_a_populora_checkpoint(tmp_path):
    torch.save(STATE, tmp_path / "plain.pt")
    with pytest.raises(CheckpointError, match="is not a populora checkpoint"):
        load_checkpoint(tmp_path / "plain.pt", kind="Thing")


def test_another_kind_is_named(saved):
    with pytest.raises(CheckpointError, match="holds a Thing checkpoint, expected a Population checkpoint"):
        load_checkpoint(saved, kind="Population")


def test_a_missing_file_is_file_not_found(tmp_path):
    with pytest.raises(FileNotFoundError, match="no checkpoint at"):
        load_checkpoint(tmp_path / "nope.pt", kind="Thing")
