"""PEFT interop (populora.llm.peft): an individual as a PEFT LoRA adapter folder, and back.

Every comparison with PEFT runs the SAME batch (same shape) through both models; fp32 outputs agree to
1e-5. Round trips (export i, load into j) are bitwise: the same numbers, copied.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import warnings

import pytest
import torch
from torch import nn

pytest.importorskip("transformers")
pytest.importorskip("peft")
pytest.importorskip("safetensors")

from peft import LoraConfig, PeftModel, get_peft_model
from safetensors.torch import load_file, save_file
from transformers import LlamaConfig, LlamaForCausalLM

from populora import Population
from populora.errors import (
    CheckpointError,
    InvalidIndexError,
    InvalidTypeError,
    InvalidValueError,
    SpentPopulationError,
)
from populora.llm import load_peft_, to_peft

ATTN = ["model.layers.*.self_attn.q_proj", "model.layers.*.self_attn.v_proj"]
BLOCK = ["model.layers.*.self_attn.*_proj", "model.layers.*.mlp.*_proj"]
TOL = 1e-5


def _config(tied: bool = False) -> LlamaConfig:
    return LlamaConfig(
        vocab_size=128,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        tie_word_embeddings=tied,
    )


_STATES: dict[bool, dict] = {}


def _llama(tied: bool = False) -> LlamaForCausalLM:
    """A fresh copy of the same tiny random Llama (weights built once per `tied`, then copied)."""
    model = LlamaForCausalLM(_config(tied))
    if tied not in _STATES:
        with torch.random.fork_rng():
            torch.manual_seed(0)
            _STATES[tied] = {k: v.clone() for k, v in LlamaForCausalLM(_config(tied)).state_dict().items()}
    model.load_state_dict(_STATES[tied])
    return model.eval()


def _tokens(seed: int = 0, shape: tuple[int, int] = (3, 7)) -> torch.Tensor:
    return torch.randint(0, 128, shape, generator=torch.Generator().manual_seed(seed))


def _population(targets, *, tied: bool = False, low_rank: int = 4, seed: int = 1) -> Population:
    return Population(_llama(tied), pop_size=4, low_rank=low_rank, lora_targets=targets, init_scale=1.0, seed=seed)


def _snapshot(pop: Population) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return [(d.detach().clone(), u.detach().clone()) for d, u in pop.factors()]


def _same(pop: Population, snapshot) -> bool:
    return all(torch.equal(d, d0) and torch.equal(u, u0) for (d, u), (d0, u0) in zip(pop.factors(), snapshot))


def _lora_layers(model: nn.Module) -> list[str]:
    return [
        n
        for n, m in model.named_modules()
        if hasattr(m, "lora_A") and ("default" in m.lora_A or "default" in m.lora_embedding_A)
    ]


def _peft_logits(path, x: torch.Tensor, tied: bool = False) -> torch.Tensor:
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)  # PEFT's "missing adapter keys" warning would fail the test
        model = PeftModel.from_pretrained(_llama(tied), str(path)).eval()
    with torch.no_grad():
        return model(input_ids=x).logits


# ---------------------------------------------------------------------------------------------- lazy import


def test_import_populora_imports_no_hf_package():
    code = (
        "import populora, populora.llm, populora.llm.peft, sys; "
        "bad = [m for m in ('transformers', 'peft', 'safetensors') if m in sys.modules]; "
        "assert not bad, bad"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


# ---------------------------------------------------------------------------------------------- export


@pytest.mark.parametrize(
    "targets", [ATTN, BLOCK, ["model.layers.1.self_attn.q_proj"]], ids=["q_v", "all_block_linears", "one_layer"]
)
def test_export_loads_in_peft_with_the_routed_individuals_outputs(tmp_path, targets):
    pop = _population(targets)
    x = _tokens()
    with torch.no_grad():
        routed = pop(x, individual=2).logits
        base = pop(x).logits
    folder = to_peft(pop, 2, tmp_path / "adapter")
    assert folder == tmp_path / "adapter"
    assert sorted(p.name for p in folder.iterdir()) == ["adapter_config.json", "adapter_model.safetensors"]
    config = json.loads((folder / "adapter_config.json").read_text())
    assert config["peft_type"] == "LORA" and config["task_type"] == "CAUSAL_LM"
    assert config["r"] == config["lora_alpha"] == 4 and config["rank_pattern"] == {}
    assert config["target_modules"] == pop.target_names  # full paths
    assert (config["bias"], config["use_rslora"], config["lora_dropout"], config["fan_in_fan_out"]) == (
        "none",
        False,
        0.0,
        False,
    )
    tensors = load_file(str(folder / "adapter_model.safetensors"))
    assert set(tensors) == {f"base_model.model.{t}.lora_{k}.weight" for t in pop.target_names for k in "AB"}
    (down, up) = pop.factors()[0]
    assert torch.equal(tensors[f"base_model.model.{pop.target_names[0]}.lora_A.weight"], down[2].T)
    assert torch.equal(tensors[f"base_model.model.{pop.target_names[0]}.lora_B.weight"], up[2])

    peft_out = _peft_logits(folder, x)
    assert (routed - base).abs().max() > 1e-3  # the adapter does something ...
    assert (peft_out - routed).abs().max() < TOL  # ... and PEFT does the same

    model = PeftModel.from_pretrained(_llama(), str(folder))
    assert _lora_layers(model) == [f"base_model.model.{t}" for t in pop.target_names]  # not over-matched


def test_export_of_a_tied_embedding_lm(tmp_path):
    with pytest.warns(UserWarning, match="tied"):
        pop = _population(None, tied=True)  # every nn.Linear but the tied lm_head
    assert "lm_head" not in pop.target_names and len(pop.target_names) == 14
    x = _tokens(1)
    with torch.no_grad():
        routed = pop(x, individual=0).logits
    to_peft(pop, 0, tmp_path / "a")
    assert (_peft_logits(tmp_path / "a", x, tied=True) - routed).abs().max() < TOL


def test_export_of_an_embedding_target(tmp_path):
    pop = _population(["model.embed_tokens", "model.layers.*.self_attn.q_proj"])
    x = _tokens(2)
    with torch.no_grad():
        routed = pop(x, individual=3).logits
    to_peft(pop, 3, tmp_path / "a")
    tensors = load_file(str(tmp_path / "a" / "adapter_model.safetensors"))
    assert tensors["base_model.model.model.embed_tokens.lora_embedding_A"].shape == (4, 128)  # (r, V)
    assert tensors["base_model.model.model.embed_tokens.lora_embedding_B"].shape == (64, 4)  # (e, r)
    assert (_peft_logits(tmp_path / "a", x) - routed).abs().max() < TOL
    load_peft_(pop, 0, tmp_path / "a")
    assert all(torch.equal(d[0], d[3]) and torch.equal(u[0], u[3]) for d, u in pop.factors())


class _Toy(nn.Module):
    """``fc`` (rank 2 at most: 2 outputs) and ``sub.fc`` (a path ending in ``.fc``)."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 2)
        self.sub = nn.Module()
        self.sub.fc = nn.Linear(8, 8)
        self.head = nn.Linear(8, 2)

    def forward(self, x):
        return self.fc(x) + self.head(torch.tanh(self.sub.fc(x)))


