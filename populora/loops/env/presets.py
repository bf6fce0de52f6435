"""Settings per task that were measured to work, and a conv policy for image observations.

:func:`preset` gives the ``evolve_with_env`` settings of a task whose
results are on the results page (and in ``benchmarks/envs.py``), with a
model factory and the arguments :meth:`~populora.EnvInteractor.play` needs
to judge the policy::

    from populora import evolve_with_env, interact_with_env
    from populora.loops.env.presets import preset

    p = preset("LunarLander-v3")
    policy, history = evolve_with_env(p.env, p.model(), seed=0, **p.kwargs)
    with interact_with_env(p.env) as interactor:
        returns = interactor.play(policy, num_episodes=30, **p.play)

Image observations: keep the image (``EnvOptions(flatten_obs=False)``:
``(N, H, W, C)`` float32 tensors, or a Dict of them) and put a small conv
net in front: :class:`ConvPolicy`, or :func:`conv_policy` built from the
observation space. Its convolutions are fixed random features (LoRA
adapters and ES evolve the ``nn.Linear`` layers by default); the linear
head after them is evolved. A flattened frame works too, but its first
layer is huge: CarRacing-v3's 96x96x3 frames are 27,648 inputs, so a
27648-32-3 MLP has 885k parameters and each individual's rank-2 adapter
55k numbers, against 152k and 4.4k for :func:`conv_policy` (measured on 2
shared CPU cores: a routed forward of 16 rows takes 7.6 ms flattened, 12.1
ms through the convolutions; CarRacing's own step, which renders the frame,
took about 40 ms, so either policy runs at about the env's 23 steps/s per
slot there). MiniGrid's cell codes are small integers: encode them one hot
(``minigrid.wrappers.OneHotPartialObsWrapper``) and pass ``scale=1``
(``examples/minigrid_conv.py``).
"""

from __future__ import annotations

import difflib
import inspect
import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from populora.errors import InvalidTypeError, InvalidValueError
from populora.loops.env.options import ES, GA, Budget, EnvOptions, Episodes, Validation

__all__ = ["PRESETS", "ConvPolicy", "Preset", "conv_policy", "preset"]


# ---------------------------------------------------------------------- the conv policy


