"""Evolve a LunarLander-v3 policy (gymnasium[box2d]): 4 discrete actions, 8 observations.

64 individuals (rank-8 LoRA adapters on a small MLP) land in 32 slots at
once; fitness is the mean return of 3 episodes (the same 3 for everyone in a
generation), observations are normalised between generations. LunarLander
counts as solved at 200; a random policy scores about -200.

Run (several minutes on a laptop CPU; ``pip install "gymnasium[box2d]"``):

    python examples/lunar_lander.py --seed 0
"""

from __future__ import annotations

import argparse
import time

import gymnasium as gym
import torch
from torch import nn

from populora import evolve_with_env, interact_with_env, is_main_rank


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--generations", type=int, default=100)
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    args = parser.parse_args()
    torch.set_num_threads(1)

    torch.manual_seed(args.seed)
    model = nn.Sequential(nn.Linear(8, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 4))
    act = lambda logits: logits.argmax(-1)

    start = time.perf_counter()
    policy, history = evolve_with_env(
        gym.make_vec("LunarLander-v3", num_envs=32, vectorization_mode="sync"),
        model,
        pop_size=64,
        low_rank=8,
        action=act,
        num_generations=args.generations,
        horizon=1000,
        num_episodes=3,
        seed=args.seed,
        normalize_obs=True,
        target_fitness=250.0,
        progress=not args.quiet,
        evolve_kwargs=dict(epsilon=0.3),
    )
    seconds = time.perf_counter() - start

    fresh = interact_with_env(gym.make_vec("LunarLander-v3", num_envs=20, vectorization_mode="sync"))
    returns = fresh.play(policy, action=act, horizon=1000, num_episodes=20, seed=1_000_000 + args.seed)
    if is_main_rank():
        first, last = history[0], history[-1]
        print(f"seed {args.seed}: {len(history)} generations in {seconds:.0f} s; best fitness {first.best:.0f} -> "
              f"{last.best:.0f} (population mean {first.mean:.0f} -> {last.mean:.0f})")
        print(f"evolved policy on 20 fresh episodes: mean return {returns.mean():.0f} "
              f"(min {returns.min():.0f}, max {returns.max():.0f}; solved is 200)")


if __name__ == "__main__":
    main()
