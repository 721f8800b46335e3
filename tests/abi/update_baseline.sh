#!/usr/bin/env bash
# Regenerates tests/abi/libclmcache.abi from a build's libclmcache.so.N.
#
#   tests/abi/update_baseline.sh BUILD_DIR
#
# Run it when an ABI change is intended (a new function, a field appended to a
# versioned struct, or an incompatible change that comes with a SONAME bump),
# and commit the new baseline with the change. Needs abidw (abigail-tools).
set -euo pipefail

if [[ $# -ne 1 ]]; then
  echo "usage: $0 BUILD_DIR" >&2
  exit 2
fi
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd -P)
src=$(cd "$here/../.." && pwd -P)
# The link-time name points at the library of the current SONAME.
lib=$(cd "$1" && pwd -P)/capi/libclmcache.so
[[ -e "$lib" ]] || { echo "update_baseline: no $lib: build the clmcache target first" >&2; exit 1; }
lib=$(realpath "$lib")
bash "$here/abi.sh" dump "$lib" "$src" "$here/libclmcache.abi"
echo "update_baseline: wrote $here/libclmcache.abi from $lib"
if command -v git >/dev/null && git -C "$src" rev-parse --git-dir >/dev/null 2>&1; then
  git -C "$src" diff --stat -- tests/abi/libclmcache.abi || true
fi
