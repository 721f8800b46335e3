#!/usr/bin/env bash
# examples/server/test_server_clm.sh: CLM suffix reuse from clm_server (ctest
# runs it as clm_server_clm):
#
#   test_server_clm.sh CLM_SERVER JSON_PROBE CLM_DEMO CLM_FIT TRAIN_CLM_SH LEXICON_DIR
#
# Trains the CLM parts for the tests' small model as `make demo` does
# (clm_demo --collect on that model, then train_clm.sh with clm_fit), starts
# the server with a snapshot store (a SQLite file here) and those parts, and
# checks: the first ask of a question records its snapshot under the
# question's key, the same question again is served it at level exact and
# injected, another tenant's ask of it finds nothing (the store keys by
# tenant), the version it created is a JSON line in --clm-events and in GET
# /debug/cache, the store survives a restart on the same file, and flags
# that cannot work are refused. Everything lives in one mktemp -d directory.
# shellcheck disable=SC2015  # `[ A ] && [ B ] || fail ...` fails when either test does: meant
set -euo pipefail

usage="usage: test_server_clm.sh CLM_SERVER JSON_PROBE CLM_DEMO CLM_FIT TRAIN_CLM_SH LEXICON_DIR"
server=${1:?$usage}
probe=${2:?$usage}
demo=${3:?$usage}
clm_fit=${4:?$usage}
train=${5:?$usage}
lexicons=${6:?$usage}
# shellcheck source=examples/server/test_lib.sh
source "$(dirname "$0")/test_lib.sh"

"$demo" --config "$work/config.json" --collect "$work/collect" >"$work/collect.log" 2>&1 ||
  fail "clm_demo --collect: $(tail -3 "$work/collect.log")"
bash "$train" "$clm_fit" "$work/collect" "$work/trained" >"$work/train.log" 2>&1 ||
  fail "train_clm.sh: $(tail -3 "$work/train.log")"
ok "CLM parts trained for the tests' model ($(grep -c . "$work/train.log") steps)"

# Flags that cannot work: exit 2 and a message.
refuse_to_start "needs --snapshot-store" --clm-dir "$work/trained"
refuse_to_start "need --snapshot-store" --lexicons "$lexicons"
refuse_to_start "needs --clm-dir" --snapshot-store "$work/x.db" --src-threshold 0
refuse_to_start "clm-dir $work/nowhere" --snapshot-store "$work/x.db" --clm-dir "$work/nowhere"
refuse_to_start "clm-events needs --snapshot-store" --clm-events "$work/events.jsonl"
ok "CLM flags that cannot work: exit 2 with a message"

clm_flags=(--snapshot-store "$work/store.db" --snapshot-min-usage 1 --lexicons "$lexicons" --clm-dir "$work/trained"
  --src-threshold 0 --trust-x-tenant --clm-events "$work/clm-events.jsonl")
launch "${clm_flags[@]}"
ask='{"messages":[{"role":"user","content":"How do I install a package with apt?"}],"max_tokens":8,"temperature":0}'
post acme "$ask"
expect_eq "$code" 200 "the first ask"
expect_eq "$(field clm.recorded)" true "the first ask: recorded"
key=$(field clm.key)
[ -n "$key" ] && [ "$key" != null ] || fail "the first ask has no suffix key"
expect_eq "$(field clm.hits_exact)" 0 "the first ask: nothing to be served yet"
post acme "$ask"
expect_eq "$code" 200 "the second ask"
expect_eq "$(field clm.key)" "$key" "the second ask: the same key"
hits=$(field clm.hits_exact)
[ "$hits" -ge 1 ] && [ "$(field clm.injected_steps)" -ge 1 ] ||
  fail "the second ask: $hits exact hits, $(field clm.injected_steps) injected steps"
post globex "$ask"
expect_eq "$(field clm.hits_exact)" 0 "another tenant's ask: nothing of acme's"
# What an operator watches (docs/observability.md): the version the first ask
# created, as a JSON line in --clm-events and in GET /debug/cache.
grep -q "\"event\":\"version_created\",\"tenant\":\"acme\",\"adapter_id\":1,\"key\":\"$key\",\"version\":1}" \
  "$work/clm-events.jsonl" || fail "--clm-events has no version_created line for $key: $(cat "$work/clm-events.jsonl")"
code=$(curl -s -o "$work/out" -w '%{http_code}' "$base/debug/cache")
expect_eq "$code" 200 "/debug/cache"
expect_eq "$(field clm.enabled)" true "/debug/cache: the CLM watch"
expect_eq "$(field clm.events.0.event)" version_created "/debug/cache: the first CLM event"
expect_eq "$(field clm.events.0.key)" "$key" "/debug/cache: its key"
# Retention under CLM: the pin names the adapter CLM's requests are cached under.
headers=$(curl -s -D - -o "$work/out" -H 'X-Tenant: acme' --data-binary "${ask%\}},\"prompt_cache_retention\":\"24h\"}" \
  "$base/v1/chat/completions")
grep -qi '^X-Clm-Pins: prompt_cache_retention=[1-9][0-9]* tokens' <<<"$headers" ||
  fail "a 24h retention under CLM: $(grep -i x-clm-pins <<<"$headers")"
stop
ok "CLM in the loop: recorded under $key, served back at level exact ($hits hits), never to another tenant; \
a 24h retention pinned"

launch "${clm_flags[@]}"
post acme "$ask"
[ "$(field clm.hits_exact)" -ge 1 ] || fail "after a restart on the same store: no exact hit"
stop
ok "the snapshot store survives a restart on the same file"
echo "all $checks checks passed"
