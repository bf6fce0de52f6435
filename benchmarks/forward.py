"""Routed forward vs pure batch inference (the performance contract of DESIGN.md).

For each point of the grid, in one process: time and peak memory of

- ``pure``:  the base model on the same ``n = P*b`` rows (no population),
- ``all``:   ``pop(x, all_individuals=True)``, rows laid out ``(p b)``,
- ``ids``:   ``pop(x, individuals=ids)`` with the same rows shuffled (one id per row),
- ``loop``:  a naive per-individual loop, ``pop(x_i, individual=i)`` for each ``i``.

Outputs are checked to agree before timing. Ratios are to ``pure``. On CPU the
time is the thread's CPU time (robust to other processes on a shared machine).
The methods are timed in turn, one block of calls each per round, and a ratio
is the median over the rounds of the two methods' times in the same round
(a slow spell of a shared machine hits one round's blocks alike).
Points where
the adapters are larger than the base weights (``P*r*(d+e) > d*e``) are marked
``*`` (reported, not judged).

A second table, ``peak memory vs r``, routes ``n = P`` rows with random ids
(many tiny groups: about 1.6 rows per id present, ids missing) and reports the
peak memory of ``pure`` / ``all`` / ``ids`` and the largest single allocation
of ``ids`` for growing ``r``: gathering each group's adapters would be a
per-row copy of the weights (``r`` times the activations); the router
processes the gathered groups in blocks bounded by ``gather_budget``, so the
``ids`` peak stays nearly flat in ``r``. Memory is counted from allocator
events (the torch profiler on CPU, the CUDA allocator's peak on GPU), not RSS.

    python benchmarks/forward.py                 # CPU, 1 thread, full grid
    python benchmarks/forward.py --quick         # a few points
    python benchmarks/forward.py --memory        # only the peak-memory-vs-r table
    python benchmarks/forward.py --device cuda   # bf16, CUDA events, d = 4096
    python benchmarks/forward.py --compile --quick --no-loop   # + torch.compile'd pure / all / ids
    python benchmarks/forward.py --device cuda --pops 8 64 256 --ranks 4 16 --transformer-pops   # a chosen grid

With ``--compile`` (opt-in: compiling each point takes tens of seconds on a
CPU) every point also times ``torch.compile(model)`` (``pure_c``) and
``torch.compile(pop)`` called as above (``all_c``, ``ids_c``), backend
``--compile-backend`` (default ``inductor``), and a second table gives the
compiled ratios to eager ``pure``. The compile itself is not timed.
"""

from __future__ import annotations

import argparse
import json
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
from populora import Population, __version__

RESULTS = Path(__file__).resolve().parent / "results" / __version__  # benchmarks/results/<version>/


