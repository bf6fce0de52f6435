"""Evolve a Pendulum-v1 swing-up policy: continuous actions, observation normalisation, to_range.

The model ends in ``tanh``; ``EnvOptions(to_range=(-2, 2))`` rescales its output to
Pendulum's torque range (the only rescale populora does, and only when
asked). Observations are normalised with running statistics that stay
frozen within a generation. Fitness is the mean return of 3 episodes of 200
steps (higher is better; Pendulum's returns are negative, about -1200 for a
random policy and above -200 for a good swing-up).

Run (a few minutes on a laptop CPU):

    python examples/pendulum.py --seed 0
"""

from __future__ import annotations

import argparse
import time

import gymnasium as gym
import torch
from torch import nn

from populora import evolve_with_env, interact_with_env, is_main_rank
from populora.interact import GA, EnvOptions, Episodes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--generations", type=int, default=60)
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    args = parser.parse_args()
    torch.set_num_threads(1)

    torch.manual_seed(args.seed)
    model = nn.Sequential(nn.Linear(3, 32), nn.Tanh(), nn.Linear(32, 32), nn.Tanh(), nn.Linear(32, 1), nn.Tanh())

    start = time.perf_counter()
    policy, history = evolve_with_env(
        gym.make_vec("Pendulum-v1", num_envs=32, vectorization_mode="sync"),
        model,
        pop_size=64,
        low_rank=4,
        action=lambda out: out,  # (k, 1) in (-1, 1) ...
        num_generations=args.generations,
        horizon=200,
        seed=args.seed,
        progress=not args.quiet,
        episodes=Episodes(num_episodes=3),
        env_options=EnvOptions(to_range=(-2.0, 2.0), normalize_obs=True),  # ... rescaled to the torque range
        algorithm=GA(evolve_kwargs=dict(epsilon=0.3)),
    )
    seconds = time.perf_counter() - start

    fresh = interact_with_env(gym.make_vec("Pendulum-v1", num_envs=20, vectorization_mode="sync"))
    returns = fresh.play(
        policy, action=lambda out: out, to_range=(-2.0, 2.0), horizon=200, num_episodes=20, seed=1_000_000 + args.seed
    )
    if is_main_rank():
        first, last = history[0], history[-1]
        print(
            f"seed {args.seed}: {len(history)} generations in {seconds:.0f} s; best fitness {first.best:.0f} -> "
            f"{last.best:.0f} (population mean {first.mean:.0f} -> {last.mean:.0f})"
        )
        print(
            f"evolved policy on 20 fresh episodes: mean return {returns.mean():.0f} "
            f"(min {returns.min():.0f}, max {returns.max():.0f})"
        )


if __name__ == "__main__":
    main()
