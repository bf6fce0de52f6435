#!/usr/bin/env bash
# PopuLoRA's loop vs its baselines (experiments/paper_loop.py: SmolLM2-135M-Instruct, arms matched by counted tokens),
# lane B. Each arm runs holding the lane's lock with OMP_NUM_THREADS=1 (one thread), one after another, in priority
# order. Resumable: every arm checkpoints to outputs/paper_loop/smollm2-<family>-<arm>-seed<k>/checkpoint.pt (every 5
# steps and after each validation); re-running this script skips finished arms (their JSON exists) and continues an
# interrupted one bit for bit. Budget: 6000 counted tokens (generated + trained) per arm, every arm of a family.
# Results: experiments/results/<version>/paper/<family>-<arm>-seed<k>.json (+ base-smollm2-<family>.json);
# table: outputs/logs/paper_report.md (rewritten after each arm). Logs: outputs/logs/paper_<family>-<arm>-seed<k>.log
# Run from any clone: bash experiments/queues/paper_loop.sh   (PYTHON=... picks the interpreter)
source "$(dirname "$0")/_common.sh"
TOKENS=6000
EVAL=3000
RESULTS="experiments/results/$VERSION/paper"
run() {
  local family=$1 arm=$2 seed=$3
  local name=$family-$arm-seed$seed
  # checked inside the lock too: a queue restarted while an arm runs must not start that arm again once it ends
  if [ -f "$RESULTS/$name.json" ]; then echo "$name done"; return; fi
  OMP_NUM_THREADS=1 lane b bash -c '[ -f "$1/$2.json" ] || "$3" experiments/paper_loop.py --arm "$4" --family "$5" \
    --seed "$6" --tokens "$7" --eval-tokens "$8" --results "$1" >> "outputs/logs/paper_$2.log" 2>&1' \
    _ "$RESULTS" "$name" "$PY" "$arm" "$family" "$seed" "$TOKENS" "$EVAL"
  "$PY" experiments/paper_loop.py --report --results "$RESULTS" > outputs/logs/paper_report.md 2>&1
}
run arithmetic a 0
run arithmetic b 0
run arithmetic d 0
run arithmetic c 0
# the harder family's (a) vs (b) before the second seed of (a): it completes a comparison, a1 repeats one
run linear b 0
run linear a 0
run arithmetic a 1