class Attention(nn.Module):
    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.heads = heads
        self.q, self.k, self.v, self.o = (nn.Linear(dim, dim) for _ in range(4))

    def forward(self, x):
        b, t, dim = x.shape
        split = lambda y: y.view(b, t, self.heads, dim // self.heads).transpose(1, 2)
        y = nn.functional.scaled_dot_product_attention(
            split(self.q(x)), split(self.k(x)), split(self.v(x)), is_causal=True
        )
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

    def paired(self, fns: dict, min_time: float) -> dict[str, list[float]]:
        """Seconds per call of each of ``fns`` in blocks (each >= 20 ms) taken in turn: round ``i`` times one
        block of every method, so a slow spell of a shared machine hits one round's blocks alike, and a
        ratio is the median of the per-round ratios (:func:`ratio`). At least 7 rounds, filling ``min_time``
        per method."""
        clock = time.perf_counter if self.cuda else time.thread_time
        calls = {}
        for k, fn in fns.items():
            fn()
            calls[k] = 1
            while True:  # calls per block
                start = clock()
                self._block(fn, calls[k])
                if clock() - start >= 0.02 or calls[k] >= 1 << 16:
                    break
                calls[k] *= 2
        blocks: dict[str, list[float]] = {k: [] for k in fns}
        begin = time.perf_counter()
        while time.perf_counter() - begin < min_time * len(fns) or len(blocks["pure"]) < 7:
            for k, fn in fns.items():
                start = clock()
                self._block(fn, calls[k])
                blocks[k].append((clock() - start) / calls[k])
        return blocks

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
    read = lambda key: int(re.search(rf"{key}:\s+(\d+)", Path("/proc/self/status").read_text()).group(1))
    before = read("VmRSS")
    fn()
    return (read("VmHWM") - before) / 1024


def allocated_peak_mb(fn, device: torch.device) -> tuple[float, float]:
    """``(peak, largest)`` MiB allocated by torch during ``fn()`` above the level at its start.

    CPU: replays the allocator events of the torch profiler in time order
    (exact bytes of every tensor, independent of RSS and of other processes);
    the largest single allocation comes from the same events. CUDA: the
    caching allocator's peak (largest allocation not tracked: ``nan``).
    """
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        fn()
        torch.cuda.synchronize()
        return (torch.cuda.max_memory_allocated() - before) / 2**20, float("nan")
    from torch._C._profiler import _EventType

    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    stack, events = list(prof.profiler.kineto_results.experimental_event_tree()), []
    while stack:
        node = stack.pop()
        stack.extend(node.children)
        if node.tag == _EventType.Allocation and node.extra_fields.device.type == "cpu":
            events.append((node.start_time_ns, node.extra_fields.alloc_size))
    held = peak = 0
    for _, size in sorted(events):
        held += size
        peak = max(peak, held)
    return peak / 2**20, max((size for _, size in events), default=0) / 2**20


def memory_vs_rank(device: torch.device, dtype: torch.dtype, timer: Timer, min_time: float, quick: bool) -> None:
    """Peak memory of ``individuals=`` routing over many tiny groups, for growing ``r``."""
    d, P = (1024, 4096) if device.type == "cuda" else (64, 4096)
    ranks = [1, 16] if quick else [1, 4, 16, 64]
    print(
        f"\npeak memory vs r: Linear({d},{d}) GELU Linear({d},{d}), P={P}, n={P} rows with random ids "
        "(many tiny groups)"
    )
    header = f"{'r':>4} {'peak MB pure':>13} {'all':>8} {'ids':>8} {'largest alloc MB (ids)':>23} {'ids/all time':>13}"
    print(header)
    print("-" * len(header))
    for r in ranks:
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(d, d), nn.GELU(), nn.Linear(d, d)).to(device=device, dtype=dtype).eval()
        pop = Population(model, pop_size=P, low_rank=r, device=device, init_scale=0.1)
        x = torch.randn(P, d, device=device, dtype=dtype)
        ids = torch.randint(0, P, (P,), generator=torch.Generator().manual_seed(0))
        fns = {
            "pure": lambda: model(x),
            "all": lambda: pop(x, all_individuals=True),
            "ids": lambda: pop(x, individuals=ids),
        }
        with torch.inference_mode():
            for fn in fns.values():
                fn()  # warm up (and cache the route plan, as a loop over the same ids does)
            mems = {k: allocated_peak_mb(fn, device) for k, fn in fns.items()}
            ratio = timer(fns["ids"], min_time) / timer(fns["all"], min_time)
        print(
            f"{r:>4} {mems['pure'][0]:13.2f} {mems['all'][0]:8.2f} {mems['ids'][0]:8.2f} {mems['ids'][1]:23.2f} "
            f"{ratio:13.3f}",
            flush=True,
        )


