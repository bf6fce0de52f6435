#!/usr/bin/env bash
# Issue 24, second measurement (lane A), resumable (rerun; finished parts are kept):
# 0.3.1 side: `git worktree add /tmp/v031 5d166a4 && cp benchmarks/forward.py benchmarks/interact.py /tmp/v031/benchmarks/`
#   1. interact: this tree only, after the one-row broadcast form of prepared merged weights
#      (routing/prepared.py _run); the first run (outputs/bench/i24m) has 0.3.1 side by side;
#   2. forward: the d=256, P=16 points (the noisiest: 16-row forwards of 0.6-1.2 ms) again, this tree and 0.3.1
#      alternately (not at the same time), twice each, --min-time 0.5.
#   nohup flock /tmp/populora-lanea.lock bash benchmarks/queues/side_by_side_031_rerun.sh > outputs/bench/i24m2.log 2>&1 &
set -u
REPO=$(cd "$(dirname "$0")/../.." && pwd); cd "$REPO" || exit 1
PY=$REPO/.venv/bin/python
R=$REPO/outputs/bench/i24m2
mkdir -p $R
export OMP_NUM_THREADS=1
echo "start $(date -u +%FT%TZ) $(uptime)" >> $R/load.txt
rows() { [ -f "$1" ] && $PY -c "import json,sys; print(len(json.load(open('$1'))['rows']))" 2>/dev/null || echo 0; }
for rep in 1 2; do
  for side in new v031; do
    out=$R/fwd_${side}_$rep.json
    [ "$(rows $out)" -ge 6 ] && continue
    dir=$REPO; [ $side = v031 ] && dir=/tmp/v031
    echo "forward $side $rep $(date -u +%T) $(uptime)" >> $R/load.txt
    (cd $dir && $PY benchmarks/forward.py --skip-memory --no-loop --min-time 0.5 --transformer-pops \
        --match "d=256 r=(1|4|16) P=16 " --resume --json $out > $R/fwd_${side}_$rep.log 2>&1)
  done
done
if [ "$(rows $R/int_new.json)" -lt 4 ]; then
  echo "interact $(date -u +%T) $(uptime)" >> $R/load.txt
  PYTHONPATH=$REPO $PY benchmarks/interact.py --repeats 5 --cpu-time --no-vector-path \
      --json $R/int_new.json > $R/int_new.log 2>&1
fi
echo "end $(date -u +%FT%TZ) $(uptime)" >> $R/load.txt
echo done > $R/done