def _toy() -> _Toy:
    with torch.random.fork_rng():
        torch.manual_seed(3)
        return _Toy()


def _toy_peft(path) -> nn.Module:
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        return PeftModel.from_pretrained(_toy(), str(path)).eval()


def test_export_of_a_plain_module_with_per_target_ranks(tmp_path):
    pop = Population(_toy(), pop_size=3, low_rank=4, lora_targets=["fc", "sub.fc"], init_scale=1.0)
    assert [d.shape[-1] for d, _ in pop.factors()] == [2, 4]  # effective ranks
    x = torch.randn(5, 8, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        routed = pop(x, individual=1)
    to_peft(pop, 1, tmp_path / "a")
    config = json.loads((tmp_path / "a" / "adapter_config.json").read_text())
    assert config["task_type"] is None  # not a causal LM: PeftModel calls the forward as it is
    assert config["r"] == 4 and config["target_modules"] == ["fc", "sub.fc"]
    # fc's rank differs; sub.fc ends in '.fc', so it is listed first and matches itself
    assert list(config["rank_pattern"].items()) == [("sub\\.fc", 4), ("fc", 2)]
    assert config["alpha_pattern"] == config["rank_pattern"]
    model = _toy_peft(tmp_path / "a")
    with torch.no_grad():
        assert (model(x) - routed).abs().max() < TOL
    assert model.base_model.model.fc.r["default"] == 2 and model.base_model.model.sub.fc.r["default"] == 4


def test_export_of_a_partial_target_set_is_not_over_matched(tmp_path):
    # a compiled pattern fullmatches the path: the top-level 'fc' alone ('fc' as a name would also take 'sub.fc')
    pop = Population(_toy(), pop_size=2, low_rank=2, lora_targets=re.compile("fc"), init_scale=1.0)
    assert pop.target_names == ["fc"]
    to_peft(pop, 0, tmp_path / "a")
    config = json.loads((tmp_path / "a" / "adapter_config.json").read_text())
    assert config["target_modules"] == "^(?:fc)$"  # the list ['fc'] would also catch 'sub.fc'
    model = _toy_peft(tmp_path / "a")
    assert _lora_layers(model) == ["base_model.model.fc"]
    x = torch.randn(5, 8, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert (model(x) - pop(x, individual=0)).abs().max() < TOL


def test_export_replaces_an_adapter_folder_and_keeps_other_files(tmp_path):
    pop = _population(ATTN)
    to_peft(pop, 0, tmp_path / "a")
    (tmp_path / "a" / "README.md").write_text("notes")
    to_peft(pop, 1, tmp_path / "a")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a"]  # no temporary folder left behind
    assert (tmp_path / "a" / "README.md").read_text() == "notes"
    load_peft_(pop, 3, tmp_path / "a")
    assert all(torch.equal(d[3], d[1]) and torch.equal(u[3], u[1]) for d, u in pop.factors())


def test_export_refuses_to_replace_a_folder_that_is_not_an_adapter(tmp_path):
    pop = _population(ATTN)
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "data.txt").write_text("precious")
    with pytest.raises(InvalidValueError, match="not a PEFT adapter folder"):
        to_peft(pop, 0, tmp_path / "a")
    assert [p.name for p in (tmp_path / "a").iterdir()] == ["data.txt"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a"]


def test_export_bad_arguments(tmp_path):
    pop = _population(ATTN)
    with pytest.raises(InvalidIndexError, match="individual"):
        to_peft(pop, 4, tmp_path / "a")
    with pytest.raises(InvalidValueError, match="task_type"):
        to_peft(pop, 0, tmp_path / "a", task_type="CAUSAL")
    assert not (tmp_path / "a").exists()
    to_peft(pop, 0, tmp_path / "a", base_model_name_or_path="org/tiny", task_type=None)
    config = json.loads((tmp_path / "a" / "adapter_config.json").read_text())
    assert (config["base_model_name_or_path"], config["task_type"]) == ("org/tiny", None)
    (tmp_path / "plain").mkdir()  # the folder gets the permissions of any new folder (not mkdtemp's 0o700)
    assert (tmp_path / "a").stat().st_mode & 0o777 == (tmp_path / "plain").stat().st_mode & 0o777


# ---------------------------------------------------------------------------------------------- import


def test_round_trip_is_bitwise(tmp_path):
    pop = _population(BLOCK)
    before = _snapshot(pop)
    to_peft(pop, 2, tmp_path / "a")
    load_peft_(pop, 0, tmp_path / "a")
    for (d, u), (d0, u0) in zip(pop.factors(), before):
        assert torch.equal(d[0], d0[2]) and torch.equal(u[0], u0[2])
        assert torch.equal(d[1:], d0[1:]) and torch.equal(u[1:], u0[1:])  # the others untouched


@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16])
def test_round_trip_keeps_the_adapters_dtype_and_grad_flags(tmp_path, dtype):
    pop = Population(
        _llama(), pop_size=3, low_rank=4, lora_targets=ATTN, init_scale=1.0, dtype=dtype, requires_grad=True
    )
    to_peft(pop, 0, tmp_path / "a")
    assert {t.dtype for t in load_file(str(tmp_path / "a" / "adapter_model.safetensors")).values()} == {dtype}
    load_peft_(pop, 2, tmp_path / "a")  # in place under no_grad: fine on leaves that require grad
    for d, u in pop.factors():
        assert d.dtype == u.dtype == dtype and torch.equal(d[2], d[0]) and torch.equal(u[2], u[0])
    assert all(p.requires_grad for p in pop.parameters() if p.dim() == 3)


