"""load_peft_ adapts exactly the modules PeftModel adapts: PEFT's matching rules for ``target_modules``
(a list: exact names or ``.suffix``; a string: a regex fullmatch; ``"all-linear"``), ``exclude_modules``,
``layers_to_transform`` / ``layers_pattern``, and ``rank_pattern`` / ``alpha_pattern``.

Every case starts from ONE adapter made by PEFT itself on all 14 block linears of a tiny Llama (random
non-zero A and B), then edits ``adapter_config.json`` to the rule under test: the file then holds tensors
for modules the rule leaves out, which ``PeftModel.from_pretrained`` ignores. The population (its targets:
every block linear, and ``lm_head``) must compute PeftModel's logits to 1e-5, and hold a non-zero adapter on
exactly the modules PeftModel wrapped.
"""

from __future__ import annotations

import json
import shutil
import warnings

import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("peft")
pytest.importorskip("safetensors")

from peft import LoraConfig, PeftModel, get_peft_model
from safetensors.torch import load_file, save_file
from transformers import LlamaConfig, LlamaForCausalLM

from populora import Population
from populora.errors import CheckpointError, InvalidValueError
from populora.llm import load_peft_

TOL = 1e-5
BLOCK = ["model.layers.*.self_attn.*_proj", "model.layers.*.mlp.*_proj", "lm_head"]
PREFIX = "base_model.model."
_STATE: dict[str, torch.Tensor] = {}


def _llama() -> LlamaForCausalLM:
    """The same tiny random Llama every call (weights drawn once, then copied)."""
    config = LlamaConfig(
        vocab_size=128,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
    )
    if not _STATE:
        with torch.random.fork_rng():
            torch.manual_seed(0)
            _STATE.update({k: v.clone() for k, v in LlamaForCausalLM(config).state_dict().items()})
    model = LlamaForCausalLM(config)
    model.load_state_dict(_STATE)
    return model.eval()


def _tokens() -> torch.Tensor:
    return torch.randint(0, 128, (3, 7), generator=torch.Generator().manual_seed(5))


def _save_peft(path, **config) -> None:
    """An adapter made by PEFT (A and B random and non-zero), saved to ``path``."""
    model = get_peft_model(_llama(), LoraConfig(lora_dropout=0.0, **config))
    g = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_" in name:
                p.copy_(torch.randn(p.shape, generator=g) * 0.3)
    model.save_pretrained(str(path))


@pytest.fixture(scope="module")
def all_linear(tmp_path_factory):
    """PEFT's adapter on every block linear (``all-linear`` leaves ``lm_head`` out), with lm_head tensors
    added by hand: a file holding tensors for every module a rule could pick or leave out."""
    folder = tmp_path_factory.mktemp("peft") / "all"
    _save_peft(folder, r=2, lora_alpha=6, target_modules="all-linear")
    file = folder / "adapter_model.safetensors"
    tensors = load_file(str(file))
    g = torch.Generator().manual_seed(3)
    tensors[f"{PREFIX}lm_head.lora_A.weight"] = torch.randn(2, 64, generator=g)
    tensors[f"{PREFIX}lm_head.lora_B.weight"] = torch.randn(128, 2, generator=g)
    save_file(tensors, str(file))
    return folder


def _edited(all_linear, tmp_path, **changes):
    folder = tmp_path / "adapter"
    shutil.copytree(all_linear, folder)
    file = folder / "adapter_config.json"
    config = json.loads(file.read_text())
    config.update(changes)
    file.write_text(json.dumps(config))
    return folder


