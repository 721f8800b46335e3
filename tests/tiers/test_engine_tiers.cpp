// The tiered KV cache through the Engine: host tier (L2) write policies and
// load-back, storage (L3) on a directory and on a real redis-server, sharing
// across two processes, tenant isolation, and failures.
//
// The reference for every KV byte (tests/kv_reference.hpp): the "model" the
// test plays writes, for token t of a prompt under tenant T, rows that are a
// hash of (T, tokens [0, t]) (every layer, K and V). Whatever tier a cached
// page comes back from, its rows must be exactly those of the prompt admitting
// it: a page of another prefix, another tenant, a half-written or stale page
// fails here.
#include <catch2/catch.hpp>

#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <random>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "child_process.hpp"
#include "clm/detail/fast_checksum.hpp"
#include "clm/engine.hpp"
#include "clm/tiers/page_file.hpp"
#include "kv_reference.hpp"
#include "store/store_test_support.hpp"  // TempDir
#include "test_random.hpp"
#include "test_support.hpp"
#include "tiers/redis_server.hpp"

namespace {

using clm::Admission;
using clm::Engine;
using clm::EngineConfig;
using clm_test::random_tokens;

constexpr std::int32_t kPage = 4;
constexpr std::int32_t kVocab = 30000;  // prompts' ids are in [0, kVocab)

EngineConfig small_config(std::int32_t device_pages, std::int32_t host_pages) {
  EngineConfig c;
  c.pool.num_pages = device_pages;
  c.pool.page_size = kPage;
  c.pool.num_layers = 2;
  c.pool.kv_heads = 1;
  c.pool.head_dim = 8;
  c.pool.dtype = clm::KvDType::f32;
  c.tiers.host_pages = host_pages;
  c.model_id = "test-model";              // what stored pages are keyed and sealed under (a storage tier needs one)
  c.tiers.admission_deadline_ms = 60000;  // wait_complete waits for all of it, however slow the machine (ASan)
  return c;
}

float* row(const clm::PagedKvPool& pool, std::int64_t slot, int layer, int kv) {
  const std::int32_t page = static_cast<std::int32_t>(slot / kPage);
  const auto t = static_cast<std::size_t>(slot % kPage);
  auto* base = static_cast<float*>(kv == 0 ? pool.k_data(page, layer) : pool.v_data(page, layer));
  return base + t * static_cast<std::size_t>(pool.config().kv_heads * pool.config().head_dim);
}

// The host's side (tests/kv_reference.hpp over the Engine's pool): writes the
// K/V of the new tokens, and counts the cached tokens whose rows differ from
// the reference (0 is right).
void write_rows(const Engine& engine, std::string_view salt, std::span<const std::int32_t> prompt, const Admission& a) {
  const clm::PagedKvPool& pool = engine.pool();
  clm_test::write_reference_rows([&](std::int64_t slot, int layer, int kv) { return row(pool, slot, layer, kv); },
                                 pool.config().num_layers, pool.config().kv_heads * pool.config().head_dim, salt,
                                 prompt, static_cast<std::size_t>(a.cached_tokens), a.slots);
}

int wrong_cached_rows(const Engine& engine, std::string_view salt, std::span<const std::int32_t> prompt,
                      const Admission& a) {
  const clm::PagedKvPool& pool = engine.pool();
  return clm_test::wrong_reference_rows(
      [&](std::int64_t slot, int layer, int kv) { return row(pool, slot, layer, kv); }, pool.config().num_layers,
      pool.config().kv_heads * pool.config().head_dim, salt, prompt, a.page_table, kPage, a.cached_tokens);
}

// One request: admit, check what was cached, compute the rest, finish.
Admission serve(Engine& engine, std::string_view salt, std::span<const std::int32_t> prompt) {
  Admission a;
  const clm::Status s = engine.admit(prompt, {.cache_salt = salt}, a);
  INFO(s.message());
  if (!s.ok()) {
    engine.wait_for_tiers();
    INFO("after the tiers' jobs: protected " << engine.metrics().cache.protected_tokens);
    CHECK(false);
  }
  REQUIRE(s.ok());
  REQUIRE(wrong_cached_rows(engine, salt, prompt, a) == 0);
  REQUIRE(a.storage_tokens <= a.host_tokens);
  REQUIRE(a.host_tokens <= a.cached_tokens);
  write_rows(engine, salt, prompt, a);
  REQUIRE(engine.finish(a.seq).ok());
  return a;
}

std::unique_ptr<Engine> make_engine(const EngineConfig& c) {
  std::unique_ptr<Engine> e;
  const clm::Status s = Engine::create(c, e);
  INFO(s.message());
  REQUIRE(s.ok());
  return e;
}

// Conversations over shared system prompts, more than the device tier holds.
struct Workload {
  std::vector<std::vector<std::int32_t>> prompts;
  explicit Workload(std::uint64_t seed, int systems = 6, int requests = 400) {
    std::mt19937_64 rng(seed);
    std::vector<std::vector<std::int32_t>> system;
    for (int i = 0; i < systems; ++i) system.push_back(random_tokens(rng, 40 + rng() % 40, kVocab));
    std::vector<std::vector<std::int32_t>> chats;
    for (int r = 0; r < requests; ++r) {
      if (chats.empty() || rng() % 3 == 0) {
        chats.push_back(system[rng() % system.size()]);
      }
      std::vector<std::int32_t>& chat = chats[rng() % chats.size()];
      if (chat.size() > 150) chat = system[rng() % system.size()];  // a new conversation: a request fits the device
      const std::vector<std::int32_t> turn = random_tokens(rng, 5 + rng() % 20, kVocab);
      chat.insert(chat.end(), turn.begin(), turn.end());
      prompts.push_back(chat);
    }
  }
};

// Each request waits for the tiers' jobs before the next (as the replay
// does), so the run is a function of the workload: no copy races a request.
double run_hit_rate(const EngineConfig& c, const Workload& w, clm::EngineMetrics* metrics = nullptr) {
  auto engine = make_engine(c);
  std::uint64_t cached = 0, total = 0;
  for (const auto& p : w.prompts) {
    const Admission a = serve(*engine, "", p);
    cached += static_cast<std::uint64_t>(a.cached_tokens);
    total += p.size();
    engine->wait_for_tiers();
    REQUIRE(engine->check_invariants().ok());
  }
  if (metrics) *metrics = engine->metrics();
  return static_cast<double>(cached) / static_cast<double>(total);
}

}  // namespace

