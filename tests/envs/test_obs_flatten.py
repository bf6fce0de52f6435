"""Observations as gymnasium means them (issue 25, item 1).

``flatten_obs=True`` must give, for every slot, the values of
``gymnasium.spaces.flatten(space, obs)`` cast to float32, for every space
type ``flatten`` turns into numbers and nested ones, through every kind of
slot source (single envs, a plain ``SyncVectorEnv`` whose sub-envs are
stepped, and a vector env stepped as a whole); ``obs_keys`` /
``drop_obs_keys`` choose Dict entries; a space with no numeric form raises
naming where it sits and how to drop it.
"""

from __future__ import annotations

import warnings
from collections import OrderedDict

import gymnasium as gym
import numpy as np
import pytest
import torch
from gymnasium.spaces import Box, Dict, Discrete, Graph, MultiBinary, MultiDiscrete, Sequence, Text, Tuple
from gymnasium.vector import AsyncVectorEnv, SyncVectorEnv
from torch import nn

from populora.envs.interactor import EnvInteractor
from populora.envs.slots import build_slots
from populora.envs.spaces import KeySelection, ObsLayout, check_obs_keys
from populora.errors import InvalidTypeError, InvalidValueError


class SpaceEnv(gym.Env):
    """Observations sampled from ``space`` (seeded by ``reset(seed=)``); episodes of 3 steps.

    ``last`` holds the last observation returned, the reference for gymnasium's ``flatten``.
    """

    metadata: dict = {}

    def __init__(self, space: gym.Space, as_dict_order: list[str] | None = None):
        self.observation_space = space
        self.action_space = Discrete(2)
        self.as_dict_order = as_dict_order  # return Dict observations with their keys in this order
        self.t = 0
        self.last = None

    def _obs(self):
        obs = self.observation_space.sample()
        if self.as_dict_order is not None:
            obs = {key: obs[key] for key in self.as_dict_order}
        self.last = obs
        return obs

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        if seed is not None:
            self.observation_space.seed(seed)
        self.t = 0
        return self._obs(), {}

    def step(self, action):
        self.t += 1
        return self._obs(), 1.0, self.t >= 3, False, {}


SPACES = {
    "box 2-d float64": Box(-1.0, 1.0, (2, 3), np.float64),
    "box uint8": Box(0, 255, (4,), np.uint8),
    "discrete": Discrete(5),
    "discrete with start": Discrete(4, start=-2),
    "multi-discrete": MultiDiscrete([3, 2, 4]),
    "multi-discrete 2-d with start": MultiDiscrete([[2, 3], [4, 2]], start=[[1, 0], [-1, 2]]),
    "multi-binary": MultiBinary(5),
    "multi-binary 2-d": MultiBinary([2, 3]),
    "tuple": Tuple((Discrete(3), Box(-1.0, 1.0, (2,), np.float32), MultiBinary(2))),
    "dict (keys sorted by gymnasium)": Dict(
        {"z": Discrete(3), "a": Box(-1.0, 1.0, (2,), np.float32), "m": MultiDiscrete([2, 2])}
    ),
    "ordered dict (kept order)": Dict(OrderedDict([("z", Discrete(3)), ("a", Box(-1.0, 1.0, (1,), np.float32))])),
    "nested": Dict(
        {
            "pos": Tuple((Box(-1.0, 1.0, (2,), np.float32), Discrete(2))),
            "inner": Dict({"b": MultiBinary(3), "a": Discrete(2, start=1)}),
            "grid": Tuple((MultiDiscrete([2, 3]), Tuple((Discrete(3, start=5),)))),
        }
    ),
}

FORMS = ["list", "sync", "vector"]


