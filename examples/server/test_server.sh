#!/usr/bin/env bash
# examples/server/test_server.sh: clm_server over HTTP with curl (ctest runs it
# as clm_server_http):
#
#   test_server.sh PATH/TO/clm_server PATH/TO/json_probe
#
# Starts the server on a free port (--port 0) with a small random model (a
# config.json written here), then checks, each against numbers worked out
# here from the byte tokenizer's chat template: flags that cannot work (exit 2,
# a message, nothing listening), a 3-turn conversation of one
# tenant (turns 2 and 3 find the earlier turns cached), a second tenant and
# the default tenant sending turn 1 again (nothing cached: tenants never
# share pages), a stream (every chunk JSON, the text the same as the same
# request answered in one piece, [DONE] last), concurrent requests, bad
# requests (each the right status and OpenAI's error shape, and the server
# keeps serving), a client that disconnects mid-stream (its request
# cancelled, its pages released), /metrics against the requests made, the
# KV events of it all read back through the replay socket by an independent
# Python subscriber (python3-zmq, python3-msgpack), a storage tier shared by
# instances one after another (and refused to another model id), and SIGTERM: exit status 0, which the server gives only when the engine's
# invariants hold and no sequence is left. curl, bash and python3 (json_probe
# reads the JSON); everything lives in one mktemp -d directory, removed at
# the end.
# shellcheck disable=SC2015  # `[ A ] && [ B ] || fail ...` fails when either test does: meant
set -euo pipefail

server=${1:?usage: test_server.sh PATH/TO/clm_server PATH/TO/json_probe}
probe=${2:?usage: test_server.sh PATH/TO/clm_server PATH/TO/json_probe}
# shellcheck source=examples/server/test_lib.sh
source "$(dirname "$0")/test_lib.sh"

# ---- start ------------------------------------------------------------------
# Flags (and --server-config files) that cannot work: exit 2 and a message
# naming the flag, before or after the model loads, and nothing listens.
refuse_to_start "needs --model-id" --kv-events 'tcp://127.0.0.1:*'
refuse_to_start "need --kv-events" --kv-events-topic kv@a@b
refuse_to_start "need --kv-events" --model-id m --kv-events-replay 'tcp://127.0.0.1:*'
refuse_to_start "not a number" --model-id m --kv-events 'tcp://127.0.0.1:*' --kv-events-batch-ms often
refuse_to_start topic --model-id m --kv-events 'tcp://127.0.0.1:*' --kv-events-topic "$(printf 't%.0s' $(seq 300))"
refuse_to_start "kv_events" --model-id m --kv-events 'nonsense://x'
refuse_to_start "needs --model-id" --host-tokens 4096 --storage "file://$work/nowhere"
refuse_to_start "needs a host tier" --model-id m --storage "file://$work/nowhere"
refuse_to_start "unknown value 'belady'" --eviction-policy belady
refuse_to_start "unknown value 'sometimes'" --write-policy sometimes
refuse_to_start "cannot read" --server-config "$work/no-such.json"
printf '{"pool-tokens": "many"}' >"$work/bad.json"
refuse_to_start "server-config: --pool-tokens: not a number" --server-config "$work/bad.json"
printf '{"porte": 1}' >"$work/bad.json"
refuse_to_start "unknown flag --porte" --server-config "$work/bad.json"
printf '[1, 2]' >"$work/bad.json"
refuse_to_start "not a JSON object" --server-config "$work/bad.json"
ok "flags that cannot work: exit 2 with a message, nothing listening"

launch --trust-x-tenant --default-max-tokens 24 --max-body-bytes 65536 --served-model-name tiny-test --model-id "tiny-test@$$" \
  --kv-events 'tcp://127.0.0.1:*' \
  --kv-events-replay 'tcp://127.0.0.1:*' --kv-events-topic kv@test@tiny --kv-events-batch-ms 5
ok "listening on 127.0.0.1:$port"
kv_replay=$(sed -n '2s/^kv events on tcp:\/\/127\.0\.0\.1:[0-9][0-9]* replay \(tcp:\/\/127\.0\.0\.1:[0-9][0-9]*\)$/\1/p' \
  "$work/server.out")
