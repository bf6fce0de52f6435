#!/usr/bin/env bash
# Issue 24 (lane A: timing ratios). This tree and 0.3.1 (worktree /tmp/v031 of 5d166a4, holding
# 0.3.1 side: `git worktree add /tmp/v031 5d166a4 && cp benchmarks/forward.py benchmarks/interact.py /tmp/v031/benchmarks/`
# copies of the same two benchmark scripts) side by side, one process each at the same time:
#   1. benchmarks/forward.py --skip-memory --no-loop  (paired all/pure, ids/pure per point; --resume keeps
#      the points a stopped run already wrote to its JSON)
#   2. benchmarks/interact.py --repeats 3 --cpu-time --no-vector-path  (routed evaluate vs the unrouted policy
#      and the critical path; a finished JSON (4 rows) is kept)
# Load (uptime) before, every 30 s during, after. Resume: rerun this script (under the lock):
#   nohup flock /tmp/populora-lanea.lock bash benchmarks/queues/side_by_side_031.sh > outputs/bench/i24m.log 2>&1 &
set -u
REPO=$(cd "$(dirname "$0")/../.." && pwd); cd "$REPO" || exit 1
PY=$REPO/.venv/bin/python
R=$REPO/outputs/bench/i24m
mkdir -p $R
export OMP_NUM_THREADS=1
echo "start $(date -u +%FT%TZ) $(uptime)" | tee -a $R/load.txt
watch_load() { while sleep 30; do echo "$(date -u +%T) $(uptime)" >> $R/load.txt; done; }
watch_load &
WATCH=$!
trap 'kill $WATCH 2>/dev/null' EXIT

rows() { [ -f "$1" ] && $PY -c "import json,sys; print(len(json.load(open('$1'))['rows']))" 2>/dev/null || echo 0; }

if [ "$(rows $R/int_new.json)" -lt 4 ] || [ "$(rows $R/int_v031.json)" -lt 4 ]; then
  echo "interact start $(date -u +%T) $(uptime)" >> $R/load.txt
  PYTHONPATH=$REPO $PY benchmarks/interact.py --repeats 3 --cpu-time --no-vector-path \
      --json $R/int_new.json > $R/int_new.log 2>&1 &
  A=$!
  PYTHONPATH=/tmp/v031 $PY /tmp/v031/benchmarks/interact.py --repeats 3 --cpu-time --no-vector-path \
      --json $R/int_v031.json > $R/int_v031.log 2>&1 &
  B=$!
  wait $A $B
  echo "interact end $(date -u +%T) $(uptime)" >> $R/load.txt
fi
if [ "$(rows $R/fwd_new.json)" -lt 26 ] || [ "$(rows $R/fwd_v031.json)" -lt 26 ]; then
  echo "forward start $(date -u +%T) $(uptime)" >> $R/load.txt
  $PY benchmarks/forward.py --skip-memory --no-loop --min-time 0.1 --resume --json $R/fwd_new.json >> $R/fwd_new.log 2>&1 &
  A=$!
  (cd /tmp/v031 && $PY benchmarks/forward.py --skip-memory --no-loop --min-time 0.1 --resume --json $R/fwd_v031.json \
      >> $R/fwd_v031.log 2>&1) &
  B=$!
  wait $A $B
  echo "forward end $(date -u +%T) $(uptime)" >> $R/load.txt
fi
$PY benchmarks/forward.py --compare $R/fwd_v031.json $R/fwd_new.json > $R/forward_compare.md 2>&1

echo "end $(date -u +%FT%TZ) $(uptime)" | tee -a $R/load.txt
echo done > $R/done
