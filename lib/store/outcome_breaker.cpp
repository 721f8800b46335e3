// lib/store/outcome_breaker.cpp: breaker (b)'s windows and pair blocks
// (outcome_breaker.hpp).
#include "outcome_breaker.hpp"

#include <algorithm>

#include <fmt/format.h>

namespace clm::store_impl {
namespace {

void append_fp(std::string& k, std::uint64_t fp) {
  for (int b = 0; b < 8; ++b) k.push_back(static_cast<char>(fp >> (8 * b)));
}

std::string served_key_of(std::string_view tenant, std::uint64_t served_fp) {
  std::string k(tenant);
  k.push_back('\0');
  append_fp(k, served_fp);
  return k;
}

std::string pair_key_of(std::string_view tenant, std::uint64_t query_fp, std::uint64_t served_fp) {
  std::string k = served_key_of(tenant, served_fp);
  append_fp(k, query_fp);
  return k;
}

}  // namespace

void OutcomeBreaker::drop_window(const std::string& pair) {
  const auto it = windows_.find(pair);
  if (it == windows_.end()) return;
  lru_.erase(it->second.lru);
  windows_.erase(it);
}

std::optional<BreakerTrip> OutcomeBreaker::report(std::string_view tenant, std::uint64_t query_fp,
                                                  std::uint64_t served_fp, bool correct, std::int64_t now_ms) {
  const std::string pair = pair_key_of(tenant, query_fp, served_fp);
  std::lock_guard lock(mutex_);
  auto it = windows_.find(pair);
  if (it == windows_.end()) {
    if (windows_.size() >= static_cast<std::size_t>(settings_.tracked_pairs)) drop_window(lru_.back());
    lru_.push_front(pair);
    it = windows_.emplace(pair, Window{}).first;
    it->second.tenant.assign(tenant);
    it->second.query_fp = query_fp;
    it->second.served_fp = served_fp;
    it->second.lru = lru_.begin();
  } else {
    lru_.splice(lru_.begin(), lru_, it->second.lru);
  }
  Window& w = it->second;
  w.reports.push_back({now_ms, correct});
  w.right += correct ? 1 : 0;
  while (!w.reports.empty() &&
         (w.reports.front().at_ms < now_ms - settings_.window_ms || w.reports.size() > kMaxReportsPerWindow)) {
    w.right -= w.reports.front().correct ? 1 : 0;
    w.reports.pop_front();
  }
  const std::size_t total = w.reports.size();
  const double accuracy = static_cast<double>(w.right) / static_cast<double>(total);
  if (total < static_cast<std::size_t>(settings_.min_reports) || accuracy >= settings_.accuracy) return std::nullopt;

  BreakerTrip trip;
  trip.until_ms = now_ms + settings_.duration_ms;
  trip.reason = fmt::format("breaker: {} of {} outcomes right ({:.3f} < {:.3f}) within {} ms", w.right, total, accuracy,
                            settings_.accuracy, settings_.window_ms);
  drop_window(pair);  // the reports that tripped it would trip it again
  if (query_fp == served_fp) {
    trip.whole_key = true;
    return trip;
  }
  // A block per query key; too many at once and the served key goes whole.
  auto& blocks = blocks_[served_key_of(tenant, served_fp)];
  const std::size_t before = blocks.size();
  std::erase_if(blocks, [&](const Block& b) { return b.until_ms < now_ms || b.query_fp == query_fp; });
  blocks.push_back({query_fp, trip.until_ms});
  blocks_size_ = blocks_size_ - before + blocks.size();
  if (blocks.size() >= kMaxBlockedQueries) {
    trip.whole_key = true;
    trip.reason += fmt::format("; wrong for {} query keys at once", blocks.size());
    blocks_size_ = blocks_size_ - blocks.size();
    blocks_.erase(served_key_of(tenant, served_fp));  // the blacklist refuses it everywhere
  }
  return trip;
}

bool OutcomeBreaker::pair_blocked(std::string_view tenant, std::uint64_t query_fp, std::uint64_t served_fp,
                                  std::int64_t now_ms) {
  if (blocks_size_.load(std::memory_order_relaxed) == 0) return false;
  std::lock_guard lock(mutex_);
  const auto it = blocks_.find(served_key_of(tenant, served_fp));
  if (it == blocks_.end()) return false;
  for (const Block& b : it->second) {
    if (b.query_fp == query_fp) return b.until_ms >= now_ms;
  }
  return false;
}

std::size_t OutcomeBreaker::blocked_queries(std::string_view tenant, std::uint64_t served_fp,
                                            std::int64_t now_ms) const {
  if (blocks_size_.load(std::memory_order_relaxed) == 0) return 0;
  std::lock_guard lock(mutex_);
  const auto it = blocks_.find(served_key_of(tenant, served_fp));
  if (it == blocks_.end()) return 0;
  return static_cast<std::size_t>(
      std::count_if(it->second.begin(), it->second.end(), [&](const Block& b) { return b.until_ms >= now_ms; }));
}

std::size_t OutcomeBreaker::forget_key(std::string_view tenant, std::uint64_t fp) {
  std::lock_guard lock(mutex_);
  std::vector<std::string> gone;
  for (const auto& [pair, w] : windows_) {
    if (w.tenant == tenant && (w.served_fp == fp || w.query_fp == fp)) gone.push_back(pair);
  }
  for (const std::string& pair : gone) drop_window(pair);
  std::size_t lifted = 0;
  const auto it = blocks_.find(served_key_of(tenant, fp));
  if (it != blocks_.end()) {
    lifted = it->second.size();
    blocks_.erase(it);
  }
  blocks_size_ = blocks_size_ - lifted;
  return lifted;
}

void OutcomeBreaker::forget_tenant(std::string_view tenant) {
  std::lock_guard lock(mutex_);
  std::vector<std::string> gone;
  for (const auto& [pair, w] : windows_) {
    if (w.tenant == tenant) gone.push_back(pair);
  }
  for (const std::string& pair : gone) drop_window(pair);
  std::size_t lifted = 0;
  std::erase_if(blocks_, [&](const auto& e) {
    const bool of_tenant = e.first.size() == tenant.size() + 9 && e.first.compare(0, tenant.size(), tenant) == 0;
    if (of_tenant) lifted += e.second.size();
    return of_tenant;
  });
  blocks_size_ = blocks_size_ - lifted;
}

std::size_t OutcomeBreaker::windows() const {
  std::lock_guard lock(mutex_);
  return windows_.size();
}

std::size_t OutcomeBreaker::blocked_pairs(std::int64_t now_ms) const {
  std::lock_guard lock(mutex_);
  std::size_t n = 0;
  for (const auto& [served, blocks] : blocks_) {
    for (const Block& b : blocks) n += b.until_ms >= now_ms ? 1 : 0;
  }
  return n;
}

}  // namespace clm::store_impl
