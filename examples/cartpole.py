"""Evolve a CartPole-v1 policy with a population of LoRA adapters, then check it on fresh episodes.

One small MLP; 64 individuals, each a rank-4 LoRA adapter on its two Linear
layers; all of them play in 16 CartPole slots at once, with ONE routed
forward per timestep. Fitness is the mean return of 10 episodes (the same 10
for every individual of a generation); observations are normalised with
statistics updated between generations; the run stops when the best
individual balances the pole for all 500 steps of all 10. The merged best
policy (which carries the normaliser) must then average at least 475 over
20 episodes it has never seen (CartPole-v1's "solved" threshold).

Run (about a minute on a laptop CPU; also under torchrun, where each rank
plays its share of the individuals):

    python examples/cartpole.py --seed 0
    torchrun --standalone --nproc-per-node=2 examples/cartpole.py
"""

from __future__ import annotations

import argparse
import time

import gymnasium as gym
import torch
from torch import nn

from populora import evolve_with_env, interact_with_env, is_main_rank

SOLVED = 475.0  # CartPole-v1's reward threshold
FRESH_SEED = 1_000_000  # episode seeds far from the ones evolution met


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--generations", type=int, default=60, help="at most this many generations")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    args = parser.parse_args()
    torch.set_num_threads(1)  # tiny matmuls: threads only add overhead

    torch.manual_seed(args.seed)
    model = nn.Sequential(nn.Linear(4, 32), nn.Tanh(), nn.Linear(32, 2))  # logits of "push left" / "push right"
    act = lambda logits: logits.argmax(-1)  # the action map: best logit

    start = time.perf_counter()
    policy, history = evolve_with_env(
        gym.make_vec("CartPole-v1", num_envs=16, vectorization_mode="sync"),
        model,
        pop_size=64,
        low_rank=4,
        action=act,
        num_generations=args.generations,
        horizon=500,
        num_episodes=10,
        normalize_obs=True,
        seed=args.seed,
        target_fitness=500.0,
        progress=not args.quiet,
        evolve_kwargs=dict(epsilon=0.3),
    )
    seconds = time.perf_counter() - start

    fresh = interact_with_env(gym.make_vec("CartPole-v1", num_envs=20, vectorization_mode="sync"))
    returns = fresh.play(policy, action=act, horizon=500, num_episodes=20, seed=FRESH_SEED + args.seed)
    if is_main_rank():
        last = history[-1]
        print(f"seed {args.seed}: {len(history)} generations in {seconds:.1f} s, best fitness {last.best:.1f} "
              f"(population mean {last.mean:.1f})")
        print(f"evolved policy on 20 fresh episodes: mean return {returns.mean():.1f} "
              f"(min {returns.min():.0f}, max {returns.max():.0f}) -> "
              f"{'solved' if returns.mean() >= SOLVED else 'NOT solved'} (threshold {SOLVED:.0f})")


if __name__ == "__main__":
    main()
