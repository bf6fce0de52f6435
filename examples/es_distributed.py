"""Evolution strategies across processes with torchrun: only the fitnesses travel.

Each rank evaluates its slice of the population (one routed forward over its
members), the ``N`` fitnesses are all-gathered, and every rank rebuilds the
same low-rank noise from the shared seed and applies the same update, so the
weights stay bitwise identical without ever being sent (they are checked by
checksum at the first step, and rank 0's are broadcast if ranks differ).

The task: a student MLP learns to imitate a fixed random teacher network.

    torchrun --standalone --nproc-per-node=2 examples/es_distributed.py
    python examples/es_distributed.py                 # the same, in one process
"""

from __future__ import annotations

import argparse
import time

import torch
from torch import nn

from populora import EggrollES, distributed


def mlp(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(16, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 4))


def mse(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """One member's mean squared error (lower is better)."""
    return ((outputs - targets) ** 2).mean()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--pop-size", type=int, default=512)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--sigma", type=float, default=0.01)
    parser.add_argument("--lr", type=float, default=0.01, help="Adam learning rate (cosine-annealed)")
    parser.add_argument("--rank", type=int, default=4)
    args = parser.parse_args()

    teacher = mlp(seed=1)
    student = mlp(seed=2)
    # EggrollES initialises the process group itself when launched by torchrun (gloo on CPU).
    es = EggrollES(
        student,
        args.pop_size,
        args.sigma,
        None,
        args.rank,
        seed=0,
        optimizer=lambda params: torch.optim.Adam(params, lr=args.lr),
    )
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(es.optimizer, T_max=args.steps)
    teacher.to(es.device)
    main_rank = distributed.is_main_rank()
    if main_rank:
        print(
            f"{distributed.world_size()} rank(s), device {es.device}: {args.pop_size} members, "
            f"{len(distributed.partition(args.pop_size))} evaluated on each rank"
        )

    data = torch.Generator().manual_seed(0)  # the same batches on every rank
    x_test = torch.randn(1024, 16, generator=data).to(es.device)
    start, sent = time.perf_counter(), distributed.bytes_communicated
    with torch.no_grad():
        for step in range(1, args.steps + 1):
            x = torch.randn(args.batch, 16, generator=data).to(es.device)
            stats = es.step(x, mse, teacher(x))
            schedule.step()
            if main_rank and (step % 50 == 0 or step == 1):
                test = mse(student(x_test), teacher(x_test)).item()
                print(f"step {step:4d}  mean member loss {-stats.mean:.4f}  test loss {test:.4f}")
    es.check_sync()  # collective: raises on every rank if the weights had drifted apart
    per_generation = (distributed.bytes_communicated - sent) / args.steps
    if main_rank:
        print(
            f"{args.steps} generations in {time.perf_counter() - start:.1f} s; weights identical on every rank; "
            f"{per_generation:.0f} bytes exchanged per generation per rank "
            f"(fitnesses only, for {sum(p.numel() for p in student.parameters())} parameters)"
        )


if __name__ == "__main__":
    main()