TEST_CASE("host tier: every policy serves exact pages and beats the device tier alone", "[tiers]") {
  const std::uint64_t seed = clm_test::fresh_seed();
  INFO("seed " << seed);
  const Workload w(seed);
  EngineConfig device_only = small_config(64, 0);
  const double alone = run_hit_rate(device_only, w);
  for (const clm::WritePolicy policy :
       {clm::WritePolicy::write_through, clm::WritePolicy::write_through_selective, clm::WritePolicy::write_back}) {
    EngineConfig c = small_config(64, 256);
    c.tiers.write_policy = policy;
    clm::EngineMetrics m, again;
    const double tiered = run_hit_rate(c, w, &m);
    INFO("policy " << static_cast<int>(policy) << ": hit rate " << tiered << " vs " << alone << " on the device alone");
    CHECK(tiered > alone);
    // Deterministic: a second run of the same workload gives the same numbers, exactly.
    CHECK(run_hit_rate(c, w, &again) == tiered);
    CHECK(again.tiers.host_hit_tokens == m.tiers.host_hit_tokens);
    CHECK(again.tiers.loaded_pages == m.tiers.loaded_pages);
    CHECK(again.tiers.backed_up_pages == m.tiers.backed_up_pages);
    CHECK(again.cache.evicted_tokens == m.cache.evicted_tokens);
    CHECK(m.has_tiers);
    CHECK(m.tiers.host_hit_tokens > 0);
    CHECK(m.tiers.loaded_pages * kPage == m.tiers.host_hit_tokens);
    CHECK(m.tiers.backed_up_pages > 0);
    CHECK(m.cache.host_cached_tokens > 0);
    CHECK(m.tiers.storage_hit_tokens == 0);
  }
}

TEST_CASE("host tier: concurrent requests keep every page exact", "[tiers][threads]") {
  const std::uint64_t seed = clm_test::fresh_seed();
  INFO("seed " << seed);
  EngineConfig c = small_config(96, 192);
  c.tiers.write_policy = clm::WritePolicy::write_through;
  auto engine = make_engine(c);
  const Workload w(seed, 4, 1200);
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (std::size_t i = static_cast<std::size_t>(t); i < w.prompts.size(); i += 4) {
        const auto& p = w.prompts[i];
        Admission a;
        if (!engine->admit(p, {}, a).ok()) continue;  // a full pool may refuse
        if (wrong_cached_rows(*engine, "", p, a) != 0) ++failures;
        write_rows(*engine, "", p, a);
        if (!engine->finish(a.seq).ok()) ++failures;
      }
    });
  }
  for (auto& t : threads) t.join();
  engine->wait_for_tiers();
  CHECK(failures == 0);
  REQUIRE(engine->check_invariants().ok());
  CHECK(engine->metrics().tiers.host_hit_tokens > 0);
}

TEST_CASE("host tier: a decode step waits for the copies to the host that hold its pages, as admit does", "[tiers]") {
  // 10 device pages. X (4 pages) is cached, B (4 pages) runs. A = X + 2 pages
  // hits X, which starts a write-through copy of X: the copy locks X's pages
  // while it reads them. A is aborted (2 pages free again) and B grows by 3
  // pages: the third can only come from X, once its copy is done. Each trial
  // races the copy worker, which has just been woken: without the wait the
  // extend fails whenever it gets there first.
  const std::uint64_t seed = clm_test::fresh_seed();
  INFO("seed " << seed);
  std::mt19937_64 rng(seed);
  for (int trial = 0; trial < 20; ++trial) {
    INFO("trial " << trial);
    EngineConfig c = small_config(10, 64);
    c.tiers.write_policy = clm::WritePolicy::write_through;
    auto engine = make_engine(c);
    const std::vector<std::int32_t> x = random_tokens(rng, 4 * kPage, kVocab);
    serve(*engine, "", x);  // no hit, so no copy yet: X is on the device only
    const std::vector<std::int32_t> b_prompt = random_tokens(rng, 4 * kPage, kVocab);
    Admission b;
    REQUIRE(engine->admit(b_prompt, {}, b).ok());
    write_rows(*engine, "", b_prompt, b);
    std::vector<std::int32_t> a_prompt = x;
    const std::vector<std::int32_t> a_turn = random_tokens(rng, 2 * kPage, kVocab);
    a_prompt.insert(a_prompt.end(), a_turn.begin(), a_turn.end());
    Admission a;
    REQUIRE(engine->admit(a_prompt, {}, a).ok());
    REQUIRE(a.cached_tokens == 4 * kPage);
    REQUIRE(engine->pool().free_pages() == 0);
    REQUIRE(engine->abort(a.seq).ok());

    const std::vector<std::int32_t> decoded = random_tokens(rng, 3 * kPage, kVocab);
    std::vector<std::int64_t> slots;
    std::vector<std::int32_t> table;
    const clm::Status grown = engine->extend(b.seq, decoded, slots, &table);
    INFO(grown.message());
    REQUIRE(grown.ok());
    CHECK(slots.size() == decoded.size());
    CHECK(table.size() == 7);
    engine->wait_for_tiers();
    REQUIRE(engine->check_invariants().ok());
    const clm::EngineMetrics m = engine->metrics();
    CHECK(m.tiers.backed_up_pages == 4);             // X's copy ran
    CHECK(m.cache.host_cached_tokens == 4 * kPage);  // and X stays on the host
    REQUIRE(engine->finish(b.seq).ok());
  }
}

