"""Measure the constants of the routing cost model (``populora/routing/cost.py``) on this machine.

Times the tensor operations a target's routed work is made of, over a grid of small shapes (the sizes where
the choice matters: a policy's layers, one or a few rows per individual), one intra-op thread, each the
minimum over repeats of the thread's CPU time per call, and fits each operation's cost model by
non-negative least squares:

- ``linear``: ``F.linear`` of ``n`` rows, ``d -> e``: ``fixed + n d e * per_mac``;
- ``bmm``: ``baddbmm`` over ``k`` groups of ``(t, p) @ (p, q)``:
  ``fixed + k * per_group + k t p q * (per_mac_small if t p q < UNBLOCKED else per_mac_large)``;
- ``ew``: one elementwise operation (multiply, sum, add) over ``m`` elements: ``fixed + m * per_element``.

Prints the measured and fitted times, then (``--write``) writes ``populora/routing/cost_constants.py``,
which the package reads at import: the choice of a form is a pure function of shapes, dtype and device,
never a timing at run time.

    python benchmarks/cost_model.py                    # float32 on CPU: print the fit
    python benchmarks/cost_model.py --write            # ... and write the constants file
    python benchmarks/cost_model.py --dtypes float32 bfloat16 --write
    python benchmarks/cost_model.py --device cuda --write   # adds the CUDA constants (CUDA events)
"""

from __future__ import annotations

import argparse
import itertools
import sys
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from populora.routing.delta import UNBLOCKED  # noqa: E402

CONSTANTS_FILE = ROOT / "populora" / "routing" / "cost_constants.py"


def per_call(fn, device: torch.device, repeats: int, min_block: float) -> float:
    """Microseconds per call: the minimum over ``repeats`` blocks (each at least ``min_block`` seconds)."""
    cuda = device.type == "cuda"
    clock = time.perf_counter if cuda else time.thread_time
    fn()
    calls = 1
    while True:
        start = clock()
        for _ in range(calls):
            fn()
        if cuda:
            torch.cuda.synchronize()
        if clock() - start >= min_block or calls >= 1 << 14:
            break
        calls *= 2
    best = float("inf")
    for _ in range(repeats):
        start = clock()
        for _ in range(calls):
            fn()
        if cuda:
            torch.cuda.synchronize()
        best = min(best, (clock() - start) / calls)
    return best * 1e6


