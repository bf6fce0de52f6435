"""evolve_with_env's option objects (populora.loops.env.options): defaults, checks, frozen, by-name algorithms.

The seed README's twelve parameters stay flat; everything else comes in a
frozen option object (``Episodes``, ``Validation``, ``EnvOptions``,
``Checkpointing``, ``Budget``, ``GA`` / ``ES``). A bad value raises naming the
option's field, and a wrong object naming the parameter, before any episode
runs (the envs here count their steps) and with the model given back
unwrapped. Every run here is a few generations of 6-step episodes.
"""

from __future__ import annotations

import dataclasses
import warnings

import gymnasium as gym
import numpy as np
import pytest
import torch
from torch import nn

from populora import EvolveResult, evolve_with_env
from populora.envs.schedule import EPISODE_SEEDINGS
from populora.errors import InvalidTypeError, InvalidValueError, PopuloraError
from populora.interact import ES, GA, Budget, Checkpointing, EnvOptions, Episodes, Validation
from populora.loops.env import options as options_module
from populora.loops.env.es_env import ES_DEFAULTS
from populora.loops.env.evolve import ENV_EVOLVE_DEFAULTS


class StepEnv(gym.Env):
    """Observation ``[t, 1]``, 6 steps; reward: the action (Discrete(2)) or its first entry (Box(-1, 1, (1,))).

    ``StepEnv.steps`` counts every step of every instance, so a check can tell whether any episode ran.
    """

    observation_space = gym.spaces.Box(-np.inf, np.inf, (2,), np.float32)
    steps = 0

    def __init__(self, continuous: bool = False):
        self.continuous = continuous
        self.action_space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32) if continuous else gym.spaces.Discrete(2)
        self.t = 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return np.array([0.0, 1.0], dtype=np.float32), {}

    def step(self, action):
        self.t += 1
        StepEnv.steps += 1
        reward = float(np.asarray(action).reshape(-1)[0])
        return np.array([self.t, 1.0], dtype=np.float32), reward, self.t >= 6, False, {}


def net(out: int = 2) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(2, 8), nn.Tanh(), nn.Linear(8, out))


def run(model=None, continuous: bool = False, **kwargs):
    """A tiny evolve_with_env: 4 individuals, rank 1, 2 generations, on 2 envs."""
    envs = [StepEnv(continuous) for _ in range(2)]
    options = dict(num_generations=2, horizon=6, seed=1, **kwargs)
    if continuous:
        options.setdefault("action", torch.tanh)
    return evolve_with_env(envs, model if model is not None else net(1 if continuous else 2), 4, 1, **options)


def same_run(a: EvolveResult, b: EvolveResult) -> bool:
    params_a, params_b = a.policy.state_dict(), b.policy.state_dict()
    return (
        [tuple(h) for h in a.history] == [tuple(h) for h in b.history]
        and params_a.keys() == params_b.keys()
        and all(torch.equal(params_a[k], params_b[k]) for k in params_a)
    )


# ----------------------------------------------------------------------------- defaults and frozen objects


def test_option_defaults_are_the_flat_keywords_old_defaults():
    assert Episodes() == Episodes(num_episodes=1, seeding="independent", fitness=None)
    assert Episodes().seeding == EPISODE_SEEDINGS[0] == "independent"
    assert Validation() == Validation(episodes=None, top=None)  # None: sized by the run (validation_defaults)
    assert EnvOptions() == EnvOptions(num_envs=None, device=None, flatten_obs=True, normalize_obs=False, to_range=None)
    assert Checkpointing() == Checkpointing(dir=None, resume=False)
    assert Budget() == Budget(max_env_steps=None)
    assert GA().evolve_kwargs == {} and GA().population_kwargs == {}
    es = ES()
    assert (es.sigma, es.lr, es.optimizer, es.max_speed, es.momentum, es.fitness_shaping, dict(es.extra)) == (
        0.3,
        0.05,
        "adam",
        None,
        None,
        "centered_rank",
        {},
    )
    assert es.es_kwargs() == {**ES_DEFAULTS, "optimizer": "adam"}  # the old es_kwargs defaults
    assert ENV_EVOLVE_DEFAULTS == {"epsilon": 0.3}  # what GA() evolves with unless evolve_kwargs says otherwise
    assert sorted(options_module.__all__) == sorted(
        ["ES", "GA", "Budget", "Checkpointing", "EnvOptions", "Episodes", "Validation"]
    )


