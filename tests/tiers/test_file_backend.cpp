// The file:// storage tier, in temporary directories: round trips checked byte
// for byte, exists, files damaged or replaced on disk refused (and removed),
// the LRU cap (a read refreshes; the order survives a reopen through the
// files' mtimes), the index rebuilt at open, four threads on one backend, a
// full disk (RLIMIT_FSIZE in a child) dropping writes while reads go on, and
// directories that cannot be used.
#include <fcntl.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

#include "child_process.hpp"
#include "clm/tiers/page_file.hpp"
#include "clm/tiers/storage_backend.hpp"
#include "store/store_test_support.hpp"
#include "test_support.hpp"
#include "tiers/tiers_test_support.hpp"

namespace fs = std::filesystem;

namespace {

using clm_test::fetch;
using clm_test::open_backend;
using clm_test::random_keys;
using clm_test::store;

const clm::PageLayout kSmall{4, 2, 2, 16, clm::KvDType::f16};  // 1 KiB pages
// 128 KiB pages: 80 + 131072 bytes a file, so capacity_mb=1 holds exactly 7.
const clm::PageLayout kCapped{16, 4, 8, 64, clm::KvDType::f16};

std::vector<std::uint8_t> exists(clm::StorageBackend& b, const std::vector<clm::PageKey>& keys) {
  std::vector<std::uint8_t> found(keys.size(), 7);
  REQUIRE(b.exists(keys, found).ok());
  return found;
}

fs::path page_path(const fs::path& root, const clm::PageKey& key) {
  const std::string hex = key.hex();
  return root / hex.substr(0, 2) / hex;
}

std::vector<fs::path> files_under(const fs::path& root, const std::string& name_prefix = "") {
  std::vector<fs::path> out;
  for (const auto& e : fs::recursive_directory_iterator(root)) {
    if (e.is_regular_file() && e.path().filename().string().starts_with(name_prefix)) out.push_back(e.path());
  }
  return out;
}

std::string read_file(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}
void write_file(const fs::path& p, const std::string& bytes) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

void set_mtime(const fs::path& p, std::int64_t seconds_ago) {
  timespec times[2];
  clock_gettime(CLOCK_REALTIME, &times[0]);
  times[0].tv_sec -= seconds_ago;
  times[1] = times[0];
  REQUIRE(utimensat(AT_FDCWD, p.c_str(), times, 0) == 0);
}

}  // namespace

TEST_CASE("file: pages round-trip byte for byte, one whole file per page", "[tiers][file]") {
  const std::uint32_t seed = clm_test::fresh_seed();
  INFO("seed " << seed);
  std::mt19937_64 rng(seed);
  clm_test::TempDir dir;
  const fs::path root = dir.path() / "pages";  // made by open
  auto b = open_backend("file://" + root.string(), kSmall);
  const auto keys = random_keys(rng, 50);
  store(*b, keys);
  std::vector<clm::PageKey> asked = keys;
  const auto absent = random_keys(rng, 10);
  asked.insert(asked.end(), absent.begin(), absent.end());
  std::shuffle(asked.begin(), asked.end(), rng);
  const auto found = fetch(*b, asked);
  const auto there = exists(*b, asked);
  for (std::size_t i = 0; i < asked.size(); ++i) {
    const bool stored = std::find(keys.begin(), keys.end(), asked[i]) != keys.end();
    CHECK(found[i] == (stored ? 1 : 0));
    CHECK(there[i] == (stored ? 1 : 0));
  }
  const clm::StorageStats st = b->stats();
  CHECK(st.pages_written == 50);
  CHECK(st.bytes_written == 50 * kSmall.page_bytes());
  CHECK(st.pages_read == 50);
  CHECK(st.pages_missing == 20);  // 10 by get, 10 by exists
  CHECK(st.corrupt_pages == 0);
  // On disk: root/<first byte>/<hex>, header + payload; no temporary file left.
  for (const auto& key : keys) {
    const fs::path p = page_path(root, key);
    REQUIRE(fs::exists(p));
    CHECK(fs::file_size(p) == clm::kPageHeaderSize + kSmall.page_bytes());
    CHECK(read_file(p).substr(0, 8) == "CLMKVPG1");
  }
  CHECK(files_under(root, ".tmp-").empty());
  CHECK(files_under(root).size() == 50);
  // A rewrite replaces the bytes.
  store(*b, keys, 5);
  for (std::uint8_t f : fetch(*b, keys, 5)) CHECK(f == 1);
  // Spans that disagree are refused.
  std::vector<std::byte> short_buffer(kSmall.page_bytes());
  std::vector<std::uint8_t> two(2);
  CHECK(b->get(std::span(keys).first(2), short_buffer, two).code() == clm::StatusCode::invalid_argument);
  CHECK(b->set(std::span(keys).first(2), short_buffer, two).code() == clm::StatusCode::invalid_argument);
  CHECK(b->exists(std::span(keys).first(3), two).code() == clm::StatusCode::invalid_argument);
  CHECK(b->url() == "file://" + root.string());
}