def bench_point(label, make_model, make_input, P, r, b, judged, device, dtype, timer, min_time, loop, compile=None):
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
        if compile is not None:
            torch._dynamo.reset()  # each point compiles afresh (no recompile limit carried over)
            cmodel, cpop = torch.compile(model, backend=compile), torch.compile(pop, backend=compile)
            torch.testing.assert_close(cpop(x, all_individuals=True), out_all, rtol=tol, atol=tol)
            torch.testing.assert_close(cpop(x_ids, individuals=ids), out_ids, rtol=tol, atol=tol)
            cmodel(x)
            fns.update(
                {
                    "pure_c": lambda: cmodel(x),
                    "all_c": lambda: cpop(x, all_individuals=True),
                    "ids_c": lambda: cpop(x_ids, individuals=ids),
                }
            )
        if loop:
            chunks = x.view(P, b, *x.shape[1:])
            fns["loop"] = lambda: [pop(chunks[i], individual=i) for i in range(P)]
        blocks = timer.paired(fns, 3 * min_time)
        mems = {k: peak_mb(fn, device) for k, fn in fns.items() if not k.endswith("_c")}
    row = {
        "point": label,
        "judged": judged,
        "n": P * b,
        "rounds": len(blocks["pure"]),
        **{f"t_{k}": statistics.median(v) for k, v in blocks.items()},
        **{f"r_{k}": ratio(blocks, k, "pure") for k in blocks},
        "r_ids_all": ratio(blocks, "ids", "all"),
        **{f"s_{k}": ratio(blocks, k[:-2], k) for k in blocks if k.endswith("_c")},  # eager / compiled
        **{f"m_{k}": v for k, v in mems.items()},
    }
    return row


def ratio(blocks: dict[str, list[float]], a: str, b: str) -> float:
    """Median over the rounds of ``a``'s time per call over ``b``'s in the same round (:meth:`Timer.paired`)."""
    return statistics.median(x / y for x, y in zip(blocks[a], blocks[b]))


