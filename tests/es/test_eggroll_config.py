"""EggrollConfig: EggrollES's options as one config, stored in its state; 0.5.0 keywords deprecated."""

import dataclasses
import inspect
import json
import warnings

import pytest
import torch
from models import mlp

from populora import EggrollES
from populora.errors import CheckpointError, InvalidTypeError, InvalidValueError
from populora.es.config import EggrollConfig


def loss(out, target):
    return (out - target).square().mean()


def data():
    g = torch.Generator().manual_seed(1)
    return torch.randn(5, 6, generator=g), torch.randn(5, 3, generator=g)


def build(*args, **kwargs):
    torch.manual_seed(0)
    return EggrollES(mlp(), 6, 0.1, 0.05, 2, *args, **kwargs)


def stepped(es, steps=2):
    x, y = data()
    for _ in range(steps):
        es.step(x, loss, y)
    return [p.detach().clone() for p in es.model.parameters()]


@pytest.mark.parametrize(
    "fields, error, message",
    [
        ({"seed": "x"}, InvalidTypeError, r"`EggrollConfig\.seed` must be an int"),
        ({"antithetic": 1}, InvalidTypeError, r"`EggrollConfig\.antithetic` must be a bool"),
        ({"fitness_shaping": "softmax"}, InvalidValueError, r"`EggrollConfig\.fitness_shaping` must be one of"),
        ({"group_size": 1}, InvalidValueError, r"`EggrollConfig\.group_size` must be an int >= 2"),
        ({"noise_reuse": 0}, InvalidValueError, r"`EggrollConfig\.noise_reuse` must be an int >= 1"),
        ({"perturb_vectors": "yes"}, InvalidTypeError, r"`EggrollConfig\.perturb_vectors`"),
    ],
)
def test_a_bad_field_is_refused_when_built_and_named(fields, error, message):
    with pytest.raises(error, match=message):
        EggrollConfig(**fields)
    with pytest.raises(error, match=message):
        dataclasses.replace(EggrollConfig(), **fields)


def test_json_round_trip_and_replace():
    config = EggrollConfig(seed=3, antithetic=False, fitness_shaping="centered_rank", group_size=2, noise_reuse=4)
    assert EggrollConfig.from_dict(json.loads(json.dumps(config.to_dict()))) == config
    assert dataclasses.replace(config, seed=5).seed == 5 and config.seed == 3


def test_signature_keeps_torcheggroll_leading_parameters_within_the_cap():
    params = [p for p in inspect.signature(EggrollES.__init__).parameters if p != "self"]
    assert params[:5] == ["model", "pop_size", "sigma", "lr", "rank"] and len(params) <= 12, params


def test_config_and_keywords_agree_and_deprecated_keywords_give_the_same_run_bit_for_bit():
    config = EggrollConfig(seed=4, fitness_shaping="centered_rank", noise_reuse=2, perturb_vectors=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        by_config = stepped(build(config))
        overridden = stepped(build(dataclasses.replace(config, seed=9), seed=4))  # the keyword wins
    with pytest.warns(DeprecationWarning, match=r"config=EggrollConfig\(fitness_shaping=\.\.\., noise_reuse="):
        legacy = build(seed=4, fitness_shaping="centered_rank", noise_reuse=2, perturb_vectors=False)
    assert legacy.config == config
    by_keywords = stepped(legacy)
    for a, b, c in zip(by_config, by_keywords, overridden):
        assert torch.equal(a, b) and torch.equal(a, c)


def test_deprecated_keywords_keep_their_0_5_0_errors():
    with pytest.raises(InvalidValueError, match="`noise_reuse` must be an int >= 1, got 0"):
        build(noise_reuse=0)
    with pytest.raises(TypeError, match=r"'noise_reus' \(did you mean 'noise_reuse'\?\)"):
        build(noise_reus=2)


def test_state_stores_the_config_and_a_load_with_another_is_refused_naming_the_field(tmp_path):
    es = build(EggrollConfig(noise_reuse=2))
    stepped(es, 1)
    state = es.state_dict()
    assert state["eggroll_config"] == {k: v for k, v in es.config.to_dict().items() if k != "seed"}
    other = build(EggrollConfig(noise_reuse=2, fitness_shaping="centered_rank"))
    with pytest.raises(
        CheckpointError, match=r"EggrollConfig\.fitness_shaping='zscore'; this run has .*'centered_rank'"
    ):
        other.load_state_dict(state)
    path = es.save(tmp_path / "es.pt")
    with pytest.raises(CheckpointError, match=r"es\.pt.*EggrollConfig\.fitness_shaping"):
        other.load(path)
    again = build(EggrollConfig(noise_reuse=2, seed=7))  # the seed is restored from the state, as before
    again.load(path)
    assert again.seed == 0 and again.generation == 1


def test_a_state_written_before_the_config_was_stored_loads_as_before():
    es = build()
    stepped(es, 1)
    state = es.state_dict()
    del state["eggroll_config"]  # 0.5.0's states
    fresh = build()
    fresh.load_state_dict(state)
    assert fresh.generation == 1
