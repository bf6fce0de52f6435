#!/usr/bin/env bash
# The GPU figures of issues 15 and 24 in one run, then ONE summary table on stdout:
#   - routed forward vs pure inference at d = 4096, bf16, r = 1 / 4 / 16, P = 8 / 64 / 256 (and the
#     transformer points), per P: target <= 1.10, lock-step (all_individuals) P >= 64 within 1.11;
#   - the overhead when no row has an adapter (routing off; every row BASE): target <= 1.02;
#   - one decode step with many individuals: the GEMM operators per target beyond the plain step, counted
#     with the torch profiler at P = 4 / 16 / 64 (never one product per individual);
#   - routed generation tokens/s vs plain batched generation, a random 0.5B Llama built by transformers,
#     P = 4 / 16 / 64;
#   - one training step of P individuals vs one LoRA over the same rows;
#   - one ES step vs plain inference (+ the same loss), and vs EvoX (below);
#   - the self-play loop's step on one GPU, 8 adapters vs 1 at equal rows per adapter (the paper's 1.31x), a
#     random Llama of SmolLM2-135M's shape built by transformers, for the one-batch and the per-member sampler;
#   - the loop by member on 2 ranks over NCCL (one GPU each): the same tokens as one process, and the step's
#     wall clock ratio; skipped, saying so under the table, with fewer than 2 GPUs (gloo on CPU in the smoke).
# Every figure is a ratio of two things measured in the same process.
#
#   bash benchmarks/gpu.sh               # one CUDA GPU; the whole run is bounded by GPU_BUDGET (330 s)
#   bash benchmarks/gpu.sh --cpu-smoke   # the same script path on CPU, tiny sizes (POPULORA_GPU_SMOKE=1 too)
#
# It needs only torch, transformers (the Llama checks; without it they are noted as failed) and populora's
# own dependencies, and installs nothing. It runs, each under its own time limit (and within the budget),
#   benchmarks/forward.py --device cuda --min-time 0.1 --pops 8 64 256 --no-loop --json forward.json
#   benchmarks/gpu_checks.py --device cuda --json checks.json
#   benchmarks/es.py --device cuda --pops 512,2048 --repeats 2 --min-time 0.5 \
#       --methods plain,plain_loss,ours,ours_unshared,ours_pm --json es.json    (float32, as the CPU table)
#   benchmarks/selfplay_gpu.py cost --json selfplay.json; benchmarks/selfplay_gpu.py ranks --json ranks.json
# keeps their full output in the output folder ($GPU_BENCH_OUT, else $OUT, else outputs/gpu/ in the
# repository: forward.log, checks.log, es.log, their JSON files, summary.md), and prints the summary.
# Progress goes to stderr; the exit status is 0 when every stage ran and its figures were read.
#
# EvoX side by side (issue 24; EvoX is never a dependency, only a black box): with EVOX_WHEELS naming a
# folder that holds EvoX's wheel, prepared where PyPI is reachable (the GPU machine has no network) with
#   python3 -m pip download --no-deps --only-binary=:all: -d outputs/evox-wheels evox==1.4.0
# (add numpy's wheel for the GPU machine's Python only if that Python lacks numpy) and carried to the GPU
# machine (outputs/ is git-ignored: carry it, never commit it), the script installs the wheels into a
# temporary folder outside the repository (pip --target --no-deps --no-index; unzipped if pip is missing),
# using the machine's own torch, and runs
#   benchmarks/es.py --device cuda --pops 512,2048 --repeats 2 --min-time 0.5 --methods ours,evox \
#       --evox-python PYTHON --json evox.json                       (EvoX's VirtualLoRAES vs EggrollES)
# adding `EvoX / ours` time and memory rows to the summary. Without EVOX_WHEELS (or without a wheel in
# it) it says why it skipped EvoX, and that changes neither the table nor the exit status.
#
# Environment: PYTHON (interpreter; default the repository's .venv, else python3), GPU_BENCH_OUT,
# GPU_BUDGET (seconds for the whole run, default 420 on CUDA), FORWARD_TIMEOUT / CHECKS_TIMEOUT /
# ES_TIMEOUT / EVOX_TIMEOUT / SELFPLAY_TIMEOUT / RANKS_TIMEOUT (seconds per stage; defaults 120 / 150 / 100 /
# 90 / 60 / 60 on CUDA, each cut to what is left of the budget), EVOX_WHEELS.

