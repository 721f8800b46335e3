#!/usr/bin/env bash
# The ABI guard of libclmcache.so.0, with libabigail (abidw, abidiff).
#
#   abi.sh dump  LIB SOURCE_DIR OUT.abi
#       writes LIB's ABI (the functions it exports and the types of capi/
#       they reach) as reproducible ABIXML: no paths of this checkout, no
#       source locations, no DT_NEEDED, hashed type ids.
#   abi.sh check LIB SOURCE_DIR BASELINE.abi [WORK_DIR]
#       dumps LIB the same way (into WORK_DIR, default a temp dir) and compares
#       it with BASELINE.abi. abidiff's exit status is a bit set
#       (ABIDIFF_ERROR = 1, ABIDIFF_USAGE_ERROR = 2, ABIDIFF_ABI_CHANGE = 4,
#       ABIDIFF_ABI_INCOMPATIBLE_CHANGE = 8):
#         0                                 pass: no change
#         bit 4 only, additions only        pass, and print the report
#         bit 8                             FAIL: incompatible change
#         bit 1 or 2                        FAIL: abidiff error / usage error
#         bit 4 with a removed or changed   FAIL (see below)
#           function or variable
#       libabigail sets bit 8 only for changes it knows break callers (a
#       removed function, say). A changed public type (a struct field retyped,
#       reordered or appended, a parameter or return type changed) gets bit 4
#       alone, as it cannot tell whether callers survive. So with bit 4 only
#       added functions and variables pass; any removed or changed one fails,
#       and an intended change (e.g. a field appended to a versioned options
#       struct) is accepted by regenerating the baseline in the same commit.
#       (No suppression file: libabigail's has_data_member_inserted_at = end
#       also hides a retyped field that grows the struct.)
#       A change to a #define (status codes, CLM_* constants) leaves no trace
#       in the binary, and is not seen.
# LIB must carry DWARF (capi/CMakeLists.txt builds it with -g).
set -euo pipefail

ABIDW=${ABIDW:-abidw}
ABIDIFF=${ABIDIFF:-abidiff}

usage() {
  echo "usage: $0 dump LIB SOURCE_DIR OUT.abi" >&2
  echo "       $0 check LIB SOURCE_DIR BASELINE.abi [WORK_DIR]" >&2
  exit 2
}

# dump LIB SOURCE_DIR OUT
dump() {
  local lib=$1 src=$2 out=$3 tmp
  [[ -f "$lib" ]] || { echo "abi.sh: no library at $lib" >&2; return 1; }
  readelf -S "$lib" | grep -q '\.debug_info' ||
    { echo "abi.sh: $lib has no DWARF (.debug_info): build it with -g" >&2; return 1; }
  tmp=$out.tmp.$$
  # Only clm.h is public: capi/ also holds the C ABI's internal header.
  "$ABIDW" --header-file "$src/capi/clm.h" --drop-private-types --exported-interfaces-only \
    --no-corpus-path --no-comp-dir-path --no-show-locs --no-elf-needed --type-id-style hash \
    --out-file "$tmp" "$lib" || { rm -f "$tmp"; return 1; }
  # abi-instr carries the compiled file's absolute path: keep it relative to
  # the source tree, so that every checkout writes the same bytes.
  sed -e "s|path='$src/|path='|g" "$tmp" >"$out" || { rm -f "$tmp"; return 1; }
  rm -f "$tmp"
  check_abixml "$out"
}

# abidiff exits 0 on an ABIXML file it cannot parse, so a damaged baseline
# (truncated, merge markers) would compare as "no change": look at it first.
check_abixml() {
  local file=$1
  [[ -s "$file" ]] || { echo "abi.sh: $file is empty" >&2; return 1; }
  grep -Eq "^<abi-corpus .*soname='libclmcache[.]so[.][0-9]+'" "$file" ||
    { echo "abi.sh: $file is not the ABIXML of libclmcache.so.N" >&2; return 1; }
  grep -q "<elf-symbol name='clm_" "$file" || { echo "abi.sh: $file lists no clm_* symbol" >&2; return 1; }
  [[ "$(tail -n 1 "$file")" == "</abi-corpus>" ]] || { echo "abi.sh: $file is truncated" >&2; return 1; }
  if grep -Eq '^(<<<<<<<|=======|>>>>>>>)' "$file"; then echo "abi.sh: $file has merge markers" >&2; return 1; fi
}

