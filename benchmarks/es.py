"""One ES step (forward + fitness + update): populora vs torcheggroll 0.2.0 vs plain inference.

Model ``Linear(256, 1024) - ReLU - Linear(1024, 256)``, batch ``b = 64`` rows,
rank 4, MSE loss (fitness = -loss), for ``N`` in {32, 128, 512, 1024, 2048}:

- ``plain``:  the model on the same ``N*b`` rows, one forward (no ES at all),
- ``plain_loss``: ``plain`` plus the same MSE per member (``torch.func.vmap`` over the ``(N, b, 256)``
  outputs, as the ES evaluates it): the baseline issue 15 names, "plain inference of the same rows + the
  same loss",
- ``plain_rows``: ``plain`` in chunks of ``--max-rows`` rows (cache-sized chunks are faster on CPU),
- ``plain_rows_loss``: ``plain_rows`` plus the same loss, chunk by chunk,
- ``ours``:   ``EggrollES.step(x, mse, y)``, every member on the shared batch ``(b, 256)`` (the first Linear's
  base product is then computed once over the ``b`` rows, see ``populora/es/shared.py``),
- ``ours_unshared``: ``ours`` with the shared-batch first layer off (``es.router.share_rows = False``): the
  first Linear's base product runs on all ``N*b`` repeated rows, as plain inference runs it,
- ``ours_pm``: ``EggrollES.step(xs, mse, ys, per_individual=True)``, member ``i`` on its own ``(b, 256)`` rows,
- ``ours_rows``: ``ours`` with ``max_rows=--max-rows`` (members evaluated in chunks: bounded memory),
- ``ours_pm_rows``: ``ours_pm`` with ``max_rows=--max-rows``,
- ``ours_fb``: ``ours`` on the same model with a bare per-feature gain ``nn.Parameter`` (1024,) after the
  first layer, evolved too (``perturb_unroutable=True``): the ``functional_call`` + ``vmap`` fallback
  path, whose cost is what ``EggrollES`` avoids by freezing such parameters by default,
- ``tegg``:   ``torcheggroll.TorchEggrollES.step(x, mse, y)`` (shared batch), when importable,
- ``evox``:   one generation of EvoX 1.4's ``VirtualLoRAES`` (``StdWorkflow.step()``: perturb, evaluate every
  member on the shared batch, update), as a black box run by ``--evox-python``; how it is matched to
  ``ours`` (same N, rank, sigma, lr, MSE fitness, z-score shaping) and what differs (no antithetic pairs)
  is in ``benchmarks/evox_worker.py``.

``--model`` picks the network (the default is the MLP above): ``block`` is one
``nn.TransformerEncoderLayer(256, 4, 1024, dropout=0)`` (train mode, so that its Linear layers are called
through their forwards, as the routed ES needs; the fused eval fast path is not measured) on ``(8, 8, 256)``
inputs and targets, MSE; ``llama`` is a tiny random Hugging Face ``LlamaForCausalLM`` (vocab 128, hidden 64,
2 layers, 4 heads, 2 KV heads; ``populora.llm.tiny_chat_model``'s config) on ``(8, 8)`` tokens, next-token
cross-entropy: both 64 rows (tokens) per member, as the MLP's ``b``. They take ``plain``, ``plain_loss``,
``ours``, ``ours_fb`` (every parameter evolved, ``perturb_unroutable=True``: ``ours`` freezes the
attention projections of ``block`` that ``nn.MultiheadAttention`` applies without their forwards, and the
norm gains), ``tegg`` and ``evox``: EvoX's ``VirtualLoRAProblem`` takes only an ``nn.Sequential`` of
``nn.Linear`` and activation modules, so on them its step fails and the table says so (with its error).

Every measurement runs in a fresh subprocess (so peak memory is that
process's own, read as the peak-RSS watermark above the level before the
steps; with ``MALLOC_MMAP_THRESHOLD_=65536`` so freed buffers leave RSS),
and the methods are interleaved over ``--repeats`` rounds; the table keeps
each method's best median step time. On CPU a step's time is the process's
CPU time (``time.process_time``: one intra-op thread, so other processes on
a shared machine do not inflate it); on CUDA it is CUDA-event time around
the step (the host waits for it before the next step). ``evox`` runs under glibc's default
malloc instead: its CPU path allocates many large temporaries a step, and with the threshold each
is a fresh mmap whose page faults count as its CPU time (8.5-9.4 s instead of 3.2-3.8 s a step at
N = 512, where ``ours`` and ``plain`` move by under 15%); its peak RSS differs by under 12% either way
(580 MB with the threshold against 592-626 MB without at N = 512, 2322 against 2055-2288 MB at
N = 2048). torcheggroll is
never a dependency:
point ``--torcheggroll-python`` at an interpreter that has it (e.g. a
scratch venv: ``python3 -m venv /tmp/tegg && /tmp/tegg/bin/pip install
torch==2.13.0 torcheggroll==0.2.0``); its worker imports only torch and torcheggroll. Likewise
``--evox-python`` (``/tmp/evox/bin/pip install torch==2.13.0 'evox==1.4.*'``) for ``evox``, whose worker
imports only torch and evox (and transformers for ``--model llama``).

    python benchmarks/es.py                                        # CPU, 1 thread, ours vs plain
    python benchmarks/es.py --torcheggroll-python /tmp/tegg/bin/python
    python benchmarks/es.py --device cuda                          # CUDA events, allocator peak
    python benchmarks/es.py --pops 512 --methods plain,plain_loss,ours --repeats 5 --json es.json
    python benchmarks/es.py --pops 512,2048 --methods plain,plain_loss,ours,evox --evox-python /tmp/evox/bin/python
    python benchmarks/es.py --model llama --methods plain,plain_loss,ours,evox --evox-python /tmp/evox/bin/python

``thr`` columns are throughput relative to a baseline (its time / the
method's time): ``thr`` against plain inference alone, ``thr+loss`` against
plain inference plus the same loss (the issue's measure; target >= 0.85 at
N = 512 on CPU, >= 0.9 on GPU). ``--json PATH`` also writes every
measurement and ratio as JSON (``benchmarks/gpu.sh`` reads it).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
METHODS = (
    "plain",
    "plain_loss",
    "plain_rows",
    "plain_rows_loss",
    "ours",
    "ours_unshared",
    "ours_pm",
    "ours_rows",
    "ours_pm_rows",
    "ours_fb",
    "tegg",
    "evox",
)
MODELS = ("mlp", "block", "llama")
MODEL_METHODS = ("plain", "plain_loss", "ours", "ours_fb", "tegg", "evox")
"""The methods ``--model block`` / ``llama`` take (the others are the MLP's own variants)."""
EXTERNAL = ("tegg", "evox")
"""Methods run in another interpreter (``--torcheggroll-python`` / ``--evox-python``)."""
BASELINE = {
    "ours": "plain",
    "ours_unshared": "plain",
    "ours_pm": "plain",
    "ours_rows": "plain_rows",
    "ours_pm_rows": "plain_rows",
    "ours_fb": "plain",
    "tegg": "plain",
    "evox": "plain",
}
"""Each ES method's plain-inference baseline (``thr`` columns)."""
LOSS_BASELINE = {
    "ours": "plain_loss",
    "ours_unshared": "plain_loss",
    "ours_pm": "plain_loss",
    "ours_rows": "plain_rows_loss",
    "ours_pm_rows": "plain_rows_loss",
    "ours_fb": "plain_loss",
    "tegg": "plain_loss",
    "evox": "plain_loss",
}
"""Each ES method's plain-inference-plus-the-same-loss baseline (``thr+loss`` columns)."""


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


def _step_timer(device):
    """``time(step) -> seconds``: CUDA-event time on CUDA, the process's CPU time elsewhere."""
    import torch

    if device.type == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)

        def timed(step):
            start.record()
            step()
            end.record()
            end.synchronize()
            return start.elapsed_time(end) / 1e3

        return timed

    def timed(step):
        t0 = time.process_time()
        step()
        return time.process_time() - t0

    return timed


