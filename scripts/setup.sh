#!/usr/bin/env bash
# One-command setup for a fresh Debian 12 machine: installs every Debian package
# the build, the tests and the quickstart need, then configures and builds.
#
#   bash scripts/setup.sh            install + build (build/)
#   bash scripts/setup.sh --test     install (with the test-only packages) + build + run the whole test suite
#
# Idempotent and non-interactive; run as root (or with sudo available).
set -euo pipefail

cd "$(dirname "$0")/.."
root=$(pwd)
mode=build
# Each stage's line says how long the script has run, so that a slow machine shows where its
# time goes (packages, the build, the tests, the sanitizer build).
stage() { printf '== [%dm%02ds] %s\n' $((SECONDS / 60)) $((SECONDS % 60)) "$*"; }
case "${1:-}" in
  "") ;;
  --test) mode=test ;;
  -h|--help) sed -n '2,8p' "$0"; exit 0 ;;
  *) echo "setup.sh: unknown option '$1' (use --test or nothing)" >&2; exit 2 ;;
esac

packages=(
  build-essential cmake ninja-build pkg-config ccache git
  libcaf-dev libzmq3-dev cppzmq-dev libyaml-cpp-dev catch2 libgloo-dev libopenblas-dev
  libcli11-dev libspdlog-dev libfmt-dev nlohmann-json3-dev libxxhash-dev libzstd-dev libdnnl-dev
  libcpp-httplib-dev
  python3 python3-zmq python3-numpy fortunes procps
)
# Only the tests need these: the PyTorch reference forwards (tests/checkpoint/hf_reference.py),
# the browser that Node (with playwright-core, from npm) drives through the dashboard
# (tests/browser/), and a one-host Slurm (slurmctld, slurmd, munged) that runs docs/deploy.md's
# sbatch script (tests/slurm/), and iproute2 (ip, tc) and nftables for the hosts made of network
# namespaces and their impaired links (tests/multihost/).
test_packages=(python3-torch chromium nodejs slurm-wlm munge iproute2 nftables)
if [ "$mode" = test ]; then packages+=("${test_packages[@]}"); fi

sudo=""
if [ "$(id -u)" != 0 ]; then sudo=sudo; fi
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  stage "installing ${#missing[@]} Debian packages: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get update -qq
  $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
else
  stage "all ${#packages[@]} Debian packages present"
fi

jobs=$(nproc)
stage "configuring and building (build/, $jobs jobs)"
cmake -S "$root" -B "$root/build" -G Ninja -DCMAKE_BUILD_TYPE=Release >"$root/build-configure.log" 2>&1 \
  || { cat "$root/build-configure.log"; exit 1; }
sed -n '/troupe .* configuration/,/sanitizers/p' "$root/build-configure.log" | sed 's/^-- //'
cmake --build "$root/build" -j "$jobs"

if [ "$mode" = test ]; then
  # The npm packages of two tests, each in its own git-ignored node_modules: the tokenizer
  # reference tests' (tests/tokenizer/package.json: the Hugging Face tokenizers library's Node
  # binding and released models' tokenizer.json files) and the browser test's
  # (tests/browser/package.json: playwright-core, which drives the chromium installed above).
  # Debian's nodejs ships without npm; NodeSource's includes it.
  if ! command -v npm >/dev/null; then
    stage "installing npm"
    { $sudo apt-get update -qq && $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends npm; } ||
      echo "npm could not be installed: the tokenizer reference tests will report SKIPPED and browser_dashboard will fail"
  fi
  stage "npm packages of the tokenizer tests (tests/tokenizer/node_modules)"
  bash "$root/tests/tokenizer/install.sh" || echo "(the tokenizer reference tests will report SKIPPED)"
  stage "npm package of the browser test (tests/browser/node_modules)"
  bash "$root/tests/browser/install.sh" || echo "(browser_dashboard will fail until bash tests/browser/install.sh succeeds)"
  stage "running the test suite"
  (cd "$root/build" && ctest --output-on-failure -j "$jobs" --timeout 600)
  # The fuzz tests (spec parser, control-plane handlers, API) also run under AddressSanitizer and UBSan.
  stage "fuzz tests under ASan+UBSan (build-asan/)"
  # -O1 -g1: the level AddressSanitizer's documentation suggests, with line tables so that every
  # report has file:line; it compiles the CAF-heavy sources about twice as fast as RelWithDebInfo's
  # -O2 -g (coordinator_actor.cpp: 67 s instead of 125 s on one core).
  cmake -S "$root" -B "$root/build-asan" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g1 -DNDEBUG" -DTROUPE_SANITIZE=ON \
    -DTROUPE_CUDA=OFF -DTROUPE_BUILD_BENCH=OFF >"$root/build-asan-configure.log" 2>&1 \
    || { cat "$root/build-asan-configure.log"; exit 1; }
  cmake --build "$root/build-asan" -j "$jobs" --target test_spec_fuzz test_control_fuzz
  (cd "$root/build-asan" &&
    LSAN_OPTIONS="suppressions=$root/tests/lsan_caf.supp" ctest --output-on-failure -R 'fuzz' --timeout 600)
fi
stage "done"
