#!/usr/bin/env bash
# examples/demo/demo.sh BUILD_DIR: the main job of `make demo`. A Debian
# support bot (examples/demo/scenario.hpp) on the tiny_llama decoder over the
# engine, with the cache off and then on, in one process; tables at the end.
set -euo pipefail
export LC_ALL=C
if [[ $# -lt 1 ]]; then
  echo "usage: $0 BUILD_DIR [clm_demo flags...]" >&2
  exit 2
fi
build=$1
shift
demo=$build/examples/demo/clm_demo
if [[ ! -x $demo ]]; then
  echo "$0: $demo is not built (make build)" >&2
  exit 2
fi
exec "$demo" "$@"