TEST_CASE("file: pages damaged or replaced on disk are refused, counted and removed", "[tiers][file]") {
  const std::uint32_t seed = clm_test::fresh_seed();
  INFO("seed " << seed);
  std::mt19937_64 rng(seed);
  clm_test::TempDir dir;
  auto b = open_backend("file://" + dir.str(), kSmall);
  const auto keys = random_keys(rng, 9);
  store(*b, keys);
  const std::size_t file_bytes = clm::kPageHeaderSize + kSmall.page_bytes();
  // 0: a payload byte flipped; 1: a header byte flipped; 2: truncated; 3: grown by a byte;
  // 4: another key's file; 5: a page of another layout of the same size; 6: empty.
  {
    std::string v = read_file(page_path(dir.path(), keys[0]));
    v[clm::kPageHeaderSize + rng() % kSmall.page_bytes()] ^= 0x01;
    write_file(page_path(dir.path(), keys[0]), v);
    v = read_file(page_path(dir.path(), keys[1]));
    v[rng() % clm::kPageHeaderSize] ^= static_cast<char>(0x40);
    write_file(page_path(dir.path(), keys[1]), v);
    fs::resize_file(page_path(dir.path(), keys[2]), file_bytes - 1 - rng() % 100);
    write_file(page_path(dir.path(), keys[3]), read_file(page_path(dir.path(), keys[3])) + "x");
    fs::copy_file(page_path(dir.path(), keys[7]), page_path(dir.path(), keys[4]), fs::copy_options::overwrite_existing);
    const clm::PageLayout other{8, 2, 1, 16, clm::KvDType::f16};  // same page_bytes, other shape
    REQUIRE(other.page_bytes() == kSmall.page_bytes());
    clm_test::TempDir other_dir;
    auto o = open_backend("file://" + other_dir.str(), other);
    const std::vector<clm::PageKey> k5 = {keys[5]};
    store(*o, k5);
    fs::copy_file(page_path(other_dir.path(), keys[5]), page_path(dir.path(), keys[5]),
                  fs::copy_options::overwrite_existing);
    write_file(page_path(dir.path(), keys[6]), "");
  }
  const auto found = fetch(*b, keys);  // every found page is checked byte for byte
  for (int i = 0; i < 7; ++i) {
    INFO("damaged page " << i);
    CHECK(found[static_cast<std::size_t>(i)] == 0);
    CHECK_FALSE(fs::exists(page_path(dir.path(), keys[static_cast<std::size_t>(i)])));  // removed
  }
  CHECK(found[7] == 1);
  CHECK(found[8] == 1);
  CHECK(b->stats().corrupt_pages == 7);
  CHECK(b->stats().repaired_pages == 7);
  // Gone now: the next read is a plain miss, and a rewrite heals.
  const std::vector<clm::PageKey> first(keys.begin(), keys.begin() + 7);
  for (std::uint8_t f : fetch(*b, first)) CHECK(f == 0);
  CHECK(b->stats().corrupt_pages == 7);
  CHECK(b->stats().pages_missing == 7);
  store(*b, first);
  for (std::uint8_t f : fetch(*b, keys)) CHECK(f == 1);
}