def _peft(folder) -> tuple[torch.Tensor, set[str]]:
    """PeftModel's logits on `_tokens()` and the modules it wrapped with LoRA."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # PEFT warns about the tensors its config leaves out
        model = PeftModel.from_pretrained(_llama(), str(folder)).eval()
    wrapped = {
        n.removeprefix(PREFIX) for n, m in model.named_modules() if hasattr(m, "lora_A") and "default" in m.lora_A
    }
    with torch.no_grad():
        return model(input_ids=_tokens()).logits, wrapped


def _population() -> Population:
    return Population(_llama(), pop_size=3, low_rank=4, lora_targets=BLOCK, init_scale=1.0, seed=1)


def _check_like_peft(folder) -> set[str]:
    expected, wrapped = _peft(folder)
    pop = _population()
    load_peft_(pop, 1, folder, strict=False)
    with torch.no_grad():
        routed = pop(_tokens(), individual=1).logits
    adapted = {name for name, (down, up) in zip(pop.target_names, pop.factors()) if up[1].any()}
    assert adapted == wrapped
    assert (routed - expected).abs().max() < TOL
    return wrapped


L0, L1 = "model.layers.0.", "model.layers.1."
RULES = {
    # a list: an exact module name, or a suffix after a dot
    "list_exact": (
        {"target_modules": [f"{L0}self_attn.q_proj", f"{L1}mlp.down_proj"]},
        {f"{L0}self_attn.q_proj", f"{L1}mlp.down_proj"},
    ),
    "list_suffix": (
        {"target_modules": ["q_proj", "up_proj"]},
        {f"{L}{m}" for L in (L0, L1) for m in ("self_attn.q_proj", "mlp.up_proj")},
    ),
    "list_dotted_suffix": (
        {"target_modules": ["self_attn.v_proj", "1.mlp.gate_proj"]},
        {f"{L0}self_attn.v_proj", f"{L1}self_attn.v_proj", f"{L1}mlp.gate_proj"},
    ),
    # a string: a regex that must match the WHOLE name
    "regex_fullmatch": (
        {"target_modules": r".*layers\.1\.self_attn\.(q|k)_proj"},
        {f"{L1}self_attn.q_proj", f"{L1}self_attn.k_proj"},
    ),
    "all_linear": (
        {"target_modules": "all-linear"},
        {
            f"{L}{m}"
            for L in (L0, L1)
            for m in (
                "self_attn.q_proj",
                "self_attn.k_proj",
                "self_attn.v_proj",
                "self_attn.o_proj",
                "mlp.gate_proj",
                "mlp.up_proj",
                "mlp.down_proj",
            )
        },
    ),
    # exclude_modules: a list (exact or suffix) or a regex fullmatch, applied before target_modules
    "exclude_list": (
        {"target_modules": ["q_proj", "v_proj", "o_proj"], "exclude_modules": [f"{L0}self_attn.v_proj", "o_proj"]},
        {f"{L0}self_attn.q_proj", f"{L1}self_attn.q_proj", f"{L1}self_attn.v_proj"},
    ),
    "exclude_regex": (
        {"target_modules": "all-linear", "exclude_modules": r".*(layers\.0\.|mlp).*"},
        {f"{L1}self_attn.{m}_proj" for m in "qkvo"},
    ),
    # layers_to_transform: the first number after a dotted segment (or after layers_pattern) is the layer
    "layers_int": (
        {"target_modules": ["q_proj", "down_proj"], "layers_to_transform": 1},
        {f"{L1}self_attn.q_proj", f"{L1}mlp.down_proj"},
    ),
    "layers_pattern": (
        {"target_modules": ["k_proj", "up_proj"], "layers_to_transform": [0], "layers_pattern": "layers"},
        {f"{L0}self_attn.k_proj", f"{L0}mlp.up_proj"},
    ),
    # PEFT applies the layer filter only to suffix matches: an exact name is adapted whatever its layer
    "layers_skip_exact_names": (
        {"target_modules": [f"{L0}self_attn.q_proj", "v_proj"], "layers_to_transform": [1]},
        {f"{L0}self_attn.q_proj", f"{L1}self_attn.v_proj"},
    ),
}


@pytest.mark.parametrize("rule", list(RULES))
def test_each_matching_rule_adapts_what_peft_adapts(all_linear, tmp_path, rule):
    changes, modules = RULES[rule]
    wrapped = _check_like_peft(_edited(all_linear, tmp_path, **changes))
    assert wrapped == modules  # the rule is what this test says it is, in PEFT too


def test_rank_and_alpha_patterns_follow_peft(tmp_path):
    """PEFT's rule: the first key k (in order) with ``re.match(rf'(.*\\.)?({k})$', name)``."""
    folder = tmp_path / "a"
    _save_peft(
        folder,
        r=2,
        lora_alpha=6,
        target_modules=["q_proj", "v_proj", "down_proj"],
        rank_pattern={"layers.1.self_attn.q_proj": 3, "down_proj": 4},
        alpha_pattern={r"layers\.\d\.self_attn\.v_proj": 2.5, "q_proj": 9},
    )
    wrapped = _check_like_peft(folder)
    assert len(wrapped) == 6
    tensors = load_file(str(folder / "adapter_model.safetensors"))
    assert tensors[f"{PREFIX}{L1}self_attn.q_proj.lora_A.weight"].shape[0] == 3
    assert tensors[f"{PREFIX}{L0}mlp.down_proj.lora_A.weight"].shape[0] == 4


