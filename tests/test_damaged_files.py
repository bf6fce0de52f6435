"""Damaged files raise CheckpointError naming the file, never a builtin (OverflowError, RecursionError, re.error,
ValueError from Python's int-string limit, ...), and the object being loaded is left as it was.

Files are damaged by hand: a verified checkpoint whose header claims an infinite or huge size or is nested
100k deep; a well-hashed checkpoint whose content is nested thousands deep, holds itself, or holds ints beyond
float64 where the ES state has numbers; a safetensors checkpoint with a huge header length or deeply nested
populora metadata; a PEFT adapter folder whose adapter_config.json is nested deep, holds patterns that are
not regexes, or numbers beyond float64.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import sys
import zipfile

import pytest
import torch
from models import mlp

from populora import EggrollES, Population, TorchEggrollES
from populora.checkpoint import atomic_save, load_checkpoint
from populora.errors import CheckpointError

DEEP = 100_000  # JSON nesting far beyond any parser's recursion limit


def _deep_json(depth: int = DEEP) -> str:
    return "[" * depth + "]" * depth


def _deep_list(depth: int) -> list:
    """A list nested ``depth`` deep, built without recursion."""
    inner: list = []
    for _ in range(depth - 1):
        inner = [inner]
    return inner


@contextlib.contextmanager
def _recursion_limit(limit: int):
    """torch.save pickles recursively: a deep state needs room to be written (loading it does not recurse)."""
    old = sys.getrecursionlimit()
    sys.setrecursionlimit(limit)
    try:
        yield
    finally:
        sys.setrecursionlimit(old)


def _rewrite_header(path, edit) -> None:
    """Replace the JSON header line of a verified checkpoint with ``edit(header_dict) -> str``."""
    data = path.read_bytes()
    magic_end = data.index(b"\n") + 1
    header_end = data.index(b"\n", magic_end)
    header = json.loads(data[magic_end:header_end])
    path.write_bytes(data[:magic_end] + edit(header).encode() + data[header_end:])


def _with_payload(path, payload: bytes, kind: str) -> None:
    """A checkpoint of ``kind`` holding ``payload`` with a correct size and SHA-256 (damage that hashes right)."""
    magic = b"populora-checkpoint\n"
    header = (
        json.dumps(
            {"format": 1, "kind": kind, "size": len(payload), "sha256": hashlib.sha256(payload).hexdigest()}
        ).encode()
        + b"\n"
    )
    path.write_bytes(magic + header + payload)


def _pickled(pkl: bytes) -> bytes:
    """A torch.save zip whose data.pkl is ``pkl`` (opcodes written by hand)."""
    base = io.BytesIO()
    torch.save({}, base)
    source = zipfile.ZipFile(io.BytesIO(base.getvalue()))
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as target:
        for info in source.infolist():
            target.writestr(info.filename, pkl if info.filename.endswith("data.pkl") else source.read(info.filename))
    return out.getvalue()


# ------------------------------------------------------------------------ verified torch checkpoints (all kinds)


def _population():
    return Population(mlp(), pop_size=4, low_rank=2, seed=0)


def _es():
    torch.manual_seed(0)
    return EggrollES(mlp(), 6, 0.1, 0.1, 2)


def _torch_es():
    torch.manual_seed(0)
    return TorchEggrollES(mlp(), pop_size=6)


class _SelfPlayFile:
    """SelfPlay files go through the same reader; building a SelfPlay needs a language model, so the
    reader is called directly with SelfPlay's kind."""

    def save(self, path):
        return atomic_save({"format": "populora.selfplay/1"}, path, kind="SelfPlay")

    def load(self, path):
        load_checkpoint(path, kind="SelfPlay")


OWNERS = {"Population": _population, "EggrollES": _es, "TorchEggrollES": _torch_es, "SelfPlay": _SelfPlayFile}


def _state(owner) -> dict:
    """What the owner's state looks like from outside (to check that a failed load changed nothing)."""
    if isinstance(owner, _SelfPlayFile):
        return {}
    model = owner.model if hasattr(owner, "model") else owner.es.model
    state = {n: p.detach().clone() for n, p in model.named_parameters()}
    if isinstance(owner, Population):
        state.update({f"f{i}": t.clone() for i, pair in enumerate(owner.factors()) for t in pair})
    return state


HEADER_DAMAGE = {
    "size_inf": lambda h: json.dumps({**h, "size": 1e400}).replace("Infinity", "1e400"),  # JSON's 1e400 is inf
    "size_huge": lambda h: json.dumps({**h, "size": 2**80}),
    "size_float": lambda h: json.dumps({**h, "size": float(h["size"])}),
    "nested_header": lambda h: _deep_json(),
    "nested_kind": lambda h: json.dumps({**h, "kind": None}).replace("null", _deep_json(5_000)),
    "size_beyond_int_limit": lambda h: json.dumps({**h, "size": "@@"}).replace('"@@"', "9" * 5_000),
}


