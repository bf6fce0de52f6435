#!/usr/bin/env bash
# Issue 26 item 4: the cost ratios of PopuLoRA's loop (timings, so lane A: /tmp/populora-lanea.lock). ~30 min at 2 threads.
# Result: benchmarks/results/paper/selfplay_cost.json (skipped if it exists); log outputs/logs/paper_selfplay_cost_laneA.log
REPO=$(cd "$(dirname "$0")/../.." && pwd); cd "$REPO"
[ -f benchmarks/results/paper/selfplay_cost.json ] && exit 0
flock /tmp/populora-lanea.lock bash -c ".venv/bin/python benchmarks/selfplay_cost.py --rounds 5 --rows 4 \
  --new-tokens 16 --out benchmarks/results/paper/selfplay_cost.json > outputs/logs/paper_selfplay_cost_laneA.log 2>&1"
