#!/usr/bin/env bash
# Issue 24 (lane A: timing ratios). This tree and 0.3.1 (a git worktree of 5d166a4 at $V031, default
# outputs/v031, made here when missing, holding copies of this tree's two benchmark scripts) side by side,
# one process each at the same time:
#   1. benchmarks/forward.py --skip-memory --no-loop  (paired all/pure, ids/pure per point; --resume keeps
#      the points a stopped run already wrote to its JSON)
#   2. benchmarks/interact.py --repeats 3 --cpu-time --no-vector-path  (routed evaluate vs the unrouted policy
#      and the critical path; a finished JSON (4 rows) is kept)
# Load (uptime) before, every 30 s during, after. Resumable: rerun this script; finished parts are kept.
#   nohup bash experiments/queues/side_by_side_031.sh > outputs/logs/side_by_side_031.log 2>&1 &
# Outputs: outputs/bench/i24m/ (the committed summary: benchmarks/results/0.5.0/forward_vs_031.json, interact_env_loop.json)
source "$(dirname "$0")/_common.sh"
whole_queue_in_lane a "$@"
V031=${V031:-$REPO/outputs/v031}
if [ ! -d "$V031" ]; then
  git worktree add "$V031" 5d166a4 && cp benchmarks/forward.py benchmarks/interact.py "$V031/benchmarks/" || exit 1
fi
R=$REPO/outputs/bench/i24m
mkdir -p "$R"
export OMP_NUM_THREADS=1
echo "start $(date -u +%FT%TZ) $(uptime)" | tee -a "$R/load.txt"
watch_load() { while sleep 30; do echo "$(date -u +%T) $(uptime)" >> "$R/load.txt"; done; }
watch_load &
WATCH=$!
trap 'kill $WATCH 2>/dev/null' EXIT
rows() { [ -f "$1" ] && "$PY" -c "import json,sys; print(len(json.load(open(sys.argv[1]))['rows']))" "$1" 2>/dev/null || echo 0; }
if [ "$(rows "$R/int_new.json")" -lt 4 ] || [ "$(rows "$R/int_v031.json")" -lt 4 ]; then
  echo "interact start $(date -u +%T) $(uptime)" >> "$R/load.txt"
  PYTHONPATH=$REPO "$PY" benchmarks/interact.py --repeats 3 --cpu-time --no-vector-path \
      --json "$R/int_new.json" > "$R/int_new.log" 2>&1 &
  A=$!
  PYTHONPATH=$V031 "$PY" "$V031/benchmarks/interact.py" --repeats 3 --cpu-time --no-vector-path \
      --json "$R/int_v031.json" > "$R/int_v031.log" 2>&1 &
  B=$!
  wait $A $B
  echo "interact end $(date -u +%T) $(uptime)" >> "$R/load.txt"
fi
if [ "$(rows "$R/fwd_new.json")" -lt 26 ] || [ "$(rows "$R/fwd_v031.json")" -lt 26 ]; then
  echo "forward start $(date -u +%T) $(uptime)" >> "$R/load.txt"
  PYTHONPATH=$REPO "$PY" benchmarks/forward.py --skip-memory --no-loop --min-time 0.1 --resume \
      --json "$R/fwd_new.json" >> "$R/fwd_new.log" 2>&1 &
  A=$!
  (cd "$V031" && PYTHONPATH=$V031 "$PY" benchmarks/forward.py --skip-memory --no-loop --min-time 0.1 --resume \
      --json "$R/fwd_v031.json" >> "$R/fwd_v031.log" 2>&1) &
  B=$!
  wait $A $B
  echo "forward end $(date -u +%T) $(uptime)" >> "$R/load.txt"
fi
"$PY" benchmarks/forward.py --compare "$R/fwd_v031.json" "$R/fwd_new.json" > "$R/forward_compare.md" 2>&1
echo "end $(date -u +%FT%TZ) $(uptime)" | tee -a "$R/load.txt"
echo done > "$R/done"
