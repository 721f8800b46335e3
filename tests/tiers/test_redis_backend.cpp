// The redis:// storage tier against a real redis-server started by the test
// (tests/tiers/redis_server.hpp): round trips checked byte for byte, exists,
// prefixes and databases that never see each other, TTLs read back with a raw
// TTL, values damaged by hand refused, a server that dies, hangs, or
// restarts, and four threads sharing one backend.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <sys/stat.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <fstream>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

#include "clm/tiers/page_file.hpp"
#include "clm/tiers/storage_backend.hpp"
#include "clm/tiers/storage_url.hpp"
#include "test_support.hpp"
#include "tiers/redis_server.hpp"
#include "tiers/tiers_test_support.hpp"

namespace {

using clm_test::fetch;
using clm_test::open_backend;
using clm_test::random_keys;
using clm_test::store;

const clm::PageLayout kSmall{16, 2, 2, 32, clm::KvDType::f16};   // 8 KiB pages
const clm::PageLayout kLarge{16, 8, 8, 128, clm::KvDType::f16};  // 512 KiB pages

std::string redis_key(const std::string& prefix, const clm::PageKey& key) { return prefix + key.hex(); }

template <typename F>
double seconds_of(F&& f) {
  const auto t0 = std::chrono::steady_clock::now();
  f();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

TEST_CASE("redis: pages round-trip byte for byte, in batches larger than one pipeline chunk", "[tiers][redis]") {
  const std::uint32_t seed = clm_test::fresh_seed();
  INFO("seed " << seed);
  std::mt19937_64 rng(seed);
  clm_test::RedisServer redis;
  redis.start();
  auto b = open_backend(redis.url("rt:"), kLarge);
  const auto keys = random_keys(rng, 40);  // 20 MiB: over the 16 MiB chunk of a SET pipeline
  store(*b, keys);
  // Read back shuffled, with keys never stored in between.
  std::vector<clm::PageKey> asked = keys;
  const auto absent = random_keys(rng, 10);
  asked.insert(asked.end(), absent.begin(), absent.end());
  std::shuffle(asked.begin(), asked.end(), rng);
  const auto found = fetch(*b, asked);
  for (std::size_t i = 0; i < asked.size(); ++i) {
    const bool stored = std::find(keys.begin(), keys.end(), asked[i]) != keys.end();
    CHECK(found[i] == (stored ? 1 : 0));
  }
  const clm::StorageStats st = b->stats();
  CHECK(st.pages_written == 40);
  CHECK(st.bytes_written == 40 * kLarge.page_bytes());
  CHECK(st.pages_read == 40);
  CHECK(st.bytes_read == 40 * kLarge.page_bytes());
  CHECK(st.pages_missing == 10);
  CHECK(st.corrupt_pages == 0);
  CHECK(st.errors == 0);
  // The value under the key is exactly header + payload (one value per page).
  auto raw = redis.connect();
  auto len = clm_test::redis_command(raw, "STRLEN %s", redis_key("rt:", keys[0]).c_str());
  CHECK(len->integer == static_cast<long long>(clm::kPageHeaderSize + kLarge.page_bytes()));
  // Empty batches are fine.
  std::vector<std::uint8_t> none;
  CHECK(b->get({}, {}, none).ok());
  CHECK(b->set({}, {}, none).ok());
  CHECK(b->exists({}, none).ok());
  // Spans that disagree are refused.
  std::vector<std::byte> short_buffer(kLarge.page_bytes());
  std::vector<std::uint8_t> two(2);
  CHECK(b->get(std::span(keys).first(2), short_buffer, two).code() == clm::StatusCode::invalid_argument);
  CHECK(b->set(std::span(keys).first(2), short_buffer, two).code() == clm::StatusCode::invalid_argument);
  CHECK(b->exists(std::span(keys).first(3), two).code() == clm::StatusCode::invalid_argument);
}

TEST_CASE("redis: exists reports stored keys, and a rewrite replaces the page", "[tiers][redis]") {
  const std::uint32_t seed = clm_test::fresh_seed();
  INFO("seed " << seed);
  std::mt19937_64 rng(seed);
  clm_test::RedisServer redis;
  redis.start();
  auto b = open_backend(redis.url("ex:"), kSmall);
  const auto keys = random_keys(rng, 64);
  std::vector<clm::PageKey> stored;
  for (std::size_t i = 0; i < keys.size(); ++i) {
    if (rng() % 2) stored.push_back(keys[i]);
  }
  store(*b, stored);
  std::vector<std::uint8_t> found(keys.size(), 7);
  REQUIRE(b->exists(keys, found).ok());
  std::uint64_t missing = 0;
  for (std::size_t i = 0; i < keys.size(); ++i) {
    const bool want = std::find(stored.begin(), stored.end(), keys[i]) != stored.end();
    CHECK(found[i] == (want ? 1 : 0));
    missing += want ? 0 : 1;
  }
  CHECK(b->stats().pages_missing == missing);
  // A second set of the same keys with other bytes: get serves the new ones.
  if (!stored.empty()) {
    store(*b, stored, 1);
    for (std::uint8_t f : fetch(*b, stored, 1)) CHECK(f == 1);
  }
}

TEST_CASE("redis: two prefixes, or two databases, on one server never see each other's pages", "[tiers][redis]") {
  const std::uint32_t seed = clm_test::fresh_seed();
  INFO("seed " << seed);
  std::mt19937_64 rng(seed);
  clm_test::RedisServer redis;
  redis.start();
  auto a = open_backend(redis.url("tenant-a:"), kSmall);
  auto b = open_backend(redis.url("tenant-b:"), kSmall);
  auto a_db3 = open_backend(redis.url("tenant-a:", "", 3), kSmall);
  const auto shared = random_keys(rng, 12);  // the same page keys under each
  const auto only_a = random_keys(rng, 12);
  store(*a, shared, 1);
  store(*b, shared, 2);
  store(*a_db3, shared, 3);
  store(*a, only_a, 1);
  for (std::uint8_t f : fetch(*a, shared, 1)) CHECK(f == 1);
  for (std::uint8_t f : fetch(*b, shared, 2)) CHECK(f == 1);
  for (std::uint8_t f : fetch(*a_db3, shared, 3)) CHECK(f == 1);
  for (std::uint8_t f : fetch(*b, only_a)) CHECK(f == 0);
  for (std::uint8_t f : fetch(*a_db3, only_a)) CHECK(f == 0);
  std::vector<std::uint8_t> found(only_a.size(), 7);
  REQUIRE(b->exists(only_a, found).ok());
  for (std::uint8_t f : found) CHECK(f == 0);
  // The keys are prefix + hex, in the database of the URL.
  auto raw = redis.connect();
  CHECK(clm_test::redis_command(raw, "EXISTS %s", redis_key("tenant-a:", only_a[0]).c_str())->integer == 1);
  CHECK(clm_test::redis_command(raw, "EXISTS %s", redis_key("tenant-b:", only_a[0]).c_str())->integer == 0);
  CHECK(clm_test::redis_command(raw, "DBSIZE")->integer == 12 * 2 + 12);
  REQUIRE(clm_test::redis_command(raw, "SELECT 3")->type == REDIS_REPLY_STATUS);
  CHECK(clm_test::redis_command(raw, "DBSIZE")->integer == 12);
  // A database the server does not have: each call is an io_error naming SELECT.
  auto bad_db = open_backend(redis.url("x:", "", 999), kSmall);
  std::vector<std::uint8_t> one(1);
  const clm::Status s = bad_db->exists(std::span(shared).first(1), one);
  INFO(s.message());
  CHECK(s.code() == clm::StatusCode::io_error);
  CHECK_THAT(s.message(), Catch::Contains("SELECT"));
}

TEST_CASE("redis: ttl sets an expiry on every page, ttl 0 sets none", "[tiers][redis]") {
  const std::uint32_t seed = clm_test::fresh_seed();
  INFO("seed " << seed);
  std::mt19937_64 rng(seed);
  clm_test::RedisServer redis;
  redis.start();
  auto with_ttl = open_backend(redis.url("ttl:", "ttl=100"), kSmall);
  auto without = open_backend(redis.url("none:", "ttl=0"), kSmall);
  const auto keys = random_keys(rng, 5);
  store(*with_ttl, keys);
  store(*without, keys);
  auto raw = redis.connect();
  for (const auto& key : keys) {
    const long long ttl = clm_test::redis_command(raw, "TTL %s", redis_key("ttl:", key).c_str())->integer;
    CHECK(ttl > 90);
    CHECK(ttl <= 100);
    CHECK(clm_test::redis_command(raw, "TTL %s", redis_key("none:", key).c_str())->integer == -1);
  }
  // And it does expire: a 1 s TTL, checked after 2.2 s.
  auto short_ttl = open_backend(redis.url("short:", "ttl=1"), kSmall);
  store(*short_ttl, keys);
  for (std::uint8_t f : fetch(*short_ttl, keys)) CHECK(f == 1);
  std::this_thread::sleep_for(std::chrono::milliseconds(2200));
  for (std::uint8_t f : fetch(*short_ttl, keys)) CHECK(f == 0);
}

TEST_CASE("redis: values damaged or replaced by hand are refused and counted", "[tiers][redis]") {
  const std::uint32_t seed = clm_test::fresh_seed();
  INFO("seed " << seed);
  std::mt19937_64 rng(seed);
  clm_test::RedisServer redis;
  redis.start();
  auto b = open_backend(redis.url("bad:"), kSmall);
  const auto keys = random_keys(rng, 8);
  store(*b, keys);
  auto raw = redis.connect();
  auto value_of = [&](const clm::PageKey& key) {
    auto r = clm_test::redis_command(raw, "GET %s", redis_key("bad:", key).c_str());
    REQUIRE(r->type == REDIS_REPLY_STRING);
    return std::string(r->str, r->len);
  };
  auto put = [&](const clm::PageKey& key, const std::string& value) {
    const std::string name = redis_key("bad:", key);
    REQUIRE(clm_test::redis_command(raw, "SET %b %b", name.data(), name.size(), value.data(), value.size())->type ==
            REDIS_REPLY_STATUS);
  };
  // 0: garbage; 1: truncated by one byte; 2: one payload bit flipped; 3: another key's page;
  // 4: a page of another layout with the same size; 5: a list, not a string. 6 and 7 stay good.
  put(keys[0], "not a page at all");
  std::string v1 = value_of(keys[1]);
  v1.pop_back();
  put(keys[1], v1);
  std::string v2 = value_of(keys[2]);
  v2[clm::kPageHeaderSize + rng() % kSmall.page_bytes()] ^= 0x10;
  put(keys[2], v2);
  put(keys[3], value_of(keys[6]));
  {
    const clm::PageLayout other{32, 2, 1, 32, clm::KvDType::f16};  // same page_bytes, other shape
    REQUIRE(other.page_bytes() == kSmall.page_bytes());
    auto o = open_backend(redis.url("bad:"), other);
    const std::vector<clm::PageKey> k4 = {keys[4]};
    std::vector<std::byte> page = clm_test::pages_of(k4, other);
    std::vector<std::uint8_t> w(1);
    REQUIRE(o->set(k4, page, w).ok());
    REQUIRE(w[0] == 1);
  }
  const std::string list_name = redis_key("bad:", keys[5]);
  clm_test::redis_command(raw, "DEL %s", list_name.c_str());
  clm_test::redis_command(raw, "LPUSH %s x", list_name.c_str());

  const auto found = fetch(*b, keys);  // every found page is checked byte for byte
  for (int i = 0; i < 6; ++i) CHECK(found[static_cast<std::size_t>(i)] == 0);
  CHECK(found[6] == 1);
  CHECK(found[7] == 1);
  const clm::StorageStats st = b->stats();
  CHECK(st.corrupt_pages == 5);
  CHECK(st.repaired_pages == 5);  // the refused values are deleted
  CHECK(st.errors == 1);          // the WRONGTYPE reply: one call with an error reply
  // exists() no longer counts them as stored (it does not read values), so the
  // tier stores those pages again; the list, not a page value, is left alone.
  std::vector<std::uint8_t> there(keys.size());
  REQUIRE(b->exists(keys, there).ok());
  for (int i = 0; i < 8; ++i) CHECK(there[static_cast<std::size_t>(i)] == (i >= 5 ? 1 : 0));
  // A rewrite heals them.
  store(*b, std::vector<clm::PageKey>(keys.begin(), keys.begin() + 6));
  for (std::uint8_t f : fetch(*b, keys)) CHECK(f == 1);
  CHECK(b->stats().repaired_pages == 5);
}

TEST_CASE("redis AUTH: a password, an ACL user, a password file, and wrong ones refused at open, and never printed",
          "[tiers][redis][auth]") {
  const std::uint32_t seed = clm_test::fresh_seed();
  INFO("seed " << seed);
  std::mt19937_64 rng(seed);
  // The default user's password, and an ACL user with its own.
  clm_test::RedisServer redis(
      {"--requirepass", "s3cret-Default", "--user", "alice", "on", ">al1ce-pw", "~*", "&*", "+@all"});
  redis.start();
  const std::string host = fmt::format("127.0.0.1:{}", redis.port());
  const auto keys = random_keys(rng, 6);
  std::unique_ptr<clm::StorageBackend> b;

  // Right credentials: pages go and come back.
  for (const std::string& url : {fmt::format("redis://:s3cret-Default@{}/0?prefix=d:", host),
                                 fmt::format("redis://alice:al1ce-pw@{}/0?prefix=a:", host)}) {
    INFO(clm::redact_storage_url(url));
    b = open_backend(url, kSmall);
    store(*b, keys);
    for (std::uint8_t f : fetch(*b, keys)) CHECK(f == 1);
    CHECK(b->url().find("s3cret") == std::string::npos);  // url() is redacted
    CHECK(b->url().find("al1ce") == std::string::npos);
    CHECK(b->url().find(":***@") != std::string::npos);
  }
  // A password file the owner alone reads.
  clm_test::TempDir dir("redis-auth");
  const std::string file = (dir.path() / "pw").string();
  { std::ofstream(file) << "al1ce-pw\n"; }
  ::chmod(file.c_str(), 0600);
  b = open_backend(fmt::format("redis://alice@{}/0?prefix=a:&password_file={}", host, file), kSmall);
  for (std::uint8_t f : fetch(*b, keys)) CHECK(f == 1);

  // Wrong credentials: refused at open, naming AUTH, never the password.
  for (const std::string& url :
       {fmt::format("redis://:wrong-Pw@{}/0", host), fmt::format("redis://alice:s3cret-Default@{}/0", host),
        fmt::format("redis://bob:al1ce-pw@{}/0", host)}) {
    INFO(clm::redact_storage_url(url));
    b.reset();
    const clm::Status s = clm::open_storage_backend(url, kSmall, clm_test::test_seal(), b);
    INFO(s.message());
    CHECK(s.code() == clm::StatusCode::failed_precondition);
    CHECK_THAT(s.message(), Catch::Contains("AUTH"));
    CHECK(s.message().find("wrong-Pw") == std::string::npos);
    CHECK(s.message().find("s3cret") == std::string::npos);
    CHECK(s.message().find("al1ce") == std::string::npos);
    CHECK(b == nullptr);
  }
  // A password file that everyone may read, or that is not there.
  ::chmod(file.c_str(), 0644);
  CHECK(clm::open_storage_backend(fmt::format("redis://alice@{}/0?password_file={}", host, file), kSmall,
                                  clm_test::test_seal(), b)
            .code() == clm::StatusCode::failed_precondition);
  CHECK(clm::open_storage_backend(fmt::format("redis://alice@{}/0?password_file={}/none", host, dir.str()), kSmall,
                                  clm_test::test_seal(), b)
            .code() == clm::StatusCode::not_found);
  // No credentials: opens (nothing to check), and no page is stored or served.
  b = open_backend(fmt::format("redis://{}/0?prefix=n:", host), kSmall);
  std::vector<std::uint8_t> written(keys.size(), 7);
  const std::vector<std::byte> pages = clm_test::pages_of(keys, kSmall);
  (void)b->set(keys, pages, written);
  for (std::uint8_t w : written) CHECK(w != 1);
  // Right credentials but the server unreachable: not an error at open (lazy, as without).
  redis.stop();
  b.reset();
  CHECK(clm::open_storage_backend(fmt::format("redis://:s3cret-Default@{}/0?timeout_ms=100", host), kSmall,
                                  clm_test::test_seal(), b)
            .ok());
}

TEST_CASE("redis: a server that goes down fails each call fast, and once back calls succeed", "[tiers][redis]") {
  const std::uint32_t seed = clm_test::fresh_seed();
  INFO("seed " << seed);
  std::mt19937_64 rng(seed);
  clm_test::RedisServer redis;
  redis.start();
  auto b = open_backend(redis.url("down:", "timeout_ms=200"), kLarge);
  const auto keys = random_keys(rng, 8);  // 4 MiB per set: writes into a dead socket raise SIGPIPE
  store(*b, keys);
  for (std::uint8_t f : fetch(*b, keys)) CHECK(f == 1);

  redis.stop();
  const std::vector<std::byte> pages = clm_test::pages_of(keys, kLarge);
  std::vector<std::byte> buffer(pages.size());
  std::vector<std::uint8_t> flags(keys.size());
  for (int round = 0; round < 5; ++round) {
    clm::Status s;
    double took = seconds_of([&] { s = b->set(keys, pages, flags); });
    INFO("set, round " << round << ": " << s.message() << " in " << took << " s");
    CHECK(s.code() == clm::StatusCode::io_error);
    CHECK(took < 1.0);
    took = seconds_of([&] { s = b->get(keys, buffer, flags); });
    INFO("get: " << s.message() << " in " << took << " s");
    CHECK(s.code() == clm::StatusCode::io_error);
    CHECK(took < 1.0);
    took = seconds_of([&] { s = b->exists(keys, flags); });
    CHECK(s.code() == clm::StatusCode::io_error);
    CHECK(took < 1.0);
    std::this_thread::sleep_for(std::chrono::milliseconds(40 * round));  // inside and past the reconnect backoff
  }
  CHECK(b->stats().errors == 15);

  redis.restart();                                              // same port, empty (nothing persisted)
  std::this_thread::sleep_for(std::chrono::milliseconds(150));  // past the reconnect backoff
  for (std::uint8_t f : fetch(*b, keys)) CHECK(f == 0);
  store(*b, keys, 1);
  for (std::uint8_t f : fetch(*b, keys, 1)) CHECK(f == 1);

  // A restart between two calls costs no failed call: a stale pooled
  // connection is retried once on a fresh one.
  redis.restart();
  const std::uint64_t errors_before = b->stats().errors;
  store(*b, keys, 2);
  for (std::uint8_t f : fetch(*b, keys, 2)) CHECK(f == 1);
  CHECK(b->stats().errors == errors_before);
}

TEST_CASE("redis: a server that accepts but never answers fails calls after the timeout", "[tiers][redis]") {
  // A listening socket nobody accepts on: connect succeeds (the backlog), replies never come.
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  REQUIRE(fd >= 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof addr;
  REQUIRE(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0);
  REQUIRE(::listen(fd, 16) == 0);
  REQUIRE(::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0);
  const std::string url = fmt::format("redis://127.0.0.1:{}/0?timeout_ms=150", ntohs(addr.sin_port));
  auto b = open_backend(url, kSmall);
  std::mt19937_64 rng(clm_test::fresh_seed());
  const auto keys = random_keys(rng, 3);
  std::vector<std::byte> buffer(keys.size() * kSmall.page_bytes());
  std::vector<std::uint8_t> found(keys.size());
  for (int round = 0; round < 3; ++round) {
    clm::Status s;
    const double took = seconds_of([&] { s = b->get(keys, buffer, found); });
    INFO(s.message() << " in " << took << " s");
    CHECK(s.code() == clm::StatusCode::io_error);
    CHECK(took < 1.0);
  }
  ::close(fd);
  // Nothing listens there now: refused at once.
  clm::Status s;
  const double took = seconds_of([&] { s = b->exists(keys, found); });
  CHECK(s.code() == clm::StatusCode::io_error);
  CHECK(took < 1.0);
}

TEST_CASE("redis: four threads share one backend, every byte checked", "[tiers][redis][concurrency]") {
  const std::uint32_t seed = clm_test::fresh_seed();
  INFO("seed " << seed);
  clm_test::RedisServer redis;
  redis.start();
  auto b = open_backend(redis.url("mt:"), kSmall);
  std::mt19937_64 key_rng(seed);
  const auto shared = random_keys(key_rng, 64);  // every thread writes and reads these too
  std::atomic<int> failures{0};
  std::atomic<std::uint64_t> pages_checked{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937_64 rng(seed + 1000 + static_cast<std::uint64_t>(t));
      for (int round = 0; round < 60; ++round) {
        std::vector<clm::PageKey> batch = random_keys(rng, 6);
        for (int j = 0; j < 4; ++j) batch.push_back(shared[rng() % shared.size()]);
        const std::vector<std::byte> pages = clm_test::pages_of(batch, kSmall);
        std::vector<std::uint8_t> written(batch.size());
        if (!b->set(batch, pages, written).ok()) ++failures;
        for (std::uint8_t w : written) failures += w == 1 ? 0 : 1;
        std::shuffle(batch.begin(), batch.end(), rng);
        std::vector<std::byte> buffer(batch.size() * kSmall.page_bytes());
        std::vector<std::uint8_t> found(batch.size());
        if (!b->get(batch, buffer, found).ok()) ++failures;
        for (std::size_t i = 0; i < batch.size(); ++i) {
          const auto slot = std::span(buffer).subspan(i * kSmall.page_bytes(), kSmall.page_bytes());
          failures += found[i] == 1 && clm_test::page_matches(batch[i], kSmall, slot) ? 0 : 1;
          ++pages_checked;
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  CHECK(failures.load() == 0);
  CHECK(pages_checked.load() == 4 * 60 * 10);
  const clm::StorageStats st = b->stats();
  CHECK(st.pages_written == 4 * 60 * 10);
  CHECK(st.pages_read == 4 * 60 * 10);
  CHECK(st.errors == 0);
  CHECK(st.corrupt_pages == 0);
}
