"""Evolve a CartPole-v1 policy with a population of LoRA adapters, then check it on fresh episodes.

The call is the one a new user would write (issue 11): 16 envs, 64
individuals, rank-4 adapters, at most 30 generations, ``target_fitness=475``
and the defaults otherwise. Every individual plays its own training episode
each generation (``Episodes(seeding='independent')``); the top candidates
replay the run's fixed validation episodes, the run stops once a VALIDATED
mean reaches 475, and the policy returned is the best validated individual.
It must then average at least 475 over 20 episodes it has never seen
(``EnvInteractor.play``, the documented way to judge a policy). A callback
logs each generation (training best, validated score, env steps).

Measured (benchmarks/envs.py --task cartpole, 2 shared CPU cores): 5 of 5
seeds solve it, 10 to 25 generations, under a minute each.

Run (also under torchrun, where each rank plays its share of the individuals):

    python examples/cartpole.py --seed 0
    torchrun --standalone --nproc-per-node=2 examples/cartpole.py
"""

from __future__ import annotations

import argparse
import time

import torch
from torch import nn

from populora import evolve_with_env, interact_with_env, is_main_rank
from populora.interact import EnvOptions

SOLVED = 475.0  # CartPole-v1's reward threshold


def log(info) -> None:
    """evolve_with_env's per-generation callback: print one line (return True to stop early)."""
    s = info.stats
    if is_main_rank():
        validated = "-" if s.validated is None else f"{s.validated:.1f}"
        print(
            f"generation {s.generation:2d}: training best {s.best:6.1f} mean {s.mean:6.1f}, "
            f"validated {validated:>6}, env steps {s.env_steps:,}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--generations", type=int, default=30, help="at most this many generations")
    parser.add_argument("--quiet", action="store_true", help="no line per generation")
    args = parser.parse_args()
    torch.set_num_threads(1)  # tiny matmuls: threads only add overhead

    torch.manual_seed(args.seed)
    model = nn.Sequential(nn.Linear(4, 32), nn.Tanh(), nn.Linear(32, 2))  # logits of "push left" / "push right"

    start = time.perf_counter()
    policy, history = evolve_with_env(
        "CartPole-v1",
        model,
        pop_size=64,
        low_rank=4,
        num_generations=args.generations,
        target_fitness=SOLVED,
        seed=args.seed,
        callback=None if args.quiet else log,
        env_options=EnvOptions(num_envs=16),
    )
    seconds = time.perf_counter() - start

    with interact_with_env("CartPole-v1", num_envs=16) as interactor:
        returns = interactor.play(policy, num_episodes=20, seed=args.seed)  # fresh: the reporting stream
    if is_main_rank():
        print(f"seed {args.seed}: {len(history)} generations, {history[-1].env_steps:,} env steps in {seconds:.1f} s")
        print(
            f"evolved policy on 20 fresh episodes: mean return {returns.mean():.1f} "
            f"(min {returns.min():.0f}, max {returns.max():.0f}) -> "
            f"{'solved' if returns.mean() >= SOLVED else 'NOT solved'} (threshold {SOLVED:.0f})"
        )


if __name__ == "__main__":
    main()
