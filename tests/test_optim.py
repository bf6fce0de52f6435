"""ClipUp (populora.optim): the update against hand-computed values, clipping, groups, errors, ES use."""

from __future__ import annotations

import math

import gymnasium as gym
import pytest
import torch
from torch import nn

from populora import EggrollES, evolve_with_env
from populora.errors import InvalidTypeError, InvalidValueError
from populora.interact import ES, Validation
from populora.loops.env.es_env import make_es
from populora.optim import ClipUp


def _params(*values: list[float]) -> list[nn.Parameter]:
    return [nn.Parameter(torch.tensor(v, dtype=torch.float64)) for v in values]


def test_first_step_is_a_normalised_step_of_length_lr():
    a, b = _params([0.0, 0.0], [1.0])
    opt = ClipUp([a, b], lr=0.3, momentum=0.9, max_speed=10.0)
    a.grad, b.grad = torch.tensor([1.0, 2.0], dtype=torch.float64), torch.tensor([2.0], dtype=torch.float64)
    opt.step()  # ||g|| = 3 over both parameters: v = 0.3 * g / 3 = 0.1 * g
    torch.testing.assert_close(a.detach(), torch.tensor([-0.1, -0.2], dtype=torch.float64))
    torch.testing.assert_close(b.detach(), torch.tensor([0.8], dtype=torch.float64))


def test_velocity_accumulates_with_momentum_then_is_clipped_to_max_speed():
    (p,) = _params([0.0, 0.0])
    opt = ClipUp([p], lr=1.0, momentum=0.5, max_speed=1.2)
    p.grad = torch.tensor([3.0, 4.0], dtype=torch.float64)  # unit direction (0.6, 0.8)
    opt.step()  # v1 = (0.6, 0.8), speed 1 <= 1.2
    torch.testing.assert_close(p.detach(), torch.tensor([-0.6, -0.8], dtype=torch.float64))
    p.grad = torch.tensor([0.0, -10.0], dtype=torch.float64)  # unit direction (0, -1)
    opt.step()  # v2 = 0.5 * (0.6, 0.8) + (0, -1) = (0.3, -0.6), speed 0.671 <= 1.2
    torch.testing.assert_close(p.detach(), torch.tensor([-0.9, -0.2], dtype=torch.float64))
    p.grad = torch.tensor([0.0, -1.0], dtype=torch.float64)
    opt.step()  # v3 = (0.15, -0.3) + (0, -1) = (0.15, -1.3): speed 1.3086 > 1.2, scaled to 1.2
    v3 = torch.tensor([0.15, -1.3], dtype=torch.float64)
    v3 = v3 * (1.2 / math.hypot(0.15, 1.3))
    torch.testing.assert_close(p.detach(), torch.tensor([-0.9, -0.2], dtype=torch.float64) - v3)
    torch.testing.assert_close(opt.state[p]["velocity"].norm(), torch.tensor(1.2, dtype=torch.float64))


def test_step_length_does_not_depend_on_the_gradient_scale():
    moved = []
    for scale in (1e-6, 1.0, 1e6):
        (p,) = _params([1.0, -1.0, 0.5])
        opt = ClipUp([p], lr=0.05)
        p.grad = torch.tensor([1.0, -2.0, 3.0], dtype=torch.float64) * scale
        opt.step()
        moved.append(p.detach().clone())
    torch.testing.assert_close(moved[0], moved[1])
    torch.testing.assert_close(moved[2], moved[1])
    assert float((moved[1] - torch.tensor([1.0, -1.0, 0.5], dtype=torch.float64)).norm()) == pytest.approx(0.05)


def test_defaults_and_groups_have_their_own_norms():
    a, b = _params([0.0], [0.0])
    opt = ClipUp([{"params": [a]}, {"params": [b], "lr": 0.2}], lr=0.1)
    assert opt.param_groups[0]["max_speed"] == pytest.approx(0.2) and opt.param_groups[0]["momentum"] == 0.9
    a.grad, b.grad = torch.tensor([5.0], dtype=torch.float64), torch.tensor([-0.01], dtype=torch.float64)
    opt.step()
    torch.testing.assert_close(a.detach(), torch.tensor([-0.1], dtype=torch.float64))
    torch.testing.assert_close(b.detach(), torch.tensor([0.2], dtype=torch.float64))