def test_spent_population_and_not_a_population(tmp_path):
    pop = _population(ATTN)
    to_peft(pop, 0, tmp_path / "a")
    pop.merge_(1)
    with pytest.raises(SpentPopulationError):
        to_peft(pop, 0, tmp_path / "b")
    with pytest.raises(SpentPopulationError):
        load_peft_(pop, 0, tmp_path / "a")
    with pytest.raises(InvalidTypeError, match="must be a populora Population, got Linear"):
        to_peft(nn.Linear(2, 2), 0, tmp_path / "b")
    assert not (tmp_path / "b").exists()


def _peft_adapter(path, *, r: int, alpha: float, targets=("q_proj", "v_proj"), **config) -> torch.Tensor:
    """An adapter made by PEFT itself (random non-zero A and B), saved; returns its logits on `_tokens(5)`."""
    model = get_peft_model(
        _llama(), LoraConfig(r=r, lora_alpha=alpha, target_modules=list(targets), lora_dropout=0.0, **config)
    )
    g = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_" in name:
                p.copy_(torch.randn(p.shape, generator=g) * 0.3)
    model.save_pretrained(str(path))
    with torch.no_grad():
        return model.eval()(input_ids=_tokens(5)).logits


@pytest.mark.parametrize("rslora", [False, True], ids=["lora", "rslora"])
def test_peft_made_adapter_routes_like_peft(tmp_path, rslora):
    expected = _peft_adapter(tmp_path / "a", r=2, alpha=6, use_rslora=rslora)
    pop = _population(ATTN, low_rank=4)
    load_peft_(pop, 1, tmp_path / "a")
    with torch.no_grad():
        routed = pop(_tokens(5), individual=1).logits
        base = pop(_tokens(5)).logits
    assert (routed - base).abs().max() > 1e-3
    assert (routed - expected).abs().max() < TOL
    tensors = load_file(str(tmp_path / "a" / "adapter_model.safetensors"))
    scaling = 6 / (2**0.5 if rslora else 2)
    for name, (down, up) in zip(pop.target_names, pop.factors()):
        a = tensors[f"base_model.model.{name}.lora_A.weight"]
        b = tensors[f"base_model.model.{name}.lora_B.weight"]
        assert torch.equal(down[1, :, :2], a.T) and torch.allclose(up[1, :, :2], b * scaling, rtol=1e-6, atol=0)
        assert not down[1, :, 2:].any() and not up[1, :, 2:].any()  # rank 2 < low_rank 4: zero-padded


