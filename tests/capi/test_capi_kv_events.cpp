// Tests of KV events through the C ABI (clm.h, "KV events"), as a host that
// publishes on a bus of its own sees them: every batch arrives at the
// callback in order, numbered without gaps, on one thread that is not the
// caller's; a picture rebuilt from the plain structs alone (a set of hashes
// per medium, a parent known before its child, a removed block present)
// equals clm_engine_kv_event_blocks after a random workload with evictions,
// the host tier, tenants and adapters. Then the ZeroMQ endpoints as bound,
// the counters, older struct sizes, and the options and calls that must be
// refused. Only clm.h, as a host sees it.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

#include "capi_checks.hpp"
#include "clm.h"
#include "test_random.hpp"

namespace {

constexpr int32_t kPage = 4;

clm_engine_options events_options() {
  clm_engine_options o;
  std::memset(&o, 0xAB, sizeof o);
  REQUIRE_OK(clm_engine_options_init(&o, sizeof o));
  o.num_pages = 48;
  o.page_size = kPage;
  o.num_layers = 1;
  o.kv_heads = 1;
  o.head_dim = 4;
  o.kv_dtype = CLM_KV_F32;
  o.host_pages = 96;
  o.model_id = "capi-events-model";
  o.kv_events = 1;
  o.kv_events_endpoint = "tcp://127.0.0.1:*";
  o.kv_events_batch_interval_ms = 2;
  o.kv_events_max_batch_events = 16;
  return o;
}

EnginePtr make(const clm_engine_options& o) {
  clm_engine* e = nullptr;
  REQUIRE_OK(clm_engine_create(&e, &o));
  return EnginePtr(e);
}

clm_metrics metrics_of(const clm_engine* e) {
  clm_metrics m;
  m.struct_size = sizeof m;
  REQUIRE_OK(clm_engine_metrics(&m, e));
  return m;
}

std::set<uint64_t> engine_blocks(const clm_engine* e, int32_t medium) {
  size_t count = 0;
  // Sizing call: a capacity of 0 reports the count.
  const clm_status sized = clm_engine_kv_event_blocks(nullptr, 0, &count, e, medium);
  REQUIRE((sized == CLM_OK || sized == CLM_ERR_INVALID_ARGUMENT));
  std::vector<uint64_t> hashes(count);
  REQUIRE_OK(clm_engine_kv_event_blocks(hashes.data(), hashes.size(), &count, e, medium));
  REQUIRE(count == hashes.size());
  const std::set<uint64_t> set(hashes.begin(), hashes.end());
  CHECK(set.size() == hashes.size());  // no page twice
  return set;
}

// What the callback saw: the batches' numbers, its threads, and the picture
// the plain structs alone give.
struct Subscriber {
  std::mutex mutex;
  std::vector<uint64_t> sequences;
  std::set<std::thread::id> threads;
  std::set<uint64_t> gpu, cpu;
  uint64_t events = 0;
  bool token_ids = true;
  std::set<std::string> extra_keys;
  std::set<int32_t> lora_ids;

  static void callback(const clm_kv_event_batch* batch, void* user_data) {
    static_cast<Subscriber*>(user_data)->apply(*batch);
  }