def test_zero_gradient_keeps_coasting_and_missing_grads_are_skipped():
    a, b = _params([0.0], [7.0])
    opt = ClipUp([a, b], lr=0.1, momentum=0.5)
    a.grad = torch.tensor([1.0], dtype=torch.float64)
    opt.step()
    a.grad = torch.zeros(1, dtype=torch.float64)
    opt.step()  # v = 0.5 * 0.1
    torch.testing.assert_close(a.detach(), torch.tensor([-0.15], dtype=torch.float64))
    assert float(b.detach()) == 7.0 and b not in opt.state


def test_state_dict_round_trip_resumes_exactly():
    def run(split: bool) -> torch.Tensor:
        torch.manual_seed(0)
        p = nn.Parameter(torch.randn(5))
        opt = ClipUp([p], lr=0.1, momentum=0.8)
        grads = torch.randn(6, 5, generator=torch.Generator().manual_seed(1))
        for i, g in enumerate(grads):
            if split and i == 3:
                state = opt.state_dict()
                opt = ClipUp([p], lr=0.1, momentum=0.8)
                opt.load_state_dict(state)
            p.grad = g.clone()
            opt.step()
        return p.detach()

    assert torch.equal(run(False), run(True))


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(lr=0.0), r"`lr` must be a finite number > 0.0, got 0.0"),
        (dict(lr=0.1, momentum=1.0), r"`momentum` must be a finite number in \[0.0, 1.0\), got 1.0"),
        (dict(lr=0.1, max_speed=-1.0), r"`max_speed` must be a finite number > 0.0, got -1.0"),
        (dict(lr=float("nan")), r"`lr` must be a finite number > 0.0, got nan"),
    ],
)
def test_bad_options_are_named(kwargs, match):
    with pytest.raises(InvalidValueError, match=match):
        ClipUp([nn.Parameter(torch.zeros(1))], **kwargs)


def test_bad_types_and_non_finite_gradients_are_refused():
    with pytest.raises(InvalidTypeError, match=r"`lr` must be a real number, got str"):
        ClipUp([nn.Parameter(torch.zeros(1))], lr="0.1")
    p = nn.Parameter(torch.zeros(2))
    opt = ClipUp([p], lr=0.1)
    p.grad = torch.tensor([1.0, float("inf")])
    with pytest.raises(InvalidValueError, match="ClipUp got a gradient of norm inf"):
        opt.step()
    assert torch.equal(p.detach(), torch.zeros(2)) and not opt.state[p]


def test_eggroll_es_takes_clipup_and_moves_by_at_most_max_speed():
    torch.manual_seed(0)
    model = nn.Linear(4, 3)
    before = torch.cat([q.detach().flatten().clone() for q in model.parameters()])
    es = EggrollES(model, 8, 0.1, None, 2, seed=0, optimizer=lambda ps: ClipUp(ps, lr=0.05, max_speed=0.07))
    assert isinstance(es.optimizer, ClipUp)
    es.tell(torch.arange(8, dtype=torch.float32))
    after = torch.cat([q.detach().flatten() for q in model.parameters()])
    assert float((after - before).norm()) == pytest.approx(0.05, rel=1e-5)  # first step: lr, under max_speed
    es.close()


def test_evolve_with_env_names_clipup_in_es_options():
    es = make_es(nn.Linear(4, 2), 4, 1, 0, None, None, {"optimizer": "clipup", "lr": 0.02, "max_speed": 0.03})
    group = es.optimizer.param_groups[0]
    assert isinstance(es.optimizer, ClipUp) and (group["lr"], group["max_speed"], group["momentum"]) == (
        0.02,
        0.03,
        0.9,
    )
    es.close()
    es = make_es(nn.Linear(4, 2), 4, 1, 0, None, None, {"optimizer": "sgd", "lr": 0.02})
    assert type(es.optimizer) is torch.optim.SGD
    es.close()
    with pytest.raises(InvalidValueError, match=r"`ES\.optimizer`.*'rmsprop'"):
        make_es(nn.Linear(4, 2), 4, 1, 0, None, None, {"optimizer": "rmsprop"})
    with pytest.raises(InvalidValueError, match=r"\['max_speed'\] are ClipUp's, but `ES\.optimizer` is 'adam'"):
        make_es(nn.Linear(4, 2), 4, 1, 0, None, None, {"max_speed": 0.1})
    torch.manual_seed(0)
    policy, history = evolve_with_env(
        [gym.make("CartPole-v1") for _ in range(2)],
        nn.Linear(4, 2),
        4,
        1,
        algorithm=ES(optimizer="clipup", lr=0.05, sigma=0.1),
        num_generations=2,
        horizon=30,
        validation=Validation(episodes=1),
    )
    assert len(history) == 2 and history[-1].env_steps > 0