@pytest.mark.parametrize("damage", list(HEADER_DAMAGE))
@pytest.mark.parametrize("owner", list(OWNERS))
def test_a_damaged_header_is_a_checkpoint_error_naming_the_file(tmp_path, owner, damage):
    obj = OWNERS[owner]()
    path = obj.save(tmp_path / "ck.pt")
    _rewrite_header(path, HEADER_DAMAGE[damage])
    before = _state(obj)
    with pytest.raises(CheckpointError) as info:
        obj.load(path)
    assert str(path) in str(info.value)
    after = _state(obj)
    assert all(torch.equal(before[k], after[k]) for k in before)


def test_content_nested_deeper_than_readers_recurse_is_refused(tmp_path):
    """A state with a value nested 3000 deep (the ES's history): its checks would recurse past Python's limit."""
    es = _es()
    state = es.state_dict()
    state["history"] = [_deep_list(3_000)]
    with _recursion_limit(20_000):
        path = atomic_save(state, tmp_path / "deep.pt", kind="EggrollES")
    before = _state(es)
    with pytest.raises(CheckpointError, match="nested more than") as info:
        es.load(path)
    assert str(path) in str(info.value)
    assert all(torch.equal(before[k], v) for k, v in _state(es).items())


@pytest.mark.parametrize(
    "pkl",
    [
        b"\x80\x02" + b"]" * DEEP + b"a" * (DEEP - 1) + b".",  # a list nested 100k deep (unpickling is iterative)
        b"\x80\x02]q\x00h\x00a.",  # a list that holds itself
    ],
    ids=["nested_100k", "holds_itself"],
)
def test_content_that_no_reader_could_walk_is_refused_by_the_reader(tmp_path, pkl):
    path = tmp_path / "crafted.pt"
    _with_payload(path, _pickled(pkl), kind="Thing")
    with pytest.raises(CheckpointError, match=r"nested more than|holds itself") as info:
        load_checkpoint(path, kind="Thing")
    assert str(path) in str(info.value)


def _set(state: dict, path: tuple, value) -> None:
    for key in path[:-1]:
        state = state[key]
    state[path[-1]] = value


ES_STATE_DAMAGE = {
    # ints beyond float64 where the state holds numbers (pickle writes any int)
    "sigma_beyond_float": (("sigma",), 10**400),
    "best_fitness_beyond_float": (("best_fitness",), 10**400),
    "history_beyond_float": (("history",), [[10**400, 0.0, 0.0, 0.0]]),
    # an int whose repr in an error message exceeds Python's 4300-digit limit
    "seed_beyond_int_string_limit": (("seed",), 10**5000),
    "generation_beyond_int_string_limit": (("best_member",), [10**5000, 0]),
    # a value of the wrong kind where a sized one is read
    "optimizer_group_params_not_a_list": (("optimizer", "param_groups", 0, "params"), 5),
    "config_holds_a_tensor": (("config", "shapes"), torch.ones(3)),
}


@pytest.mark.parametrize("damage", list(ES_STATE_DAMAGE))
@pytest.mark.parametrize("owner", ["EggrollES", "TorchEggrollES"])
def test_an_es_state_too_damaged_to_read_is_a_checkpoint_error_naming_the_file(tmp_path, owner, damage):
    obj = OWNERS[owner]()
    es = obj if owner == "EggrollES" else obj.es
    state = obj.state_dict()
    key, value = ES_STATE_DAMAGE[damage]
    _set(state, key, value)
    path = atomic_save(state, tmp_path / "ck.pt", kind=owner)
    before = _state(obj)
    with pytest.raises(CheckpointError) as info:
        obj.load(path)
    assert str(path) in str(info.value)
    assert all(torch.equal(before[k], v) for k, v in _state(obj).items())
    assert es.generation == 0


# ------------------------------------------------------------------------------------ safetensors checkpoints

st = pytest.importorskip("safetensors.torch")


def _st_header(path) -> tuple[dict, bytes]:
    data = path.read_bytes()
    size = int.from_bytes(data[:8], "little")
    return json.loads(data[8 : 8 + size]), data[8 + size :]


def _st_write(path, header: dict, rest: bytes) -> None:
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    path.write_bytes(len(raw).to_bytes(8, "little") + raw + rest)


def _st_meta(path, edit) -> None:
    header, rest = _st_header(path)
    header["__metadata__"]["populora"] = edit(header["__metadata__"]["populora"])
    _st_write(path, header, rest)


def _meta_nested(text: str, depth: int) -> str:
    meta = json.loads(text)
    meta["meta"]["history"] = None
    return json.dumps(meta).replace('"history": null', '"history": ' + _deep_json(depth))


