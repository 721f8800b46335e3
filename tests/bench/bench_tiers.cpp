// tests/bench/bench_tiers.cpp: benchmarks of the tiered KV cache
// (EngineConfig::tiers), each figure printed as one JSON line beside a
// baseline measured in the same run (medians of interleaved runs):
//
//   l2_to_l1_load_*            GB/s of the Engine's load-back: the admit of a
//                              prompt whose pages are only in the host tier
//                              (L2); bytes = loaded pages * page bytes
//                              (EngineMetrics::tiers.loaded_pages). Baseline:
//                              one memcpy of as many bytes. Goal ratio >= 0.70.
//   l2_to_l1_page_copier_*     PageCopier::to_device alone, pages scattered
//                              over both pools (one memcpy per page), against
//                              the same memcpy.
//   l1_to_l2_write_back_*      GB/s of the Engine's write-back: the admit whose
//                              allocation evicts a prompt's device pages under
//                              WritePolicy::write_back, copying them to the
//                              host (bytes from tiers.backed_up_pages).
//   l1_to_l2_page_copier_*     PageCopier::to_host alone, scattered.
//   gsp_tiered_hit_rate_*      gsp through the replay's tiered path (an Engine
//                              with a host tier), L1 32768 tokens and L2 4x: the
//                              hit rate over all tiers against L1 alone at the
//                              same size (the plain replay), per write policy.
//   redis_fetch_vs_recompute_* seconds per layer of an admit that fetches a
//                              2048-token prefix from a real redis-server and
//                              loads it (admit time / num_layers), against the
//                              library's CPU prefill attention of those 2048
//                              tokens for one layer (32 q heads over the 8 KV
//                              heads). Ratio < 1: fetching wins. Skipped, with
//                              a message, without redis-server.
//   page_mac_gmac_*            GB/s of the page signature (PageSigner::sign over
//                              one page) against memcpy of the page;
//   hmac_sha256_*              the same for HMAC-SHA256 (format 2's MAC), for
//                              comparison.
//   signed_fetch_{dir,redis}_* GB/s of the same fetch + load from a directory
//                              and from redis-server with signed pages (a page
//                              secret) against unsigned ones, interleaved.
//                              Goal ratio >= 0.70.
//   redis_auth_signed_fetch_*  seconds per layer of that fetch + load from a
//                              redis-server with AUTH (requirepass) and signed
//                              pages, against one without either.
//   conversation_{store,fetch}_turns191-200_vs_6-15_*
//                              one 32k-token conversation turn by turn through a
//                              redis-server: a turn's cost late (turns 191-200)
//                              against early (turns 6-15). Goal ratio <= 1.5.
//
// Page shape: page_size 16, 32 layers, 8 KV heads, head_dim 128, bf16: 2 MiB
// a page (a Llama-3-8B layout), named in each case as p16_l32_h8_d128_bf16.
// All tiers are host memory here: "device" (L1) is the Engine's host pool,
// so the copies are memcpy, and the goal is to copy at memcpy speed.
//
// CLM_BENCH_SMOKE=1 runs a tiny version (2 layers, a few pages, one run,
// a short gsp) in seconds, so that ctest builds and runs the program.
#include <openssl/evp.h>
#include <openssl/params.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <memory>
#include <numeric>
#include <random>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "bench_common.hpp"
#include "clm/cache/paged_kv_pool.hpp"
#include "clm/engine.hpp"
#include "clm/kernels/attention.hpp"
#include "clm/tiers/page_copier.hpp"
#include "clm/tiers/page_file.hpp"
#include "clm/tiers/page_seal.hpp"
#include "replay_driver.hpp"
#include "test_random.hpp"
#include "tiers/redis_server.hpp"
#include "workload.hpp"

