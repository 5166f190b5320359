#!/usr/bin/env bash
# The GPU checks, for a GPU machine that has CUDA and PyTorch's wheels (cuBLAS, NCCL) but none
# of the Debian libraries troupe links (CAF, gloo, yaml-cpp, ZeroMQ, OpenBLAS, oneDNN, ...).
#
#   bash scripts/gpu-check.sh bundle       on the build machine: build the GPU test binaries and
#                                          pack them with their non-CUDA shared libraries into
#                                          build-gpu/troupe-gpu.tar.xz (ignored by git: carry it)
#   bash scripts/gpu-check.sh run [LOG]    on the GPU machine, in the repository root: unpack,
#                                          point the loader at that machine's own CUDA libraries,
#                                          run every [gpu] test, then bench/gpu_throughput (the
#                                          engine next to PyTorch); everything into LOG (default
#                                          $OUT/gpu-check.log when $OUT is set, else
#                                          gpu-check.log); exit 0 only when all passed
#
# `troupe version` checks that the executable loads its CUDA backend (libtroupe_cuda.so, carried
# beside it) and sees the GPU. Each binary runs under a timeout (120 + 60 + 120 s of tests, 150 + 200 s of benchmark: under
# 11 minutes at the very worst; the tests take well under their limits, so a run fits 8). The CUDA libraries are not carried
# (libcublasLt and libnccl are hundreds of MB): the run looks for them in /usr/local/cuda and
# in the site-packages of python3 (nvidia/*/lib, torch/lib), and says which it took.
set -euo pipefail

cd "$(dirname "$0")/.."
root=$(pwd)
bundle_dir="$root/build-gpu"
bundle="$bundle_dir/troupe-gpu.tar.xz"
binaries=(tests/kernels/test_kernels_cuda tests/comm/test_comm tests/engine/test_engine_cuda bench/gpu_throughput troupe)

# Libraries the GPU machine has, of its own and newer: never carried.
system_lib='^(linux-vdso|ld-linux|libc\.so|libm\.so|libdl\.so|libpthread\.so|librt\.so|libcuda\.so|libcudart\.so|libcublas\.so|libcublasLt\.so|libnccl\.so|libnvidia)'

do_bundle() {
  local build="$root/build"
  [ -f "$build/CMakeCache.txt" ] || { echo "gpu-check: configure first (bash scripts/setup.sh)" >&2; exit 2; }
  grep -q '^TROUPE_CUDA:STRING=OFF' "$build/CMakeCache.txt" &&
    { echo "gpu-check: build/ is configured with TROUPE_CUDA=OFF" >&2; exit 2; }
  cmake --build "$build" -j "$(nproc)" --target test_kernels_cuda test_comm test_engine_cuda gpu_throughput troupe
  local stage
  stage=$(mktemp -d)
  trap 'rm -rf "$stage"' RETURN
  mkdir -p "$stage/bin" "$stage/lib"
  # The troupe executable loads its CUDA backend from beside itself (kernels/cuda_backend.hpp).
  for b in "${binaries[@]}" libtroupe_cuda.so; do
    [ -e "$build/$b" ] || { echo "gpu-check: $build/$b was not built (does this build have CUDA?)" >&2; exit 2; }
    cp "$build/$b" "$stage/bin/"
    # Each resolved dependency that is not the GPU machine's own: copied, links followed.
    ldd "$build/$b" | awk '$2 == "=>" && $3 ~ /^\// {print $1, $3}' | while read -r name path; do
      if [[ ! $name =~ $system_lib ]]; then cp -L "$path" "$stage/lib/$name"; fi
    done
  done
  mkdir -p "$bundle_dir"
  tar -C "$stage" -cJf "$bundle" bin lib
  echo "gpu-check: $bundle ($(du -h "$bundle" | cut -f1)): ${binaries[*]##*/} and $(ls "$stage/lib" | wc -l) libraries"
  echo "gpu-check: on the GPU machine, carry build-gpu and run: bash scripts/gpu-check.sh run"
}

