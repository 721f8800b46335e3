// Tests of an Engine's KV events (EngineConfig::kv_events): a subscriber on a
// real ZeroMQ socket, joining after the first batches and recovering them
// through replay, rebuilds each tier's set of blocks from the stream alone
// (a naive model: a set per medium, a parent must be known before its child,
// a removed block must be there); after a random workload with evictions,
// host-tier moves, three tenants and two adapters, that set equals the
// engine's, block for block, and every block hash is one of the hashes
// chained independently over the prompts the workload finished. Then: drops
// and the resync that follows them, replay requests that are malformed or
// from the future, and configurations that must be refused.
#include <catch2/catch.hpp>

#include <openssl/evp.h>

#define XXH_INLINE_ALL
#include <xxhash.h>
#include <zmq.hpp>

#include <algorithm>
#include <chrono>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "clm/cache/paged_kv_pool.hpp"
#include "clm/cache/radix_tree.hpp"
#include "clm/engine.hpp"
#include "clm/events/kv_event_recorder.hpp"
#include "clm/tiers/page_seal.hpp"
#include "events/kv_events_workload.hpp"
#include "test_random.hpp"
#include "test_support.hpp"

namespace {

using Tokens = std::vector<std::int32_t>;
constexpr std::int32_t kPageSize = clm_test::kEventsPageSize;
constexpr const char* kModel = "test-model@sha256:00";

clm::EngineConfig events_config() {
  return clm_test::kv_events_config(kModel, "tcp://127.0.0.1:*", "tcp://127.0.0.1:*");
}

std::uint64_t be64(const zmq::message_t& m) {
  std::uint64_t v = 0;
  const auto* p = static_cast<const unsigned char*>(m.data());
  for (std::size_t i = 0; i < 8; ++i) v = (v << 8) | p[i];
  return v;
}

std::string be64_bytes(std::uint64_t v) {
  std::string out(8, '\0');
  for (int i = 7; i >= 0; --i, v >>= 8) out[static_cast<std::size_t>(i)] = static_cast<char>(v & 0xff);
  return out;
}

// Asks the replay socket for every batch from `start`: (seq, payload) in order.
std::vector<std::pair<std::uint64_t, std::string>> replay(zmq::context_t& ctx, const std::string& endpoint,
                                                          std::uint64_t start, const std::string& request = {}) {
  zmq::socket_t dealer(ctx, zmq::socket_type::dealer);
  dealer.set(zmq::sockopt::rcvtimeo, 5000);
  dealer.set(zmq::sockopt::linger, 0);
  dealer.connect(endpoint);
  (void)dealer.send(zmq::message_t(), zmq::send_flags::sndmore);
  (void)dealer.send(zmq::buffer(request.empty() ? be64_bytes(start) : request));
  std::vector<std::pair<std::uint64_t, std::string>> out;
  for (;;) {
    zmq::message_t empty, seq, payload;
    REQUIRE(dealer.recv(empty));
    REQUIRE(empty.size() == 0);
    REQUIRE(dealer.recv(seq));
    REQUIRE(seq.size() == 8);
    REQUIRE(dealer.recv(payload));
    if (be64(seq) == ~std::uint64_t{0}) {
      CHECK(payload.size() == 0);
      return out;
    }
    out.emplace_back(be64(seq), payload.to_string());
  }
}

// A subscriber that knows only the wire format: a set of block hashes per medium.
struct Picture {
  std::set<std::uint64_t> gpu, cpu;
  std::uint64_t next_seq = 0;
  std::uint64_t events = 0;
  bool token_ids = true;  // KvEventsConfig::token_ids: every page's ids, or none at all

