"""Evolve a LunarLander-v3 policy (gymnasium[box2d]) with its preset: 4 discrete actions, 8 observations.

The settings are ``populora.loops.env.presets.preset("LunarLander-v3")``: 32
individuals (rank-4 LoRA adapters on an 8-32-4 MLP, genetic algorithm) play 2
episodes each per generation, each its own, of the full 1000 steps;
observations are normalised between generations; the top candidates are
validated every generation and the best validated individual is returned. The
run stops at 1.95M env steps (validation included; a run stops after the
generation that reaches it, so it stays within 2M). The policy is judged on 30
fresh episodes. LunarLander counts as solved at 200; a random policy scores
about -200.

Measured (``python benchmarks/envs.py --task lunarlander --seed 0 1 2``, the
same settings; the results page has the rows): 231, 247 and 202 on 30 fresh
episodes, a validated 200 first reached at 1.30M, 682k and 893k env steps.
With 64 individuals instead the GA reached 171 validated (123 fresh) at 2M
steps on seed 0; ES with ClipUp on a zero-started linear policy (the settings
that solve LunarLanderContinuous-v3) a best validated 35 at 1.2M steps.

Run (``pip install "gymnasium[box2d]"``):

    python examples/lunar_lander.py --seed 0
"""

from __future__ import annotations

import argparse
import time

import torch

from populora import evolve_with_env, interact_with_env, is_main_rank
from populora.interact import Budget
from populora.loops.env.presets import preset


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-env-steps", type=int, default=1_950_000)
    parser.add_argument("--generations", type=int, default=100_000, help="at most this many generations")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    args = parser.parse_args()
    torch.set_num_threads(1)

    p = preset("LunarLander-v3")
    options = {**p.kwargs, "num_generations": args.generations, "budget": Budget(max_env_steps=args.max_env_steps)}
    torch.manual_seed(args.seed)
    model = p.model()  # 8 -> 32 -> 4 logits of the 4 engines' actions

    start = time.perf_counter()
    policy, history = evolve_with_env(p.env, model, seed=args.seed, progress=not args.quiet, **options)
    seconds = time.perf_counter() - start

    with interact_with_env(p.env, num_envs=16) as interactor:  # fresh episodes of the full 1000 steps
        returns = interactor.play(policy, num_episodes=30, seed=7_000_000 + args.seed, **p.play)
    if is_main_rank():
        best = max((h.validated for h in history if h.validated is not None), default=float("nan"))
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
