#!/usr/bin/env bash
# tests/gpu/run.sh: build clmcache with CUDA, run the CUDA tests (the
# library's kernels, the CLM model side, the tiny_llama CUDA decoder and its
# CLI) and the CUDA kernel benchmarks on this machine's GPU, and write the
# results under $OUT (or ./gpu-results), four files in all:
#
#   summary.md                 steps, tests (pass/fail per binary) + both benchmark tables
#   bench_cuda_kernels.jsonl   the paged-attention benchmark's JSON lines
#   bench_cuda_clm.jsonl       the CLM model side's (SRC head, adapter)
#   logs.tar.gz                configure, build, each test's and each benchmark's log
#
# One shot: every step runs under `timeout` and appends its line to
# summary.md as it ends, so a run cut short still says how far it got. Order:
# build (the device's architecture only, no emulated programs), the GPU tests,
# the benchmarks, then the GPU tests again under compute-sanitizer (memcheck,
# racecheck, synccheck; small shapes).
# Exits non-zero when the build or a test fails. Installs nothing. Without a
# usable GPU the GPU tests and the benchmark report SKIPPED and the run passes
# (set CLM_REQUIRE_GPU=1 to make that a failure).
#
# Dependencies: the system's (make deps), or, on a GPU machine with no package
# registry, the archive tests/gpu/pack_deps.sh writes to .gpu-deps/deps.tar.gz
# (made where apt-get works, then carried along with the working tree): when it
# is there, it is unpacked into the build folder and built against. CMake
# drives make, or ninja where there is no make.
#
# Environment: OUT (results folder), CLM_GPU_BUILD (build folder, default
# build-gpu in the source tree), CLM_GPU_DEPS (the archive, default
# .gpu-deps/deps.tar.gz), CLM_CUDA_ARCH (default 90: H100/H200; 80 for A100),
# CLM_BENCH_SMOKE=1 (tiny benchmark shapes), JOBS, CLM_GPU_STEP_TIMEOUT
# (seconds for configure, each test and each benchmark; default 300) and
# CLM_GPU_BUILD_TIMEOUT (default 420), CLM_GPU_SANITIZER_TIMEOUT (each
# compute-sanitizer run; default 150).
set -uo pipefail

src=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
out=${OUT:-$PWD/gpu-results}
build=${CLM_GPU_BUILD:-$src/build-gpu}
arch=${CLM_CUDA_ARCH:-90}
jobs=${JOBS:-$(nproc)}
step_timeout=${CLM_GPU_STEP_TIMEOUT:-300}
build_timeout=${CLM_GPU_BUILD_TIMEOUT:-420}
mkdir -p "$out"
out=$(cd "$out" && pwd)
summary=$out/summary.md
start=$(date +%s)
say() { printf '[gpu/run.sh %4ss] %s\n' "$(( $(date +%s) - start ))" "$*"; }
note() { echo "- $* ($(( $(date +%s) - start )) s)" >>"$summary"; }  # one step's line in summary.md
timed_out() { [ "$1" = 124 ] || [ "$1" = 137 ]; }

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

{
  echo "# clmcache CUDA kernels: tests/gpu/run.sh"
  echo
  echo "- date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "- GPU: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -1 || echo none)"
  echo "- nvcc: $("$nvcc" --version | tail -1), sm_$arch"
  echo
  echo "## Steps"
  echo
} >"$summary"

