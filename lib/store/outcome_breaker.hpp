// lib/store/outcome_breaker.hpp: breaker (b) of the snapshot store: how often
// what lookups served was right, per (query key, served key) of a tenant, and
// what it refuses once that falls (docs/snapshot-store.md).
//
//   store_impl::OutcomeBreaker breaker(settings);
//   auto trip = breaker.report(tenant, query_fp, served_fp, /*correct=*/false, now_ms);
//   if (trip && trip->whole_key) { /* blacklist the served key, persisted */ }
//   if (breaker.pair_blocked(tenant, query_fp, candidate_fp, now_ms)) { /* skip it */ }
//
// Why pairs: at level 2 a query key is served a neighbour's snapshot. A wrong
// serve there says the neighbour is no answer to that query, not that the
// neighbour is wrong for its own key, so it must not count against the
// neighbour's exact hits. A pair whose accuracy falls is blocked: that
// candidate is refused to that query key only, until the block expires. A
// pair of a key with itself (level 1, or a fallback named as its key) trips
// the whole key: the caller blacklists it. A served key blocked for
// kMaxBlockedQueries query keys at once is wrong for too many to block one by
// one: that trips the whole key too.
//
// Bounded: at most `tracked_pairs` windows (least recently reported dropped
// first), each of at most kMaxReportsPerWindow reports; blocks at most
// kMaxBlockedQueries per served key. Blocks live in memory only (the key
// blacklist is persisted): after a restart a wrong pair must fail
// min_reports times again before it is blocked. Thread-safe.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <list>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace clm::store_impl {

struct BreakerSettings {
  double accuracy = 0.95;      // below it (with min_reports reports) a pair trips
  std::int64_t window_ms = 0;  // reports older than this leave the window
  std::int32_t min_reports = 20;
  std::int64_t duration_ms = 0;  // how long a block (or blacklist) lasts
  std::int32_t tracked_pairs = 4096;
};

struct BreakerTrip {
  bool whole_key = false;  // blacklist the served key; false: the pair was blocked
  std::int64_t until_ms = 0;
  std::string reason;
};

class OutcomeBreaker {
 public:
  static constexpr std::size_t kMaxReportsPerWindow = 512;
  static constexpr std::size_t kMaxBlockedQueries = 8;

  explicit OutcomeBreaker(const BreakerSettings& settings) : settings_(settings) {}

  // Adds one report of serving served_fp to a lookup of query_fp; a trip when
  // this report made the pair's accuracy fall below settings.accuracy.
  std::optional<BreakerTrip> report(std::string_view tenant, std::uint64_t query_fp, std::uint64_t served_fp,
                                    bool correct, std::int64_t now_ms);
  // Whether served_fp is refused to query_fp (a block in force).
  bool pair_blocked(std::string_view tenant, std::uint64_t query_fp, std::uint64_t served_fp, std::int64_t now_ms);
  // How many query keys served_fp is refused to now (changes nothing).
  std::size_t blocked_queries(std::string_view tenant, std::uint64_t served_fp, std::int64_t now_ms) const;
  // Forgets the windows and lifts the blocks in which served_fp was served
  // (or asked for); the number of blocks lifted.
  std::size_t forget_key(std::string_view tenant, std::uint64_t fp);
  void forget_tenant(std::string_view tenant);

  std::size_t windows() const;
  std::size_t blocked_pairs(std::int64_t now_ms) const;

 private:
  struct Report {
    std::int64_t at_ms;
    bool correct;
  };
  struct Window {
    std::string tenant;
    std::uint64_t query_fp = 0;
    std::uint64_t served_fp = 0;
    std::deque<Report> reports;
    std::size_t right = 0;
    std::list<std::string>::iterator lru;
  };
  struct Block {
    std::uint64_t query_fp;
    std::int64_t until_ms;
  };

  void drop_window(const std::string& pair);

  const BreakerSettings settings_;
  mutable std::mutex mutex_;
  std::list<std::string> lru_;  // pair keys, most recently reported first
  std::unordered_map<std::string, Window> windows_;
  // tenant_key(tenant, served) -> blocks of that served key, one per query key.
  std::unordered_map<std::string, std::vector<Block>> blocks_;
  // Blocks in blocks_ (expired ones included), read without the lock: a
  // lookup skips the lock when nothing is blocked.
  std::atomic<std::size_t> blocks_size_{0};
};

}  // namespace clm::store_impl
