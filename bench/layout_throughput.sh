#!/usr/bin/env bash
# Tokens/s of config A (4 layers, d_model 256, 4 heads, seq 128, global batch 16) through
# `troupe run` with real worker processes: 1x1x1 against 2x1x1, 1x2x1 and 1x1x2 (two workers,
# one thread each), measured in the same run. Prints the median tokens/s over steps 2..11, the
# ratio to 1x1x1, the measured pipeline bubble and the loss at the last step (the same for every
# layout up to float summation order).
#
#   bench/layout_throughput.sh [build dir]      (default: build)
set -euo pipefail
cd "$(dirname "$0")/.."
troupe="$(pwd)/${1:-build}/troupe"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
echo "layout   tokens/s  vs 1x1x1  bubble  final loss   ($(nproc) cores, load $(cut -d' ' -f1 /proc/loadavg))"
base=""
for layout in "1 1 1 16" "2 1 1 8" "1 2 1 4" "1 1 2 16"; do
  set -- $layout
  name="a-$1x$2x$3"
  cat >"$work/$name.yaml" <<SPEC
name: $name
model: {type: gpt, seq_len: 128, d_model: 256, n_layers: 4, n_heads: 4}
data: {path: /usr/share/games/fortunes}
train: {steps: 12, global_batch: 16, micro_batch: $4, seed: 0, optimizer: {lr: 0.003}}
parallel: {data: $1, pipeline: $2, tensor: $3, schedule: 1f1b}
SPEC
  "$troupe" run -q "$work/$name.yaml" --runs-dir "$work/runs-$name" >"$work/$name.log" 2>&1 \
    || { echo "$name failed:"; cat "$work/$name.log"; exit 1; }
  line=$(python3 - "$work"/runs-"$name"/*/metrics.jsonl "$base" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])][2:]
tps = statistics.median(r["tokens_per_s"] for r in rows)
bubble = statistics.median(r.get("bubble_fraction", 0.0) for r in rows)
base = float(sys.argv[2]) if sys.argv[2] else tps
print(f"{tps:.0f} {rows[-1]['layout']:7s}  {tps:8.0f}  {tps / base:7.2f}x  {bubble:6.3f}  {rows[-1]['loss']:.6f}")
PY
)
  [ -z "$base" ] && base=${line%% *}
  echo "${line#* }"
done