class ConvPolicy(nn.Module):
    """A small conv net for image observations: images ``(N, H, W, C)`` (or ``(N, C, H, W)``) to ``(N, out)``.

    Small images (both sides under 32, e.g. MiniGrid's 7x7 views) go through
    two 3x3 convolutions of stride 1; larger ones (Atari's 84x84, CarRacing's
    96x96) through the DQN stack (8x8 stride 4, 4x4 stride 2, 3x3 stride 1).
    Then ``Linear(features, hidden)``, ``tanh``, ``Linear(hidden, out)``: the
    two layers a Population's adapters (or an ES) evolve; the convolutions
    keep their random initialisation (seed it with ``torch.manual_seed``).

    Args:
        image_shape: one observation's image, as the env gives it (``(H, W, C)``
            with ``channels_last``, else ``(C, H, W)``).
        out: outputs per observation (action logits, or Box values).
        channels_last: the image's channels are its last dim (gymnasium's
            RGB frames, MiniGrid); ``False`` for ale-py's stacked frames ``(4, 84, 84)``.
        key: the entry of a Dict observation holding the image (``None``: the
            observation is the image).
        scale: pixels are multiplied by it (``1 / 255`` for 8-bit frames).
        channels: output channels of the convolutions (2 for small images, 3 for large).
        hidden: width of the linear layer after them.
        out_tanh: end in ``tanh`` (Box actions in ``(-1, 1)``, with ``EnvOptions(to_range=...)``).

    Shapes:
        input: ``(N, *image_shape)`` float (or a Dict with ``key``); output ``(N, out)``.
    """

    def __init__(
        self,
        image_shape: Sequence[int],
        out: int,
        *,
        channels_last: bool = True,
        key: str | None = None,
        scale: float = 1.0 / 255.0,
        channels: Sequence[int] | None = None,
        hidden: int = 64,
        out_tanh: bool = False,
    ):
        super().__init__()
        shape = tuple(int(s) for s in image_shape)
        if len(shape) != 3 or min(shape) < 1:
            raise InvalidValueError(f"`image_shape` must be 3 positive sizes (H, W, C) or (C, H, W), got {image_shape}")
        if isinstance(out, bool) or not isinstance(out, int) or out < 1:
            raise InvalidValueError(f"`out` must be an int >= 1, got {out!r}")
        height, width, depth = shape if channels_last else (shape[1], shape[2], shape[0])
        self.image_shape, self.channels_last, self.key, self.scale = shape, bool(channels_last), key, float(scale)
        small = min(height, width) < 32
        layers_spec = [(3, 1), (3, 1)] if small else [(8, 4), (4, 2), (3, 1)]
        widths = list(channels) if channels is not None else ([16, 32] if small else [16, 32, 32])
        if len(widths) != len(layers_spec):
            raise InvalidValueError(
                f"`channels` must give {len(layers_spec)} widths for a {height}x{width} image, got {channels}"
            )
        convs: list[nn.Module] = []
        in_ch, h, w = depth, height, width
        for (kernel, stride), ch in zip(layers_spec, widths):
            pad = kernel // 2 if small else 0
            convs += [nn.Conv2d(in_ch, ch, kernel, stride, padding=pad), nn.ReLU()]
            h, w = (h + 2 * pad - kernel) // stride + 1, (w + 2 * pad - kernel) // stride + 1
            if h < 1 or w < 1:
                raise InvalidValueError(f"a {height}x{width} image is too small for the conv stack {layers_spec}")
            in_ch = ch
        self.convs = nn.Sequential(*convs)
        self.features = in_ch * h * w
        head: list[nn.Module] = [nn.Linear(self.features, hidden), nn.Tanh(), nn.Linear(hidden, out)]
        self.head = nn.Sequential(*head, *([nn.Tanh()] if out_tanh else []))

    def forward(self, obs: Tensor | dict[str, Tensor]) -> Tensor:
        if self.key is not None:
            if not isinstance(obs, dict) or self.key not in obs:
                raise InvalidTypeError(
                    f"ConvPolicy(key={self.key!r}) takes Dict observations with that entry, got "
                    f"{sorted(obs) if isinstance(obs, dict) else type(obs).__name__}"
                )
            obs = obs[self.key]
        if not isinstance(obs, Tensor) or obs.dim() != 4:
            raise InvalidTypeError(
                "ConvPolicy takes image batches (N, H, W, C) or (N, C, H, W): build the interactor with "
                f"flatten_obs=False (EnvOptions(flatten_obs=False)); got {getattr(obs, 'shape', type(obs).__name__)}"
            )
        weight = self.head[0].weight
        assert isinstance(weight, Tensor)  # an nn.Linear's (the checker sees Module attributes as Tensor | Module)
        x = obs.to(weight.dtype) * self.scale
        if self.channels_last:
            x = x.permute(0, 3, 1, 2)
        return self.head(self.convs(x).flatten(1))