def test_es_kwargs_carry_clipup_options_only_when_set_and_extra_last():
    assert "max_speed" not in ES().es_kwargs() and "momentum" not in ES().es_kwargs()
    clipup = ES(sigma=0.1, lr=0.03, optimizer="clipup", max_speed=0.06, momentum=0.8, antithetic=False)
    assert clipup.es_kwargs() == {
        "sigma": 0.1,
        "lr": 0.03,
        "optimizer": "clipup",
        "max_speed": 0.06,
        "momentum": 0.8,
        "fitness_shaping": "centered_rank",
        "antithetic": False,  # EggrollConfig's fields where they differ from its defaults (0.6.0: ES fields)
    }


@pytest.mark.parametrize(
    "obj, name, other",
    [
        (Episodes(), "num_episodes", 2),
        (Episodes(), "seeding", "common"),
        (Validation(), "episodes", 3),
        (EnvOptions(), "normalize_obs", True),
        (Checkpointing(), "dir", "runs"),
        (Budget(), "max_env_steps", 7),
        (GA(), "evolve_kwargs", {"epsilon": 0.1}),
        (ES(), "sigma", 0.5),
    ],
    ids=lambda v: type(v).__name__ if dataclasses.is_dataclass(v) else str(v),
)
def test_option_objects_are_frozen(obj, name, other):
    before = getattr(obj, name)
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(obj, name, 7)
    assert getattr(obj, name) == before
    assert dataclasses.replace(obj, **{name: other}) != obj  # a changed copy is the way to vary one


def test_explicit_default_objects_run_exactly_as_the_defaults():
    plain = run()
    explicit = run(
        algorithm=GA(),
        episodes=Episodes(),
        validation=Validation(),
        env_options=EnvOptions(),
        checkpointing=Checkpointing(),
        budget=Budget(),
    )
    nones = run(episodes=None, validation=None, env_options=None, checkpointing=None, budget=None)
    assert same_run(plain, explicit) and same_run(plain, nones)
    assert len(plain.history) == 2 and all(h.validated is not None for h in plain.history)  # validated by default


# ----------------------------------------------------------------------------- algorithm by name


def test_ga_and_es_by_name_run_their_defaults():
    assert same_run(run(algorithm="ga"), run(algorithm=GA()))
    assert same_run(run(algorithm="ga"), run())  # the GA is the default
    by_name, by_object = run(algorithm="es"), run(algorithm=ES())
    assert same_run(by_name, by_object)
    assert not same_run(by_name, run(algorithm=ES(sigma=0.1)))  # the options reach the ES
    assert len(by_name.history) == 2 and by_name.history[-1].env_steps > 0


def test_an_unknown_algorithm_name_or_type_is_refused():
    StepEnv.steps = 0
    with pytest.raises(InvalidValueError, match=r"`algorithm` must be one of \['ga', 'es'\], got 'cma'"):
        run(algorithm="cma")
    with pytest.raises(InvalidTypeError, match=r"`algorithm` must be populora\.loops\.env\.GA\(\.\.\.\) or ES"):
        run(algorithm={"sigma": 0.1})
    assert StepEnv.steps == 0


# ----------------------------------------------------------------------------- return_history


def test_return_history_false_returns_the_policy_alone_without_a_warning():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        alone = run(return_history=False)
    assert isinstance(alone, nn.Module) and not isinstance(alone, tuple)
    full = run(return_history=True)
    assert isinstance(full, EvolveResult)
    for (name, a), (_, b) in zip(alone.state_dict().items(), full.policy.state_dict().items()):
        assert torch.equal(a, b), name