  void apply(const clm_kv_event_batch& batch) {
    std::lock_guard lock(mutex);
    CHECK(batch.struct_size >= sizeof(clm_kv_event_batch));
    CHECK(batch.data_parallel_rank == 3);
    CHECK(batch.ts > 1.7e9);
    sequences.push_back(batch.sequence);
    threads.insert(std::this_thread::get_id());
    for (size_t i = 0; i < batch.n_events; ++i) {
      const clm_kv_event& e = batch.events[i];
      ++events;
      std::set<uint64_t>& tier = e.medium == CLM_KV_MEDIUM_CPU ? cpu : gpu;
      switch (e.kind) {
        case CLM_KV_EVENT_ALL_BLOCKS_CLEARED:
          gpu.clear();
          cpu.clear();
          break;
        case CLM_KV_EVENT_BLOCK_STORED:
          REQUIRE(e.n_block_hashes > 0);
          CHECK(e.block_size == kPage);
          CHECK(e.n_token_ids == (token_ids ? e.n_block_hashes * kPage : 0));
          if (e.has_parent) CHECK(tier.count(e.parent_block_hash) == 1);
          for (size_t b = 0; b < e.n_block_hashes; ++b) CHECK(tier.insert(e.block_hashes[b]).second);
          REQUIRE(e.extra_key != nullptr);
          extra_keys.insert(e.extra_key);
          lora_ids.insert(e.lora_id);
          break;
        case CLM_KV_EVENT_BLOCK_REMOVED:
          for (size_t b = 0; b < e.n_block_hashes; ++b) CHECK(tier.erase(e.block_hashes[b]) == 1);
          break;
        default:
          FAIL("unknown kind " << e.kind);
      }
    }
  }
};

// Prompts over a few shared system prompts, three tenants and two adapters,
// in a pool small enough to evict; some come back, so the host tier loads.
void run_workload(clm_engine* e, std::mt19937& rng, int requests) {
  std::vector<std::vector<int32_t>> systems(4);
  for (auto& s : systems) {
    s.resize(12 + rng() % 12);
    for (auto& t : s) t = static_cast<int32_t>(rng() % 30000);
  }
  const char* salts[] = {nullptr, "tenant-a", "tenant-b"};
  std::vector<std::vector<int32_t>> seen;
  for (int r = 0; r < requests; ++r) {
    std::vector<int32_t> prompt;
    if (!seen.empty() && rng() % 4 == 0) {
      prompt = seen[rng() % seen.size()];
    } else {
      prompt = systems[rng() % systems.size()];
      const size_t extra = 4 + rng() % 24;
      for (size_t i = 0; i < extra; ++i) prompt.push_back(static_cast<int32_t>(rng() % 30000));
      seen.push_back(prompt);
    }
    clm_admit_options a;
    REQUIRE_OK(clm_admit_options_init(&a, sizeof a));
    const char* salt = salts[prompt.size() % 3];
    a.cache_salt = salt;
    a.cache_salt_len = salt ? std::strlen(salt) : 0;
    a.adapter_id = rng() % 2 ? 7 : 0;
    clm_seq* s = nullptr;
    const clm_status st = clm_engine_admit(&s, e, prompt.data(), prompt.size(), &a);
    if (st == CLM_ERR_OUT_OF_MEMORY) continue;  // the pool is full of running sequences: none here
    REQUIRE(st == CLM_OK);
    SeqPtr seq(s);
    REQUIRE_OK(clm_seq_finish(seq.get()));
    if (r % 16 == 0) REQUIRE_OK(clm_engine_wait_for_tiers(e));
  }
  REQUIRE_OK(clm_engine_wait_for_tiers(e));
}

}  // namespace