def make_envs(form: str, space: gym.Space, n: int = 3, **kwargs):
    """``n`` slots of ``SpaceEnv(space)`` as ``form``, and a function giving each slot's last raw observation."""
    factories = [lambda: SpaceEnv(space, **kwargs) for _ in range(n)]
    if form == "list":
        envs = [f() for f in factories]
        return envs, lambda: [e.last for e in envs]
    if form == "async":
        vec = AsyncVectorEnv(factories, context="fork")
        return vec, lambda: list(vec.get_attr("last"))
    vec = SyncVectorEnv(factories)
    last = lambda: [e.last for e in vec.envs]
    return (vec if form == "sync" else gym.vector.VectorWrapper(vec)), last


def expected(space: gym.Space, observations: list) -> torch.Tensor:
    """gymnasium's own flatten of each observation, stacked and cast to float32."""
    return torch.from_numpy(np.stack([gym.spaces.flatten(space, obs) for obs in observations]).astype(np.float32))


def play_and_compare(envs, last, space, *, steps: int = 2, **slot_kwargs) -> None:
    slots = build_slots(envs, **slot_kwargs)
    n = slots.num
    every = np.arange(n, dtype=np.int64)
    slots.reset(every, [11 * i + 3 for i in range(n)], [5] * len(slots.whole_sources) or None)
    reference = slots.obs_space if slot_kwargs.get("obs_keys") or slot_kwargs.get("drop_obs_keys") else space
    width = gym.spaces.flatdim(reference)
    for _ in range(steps + 1):
        obs = slots.take(every)
        assert obs.dtype == torch.float32 and obs.shape == (n, width)
        observations = last()
        if reference is not space:  # the raw observations hold every key: gymnasium flattens the kept ones
            observations = [{key: o[key] for key in reference.spaces} for o in observations]
        assert torch.equal(obs, expected(reference, observations))
        slots.step(torch.zeros(n, dtype=torch.int64), every)
    slots.close()


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("name", list(SPACES))
def test_flat_observations_are_gymnasiums_flatten(name, form):
    space = SPACES[name]
    envs, last = make_envs(form, space)
    play_and_compare(envs, last, space)


@pytest.mark.parametrize("name", ["discrete with start", "nested"])
def test_flat_observations_through_an_async_vector_env(name):
    envs, last = make_envs("async", SPACES[name])
    try:
        play_and_compare(envs, last, SPACES[name], steps=1)
    finally:
        envs.close()


def test_dict_entries_follow_the_space_order_not_the_observations():
    """An env whose dicts list their keys in another order still flattens in the space's (sorted) order."""
    space = SPACES["dict (keys sorted by gymnasium)"]
    assert list(space.spaces) == ["a", "m", "z"]
    env = SpaceEnv(space, as_dict_order=["z", "m", "a"])
    slots = build_slots([env])
    slots.reset(np.zeros(1, dtype=np.int64), [4])
    raw = env.last
    assert list(raw) == ["z", "m", "a"]
    want = np.concatenate([raw["a"], np.eye(2)[raw["m"]].reshape(-1), np.eye(3)[raw["z"]]]).astype(np.float32)
    assert slots.obs[0].tolist() == want.tolist()


def test_discrete_observations_become_one_hot():
    """FrozenLake's Discrete(16): a one-hot of 16 (it was one number)."""
    env = gym.make("FrozenLake-v1", is_slippery=False)
    slots = build_slots([env])
    slots.reset(np.zeros(1, dtype=np.int64), [0])
    assert slots.obs.shape == (1, 16) and slots.obs[0].tolist() == [1.0] + [0.0] * 15
    slots.step(torch.tensor([2]), np.zeros(1, dtype=np.int64))  # right: state 1
    assert slots.obs[0].argmax().item() == 1 and slots.obs[0].sum().item() == 1.0


TAXI = "Taxi-v4" if "Taxi-v4" in gym.envs.registry else "Taxi-v3"