# The directories holding the CUDA libraries the binaries need, on this machine.
cuda_lib_dirs() {
  local d
  for d in /usr/local/cuda/lib64 /usr/local/cuda/lib /usr/local/cuda/targets/x86_64-linux/lib; do
    [ -e "$d/libcublasLt.so.13" ] && echo "$d"
  done
  python3 - <<'EOF' 2>/dev/null || true
import glob, os, site, sys
roots = site.getsitepackages() + [site.getusersitepackages()]
seen = set()
for r in roots:
    for pattern in ("nvidia/*/lib", "nvidia/*/*/lib", "torch/lib"):
        for d in sorted(glob.glob(os.path.join(r, pattern))):
            if d not in seen and glob.glob(os.path.join(d, "lib*.so*")):
                seen.add(d)
                print(d)
EOF
}

do_run() {
  local log="${1:-${OUT:+$OUT/gpu-check.log}}"
  log="${log:-gpu-check.log}"
  [ -f "$bundle" ] || { echo "gpu-check: no $bundle: run 'bash scripts/gpu-check.sh bundle' on the build machine and carry build-gpu" >&2; exit 2; }
  exec > >(tee "$log") 2>&1
  echo "== gpu-check $(date -u +%FT%TZ) on $(hostname)"
  if command -v nvidia-smi >/dev/null; then nvidia-smi -L 2>&1 || true; else echo "(no nvidia-smi)"; fi
  local dir
  dir=$(mktemp -d)
  tar -C "$dir" -xJf "$bundle"
  local cuda_dirs
  cuda_dirs=$(cuda_lib_dirs | paste -sd: -)
  echo "== CUDA libraries from: ${cuda_dirs:-nowhere found}"
  export LD_LIBRARY_PATH="$dir/lib${cuda_dirs:+:$cuda_dirs}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  local failed=0 b missing limit
  for b in "$dir"/bin/*; do
    missing=$(ldd "$b" | grep 'not found' || true)
    if [ -n "$missing" ]; then
      echo "== $(basename "$b"): libraries not found:"
      echo "$missing"
      failed=1
      continue
    fi
    case "$(basename "$b")" in
      gpu_throughput) continue ;;  # after the tests
      libtroupe_cuda.so) continue ;;
      troupe)
        # The executable links no CUDA library; it loads its backend and counts the GPUs.
        echo "== troupe version (its CUDA backend loaded from beside it)"
        local version
        version=$(timeout 60 "$b" version 2>&1) || failed=1
        echo "$version"
        echo "$version" | grep -q 'cuda/nccl: built, loads; [1-9]' || { echo "== troupe: no GPU through its backend"; failed=1; }
        continue ;;
      test_kernels_cuda) limit=120 ;;
      test_comm) limit=60 ;;
      *) limit=120 ;;
    esac
    echo "== $(basename "$b") [gpu]"
    # -d yes: each test case's time; the [gpu] tag: the cases that need the device, which
    # fail instead of skipping when it is not there.
    if ! TROUPE_REQUIRE_GPU=1 timeout "$limit" "$b" "[gpu]" -d yes; then failed=1; fi
  done
  # One run per config, each under its own limit: the 124M figures stand even if the 1.3B
  # run (torch.compile of the bigger model included) runs out of time.
  local config config_limit
  for config in 124m:150 1.3b:200; do
    config_limit=${config#*:}
    config=${config%%:*}
    echo "== gpu_throughput --config $config (the engine next to PyTorch on the same GPU)"
    if ! timeout "$config_limit" "$dir/bin/gpu_throughput" --steps 10 --warmup 3 --config "$config" \
      --script "$root/bench/torch_reference.py"; then failed=1; fi
  done
  rm -rf "$dir"
  if [ "$failed" = 0 ]; then echo "== gpu-check: all passed"; else echo "== gpu-check: FAILED"; fi
  return "$failed"
}

case "${1:-}" in
  bundle) do_bundle ;;
  run) shift; do_run "$@" ;;
  *) sed -n '2,16p' "$0"; exit 2 ;;
esac
