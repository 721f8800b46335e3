// clm/tiers/tier_manager.hpp: the moving parts of the tiered KV cache, which
// the Engine owns when EngineConfig::tiers.host_pages > 0: the host pool
// (L2), the page copier, the storage backend (L3) and the worker threads that
// copy pages between them. The Engine calls it; hosts use the Engine.
//
//   std::unique_ptr<clm::TierManager> tiers;
//   CLM_RETURN_IF_ERROR(clm::TierManager::create(config.tiers, config.model_id, device_pool, tiers));
//   clm::RadixTree tree(device_pool, policy, fraction, tiers->host_pool());
//   tiers->start(tree, engine_mutex);       // workers take engine_mutex to reach the tree
//   ...                                     // admit: fetch(), load(); under the lock: on_hit(), on_evictions()
//   tiers->stop();                          // before the tree goes
//
// Jobs and their guards (docs/tiers.md): a write-through copy locks its
// device node (never evicted while read) and holds its host pages until
// insert_host() takes them; a storage write host_pins its node; a fetch
// host_pins the node its pages hang below and moves the pin down as batches
// land. No storage call runs under the engine lock, and no copy but
// write-back's: it runs inside a device eviction, which must read the pages
// before they are reused (docs/tiers.md).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <vector>

#include "clm/cache/paged_kv_pool.hpp"
#include "clm/cache/radix_tree.hpp"
#include "clm/detail/spin_mutex.hpp"
#include "clm/status.hpp"
#include "clm/tiers/page_copier.hpp"
#include "clm/tiers/page_key.hpp"
#include "clm/tiers/storage_backend.hpp"
#include "clm/tiers/storage_breaker.hpp"
#include "clm/tiers/tier_config.hpp"

namespace clm {

// What one admission's fetch from storage brought in time.
struct FetchOutcome {
  std::int32_t first_token = 0;     // where the fetched pages start
  std::int32_t fetched_tokens = 0;  // whole pages from first_token on, in the host tier when fetch() returned
  bool timed_out = false;
  bool failed = false;  // storage could not be asked (counted in storage_errors)
};

class TierManager {
 public:
  // invalid_argument for a bad setting, a storage tier without a model id, or
  // a page secret without a storage tier; the secret's own errors
  // (load_page_secret) as they are.
  static Status create(const TierConfig& config, std::string_view model_id, const PagedKvPool& device_pool,
                       std::unique_ptr<TierManager>& out);
  ~TierManager();
  TierManager(const TierManager&) = delete;
  TierManager& operator=(const TierManager&) = delete;

  PagedKvPool* host_pool() const { return host_pool_.get(); }
  const TierConfig& config() const { return config_; }
  bool has_storage() const { return storage_ != nullptr; }
  // What every page key is chained under (page_seal.hpp): the model, and the
  // secret when pages are signed; all zero without a storage tier.
  const Digest32& key_scope() const { return key_scope_; }

  // Starts the workers (and write-back, under write_back). Once.
  void start(RadixTree& tree, detail::SpinThenBlockMutex& engine_mutex);
  // Finishes running jobs, drops queued ones (their pages go back), joins.
  void stop();

  // ---- under the engine lock -------------------------------------------------
  // A match will be used: write-through copies of the hit path's nodes.
  void on_hit(NodeRef device_end);
  // Storage writes for the nodes write-back gave host copies since the last call.
  void on_evictions();
  // Admission accounting.
  void count_admission(std::int32_t device_tokens, std::int32_t host_tokens, std::int32_t storage_tokens);

  // ---- without the engine lock -------------------------------------------------
  // Fetches the pages of `tokens` past its first `host_backed_tokens` that
  // storage has into the host tier, waiting as the prefetch policy says
  // (not at all with wait = false: a prefetch), and never past
  // admission_deadline_ms. Only when storage has pages past the first
  // `cached_tokens` (what the tree holds, on any tier): pages still on the
  // device are never read again for nothing. Host copies form a prefix, so
  // when storage does have more, the device part without host copies is read
  // too. A fetch of a prefix already queued or running joins it; a full
  // queue drops its oldest prefetch (or this fetch); an open breaker asks
  // storage nothing. Storage failures are counted, never returned: the
  // caller recomputes.
  void fetch(std::span<const std::int32_t> tokens, const CacheNamespace& ns, std::int32_t host_backed_tokens,
             std::int32_t cached_tokens, bool wait, FetchOutcome& out);
  // Copies host pages back into device pages (a load-back).
  Status load(std::span<const std::int32_t> host_pages, std::span<const std::int32_t> device_pages);
  // Waits until every queued and running job is done (tests, shutdown of a host).
  void drain();
  // Whether device-to-host copies are queued or running (they lock device
  // pages), and a wait for them to finish.
  bool copies_in_flight() const;
  void wait_for_copies();

