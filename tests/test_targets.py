"""Finding lora targets: paths, globs, auto-discovery, and the errors for misses."""

import re
import warnings

import pytest
from models import TinyTransformer, mlp
from torch import nn

from populora.errors import InvalidTypeError, TargetNotFoundError
from populora.targets import TARGET_FORMS, find_targets, tied_weights


def test_none_finds_every_linear_in_module_order():
    model = TinyTransformer(depth=1)
    found = find_targets(model, None)
    assert list(found) == [
        "blocks.0.attn.q",
        "blocks.0.attn.k",
        "blocks.0.attn.v",
        "blocks.0.attn.o",
        "blocks.0.mlp.0",
        "blocks.0.mlp.2",
        "head",
    ]
    assert all(isinstance(m, nn.Linear) for m in found.values())


def test_paths_and_globs():
    model = TinyTransformer(depth=2)
    assert list(find_targets(model, ["head", "embed"])) == ["embed", "head"]  # model order, Embedding allowed
    assert list(find_targets(model, "*.q")) == ["blocks.0.attn.q", "blocks.1.attn.q"]
    assert list(find_targets(model, ["blocks.1.*", "blocks.1.attn.q"])) == [
        "blocks.1.attn.q",
        "blocks.1.attn.k",
        "blocks.1.attn.v",
        "blocks.1.attn.o",
        "blocks.1.mlp.0",
        "blocks.1.mlp.2",
    ]


def test_missing_path_lists_closest_linear_paths():
    with pytest.raises(
        TargetNotFoundError,
        match=r"lora target '3' is not a module of Sequential; "
        r"closest nn.Linear paths: '2', '0'",
    ):
        find_targets(mlp(), ["0", "3"])
    with pytest.raises(TargetNotFoundError, match=r"closest nn.Linear paths: 'blocks.0.attn.q'"):
        find_targets(TinyTransformer(depth=1), ["blocks.0.attn.qq"])


def test_non_linear_target_rejected():
    with pytest.raises(TargetNotFoundError, match=r"lora target '1' is GELU; expected nn.Linear or nn.Embedding"):
        find_targets(mlp(), ["1"])


def test_glob_matching_nothing():
    with pytest.raises(TargetNotFoundError, match=r"pattern '\*.w' matches no nn.Linear or nn.Embedding"):
        find_targets(mlp(), "*.w")


def test_multihead_attention_out_proj_refused_or_skipped():
    model = nn.Sequential(nn.Linear(4, 8))
    model.add_module("mha", nn.MultiheadAttention(8, 2, batch_first=True))
    with pytest.raises(TargetNotFoundError, match=r"'mha.out_proj' cannot be routed: nn.MultiheadAttention"):
        find_targets(model, ["mha.out_proj"])
    assert list(find_targets(model, None)) == ["0"]


def test_empty_or_no_linear():
    with pytest.raises(TargetNotFoundError, match="`lora_targets` is empty"):
        find_targets(mlp(), [])
    with pytest.raises(TargetNotFoundError, match="ReLU has none"):
        find_targets(nn.ReLU(), None)


def test_layers_whose_forward_is_not_the_plain_one_are_refused():
    """A routed delta on an overriding forward would not equal merging it into the weight."""

    class LinearReLU(nn.Linear):
        def forward(self, x):
            return super().forward(x).relu()

    model = nn.Sequential(LinearReLU(3, 4), nn.Linear(4, 2), nn.Embedding(5, 2, max_norm=1.0))
    with pytest.raises(TargetNotFoundError, match=r"'0' cannot be routed: LinearReLU '0' overrides the forward"):
        find_targets(model, ["0"])
    with pytest.raises(TargetNotFoundError, match=r"'2' cannot be routed: nn.Embedding '2' has max_norm=1.0"):
        find_targets(model, ["2"])
    assert list(find_targets(model, None)) == ["1"]


def _tied_lm():
    """Embedding + Linear head sharing one weight (an LM with tie_word_embeddings=True), a Linear between."""
    model = nn.ModuleDict(dict(embed=nn.Embedding(11, 8), mid=nn.Linear(8, 8), head=nn.Linear(8, 11, bias=False)))
    model.head.weight = model.embed.weight
    return model


def test_tied_weights_are_found():
    assert tied_weights(_tied_lm()) == {"embed": ["head.weight"], "head": ["embed.weight"]}
    shared = nn.Linear(3, 3)
    assert tied_weights(nn.Sequential(shared, nn.ReLU(), shared)) == {}  # one module twice: one layer, not tied


