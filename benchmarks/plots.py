"""Every figure of the documentation site, from the committed benchmark outputs: one command.

    python benchmarks/plots.py                    # reads benchmarks/results/<version>/, writes docs/images/
    python benchmarks/plots.py --out /tmp/figs    # somewhere else

Inputs (JSON under ``benchmarks/results/<version>/``, the folder named by the populora version that wrote the file;
each records the command, populora version and commit it came from; of a name in several version folders the
newest version's file is drawn):

- ``forward.json`` (``benchmarks/forward.py``): routed forward / plain forward on the same rows, by ``d``, ``P``,
  ``b`` and ``r`` -> ``forward-ratio.png``.
- ``es.json`` (``benchmarks/es.py``): one ES step against torcheggroll 0.2.0 and plain inference, by ``N`` ->
  ``es-vs-torcheggroll.png``.
- ``envs_<task>.json`` (``benchmarks/envs.py --json``): runs with per-generation histories -> one
  ``env-<task>.png`` each, the seeds' validated score against env steps (each seed a line, the band between the
  lowest and highest seed shaded).
- ``selfplay_arithmetic.json`` (``examples/selfplay_arithmetic.py``'s ``results.json``): the teachers' validity and
  the students' accuracy over steps -> ``selfplay.png``.

A figure whose input is not there is skipped and named on the output (so a new benchmark output only needs
committing and this command rerunning). Needs matplotlib (``pip install -e ".[examples]"``).
"""

from __future__ import annotations

import argparse
import json
import math
import re
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results"
IMAGES = REPO / "docs" / "images"
_DPI = 110


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plt.rcParams.update({"font.size": 9, "axes.grid": True, "grid.alpha": 0.3, "figure.dpi": _DPI})
    return plt


def _number(cell: str) -> float:
    """The first number in a table cell as written (``"6.4x"`` -> 6.4, ``"1,152"`` -> 1152)."""
    match = re.search(r"-?\d[\d,]*\.?\d*", cell)
    if match is None:
        raise ValueError(f"no number in {cell!r}")
    return float(match.group(0).replace(",", ""))


def _rows(report: dict[str, Any]) -> list[dict[str, str]]:
    return [dict(zip(report["columns"], row)) for row in report["rows"]]


def _source(report: dict[str, Any]) -> str:
    return f"populora {report['populora']} ({report['commit']}): {report['command']}"


def _save(fig: Any, path: Path) -> Path:
    fig.savefig(path, dpi=_DPI, bbox_inches="tight", metadata={"Software": None})
    _pyplot().close(fig)
    return path


def forward_ratio(report: dict[str, Any], path: Path) -> Path:
    """``all / pure`` and ``ids / pure`` of the MLP grid: a panel per ``d``, bars per ``r`` over ``(P, b)``."""
    plt = _pyplot()
    points = []
    for row in _rows(report):
        m = re.match(r"mlp d=(\d+) r=(\d+) P=(\d+) b=(\d+)( \*)?", row["point"])
        if m:
            d, r, p, b = (int(v) for v in m.groups()[:4])
            points.append(
                dict(
                    d=d,
                    r=r,
                    P=p,
                    b=b,
                    judged=m.group(5) is None,
                    all=_number(row["all / pure"]),
                    ids=_number(row["ids / pure"]),
                )
            )
    ds, rs = sorted({q["d"] for q in points}), sorted({q["r"] for q in points})
    groups = sorted({(q["P"], q["b"]) for q in points})
    fig, axes = plt.subplots(2, len(ds), figsize=(4.4 * len(ds), 6.2), sharey=True, squeeze=False, layout="constrained")
    width = 0.8 / len(rs)
    for col, d in enumerate(ds):
        for row, key in enumerate(("all", "ids")):
            ax = axes[row][col]
            for k, r in enumerate(rs):
                for g, (p, b) in enumerate(groups):
                    q = next((q for q in points if (q["d"], q["r"], q["P"], q["b"]) == (d, r, p, b)), None)
                    if q is None:
                        continue
                    ax.bar(
                        g + (k - (len(rs) - 1) / 2) * width,
                        q[key],
                        width,
                        color=f"C{k}",
                        hatch=None if q["judged"] else "///",
                        edgecolor="white",
                    )
            ax.axhline(1.0, color="black", lw=0.8)
            ax.axhline(1.05, color="C3", lw=0.8, ls="--")
            ax.set_xticks(range(len(groups)), [f"P={p}\nb={b}" for p, b in groups])
            ax.set_ylim(0.8, max(2.1, max(q[key] for q in points) + 0.1))
            ax.set_title(f"d = {d}: {'all' if key == 'all' else 'ids (shuffled)'} / plain", fontsize=9)
            if col == 0:
                ax.set_ylabel("routed time / plain time")
    from matplotlib.patches import Patch

    handles = [Patch(color=f"C{k}", label=f"rank r = {r}") for k, r in enumerate(rs)]
    handles.append(Patch(facecolor="lightgray", hatch="///", edgecolor="white", label="not judged"))
    handles.append(plt.Line2D([], [], color="C3", ls="--", lw=0.8, label="target 1.05"))
    axes[0][0].legend(handles=handles, loc="upper left", fontsize=7)
    fig.suptitle("Routed forward vs the plain model on the same rows (MLP; hatched: adapters larger than the base)")
    fig.text(0.01, -0.01, _source(report), fontsize=7, color="gray")
    return _save(fig, path)


