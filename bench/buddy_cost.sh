#!/usr/bin/env bash
# What the in-memory snapshots and their copies in the buddies cost a step: the same job
# through `troupe run` (worker processes over gloo, data-parallel 2, GPT 4 layers x 384,
# seq 64) with checkpoint.memory_every 0 and 1, the two runs interleaved ROUNDS times.
# ZERO is train.zero: 0 (replicated: the replicas' own snapshots are the copies, no buddies)
# or 1, 2 (sharded: each rank's snapshot reaches its buddy every step). A sharded job runs a
# third way too, "1 sent": TROUPE_BUDDY_SHM=0 keeps the snapshots in private memory, so every
# copy is sent over the buddy link as between hosts, where "1" lets the buddy (the same host)
# map its partner's snapshots.
#
#   bench/buddy_cost.sh [BUILD_DIR] [ROUNDS] [STEPS] [ZERO] [MODEL]
#
# MODEL "wide" (default: the GPT above, global batch 8) or "A": config A (GPT 4 layers x 256,
# 4 heads, seq 128, global batch 16), the benchmarks' usual model.
#
# Prints each run's median step time (metrics.jsonl step_ms, the first 5 steps left out) and
# wall time, then the medians over the rounds. step_ms does not hold the snapshot itself nor
# the wait for the previous copy (they follow the step); the wall time does.
set -euo pipefail
build=${1:-build}
rounds=${2:-3}
steps=${3:-40}
zero=${4:-0}
model=${5:-wide}
case "$model" in
wide) shape="seq_len: 64, d_model: 384, n_layers: 4, n_heads: 6" batch="global_batch: 8, micro_batch: 4" ;;
A) shape="seq_len: 128, d_model: 256, n_layers: 4, n_heads: 4" batch="global_batch: 16, micro_batch: 8" ;;
*) echo "buddy_cost.sh: MODEL is wide or A, not '$model'" >&2 && exit 2 ;;
esac
. "$(dirname "$0")/lib.sh" "$build"

for m in 0 1; do
  cat >"$work/m$m.yaml" <<YAML
name: buddy-cost-m$m
model: {type: gpt, vocab_size: 256, ${shape}}
data: {source: synthetic}
train: {steps: ${steps}, ${batch}, seed: 0, zero: ${zero}}
parallel: {data: 2, pipeline: 1, tensor: 1}
checkpoint: {memory_every: $m}
YAML
done

median() { sort -g | awk '{v[NR]=$1} END {print (NR % 2) ? v[(NR+1)/2] : (v[NR/2] + v[NR/2+1]) / 2}'; }
variants="0 1"
[ "$zero" != 0 ] && variants="0 1 1sent"
echo "memory_every  round  median step_ms  wall s"
for r in $(seq 1 "$rounds"); do
  for v in $variants; do
    m=${v%sent}
    shm=1
    [ "$v" = 1sent ] && shm=0
    start=$(date +%s.%N)
    TROUPE_BUDDY_SHM=$shm troupe_run "$work/m$m.yaml" "$work/runs_${v}_$r"
    wall=$(awk -v a="$start" -v b="$(date +%s.%N)" 'BEGIN {print b - a}')
    ms=$(median_step_ms "$(ls "$work"/runs_${v}_$r/*/metrics.jsonl)" 5)
    echo "$v $r $ms $wall" >>"$work/rows"
    printf '%-13s %-6s %-15.1f %.2f\n' "$v" "$r" "$ms" "$wall"
  done
done
for v in $variants; do
  ms=$(awk -v m="$v" '$1 == m {print $3}' "$work/rows" | median)
  wall=$(awk -v m="$v" '$1 == m {print $4}' "$work/rows" | median)
  printf 'memory_every %s: median step %.1f ms, median wall %.2f s\n' "$v" "$ms" "$wall"
done
grep -h "memory:" "$work"/runs_1_1/*/workers/0.log | sed 's/^/rank 0 with snapshots, /'