  void apply(std::uint64_t seq, const std::string& payload) {
    REQUIRE(seq == next_seq);  // in order, none missing
    ++next_seq;
    clm::KvEventBatch batch;
    const clm::Status s = clm::decode_kv_event_batch(payload, batch);
    INFO(s.message());
    REQUIRE(s.ok());
    CHECK(batch.data_parallel_rank == std::optional<std::int32_t>(0));
    for (const clm::KvEvent& e : batch.events) {
      ++events;
      auto& tier = e.medium == clm::KvMedium::cpu ? cpu : gpu;
      switch (e.kind) {
        case clm::KvEventKind::all_blocks_cleared:
          gpu.clear();
          cpu.clear();
          break;
        case clm::KvEventKind::block_stored:
          CHECK(e.block_size == kPageSize);
          CHECK(e.token_ids.size() == (token_ids ? e.block_hashes.size() * kPageSize : 0));
          if (e.parent_block_hash) CHECK(tier.count(*e.parent_block_hash) == 1);  // routers drop orphans
          for (std::uint64_t h : e.block_hashes) CHECK(tier.insert(h).second);
          break;
        case clm::KvEventKind::block_removed:
          for (std::uint64_t h : e.block_hashes) CHECK(tier.erase(h) == 1);
          break;
      }
    }
  }
};

std::set<std::uint64_t> engine_blocks(const clm::Engine& engine, clm::KvMedium medium) {
  std::vector<std::uint64_t> blocks;
  REQUIRE(engine.kv_event_blocks(medium, blocks).ok());
  const std::set<std::uint64_t> set(blocks.begin(), blocks.end());
  CHECK(set.size() == blocks.size());  // no page twice
  return set;
}

using Finished = clm_test::FinishedPrompt;

// Every block hash of every whole page of each finished prompt, chained here
// from the definition (clm/events/kv_event_recorder.hpp), not by the
// recorder's walk of the tree: the namespace's seed is the first 8 bytes
// (big-endian) of SHA-256(scope, u32 salt length, salt, i32 adapter), and
// each page's hash is XXH3 (64-bit) of its token ids seeded with the one
// before (Debian's xxHash, header-only here as in the library).
std::set<std::uint64_t> reference_hashes(const std::vector<Finished>& finished) {
  clm::PageSeal seal;
  REQUIRE(clm::PageSeal::create(kModel, {}, seal).ok());
  const clm::Digest32 scope = seal.key_scope();
  std::set<std::uint64_t> out;
  for (const Finished& f : finished) {
    std::string bytes(reinterpret_cast<const char*>(scope.data()), scope.size());
    const auto le32 = [&bytes](std::uint32_t v) {
      for (int b = 0; b < 4; ++b) bytes.push_back(static_cast<char>(v >> (8 * b)));
    };
    le32(static_cast<std::uint32_t>(f.salt.size()));
    bytes += f.salt;
    le32(static_cast<std::uint32_t>(f.adapter));
    unsigned char digest[EVP_MAX_MD_SIZE];
    unsigned int length = 0;
    REQUIRE(EVP_Digest(bytes.data(), bytes.size(), digest, &length, EVP_sha256(), nullptr) == 1);
    std::uint64_t h = 0;
    for (int i = 0; i < 8; ++i) h = (h << 8) | digest[i];
    for (std::size_t at = 0; at + kPageSize <= f.tokens.size(); at += kPageSize) {
      h = XXH3_64bits_withSeed(f.tokens.data() + at, kPageSize * sizeof(std::int32_t), h);
      out.insert(h);
    }
  }
  return out;
}

void run_workload(clm::Engine& engine, std::mt19937& rng, int requests, std::vector<Finished>& finished) {
  const clm::Status s = clm_test::run_kv_events_workload(engine, rng, requests, finished);
  INFO(s.message());
  REQUIRE(s.ok());
}

}  // namespace

