// clm/events/kv_event_recorder.hpp: the KV events of one radix tree, as it
// changes (a RadixTreeObserver): every node whose pages enter or leave the
// device pool or the host tier becomes one BlockStored or BlockRemoved, in
// the order the tree changed, into a bounded queue a publisher takes from
// (kv_event_publisher.hpp). Engine owns one when EngineConfig::kv_events is
// on; on its own:
//
//   clm::KvEventRecorder recorder(tree.page_size(), scope, /*capacity=*/4096);
//   tree.set_observer(&recorder);
//   recorder.record_cleared();                       // a new tree holds nothing
//   ... tree.insert(...), tree.evict(...) ...
//   std::vector<clm::KvEvent> events;
//   recorder.take(events, 1024);                     // oldest first
//
// A block's hash is a 64-bit chain over the prefix, as the page keys of
// clm/tiers/page_key.hpp are over the same inputs: xxHash64 of the page's
// token ids, seeded with the previous page's hash, and the first page's with
// the namespace's seed (the first 8 bytes of SHA-256 of the scope, the salt
// and the adapter: the model, the deployment's secret when pages are signed,
// the tenant). So the same page has the same hash in every instance of one
// model and secret, a stored, a removed and a parent hash always agree, and
// tenants' chains start apart. Not SHA-256 per page: that was three quarters
// of the cost of events to an engine (bench_events), and a router only keys
// on these hashes (it hashes the token ids with its own scheme); a collision
// would mislead a router's bookkeeping, never serve a wrong page. The salt
// itself is never sent: each block's extra key is its digest.
//
// Threads: the observer calls, resync and cached_blocks run under the lock of
// the tree's owner (its caches are that lock's); take, metrics and the
// counters may be called from any thread.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "clm/cache/radix_tree.hpp"
#include "clm/events/kv_event.hpp"
#include "clm/tiers/page_seal.hpp"

namespace clm {

class KvEventRecorder final : public RadixTreeObserver {
 public:
  // `scope`: PageSeal::key_scope() of the model (and secret). `capacity`:
  // events queued at most (past it: dropped, counted, and a resync needed).
  // `token_ids` false: stored events carry none (KvEventsConfig::token_ids).
  KvEventRecorder(std::int32_t page_size, const Digest32& scope, std::size_t capacity, bool token_ids = true);

  void pages_stored(const RadixTree& tree, std::int32_t index, Tier tier) noexcept override;
  void pages_removed(const RadixTree& tree, std::int32_t index, Tier tier) noexcept override;

  // AllBlocksCleared: the tree holds nothing (a new one, or a clear).
  void record_cleared() noexcept;
  // After drops: AllBlocksCleared, then a BlockStored for every node on each
  // tier, parents first. Clears resync_needed().
  void resync(const RadixTree& tree) noexcept;
  bool resync_needed() const { return resync_needed_.load(std::memory_order_acquire); }

  // The hashes of every page on `medium`, parents before children.
  // out_of_memory when the list cannot be made for want of memory.
  Status cached_blocks(const RadixTree& tree, KvMedium medium, std::vector<std::uint64_t>& out) const;

  // Moves up to `max` of the oldest queued events into `out` (replacing its
  // contents); returns how many.
  std::size_t take(std::vector<KvEvent>& out, std::size_t max);
  // Hands events back once sent (emptying `used`), so that their storage
  // serves the events to come: in a steady state the recording thread
  // allocates nothing for events, and frees nothing another thread made
  // (glibc keeps a chunk freed on another thread in that thread's cache,
  // and the recording thread's heap grows and faults in new pages). Keeps
  // at most kMaxSpares events (a burst's worth: an engine records thousands
  // between two batches), none holding more than kMaxSpareTokens ids, and at
  // most kMaxSpareTokenTotal ids of storage in all (8 MiB). Called from the
  // thread that calls take (one thread); holds the lock the recording thread
  // pushes under for a swap only.
  void recycle(std::vector<KvEvent>& used) noexcept;
  static constexpr std::size_t kMaxSpares = 16384;
  static constexpr std::size_t kMaxSpareTokens = 8192;
  static constexpr std::size_t kMaxSpareTokenTotal = std::size_t{1} << 21;
  std::size_t queued() const;
  // When the oldest queued event was recorded (the batch deadline counts from it).
  std::chrono::steady_clock::time_point oldest() const;
  // Called (from the recording thread, with no lock of ours held) when the
  // queue reaches `threshold` events, or needs a resync: wakes a publisher.
  void set_wakeup(std::size_t threshold, std::function<void()> wake);

