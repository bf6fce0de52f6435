"""Routed forward vs pure batch inference (the performance contract of DESIGN.md).

For each point of the grid, in one process: time and peak memory of

- ``pure``:  the base model on the same ``n = P*b`` rows (no population),
- ``all``:   ``pop(x, all_individuals=True)``, rows laid out ``(p b)``,
- ``ids``:   ``pop(x, individuals=ids)`` with the same rows shuffled (one id per row),
- ``loop``:  a naive per-individual loop, ``pop(x_i, individual=i)`` for each ``i``.

Outputs are checked to agree before timing. Ratios are to ``pure``. On CPU the
time is the thread's CPU time (robust to other processes on a shared machine).
Points where
the adapters are larger than the base weights (``P*r*(d+e) > d*e``) are marked
``*`` (reported, not judged).

    python benchmarks/forward.py                 # CPU, 1 thread, full grid
    python benchmarks/forward.py --quick         # a few points
    python benchmarks/forward.py --device cuda   # bf16, CUDA events, d = 4096
"""

from __future__ import annotations

import argparse
import math
import os
import re
import statistics
import sys
import time
from pathlib import Path

if "MALLOC_MMAP_THRESHOLD_" not in os.environ:  # glibc reads it at start-up: re-exec with it set, so that
    os.environ["MALLOC_MMAP_THRESHOLD_"] = "65536"  # buffers >= 64 KiB are unmapped on free and RSS tracks them
    os.execv(sys.executable, [sys.executable, *sys.argv])

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from populora import Population  # noqa: E402


class Attention(nn.Module):
    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.heads = heads
        self.q, self.k, self.v, self.o = (nn.Linear(dim, dim) for _ in range(4))

    def forward(self, x):
        b, t, dim = x.shape
        split = lambda y: y.view(b, t, self.heads, dim // self.heads).transpose(1, 2)  # noqa: E731
        y = nn.functional.scaled_dot_product_attention(split(self.q(x)), split(self.k(x)), split(self.v(x)), is_causal=True)
        return self.o(y.transpose(1, 2).reshape(b, t, dim))


class Block(nn.Module):
    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.attn = Attention(dim, heads)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


def mlp(d: int) -> nn.Module:
    return nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))


def transformer(dim: int, depth: int = 4, heads: int = 4) -> nn.Module:
    return nn.Sequential(*(Block(dim, heads) for _ in range(depth)))


class Timer:
    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"

    def __call__(self, fn, min_time: float) -> float:
        """Median seconds per call over blocks of calls (each block >= 20 ms) filling ``min_time``."""
        fn()
        if self.cuda:
            torch.cuda.synchronize()
        clock = time.perf_counter if self.cuda else time.thread_time  # CPU: this thread's CPU time
        calls = 1
        while True:  # calls per block
            start = clock()
            self._block(fn, calls)
            if clock() - start >= 0.02 or calls >= 1 << 16:
                break
            calls *= 2
        blocks: list[float] = []
        begin = time.perf_counter()
        while time.perf_counter() - begin < min_time or len(blocks) < 5:
            start = clock()
            self._block(fn, calls)
            blocks.append((clock() - start) / calls)
        return statistics.median(blocks)

    def _block(self, fn, calls: int) -> None:
        for _ in range(calls):
            fn()
        if self.cuda:
            torch.cuda.synchronize()


