# tests/install/consumer_common.sh: what the installed-package consumers
# (c_consumer.sh, cpp_consumer.sh) share. Sourced; then
#
#   consumer_begin c_consumer "MODES STAGE_DIR EXAMPLE_DIR WORK_DIR" "$@"
#
# checks for the four arguments (MODE STAGE_DIR THIRD WORK_DIR), sets `mode`,
# `stage` (absolute) and `work` (a fresh folder under WORK_DIR, removed when
# the script passes and kept, with a note, when it fails), and fail() reports
# a failure under the consumer's name and mode.

consumer_begin() {
  consumer_name=$1
  local usage=$2
  shift 2
  if [[ $# -ne 4 ]]; then
    echo "usage: $consumer_name.sh $usage" >&2
    exit 2
  fi
  mode=$1
  stage=$(cd "$2" && pwd -P)
  mkdir -p "$4"
  work=$(mktemp -d "$(cd "$4" && pwd -P)/${mode}.XXXXXX")
  trap consumer_cleanup EXIT
}

fail() {
  echo "$consumer_name[$mode]: FAILED: $*" >&2
  exit 1
}

consumer_cleanup() {
  local rc=$?
  if [[ $rc -eq 0 ]]; then rm -rf "$work"; else echo "$consumer_name[$mode]: work directory kept: $work" >&2; fi
}