def es_vs_torcheggroll(report: dict[str, Any], path: Path) -> Path:
    """Time and memory of one ES step by ``N``: ours, ours per individual, plain inference, torcheggroll."""
    plt = _pyplot()
    rows = _rows(report)
    n = [_number(r["N"]) for r in rows]
    fig, (left, right) = plt.subplots(1, 2, figsize=(9.5, 3.8), layout="constrained")
    for column, label, style in (
        ("torcheggroll ms", "torcheggroll 0.2.0", dict(color="C3", marker="s")),
        ("ours ms", "populora (shared batch)", dict(color="C0", marker="o")),
        ("ours_pm ms", "populora (each member its own rows)", dict(color="C0", marker="o", ls="--")),
        ("plain ms", "plain inference of the same rows", dict(color="gray", marker=".", ls=":")),
    ):
        left.plot(n, [_number(r[column]) for r in rows], label=label, **style)
    for column, label, style in (
        ("torcheggroll MB", "torcheggroll 0.2.0", dict(color="C3", marker="s")),
        ("ours MB", "populora (default)", dict(color="C0", marker="o")),
        ("ours_rows MB", "populora (max_rows=8192)", dict(color="C2", marker="^")),
    ):
        right.plot(n, [_number(r[column]) for r in rows], label=label, **style)
    for ax, what in ((left, "ms per ES step"), (right, "peak MB per ES step")):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("population size N")
        ax.set_ylabel(what)
        ax.legend(fontsize=7)
    left.set_title("time (lower is better)", fontsize=9)
    right.set_title("memory (lower is better)", fontsize=9)
    fig.suptitle("One ES step on Linear(256, 1024) - ReLU - Linear(1024, 256), batch 64, rank 4")
    fig.text(0.01, -0.04, _source(report), fontsize=7, color="gray", wrap=True)
    return _save(fig, path)


def _step_values(history: list[dict[str, Any]], key: str) -> tuple[list[float], list[float]]:
    xs, ys = [], []
    best = -math.inf
    for h in history:
        value = h.get(key)
        if value is None or h.get("env_steps") is None:
            continue
        best = max(best, float(value))  # the champion so far: what the run would return at that point
        xs.append(float(h["env_steps"]))
        ys.append(best)
    return xs, ys


