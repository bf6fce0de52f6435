"""Targets on real LMs: '!' exclusions, the Llama presets, and quantized base layers refused."""

from __future__ import annotations

import warnings

import pytest
import torch
from models import TinyTransformer
from torch import nn

from populora import Population
from populora.errors import InvalidValueError, TargetNotFoundError
from populora.llm import LLAMA_ALL, LLAMA_ATTENTION, LLAMA_MLP
from populora.targets import find_targets, quantized_reason

PROJ = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def _tiny_llama(tied: bool):
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(
        vocab_size=128,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        tie_word_embeddings=tied,
    )
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(config).eval()


def _block_linears(layers: int = 2) -> list[str]:
    kinds = {
        "q_proj": "self_attn",
        "k_proj": "self_attn",
        "v_proj": "self_attn",
        "o_proj": "self_attn",
        "gate_proj": "mlp",
        "up_proj": "mlp",
        "down_proj": "mlp",
    }
    return [f"model.layers.{i}.{kinds[p]}.{p}" for i in range(layers) for p in PROJ]


# ----------------------------------------------------------------------------------------- exclusion


def test_exclusion_removes_matches_whatever_the_order():
    model = TinyTransformer(depth=2)
    every = list(find_targets(model, None))
    assert list(find_targets(model, ["!head"])) == [p for p in every if p != "head"]
    assert list(find_targets(model, ["!head", "blocks.*"])) == list(find_targets(model, ["blocks.*", "!head"]))
    assert list(find_targets(model, ["blocks.*", "!*.attn.*"])) == [
        "blocks.0.mlp.0",
        "blocks.0.mlp.2",
        "blocks.1.mlp.0",
        "blocks.1.mlp.2",
    ]
    # a module path excludes everything below it; an exact include that is excluded is dropped too
    assert list(find_targets(model, ["!blocks.0", "!head"])) == [p for p in every if p.startswith("blocks.1.")]
    assert list(find_targets(model, ["head", "blocks.0.attn.q", "!head"])) == ["blocks.0.attn.q"]
    # an Embedding selected by an include can be excluded as well
    assert list(find_targets(model, ["embed", "head", "!embed"])) == ["head"]


def test_exclusion_errors():
    model = TinyTransformer(depth=1)
    with pytest.raises(
        TargetNotFoundError,
        match=r"exclusion '!haed' matches no nn.Linear or nn.Embedding of "
        r"TinyTransformer; closest nn.Linear names: 'head'",
    ):
        find_targets(model, ["!haed"])
    with pytest.raises(TargetNotFoundError, match=r"exclusion '!\*.zz' matches no nn.Linear"):
        find_targets(model, ["*.q", "!*.zz"])
    with pytest.raises(TargetNotFoundError, match=r"exclusion is '!' alone"):
        find_targets(model, ["*.q", "!"])
    with pytest.raises(TargetNotFoundError, match=r"selects no layer: every layer its entries match is excluded"):
        find_targets(model, ["*.q", "!blocks.*"])
    with pytest.raises(
        TargetNotFoundError,
        match=r"only exclusions\) looks for every other nn.Linear, but "
        r"TinyTransformer has none that can be routed \(excluded: ",
    ):
        find_targets(model, ["!blocks.*", "!head"])


def test_population_with_exclusions_checks_before_touching_the_model():
    model = TinyTransformer(depth=1)
    flags = [p.requires_grad for p in model.parameters()]
    with pytest.raises(TargetNotFoundError, match="exclusion '!nope'"):
        Population(model, 2, 2, ["!nope"])
    assert [p.requires_grad for p in model.parameters()] == flags
    pop = Population(model, 2, 2, ["!head"])
    assert "head" not in pop.target_names and len(pop.target_names) == 6


# ------------------------------------------------------------------------------------- Llama presets


