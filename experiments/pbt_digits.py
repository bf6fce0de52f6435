"""Population-based training of 16 digit classifiers in ONE network, against 16 runs trained one after the other.

scikit-learn's bundled digits (1797 real 8x8 scans, 10 classes; shipped inside the package, nothing
downloaded) are split stratified into train / validation / test (987 / 360 / 450). The base network is
an MLP ``64 -> 256 -> 256 -> 10`` (ReLU) with torch's default random initialisation, FROZEN: it is never
trained. Each of the ``P = 16`` individuals is a set of rank-16 LoRA adapters on its three layers
(``Population(..., init_scale=0, requires_grad=True)``: ``up = 0``, so every individual starts as the
base network and differs by its ``down`` factors). At rank 16 the last layer's adapter is a full
``256 x 10`` update and the hidden adapters reshape the random features: 95-97% test accuracy without
touching the base (a wider rank or a pre-trained base was not needed).

Population-based training (``populora.train.PBT``):

- every step, ONE routed forward (``all_individuals=True, broadcast=True``: every individual gets the
  same minibatch of 64 rows, rows laid out ``(p b)``), one backward of the sum of the individuals' mean
  cross-entropies (individual ``i``'s gradient is that of its own loss only), one Adam step over
  ``pop.adapter_parameters()`` through ``LRMultipliers`` (individual ``i``'s learning rate is
  ``lr * m[i]``; the starting multipliers are spread log-uniformly over ``--lr-span`` decades around 1,
  so some of the 16 start far too slow and some diverge);
- every ``--interval`` steps the individuals are scored on the validation set (one routed forward) and
  ``PBT.step`` ranks them by validation loss (``--fitness loss``, the default: a continuous key, where
  accuracy on 360 digits ties most individuals) and replaces the bottom quarter by copies of the top
  quarter: weights and Adam rows inherited (``optimizer_state="inherit"``), learning-rate multiplier
  inherited and multiplied by 0.8 or 1.2 (PBT's explore); ``--crossover-rate`` / ``--epsilon`` add
  crossover and weight mutation.

The baseline: 16 independent runs trained one after the other, run ``i`` a ``pop_size=1`` population on
its own copy of the same frozen base, starting from individual ``i``'s initial adapters with Adam at
``lr * m[i]`` (PBT member ``i``'s starting point), on the same minibatches, for the same number of steps.
Until the first replacement, run ``i`` and PBT member ``i`` are the same computation (the script prints
their adapters' relative distance after the first step and just before the first replacement).

Reported (one process, same machine), per seed (``--seeds``: the split, the base, the adapters and the
batches) and as the mean over the seeds: the test accuracy of the validation-chosen PBT individual, of
the validation-chosen independent run and of the best independent run on the test set (an oracle); the
wall clock of the whole PBT run against the 16 runs together, the median time of one training step (the
PBT step trains 16 individuals), and the peak tensor memory of one step: the resident tensors (base
weights, adapters, Adam state) plus the step's transient peak measured by ``torch.profiler`` (CPU
allocations). One test digit is 0.22 points, and the test accuracy of one run varies by about a point
with the seed, so a single seed does not settle a 1-point comparison. The results are written to ``--out``
(default ``experiments/results/<version>/train/pbt_digits.json``; ``<version>`` is ``populora.__version__``, which
the file also records) after every seed, and running the same command again takes the seeds already in the file
(same options) and runs the others: a stopped run continues. A file of other options, or holding finished seeds
the command does not ask for, is refused rather than overwritten.

    pip install scikit-learn
    python experiments/pbt_digits.py --seeds 3 4 5 6 7       # the results page's run (about 25 minutes)
    python experiments/pbt_digits.py --out /tmp/pbt.json     # one seed: a minute or two on one idle CPU core
    python experiments/pbt_digits.py --steps 20 --interval 5 --subset 400 --out /tmp/pbt.json   # seconds (smoke)
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from populora import Population, __version__
from populora.train import PBT, LRMultipliers, PBTConfig

REPO = Path(__file__).resolve().parents[1]
DEFAULT_OUT = REPO / "experiments" / "results" / __version__ / "train" / "pbt_digits.json"  # by the writing version


def load_digits(seed: int, subset: int | None, validation: float, test: float) -> dict[str, tuple[Tensor, Tensor]]:
    """Stratified train / validation / test splits, standardised with the training statistics."""
    from sklearn.datasets import load_digits as sklearn_digits
    from sklearn.model_selection import train_test_split

    data = sklearn_digits()
    x, y = data.data, data.target
    if subset is not None:  # a stratified subset for smoke runs
        x, _, y, _ = train_test_split(x, y, train_size=subset, random_state=seed, stratify=y)
    x_rest, x_test, y_rest, y_test = train_test_split(x, y, test_size=test, random_state=seed, stratify=y)
    x_train, x_val, y_train, y_val = train_test_split(
        x_rest, y_rest, test_size=validation / (1 - test), random_state=seed, stratify=y_rest
    )
    t = lambda a: torch.tensor(a, dtype=torch.float32) / 16.0  # pixels 0..16 -> 0..1
    x_train, x_val, x_test = t(x_train), t(x_val), t(x_test)
    mean, std = x_train.mean(0), x_train.std(0) + 1e-3
    splits = {"train": (x_train, y_train), "validation": (x_val, y_val), "test": (x_test, y_test)}
    return {k: ((x - mean) / std, torch.tensor(y, dtype=torch.long)) for k, (x, y) in splits.items()}


def base_network(hidden: int, seed: int) -> nn.Sequential:
    """The frozen base: a randomly initialised MLP (torch's default init, drawn from ``seed``)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return nn.Sequential(
            nn.Linear(64, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, 10)
        )