# ---- dependencies: the archive of pack_deps.sh when it is there, else the system's ----
mkdir -p "$build"
logs=$build/gpu-logs
rm -rf "$logs"
mkdir -p "$logs"
deps_archive=${CLM_GPU_DEPS:-$src/.gpu-deps/deps.tar.gz}
dep_flags=()
if [ -f "$deps_archive" ]; then
  deps=$build/deps
  rm -rf "$deps"
  mkdir -p "$deps"
  if ! tar -xzf "$deps_archive" -C "$deps"; then
    say "FAILED: cannot unpack $deps_archive"
    note "**FAILED**: cannot unpack $deps_archive"
    exit 1
  fi
  say "dependencies from $deps_archive: $(sed 's/Package: //; s/ Version: / /' "$deps/clm-gpu-deps.txt" | paste -sd, -)"
  usr=$deps/usr
  arch_lib=$usr/lib/x86_64-linux-gnu
  # Debian keeps a few headers in the multiarch include folder (OpenSSL's
  # opensslconf.h and configuration.h), which a compiler of another
  # distribution does not search: merge them into the plain one.
  if [ -d "$usr/include/x86_64-linux-gnu" ]; then
    cp -rn "$usr/include/x86_64-linux-gnu/." "$usr/include/"
  fi
  # Every package named outright: a system without Debian's multiarch layout would not search lib/x86_64-linux-gnu.
  dep_flags=(-DCMAKE_PREFIX_PATH="$usr" -DEigen3_DIR="$usr/share/eigen3/cmake" -Dfmt_DIR="$arch_lib/cmake/fmt"
             -DCatch2_DIR="$usr/lib/cmake/Catch2" -DSQLite3_INCLUDE_DIR="$usr/include"
             -DSQLite3_LIBRARY="$arch_lib/libsqlite3.so" -DHNSWLIB_INCLUDE_DIR="$usr/include"
             -DOPENSSL_ROOT_DIR="$usr" -DOPENSSL_INCLUDE_DIR="$usr/include"
             -DOPENSSL_CRYPTO_LIBRARY="$arch_lib/libcrypto.so" -DOPENSSL_SSL_LIBRARY="$arch_lib/libssl.so"
             -DHIREDIS_INCLUDE_DIR="$usr/include" -DHIREDIS_LIBRARY="$arch_lib/libhiredis.so"
             -DOPENCC_INCLUDE_DIR="$usr/include" -DOPENCC_LIBRARY="$arch_lib/libopencc.so"
             -DOPENCC_T2S_CONFIG="$usr/share/opencc/t2s.json" -DICU_ROOT="$usr"
             # libopencc.so.1.1 needs libmarisa.so.0, from the archive too: the loader
             # looks an indirect dependency up in the DT_RPATH of the programs and
             # libraries that loaded it, never in the DT_RUNPATH the linker writes by
             # default (which serves only the object's own dependencies).
             -DCMAKE_EXE_LINKER_FLAGS=-Wl,--disable-new-dtags -DCMAKE_SHARED_LINKER_FLAGS=-Wl,--disable-new-dtags)
fi
generator=()
if ! command -v make >/dev/null 2>&1 && command -v ninja >/dev/null 2>&1; then
  generator=(-G Ninja)
fi
say "host compiler: $(c++ --version 2>/dev/null | head -1 || echo 'c++ not found'); cmake: $(cmake --version | head -1)"

