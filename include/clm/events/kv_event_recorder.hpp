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
//   recorder.take(events, 1024);                     // oldest first (one taking thread)
//
// A block's hash is a 64-bit chain over the prefix, as the page keys of
// clm/tiers/page_key.hpp are over the same inputs: XXH3 (64-bit, xxHash
// 0.8) of the page's token ids (little-endian int32) seeded with the
// previous page's hash, and the first page's with
// the namespace's seed (the first 8 bytes of SHA-256 of the scope, the salt
// and the adapter: the model, the deployment's secret when pages are signed,
// the tenant). So the same page has the same hash in every instance of one
// model and secret, a stored, a removed and a parent hash always agree, and
// tenants' chains start apart. Not SHA-256 per page: that was three quarters
// of the cost of events to an engine (bench_events); nor xxHash64 (until
// 2026-12-05): its chain, one page's hash the next one's seed, waits 15 ns a
// page here against XXH3's 6.5. A router only keys
// on these hashes (it hashes the token ids with its own scheme); a collision
// would mislead a router's bookkeeping, never serve a wrong page. The salt
// itself is never sent: each block's extra key is its digest.
//
// What the recording thread does is kept small, because it runs inside the
// engine's calls: an event is a compact record in a log (a node's token ids
// copied into one flat array that keeps its storage), and the thread that
// takes the log does the rest: it hashes each node's pages once (the
// recording thread only notes which nodes it has described to it), keeps
// them while the node is on a tier, and builds the events or their views.
//
// Threads: the observer calls, record_cleared, resync and cached_blocks run
// under the lock of the tree's owner (its notes are that lock's); take and
// take_views are called by one thread (the publisher's), which owns the
// hashes; queued, oldest, metrics and the counters may be called from any
// thread.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
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
  // contents, reusing its events' storage); returns how many. One thread.
  std::size_t take(std::vector<KvEvent>& out, std::size_t max);
  // The same as views into the recorder's storage (replacing `out`'s
  // contents), valid until the next take or take_views: what a publisher
  // encodes from without building events. The same one thread as take.
  std::size_t take_views(std::vector<KvEventView>& out, std::size_t max);
  // An event of `out` keeps token-id storage for the next take only up to
  // kMaxKeptTokens ids, and a batch's events up to kMaxKeptTokenTotal in all.
  static constexpr std::size_t kMaxKeptTokens = 8192;
  static constexpr std::size_t kMaxKeptTokenTotal = std::size_t{1} << 21;
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
  // block's extra key) and its adapter: learnt once per namespace. Never
  // freed (the map only grows): records and the taking thread point at them.
  struct Namespace {
    std::uint64_t seed = 0;
    std::string digest;
    std::int32_t adapter_id = 0;
  };
  // One entry of the log. define: node (index, generation) has these tokens,
  // chained from the last hash of `parent` (-1: the namespace's seed);
  // stored and removed: the node's last `pages` pages (a split leaves the
  // lower half with the node's index and its last pages), with the define
  // folded in when `define` is set; forget: the node left both tiers.
  enum class Op : std::uint8_t { cleared, define, stored, removed };
  struct Record {
    Op op = Op::cleared;
    KvMedium medium = KvMedium::gpu;
    bool define = false, forget = false, token_ids = false;  // token_ids: the tokens go in the event too
    std::int32_t index = -1, parent = -1;
    std::uint32_t generation = 0, parent_generation = 0;
    std::size_t pages = 0;
    const Namespace* ns = nullptr;         // define
    const std::int32_t* tokens = nullptr;  // in the log's blocks
    std::size_t token_count = 0;
  };
  // Records in order and their tokens, in blocks that never move (a log
  // that grows allocates a block, copying nothing); cleared, a log keeps its
  // blocks (within kMaxLogTokens) for the records to come.
  struct Log {
    struct Block {
      std::unique_ptr<std::int32_t[]> data;
      std::size_t capacity = 0;
    };
    std::vector<Record> records;
    std::vector<Block> blocks;
    std::size_t block = 0, used = 0;  // the next tokens go to blocks[block] at `used`
    std::size_t events = 0;           // records that are events (all but defines)
    // A copy of `tokens` in the log's blocks. May throw std::bad_alloc, changing nothing.
    const std::int32_t* put(std::span<const std::int32_t> tokens);
    void clear() noexcept;
  };
  static constexpr std::size_t kLogBlockTokens = std::size_t{1} << 16;  // 256 KiB
  static constexpr std::size_t kMaxLogTokens = std::size_t{1} << 22;    // kept past a clear (16 MiB)
  // The recording thread's note of a node slot: whether the taking thread's
  // entry for it (Entry) is this node's (same generation), and its namespace.
  struct Known {
    std::uint32_t generation = 0;
    bool described = false;
    const Namespace* ns = nullptr;
  };
  // The taking thread's entry of a node slot: its page hashes.
  struct Entry {
    std::uint32_t generation = 0;
    const Namespace* ns = nullptr;
    std::vector<std::uint64_t> hashes;
  };
  // An event of the batch being built: its record, and its hashes in batch_hashes_.
  struct Built {
    const Record* record = nullptr;
    std::size_t hashes_at = 0, hash_count = 0;
    std::optional<std::uint64_t> parent;
    const Namespace* ns = nullptr;
  };

  void record(const RadixTree& tree, std::int32_t index, Tier tier, bool stored) noexcept;
  const Namespace& namespace_of(const RadixTree& tree, std::int32_t index) const;
  bool described(std::int32_t index, std::uint32_t generation) const;
  // Appends to `log` a define for every node from `index` up that the taking
  // thread does not know, top first, all but `index` itself when `fold_own`
  // (its define then rides on the caller's record); returns `index`'s
  // namespace. May throw std::bad_alloc, leaving `log` and known_ consistent
  // (what it appended stays, and is noted).
  const Namespace& describe(const RadixTree& tree, std::int32_t index, bool fold_own, Log& log) const;
  // Node `index`'s record of kind `op`: the node, its pages and its parent.
  Record node_record(const RadixTree& tree, std::int32_t index, const NodeView& v, Op op) const;
  static void append(Log& log, const Record& r, std::span<const std::int32_t> tokens);
  void lose_queue(std::uint64_t also) noexcept;  // under queue_mutex_
  void reset_known() noexcept;
  // The taking thread's: claims records [first, end) of taken_ holding at
  // most `max` events, then builds them into built_ (false: the log did not
  // fit the entries, a resync is asked for and the batch dropped).
  std::size_t claim(std::size_t max, std::size_t& first, std::size_t& end);
  bool build(std::size_t first, std::size_t end);
  std::uint64_t chain_hashes(std::uint64_t above, std::span<const std::int32_t> tokens,
                             std::vector<std::uint64_t>& out) const;
  KvEventView view(const Built& b) const;
  void fill(const Built& b, KvEvent& out, std::size_t& kept_tokens) const;

  const std::int32_t page_size_;
  const Digest32 scope_;
  const std::size_t capacity_;
  const bool token_ids_;

  // The owner's lock: each node slot's note, by node index, and each namespace.
  mutable std::vector<Known> known_;
  mutable std::map<std::pair<std::string, std::int32_t>, Namespace> namespaces_;

  mutable std::mutex queue_mutex_;
  // The queue: what the recording thread appends to. The taking thread swaps
  // it whole for taken_ (the emptied log it last took), then builds events
  // from taken_ outside the lock, a batch at a time.
  Log queue_;
  std::chrono::steady_clock::time_point oldest_{};  // of queue_'s first event
  std::uint64_t epoch_ = 0;                         // bumped when what is queued is lost or replaced
  std::size_t taken_left_ = 0;                      // taken_'s events not yet handed out (under the lock)
  std::chrono::steady_clock::time_point taken_oldest_{};
  std::size_t wake_threshold_ = 0;
  std::function<void()> wake_;
  // The taking thread's own: the log it takes from, the node entries, the
  // batch being built, and events kept for a batch larger than the last.
  Log taken_;
  std::size_t taken_head_ = 0;
  std::uint64_t taken_epoch_ = 0;
  std::vector<Entry> entries_;
  std::vector<Built> built_;
  std::vector<std::uint64_t> batch_hashes_;
  std::vector<KvEvent> slots_;

  std::atomic<bool> resync_needed_{false};
  std::atomic<std::uint64_t> recorded_{0}, dropped_{0}, resyncs_{0};
};

}  // namespace clm
