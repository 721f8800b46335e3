// clm/cache/divergence.hpp: where a prefix cache breaks. A timestamp or a
// random id early in a system prompt makes every request leave the cached
// path at the same depth, and the hit rate collapses with nothing to say why.
// The tree (RadixTree::match_prefix) tells a DivergenceSketch of each match
// that ends where a longer cached path goes on (a *branch point*: the request
// split off there) and of each match that went on past a branch point into
// one of its branches (a *hit*). The sketch keeps a bounded number of branch
// points (Space-Saving: the least split-at one goes when a new one comes),
// each with its counts over a sliding window and the tokens either side of
// the split; a report lists, per tenant, the points where many requests split
// off and few of the branches were ever reached again.
//
//   clm::DivergenceReport report;
//   CLM_RETURN_IF_ERROR(engine->divergence_report({.top_per_tenant = 3}, report));
//   for (const clm::BranchPoint& p : report.points)
//     fmt::print("{}: {} branches at token {}, {} hits\n", p.tenant, p.branches, p.depth, p.hits);
//   // support-bot: 5000 branches at token 412, 0 hits   <- "Current time: ..." at token 412
//
// Cost: a match that ends at a branch point costs a table lookup (and, for a
// point not seen before, an entry; a full sketch scans for its least entry);
// a match that passes one costs a table lookup; every match adds one to a
// depth histogram. Memory: `branch_points` entries of ~200 bytes plus their
// context tokens. Not thread-safe: the tree's owner serialises access.
#pragma once

#include <time.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cstdint>
#include <functional>
#include <map>
#include <new>
#include <span>
#include <string>
#include <string_view>
#include <tuple>
#include <unordered_map>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "clm/cache/radix_tree_types.hpp"
#include "clm/status.hpp"

namespace clm {

struct DivergenceConfig {
  bool enabled = true;                 // off: no branch points, no depth histogram (replay --no-divergence)
  std::int32_t branch_points = 256;    // sketch entries, [16, 65536]
  std::int64_t window_ms = 3'600'000;  // counts older than this (in half windows) drop out; >= 2
  std::int32_t context_tokens = 8;     // tokens kept either side of a split, [0, 64]
};

inline Status check_divergence_config(const DivergenceConfig& c) {
  if (c.branch_points < 16 || c.branch_points > 65536) {
    return invalid_argument(fmt::format("divergence: branch_points must be in [16, 65536], got {}", c.branch_points));
  }
  if (c.window_ms < 2) return invalid_argument(fmt::format("divergence: window_ms must be >= 2, got {}", c.window_ms));
  if (c.context_tokens < 0 || c.context_tokens > 64) {
    return invalid_argument(fmt::format("divergence: context_tokens must be in [0, 64], got {}", c.context_tokens));
  }
  return {};
}

// One branch point as a report gives it.
struct BranchPoint {
  // The tenant's name as the host gave it at admission (AdmitOptions::tenant);
  // a namespace admitted without one is named by its salt's digest (never the
  // salt itself), "" for the default namespace.
  std::string tenant;
  std::int32_t adapter_id = 0;
  std::int32_t depth = 0;      // tokens from the start of the prompt to the split (whole pages)
  std::uint64_t branches = 0;  // admissions that split off here, in the window
  std::uint64_t hits = 0;      // admissions that went on past it into a cached branch, in the window
  // Space-Saving's bound: `branches` may count up to this many splits of the
  // points this one replaced in the sketch (0 for a point never displaced).
  std::uint64_t overcount = 0;
  std::vector<std::int32_t> before;        // the prompt's tokens just before the split
  std::vector<std::int32_t> after;         // ... and just after it (the request that split off)
  std::vector<std::int32_t> cached_after;  // the cached path's tokens after it (what the request did not match)
  // Splits no later request reached a branch of: branches - hits, at least 0.
  std::uint64_t unreused() const { return branches > hits ? branches - hits : 0; }
};

struct DivergenceReportOptions {
  std::int32_t top_per_tenant = 5;  // >= 1
  std::uint64_t min_branches = 2;   // points with fewer splits in the window are left out
  std::string_view tenant = {};     // only this tenant (its name or salt digest); empty: all
};

struct DivergenceReport {
  // Per tenant, the points with the most unreused splits first (then the
  // deepest); tenants in the order of their first point.
  std::vector<BranchPoint> points;
  std::int64_t window_ms = 0;
  bool enabled = false;
};

class DivergenceSketch {
 public:
  using Clock = std::int64_t (*)();  // milliseconds, monotonic
  // The coarse monotonic clock (a few ms steps, which a window of minutes does
  // not see): 5 ns a read here against 32 for steady_clock.
  static std::int64_t coarse_ms() {
    timespec now{};
    clock_gettime(CLOCK_MONOTONIC_COARSE, &now);
    return static_cast<std::int64_t>(now.tv_sec) * 1000 + now.tv_nsec / 1'000'000;
  }