TEST_CASE("KV events: a late subscriber's picture, with replay, equals the engine's block for block",
          "[events][threads]") {
  const std::uint32_t seed = clm_test::fresh_seed();
  INFO("seed " << seed);
  std::mt19937 rng(seed);
  std::unique_ptr<clm::Engine> engine;
  const clm::Status created = clm::Engine::create(events_config(), engine);
  INFO(created.message());
  REQUIRE(created.ok());
  REQUIRE(engine->kv_events_endpoint().starts_with("tcp://127.0.0.1:"));

  std::vector<Finished> finished;
  run_workload(*engine, rng, 40, finished);  // published before anyone listens

  zmq::context_t ctx(1);
  zmq::socket_t sub(ctx, zmq::socket_type::sub);
  sub.set(zmq::sockopt::subscribe, "");
  sub.set(zmq::sockopt::rcvtimeo, 200);
  sub.connect(engine->kv_events_endpoint());
  std::this_thread::sleep_for(std::chrono::milliseconds(200));  // the subscription reaches the publisher

  run_workload(*engine, rng, 400, finished);
  REQUIRE(engine->flush_kv_events(std::chrono::seconds(10)).ok());

  // Live batches, as the subscriber got them.
  std::map<std::uint64_t, std::string> live;
  for (;;) {
    zmq::message_t topic, seq, payload;
    if (!sub.recv(topic)) break;
    REQUIRE(sub.recv(seq));
    REQUIRE(sub.recv(payload));
    CHECK(topic.size() == 0);
    live.emplace(be64(seq), payload.to_string());
  }
  REQUIRE(!live.empty());
  // What it missed (it joined late), then the rest live: one picture.
  const auto missed = replay(ctx, engine->kv_events_replay_endpoint(), 0);
  REQUIRE(!missed.empty());
  Picture picture;
  for (const auto& [seq, payload] : missed) {
    if (seq >= live.begin()->first) break;
    picture.apply(seq, payload);
  }
  for (const auto& [seq, payload] : live) picture.apply(seq, payload);
  // Replay sends the very bytes that went out live.
  for (const auto& [seq, payload] : missed) {
    if (live.count(seq)) CHECK(live.at(seq) == payload);
  }
  const clm::EngineMetrics m = engine->metrics();
  CHECK(m.kv_events.enabled);
  CHECK(m.kv_events.dropped_events == 0);
  CHECK(m.kv_events.published_events == picture.events);
  CHECK(m.kv_events.next_sequence == picture.next_seq);
  CHECK(m.kv_events.replay_requests == 1);
  // The run did what it is meant to exercise.
  CHECK(m.cache.evictions > 0);
  CHECK(m.tiers.backed_up_pages > 0);
  CHECK(m.tiers.loaded_pages > 0);

  const auto gpu = engine_blocks(*engine, clm::KvMedium::gpu), cpu = engine_blocks(*engine, clm::KvMedium::cpu);
  CHECK(picture.gpu == gpu);
  CHECK(picture.cpu == cpu);
  CHECK(!gpu.empty());
  CHECK(!cpu.empty());
  // Every block is a page of a prompt the workload finished, by an independent chain.
  const auto reference = reference_hashes(finished);
  for (std::uint64_t h : gpu) CHECK(reference.count(h) == 1);
  for (std::uint64_t h : cpu) CHECK(reference.count(h) == 1);
}

TEST_CASE("KV events: a full queue drops, counts, and resyncs so the picture is right again", "[events][threads]") {
  const std::uint32_t seed = clm_test::fresh_seed();
  INFO("seed " << seed);
  std::mt19937 rng(seed);
  clm::EngineConfig config = events_config();
  config.kv_events.queue_events = 8;  // a batch's worth, sent only every second: it overflows
  config.kv_events.max_batch_events = 8;
  config.kv_events.batch_interval_ms = 1000;
  config.kv_events.buffer_batches = 100000;
  std::unique_ptr<clm::Engine> engine;
  REQUIRE(clm::Engine::create(config, engine).ok());
  std::vector<Finished> finished;
  run_workload(*engine, rng, 300, finished);
  REQUIRE(engine->flush_kv_events(std::chrono::seconds(20)).ok());
  const clm::EngineMetrics m = engine->metrics();
  CHECK(m.kv_events.dropped_events > 0);
  CHECK(m.kv_events.resyncs > 0);
  zmq::context_t ctx(1);
  Picture picture;
  for (const auto& [seq, payload] : replay(ctx, engine->kv_events_replay_endpoint(), 0)) picture.apply(seq, payload);
  CHECK(picture.gpu == engine_blocks(*engine, clm::KvMedium::gpu));
  CHECK(picture.cpu == engine_blocks(*engine, clm::KvMedium::cpu));
}