# ---- configure and build (own folder, Release, one architecture) -------------
# Warnings stay warnings here: this run measures, and another machine's compiler
# (newer, with new warnings) must not stop it; CI keeps them errors.
configure() {
  timeout "$step_timeout" cmake -S "$src" -B "$build" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_COMPILER="$nvcc" \
    -DCMAKE_CUDA_ARCHITECTURES="$arch" -DCLM_CUDA=ON -DCLM_WARNINGS_AS_ERRORS=OFF "${dep_flags[@]}" \
    >"$logs/configure.log" 2>&1
}
say "configuring $build (sm_$arch)"
if ! configure; then
  if [ ${#dep_flags[@]} = 0 ] && command -v make >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1; then
    say "configure failed; checking the Debian packages (make deps), then retrying"
    make -C "$src" deps >>"$logs/configure.log" 2>&1 || true
  fi
  if ! configure; then
    tail -30 "$logs/configure.log"
    say "FAILED: configure (see configure.log in logs.tar.gz; without a package registry, run tests/gpu/pack_deps.sh where there is one and carry .gpu-deps)"
    note "configure: **FAILED** (configure.log)"
    tar -czf "$out/logs.tar.gz" -C "$logs" .
    exit 1
  fi
fi
note "configure: done"
if [ ! -d "$build/cuda" ]; then  # cuda/ is configured only when CMake enabled CUDA
  tail -30 "$logs/configure.log"
  say "FAILED: CMake did not enable CUDA (see configure.log in logs.tar.gz)"
  note "configure: **FAILED**: CMake did not enable CUDA"
  tar -czf "$out/logs.tar.gz" -C "$logs" .
  exit 1
fi
# Only what needs the device: the emulated programs (the kernel source on the
# CPU) are CI's, and every minute here is device time.
targets=(test_cuda_kernels test_cuda_plan test_device_pool bench_cuda_kernels test_cuda_clm bench_cuda_clm
         test_cuda_llama tiny_llama test_capi_kernels)
say "building ${targets[*]} with $jobs jobs"
timeout "$build_timeout" cmake --build "$build" -j"$jobs" --target "${targets[@]}" >"$logs/build.log" 2>&1
code=$?
if [ $code != 0 ]; then
  grep -E "error|Error" "$logs/build.log" | head -40
  if timed_out $code; then
    say "FAILED: build: timed out after ${build_timeout}s (see build.log in logs.tar.gz)"
    note "build: **FAILED**: timed out after ${build_timeout}s (build.log)"
  else
    say "FAILED: build (see build.log in logs.tar.gz)"
    note "build: **FAILED** (build.log)"
  fi
  tar -czf "$out/logs.tar.gz" -C "$logs" .
  exit 1
fi
say "build done"
note "build: done"

# ---- tests ------------------------------------------------------------------------
# The CPU-only ones (host checks, emulated kernels) run in the background
# while the GPU ones run; each test's row goes into summary.md as it ends.
run_test() {  # name command...
  local t=$1
  shift
  timeout "$step_timeout" "$@" >"$logs/$t.log" 2>&1
  echo $? >"$logs/$t.rc"
}
# The tiny_llama CLI on the CUDA decoder (--device cuda): a few tokens from
# the default model, end to end. Without a device it cannot make its pool.
run_cli() {
  run_test tiny_llama_cuda "$build/examples/tiny_llama/tiny_llama" --device cuda --max-new-tokens 8
  if [ "$(cat "$logs/tiny_llama_cuda.rc")" != 0 ] && grep -q "no CUDA device" "$logs/tiny_llama_cuda.log"; then
    echo "SKIPPED (no usable CUDA device: $(tail -1 "$logs/tiny_llama_cuda.log"))" >>"$logs/tiny_llama_cuda.log"
    echo 0 >"$logs/tiny_llama_cuda.rc"
  fi
}
failed=0
skipped=0
report() {  # name
  local t=$1 code line result
  code=$(cat "$logs/$t.rc" 2>/dev/null || echo 1)
  line=$(grep -E "^(All tests passed|test cases:|\{\"prompt_tokens\")" "$logs/$t.log" | tail -1)
  result=passed
  if timed_out "$code"; then
    result="**FAILED** (timed out after ${step_timeout}s)"
    failed=1
  elif [ "$code" != 0 ]; then
    result="**FAILED** (exit $code)"
    failed=1
  elif grep -q "^SKIPPED (no usable CUDA device" "$logs/$t.log"; then
    result="skipped: $(grep -m1 '^SKIPPED (no usable CUDA device' "$logs/$t.log")"
    skipped=1
  fi
  echo "| $t | $result | $(printf "%s" "${line:-no summary line}" | tr "|" "/") |" >>"$summary"
  say "$t: $result ${line}"
  if [ "$code" != 0 ]; then tail -40 "$logs/$t.log"; fi
}
cpu_tests=(test_cuda_plan)  # the host-side planning, with this machine's build
gpu_tests=(test_device_pool test_cuda_kernels test_cuda_clm test_cuda_llama capi/test_capi_kernels)  # under tests/
{
  echo
  echo "## Tests"
  echo
  echo "| test | result | summary |"
  echo "|---|---|---|"
} >>"$summary"
pids=()
for t in "${cpu_tests[@]}"; do
  run_test "$t" "$build/tests/$t" &
  pids+=($!)
done
for t in "${gpu_tests[@]}"; do
  say "running $t"
  run_test "$(basename "$t")" "$build/tests/$t"
  report "$(basename "$t")"
done
say "running tiny_llama --device cuda"
run_cli
report tiny_llama_cuda
for p in "${pids[@]}"; do wait "$p"; done
for t in "${cpu_tests[@]}"; do report "$t"; done
tar -czf "$out/logs.tar.gz" -C "$logs" .

# ---- benchmarks: JSON lines to $OUT, their markdown tables into summary.md -------------
run_bench() {  # name heading
  local name=$1 heading=$2
  say "running $name"
  : >"$logs/$name.md"
  CLM_BENCH_MARKDOWN="$logs/$name.md" timeout "$step_timeout" "$build/tests/bench/$name" >"$out/$name.jsonl" \
    2>"$logs/$name.log"
  local code=$?
  cat "$logs/$name.log"
  {
    echo
    echo "## $heading ($name)"
    echo
    if timed_out $code; then
      echo "**FAILED** (timed out after ${step_timeout}s): $(tail -3 "$logs/$name.log")"
    elif [ $code != 0 ]; then
      echo "**FAILED** (exit $code): $(tail -3 "$logs/$name.log")"
    elif [ -s "$logs/$name.md" ]; then
      cat "$logs/$name.md"
    else
      cat "$logs/$name.log"
    fi
  } >>"$summary"
  if [ $code != 0 ]; then
    say "FAILED: $name (exit $code)"
    failed=1
  elif grep -q SKIPPED "$logs/$name.log"; then
    skipped=1
  fi
}
run_bench bench_cuda_kernels "Benchmark: paged attention, page copies"
run_bench bench_cuda_clm "Benchmark: CLM model side (SRC head, snapshot adapter)"

tar -czf "$out/logs.tar.gz" -C "$logs" .

# ---- compute-sanitizer: the GPU tests again, small shapes, after the figures ------------
# memcheck (out-of-bounds and misaligned accesses, leaks of device memory),
# racecheck (shared-memory hazards), synccheck (barriers in divergent code),
# each over the kernels, the CLM model side and the device pool, with
# CLM_GPU_TEST_SMALL=1 (a sanitized kernel runs 10-100x slower). Last, so
# that a slow tool never costs the figures above.
sanitizer=$(command -v compute-sanitizer || true)
[ -n "$sanitizer" ] || sanitizer=$(dirname "$nvcc")/compute-sanitizer
sanitizer_timeout=${CLM_GPU_SANITIZER_TIMEOUT:-150}
{
  echo
  echo "## compute-sanitizer (small shapes)"
  echo
} >>"$summary"
if [ ! -x "$sanitizer" ]; then
  say "compute-sanitizer not found (PATH or next to nvcc): not run"
  echo "not run: compute-sanitizer not found (PATH or next to nvcc)" >>"$summary"
elif [ $skipped != 0 ]; then
  echo "not run: no usable CUDA device" >>"$summary"
else
  echo "| tool | test | result |" >>"$summary"
  echo "|---|---|---|" >>"$summary"
  for tool in memcheck racecheck synccheck; do
    for t in test_cuda_kernels test_cuda_clm test_device_pool; do
      name=sanitize_${tool}_$t
      say "compute-sanitizer --tool $tool $t"
      leak=()
      [ "$tool" = memcheck ] && leak=(--leak-check full)
      CLM_GPU_TEST_SMALL=1 timeout "$sanitizer_timeout" "$sanitizer" --tool "$tool" "${leak[@]}" --error-exitcode 99 \
        "$build/tests/$t" >"$logs/$name.log" 2>&1
      code=$?
      if grep -q -E "Device not supported|Unable to find injection library|Target application terminated before first instrumented API call" \
        "$logs/$name.log" && [ $code != 99 ]; then
        # Seen on gVisor machines: the tool refuses the device. Not a finding in our code.
        result="not usable here: $(grep -m1 -E 'Device not supported|injection|terminated' "$logs/$name.log" | tr '|' '/')"
        echo "| $tool | $t | $result |" >>"$summary"
        say "$name: $result; no further compute-sanitizer runs"
        break 2
      elif timed_out $code; then
        result="**FAILED** (timed out after ${sanitizer_timeout}s)"
        failed=1
      elif [ $code = 99 ]; then
        result="**FAILED**: $(grep -m1 -E 'ERROR SUMMARY|Invalid|Race|Barrier' "$logs/$name.log" | tr '|' '/')"
        failed=1
      elif [ $code != 0 ]; then
        result="**FAILED** (exit $code)"
        failed=1
      else
        result="passed: $(grep -m1 'ERROR SUMMARY' "$logs/$name.log" || echo 'no summary line')"
      fi
      echo "| $tool | $t | $result |" >>"$summary"
      say "$name: $result"
    done
  done
fi
tar -czf "$out/logs.tar.gz" -C "$logs" .
echo
cat "$summary"
echo
say "results in $out: summary.md, bench_cuda_kernels.jsonl, bench_cuda_clm.jsonl, logs.tar.gz"
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