namespace {

using clm::Admission;
using clm::Engine;
using clm::EngineConfig;
using clm_bench::check;
using clm_bench::Clock;
using clm_bench::die;
using clm_bench::print_figure;
using clm_bench::program_name;
using clm_bench::seconds_since;
using clm_bench::smoke_run;
using clm_test::random_tokens;

constexpr std::string_view kBench = "tiers";
constexpr std::int32_t kPageSize = 16;
constexpr std::int32_t kVocabulary = 128256;
constexpr std::int32_t kQueryHeads = 32;  // over 8 KV heads: Llama-3-8B's grouping

// ---- scale -------------------------------------------------------------------

struct Scale {
  bool smoke = false;
  std::int32_t num_layers = 32;
  std::int32_t copy_pages = 64;  // pages a copy figure moves: 128 MiB at 2 MiB a page
  int copy_runs = 9;
  std::int64_t gsp_l1_tokens = 32768;  // 13 of gsp's 2432-token requests: L1 alone thrashes
  int gsp_repeats = 3;                 // replays per policy (hit rates must agree; time is their median)
  std::int32_t redis_tokens = 2048;
  int redis_runs = 5;
};

Scale make_scale() {
  Scale s;
  if (smoke_run()) {
    s.smoke = true;
    s.num_layers = 2;
    s.copy_pages = 8;
    s.copy_runs = 1;
    s.gsp_l1_tokens = 1024;
    s.gsp_repeats = 1;
    s.redis_tokens = 256;
    s.redis_runs = 1;
  }
  return s;
}

// The realistic page of the figures (2 layers in a smoke run), in host memory.
clm::PagedKvPoolConfig page_shape(const Scale& scale, std::int32_t num_pages) {
  clm::PagedKvPoolConfig c;
  c.num_pages = num_pages;
  c.page_size = kPageSize;
  c.num_layers = scale.num_layers;
  c.kv_heads = 8;
  c.head_dim = 128;
  c.dtype = clm::KvDType::bf16;
  c.memory = clm::MemoryKind::host;
  return c;
}

std::string shape_name(const clm::PagedKvPoolConfig& c) {
  return fmt::format("p{}_l{}_h{}_d{}_{}", c.page_size, c.num_layers, c.kv_heads, c.head_dim,
                     clm::kv_dtype_name(c.dtype));
}

std::size_t page_bytes(const clm::PagedKvPoolConfig& c) { return clm::PageLayout::of(c).page_bytes(); }

std::string load_average() {
  std::ifstream in("/proc/loadavg");
  std::string a, b, c;
  if (!(in >> a >> b >> c)) return "unknown";
  return fmt::format("{} {} {}", a, b, c);
}

template <typename... Args>
void progress(fmt::format_string<Args...> format, Args&&... args) {
  fmt::print(stderr, "{}: {}\n", program_name(), fmt::format(format, std::forward<Args>(args)...));
}

// ---- shared pieces -----------------------------------------------------------

// Writes every byte of a pool once: the timed copies must not pay for first-touch page faults.
void prefault(const clm::PagedKvPool& pool, int byte) { std::memset(pool.data(), byte, pool.storage_bytes()); }

std::unique_ptr<Engine> make_engine(const EngineConfig& config) {
  std::unique_ptr<Engine> engine;
  check(Engine::create(config, engine), "Engine::create");
  prefault(engine->pool(), 0x3c);
  return engine;
}

// A request whose K/V the bench does not compute (the pool's bytes stand in for it).
void admit_and_finish(Engine& engine, std::span<const std::int32_t> prompt) {
  Admission a;
  check(engine.admit(prompt, {}, a), "admit");
  check(engine.finish(a.seq), "finish");
}

// The baseline of the copy figures: one memcpy of `bytes` between two buffers
// written beforehand (no page faults inside the timing).
class MemcpyBaseline {
 public:
  explicit MemcpyBaseline(std::size_t bytes) : from_(bytes, std::byte{0x5a}), to_(bytes, std::byte{0xa5}) {}
  std::size_t bytes() const { return from_.size(); }
  double run() {
    const Clock::time_point start = Clock::now();
    std::memcpy(to_.data(), from_.data(), from_.size());
    const double s = seconds_since(start);
    sink_ = sink_ + static_cast<unsigned>(to_[to_.size() / 2]);  // the copy is used
    return s;
  }