TEST_CASE("file: the size cap removes the least recently used pages, and a read refreshes", "[tiers][file]") {
  const std::uint32_t seed = clm_test::fresh_seed();
  INFO("seed " << seed);
  std::mt19937_64 rng(seed);
  clm_test::TempDir dir;
  auto b = open_backend("file://" + dir.str() + "?capacity_mb=1", kCapped);
  const auto keys = random_keys(rng, 12);
  auto upto = [&](std::size_t n) { return std::vector<clm::PageKey>(keys.begin(), keys.begin() + n); };
  for (std::size_t i = 0; i < 7; ++i) store(*b, {keys[i]});
  CHECK(b->stats().evicted_pages == 0);
  for (std::uint8_t f : exists(*b, upto(7))) CHECK(f == 1);
  // Page 0 read (now the most recent); page 7 in: page 1 goes, not page 0.
  for (std::uint8_t f : fetch(*b, {keys[0]})) CHECK(f == 1);
  store(*b, {keys[7]});
  CHECK(b->stats().evicted_pages == 1);
  auto there = exists(*b, upto(8));
  CHECK(there == std::vector<std::uint8_t>{1, 0, 1, 1, 1, 1, 1, 1});
  // Two more: pages 2 and 3 go.
  store(*b, {keys[8], keys[9]});
  there = exists(*b, upto(10));
  CHECK(there == std::vector<std::uint8_t>{1, 0, 0, 0, 1, 1, 1, 1, 1, 1});
  CHECK(b->stats().evicted_pages == 3);
  CHECK(files_under(dir.path()).size() == 7);
  // The survivors still read back intact.
  const auto found = fetch(*b, upto(10));
  CHECK(found == std::vector<std::uint8_t>{1, 0, 0, 0, 1, 1, 1, 1, 1, 1});
  // A cap below one page file is refused at open.
  std::unique_ptr<clm::StorageBackend> tiny;
  const clm::PageLayout two_mib{16, 32, 8, 64, clm::KvDType::f32};
  REQUIRE(two_mib.page_bytes() == 2u << 20);
  const clm::Status s =
      clm::open_storage_backend("file://" + dir.str() + "?capacity_mb=1", two_mib, clm_test::test_seal(), tiny);
  INFO(s.message());
  CHECK(s.code() == clm::StatusCode::invalid_argument);
}

