// clm/engine/prefix_pins.hpp: the Engine's table of pinned prefixes
// (Engine::pin_prefix): each pin holds a lock on the deepest tree node of a
// cached prefix for a time to live, within a budget of pool pages; an
// admission whose match covers a pinned node refreshes its pins, and pins
// past their time are taken out to be unlocked. Bookkeeping only: the Engine
// takes and releases the tree's locks, under its own lock, which guards this
// table too.
//
//   clm::PrefixPins pins(/*budget_pages=*/1024);
//   if (!pins.fits(pages)) return out_of_memory("pin budget ...");
//   const std::uint64_t id = pins.add(node, pages, std::chrono::minutes(5), now);
//   pins.refresh_node(node.index, now);            // a hit on the pinned prefix
//   pins.expire(now, [&](const clm::PrefixPins::Pin& p) { tree.unlock(p.node); });
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <unordered_map>
#include <vector>

#include "clm/cache/radix_tree_types.hpp"

namespace clm {

class PrefixPins {
 public:
  using Clock = std::chrono::steady_clock;
  struct Pin {
    std::uint64_t id = 0;
    NodeRef node;            // locked while the pin lasts
    std::int32_t pages = 0;  // the prefix's pages (what the budget counts)
    Clock::duration ttl{};   // each refresh sets the expiry this far ahead
    Clock::time_point expires{};
  };

  explicit PrefixPins(std::int64_t budget_pages) : budget_(budget_pages) {}

  std::int64_t budget_pages() const { return budget_; }
  std::int64_t pinned_pages() const { return pinned_; }
  std::size_t size() const { return pins_.size(); }
  bool empty() const { return pins_.empty(); }
  bool fits(std::int64_t pages) const { return pinned_ + pages <= budget_; }

  // A new pin (the caller checked fits() and locked `node`); its id, never 0.
  // All or nothing: on bad_alloc the table is as it was.
  std::uint64_t add(NodeRef node, std::int32_t pages, Clock::duration ttl, Clock::time_point now) {
    const std::uint64_t id = next_id_;
    const Pin pin{id, node, pages, ttl, now + ttl};
    const auto placed = pins_.emplace(id, pin).first;
    try {
      const auto expiry = by_expiry_.emplace(pin.expires, id);
      try {
        by_node_.emplace(node.index, id);
      } catch (...) {
        by_expiry_.erase(expiry);
        throw;
      }
    } catch (...) {
      pins_.erase(placed);
      throw;
    }
    ++next_id_;
    pinned_ += pages;
    return id;
  }

  // Takes pin `id` out (the caller unlocks its node); nullopt when unknown.
  std::optional<Pin> remove(std::uint64_t id) {
    const auto it = pins_.find(id);
    if (it == pins_.end()) return std::nullopt;
    Pin pin = it->second;
    erase_index(pin);
    pins_.erase(it);
    pinned_ -= pin.pages;
    return pin;
  }

  bool has_node(std::int32_t node_index) const { return by_node_.count(node_index) > 0; }

  // The pins on node `node_index` now expire their ttl after `now`.
  void refresh_node(std::int32_t node_index, Clock::time_point now) {
    const auto [first, last] = by_node_.equal_range(node_index);
    for (auto it = first; it != last; ++it) {
      Pin& pin = pins_.at(it->second);
      remove_expiry(pin);
      pin.expires = now + pin.ttl;
      by_expiry_.emplace(pin.expires, pin.id);
    }
  }

  // Takes every pin expired at `now` out, oldest first, and hands each to
  // `expired` (which unlocks its node). Allocates nothing.
  template <class Expired>
  void expire(Clock::time_point now, Expired&& expired) {
    while (!by_expiry_.empty() && by_expiry_.begin()->first <= now) {
      const std::optional<Pin> pin = remove(by_expiry_.begin()->second);
      expired(*pin);  // the indexes always agree: every expiry names a pin
    }
  }

 private:
  void remove_expiry(const Pin& pin) {
    const auto [first, last] = by_expiry_.equal_range(pin.expires);
    for (auto it = first; it != last; ++it) {
      if (it->second == pin.id) {
        by_expiry_.erase(it);
        return;
      }
    }
  }
  void erase_index(const Pin& pin) {
    remove_expiry(pin);
    const auto [first, last] = by_node_.equal_range(pin.node.index);
    for (auto it = first; it != last; ++it) {
      if (it->second == pin.id) {
        by_node_.erase(it);
        return;
      }
    }
  }

  std::int64_t budget_;
  std::int64_t pinned_ = 0;
  std::uint64_t next_id_ = 1;
  std::unordered_map<std::uint64_t, Pin> pins_;
  std::multimap<Clock::time_point, std::uint64_t> by_expiry_;
  std::unordered_multimap<std::int32_t, std::uint64_t> by_node_;
};

}  // namespace clm