  explicit DivergenceSketch(const DivergenceConfig& config = {}) { configure(config); }

  // Takes a checked config (check_divergence_config); forgets every point.
  void configure(const DivergenceConfig& config) {
    config_ = config;
    half_window_ms_ = std::max<std::int64_t>(1, config.window_ms / 2);
    entries_.clear();
    index_.clear();
    entries_.reserve(static_cast<std::size_t>(config.branch_points));
    index_.reserve(static_cast<std::size_t>(config.branch_points));
    epoch_ = clock_() / half_window_ms_;
  }
  bool enabled() const { return config_.enabled; }
  const DivergenceConfig& config() const { return config_; }
  void set_clock(Clock clock) {
    clock_ = clock;
    epoch_ = clock_() / half_window_ms_;
  }

  // A request (`tokens`) split off at `depth` tokens from the cached path of
  // node `point` (which ends there), in namespace `ns`; `cached_after` is the
  // cached path's continuation when the split made the point (else empty: the
  // point keeps what it had). Never throws: a point it has no memory for is
  // not recorded.
  void record_split(NodeRef point, const CacheNamespace& ns, std::int32_t depth, std::span<const std::int32_t> tokens,
                    std::span<const std::int32_t> cached_after) noexcept {
    epoch_ = clock_() / half_window_ms_;
    try {
      Entry* e = find(point);
      if (!e) e = add(point, ns, depth, tokens, cached_after);
      roll(*e);
      ++e->branches[0];
    } catch (const std::bad_alloc&) {
      // Not recorded: the report is a sample, and a lookup never fails for it.
    }
  }

  // A request went on past branch point `point` into one of its branches.
  // Uses the epoch of the last split or report: no clock read on this path.
  void record_hit(NodeRef point) noexcept {
    if (auto it = index_.find(point.index); it != index_.end()) {
      Entry& e = entries_[it->second];
      if (e.point.generation != point.generation) return;
      roll(e);
      ++e.hits[0];
    }
  }

  // The points over the window ending now. `name_of_salt` names a namespace
  // admitted without a tenant name (the Engine passes a digest).
  Status report(const DivergenceReportOptions& options,
                const std::function<std::string(std::string_view)>& name_of_salt, DivergenceReport& out) {
    if (options.top_per_tenant < 1) {
      return invalid_argument(
          fmt::format("divergence report: top_per_tenant must be >= 1, got {}", options.top_per_tenant));
    }
    epoch_ = clock_() / half_window_ms_;
    DivergenceReport report;
    report.window_ms = config_.window_ms;
    report.enabled = config_.enabled;
    // Points of one tenant at one depth are one point to an operator (a
    // branch point evicted and made again is a new node).
    std::map<std::tuple<std::string, std::int32_t, std::int32_t>, BranchPoint> merged;
    for (Entry& e : entries_) {
      roll(e);
      std::string tenant = e.tenant_named ? e.tenant : name_of_salt(e.tenant);
      if (!options.tenant.empty() && tenant != options.tenant) continue;
      BranchPoint& p = merged[{tenant, e.adapter_id, e.depth}];
      if (p.branches == 0 && p.hits == 0) {
        p.tenant = std::move(tenant);
        p.adapter_id = e.adapter_id;
        p.depth = e.depth;
      }
      p.branches += e.branches[0] + e.branches[1];
      p.hits += e.hits[0] + e.hits[1];
      p.overcount += e.overcount;
      if (p.before.empty() && p.after.empty()) {
        p.before = e.before;
        p.after = e.after;
      }
      if (p.cached_after.empty()) p.cached_after = e.cached_after;
    }
    std::map<std::pair<std::string, std::int32_t>, std::vector<BranchPoint>> by_tenant;
    for (auto& [key, p] : merged) {
      if (p.branches < options.min_branches) continue;
      by_tenant[{p.tenant, p.adapter_id}].push_back(std::move(p));
    }
    std::vector<std::vector<BranchPoint>> tenants;
    for (auto& [key, points] : by_tenant) {
      std::sort(points.begin(), points.end(), [](const BranchPoint& a, const BranchPoint& b) {
        if (a.unreused() != b.unreused()) return a.unreused() > b.unreused();
        if (a.branches != b.branches) return a.branches > b.branches;
        return a.depth > b.depth;
      });
      points.resize(std::min(points.size(), static_cast<std::size_t>(options.top_per_tenant)));
      tenants.push_back(std::move(points));
    }
    std::stable_sort(tenants.begin(), tenants.end(),
                     [](const auto& a, const auto& b) { return a.front().unreused() > b.front().unreused(); });
    for (auto& points : tenants) {
      for (BranchPoint& p : points) report.points.push_back(std::move(p));
    }
    out = std::move(report);
    return {};
  }