def test_auto_discovery_and_patterns_skip_tied_layers_with_one_warning():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert list(find_targets(_tied_lm(), None)) == ["mid"]
    assert len(caught) == 1
    assert str(caught[0].message).startswith(
        "skipped 1 layer(s) with tied weights, which cannot be targets: "
        "'head.weight' is the same tensor as 'embed.weight' (tied weights)"
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert list(find_targets(_tied_lm(), "*")) == ["mid"]
    assert len(caught) == 1 and "skipped 2 layer(s)" in str(caught[0].message)
    with pytest.raises(TargetNotFoundError, match=r"pattern 'he\*' matches only layers with tied weights"):
        find_targets(_tied_lm(), "he*")


def test_explicit_tied_target_raises_naming_both_modules():
    with pytest.raises(
        TargetNotFoundError,
        match=r"lora target 'head' cannot be a target: 'head.weight' is the "
        r"same tensor as 'embed.weight' \(tied weights\): merging an "
        r"adapter of 'head' would also change 'embed'",
    ):
        find_targets(_tied_lm(), ["mid", "head"])
    with pytest.raises(TargetNotFoundError, match=r"'embed.weight' is the same tensor as 'head.weight'"):
        find_targets(_tied_lm(), "embed")


def test_only_tied_linears_is_an_error():
    model = nn.ModuleDict(dict(embed=nn.Embedding(5, 4), head=nn.Linear(4, 5, bias=False)))
    model.head.weight = model.embed.weight
    with pytest.raises(TargetNotFoundError, match=r"has none that can be routed \(tied weights skipped: \['head'\]\)"):
        find_targets(model, None)


# ------------------------------------------------------------------------- PEFT's forms (issue 23)


def _llama_like(tie: bool = False):
    """Two decoder blocks with HF Llama's module names, an embedding and an lm_head (``get_output_embeddings``)."""

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.self_attn = nn.ModuleDict({n: nn.Linear(8, 8) for n in ("q_proj", "k_proj", "v_proj", "o_proj")})
            self.mlp = nn.ModuleDict({n: nn.Linear(8, 8) for n in ("gate_proj", "up_proj", "down_proj")})

    class LM(nn.Module):
        def __init__(self):
            super().__init__()
            self.model = nn.Module()
            self.model.embed_tokens = nn.Embedding(11, 8)
            self.model.layers = nn.ModuleList([Block(), Block()])
            self.lm_head = nn.Linear(8, 11, bias=False)
            if tie:
                self.lm_head.weight = self.model.embed_tokens.weight

        def get_output_embeddings(self):
            return self.lm_head

    return LM()


def _paths(layers, names):
    return [f"model.layers.{i}.{n}" for i in layers for n in names]


def test_a_dot_free_name_matches_as_a_path_suffix_like_peft():
    model = _llama_like()
    assert list(find_targets(model, ["q_proj", "v_proj"])) == _paths([0, 1], ["self_attn.q_proj", "self_attn.v_proj"])
    assert list(find_targets(model, "down_proj")) == _paths([0, 1], ["mlp.down_proj"])
    # a name never matches part of a component: 'proj' is no layer's name
    with pytest.raises(
        TargetNotFoundError, match=r"lora target name 'proj' matches no nn.Linear.*closest nn.Linear names: "
    ):
        find_targets(model, "proj")
    # a name of containers: says so, and how to reach the layers inside
    with pytest.raises(
        TargetNotFoundError, match=r"lora target name 'mlp' matches 2 module\(s\) \(ModuleDict: .*'\*\.mlp\.\*' selects"
    ):
        find_targets(model, "mlp")


def test_a_name_and_its_exclusion_and_globs_combine():
    model = _llama_like()
    assert list(find_targets(model, ["q_proj", "v_proj", "!model.layers.0"])) == _paths(
        [1], ["self_attn.q_proj", "self_attn.v_proj"]
    )
    assert list(find_targets(model, ["*.self_attn.*", "!k_proj", "!o_proj"])) == _paths(
        [0, 1], ["self_attn.q_proj", "self_attn.v_proj"]
    )
    assert list(find_targets(model, ["!q_proj", "!mlp"])) == _paths(
        [0, 1], ["self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj"]
    ) + ["lm_head"]
    with pytest.raises(
        TargetNotFoundError, match=r"exclusion '!q_prj' matches no nn.Linear.*closest nn.Linear names: 'q_proj'"
    ):
        find_targets(model, ["all-linear", "!q_prj"])


def test_an_index_is_a_path_not_a_suffix():
    """'0' in nested Sequentials names the first slot, not the first layer of every block."""
    model = nn.Sequential(nn.Sequential(nn.Linear(2, 2), nn.ReLU()), nn.Sequential(nn.Linear(2, 2)), nn.Linear(2, 2))
    with pytest.raises(
        TargetNotFoundError,
        match=r"lora target '0' is Sequential; expected nn.Linear or nn.Embedding \(a glob such as '0.\*'",
    ):
        find_targets(model, "0")
    assert list(find_targets(model, ["2", "0.*"])) == ["0.0", "2"]


def test_all_linear_leaves_out_the_output_layer_like_peft():
    model = _llama_like()
    block = ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj"]
    block += ["mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"]
    assert list(find_targets(model, "all-linear")) == _paths([0, 1], block)
    assert list(find_targets(model, "ALL-LINEAR")) == _paths([0, 1], block)  # PEFT lower-cases it too
    assert list(find_targets(model, None))[-1] == "lm_head"  # None keeps the head
    # with an embedding, and minus the MLPs
    assert list(find_targets(model, ["all-linear", "embed_tokens", "!*.mlp.*"])) == ["model.embed_tokens"] + _paths(
        [0, 1], block[:4]
    )
    # a plain nn.Module has no output layer to leave out: the same as None
    assert list(find_targets(TinyTransformer(depth=1), "all-linear")) == list(
        find_targets(TinyTransformer(depth=1), None)
    )
    with pytest.raises(TargetNotFoundError, match=r"'!all-linear' would exclude every layer"):
        find_targets(model, ["q_proj", "!all-linear"])


def test_all_linear_with_a_tied_head_warns_about_nothing():
    """The tied head is the output layer: left out by the keyword, not skipped with a warning."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        found = find_targets(_llama_like(tie=True), "all-linear")
    assert "lm_head" not in found and len(found) == 14
    with pytest.raises(
        TargetNotFoundError, match=r"lora target 'lm_head' cannot be a target: 'lm_head.weight' is the same tensor"
    ):
        find_targets(_llama_like(tie=True), "lm_head")  # a name matching one root layer reads as its path
    with pytest.raises(
        TargetNotFoundError, match=r"lora target name 'embed_tokens' matches only layers with tied weights"
    ):
        find_targets(_llama_like(tie=True), "embed_tokens")


def test_a_name_matching_tied_and_untied_layers_skips_the_tied_with_a_warning():
    model = nn.ModuleDict(dict(a=nn.ModuleDict(dict(w=nn.Linear(4, 4))), b=nn.ModuleDict(dict(w=nn.Linear(4, 4)))))
    model.b.w.weight = model.a.w.weight  # two different modules, one weight
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(TargetNotFoundError, match=r"name 'w' matches only layers with tied weights"):
            find_targets(model, "w")
    model.add_module("c", nn.ModuleDict(dict(w=nn.Linear(4, 4))))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert list(find_targets(model, "w")) == ["c.w"]
    assert len(caught) == 1 and "skipped 2 layer(s) with tied weights" in str(caught[0].message)


def test_a_compiled_regex_fullmatches_the_path():
    model = _llama_like()
    pattern = re.compile(r".*\.layers\.1\.self_attn\.(q|v)_proj")
    assert list(find_targets(model, pattern)) == _paths([1], ["self_attn.q_proj", "self_attn.v_proj"])
    assert list(find_targets(model, [re.compile(r".*q_proj"), "!model.layers.1"])) == _paths([0], ["self_attn.q_proj"])
    # fullmatch, not search: a bare 'q_proj' regex matches no full path
    with pytest.raises(TargetNotFoundError, match=r"lora target regex 'q_proj' matches no nn.Linear"):
        find_targets(model, re.compile("q_proj"))
    with pytest.raises(InvalidTypeError, match=r"a `lora_targets` regex must be a str pattern"):
        find_targets(model, re.compile(b"q"))


def test_a_miss_lists_the_closest_paths_and_the_forms():
    with pytest.raises(TargetNotFoundError) as caught:
        find_targets(_llama_like(), "model.layers.0.self_attn.q_prj")
    message = str(caught.value)
    assert "closest nn.Linear paths: 'model.layers.0.self_attn.q_proj'" in message
    for form in ("a dot-free name matched as a path suffix", "fnmatch glob", "'all-linear'", "re.Pattern", "'!'"):
        assert form in message
    assert "populora.llm.LLAMA_ATTENTION" in message and message.endswith(TARGET_FORMS)


def test_peft_forms_build_a_population():
    from populora import Population

    pop = Population(_llama_like(), 3, 2, ["q_proj", "v_proj"], seed=0)
    assert pop.target_names == _paths([0, 1], ["self_attn.q_proj", "self_attn.v_proj"])
    pop = Population(_llama_like(), 3, 2, "all-linear", seed=0)
    assert len(pop.target_names) == 14 and "lm_head" not in pop.target_names