set -u
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
SMOKE="${POPULORA_GPU_SMOKE:-0}"
for arg in "$@"; do
  case "$arg" in
    --cpu-smoke) SMOKE=1 ;;
    -h|--help) sed -n '2,/^set -u/p' "${BASH_SOURCE[0]}" | grep '^#' | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "gpu.sh: unknown argument '$arg' (expected --cpu-smoke or --help)" >&2; exit 2 ;;
  esac
done
[ "$SMOKE" = "1" ] || SMOKE=0

PY="${PYTHON:-}"
if [ -z "$PY" ]; then
  if [ -x "$REPO/.venv/bin/python" ]; then PY="$REPO/.venv/bin/python"; else PY=python3; fi
fi
OUTDIR="${GPU_BENCH_OUT:-${OUT:-$REPO/outputs/gpu}}"
mkdir -p "$OUTDIR" || exit 2
EVOX_DIR="${EVOX_WHEELS:-}"
if [ -n "$EVOX_DIR" ] && [ -d "$EVOX_DIR" ]; then EVOX_DIR="$(cd "$EVOX_DIR" && pwd)"; fi  # before the cd below
cd "$REPO" || exit 2
export PYTHONUNBUFFERED=1 PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"

if [ "$SMOKE" = "1" ]; then
  DEVICE=cpu
  FORWARD_ARGS=(--device cpu --quick --no-loop --min-time 0.01 --skip-memory --match "P=16 |transformer")
  CHECKS_ARGS=(--smoke --min-time 0.005 --repeats 1)
  ES_ARGS=(--device cpu --pops 4 --repeats 1 --min-time 0.01 --methods plain,plain_loss,ours,ours_unshared,ours_pm --in-process)
  EVOX_ARGS=(--device cpu --pops 4 --repeats 1 --min-time 0.01 --methods ours,evox --in-process)
  SELFPLAY_ARGS=(--smoke)
  SELFPLAY_TIMEOUT="${SELFPLAY_TIMEOUT:-120}"
  RANKS_TIMEOUT="${RANKS_TIMEOUT:-120}"
  BUDGET="${GPU_BUDGET:-900}"
  FORWARD_TIMEOUT="${FORWARD_TIMEOUT:-300}"
  CHECKS_TIMEOUT="${CHECKS_TIMEOUT:-300}"
  ES_TIMEOUT="${ES_TIMEOUT:-120}"
  EVOX_TIMEOUT="${EVOX_TIMEOUT:-120}"
else
  DEVICE=cuda
  FORWARD_ARGS=(--device cuda --min-time 0.1 --pops 8 64 256 --no-loop)
  CHECKS_ARGS=(--device cuda)
  ES_ARGS=(--device cuda --pops 512,2048 --repeats 2 --min-time 0.5 --methods plain,plain_loss,ours,ours_unshared,ours_pm)
  EVOX_ARGS=(--device cuda --pops 512,2048 --repeats 2 --min-time 0.5 --methods ours,evox)
  SELFPLAY_ARGS=()
  SELFPLAY_TIMEOUT="${SELFPLAY_TIMEOUT:-60}"
  RANKS_TIMEOUT="${RANKS_TIMEOUT:-60}"
  BUDGET="${GPU_BUDGET:-420}"
  FORWARD_TIMEOUT="${FORWARD_TIMEOUT:-120}"
  CHECKS_TIMEOUT="${CHECKS_TIMEOUT:-150}"
  ES_TIMEOUT="${ES_TIMEOUT:-100}"
  EVOX_TIMEOUT="${EVOX_TIMEOUT:-90}"