def _transformer_problem(name: str, device, dtype, gen) -> tuple:
    """``(model, x, y, loss_fn, member_loss, row_loss)`` of ``--model block`` / ``llama`` (see the docstring).

    ``loss_fn(out, y)``: one member's loss (what the ES evaluates); ``member_loss(out, pop) -> (pop,)``: the
    same per member on the ``(pop*8, ...)`` output of ``plain``; ``row_loss(out (M, 8, ...), y) -> (M, 8)``:
    each row's loss (EvoX's criterion).
    """
    import torch
    from torch import nn
    from torch.nn import functional as F

    if name == "block":
        model = nn.TransformerEncoderLayer(256, 4, 1024, dropout=0.0, batch_first=True).to(device, dtype).train()
        x = torch.randn(8, 8, 256, generator=gen).to(device, dtype)
        y = torch.randn(8, 8, 256, generator=gen).to(device, dtype)

        def loss_fn(out, target):
            return ((out - target) ** 2).mean()

        def row_loss(out, target):
            return ((out - target) ** 2).flatten(2).mean(-1)

        def member_loss(out, pop):
            return row_loss(out.view(pop, *y.shape), y).mean(1)

        return model, x, y, loss_fn, member_loss, row_loss
    import transformers

    config = transformers.LlamaConfig(
        vocab_size=128,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
    )
    model = transformers.LlamaForCausalLM(config).to(device, dtype).eval()
    x = y = torch.randint(0, 128, (8, 8), generator=gen).to(device)

    def loss_fn(out, tokens):  # mean next-token cross-entropy
        logits = out["logits"]
        return F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]).float(), tokens[:, 1:].reshape(-1))

    def row_loss(logits, tokens):
        members, rows, length, vocab = logits.shape
        per_token = F.cross_entropy(
            logits[..., :-1, :].reshape(-1, vocab).float(),
            tokens[:, 1:].expand(members, -1, -1).reshape(-1),
            reduction="none",
        )
        return per_token.view(members, rows, length - 1).mean(-1)

    def member_loss(out, pop):
        return row_loss(out["logits"].view(pop, *y.shape, -1), y).mean(1)

    return model, x, y, loss_fn, member_loss, row_loss