TEST_CASE("C ABI KV events: the callback's batches rebuild the engine's blocks exactly, in order, on one thread",
          "[capi][events]") {
  const uint32_t seed = clm_test::fresh_seed();
  INFO("seed " << seed);
  std::mt19937 rng(seed);
  Subscriber sub;
  clm_engine_options o = events_options();
  o.kv_events_callback = &Subscriber::callback;
  o.kv_events_callback_data = &sub;
  o.kv_events_data_parallel_rank = 3;
  o.kv_events_endpoint = "tcp://no-host-anyone-binds:1";  // unused with a callback
  EnginePtr engine = make(o);
  run_workload(engine.get(), rng, 300);
  REQUIRE_OK(clm_engine_flush_kv_events(engine.get(), 10000));

  std::unique_lock lock(sub.mutex);
  REQUIRE(!sub.sequences.empty());
  for (size_t i = 0; i < sub.sequences.size(); ++i) REQUIRE(sub.sequences[i] == i);
  CHECK(sub.threads.size() == 1);
  CHECK(sub.threads.count(std::this_thread::get_id()) == 0);
  const auto gpu = engine_blocks(engine.get(), CLM_KV_MEDIUM_GPU);
  const auto cpu = engine_blocks(engine.get(), CLM_KV_MEDIUM_CPU);
  CHECK(sub.gpu == gpu);
  CHECK(sub.cpu == cpu);
  CHECK(!gpu.empty());
  CHECK(!cpu.empty());
  // Tenants' salts arrive only as digests; adapters as lora ids.
  CHECK(sub.extra_keys.count("") == 1);
  CHECK(sub.extra_keys.size() == 3);
  for (const std::string& k : sub.extra_keys) CHECK((k.empty() || (k.rfind("salt:", 0) == 0 && k.size() == 37)));
  CHECK(sub.lora_ids == std::set<int32_t>{0, 7});

  const clm_metrics m = metrics_of(engine.get());
  CHECK(m.has_kv_events == 1);
  CHECK(m.kv_events_published == sub.events);
  CHECK(m.kv_events_published_batches == sub.sequences.size());
  CHECK(m.kv_events_next_sequence == sub.sequences.size());
  CHECK(m.kv_events_recorded == sub.events);
  CHECK(m.kv_events_dropped == 0);
  CHECK(m.kv_events_queued == 0);
  CHECK(m.kv_events_resync_pending == 0);
  CHECK(m.evictions > 0);  // the run did what it is meant to exercise
  CHECK(m.backed_up_pages > 0);

  // With a callback there is no socket: both endpoints are "".
  char text[256];
  size_t len = 99;
  REQUIRE_OK(clm_engine_kv_events_endpoint(text, sizeof text, &len, engine.get(), 0));
  CHECK(len == 0);
  CHECK(std::string(text).empty());
}

TEST_CASE("C ABI KV events: clm_engine_free delivers what is queued, and the callback is not called after",
          "[capi][events]") {
  const uint32_t seed = clm_test::fresh_seed();
  INFO("seed " << seed);
  std::mt19937 rng(seed);
  Subscriber sub;
  clm_engine_options o = events_options();
  o.kv_events_callback = &Subscriber::callback;
  o.kv_events_callback_data = &sub;
  o.kv_events_data_parallel_rank = 3;
  // Batches only when asked: everything is still queued when the engine is freed.
  o.kv_events_batch_interval_ms = 60000;
  o.kv_events_max_batch_events = 65536;
  EnginePtr engine = make(o);
  run_workload(engine.get(), rng, 100);
  // A sequence alive keeps the engine's core past clm_engine_free.
  const std::vector<int32_t> running{1, 2, 3, 4, 5, 6, 7, 8, 9};
  clm_seq* held = nullptr;
  REQUIRE_OK(clm_engine_admit(&held, engine.get(), running.data(), running.size(), nullptr));
  SeqPtr held_seq(held);
  REQUIRE(metrics_of(engine.get()).kv_events_queued > 0);
  const auto gpu = engine_blocks(engine.get(), CLM_KV_MEDIUM_GPU);
  const auto cpu = engine_blocks(engine.get(), CLM_KV_MEDIUM_CPU);
  engine.reset();
  std::unique_lock lock(sub.mutex);
  CHECK(sub.gpu == gpu);
  CHECK(sub.cpu == cpu);
  const uint64_t delivered = sub.events;
  lock.unlock();
  CHECK(clm_seq_finish(held_seq.get()) == CLM_ERR_FAILED_PRECONDITION);
  held_seq.reset();
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  lock.lock();
  CHECK(sub.events == delivered);  // the callback was not called after clm_engine_free
}