def nnls(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Non-negative least squares, relative errors (each row scaled by its target)."""
    w = 1 / np.maximum(b, 1e-9)
    a, b = a * w[:, None], b * w
    try:
        from scipy.optimize import nnls as scipy_nnls

        return scipy_nnls(a, b)[0]
    except ImportError:  # an unconstrained fit, clipped
        return np.clip(np.linalg.lstsq(a, b, rcond=None)[0], 0, None)


LAYERS = [(4, 32), (32, 2), (32, 32), (8, 64), (64, 64), (64, 8), (128, 128), (256, 256)]
RANKS = [1, 4, 16]


def measure(device: torch.device, dtype: torch.dtype, repeats: int, min_block: float, quick: bool) -> dict:
    """The fitted constants of one (device, dtype)."""
    g = torch.Generator().manual_seed(0)
    rand = lambda *shape: torch.randn(*shape, generator=g).to(device, dtype)
    layers = LAYERS[:4] if quick else LAYERS
    groups = [1, 16, 64] if quick else [1, 4, 16, 64, 256]
    rows = [1, 4] if quick else [1, 2, 4, 16]
    time_it = lambda fn: per_call(fn, device, repeats, min_block)

    lin_x, lin_y = [], []
    for (d, e), n in itertools.product(layers, [1, 16, 64, 256, 1024]):
        x, w, b = rand(n, d), rand(e, d), rand(e)
        lin_x.append([1.0, n * d * e])
        lin_y.append(time_it(lambda x=x, w=w, b=b: torch.nn.functional.linear(x, w, b)))

    bmm_x, bmm_y = [], []
    shapes = {(p, q) for d, e in layers for p, q in ((d, e), *((d, r) for r in RANKS), *((r, e) for r in RANKS))}
    for (p, q), k, t in itertools.product(sorted(shapes), groups, rows):
        if k * t * p * q > 1 << 22:
            continue
        xs, w, b = rand(k, t, p), rand(k, p, q), rand(q)
        macs = t * p * q
        small = macs < UNBLOCKED
        bmm_x.append([1.0, k, k * macs if small else 0.0, 0.0 if small else k * macs])
        bmm_y.append(time_it(lambda xs=xs, w=w, b=b: torch.baddbmm(b, xs, w)))

    ew_x, ew_y = [], []
    for m in [16, 256, 4096, 32768, 262144]:
        a, c = rand(m), rand(m)
        ew_x.append([1.0, m])
        ew_y.append(time_it(lambda a=a, c=c: a * c))
        ew_x.append([1.0, m])
        ew_y.append(time_it(lambda a=a: a.view(-1, 16).sum(1)) if m >= 16 else time_it(lambda a=a: a.sum()))

    fits = {}
    for name, xs, ys in (("linear", lin_x, lin_y), ("bmm", bmm_x, bmm_y), ("ew", ew_x, ew_y)):
        a, b = np.asarray(xs, dtype=np.float64), np.asarray(ys, dtype=np.float64)
        coef = nnls(a, b)
        rel = np.abs(a @ coef - b) / b
        fits[name] = tuple(float(f"{c:.4g}") for c in coef)
        print(
            f"  {name:6} {fits[name]}  ({len(b)} shapes, median relative error {np.median(rel):.0%}, "
            f"worst {rel.max():.0%})",
            flush=True,
        )
    return fits


def write(constants: dict) -> None:
    """Write ``constants`` as ``populora/routing/cost_constants.py`` (formatted as ``ruff format`` would)."""
    lines = ["CONSTANTS: dict[tuple[str, str], dict[str, tuple[float, ...]]] = {"]
    for (device, dtype), fits in sorted(constants.items()):
        lines.append(f'    ("{device}", "{dtype}"): {{')
        lines += [f'        "{name}": ({", ".join(repr(c) for c in fits[name])}),' for name in sorted(fits)]
        lines.append("    },")
    lines.append("}")
    text = (
        '"""Constants of the routing cost model (:mod:`populora.routing.cost`), measured by '
        "``benchmarks/cost_model.py``.\n\n"
        "Generated file: ``python benchmarks/cost_model.py --write`` measures the machine it runs on again.\n"
        "Microseconds: ``linear`` (fixed, per multiply-add), ``bmm`` (fixed, per group, per multiply-add below\n"
        "and above ``UNBLOCKED`` multiply-adds per group), ``ew`` (fixed, per element of one elementwise\n"
        'operation).\n"""\n\n' + "\n".join(lines) + "\n"
    )
    CONSTANTS_FILE.write_text(text)
    print(f"wrote {CONSTANTS_FILE}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtypes", nargs="+", default=["float32"])
    parser.add_argument("--repeats", type=int, default=5, help="blocks per shape (the minimum is kept)")
    parser.add_argument("--min-block", type=float, default=0.005, help="seconds per block")
    parser.add_argument("--quick", action="store_true", help="a few shapes only (a smoke run)")
    parser.add_argument("--write", action="store_true", help="write populora/routing/cost_constants.py")
    args = parser.parse_args()
    device = torch.device(args.device)
    torch.set_num_threads(1)
    from populora.routing.cost_constants import CONSTANTS

    constants = dict(CONSTANTS)  # other devices' constants are kept
    print(f"device={device} torch={torch.__version__} threads={torch.get_num_threads()}")
    for name in args.dtypes:
        dtype = getattr(torch, name)
        print(f"{device.type} {name}:", flush=True)
        constants[(device.type, name)] = measure(device, dtype, args.repeats, args.min_block, args.quick)
    if args.write:
        write(constants)


if __name__ == "__main__":
    main()