[ -n "$kv_replay" ] || fail "no 'kv events on ENDPOINT replay ENDPOINT' line: $(sed -n 2p "$work/server.out")"
ok "KV events published, replay on $kv_replay"

code=$(curl -s -o "$work/out" -w '%{http_code}' "$base/v1/models")
expect_eq "$code" 200 "GET /v1/models"
expect_eq "$(field object)" list "/v1/models: object"
expect_eq "$(field data.0.id)" tiny-test "/v1/models: the served model's name"
expect_eq "$(field data.0.object)" model "/v1/models: data[0].object"
expect_eq "$(field data.0.max_model_len)" 4096 "/v1/models: the context (the model's 4096 positions)"
ok "GET /v1/models lists the served model and its context"

code=$(curl -s -o "$work/out" -w '%{http_code}' "$base/health")
expect_eq "$code" 200 "GET /health"
ok "GET /health is 200"

# ---- one tenant, three turns ------------------------------------------------
system='You are a helpful assistant for Debian users.'
user1='How do I install Debian?'
user2='And how do I upgrade it to the next release?'
user3='Thanks! What is apt?'
m_system="{\"role\":\"system\",\"content\":\"$system\"}"
m_user1="{\"role\":\"user\",\"content\":\"$user1\"}"
m_user2="{\"role\":\"user\",\"content\":\"$user2\"}"
m_user3="{\"role\":\"user\",\"content\":\"$user3\"}"
turn1="[$m_system,$m_user1]"
prompt1=$((1 + $(message_tokens system ${#system}) + $(message_tokens user ${#user1}) + assistant_header))

post acme "{\"model\":\"tiny\",\"messages\":$turn1,\"max_tokens\":24,\"temperature\":0}"
expect_eq "$code" 200 "turn 1"
expect_eq "$(field object)" chat.completion "turn 1: object"
expect_eq "$(field model)" tiny "turn 1: the model is echoed"
expect_eq "$(field choices.0.message.role)" assistant "turn 1: role"
expect_eq "$(field usage.prompt_tokens)" $prompt1 "turn 1: prompt_tokens"
expect_eq "$(field usage.prompt_tokens_details.cached_tokens)" 0 "turn 1: cached_tokens on a fresh server"
completion=$(field usage.completion_tokens)
[ "$completion" -ge 1 ] && [ "$completion" -le 24 ] || fail "turn 1: completion_tokens $completion"
expect_eq "$(field usage.total_tokens)" $((prompt1 + completion)) "turn 1: total_tokens"
case $(field choices.0.finish_reason) in stop | length) ;; *) fail "turn 1: finish_reason" ;; esac
field id | grep -q '^chatcmpl-' || fail "turn 1: id"
field timings.ttft_seconds >/dev/null
answer1=$("$probe" json choices.0.message.content <"$work/out")
answer1_bytes=$("$probe" bytes choices.0.message.content <"$work/out")
answered $prompt1 0
ok "turn 1: $prompt1 prompt tokens, none cached"

m_answer1="{\"role\":\"assistant\",\"content\":$answer1}"
turn2="[$m_system,$m_user1,$m_answer1,$m_user2]"
prompt2=$((prompt1 + answer1_bytes + 1 + $(message_tokens user ${#user2}) + assistant_header))
post acme "{\"messages\":$turn2,\"max_completion_tokens\":24,\"temperature\":0}"
expect_eq "$code" 200 "turn 2"
expect_eq "$(field usage.prompt_tokens)" $prompt2 "turn 2: prompt_tokens"
cached2=$(field usage.prompt_tokens_details.cached_tokens)
# Turn 1's whole prompt was cached when it finished, in whole pages.
[ "$cached2" -ge $((prompt1 / page * page)) ] && [ "$cached2" -lt $prompt2 ] && [ $((cached2 % page)) = 0 ] ||
  fail "turn 2: cached_tokens $cached2 (turn 1's prompt: $prompt1)"
expect_eq "$(field usage.prompt_tokens_details.cached_tokens_by_source.device)" "$cached2" \
  "turn 2: cached on the device"
answer2=$("$probe" json choices.0.message.content <"$work/out")
answer2_bytes=$("$probe" bytes choices.0.message.content <"$work/out")
answered $prompt2 "$cached2"
ok "turn 2: $cached2 of $prompt2 prompt tokens cached"

turn3="[$m_system,$m_user1,$m_answer1,$m_user2,{\"role\":\"assistant\",\"content\":$answer2},$m_user3]"
prompt3=$((prompt2 + answer2_bytes + 1 + $(message_tokens user ${#user3}) + assistant_header))
post acme "{\"messages\":$turn3,\"max_tokens\":24,\"temperature\":0}"
expect_eq "$code" 200 "turn 3"
expect_eq "$(field usage.prompt_tokens)" $prompt3 "turn 3: prompt_tokens"
cached3=$(field usage.prompt_tokens_details.cached_tokens)
[ "$cached3" -ge $((prompt2 / page * page)) ] && [ "$cached3" -lt $prompt3 ] ||
  fail "turn 3: cached_tokens $cached3 (turn 2's prompt: $prompt2)"
answered $prompt3 "$cached3"
ok "turn 3: $cached3 of $prompt3 prompt tokens cached"

# ---- other tenants get nothing of acme's ------------------------------------
post globex "{\"messages\":$turn1,\"max_tokens\":24,\"temperature\":0}"
expect_eq "$code" 200 "tenant globex"
expect_eq "$(field usage.prompt_tokens_details.cached_tokens)" 0 "tenant globex: cached_tokens"
expect_eq "$("$probe" json choices.0.message.content <"$work/out")" "$answer1" "tenant globex: the same greedy answer"
answered $prompt1 0
post - "{\"messages\":$turn1,\"max_tokens\":24,\"temperature\":0}"
expect_eq "$code" 200 "the default tenant"
expect_eq "$(field usage.prompt_tokens_details.cached_tokens)" 0 "the default tenant: cached_tokens"
answered $prompt1 0
ok "tenant globex and the default tenant find nothing cached of acme's turn 1"

# top_k 1 leaves one token to draw: the greedy answer, at any temperature.
post topk "{\"messages\":$turn1,\"max_tokens\":24,\"temperature\":1.5,\"top_k\":1,\"seed\":3}"
expect_eq "$code" 200 "top_k 1"
expect_eq "$("$probe" json choices.0.message.content <"$work/out")" "$answer1" "top_k 1 against the greedy answer"
answered $prompt1 0
ok "top_k is honoured: top_k 1 at temperature 1.5 gives the greedy answer"

# ---- a stream ---------------------------------------------------------------
question='你好！Debian 是什么？'
prompt_zh=$((1 + $(message_tokens user ${#question}) + assistant_header))
ask_zh="\"messages\":[{\"role\":\"user\",\"content\":\"$question\"}],\"max_tokens\":40,\"temperature\":1.0,\"seed\":11"
post stream-a "{$ask_zh,\"stream\":true,\"stream_options\":{\"include_usage\":true}}" -N
expect_eq "$code" 200 "stream"
"$probe" sse <"$work/out" >"$work/summary" || fail "the stream breaks the rules"
cp "$work/summary" "$work/out"
expect_eq "$(field role)" assistant "stream: role"
expect_eq "$(field usage.prompt_tokens)" $prompt_zh "stream: prompt_tokens"
expect_eq "$(field usage.prompt_tokens_details.cached_tokens)" 0 "stream: cached_tokens"
streamed=$("$probe" json content <"$work/out")
stream_reason=$(field finish_reason)
stream_tokens=$(field usage.completion_tokens)
chunks=$(field chunks)
answered $prompt_zh 0
# The same request in one piece (another tenant: computed afresh, as the stream was).
post stream-b "{$ask_zh}"
expect_eq "$code" 200 "the stream's request in one piece"
expect_eq "$("$probe" json choices.0.message.content <"$work/out")" "$streamed" "stream: text against one piece"
expect_eq "$(field choices.0.finish_reason)" "$stream_reason" "stream: finish_reason against one piece"
expect_eq "$(field usage.completion_tokens)" "$stream_tokens" "stream: completion_tokens against one piece"
answered $prompt_zh 0
ok "stream: $chunks chunks of JSON, [DONE] last, the same text and usage as in one piece"

# ---- concurrent requests ----------------------------------------------------
clients=()
for i in 1 2 3 4; do
  curl -s -o "$work/par$i" -w '%{http_code}' -H "X-Tenant: par$i" \
    --data-binary "{\"messages\":[{\"role\":\"user\",\"content\":\"Question $i\"}],\"max_tokens\":16}" \
    "$base/v1/chat/completions" >"$work/par$i.code" &
  clients+=($!)
done
wait "${clients[@]}" # (a plain wait would wait for the server too)
prompt_par=$((1 + $(message_tokens user 10) + assistant_header))
for i in 1 2 3 4; do
  expect_eq "$(cat "$work/par$i.code")" 200 "concurrent request $i"
  expect_eq "$("$probe" get usage.prompt_tokens <"$work/par$i")" $prompt_par "concurrent request $i: prompt_tokens"
  answered $prompt_par 0
done
ok "4 concurrent requests of 4 tenants answered"

# ---- bad requests -----------------------------------------------------------
user='"messages":[{"role":"user","content":"Hi"}]'
# refused STATUS PARAM CODE BODY: POST BODY, expect STATUS and OpenAI's error shape.
refused() {
  post bad "$4"
  expect_eq "$code" "$1" "status of $4"
  expect_eq "$(field error.type)" invalid_request_error "error.type of $4"
  expect_eq "$(field error.param)" "$2" "error.param of $4"
  expect_eq "$(field error.code)" "$3" "error.code of $4"
  [ -n "$(field error.message)" ] || fail "no error.message for $4"
  [ "$1" = 400 ] && bad=$((bad + 1))
  return 0
}
refused 400 null invalid_json '{"messages": [{"role": "user", "content": "Hi"}'
refused 400 null invalid_json 'not json at all'
refused 400 body invalid_type '["messages"]'
refused 400 messages missing_required_parameter '{"model": "tiny"}'
refused 400 messages invalid_value '{"messages": []}'
refused 400 'messages[0].role' invalid_value '{"messages": [{"role": "wizard", "content": "Hi"}]}'
refused 400 'messages[0].content' invalid_type '{"messages": [{"role": "user", "content": 42}]}'
refused 400 'messages[0].content' invalid_type '{"messages": [{"role": "user", "content": [{"type": "text"}]}]}'
refused 400 max_tokens invalid_value "{$user, \"max_tokens\": 0}"
refused 400 max_tokens invalid_value "{$user, \"max_tokens\": 1000000000}"
refused 400 max_tokens invalid_type "{$user, \"max_tokens\": \"lots\"}"
refused 400 temperature invalid_value "{$user, \"temperature\": -1}"
refused 400 temperature invalid_type "{$user, \"temperature\": \"hot\"}"
refused 400 stream invalid_type "{$user, \"stream\": \"yes\"}"
refused 400 temprature unknown_parameter "{$user, \"temprature\": 0.5}"
refused 400 tools unsupported_parameter "{$user, \"tools\": [{\"type\": \"function\"}]}"
refused 400 'messages[0].cache_control.ttl' invalid_value \
  '{"messages": [{"role": "user", "content": "Hi", "cache_control": {"type": "ephemeral", "ttl": "2h"}}]}'
long=$(printf 'a%.0s' $(seq 4200))
refused 400 messages context_length_exceeded "{\"messages\":[{\"role\":\"user\",\"content\":\"$long\"}]}"
grep -q "maximum context length is 4096 tokens" "$work/out" || fail "the context error does not say the context length"
ok "$bad malformed requests refused with 400 and OpenAI's error shape"

code=$(curl -s -o "$work/out" -w '%{http_code}' "$base/v1/chat/completions")
expect_eq "$code" 405 "GET /v1/chat/completions"
expect_eq "$(field error.code)" method_not_allowed "GET /v1/chat/completions: error.code"
code=$(curl -s -o "$work/out" -w '%{http_code}' "$base/v2/nothing")
expect_eq "$code" 404 "GET /v2/nothing"
expect_eq "$(field error.type)" invalid_request_error "GET /v2/nothing: error.type"
head -c 70000 /dev/zero | tr '\0' x >"$work/big"
code=$(curl -s -o "$work/out" -w '%{http_code}' --data-binary @"$work/big" "$base/v1/chat/completions")
expect_eq "$code" 413 "a body over --max-body-bytes"
expect_eq "$(field error.code)" payload_too_large "a body over --max-body-bytes: error.code"
ok "wrong method 405, unknown path 404, oversize body 413"

post acme "{\"messages\":$turn1,\"max_tokens\":8}"
expect_eq "$code" 200 "a good request after the bad ones"
answered $prompt1 "$(field usage.prompt_tokens_details.cached_tokens)"
ok "the server still serves after bad requests"

# ---- a client that goes away mid-stream --------------------------------------
# A long answer (past <|eot_id|>); the client reads a few chunks and leaves.
story='Tell me a very long story.'
prompt_story=$((1 + $(message_tokens user ${#story}) + assistant_header))
long_story="{\"messages\":[{\"role\":\"user\",\"content\":\"$story\"}],\"max_tokens\":3000,\"ignore_eos\":true"
set +o pipefail
curl -sN -H "X-Tenant: gone" --data-binary "$long_story,\"stream\":true}" "$base/v1/chat/completions" |
  head -c 1200 >"$work/partial"
set -o pipefail
grep -q '^data: {' "$work/partial" || fail "the long stream sent no chunk before the client left"
answered $prompt_story 0
# The server notices at its next write; the generator then cancels the
# request, releases its pages, and reports it done (its time to first token).
for _ in $(seq 300); do
  curl -s "$base/metrics" >"$work/metrics"
  grep -qx 'clm_server_client_disconnects_total 1' "$work/metrics" &&
    grep -qx 'clm_active_sequences 0' "$work/metrics" &&
    grep -qx "clm_server_time_to_first_token_seconds_count $generated" "$work/metrics" && break
  sleep 0.1
done
grep -qx 'clm_server_client_disconnects_total 1' "$work/metrics" || fail "the disconnect was not noticed in 30 s"
grep -qx 'clm_active_sequences 0' "$work/metrics" || fail "the cancelled request still runs after 30 s"
grep -qx 'clm_sequences_aborted_total 1' "$work/metrics" || fail "the cancelled request was not aborted"
post acme "{\"messages\":$turn1,\"max_tokens\":8}"
expect_eq "$code" 200 "a good request after the disconnect"
answered $prompt1 "$(field usage.prompt_tokens_details.cached_tokens)"
ok "a client gone mid-stream: its request cancelled and released, the server still serves"

# ---- metrics ----------------------------------------------------------------
metrics_headers=$(curl -s -D - -o "$work/metrics" "$base/metrics")
grep -qi '^content-type: text/plain; version=0.0.4' <<<"$metrics_headers" ||
  fail "/metrics Content-Type: $metrics_headers"
metric() { awk -v name="$1" '$1 == name { print $2 }' "$work/metrics"; }
expect_eq "$(metric clm_prefix_cache_queries_total)" $queried "clm_prefix_cache_queries_total (prompt tokens admitted)"
expect_eq "$(metric clm_prefix_cache_hits_total)" $hits "clm_prefix_cache_hits_total (cached tokens reported)"
expect_eq "$(metric 'clm_cached_tokens_total{source="device"}')" $hits "clm_cached_tokens_total{source=device}"
expect_eq "$(metric clm_sequences_admitted_total)" $generated "clm_sequences_admitted_total"
expect_eq "$(metric clm_sequences_finished_total)" $((generated - 1)) "clm_sequences_finished_total"
expect_eq "$(metric clm_active_sequences)" 0 "clm_active_sequences"
expect_eq "$(metric 'clm_server_requests_total{path="/v1/chat/completions",code="200"}')" $chats_ok "chat 200s"
expect_eq "$(metric 'clm_server_requests_total{path="/v1/chat/completions",code="400"}')" $bad "chat 400s"
expect_eq "$(metric 'clm_server_requests_total{path="/v1/chat/completions",code="405"}')" 1 "chat 405s"
expect_eq "$(metric 'clm_server_requests_total{path="/v1/chat/completions",code="413"}')" 1 "chat 413s"
expect_eq "$(metric 'clm_server_requests_total{path="other",code="404"}')" 1 "404s"
expect_eq "$(metric 'clm_server_requests_total{path="/health",code="200"}')" 1 "health 200s"
expect_eq "$(metric 'clm_server_requests_total{path="/v1/models",code="200"}')" 1 "models 200s"
expect_eq "$(metric clm_server_streaming_requests_total)" 2 "clm_server_streaming_requests_total"
expect_eq "$(metric clm_server_client_disconnects_total)" 1 "clm_server_client_disconnects_total"
expect_eq "$(metric clm_server_time_to_first_token_seconds_count)" $generated "time to first token: count"
expect_eq "$(metric 'clm_server_time_to_first_token_seconds_bucket{le="+Inf"}')" $generated "time to first token: +Inf"
for family in clm_prefix_cache_queries_total clm_evictable_tokens clm_protected_tokens clm_evicted_tokens_total \
  clm_eviction_duration_seconds clm_server_time_to_first_token_seconds; do
  grep -q "^# TYPE $family " "$work/metrics" || fail "/metrics lacks $family"
done
ok "/metrics: $queried prompt tokens queried, $hits hit, $generated requests, agreeing with the answers"

# ---- what a fleet scheduler reads ---------------------------------------------
# Idle: nothing running or waiting, no page held. With a long answer in
# flight: one request running, and its pages held.
expect_eq "$(metric clm_server_num_requests_running)" 0 "clm_server_num_requests_running, idle"
expect_eq "$(metric clm_server_num_requests_waiting)" 0 "clm_server_num_requests_waiting, idle"
expect_eq "$(metric clm_kv_cache_usage_ratio)" 0 "clm_kv_cache_usage_ratio, idle"
long="{\"model\":\"tiny\",\"messages\":[{\"role\":\"user\",\"content\":\"Tell me a long story.\"}],\"max_tokens\":1500,\"ignore_eos\":true,\"temperature\":0}"
curl -s -o "$work/long" -H 'Content-Type: application/json' --data-binary "$long" "$base/v1/chat/completions" &
long_pid=$!
seen_running=
for _ in $(seq 200); do
  curl -s -o "$work/metrics" "$base/metrics" || fail "GET /metrics"
  if [ "$(metric clm_server_num_requests_running)" = 1 ]; then
    usage=$(metric clm_kv_cache_usage_ratio)
    awk -v u="$usage" 'BEGIN { exit !(u > 0 && u <= 1) }' || fail "clm_kv_cache_usage_ratio $usage with a request running"
    seen_running=1
    break
  fi
  sleep 0.02
done
wait "$long_pid" || fail "the long request"
[ -n "$seen_running" ] || fail "no scrape saw the long request running"
generated=$((generated + 1))
ok "running and waiting requests and the pool's held share, idle and with a request in flight"

# ---- KV events ----------------------------------------------------------------
# Every batch so far through the replay socket, read by an independent
# subscriber (python3-zmq, python3-msgpack): as many events as the server
# says it published, and a consistent picture holding the cached pages.
sleep 0.2 # the last batch's interval
curl -s -o "$work/metrics" "$base/metrics" || fail "GET /metrics"
published=$(metric clm_kv_events_published_total)
[ -n "$published" ] && [ "$published" -gt 0 ] || fail "clm_kv_events_published_total: '$published'"
/usr/bin/python3 - "$kv_replay" "$published" "$page" >"$work/out" 2>&1 <<'PY' || fail "the KV-event subscriber"
import sys
import msgpack
import zmq
endpoint, published, page = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
sock = zmq.Context().socket(zmq.DEALER)
sock.setsockopt(zmq.RCVTIMEO, 5000)
sock.setsockopt(zmq.LINGER, 0)
sock.connect(endpoint)
sock.send_multipart([b"", (0).to_bytes(8, "big")])
gpu, events, expected_seq = set(), 0, 0
while True:
    empty, seq, payload = sock.recv_multipart()
    if seq == b"\xff" * 8:
        break
    assert int.from_bytes(seq, "big") == expected_seq, "a gap in the sequence"
    expected_seq += 1
    ts, batch, rank = msgpack.unpackb(payload, raw=False)
    for e in batch:
        events += 1
        if e[0] == "AllBlocksCleared":
            gpu.clear()
        elif e[0] == "BlockStored" and e[6] == "GPU":
            assert e[2] is None or e[2] in gpu, "a block before its parent"
            assert e[4] == page and len(e[3]) == page * len(e[1]), "token ids"
            gpu.update(e[1])
        elif e[0] == "BlockRemoved" and e[2] == "GPU":
            assert all(h in gpu for h in e[1]), "a block removed that was not stored"
            gpu.difference_update(e[1])
assert events == published, f"{events} events replayed, {published} published"
assert gpu, "no cached page"
print(len(gpu))
PY
ok "KV events: $published events replayed in order, $(cat "$work/out") cached pages on the device"

# ---- SIGTERM ----------------------------------------------------------------
stop
expect_eq "$(field active_sequences)" 0 "the final line: active_sequences"
expect_eq "$(field admitted)" $generated "the final line: admitted"
[ "$(field kv_events_published)" -ge "$published" ] || fail "the final line: kv_events_published"
ok "SIGTERM: exit 0, invariants hold, no sequence left"
# ---- two instances share a storage tier ---------------------------------------
# Instance A (flags from a --server-config file, the command line adding
# one) answers a conversation twice: its pages reach the host tier on their
# first hit and storage from there. Instance B, new, on the same directory
# and model id, finds the prompt in storage; instance C, of another model id,
# finds nothing (stored pages name their model).
cat >"$work/server.json" <<JSON
{"host-tokens": 8192, "storage": "file://$work/storage", "write-policy": "write_through",
 "prefetch-policy": "wait_complete", "eviction-policy": "lru", "default-max-tokens": 8, "trust-x-tenant": true}
JSON
shared="{\"model\":\"tiny\",\"messages\":$turn1,\"max_tokens\":8,\"temperature\":0}"
launch --server-config "$work/server.json" --model-id "tiny-shared@$$"
post acme "$shared"
expect_eq "$code" 200 "instance A: first answer"
post acme "$shared"
expect_eq "$code" 200 "instance A: second answer"
stop
stored=$(field stored_pages)
[ "$stored" -gt 0 ] || fail "instance A stored no page ($stored)"
launch --server-config "$work/server.json" --model-id "tiny-shared@$$"
post acme "$shared"
expect_eq "$code" 200 "instance B"
from_storage=$(field usage.prompt_tokens_details.cached_tokens_by_source.storage)
[ "$from_storage" -gt 0 ] || fail "instance B: nothing from storage ($from_storage)"
expect_eq "$(field usage.prompt_tokens_details.cached_tokens)" "$from_storage" "instance B: cached tokens"
stop
launch --server-config "$work/server.json" --model-id "another-model@$$"
post acme "$shared"
expect_eq "$code" 200 "instance C"
expect_eq "$(field usage.prompt_tokens_details.cached_tokens)" 0 "instance C (another model id): cached tokens"
stop
ok "a storage tier shared by instances: A stored $stored pages, B found $from_storage prompt tokens there, \
another model none"

echo "all $checks checks passed"
