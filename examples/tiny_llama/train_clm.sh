#!/usr/bin/env bash
# examples/tiny_llama/train_clm.sh: trains the CLM parts of the loop (SRC head,
# snapshot projection, snapshot adapter) with clm_fit on what a
# tiny_llama::ClmCollector wrote (clm_collect.hpp), and leaves
# head.safetensors, projection.safetensors and adapter.safetensors in OUT_DIR.
#
#   examples/tiny_llama/train_clm.sh build/examples/clm_fit/clm_fit clm-collect clm-trained
#
# One line per step on stdout ("train_clm: <step>: <clm_fit's JSON summary>").
# Any error stops it with a message on stderr and exit status 1, and OUT_DIR
# gets none of the three files: they are written to a temporary folder inside
# it and moved into place only when every step succeeded. The SRC head's
# training can be tuned with CLM_SRC_EPOCHS (30), CLM_SRC_LR (3e-3) and
# CLM_SRC_SEED (0); the adapter's ridge with CLM_ADAPTER_LAMBDA (1e-2).
set -euo pipefail

fail() {
  echo "train_clm: $*" >&2
  exit 1
}

[[ $# -eq 3 ]] || fail "usage: train_clm.sh CLM_FIT_BINARY COLLECT_DIR OUT_DIR"
clm_fit=$1
collect=$2
out=$3
[[ -x $clm_fit ]] || fail "clm_fit binary '$clm_fit' is missing or not executable (build the clm_fit target)"
[[ -d $collect ]] || fail "collect directory '$collect' does not exist (ClmCollector::write makes it)"
for f in clm_collect.txt conversations.safetensors src_features.safetensors hidden_samples.safetensors \
  adapter_pairs.safetensors; do
  [[ -f $collect/$f ]] || fail "'$collect/$f' is missing: not a ClmCollector directory, or an incomplete one"
done

# A whole-number or decimal value of the manifest, or a clear failure.
setting() {
  local line
  line=$(grep -E "^$1=" "$collect/clm_collect.txt" | tail -n 1) || fail "'$collect/clm_collect.txt' has no $1"
  local value=${line#*=}
  [[ $value =~ ^[0-9]+([.][0-9]+)?([eE][-+]?[0-9]+)?$ ]] || fail "'$collect/clm_collect.txt': $1='$value' is not a number"
  echo "$value"
}
dim=$(setting snapshot_dim)
ngram=$(setting label_ngram)
scale=$(setting residual_scale)

mkdir -p "$out" || fail "cannot create '$out'"
work=$(mktemp -d "$out/.train_clm.XXXXXX") || fail "cannot make a temporary folder in '$out'"
trap 'rm -rf "$work"' EXIT

# Runs one clm_fit step; prints its summary, or fails with clm_fit's message.
step() {
  local name=$1
  shift
  local output
  if ! output=$("$clm_fit" "$@" 2>&1); then
    fail "$name failed: $(echo "$output" | head -n 3 | tr '\n' ' ')"
  fi
  echo "train_clm: $name: $(echo "$output" | tail -n 1)"
}

step labels labels --tokens "$collect/conversations.safetensors" --n "$ngram" --out "$work/labels.safetensors"
step src-head src-head --data "$collect/src_features.safetensors" --labels "$work/labels.safetensors" \
  --out "$work/head.safetensors" --epochs "${CLM_SRC_EPOCHS:-30}" --lr "${CLM_SRC_LR:-3e-3}" \
  --seed "${CLM_SRC_SEED:-0}"
step projection projection --data "$collect/hidden_samples.safetensors" --dim "$dim" \
  --out "$work/projection.safetensors"
step adapter adapter --data "$collect/adapter_pairs.safetensors" --projection "$work/projection.safetensors" \
  --residual-scale "$scale" --lambda "${CLM_ADAPTER_LAMBDA:-1e-2}" --out "$work/adapter.safetensors"

for f in projection adapter head; do
  mv -f "$work/$f.safetensors" "$out/$f.safetensors" || fail "cannot move $f.safetensors into '$out'"
done
echo "train_clm: done: $out/head.safetensors $out/projection.safetensors $out/adapter.safetensors"