fi

# what runs where (and, on CUDA, that there is a GPU at all)
if ! "$PY" - "$DEVICE" >"$OUTDIR/env.txt" 2>&1 <<'PY'
import sys
import torch
if sys.argv[1] == "cuda":
    if not torch.cuda.is_available():
        sys.exit("no CUDA device visible to torch " + torch.__version__ + ": run with --cpu-smoke for the CPU check")
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}, CUDA {torch.version.cuda}")
else:
    print(f"torch {torch.__version__}, CPU (smoke run: tiny sizes, figures not meaningful)")
PY
then
  cat "$OUTDIR/env.txt" >&2
  exit 2
fi
echo "gpu.sh: $(cat "$OUTDIR/env.txt"); logs in $OUTDIR" >&2

run() {  # run NAME TIMEOUT CMD...: the command's output to NAME.log; its exit status in NAME.rc
  local name="$1" limit="$2"
  shift 2
  local left=$((BUDGET - SECONDS - 15))  # (15 s kept for the summary)
  if [ "$left" -lt "$limit" ]; then limit=$left; fi
  if [ "$limit" -lt 5 ]; then
    echo "124" >"$OUTDIR/$name.rc"
    echo "gpu.sh: $name: skipped, the budget of $BUDGET s is spent" | tee "$OUTDIR/$name.log" >&2
    return
  fi
  local begin=$SECONDS
  echo "gpu.sh: $name (limit $limit s): $*" >&2
  timeout --kill-after=10 "$limit" "$@" >"$OUTDIR/$name.log" 2>&1
  local rc=$?
  echo "$rc" >"$OUTDIR/$name.rc"
  echo "gpu.sh: $name: exit $rc after $((SECONDS - begin)) s" >&2
}

rm -f "$OUTDIR/es.json" "$OUTDIR/evox.json" "$OUTDIR/evox.rc" "$OUTDIR/forward.json" "$OUTDIR/checks.json" \
  "$OUTDIR/selfplay.json" "$OUTDIR/ranks.json"
run forward "$FORWARD_TIMEOUT" "$PY" -u benchmarks/forward.py "${FORWARD_ARGS[@]}" --json "$OUTDIR/forward.json"
run checks "$CHECKS_TIMEOUT" "$PY" -u benchmarks/gpu_checks.py "${CHECKS_ARGS[@]}" --json "$OUTDIR/checks.json"
run es "$ES_TIMEOUT" "$PY" -u benchmarks/es.py "${ES_ARGS[@]}" --json "$OUTDIR/es.json"
run selfplay "$SELFPLAY_TIMEOUT" "$PY" -u benchmarks/selfplay_gpu.py cost "${SELFPLAY_ARGS[@]}" --json "$OUTDIR/selfplay.json"
run ranks "$RANKS_TIMEOUT" "$PY" -u benchmarks/selfplay_gpu.py ranks "${SELFPLAY_ARGS[@]}" --json "$OUTDIR/ranks.json"

# EvoX side by side, from the wheels in EVOX_WHEELS (see the top): installed outside the repository
EVOX_SKIP="" EVOX_CMD=""
if [ -z "$EVOX_DIR" ]; then
  EVOX_SKIP="EVOX_WHEELS not set"
elif [ ! -d "$EVOX_DIR" ]; then
  EVOX_SKIP="EVOX_WHEELS=$EVOX_DIR is not a folder"
elif ! compgen -G "$EVOX_DIR/evox-*.whl" >/dev/null; then
  EVOX_SKIP="no evox-*.whl in EVOX_WHEELS=$EVOX_DIR"