 private:
  std::vector<std::byte> from_;
  std::vector<std::byte> to_;
  volatile unsigned sink_ = 0;
};

double gb_per_s(std::size_t bytes, double seconds) { return static_cast<double>(bytes) / seconds / 1e9; }

// ---- 1. host tier -> device tier: the Engine's load-back ------------------------

void bench_load_back(const Scale& scale, std::mt19937_64& rng) {
  const std::int32_t pages = scale.copy_pages;
  EngineConfig config;
  config.pool = page_shape(scale, pages + 1);  // the prompt's pages and its last token's
  config.tiers.host_pages = pages;
  config.tiers.write_policy = clm::WritePolicy::write_back;  // device evictions copy to the host
  auto engine = make_engine(config);
  const std::size_t bytes = static_cast<std::size_t>(pages) * page_bytes(config.pool);
  progress("l2_to_l1_load: {} pages ({} MiB) of {}", pages, bytes >> 20, shape_name(config.pool));

  // One prompt of `pages` whole pages (+1 token: a hit covers at most len-1).
  const std::vector<std::int32_t> prompt =
      random_tokens(rng, static_cast<std::size_t>(pages) * kPageSize + 1, kVocabulary);
  // An admission of every device page evicts all that is cached on the
  // device; aborted, it gives them all back, and the prompt is on the host only.
  const std::vector<std::int32_t> filler =
      random_tokens(rng, static_cast<std::size_t>(config.pool.num_pages) * kPageSize, kVocabulary);
  auto evict_device = [&] {
    Admission a;
    check(engine->admit(filler, {}, a), "admit (filler)");
    check(engine->abort(a.seq), "abort (filler)");
    engine->wait_for_tiers();
  };
  admit_and_finish(*engine, prompt);
  evict_device();  // write-back: the prompt's pages go to the host
  if (engine->metrics().tiers.backed_up_pages != static_cast<std::uint64_t>(pages)) {
    die(fmt::format("l2_to_l1_load: write-back copied {} pages, not {}", engine->metrics().tiers.backed_up_pages,
                    pages));
  }

  MemcpyBaseline memcpy_baseline(bytes);
  auto load_back = [&] {
    const std::uint64_t before = engine->metrics().tiers.loaded_pages;
    Admission a;
    const Clock::time_point start = Clock::now();
    check(engine->admit(prompt, {}, a), "admit (load-back)");
    const double s = seconds_since(start);
    const std::uint64_t loaded = engine->metrics().tiers.loaded_pages - before;
    if (loaded != static_cast<std::uint64_t>(pages) || a.host_tokens != pages * kPageSize) {
      die(fmt::format("l2_to_l1_load: the admit loaded {} pages ({} host tokens), not {}", loaded, a.host_tokens,
                      pages));
    }
    check(engine->abort(a.seq), "abort");  // the loaded pages stay cached, on both tiers
    evict_device();                        // and leave the device again (no copy: the host has them)
    return s;
  };
  const auto m = clm_bench::interleaved_medians(scale.copy_runs, load_back, [&] { return memcpy_baseline.run(); });
  print_figure(kBench, fmt::format("l2_to_l1_load_{}_{}pages", shape_name(config.pool), pages), "load_GB_per_s",
               gb_per_s(bytes, m.part), "GB/s", "memcpy_GB_per_s", gb_per_s(bytes, m.baseline));
}

// ---- 2. device tier -> host tier: the Engine's write-back ------------------------

void bench_write_back(const Scale& scale, std::mt19937_64& rng) {
  const std::int32_t pages = scale.copy_pages;
  EngineConfig config;
  config.pool = page_shape(scale, pages + 1);
  config.tiers.host_pages = pages;  // each round's copies push the last round's out (LRU)
  config.tiers.write_policy = clm::WritePolicy::write_back;
  auto engine = make_engine(config);
  const std::size_t bytes = static_cast<std::size_t>(pages) * page_bytes(config.pool);
  progress("l1_to_l2_write_back: {} pages ({} MiB) of {}", pages, bytes >> 20, shape_name(config.pool));
  const std::vector<std::int32_t> filler =
      random_tokens(rng, static_cast<std::size_t>(config.pool.num_pages) * kPageSize, kVocabulary);

  MemcpyBaseline memcpy_baseline(bytes);
  auto write_back = [&] {
    // A new prompt each round: cached on the device, with no host copy yet.
    admit_and_finish(*engine, random_tokens(rng, static_cast<std::size_t>(pages) * kPageSize + 1, kVocabulary));
    const std::uint64_t before = engine->metrics().tiers.backed_up_pages;
    Admission a;
    const Clock::time_point start = Clock::now();
    check(engine->admit(filler, {}, a), "admit (filler: evicts the prompt)");
    const double s = seconds_since(start);
    check(engine->abort(a.seq), "abort (filler)");
    const std::uint64_t copied = engine->metrics().tiers.backed_up_pages - before;
    if (copied != static_cast<std::uint64_t>(pages)) {
      die(fmt::format("l1_to_l2_write_back: the eviction copied {} pages, not {}", copied, pages));
    }
    return s;
  };
  const auto m = clm_bench::interleaved_medians(scale.copy_runs, write_back, [&] { return memcpy_baseline.run(); });
  print_figure(kBench, fmt::format("l1_to_l2_write_back_{}_{}pages", shape_name(config.pool), pages),
               "write_back_GB_per_s", gb_per_s(bytes, m.part), "GB/s", "memcpy_GB_per_s", gb_per_s(bytes, m.baseline));
}

// ---- 1b, 2b. PageCopier alone, pages scattered ------------------------------------

void bench_page_copier(const Scale& scale, std::mt19937_64& rng) {
  const std::int32_t pages = scale.copy_pages;
  // Twice the pages, of which every other one is used, in shuffled order: no
  // two neighbours in a copy are neighbours in a pool, so each page is its
  // own memcpy (the copier merges runs of consecutive ids).
  const clm::PagedKvPoolConfig config = page_shape(scale, 2 * pages);
  std::unique_ptr<clm::PagedKvPool> device_pool, host_pool;
  check(clm::PagedKvPool::create(config, device_pool), "device pool");
  check(clm::PagedKvPool::create(config, host_pool), "host pool");
  prefault(*device_pool, 0x11);
  prefault(*host_pool, 0x22);
  std::unique_ptr<clm::PageCopier> copier;
  check(clm::PageCopier::create(*device_pool, *host_pool, copier), "PageCopier::create");
  std::vector<std::int32_t> device_pages(static_cast<std::size_t>(pages)), host_pages(device_pages.size());
  for (std::int32_t i = 0; i < pages; ++i) {
    device_pages[static_cast<std::size_t>(i)] = 2 * i;
    host_pages[static_cast<std::size_t>(i)] = 2 * i + 1;
  }
  std::shuffle(device_pages.begin(), device_pages.end(), rng);
  std::shuffle(host_pages.begin(), host_pages.end(), rng);
  const std::size_t bytes = static_cast<std::size_t>(pages) * page_bytes(config);
  progress("page copier: {} scattered pages ({} MiB) of {}", pages, bytes >> 20, shape_name(config));
  MemcpyBaseline memcpy_baseline(bytes);
  auto timed = [](auto&& copy) {
    const Clock::time_point start = Clock::now();
    check(copy(), "page copy");
    return seconds_since(start);
  };
  const auto to_device = clm_bench::interleaved_medians(
      scale.copy_runs, [&] { return timed([&] { return copier->to_device(host_pages, device_pages); }); },
      [&] { return memcpy_baseline.run(); });
  print_figure(kBench, fmt::format("l2_to_l1_page_copier_to_device_{}_{}pages_scattered", shape_name(config), pages),
               "copy_GB_per_s", gb_per_s(bytes, to_device.part), "GB/s", "memcpy_GB_per_s",
               gb_per_s(bytes, to_device.baseline));
  const auto to_host = clm_bench::interleaved_medians(
      scale.copy_runs, [&] { return timed([&] { return copier->to_host(device_pages, host_pages); }); },
      [&] { return memcpy_baseline.run(); });
  print_figure(kBench, fmt::format("l1_to_l2_page_copier_to_host_{}_{}pages_scattered", shape_name(config), pages),
               "copy_GB_per_s", gb_per_s(bytes, to_host.part), "GB/s", "memcpy_GB_per_s",
               gb_per_s(bytes, to_host.baseline));
}

// ---- 3. gsp: hit rate over all tiers vs L1 alone ----------------------------------

void bench_gsp_hit_rate(const Scale& scale) {
  clm::replay::GspParams params;
  if (scale.smoke) {  // 8 groups of 4, 256-token system prompts
    params.groups = 8;
    params.prompts_per_group = 4;
    params.system_prompt_tokens = 256;
    params.question_tokens = 32;
    params.output_tokens = 32;
  }
  const clm::replay::Workload gsp = clm::replay::generate_gsp(params);
  clm::replay::ReplayConfig l1_only;
  l1_only.page_size = kPageSize;
  l1_only.capacity_tokens = scale.gsp_l1_tokens;
  clm::replay::ReplayResult alone;
  check(clm::replay::run_replays(gsp, l1_only, scale.gsp_repeats, alone), "gsp replay (L1 only)");
  const std::int64_t l2_tokens = 4 * scale.gsp_l1_tokens;
  progress("gsp: {} requests; L1 {} tokens alone: hit rate {:.4f}", gsp.requests.size(), scale.gsp_l1_tokens,
           alone.hit_rate());
  for (const clm::WritePolicy policy :
       {clm::WritePolicy::write_through_selective, clm::WritePolicy::write_through, clm::WritePolicy::write_back}) {
    clm::replay::ReplayConfig tiered = l1_only;
    tiered.host_capacity_tokens = l2_tokens;
    tiered.write_policy = policy;
    clm::replay::ReplayResult r;
    check(clm::replay::run_replays(gsp, tiered, scale.gsp_repeats, r), "gsp replay (tiers)");
    progress("gsp, {}: device {:.4f} + host {:.4f} = {:.4f}; {} pages loaded, {} backed up; {:.0f} requests/s",
             clm::write_policy_name(policy), r.device_hit_rate(), r.host_hit_rate(), r.hit_rate(), r.tiers.loaded_pages,
             r.tiers.backed_up_pages, r.requests_per_s());
    print_figure(kBench,
                 fmt::format("gsp_tiered_hit_rate_{}_p{}_l1_{}_l2_{}", clm::write_policy_name(policy), kPageSize,
                             scale.gsp_l1_tokens, l2_tokens),
                 "hit_rate_all_tiers", r.hit_rate(), "fraction", "hit_rate_l1_only", alone.hit_rate());
  }
}

// ---- 4. fetching a prefix from redis vs recomputing its attention --------------

// Seconds of the CPU prefill attention of `tokens` new tokens over themselves,
// one layer, kQueryHeads query heads over the shape's KV heads.
class PrefillAttention {
 public:
  PrefillAttention(const Scale& scale, std::int32_t tokens, std::mt19937_64& rng) : tokens_(tokens) {
    clm::PagedKvPoolConfig config = page_shape(scale, tokens / kPageSize);
    config.num_layers = 1;
    check(clm::PagedKvPool::create(config, pool_), "attention pool");
    const auto n = static_cast<std::size_t>(tokens);
    const auto kv_row = static_cast<std::size_t>(config.kv_heads * config.head_dim);
    const auto q_row = static_cast<std::size_t>(kQueryHeads * config.head_dim);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::vector<float> k(n * kv_row), v(n * kv_row);
    for (float& x : k) x = normal(rng);
    for (float& x : v) x = normal(rng);
    q_.resize(n * q_row);
    for (float& x : q_) x = normal(rng);
    out_.resize(q_.size());
    std::vector<std::int64_t> slots(n);
    std::iota(slots.begin(), slots.end(), std::int64_t{0});
    pages_.resize(static_cast<std::size_t>(config.num_pages));
    std::iota(pages_.begin(), pages_.end(), 0);
    view_ = clm::PagedKvView::of(*pool_);
    check(clm::write_kv(view_, 0, k.data(), v.data(), slots), "write_kv");
    params_.layer = 0;
    params_.num_q_heads = kQueryHeads;
  }
  double run() {
    const Clock::time_point start = Clock::now();
    check(clm::paged_prefill_attention(view_, params_, q_.data(), tokens_, pages_, tokens_, out_.data()),
          "paged_prefill_attention");
    return seconds_since(start);
  }

