"""One ES step (forward + fitness + update): populora vs torcheggroll 0.2.0 vs plain inference.

Model ``Linear(256, 1024) - ReLU - Linear(1024, 256)``, batch ``b = 64`` rows,
rank 4, MSE loss (fitness = -loss), for ``N`` in {32, 128, 512, 1024, 2048}:

- ``plain``:  the model on the same ``N*b`` rows, one forward (no ES at all),
- ``plain_rows``: ``plain`` in chunks of ``--max-rows`` rows (cache-sized chunks are faster on CPU),
- ``ours``:   ``EggrollES.step(x, mse, y)``, every member on the shared batch ``(b, 256)``,
- ``ours_pm``: ``EggrollES.step(xs, mse, ys, per_individual=True)``, member ``i`` on its own ``(b, 256)`` rows,
- ``ours_rows``: ``ours`` with ``max_rows=--max-rows`` (members evaluated in chunks: bounded memory),
- ``ours_pm_rows``: ``ours_pm`` with ``max_rows=--max-rows``,
- ``ours_fb``: ``ours`` on the same model with a bare per-feature gain ``nn.Parameter`` (1024,) after the
  first layer, evolved too (``perturb_unroutable=True``): the ``functional_call`` + ``vmap`` fallback
  path, whose cost is what ``EggrollES`` avoids by freezing such parameters by default,
- ``tegg``:   ``torcheggroll.TorchEggrollES.step(x, mse, y)`` (shared batch), when importable.

Every measurement runs in a fresh subprocess (so peak memory is that
process's own, read as the peak-RSS watermark above the level before the
steps; with ``MALLOC_MMAP_THRESHOLD_=65536`` so freed buffers leave RSS),
and the methods are interleaved over ``--repeats`` rounds; the table keeps
each method's best median step time. torcheggroll is never a dependency:
point ``--torcheggroll-python`` at an interpreter that has it (e.g. a
scratch venv: ``python3 -m venv /tmp/tegg && /tmp/tegg/bin/pip install
torch==2.13.0 torcheggroll==0.2.0``); its worker imports only torch and torcheggroll.

    python benchmarks/es.py                                        # CPU, 1 thread, ours vs plain
    python benchmarks/es.py --torcheggroll-python /tmp/tegg/bin/python
    python benchmarks/es.py --device cuda                          # CUDA events, allocator peak
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
METHODS = ("plain", "plain_rows", "ours", "ours_pm", "ours_rows", "ours_pm_rows", "ours_fb", "tegg")
BASELINE = {"ours": "plain", "ours_pm": "plain", "ours_rows": "plain_rows", "ours_pm_rows": "plain_rows",
            "ours_fb": "plain", "tegg": "plain"}


# ------------------------------------------------------------------------------------------------ worker


def _peak_tracker(device):
    """``(reset, read)``: reset the peak watermark; read MB above the level at reset."""
    import torch

    if device.type == "cuda":
        state = {}

        def reset():
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            state["before"] = torch.cuda.memory_allocated()

        def read():
            torch.cuda.synchronize()
            return (torch.cuda.max_memory_allocated() - state["before"]) / 2**20

        return reset, read

    status = Path("/proc/self/status")
    field = lambda key: int(re.search(rf"{key}:\s+(\d+)", status.read_text()).group(1))
    state = {}

    def reset():
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # reset the peak-RSS watermark to the current RSS
        state["before"] = field("VmRSS")

    def read():
        return (field("VmHWM") - state["before"]) / 1024

    return reset, read


def worker(method: str, pop: int, device_name: str, threads: int, min_time: float, max_rows: int) -> dict:
    import torch
    from torch import nn

    torch.set_num_threads(threads)
    device = torch.device(device_name)
    dtype = torch.float32
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(256, 1024), nn.ReLU(), nn.Linear(1024, 256)).to(device, dtype)
    b = 64
    gen = torch.Generator().manual_seed(0)
    x, y = torch.randn(b, 256, generator=gen).to(device), torch.randn(b, 256, generator=gen).to(device)

    def mse(out, target):
        return ((out - target) ** 2).mean()

    if method == "plain":
        rows = x.repeat(pop, 1)  # the same N*b rows the ES forward runs

        def step():
            with torch.no_grad():
                model(rows)
    elif method == "plain_rows":
        rows = x.repeat(pop, 1)

        def step():
            with torch.no_grad():
                for start in range(0, len(rows), max_rows):
                    model(rows[start : start + max_rows])
    elif method == "tegg":
        from torcheggroll import TorchEggrollES

        es = TorchEggrollES(model, pop_size=pop, sigma=0.02, lr=0.05, rank=4, device=device)

        def step():
            es.step(x, mse, y)
    else:
        sys.path.insert(0, str(REPO))
        from populora import EggrollES

        if method == "ours_fb":

            class Gain(nn.Module):  # a bare parameter in an expression: unroutable
                def __init__(self, size: int):
                    super().__init__()
                    self.gain = nn.Parameter(torch.ones(size))

                def forward(self, h):
                    return h * self.gain

            model = nn.Sequential(model[0], Gain(1024), model[1], model[2]).to(device, dtype)
        es = EggrollES(model, pop, 0.02, 0.05, 4, device=device, perturb_unroutable=method == "ours_fb")
        if method in ("ours_pm", "ours_pm_rows"):
            xs = torch.randn(pop, b, 256, generator=gen).to(device)
            ys = torch.randn(pop, b, 256, generator=gen).to(device)
            chunk = max_rows if method == "ours_pm_rows" else None

            def step():
                es.step(xs, mse, ys, per_individual=True, max_rows=chunk)
        elif method == "ours_rows":

            def step():
                es.step(x, mse, y, max_rows=max_rows)
        else:

            def step():
                es.step(x, mse, y)

    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    step()  # warm-up (allocator, vmap tracing, lazy init)
    sync()
    reset, read = _peak_tracker(device)
    reset()
    times: list[float] = []
    start = time.perf_counter()
    while len(times) < 2 or (time.perf_counter() - start < min_time and len(times) < 50):
        t0 = time.perf_counter()
        step()
        sync()
        times.append(time.perf_counter() - t0)
    return {"method": method, "pop": pop, "seconds": statistics.median(times), "steps": len(times), "peak_mb": read()}


# ------------------------------------------------------------------------------------------------ driver


def run_one(python: str, method: str, pop: int, args: argparse.Namespace) -> dict | None:
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="65536", OMP_NUM_THREADS=str(args.threads),
               PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH", "")])))
    cmd = [python, str(Path(__file__).resolve()), "--worker", method, "--pop", str(pop), "--device", args.device,
           "--threads", str(args.threads), "--min-time", str(args.min_time), "--max-rows", str(args.max_rows)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=args.timeout)
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["(no output)"]
        print(f"  {method} N={pop}: failed (exit {proc.returncode}): {tail[0]}", file=sys.stderr)
        return None
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads per process")
    parser.add_argument("--pops", default="32,128,512,1024,2048")
    parser.add_argument("--repeats", type=int, default=3, help="interleaved rounds; the best median is kept")
    parser.add_argument("--min-time", type=float, default=1.0, help="seconds of timed steps per measurement")
    parser.add_argument("--torcheggroll-python", default=None,
                        help="interpreter with torcheggroll installed (default: this one, if it has it)")
    parser.add_argument("--tegg-max-pop", type=int, default=2048, help="skip torcheggroll above this N (memory)")
    parser.add_argument("--max-rows", type=int, default=2048, help="rows per forward of the *_rows methods")
    parser.add_argument("--timeout", type=float, default=1800)
    parser.add_argument("--worker", choices=METHODS, help=argparse.SUPPRESS)
    parser.add_argument("--pop", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.worker:
        print(json.dumps(worker(args.worker, args.pop, args.device, args.threads, args.min_time, args.max_rows)))
        return

    pops = [int(p) for p in args.pops.split(",")]
    tegg_python = args.torcheggroll_python or sys.executable
    has_tegg = subprocess.run([tegg_python, "-c", "import torcheggroll"], capture_output=True).returncode == 0
    methods = [m for m in METHODS if m != "tegg" or has_tegg]
    print(f"device={args.device} threads={args.threads} pops={pops} repeats={args.repeats} "
          f"torcheggroll={'yes (' + tegg_python + ')' if has_tegg else 'not importable: skipped'}", flush=True)

    best: dict[tuple[str, int], dict] = {}
    for round_ in range(args.repeats):
        for pop in pops:
            for method in methods:
                if method == "tegg" and pop > args.tegg_max_pop:
                    continue
                if method == "tegg" and round_ > 0 and (method, pop) in best and best[method, pop]["seconds"] > 30:
                    continue  # one round of a >30 s step is enough
                res = run_one(tegg_python if method == "tegg" else sys.executable, method, pop, args)
                if res is None:
                    continue
                key = (method, pop)
                if key not in best or res["seconds"] < best[key]["seconds"]:
                    best[key] = {**res, "peak_mb": max(res["peak_mb"], best.get(key, res)["peak_mb"])}
                print(f"  round {round_ + 1} {method:8s} N={pop:5d}: {res['seconds'] * 1e3:9.1f} ms/step, "
                      f"peak {res['peak_mb']:8.1f} MB", flush=True)

    def cell(method, pop, key, fmt):
        r = best.get((method, pop))
        return format(r[key] * (1e3 if key == "seconds" else 1), fmt) if r else "-"

    def ratio(a, b, pop, key):
        ra, rb = best.get((a, pop)), best.get((b, pop))
        return f"{ra[key] / rb[key]:.2f}" if ra and rb and rb[key] > 0 else "-"

    cols = [m for m in METHODS if any((m, p) in best for p in pops)]
    print()
    print(f"| N | {' | '.join(f'{m} ms' for m in cols)} | "
          + " | ".join(f"{m} thr" for m in cols if m in BASELINE)
          + (" | tegg/ours time" if "tegg" in cols else "")
          + f" | {' | '.join(f'{m} MB' for m in cols)}"
          + (" | tegg/ours mem | tegg/ours_rows mem" if "tegg" in cols else "") + " |")
    ncols = 1 + 2 * len(cols) + sum(m in BASELINE for m in cols) + (3 if "tegg" in cols else 0)
    print("|---:" * ncols + "|")
    for pop in pops:
        row = [str(pop)] + [cell(m, pop, "seconds", ".1f") for m in cols]
        row += [ratio(BASELINE[m], m, pop, "seconds") for m in cols if m in BASELINE]
        if "tegg" in cols:
            row.append(ratio("tegg", "ours", pop, "seconds"))
        row += [cell(m, pop, "peak_mb", ".0f") for m in cols]
        if "tegg" in cols:
            row += [ratio("tegg", "ours", pop, "peak_mb"), ratio("tegg", "ours_rows", pop, "peak_mb")]
        print("| " + " | ".join(row) + " |")
    print("\nthr = throughput of the ES step relative to plain inference of the same N*b rows (time plain / time "
          "method; the *_rows methods against plain_rows, chunked alike); tegg/ours = how many times more time / "
          "memory torcheggroll 0.2.0 needs than populora.")

if __name__ == "__main__":
    main()