TEST_CASE("file: reopening rebuilds the index from the files, oldest use first", "[tiers][file]") {
  const std::uint32_t seed = clm_test::fresh_seed();
  INFO("seed " << seed);
  std::mt19937_64 rng(seed);
  clm_test::TempDir dir;
  const std::string url = "file://" + dir.str() + "?capacity_mb=1";
  const auto keys = random_keys(rng, 10);
  {
    auto b = open_backend(url, kCapped);
    store(*b, std::vector<clm::PageKey>(keys.begin(), keys.begin() + 5));
  }
  // Uses 100, 90, 80, 70, 60 s ago; then page 0 is read through a reopened
  // backend, which refreshes its mtime.
  for (int i = 0; i < 5; ++i) set_mtime(page_path(dir.path(), keys[static_cast<std::size_t>(i)]), 100 - 10 * i);
  {
    auto b = open_backend(url, kCapped);
    for (std::uint8_t f : fetch(*b, {keys[0]})) CHECK(f == 1);
  }
  CHECK(fs::last_write_time(page_path(dir.path(), keys[0])) >
        fs::file_time_type::clock::now() - std::chrono::seconds(50));
  // Leftovers: a stale temporary file (removed), a fresh one (another
  // writer's, kept), files with wrong names or sizes (ignored, kept).
  const fs::path sub = page_path(dir.path(), keys[1]).parent_path();
  const fs::path stale = sub / (".tmp-" + keys[1].hex() + "-1-1");
  const fs::path fresh = sub / (".tmp-" + keys[1].hex() + "-1-2");
  const fs::path wrong_size = sub / (sub.filename().string() + std::string(62, 'e'));
  const fs::path wrong_name = sub / "notes.txt";
  const fs::path wrong_dir = dir.path() / "zz";
  write_file(stale, "half a page");
  set_mtime(stale, 3600);
  write_file(fresh, "a page being written");
  write_file(wrong_size, "short");
  write_file(wrong_name, "hello");
  fs::create_directories(wrong_dir);
  write_file(wrong_dir / keys[9].hex(), std::string(clm::kPageHeaderSize + kCapped.page_bytes(), 'x'));

  auto b = open_backend(url, kCapped);
  CHECK_FALSE(fs::exists(stale));
  CHECK(fs::exists(fresh));
  CHECK(fs::exists(wrong_size));
  CHECK(fs::exists(wrong_name));
  for (std::uint8_t f : fetch(*b, std::vector<clm::PageKey>(keys.begin(), keys.begin() + 5))) CHECK(f == 1);
  // The fetch above refreshed all five in key order 0..4; so the index order
  // is again 0 oldest. Rebuild from fixed mtimes instead: 0 newest, then 4..1.
  b.reset();
  set_mtime(page_path(dir.path(), keys[0]), 10);
  for (int i = 1; i < 5; ++i) set_mtime(page_path(dir.path(), keys[static_cast<std::size_t>(i)]), 100 - 10 * i);
  b = open_backend(url, kCapped);
  // Five pages known; three more make eight: the oldest, page 1, goes.
  store(*b, std::vector<clm::PageKey>(keys.begin() + 5, keys.begin() + 8));
  CHECK(b->stats().evicted_pages == 1);
  CHECK(exists(*b, std::vector<clm::PageKey>(keys.begin(), keys.begin() + 8)) ==
        std::vector<std::uint8_t>{1, 0, 1, 1, 1, 1, 1, 1});
  // Files it did not write but can read (another process's) are served and adopted.
  b.reset();
  {
    clm_test::TempDir other;
    auto o = open_backend("file://" + other.str(), kCapped);
    store(*o, {keys[9]});
    fs::create_directories(page_path(dir.path(), keys[9]).parent_path());
    fs::copy_file(page_path(other.path(), keys[9]), page_path(dir.path(), keys[9]));
  }
  b = open_backend(url, kCapped);
  for (std::uint8_t f : fetch(*b, {keys[9]})) CHECK(f == 1);
}

TEST_CASE("file: four threads share one backend, every byte checked", "[tiers][file][concurrency][threads]") {
  const std::uint32_t seed = clm_test::fresh_seed();
  INFO("seed " << seed);
  for (const bool capped : {false, true}) {
    INFO((capped ? "with a cap (evictions race the reads)" : "without a cap"));
    clm_test::TempDir dir;
    auto b = open_backend("file://" + dir.str() + (capped ? "?capacity_mb=1" : ""), kCapped);
    std::mt19937_64 key_rng(seed);
    const auto shared = random_keys(key_rng, 16);
    std::atomic<int> wrong{0}, missing{0};
    std::vector<std::thread> threads;
    for (int t = 0; t < 4; ++t) {
      threads.emplace_back([&, t] {
        std::mt19937_64 rng(seed + 77 + static_cast<std::uint64_t>(t));
        for (int round = 0; round < 25; ++round) {
          std::vector<clm::PageKey> batch = random_keys(rng, 2);
          batch.push_back(shared[rng() % shared.size()]);
          batch.push_back(shared[rng() % shared.size()]);
          const std::vector<std::byte> pages = clm_test::pages_of(batch, kCapped);
          std::vector<std::uint8_t> written(batch.size());
          if (!b->set(batch, pages, written).ok()) ++wrong;
          for (std::uint8_t w : written) wrong += w == 1 ? 0 : 1;
          std::vector<std::byte> buffer(batch.size() * kCapped.page_bytes());
          std::vector<std::uint8_t> found(batch.size());
          if (!b->get(batch, buffer, found).ok()) ++wrong;
          for (std::size_t i = 0; i < batch.size(); ++i) {
            const auto slot = std::span(buffer).subspan(i * kCapped.page_bytes(), kCapped.page_bytes());
            if (found[i] == 0) {
              ++missing;
            } else if (!clm_test::page_matches(batch[i], kCapped, slot)) {
              ++wrong;
            }
          }
        }
      });
    }
    for (auto& th : threads) th.join();
    CHECK(wrong.load() == 0);
    CHECK(b->stats().corrupt_pages == 0);
    CHECK(files_under(dir.path(), ".tmp-").empty());
    if (!capped) {
      CHECK(missing.load() == 0);
    } else {
      CHECK(files_under(dir.path()).size() <= 7);
      CHECK(b->stats().evicted_pages > 0);
    }
  }
}

