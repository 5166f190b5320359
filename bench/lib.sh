# What the shell benchmarks share. Source it with the build directory:
#
#   . "$(dirname "$0")/lib.sh" "${1:-build}"
#
# It sets $troupe (the built binary, checked) and $work (a temporary directory, removed on
# exit), and defines troupe_run and median_step_ms.
troupe="$1/troupe"
[ -x "$troupe" ] || { echo "no $troupe: build first" >&2; exit 2; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# troupe_run SPEC RUNS_DIR [ARGS...]: `troupe run -q`, its output shown only when it fails
# (then the benchmark stops).
troupe_run() {
  local spec=$1 dir=$2
  shift 2
  "$troupe" run -q "$@" "$spec" --runs-dir "$dir" >"$work/log" 2>&1 || {
    cat "$work/log" >&2
    exit 1
  }
}

# median_step_ms METRICS_JSONL [FIRST_STEP]: the median step_ms of the steps from FIRST_STEP
# on (default 1: step 0 warms up).
median_step_ms() {
  python3 -c '
import json, statistics, sys
first = int(sys.argv[2])
ms = [m["step_ms"] for m in map(json.loads, open(sys.argv[1])) if "step_ms" in m and m["step"] >= first]
print("%.2f" % statistics.median(ms))' "$1" "${2:-1}"
}