def peak_mb(fn, device: torch.device) -> float:
    """Peak memory above the level before the call (CUDA allocator, or peak RSS on CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        fn()
        torch.cuda.synchronize()
        return (torch.cuda.max_memory_allocated() - before) / 2**20
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # reset the peak-RSS watermark
    except OSError:
        return float("nan")
    read = lambda key: int(re.search(rf"{key}:\s+(\d+)", Path("/proc/self/status").read_text()).group(1))  # noqa: E731
    before = read("VmRSS")
    fn()
    return (read("VmHWM") - before) / 1024


def bench_point(label, make_model, make_input, P, r, b, judged, device, dtype, timer, min_time, loop):
    torch.manual_seed(0)
    model = make_model().to(device=device, dtype=dtype).eval()
    pop = Population(model, pop_size=P, low_rank=r, device=device, init_scale=0.1)
    x = make_input(P * b).to(device)
    if x.is_floating_point():
        x = x.to(dtype)
    gen = torch.Generator().manual_seed(0)
    shuffle = torch.randperm(P * b, generator=gen).to(device)
    x_ids, ids = x[shuffle], shuffle // b  # the same rows and owners as `all`, in random order

    with torch.inference_mode():
        out_all = pop(x, all_individuals=True)
        out_ids = pop(x_ids, individuals=ids)
        tol = 1e-4 if dtype == torch.float32 else 3e-2
        torch.testing.assert_close(out_ids[torch.argsort(shuffle)], out_all, rtol=tol, atol=tol)
        ref = torch.cat([pop(x[i * b : (i + 1) * b], individual=i) for i in range(min(P, 4))])
        torch.testing.assert_close(ref, out_all[: len(ref)], rtol=tol, atol=tol)

        fns = {
            "pure": lambda: model(x),
            "all": lambda: pop(x, all_individuals=True),
            "ids": lambda: pop(x_ids, individuals=ids),
        }
        if loop:
            chunks = x.view(P, b, *x.shape[1:])
            fns["loop"] = lambda: [pop(chunks[i], individual=i) for i in range(P)]
        times = {k: float("inf") for k in fns}
        for _ in range(3):  # interleave methods so drift hits them alike; keep the best median
            for k, fn in fns.items():
                times[k] = min(times[k], timer(fn, min_time))
        mems = {k: peak_mb(fn, device) for k, fn in fns.items()}
    row = {"point": label, "judged": judged, "n": P * b, **{f"t_{k}": v for k, v in times.items()},
           **{f"m_{k}": v for k, v in mems.items()}}
    return row


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=1, help="CPU threads (torch.set_num_threads)")
    parser.add_argument("--quick", action="store_true", help="a few points only")
    parser.add_argument("--min-time", type=float, default=0.2, help="seconds of timing per method and round")
    parser.add_argument("--no-loop", action="store_true", help="skip the naive per-individual loop")
    args = parser.parse_args()
    device = torch.device(args.device)
    torch.set_num_threads(args.threads)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    timer = Timer(device)

    points = []
    dims = [4096] if device.type == "cuda" else [256, 1024]
    ranks, pops, bs = [1, 4, 16], [16, 256], [1, 16]
    if args.quick:
        dims, ranks, pops, bs = dims[:1], [4], [16, 256], [1, 16]
    for d in dims:
        for r in ranks:
            for P in pops:
                for b in bs:
                    judged = P * r * (d + 4 * d) <= d * 4 * d
                    points.append((f"mlp d={d} r={r} P={P} b={b}", lambda d=d: mlp(d), lambda n, d=d: torch.randn(n, d),
                                   P, r, b, judged))
    tdim = 1024 if device.type == "cuda" else 256
    for P in ([8] if args.quick else [8, 64]):
        judged = P * 4 * (2 * tdim) <= tdim * tdim
        points.append((f"transformer dim={tdim} seq=32 P={P} b=4 r=4", lambda: transformer(tdim),
                       lambda n: torch.randn(n, 32, tdim), P, 4, 4, judged))

    print(f"device={device} dtype={dtype} threads={torch.get_num_threads()} torch={torch.__version__}")
    header = (f"{'point':<42} {'n':>5} {'pure ms':>9} {'all/pure':>9} {'ids/pure':>9} {'ids/all':>8} {'loop/pure':>10} "
              f"{'rows/s (all)':>13} {'peak MB pure/all/ids':>22}")
    print(header)
    print("-" * len(header))
    rows = []
    for label, make_model, make_input, P, r, b, judged in points:
        row = bench_point(label, make_model, make_input, P, r, b, judged, device, dtype, timer, args.min_time,
                          loop=not args.no_loop)
        rows.append(row)
        loop = f"{row['t_loop'] / row['t_pure']:10.2f}" if "t_loop" in row else f"{'-':>10}"
        mark = "" if judged else " *"
        print(f"{label + mark:<42} {row['n']:>5} {row['t_pure'] * 1e3:9.3f} {row['t_all'] / row['t_pure']:9.3f} "
              f"{row['t_ids'] / row['t_pure']:9.3f} {row['t_ids'] / row['t_all']:8.3f} {loop} "
              f"{row['n'] / row['t_all']:13.0f} {row['m_pure']:6.1f}/{row['m_all']:6.1f}/{row['m_ids']:6.1f}", flush=True)

    geo = lambda xs: math.exp(sum(map(math.log, xs)) / len(xs))  # noqa: E731
    all_r = [r["t_all"] / r["t_pure"] for r in rows]
    ids_r = [r["t_ids"] / r["t_pure"] for r in rows]
    judged_all = [x for x, r in zip(all_r, rows) if r["judged"]]
    judged_ids = [x for x, r in zip(ids_r, rows) if r["judged"]]
    print("-" * len(header))
    print(f"geometric mean all/pure {geo(all_r):.3f}   ids/pure {geo(ids_r):.3f}   (target <= 1.10 on CPU)")
    print(f"worst judged   all/pure {max(judged_all):.3f}   ids/pure {max(judged_ids):.3f}   (target <= 1.30; "
          f"* = adapters larger than base weights, not judged)")
    print(f"geometric mean ids/all  {geo([i / a for i, a in zip(ids_r, all_r)]):.3f}   (target <= 1.10)")


if __name__ == "__main__":
    main()