TEST_CASE("C ABI KV events: token ids left out, a socket's endpoints as bound, and older option sizes",
          "[capi][events]") {
  const uint32_t seed = clm_test::fresh_seed();
  INFO("seed " << seed);
  std::mt19937 rng(seed);
  {
    Subscriber sub;
    sub.token_ids = false;
    clm_engine_options o = events_options();
    o.kv_events_callback = &Subscriber::callback;
    o.kv_events_callback_data = &sub;
    o.kv_events_data_parallel_rank = 3;
    o.kv_events_token_ids = 0;
    EnginePtr engine = make(o);
    run_workload(engine.get(), rng, 100);
    REQUIRE_OK(clm_engine_flush_kv_events(engine.get(), 10000));
    std::lock_guard lock(sub.mutex);
    CHECK(sub.events > 1);
    CHECK(sub.gpu == engine_blocks(engine.get(), CLM_KV_MEDIUM_GPU));
  }
  {
    clm_engine_options o = events_options();
    o.kv_events_replay_endpoint = "tcp://127.0.0.1:*";
    o.kv_events_topic = "kv@pod-1@capi-events-model";
    EnginePtr engine = make(o);
    char text[256];
    size_t len = 0;
    REQUIRE_OK(clm_engine_kv_events_endpoint(text, sizeof text, &len, engine.get(), 0));
    const std::string pub(text, len);
    CHECK(pub.rfind("tcp://127.0.0.1:", 0) == 0);
    CHECK(pub != "tcp://127.0.0.1:*");  // the port the wildcard picked
    REQUIRE_OK(clm_engine_kv_events_endpoint(text, sizeof text, &len, engine.get(), 1));
    const std::string replay(text, len);
    CHECK(replay.rfind("tcp://127.0.0.1:", 0) == 0);
    CHECK(replay != pub);
    // A short buffer reports the length and writes nothing.
    char small[4] = {'x', 'x', 'x', 'x'};
    CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT, clm_engine_kv_events_endpoint(small, sizeof small, &len, engine.get(), 0));
    CHECK(len == pub.size());
    CHECK(small[0] == 'x');
    run_workload(engine.get(), rng, 50);
    REQUIRE_OK(clm_engine_flush_kv_events(engine.get(), 10000));
    const clm_metrics m = metrics_of(engine.get());
    CHECK(m.kv_events_published_batches > 0);
    CHECK(m.kv_events_send_failures == 0);
  }
  {
    // A caller built against version 6 of the options (or 5 of the metrics)
    // gets no events and reads no event counters.
    alignas(clm_engine_options) unsigned char v6[sizeof(clm_engine_options)];
    const size_t v6_size = offsetof(clm_engine_options, kv_events);
    std::memset(v6, 0xCD, sizeof v6);
    auto* o = reinterpret_cast<clm_engine_options*>(v6);
    REQUIRE_OK(clm_engine_options_init(o, v6_size));
    CHECK(v6[v6_size] == 0xCD);  // nothing written past the caller's struct
    o->num_pages = 8;
    o->page_size = kPage;
    EnginePtr engine = make(*o);
    alignas(clm_metrics) unsigned char m5[sizeof(clm_metrics)];
    std::memset(m5, 0xCD, sizeof m5);
    auto* m = reinterpret_cast<clm_metrics*>(m5);
    m->struct_size = static_cast<uint32_t>(offsetof(clm_metrics, has_kv_events));
    REQUIRE_OK(clm_engine_metrics(m, engine.get()));
    CHECK(m5[offsetof(clm_metrics, has_kv_events)] == 0xCD);
    CHECK(metrics_of(engine.get()).has_kv_events == 0);
    size_t count = 0;
    CHECK_STATUS(CLM_ERR_FAILED_PRECONDITION, clm_engine_kv_event_blocks(nullptr, 0, &count, engine.get(), 0));
  }
  // The defaults: off, loopback, the array layout, ids sent.
  clm_engine_options d;
  REQUIRE_OK(clm_engine_options_init(&d, sizeof d));
  const clm_engine_options init = CLM_ENGINE_OPTIONS_INIT;
  CHECK(d.kv_events == 0);
  CHECK(d.kv_events_bind == CLM_KV_EVENTS_BIND_AUTO);
  CHECK(d.kv_events_endpoint == nullptr);
  CHECK(d.kv_events_callback == nullptr);
  CHECK(d.kv_events_layout == CLM_KV_EVENTS_LAYOUT_ARRAY);
  CHECK(d.kv_events_token_ids == 1);
  CHECK(std::memcmp(&d.kv_events, &init.kv_events, sizeof d - offsetof(clm_engine_options, kv_events)) == 0);
}

