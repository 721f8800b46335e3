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
//   std::vector<clm::PrefixHints::Hint> due;
//   hints.take_expired(now, due);                 // set priority 0 along each due[i].tokens
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
  // (take_oldest) when size() == capacity() and the key is new.
  bool put(Hint hint) {
    bool replaced = false;
    if (const auto it = hints_.find(hint.key); it != hints_.end()) {
      remove_expiry(it->second);
      hints_.erase(it);
      replaced = true;
    }
    by_expiry_.emplace(hint.expires, hint.key);
    std::string key = hint.key;
    hints_.emplace(std::move(key), std::move(hint));
    return replaced;
  }
  bool contains(const std::string& key) const { return hints_.count(key) > 0; }

  // Moves every hint expired at `now` into `out` (appended), oldest first.
  void take_expired(Clock::time_point now, std::vector<Hint>& out) {
    while (!by_expiry_.empty() && by_expiry_.begin()->first <= now) take_first(out);
  }
  bool any_expired(Clock::time_point now) const { return !by_expiry_.empty() && by_expiry_.begin()->first <= now; }
  // The hint that expires first, taken out early (to make room).
  void take_oldest(std::vector<Hint>& out) {
    if (!by_expiry_.empty()) take_first(out);
  }

 private:
  void take_first(std::vector<Hint>& out) {
    const auto first = by_expiry_.begin();
    const auto it = hints_.find(first->second);
    by_expiry_.erase(first);
    out.push_back(std::move(it->second));
    hints_.erase(it);
  }
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