else
  EVOX_SITE="$(mktemp -d "${TMPDIR:-/tmp}/populora-evox.XXXXXX")" || exit 2
  trap 'rm -rf "$EVOX_SITE"' EXIT
  wheels=("$EVOX_DIR"/evox-*.whl)
  if ! "$PY" -c "import numpy" 2>/dev/null && compgen -G "$EVOX_DIR/numpy-*.whl" >/dev/null; then
    wheels+=("$EVOX_DIR"/numpy-*.whl)  # evox needs numpy; torch usually brings it
  fi
  if "$PY" -m pip --version >/dev/null 2>&1; then
    "$PY" -m pip install --quiet --disable-pip-version-check --no-index --no-deps --target "$EVOX_SITE" \
      "${wheels[@]}" >"$OUTDIR/evox-install.log" 2>&1
  else  # a wheel is a zip archive laid out as site-packages
    for wheel in "${wheels[@]}"; do "$PY" -m zipfile -e "$wheel" "$EVOX_SITE" || break; done >"$OUTDIR/evox-install.log" 2>&1
  fi
  if PYTHONPATH="$EVOX_SITE:$PYTHONPATH" "$PY" -c "import evox" >>"$OUTDIR/evox-install.log" 2>&1; then
    EVOX_CMD="python benchmarks/es.py $(printf '%q ' "${EVOX_ARGS[@]}")--evox-python PYTHON"
    run evox "$EVOX_TIMEOUT" env PYTHONPATH="$EVOX_SITE:$PYTHONPATH" "$PY" -u benchmarks/es.py "${EVOX_ARGS[@]}" \
      --evox-python "$PY" --json "$OUTDIR/evox.json"
  else
    EVOX_SKIP="evox from $EVOX_DIR does not import (see $OUTDIR/evox-install.log)"
  fi
fi
[ -z "$EVOX_SKIP" ] || echo "gpu.sh: evox: skipped ($EVOX_SKIP)" >&2

"$PY" - "$OUTDIR" "$FORWARD_TIMEOUT" "$ES_TIMEOUT" "python benchmarks/forward.py $(printf '%q ' "${FORWARD_ARGS[@]}")" \
  "python benchmarks/es.py $(printf '%q ' "${ES_ARGS[@]}")" "$EVOX_CMD" "$EVOX_SKIP" "$CHECKS_TIMEOUT" \
  "python benchmarks/gpu_checks.py $(printf '%q ' "${CHECKS_ARGS[@]}")" "$SECONDS" "$SELFPLAY_TIMEOUT" \
  "$RANKS_TIMEOUT" "python benchmarks/selfplay_gpu.py cost|ranks $(printf '%q ' "${SELFPLAY_ARGS[@]}")" <<'PY'
"""Read forward.log, checks.json, es.json and evox.json; print the one summary table (also written to
summary.md)."""
import json
import math
import re
import sys
from pathlib import Path

out, fwd_limit, es_limit = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
fwd_cmd, es_cmd = sys.argv[4].strip(), sys.argv[5].strip()
evox_cmd, evox_skip = sys.argv[6].strip(), sys.argv[7]
checks_limit, checks_cmd, elapsed = sys.argv[8], sys.argv[9].strip(), sys.argv[10]
selfplay_limit, ranks_limit, selfplay_cmd = sys.argv[11], sys.argv[12], sys.argv[13].strip()
rc = {name: (out / f"{name}.rc").read_text().strip() for name in ("forward", "checks", "es", "selfplay", "ranks")}
notes, rows = [], []
POINT = re.compile(r"^(?P<label>(?:mlp|transformer) .*?)(?P<star> \*)?\s+(?P<n>\d+)\s+(?P<pure>[\d.]+)\s+"
                   r"(?P<all>[\d.]+)\s+(?P<ids>[\d.]+)\s+(?P<ids_all>[\d.]+)\s")


def stage_note(name, limit):
    code = rc[name]
    if code == "0":
        return
    why = f"timed out after {limit} s" if code in ("124", "137") else f"exit {code}"
    notes.append(f"{name} failed ({why}); see {out / (name + '.log')}")