// The child of the crash test: writes batches of new pages (and rewrites of
// old ones) until it is killed, telling the parent through `fd` the keys of
// each batch before it writes them ('I') and again once set() has stored
// them ('D'). Never returns.
[[noreturn]] void write_pages_until_killed(const std::string& url, std::uint64_t seed, int fd) {
  std::unique_ptr<clm::StorageBackend> b;
  if (!clm::open_storage_backend(url, kSmall, clm_test::test_seal(), b).ok()) _exit(3);
  std::mt19937_64 rng(seed);
  std::vector<clm::PageKey> written_before;
  auto say = [fd](char what, const std::vector<clm::PageKey>& keys) {
    for (const clm::PageKey& key : keys) {
      char record[1 + sizeof key.bytes];
      record[0] = what;
      std::memcpy(record + 1, key.bytes.data(), sizeof key.bytes);
      if (::write(fd, record, sizeof record) != static_cast<ssize_t>(sizeof record)) _exit(4);
    }
  };
  say('R', {clm::PageKey{}});  // open: the parent may time the kill from here
  for (;;) {
    std::vector<clm::PageKey> keys = random_keys(rng, 1 + rng() % 4);
    if (!written_before.empty() && rng() % 3 == 0) keys.push_back(written_before[rng() % written_before.size()]);
    say('I', keys);
    const std::vector<std::byte> pages = clm_test::pages_of(keys, kSmall);
    std::vector<std::uint8_t> written(keys.size(), 7);
    if (!b->set(keys, pages, written).ok()) _exit(5);
    for (std::uint8_t w : written) {
      if (w != 1) _exit(6);
    }
    say('D', keys);
    written_before.insert(written_before.end(), keys.begin(), keys.end());
  }
}