[[ $# -ge 1 ]] || usage
mode=$1
shift
case $mode in
  dump)
    [[ $# -eq 3 ]] || usage
    dump "$1" "$(cd "$2" && pwd -P)" "$3"
    ;;
  check)
    [[ $# -eq 3 || $# -eq 4 ]] || usage
    lib=$1
    src=$(cd "$2" && pwd -P)
    baseline=$3
    if [[ $# -eq 4 ]]; then
      mkdir -p "$4"
      work=$(cd "$4" && pwd -P)
    else
      work=$(mktemp -d)
      trap 'rm -rf "$work"' EXIT
    fi
    [[ -f "$baseline" ]] || { echo "abi_check: FAILED: no baseline at $baseline (tests/abi/update_baseline.sh BUILD_DIR makes one)" >&2; exit 1; }
    check_abixml "$baseline" || { echo "abi_check: FAILED: damaged baseline (tests/abi/update_baseline.sh BUILD_DIR remakes it)" >&2; exit 1; }
    current=$work/current.abi
    dump "$lib" "$src" "$current" || { echo "abi_check: FAILED: abidw could not read $lib" >&2; exit 1; }
    set +e
    "$ABIDIFF" --no-show-locs "$baseline" "$current" >"$work/abidiff.txt" 2>&1
    rc=$?
    set -e
    echo "abidiff $(basename "$baseline") $(basename "$lib"): exit status $rc"
    report() { sed 's/^/  | /' "$work/abidiff.txt"; }
    if grep -q 'parser error' "$work/abidiff.txt"; then
      report
      echo "abi_check: FAILED: abidiff could not parse an ABIXML file (exit $rc)" >&2
      exit 1
    fi
    if ((rc & 3)); then
      report
      echo "abi_check: FAILED: abidiff did not run properly (exit $rc: bit 1 error, bit 2 usage error)" >&2
      exit 1
    fi
    if ((rc & 8)); then
      report
      echo "abi_check: FAILED: incompatible ABI change (ABIDIFF_ABI_INCOMPATIBLE_CHANGE) against $baseline." >&2
      echo "  Callers compiled against libclmcache.so.0 would break: undo it, or bump the SONAME" >&2
      echo "  (PROJECT_VERSION major) and regenerate the baseline with tests/abi/update_baseline.sh." >&2
      exit 1
    fi
    if ((rc & 4)); then
      report
      # "Functions changes summary: 0 Removed, 1 Changed (1 filtered out), 2 Added functions",
      # the same for variables and for symbols without debug info: only
      # additions are compatible (changes libabigail filters out as harmless
      # are not counted).
      if grep -Eq '^(Functions|Variables) changes summary: ([1-9][0-9]* Removed|[0-9]+ Removed, [1-9][0-9]* Changed)' \
        "$work/abidiff.txt" ||
        grep -Eq '^(Function|Variable) symbols changes summary: [1-9][0-9]* Removed' "$work/abidiff.txt" ||
        grep -q '^ELF SONAME changed' "$work/abidiff.txt"; then
        echo "abi_check: FAILED: the ABI changed in a way callers compiled against $baseline may not survive" >&2
        echo "  (a removed or changed function, variable or type above). If it is intended and" >&2
        echo "  compatible, or comes with a SONAME bump, regenerate the baseline with tests/abi/update_baseline.sh." >&2
        exit 1
      fi
      echo "abi_check: compatible ABI change (ABIDIFF_ABI_CHANGE: additions only): passes."
      echo "  Regenerate the baseline with tests/abi/update_baseline.sh BUILD_DIR when the release is cut."
      exit 0
    fi
    echo "abi_check: no ABI change against $baseline"
    ;;
  *)
    usage
    ;;
esac
