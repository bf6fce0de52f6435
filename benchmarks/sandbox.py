"""Sandbox throughput: programs per second on 1,000 benign generated code-task programs.

Each program is one of the code tasks' generated functions (a chain of 1 .. 5 steps over a list,
a string or an int) with one input; every run is a fresh child interpreter with the full
confinement this machine allows (printed as the guards). Printed: programs/s run one at a time and
``workers`` at a time, the mean CPU seconds per child, and how many runs were not ``ok`` (0
expected). Not a test.

    python benchmarks/sandbox.py                 # 1,000 programs, serial and 2 workers
    python benchmarks/sandbox.py 200 1,2,4       # any count and list of worker counts
    python benchmarks/sandbox.py 1000 2 --no-net # without the network namespace
"""

from __future__ import annotations

import collections
import os
import sys
import time

import torch

from populora.tasks.base import randint
from populora.tasks.code import _generate
from populora.tasks.sandbox import Job, Limits, Sandbox


def jobs(count: int, seed: int = 0) -> list[Job]:
    generator = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(count):
        program = _generate(generator, randint(generator, 1, 5))
        out.append(Job(program.source, (program.draw_input(generator),)))
    return out


def main(count: int, workers: list[int], cut_network: bool) -> None:
    batch = jobs(count)
    print(f"{count} programs, {os.cpu_count()} CPUs, python {sys.version.split()[0]}, uid {os.geteuid()}")
    for w in workers:
        box = Sandbox(Limits(cpu_s=1.0, wall_s=10.0), workers=w, cut_network=cut_network)
        start = time.perf_counter()
        results = box.run_many(batch)
        elapsed = time.perf_counter() - start
        statuses = collections.Counter(r.status for r in results)
        cpu = sum(r.cpu_s for r in results) / len(results)
        print(
            f"workers={w}: {count / elapsed:6.1f} programs/s  ({elapsed:6.1f} s; CPU {1000 * cpu:5.1f} ms per child; "
            f"not ok: {count - statuses['ok']} {dict(statuses)}; guards {results[0].guards})"
        )


if __name__ == "__main__":
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    main(
        int(args[0]) if args else 1000,
        [int(w) for w in args[1].split(",")] if len(args) > 1 else [1, 2],
        "--no-net" not in sys.argv,
    )
