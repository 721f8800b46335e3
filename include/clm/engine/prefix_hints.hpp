// clm/engine/prefix_hints.hpp: the Engine's priorities that expire
// (Engine::hint_prefix): a host that knows a conversation will continue sets
// a priority along its cached prefix for a while; when the time is over the
// prefix drops back to priority 0, unless a later hint under the same key
// (the conversation's next turn) has replaced it. Bookkeeping only: the
// Engine sets the tree's priorities, under its own lock, which guards this
// table too.
//
//   clm::PrefixHints hints(/*capacity=*/4096);
//   hints.put("tenant\x1f" "conversation-7", tokens, ns, now + ttl);   // replaces that key's hint
//   hints.expire(now, [&](const clm::PrefixHints::Hint& h) { /* set priority 0 along h.tokens */ });
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <string>
#include <unordered_map>
#include <vector>

namespace clm {

class PrefixHints {
 public:
  using Clock = std::chrono::steady_clock;
  struct Hint {
    std::string key;
    std::vector<std::int32_t> tokens;  // the prefix it raised
    std::string salt;
    std::int32_t adapter_id = 0;
    Clock::time_point expires{};
  };

  explicit PrefixHints(std::size_t capacity) : capacity_(capacity) {}

  std::size_t size() const { return hints_.size(); }
  bool empty() const { return hints_.empty(); }
  std::size_t capacity() const { return capacity_; }

  // Records `hint` under its key, replacing (without expiring) that key's
  // earlier one; true when it replaced one. The caller first makes room
  // (expire_first) when size() == capacity() and the key is new. All or
  // nothing: on bad_alloc the table is as it was.
  bool put(Hint hint) {
    const auto expiry = by_expiry_.emplace(hint.expires, hint.key);
    const auto it = hints_.find(hint.key);
    if (it == hints_.end()) {
      try {
        std::string key = hint.key;
        hints_.emplace(std::move(key), std::move(hint));
      } catch (...) {
        by_expiry_.erase(expiry);
        throw;
      }
      return false;
    }
    remove_expiry(it->second);
    it->second = std::move(hint);  // moves: no allocation
    return true;
  }
  bool contains(const std::string& key) const { return hints_.count(key) > 0; }

  // Takes every hint expired at `now` out, oldest first, and hands each to
  // `expired` (which sets its prefix back to priority 0).
  template <class Expired>
  void expire(Clock::time_point now, Expired&& expired) {
    while (!by_expiry_.empty() && by_expiry_.begin()->first <= now) expire_first(expired);
  }
  // The hint that expires first, taken out early (to make room).
  template <class Expired>
  void expire_first(Expired&& expired) {
    if (by_expiry_.empty()) return;
    const auto first = by_expiry_.begin();
    const auto it = hints_.find(first->second);  // the indexes always agree
    by_expiry_.erase(first);
    const Hint hint = std::move(it->second);
    hints_.erase(it);
    expired(hint);
  }

 private:
  void remove_expiry(const Hint& hint) {
    const auto [first, last] = by_expiry_.equal_range(hint.expires);
    for (auto it = first; it != last; ++it) {
      if (it->second == hint.key) {
        by_expiry_.erase(it);
        return;
      }
    }
  }

  std::size_t capacity_;
  std::unordered_map<std::string, Hint> hints_;
  std::multimap<Clock::time_point, std::string> by_expiry_;
};

}  // namespace clm