TEST_CASE("file: SIGKILL while writing loses no stored page and never serves a torn one", "[tiers][file][crash]") {
  const std::uint32_t seed = clm_test::fresh_seed();
  INFO("seed " << seed);
  std::mt19937_64 rng(seed);
  const char* env = std::getenv("CLM_CRASH_KILLS");
  const int kills = env ? std::max(1, std::atoi(env)) : 60;
  clm_test::TempDir dir;
  const std::string url = "file://" + dir.str();
  std::vector<clm::PageKey> stored, in_flight;  // set() returned / the write may or may not have landed
  std::uniform_int_distribution<int> delay_us(1'000, 30'000);
  std::uint64_t checked_in_flight = 0;
  for (int generation = 0; generation < kills; ++generation) {
    INFO("kill " << generation);
    clm_test::ChildProcess child([&](int report_fd) {
      write_pages_until_killed(url, seed * 1000003ull + static_cast<std::uint64_t>(generation), report_fd);
    });
    // Where the kill is timed from: opening indexes every page file, which
    // takes longer as the directory fills (and on a loaded machine), and a
    // write ends with an fsync, so a kill timed from the fork alone often
    // lands before any write has ended. One kill in four is timed from the
    // fork (it may cut the open and its clean-up of a killed writer's
    // temporary files), one from the end of the open, two from the end of
    // the child's first write, so that the children surely store pages.
    using Record = std::array<char, 1 + 32>;
    std::vector<Record> records;  // in the order the child sent them
    auto read_record = [&] {
      Record r;
      if (!child.read(r)) return '\0';
      records.push_back(r);
      return r[0];
    };
    const std::uint64_t timed_from = rng() % 4;
    if (timed_from == 1) REQUIRE(read_record() == 'R');
    if (timed_from >= 2) {
      char what;
      do {
        what = read_record();
        REQUIRE(what != '\0');  // the child died by itself
      } while (what != 'D');
    }
    std::this_thread::sleep_for(std::chrono::microseconds(delay_us(rng)));
    child.kill();
    // Whole records only: the kill may cut the last one.
    while (read_record() != '\0') {
    }
    std::vector<clm::PageKey> intended;
    for (const Record& record : records) {
      clm::PageKey key;
      std::memcpy(key.bytes.data(), record.data() + 1, key.bytes.size());
      if (record[0] == 'R') continue;
      if (record[0] == 'I') {
        intended.push_back(key);
      } else {
        stored.push_back(key);
        intended.erase(std::find(intended.begin(), intended.end(), key));
      }
    }
    in_flight = intended;

    // Reopen as a restarted process would: every stored page reads back
    // byte for byte; a page whose write was cut is absent or whole; no file
    // that holds a page is torn (get() would count it corrupt).
    auto b = open_backend(url, kSmall);
    for (std::uint8_t f : fetch(*b, stored)) REQUIRE(f == 1);
    fetch(*b, in_flight);  // each found page is checked against its bytes
    checked_in_flight += in_flight.size();
    CHECK(b->stats().corrupt_pages == 0);
  }
  // Every page file left is whole: a fresh open indexes them all, and they all read back.
  auto b = open_backend(url, kSmall);
  std::vector<clm::PageKey> on_disk;
  for (const fs::path& f : files_under(dir.path())) {
    const std::string name = f.filename().string();
    if (name.starts_with(".tmp-")) continue;  // a killed writer's, removed once stale
    clm::PageKey key;
    REQUIRE(name.size() == 64);
    for (std::size_t i = 0; i < 32; ++i)
      key.bytes[i] = static_cast<std::uint8_t>(std::stoi(name.substr(2 * i, 2), nullptr, 16));
    on_disk.push_back(key);
  }
  for (std::uint8_t f : fetch(*b, on_disk)) CHECK(f == 1);
  CHECK(b->stats().corrupt_pages == 0);
  INFO("pages stored " << stored.size() << ", in flight at a kill " << checked_in_flight);
  CHECK(stored.size() >= static_cast<std::size_t>(kills) / 3);  // half the kills wait for a stored page
}