def test_peft_made_adapter_with_an_embedding_target(tmp_path):
    expected = _peft_adapter(tmp_path / "a", r=3, alpha=5, targets=("embed_tokens", "o_proj"))
    pop = _population(["model.embed_tokens", "model.layers.*.self_attn.o_proj"], low_rank=4)
    load_peft_(pop, 0, tmp_path / "a")
    with torch.no_grad():
        routed = pop(_tokens(5), individual=0).logits
    assert (routed - expected).abs().max() < TOL
    ((down, up),) = pop.factors()[:1]  # the embedding: down (P, V, r), up (P, e, r)
    tensors = load_file(str(tmp_path / "a" / "adapter_model.safetensors"))
    a = tensors["base_model.model.model.embed_tokens.lora_embedding_A"]
    assert torch.equal(down[0, :, :3], a.T) and not down[0, :, 3:].any()
    # PEFT saved a copy of the embedding table: accepted because it is the base model's, refused if it is not
    key = "base_model.model.model.embed_tokens.base_layer.weight"
    assert key in load_file(str(tmp_path / "a" / "adapter_model.safetensors"))
    _edit_tensors(tmp_path / "a", add={key: torch.zeros(128, 64)})
    before = _snapshot(pop)
    with pytest.raises(InvalidValueError, match="a copy of the base layer 'model.embed_tokens' that differs"):
        load_peft_(pop, 1, tmp_path / "a")
    assert _same(pop, before)
    load_peft_(pop, 1, tmp_path / "a", strict=False)
    assert all(torch.equal(d[0], d[1]) and torch.equal(u[0], u[1]) for d, u in pop.factors())


