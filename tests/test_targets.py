"""Finding lora targets: paths, globs, auto-discovery, and the errors for misses."""

import pytest
from models import TinyTransformer, mlp
from torch import nn

from populora.errors import TargetNotFoundError
from populora.targets import find_targets


def test_none_finds_every_linear_in_module_order():
    model = TinyTransformer(depth=1)
    found = find_targets(model, None)
    assert list(found) == ["blocks.0.attn.q", "blocks.0.attn.k", "blocks.0.attn.v", "blocks.0.attn.o",
                           "blocks.0.mlp.0", "blocks.0.mlp.2", "head"]
    assert all(isinstance(m, nn.Linear) for m in found.values())


def test_paths_and_globs():
    model = TinyTransformer(depth=2)
    assert list(find_targets(model, ["head", "embed"])) == ["embed", "head"]  # model order, Embedding allowed
    assert list(find_targets(model, "*.q")) == ["blocks.0.attn.q", "blocks.1.attn.q"]
    assert list(find_targets(model, ["blocks.1.*", "blocks.1.attn.q"])) == [
        "blocks.1.attn.q", "blocks.1.attn.k", "blocks.1.attn.v", "blocks.1.attn.o", "blocks.1.mlp.0", "blocks.1.mlp.2"]


def test_missing_path_lists_closest_linear_paths():
    with pytest.raises(TargetNotFoundError, match=r"lora target '3' is not a module of Sequential; "
                                                  r"closest nn.Linear paths: '2', '0'"):
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