def test_tensors_of_a_module_the_config_leaves_out_are_not_applied(all_linear, tmp_path):
    """The issue's case: the file holds v_proj tensors, target_modules lists q_proj only."""
    folder = _edited(all_linear, tmp_path, target_modules=["q_proj"])
    assert f"{PREFIX}{L0}self_attn.v_proj.lora_A.weight" in load_file(str(folder / "adapter_model.safetensors"))
    expected, wrapped = _peft(folder)
    assert wrapped == {f"{L0}self_attn.q_proj", f"{L1}self_attn.q_proj"}
    pop = Population(
        _llama(), pop_size=2, low_rank=4, lora_targets=["model.layers.*.self_attn.[qv]_proj"], init_scale=1.0, seed=1
    )
    load_peft_(pop, 0, folder, strict=False)
    with torch.no_grad():
        routed = pop(_tokens(), individual=0).logits
    assert (routed - expected).abs().max() < TOL
    for name, (_, up) in zip(pop.target_names, pop.factors()):
        assert bool(up[0].any()) == name.endswith("q_proj")
    # strict: the population's v_proj targets are not adapted by the config, and their tensors fit no target
    before = [(d.clone(), u.clone()) for d, u in pop.factors()]
    with pytest.raises(
        InvalidValueError,
        match=r"(?s)does not adapt.*'model.layers.0.self_attn.v_proj'.*"
        r"belong to no target",
    ):
        load_peft_(pop, 1, folder)
    assert all(torch.equal(d, d0) and torch.equal(u, u0) for (d, u), (d0, u0) in zip(pop.factors(), before))


REFUSED = {
    # PEFT would pick its own per-architecture default targets
    "no_target_modules": ({"target_modules": None}, InvalidValueError, "target_modules is null"),
    # PEFT raises: no module of the model matches
    "matches_nothing": ({"target_modules": ["qq_proj"]}, InvalidValueError, "match no module"),
    "regex_is_not_a_search": ({"target_modules": "q_proj"}, InvalidValueError, "match no module"),
    # full trained copies of whole modules: not a low-rank adapter
    "modules_to_save": ({"modules_to_save": ["lm_head"]}, InvalidValueError, "modules_to_save"),
    "ensure_weight_tying": ({"ensure_weight_tying": True}, InvalidValueError, "ensure_weight_tying"),
    # configs PEFT itself refuses to build
    "layers_with_a_regex": (
        {"target_modules": ".*q_proj", "layers_to_transform": [0]},
        CheckpointError,
        "layers_to_transform",
    ),
    "pattern_without_layers": (
        {"target_modules": ["q_proj"], "layers_pattern": "layers"},
        CheckpointError,
        "layers_pattern",
    ),
    "bad_target_type": ({"target_modules": [3, "q_proj"]}, CheckpointError, "target_modules"),
    "bad_layers_type": (
        {"target_modules": ["q_proj"], "layers_to_transform": ["0"]},
        CheckpointError,
        "layers_to_transform",
    ),
}


@pytest.mark.parametrize("case", list(REFUSED))
def test_what_is_not_implemented_or_not_valid_is_refused(all_linear, tmp_path, case):
    changes, error, match = REFUSED[case]
    folder = _edited(all_linear, tmp_path, **changes)
    pop = _population()
    before = [(d.clone(), u.clone()) for d, u in pop.factors()]
    with pytest.raises(error, match=match) as info:
        load_peft_(pop, 1, folder, strict=False)
    assert str(folder) in str(info.value)
    assert all(torch.equal(d, d0) and torch.equal(u, u0) for (d, u), (d0, u0) in zip(pop.factors(), before))