def test_adapter_rank_above_low_rank_raises(tmp_path):
    _peft_adapter(tmp_path / "a", r=8, alpha=8)
    pop = _population(ATTN, low_rank=4)
    before = _snapshot(pop)
    with pytest.raises(InvalidValueError, match="rank 8, above the population's rank 4"):
        load_peft_(pop, 1, tmp_path / "a")
    assert _same(pop, before)


def _edit_config(folder, **changes):
    file = folder / "adapter_config.json"
    config = json.loads(file.read_text())
    config.update(changes)
    file.write_text(json.dumps(config))


def _edit_tensors(folder, drop=(), add=None):
    file = folder / "adapter_model.safetensors"
    tensors = load_file(str(file))
    for key in drop:
        del tensors[key]
    tensors.update(add or {})
    save_file(tensors, str(file))


Q0 = "base_model.model.model.layers.0.self_attn.q_proj"
V1 = "base_model.model.model.layers.1.self_attn.v_proj"


def _corrupt(folder):
    file = folder / "adapter_model.safetensors"
    data = bytearray(file.read_bytes())
    data[:8] = b"\xff" * 8  # the header length: now absurd
    file.write_bytes(bytes(data))


BAD = {
    "dora": (lambda f: _edit_config(f, use_dora=True), InvalidValueError, "use_dora=True.*DoRA"),
    "bias": (lambda f: _edit_config(f, bias="all"), InvalidValueError, "bias='all'"),
    "lora_bias": (lambda f: _edit_config(f, lora_bias=True), InvalidValueError, "lora_bias=True"),
    "fan_in_fan_out": (lambda f: _edit_config(f, fan_in_fan_out=True), InvalidValueError, "fan_in_fan_out=True"),
    "alora": (
        lambda f: _edit_config(f, alora_invocation_tokens=[5, 6]),
        InvalidValueError,
        r"alora_invocation_tokens=\[5, 6\]: a LoRA variant",
    ),
    "target_parameters": (
        lambda f: _edit_config(f, target_parameters=["experts.w"]),
        InvalidValueError,
        "target_parameters",
    ),
    "not_lora": (lambda f: _edit_config(f, peft_type="IA3"), InvalidValueError, "'IA3' adapter; only peft_type"),
    "missing_keys": (
        lambda f: _edit_tensors(f, drop=[f"{V1}.lora_A.weight", f"{V1}.lora_B.weight"]),
        InvalidValueError,
        r"targets missing from the file: \['model.layers.1.self_attn.v_proj'\]",
    ),
    "unexpected_keys": (
        lambda f: _edit_tensors(
            f,
            add={
                "base_model.model.lm_head.lora_A.weight": torch.ones(4, 64),
                "base_model.model.lm_head.lora_B.weight": torch.ones(128, 4),
            },
        ),
        InvalidValueError,
        r"belong to no target: \['base_model.model.lm_head.lora_A.weight'",
    ),
    "half_pair": (
        lambda f: _edit_tensors(f, drop=[f"{Q0}.lora_B.weight"]),
        CheckpointError,
        "holds .*q_proj.lora_A.weight' but not .*q_proj.lora_B.weight'",
    ),
    "wrong_shape": (
        lambda f: _edit_tensors(f, add={f"{Q0}.lora_A.weight": torch.ones(4, 32)}),
        InvalidValueError,
        r"must be \(r, d\) and \(e, r\) = \(4, 64\) and \(64, 4\), got \(4, 32\)",
    ),
    "rank_zero": (
        lambda f: _edit_tensors(
            f, add={f"{V1}.lora_A.weight": torch.ones(0, 64), f"{V1}.lora_B.weight": torch.ones(32, 0)}
        ),
        CheckpointError,
        "has rank 0",
    ),
    "rank_disagrees_with_config": (
        lambda f: _edit_config(f, r=2, lora_alpha=2),
        CheckpointError,
        "gives 'model.layers.0.self_attn.q_proj' rank 2, but its tensors have rank 4",
    ),
    # the last target: every target before it has been read, none written
    "non_finite": (
        lambda f: _edit_tensors(f, add={f"{V1}.lora_B.weight": torch.full((32, 4), float("nan"))}),
        InvalidValueError,
        "'model.layers.1.self_attn.v_proj' holds non-finite values",
    ),
    "corrupted_safetensors": (_corrupt, CheckpointError, "adapter_model.safetensors is damaged"),
    "truncated_safetensors": (
        lambda f: (f / "adapter_model.safetensors").write_bytes((f / "adapter_model.safetensors").read_bytes()[:100]),
        CheckpointError,
        "is damaged",
    ),
    "bad_json": (lambda f: (f / "adapter_config.json").write_text("{not json"), CheckpointError, "not valid JSON"),
    "no_weights": (
        lambda f: (f / "adapter_model.safetensors").unlink(),
        FileNotFoundError,
        "has no adapter_model.safetensors",
    ),
}