def env_curves(report: dict[str, Any], path: Path) -> Path | None:
    """Each seed's best validated score so far against env steps; the band between the lowest and highest seed."""
    runs = [r for r in report["runs"] if r.get("history")]
    if not runs:
        return None
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6.4, 3.8), layout="constrained")
    curves = []
    for k, run in enumerate(sorted(runs, key=lambda r: r["seed"])):
        key = "validated" if any(h.get("validated") is not None for h in run["history"]) else "best"
        xs, ys = _step_values(run["history"], key)
        if xs:
            curves.append((xs, ys))
            ax.step(xs, ys, where="post", lw=1, color="C0", alpha=0.55, label="a seed" if k == 0 else None)
    if len(curves) > 1:
        grid = sorted({x for xs, _ in curves for x in xs})
        at = [
            [next((y for x, y in zip(reversed(xs), reversed(ys)) if x <= g), math.nan) for g in grid]
            for xs, ys in curves
        ]
        low = [min((v for v in col if not math.isnan(v)), default=math.nan) for col in zip(*at)]
        high = [max((v for v in col if not math.isnan(v)), default=math.nan) for col in zip(*at)]
        ax.fill_between(
            grid, low, high, step="post", color="C0", alpha=0.2, label=f"{len(curves)} seeds: lowest to highest"
        )
    target = runs[0].get("target")
    if target is not None:
        ax.axhline(float(target), color="C3", ls="--", lw=0.8, label=f"target {target:g}")
    ax.set_xlabel("env steps (training and validation)")
    ax.set_ylabel("best validated score so far")
    algorithm = runs[0]["algorithm"].upper()
    ax.set_title(f"{runs[0]['task']} ({algorithm}): validated score while evolving", fontsize=9)
    ax.legend(fontsize=7, loc="lower right")
    fig.text(0.01, -0.04, _source(report), fontsize=7, color="gray", wrap=True)
    return _save(fig, path)


def selfplay(report: dict[str, Any], path: Path) -> Path | None:
    """The teachers' validity and the students' accuracy per step; the validation curve where recorded."""
    history = report.get("history") or []
    if not history:
        return None
    plt = _pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=(9.5, 3.6), layout="constrained")
    steps = [h["step"] + 1 for h in history]  # a record's step counts from 0: plot it where that step is done
    left.plot(steps, [h["validity"] for h in history], color="C1", lw=1)
    left.set_title("teachers' proposals that are valid problems", fontsize=9)
    left.set_ylim(-0.02, 1.02)
    left.set_xlabel("self-play steps done")
    left.set_ylabel("validity")
    right.plot(
        steps, [h["student_mean"] for h in history], color="C0", lw=1, alpha=0.6, label="students' mean (training)"
    )
    curve = report.get("curve") or []
    if curve:
        right.plot([c["step"] for c in curve], [c["mean"] for c in curve], "o-", color="C2", label="validation: mean")
        right.plot([c["step"] for c in curve], [c["best"] for c in curve], "s--", color="C2", label="validation: best")
    if report.get("base_heldout") is not None:
        right.axhline(report["base_heldout"], color="gray", ls=":", label="base model, held-out")
    right.set_ylim(-0.02, 1.02)
    right.set_xlabel("self-play steps done")
    right.set_ylabel("accuracy")
    right.set_title("students", fontsize=9)
    right.legend(fontsize=7)
    fig.suptitle(f"Self-play on {report.get('model', 'a language model')}: {report.get('task', '')}", fontsize=9)
    command = report.get("command", "examples/selfplay_arithmetic.py")
    fig.text(0.01, -0.04, f"populora {report.get('populora', '?')}: {command}", fontsize=7, color="gray", wrap=True)
    return _save(fig, path)


def llm_generate(report: dict[str, Any], path: Path) -> Path:
    """Routed generation on SmolLM2-135M: tokens / s by population size, routed vs plain vs PEFT's mixed batch."""
    plt = _pyplot()
    rows = _rows(report)
    pops = [r["P"] for r in rows]
    plain = [_number(r["plain batched tok/s"]) for r in rows]
    routed = [_number(r["routed tok/s"]) for r in rows]
    peft = [a / _number(r["vs PEFT mixed batch"]) for a, r in zip(routed, rows)]  # "2.12x faster" than PEFT
    fig, ax = plt.subplots(figsize=(6.4, 3.4), layout="constrained")
    x = range(len(pops))
    for k, (values, label) in enumerate(
        [
            (plain, "plain batched generate of the base"),
            (routed, "routed: every row its own individual"),
            (peft, "PEFT mixed-adapter batch"),
        ]
    ):
        ax.bar([i + (k - 1) * 0.27 for i in x], values, width=0.27, label=label)
    ax.set_xticks(list(x), [f"P = {p}" for p in pops])
    ax.set_ylabel("tokens / s")
    ax.set_title("Routed generation, SmolLM2-135M (same tokens as PEFT)", fontsize=9)
    ax.legend(fontsize=7)
    fig.text(0.01, -0.04, _source(report), fontsize=7, color="gray", wrap=True)
    return _save(fig, path)


