"""Evolve a LunarLander-v3 policy (gymnasium[box2d]): 4 discrete actions, 8 observations.

64 individuals (rank-4 LoRA adapters on an 8-32-4 MLP) play 2 episodes each
per generation, each its own; observations are normalised between
generations; the top candidates are validated every generation and the best
validated individual is returned. The run stops at 1.95M env steps
(validation included; a run stops after the generation that reaches it, so
it stays within 2M). LunarLander counts as solved at 200; a random policy
scores about -200. ``--algorithm es`` runs EggRoll ES instead (the MLP,
Adam and the ES defaults).

Measured (benchmarks/envs.py --task lunarlander, 2 shared CPU cores, seed 0):
genetic algorithm 191 on 30 fresh episodes at 2.08M env steps (4.3 min);
ES 97 at 1.7M (14 min). ES with ClipUp on a zero-started linear policy (the
configuration that solves LunarLanderContinuous-v3,
``examples/lunar_lander_continuous.py``) reached a best validated 35 at
1.2M steps on this discrete task. Not solved yet: issue 11's target is 200.

Run (``pip install "gymnasium[box2d]"``):

    python examples/lunar_lander.py --seed 0
"""

from __future__ import annotations

import argparse
import time

import torch
from torch import nn

from populora import evolve_with_env, interact_with_env, is_main_rank
from populora.interact import Budget, EnvOptions, Episodes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-env-steps", type=int, default=1_950_000)
    parser.add_argument("--generations", type=int, default=100_000, help="at most this many generations")
    parser.add_argument("--algorithm", choices=["ga", "es"], default="ga")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    args = parser.parse_args()
    torch.set_num_threads(1)

    torch.manual_seed(args.seed)
    model = nn.Sequential(nn.Linear(8, 32), nn.Tanh(), nn.Linear(32, 4))  # logits of the 4 engines' actions

    start = time.perf_counter()
    policy, history = evolve_with_env(
        "LunarLander-v3",
        model,
        pop_size=64,
        low_rank=4,
        num_generations=args.generations,
        horizon=1000,
        seed=args.seed,
        progress=not args.quiet,
        algorithm=args.algorithm,  # "ga" or "es": each with its defaults
        episodes=Episodes(num_episodes=2),
        env_options=EnvOptions(num_envs=16, normalize_obs=True),
        budget=Budget(max_env_steps=args.max_env_steps),
    )
    seconds = time.perf_counter() - start

    with interact_with_env("LunarLander-v3", num_envs=16) as interactor:
        returns = interactor.play(policy, horizon=1000, num_episodes=30, seed=7_000_000 + args.seed)  # fresh ones
    if is_main_rank():
        best = max(h.validated for h in history if h.validated is not None)
        print(
            f"seed {args.seed}: {len(history)} generations, {history[-1].env_steps:,} env steps in {seconds:.0f} s; "
            f"best validated {best:.0f}"
        )
        print(
            f"evolved policy on 30 fresh episodes: mean return {returns.mean():.0f} "
            f"(min {returns.min():.0f}, max {returns.max():.0f}; solved is 200)"
        )


if __name__ == "__main__":
    main()