@pytest.mark.parametrize("env_id", ["FrozenLake-v1", TAXI, "Blackjack-v1"])
def test_a_policy_sized_by_flatdim_plays_discrete_and_tuple_envs(env_id):
    """What a gymnasium user writes: ``nn.Linear(flatdim(observation_space), action_space.n)``."""
    probe = gym.make(env_id)
    d, n = gym.spaces.flatdim(probe.observation_space), int(probe.action_space.n)
    slots = build_slots([gym.make(env_id) for _ in range(3)])
    assert slots.obs_space == probe.observation_space
    interactor = EnvInteractor(slots)
    torch.manual_seed(0)
    pop = interactor.population(nn.Sequential(nn.Linear(d, n)), 4, 2, seed=0)
    fitness = interactor.evaluate(pop, horizon=20, num_episodes=2)
    assert fitness.shape == (4,) and torch.isfinite(fitness).all()
    assert interactor.counters["env_steps"] > 0


def test_unflattened_observations_keep_their_structure_and_key_selection():
    space = SPACES["nested"]
    envs = [SpaceEnv(space) for _ in range(2)]
    slots = build_slots(envs, flatten_obs=False, drop_obs_keys=["grid"])
    slots.reset(np.arange(2, dtype=np.int64), [1, 2])
    obs = slots.obs
    assert set(obs) == {"inner", "pos"}
    assert obs["pos"][0].shape == (2, 2) and obs["pos"][0].dtype == torch.float32
    assert obs["pos"][1].tolist() == [float(e.last["pos"][1]) for e in envs]  # a Discrete stays its index
    assert obs["inner"]["b"].shape == (2, 3)


# ----------------------------------------------------------------------------- key selection


MINIGRID_LIKE = Dict(
    {"image": Box(0, 255, (2, 2, 3), np.uint8), "direction": Discrete(4), "mission": Text(max_length=20)}
)


class TextMissionEnv(SpaceEnv):
    def __init__(self):
        super().__init__(MINIGRID_LIKE)


@pytest.mark.parametrize("form", [*FORMS, "async"])
@pytest.mark.parametrize("option", [{"drop_obs_keys": ["mission"]}, {"obs_keys": ["image", "direction"]}])
def test_key_selection_drops_text_entries_in_every_form(form, option):
    envs, last = make_envs(form, MINIGRID_LIKE)
    try:
        play_and_compare(envs, last, MINIGRID_LIKE, steps=1, **option)
    finally:
        envs.close() if form == "async" else None


@pytest.mark.parametrize("form", FORMS)
def test_a_text_entry_raises_naming_the_key_and_the_fix(form):
    envs, _ = make_envs(form, MINIGRID_LIKE)
    with pytest.raises(
        InvalidValueError,
        match=r"obs\['mission'\] of .* is Text\(.*character.*drop it with "
        r"`drop_obs_keys=\['mission'\]` \(or keep the others with "
        r"`obs_keys=\['direction', 'image'\]`\)",
    ):
        build_slots(envs)
    with pytest.raises(InvalidValueError, match=r"obs\['mission'\].*a Text has no tensor form"):
        build_slots(envs, flatten_obs=False)


@pytest.mark.parametrize(
    "space, where, kind, fix",
    [
        (Graph(node_space=Box(-1, 1, (2,)), edge_space=None), "the observation", "Graph", "wrap the env"),
        (Tuple((Discrete(2), Sequence(Discrete(3)))), r"obs\[1\]", "Sequence", "wrap the env"),
        (
            Dict({"a": Discrete(2), "b": Dict({"c": Sequence(Discrete(3))})}),
            r"obs\['b'\]\['c'\]",
            "Sequence",
            r"drop_obs_keys=\['b'\]",
        ),
    ],
)
def test_spaces_without_numbers_raise_naming_where_they_sit(space, where, kind, fix):
    with pytest.raises(InvalidValueError, match=rf"{where} of .* is {kind}\(.*no numbers for a {kind}; .*{fix}"):
        build_slots([SpaceEnv(space)])


def test_nested_entry_without_numbers_names_the_top_key_to_drop():
    space = Dict({"a": Discrete(2), "b": Dict({"c": Sequence(Discrete(3))})})
    with pytest.raises(InvalidValueError, match=r"drop the entry holding it with `drop_obs_keys=\['b'\]`"):
        build_slots([SpaceEnv(space)])
    slots = build_slots([SpaceEnv(space)], drop_obs_keys=["b"])
    assert slots.obs_space == Dict({"a": Discrete(2)})


