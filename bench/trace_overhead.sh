#!/usr/bin/env bash
# What tracing costs: config A's width (GPT, 4 layers x 256, seq 128, batch 16, micro-batch
# 4) on 1x2x1 1F1B through `troupe run` with two worker processes, traced over every step
# (train.trace) and not traced, alternating, RUNS times each.
#
#   bench/trace_overhead.sh [BUILD_DIR] [RUNS] [STEPS]
#
# Prints each run's median step time (steps 1.., from metrics.jsonl) and the median of the
# traced runs over the untraced ones.
set -euo pipefail
build=${1:-build}
runs=${2:-3}
steps=${3:-20}
. "$(dirname "$0")/lib.sh" "$build"

printf '%-8s %4s  %s\n' tracing run "median step ms"
off=() on=()
for run in $(seq 1 "$runs"); do
  for traced in no yes; do
    spec="$work/a_${traced}.yaml"
    trace=""
    [ "$traced" = yes ] && trace=", trace: {from_step: 0, steps: ${steps}}"
    cat >"$spec" <<YAML
name: overhead-${traced}
model: {type: gpt, vocab_size: 256, seq_len: 128, d_model: 256, n_layers: 4, n_heads: 4}
data: {source: synthetic}
train: {steps: ${steps}, global_batch: 16, micro_batch: 4, seed: 1${trace}}
parallel: {data: 1, pipeline: 2, tensor: 1, schedule: 1f1b}
checkpoint: {every: 1000}
YAML
    dir="$work/runs_${traced}_${run}"
    troupe_run "$spec" "$dir"
    ms=$(median_step_ms "$(ls "$dir"/*/metrics.jsonl)")
    printf '%-8s %4d  %s\n' "$traced" "$run" "$ms"
    if [ "$traced" = yes ]; then on+=("$ms"); else off+=("$ms"); fi
  done
done
python3 -c '
import statistics, sys
n = int(sys.argv[1]); off = list(map(float, sys.argv[2:2 + n])); on = list(map(float, sys.argv[2 + n:]))
print("traced / untraced median step time: %.3f (%.2f ms vs %.2f ms)" %
      (statistics.median(on) / statistics.median(off), statistics.median(on), statistics.median(off)))' \
  "${#off[@]}" "${off[@]}" "${on[@]}"