def _rename_keys(folder, rename):
    file = folder / "adapter_model.safetensors"
    save_file({rename(k): v for k, v in load_file(str(file)).items()}, str(file))


BAD["no_peft_prefix"] = (
    lambda f: _rename_keys(f, lambda k: k.removeprefix("base_model.model.")),
    InvalidValueError,
    "PEFT's keys start with 'base_model.model.'; these do not",
)
BAD["wrapped_model"] = (
    lambda f: _rename_keys(f, lambda k: k.replace("base_model.model.", "base_model.model.lm.")),
    InvalidValueError,
    "extra prefix 'lm.': an adapter made on a model that wraps this one",
)


@pytest.mark.parametrize("case", list(BAD))
def test_bad_adapter_raises_and_changes_nothing(tmp_path, case):
    edit, error, match = BAD[case]
    pop = _population(ATTN)
    to_peft(pop, 0, tmp_path / "a")
    edit(tmp_path / "a")
    before = _snapshot(pop)
    with pytest.raises(error, match=match):
        load_peft_(pop, 1, tmp_path / "a")
    assert _same(pop, before)


def test_no_folder_and_bad_individual(tmp_path):
    pop = _population(ATTN)
    with pytest.raises(FileNotFoundError, match="no PEFT adapter folder"):
        load_peft_(pop, 0, tmp_path / "nothing")
    to_peft(pop, 0, tmp_path / "a")
    with pytest.raises(InvalidIndexError, match="individual"):
        load_peft_(pop, 4, tmp_path / "a")


def test_non_strict_loads_what_matches(tmp_path):
    pop = _population(ATTN)
    to_peft(pop, 0, tmp_path / "a")
    _edit_tensors(
        tmp_path / "a",
        drop=[f"{V1}.lora_A.weight", f"{V1}.lora_B.weight"],
        add={
            "base_model.model.lm_head.lora_A.weight": torch.ones(4, 64),
            "base_model.model.lm_head.lora_B.weight": torch.ones(128, 4),
        },
    )
    before = _snapshot(pop)
    load_peft_(pop, 2, tmp_path / "a", strict=False)
    for name, (d, u), (d0, u0) in zip(pop.target_names, pop.factors(), before):
        if name == "model.layers.1.self_attn.v_proj":  # not in the file: a zero adapter, as under PEFT
            assert not d[2].any() and not u[2].any()
        else:
            assert torch.equal(d[2], d0[0]) and torch.equal(u[2], u0[0])
        assert torch.equal(d[[0, 1, 3]], d0[[0, 1, 3]]) and torch.equal(u[[0, 1, 3]], u0[[0, 1, 3]])


