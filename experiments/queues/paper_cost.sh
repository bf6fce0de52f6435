#!/usr/bin/env bash
# Issue 26 item 4: the cost ratios of PopuLoRA's loop (timings, so lane A). ~30 min at 2 threads.
# Result: benchmarks/results/<version>/paper/selfplay_cost.json (skipped if it exists: rerun to resume the queue);
# log outputs/logs/paper_selfplay_cost.log. Run from any clone: bash experiments/queues/paper_cost.sh
source "$(dirname "$0")/_common.sh"
out="benchmarks/results/$VERSION/paper/selfplay_cost.json"
if [ -f "$out" ]; then echo "$out exists: done"; exit 0; fi
mkdir -p "$(dirname "$out")"
lane a "$PY" benchmarks/selfplay_cost.py --rounds 5 --rows 4 --new-tokens 16 --out "$out" \
  > outputs/logs/paper_selfplay_cost.log 2>&1
