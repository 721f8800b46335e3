// examples/fleet/fleet_index.hpp: what a cache-aware router knows of each
// clmcache instance, learnt from its KV events alone (docs/fleet.md): the
// block hashes it holds on each medium, and how many leading pages of a
// prompt each one would find cached.
//
//   FleetIndex index(3);
//   index.apply(instance, batch);                        // each decoded batch, in order
//   std::vector<std::uint64_t> hashes = prompt_block_hashes(scope, salt, tokens, page_size);
//   std::vector<std::size_t> pages = index.matched_pages(hashes);   // per instance
//
// The hashes of a prompt are computed as the instances compute them (the
// chain of docs/fleet.md: XXH3 over each page's token ids, seeded with
// the namespace's seed), so the router and the instances agree on them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <span>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "clm/events/kv_event.hpp"
#include "clm/events/kv_event_recorder.hpp"

namespace clm_fleet {

class FleetIndex {
 public:
  explicit FleetIndex(std::size_t instances) : held_(instances) {}

  // One batch of `instance`'s stream, in order (thread-safe).
  void apply(std::size_t instance, const clm::KvEventBatch& batch) {
    std::lock_guard lock(mutex_);
    ++batches_;
    auto& held = held_.at(instance);
    for (const clm::KvEvent& e : batch.events) {
      const std::uint8_t medium = e.medium == clm::KvMedium::cpu ? 2 : 1;
      switch (e.kind) {
        case clm::KvEventKind::all_blocks_cleared:
          held.clear();
          break;
        case clm::KvEventKind::block_stored:
          for (std::uint64_t h : e.block_hashes) held[h] |= medium;
          break;
        case clm::KvEventKind::block_removed:
          for (std::uint64_t h : e.block_hashes) {
            const auto it = held.find(h);
            if (it == held.end()) continue;
            it->second &= static_cast<std::uint8_t>(~medium);
            if (it->second == 0) held.erase(it);
          }
          break;
      }
    }
  }

  // How many batches it has applied: a scheduler waits for it to stop
  // growing before it trusts what the index says.
  std::uint64_t batches_applied() const {
    std::lock_guard lock(mutex_);
    return batches_;
  }

  // Per instance, how many of `hashes` (a prompt's pages, in order) it holds
  // on some medium before the first it lacks.
  std::vector<std::size_t> matched_pages(const std::vector<std::uint64_t>& hashes) const {
    std::lock_guard lock(mutex_);
    std::vector<std::size_t> out(held_.size(), 0);
    for (std::size_t i = 0; i < held_.size(); ++i) {
      while (out[i] < hashes.size() && held_[i].count(hashes[out[i]])) ++out[i];
    }
    return out;
  }

 private:
  mutable std::mutex mutex_;
  std::uint64_t batches_ = 0;
  std::vector<std::unordered_map<std::uint64_t, std::uint8_t>> held_;  // hash -> media (1 GPU, 2 CPU)
};

// The block hashes of a prompt's whole pages, as an instance of the model
// whose PageSeal::key_scope() is `scope` hashes them for tenant `salt`.
inline std::vector<std::uint64_t> prompt_block_hashes(const clm::Digest32& scope, std::string_view salt,
                                                      std::span<const std::int32_t> tokens, std::int32_t page_size) {
  std::vector<std::uint64_t> out;
  std::uint64_t h = clm::KvEventRecorder::namespace_seed(scope, salt, 0);
  const auto page = static_cast<std::size_t>(page_size);
  for (std::size_t at = 0; at + page <= tokens.size(); at += page) {
    h = clm::KvEventRecorder::next_block_hash(h, tokens.subspan(at, page));
    out.push_back(h);
  }
  return out;
}

}  // namespace clm_fleet