def losses(pop: Population, x: Tensor, y: Tensor) -> Tensor:
    """``(P,)`` mean cross-entropy of every individual on the same rows (one routed forward)."""
    logits = pop(x, all_individuals=True, broadcast=True)  # (P b, 10), rows (p b)
    per_row = nn.functional.cross_entropy(logits, y.repeat(pop.pop_size), reduction="none")
    return per_row.view(pop.pop_size, -1).mean(1)


@torch.no_grad()
def scores(pop: Population, x: Tensor, y: Tensor) -> tuple[Tensor, Tensor]:
    """``(accuracy (P,), loss (P,))`` of every individual on ``(x, y)``, float64."""
    logits = pop(x, all_individuals=True, broadcast=True).view(pop.pop_size, len(x), -1)
    acc = (logits.argmax(-1) == y).double().mean(1)
    loss = nn.functional.cross_entropy(logits.flatten(0, 1), y.repeat(pop.pop_size), reduction="none")
    return acc, loss.view(pop.pop_size, -1).double().mean(1)


def best_by_validation(val_acc: Tensor, val_loss: Tensor) -> int:
    """The highest validation accuracy, ties to the lower validation loss (then the lower id)."""
    order = sorted(range(len(val_acc)), key=lambda i: (-float(val_acc[i]), float(val_loss[i]), i))
    return order[0]


def train_step(pop: Population, opt: torch.optim.Optimizer, lr: LRMultipliers | None, x: Tensor, y: Tensor) -> None:
    """One step of every individual: forward, backward of the summed losses, Adam (scaled per individual)."""
    opt.zero_grad(set_to_none=True)
    losses(pop, x, y).sum().backward()
    if lr is None:
        opt.step()
    else:
        lr.step(opt, pop.adapter_parameters())


def _walk(nodes: list) -> Any:
    for node in nodes:
        yield node
        yield from _walk(node.children)


def step_peak_bytes(step: Callable[[], None], resident: list[Tensor]) -> dict[str, int]:
    """Peak tensor bytes of one call of ``step``: ``resident`` tensors plus the profiler's transient peak.

    ``torch.profiler`` (``profile_memory=True``) records every CPU allocation and free with the running
    total of what was allocated since profiling began; its maximum is the step's transient peak
    (activations, gradients, temporaries). ``resident`` are the tensors alive across steps (weights,
    adapters, optimizer state), counted once per storage.
    """
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        step()
    peak = 0
    for node in _walk(prof.profiler.kineto_results.experimental_event_tree()):
        extra = node.typed[1]
        if type(extra).__name__ == "_ExtraFields_Allocation":
            peak = max(peak, int(extra.total_allocated))
    storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in resident if t.numel()}
    held = sum(storages.values())
    return {"resident": held, "transient_peak": peak, "peak": held + peak}