TEST_CASE("C ABI KV events: options and calls that cannot work are refused with a clear status", "[capi][events]") {
  clm_engine* e = nullptr;
  const auto refused = [&e](clm_engine_options o) {
    CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT, clm_engine_create(&e, &o));
    CHECK(e == nullptr);
  };
  clm_engine_options o = events_options();
  o.kv_events = 2;
  refused(o);
  o = events_options();
  o.kv_events_bind = 3;
  refused(o);
  o = events_options();
  o.kv_events_layout = -1;
  refused(o);
  o = events_options();
  o.kv_events_token_ids = 5;
  refused(o);
  o = events_options();
  o.kv_events_callback_data = &o;  // data for no callback
  refused(o);
  o = events_options();
  o.model_id = nullptr;  // the hashes name the model
  refused(o);
  o = events_options();
  const std::string topic(300, 't');
  o.kv_events_topic = topic.c_str();
  refused(o);
  o = events_options();
  const std::string endpoint = "tcp://127.0.0.1:" + std::string(5000, '9');
  o.kv_events_endpoint = endpoint.c_str();
  refused(o);
  o = events_options();
  o.kv_events_callback = [](const clm_kv_event_batch*, void*) {};
  o.kv_events_replay_endpoint = "tcp://127.0.0.1:*";  // replay is the host's bus's
  refused(o);
  o = events_options();
  o.kv_events_endpoint = "tcp://256.1.1.1:1";  // cannot bind: a clear status, no engine
  o.kv_events_bind = CLM_KV_EVENTS_BIND;
  {
    const clm_status s = clm_engine_create(&e, &o);
    INFO(clm_last_error());
    CHECK(s != CLM_OK);
    CHECK(e == nullptr);
  }

  // The calls, on an engine with events and without.
  EnginePtr with = make(events_options());
  clm_engine_options plain_options = events_options();
  plain_options.kv_events = 0;
  EnginePtr plain = make(plain_options);
  size_t count = 0, len = 0;
  uint64_t one[1];
  char text[8];
  CHECK_STATUS(CLM_ERR_FAILED_PRECONDITION, clm_engine_flush_kv_events(plain.get(), 10));
  CHECK_STATUS(CLM_ERR_FAILED_PRECONDITION, clm_engine_kv_event_blocks(one, 1, &count, plain.get(), 0));
  CHECK_STATUS(CLM_ERR_FAILED_PRECONDITION, clm_engine_kv_events_endpoint(text, sizeof text, &len, plain.get(), 0));
  CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT, clm_engine_flush_kv_events(nullptr, 10));
  CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT, clm_engine_flush_kv_events(with.get(), -1));
  CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT, clm_engine_kv_event_blocks(one, 1, nullptr, with.get(), 0));
  CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT, clm_engine_kv_event_blocks(nullptr, 1, &count, with.get(), 0));
  CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT, clm_engine_kv_event_blocks(one, 1, &count, with.get(), 2));
  CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT, clm_engine_kv_event_blocks(one, 1, &count, nullptr, 0));
  CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT, clm_engine_kv_events_endpoint(text, sizeof text, nullptr, with.get(), 0));
  CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT, clm_engine_kv_events_endpoint(text, sizeof text, &len, with.get(), 2));
  CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT, clm_engine_kv_events_endpoint(nullptr, 0, &len, with.get(), 0));
  CHECK(len > 0);  // ... and says how long it is
}