def worker(
    method: str,
    pop: int,
    device_name: str,
    threads: int,
    min_time: float,
    max_rows: int,
    dtype_name: str = "float32",
    model_name: str = "mlp",
) -> dict:
    import torch
    from torch import nn

    torch.set_num_threads(threads)
    device = torch.device(device_name)
    dtype = getattr(torch, dtype_name)
    torch.manual_seed(0)
    b = 64
    gen = torch.Generator().manual_seed(0)
    if model_name == "mlp":
        model = nn.Sequential(nn.Linear(256, 1024), nn.ReLU(), nn.Linear(1024, 256)).to(device, dtype)
        x = torch.randn(b, 256, generator=gen).to(device, dtype)
        y = torch.randn(b, 256, generator=gen).to(device, dtype)

        def loss_fn(out, target):  # MSE
            return ((out - target) ** 2).mean()

        per_member_mse = torch.func.vmap(loss_fn, in_dims=(0, None))  # the loss as the ES evaluates it, per member

        def member_loss(out, pop):
            return per_member_mse(out.view(pop, b, -1), y)

        def row_loss(out, target):
            return ((out - target) ** 2).mean(-1)
    else:
        model, x, y, loss_fn, member_loss, row_loss = _transformer_problem(model_name, device, dtype, gen)

    if method in ("plain", "plain_loss"):
        rows = x.repeat(pop, *[1] * (x.dim() - 1))  # the same N*b rows the ES forward runs
        loss = method == "plain_loss"

        def step():
            with torch.no_grad():
                out = model(rows)
                if loss:
                    member_loss(out, pop).cpu()
    elif method in ("plain_rows", "plain_rows_loss"):
        rows = x.repeat(pop, 1)
        loss = method == "plain_rows_loss"
        chunk = max(b, max_rows // b * b)  # whole members per chunk, as the ES's max_rows does

        def step():
            with torch.no_grad():
                for start in range(0, len(rows), chunk):
                    out = model(rows[start : start + chunk])
                    if loss:
                        per_member_mse(out.view(-1, b, out.shape[-1]), y).cpu()
    elif method == "tegg":
        from torcheggroll import TorchEggrollES

        es = TorchEggrollES(model, pop_size=pop, sigma=0.02, lr=0.05, rank=4, device=device)

        def step():
            es.step(x, loss_fn, y)
    elif method == "evox":
        from evox_worker import evox_step  # this file's folder: benchmarks/

        step = evox_step(model, x, y, row_loss, pop, device)
    else:
        sys.path.insert(0, str(REPO))
        from populora import EggrollES

        if method == "ours_fb" and model_name == "mlp":

            class Gain(nn.Module):  # a bare parameter in an expression: unroutable
                def __init__(self, size: int):
                    super().__init__()
                    self.gain = nn.Parameter(torch.ones(size))

                def forward(self, h):
                    return h * self.gain

            model = nn.Sequential(model[0], Gain(1024), model[1], model[2]).to(device, dtype)
        es = EggrollES(model, pop, 0.02, 0.05, 4, device=device, perturb_unroutable=method == "ours_fb")
        if method == "ours_unshared":
            es.router.share_rows = False
        if method in ("ours_pm", "ours_pm_rows"):
            xs = torch.randn(pop, b, 256, generator=gen).to(device, dtype)
            ys = torch.randn(pop, b, 256, generator=gen).to(device, dtype)
            chunk = max_rows if method == "ours_pm_rows" else None

            def step():
                es.step(xs, loss_fn, ys, per_individual=True, max_rows=chunk)
        elif method == "ours_rows":

            def step():
                es.step(x, loss_fn, y, max_rows=max_rows)
        else:

            def step():
                es.step(x, loss_fn, y)

    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    step()  # warm-up (allocator, vmap tracing, lazy init)
    sync()
    reset, read = _peak_tracker(device)
    reset()
    timed = _step_timer(device)
    times: list[float] = []
    start = time.perf_counter()
    while len(times) < 2 or (time.perf_counter() - start < min_time and len(times) < 50):
        times.append(timed(step))
    return {"method": method, "pop": pop, "seconds": statistics.median(times), "steps": len(times), "peak_mb": read()}


# ------------------------------------------------------------------------------------------------ driver


FAILURES: dict[tuple[str, int], str] = {}
"""``(method, N) -> the error's last line`` of each measurement that failed (printed under the table)."""


def run_one(python: str, method: str, pop: int, args: argparse.Namespace) -> dict | None:
    if args.in_process and method not in EXTERNAL:  # quick checks: no interpreter start per measurement
        try:
            return worker(method, pop, args.device, args.threads, args.min_time, args.max_rows, args.dtype, args.model)
        except Exception as error:  # report and go on, as a failed subprocess does
            FAILURES[method, pop] = f"{type(error).__name__}: {error}"
            print(f"  {method} N={pop}: failed: {FAILURES[method, pop]}", file=sys.stderr)
            return None
    env = dict(
        os.environ,
        MALLOC_MMAP_THRESHOLD_="65536",
        OMP_NUM_THREADS=str(args.threads),
        PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH", "")])),
    )
    if method == "evox":  # glibc's default malloc: see the docstring
        del env["MALLOC_MMAP_THRESHOLD_"]
    cmd = [
        python,
        str(Path(__file__).resolve()),
        "--worker",
        method,
        "--pop",
        str(pop),
        "--device",
        args.device,
        "--threads",
        str(args.threads),
        "--min-time",
        str(args.min_time),
        "--max-rows",
        str(args.max_rows),
        "--dtype",
        args.dtype,
        "--model",
        args.model,
    ]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=args.timeout)
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["(no output)"]
        FAILURES[method, pop] = tail[0]
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
    parser.add_argument(
        "--torcheggroll-python",
        default=None,
        help="interpreter with torcheggroll installed (default: this one, if it has it)",
    )
    parser.add_argument("--tegg-max-pop", type=int, default=2048, help="skip torcheggroll above this N (memory)")
    parser.add_argument("--max-rows", type=int, default=2048, help="rows per forward of the *_rows methods")
    parser.add_argument("--timeout", type=float, default=1800)
    parser.add_argument(
        "--evox-python",
        default=None,
        help="interpreter with evox installed: runs the evox method (default: this one, if it has "
        "it and --methods names evox)",
    )
    parser.add_argument("--model", default="mlp", choices=MODELS, help="the network (see above)")
    parser.add_argument(
        "--methods",
        default=None,
        help="comma-separated methods to run (default: all but tegg and evox for the MLP, "
        f"{','.join(m for m in MODEL_METHODS if m not in EXTERNAL)} for the others; tegg is "
        "added when importable, evox when --evox-python is given)",
    )
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16", "float16", "float64"))
    parser.add_argument(
        "--json",
        nargs="?",
        const="auto",
        default=None,
        help="also write the measurements and ratios here (--json alone: benchmarks/results/<version>/es.json)",
    )
    parser.add_argument(
        "--in-process",
        action="store_true",
        help="measure in this process instead of a fresh subprocess each (quick checks; the peak "
        "memory then includes earlier measurements' leftovers)",
    )
    parser.add_argument("--worker", choices=METHODS, help=argparse.SUPPRESS)
    parser.add_argument("--pop", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.json == "auto":
        from populora import __version__

        args.json = str(Path(__file__).resolve().parent / "results" / __version__ / "es.json")
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)

    if args.worker:
        print(
            json.dumps(
                worker(
                    args.worker,
                    args.pop,
                    args.device,
                    args.threads,
                    args.min_time,
                    args.max_rows,
                    args.dtype,
                    args.model,
                )
            )
        )
        return

    pops = [int(p) for p in args.pops.split(",")]
    if args.methods is None:
        args.methods = ",".join(m for m in (METHODS if args.model == "mlp" else MODEL_METHODS) if m not in EXTERNAL)
    chosen = [m.strip() for m in args.methods.split(",") if m.strip()]
    unknown = [m for m in chosen if m not in METHODS]
    if unknown:
        parser.error(f"unknown --methods {unknown}; choose from {list(METHODS)}")
    if args.model != "mlp" and set(chosen) - set(MODEL_METHODS):
        parser.error(
            f"--model {args.model} takes --methods from {list(MODEL_METHODS)}, got "
            f"{[m for m in chosen if m not in MODEL_METHODS]}"
        )
    tegg_python = args.torcheggroll_python or sys.executable
    has_tegg = subprocess.run([tegg_python, "-c", "import torcheggroll"], capture_output=True).returncode == 0
    evox_python = args.evox_python or sys.executable
    want_evox = "evox" in chosen or args.evox_python is not None
    has_evox = (
        want_evox
        and subprocess.run([evox_python, "-c", "import evox"], capture_output=True, check=False).returncode == 0
    )
    methods = [
        m
        for m in METHODS
        if (m in chosen or m == "tegg" or (m == "evox" and want_evox))
        and (m != "tegg" or has_tegg)
        and (m != "evox" or has_evox)
    ]
    print(
        f"device={args.device} dtype={args.dtype} threads={args.threads} model={args.model} pops={pops} "
        f"repeats={args.repeats} "
        f"torcheggroll={'yes (' + tegg_python + ')' if has_tegg else 'not importable: skipped'}"
        + (
            f" evox={'yes (' + evox_python + ')' if has_evox else 'not importable (' + evox_python + '): skipped'}"
            if want_evox
            else ""
        ),
        flush=True,
    )
    python_of = {"tegg": tegg_python, "evox": evox_python}

    best: dict[tuple[str, int], dict] = {}
    for round_ in range(args.repeats):
        for pop in pops:
            for method in methods:
                if method == "tegg" and pop > args.tegg_max_pop:
                    continue
                if method in EXTERNAL and round_ > 0 and (method, pop) in best and best[method, pop]["seconds"] > 30:
                    continue  # one round of a >30 s step is enough
                if (method, pop) in FAILURES:
                    continue  # failed in an earlier round (e.g. a model EvoX cannot take): the same again
                res = run_one(python_of.get(method, sys.executable), method, pop, args)
                if res is None:
                    continue
                key = (method, pop)
                if key not in best or res["seconds"] < best[key]["seconds"]:
                    best[key] = {**res, "peak_mb": max(res["peak_mb"], best.get(key, res)["peak_mb"])}
                print(
                    f"  round {round_ + 1} {method:8s} N={pop:5d}: {res['seconds'] * 1e3:9.1f} ms/step, "
                    f"peak {res['peak_mb']:8.1f} MB",
                    flush=True,
                )

    def cell(method, pop, key, fmt):
        r = best.get((method, pop))
        return format(r[key] * (1e3 if key == "seconds" else 1), fmt) if r else "-"

    def ratio(a, b, pop, key):
        ra, rb = best.get((a, pop)), best.get((b, pop))
        return f"{ra[key] / rb[key]:.2f}" if ra and rb and rb[key] > 0 else "-"

    cols = [m for m in METHODS if any((m, p) in best for p in pops)]
    thr = [m for m in cols if m in BASELINE and BASELINE[m] in cols]
    thr_loss = [m for m in cols if m in LOSS_BASELINE and LOSS_BASELINE[m] in cols]
    print()
    print(
        f"| N | {' | '.join(f'{m} ms' for m in cols)} | "
        + "".join(f"{m} thr | " for m in thr)
        + "".join(f"{m} thr+loss | " for m in thr_loss)
        + ("tegg/ours time | " if "tegg" in cols else "")
        + ("evox/ours time | " if "evox" in cols else "")
        + f"{' | '.join(f'{m} MB' for m in cols)}"
        + (" | tegg/ours mem | tegg/ours_rows mem" if "tegg" in cols else "")
        + (" | evox/ours mem" if "evox" in cols else "")
        + " |"
    )
    ncols = 1 + 2 * len(cols) + len(thr) + len(thr_loss) + (3 if "tegg" in cols else 0) + 2 * ("evox" in cols)
    print("|---:" * ncols + "|")
    for pop in pops:
        row = [str(pop)] + [cell(m, pop, "seconds", ".1f") for m in cols]
        row += [ratio(BASELINE[m], m, pop, "seconds") for m in thr]
        row += [ratio(LOSS_BASELINE[m], m, pop, "seconds") for m in thr_loss]
        if "tegg" in cols:
            row.append(ratio("tegg", "ours", pop, "seconds"))
        if "evox" in cols:
            row.append(ratio("evox", "ours", pop, "seconds"))
        row += [cell(m, pop, "peak_mb", ".0f") for m in cols]
        if "tegg" in cols:
            row += [ratio("tegg", "ours", pop, "peak_mb"), ratio("tegg", "ours_rows", pop, "peak_mb")]
        if "evox" in cols:
            row.append(ratio("evox", "ours", pop, "peak_mb"))
        print("| " + " | ".join(row) + " |")
    print(
        "\nthr = throughput of the ES step relative to plain inference of the same N*b rows (time plain / time "
        "method; the *_rows methods against plain_rows, chunked alike); thr+loss = the same against plain "
        "inference plus the same loss (plain_loss / plain_rows_loss); tegg/ours (evox/ours) = how many times "
        "more time / memory torcheggroll 0.2.0 (EvoX's VirtualLoRAES) needs than populora."
    )
    for (method, pop), error in sorted(FAILURES.items(), key=lambda kv: (kv[0][1], METHODS.index(kv[0][0]))):
        print(f"{method} N={pop} failed: {error}")
    if args.json:
        ratios = {}
        for pop in pops:
            for kind, table, methods_ in (("thr", BASELINE, thr), ("thr+loss", LOSS_BASELINE, thr_loss)):
                for m in methods_:
                    a, b = best.get((table[m], pop)), best.get((m, pop))
                    if a and b and b["seconds"] > 0:
                        ratios[f"{m} {kind} N={pop}"] = a["seconds"] / b["seconds"]
            a, b = best.get(("evox", pop)), best.get(("ours", pop))
            if a and b:
                ratios[f"evox/ours time N={pop}"] = a["seconds"] / b["seconds"]
                ratios[f"evox/ours mem N={pop}"] = a["peak_mb"] / b["peak_mb"] if b["peak_mb"] > 0 else math.inf
        from populora import __version__

        report = {
            "populora": __version__,
            "device": args.device,
            "dtype": args.dtype,
            "threads": args.threads,
            "model": args.model,
            "pops": pops,
            "repeats": args.repeats,
            "command": " ".join(sys.argv),
            "results": [best[k] for k in sorted(best, key=lambda k: (k[1], METHODS.index(k[0])))],
            "ratios": ratios,
            "failures": {f"{m} N={p}": e for (m, p), e in FAILURES.items()},
        }
        Path(args.json).write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
