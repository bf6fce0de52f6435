"""Finding lora targets: paths, globs, auto-discovery, and the errors for misses."""

import warnings

import pytest
from models import TinyTransformer, mlp
from torch import nn

from populora.errors import TargetNotFoundError
from populora.targets import find_targets, tied_weights


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