def test_options_are_keyword_only_past_the_twelve_seed_parameters(tmp_path):
    """``checkpoint_dir`` used to be the 13th positional parameter: a 13th positional is now refused."""
    StepEnv.steps = 0
    with pytest.raises(TypeError, match="positional"):
        evolve_with_env([StepEnv()], net(), 4, 1, None, 2, 6, 0, False, None, True, None, str(tmp_path))
    assert StepEnv.steps == 0 and not any(tmp_path.iterdir())


# ----------------------------------------------------------------------------- bad values and bad objects


BAD_VALUES = {
    "Episodes.num_episodes=0": (
        lambda: dict(episodes=Episodes(num_episodes=0)),
        InvalidValueError,
        r"`Episodes\.num_episodes` must be an int >= 1, got 0",
    ),
    "Episodes.num_episodes=1.5": (
        lambda: dict(episodes=Episodes(num_episodes=1.5)),
        InvalidTypeError,
        r"`Episodes\.num_episodes` must be an int",
    ),
    "Episodes.seeding": (
        lambda: dict(episodes=Episodes(seeding="shared")),
        InvalidValueError,
        r"`Episodes\.seeding`.*'shared'",
    ),
    "Episodes.fitness": (
        lambda: dict(episodes=Episodes(fitness=3)),
        InvalidTypeError,
        r"`Episodes\.fitness` must be callable",
    ),
    "Validation.episodes": (
        lambda: dict(validation=Validation(episodes=-1)),
        InvalidValueError,
        r"`Validation\.episodes`",
    ),
    "Validation.top": (lambda: dict(validation=Validation(top=0)), InvalidValueError, r"`Validation\.top`"),
    "Checkpointing.resume": (
        lambda: dict(checkpointing=Checkpointing(resume=True)),
        InvalidValueError,
        r"`Checkpointing\(resume=True\)` needs `dir`",
    ),
    "Budget.max_env_steps=0": (
        lambda: dict(budget=Budget(max_env_steps=0)),
        InvalidValueError,
        r"`Budget\.max_env_steps` must be an int >= 1, got 0",
    ),
    "Budget.max_seconds=0": (
        lambda: dict(budget=Budget(max_seconds=0)),
        InvalidValueError,
        r"`Budget\.max_seconds` must be a finite number > 0\.0, got 0",
    ),
    "Budget.max_env_steps str": (
        lambda: dict(budget=Budget(max_env_steps="x")),
        InvalidTypeError,
        r"`Budget\.max_env_steps` must be an int",
    ),
    "GA.evolve_kwargs": (
        lambda: dict(algorithm=GA(evolve_kwargs=[1])),
        InvalidTypeError,
        r"`GA\.evolve_kwargs` must be a dict",
    ),
    "GA.population_kwargs": (
        lambda: dict(algorithm=GA(population_kwargs=3)),
        InvalidTypeError,
        r"`GA\.population_kwargs` must be a dict",
    ),
    "GA.evolve_kwargs key": (  # the old message: the misspelt key and its likely meaning
        lambda: dict(algorithm=GA(evolve_kwargs={"epsilonn": 0.1})),
        InvalidTypeError,
        r"`evolve_kwargs` has the key 'epsilonn' \(did you mean 'epsilon'\?\)",
    ),
    "GA.evolve_kwargs value": (lambda: dict(algorithm=GA(evolve_kwargs={"epsilon": -1})), InvalidValueError, "epsilon"),
    "ES.extra": (lambda: dict(algorithm=ES(extra=[1])), InvalidTypeError, r"`ES\.extra` must be a dict"),
    "ES.extra key": (lambda: dict(algorithm=ES(extra={"elite_frac": 0.2})), InvalidTypeError, "'elite_frac'"),
    "ES.sigma": (lambda: dict(algorithm=ES(sigma=-1.0)), InvalidValueError, r"`ES\.sigma` must be a finite number > 0"),
    "ES.lr": (lambda: dict(algorithm=ES(lr=0.0)), InvalidValueError, r"`ES\.lr` must be a finite number > 0"),
    "ES.optimizer": (lambda: dict(algorithm=ES(optimizer="rmsprop")), InvalidValueError, r"`ES\.optimizer`.*'rmsprop'"),
    "ES.momentum": (lambda: dict(algorithm=ES(momentum=0.5)), InvalidValueError, r"\['momentum'\] are ClipUp's"),
    "ES.extra own field": (lambda: dict(algorithm=ES(extra={"sigma": 0.1})), InvalidValueError, r"ES's own fields"),
    "EnvOptions.device": (
        lambda: dict(env_options=EnvOptions(device="nope")),
        InvalidValueError,
        r"`EnvOptions\.device`",
    ),
    "EnvOptions.flatten_obs": (
        lambda: dict(env_options=EnvOptions(flatten_obs="yes")),
        InvalidTypeError,
        r"`EnvOptions\.flatten_obs`",
    ),
    "Checkpointing.dir": (lambda: dict(checkpointing=Checkpointing(dir=3)), InvalidTypeError, r"`Checkpointing\.dir`"),
    "ES.fitness_shaping": (
        lambda: dict(algorithm=ES(fitness_shaping="nope")),
        InvalidValueError,
        r"`ES\.fitness_shaping`.*'nope'",
    ),
    "ES with Episodes.fitness": (
        lambda: dict(algorithm="es", episodes=Episodes(fitness=lambda population: 0.0)),
        InvalidValueError,
        r"does not take `Episodes\(fitness=\.\.\.\)`",
    ),
    "EnvOptions.normalize_obs": (
        lambda: dict(env_options=EnvOptions(normalize_obs=True, flatten_obs=False)),
        InvalidValueError,
        r"`normalize_obs=True` needs `flatten_obs=True`",
    ),
    "EnvOptions.num_envs": (
        lambda: dict(env_options=EnvOptions(num_envs=2)),
        InvalidValueError,
        r"`num_envs=2` only applies to a factory",
    ),
    "EnvOptions.to_range": (
        lambda: dict(env_options=EnvOptions(to_range=(1.0, -1.0)), continuous=True),
        InvalidValueError,
        r"`to_range=\(lo, hi\)` needs lo < hi",
    ),
    "EnvOptions.to_range on Discrete": (
        lambda: dict(env_options=EnvOptions(to_range=(-1.0, 1.0))),
        InvalidValueError,
        r"`to_range` rescales continuous",
    ),
}


