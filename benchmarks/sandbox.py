"""Sandbox throughput: benign programs per second, 0.5.0's sandbox and this one side by side.

Each program is one of the code tasks' generated functions (a chain of 1 .. 5 steps over a list,
a string or an int) with one input; every run is a fresh child with the full confinement this
machine allows (printed as the guards). The two sandboxes run the same batch in alternating rounds
in one process, so that a busy machine slows both alike; printed: programs/s of each at every
worker count, the ratio new / 0.5.0 (target >= 0.80) and how many runs were not ``ok`` (0
expected). 0.5.0 is read from a checkout of commit 1496bc6 (``--old PATH``, default
``/tmp/v050_sb``: ``git worktree add /tmp/v050_sb 1496bc6``); without one only the new figures are
printed. Not a test.

    python benchmarks/sandbox.py                  # 300 programs, 1 and 2 workers, 3 rounds
    python benchmarks/sandbox.py 200 1,2,4 5      # count, worker counts, rounds
    python benchmarks/sandbox.py 300 2 3 --no-net # without the network namespace
"""

from __future__ import annotations

import collections
import importlib.util
import os
import sys
import time
from typing import Any

import torch

from populora.tasks.base import randint
from populora.tasks.code import _generate
from populora.tasks.sandbox import Job, Limits, Sandbox


def jobs(count: int, seed: int = 0) -> list[tuple[str, str]]:
    generator = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(count):
        program = _generate(generator, randint(generator, 1, 5))
        out.append((program.source, program.draw_input(generator)))
    return out


def load_old(path: str) -> Any:
    """0.5.0's sandbox module, loaded from its file under another name (it imports only populora.checks
    and populora.errors, which are unchanged)."""
    file = os.path.join(path, "populora", "tasks", "sandbox.py")
    if not os.path.exists(file):
        return None
    spec = importlib.util.spec_from_file_location("populora_050_sandbox", file)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def measure(module: Any, batch: list[tuple[str, str]], workers: int, cut_network: bool) -> tuple[float, Any, Any]:
    box = module.Sandbox(module.Limits(cpu_s=1.0, wall_s=10.0), workers=workers, cut_network=cut_network)
    runs = [module.Job(source, (text,)) for source, text in batch]
    start = time.perf_counter()
    results = box.run_many(runs)
    elapsed = time.perf_counter() - start
    return len(batch) / elapsed, collections.Counter(r.status for r in results), results[0].guards


def main(count: int, workers: list[int], rounds: int, cut_network: bool, old_path: str) -> None:
    batch = jobs(count)
    old = load_old(old_path)
    new = sys.modules["populora.tasks.sandbox"]
    assert new.Sandbox is Sandbox and new.Job is Job and new.Limits is Limits
    print(f"{count} programs, {os.cpu_count()} CPUs, python {sys.version.split()[0]}, uid {os.geteuid()}")
    print(f"0.5.0 from {old_path}" if old is not None else f"no 0.5.0 checkout at {old_path}: new figures only")
    for w in workers:
        rates: dict[str, list[float]] = {"0.5.0": [], "new": []}
        for _ in range(rounds):
            for name, module in (("0.5.0", old), ("new", new)):
                if module is None:
                    continue
                rate, statuses, guards = measure(module, batch, w, cut_network)
                rates[name].append(rate)
                bad = count - statuses["ok"]
                print(f"  workers={w} {name:5}: {rate:6.1f} programs/s; not ok {bad}; guards {guards}")
        line = f"workers={w}: new {max(rates['new']):6.1f} programs/s (best of {rounds})"
        if rates["0.5.0"]:
            ratio = max(rates["new"]) / max(rates["0.5.0"])
            line += f", 0.5.0 {max(rates['0.5.0']):6.1f}: ratio {ratio:.2f} (target >= 0.80)"
        print(line)


if __name__ == "__main__":
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    old_path = next((a.split("=", 1)[1] for a in sys.argv[1:] if a.startswith("--old=")), "/tmp/v050_sb")
    main(
        int(args[0]) if args else 300,
        [int(w) for w in args[1].split(",")] if len(args) > 1 else [1, 2],
        int(args[2]) if len(args) > 2 else 3,
        "--no-net" not in sys.argv,
        old_path,
    )