def conv_policy(obs_space: Any, out: int, *, key: str | None = None, **kwargs: Any) -> ConvPolicy:
    """A :class:`ConvPolicy` sized from a gymnasium observation space.

    Args:
        obs_space: a ``Box`` image space, or a ``Dict`` with an image entry
            (``key``, default ``'image'`` when it has one, e.g. MiniGrid's).
        out: outputs per observation.
        key: the Dict entry holding the image.
        kwargs: more :class:`ConvPolicy` arguments. ``channels_last`` defaults
            to whether the last dim is the smallest of the three (RGB frames
            ``(H, W, 3)``, MiniGrid's ``(7, 7, 3)``; ale-py's ``(4, 84, 84)``
            is channels first), ``scale`` to ``1 / high`` of the space (1 for
            an unbounded one).

    Example:
        >>> import gymnasium as gym
        >>> space = gym.spaces.Box(0, 255, (96, 96, 3), dtype="uint8")
        >>> conv_policy(space, 3)(torch.zeros(2, 96, 96, 3)).shape
        torch.Size([2, 3])
    """
    spaces = getattr(obs_space, "spaces", None)
    if isinstance(spaces, dict):
        key = key if key is not None else ("image" if "image" in spaces else None)
        if key is None or key not in spaces:
            raise InvalidValueError(
                f"a Dict observation space needs `key=`, the entry holding the image; its entries are {sorted(spaces)}"
            )
        image = spaces[key]
    else:
        image = obs_space
    shape = getattr(image, "shape", None)
    if shape is None or len(shape) != 3:
        raise InvalidValueError(f"conv_policy needs a 3-dim image space (H, W, C) or (C, H, W), got {image}")
    kwargs.setdefault("channels_last", int(shape[-1]) <= min(int(shape[0]), int(shape[1])))
    if "scale" not in kwargs:
        high = float(torch.as_tensor(getattr(image, "high", math.inf)).max()) if hasattr(image, "high") else math.inf
        kwargs["scale"] = 1.0 / high if math.isfinite(high) and high > 0 else 1.0
    return ConvPolicy(tuple(shape), out, key=key, **kwargs)


# ---------------------------------------------------------------------- presets per task


def identity(outputs: Tensor) -> Tensor:
    """The model's outputs are the actions (Box spaces)."""
    return outputs


def first_three(outputs: Tensor) -> Tensor:
    """``argmax`` of 3 outputs: MiniGrid's actions left, right, forward."""
    return outputs.argmax(-1)


def _mlp(*sizes: int, out_tanh: bool = False) -> nn.Module:
    layers: list[nn.Module] = []
    for a, b in itertools.pairwise(sizes):
        layers += [nn.Linear(a, b), nn.Tanh()]
    return nn.Sequential(*(layers if out_tanh else layers[:-1]))


def _zero_linear(d: int, e: int) -> nn.Module:
    """A linear policy starting at zero (PGPE's usual start): ``(b, d) -> (b, e)``."""
    layer = nn.Linear(d, e)
    with torch.no_grad():
        layer.weight.zero_()
        layer.bias.zero_()
    return nn.Sequential(layer)


def _minigrid_env(task: str) -> Callable[[], Any]:
    def make() -> Any:
        import gymnasium as gym
        import minigrid  # noqa: F401 - registers the MiniGrid envs
        from minigrid.wrappers import OneHotPartialObsWrapper

        return OneHotPartialObsWrapper(gym.make(task))

    return make


def _minigrid_model(task: str) -> Callable[[], nn.Module]:
    def model() -> nn.Module:
        return conv_policy(_minigrid_env(task)().observation_space, 3, key="image", scale=1.0)

    return model