@pytest.mark.parametrize("tied", [False, True])
def test_llama_presets_on_a_tiny_random_llama(tied):
    model = _tiny_llama(tied)
    blocks = _block_linears()
    assert list(find_targets(model, LLAMA_ALL)) == blocks
    assert list(find_targets(model, LLAMA_ATTENTION)) == [p for p in blocks if ".self_attn." in p]
    assert list(find_targets(model, LLAMA_MLP)) == [p for p in blocks if ".mlp." in p]
    assert list(find_targets(model, (*LLAMA_ALL, "!model.layers.0.*"))) == blocks[7:]
    # every block linear but the head, with no tied-weights warning for the excluded (tied) head
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert list(find_targets(model, ["!lm_head"])) == blocks
    if tied:  # auto-discovery skips the tied head with its warning
        with pytest.warns(UserWarning, match="skipped 1 layer.*'lm_head.weight' is the same tensor"):
            assert list(find_targets(model, None)) == blocks
    else:
        assert list(find_targets(model, None)) == [*blocks, "lm_head"]
    pop = Population(model, 2, 4, LLAMA_ALL, init_scale=0)
    assert pop.target_names == blocks


# --------------------------------------------------------------------------------- quantized layers


class Linear4bit(nn.Linear):
    """A hand-made stand-in of bitsandbytes' Linear4bit: packed uint8 weight, its own forward."""

    def __init__(self, d: int, e: int):
        super().__init__(d, e, bias=False)
        self.weight = nn.Parameter(torch.zeros(d * e // 2, 1, dtype=torch.uint8), requires_grad=False)

    def forward(self, x):
        return x.new_zeros(*x.shape[:-1], self.out_features)


class Int8Params(nn.Parameter):
    """A Parameter subclass holding a float-looking weight (as bitsandbytes' Int8Params before quantizing)."""


class Linear8bitLt(nn.Linear):
    def __init__(self, d: int, e: int):
        super().__init__(d, e)
        self.weight = Int8Params(self.weight.data, requires_grad=False)


class QuantLinear(nn.Module):
    """Not an nn.Linear at all (GPTQ / HQQ style): an int weight and a scale."""

    def __init__(self, d: int, e: int):
        super().__init__()
        self.in_features, self.out_features = d, e
        self.register_buffer("weight", torch.zeros(e, d, dtype=torch.int8))
        self.scale = nn.Parameter(torch.ones(e))

    def forward(self, x):
        return x @ (self.weight.float() * self.scale[:, None]).T


def _quantized_model() -> nn.Module:
    return nn.ModuleDict(dict(q=Linear4bit(8, 8), k=Linear8bitLt(8, 8), v=QuantLinear(8, 8), o=nn.Linear(8, 8)))


def test_quantized_reason_names_the_module_and_its_type():
    model = _quantized_model()
    assert quantized_reason(model.q, "q") == (
        "'q' is a quantized layer (Linear4bit from test_llm_targets, weight Parameter of dtype torch.uint8)"
    )
    assert "Linear8bitLt from test_llm_targets, weight Int8Params of dtype torch.float32" in quantized_reason(
        model.k, "k"
    )
    assert "QuantLinear from test_llm_targets, weight Tensor of dtype torch.int8" in quantized_reason(model.v, "v")
    assert quantized_reason(model.o, "o") is None
    assert quantized_reason(nn.Embedding(4, 2)) is None and quantized_reason(nn.ReLU()) is None
    assert quantized_reason(nn.Linear(4, 4).to(torch.bfloat16)) is None


@pytest.mark.parametrize(
    ("targets", "names"),
    [
        (
            None,
            r"`lora_targets=None` looks for every nn.Linear, but found 'q' is a quantized layer \(Linear4bit.*'k' is a "
            r"quantized layer \(Linear8bitLt.*'v' is a quantized layer \(QuantLinear",
        ),
        ("*", r"pattern '\*' matches 'q' is a quantized layer \(Linear4bit"),
        (
            ["o", "v"],
            r"lora target 'v' is a quantized layer \(QuantLinear from test_llm_targets, weight Tensor of "
            r"dtype torch.int8\): quantized base layers are not supported yet",
        ),
        ("q", r"lora target 'q' is a quantized layer \(Linear4bit"),
        (["!o"], r"only exclusions\) looks for every other nn.Linear, but found 'q' is a quantized layer"),
    ],
)
def test_quantized_layers_are_refused_not_skipped(targets, names):
    model = _quantized_model()
    with pytest.raises(TargetNotFoundError, match=names):
        find_targets(model, targets)
    with pytest.raises(TargetNotFoundError, match="quantized base layers are not supported yet"):
        Population(model, 2, 2, targets)
    assert all(type(m).forward is not None for m in model.values())  # nothing wrapped


def test_quantized_layers_can_be_excluded():
    model = _quantized_model()
    assert list(find_targets(model, ["!q", "!k", "!v"])) == ["o"]
    assert list(find_targets(model, ["o"])) == ["o"]
    assert list(find_targets(model, ["*", "!q", "!k", "!v"])) == ["o"]


# ------------------------------------------------------------------------ a model spread over devices


class _Spread(nn.Module):
    """Layers on two devices (as device_map="auto" leaves a model): 'cpu', and 'meta' for an offloaded one."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.embed, self.a, self.b = nn.Embedding(5, 4), nn.Linear(4, 4), nn.Linear(4, 4).to("meta")

    def forward(self, x):
        return self.a(self.embed(x))  # the offloaded layer is not used here


def _spread():
    return _Spread()


def test_placement_of_a_spread_model():
    from populora.population.placement import model_devices, place

    model = _spread()
    assert model_devices(model) == [torch.device("cpu"), torch.device("meta")]
    placement = place(model, find_targets(model, ["embed", "a"]), None)
    assert placement.spread and placement.device == torch.device("cpu")
    assert placement.targets == {"embed": torch.device("cpu"), "a": torch.device("cpu")}
    # an explicit device (or a model on one device) puts everything on that one device
    assert place(model, find_targets(model, ["a"]), "cpu") == (torch.device("cpu"), {"a": torch.device("cpu")}, False)
    single = nn.Sequential(nn.Linear(2, 2))
    assert place(single, find_targets(single, None), None) == (torch.device("cpu"), {"0": torch.device("cpu")}, False)


def test_a_spread_model_stays_where_it_is_and_adapters_follow_their_targets():
    model = _spread()
    pop = Population(model, 3, 2, ["embed", "a"], init_scale=1.0)
    assert model.b.weight.device.type == "meta" and model.a.weight.device.type == "cpu"  # not moved
    assert pop.device == torch.device("cpu")
    assert [(d.device.type, u.device.type) for d, u in pop.factors()] == [("cpu", "cpu"), ("cpu", "cpu")]
    x = torch.tensor([[1, 2], [3, 4], [0, 1]])
    with torch.no_grad():  # the in-memory part routes as usual: row i through individual i
        routed = pop(x, individuals=[0, 1, 2])
        for i in range(3):
            dw = pop.delta_weight(i)
            h = model.embed(x[i]) + dw["embed"][x[i]]
            expected = h @ (model.a.weight + dw["a"]).T + model.a.bias
            assert (routed[i] - expected).abs().max() < 1e-5


def test_a_target_offloaded_to_meta_is_refused_before_the_model_is_touched():
    model = _spread()
    flags = [p.requires_grad for p in model.parameters()]
    with pytest.raises(
        InvalidValueError,
        match=r"spread over \['cpu', 'meta'\] and target\(s\) \['b'\] sit on "
        r"the meta device \(offloaded, not in memory\)",
    ):
        Population(model, 2, 2, ["a", "b"])
    assert [p.requires_grad for p in model.parameters()] == flags
    with pytest.raises(InvalidValueError, match=r"target\(s\) \['b'\]"):
        Population(model, 2, 2, None)
    assert list(Population(model, 2, 2, ["!b"]).target_names) == ["a"]
