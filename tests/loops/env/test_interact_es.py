"""EggrollES against environments: individuals play episodes as a Population's do.

Same seed -> bitwise the same parameters; an individual's fitness equals a
hand-rolled rollout of its materialised parameters with the same seeds; the
env steps counted equal the steps the envs took; evolve_with_env(...,
algorithm='es') runs end to end and returns a validated centre.
"""

from __future__ import annotations

import copy
import re

import gymnasium as gym
import numpy as np
import pytest
import torch
from torch import nn

from populora import EggrollES, evolve_with_env, interact_with_env
from populora.envs.schedule import VALIDATION_STREAM, stream_seeds, training_seeds
from populora.errors import InvalidTypeError, InvalidValueError, TargetNotFoundError
from populora.interact import ES, Budget, EnvOptions, Episodes, Validation
from populora.loops.env.es_env import es_fitnesses, make_es

POP, HORIZON = 8, 40


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 2))


class _Counting(gym.Wrapper):
    """Counts the steps the env really took (in ``log``)."""

    def __init__(self, env, log):
        super().__init__(env)
        self.log = log

    def step(self, action):
        self.log.append(1)
        return self.env.step(action)


def _params(model: nn.Module) -> dict:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _es_run(seed: int) -> tuple[dict, list]:
    policy, history = evolve_with_env(
        [gym.make("CartPole-v1") for _ in range(3)],
        _model(),
        POP,
        2,
        algorithm="es",
        num_generations=3,
        horizon=HORIZON,
        seed=seed,
        episodes=Episodes(num_episodes=2),
        validation=Validation(episodes=2),
    )
    return _params(policy), history


def _es_loop(seed: int) -> dict:
    """Three generations of es_fitnesses + tell; the ES's parameters."""
    es = make_es(_model(), POP, 2, seed, None, None, {"sigma": 0.5})
    with interact_with_env([gym.make("CartPole-v1") for _ in range(3)], normalize_obs=True) as interactor:
        for _ in range(3):
            es.tell(es_fitnesses(interactor, es, seed=seed, horizon=200, num_episodes=2))
    es.close()
    return _params(es.model)


def test_same_seed_gives_bitwise_the_same_parameters():
    a, b, c = _es_loop(5), _es_loop(5), _es_loop(6)
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert any(not torch.equal(a[k], c[k]) for k in a)  # the seed matters
    start = _params(_model())
    assert any(not torch.equal(a[k], start[k]) for k in a)  # and the ES moved


def test_evolve_with_env_es_is_reproducible():
    a, history_a = _es_run(5)
    b, history_b = _es_run(5)
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert [tuple(h) for h in history_a] == [tuple(h) for h in history_b]
    assert all(h.validated is not None and h.env_steps > 0 for h in history_a)


def _hand_rolled(model: nn.Module, seeds: list[int]) -> float:
    env = gym.make("CartPole-v1")
    total = 0.0
    for s in seeds:
        obs, _ = env.reset(seed=int(s))
        for _ in range(HORIZON):
            with torch.no_grad():
                act = int(model(torch.as_tensor(obs, dtype=torch.float32)).argmax(-1))
            obs, reward, term, trunc, _ = env.step(act)
            total += reward
            if term or trunc:
                break
    return total / len(seeds)