@dataclass(frozen=True)
class Preset:
    """Measured settings of one task (see :func:`preset`).

    Attributes:
        task: the gymnasium id.
        env: what ``evolve_with_env`` and ``interact_with_env`` take (the id, or a factory).
        model: builds the untrained model (seed torch first: ``torch.manual_seed(seed)``).
        kwargs: the other ``evolve_with_env`` arguments: ``pop_size``, ``low_rank``, ``horizon``,
            ``action``, ``num_generations``, ``algorithm``, ``episodes``, ``validation``, ``env_options``,
            ``budget``.
        play: what :meth:`~populora.EnvInteractor.play` needs to judge the policy (``action``,
            ``to_range``, ``horizon``), and ``interact`` the ``interact_with_env`` options of those
            episodes (``flatten_obs``, ``drop_obs_keys``).
        target: the score a solved task reaches (mean return over fresh episodes).
        measured: what these settings reached (the results page has the runs).
    """

    task: str
    env: Any
    model: Callable[[], nn.Module]
    kwargs: dict[str, Any]
    play: dict[str, Any] = field(default_factory=dict)
    interact: dict[str, Any] = field(default_factory=dict)
    target: float | None = None
    measured: str = ""

    def __post_init__(self) -> None:
        # the three dicts are the keyword arguments of a call: each key is checked against it when built
        from populora.envs.interactor import EnvInteractor, interact_with_env
        from populora.loops.env.evolve import evolve_with_env

        _check_call_keys(f"Preset({self.task!r}).kwargs", self.kwargs, evolve_with_env, ("envs", "model", "seed"))
        _check_call_keys(f"Preset({self.task!r}).play", self.play, EnvInteractor.play, ("self", "policy"))
        _check_call_keys(f"Preset({self.task!r}).interact", self.interact, interact_with_env, ("envs",))
        options: dict[str, type | tuple[type, ...]] = {"algorithm": (GA, ES), "episodes": Episodes}
        options["validation"] = Validation
        options.update(env_options=EnvOptions, budget=Budget)
        for key, kind in options.items():
            value = self.kwargs.get(key)
            if value is not None and not isinstance(value, kind):
                raise InvalidTypeError(
                    f"`Preset({self.task!r}).kwargs[{key!r}]` must be an option object, got {value!r:.80}"
                )


