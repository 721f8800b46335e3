#!/usr/bin/env bash
# tests/gpu/run.sh: build clmcache with CUDA, run the CUDA tests and the CUDA
# kernel benchmark on this machine's GPU, and write the results under $OUT
# (or ./gpu-results):
#
#   summary.md                 tests (pass/fail per binary) + benchmark table
#   bench_cuda_kernels.jsonl   the benchmark's JSON lines
#   bench_cuda_kernels.md      the benchmark's markdown table
#   bench_cuda_clm.jsonl/.md   the same for the CLM model side (SRC head, adapter)
#   <test>.log, build.log, configure.log, bench_cuda_kernels.log
#
# Exits non-zero when the build or a test fails. Installs nothing. Without a
# usable GPU the GPU tests and the benchmark report SKIPPED and the run passes
# (set CLM_REQUIRE_GPU=1 to make that a failure).
#
# Environment: OUT (results folder), CLM_GPU_BUILD (build folder, default
# build-gpu in the source tree), CLM_CUDA_ARCH (default 90: H100/H200; 80 for
# A100), CLM_BENCH_SMOKE=1 (tiny benchmark shapes), JOBS.
set -uo pipefail

src=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
out=${OUT:-$PWD/gpu-results}
build=${CLM_GPU_BUILD:-$src/build-gpu}
arch=${CLM_CUDA_ARCH:-90}
jobs=${JOBS:-$(nproc)}
mkdir -p "$out"
out=$(cd "$out" && pwd)
start=$(date +%s)
say() { printf '[gpu/run.sh %4ss] %s\n' "$(( $(date +%s) - start ))" "$*"; }

nvcc=$(command -v nvcc || true)
[ -n "$nvcc" ] || nvcc=/usr/local/cuda/bin/nvcc
if [ ! -x "$nvcc" ]; then
  say "nvcc not found (PATH or /usr/local/cuda/bin): cannot build the CUDA kernels"
  exit 2
fi
say "nvcc: $("$nvcc" --version | tail -1)"
if command -v nvidia-smi >/dev/null 2>&1; then
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | sed 's/^/[gpu] /'
else
  say "nvidia-smi not found"
fi

# ---- configure and build (own folder, Release, one architecture) -------------
configure() {
  cmake -S "$src" -B "$build" -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_COMPILER="$nvcc" \
    -DCMAKE_CUDA_ARCHITECTURES="$arch" -DCLM_CUDA=ON >"$out/configure.log" 2>&1
}
say "configuring $build (sm_$arch)"
if ! configure; then
  say "configure failed; checking the Debian packages (make deps), then retrying"
  make -C "$src" deps >>"$out/configure.log" 2>&1 || true
  if ! configure; then
    tail -30 "$out/configure.log"
    say "FAILED: configure (see $out/configure.log)"
    exit 1
  fi
fi
if [ ! -d "$build/cuda" ]; then  # cuda/ is configured only when CMake enabled CUDA
  tail -30 "$out/configure.log"
  say "FAILED: CMake did not enable CUDA (see $out/configure.log)"
  exit 1
fi
targets=(test_cuda_kernels test_cuda_plan test_cuda_emulated test_cuda_kernels_emulated test_device_pool bench_cuda_kernels
         test_cuda_clm test_cuda_clm_emulated bench_cuda_clm)
say "building ${targets[*]} with $jobs jobs"
if ! cmake --build "$build" -j"$jobs" --target "${targets[@]}" >"$out/build.log" 2>&1; then
  grep -E "error|Error" "$out/build.log" | head -40
  say "FAILED: build (see $out/build.log)"
  exit 1
fi
say "build done"

# ---- tests ------------------------------------------------------------------------
# The CPU-only ones (host checks, emulated kernels) run in the background
# while the GPU ones run.
declare -A rc
run_test() {  # name
  local t=$1
  "$build/tests/$t" >"$out/$t.log" 2>&1
  echo $? >"$out/$t.rc"
}
cpu_tests=(test_cuda_plan test_cuda_emulated test_cuda_kernels_emulated test_cuda_clm_emulated)
gpu_tests=(test_device_pool test_cuda_kernels test_cuda_clm)
pids=()
for t in "${cpu_tests[@]}"; do
  run_test "$t" &
  pids+=($!)
done
for t in "${gpu_tests[@]}"; do
  say "running $t"
  run_test "$t"