def test_a_custom_space_like_minigrids_mission_raises():
    class MissionLike(gym.Space):
        def __init__(self):
            super().__init__(dtype=str)

        def sample(self, mask=None, probability=None):
            return "go to the goal"

    space = Dict({"direction": Discrete(4), "mission": MissionLike()})
    with pytest.raises(
        InvalidValueError,
        match=r"obs\['mission'\].*no numbers for a MissionLike.*"
        r"drop_obs_keys=\['mission'\]",
    ):
        build_slots([SpaceEnv(space)])
    slots = build_slots([SpaceEnv(space) for _ in range(2)], drop_obs_keys=["mission"])
    slots.reset(np.arange(2, dtype=np.int64), [0, 1])
    assert slots.obs.shape == (2, 4)


def test_bad_key_options_raise_before_any_env_is_made():
    made = []
    factory = lambda: made.append(1) or SpaceEnv(MINIGRID_LIKE)
    cases = {
        "both": (InvalidValueError, dict(obs_keys=["image"], drop_obs_keys=["mission"]), "not both"),
        "a string": (InvalidTypeError, dict(obs_keys="image"), r"must be a list.*obs_keys=\['image'\]"),
        "empty": (InvalidValueError, dict(drop_obs_keys=[]), "is empty"),
        "not strings": (InvalidTypeError, dict(obs_keys=["image", 3]), "holds 3"),
        "twice": (InvalidValueError, dict(obs_keys=["image", "image"]), r"names \['image'\] more than once"),
    }
    for error, kwargs, message in cases.values():
        with pytest.raises(error, match=message):
            build_slots(factory, num_envs=2, **kwargs)
    assert made == []


def test_unknown_keys_list_the_available_ones():
    with pytest.raises(
        InvalidValueError,
        match=r"obs_keys=\['imag'\] names \['imag'\], which the observations of "
        r".* do not have; their keys are \['direction', 'image', 'mission'\]",
    ):
        build_slots([SpaceEnv(MINIGRID_LIKE)], obs_keys=["imag"])
    with pytest.raises(InvalidValueError, match="leaves no entry"):
        build_slots([SpaceEnv(MINIGRID_LIKE)], drop_obs_keys=["image", "direction", "mission"])
    with pytest.raises(
        InvalidValueError,
        match=r"selects entries of Dict observations; the observation space .* "
        r"is Discrete\(5\)",
    ):
        build_slots([SpaceEnv(Discrete(5))], obs_keys=["a"])


# ----------------------------------------------------------------------------- dm_control (no gymnasium space)


def test_dm_control_keeps_its_own_order_and_selects_keys():
    from dm_control import suite

    env = suite.load("cartpole", "balance", task_kwargs={"random": 0})
    slots = build_slots([env])
    assert slots.obs_space is None
    slots.reset(np.zeros(1, dtype=np.int64), [3])
    physics_obs = env.task.get_observation(env.physics)
    assert list(physics_obs) == ["position", "velocity"]
    want = np.concatenate([physics_obs["position"], physics_obs["velocity"]]).astype(np.float32)
    assert slots.obs.shape == (1, 5) and np.allclose(slots.obs[0].numpy(), want)
    only = build_slots([suite.load("cartpole", "balance")], obs_keys=["velocity"])
    only.reset(np.zeros(1, dtype=np.int64), [3])
    assert only.obs.shape == (1, 2)
    with pytest.raises(InvalidValueError, match=r"their keys are \['position', 'velocity'\]"):
        build_slots([suite.load("cartpole", "balance")], drop_obs_keys=["speed"])


# ----------------------------------------------------------------------------- the layout itself


