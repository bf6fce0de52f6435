"""ClipUp all or nothing: every parameter group is checked (gradients and options) before any moves, and an
option out of range is refused wherever it enters (construction, add_param_group, an edited group at step,
load_state_dict)."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from populora.errors import InvalidTypeError, InvalidValueError
from populora.optim import ClipUp


def two_groups(**second) -> tuple[ClipUp, list[nn.Parameter]]:
    a, b, c = (nn.Parameter(torch.tensor(v, dtype=torch.float64)) for v in ([0.0, 1.0], [2.0], [3.0, 4.0]))
    opt = ClipUp([{"params": [a, b]}, {"params": [c], **second}], lr=0.1, momentum=0.9)
    return opt, [a, b, c]


def values(params: list[nn.Parameter]) -> list[torch.Tensor]:
    return [p.detach().clone() for p in params]


def assert_unmoved(opt: ClipUp, params: list[nn.Parameter], before: list[torch.Tensor]) -> None:
    assert all(torch.equal(p.detach(), v) for p, v in zip(params, before))
    assert not any(opt.state[p] for p in params)  # no velocity was created either


def set_grads(params: list[nn.Parameter], bad: float | None = None) -> None:
    for i, p in enumerate(params):
        p.grad = torch.full_like(p, 0.5 + i)
    if bad is not None:
        params[-1].grad[0] = bad


# ---------------------------------------------------------------------------------------------- gradients


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_a_non_finite_gradient_in_a_later_group_moves_no_group(bad):
    opt, params = two_groups()
    before = values(params)
    set_grads(params, bad)
    with pytest.raises(InvalidValueError, match=r"gradient of norm .* in parameter group 1"):
        opt.step()
    assert_unmoved(opt, params, before)
    set_grads(params)  # fixed: the step runs and moves both groups
    opt.step()
    assert all(not torch.equal(p.detach(), v) for p, v in zip(params, before))


def test_a_sparse_gradient_in_a_later_group_moves_no_group():
    opt, params = two_groups()
    before = values(params)
    set_grads(params)
    params[2].grad = params[2].grad.to_sparse()
    with pytest.raises(InvalidValueError, match=r"sparse gradients .*parameter group 1"):
        opt.step()
    assert_unmoved(opt, params, before)


def test_a_closure_whose_gradients_are_bad_in_a_later_group_moves_no_group():
    opt, params = two_groups()
    before = values(params)
    calls = []

    def closure():
        calls.append(1)
        set_grads(params, float("nan"))
        return 1.0

    with pytest.raises(InvalidValueError, match="parameter group 1"):
        opt.step(closure)
    assert calls == [1]
    assert_unmoved(opt, params, before)


# ---------------------------------------------------------------------------------------------- options

BAD_OPTIONS = [
    ("eps", -1.0, InvalidValueError, r">= 0.0, got -1.0"),  # the example: it ascends
    ("eps", float("nan"), InvalidValueError, "got nan"),
    ("eps", "1e-8", InvalidTypeError, "real number"),
    ("lr", -0.1, InvalidValueError, r"> 0.0, got -0.1"),
    ("lr", 0.0, InvalidValueError, r"> 0.0, got 0.0"),
    ("momentum", 1.5, InvalidValueError, r"in \[0.0, 1.0\), got 1.5"),
    ("momentum", -0.1, InvalidValueError, r"in \[0.0, 1.0\), got -0.1"),
    ("max_speed", 0.0, InvalidValueError, r"> 0.0, got 0.0"),
    ("max_speed", float("inf"), InvalidValueError, "got inf"),
    ("lr", True, InvalidTypeError, "real number"),
]
IDS = [f"{key}={value!r}" for key, value, _, _ in BAD_OPTIONS]


@pytest.mark.parametrize("key, value, error, match", BAD_OPTIONS, ids=IDS)
def test_a_group_option_out_of_range_is_refused_at_construction(key, value, error, match):
    with pytest.raises(error, match=rf"`param_groups\[1\]\['{key}'\]` must be .*{match}"):
        two_groups(**{key: value})


@pytest.mark.parametrize("key, value, error, match", BAD_OPTIONS, ids=IDS)
def test_add_param_group_refuses_an_option_out_of_range_and_adds_nothing(key, value, error, match):
    opt, params = two_groups()
    extra = nn.Parameter(torch.zeros(2, dtype=torch.float64))
    with pytest.raises(error, match=rf"`param_groups\[2\]\['{key}'\]` must be .*{match}"):
        opt.add_param_group({"params": [extra], key: value})
    assert len(opt.param_groups) == 2
    opt.add_param_group({"params": [extra], "eps": 0.0})  # a valid group is still added (eps 0 is allowed)
    assert len(opt.param_groups) == 3


@pytest.mark.parametrize("key, value, error, match", BAD_OPTIONS, ids=IDS)
def test_step_refuses_a_group_option_edited_out_of_range_and_moves_nothing(key, value, error, match):
    opt, params = two_groups()
    before = values(params)
    opt.param_groups[1][key] = value  # torch's optimizers let users edit their groups (LR schedules do)
    set_grads(params)
    with pytest.raises(error, match=rf"`param_groups\[1\]\['{key}'\]` must be .*{match}"):
        opt.step()
    assert_unmoved(opt, params, before)


@pytest.mark.parametrize("key, value, error, match", BAD_OPTIONS, ids=IDS)
def test_load_state_dict_refuses_a_group_option_out_of_range_and_changes_nothing(key, value, error, match):
    source, params = two_groups()
    set_grads(params)
    source.step()
    state = source.state_dict()
    state["param_groups"][1][key] = value
    opt, _ = two_groups(lr=0.2)
    before = copy.deepcopy(opt.state_dict())
    with pytest.raises(error, match=rf"`param_groups\[1\]\['{key}'\]` must be .*{match}"):
        opt.load_state_dict(state)
    after = opt.state_dict()
    assert after["param_groups"] == before["param_groups"] and not after["state"]


def test_a_group_without_an_option_is_refused_at_step():
    opt, params = two_groups()
    del opt.param_groups[1]["max_speed"]
    set_grads(params)
    before = values(params)
    with pytest.raises(InvalidValueError, match=r"parameter group 1 lacks the option\(s\) \['max_speed'\]"):
        opt.step()
    assert_unmoved(opt, params, before)


@pytest.mark.parametrize("velocity", [torch.full((2,), float("nan")), torch.zeros(3), [0.0, 0.0]])
def test_load_state_dict_refuses_a_velocity_that_is_not_a_finite_tensor_of_its_parameter(velocity):
    source, params = two_groups()
    set_grads(params)
    source.step()
    state = source.state_dict()
    state["state"][2]["velocity"] = velocity  # the first parameter of group 1: shape (2,)
    opt, _ = two_groups()
    with pytest.raises(InvalidValueError, match=r"velocity of parameter 2 \(group 1\)"):
        opt.load_state_dict(state)
    assert not opt.state_dict()["state"]