  std::uint64_t recorded_events() const { return recorded_.load(std::memory_order_relaxed); }
  std::uint64_t dropped_events() const { return dropped_.load(std::memory_order_relaxed); }
  std::uint64_t resyncs() const { return resyncs_.load(std::memory_order_relaxed); }

  // The hash of the namespace's first page's parent (scope, salt, adapter).
  static std::uint64_t namespace_seed(const Digest32& scope, std::string_view salt, std::int32_t adapter_id);
  // The hash of a page of `page_tokens` after the page hashed `parent`.
  static std::uint64_t next_block_hash(std::uint64_t parent, std::span<const std::int32_t> page_tokens);
  // "salt:" and the first 32 hex digits of SHA-256(salt); empty for "".
  static std::string salt_digest(std::string_view salt);

 private:
  // A namespace's seed (the first page's parent), its salt's digest (each
  // block's extra key) and its adapter: learnt once per namespace.
  struct Namespace {
    std::uint64_t seed = 0;
    std::string digest;
    std::int32_t adapter_id = 0;
  };
  // A node's page hashes, computed once (a node leaves a tier with the hashes
  // it entered with; the last is its children's parent), and its namespace,
  // which its children share. A split leaves the lower half with the node's
  // index and its last pages: the last hashes of the entry are still its own.
  struct Tail {
    std::uint32_t generation = 0;
    const Namespace* ns = nullptr;
    std::vector<std::uint64_t> hashes;
  };
  void record(const RadixTree& tree, std::int32_t index, Tier tier, bool stored) noexcept;
  void node_event(const RadixTree& tree, std::int32_t index, KvMedium medium, bool stored, KvEvent& out) const;
  const Tail& known_tail(const RadixTree& tree, std::int32_t index) const;
  // Node `index`'s entry if it is still that node's (same generation) and hashed; else nullptr.
  const Tail* known_entry(std::int32_t index, std::uint32_t generation) const;
  Tail& hash_node(std::int32_t index, const NodeView& v, const Namespace& ns, std::uint64_t above) const;
  const Namespace& namespace_of(const RadixTree& tree, std::int32_t index) const;
  void lose_queue(std::uint64_t also) noexcept;
  void push(KvEvent&& event) noexcept;
  KvEvent spare_event() noexcept;  // the owner's lock: a recycled event's storage, or a new event

  const std::int32_t page_size_;
  const Digest32 scope_;
  const std::size_t capacity_;
  const bool token_ids_;

  // The owner's lock: each node's entry, by node index (a slot whose node
  // left both tiers is emptied, keeping its storage for the next node there;
  // the generation tells a slot's nodes apart), and each namespace (a map:
  // its entries do not move, the nodes' entries point at them).
  mutable std::vector<Tail> tails_;
  mutable std::map<std::pair<std::string, std::int32_t>, Namespace> namespaces_;

  mutable std::mutex queue_mutex_;
  // The queue: queue_[queue_head_, size()), oldest first. A vector whose
  // capacity stays (cleared when drained), not a deque whose blocks the
  // taking thread would free.
  std::vector<KvEvent> queue_;
  std::size_t queue_head_ = 0;
  std::vector<KvEvent> spares_;        // handed back by recycle(), for the recording thread to take
  std::vector<KvEvent> local_spares_;  // the owner's lock: spares_ taken in one swap
  // The taking thread's own: events handed back and not yet in spares_ (which
  // they replace in one swap once the recording thread has emptied it), and
  // the token-id capacity they hold.
  std::vector<KvEvent> returned_;
  std::size_t returned_tokens_ = 0;
  std::chrono::steady_clock::time_point oldest_{};
  std::size_t wake_threshold_ = 0;
  std::function<void()> wake_;

  std::atomic<bool> resync_needed_{false};
  std::atomic<std::uint64_t> recorded_{0}, dropped_{0}, resyncs_{0};
};

}  // namespace clm