def selfplay_arms(reports: list[dict[str, Any]], path: Path) -> Path | None:
    """PopuLoRA's loop and its single-agent arms on SmolLM2: held-out accuracy before (the base) and after."""
    reports = [r for r in reports if r.get("scores") and r.get("base")]
    if not reports:
        return None
    plt = _pyplot()
    splits = list(reports[0]["scores"])
    fig, axes = plt.subplots(1, len(splits), figsize=(2.6 * len(splits), 3.4), layout="constrained", sharey=True)
    labels = [f"{r['family']} {r['arm']} s{r['seed']}" for r in reports]
    for ax, split in zip(axes, splits):
        x = range(len(reports))
        ax.bar([i - 0.2 for i in x], [r["base"][split] for r in reports], width=0.4, color="gray", label="base")
        ax.bar([i + 0.2 for i in x], [r["scores"][split] for r in reports], width=0.4, color="C0", label="after")
        ax.set_xticks(list(x), labels, rotation=60, fontsize=6)
        ax.set_title(f"held out: {split}", fontsize=8)
        ax.set_ylim(0, 1)
    axes[0].set_ylabel("accuracy")
    axes[0].legend(fontsize=7)
    arms = sorted({f"{r['arm']}: {r['arm_name']}" for r in reports})
    fig.suptitle("Self-play on SmolLM2-135M-Instruct, the chosen student before and after", fontsize=9)
    fig.text(
        0.01,
        -0.1,
        "; ".join(arms) + " (populora 0.5.0, experiments/paper_loop.py)",
        fontsize=6,
        color="gray",
        wrap=True,
    )
    return _save(fig, path)


def version_key(folder: str) -> tuple[int, ...]:
    """``'0.3.1'`` -> ``(0, 3, 1)``; a folder not named by a version sorts first."""
    parts = re.findall(r"\d+", folder)
    return tuple(int(p) for p in parts) if re.match(r"^\d+(\.\d+)*", folder) else ()


def newest(results: Path, name: str) -> Path | None:
    """``results/<version>/<name>`` of the newest version holding it (or ``results/<name>`` itself), else None."""
    found = sorted(results.glob(f"*/{name}"), key=lambda p: version_key(p.parent.name))
    if found:
        return found[-1]
    return results / name if (results / name).exists() else None


def main(results: Path = RESULTS, out: Path = IMAGES) -> dict[str, Path | None]:
    """Write every figure whose input exists; ``{figure name: path, or None when skipped}``."""
    out.mkdir(parents=True, exist_ok=True)
    load = lambda name: json.loads(path.read_text()) if (path := newest(results, name)) is not None else None
    made: dict[str, Path | None] = {}
    report = load("forward.json")
    made["forward-ratio.png"] = forward_ratio(report, out / "forward-ratio.png") if report else None
    report = load("es.json")
    made["es-vs-torcheggroll.png"] = es_vs_torcheggroll(report, out / "es-vs-torcheggroll.png") if report else None
    names = sorted({p.name for p in [*results.glob("envs_*.json"), *results.glob("*/envs_*.json")]})
    for source in (newest(results, name) for name in names):
        task = source.stem.removeprefix("envs_")
        report = json.loads(source.read_text())
        if "runs" in report:  # envs_tasks.json is the table of final scores, without histories
            made[f"env-{task}.png"] = env_curves(report, out / f"env-{task}.png")
    report = load("generate.json")
    made["llm-generate.png"] = llm_generate(report, out / "llm-generate.png") if report else None
    paper = sorted((results.parent.parent / "experiments" / "results").glob("*/paper/*-seed*.json"))
    made["selfplay-arms.png"] = selfplay_arms([json.loads(p.read_text()) for p in paper], out / "selfplay-arms.png")
    report = load("selfplay_arithmetic.json")
    made["selfplay.png"] = selfplay(report, out / "selfplay.png") if report else None
    return made


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--results", type=Path, default=RESULTS, help="the benchmark outputs (JSON)")
    parser.add_argument("--out", type=Path, default=IMAGES, help="where the PNGs go")
    args = parser.parse_args()
    for name, path in main(args.results, args.out).items():
        print(f"{name}: {path if path else 'skipped (no input with data)'}")