@pytest.mark.parametrize("seeding", ["independent", "common"])
def test_fitness_equals_a_hand_rolled_rollout_of_the_perturbed_individual(seeding):
    model = _model()
    es = EggrollES(model, POP, 0.5, 0.1, 2, seed=1)
    interactor = interact_with_env([gym.make("CartPole-v1") for _ in range(3)])
    es.tell(torch.arange(POP, dtype=torch.float32))  # generation 1: the parameters moved once
    fitness = es_fitnesses(interactor, es, seed=11, horizon=HORIZON, num_episodes=2, episode_seeding=seeding)
    assert fitness.shape == (POP,)
    assert len(set(fitness.tolist())) > 1  # the individuals act differently
    for i in range(POP):
        member = copy.deepcopy(model)
        es.close()  # the plain forward of the materialised parameters
        member.load_state_dict({**model.state_dict(), **es.individual_params(i)})
        seeds = training_seeds(11 + es.generation, [i % (POP // 2)], 2, seeding)
        seeds = list(np.asarray(seeds).reshape(-1)) if seeding == "independent" else seeds
        assert float(fitness[i]) == _hand_rolled(member, seeds), i
    interactor.close()


def test_env_steps_counted_equal_the_steps_taken():
    log: list = []
    envs = [_Counting(gym.make("CartPole-v1"), log) for _ in range(3)]
    _, history = evolve_with_env(
        envs,
        _model(),
        POP,
        2,
        algorithm="es",
        num_generations=3,
        horizon=HORIZON,
        seed=0,
        validation=Validation(episodes=2),
    )
    assert history[-1].env_steps == len(log) - _last_validation_steps(history, log)
    steps = [h.env_steps for h in history]
    assert steps == sorted(steps) and steps[0] > 0


def _last_validation_steps(history, log) -> int:
    """The ES validates its centre once more after the last update: those steps come after the last record."""
    return len(log) - history[-1].env_steps


def test_ga_env_steps_counted_equal_the_steps_taken():
    log: list = []
    envs = [_Counting(gym.make("CartPole-v1"), log) for _ in range(3)]
    counts = []
    _, history = evolve_with_env(
        envs,
        _model(),
        6,
        2,
        num_generations=3,
        horizon=HORIZON,
        seed=0,
        callback=lambda info: counts.append(len(log) - info.interactor.counters["check_steps"]),
    )
    assert [h.env_steps for h in history] == counts  # validation steps included, generation by generation
    assert 0 < len(log) - history[-1].env_steps <= 24  # the replay check's steps, outside any episode


def test_es_steps_per_generation_match_the_envs():
    log: list = []
    envs = [_Counting(gym.make("CartPole-v1"), log) for _ in range(3)]
    counts = []
    _, history = evolve_with_env(
        envs,
        _model(),
        POP,
        2,
        algorithm="es",
        num_generations=3,
        horizon=HORIZON,
        seed=0,
        callback=lambda info: counts.append(len(log) - info.interactor.counters["check_steps"]),
    )
    assert [h.env_steps for h in history] == counts


def test_callback_can_stop_the_run_and_sees_the_generation():
    seen = []

    def callback(info):
        seen.append((info.stats.generation, info.fitnesses.shape, type(info.optimizer).__name__))
        return info.stats.generation == 1

    _, history = evolve_with_env(
        "CartPole-v1",
        _model(),
        POP,
        2,
        num_generations=10,
        horizon=HORIZON,
        env_options=EnvOptions(num_envs=2),
        callback=callback,
    )
    assert len(history) == 2 and seen == [(0, (POP,), "Population"), (1, (POP,), "Population")]
    _, history = evolve_with_env(
        "CartPole-v1",
        _model(),
        POP,
        2,
        algorithm="es",
        num_generations=10,
        horizon=HORIZON,
        env_options=EnvOptions(num_envs=2),
        callback=callback,
    )
    assert len(history) == 2 and seen[-1] == (1, (POP,), "EggrollES")


def test_max_env_steps_stops_the_run():
    _, history = evolve_with_env(
        "CartPole-v1",
        _model(),
        POP,
        2,
        num_generations=50,
        horizon=HORIZON,
        env_options=EnvOptions(num_envs=2),
        budget=Budget(max_env_steps=500),
    )
    assert history[-1].env_steps >= 500 and (len(history) == 1 or history[-2].env_steps < 500)


def test_es_improves_a_short_cartpole_and_returns_the_best_validated_centre():
    policy, history = evolve_with_env(
        "CartPole-v1",
        _model(),
        16,
        2,
        algorithm="es",
        num_generations=12,
        horizon=100,
        seed=0,
        env_options=EnvOptions(num_envs=4),
        validation=Validation(episodes=4),
    )
    validated = [h.validated for h in history if h.validated is not None]
    assert max(validated) >= 3 * validated[0]  # the centre learns (an untrained one falls within ~10 steps)
    with interact_with_env("CartPole-v1", num_envs=4) as interactor:
        replay = interactor.play(policy, horizon=100, seeds=stream_seeds(0, VALIDATION_STREAM, 4))
    assert float(replay.mean()) == max(validated)  # the policy returned is the best validated centre
    assert isinstance(policy, nn.Sequential)


def test_es_refuses_ga_options():
    """A custom fitness is the GA's; a GA option put in ``ES(extra=...)`` is refused naming it."""
    with pytest.raises(InvalidValueError, match=r"does not take `Episodes\(fitness=\.\.\.\)`"):
        evolve_with_env("CartPole-v1", _model(), POP, 2, algorithm="es", episodes=Episodes(fitness=lambda pop: 0.0))
    with pytest.raises(InvalidTypeError, match="unexpected keyword argument 'elite_frac'"):
        evolve_with_env("CartPole-v1", _model(), POP, 2, algorithm=ES(extra={"elite_frac": 0.2}))
    with pytest.raises(TargetNotFoundError, match="lora target name 'nope' matches no module"):
        make_es(_model(), POP, 2, 0, ["nope"], None, None)


def test_make_es_defaults_adam_and_centred_ranks():
    es = make_es(_model(), POP, 2, 0, None, None, None)
    assert isinstance(es.optimizer, torch.optim.Adam) and es.fitness_shaping == "centered_rank"
    assert es.sigma == 0.3 and es.optimizer.param_groups[0]["lr"] == 0.05
    es.close()
    es = make_es(_model(), POP, 2, 0, ["0"], None, {"sigma": 0.2, "lr": 0.01})
    assert es.sigma == 0.2 and es.param_names == ["0.weight", "0.bias"]
    es.close()


def test_make_es_takes_a_populations_target_forms():
    """PEFT-style names, globs, compiled patterns, 'all-linear' and '!' exclusions select the evolved modules."""
    from collections import OrderedDict

    model = nn.Sequential(
        OrderedDict(body=nn.Sequential(OrderedDict(fc=nn.Linear(4, 8), norm=nn.LayerNorm(8))), fc=nn.Linear(8, 2))
    )
    cases = {
        "fc": ["body.fc.weight", "body.fc.bias", "fc.weight", "fc.bias"],  # a dot-free name is a path suffix
        re.compile("fc"): ["fc.weight", "fc.bias"],  # fullmatch
        "body": ["body.fc.weight", "body.fc.bias"],  # a container by its path (EggrollES leaves norm gains alone)
        ("all-linear", "!body"): ["fc.weight", "fc.bias"],
    }
    for targets, names in cases.items():
        es = make_es(model, POP, 2, 0, list(targets) if isinstance(targets, tuple) else targets, None, None)
        assert es.param_names == names, targets
        es.close()
    with pytest.raises(TargetNotFoundError, match=r"exclusion lora target name 'head' matches no module"):
        make_es(model, POP, 2, 0, ["fc", "!head"], None, None)


def _es_rank_run(num_envs: int) -> dict:
    policy, history = evolve_with_env(
        [gym.make("CartPole-v1") for _ in range(num_envs)],
        _model(),
        POP,
        2,
        algorithm=ES(sigma=0.5),
        num_generations=3,
        horizon=HORIZON,
        seed=3,
        episodes=Episodes(num_episodes=2),
        env_options=EnvOptions(normalize_obs=True),
        validation=Validation(episodes=2),
    )
    return {"policy": _params(policy), "history": [tuple(h) for h in history]}


def _es_worker(rank: int, world: int, store: str, out: str) -> None:
    import torch.distributed as dist
    from ranks import init_gloo, save

    init_gloo(rank, world, store)
    try:
        save(_es_rank_run(num_envs=2 + rank), out, rank)  # ranks hold different env counts
    finally:
        dist.destroy_process_group()


@pytest.mark.distributed
def test_es_on_two_ranks_stays_in_lockstep(tmp_path):
    from ranks import spawn

    ranks = spawn(_es_worker, tmp_path)
    alone = _es_rank_run(num_envs=3)
    a, b = ranks
    assert a["history"] == b["history"]  # the fitnesses are all-gathered: the same stats on every rank
    assert all(torch.equal(a["policy"][k], b["policy"][k]) for k in a["policy"])  # the same policy
    assert [h[0] for h in a["history"]] == [0, 1, 2]
    assert [h[5] for h in a["history"]] == [h[5] for h in alone["history"]]  # env steps summed over ranks
    for key, value in alone["policy"].items():  # one process plays the same episodes (other batch shapes)
        torch.testing.assert_close(a["policy"][key], value, rtol=1e-5, atol=1e-6, msg=key)
