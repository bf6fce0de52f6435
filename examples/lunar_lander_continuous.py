"""Evolve a LunarLanderContinuous-v3 policy (gymnasium[box2d]) with ES and ClipUp: a linear policy.

The policy is one linear layer 8 -> 2 (main and side engine), starting at
zero, on normalised observations; the env clips actions to [-1, 1].
EggRoll ES (``algorithm=ES(...)``) perturbs it with 128 members (64 antithetic
pairs, each pair on its own episode, rank-2 noise of scale 0.1), shapes the
returns by centred ranks and steps with ClipUp (``populora.optim.ClipUp``,
PGPE's optimiser: a normalised step of 0.03, velocity with momentum 0.9,
speed at most 0.06). The centre is validated every generation and the best
validated centre is returned. The run stops at 1.95M env steps (validation
included; a run stops after the generation that reaches it, so it stays
within 2M). LunarLander counts as solved at 200.

Measured (``python benchmarks/envs.py --task lunarlander-continuous --seed
0 1 2``, the same configuration; 2 CPU cores shared with other jobs, load
8-12): seeds 0, 1, 2 score 264, 287, 277 on 30 fresh episodes (3/3 >= 200)
at 1.96M, 1.97M, 1.95M env steps in 621, 981, 918 s.

Run (``pip install "gymnasium[box2d]"``):

    python examples/lunar_lander_continuous.py --seed 0
"""

from __future__ import annotations

import argparse
import time

import torch
from torch import nn

from populora import evolve_with_env, interact_with_env, is_main_rank
from populora.interact import ES, Budget, EnvOptions


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-env-steps", type=int, default=1_950_000)
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    args = parser.parse_args()
    torch.set_num_threads(1)

    model = nn.Linear(8, 2)  # (b, 8) observations -> (b, 2) engine throttles
    with torch.no_grad():
        model.weight.zero_()
        model.bias.zero_()

    start = time.perf_counter()
    policy, history = evolve_with_env(
        "LunarLanderContinuous-v3",
        nn.Sequential(model),
        pop_size=128,
        low_rank=2,
        action=lambda out: out,
        num_generations=100_000,
        horizon=1000,
        seed=args.seed,
        progress=not args.quiet,
        algorithm=ES(sigma=0.1, optimizer="clipup", lr=0.03),  # ClipUp: max_speed 2 * lr, momentum 0.9
        env_options=EnvOptions(num_envs=16, normalize_obs=True),
        budget=Budget(max_env_steps=args.max_env_steps),
    )
    seconds = time.perf_counter() - start

    with interact_with_env("LunarLanderContinuous-v3", num_envs=16) as interactor:
        returns = interactor.play(
            policy, action=lambda out: out, horizon=1000, num_episodes=30, seed=7_000_000 + args.seed
        )  # fresh episodes (the benchmark's reporting seeds)
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