  std::size_t memory_bytes() const {
    std::size_t bytes =
        entries_.capacity() * sizeof(Entry) + index_.bucket_count() * sizeof(void*) + index_.size() * 32;
    for (const Entry& e : entries_) {
      bytes += (e.before.capacity() + e.after.capacity() + e.cached_after.capacity()) * sizeof(std::int32_t);
      if (e.tenant.capacity() > 15) bytes += e.tenant.capacity();
    }
    return bytes;
  }

 private:
  struct Entry {
    NodeRef point;
    std::int64_t epoch = 0;                   // the half window branches[0] and hits[0] count
    std::array<std::uint64_t, 2> branches{};  // this half window, the one before
    std::array<std::uint64_t, 2> hits{};
    std::uint64_t overcount = 0;
    std::int32_t depth = 0;
    std::int32_t adapter_id = 0;
    bool tenant_named = false;  // tenant is the host's name; else it holds the salt, named at report time
    std::string tenant;
    std::vector<std::int32_t> before, after, cached_after;
  };

  Entry* find(NodeRef point) {
    auto it = index_.find(point.index);
    if (it == index_.end()) return nullptr;
    Entry& e = entries_[it->second];
    if (e.point.generation == point.generation) return &e;
    // The node was freed and its slot reused: the old point is gone from the tree.
    std::size_t slot = it->second;
    index_.erase(it);
    release(slot);
    return nullptr;
  }

  // Moves an entry's counts to the current half window.
  void roll(Entry& e) const {
    if (e.epoch == epoch_) return;
    if (e.epoch + 1 == epoch_) {
      e.branches = {0, e.branches[0]};
      e.hits = {0, e.hits[0]};
    } else {
      e.branches = {};
      e.hits = {};
    }
    e.epoch = epoch_;
  }

  Entry* add(NodeRef point, const CacheNamespace& ns, std::int32_t depth, std::span<const std::int32_t> tokens,
             std::span<const std::int32_t> cached_after) {
    Entry fresh;
    fresh.point = point;
    fresh.epoch = epoch_;
    fresh.depth = depth;
    fresh.adapter_id = ns.adapter_id;
    fresh.tenant_named = !ns.tenant.empty();
    fresh.tenant = std::string(fresh.tenant_named ? ns.tenant : ns.salt);
    const auto context = static_cast<std::size_t>(config_.context_tokens);
    const auto at = static_cast<std::size_t>(depth);
    const std::size_t from = at > context ? at - context : 0;
    fresh.before.assign(tokens.begin() + static_cast<std::ptrdiff_t>(from),
                        tokens.begin() + static_cast<std::ptrdiff_t>(at));
    const std::size_t to = std::min(tokens.size(), at + context);
    fresh.after.assign(tokens.begin() + static_cast<std::ptrdiff_t>(at),
                       tokens.begin() + static_cast<std::ptrdiff_t>(to));
    fresh.cached_after.assign(cached_after.begin(), cached_after.begin() + static_cast<std::ptrdiff_t>(
                                                                               std::min(context, cached_after.size())));
    if (entries_.size() < static_cast<std::size_t>(config_.branch_points)) {
      index_.emplace(point.index, entries_.size());  // may throw: nothing added yet
      entries_.push_back(std::move(fresh));          // capacity reserved: does not throw
      return &entries_.back();
    }
    // Space-Saving: the point split at least in the window goes; the newcomer
    // starts from its count, which bounds how far it may be overcounted.
    std::size_t least = 0;
    std::uint64_t least_count = ~std::uint64_t{0};
    for (std::size_t i = 0; i < entries_.size(); ++i) {
      roll(entries_[i]);
      const std::uint64_t count = entries_[i].branches[0] + entries_[i].branches[1];
      if (count < least_count) {
        least_count = count;
        least = i;
      }
    }
    index_.emplace(point.index, least);  // may throw: nothing replaced yet (find() took out a stale index)
    index_.erase(entries_[least].point.index);
    fresh.branches[0] = least_count;
    fresh.overcount = least_count;
    entries_[least] = std::move(fresh);
    return &entries_[least];
  }

  // Frees entry `slot` (already out of the index) by moving the last entry into it.
  void release(std::size_t slot) {
    const std::size_t last = entries_.size() - 1;
    if (slot != last) {
      entries_[slot] = std::move(entries_[last]);
      index_[entries_[slot].point.index] = slot;
    }
    entries_.pop_back();
  }

  DivergenceConfig config_;
  std::int64_t half_window_ms_ = 1;
  Clock clock_ = &coarse_ms;
  std::int64_t epoch_ = 0;
  std::vector<Entry> entries_;
  std::unordered_map<std::int32_t, std::size_t> index_;  // node index -> entry
};

}  // namespace clm
