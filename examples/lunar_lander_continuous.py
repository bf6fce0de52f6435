"""Evolve a LunarLanderContinuous-v3 policy (gymnasium[box2d]) with ES and ClipUp: a linear policy.

The settings are ``populora.loops.env.presets.preset("LunarLanderContinuous-v3")``.
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

from populora import evolve_with_env, interact_with_env, is_main_rank
from populora.interact import Budget
from populora.loops.env.presets import preset


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-env-steps", type=int, default=1_950_000)
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    args = parser.parse_args()
    torch.set_num_threads(1)

    p = preset("LunarLanderContinuous-v3")  # ES(sigma=0.1, optimizer="clipup", lr=0.03): max_speed 2 * lr, momentum 0.9
    options = {**p.kwargs, "budget": Budget(max_env_steps=args.max_env_steps)}
    model = p.model()  # nn.Sequential(nn.Linear(8, 2)) at zero: (b, 8) observations -> (b, 2) engine throttles

    start = time.perf_counter()
    policy, history = evolve_with_env(p.env, model, seed=args.seed, progress=not args.quiet, **options)
    seconds = time.perf_counter() - start

    with interact_with_env(p.env, num_envs=16) as interactor:  # fresh episodes (the benchmark's reporting seeds)
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
