"""Evolve a Pendulum-v1 swing-up policy with its preset: continuous actions, observation normalisation, to_range.

The settings are ``populora.loops.env.presets.preset("Pendulum-v1")``: EggRoll
ES with ClipUp on a 3-16-1 tanh MLP, 128 members (64 antithetic pairs, rank-2
noise of scale 0.5, ClipUp step 0.15), every member of a generation on the
same start state (``Episodes(seeding="common")``: start states differ by up
to ~1000 in return, which would otherwise rank the start states rather than
the members), observations normalised with running statistics frozen within
a generation. The model ends in ``tanh``; ``EnvOptions(to_range=(-2, 2))``
rescales its output to Pendulum's torque range (the only rescale populora
does, and only when asked). Episodes last 200 steps; the returns are
negative, about -1200 for a random policy and above -200 for a good
swing-up. The run stops at 4.875M env steps (within 5M).

Measured: see the results page (``python benchmarks/envs.py --task pendulum
--seed 0 1 2``, the same settings). The previous ES settings (each antithetic
pair on its own start state) scored -144 on 30 fresh episodes at 4.89M steps
on seed 0 but -730 on seed 1.

Run (about an hour of one CPU core)::

    python examples/pendulum.py --seed 0
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
    parser.add_argument("--max-env-steps", type=int, default=4_875_000)
    parser.add_argument("--generations", type=int, default=100_000, help="at most this many generations")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    args = parser.parse_args()
    torch.set_num_threads(1)

    p = preset("Pendulum-v1")
    options = {**p.kwargs, "num_generations": args.generations, "budget": Budget(max_env_steps=args.max_env_steps)}
    torch.manual_seed(args.seed)
    model = p.model()  # (k, 3) observations -> (k, 1) in (-1, 1), rescaled to the torque range by to_range

    start = time.perf_counter()
    policy, history = evolve_with_env(p.env, model, seed=args.seed, progress=not args.quiet, **options)
    seconds = time.perf_counter() - start

    with interact_with_env(p.env, num_envs=20) as interactor:  # fresh episodes: play()'s reporting seeds
        returns = interactor.play(policy, num_episodes=20, seed=7_000_000 + args.seed, **p.play)
    if is_main_rank():
        first, last = history[0], history[-1]
        print(
            f"seed {args.seed}: {len(history)} generations, {last.env_steps:,} env steps in {seconds:.0f} s; "
            f"training best {first.best:.0f} -> {last.best:.0f} (mean {first.mean:.0f} -> {last.mean:.0f})"
        )
        print(
            f"evolved policy on 20 fresh episodes: mean return {returns.mean():.0f} "
            f"(min {returns.min():.0f}, max {returns.max():.0f}; solved is -200)"
        )


if __name__ == "__main__":
    main()