TEST_CASE("storage tier: a directory shared by two engines gives the second the first's pages", "[tiers]") {
  clm_test::TempDir dir;
  const std::uint64_t seed = clm_test::fresh_seed();
  INFO("seed " << seed);
  std::mt19937_64 rng(seed);
  const std::vector<std::int32_t> prompt = random_tokens(rng, 203, kVocab);
  EngineConfig c = small_config(128, 128);
  c.tiers.write_policy = clm::WritePolicy::write_through;
  c.tiers.storage_url = "file://" + dir.str();
  c.tiers.prefetch_policy = clm::PrefetchPolicy::wait_complete;
  {
    auto first = make_engine(c);
    serve(*first, "t", prompt);
    serve(*first, "t", prompt);  // the hit: a host copy, then storage
    first->wait_for_tiers();
    CHECK(first->metrics().tiers.stored_pages == 202 / kPage);
  }
  auto second = make_engine(c);
  const Admission a = serve(*second, "t", prompt);
  CHECK(a.cached_tokens == 202 / kPage * kPage);
  CHECK(a.storage_tokens == a.cached_tokens);
  const clm::EngineMetrics m = second->metrics();
  CHECK(m.tiers.fetched_pages == 202 / kPage);
  CHECK(m.tiers.storage_hit_tokens == static_cast<std::uint64_t>(a.cached_tokens));
  // Another tenant, and the same tenant under another adapter, get nothing.
  Admission other;
  REQUIRE(second->admit(prompt, {.cache_salt = "t2"}, other).ok());
  CHECK(other.cached_tokens == 0);
  REQUIRE(second->abort(other.seq).ok());
  REQUIRE(second->admit(prompt, {.cache_salt = "t", .adapter_id = 3}, other).ok());
  CHECK(other.cached_tokens == 0);
  REQUIRE(second->abort(other.seq).ok());
}

