"""policy_gradient_step_'s config: PolicyGradient checked when built (naming the field), JSON round trip,
replace, and 0.5.0's flat keywords deprecated and bit for bit the config form."""

from __future__ import annotations

import copy
import dataclasses
import inspect
import json

import pytest
import torch

pytest.importorskip("transformers")

from populora import Population
from populora.errors import InvalidTypeError, InvalidValueError
from populora.llm import tiny_chat_model
from populora.train import LRMultipliers, PolicyGradient, policy_gradient_step_

TARGETS = ["model.layers.*.self_attn.q_proj", "model.layers.*.mlp.down_proj"]


@pytest.mark.parametrize(
    "field, value, error",
    [
        ("pad_id", -1, InvalidValueError),
        ("micro_batch", 0, InvalidValueError),
        ("micro_batch", 2.0, InvalidTypeError),
        ("reduction", "mean", InvalidValueError),
        ("kl_coef", -0.1, InvalidValueError),
        ("kl_estimator", "k4", InvalidValueError),
        ("max_grad_norm", 0.0, InvalidValueError),
    ],
)
def test_a_bad_field_is_refused_when_built_naming_it(field, value, error):
    with pytest.raises(error, match=f"`PolicyGradient.{field}`"):
        PolicyGradient(**{field: value})
    with pytest.raises(error, match=f"`PolicyGradient.{field}`"):
        dataclasses.replace(PolicyGradient(), **{field: value})


def test_round_trip_replace_and_stored_as_checked():
    config = PolicyGradient(pad_id=2, micro_batch=4, reduction="sum", kl_coef=1, max_grad_norm=0.5)
    assert PolicyGradient.from_dict(json.loads(json.dumps(config.to_dict()))) == config
    assert isinstance(config.kl_coef, float)  # 1 is stored as 1.0
    assert dataclasses.replace(config, kl_estimator="k1").kl_estimator == "k1"
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.kl_coef = 0.0  # type: ignore[misc]


def test_the_signature_has_at_most_twelve_parameters():
    assert len(inspect.signature(policy_gradient_step_).parameters) <= 12


def test_the_050_keywords_warn_and_take_the_same_step_bit_for_bit():
    model, _ = tiny_chat_model()
    pop = Population(model.double(), 3, 2, TARGETS, seed=1, init_scale=0.5)
    opt = torch.optim.AdamW(pop.adapter_parameters(), lr=1e-2)
    lr = LRMultipliers(3, values=[1.0, 0.5, 2.0])
    twin = copy.deepcopy((pop, opt, lr))
    rows = ([[3, 4], [5, 6, 7], [5], [9, 9]], [[8, 9], [10], [11, 12], [13]], [0, 1, 2, 0], [1.0, -0.5, 0.3, 0.8])
    options = dict(micro_batch=3, reduction="sequence_mean", kl_coef=0.2, kl_estimator="k2", max_grad_norm=0.1)
    new = policy_gradient_step_(pop, opt, *rows, PolicyGradient(**options), lr_multipliers=lr)
    with pytest.warns(DeprecationWarning, match=r"config=PolicyGradient\(micro_batch=..."):
        old = policy_gradient_step_(twin[0], twin[1], *rows, lr_multipliers=twin[2], **options)
    assert all(torch.equal(a, b) for a, b in zip(pop.adapter_parameters(), twin[0].adapter_parameters()))
    assert new.loss == old.loss and torch.equal(new.grad_norms, old.grad_norms) and torch.equal(new.kl, old.kl)
    # keywords over a config: applied over it, the rest of the config kept
    with pytest.warns(DeprecationWarning):
        policy_gradient_step_(pop, opt, *rows, PolicyGradient(reduction="sum"), micro_batch=1)
    with pytest.raises(InvalidTypeError, match="'kl_coeff'.*'kl_coef'"):
        policy_gradient_step_(pop, opt, *rows, kl_coeff=0.1)
    with pytest.raises(InvalidTypeError, match="must be a PolicyGradient"):
        policy_gradient_step_(pop, opt, *rows, {"kl_coef": 0.1})
