#!/usr/bin/env bash
# Per-rank memory under ZeRO 0, 1 and 2: config B (GPT, 8 layers x 512, seq 256, batch 8)
# through `troupe run` with worker processes over gloo, data-parallel 2 and 4.
#
#   bench/zero_memory.sh [BUILD_DIR] [STEPS]
#
# Prints, per run, what rank 0's worker log says it holds (params, grads, AdamW moments:
# the engine's own buffers) and the peak RSS of every worker process (getrusage at exit,
# after the final checkpoint's host copy).
set -euo pipefail
build=${1:-build}
steps=${2:-2}
. "$(dirname "$0")/lib.sh" "$build"

printf '%-4s %-4s  %-70s  %s\n' dp zero "rank 0 holds" "peak RSS per worker (MiB)"
for dp in 2 4; do
  for zero in 0 1 2; do
    spec="$work/b_dp${dp}_z${zero}.yaml"
    cat >"$spec" <<YAML
name: zero-b-dp${dp}-z${zero}
model: {type: gpt, vocab_size: 256, seq_len: 256, d_model: 512, n_layers: 8, n_heads: 8}
data: {source: synthetic}
train: {steps: ${steps}, global_batch: 8, seed: 1, zero: ${zero}}
parallel: {data: ${dp}, pipeline: 1, tensor: 1}
checkpoint: {every: 1000}
YAML
    troupe_run "$spec" "$work/runs_${dp}_${zero}"
    run=$(ls -d "$work/runs_${dp}_${zero}"/*/)
    holds=$(sed -n 's/^memory: //p' "$run/workers/0.log")
    rss=$(for r in $(seq 0 $((dp - 1))); do sed -n 's/^peak RSS \([0-9]*\) MiB/\1/p' "$run/workers/$r.log"; done | paste -sd/)
    printf '%-4s %-4s  %-70s  %s\n' "$dp" "$zero" "$holds" "$rss"
  done
done
