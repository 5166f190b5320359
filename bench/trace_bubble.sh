#!/usr/bin/env bash
# The pipeline bubble a timeline trace shows next to the one the schedule predicts:
# config A's width (GPT, 4 layers x 256, seq 128, batch 16, micro-batch 4: m = 4) on
# 1x2x1 through `troupe run --trace 3` with two worker processes over gloo, then
# `troupe trace merge`.
#
#   bench/trace_bubble.sh [BUILD_DIR] [RUNS]
#
# Prints, per schedule and run, each traced step's bubble (1 - compute / schedule time,
# the mean over ranks) and the theoretical bubble of bench/pipeline_bubble:
# (p-1)/(m+p-1) for 1F1B, (p-1)/(3m+p-1) for ZB-H1.
set -euo pipefail
build=${1:-build}
runs=${2:-3}
. "$(dirname "$0")/lib.sh" "$build"

p=2
m=4
printf '%-8s %4s  %-28s  %s\n' schedule run "traced bubble, steps 1..3" predicted
for schedule in 1f1b zb-h1; do
  predicted=$(awk -v p=$p -v m=$m -v s="$schedule" \
    'BEGIN { k = (s == "zb-h1") ? 3 : 1; printf "%.1f%%", 100 * (p - 1) / (k * m + p - 1) }')
  for run in $(seq 1 "$runs"); do
    spec="$work/a_${schedule}.yaml"
    cat >"$spec" <<YAML
name: bubble-${schedule}
model: {type: gpt, vocab_size: 256, seq_len: 128, d_model: 256, n_layers: 4, n_heads: 4}
data: {source: synthetic}
train: {steps: 5, global_batch: 16, micro_batch: 4, seed: 1}
parallel: {data: 1, pipeline: ${p}, tensor: 1, schedule: ${schedule}}
checkpoint: {every: 1000}
YAML
    dir="$work/runs_${schedule}_${run}"
    troupe_run "$spec" "$dir" --trace 3
    bubbles=$("$troupe" trace merge "$(ls -d "$dir"/*/)" | awk '$1 ~ /^[0-9]+$/ { print $NF }' | paste -sd' ')
    printf '%-8s %4d  %-28s  %s\n' "$schedule" "$run" "$bubbles" "$predicted"
  done
done