done
for p in "${pids[@]}"; do wait "$p"; done

failed=0
skipped=0
{
  echo "# clmcache CUDA kernels: tests/gpu/run.sh"
  echo
  echo "- date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "- GPU: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -1 || echo none)"
  echo "- nvcc: $("$nvcc" --version | tail -1), sm_$arch"
  echo
  echo "## Tests"
  echo
  echo "| test | result | summary |"
  echo "|---|---|---|"
} >"$out/summary.md"
for t in "${gpu_tests[@]}" "${cpu_tests[@]}"; do
  code=$(cat "$out/$t.rc" 2>/dev/null || echo 1)
  rc[$t]=$code
  line=$(grep -E "^(All tests passed|test cases:)" "$out/$t.log" | tail -1)
  result=passed
  if [ "$code" != 0 ]; then
    result="**FAILED** (exit $code)"
    failed=1
  elif grep -q "^SKIPPED" "$out/$t.log"; then
    result="skipped: $(grep -m1 '^SKIPPED' "$out/$t.log")"
    skipped=1
  fi
  echo "| $t | $result | $(printf "%s" "${line:-no summary line}" | tr "|" "/") |" >>"$out/summary.md"
  say "$t: $result ${line}"
  if [ "$code" != 0 ]; then tail -40 "$out/$t.log"; fi
done

# ---- benchmark ------------------------------------------------------------------------
say "running bench_cuda_kernels"
: >"$out/bench_cuda_kernels.md"
CLM_BENCH_MARKDOWN="$out/bench_cuda_kernels.md" "$build/tests/bench/bench_cuda_kernels" \
  >"$out/bench_cuda_kernels.jsonl" 2>"$out/bench_cuda_kernels.log"
bench_rc=$?
cat "$out/bench_cuda_kernels.log"
{
  echo
  echo "## Benchmark (bench_cuda_kernels)"
  echo
  if [ $bench_rc != 0 ]; then
    echo "**FAILED** (exit $bench_rc): $(tail -3 "$out/bench_cuda_kernels.log")"
  elif [ -s "$out/bench_cuda_kernels.md" ]; then
    cat "$out/bench_cuda_kernels.md"
  else
    echo "$(cat "$out/bench_cuda_kernels.log")"
  fi
} >>"$out/summary.md"
if [ $bench_rc != 0 ]; then
  say "FAILED: bench_cuda_kernels (exit $bench_rc)"
  failed=1
elif grep -q SKIPPED "$out/bench_cuda_kernels.log"; then
  skipped=1
else
  cat "$out/bench_cuda_kernels.md"
fi

# ---- CLM model side benchmark (SRC head, snapshot adapter) -------------------------------
say "running bench_cuda_clm"
: >"$out/bench_cuda_clm.md"
CLM_BENCH_MARKDOWN="$out/bench_cuda_clm.md" "$build/tests/bench/bench_cuda_clm" \
  >"$out/bench_cuda_clm.jsonl" 2>"$out/bench_cuda_clm.log"
clm_bench_rc=$?
cat "$out/bench_cuda_clm.log"
{
  echo
  echo "## Benchmark (bench_cuda_clm)"
  echo
  if [ $clm_bench_rc != 0 ]; then
    echo "**FAILED** (exit $clm_bench_rc): $(tail -3 "$out/bench_cuda_clm.log")"
  elif [ -s "$out/bench_cuda_clm.md" ]; then
    cat "$out/bench_cuda_clm.md"
  else
    echo "$(cat "$out/bench_cuda_clm.log")"
  fi
} >>"$out/summary.md"
if [ $clm_bench_rc != 0 ]; then
  say "FAILED: bench_cuda_clm (exit $clm_bench_rc)"
  failed=1
elif grep -q SKIPPED "$out/bench_cuda_clm.log"; then
  skipped=1
else
  cat "$out/bench_cuda_clm.md"
fi

say "results in $out (summary.md)"
if [ $failed != 0 ]; then
  say "FAILED"
  exit 1
fi
if [ $skipped != 0 ]; then
  if [ "${CLM_REQUIRE_GPU:-0}" = 1 ]; then
    say "FAILED: no usable CUDA device (CLM_REQUIRE_GPU=1)"
    exit 1
  fi
  say "passed, but the GPU tests and the benchmark were SKIPPED: no usable CUDA device"
  exit 0
fi
say "passed"
