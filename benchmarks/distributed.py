"""Distributed evolution: generations per second with 1 and N processes, and bytes per generation.

An evaluation-bound fitness (``sleep`` per individual, 20 ms by default, plus
one forward of the individual) over ``P = 32`` individuals; one generation is
``evaluate_distributed`` + ``evolve_``. The single-process run happens here;
the N-process run launches this script again through ``torchrun --standalone``
(gloo on CPU). Two model sizes show that the traffic per generation is the
fitness exchange alone (``4 * (P + world)`` bytes: float32 values plus one
failure flag per rank), independent of the model; the weights travel once, at
the first evaluation (adapters broadcast, base model compared by checksum).

    python benchmarks/distributed.py                    # 1 vs 2 processes
    python benchmarks/distributed.py --nproc 4 --generations 10
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import torch
from torch import nn

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from populora import Population, is_main_rank, world_size  # noqa: E402
from populora import distributed as pd  # noqa: E402

MODELS = {  # name -> (input width, hidden width)
    "small": (8, 16),
    "large": (1024, 1024),
}


def build(name: str) -> nn.Module:
    d, h = MODELS[name]
    torch.manual_seed(0)  # the same base model on every rank: no repair needed
    return nn.Sequential(nn.Linear(d, h), nn.ReLU(), nn.Linear(h, h), nn.ReLU(), nn.Linear(h, 1))


def measure(name: str, pop_size: int, generations: int, sleep_s: float) -> dict:
    """Run on this process (and its peers, under torchrun); returns rank 0's numbers."""
    model = build(name)
    pop = Population(model, pop_size=pop_size, low_rank=4, lora_targets=["0", "2", "4"])
    x = torch.randn(1, MODELS[name][0], generator=torch.Generator().manual_seed(1))

    def fitness(population, individuals):
        out = []
        for i in individuals:
            time.sleep(sleep_s)  # the environment
            with torch.no_grad():
                out.append(-population(x, individual=i).square().mean().item())
        return out

    pop.evolve_(pop.evaluate_distributed(fitness))  # warm-up; includes the one-time weight sync
    before = pd.bytes_communicated
    start = time.perf_counter()
    for _ in range(generations):
        pop.evolve_(pop.evaluate_distributed(fitness))
    seconds = time.perf_counter() - start
    return {
        "model": name,
        "params": sum(p.numel() for p in model.parameters()),
        "adapter_bytes": sum(t.numel() * t.element_size() for f in pop.factors() for t in f),
        "world": world_size(),
        "gen_per_s": generations / seconds,
        "bytes_per_gen": (pd.bytes_communicated - before) / generations,
    }


def worker(args: argparse.Namespace) -> None:
    rows = [measure(name, args.pop_size, args.generations, args.sleep) for name in MODELS]
    if is_main_rank():
        print("RESULT " + json.dumps(rows), flush=True)


def launch(args: argparse.Namespace) -> list[dict]:
    torchrun = Path(sys.executable).with_name("torchrun")
    cmd = [str(torchrun)] if torchrun.exists() else [sys.executable, "-m", "torch.distributed.run"]
    cmd += [
        "--standalone",
        f"--nproc-per-node={args.nproc}",
        __file__,
        "--worker",
        f"--pop-size={args.pop_size}",
        f"--generations={args.generations}",
        f"--sleep={args.sleep}",
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        raise SystemExit(f"torchrun failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    line = next(line for line in proc.stdout.splitlines() if line.startswith("RESULT "))
    return json.loads(line[len("RESULT ") :])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pop-size", type=int, default=32)
    parser.add_argument("--generations", type=int, default=5, help="timed generations (after one warm-up)")
    parser.add_argument("--sleep", type=float, default=0.02, help="seconds of 'environment' per individual")
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return worker(args)

    os.environ.pop("WORLD_SIZE", None)  # the single-process run must not try to join a group
    torch.set_num_threads(1)  # as torchrun does for each worker
    single = [measure(name, args.pop_size, args.generations, args.sleep) for name in MODELS]
    multi = launch(args)
    print(
        f"P = {args.pop_size}, {args.sleep * 1e3:.0f} ms per individual, {args.generations} timed generations, "
        f"{os.cpu_count()} CPUs, torch {torch.__version__}\n"
    )
    header = (
        f"{'model':<6} {'base params':>11} {'adapters (B)':>12} | {'gen/s 1 proc':>12} "
        f"{f'gen/s {args.nproc} proc':>12} {'speed-up':>8} | {'bytes/gen':>9} {'4*(P+W)':>7}"
    )
    print(header)
    print("-" * len(header))
    for one, many in zip(single, multi):
        print(
            f"{one['model']:<6} {one['params']:>11,} {one['adapter_bytes']:>12,} | {one['gen_per_s']:>12.2f} "
            f"{many['gen_per_s']:>12.2f} {many['gen_per_s'] / one['gen_per_s']:>7.2f}x | "
            f"{many['bytes_per_gen']:>9.0f} {4 * (args.pop_size + args.nproc):>7}"
        )


if __name__ == "__main__":
    main()