TEST_CASE("file: a full disk drops writes (written = 0) while reads go on", "[tiers][file][faults]") {
  const std::uint32_t seed = clm_test::fresh_seed();
  INFO("seed " << seed);
  std::mt19937_64 rng(seed);
  clm_test::TempDir dir;
  const std::string url = "file://" + dir.str();
  const auto old_keys = random_keys(rng, 6);
  const auto new_keys = random_keys(rng, 5);
  {
    auto b = open_backend(url, kCapped);
    store(*b, old_keys);
  }
  // The child: a file-size limit below one page file (EFBIG on every page
  // write, as a full disk or quota would fail it); exit code 0 only if every
  // write was dropped cleanly and every old page still read back.
  clm_test::ChildProcess child([&](int) {
    signal(SIGXFSZ, SIG_IGN);  // a write past the limit then fails with EFBIG instead of killing us
    std::unique_ptr<clm::StorageBackend> b;
    if (!clm::open_storage_backend(url, kCapped, clm_test::test_seal(), b).ok()) return 3;
    const rlimit limit{kCapped.page_bytes() / 2, kCapped.page_bytes() / 2};
    if (setrlimit(RLIMIT_FSIZE, &limit) != 0) return 4;
    const std::vector<std::byte> pages = clm_test::pages_of(new_keys, kCapped);
    std::vector<std::uint8_t> written(new_keys.size(), 7);
    if (!b->set(new_keys, pages, written).ok()) return 5;
    for (std::uint8_t w : written) {
      if (w != 0) return 6;
    }
    if (b->stats().dropped_writes != new_keys.size() || b->stats().pages_written != 0) return 7;
    std::vector<std::byte> buffer(old_keys.size() * kCapped.page_bytes());
    std::vector<std::uint8_t> found(old_keys.size());
    if (!b->get(old_keys, buffer, found).ok()) return 8;
    for (std::size_t i = 0; i < old_keys.size(); ++i) {
      const auto slot = std::span(buffer).subspan(i * kCapped.page_bytes(), kCapped.page_bytes());
      if (found[i] != 1 || !clm_test::page_matches(old_keys[i], kCapped, slot)) return 9;
    }
    std::vector<std::uint8_t> there(new_keys.size(), 7);
    if (!b->exists(new_keys, there).ok()) return 10;
    for (std::uint8_t t : there) {
      if (t != 0) return 11;
    }
    return 0;
  });
  const int code = child.exit_code();
  INFO("child exit code " << code << " (see the codes the child returns)");
  REQUIRE(code == 0);
  // No partial file anywhere: neither a temporary one nor a page.
  CHECK(files_under(dir.path(), ".tmp-").empty());
  auto b = open_backend(url, kCapped);
  for (std::uint8_t f : fetch(*b, old_keys)) CHECK(f == 1);
  for (std::uint8_t f : exists(*b, new_keys)) CHECK(f == 0);
  CHECK(files_under(dir.path()).size() == old_keys.size());
}

TEST_CASE("file: a directory that cannot be made or written is an io_error at open", "[tiers][file][faults]") {
  clm_test::TempDir dir;
  write_file(dir.path() / "a-file", "x");
  std::unique_ptr<clm::StorageBackend> b;
  for (const fs::path& p : {dir.path() / "a-file" / "pages", dir.path() / "a-file"}) {
    const clm::Status s = clm::open_storage_backend("file://" + p.string(), kSmall, clm_test::test_seal(), b);
    INFO(p << ": " << s.message());
    CHECK(s.code() == clm::StatusCode::io_error);
    CHECK(b == nullptr);
  }
  // Permission bits stop writes only for a user other than root: as root, a
  // child drops to nobody (65534) and opens a directory nobody may write.
  const fs::path ro = dir.path() / "read-only";
  fs::create_directories(ro);
  fs::permissions(dir.path(), fs::perms::owner_all | fs::perms::others_exec | fs::perms::group_exec);
  fs::permissions(ro, fs::perms::owner_read | fs::perms::owner_exec | fs::perms::others_read | fs::perms::others_exec |
                          fs::perms::group_read | fs::perms::group_exec);
  const clm::PageSeal seal = clm_test::test_seal();
  auto open_read_only = [&]() -> int {
    std::unique_ptr<clm::StorageBackend> backend;
    const clm::Status s = clm::open_storage_backend("file://" + ro.string(), kSmall, seal, backend);
    if (s.code() != clm::StatusCode::io_error) return 2;
    if (s.message().find("not writable") == std::string::npos) return 3;
    return backend == nullptr ? 0 : 4;
  };
  if (geteuid() == 0) {
    clm_test::ChildProcess child([&](int) -> int {
      if (::setgid(65534) != 0 || ::setuid(65534) != 0) return 5;
      return open_read_only();
    });
    CHECK(child.exit_code() == 0);  // 2-4: the open was not refused as not writable; 5: no setuid
  } else {
    CHECK(open_read_only() == 0);
  }
  fs::permissions(ro, fs::perms::owner_all);
}