def test_layout_refuses_values_outside_the_space_and_wrong_shapes():
    layout = ObsLayout(Dict({"d": Discrete(3, start=1), "m": MultiDiscrete([2, 3])}), True, KeySelection(), "env")
    good = {"d": np.array([1, 3]), "m": np.array([[0, 2], [1, 0]])}
    assert layout.from_batch(good, 2).tolist() == [[1, 0, 0, 1, 0, 0, 0, 1], [0, 0, 1, 0, 1, 1, 0, 0]]
    with pytest.raises(
        InvalidValueError,
        match=r"obs\['d'\] holds values \[1, 4\] outside its space Discrete\(3, "
        r"start=1\) \(valid: 1 to 3\)",
    ):
        layout.from_batch({**good, "d": np.array([1, 4])}, 2)
    with pytest.raises(InvalidValueError, match=r"obs\['m'\] holds values outside its space"):
        layout.from_batch({**good, "m": np.array([[0, 3], [1, 0]])}, 2)
    with pytest.raises(InvalidValueError, match=r"the observation has no obs\['m'\]"):
        layout.from_batch({"d": np.array([1, 2])}, 2)
    box = ObsLayout(Box(-1, 1, (3,)), True, KeySelection(), "env")
    with pytest.raises(InvalidValueError, match=r"has shape \(2, 4\) for 2 slot\(s\); its space Box.* holds 3"):
        box.from_batch(np.zeros((2, 4), np.float32), 2)


def test_check_obs_keys_returns_the_selection():
    keep = check_obs_keys(["b", "a"], None)
    assert keep.active and keep.kept(["a", "b", "c"], "env") == ["a", "b"]  # the space's order
    drop = check_obs_keys(None, ("c",))
    assert drop.kept(["a", "b", "c"], "env") == ["a", "b"]
    assert not check_obs_keys(None, None).active
    assert check_obs_keys({"a": 1}.keys(), None).keep == ("a",)  # any iterable of keys but a mapping or a string
    with pytest.raises(InvalidTypeError, match="must be a list of Dict observation keys"):
        check_obs_keys({"a": True}, None)


def test_no_warning_for_plain_box_observations():
    import env_ssl_wrapper  # noqa: F401  (its import is not what is checked)

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        slots = build_slots(SyncVectorEnv([lambda: SpaceEnv(Box(-1, 1, (3,), np.float32)) for _ in range(2)]))
        slots.reset(np.arange(2, dtype=np.int64), [0, 1])
    assert slots.sources[0]._direct and slots.obs.shape == (2, 3)


@pytest.mark.parametrize("form", FORMS)
def test_minigrid_plays_with_its_mission_dropped(form):
    """MiniGrid's text ``mission`` (a ``MissionSpace``) is refused by name, and plays once dropped."""
    pytest.importorskip("minigrid")
    from gymnasium.wrappers import FilterObservation

    make = lambda: gym.make("MiniGrid-Empty-5x5-v0")
    envs = {
        "list": lambda: [make() for _ in range(2)],
        "sync": lambda: gym.make_vec("MiniGrid-Empty-5x5-v0", 2, "sync"),
        "vector": lambda: gym.vector.VectorWrapper(gym.make_vec("MiniGrid-Empty-5x5-v0", 2, "sync")),
    }[form]()
    with pytest.raises(InvalidValueError, match=r"obs\['mission'\] of .* is MissionSpace.*drop_obs_keys=\['mission'\]"):
        build_slots(envs)
    slots = build_slots(envs, drop_obs_keys=["mission"])
    width = gym.spaces.flatdim(FilterObservation(make(), ["direction", "image"]).observation_space)
    assert width == 4 + 7 * 7 * 3
    interactor = EnvInteractor(slots)
    pop = interactor.population(nn.Sequential(nn.Linear(width, 7)), 3, 2, seed=0)
    fitness = interactor.evaluate(pop, horizon=10, num_episodes=1)
    assert fitness.shape == (3,) and torch.isfinite(fitness).all()
    assert slots.obs.shape == (2, width)