  TierMetrics metrics() const;

 private:
  struct CopyJob;
  struct StoreJob;
  struct FetchJob;

  TierManager(const TierConfig& config, std::unique_ptr<PagedKvPool> host_pool) noexcept;

  void copy_worker();
  void storage_worker();
  // A job that runs out of host memory outside the tree's calls is given up
  // and counted (worker_failures); false then. A worker thread must not end
  // the host's process.
  template <typename Job>
  bool run_counted(Job&& job);
  // RadixTree::insert_host under the engine lock, a std::bad_alloc as
  // out_of_memory: the call is all or nothing, so the caller's failure path
  // (its pages back to the pool, its lock or pin released) is the right one.
  Status insert_host(std::span<const std::int32_t> tokens, std::span<const std::int32_t> host_pages,
                     std::int32_t first_page, const CacheNamespace& ns, InsertOutcome& out);
  void run_copy(CopyJob& job);
  // Whether storage answered every call (what the breaker is told).
  bool run_store(StoreJob& job);
  bool run_fetch(FetchJob& job);
  // Under queue_mutex_: `job` done, its waiters woken.
  void end_fetch(FetchJob& job, bool failed);
  // Under queue_mutex_: a queued or running fetch that `tokens` (whole
  // pages) extends or is a prefix of, in `ns`; null if none.
  std::shared_ptr<FetchJob> fetch_of_prefix(std::span<const std::int32_t> tokens, const CacheNamespace& ns,
                                            bool running) const;
  void queue_store(NodeRef node);  // under the engine lock
  // Under queue_mutex_: the page keys cache (stored_keys_).
  static std::uint64_t key_cache_slot(NodeRef node) {
    return (static_cast<std::uint64_t>(static_cast<std::uint32_t>(node.index)) << 32) | node.generation;
  }
  void remember_key(NodeRef node, const PageKey& key);
  static constexpr std::size_t kMaxKeyCacheEntries = std::size_t{1} << 16;
  void cancel(CopyJob& job);  // under the engine lock
  void cancel(StoreJob& job);

  const TierConfig config_;
  std::unique_ptr<PagedKvPool> host_pool_;
  std::unique_ptr<PageCopier> copier_;
  std::unique_ptr<StorageBackend> storage_;
  Digest32 key_scope_{};  // the storage seal's (page_seal.hpp): every page key is chained under it
  RadixTree* tree_ = nullptr;
  detail::SpinThenBlockMutex* engine_mutex_ = nullptr;

  // Queues and counts; never held while the engine lock is taken.
  mutable std::mutex queue_mutex_;
  std::condition_variable queue_ready_;
  std::condition_variable queue_idle_;
  std::deque<std::unique_ptr<CopyJob>> copy_queue_;
  std::deque<std::shared_ptr<FetchJob>> fetch_queue_;
  std::vector<std::shared_ptr<FetchJob>> running_fetches_;
  std::uint64_t fetches_started_ = 0;  // a running fetch waits only for those started before it
  StorageBreaker breaker_;
  // Page keys by node (under queue_mutex_): the key of the last page of a
  // node whose pages, and those above it, storage holds (this instance
  // stored them, found them there, or fetched them). A store job hashes and
  // checks only what lies below the deepest such node of its path, so a
  // conversation's turn costs its own pages, not its whole history. A node's
  // generation changes when it is freed, so an entry never outlives it; and
  // its end never moves while it lives (a split gives the head to a new node,
  // the node keeps its end; with a host tier no leaf gives up only its tail),
  // so the key at its end stays the key of the same prefix.
  std::unordered_map<std::uint64_t, PageKey> stored_keys_;
  std::deque<std::unique_ptr<StoreJob>> store_queue_;
  int running_jobs_ = 0;
  int running_copies_ = 0;
  bool stopping_ = false;
  std::vector<std::thread> workers_;
  TierMetrics metrics_;  // under queue_mutex_
};

}  // namespace clm