TEST_CASE("storage tier: a damaged stored page is never loaded, and the pages before it are", "[tiers]") {
  clm_test::TempDir dir;
  const std::uint64_t seed = clm_test::fresh_seed();
  INFO("seed " << seed);
  std::mt19937_64 rng(seed);
  const std::vector<std::int32_t> prompt = random_tokens(rng, 81, kVocab);  // 20 whole pages
  EngineConfig c = small_config(64, 64);
  c.tiers.write_policy = clm::WritePolicy::write_through;
  c.tiers.storage_url = "file://" + dir.str();
  c.tiers.prefetch_policy = clm::PrefetchPolicy::wait_complete;
  {
    auto first = make_engine(c);
    serve(*first, "t", prompt);
    serve(*first, "t", prompt);
    first->wait_for_tiers();
    REQUIRE(first->metrics().tiers.stored_pages == 20);
  }
  // Page 12's file: flip one payload byte (the key says which file it is).
  std::vector<clm::PageKey> keys(20);
  clm::PageSeal seal;
  REQUIRE(clm::PageSeal::create(c.model_id, "", seal).ok());
  REQUIRE(clm::chain_page_keys(clm::PageKey::root(), prompt, kPage, {"t", 0, seal.key_scope()}, keys).ok());
  const std::string hex = keys[12].hex();
  std::filesystem::path victim;
  for (const auto& entry : std::filesystem::recursive_directory_iterator(dir.path())) {
    if (entry.is_regular_file() && entry.path().filename().string().find(hex) != std::string::npos)
      victim = entry.path();
  }
  REQUIRE_FALSE(victim.empty());
  {
    std::fstream f(victim, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(-5, std::ios::end);
    char byte = 0;
    f.read(&byte, 1);
    f.seekp(-5, std::ios::end);
    byte = static_cast<char>(byte ^ 0x40);
    f.write(&byte, 1);
  }
  auto second = make_engine(c);
  const Admission a = serve(*second, "t", prompt);  // every cached row checked against the reference
  CHECK(a.cached_tokens == 12 * kPage);
  CHECK(a.storage_tokens == 12 * kPage);
  CHECK(second->metrics().tiers.storage.corrupt_pages == 1);
}

TEST_CASE("storage tier: each turn of a conversation checks and stores its own pages, not its history", "[tiers]") {
  clm_test::TempDir dir;
  const std::uint64_t seed = clm_test::fresh_seed();
  INFO("seed " << seed);
  std::mt19937_64 rng(seed);
  EngineConfig c = small_config(256, 256);
  c.tiers.storage_url = "file://" + dir.str();
  c.tiers.prefetch_policy = clm::PrefetchPolicy::wait_complete;
  c.tiers.write_policy = clm::WritePolicy::write_through;
  auto engine = make_engine(c);
  std::vector<std::int32_t> conversation = random_tokens(rng, 3 * kPage, kVocab);
  std::uint64_t checked_before = 0, most_checked = 0;
  constexpr int kTurns = 40;
  for (int turn = 1; turn <= kTurns; ++turn) {
    const std::vector<std::int32_t> more = random_tokens(rng, 3 * kPage, kVocab);  // 3 pages a turn
    conversation.insert(conversation.end(), more.begin(), more.end());
    serve(*engine, "t", std::span(conversation).first(conversation.size() - 1));
    engine->wait_for_tiers();
    const std::uint64_t checked = engine->metrics().tiers.storage.pages_checked;
    INFO("turn " << turn << ": " << checked - checked_before << " pages checked");
    if (turn > 2) most_checked = std::max(most_checked, checked - checked_before);
    checked_before = checked;
  }
  // A turn's store asks storage about the turn's own pages, and its fetch about the few past the host copies:
  // a constant, where the whole path (3 pages a turn, 120 at the end) was checked before.
  CHECK(most_checked <= 12);
  const clm::TierMetrics m = engine->metrics().tiers;
  CHECK(m.stored_pages >= static_cast<std::uint64_t>(3 * (kTurns - 1)));
  CHECK(m.storage_errors == 0);
  // Every page is there: a fresh instance fetches the whole conversation but its last turn.
  auto fresh = make_engine(c);
  const std::span<const std::int32_t> all = std::span(conversation).first(conversation.size() - 1);
  const Admission a = serve(*fresh, "t", all);
  CHECK(a.storage_tokens >= (3 * kTurns - 1) * kPage);  // all but the last turn: stored when a hit copies it
  // Another instance follows the conversation turn by turn: each fetch reads the turn's new pages, its keys
  // chained from the last page it fetched before (every cached row is checked against the reference).
  auto follower = make_engine(c);
  std::uint64_t follower_checked = 0, follower_most = 0;
  for (int turn = 1; turn < kTurns; ++turn) {
    const auto length = static_cast<std::size_t>((3 + 3 * turn) * kPage - 1);
    const Admission f = serve(*follower, "t", std::span(conversation).first(length));
    follower->wait_for_tiers();
    INFO("follower turn " << turn);
    CHECK(f.storage_tokens == (turn == 1 ? 5 : 3) * kPage);
    const std::uint64_t checked = follower->metrics().tiers.storage.pages_checked;
    follower_most = std::max(follower_most, checked - follower_checked);
    follower_checked = checked;
  }
  CHECK(follower_most <= 12);
}

TEST_CASE("storage tier: a prefix still on the device is not read from storage again (write_back)", "[tiers]") {
  clm_test::TempDir dir;
  const std::uint64_t seed = clm_test::fresh_seed();
  INFO("seed " << seed);
  std::mt19937_64 rng(seed);
  const std::vector<std::int32_t> turn1 = random_tokens(rng, 4 * 12 + 1, kVocab);  // 12 whole pages
  std::vector<std::int32_t> turn2 = turn1;
  const std::vector<std::int32_t> more = random_tokens(rng, 4 * 6, kVocab);
  turn2.insert(turn2.end(), more.begin(), more.end());
  EngineConfig c = small_config(64, 64);
  c.tiers.storage_url = "file://" + dir.str();
  c.tiers.prefetch_policy = clm::PrefetchPolicy::wait_complete;
  c.tiers.write_policy = clm::WritePolicy::write_back;  // device pages get host copies only when evicted
  auto engine = make_engine(c);
  CHECK(serve(*engine, "t", turn1).cached_tokens == 0);  // computed here: on the device, no host copy
  {
    // Another instance stores turn 1's pages meanwhile.
    EngineConfig w = c;
    w.tiers.write_policy = clm::WritePolicy::write_through;
    auto writer = make_engine(w);
    serve(*writer, "t", turn1);
    serve(*writer, "t", turn1);
    writer->wait_for_tiers();
    REQUIRE(writer->metrics().tiers.stored_pages == 12);
  }
  // Turn 2: its first 12 pages are on this device; storage has them too, and nothing past them.
  const Admission a = serve(*engine, "t", turn2);
  CHECK(a.cached_tokens == 12 * kPage);
  CHECK(a.host_tokens == 0);
  CHECK(a.storage_tokens == 0);
  engine->wait_for_tiers();
  const clm::TierMetrics m = engine->metrics().tiers;
  CHECK(m.storage.pages_read == 0);
  CHECK(m.storage.bytes_read == 0);
  CHECK(m.fetched_pages == 0);
  REQUIRE(engine->check_invariants().ok());
}

TEST_CASE("storage tier: another model's pages are never served, the same model's always are", "[tiers]") {
  clm_test::TempDir dir;
  const std::uint64_t seed = clm_test::fresh_seed();
  INFO("seed " << seed);
  std::mt19937_64 rng(seed);
  const std::vector<std::int32_t> prompt = random_tokens(rng, 4 * 30 + 1, kVocab);  // 30 whole pages
  EngineConfig c = small_config(64, 64);
  c.tiers.storage_url = "file://" + dir.str();
  c.tiers.prefetch_policy = clm::PrefetchPolicy::wait_complete;
  c.model_id = "llama-A@sha256:0001";
  {
    auto writer = make_engine(c);
    serve(*writer, "t", prompt);
    serve(*writer, "t", prompt);
    writer->wait_for_tiers();
    REQUIRE(writer->metrics().tiers.stored_pages == 30);
  }
  // The same layout, tenant, adapter and prompt, another model (weights swapped in place: a new id).
  EngineConfig other = c;
  other.model_id = "llama-A@sha256:0002";
  auto stranger = make_engine(other);
  const Admission none = serve(*stranger, "t", prompt);
  CHECK(none.cached_tokens == 0);
  CHECK(none.storage_tokens == 0);
  CHECK(stranger->metrics().tiers.storage_hit_tokens == 0);
  CHECK(stranger->metrics().tiers.fetched_pages == 0);
  stranger.reset();
  auto same = make_engine(c);
  const Admission all = serve(*same, "t", prompt);
  CHECK(all.storage_tokens == 30 * kPage);
  CHECK(same->metrics().tiers.storage.foreign_model_pages == 0);
}

TEST_CASE("storage tier: signed pages, and an unsigned reader, another secret and a forger get nothing", "[tiers]") {
  clm_test::TempDir dir, keys_dir("keys");
  const std::uint64_t seed = clm_test::fresh_seed();
  INFO("seed " << seed);
  std::mt19937_64 rng(seed);
  const std::vector<std::int32_t> prompt = random_tokens(rng, 4 * 20 + 3, kVocab);  // 20 whole pages
  const std::string secret = "deployment-secret-" + std::to_string(rng());
  const std::string secret_file = keys_dir.str() + "/page.key";
  { std::ofstream(secret_file) << secret << "\n"; }
  REQUIRE(::chmod(secret_file.c_str(), 0600) == 0);
  EngineConfig c = small_config(64, 64);
  c.tiers.storage_url = "file://" + dir.str();
  c.tiers.prefetch_policy = clm::PrefetchPolicy::wait_complete;
  c.tiers.page_secret_file = secret_file;
  {
    auto writer = make_engine(c);
    CHECK(writer->metrics().tiers.signed_pages);
    serve(*writer, "t", prompt);
    serve(*writer, "t", prompt);
    writer->wait_for_tiers();
    REQUIRE(writer->metrics().tiers.stored_pages == 20);
  }
  EngineConfig unsigned_reader = c;
  unsigned_reader.tiers.page_secret_file.clear();
  CHECK(serve(*make_engine(unsigned_reader), "t", prompt).storage_tokens == 0);
  EngineConfig other_secret = c;
  ::setenv("CLM_TEST_OTHER_PAGE_SECRET", "another-deployment-secret", 1);
  other_secret.tiers.page_secret_file.clear();
  other_secret.tiers.page_secret_env = "CLM_TEST_OTHER_PAGE_SECRET";
  CHECK(serve(*make_engine(other_secret), "t", prompt).storage_tokens == 0);
  ::unsetenv("CLM_TEST_OTHER_PAGE_SECRET");

  // A writer without the secret rewrites page 7's payload (with the public
  // checksum recomputed): refused as forged, deleted, and the pages before it still load.
  std::vector<clm::PageKey> keys(20);
  clm::PageSeal seal;
  REQUIRE(clm::PageSeal::create(c.model_id, secret, seal).ok());
  REQUIRE(clm::chain_page_keys(clm::PageKey::root(), prompt, kPage, {"t", 0, seal.key_scope()}, keys).ok());
  std::filesystem::path victim;
  for (const auto& entry : std::filesystem::recursive_directory_iterator(dir.path())) {
    if (entry.is_regular_file() && entry.path().filename().string() == keys[7].hex()) victim = entry.path();
  }
  REQUIRE_FALSE(victim.empty());
  std::vector<char> bytes;
  {
    std::ifstream in(victim, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  REQUIRE(bytes.size() > clm::kPageHeaderSize);
  for (std::size_t i = clm::kPageHeaderSize; i < bytes.size(); i += 5) bytes[i] = static_cast<char>(rng());
  const std::uint64_t head = clm::detail::fast_checksum(bytes.data(), clm::kPageChecksumOffset);
  const std::uint64_t sum =
      clm::detail::fast_checksum(bytes.data() + clm::kPageHeaderSize, bytes.size() - clm::kPageHeaderSize, head);
  for (int b = 0; b < 8; ++b)
    bytes[clm::kPageChecksumOffset + static_cast<std::size_t>(b)] = static_cast<char>(sum >> (8 * b));
  {
    std::ofstream out(victim, std::ios::binary | std::ios::trunc);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  }
  auto reader = make_engine(c);
  const Admission a = serve(*reader, "t", prompt);  // every cached row checked against the reference
  CHECK(a.storage_tokens == 7 * kPage);
  const clm::StorageStats st = reader->metrics().tiers.storage;
  CHECK(st.forged_pages == 1);
  CHECK(st.corrupt_pages == 1);
  CHECK(st.repaired_pages == 1);
  CHECK_FALSE(std::filesystem::exists(victim));
}

TEST_CASE("storage tier: a missing model id, or a bad page secret, is refused at create", "[tiers]") {
  clm_test::TempDir dir, keys_dir("keys");
  std::unique_ptr<Engine> e;
  EngineConfig c = small_config(16, 16);
  c.tiers.storage_url = "file://" + dir.str();
  c.model_id.clear();
  clm::Status s = Engine::create(c, e);
  CHECK(s.code() == clm::StatusCode::invalid_argument);
  CHECK_THAT(s.message(), Catch::Contains("model id"));
  c.model_id = std::string(5000, 'm');
  CHECK(Engine::create(c, e).code() == clm::StatusCode::invalid_argument);
  c.model_id = "m";
  const std::string open_file = keys_dir.str() + "/open.key";
  { std::ofstream(open_file) << "s3cret-readable-by-all-0123456789"; }
  REQUIRE(::chmod(open_file.c_str(), 0644) == 0);
  c.tiers.page_secret_file = open_file;
  s = Engine::create(c, e);
  CHECK(s.code() == clm::StatusCode::failed_precondition);
  CHECK_THAT(s.message(), !Catch::Contains("s3cret"));
  c.tiers.page_secret_file = keys_dir.str() + "/missing.key";
  CHECK(Engine::create(c, e).code() == clm::StatusCode::not_found);
  c.tiers.page_secret_env = "HOME";
  CHECK(Engine::create(c, e).code() == clm::StatusCode::invalid_argument);  // both
  EngineConfig no_storage = small_config(16, 16);
  no_storage.tiers.page_secret_env = "HOME";
  CHECK(Engine::create(no_storage, e).code() == clm::StatusCode::invalid_argument);
  no_storage.tiers.host_pages = 0;
  CHECK(Engine::create(no_storage, e).code() == clm::StatusCode::invalid_argument);
  CHECK(e == nullptr);
  // Without a storage tier a model id is not needed.
  EngineConfig host_only = small_config(16, 16);
  host_only.model_id.clear();
  CHECK(Engine::create(host_only, e).ok());
}

TEST_CASE("storage tier: two processes on one redis-server share a prefix, bit for bit", "[tiers][redis]") {
  clm_test::RedisServer redis;
  redis.start();
  const std::uint64_t seed = clm_test::fresh_seed();
  INFO("seed " << seed);
  std::mt19937_64 rng(seed);
  const std::vector<std::int32_t> prompt = random_tokens(rng, 2048 / 4 + 7, kVocab);
  EngineConfig c = small_config(256, 256);
  c.tiers.write_policy = clm::WritePolicy::write_through;
  c.tiers.storage_url = redis.url("share:");
  c.tiers.prefetch_policy = clm::PrefetchPolicy::wait_complete;
  clm_test::ChildProcess first_instance([&](int) {  // computes the prefix, and it lands in redis
    std::unique_ptr<Engine> first;
    if (!Engine::create(c, first).ok()) return 1;
    Admission a;
    for (int round = 0; round < 2; ++round) {
      if (!first->admit(prompt, {.cache_salt = "acme"}, a).ok()) break;
      write_rows(*first, "acme", prompt, a);
      (void)first->finish(a.seq);
    }
    first->wait_for_tiers();
    return first->metrics().tiers.stored_pages > 0 ? 0 : 2;
  });
  REQUIRE(first_instance.exit_code() == 0);
  auto second = make_engine(c);
  const Admission a = serve(*second, "acme", prompt);  // checks every cached row against the reference
  CHECK(a.cached_tokens == static_cast<std::int32_t>((prompt.size() - 1) / kPage * kPage));
  CHECK(a.storage_tokens == a.cached_tokens);
  // The salt is in every key: the same tokens under another tenant find nothing in redis.
  Admission other;
  REQUIRE(second->admit(prompt, {.cache_salt = "acme2"}, other).ok());
  CHECK(other.cached_tokens == 0);
  CHECK(other.storage_tokens == 0);
  REQUIRE(second->abort(other.seq).ok());
}

TEST_CASE("storage tier: redis going away falls back to recompute, and is used again when back", "[tiers][redis]") {
  clm_test::RedisServer redis;
  redis.start();
  const std::uint64_t seed = clm_test::fresh_seed();
  INFO("seed " << seed);
  std::mt19937_64 rng(seed);
  EngineConfig c = small_config(64, 64);
  c.tiers.write_policy = clm::WritePolicy::write_through;
  c.tiers.storage_url = redis.url("faults:", "timeout_ms=100");
  c.tiers.prefetch_policy = clm::PrefetchPolicy::wait_complete;
  auto engine = make_engine(c);
  redis.stop();
  const std::vector<std::int32_t> a_prompt = random_tokens(rng, 61, kVocab);
  const Admission first = serve(*engine, "x", a_prompt);  // storage down: no error, just no hit
  CHECK(first.cached_tokens == 0);
  serve(*engine, "x", a_prompt);
  engine->wait_for_tiers();
  CHECK(engine->metrics().tiers.storage_errors > 0);
  redis.restart();
  // The backend waits ~100 ms after a failed connect before it tries again.
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  const std::vector<std::int32_t> b_prompt = random_tokens(rng, 61, kVocab);
  serve(*engine, "x", b_prompt);
  serve(*engine, "x", b_prompt);  // hit: stored now that redis is back
  engine->wait_for_tiers();
  CHECK(engine->metrics().tiers.stored_pages >= 60 / kPage);
  auto fresh = make_engine(c);  // a new instance finds it there
  const Admission again = serve(*fresh, "x", b_prompt);
  CHECK(again.storage_tokens == 60 / kPage * kPage);
}

TEST_CASE("storage tier: a hung redis never holds the engine lock", "[tiers][redis]") {
  clm_test::RedisServer redis;
  redis.start();
  const std::uint64_t seed = clm_test::fresh_seed();
  INFO("seed " << seed);
  std::mt19937_64 rng(seed);
  EngineConfig c = small_config(64, 64);
  c.tiers.write_policy = clm::WritePolicy::write_through;
  c.tiers.storage_url = redis.url("hung:", "timeout_ms=1500");
  c.tiers.prefetch_policy = clm::PrefetchPolicy::wait_complete;
  auto engine = make_engine(c);
  const std::vector<std::int32_t> cached = random_tokens(rng, 41, kVocab);
  serve(*engine, "x", cached);  // on the device from now on: its admissions need no storage
  redis.pause();
  // An admission that asks storage waits for the hung server (up to the backend's timeout)...
  std::atomic<bool> waiting_done{false};
  std::thread waiting([&] {
    Admission a;
    const std::vector<std::int32_t> fresh = random_tokens(rng, 41, kVocab);
    if (engine->admit(fresh, {.cache_salt = "x"}, a).ok()) (void)engine->abort(a.seq);
    waiting_done = true;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  // ... while everything else goes on: these take the engine lock.
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < 20; ++i) {
    const Admission a = serve(*engine, "x", cached);
    CHECK(a.cached_tokens == 40);
    CHECK(engine->check_invariants().ok());
    (void)engine->metrics();
  }
  const double busy_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  CHECK_FALSE(waiting_done.load());  // the storage admission is still waiting
  CHECK(busy_ms < 500.0);
  redis.resume();
  waiting.join();
  engine->wait_for_tiers();
  REQUIRE(engine->check_invariants().ok());
}

namespace {

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// An admission of a fresh prompt (nothing cached anywhere), timed; aborted after.
double timed_fresh_admission(Engine& engine, std::mt19937_64& rng, clm::Admission& a) {
  const std::vector<std::int32_t> fresh = random_tokens(rng, 41, kVocab);
  const auto start = std::chrono::steady_clock::now();
  REQUIRE(engine.admit(fresh, {.cache_salt = "x"}, a).ok());
  const double s = seconds_since(start);
  REQUIRE(engine.abort(a.seq).ok());
  return s;
}

// Polls the engine's tier metrics until `done` holds or `seconds` pass.
template <typename Pred>
bool wait_for_metrics(Engine& engine, Pred&& done, double seconds = 10.0) {
  const auto start = std::chrono::steady_clock::now();
  while (!done(engine.metrics().tiers)) {
    if (seconds_since(start) > seconds) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return true;
}

}  // namespace

TEST_CASE("storage tier: a hung redis (SIGSTOP) holds no admission past its bound, and the breaker stops asking it",
          "[tiers][redis]") {
  clm_test::RedisServer redis;
  redis.start();
  const std::uint64_t seed = clm_test::fresh_seed();
  INFO("seed " << seed);
  std::mt19937_64 rng(seed);
  EngineConfig c = small_config(64, 64);
  // Each call to the hung server waits 1 s: longer than every bound below.
  c.tiers.storage_url = redis.url("stopped:", "timeout_ms=1000");
  c.tiers.breaker_failures = 2;
  c.tiers.breaker_open_ms = 300;
  c.tiers.admission_deadline_ms = 300;
  c.tiers.prefetch_timeout_ms = 100;
  c.tiers.prefetch_timeout_per_1k_tokens_ms = 0;
  EngineConfig best_effort = c, timeout = c, wait_complete = c;
  best_effort.tiers.prefetch_policy = clm::PrefetchPolicy::best_effort;
  timeout.tiers.prefetch_policy = clm::PrefetchPolicy::timeout;
  wait_complete.tiers.prefetch_policy = clm::PrefetchPolicy::wait_complete;
  auto e_best = make_engine(best_effort), e_timeout = make_engine(timeout), e_wait = make_engine(wait_complete);
  redis.pause();
  clm::Admission a;
  // best_effort: no wait at all.
  CHECK(timed_fresh_admission(*e_best, rng, a) < 0.2);
  CHECK(a.storage_tokens == 0);
  // timeout: its 100 ms, not the backend's second.
  const double t = timed_fresh_admission(*e_timeout, rng, a);
  CHECK(t >= 0.095);
  CHECK(t < 0.8);
  CHECK(e_timeout->metrics().tiers.prefetch_timeouts == 1);
  // wait_complete: the admission deadline (300 ms), not the backend's second.
  const double w = timed_fresh_admission(*e_wait, rng, a);
  CHECK(w >= 0.295);
  CHECK(w < 0.9);
  CHECK(e_wait->metrics().tiers.prefetch_timeouts == 1);
  // A second fetch on the other worker: two failed calls in a row open the breaker.
  (void)timed_fresh_admission(*e_wait, rng, a);
  REQUIRE(wait_for_metrics(*e_wait, [](const clm::TierMetrics& m) { return m.breaker_state == 1; }));
  const clm::TierMetrics opened = e_wait->metrics().tiers;
  CHECK(opened.breaker_trips == 1);
  CHECK(opened.storage_errors >= 2);
  // Open: storage is not asked, so a wait_complete admission does not wait.
  CHECK(timed_fresh_admission(*e_wait, rng, a) < 0.2);
  CHECK(e_wait->metrics().tiers.breaker_skips >= 1);
  CHECK(e_wait->metrics().tiers.prefetch_timeouts == 2);  // the two above, not this one
  // Back: after breaker_open_ms one call probes the server, and its success closes the breaker.
  redis.resume();
  std::this_thread::sleep_for(std::chrono::milliseconds(350));
  e_wait->wait_for_tiers();
  (void)timed_fresh_admission(*e_wait, rng, a);
  CHECK(wait_for_metrics(*e_wait, [](const clm::TierMetrics& m) { return m.breaker_state == 0; }));
  CHECK(e_wait->metrics().tiers.breaker_trips == 1);
  for (auto* e : {e_best.get(), e_timeout.get(), e_wait.get()}) {
    e->wait_for_tiers();
    REQUIRE(e->check_invariants().ok());
  }
}

TEST_CASE("storage tier: a capped fetch queue drops the oldest prefetch, and one fetch serves each prefix",
          "[tiers][redis]") {
  clm_test::RedisServer redis;
  redis.start();
  const std::uint64_t seed = clm_test::fresh_seed();
  INFO("seed " << seed);
  std::mt19937_64 rng(seed);
  EngineConfig c = small_config(64, 64);
  c.tiers.storage_url = redis.url("capped:", "timeout_ms=1500");
  c.tiers.max_queued_fetches = 4;
  c.tiers.breaker_failures = 1000;  // never opens here
  c.tiers.prefetch_policy = clm::PrefetchPolicy::best_effort;
  auto engine = make_engine(c);
  redis.pause();
  auto prompt = [&] { return random_tokens(rng, 41, kVocab); };
  // Two prefetches hang on the two storage workers...
  const std::vector<std::int32_t> running = prompt();
  REQUIRE(engine->prefetch(running, {.cache_salt = "x"}).ok());
  REQUIRE(engine->prefetch(prompt(), {.cache_salt = "x"}).ok());
  REQUIRE(wait_for_metrics(*engine, [](const clm::TierMetrics& m) { return m.queued_fetches == 0; }));
  // ... ten more fill the queue of four: the six oldest are dropped.
  std::vector<std::vector<std::int32_t>> queued;
  for (int i = 0; i < 10; ++i) {
    queued.push_back(prompt());
    REQUIRE(engine->prefetch(queued.back(), {.cache_salt = "x"}).ok());
  }
  clm::TierMetrics m = engine->metrics().tiers;
  CHECK(m.queued_fetches == 4);
  CHECK(m.dropped_fetches == 6);
  CHECK(m.merged_fetches == 0);
  // The same prefix again joins its fetch, queued or running; a longer one grows the queued fetch.
  REQUIRE(engine->prefetch(queued.back(), {.cache_salt = "x"}).ok());
  std::vector<std::int32_t> longer = queued[8];
  const std::vector<std::int32_t> tail = random_tokens(rng, 20, kVocab);
  longer.insert(longer.end(), tail.begin(), tail.end());
  REQUIRE(engine->prefetch(longer, {.cache_salt = "x"}).ok());
  REQUIRE(engine->prefetch(running, {.cache_salt = "x"}).ok());
  REQUIRE(engine->prefetch(queued.back(), {.cache_salt = "y"}).ok());  // another tenant: its own fetch
  m = engine->metrics().tiers;
  CHECK(m.merged_fetches == 3);
  CHECK(m.queued_fetches == 4);
  CHECK(m.dropped_fetches == 7);
  redis.resume();
  engine->wait_for_tiers();
  REQUIRE(engine->check_invariants().ok());
  CHECK(engine->metrics().tiers.queued_fetches == 0);
}

TEST_CASE("tiers: bad configurations are refused with a clear status", "[tiers]") {
  std::unique_ptr<Engine> e;
  EngineConfig c = small_config(16, 0);
  c.tiers.storage_url = "file:///tmp";
  CHECK(Engine::create(c, e).code() == clm::StatusCode::invalid_argument);  // storage needs a host tier
  c = small_config(16, 16);
  c.tiers.storage_url = "gopher://x";
  CHECK(Engine::create(c, e).code() == clm::StatusCode::invalid_argument);
  c.tiers.storage_url = "redis://127.0.0.1:99999/0";
  CHECK(Engine::create(c, e).code() == clm::StatusCode::invalid_argument);
  c.tiers.storage_url = "";
  c.tiers.storage_workers = 0;
  CHECK(Engine::create(c, e).code() == clm::StatusCode::invalid_argument);
  c = small_config(16, 16);
  c.tiers.prefetch_timeout_ms = -1;
  CHECK(Engine::create(c, e).code() == clm::StatusCode::invalid_argument);
  c = small_config(16, 16);
  c.pool.memory = clm::MemoryKind::none;
  c.tiers.storage_url = "file:///tmp/clm-never-created";
  CHECK(Engine::create(c, e).code() == clm::StatusCode::invalid_argument);  // no bytes to store
  c = small_config(16, 16);
  std::unique_ptr<Engine> plain;
  REQUIRE(Engine::create(small_config(16, 0), plain).ok());
  CHECK(plain->prefetch(std::vector<std::int32_t>{1, 2, 3}, {}).code() == clm::StatusCode::failed_precondition);
}