def fmt(value):
    return "-" if value is None or not math.isfinite(value) else f"{value:.3f}"


geo = lambda xs: math.exp(sum(map(math.log, xs)) / len(xs)) if xs else None

# ---- routed forward
stage_note("forward", fwd_limit)
log = (out / "forward.log").read_text(errors="replace") if (out / "forward.log").exists() else ""
points = []
for line in log.splitlines():
    m = POINT.match(line)
    if m:
        dim = re.search(r"\bd(?:im)?=(\d+)", m["label"])
        points.append(dict(label=m["label"].strip(), judged=not m["star"], kind=m["label"].split()[0],
                           d=int(dim[1]) if dim else 0, all=float(m["all"]), ids_all=float(m["ids_all"])))
mlps = [p for p in points if p["kind"] == "mlp"]
if not mlps:
    notes.append(f"no routed-forward points found in {out / 'forward.log'}")
d = max((p["d"] for p in mlps), default=None)
at_d = [p for p in mlps if p["d"] == d]
judged = [p for p in at_d if p["judged"]]
worst = max(judged, key=lambda p: p["all"], default=None)
where = f"mlp d={d}" if d else "mlp"
rows.append(("forward all / pure, geometric mean, judged points", f"{where} ({len(judged)} points)",
             fmt(geo([p["all"] for p in judged])), "<= 1.05"))
rows.append(("forward all / pure, worst judged point", worst["label"] if worst else where,
             fmt(worst["all"] if worst else None), "<= 1.30"))
rows.append(("forward all / pure, geometric mean, all points", f"{where} ({len(at_d)} points)",
             fmt(geo([p["all"] for p in at_d])), "reported"))
rows.append(("forward ids / all, geometric mean", f"{where} ({len(at_d)} points)",
             fmt(geo([p["ids_all"] for p in at_d])), "<= 1.10"))
for p in points:
    if p["kind"] == "transformer":
        rows.append(("forward all / pure, transformer", p["label"] + ("" if p["judged"] else " *"), fmt(p["all"]),
                     "reported"))
for P in sorted({int(re.search(r"\bP=(\d+)", p["label"])[1]) for p in at_d}):
    at_p = [p for p in at_d if re.search(rf"\bP={P}\b", p["label"])]
    rows.append((f"forward all / pure, geometric mean at P={P}", f"{where}, r = 1 / 4 / 16 ({len(at_p)} points)",
                 fmt(geo([p["all"] for p in at_p])), "<= 1.11 (lock-step)" if P >= 64 else "<= 1.10"))

# ---- the checks of gpu_checks.py: no-adapter overhead, decode kernels, generation, training step
stage_note("checks", checks_limit)
if (out / "checks.json").exists():
    report = json.loads((out / "checks.json").read_text())
    for row in report["rows"]:
        rows.append((f"{row['check']}: {row['what']}", row["point"], fmt(row["value"]), row["target"]))
    notes += [f"checks: {name} could not run: {why}" for name, why in report["failures"].items()]
else:
    notes.append(f"no check results ({out / 'checks.json'} missing)")

# ---- ES step
stage_note("es", es_limit)
ratios, pops = {}, []
if (out / "es.json").exists():
    report = json.loads((out / "es.json").read_text())
    ratios, pops = report["ratios"], report["pops"]
else:
    notes.append(f"no ES results ({out / 'es.json'} missing)")
for pop in pops or ["-"]:
    for method, kind, what, target in (("ours", "thr", "plain inference", "reported"),
                                       ("ours", "thr+loss", "plain inference + the same loss", ">= 0.90"),
                                       ("ours_unshared", "thr+loss", "plain inference + the same loss", ">= 0.90"),
                                       ("ours_pm", "thr+loss", "plain inference + the same loss", "reported")):
        label = "ES step throughput / " + what + {"ours_pm": ", own rows per member",
                                                  "ours_unshared": ", first layer per member"}.get(method, "")
        rows.append((label, f"N={pop}", fmt(ratios.get(f"{method} {kind} N={pop}")), target))