TEST_CASE("KV events: a host's sink gets every batch in order, on one thread of its own, and no socket opens",
          "[events][threads]") {
  const std::uint32_t seed = clm_test::fresh_seed();
  INFO("seed " << seed);
  std::mt19937 rng(seed);
  clm::EngineConfig config = events_config();
  config.kv_events.replay_endpoint.clear();
  config.kv_events.endpoint = "tcp://not-a-host-anyone-binds:1";  // unused with a sink
  std::mutex mutex;
  std::vector<clm::KvEventBatch> batches;
  std::set<std::thread::id> threads;
  std::vector<std::uint64_t> sequences;
  config.kv_events.sink = [&](std::uint64_t sequence, const clm::KvEventBatch& batch) {
    std::lock_guard lock(mutex);
    sequences.push_back(sequence);
    batches.push_back(batch);
    threads.insert(std::this_thread::get_id());
  };
  std::unique_ptr<clm::Engine> engine;
  const clm::Status created = clm::Engine::create(config, engine);
  INFO(created.message());
  REQUIRE(created.ok());
  CHECK(engine->kv_events_endpoint().empty());
  std::vector<Finished> finished;
  run_workload(*engine, rng, 100, finished);
  // Every event so far sent and handed back: the next ones reuse their storage.
  REQUIRE(engine->flush_kv_events(std::chrono::seconds(10)).ok());
  run_workload(*engine, rng, 200, finished);
  REQUIRE(engine->flush_kv_events(std::chrono::seconds(10)).ok());
  std::lock_guard lock(mutex);
  REQUIRE(!batches.empty());
  CHECK(threads.size() == 1);
  CHECK(threads.count(std::this_thread::get_id()) == 0);
  for (std::size_t i = 0; i < sequences.size(); ++i) REQUIRE(sequences[i] == i);
  for (const clm::KvEventBatch& b : batches) CHECK_FALSE(b.events.empty());  // no empty batch is numbered
  // Events reuse the storage of sent ones (KvEventRecorder::recycle): none
  // carries what an earlier event held.
  for (const clm::KvEventBatch& b : batches) {
    for (const clm::KvEvent& e : b.events) {
      if (e.kind == clm::KvEventKind::block_stored) {
        CHECK(e.token_ids.size() == e.block_hashes.size() * kPageSize);
        CHECK((e.extra_key.empty() || e.extra_key.size() == 37));
      } else {
        CHECK(e.token_ids.empty());
        CHECK(!e.parent_block_hash);
        CHECK(e.extra_key.empty());
        CHECK(!e.lora_id);
        CHECK(e.block_size == 0);
      }
    }
  }
  // The batches, encoded as a socket would carry them, give the engine's picture.
  Picture picture;
  for (std::size_t i = 0; i < batches.size(); ++i) {
    std::string payload;
    REQUIRE(clm::encode_kv_event_batch(batches[i], clm::KvEventLayout::array, payload).ok());
    picture.apply(i, payload);
  }
  CHECK(picture.gpu == engine_blocks(*engine, clm::KvMedium::gpu));
  CHECK(picture.cpu == engine_blocks(*engine, clm::KvMedium::cpu));
  CHECK(engine->metrics().kv_events.published_batches == batches.size());
  // A sink with a replay socket is refused: replay is the host's bus's.
  clm::EngineConfig both = config;
  both.kv_events.replay_endpoint = "tcp://127.0.0.1:*";
  std::unique_ptr<clm::Engine> refused;
  CHECK(clm::Engine::create(both, refused).code() == clm::StatusCode::invalid_argument);
}

TEST_CASE("KV events: with token ids left out the stream carries none and still gives the engine's picture",
          "[events]") {
  const std::uint32_t seed = clm_test::fresh_seed();
  INFO("seed " << seed);
  std::mt19937 rng(seed);
  clm::EngineConfig config = events_config();
  config.kv_events.token_ids = false;
  std::unique_ptr<clm::Engine> engine;
  REQUIRE(clm::Engine::create(config, engine).ok());
  zmq::context_t ctx(1);
  std::vector<Finished> finished;
  run_workload(*engine, rng, 200, finished);
  REQUIRE(engine->flush_kv_events(std::chrono::seconds(10)).ok());
  Picture picture;
  picture.token_ids = false;
  for (const auto& [seq, payload] : replay(ctx, engine->kv_events_replay_endpoint(), 0)) picture.apply(seq, payload);
  CHECK(picture.events > 1);
  CHECK(picture.gpu == engine_blocks(*engine, clm::KvMedium::gpu));
  CHECK(picture.cpu == engine_blocks(*engine, clm::KvMedium::cpu));
  // The hashes do not depend on whether ids are sent.
  const auto reference = reference_hashes(finished);
  for (std::uint64_t h : picture.gpu) CHECK(reference.count(h) == 1);
}