@pytest.mark.parametrize("case", sorted(BAD_VALUES))
def test_a_bad_option_value_raises_naming_the_field_before_any_episode(case):
    make, error, message = BAD_VALUES[case]
    continuous = case == "EnvOptions.to_range"
    model = net(1 if continuous else 2)
    StepEnv.steps = 0
    with pytest.raises(error, match=message) as caught:
        kwargs = make()  # an option object checks its own fields when built
        kwargs.pop("continuous", None)
        run(model, continuous, **kwargs)
    assert isinstance(caught.value, PopuloraError)
    assert StepEnv.steps == 0  # raised before the first episode
    assert all(p.requires_grad for p in model.parameters())  # the model comes back unwrapped
    assert all("forward" not in vars(m) for m in model.modules())


@pytest.mark.parametrize(
    "name, value, kind",
    [
        ("episodes", {"num_episodes": 2}, "Episodes"),
        ("episodes", Validation(), "Episodes"),  # another option object in the wrong place
        ("validation", 3, "Validation"),
        ("env_options", Budget(), "EnvOptions"),
        ("checkpointing", "runs/ckpt", "Checkpointing"),
        ("budget", 1000, "Budget"),
    ],
)
def test_an_option_object_of_the_wrong_type_raises_naming_the_parameter(name, value, kind):
    StepEnv.steps = 0
    expected = rf"`{name}` must be a populora\.loops\.env\.{kind} \(or None for its defaults\)"
    with pytest.raises(InvalidTypeError, match=expected):
        run(**{name: value})
    assert StepEnv.steps == 0


