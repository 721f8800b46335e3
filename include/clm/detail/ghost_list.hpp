// clm/detail/ghost_list.hpp: the ghost of EvictionPolicy::ghost_slru, a FIFO of
// the keys of recently evicted prefixes (no KV, no tokens: 8 bytes of key and
// the evicted length), bounded by the tokens those prefixes held.
//
// A prefix that is inserted again while its key is remembered came back soon
// after the cache gave it up: the tree admits it to the protected segment.
// Keys that are forgotten early (a hit) leave a dead FIFO entry behind, dropped
// when it reaches the front, so remember and forget are O(1) amortised. When
// every prefix keeps coming back the front may never move: once dead entries
// outnumber the live ones the FIFO is compacted, so it never holds more than
// about twice the live entries.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <unordered_map>

namespace clm::detail {

class GhostList {
 public:
  void set_capacity(std::int64_t tokens) { capacity_ = tokens; }
  std::int64_t capacity() const { return capacity_; }
  std::int64_t tokens() const { return tokens_; }
  std::size_t size() const { return live_.size(); }

  // Remembers an evicted prefix of `tokens` tokens (a key already remembered
  // is refreshed), then forgets the oldest ones beyond the capacity. May throw
  // std::bad_alloc; the list is then as it was, or without `key`.
  void remember(std::uint64_t key, std::int64_t tokens) {
    if (capacity_ <= 0) return;
    forget(key);
    const std::uint64_t serial = next_serial_++;
    fifo_.push_back({key, serial});
    try {
      live_.emplace(key, Live{serial, tokens});
    } catch (...) {
      fifo_.pop_back();
      throw;
    }
    tokens_ += tokens;
    while (!fifo_.empty() && (tokens_ > capacity_ || !is_live(fifo_.front()))) {
      const Entry front = fifo_.front();
      fifo_.pop_front();
      if (is_live(front)) {
        auto it = live_.find(front.key);
        tokens_ -= it->second.tokens;
        live_.erase(it);
      }
    }
    compact_if_mostly_dead();
  }

  // True when `key` was remembered; it is forgotten (a prefix comes back once).
  bool forget(std::uint64_t key) {
    auto it = live_.find(key);
    if (it == live_.end()) return false;
    tokens_ -= it->second.tokens;
    live_.erase(it);
    compact_if_mostly_dead();
    return true;
  }

  std::size_t memory_bytes() const {
    constexpr std::size_t kMapNode = 48;  // key, value, next pointer, cached hash, malloc's header
    return fifo_.size() * sizeof(Entry) + live_.bucket_count() * sizeof(void*) + live_.size() * kMapNode;
  }

  // For invariant checks: the tokens of the live entries, and within capacity.
  bool well_formed() const {
    std::int64_t sum = 0;
    for (const auto& [key, live] : live_) sum += live.tokens;
    return sum == tokens_ && (tokens_ <= capacity_ || capacity_ <= 0) && live_.size() <= fifo_.size() &&
           fifo_.size() <= 2 * live_.size() + kCompactSlack;
  }

 private:
  struct Entry {
    std::uint64_t key;
    std::uint64_t serial;
  };
  struct Live {
    std::uint64_t serial;
    std::int64_t tokens;
  };
  static constexpr std::size_t kCompactSlack = 64;  // below this many dead entries compacting is not worth it
  // Amortised O(1): it runs after at least half the FIFO died. Allocates
  // nothing (deque's shrink_to_fit is noexcept), so forget() cannot throw.
  void compact_if_mostly_dead() noexcept {
    if (fifo_.size() <= 2 * live_.size() + kCompactSlack) return;
    std::erase_if(fifo_, [&](const Entry& e) { return !is_live(e); });
    fifo_.shrink_to_fit();
  }
  bool is_live(const Entry& e) const {
    auto it = live_.find(e.key);
    return it != live_.end() && it->second.serial == e.serial;
  }

  std::deque<Entry> fifo_;
  std::unordered_map<std::uint64_t, Live> live_;
  std::uint64_t next_serial_ = 0;
  std::int64_t tokens_ = 0;
  std::int64_t capacity_ = 0;
};

}  // namespace clm::detail
