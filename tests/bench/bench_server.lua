-- tests/bench/bench_server.lua: wrk's script for bench_server. Each wrk
-- thread holds one connection and plays conversations of the demo's
-- scenario one after another, as a chat client does: turn k+1 sends the
-- system prompt, every earlier question and the answers the server gave
-- (copied back as the JSON strings it sent), then the next question.
-- Thread i plays conversations i, i + T, i + 2T, ... (T threads), so no two
-- threads play one conversation at once. Every response is counted by status; a 200's server-side
-- time to first token (timings.ttft_seconds) is kept. done() prints one
-- JSON line: requests, seconds, statuses, and every TTFT.
--
--   wrk -t 16 -c 16 -d 10s -s bench_server.lua http://127.0.0.1:PORT -- CONVERSATIONS_FILE MAX_TOKENS 16
--
-- CONVERSATIONS_FILE: the system prompt as a JSON string on line 1, then one
-- conversation per line, its questions as JSON strings separated by tabs.

local threads = {}

function setup(thread)
  thread:set("index", #threads)
  table.insert(threads, thread)
end

local system_prompt, conversations = nil, {}
local conversation, turn, history = 1, 1, ""
-- Globals: done() reads them from each thread with thread:get.
statuses, ttfts = {}, {}
local max_tokens, stride = 16, 1

local function split_tabs(line)
  local out = {}
  for field in string.gmatch(line, "[^\t]+") do table.insert(out, field) end
  return out
end

function init(args)
  local path = args[1]
  max_tokens = tonumber(args[2] or "16")
  stride = tonumber(args[3] or "1")
  local file = assert(io.open(path, "r"))
  system_prompt = file:read("*l")
  for line in file:lines() do table.insert(conversations, split_tabs(line)) end
  file:close()
  conversation = (index % #conversations) + 1
  wrk.method = "POST"
  wrk.headers["Content-Type"] = "application/json"
end

local function message(role, json_text)
  return '{"role":"' .. role .. '","content":' .. json_text .. '}'
end

function request()
  local questions = conversations[conversation]
  local body = '{"messages":[' .. message("system", system_prompt) .. history .. ',' ..
      message("user", questions[turn]) .. '],"max_tokens":' .. max_tokens .. ',"temperature":0}'
  return wrk.format(nil, "/v1/chat/completions", nil, body)
end

-- The answer's content as the JSON string literal the server sent (escapes kept).
local function answer_literal(body)
  local key = '"role":"assistant","content":"'
  local at = string.find(body, key, 1, true)
  if not at then return nil end
  local i = at + #key
  while i <= #body do
    local c = string.sub(body, i, i)
    if c == "\\" then
      i = i + 2
    elseif c == '"' then
      return string.sub(body, at + #key - 1, i)
    else
      i = i + 1
    end
  end
  return nil
end

function response(status, headers, body)
  statuses[status] = (statuses[status] or 0) + 1
  local answer = status == 200 and answer_literal(body) or nil
  if answer then
    local ttft = string.match(body, '"ttft_seconds":([%d%.eE%-]+)')
    if ttft then table.insert(ttfts, tonumber(ttft)) end
    local questions = conversations[conversation]
    history = history .. ',' .. message("user", questions[turn]) .. ',' .. message("assistant", answer)
    turn = turn + 1
    if turn <= #questions then return end
  end
  -- The conversation is over (or failed): this thread's next one, from its first turn.
  conversation = ((conversation - 1 + stride) % #conversations) + 1
  turn, history = 1, ""
end

function done(summary, latency, requests)
  local parts, all = {}, {}
  local counts = {}
  for _, thread in ipairs(threads) do
    for status, n in pairs(thread:get("statuses")) do counts[status] = (counts[status] or 0) + n end
    for _, t in ipairs(thread:get("ttfts")) do table.insert(all, string.format("%.6f", t)) end
  end
  for status, n in pairs(counts) do table.insert(parts, string.format('"%d":%d', status, n)) end
  io.write(string.format(
    '{"requests":%d,"seconds":%.6f,"socket_errors":%d,"latency_p50_s":%.6f,"latency_p99_s":%.6f,' ..
    '"statuses":{%s},"ttft":[%s]}\n',
    summary.requests, summary.duration / 1e6,
    summary.errors.connect + summary.errors.read + summary.errors.write + summary.errors.timeout,
    latency:percentile(50.0) / 1e6, latency:percentile(99.0) / 1e6,
    table.concat(parts, ","), table.concat(all, ",")))
end
