"""PopuLoRA by member on 1 and 2 processes (issue 33 item 1): a step's CPU time, and the bytes a step exchanges.

The RL loop (4 teachers + 4 students by default, tiny random Llama, CPU) runs ``--steps`` steps on one process,
then on two gloo processes (``torch.multiprocessing`` spawn, a file store); the first step of each is a warm-up
and is not counted. Per step and rank it records the CPU time (``time.process_time``: this process's user +
system time, what a rank costs whatever else the machine runs), the wall clock, and the payload bytes the rank
put into collectives, by kind (:data:`populora.distributed.members.traffic`). It checks that the two runs
sampled the same token ids, then prints

- ``cpu per rank, 2 ranks / 1``: a rank's CPU per step on two processes over the single process's (ideal 0.5);
- ``cpu of both ranks / 1``: the total work (1.0: partitioning costs nothing extra);
- ``wall, 2 ranks / 1`` (on a machine with spare cores; on a busy shared one it says little);
- bytes per step and rank, by kind (teacher / student reply ids, verdicts, failure flags, replacement parents
  averaged over the steps; a replacement happens every ``interval`` steps).

    python benchmarks/selfplay_dist.py                 # 4 + 4 members, 7 steps
    python benchmarks/selfplay_dist.py --steps 3 --json out.json
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from populora import Population
from populora.distributed import members as pm
from populora.llm import LLAMA_ALL, tiny_chat_model
from populora.loops.selfplay import CPU_PRESET, PopuLoRA
from populora.tasks import Arithmetic


def make(members: int, seed: int = 0) -> PopuLoRA:
    model, tokenizer = tiny_chat_model(seed=0)
    config = CPU_PRESET.replace(
        teachers=members,
        students=members,
        rank=2,
        anchors=1,
        interval=2,
        seed=seed,
        teacher_generate=dict(max_new_tokens=8),
        student_generate=dict(max_new_tokens=6),
    )
    teachers = Population(model, members, 2, list(LLAMA_ALL), seed=seed, init_scale=0.5)
    students = Population(model, members, 2, list(LLAMA_ALL), seed=seed + 1, init_scale=0.5)
    return PopuLoRA(teachers, students, tokenizer, Arithmetic(), config=config)


def run(members: int, steps: int, distributed: bool) -> dict[str, Any]:
    torch.set_num_threads(1)
    loop = make(members)
    cpu, wall, traffic, tokens = [], [], [], []
    for _ in range(steps):
        pm.reset_traffic()
        c0, w0 = time.process_time(), time.perf_counter()
        out = loop.step(distributed=distributed)
        cpu.append(time.process_time() - c0)
        wall.append(time.perf_counter() - w0)
        traffic.append(dict(pm.traffic))
        tokens.append((out.proposal_ids, out.answer_ids))
    return {"cpu": cpu, "wall": wall, "traffic": traffic, "tokens": tokens}


def _worker(rank: int, world: int, store: str, out: str, members: int, steps: int) -> None:
    dist.init_process_group(
        "gloo", init_method=f"file://{store}", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=120)
    )
    torch.save(run(members, steps, True), Path(out) / f"rank{rank}.pt")
    dist.destroy_process_group()


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--members", type=int, default=4, help="members per role")
    parser.add_argument("--steps", type=int, default=7, help="steps per run (the first is a warm-up)")
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    one = run(args.members, args.steps, False)
    with tempfile.TemporaryDirectory() as tmp:
        mp.spawn(_worker, args=(2, f"{tmp}/store", tmp, args.members, args.steps), nprocs=2, join=True)
        ranks = [torch.load(Path(tmp) / f"rank{r}.pt", weights_only=False) for r in range(2)]
    same = all(r["tokens"] == one["tokens"] for r in ranks)
    count = slice(1, None)  # the first step warms up
    med = lambda xs: statistics.median(xs[count])
    cpu1, wall1 = med(one["cpu"]), med(one["wall"])
    cpu2 = [med(r["cpu"]) for r in ranks]
    wall2 = max(med(r["wall"]) for r in ranks)
    kinds = sorted({k for r in ranks for t in r["traffic"] for k in t})
    per_step = {
        f"rank {i}": {k: statistics.mean(t.get(k, 0) for t in r["traffic"][count]) for k in kinds}
        for i, r in enumerate(ranks)
    }
    result = {
        "members per role": args.members,
        "steps counted": args.steps - 1,
        "same token ids on 1 and 2 processes": same,
        "cpu per step, 1 process (s)": cpu1,
        "cpu per step per rank, 2 processes (s)": cpu2,
        "cpu per rank, 2 ranks / 1": [c / cpu1 for c in cpu2],
        "cpu of both ranks / 1": sum(cpu2) / cpu1,
        "wall, 2 ranks / 1": wall2 / wall1,
        "bytes per step sent by each rank, by kind": per_step,
    }
    for key, value in result.items():
        if isinstance(value, dict):
            print(f"{key}:")
            for rank, kinds_ in value.items():
                print(f"  {rank}: " + ", ".join(f"{k} {v:.0f}" for k, v in kinds_.items()))
        elif isinstance(value, list):
            print(f"{key}: " + " / ".join(f"{v:.3f}" for v in value))
        else:
            print(f"{key}: {value:.3f}" if isinstance(value, float) else f"{key}: {value}")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))
    if not same:
        raise SystemExit("the 2-process run sampled other token ids than the 1-process run")
    return result


if __name__ == "__main__":
    main()