TEST_CASE("KV events: malformed and future replay requests get the end marker and are counted", "[events]") {
  std::unique_ptr<clm::Engine> engine;
  REQUIRE(clm::Engine::create(events_config(), engine).ok());
  REQUIRE(engine->flush_kv_events(std::chrono::seconds(5)).ok());  // AllBlocksCleared went out: seq 0
  zmq::context_t ctx(1);
  CHECK(replay(ctx, engine->kv_events_replay_endpoint(), 0, "short").empty());
  CHECK(replay(ctx, engine->kv_events_replay_endpoint(), 1000000).empty());  // from the future: nothing
  const auto all = replay(ctx, engine->kv_events_replay_endpoint(), 0);
  REQUIRE(all.size() == 1);
  clm::KvEventBatch batch;
  REQUIRE(clm::decode_kv_event_batch(all[0].second, batch).ok());
  REQUIRE(batch.events.size() == 1);
  CHECK(batch.events[0].kind == clm::KvEventKind::all_blocks_cleared);  // a new instance holds nothing
  const clm::EngineMetrics m = engine->metrics();
  CHECK(m.kv_events.replay_refused == 1);
  CHECK(m.kv_events.replay_requests == 2);
}

TEST_CASE("KV events: configurations that cannot work are refused with a clear status", "[events]") {
  std::unique_ptr<clm::Engine> first;
  clm::EngineConfig config = events_config();
  config.kv_events.replay_endpoint.clear();
  REQUIRE(clm::Engine::create(config, first).ok());
  // The same port again: cannot bind.
  config.kv_events.endpoint = first->kv_events_endpoint();
  std::unique_ptr<clm::Engine> second;
  clm::Status s = clm::Engine::create(config, second);
  CHECK(s.code() == clm::StatusCode::io_error);
  CHECK(s.message().find(first->kv_events_endpoint()) != std::string::npos);
  CHECK(second == nullptr);

  const auto refused = [](clm::EngineConfig c, const char* what) {
    std::unique_ptr<clm::Engine> e;
    const clm::Status st = clm::Engine::create(c, e);
    INFO(what << ": " << st.message());
    CHECK(st.code() == clm::StatusCode::invalid_argument);
    CHECK(e == nullptr);
  };
  clm::EngineConfig c = events_config();
  c.model_id.clear();
  refused(c, "no model id");
  c = events_config();
  c.kv_events.topic.assign(clm::KvEventsConfig::kMaxTopicBytes + 1, 't');
  refused(c, "topic over the limit");
  c = events_config();
  c.kv_events.endpoint = "tcp://no-port-here";
  refused(c, "malformed endpoint");
  c = events_config();
  c.kv_events.max_batch_events = 0;
  refused(c, "empty batches");
  c = events_config();
  c.kv_events.queue_events = 4;
  c.kv_events.max_batch_events = 8;
  refused(c, "a queue smaller than a batch");

  // Off: nothing recorded, and the calls say so.
  c = events_config();
  c.kv_events.enabled = false;
  std::unique_ptr<clm::Engine> off;
  REQUIRE(clm::Engine::create(c, off).ok());
  std::vector<std::uint64_t> blocks;
  CHECK(off->kv_event_blocks(clm::KvMedium::gpu, blocks).code() == clm::StatusCode::failed_precondition);
  CHECK(!off->metrics().kv_events.enabled);
  CHECK(off->kv_events_endpoint().empty());
}