 private:
  std::int32_t tokens_;
  std::unique_ptr<clm::PagedKvPool> pool_;
  clm::PagedKvView view_;
  clm::AttentionParams params_;
  std::vector<float> q_, out_;
  std::vector<std::int32_t> pages_;
};

// Two prefixes stored by one engine, then fetched by a fresh one in turn:
// each fetch of one pushes the other out of both tiers (the host tier holds
// one prefix, the device one prompt), so every timed admit finds its prefix
// in storage alone. fetch() is the seconds of one such admit (fetch + load).
class StoredPrefixes {
 public:
  StoredPrefixes(const Scale& scale, std::mt19937_64& rng, const std::string& storage_url,
                 const std::string& secret_env, std::string_view what)
      : what_(what), tokens_(scale.redis_tokens) {
    const std::int32_t prefix_pages = tokens_ / kPageSize;
    config_.pool = page_shape(scale, prefix_pages + 1);
    config_.tiers.host_pages = prefix_pages;
    config_.tiers.write_policy = clm::WritePolicy::write_through;
    config_.tiers.storage_url = storage_url;
    config_.tiers.page_secret_env = secret_env;
    config_.model_id = "bench-model";
    config_.tiers.prefetch_policy = clm::PrefetchPolicy::wait_complete;
    config_.tiers.admission_deadline_ms = 600000;  // every page is measured: no deadline cuts a slow fetch short
    prefix_bytes_ = static_cast<std::size_t>(prefix_pages) * page_bytes(config_.pool);
    prompts_ = {random_tokens(rng, static_cast<std::size_t>(tokens_) + 1, kVocabulary),
                random_tokens(rng, static_cast<std::size_t>(tokens_) + 1, kVocabulary)};
    {
      auto writer = make_engine(config_);
      for (const auto& prompt : prompts_) {
        admit_and_finish(*writer, prompt);
        admit_and_finish(*writer, prompt);  // the hit: a host copy (write_through), then storage
        writer->wait_for_tiers();
      }
      const clm::TierMetrics m = writer->metrics().tiers;
      if (m.stored_pages != 2 * static_cast<std::uint64_t>(prefix_pages) || m.storage_errors != 0 ||
          m.signed_pages != !secret_env.empty()) {
        die(fmt::format("{}: stored {} pages ({} storage errors, signed {}), not {}", what_, m.stored_pages,
                        m.storage_errors, m.signed_pages, 2 * prefix_pages));
      }
    }
    reader_ = make_engine(config_);  // a fresh Engine: its host tier is empty
  }