# ------------------------------------------------------------------- Population's thin methods


def test_population_methods_delegate_to_populora_llm(tmp_path):
    pop = _population(BLOCK)
    before = _snapshot(pop)
    folder = pop.to_peft(3, tmp_path / "m", base_model_name_or_path="tiny")
    assert folder == tmp_path / "m"
    assert json.loads((folder / "adapter_config.json").read_text())["base_model_name_or_path"] == "tiny"
    x = _tokens()
    with torch.no_grad():
        expected = pop(x, individual=3).logits
    assert (_peft_logits(folder, x) - expected).abs().max() < TOL
    pop.load_peft_(1, folder)
    for (d, u), (d0, u0) in zip(pop.factors(), before):
        assert torch.equal(d[1], d0[3]) and torch.equal(u[1], u0[3])
        assert torch.equal(d[0], d0[0]) and torch.equal(u[2:], u0[2:])
    with pytest.raises(InvalidValueError, match="does not fit the population's targets"):
        _population(ATTN).load_peft_(0, folder)
    pop_loose = _population(ATTN)
    pop_loose.load_peft_(0, folder, strict=False)
    assert all(
        torch.equal(d[0], d0[3])
        for (d, _), (d0, _) in zip(
            pop_loose.factors(), [(b[0], b[1]) for n, b in zip(pop.target_names, before) if n in pop_loose.target_names]
        )
    )


def test_set_factors_writes_one_individual_and_checks_first():
    pop = _population(ATTN, low_rank=4)
    before = _snapshot(pop)
    new = [(torch.full_like(d[0], 0.5, dtype=torch.float64), torch.full_like(u[0], -0.25)) for d, u in pop.factors()]
    pop.set_factors_(2, new)
    for (d, u), (d0, u0) in zip(pop.factors(), before):
        assert d.dtype == torch.float32 and torch.equal(d[2], torch.full_like(d[2], 0.5))
        assert torch.equal(u[2], torch.full_like(u[2], -0.25))
        assert torch.equal(d[[0, 1, 3]], d0[[0, 1, 3]]) and torch.equal(u[[0, 1, 3]], u0[[0, 1, 3]])
    snap = _snapshot(pop)
    name = pop.target_names[1]
    d_shape = tuple(pop.factors()[1].down.shape[1:])
    bad_shape = list(new)
    bad_shape[1] = (torch.zeros(d_shape[0], d_shape[1] + 1), new[1][1])
    bad_nan = list(new)
    bad_nan[-1] = (new[-1][0], torch.full_like(new[-1][1], float("nan")))
    cases = [
        (InvalidValueError, "one \\(down, up\\) pair per target \\(4\\), got 3", new[:3]),
        (InvalidValueError, f"down of '{name}' must have shape \\({d_shape[0]}, {d_shape[1]}\\), got", bad_shape),
        (InvalidValueError, "holds non-finite values", bad_nan),
        (InvalidTypeError, "must be floating point, got torch.int64", [(d.long(), u) for d, u in new]),
        (InvalidTypeError, "must be a \\(down, up\\) pair of tensors", [d for d, _ in new]),
        (InvalidTypeError, "must be a sequence of \\(down, up\\) pairs", torch.zeros(3)),
        (InvalidIndexError, r"`individual` must be an id in \[0, 4\), got 4", None),
    ]
    for error, match, value in cases:
        with pytest.raises(error, match=match):
            pop.set_factors_(4 if value is None else 0, new if value is None else value)
        assert _same(pop, snap)


def test_set_factors_stays_out_of_autograd():
    pop = Population(_llama(), pop_size=2, low_rank=2, lora_targets=ATTN, requires_grad=True, init_scale=1.0)
    pop.set_factors_(0, [(d[1].detach(), u[1].detach()) for d, u in pop.factors()])
    loss = pop(_tokens(), individual=0).logits.square().mean()
    loss.backward()
    assert all(p.grad is not None for p in pop.parameters() if p.requires_grad)