# ----------------------------------------------------------------------------- wall-clock budget and progress


class FakeClock:
    """``time.monotonic`` of populora.loops.env.generations, moved on by the test (never the real clock)."""

    def __init__(self):
        self.now = 1000.0

    def monotonic(self):
        return self.now


@pytest.fixture
def clock(monkeypatch):
    from populora.interact import generations

    fake = FakeClock()
    monkeypatch.setattr(generations, "time", fake)
    return fake


def clocked_run(clock, algorithm="ga", seconds_per_generation=100.0, callback=None, **kwargs):
    """4 individuals, one 6-step episode each, no validation; each generation's callback moves the clock on."""

    def tick(info):
        clock.now += seconds_per_generation
        return callback(info) if callback is not None else None

    options = dict(num_generations=10, horizon=6, seed=1, validation=Validation(episodes=0), algorithm=algorithm)
    return evolve_with_env([StepEnv() for _ in range(2)], net(), 4, 1, callback=tick, **{**options, **kwargs})


@pytest.mark.parametrize("algorithm", ["ga", "es"])
def test_max_seconds_stops_after_the_first_generation_past_it(clock, algorithm):
    infos = []
    result = clocked_run(clock, algorithm, budget=Budget(max_seconds=250.0), callback=infos.append)
    # generations are judged 0, 100, 200, 300 fake seconds after the call: the fourth is the first at or past 250
    assert len(result.history) == 4 and [i.stats.generation for i in infos] == [0, 1, 2, 3]
    assert len(clocked_run(clock, algorithm, budget=Budget(max_seconds=200.0)).history) == 3  # 200 >= 200


def test_the_clock_counts_from_the_call_and_env_steps_still_bind(clock):
    clock.now = 5_000.0  # whatever the clock read before the call
    assert len(clocked_run(clock, budget=Budget(max_seconds=1e6, max_env_steps=30)).history) == 2  # 24, 48 steps
    # the first generation is judged 0 fake seconds after the call: a budget of 1e-9 s still plays it and the next
    assert len(clocked_run(clock, budget=Budget(max_seconds=1e-9)).history) == 2


def test_the_progress_bar_follows_the_binding_budget(clock, capsys, monkeypatch):
    from populora import stats

    monkeypatch.setattr(stats, "bars_shown", lambda: True)  # pytest's stderr is no terminal: drawn all the same

    def last_bar():
        return capsys.readouterr().err.replace("\r", "\n").strip().splitlines()[-1]

    clocked_run(clock, budget=Budget(max_seconds=250.0), progress=True)
    bar = last_bar()
    assert bar.startswith("seconds:") and "250/250 [" in bar and "gen=4" in bar, bar
    clocked_run(clock, budget=Budget(max_env_steps=30, max_seconds=1e6), progress=True)
    bar = last_bar()
    assert bar.startswith("env steps:") and "30/30 [" in bar and "gen=2" in bar, bar
    clocked_run(clock, num_generations=2, progress=True)  # no Budget: the bar counts generations, as before
    bar = last_bar()
    assert bar.startswith("generations:") and "2/2 [" in bar and "gen=" not in bar, bar
    # seconds bind first, then the generations overtake them: the bar switches to generations
    clocked_run(clock, num_generations=3, seconds_per_generation=10.0, budget=Budget(max_seconds=100.0), progress=True)
    bar = last_bar()
    assert bar.startswith("generations:") and "3/3 [" in bar, bar