def optimizer_tensors(opt: torch.optim.Optimizer) -> list[Tensor]:
    return [v for state in opt.state.values() for v in state.values() if isinstance(v, Tensor)]


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog=f"Results go to {DEFAULT_OUT.relative_to(REPO)} unless --out says otherwise; re-running the same "
        "command keeps the finished seeds.",
    )
    parser.add_argument("--pop-size", type=int, default=16, help="individuals (LoRA adapter sets)")
    parser.add_argument("--steps", type=int, default=600, help="training steps of every run")
    parser.add_argument("--interval", type=int, default=50, help="PBT replaces every k steps")
    parser.add_argument("--fraction", type=float, default=0.25, help="fraction replaced (and parents' pool)")
    parser.add_argument(
        "--fitness", choices=["accuracy", "loss"], default="loss", help="PBT ranks by validation -loss or accuracy"
    )
    parser.add_argument("--decay", type=float, default=0.0, help="moving average of the fitnesses (0: the latest)")
    parser.add_argument("--crossover-rate", type=float, default=0.0, help="children made by layer-wise crossover")
    parser.add_argument("--epsilon", type=float, default=0.0, help="weight mutation of copied children")
    parser.add_argument("--lr", type=float, default=3e-3, help="Adam learning rate at multiplier 1")
    parser.add_argument("--lr-span", type=float, default=2.5, help="decades spanned by the starting multipliers")
    parser.add_argument("--hidden", type=int, default=256, help="hidden width of the frozen base MLP")
    parser.add_argument("--rank", type=int, default=16, help="LoRA rank")
    parser.add_argument("--batch", type=int, default=64, help="minibatch rows")
    parser.add_argument("--subset", type=int, default=None, help="use this many digits (smoke runs)")
    parser.add_argument("--validation", type=float, default=0.2, help="fraction of all digits")
    parser.add_argument("--test", type=float, default=0.25, help="fraction of all digits")
    parser.add_argument("--independent", action=argparse.BooleanOptionalAction, default=True, help="the baseline")
    parser.add_argument(
        "--seeds", type=int, nargs="+", default=[0], help="one run per seed (split, base, adapters, batches)"
    )
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads (tiny matmuls: 1)")
    parser.add_argument(
        "--out", type=Path, default=DEFAULT_OUT, help=f"the results JSON (default: {DEFAULT_OUT.relative_to(REPO)})"
    )
    args = parser.parse_args(argv)
    for name in ("pop_size", "steps", "interval", "hidden", "rank", "batch", "threads"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1, got {getattr(args, name)}")
    if not 0 < args.fraction <= 0.5:
        parser.error(f"--fraction must be in (0, 0.5], got {args.fraction}")
    if not (0 < args.validation < 1 and 0 < args.test < 1 and args.validation + args.test < 1):
        parser.error("--validation and --test are fractions of all digits, each in (0, 1), summing below 1")
    return args


class Setup:
    """What every run of one invocation shares: the splits, the frozen base, the starting multipliers."""

    def __init__(self, args: argparse.Namespace, seed: int) -> None:
        self.args, self.seed = args, seed
        self.data = load_digits(seed, args.subset, args.validation, args.test)
        self.pristine = base_network(args.hidden, seed)  # every run's base is a copy of this one
        self.multipliers = torch.logspace(-args.lr_span / 2, args.lr_span / 2, args.pop_size, dtype=torch.float64)

    def build(self, pop_size: int) -> Population:
        """A population of ``pop_size`` on a fresh copy of the frozen base (seeded: the same initial adapters)."""
        return Population(
            copy.deepcopy(self.pristine),
            pop_size,
            self.args.rank,
            init_scale=0.0,
            requires_grad=True,
            seed=self.seed,
        )

    def batches(self) -> Any:
        """The minibatches of every run: ``(x, y)`` of ``batch`` rows, drawn from the same seeded generator."""
        x, y = self.data["train"]
        generator = torch.Generator().manual_seed(self.seed + 1)
        for _ in range(self.args.steps):
            rows = torch.randint(len(x), (self.args.batch,), generator=generator)
            yield x[rows], y[rows]


def run_pbt(setup: Setup) -> dict[str, Any]:
    """P individuals in one network, PBT every ``interval`` steps; returns the figures and the twins' snapshots."""
    args, size = setup.args, setup.args.pop_size
    (x_val, y_val), (x_test, y_test) = setup.data["validation"], setup.data["test"]
    pop = setup.build(size)
    opt = torch.optim.Adam(pop.adapter_parameters(), lr=args.lr)
    lr = LRMultipliers(size, values=setup.multipliers, seed=setup.seed)
    pbt = PBT(
        pop,
        opt,
        PBTConfig(
            interval=args.interval,
            fraction=args.fraction,
            decay=args.decay,
            crossover_rate=args.crossover_rate,
            epsilon=args.epsilon,
            seed=setup.seed,
        ),
        lr_multipliers=lr,
    )
    step_s: list[float] = []
    replacements, twins = [], {}
    t0 = time.perf_counter()
    for step, (x, y) in enumerate(setup.batches(), 1):
        t = time.perf_counter()
        train_step(pop, opt, lr, x, y)
        step_s.append(time.perf_counter() - t)
        if step == 1 or (pbt.ready() and not replacements):  # the independent runs' twins, before any replacement
            twins[step] = [p.detach().clone() for p in pop.adapter_parameters()]
        if not pbt.ready():
            pbt.step()
            continue
        val_acc, val_loss = scores(pop, x_val, y_val)
        # accuracy moves in steps of 1 / len(validation): its ties go to the lower loss
        done = pbt.step(val_acc - 1e-4 * val_loss if args.fitness == "accuracy" else -val_loss)
        assert done is not None
        replacements.append(
            {
                "step": step,
                "validation_accuracy": [round(float(v), 4) for v in val_acc],
                "replaced": done.children.tolist(),
                "parents": done.parents.tolist(),
                "lr_multipliers": [round(float(v), 4) for v in lr.values],
            }
        )
        print(
            f"step {step:4d}  validation accuracy best {float(val_acc.max()):.3f} mean {float(val_acc.mean()):.3f}; "
            f"replaced {done.children.tolist()} by {done.parents[:, 0].tolist()}; lr multipliers "
            f"{float(lr.values.min()):.3g}..{float(lr.values.max()):.3g}",
            flush=True,
        )
    wall = time.perf_counter() - t0
    val_acc, val_loss = scores(pop, x_val, y_val)
    test_acc, _ = scores(pop, x_test, y_test)
    chosen = best_by_validation(val_acc, val_loss)
    return {
        "chosen": chosen,
        "chosen_lr": args.lr * float(lr.values[chosen]),
        "validation_accuracy": float(val_acc[chosen]),
        "test_accuracy": float(test_acc[chosen]),
        "test_accuracy_all": [round(float(v), 4) for v in test_acc],
        "best_test_accuracy": float(test_acc.max()),
        "wall_s": wall,
        "step_median_s": statistics.median(step_s),
        "replacements": replacements,
        "twins": twins,
    }


def run_independent(setup: Setup, twins: dict[int, list[Tensor]]) -> dict[str, Any]:
    """``P`` runs one after the other, run ``i`` from PBT member ``i``'s start (adapters, learning rate, batches)."""
    args, size = setup.args, setup.args.pop_size
    (x_val, y_val), (x_test, y_test) = setup.data["validation"], setup.data["test"]
    start = [(f.down.detach().clone(), f.up.detach().clone()) for f in setup.build(size).factors()]
    runs, step_s = [], []
    diffs: dict[int, list[float]] = {step: [] for step in twins}
    t0 = time.perf_counter()
    for i in range(size):
        single = setup.build(1)
        single.set_factors_(0, [(down[i], up[i]) for down, up in start])
        opt = torch.optim.Adam(single.adapter_parameters(), lr=args.lr * float(setup.multipliers[i]))
        for step, (x, y) in enumerate(setup.batches(), 1):
            t = time.perf_counter()
            train_step(single, opt, None, x, y)
            step_s.append(time.perf_counter() - t)
            if step in twins:  # relative distance to PBT member i at the same step
                mine = torch.cat([p.detach()[0].flatten() for p in single.adapter_parameters()])
                theirs = torch.cat([p[i].flatten() for p in twins[step]])
                diffs[step].append(float((mine - theirs).norm() / theirs.norm().clamp_min(1e-30)))
        v_acc, v_loss = scores(single, x_val, y_val)
        t_acc, _ = scores(single, x_test, y_test)
        runs.append(
            {
                "lr": args.lr * float(setup.multipliers[i]),
                "validation_accuracy": float(v_acc[0]),
                "validation_loss": float(v_loss[0]),
                "test_accuracy": float(t_acc[0]),
            }
        )
    wall = time.perf_counter() - t0
    v = torch.tensor([r["validation_accuracy"] for r in runs], dtype=torch.float64)
    vl = torch.tensor([r["validation_loss"] for r in runs], dtype=torch.float64)
    chosen = best_by_validation(v, vl)
    best = max(range(size), key=lambda i: (runs[i]["test_accuracy"], -i))
    return {
        "runs": runs,
        "chosen": chosen,
        "test_accuracy": runs[chosen]["test_accuracy"],
        "best_test": best,
        "best_test_accuracy": runs[best]["test_accuracy"],
        "wall_s": wall,
        "step_median_s": statistics.median(step_s),
        "twin_relative_distance": {str(k): v for k, v in diffs.items()},
    }


def step_memory(setup: Setup, pop_size: int) -> dict[str, int]:
    """Peak tensor bytes of one steady-state training step of ``pop_size`` individuals (fresh objects)."""
    x, y = next(iter(setup.batches()))
    pop = setup.build(pop_size)
    opt = torch.optim.Adam(pop.adapter_parameters(), lr=setup.args.lr)
    lr = LRMultipliers(pop_size, values=setup.multipliers) if pop_size > 1 else None
    train_step(pop, opt, lr, x, y)  # Adam's state exists: the steady-state step is measured
    opt.zero_grad(set_to_none=True)  # the step allocates its own gradients
    return step_peak_bytes(
        lambda: train_step(pop, opt, lr, x, y),
        [*pop.model.parameters(), *pop.adapter_parameters(), *optimizer_tensors(opt)],
    )


def run_seed(args: argparse.Namespace, seed: int, memory: bool) -> dict[str, Any]:
    """PBT and (with ``--independent``) the independent runs of one seed, with the per-seed lines printed."""
    setup = Setup(args, seed)
    size, data = args.pop_size, setup.data
    print(
        f"seed {seed}: digits {len(data['train'][1])} train / {len(data['validation'][1])} validation / "
        f"{len(data['test'][1])} test; frozen random MLP 64-{args.hidden}-{args.hidden}-10, rank-{args.rank} "
        f"adapters on its 3 layers; P = {size}, Adam lr {args.lr:g} x [{float(setup.multipliers[0]):.3g} .. "
        f"{float(setup.multipliers[-1]):.3g}], {args.steps} steps of {args.batch} rows, PBT every {args.interval} "
        f"(fitness: validation {args.fitness})",
        flush=True,
    )
    pbt = run_pbt(setup)
    twins = pbt.pop("twins")
    result: dict[str, Any] = {"seed": seed, "splits": {k: len(v[1]) for k, v in data.items()}, "pbt": pbt}
    if memory:
        pbt["peak_step_bytes"] = step_memory(setup, size)
    if not args.independent:
        print(f"seed {seed}: PBT's validation-chosen individual: test accuracy {pbt['test_accuracy']:.3f}", flush=True)
        return result
    ind = result["independent"] = run_independent(setup, twins)
    if memory:
        ind["peak_step_bytes"] = step_memory(setup, 1)
    for step, d in ind["twin_relative_distance"].items():
        print(
            f"seed {seed}, step {step}: PBT member i vs independent run i, relative distance of the adapters: "
            f"median {statistics.median(d):.1e}, max {max(d):.1e}"
        )
    print(
        f"seed {seed}: test accuracy: PBT's validation-chosen individual {pbt['test_accuracy']:.3f}; validation-chosen "
        f"independent run {ind['test_accuracy']:.3f}, best independent run on test {ind['best_test_accuracy']:.3f}",
        flush=True,
    )
    return result


def write_json(path: Path, payload: dict[str, Any]) -> None:
    """Write ``payload`` atomically (a stopped run never leaves half a file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(payload, indent=1))
    tmp.replace(path)


def resumable_seeds(path: Path | None, config: dict[str, Any]) -> dict[int, dict[str, Any]]:
    """The finished seeds of an earlier run of the same configuration (``--seeds`` aside) written to ``path``.

    Raises:
        SystemExit: ``path`` holds results of another configuration, or finished seeds ``--seeds`` leaves out
            (rerunning would overwrite them).
    """
    if path is None or not path.exists():
        return {}
    earlier = json.loads(path.read_text())
    ignored = ("seeds", "out", "threads")  # where it is written and how many threads do not change a result
    old = {k: v for k, v in earlier.get("config", {}).items() if k not in ignored}
    now = {k: v for k, v in config.items() if k not in ignored}
    if old != now:
        differ = {k: (old.get(k), now.get(k)) for k in sorted(old.keys() | now.keys()) if old.get(k) != now.get(k)}
        raise SystemExit(f"{path} holds results of other options {differ} (file, now): pass another --out")
    done = {r["seed"]: r for r in earlier.get("seeds", [])}
    left_out = sorted(set(done) - set(config["seeds"]))
    if left_out:
        raise SystemExit(
            f"{path} holds finished seeds {left_out} that --seeds leaves out: add them or pass another --out"
        )
    return done


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse(argv)
    torch.set_num_threads(args.threads)
    config = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}
    command = "python experiments/pbt_digits.py " + " ".join(sys.argv[1:] if argv is None else argv)
    load = {"start": os.getloadavg()}  # 1, 5, 15-minute load averages: the wall clocks depend on them
    done = resumable_seeds(args.out, config)
    runs = []
    for k, seed in enumerate(args.seeds):
        if seed in done:
            print(f"seed {seed}: taken from {args.out} (a finished seed of the same configuration)", flush=True)
            runs.append(done[seed])
        else:
            runs.append(run_seed(args, seed, memory=k == 0))
        if args.out is not None:  # partial results after every seed; rerunning the command continues from them
            partial = {"status": "running", "populora": __version__, "config": config, "command": command}
            write_json(args.out, {**partial, "seeds": runs})
    load["end"] = os.getloadavg()
    size, first = args.pop_size, runs[0]
    mean = lambda values: sum(values) / len(values)
    pbt_test = mean([r["pbt"]["test_accuracy"] for r in runs])
    summary: dict[str, Any] = {"pbt_test_accuracy": pbt_test, "pbt_wall_s": mean([r["pbt"]["wall_s"] for r in runs])}
    if not args.independent:
        print(f"PBT's validation-chosen individual: test accuracy {pbt_test:.3f} (mean of {len(runs)} seeds)")
    else:
        ind_chosen = mean([r["independent"]["test_accuracy"] for r in runs])
        ind_best = mean([r["independent"]["best_test_accuracy"] for r in runs])
        summary.update(
            independent_chosen_test_accuracy=ind_chosen,
            independent_best_test_accuracy=ind_best,
            independent_wall_s=mean([r["independent"]["wall_s"] for r in runs]),
            gap_to_best_points=100 * (pbt_test - ind_best),
        )
        mib = lambda b: b / 2**20
        pm, im = first["pbt"]["peak_step_bytes"], first["independent"]["peak_step_bytes"]
        p_step, i_step = first["pbt"]["step_median_s"], first["independent"]["step_median_s"]
        table = [
            ("test accuracy, validation-chosen", f"{pbt_test:.3f}", f"{ind_chosen:.3f}"),
            (
                "test accuracy, best on test",
                f"{mean([r['pbt']['best_test_accuracy'] for r in runs]):.3f}",
                f"{ind_best:.3f}",
            ),
            ("wall clock, whole run (s)", f"{summary['pbt_wall_s']:.1f}", f"{summary['independent_wall_s']:.1f}"),
            ("one training step, median (ms)", f"{1e3 * p_step:.2f}", f"{1e3 * i_step:.2f}"),
            ("peak tensor memory per step (MiB)", f"{mib(pm['peak']):.2f}", f"{mib(im['peak']):.2f}"),
            ("  of which resident (MiB)", f"{mib(pm['resident']):.2f}", f"{mib(im['resident']):.2f}"),
        ]
        print(
            f"\n{f'seeds {args.seeds} (accuracy and wall: mean)':38s}{f'PBT, P = {size} in one network':>30s}"
            f"{f'{size} independent runs':>24s}"
        )
        for name, a, b in table:
            print(f"{name:38s}{a:>30s}{b:>24s}")
        print(
            f"\nPBT's validation-chosen individual: test accuracy {pbt_test:.3f}, "
            f"{100 * (pbt_test - ind_chosen):+.1f} points against the validation-chosen independent run, "
            f"{summary['gap_to_best_points']:+.1f} against the best independent run on test "
            f"(mean of {len(runs)} seeds)",
            flush=True,
        )
    result = {
        "status": "finished",
        "populora": __version__,
        "config": config,
        "command": command,
        "cpu_count": os.cpu_count(),
        "load_average": load,
        "summary": summary,
        "seeds": runs,
    }
    if args.out is not None:
        write_json(args.out, result)
        print(f"results -> {args.out}")
    return result


if __name__ == "__main__":
    main()