# ---- the self-play loop: 8 adapters / 1 at equal rows per adapter; 2 ranks by member (skipped: a line, no row)
stage_note("selfplay", selfplay_limit)
report = json.loads((out / "selfplay.json").read_text()) if (out / "selfplay.json").exists() else {}
point = f"{report.get('model', '-')}, b={report.get('rows_per_adapter', '-')}, {report.get('new_tokens', '-')} new tokens"
for sampler, how in (("batch", "one routed batch"), ("member", "per-member blocks")):
    rows.append((f"selfplay: loop step, 8 adapters / 1 at equal rows per adapter, {how}", point,
                 fmt(report.get("ratio_8_over_1", {}).get(sampler)), "reported (the paper: 1.31)"))
skip_lines = []
stage_note("ranks", ranks_limit)
report = json.loads((out / "ranks.json").read_text()) if (out / "ranks.json").exists() else {}
if "skipped" in report:
    skip_lines.append(f"selfplay ranks: skipped ({report['skipped']})")
else:
    backend = report.get("backend", "-")
    same = report.get("same_tokens")
    rows.append(("selfplay: 2 ranks by member, token ids equal to 1 process (1 = yes)", f"{backend}, 4 + 4 members",
                 fmt(None if same is None else float(same)), "= 1"))
    rows.append(("selfplay: 2 ranks by member, step wall clock / 1 process", f"{backend}, 4 + 4 members",
                 fmt(report.get("wall_ratio_2_over_1")), "reported"))
    if same is False:
        notes.append("selfplay ranks: the 2-rank run sampled other token ids than the 1-process run")

# ---- EvoX side by side: rows only where it ran; a skip or a failure is a line under the table (EvoX is a
# third party's black box, so neither makes the script fail)
evox_lines = []
if evox_skip:
    evox_lines.append(f"evox: skipped ({evox_skip})")
elif evox_cmd:
    report = json.loads((out / "evox.json").read_text()) if (out / "evox.json").exists() else {}
    found = False
    for pop in report.get("pops", []):
        time_ratio = report["ratios"].get(f"evox/ours time N={pop}")
        if time_ratio is not None:
            found = True
            rows.append(("ES step time, EvoX VirtualLoRAES / ours", f"N={pop}", fmt(time_ratio), "reported"))
            rows.append(("ES step peak memory, EvoX VirtualLoRAES / ours", f"N={pop}",
                         fmt(report["ratios"][f"evox/ours mem N={pop}"]), "reported"))
    code = (out / "evox.rc").read_text().strip() if (out / "evox.rc").exists() else "?"
    if not found:
        why = "timed out" if code in ("124", "137") else f"exit {code}"
        evox_lines.append(f"evox: no EvoX / ours ratio ({why}); see {out / 'evox.log'}")
    evox_lines += [f"evox: {what} failed: {error}" for what, error in report.get("failures", {}).items()]

lines = [f"device: {(out / 'env.txt').read_text().strip()}",
         f"commands: {fwd_cmd}; {checks_cmd}; {es_cmd}; {selfplay_cmd}" + (f"; {evox_cmd}" if evox_cmd else ""),
         f"whole run: {elapsed} s", "",
         "| measure | point | value | target |", "| --- | --- | ---: | --- |"]
lines += [f"| {a} | {b} | {c} | {t} |" for a, b, c, t in rows]
lines += [""] + evox_lines + skip_lines + [f"note: {n}" for n in notes]
text = "\n".join(lines).rstrip() + "\n"
(out / "summary.md").write_text(text)
print(text, end="")
missing = any(r[2] == "-" for r in rows)
sys.exit(1 if notes or missing else 0)
PY
