#!/usr/bin/env bash
# Issue 24, second measurement (lane A), resumable (rerun; finished parts are kept):
# 0.3.1 side: a git worktree of 5d166a4 at $V031 (default outputs/v031, made here when missing, with copies of
# this tree's benchmarks/forward.py and benchmarks/interact.py)
#   1. interact: this tree only, after the one-row broadcast form of prepared merged weights
#      (routing/prepared.py _run); the first run (outputs/bench/i24m) has 0.3.1 side by side;
#   2. forward: the d=256, P=16 points (the noisiest: 16-row forwards of 0.6-1.2 ms) again, this tree and 0.3.1
#      alternately (not at the same time), twice each, --min-time 0.5.
#   nohup bash experiments/queues/side_by_side_031_rerun.sh > outputs/logs/side_by_side_031_rerun.log 2>&1 &
# Outputs: outputs/bench/i24m2/ (the committed summary: benchmarks/results/0.5.0/interact_env_loop_rerun.json)
source "$(dirname "$0")/_common.sh"
whole_queue_in_lane a "$@"
V031=${V031:-$REPO/outputs/v031}
if [ ! -d "$V031" ]; then
  git worktree add "$V031" 5d166a4 && cp benchmarks/forward.py benchmarks/interact.py "$V031/benchmarks/" || exit 1
fi
R=$REPO/outputs/bench/i24m2
mkdir -p "$R"
export OMP_NUM_THREADS=1
echo "start $(date -u +%FT%TZ) $(uptime)" >> "$R/load.txt"
rows() { [ -f "$1" ] && "$PY" -c "import json,sys; print(len(json.load(open(sys.argv[1]))['rows']))" "$1" 2>/dev/null || echo 0; }
for rep in 1 2; do
  for side in new v031; do
    out=$R/fwd_${side}_$rep.json
    [ "$(rows "$out")" -ge 6 ] && continue
    dir=$REPO; [ $side = v031 ] && dir=$V031
    echo "forward $side $rep $(date -u +%T) $(uptime)" >> "$R/load.txt"
    (cd "$dir" && PYTHONPATH=$dir "$PY" benchmarks/forward.py --skip-memory --no-loop --min-time 0.5 --transformer-pops \
        --match "d=256 r=(1|4|16) P=16 " --resume --json "$out" > "$R/fwd_${side}_$rep.log" 2>&1)
  done
done
if [ "$(rows "$R/int_new.json")" -lt 4 ]; then
  echo "interact $(date -u +%T) $(uptime)" >> "$R/load.txt"
  PYTHONPATH=$REPO "$PY" benchmarks/interact.py --repeats 5 --cpu-time --no-vector-path \
      --json "$R/int_new.json" > "$R/int_new.log" 2>&1
fi
echo "end $(date -u +%FT%TZ) $(uptime)" >> "$R/load.txt"
echo done > "$R/done"