ST_DAMAGE = {
    "header_length_huge": lambda p: p.write_bytes((2**63).to_bytes(8, "little") + p.read_bytes()[8:]),
    "header_length_max": lambda p: p.write_bytes(b"\xff" * 8 + p.read_bytes()[8:]),
    "metadata_nested_100k": lambda p: _st_meta(p, lambda m: _meta_nested(m, DEEP)),
    "metadata_nested_500": lambda p: _st_meta(p, lambda m: _meta_nested(m, 500)),
    "metadata_kind_nested": lambda p: _st_meta(
        p, lambda m: m.replace('"kind": "Population"', '"kind": ' + _deep_json(5_000))
    ),
    "metadata_not_json": lambda p: _st_meta(p, lambda m: m[:-1]),
}


@pytest.mark.parametrize("damage", list(ST_DAMAGE))
def test_a_damaged_safetensors_checkpoint_is_a_checkpoint_error_naming_the_file(tmp_path, damage):
    src = _population()
    path = src.save(tmp_path / "pop.safetensors")
    ST_DAMAGE[damage](path)
    pop = _population()
    before = _state(pop)
    with pytest.raises(CheckpointError) as info:
        pop.load(path)
    assert str(path) in str(info.value)
    assert all(torch.equal(before[k], v) for k, v in _state(pop).items())


# ---------------------------------------------------------------------------------------- PEFT adapter folders


def _adapter(tmp_path):
    from populora.llm import to_peft

    pop = Population(mlp(), pop_size=2, low_rank=2, seed=0, init_scale=1.0)
    return pop, to_peft(pop, 0, tmp_path / "adapter")


def _edit_config(folder, edit) -> None:
    file = folder / "adapter_config.json"
    file.write_text(edit(json.loads(file.read_text())))


def _json_with(**changes):
    """``json.dumps`` of the config updated with ``changes``; a value ``("raw", text)`` is written as ``text``."""

    def edit(config):
        raw = {}
        for key, value in changes.items():
            if isinstance(value, tuple):
                raw[key], value = value[1], f"@@{key}@@"
            config[key] = value
        text = json.dumps(config)
        for key, value in raw.items():
            text = text.replace(f'"@@{key}@@"', value)
        return text

    return edit


PEFT_DAMAGE = {
    "config_nested_100k": lambda c: _deep_json(),
    "config_value_nested_5000": _json_with(notes=("raw", _deep_json(5_000))),
    "rank_pattern_not_a_regex": _json_with(rank_pattern={"(": 1}),
    "alpha_pattern_not_a_regex": _json_with(alpha_pattern={"[0-": 2.0}),
    "rank_pattern_nested_groups": _json_with(rank_pattern={"(" * 5_000 + ")" * 5_000: 1}),
    "alpha_pattern_repeat_too_large": _json_with(alpha_pattern={"a{99999999999999999999}": 1.0}),
    "lora_alpha_beyond_float": _json_with(lora_alpha=("raw", "1" + "0" * 400)),
    "rank_pattern_value_beyond_float": _json_with(rank_pattern=("raw", '{"fc": 1' + "0" * 400 + "}")),
    "target_modules_not_a_regex": _json_with(target_modules="(0"),
    "exclude_modules_not_a_regex": _json_with(exclude_modules="*"),
    "layers_pattern_not_a_regex": _json_with(layers_to_transform=[0], layers_pattern="("),
}


@pytest.mark.parametrize("damage", list(PEFT_DAMAGE))
def test_a_damaged_adapter_config_is_a_checkpoint_error_naming_the_folder(tmp_path, damage):
    pytest.importorskip("safetensors")
    from populora.llm import load_peft_

    pop, folder = _adapter(tmp_path)
    _edit_config(folder, PEFT_DAMAGE[damage])
    before = [(d.clone(), u.clone()) for d, u in pop.factors()]
    with pytest.raises(CheckpointError) as info:
        load_peft_(pop, 1, folder)
    assert str(folder) in str(info.value)
    assert all(torch.equal(d, d0) and torch.equal(u, u0) for (d, u), (d0, u0) in zip(pop.factors(), before))


@pytest.mark.parametrize("damage", ["header_length_huge", "header_nested"])
def test_a_damaged_adapter_safetensors_is_a_checkpoint_error_naming_the_folder(tmp_path, damage):
    from populora.llm import load_peft_

    pop, folder = _adapter(tmp_path)
    file = folder / "adapter_model.safetensors"
    if damage == "header_length_huge":
        file.write_bytes((2**62).to_bytes(8, "little") + file.read_bytes()[8:])
    else:
        header, rest = _st_header(file)
        header["__metadata__"] = {"format": "pt"}
        text = json.dumps(header)[:-1] + ', "x": ' + _deep_json(DEEP) + "}"
        raw = text.encode() + b" " * (-len(text) % 8)
        file.write_bytes(len(raw).to_bytes(8, "little") + raw + rest)
    with pytest.raises(CheckpointError) as info:
        load_peft_(pop, 1, folder)
    assert str(folder) in str(info.value)
