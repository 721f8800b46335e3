// examples/server/server_flags.cpp: clm_server's flags (server_flags.hpp).
#include "server_flags.hpp"

#include <cmath>
#include <fstream>
#include <optional>
#include <string_view>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

namespace clm_server {
namespace {

using Pairs = std::vector<std::pair<std::string, std::string>>;

// --server-config FILE as (--flag, value) pairs: a JSON object of strings,
// numbers and booleans, keyed by the flags' names without their dashes.
std::string read_config_file(const std::string& path, Pairs& out) {
  std::ifstream in(path);
  if (!in) return fmt::format("--server-config: cannot read {}", path);
  nlohmann::json doc;
  try {
    in >> doc;
  } catch (const nlohmann::json::exception& e) {
    return fmt::format("--server-config {}: not JSON ({})", path, e.what());
  }
  if (!doc.is_object()) return fmt::format("--server-config {}: not a JSON object", path);
  for (const auto& [key, value] : doc.items()) {
    if (key == "server-config" || key == "help")
      return fmt::format("--server-config {}: key \"{}\" not allowed", path, key);
    std::string text;
    if (value.is_string()) {
      text = value.get<std::string>();
    } else if (value.is_number_integer()) {
      text = std::to_string(value.get<std::int64_t>());
    } else if (value.is_number_float()) {
      text = fmt::format("{}", value.get<double>());
    } else if (value.is_boolean()) {
      text = value.get<bool>() ? "true" : "false";
    } else {
      return fmt::format("--server-config {}: \"{}\" must be a string, a number or a boolean", path, key);
    }
    out.emplace_back("--" + key, std::move(text));
  }
  return {};
}

// `parse` of a policy's name into `out`, or an error naming the flag and the
// names it takes.
template <class Policy>
std::string parse_policy(std::string_view flag, const std::string& value,
                         std::optional<Policy> (*parse)(std::string_view), std::string_view names, Policy& out) {
  const std::optional<Policy> p = parse(value);
  if (!p) return fmt::format("{}: unknown value '{}' ({})", flag, value, names);
  out = *p;
  return {};
}

// Flags that take no value on the command line (true when given); in a
// --server-config file, true or false.
bool is_switch(std::string_view flag) { return flag == "--trust-x-tenant"; }

// A duration in seconds: finite and > 0.
std::string parse_seconds(std::string_view flag, const std::string& value, double& out) {
  std::size_t used = 0;
  double seconds = 0;
  try {
    seconds = std::stod(value, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used != value.size() || value.empty() || !std::isfinite(seconds) || seconds <= 0 || seconds > 1e6) {
    return fmt::format("{}: not a number of seconds in (0, 1e6]: {}", flag, value);
  }
  out = seconds;
  return {};
}

// One flag and its value into `f`; an error naming it, or "".
std::string apply(ServerFlags& f, std::string_view flag, const std::string& value) {
  try {
    std::size_t used = value.size();
    if (is_switch(flag) && value != "true" && value != "false") {
      return fmt::format("{}: true or false, got {}", flag, value);
    }
    if (flag == "--trust-x-tenant") {
      f.trust_x_tenant = value == "true";
    } else if (flag == "--host") {
      f.host = value;
    } else if (flag == "--tls-cert") {
      f.tls_cert = value;
    } else if (flag == "--tls-key") {
      f.tls_key = value;
    } else if (flag == "--request-timeout") {
      return parse_seconds(flag, value, f.request_timeout_s);
    } else if (flag == "--max-request-timeout") {
      return parse_seconds(flag, value, f.max_request_timeout_s);
    } else if (flag == "--header-timeout") {
      return parse_seconds(flag, value, f.header_timeout_s);
    } else if (flag == "--body-timeout") {
      return parse_seconds(flag, value, f.body_timeout_s);
    } else if (flag == "--hint-ttl") {
      return parse_seconds(flag, value, f.hint_ttl_s);
    } else if (flag == "--drain-grace") {
      return parse_seconds(flag, value, f.drain_grace_s);
    } else if (flag == "--max-waiting") {
      f.max_waiting = std::stoll(value, &used);
    } else if (flag == "--max-pending-connections") {
      f.max_pending_connections = std::stoi(value, &used);
    } else if (flag == "--api-keys") {
      f.api_keys = value;
    } else if (flag == "--port") {
      f.port = std::stoi(value, &used);
    } else if (flag == "--threads") {
      f.threads = std::stoi(value, &used);
    } else if (flag == "--http-threads") {
      f.http_threads = std::stoi(value, &used);
    } else if (flag == "--page-size") {
      f.page_size = std::stoi(value, &used);
    } else if (flag == "--pool-tokens") {
      f.pool_tokens = std::stoll(value, &used);
    } else if (flag == "--weights") {
      f.weights = value;
    } else if (flag == "--config") {
      f.config = value;
    } else if (flag == "--tokenizer") {
      f.tokenizer = value;
    } else if (flag == "--max-batch") {
      f.max_batch = std::stoi(value, &used);
    } else if (flag == "--default-max-tokens") {
      f.default_max_tokens = std::stoi(value, &used);
    } else if (flag == "--max-body-bytes") {
      f.max_body_bytes = std::stoll(value, &used);
    } else if (flag == "--model-id") {
      f.model_id = value;
    } else if (flag == "--served-model-name") {
      f.served_model_name = value;
    } else if (flag == "--eviction-policy") {
      const std::optional<clm::EvictionPolicy> p = clm::parse_eviction_policy(value);
      // belady needs every future request: only the replay tool runs it.
      if (!p || *p == clm::EvictionPolicy::belady) {
        return fmt::format("{}: unknown value '{}' (lru, lfu, slru, priority, ghost_slru)", flag, value);
      }
      f.eviction_policy = *p;
    } else if (flag == "--prefix-cache") {
      if (value != "on" && value != "off") return fmt::format("{}: on or off, got {}", flag, value);
      f.prefix_cache = value == "on";
    } else if (flag == "--divergence") {
      if (value != "on" && value != "off") return fmt::format("{}: on or off, got {}", flag, value);
      f.divergence = value == "on";
    } else if (flag == "--pin-budget-fraction") {
      f.pin_budget_fraction = std::stod(value, &used);
      if (used == value.size() && !(f.pin_budget_fraction >= 0.0 && f.pin_budget_fraction <= 1.0)) {
        return fmt::format("{}: a share of the pool in [0, 1], got {}", flag, value);
      }
    } else if (flag == "--host-tokens") {
      f.host_tokens = std::stoll(value, &used);
    } else if (flag == "--write-policy") {
      return parse_policy(flag, value, clm::parse_write_policy, "write_through, write_through_selective, write_back",
                          f.write_policy);
    } else if (flag == "--prefetch-policy") {
      return parse_policy(flag, value, clm::parse_prefetch_policy, "best_effort, wait_complete, timeout",
                          f.prefetch_policy);
    } else if (flag == "--storage") {
      f.storage_url = value;
    } else if (flag == "--page-secret-file") {
      f.page_secret_file = value;
    } else if (flag == "--page-secret-env") {
      f.page_secret_env = value;
    } else if (flag == "--snapshot-store") {
      f.snapshot_store = value;
    } else if (flag == "--snapshot-min-usage") {
      f.snapshot_min_usage = std::stoll(value, &used);
    } else if (flag == "--lexicons") {
      f.lexicons = value;
    } else if (flag == "--clm-dir") {
      f.clm_dir = value;
    } else if (flag == "--clm-events") {
      f.clm_events = value;
    } else if (flag == "--src-threshold") {
      f.src_threshold = std::stof(value, &used);
    } else if (flag == "--kv-events") {
      f.kv_events.enabled = true;
      f.kv_events.endpoint = value;
    } else if (flag == "--kv-events-replay") {
      f.kv_events.replay_endpoint = value;
    } else if (flag == "--kv-events-topic") {
      f.kv_events.topic = value;
    } else if (flag == "--kv-events-batch-ms") {
      f.kv_events.batch_interval_ms = std::stoi(value, &used);
    } else if (flag == "--kv-events-buffer") {
      f.kv_events.buffer_batches = std::stoi(value, &used);
    } else if (flag == "--kv-events-dp-rank") {
      f.kv_events.data_parallel_rank = std::stoi(value, &used);
    } else {
      return fmt::format("unknown flag {} (--help lists them)", flag);
    }
    if (used != value.size()) return fmt::format("{}: not a number: {}", flag, value);
  } catch (const std::exception&) {
    return fmt::format("{}: not a number: {}", flag, value);
  }
  return {};
}

std::string check(const ServerFlags& f) {
  if (f.port < 0 || f.port > 65535) return fmt::format("--port must be in [0, 65535], got {}", f.port);
  if (f.threads < 0) return fmt::format("--threads must be >= 0, got {}", f.threads);
  if (f.http_threads < 1) return fmt::format("--http-threads must be >= 1, got {}", f.http_threads);
  if (f.page_size < 1) return fmt::format("--page-size must be >= 1, got {}", f.page_size);
  if (f.pool_tokens < f.page_size || f.pool_tokens / f.page_size > (std::int64_t{1} << 30)) {
    return fmt::format("--pool-tokens must hold at least one page and at most 2^30 pages, got {}", f.pool_tokens);
  }
  if (f.max_batch < 1) return fmt::format("--max-batch must be >= 1, got {}", f.max_batch);
  if (f.default_max_tokens < 1) return fmt::format("--default-max-tokens must be >= 1, got {}", f.default_max_tokens);
  if (f.max_body_bytes < 1) return fmt::format("--max-body-bytes must be >= 1, got {}", f.max_body_bytes);
  if (f.host.empty()) return "--host must name an address (127.0.0.1, 0.0.0.0, ::1, ...)";
  if (f.tls_cert.empty() != f.tls_key.empty()) return "--tls-cert and --tls-key go together";
  if (f.request_timeout_s > f.max_request_timeout_s) {
    return fmt::format("--request-timeout ({} s) is over --max-request-timeout ({} s)", f.request_timeout_s,
                       f.max_request_timeout_s);
  }
  if (f.hint_ttl_s > 86400) return fmt::format("--hint-ttl must be at most 86400 s (a day), got {}", f.hint_ttl_s);
  if (f.max_waiting < 1 || f.max_waiting > 1000000) {
    return fmt::format("--max-waiting must be in [1, 1000000], got {}", f.max_waiting);
  }
  if (f.max_pending_connections < 1) {
    return fmt::format("--max-pending-connections must be >= 1, got {}", f.max_pending_connections);
  }
  if (f.served_model_name.empty() || f.served_model_name.size() > 256) {
    return "--served-model-name must be 1 to 256 bytes";
  }
  if (f.host_tokens < 0 || f.host_tokens / f.page_size > (std::int64_t{1} << 30)) {
    return fmt::format("--host-tokens must be in [0, 2^30 pages], got {}", f.host_tokens);
  }
  if (!f.storage_url.empty() && f.host_tokens < f.page_size) {
    return "--storage needs a host tier (--host-tokens): pages reach storage through it";
  }
  if (!f.storage_url.empty() && f.model_id.empty()) {
    return "--storage needs --model-id (the host's fingerprint of its weights, e.g. their SHA-256): stored pages "
           "name the model, so that no other model is served them";
  }
  if (!f.clm_dir.empty() && f.snapshot_store.empty()) {
    return "--clm-dir needs --snapshot-store (CLM finds and records its snapshots there)";
  }
  if (f.src_threshold && f.clm_dir.empty()) return "--src-threshold needs --clm-dir";
  if (!f.clm_events.empty() && f.snapshot_store.empty()) {
    return "--clm-events needs --snapshot-store (the events are the store's and its lookups')";
  }
  if (f.snapshot_min_usage < 1) return fmt::format("--snapshot-min-usage must be >= 1, got {}", f.snapshot_min_usage);
  if (f.snapshot_store.empty() && (!f.lexicons.empty() || f.snapshot_min_usage != ServerFlags{}.snapshot_min_usage)) {
    return "--lexicons and --snapshot-min-usage need --snapshot-store";
  }
  const bool kv_flag = !f.kv_events.replay_endpoint.empty() || !f.kv_events.topic.empty() ||
                       f.kv_events.batch_interval_ms != clm::KvEventsConfig{}.batch_interval_ms ||
                       f.kv_events.buffer_batches != clm::KvEventsConfig{}.buffer_batches ||
                       f.kv_events.data_parallel_rank != 0;
  if (kv_flag && !f.kv_events.enabled) return "the --kv-events-* flags need --kv-events ENDPOINT";
  if (f.kv_events.enabled && f.model_id.empty()) {
    return "--kv-events needs --model-id (the host's fingerprint of its weights, e.g. their SHA-256): "
           "the block hashes name the model";
  }
  // The rest (a URL or endpoint that does not work, a secret that cannot be read) the engine names.
  return {};
}

}  // namespace

std::string parse_server_flags(int argc, char** argv, ServerFlags& flags) {
  Pairs file, line;
  for (int i = 1; i < argc; ++i) {
    const std::string_view flag = argv[i];
    if (flag == "--help" || flag == "-h") {
      flags.help = true;
      return {};
    }
    if (is_switch(flag)) {
      line.emplace_back(std::string(flag), "true");
      continue;
    }
    if (i + 1 >= argc) return fmt::format("{} needs a value (or is unknown)", flag);
    const std::string value = argv[++i];
    if (flag == "--server-config") {
      if (!file.empty()) return "--server-config given twice";
      if (std::string error = read_config_file(value, file); !error.empty()) return error;
      if (file.empty()) file.emplace_back("", "");  // an empty object: given, setting nothing
      continue;
    }
    line.emplace_back(std::string(flag), value);
  }
  for (const Pairs* pairs : {&file, &line}) {
    for (const auto& [flag, value] : *pairs) {
      if (flag.empty()) continue;
      if (std::string error = apply(flags, flag, value); !error.empty()) {
        return pairs == &file ? "--server-config: " + error : error;
      }
    }
  }
  return check(flags);
}

std::string server_usage() {
  return R"(usage: clm_server [flags]   (or --server-config FILE: a JSON object of the same flags without
                            their dashes, e.g. {"port": 8000, "host-tokens": 65536}; the command line wins)

server:
  --host ADDR              the address to listen on (default 127.0.0.1; 0.0.0.0 for every interface)
  --port N                 listen on ADDR:N; 0 picks a free port (default 8000)
  --tls-cert FILE          HTTPS with this certificate (PEM) ...
  --tls-key FILE           ... and its private key (PEM)
  --http-threads N         connections served at once (default 16)
  --max-pending-connections N  accepted connections waiting for a thread; past it, accepting pauses (default 64)
  --max-batch N            sequences decoded together (default 32)
  --max-waiting N          requests queued for the model; past it, 429 with Retry-After (default 256)
  --default-max-tokens N   a request's max_tokens when it gives none (default 256)
  --max-body-bytes N       largest request body (default 1048576)
  --body-timeout S         the whole body must arrive within S seconds, else 408 (default 30)
  --header-timeout S       a connection's request head (or TLS handshake) within S seconds, else closed
                           (default 10; also how long an idle keep-alive connection stays)
  --request-timeout S      a request's deadline, else 504 (default 600) ...
  --max-request-timeout S  ... or the X-Request-Timeout it sends, up to S (default 3600)
  --drain-grace S          on SIGTERM: finish running requests for up to S seconds, then cancel (default 30)
  --served-model-name NAME the model GET /v1/models lists (default tiny-llama)
tenants:
  --api-keys FILE          bearer tokens, each naming a tenant (its cache salt), a rate limit, admin
                           (examples/server/api_keys.hpp); a missing or unknown key is 401
  --trust-x-tenant         honour the X-Tenant header (a gateway in front sets it); otherwise refused
model:
  --config FILE            the model's config.json (default: tiny_llama's shape)
  --weights FILE           its safetensors weights (default: a deterministic random init)
  --tokenizer FILE         a Hugging Face tokenizer.json (Qwen3's): its ChatML template and vocabulary
                           (the model's vocabulary is then the tokenizer's); default: byte tokens
  --threads N              compute threads (default: the hardware's)
  --model-id ID            the host's fingerprint of the weights (e.g. their SHA-256); needed by
                           --storage and --kv-events
cache:
  --page-size N            tokens per page (default 16)
  --pool-tokens N          the KV pool, in tokens (default 32768)
  --eviction-policy P      lru, lfu, slru, priority, ghost_slru (default ghost_slru)
  --prefix-cache on|off    off: every prompt computed afresh (the baseline bench_server measures against)
  --divergence on|off      where prompts split off the cache, per tenant, in GET /debug/cache and the
                           clm_prefix_match_depth_tokens metrics (docs/observability.md; default on)
  --pin-budget-fraction F  the pool's share that pinned prompts may hold (prompt_cache_retention "24h",
                           cache_control; default 0.25); past it such requests get 400
  --hint-ttl S             a conversation whose client sends X-Session-Continues: true keeps a priority
                           this long after each answer (default 120)
tiers (docs/tiers.md):
  --host-tokens N          a host-memory tier of N tokens that evicted pages move to (default 0: none)
  --write-policy P         write_through, write_through_selective, write_back (default write_through)
  --prefetch-policy P      best_effort, wait_complete, timeout (default timeout)
  --storage URL            a storage tier below the host tier, shared by instances:
                           file:///DIR?capacity_mb=N or redis://[user:]password@host:port/db?prefix=clm:
  --page-secret-file FILE  the deployment secret that signs stored pages (AES-256-GMAC) ...
  --page-secret-env NAME   ... or the environment variable holding it
CLM suffix reuse (docs/clm.md):
  --snapshot-store FILE    the semantic snapshot store (SQLite + hnswlib), created when missing
  --snapshot-min-usage N   sightings of a suffix before its snapshot is stored (default 50)
  --lexicons DIR           the suffix keyer's domain words (e.g. examples/demo/lexicon)
  --clm-dir DIR            CLM in the loop for every request, with the parts train_clm.sh trained for
                           this model (head, projection, adapter .safetensors)
  --src-threshold X        the SRC gate's score threshold (default: the trained head's own)
  --clm-events FILE        append what an operator watches of CLM as JSON lines (docs/observability.md):
                           keys seen often with a low SRC score, blacklists and their reasons,
                           versions, drift; the same in GET /debug/cache
KV events for a cache-aware router (docs/fleet.md):
  --kv-events ENDPOINT     publish vLLM's KV events on a ZeroMQ PUB socket (tcp://127.0.0.1:* picks a port)
  --kv-events-replay EP    a ROUTER socket that sends missed batches again
  --kv-events-topic T      each message's first frame, e.g. llm-d's kv@<pod>@<model>
  --kv-events-batch-ms N   a batch goes out this often (default 10)
  --kv-events-buffer N     batches the replay socket keeps (default 10000)
  --kv-events-dp-rank N    the data-parallel rank in each batch (default 0)
)";
}

clm::EngineConfig engine_config_from(const ServerFlags& f, const clm::PagedKvPoolConfig& pool) {
  clm::EngineConfig c;
  c.pool = pool;
  c.eviction_policy = f.eviction_policy;
  c.pin_budget_fraction = f.pin_budget_fraction;
  c.model_id = f.model_id;
  c.tiers.host_pages = static_cast<std::int32_t>(f.host_tokens / f.page_size);
  c.tiers.write_policy = f.write_policy;
  c.tiers.prefetch_policy = f.prefetch_policy;
  c.tiers.storage_url = f.storage_url;
  c.tiers.page_secret_file = f.page_secret_file;
  c.tiers.page_secret_env = f.page_secret_env;
  c.kv_events = f.kv_events;
  c.divergence.enabled = f.divergence;
  c.snapshot_store.path = f.snapshot_store;
  c.snapshot_store.min_usage_threshold = f.snapshot_min_usage;
  c.snapshot_store.keyer.lexicon_dir = f.lexicons;
  if (f.src_threshold) c.src_gate.threshold_override = *f.src_threshold;
  return c;
}

}  // namespace clm_server
