#!/usr/bin/env bash
# tests/check_eigen_avx2_isolation.sh OBJECTS: lib/kernels/eigen_avx2.cpp's object may
# hold AVX instructions only in Eigen's renamed copy (ClmEigenAvx2), our two
# entry points, and functions of an anonymous namespace (internal linkage:
# never merged); any other function compiled for AVX there could be picked by
# the linker for the generic build and crash a CPU without AVX.
# OBJECTS: clmcache_core's object files (a ;-separated list, as CMake gives it).
set -euo pipefail
obj=""
IFS=';' read -ra objects <<<"$*"
for o in "${objects[@]}"; do
  [[ "$o" == *eigen_avx2.cpp.o ]] && obj=$o
done
[[ -n "$obj" ]] || { echo "no eigen_avx2.cpp.o among the objects"; exit 1; }
report=$(objdump -d --no-show-raw-insn -C "$obj" | awk '
  /^[0-9a-f]+ <.*>:$/ { name = $0; sub(/^[0-9a-f]+ </, "", name); sub(/>:$/, "", name); next }
  /\t(v[a-z0-9]+ |.*%ymm)/ { vex[name]++ }
  END { for (n in vex) print (n ~ /ClmEigenAvx2|gemm_nt_avx2|src_head_pooled_logits_avx2|\(anonymous namespace\)/ ? "ok " : "BAD ") vex[n] " " n }')
if [[ -z "$report" ]]; then
  echo "no AVX instruction at all in $obj: the AVX2 build is not being compiled (or this check is broken)"
  exit 1
fi
if grep -q '^BAD ' <<<"$report"; then
  echo "functions outside Eigen's renamed copy compiled for AVX in $obj:"
  grep '^BAD ' <<<"$report"
  exit 1
fi
echo "$(grep -c '^ok ' <<<"$report") functions with AVX instructions, all in Eigen's renamed copy or our entry points"
