#!/usr/bin/env bash
# The three-seed runs of the environment presets (Pendulum-v1, LunarLander-v3, LunarLanderContinuous-v3) on
# seeds 0-2, each (task, seed) under lane B (taken per run so other lane-B queues interleave; OMP_NUM_THREADS=1;
# the results depend on env-step counts only, not on machine load).
# Resumable: rerun this script; seeds already in benchmarks/results/<version>/envs_<task>.json are skipped, a seed in
# progress continues from its checkpoint in outputs/envs_ckpt/<task>-<config>-<seed>/.
# Run from any clone: bash experiments/queues/envs_presets.sh [task ...]   (PYTHON=... picks the interpreter)
# Logs: outputs/logs/envs_<task>.log (one table row per finished seed).
source "$(dirname "$0")/_common.sh"
tasks="${*:-pendulum lunarlander lunarlander-continuous}"  # or name some: bash experiments/queues/envs_presets.sh lunarlander
mkdir -p "benchmarks/results/$VERSION"
for task in $tasks; do
  for seed in 0 1 2; do
    echo "== $task seed $seed waiting $(date -u +%FT%TZ)"
    OMP_NUM_THREADS=1 lane b "$PY" benchmarks/envs.py --task "$task" --seed "$seed" --budget-seconds 1000000 \
      --json "benchmarks/results/$VERSION/envs_$task.json" --checkpoints outputs/envs_ckpt >> "outputs/logs/envs_$task.log" 2>&1
    echo "== $task seed $seed rc=$? $(date -u +%FT%TZ)"
  done
done