def test_generation_info_as_dict_is_numbers_only(clock):
    infos = []
    clocked_run(clock, num_generations=2, validation=Validation(episodes=2, top=1), callback=infos.append)
    rows = [info.as_dict() for info in infos]
    assert set(rows[0]) == {"generation", "best", "mean", "std", "validated", "env_steps", "champion_score"}
    assert all(isinstance(v, (int, float)) and not isinstance(v, bool) for row in rows for v in row.values())
    assert rows[1]["generation"] == 1 and rows[1]["champion_score"] == infos[1].champion_score
    no_validation = []
    clocked_run(clock, num_generations=1, callback=no_validation.append)
    assert set(no_validation[0].as_dict()) == {"generation", "best", "mean", "std", "env_steps"}


BUILT_BAD = [
    (lambda: Episodes(num_episodes="2"), InvalidTypeError, r"`Episodes\.num_episodes` must be an int, got str '2'"),
    (lambda: Episodes(seeding="shared"), InvalidValueError, r"`Episodes\.seeding`.*'shared'"),
    (lambda: Validation(top=0), InvalidValueError, r"`Validation\.top` must be an int >= 1, got 0"),
    (lambda: Checkpointing("runs", resume="no"), InvalidTypeError, r"`Checkpointing\.resume` must be a bool"),
    (lambda: Checkpointing("runs", resume=1), InvalidTypeError, r"`Checkpointing\.resume` must be a bool"),
    (lambda: Checkpointing(dir=3), InvalidTypeError, r"`Checkpointing\.dir`"),
    (lambda: EnvOptions(num_envs="x"), InvalidTypeError, r"`EnvOptions\.num_envs` must be an int, got str 'x'"),
    (lambda: EnvOptions(device="nope"), InvalidValueError, r"`EnvOptions\.device`"),
    (lambda: EnvOptions(normalize_obs=1), InvalidTypeError, r"`EnvOptions\.normalize_obs` must be a bool"),
    (lambda: EnvOptions(to_range=(0.0,)), InvalidValueError, r"`EnvOptions\.to_range` must be a pair"),
    (lambda: EnvOptions(obs_keys="image"), InvalidTypeError, r"`EnvOptions\.obs_keys`"),
    (lambda: Budget(max_seconds=-1), InvalidValueError, r"`Budget\.max_seconds`"),
    (lambda: GA(evolve_kwargs={"epsilonn": 0.1}), InvalidTypeError, r"'epsilonn' \(did you mean 'epsilon'\?\)"),
    (lambda: GA(population_kwargs=3), InvalidTypeError, r"`GA\.population_kwargs` must be a dict"),
    (lambda: ES(sigma="big"), InvalidTypeError, r"`ES\.sigma` must be a real number"),
    (lambda: ES(momentum=1.5), InvalidValueError, r"`ES\.momentum`"),
    (lambda: ES(max_speed=0), InvalidValueError, r"`ES\.max_speed`"),
    (lambda: ES(optimizer="rmsprop"), InvalidValueError, r"`ES\.optimizer`"),
]


@pytest.mark.parametrize("make, error, message", BUILT_BAD, ids=lambda v: "" if callable(v) else str(v)[:30])
def test_every_option_object_checks_its_fields_when_built(make, error, message):
    with pytest.raises(error, match=message):
        make()


def test_valid_forms_still_build():
    EnvOptions(num_envs=np.int64(4), device=torch.device("cpu"), to_range=([-1.0], np.array([2.0])), obs_keys=["a"])
    assert EnvOptions(drop_obs_keys=(k for k in ["mission"])).drop_obs_keys == ("mission",)  # read once, kept
    Checkpointing("runs", resume=np.bool_(True)), Budget(max_env_steps=np.int64(5), max_seconds=1)
    ES(optimizer=None), ES(optimizer=lambda params: torch.optim.SGD(params, lr=0.1), fitness_shaping=lambda f: f)
    Validation(episodes=0, top=None), Episodes(num_episodes=2, seeding="common", fitness=lambda population: 0.0)