def _check_call_keys(where: str, options: Any, fn: Callable[..., Any], own: Sequence[str]) -> None:
    """Every key of ``options`` (a dict of keyword arguments of ``fn``) is one of its parameters, not in ``own``."""
    if not isinstance(options, dict):
        raise InvalidTypeError(f"`{where}` must be a dict of {fn.__qualname__} arguments, got {options!r:.80}")
    allowed = [name for name in inspect.signature(fn).parameters if name not in own]
    for key in options:
        if key not in allowed:
            close = difflib.get_close_matches(str(key), allowed, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise InvalidTypeError(f"`{where}` has the key {key!r}{hint}, which {fn.__qualname__} does not take")


def _presets() -> dict[str, Preset]:
    lander = EnvOptions(num_envs=16, normalize_obs=True)
    return {
        "CartPole-v1": Preset(
            "CartPole-v1",
            "CartPole-v1",
            lambda: _mlp(4, 32, 2),
            dict(
                pop_size=64, low_rank=4, num_generations=30, target_fitness=475.0, env_options=EnvOptions(num_envs=16)
            ),
            target=475.0,
            measured="5/5 seeds >= 475 on 20 fresh episodes (GA, at most 30 generations)",
        ),
        "LunarLander-v3": Preset(
            "LunarLander-v3",
            "LunarLander-v3",
            lambda: _mlp(8, 32, 4),
            dict(
                # 32 individuals: twice the generations of 64 in the same steps (64 reached 171 validated, 123
                # fresh at 2M steps on seed 0; 32 reached 226 / 222)
                pop_size=32,
                low_rank=4,
                # the full 1000 steps: with training episodes cut at 500 the GA reached only -77..-143 at 1M steps
                horizon=1000,
                num_generations=100_000,
                algorithm=GA(),
                episodes=Episodes(num_episodes=2),
                env_options=lander,
                # no target_fitness: a champion confirmed at >= 200 less two standard errors stopped seed 1 at
                # 1.2M steps with a policy that scored 197 on fresh episodes; the whole budget it is
                budget=Budget(max_env_steps=1_950_000),
            ),
            play=dict(horizon=1000),
            target=200.0,
            measured="231, 247, 202 on 30 fresh episodes (seeds 0-2); validated >= 200 at 1.30M, 682k, 893k",
        ),
        "LunarLanderContinuous-v3": Preset(
            "LunarLanderContinuous-v3",
            "LunarLanderContinuous-v3",
            lambda: _zero_linear(8, 2),
            dict(
                pop_size=128,
                low_rank=2,
                horizon=1000,
                action=identity,
                num_generations=100_000,
                algorithm=ES(sigma=0.1, optimizer="clipup", lr=0.03),
                env_options=lander,
                budget=Budget(max_env_steps=1_950_000),
            ),
            play=dict(action=identity, horizon=1000),
            target=200.0,
            measured="264, 287, 277 on 30 fresh episodes (seeds 0-2) at 1.95M-1.97M env steps",
        ),
        "Pendulum-v1": Preset(
            "Pendulum-v1",
            "Pendulum-v1",
            lambda: _mlp(3, 16, 1, out_tanh=True),
            dict(
                # 64 members of one episode: 12,800 training steps a generation, ~260 generations in 5M steps with
                # validation (128 members with ClipUp step 0.15 needed ~4M steps on seed 0 and stalled at -730 on
                # seed 1). Chosen on a vectorised replica of this ES on Pendulum's equations, 8 seeds: 7/8 reached
                # >= -200 on 30 fresh episodes (-116..-196, one -305) against 6/8 with one common start state a
                # generation, 7/8 (slower) with step 0.2, 4/8 with noise 0.8, 1/8 with 0.3, 4/8 with 32 members,
                # 1/4 with 128, 6/8 with 2 episodes a member
                pop_size=64,
                low_rank=2,
                horizon=200,
                action=identity,
                num_generations=100_000,
                algorithm=ES(sigma=0.5, optimizer="clipup", lr=0.3),
                # each antithetic pair meets its own start state (both mirrors the same one), so a generation's
                # gradient averages 32 start states instead of following one
                episodes=Episodes(num_episodes=1, seeding="independent"),
                # 30 validation episodes: returns range 0..-400 by start state, and the best of 10-episode
                # scores over hundreds of generations picked centres 30-40 worse on fresh episodes
                validation=Validation(episodes=30, top=1),
                env_options=EnvOptions(num_envs=64, normalize_obs=True, to_range=(-2.0, 2.0)),
                target_fitness=-200.0,
                budget=Budget(max_env_steps=4_875_000),
            ),
            play=dict(action=identity, to_range=(-2.0, 2.0), horizon=200),
            target=-200.0,
            measured="-156, -171, -133 on 30 fresh episodes (seeds 0-2); validated >= -200 at 1.77M, 1.48M, 3.02M",
        ),
        "MiniGrid-Empty-Random-5x5-v0": Preset(
            "MiniGrid-Empty-Random-5x5-v0",
            _minigrid_env("MiniGrid-Empty-Random-5x5-v0"),
            _minigrid_model("MiniGrid-Empty-Random-5x5-v0"),
            dict(
                pop_size=64,
                low_rank=4,
                horizon=30,
                action=first_three,
                num_generations=10,
                algorithm=GA(),
                episodes=Episodes(num_episodes=4),
                env_options=EnvOptions(num_envs=16, flatten_obs=False, drop_obs_keys=("mission",)),
            ),
            play=dict(action=first_three, horizon=30),
            interact=dict(flatten_obs=False, drop_obs_keys=("mission",)),
            target=0.9,
            measured="success 1.0 on 30 fresh episodes (mean reward 0.92) after 10 generations, 72k env steps",
        ),
    }


PRESETS: tuple[str, ...] = (
    "CartPole-v1",
    "LunarLander-v3",
    "LunarLanderContinuous-v3",
    "Pendulum-v1",
    "MiniGrid-Empty-Random-5x5-v0",
)
"""The tasks :func:`preset` knows."""


def preset(task: str) -> Preset:
    """The measured settings of ``task`` (a gymnasium id of :data:`PRESETS`), a fresh copy each call.

    Raises:
        InvalidValueError: a task without a preset (the known ones listed).

    Example:
        >>> p = preset("LunarLanderContinuous-v3")
        >>> p.kwargs["pop_size"], p.kwargs["algorithm"].optimizer, p.target
        (128, 'clipup', 200.0)
    """
    table = _presets()
    if task not in table:
        raise InvalidValueError(f"no preset for task {task!r}; presets exist for {list(PRESETS)}")
    return table[task]
