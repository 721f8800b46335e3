#!/usr/bin/env bash
# examples/demo/demo.sh BUILD_DIR [clm_demo flags...]: the main job of `make
# demo`. A Debian support bot (examples/demo/scenario.hpp) on the tiny_llama
# decoder over the engine, with the cache off and then on (and CLM in the
# loop), in one process; tables at the end.
#
# The CLM parts (SRC head, snapshot projection, adapter) are trained on the
# demo's own conversations the first time: clm_demo --collect records them
# with CLM off, examples/tiny_llama/train_clm.sh fits the parts with clm_fit
# into BUILD_DIR/clm-demo/trained, which later runs reuse (delete it to
# retrain). They are trained again when the model changes (its config.json
# text or its weights: clm_demo --write-model-key, kept beside them).
#
# The SRC gate's threshold is 0 here: the decoder has random weights, so its
# answers never repeat and a head trained on them cannot tell a repeated
# question from a new one (train_clm prints its AUC). With the gate open,
# every step looks its suffix up, and the table shows what the store finds,
# level by level. A host with real weights keeps the traffic-based threshold.
#
# Then what was reused: one line per snapshot the store served a request, the
# question asked <- the question whose snapshot it was, with their intents
# (examples/demo/questions.tsv), marked OTHER when they differ, and the
# counts; the same pairs go to BUILD_DIR/clm-demo/reuse.tsv (columns in
# examples/demo/reuse_report.hpp).
#
# With --tokenizer FILE (make demo TOKENIZER=FILE): a Hugging Face
# tokenizer.json (Qwen3's, examples/tokenizer) instead of byte tokens, the
# model's vocabulary its size; CLM in the loop finds the question by the byte
# template, so that run has no CLM parts and trains none.
set -euo pipefail
export LC_ALL=C
if [[ $# -lt 1 ]]; then
  echo "usage: $0 BUILD_DIR [clm_demo flags...]" >&2
  exit 2
fi
build=$1
shift
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
demo=$build/examples/demo/clm_demo
clm_fit=$build/examples/clm_fit/clm_fit
for arg in "$@"; do
  if [[ $arg == --tokenizer && -x $demo ]]; then
    exec "$demo" "$@"
  fi
done
for tool in "$demo" "$clm_fit"; do
  if [[ ! -x $tool ]]; then
    echo "$0: $tool is not built (make build)" >&2
    exit 2
  fi
done
trained=$build/clm-demo/trained
# The parts fit the model they were trained on: retrain for another one.
key=$(mktemp "${TMPDIR:-/tmp}/clm-demo-model.XXXXXX")
collect=
trap 'rm -rf "$key" ${collect:+"$collect"}' EXIT
"$demo" --write-model-key "$key" "$@"
if [[ -f $trained/model-key.txt ]] && ! cmp -s "$key" "$trained/model-key.txt"; then
  echo "The CLM parts in $trained were trained for another model: training them again"
  rm -f "$trained"/{head,projection,adapter}.safetensors "$trained/model-key.txt"
fi
if [[ ! -f $trained/head.safetensors || ! -f $trained/projection.safetensors || ! -f $trained/adapter.safetensors ||
  ! -f $trained/model-key.txt ]]; then
  echo "Training the CLM parts on the demo's own conversations (once; kept in $trained)"
  collect=$(mktemp -d "${TMPDIR:-/tmp}/clm-demo-collect.XXXXXX")
  "$demo" --collect "$collect" "$@"
  mkdir -p "$trained"
  "$here/../tiny_llama/train_clm.sh" "$clm_fit" "$collect" "$trained"
  cp "$key" "$trained/model-key.txt"
  echo
fi
"$demo" --clm-dir "$trained" --src-threshold 0 --reuse-tsv "$build/clm-demo/reuse.tsv" "$@"