  const EngineConfig& config() const { return config_; }
  std::size_t prefix_bytes() const { return prefix_bytes_; }

  double fetch() {
    const std::vector<std::int32_t>& prompt = prompts_[next_];
    next_ = 1 - next_;
    Admission a;
    const Clock::time_point start = Clock::now();
    check(reader_->admit(prompt, {}, a), "admit (fetch from storage)");
    const double s = seconds_since(start);
    if (a.storage_tokens != tokens_ || a.cached_tokens != tokens_) {
      die(fmt::format("{}: the admit found {} tokens in storage ({} cached), not {}", what_, a.storage_tokens,
                      a.cached_tokens, tokens_));
    }
    check(reader_->abort(a.seq), "abort");
    reader_->wait_for_tiers();
    return s;
  }

  void check_clean() const {
    const clm::TierMetrics tm = reader_->metrics().tiers;
    if (tm.storage_errors != 0 || tm.storage.corrupt_pages != 0) {
      die(fmt::format("{}: {} storage errors, {} refused pages", what_, tm.storage_errors, tm.storage.corrupt_pages));
    }
  }

 private:
  std::string what_;
  std::int32_t tokens_;
  EngineConfig config_;
  std::size_t prefix_bytes_ = 0;
  std::vector<std::vector<std::int32_t>> prompts_;
  std::unique_ptr<Engine> reader_;
  std::size_t next_ = 0;
};

// The secret the signed cases use, from an environment variable (as a
// deployment would from its secret store).
constexpr const char* kSecretEnv = "CLM_BENCH_TIERS_PAGE_SECRET";

void bench_redis_fetch(const Scale& scale, std::mt19937_64& rng) {
  const std::int32_t tokens = scale.redis_tokens;
  clm_test::RedisServer redis;
  try {
    redis.start();
  } catch (const std::exception& e) {
    progress("redis_fetch_vs_recompute_{}: SKIPPED (no redis-server to start): {}", tokens, e.what());
    return;
  }
  // A 2 MiB page is one value; a socket read or write waits up to 5 s (the default 200 ms is for small pages).
  StoredPrefixes stored(scale, rng, redis.url("bench-tiers:", "timeout_ms=5000"), "", "redis_fetch_vs_recompute");
  progress("redis_fetch_vs_recompute_{}: stored two {}-token prefixes ({} MiB each) of {} in redis-server on port {}",
           tokens, tokens, stored.prefix_bytes() >> 20, shape_name(stored.config().pool), redis.port());
  PrefillAttention recompute(scale, tokens, rng);
  const auto m = clm_bench::interleaved_medians(
      scale.redis_runs, [&] { return stored.fetch() / scale.num_layers; }, [&] { return recompute.run(); });
  stored.check_clean();
  progress("redis_fetch_vs_recompute_{}: fetch + load {:.1f} ms per prompt ({:.2f} GB/s), attention {:.1f} ms a layer",
           tokens, m.part * scale.num_layers * 1e3, gb_per_s(stored.prefix_bytes(), m.part * scale.num_layers),
           m.baseline * 1e3);
  print_figure(kBench,
               fmt::format("redis_fetch_vs_recompute_{}_{}_q{}", tokens, shape_name(stored.config().pool), kQueryHeads),
               "fetch_load_s_per_layer", m.part, "s", "prefill_attention_s_per_layer", m.baseline);
}

// ---- 6. signed pages: the page MAC itself, and fetches with it against without ----

// GB/s of `mac_one` over a page against memcpy of the page.
template <typename MacOne>
void bench_mac_speed(const Scale& scale, std::string_view name, MacOne&& mac_one) {
  const std::size_t bytes = page_bytes(page_shape(scale, 1));
  const std::vector<std::byte> page(bytes, std::byte{0x6b});
  MemcpyBaseline memcpy_baseline(bytes);
  const auto m = clm_bench::interleaved_medians(
      scale.copy_runs,
      [&] {
        const Clock::time_point start = Clock::now();
        mac_one(std::span(page));
        return seconds_since(start);
      },
      [&] { return memcpy_baseline.run(); });
  progress("{}: {:.2f} GB/s over a {} MiB page (memcpy {:.2f} GB/s)", name, gb_per_s(bytes, m.part), bytes >> 20,
           gb_per_s(bytes, m.baseline));
  print_figure(kBench, fmt::format("{}_{}_page", name, shape_name(page_shape(scale, 1))), "GB_per_s",
               gb_per_s(bytes, m.part), "GB/s", "memcpy_GB_per_s", gb_per_s(bytes, m.baseline));
}

void bench_page_mac(const Scale& scale) {
  std::unique_ptr<clm::PageSigner> signer;
  check(clm::PageSigner::create("a bench secret of a fair length", signer), "PageSigner::create");
  clm::PageSignature signature{};
  bench_mac_speed(scale, "page_mac_gmac", [&](std::span<const std::byte> page) {
    check(signer->sign(page.first(clm::kPageMacOffset), page, signature), "sign");
  });
  // What the pages were signed with before (format 2), for comparison.
  EVP_MAC* hmac = EVP_MAC_fetch(nullptr, "HMAC", nullptr);
  if (!hmac) die("libcrypto has no HMAC");
  char digest_name[] = "SHA256";
  const OSSL_PARAM params[] = {OSSL_PARAM_construct_utf8_string("digest", digest_name, 0), OSSL_PARAM_construct_end()};
  const std::string secret = "a bench secret of a fair length";
  std::array<unsigned char, 32> mac{};
  bench_mac_speed(scale, "hmac_sha256", [&](std::span<const std::byte> page) {
    EVP_MAC_CTX* ctx = EVP_MAC_CTX_new(hmac);
    std::size_t length = 0;
    const bool ok =
        ctx && EVP_MAC_init(ctx, reinterpret_cast<const unsigned char*>(secret.data()), secret.size(), params) == 1 &&
        EVP_MAC_update(ctx, reinterpret_cast<const unsigned char*>(page.data()), page.size()) == 1 &&
        EVP_MAC_final(ctx, mac.data(), &length, mac.size()) == 1;
    EVP_MAC_CTX_free(ctx);
    if (!ok) die("HMAC-SHA256 failed");
  });
  EVP_MAC_free(hmac);
}

// Fetch + load of a stored prefix with signed pages against the same without,
// from `storage_url(prefix)` (a directory or a redis-server), interleaved.
template <typename UrlOf>
void bench_signed_fetch(const Scale& scale, std::mt19937_64& rng, std::string_view backend, UrlOf&& url_of) {
  ::setenv(kSecretEnv, "deployment secret of the bench, 32+ bytes", 1);
  StoredPrefixes plain(scale, rng, url_of("plain"), "", fmt::format("signed_fetch_{}", backend));
  StoredPrefixes sealed(scale, rng, url_of("signed"), kSecretEnv, fmt::format("signed_fetch_{}", backend));
  const auto m = clm_bench::interleaved_medians(
      scale.redis_runs, [&] { return sealed.fetch(); }, [&] { return plain.fetch(); });
  plain.check_clean();
  sealed.check_clean();
  const double signed_gbps = gb_per_s(sealed.prefix_bytes(), m.part);
  const double plain_gbps = gb_per_s(plain.prefix_bytes(), m.baseline);
  progress("signed_fetch_{}_{}: fetch + load {:.2f} GB/s signed, {:.2f} GB/s unsigned", backend, scale.redis_tokens,
           signed_gbps, plain_gbps);
  print_figure(kBench,
               fmt::format("signed_fetch_{}_{}_{}", backend, scale.redis_tokens, shape_name(plain.config().pool)),
               "fetch_load_GB_per_s_signed", signed_gbps, "GB/s", "fetch_load_GB_per_s_unsigned", plain_gbps);
}

void bench_signed_fetches(const Scale& scale, std::mt19937_64& rng) {
  const std::string dir =
      (std::filesystem::temp_directory_path() / fmt::format("clm-bench-tiers-signed-{}", ::getpid())).string();
  bench_signed_fetch(scale, rng, "dir", [&](std::string_view name) { return fmt::format("file://{}/{}", dir, name); });
  std::filesystem::remove_all(dir);

  // redis-server with AUTH (requirepass), and a 2048-token prefix: fetch +
  // load per layer with AUTH and HMAC against a server without either.
  clm_test::RedisServer open_redis;
  clm_test::RedisServer auth_redis({"--requirepass", "bench-redis-password"});
  try {
    open_redis.start();
    auth_redis.start();
  } catch (const std::exception& e) {
    progress("signed_fetch_redis: SKIPPED (no redis-server to start): {}", e.what());
    return;
  }
  bench_signed_fetch(scale, rng, "redis", [&](std::string_view name) {
    return open_redis.url(fmt::format("{}:", name), "timeout_ms=5000");
  });
  ::setenv(kSecretEnv, "deployment secret of the bench, 32+ bytes", 1);
  StoredPrefixes plain(scale, rng, open_redis.url("auth-plain:", "timeout_ms=5000"), "", "redis_auth_signed");
  const std::string auth_url = fmt::format(
      "redis://:bench-redis-password@127.0.0.1:{}/0?prefix=auth-signed:&timeout_ms=5000", auth_redis.port());
  StoredPrefixes sealed(scale, rng, auth_url, kSecretEnv, "redis_auth_signed");
  const auto m = clm_bench::interleaved_medians(
      scale.redis_runs, [&] { return sealed.fetch() / scale.num_layers; },
      [&] { return plain.fetch() / scale.num_layers; });
  plain.check_clean();
  sealed.check_clean();
  print_figure(kBench,
               fmt::format("redis_auth_signed_fetch_{}_{}", scale.redis_tokens, shape_name(plain.config().pool)),
               "fetch_load_s_per_layer_auth_signed", m.part, "s", "fetch_load_s_per_layer_plain", m.baseline);
}

// ---- 7. one long conversation, turn by turn: store and fetch cost per turn ----
//
// A 32k-token conversation of 200 turns (160 new tokens a turn: a reply and
// the user's next message) through a writer engine (write_through: each
// turn's hit gives the previous turn's pages host copies, then stored
// copies) and a reader engine on the same redis-server (each turn fetches
// what the writer stored of the turn before). The cost of a turn is the wall
// time of its admit, finish and wait for the tiers' jobs. The figure: turns
// 191-200 against turns 6-15 (medians); work that grows with the
// conversation's length shows as a ratio well above 1.

struct TurnCosts {
  std::vector<double> store_s, fetch_s;
};

void bench_conversation_turns(const Scale& scale, std::mt19937_64& rng) {
  clm_test::RedisServer redis;
  try {
    redis.start();
  } catch (const std::exception& e) {
    progress("conversation_turns: SKIPPED (no redis-server to start): {}", e.what());
    return;
  }
  const int turns = scale.smoke ? 20 : 200;
  constexpr std::int32_t kTurnTokens = 160;
  const std::int32_t total_pages = turns * kTurnTokens / kPageSize + 2;
  EngineConfig config;
  config.pool = page_shape(scale, total_pages + 8);
  config.pool.num_layers = 2;  // 128 KiB pages: the per-turn bookkeeping, not the bytes, is measured
  config.tiers.host_pages = total_pages + 8;
  config.tiers.write_policy = clm::WritePolicy::write_through;
  config.tiers.storage_url = redis.url("conversation:", "timeout_ms=5000");
  config.tiers.prefetch_policy = clm::PrefetchPolicy::wait_complete;
  config.tiers.admission_deadline_ms = 600000;  // every turn's fetch completes: the cost measured is all of it
  config.model_id = "bench-model";
  // The conversation's prompts: turn t's is turn t-1's and 160 more tokens.
  std::vector<std::int32_t> conversation = random_tokens(rng, kTurnTokens, kVocabulary);
  std::vector<std::size_t> prompt_end;
  for (int turn = 1; turn <= turns + 1; ++turn) {
    prompt_end.push_back(conversation.size());
    const std::vector<std::int32_t> next = random_tokens(rng, kTurnTokens, kVocabulary);
    conversation.insert(conversation.end(), next.begin(), next.end());
  }
  auto prompt = [&](int turn) { return std::span(conversation).first(prompt_end[static_cast<std::size_t>(turn - 1)]); };
  TurnCosts costs;
  // The writer: turn t's hit stores turn t-1's pages (one turn more, so that turn `turns` is stored too).
  auto writer = make_engine(config);
  for (int turn = 1; turn <= turns + 1; ++turn) {
    const Clock::time_point start = Clock::now();
    admit_and_finish(*writer, prompt(turn));
    writer->wait_for_tiers();
    costs.store_s.push_back(seconds_since(start));
    if (turn % 50 == 0) progress("conversation_turns: writer at turn {} of {}", turn, turns);
  }
  // The reader: each turn fetches the pages the turn before did not have.
  auto reader = make_engine(config);
  for (int turn = 1; turn <= turns; ++turn) {
    const Clock::time_point start = Clock::now();
    admit_and_finish(*reader, prompt(turn));
    reader->wait_for_tiers();
    costs.fetch_s.push_back(seconds_since(start));
    if (turn % 50 == 0) progress("conversation_turns: reader at turn {} of {}", turn, turns);
  }
  const std::size_t tokens = prompt_end[static_cast<std::size_t>(turns - 1)];
  const clm::TierMetrics wm = writer->metrics().tiers, rm = reader->metrics().tiers;
  const auto want_pages = static_cast<std::uint64_t>(tokens - 1) / kPageSize;
  if (wm.storage_errors != 0 || rm.storage_errors != 0 || wm.stored_pages < want_pages ||
      rm.fetched_pages < want_pages) {
    die(fmt::format("conversation_turns: writer stored {} pages ({} errors), reader fetched {} ({} errors)",
                    wm.stored_pages, wm.storage_errors, rm.fetched_pages, rm.storage_errors));
  }
  // Medians of ten turns (five in a smoke run): one turn's time is noise.
  const int width = scale.smoke ? 5 : 10;
  auto window = [&](const std::vector<double>& v, int last_turn) {
    return clm_bench::median(std::vector<double>(v.begin() + (last_turn - width), v.begin() + last_turn));
  };
  const int late = turns, early = scale.smoke ? 6 : 15;
  for (const auto& [name, values] : {std::pair<const char*, const std::vector<double>*>{"store", &costs.store_s},
                                     std::pair<const char*, const std::vector<double>*>{"fetch", &costs.fetch_s}}) {
    const double late_s = window(*values, late), early_s = window(*values, early);
    progress("conversation_turns: {} turn {} {:.2f} ms, turn {} {:.2f} ms", name, late, late_s * 1e3, early,
             early_s * 1e3);
    print_figure(kBench,
                 fmt::format("conversation_{}_turns{}-{}_vs_{}-{}_{}tok", name, late - width + 1, late,
                             early - width + 1, early, tokens),
                 fmt::format("{}_s_per_turn_late", name), late_s, "s", fmt::format("{}_s_per_turn_early", name),
                 early_s);
  }
}

}  // namespace

int main() {
  const Scale scale = make_scale();
  std::uint64_t seed = std::random_device{}();
  seed = (seed << 32) ^ std::random_device{}();
  progress("seed {}{}; {} hardware threads; load average {}", seed, scale.smoke ? "; smoke run" : "",
           std::thread::hardware_concurrency(), load_average());
  std::mt19937_64 rng(seed);
  bench_load_back(scale, rng);
  bench_write_back(scale, rng);
  bench_page_copier(scale, rng);
  bench_gsp_hit_rate(scale);
  bench_redis_fetch(scale, rng);
  bench_page_mac(scale);
  bench_signed_fetches(scale, rng);
  bench_conversation_turns(scale, rng);
  progress("done; load average {}", load_average());
  return 0;
}