TEST_CASE("KV events: the recorder hands out every event once, in order, across partial takes, drops and resyncs",
          "[events]") {
  // The recorder alone on a bare tree, taken from by hand: batches of random sizes, as events or as views, while
  // the tree keeps changing, a queue small enough to overflow, and a resync at a random later moment (as the
  // publisher's thread would). The picture built from what was handed out must equal cached_blocks whenever
  // nothing is queued or lost, and every recorded event is handed out or counted dropped, exactly once.
  const std::uint32_t seed = clm_test::fresh_seed();
  INFO("seed " << seed);
  std::mt19937 rng(seed);
  clm::PagedKvPoolConfig pc;
  pc.num_pages = 40;
  pc.page_size = kPageSize;
  pc.memory = clm::MemoryKind::none;
  std::unique_ptr<clm::PagedKvPool> pool;
  REQUIRE(clm::PagedKvPool::create(pc, pool).ok());
  clm::RadixTree tree(*pool);
  clm::PageSeal seal;
  REQUIRE(clm::PageSeal::create(kModel, {}, seal).ok());
  const std::size_t capacity = 12 + rng() % 40;
  clm::KvEventRecorder recorder(kPageSize, seal.key_scope(), capacity);
  tree.set_observer(&recorder);
  recorder.record_cleared();

  std::set<std::uint64_t> picture;
  std::uint64_t handed_out = 0;
  // Applies one event: a set of hashes, a parent known before its child, a removed block present.
  auto apply = [&](clm::KvEventKind kind, std::span<const std::uint64_t> hashes, std::optional<std::uint64_t> parent,
                   std::size_t tokens) {
    ++handed_out;
    if (kind == clm::KvEventKind::all_blocks_cleared) {
      picture.clear();
      return;
    }
    if (kind == clm::KvEventKind::block_removed) {
      for (std::uint64_t h : hashes) CHECK(picture.erase(h) == 1);
      return;
    }
    CHECK(tokens == hashes.size() * kPageSize);
    if (parent) CHECK(picture.count(*parent) == 1);
    for (std::uint64_t h : hashes) CHECK(picture.insert(h).second);
  };
  std::vector<clm::KvEvent> events;
  std::vector<clm::KvEventView> views;
  auto take_some = [&](std::size_t max) {
    if (rng() % 2) {
      const std::size_t n = recorder.take(events, max);
      REQUIRE(n == events.size());
      for (const clm::KvEvent& e : events) apply(e.kind, e.block_hashes, e.parent_block_hash, e.token_ids.size());
      return n;
    }
    const std::size_t n = recorder.take_views(views, max);
    REQUIRE(n == views.size());
    for (const clm::KvEventView& v : views) apply(v.kind, v.block_hashes, v.parent_block_hash, v.token_ids.size());
    return n;
  };
  auto blocks = [&] {
    std::vector<std::uint64_t> out;
    REQUIRE(recorder.cached_blocks(tree, clm::KvMedium::gpu, out).ok());
    return std::set<std::uint64_t>(out.begin(), out.end());
  };

  std::vector<Tokens> prefixes(5);
  for (auto& p : prefixes) p = clm_test::random_tokens(rng, kPageSize * (1 + rng() % 4), 1000);
  int resync_in = -1;  // steps until the "publisher" resyncs, once one is needed
  int checked = 0;
  for (int step = 0; step < 4000; ++step) {
    const auto op = rng() % 10;
    if (op < 6) {
      Tokens prompt = prefixes[rng() % prefixes.size()];
      const Tokens tail = clm_test::random_tokens(rng, kPageSize * (rng() % 4), 50);  // short alphabet: shared turns
      prompt.insert(prompt.end(), tail.begin(), tail.end());
      std::vector<std::int32_t> pages(prompt.size() / kPageSize);
      REQUIRE(tree.allocate_pages(pages).ok());
      clm::InsertOutcome out;
      const clm::CacheNamespace ns{.salt = rng() % 3 == 0 ? "tenant-b" : ""};
      REQUIRE(tree.insert(prompt, pages, ns, out).ok());
    } else if (op < 7) {
      REQUIRE(tree.evict(kPageSize * (1 + rng() % 8)).ok());
    } else if (step % 500 < 300 || step % 500 >= 450) {  // between, no taker: the queue overflows for sure
      take_some(1 + rng() % 20);
    }
    if (recorder.resync_needed() && resync_in < 0) resync_in = static_cast<int>(rng() % 30);
    if (resync_in >= 0 && resync_in-- == 0) recorder.resync(tree);
    if (step % 500 == 499 || step == 3999) {
      // Drain: resync if needed, take all, and compare.
      if (recorder.resync_needed()) recorder.resync(tree);
      resync_in = -1;
      while (recorder.queued() > 0) take_some(1 + rng() % 20);
      REQUIRE_FALSE(recorder.resync_needed());
      CHECK(picture == blocks());
      CHECK(recorder.recorded_events() == handed_out + recorder.dropped_events());
      ++checked;
    }
  }
  CHECK(checked == 8);
  CHECK(recorder.dropped_events() > 0);  // the queue did overflow: the drop paths ran
  CHECK(recorder.resyncs() > 0);
}