def compare(before: str, after: str) -> None:
    """Two runs' ``--json`` side by side (made at the same time, one process each): per point each run's
    ratios to its own ``pure`` and the paired ratio after / before; then the summary figures of each."""
    runs = [{row["point"]: row for row in json.loads(Path(f).read_text())["rows"]} for f in (before, after)]
    labels = [label for label in runs[1] if label in runs[0]]
    geo = lambda xs: math.exp(sum(map(math.log, xs)) / len(xs))
    print(f"before: {before}\nafter:  {after}")
    print(
        "| point | n | pure ms (before / after) | all / pure, before | after | after / before "
        "| ids / pure, before | after | after / before |"
    )
    print("| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for label in labels:
        a, b = runs[0][label], runs[1][label]
        print(
            f"| {label}{'' if b['judged'] else ' *'} | {b['n']} | {a['t_pure'] * 1e3:.3g} / {b['t_pure'] * 1e3:.3g} "
            f"| {a['r_all']:.3f} | {b['r_all']:.3f} | {b['r_all'] / a['r_all']:.3f} "
            f"| {a['r_ids']:.3f} | {b['r_ids']:.3f} | {b['r_ids'] / a['r_ids']:.3f} |"
        )
    print("\n| measure | before | after | paired after / before (geometric mean) |")
    print("| --- | ---: | ---: | ---: |")
    judged = [label for label in labels if runs[1][label]["judged"]]
    for what, chosen, key in (
        ("geometric mean of all / pure, judged points", judged, "r_all"),
        ("geometric mean of all / pure, whole grid", labels, "r_all"),
        ("geometric mean of ids / pure, judged points", judged, "r_ids"),
        ("geometric mean of ids / all, whole grid", labels, "r_ids_all"),
    ):
        vals = [[run[label][key] for label in chosen] for run in runs]
        paired = geo([y / x for x, y in zip(*vals)])
        print(f"| {what} | {geo(vals[0]):.3f} | {geo(vals[1]):.3f} | {paired:.3f} |")
    for run, name in zip(runs, ("before", "after")):
        worst = max(judged, key=lambda label: run[label]["r_all"])
        print(f"| worst judged all / pure, {name} | {worst} | {run[worst]['r_all']:.3f} | |")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=1, help="CPU threads (torch.set_num_threads)")
    parser.add_argument("--quick", action="store_true", help="a few points only")
    parser.add_argument("--min-time", type=float, default=0.2, help="seconds of timing per method and round")
    parser.add_argument("--no-loop", action="store_true", help="skip the naive per-individual loop")
    parser.add_argument("--memory", action="store_true", help="only the peak-memory-vs-r table")
    parser.add_argument("--compile", action="store_true", help="also time torch.compile'd pure / all / ids")
    parser.add_argument("--compile-backend", default="inductor", help="torch.compile backend (with --compile)")
    parser.add_argument("--match", default="", help="only the points whose label matches this regex")
    parser.add_argument("--skip-memory", action="store_true", help="skip the peak-memory-vs-r table")
    parser.add_argument(
        "--json",
        nargs="?",
        const=str(RESULTS / "forward.json"),
        default=None,
        help="also write every point's figures here, rewritten per point "
        "(--json alone: benchmarks/results/<version>/forward.json)",
    )
    parser.add_argument(
        "--resume", action="store_true", help="with --json: keep the points that file holds, measure the others"
    )
    parser.add_argument(
        "--compare",
        nargs=2,
        metavar=("BEFORE", "AFTER"),
        help="print the two --json files of runs made side by side, point by point, and exit",
    )
    parser.add_argument("--dims", type=int, nargs="+", help="MLP widths d (default: 256 1024; 4096 on CUDA)")
    parser.add_argument("--ranks", type=int, nargs="+", help="adapter ranks (default: 1 4 16)")
    parser.add_argument("--pops", type=int, nargs="+", help="population sizes P of the MLP points (default: 16 256)")
    parser.add_argument("--rows", type=int, nargs="+", help="rows b per individual (default: 1 16)")
    parser.add_argument(
        "--transformer-pops", type=int, nargs="*", help="P of the transformer points (default: 8 64; none: skip)"
    )
    args = parser.parse_args()
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    if args.compare:
        compare(*args.compare)
        return
    device = torch.device(args.device)
    torch.set_num_threads(args.threads)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    timer = Timer(device)
    if args.memory:
        print(f"device={device} dtype={dtype} threads={torch.get_num_threads()} torch={torch.__version__}")
        memory_vs_rank(device, dtype, timer, args.min_time, args.quick)
        return

    points = []
    dims = [4096] if device.type == "cuda" else [256, 1024]
    ranks, pops, bs = [1, 4, 16], [16, 256], [1, 16]
    if args.quick:
        dims, ranks, pops, bs = dims[:1], [4], [16, 256], [1, 16]
    dims, ranks = args.dims or dims, args.ranks or ranks
    pops, bs = args.pops or pops, args.rows or bs
    for d in dims:
        for r in ranks:
            for P in pops:
                for b in bs:
                    judged = P * r * (d + 4 * d) <= d * 4 * d
                    points.append(
                        (
                            f"mlp d={d} r={r} P={P} b={b}",
                            lambda d=d: mlp(d),
                            lambda n, d=d: torch.randn(n, d),
                            P,
                            r,
                            b,
                            judged,
                        )
                    )
    tdim = 1024 if device.type == "cuda" else 256
    tpops = [8] if args.quick else [8, 64]
    for P in tpops if args.transformer_pops is None else args.transformer_pops:
        judged = P * 4 * (2 * tdim) <= tdim * tdim
        points.append(
            (
                f"transformer dim={tdim} seq=32 P={P} b=4 r=4",
                lambda: transformer(tdim),
                lambda n: torch.randn(n, 32, tdim),
                P,
                4,
                4,
                judged,
            )
        )

    points = [p for p in points if re.search(args.match, p[0])]
    print(f"device={device} dtype={dtype} threads={torch.get_num_threads()} torch={torch.__version__}")
    header = (
        f"{'point':<42} {'n':>5} {'pure ms':>9} {'all/pure':>9} {'ids/pure':>9} {'ids/all':>8} {'loop/pure':>10} "
        f"{'rows/s (all)':>13} {'peak MB pure/all/ids':>22}"
    )
    print(header)
    print("-" * len(header))
    rows = []
    done = {}
    if args.resume and args.json and Path(args.json).exists():
        done = {row["point"]: row for row in json.loads(Path(args.json).read_text())["rows"]}
    for label, make_model, make_input, P, r, b, judged in points:
        if label in done:  # measured by an earlier, stopped run
            rows.append(done[label])
            print(f"{label + ('' if judged else ' *'):<42} (kept from {args.json})", flush=True)
            continue
        row = bench_point(
            label,
            make_model,
            make_input,
            P,
            r,
            b,
            judged,
            device,
            dtype,
            timer,
            args.min_time,
            loop=not args.no_loop,
            compile=args.compile_backend if args.compile else None,
        )
        rows.append(row)
        if args.json:  # rewritten after every point: a stopped run keeps what it measured
            Path(args.json).write_text(
                json.dumps({"populora": __version__, "device": str(device), "torch": torch.__version__, "rows": rows})
            )
        loop = f"{row['r_loop']:10.2f}" if "r_loop" in row else f"{'-':>10}"
        mark = "" if judged else " *"
        print(
            f"{label + mark:<42} {row['n']:>5} {row['t_pure'] * 1e3:9.3f} {row['r_all']:9.3f} "
            f"{row['r_ids']:9.3f} {row['r_ids_all']:8.3f} {loop} "
            f"{row['n'] / row['t_all']:13.0f} {row['m_pure']:6.1f}/{row['m_all']:6.1f}/{row['m_ids']:6.1f}",
            flush=True,
        )

    geo = lambda xs: math.exp(sum(map(math.log, xs)) / len(xs))
    all_r = [r["r_all"] for r in rows]
    ids_r = [r["r_ids"] for r in rows]
    judged_all = [x for x, r in zip(all_r, rows) if r["judged"]]
    judged_ids = [x for x, r in zip(ids_r, rows) if r["judged"]]
    print("-" * len(header))
    print(f"geometric mean all/pure {geo(all_r):.3f}   ids/pure {geo(ids_r):.3f}   (target <= 1.10 on CPU)")
    print(
        f"worst judged   all/pure {max(judged_all):.3f}   ids/pure {max(judged_ids):.3f}   (target <= 1.30; "
        f"* = adapters larger than base weights, not judged)"
    )
    print(f"geometric mean ids/all  {geo([r['r_ids_all'] for r in rows]):.3f}   (target <= 1.10)")
    if judged_all:
        print(
            f"geometric mean over the judged points: all/pure {geo(judged_all):.3f}   ids/pure {geo(judged_ids):.3f}"
            f"   (target <= 1.05)"
        )
    if args.compile:
        print(f"\ntorch.compile (backend {args.compile_backend}): ratios to eager pure; speed-up = eager / compiled")
        head = (
            f"{'point':<42} {'pure_c/pure':>12} {'all_c/pure':>11} {'ids_c/pure':>11} {'all speed-up':>13} "
            f"{'ids speed-up':>13}"
        )
        print(head)
        print("-" * len(head))
        for row in rows:
            print(
                f"{row['point'] + ('' if row['judged'] else ' *'):<42} {row['r_pure_c']:12.3f} "
                f"{row['r_all_c']:11.3f} {row['r_ids_c']:11.3f} {row['s_all_c']:13.3f} "
                f"{row['s_ids_c']:13.3f}",
                flush=True,
            )
        print(
            f"geometric mean speed-up  all {geo([r['s_all_c'] for r in rows]):.3f}   "
            f"ids {geo([r['s_ids_c'] for r in rows]):.3f}"
        )
    if not args.skip_memory:
        memory_vs_rank(device, dtype, timer, args.min_time, args.quick)


if __name__ == "__main__":
    main()
