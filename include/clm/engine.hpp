// clm/engine.hpp: the one class a host talks to. It owns the KV pool and the
// prefix cache (and, as they land, the tiers and the CLM parts), all set up
// from one EngineConfig, and runs the request lifecycle over them.
//
//   clm::EngineConfig config;
//   config.pool.num_pages = 65536; config.pool.page_size = 16;
//   config.pool.num_layers = 32; config.pool.kv_heads = 8; config.pool.head_dim = 128;
//   std::unique_ptr<clm::Engine> engine;
//   CLM_RETURN_IF_ERROR(clm::Engine::create(config, engine));
//
//   clm::Admission a;
//   CLM_RETURN_IF_ERROR(engine->admit(prompt, {.cache_salt = "tenant-7"}, a));
//   // prompt[0, a.cached_tokens) is cached in a.page_table; write the K/V of
//   // prompt[a.cached_tokens, len) into a.slots (slot = page * page_size + row).
//   std::vector<int64_t> slots;
//   CLM_RETURN_IF_ERROR(engine->extend(a.seq, {&next_token, 1}, slots));  // decode
//   CLM_RETURN_IF_ERROR(engine->finish(a.seq));  // publish prompt + output, unlock
//
// Lifecycle: admit matches the longest cached prefix (page-aligned, at most
// len-1 tokens), locks it, and allocates fresh pages for the rest of the
// prompt, evicting unlocked prefixes when the pool is short. extend appends
// tokens whose K/V the host will write, allocating a page whenever the last
// one fills. finish inserts every token of the sequence into the cache and
// unlocks; abort releases without caching. A sequence id is never reused, so
// a finish after abort, or a second finish, is reported as such.
//
// Thread safety: every method may be called from any thread at once. One
// lock guards the pool, the tree and the sequence table; copying tokens in and
// computing slots out happen outside it. The lock spins a few microseconds
// before it sleeps (detail/spin_mutex.hpp): critical sections are shorter than
// a futex round trip, and with a plain std::mutex two threads on one Engine
// ran at 0.64x the requests/s of one; with it, 1.4x (bench_engine).
//
// Files: the class is here; most structs its calls take and return are in
// engine/ (engine_config.hpp: EngineConfig; admission.hpp: AdmitOptions,
// Admission, AdmissionPlan, PagedBatch; engine_metrics.hpp: EngineMetrics),
// and the code of the CLM snapshot calls is in engine/engine_snapshots.hpp.
// Include this header only: it brings all of them.
#pragma once

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <mutex>  // std::lock_guard
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include <fmt/format.h>

#include "clm/cache/eviction_policy.hpp"
#include "clm/cache/paged_kv_pool.hpp"
#include "clm/cache/radix_tree.hpp"
#include "clm/detail/spin_mutex.hpp"
#include "clm/engine/admission.hpp"
#include "clm/engine/clm_watch.hpp"
#include "clm/engine/engine_config.hpp"
#include "clm/engine/engine_metrics.hpp"
#include "clm/engine/prefix_hints.hpp"
#include "clm/engine/prefix_pins.hpp"
#include "clm/events/kv_event_publisher.hpp"
#include "clm/events/kv_event_recorder.hpp"
#include "clm/metrics/metrics_text.hpp"
#include "clm/model/snapshot_adapter.hpp"
#include "clm/model/snapshot_projection.hpp"
#include "clm/model/src_tracker.hpp"
#include "clm/status.hpp"
#include "clm/store/snapshot_store.hpp"
#include "clm/tiers/tier_manager.hpp"

namespace clm {

// One suffix of a snapshot lookup or record: the user's text (the store's
// SuffixKeyer makes the key), or the host's own key and the group level 2
// must agree on (store/suffix_key.hpp, from_host_key).
struct SuffixRef {
  std::string_view text = {};
  bool is_key = false;
  std::string_view group = {};
};

class Engine {
 public:
  // The longest sequence (prompt + output) the Engine holds.
  static constexpr std::size_t kMaxTokens = std::size_t{1} << 30;

  static Status create(const EngineConfig& config, std::unique_ptr<Engine>& out) {
    if (config.eviction_policy == EvictionPolicy::belady) {
      return invalid_argument(
          "eviction policy belady is an offline reference that needs every future request: only the replay tool "
          "(examples/replay, --policy belady) can run it");
    }
    if (config.eviction_policy > EvictionPolicy::ghost_slru) return invalid_argument("unknown eviction policy");
    if (!(config.slru_protected_fraction >= 0.0 && config.slru_protected_fraction <= 1.0)) {
      return invalid_argument(
          fmt::format("slru_protected_fraction must be in [0, 1], got {}", config.slru_protected_fraction));
    }
    if (!(config.ghost_slru_protected_fraction >= 0.0 && config.ghost_slru_protected_fraction <= 1.0)) {
      return invalid_argument(
          fmt::format("ghost_slru_protected_fraction must be in [0, 1], got {}", config.ghost_slru_protected_fraction));
    }
    if (!(config.ghost_slru_memory >= 0.0 && config.ghost_slru_memory <= kMaxGhostMemory)) {
      return invalid_argument(fmt::format("ghost_slru_memory must be in [0, {}] pool capacities, got {}",
                                          kMaxGhostMemory, config.ghost_slru_memory));
    }
    CLM_RETURN_IF_ERROR(check_src_gate_config(config.src_gate));
    for (std::int32_t id : config.special_token_ids) {
      if (id < 0) return invalid_argument(fmt::format("special_token_ids: token id {} is negative", id));
    }
    std::unique_ptr<PagedKvPool> pool;
    CLM_RETURN_IF_ERROR(PagedKvPool::create(config.pool, pool));
    std::unique_ptr<TierManager> tiers;
    if (config.tiers.host_pages < 0) {
      return invalid_argument(
          fmt::format("tiers: host_pages must be >= 0 (0: no tiers), got {}", config.tiers.host_pages));
    }
    if (config.tiers.host_pages > 0) {
      CLM_RETURN_IF_ERROR(TierManager::create(config.tiers, config.model_id, *pool, tiers));
    } else if (!config.tiers.storage_url.empty()) {
      return invalid_argument("tiers: a storage tier needs a host tier (tiers.host_pages > 0)");
    } else if (!config.tiers.page_secret_file.empty() || !config.tiers.page_secret_env.empty()) {
      return invalid_argument("tiers: a page secret without a storage tier (tiers.storage_url) signs nothing");
    }
    if (!(config.pin_budget_fraction >= 0.0 && config.pin_budget_fraction <= 1.0)) {
      return invalid_argument(fmt::format("pin_budget_fraction must be in [0, 1], got {}", config.pin_budget_fraction));
    }
    if (config.max_priority_hints < 1) {
      return invalid_argument(fmt::format("max_priority_hints must be >= 1, got {}", config.max_priority_hints));
    }
    if (config.max_pin_ttl.count() < 1) {
      return invalid_argument(fmt::format("max_pin_ttl must be >= 1 ms, got {} ms", config.max_pin_ttl.count()));
    }
    CLM_RETURN_IF_ERROR(check_divergence_config(config.divergence));
    if (config.kv_events.enabled && config.model_id.empty()) {
      return invalid_argument("kv_events: needs model_id (the block hashes name the model, as stored pages do)");
    }
    CLM_RETURN_IF_ERROR(check_clm_watch_config(config.clm_watch));
    // The CLM watch hears the store's events from its first record on.
    auto watch = std::make_shared<ClmWatch>(config.clm_watch);
    std::unique_ptr<SnapshotStore> store;
    if (!config.snapshot_store.path.empty()) {
      SnapshotStoreConfig store_config = config.snapshot_store;
      store_config.on_event = [watch, host = config.snapshot_store.on_event](const SnapshotStoreEvent& e) {
        if (host) host(e);
        std::string_view salt;
        std::int32_t adapter_id = 0;
        snapshot_tenant_parts(e.tenant, salt, adapter_id);
        watch->store_event(e, salt, adapter_id, &KvEventRecorder::salt_digest);
      };
      CLM_RETURN_IF_ERROR(SnapshotStore::open(store_config, store));
    }
    std::unique_ptr<Engine> engine(new Engine(config, std::move(pool), std::move(tiers)));
    engine->store_ = std::move(store);
    engine->clm_watch_ = std::move(watch);
    CLM_RETURN_IF_ERROR(engine->tree_->set_divergence(config.divergence));
    if (config.kv_events.enabled) CLM_RETURN_IF_ERROR(engine->start_kv_events());
    if (engine->tiers_) engine->tiers_->start(*engine->tree_, engine->mutex_);
    out = std::move(engine);
    return {};
  }
  ~Engine() {
    kv_publisher_.reset();  // its thread may call back (a resync): first
    abort_all();
    if (tiers_) tiers_->stop();  // its jobs hold tree nodes; the tree holds its host pages
    tree_.reset();
  }
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  const EngineConfig& config() const { return config_; }
  std::int32_t page_size() const { return page_size_; }
  // The pool's KV memory; its layout is documented in paged_kv_pool.hpp. The
  // data pointer never changes; page contents belong to the sequence whose
  // table holds the page.
  const PagedKvPool& pool() const { return *pool_; }

  Status admit(std::span<const std::int32_t> prompt, const AdmitOptions& options, Admission& out) {
    CLM_RETURN_IF_ERROR(check_admission(prompt, options, "admit"));
    const bool from_storage = tiers_ && tiers_->has_storage();
    // The ids are read first by the storage fetch when there is one (so check
    // them all before it), else by the tree, which checks only what it did not
    // match: a cached prefix is never scanned twice.
    if (from_storage) CLM_RETURN_IF_ERROR(detail::check_token_ids(prompt, 0, "admit"));
    auto seq = std::make_unique<Sequence>();
    seq->salt.assign(options.cache_salt);
    seq->tenant_name.assign(options.tenant);
    seq->adapter_id = options.adapter_id;
    seq->priority = options.priority;
    seq->priority_update = options.priority_update;
    seq->tokens.assign(prompt.begin(), prompt.end());
    const std::size_t total_pages = pages_for(prompt.size());
    out.host_tokens = out.storage_tokens = 0;
    FetchOutcome fetched;
    if (from_storage) fetch_from_storage(prompt, seq->cache_namespace(), true, fetched);
    {
      std::unique_lock lock(mutex_);
      CLM_RETURN_IF_ERROR(tree_->match_prefix(prompt, seq->cache_namespace(), match_, "admit"));
      CLM_RETURN_IF_ERROR(tree_->lock(match_.node));
      if (!pins_.empty()) refresh_pins_on_path(match_.node);
      if (!hints_.empty()) expire_hints(PrefixHints::Clock::now());
      // The host-only part (match_ is shared scratch: what a load-back needs is kept here).
      const bool load_back = match_.host_tokens > 0;
      const NodeRef host_node = match_.host_node;
      std::vector<std::int32_t> host_pages;
      if (load_back) {
        (void)tree_->host_pin(host_node);  // a live node with a host copy: cannot fail
        host_pages.swap(match_.host_pages);
      }
      seq->pages.swap(match_.pages);
      seq->tree_pages = seq->pages.size();
      seq->locked = match_.node;
      seq->pages.resize(total_pages);
      // (Our own locks and pins hold while retry_after_copies waits.)
      const Status allocated =
          retry_after_copies(lock, [&] { return allocate(std::span(seq->pages).subspan(seq->tree_pages)); });
      if (!allocated.ok()) {
        if (load_back) (void)tree_->host_unpin(host_node);
        (void)tree_->unlock(seq->locked);
        ++metrics_.rejected;
        if (tiers_) tiers_->on_evictions();
        return allocated;
      }
      if (load_back) load_from_host(lock, *seq, host_pages, host_node, fetched, out);
      if (tiers_) {
        const auto device = static_cast<std::int32_t>(seq->tree_pages) * page_size_ - out.host_tokens;
        tiers_->count_admission(device, out.host_tokens - out.storage_tokens, out.storage_tokens);
        tiers_->on_evictions();
        tiers_->on_hit(seq->locked);
      }
      out.seq = next_id_++;
      // Under the lock, like abort_all's removal: an abort_all between our
      // unlock and a later add would leave a dead sequence tracked forever.
      src_.add(out.seq);
      out.cached_tokens = static_cast<std::int32_t>(seq->tree_pages) * page_size_;
      sequences_.emplace(out.seq, std::move(seq));
      ++metrics_.admitted;
      // Copied under the lock: the table may change as soon as it is released.
      const Sequence& admitted = *sequences_.find(out.seq)->second;
      out.page_table.assign(admitted.pages.begin(), admitted.pages.end());
    }
    slots_for(out.page_table, static_cast<std::size_t>(out.cached_tokens), prompt.size(), out.slots);
    return {};
  }

  // What admit(prompt, options) would take from the pool now, with nothing
  // changed: no match counted, no recency, no lock, no page allocated or
  // evicted. The same errors as admit() for a bad prompt or priority.
  Status plan_admission(std::span<const std::int32_t> prompt, const AdmitOptions& options, AdmissionPlan& out) const {
    CLM_RETURN_IF_ERROR(check_admission(prompt, options, "plan_admission"));
    PrefixPeek peek;
    std::lock_guard lock(mutex_);
    CLM_RETURN_IF_ERROR(tree_->peek_prefix(prompt, {options.cache_salt, options.adapter_id}, peek, "plan_admission"));
    out.cached_tokens = peek.cached_tokens;
    out.new_pages = static_cast<std::int32_t>(pages_for(prompt.size())) - peek.cached_tokens / page_size_;
    out.unlocked_pages = peek.unlocked_tokens / page_size_;
    out.pages_free = pool_->free_pages();
    out.evictable_tokens = tree_->evictable_tokens();
    return {};
  }

  // Appends tokens (decode steps); `slots` receives where to write their K/V,
  // and `page_table`, when given, the sequence's whole page table afterwards.
  Status extend(SequenceId id, std::span<const std::int32_t> tokens, std::vector<std::int64_t>& slots,
                std::vector<std::int32_t>* page_table = nullptr) {
    if (tokens.size() > kMaxTokens) return invalid_argument("extend: sequence would be too long");
    CLM_RETURN_IF_ERROR(detail::check_token_ids(tokens, 0, "extend"));
    std::vector<std::int32_t> pages;
    std::size_t first = 0;
    std::unique_lock lock(mutex_);
    // grow() looks the sequence up on each try: another thread may end it while retry_after_copies waits.
    const Status grown = retry_after_copies(lock, [&] { return grow(id, tokens, pages, first, page_table); });
    lock.unlock();
    CLM_RETURN_IF_ERROR(grown);
    slots_for(pages, first, first + tokens.size(), slots);
    return {};
  }

  // ---- tiers (tiers/tier_config.hpp, docs/tiers.md) -------------------------
  // Starts fetching the pages of `prompt` that only storage has into the host
  // tier, and returns: a host calls it when a request arrives, and admit()
  // later finds them there (best_effort admissions wait for nothing).
  // failed_precondition without a storage tier; then the same errors as
  // admit() for a bad prompt or options.
  Status prefetch(std::span<const std::int32_t> prompt, const AdmitOptions& options) {
    if (!tiers_ || !tiers_->has_storage()) return failed_precondition("prefetch: the engine has no storage tier");
    CLM_RETURN_IF_ERROR(check_admission(prompt, options, "prefetch"));
    CLM_RETURN_IF_ERROR(detail::check_token_ids(prompt, 0, "prefetch"));  // before the storage fetch reads them
    FetchOutcome ignored;
    fetch_from_storage(prompt, {options.cache_salt, options.adapter_id}, false, ignored);
    return {};
  }
  // Waits until the tiers' copies and storage reads and writes queued so far are done.
  void wait_for_tiers() {
    if (tiers_) tiers_->drain();
  }

  // Publishes prompt + output into the cache and ends the sequence.
  Status finish(SequenceId id) {
    std::unique_ptr<Sequence> seq;
    {
      std::lock_guard lock(mutex_);
      Sequence* found = nullptr;
      CLM_RETURN_IF_ERROR(find(id, "finish", found));
      InsertOutcome done;
      CLM_RETURN_IF_ERROR(tree_->insert(found->tokens, found->pages, found->cache_namespace(), done, found->priority,
                                        found->priority_update));
      // The tree took the pages of the stored part; the partial last page is ours.
      (void)pool_->release(std::span(found->pages).subspan(static_cast<std::size_t>(done.stored_tokens / page_size_)));
      (void)tree_->unlock(found->locked);
      seq = take(id);
      ++metrics_.finished;
    }
    src_.remove(id);
    return {};  // `seq` is freed outside the lock
  }

  // Ends the sequence without caching anything it computed.
  Status abort(SequenceId id) {
    std::unique_ptr<Sequence> seq;
    {
      std::lock_guard lock(mutex_);
      Sequence* found = nullptr;
      CLM_RETURN_IF_ERROR(find(id, "abort", found));
      (void)pool_->release(std::span(found->pages).subspan(found->tree_pages));
      (void)tree_->unlock(found->locked);
      seq = take(id);
      ++metrics_.aborted;
    }
    src_.remove(id);
    return {};
  }

  // Ends every running sequence as abort() would (a host shutting down).
  void abort_all() {
    std::lock_guard lock(mutex_);
    for (auto& [id, seq] : sequences_) {
      (void)tree_->unlock(seq->locked);
      (void)pool_->release(std::span(seq->pages).subspan(seq->tree_pages));
      src_.remove(id);
      ++metrics_.aborted;
    }
    sequences_.clear();
  }

  Status page_table(SequenceId id, std::vector<std::int32_t>& pages, std::int32_t* tokens = nullptr) {
    std::lock_guard lock(mutex_);
    Sequence* seq = nullptr;
    CLM_RETURN_IF_ERROR(find(id, "page_table", seq));
    pages.assign(seq->pages.begin(), seq->pages.end());
    if (tokens) *tokens = static_cast<std::int32_t>(seq->tokens.size());
    return {};
  }

  // The page tables of `ids` (each running, each once) in FlashInfer's CSR
  // form, for attention kernels. `out` is left as it was on error.
  Status batch_page_table(std::span<const SequenceId> ids, PagedBatch& out) {
    std::vector<SequenceId> sorted(ids.begin(), ids.end());
    std::sort(sorted.begin(), sorted.end());
    if (auto twice = std::adjacent_find(sorted.begin(), sorted.end()); twice != sorted.end()) {
      return invalid_argument(fmt::format("batch_page_table: sequence {} is in the batch more than once", *twice));
    }
    PagedBatch batch;
    std::lock_guard lock(mutex_);
    std::size_t total = 0;
    for (SequenceId id : ids) {
      Sequence* seq = nullptr;
      CLM_RETURN_IF_ERROR(find(id, "batch_page_table", seq));
      total += seq->pages.size();
    }
    // indptr holds int32 offsets into indices.
    if (total > static_cast<std::size_t>(std::numeric_limits<std::int32_t>::max())) {
      return invalid_argument(fmt::format(
          "batch_page_table: {} sequences hold {} pages in all, more than int32 offsets reach", ids.size(), total));
    }
    batch.indptr.reserve(ids.size() + 1);
    batch.indices.reserve(total);
    batch.last_page_len.reserve(ids.size());
    batch.indptr.push_back(0);
    for (SequenceId id : ids) {
      const Sequence& seq = *sequences_.find(id)->second;
      batch.indices.insert(batch.indices.end(), seq.pages.begin(), seq.pages.end());
      batch.indptr.push_back(static_cast<std::int32_t>(batch.indices.size()));
      // A sequence holds at most kMaxTokens (2^30) tokens: its length fits.
      const auto len = static_cast<std::int32_t>(seq.tokens.size());
      batch.last_page_len.push_back(len - (static_cast<std::int32_t>(seq.pages.size()) - 1) * page_size_);
    }
    out = std::move(batch);
    return {};
  }

  // ---- CLM: the SRC head over running sequences (src_tracker.hpp) ----------
  // Installs the SRC head (shared: several engines may use one); nullptr removes it.
  void set_src_head(std::shared_ptr<const SrcHead> head) { src_.set_head(std::move(head)); }
  std::shared_ptr<const SrcHead> src_head() const { return src_.head(); }

  // One SRC step over running sequences: attn_out holds the new rows of one
  // layer's attention output, sequence ids[i] owning rows indptr[i] ..
  // indptr[i+1]-1, token_ids their ids. Each sequence's mean runs over all its
  // non-special rows so far; decisions_out[i] says whether to look up and
  // inject a snapshot. Nothing changes on error.
  Status src_step(std::span<const SequenceId> ids, ConstActivationView attn_out,
                  std::span<const std::int32_t> token_ids, std::span<const std::int32_t> indptr,
                  std::span<SrcDecision> decisions_out) {
    return src_.step(ids, attn_out, token_ids, indptr, decisions_out);
  }
  // The same step for a GPU host: attn_out and token_ids in device memory,
  // queued on `stream` (a cudaStream_t), the running sums kept on the device
  // (clm::cuda::CudaSrcSums; only the batch's scores come back). Waits for
  // the device. failed_precondition until set_device_src_sums.
  Status src_step_device(std::span<const SequenceId> ids, ConstActivationView attn_out, const std::int32_t* token_ids,
                         std::span<const std::int32_t> indptr, std::span<SrcDecision> decisions_out, void* stream) {
    return src_.step_device(ids, attn_out, token_ids, indptr, decisions_out, stream);
  }
  // The device sums of src_step_device (one per engine: the rows are its
  // tracker's); nullptr removes them.
  void set_device_src_sums(std::shared_ptr<DeviceSrcSums> sums) { src_.set_device_sums(std::move(sums)); }
  // Whether each lookup the last step asked for found a snapshot (feeds the breaker).
  Status report_snapshot_retrieval(std::span<const SequenceId> ids, std::span<const std::uint8_t> found) {
    return src_.report_retrieval(ids, found);
  }
  bool src_baseline(SequenceId id) const { return src_.in_baseline(id); }

  // ---- CLM: snapshots (snapshot_projection.hpp, snapshot_adapter.hpp) -------
  // Installs the PCA projection that turns last-layer hidden states into
  // snapshots, and the adapter that injects them; nullptr removes either.
  void set_snapshot_projection(std::shared_ptr<const SnapshotProjection> projection) {
    std::lock_guard lock(clm_parts_mutex_);
    projection_ = std::move(projection);
  }
  void set_snapshot_adapter(std::shared_ptr<const SnapshotAdapter> adapter) {
    std::lock_guard lock(clm_parts_mutex_);
    adapter_ = std::move(adapter);
  }
  std::shared_ptr<const SnapshotProjection> snapshot_projection() const {
    std::lock_guard lock(clm_parts_mutex_);
    return projection_;
  }
  std::shared_ptr<const SnapshotAdapter> snapshot_adapter() const {
    std::lock_guard lock(clm_parts_mutex_);
    return adapter_;
  }

  // Snapshots of hidden-state rows [n][hidden] into out [n][snapshot_dim]:
  // projected, L2-normalised (what a host stores to reuse later).
  Status make_snapshots(ConstActivationView rows, std::span<float> out) const {
    const std::shared_ptr<const SnapshotProjection> projection = snapshot_projection();
    if (!projection) return failed_precondition("make_snapshots: no snapshot projection is installed");
    return projection->project(rows, out);
  }

  // Injects snapshots into one layer's hidden states of a ragged batch:
  // sequence ids[i] owns rows indptr[i] .. indptr[i+1]-1 and gets
  // residual_scale * adapter(snapshots[i]) added to each, when apply[i] != 0,
  // the sequence is not in baseline mode, and the adapter injects at `layer`.
  Status inject_snapshots(std::span<const SequenceId> ids, ActivationView hidden_states,
                          std::span<const std::int32_t> indptr, std::span<const float> snapshots,
                          std::span<const std::uint8_t> apply, std::int32_t layer);

  // ---- CLM: the snapshot store (store/snapshot_store.hpp; the code of these
  // calls is in engine/engine_snapshots.hpp) ------------------------------------
  // The store, or nullptr when EngineConfig::snapshot_store.path was empty.
  SnapshotStore* snapshot_store() const { return store_.get(); }

  // The key the store uses for `suffix`.
  Status suffix_key(const SuffixRef& suffix, SuffixKey& out) const;
  // The store's tenant of the sequences admitted with cache salt `salt` and
  // adapter `adapter_id`: the salt's bytes, then the id's 4 little-endian
  // bytes (as the prefix cache separates them). For administering a tenant's
  // snapshots (store/snapshot_store.hpp, "administration").
  static std::string snapshot_tenant(std::string_view salt, std::int32_t adapter_id) {
    std::string t(salt);
    for (int b = 0; b < 4; ++b) t.push_back(static_cast<char>(static_cast<std::uint32_t>(adapter_id) >> (8 * b)));
    return t;
  }
  // The salt and adapter id of a tenant snapshot_tenant made (a tenant of
  // fewer than 4 bytes, which no sequence has: itself as the salt, adapter 0).
  static void snapshot_tenant_parts(std::string_view tenant, std::string_view& salt, std::int32_t& adapter_id) {
    adapter_id = 0;
    salt = tenant;
    if (tenant.size() < 4) return;
    std::uint32_t id = 0;
    for (std::size_t b = 0; b < 4; ++b) {
      id |= static_cast<std::uint32_t>(static_cast<unsigned char>(tenant[tenant.size() - 4 + b])) << (8 * b);
    }
    adapter_id = static_cast<std::int32_t>(id);
    salt.remove_suffix(4);
  }

  // Looks up a snapshot for each sequence ids[i]: suffixes[i] names its
  // suffix, queries [n][snapshot_dim] (or empty: level 2 is skipped) its
  // query vectors. Writes hits[i], snapshots [n][snapshot_dim] (zeros on a
  // miss) and apply[i] (1 on a hit): what inject_snapshots takes. Each lookup
  // is reported to the SRC breaker as report_snapshot_retrieval would (found
  // = hit), so the host does not report it again. The tenant is the
  // sequence's cache salt and adapter id. Everything is checked first; on an
  // error no output is meaningful and no breaker state changed.
  Status lookup_snapshots(std::span<const SequenceId> ids, std::span<const SuffixRef> suffixes,
                          std::span<const float> queries, std::span<SnapshotHit> hits, std::span<float> snapshots,
                          std::span<std::uint8_t> apply);

  // Records a snapshot [snapshot_dim] of a sequence's suffix (store record():
  // admission, versions, drift), under the sequence's tenant.
  Status record_snapshot(SequenceId id, const SuffixRef& suffix, std::span<const float> snapshot,
                         RecordOutcome& outcome);

  // Whether the snapshot last served to each sequence was right (correct[i]
  // != 0): breaker (b) of the store counts it against the pair (the key the
  // lookup asked for, the key it served): a key served for itself is
  // blacklisted when its accuracy falls, a key served for another (levels 2
  // and 3) is refused to that one only. failed_precondition for a sequence
  // that was served nothing.
  Status report_snapshot_outcome(std::span<const SequenceId> ids, std::span<const std::uint8_t> correct);

  EngineMetrics metrics() const {
    // The tracker's and the store's own locks, taken before ours: never nested.
    const SrcMetrics src = src_.metrics();
    const SnapshotStoreMetrics store = store_ ? store_->metrics() : SnapshotStoreMetrics{};
    const TierMetrics tiers = tiers_ ? tiers_->metrics() : TierMetrics{};
    const KvEventsMetrics kv_events = kv_publisher_ ? kv_publisher_->metrics() : KvEventsMetrics{};
    const ClmWatchMetrics clm_watch = clm_watch_->metrics();
    std::lock_guard lock(mutex_);
    EngineMetrics m = metrics_;
    m.kv_events = kv_events;
    m.src = src;
    m.has_snapshot_store = store_ != nullptr;
    m.store = store;
    m.clm_watch = clm_watch;
    m.has_tiers = tiers_ != nullptr;
    if (tiers_) m.tiers = tiers;
    m.cache = tree_->metrics();
    m.tiers.host_pages_used = m.cache.host_pages_used;
    m.tiers.dropped_backups += m.cache.write_backs_dropped;
    m.active_sequences = static_cast<std::int64_t>(sequences_.size());
    m.pins_active = static_cast<std::int64_t>(pins_.size());
    m.pinned_pages = pins_.pinned_pages();
    m.pin_budget_pages = pins_.budget_pages();
    m.priority_hints_active = static_cast<std::int64_t>(hints_.size());
    return m;
  }

  // ---- priorities that expire -----------------------------------------------
  // A host's word that a conversation will continue: sets `priority` (1 to
  // 100) along the cached prefix of `tokens` (under options' salt and
  // adapter) now, as an admission with PriorityUpdate::set would, and back to
  // 0 once `ttl` has passed (at the next admission or hint after it), unless
  // a later hint under the same `key` (the conversation's next turn) has
  // replaced it: then that one's time counts, and the old one sets nothing
  // back. Under the priority and ghost_slru policies the prefix outranks
  // unhinted ones meanwhile. A prefix shared with another conversation (a
  // system prompt) drops to 0 with whichever hint expires first, as with
  // PriorityUpdate::set. At most max_priority_hints are held: past that the
  // one due first expires early. `reached`: the tokens found cached.
  // invalid_argument for an empty or long key, a bad prompt, a priority
  // outside [1, 100] or a ttl outside [1 ms, max_pin_ttl].
  Status hint_prefix(std::string_view key, std::span<const std::int32_t> tokens, const AdmitOptions& options,
                     int priority, std::chrono::milliseconds ttl, std::int32_t& reached) {
    CLM_RETURN_IF_ERROR(check_admission(tokens, options, "hint_prefix"));
    CLM_RETURN_IF_ERROR(detail::check_token_ids(tokens, 0, "hint_prefix"));
    if (key.empty() || key.size() > 4096) {
      return invalid_argument(fmt::format("hint_prefix: the key must be 1 to 4096 bytes, got {}", key.size()));
    }
    if (priority < 1 || priority > kMaxPriority) {
      return invalid_argument(fmt::format("hint_prefix: priority must be in [1, {}], got {}", kMaxPriority, priority));
    }
    if (ttl.count() < 1 || ttl > config_.max_pin_ttl) {
      return invalid_argument(
          fmt::format("hint_prefix: ttl must be in [1, {}] ms, got {} ms", config_.max_pin_ttl.count(), ttl.count()));
    }
    PrefixHints::Hint hint{.key = std::string(key),
                           .tokens = std::vector<std::int32_t>(tokens.begin(), tokens.end()),
                           .salt = std::string(options.cache_salt),
                           .adapter_id = options.adapter_id,
                           .expires = PrefixHints::Clock::now() + ttl};
    std::lock_guard lock(mutex_);
    expire_hints(PrefixHints::Clock::now());
    CLM_RETURN_IF_ERROR(
        tree_->set_prefix_priority(tokens, {options.cache_salt, options.adapter_id}, priority, reached, "hint_prefix"));
    if (hints_.size() >= hints_.capacity() && !hints_.contains(hint.key)) {
      hints_.expire_first([&](const auto& h) { drop_hint(h); });
    }
    if (hints_.put(std::move(hint))) ++metrics_.priority_hints_replaced;
    ++metrics_.priority_hints_created;
    return {};
  }

  // ---- pinned prefixes -------------------------------------------------------
  // Keeps the cached part of `tokens`' prefix (whole pages on the pool, under
  // options' salt and adapter) from eviction for `ttl`: its tree node is
  // locked as a running sequence's would be. Each admission whose match
  // covers the whole pinned prefix refreshes it to `ttl` again; it expires by
  // itself (at the next admission or pin call after its time), or unpin()
  // ends it. Pins share a budget of pin_budget_fraction of the pool's pages:
  // a pin past it is refused (out_of_memory, nothing pinned), never made room
  // for by dropping another. invalid_argument: a bad prompt or a ttl outside
  // [1 ms, max_pin_ttl]; not_found: nothing of the prefix is on the pool (pin
  // after the request that computed it has finished).
  Status pin_prefix(std::span<const std::int32_t> tokens, const AdmitOptions& options, std::chrono::milliseconds ttl,
                    PinResult& out) {
    CLM_RETURN_IF_ERROR(check_admission(tokens, options, "pin_prefix"));
    CLM_RETURN_IF_ERROR(detail::check_token_ids(tokens, 0, "pin_prefix"));
    if (ttl.count() < 1 || ttl > config_.max_pin_ttl) {
      return invalid_argument(
          fmt::format("pin_prefix: ttl must be in [1, {}] ms, got {} ms", config_.max_pin_ttl.count(), ttl.count()));
    }
    std::lock_guard lock(mutex_);
    const auto now = PrefixPins::Clock::now();
    expire_pins(now);
    NodeRef node;
    std::int32_t cached = 0;
    CLM_RETURN_IF_ERROR(
        tree_->device_prefix_node(tokens, {options.cache_salt, options.adapter_id}, node, cached, "pin_prefix"));
    if (cached == 0) {
      return not_found(
          "pin_prefix: nothing of this prefix is cached on the pool (pin it once a request has computed it)");
    }
    const std::int32_t pages = cached / page_size_;
    if (!pins_.fits(pages)) {
      ++metrics_.pins_refused;
      return out_of_memory(fmt::format("pin_prefix: the pin budget is {} pages, {} are pinned, this prefix has {}",
                                       pins_.budget_pages(), pins_.pinned_pages(), pages));
    }
    CLM_RETURN_IF_ERROR(tree_->lock(node));
    try {
      out.pin = pins_.add(node, pages, ttl, now);
    } catch (const std::bad_alloc&) {
      (void)tree_->unlock(node);
      return out_of_memory("pin_prefix: no memory for the pin");
    }
    out.pinned_tokens = cached;
    ++metrics_.pins_created;
    return {};
  }

  // Pages of the pin budget no pin holds now (what a host checks before it
  // promises a pin; a pin_prefix may still find less left by then).
  std::int64_t pin_pages_left() const {
    std::lock_guard lock(mutex_);
    return pins_.budget_pages() - pins_.pinned_pages();
  }

  // Ends pin `pin` (its prefix becomes evictable again unless others hold it).
  // not_found when it is unknown, already ended or expired.
  Status unpin(std::uint64_t pin) {
    std::lock_guard lock(mutex_);
    expire_pins(PrefixPins::Clock::now());
    const std::optional<PrefixPins::Pin> removed = pins_.remove(pin);
    if (!removed) return not_found(fmt::format("unpin: no pin {} (never made, ended or expired)", pin));
    return tree_->unlock(removed->node);
  }

  // metrics() as Prometheus text (metrics_text.hpp).
  std::string metrics_text() const { return format_metrics_text(metrics()); }

  // ---- CLM anomalies (EngineConfig::clm_watch, engine/clm_watch.hpp) ----------
  // Keys seen often with a low SRC score in the window, and the store's last
  // events (blacklists and their reasons, versions, drift). failed_precondition
  // without a snapshot store (no CLM) or with the watch off.
  Status clm_anomalies(ClmAnomalyReport& out) const {
    if (!store_) return failed_precondition("clm_anomalies: the engine has no snapshot store (no CLM parts)");
    if (!config_.clm_watch.enabled) {
      return failed_precondition("clm_anomalies: the CLM watch is off (EngineConfig::clm_watch.enabled)");
    }
    out = clm_watch_->report();
    return {};
  }

  // ---- divergence hot spots (EngineConfig::divergence, cache/divergence.hpp)
  // Per tenant, the branch points where the most admissions split off the
  // cached path with the fewest later hits past them, over the window ending
  // now. A tenant is the name admissions gave (AdmitOptions::tenant), else
  // its salt's digest ("salt:" and 32 hex digits; "" for no salt).
  // failed_precondition when divergence counting is off.
  Status divergence_report(const DivergenceReportOptions& options, DivergenceReport& out) {
    if (!config_.divergence.enabled) {
      return failed_precondition("divergence_report: divergence counting is off (EngineConfig::divergence.enabled)");
    }
    std::lock_guard lock(mutex_);
    return tree_->divergence_report(options, &KvEventRecorder::salt_digest, out);
  }

  // ---- KV events (EngineConfig::kv_events, events/) ------------------------
  // The hashes of every page now on `medium` (the pool, or the host tier),
  // parents first: what a subscriber that missed nothing holds for this
  // instance. failed_precondition when KV events are off.
  Status kv_event_blocks(KvMedium medium, std::vector<std::uint64_t>& out) const {
    if (!kv_recorder_) return failed_precondition("kv_event_blocks: KV events are off (EngineConfig::kv_events)");
    std::lock_guard lock(mutex_);
    return kv_recorder_->cached_blocks(*tree_, medium, out);
  }
  // Returns once every event so far is published (failed_precondition after `timeout`).
  Status flush_kv_events(std::chrono::milliseconds timeout) {
    if (!kv_publisher_) return failed_precondition("flush_kv_events: KV events are off (EngineConfig::kv_events)");
    return kv_publisher_->flush(timeout);
  }
  bool kv_events_enabled() const { return kv_publisher_ != nullptr; }
  // Publishes what is recorded, then stops publishing for good: no batch
  // goes out and no sink is called once it returns (clm_engine_free calls
  // it, so that a host's callback outlives no engine it was given to).
  void stop_kv_events() {
    if (kv_publisher_) kv_publisher_->stop();
  }
  // The endpoints as bound ("tcp://127.0.0.1:40123" for a "*" port); empty when off.
  std::string kv_events_endpoint() const { return kv_publisher_ ? kv_publisher_->endpoint() : std::string(); }
  std::string kv_events_replay_endpoint() const {
    return kv_publisher_ ? kv_publisher_->replay_endpoint() : std::string();
  }

  // For tests: the tree's invariants, and that every pool page is free, the
  // tree's, or held by exactly the running sequences that list it.
  Status check_invariants() const {
    std::lock_guard lock(mutex_);
    CLM_RETURN_IF_ERROR(tree_->check_invariants());
    std::int64_t held = admitting_pages_;
    for (const auto& [id, seq] : sequences_) held += static_cast<std::int64_t>(seq->pages.size() - seq->tree_pages);
    const std::int64_t tree_pages = tree_->cached_tokens() / page_size_;
    if (pool_->free_pages() + tree_pages + held != pool_->num_pages()) {
      return Status(StatusCode::internal, fmt::format("engine: {} free + {} cached + {} held by sequences != {} pages",
                                                      pool_->free_pages(), tree_pages, held, pool_->num_pages()));
    }
    return {};
  }

 private:
  struct Sequence {
    std::string salt;
    std::int32_t adapter_id = 0;
    int priority = 0;
    PriorityUpdate priority_update = PriorityUpdate::raise;
    std::vector<std::int32_t> tokens;
    std::vector<std::int32_t> pages;
    std::size_t tree_pages = 0;  // leading pages that are the tree's (protected by `locked`)
    NodeRef locked;
    std::string tenant_name;  // AdmitOptions::tenant, for reports
    // The keys of its sightings told to the CLM watch (once per sequence and
    // key): the last kMaxWatchedKeys, enough for any suffix a host looks up
    // again; a key older than those counts again.
    std::vector<std::uint64_t> watched_fingerprints;
    static constexpr std::size_t kMaxWatchedKeys = 64;
    SuffixKey looked_up;  // the key the last lookup asked for, when it served a snapshot
    SnapshotHit served;   // what it served (level miss: nothing, or it was reported)
    CacheNamespace cache_namespace() const { return {salt, adapter_id, tenant_name}; }
    // The snapshot store's tenant: salt and adapter, as the prefix cache separates them.
    std::string tenant() const { return snapshot_tenant(salt, adapter_id); }
  };

  // The snapshot calls' helpers (engine/engine_snapshots.hpp).
  static Status check_distinct(std::span<const SequenceId> ids, const char* what);
  Status tenants_of(std::span<const SequenceId> ids, const char* what, std::vector<std::string>& out);

  Engine(const EngineConfig& config, std::unique_ptr<PagedKvPool> pool, std::unique_ptr<TierManager> tiers)
      : config_(config),
        page_size_(config.pool.page_size),
        pool_(std::move(pool)),
        tiers_(std::move(tiers)),
        tree_(std::make_unique<RadixTree>(*pool_, config.eviction_policy,
                                          config.eviction_policy == EvictionPolicy::ghost_slru
                                              ? config.ghost_slru_protected_fraction
                                              : config.slru_protected_fraction,
                                          tiers_ ? tiers_->host_pool() : nullptr, config.ghost_slru_memory)),
        src_(config.src_gate, config.special_token_ids),
        pins_(static_cast<std::int64_t>(config.pin_budget_fraction * static_cast<double>(config.pool.num_pages))),
        hints_(static_cast<std::size_t>(config.max_priority_hints)) {}

  // Under the lock: unlocks the pins past their time.
  void expire_pins(PrefixPins::Clock::time_point now) {
    pins_.expire(now, [&](const PrefixPins::Pin& pin) {
      (void)tree_->unlock(pin.node);
      ++metrics_.pins_expired;
    });
  }

  // Under the lock: the hints past their time set their prefixes back to 0.
  void expire_hints(PrefixHints::Clock::time_point now) {
    hints_.expire(now, [&](const auto& h) { drop_hint(h); });
  }
  void drop_hint(const PrefixHints::Hint& h) {
    std::int32_t reached = 0;
    (void)tree_->set_prefix_priority(h.tokens, {h.salt, h.adapter_id}, 0, reached);  // checked when hinted
    ++metrics_.priority_hints_expired;
  }

  // Under the lock: an admission locked `matched`, so every pin on it or
  // above it is covered by the hit: their time starts again.
  void refresh_pins_on_path(NodeRef matched) {
    const auto now = PrefixPins::Clock::now();
    expire_pins(now);
    // (node_parent, not node_view: `matched` is a namespace root when nothing matched.)
    for (std::int32_t n = matched.index; n >= 0; n = tree_->node_parent(n)) {
      if (!pins_.has_node(n)) continue;
      pins_.refresh_node(n, now);
      ++metrics_.pins_refreshed;
    }
  }

  // Records the tree's changes from now on, starting with AllBlocksCleared
  // (this instance holds nothing), and publishes them.
  Status start_kv_events() {
    Digest32 scope{};
    if (tiers_ && tiers_->has_storage()) {
      scope = tiers_->key_scope();  // the same keys as the stored pages', secret included
    } else {
      PageSeal seal;
      CLM_RETURN_IF_ERROR(PageSeal::create(config_.model_id, {}, seal));
      scope = seal.key_scope();
    }
    kv_recorder_ = std::make_unique<KvEventRecorder>(
        page_size_, scope, static_cast<std::size_t>(std::max(1, config_.kv_events.queue_events)),
        config_.kv_events.token_ids);
    kv_recorder_->record_cleared();
    CLM_RETURN_IF_ERROR(KvEventPublisher::create(
        config_.kv_events, *kv_recorder_,
        [this] {
          std::lock_guard lock(mutex_);
          kv_recorder_->resync(*tree_);
        },
        kv_publisher_));
    tree_->set_observer(kv_recorder_.get());
    return {};
  }

  // Storage (L3): fetches what no tier holds of the prompt's whole pages
  // (up to len-1 tokens), waiting as the prefetch policy says when `wait`.
  void fetch_from_storage(std::span<const std::int32_t> prompt, const CacheNamespace& ns, bool wait,
                          FetchOutcome& fetched) {
    if (prompt.size() < 2 || prompt.size() > kMaxTokens) return;
    const auto limit =
        static_cast<std::int32_t>((prompt.size() - 1) / static_cast<std::size_t>(page_size_)) * page_size_;
    if (limit <= 0) return;
    std::int32_t cached = 0, host_backed = 0;
    {
      std::lock_guard lock(mutex_);
      tree_->coverage(prompt, ns, cached, host_backed);
    }
    if (cached >= limit) return;
    tiers_->fetch(prompt.first(static_cast<std::size_t>(limit)), ns, host_backed, cached, wait, fetched);
  }

  // The load-back of an admission, under the lock (released while copying):
  // the match found host_pages (host-only, ending at host_node) after the
  // device part; they are pinned, the device end locked, and seq.pages has fresh device pages from
  // seq.tree_pages on. On success those pages join the tree and the
  // sequence's lock moves to the end of the loaded part; if the copy fails
  // they are left for the host to compute.
  void load_from_host(std::unique_lock<detail::SpinThenBlockMutex>& lock, Sequence& seq,
                      std::span<const std::int32_t> host_pages, NodeRef host_node, const FetchOutcome& fetched,
                      Admission& out) {
    const std::size_t device = seq.tree_pages;
    const std::size_t head = device + host_pages.size();
    // The sequence is not registered yet: its fresh pages are counted here
    // while the lock is down, so that check_invariants finds every page.
    const auto unregistered = static_cast<std::int64_t>(seq.pages.size() - seq.tree_pages);
    admitting_pages_ += unregistered;
    lock.unlock();
    const Status loaded = tiers_->load(host_pages, std::span(seq.pages).subspan(device, host_pages.size()));
    lock.lock();
    admitting_pages_ -= unregistered;
    InsertOutcome done;
    if (loaded.ok() &&
        tree_
            ->insert(std::span(seq.tokens).first(head * static_cast<std::size_t>(page_size_)),
                     std::span(seq.pages).first(head), seq.cache_namespace(), done, seq.priority, seq.priority_update)
            .ok() &&
        tree_->lock(done.node).ok()) {
      (void)tree_->unlock(seq.locked);
      seq.locked = done.node;
      seq.tree_pages = head;
      const auto begin = static_cast<std::int32_t>(device) * page_size_;
      const auto end = static_cast<std::int32_t>(head) * page_size_;
      out.host_tokens = end - begin;
      out.storage_tokens = std::max(
          0, std::min(end, fetched.first_token + fetched.fetched_tokens) - std::max(begin, fetched.first_token));
    }
    (void)tree_->host_unpin(host_node);
  }

  // Runs attempt() (an allocation, under `lock`); when the pool is short
  // while copies to the host are in flight, which lock the device pages they
  // read, waits for them without the lock and runs it once more. attempt()
  // must find again anything another thread may change meanwhile.
  template <class Attempt>
  Status retry_after_copies(std::unique_lock<detail::SpinThenBlockMutex>& lock, Attempt&& attempt) {
    Status result = attempt();
    if (result.code() != StatusCode::out_of_memory || !tiers_ || !tiers_->copies_in_flight()) return result;
    lock.unlock();
    tiers_->wait_for_copies();
    lock.lock();
    return attempt();
  }

  // extend()'s part under the lock: the pages for `tokens` after sequence
  // id's, and the tokens appended, or nothing changed. `pages` gets the pages
  // the new tokens land in, `first` the first one's row in pages[0].
  Status grow(SequenceId id, std::span<const std::int32_t> tokens, std::vector<std::int32_t>& pages, std::size_t& first,
              std::vector<std::int32_t>* page_table) {
    Sequence* seq = nullptr;
    CLM_RETURN_IF_ERROR(find(id, "extend", seq));
    first = seq->tokens.size();
    if (tokens.size() > kMaxTokens - first) return invalid_argument("extend: sequence would be too long");
    const std::size_t old_pages = seq->pages.size();
    seq->pages.resize(pages_for(first + tokens.size()));
    const Status allocated = allocate(std::span(seq->pages).subspan(old_pages));
    if (tiers_) tiers_->on_evictions();
    if (!allocated.ok()) {
      seq->pages.resize(old_pages);
      return allocated;
    }
    seq->tokens.insert(seq->tokens.end(), tokens.begin(), tokens.end());
    const std::size_t first_page = first / static_cast<std::size_t>(page_size_);
    pages.assign(seq->pages.begin() + static_cast<std::ptrdiff_t>(first_page), seq->pages.end());
    first -= first_page * static_cast<std::size_t>(page_size_);
    if (page_table) page_table->assign(seq->pages.begin(), seq->pages.end());
    return {};
  }

  // tree_->allocate_pages, under the lock; a call that evicted (the only way
  // the device's cached tokens shrink) is timed into the histogram.
  Status allocate(std::span<std::int32_t> pages) {
    const std::int64_t cached = tree_->cached_tokens();
    const auto start = std::chrono::steady_clock::now();
    Status allocated = tree_->allocate_pages(pages);
    if (tree_->cached_tokens() < cached) {
      metrics_.eviction_duration.record(
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    }
    return allocated;
  }

  // What admit(), plan_admission() and prefetch() refuse, all three alike
  // (invalid_argument), before anything else reads the prompt: an empty
  // prompt, one longer than kMaxTokens (checked before any id is read;
  // extend() counts on every sequence holding at most kMaxTokens), a
  // priority or priority_update out of range. A token id outside [0, 2^31)
  // is refused as well, with the call's name, by whichever reads the ids
  // first: the storage fetch's check_token_ids, or the tree's match or peek
  // (which skips the part it matched: cached ids are valid). test_engine
  // "admit, plan_admission and prefetch refuse the same prompts" holds them
  // to it.
  static Status check_admission(std::span<const std::int32_t> prompt, const AdmitOptions& options, const char* what) {
    if (prompt.empty()) return invalid_argument(fmt::format("{}: empty prompt", what));
    if (prompt.size() > kMaxTokens) {
      return invalid_argument(fmt::format("{}: a prompt of {} tokens is longer than a sequence may be ({})", what,
                                          prompt.size(), kMaxTokens));
    }
    if (options.priority < 0 || options.priority > kMaxPriority) {
      return invalid_argument(
          fmt::format("{}: priority must be in [0, {}], got {}", what, kMaxPriority, options.priority));
    }
    if (!is_priority_update(static_cast<int>(options.priority_update))) {
      return invalid_argument(fmt::format("{}: priority_update must be raise (0) or set (1), got {}", what,
                                          static_cast<int>(options.priority_update)));
    }
    return {};
  }

  std::size_t pages_for(std::size_t tokens) const {
    return (tokens + static_cast<std::size_t>(page_size_) - 1) / static_cast<std::size_t>(page_size_);
  }

  // Slots of tokens [begin, end) of a sequence whose pages from token 0 are `pages`.
  void slots_for(const std::vector<std::int32_t>& pages, std::size_t begin, std::size_t end,
                 std::vector<std::int64_t>& slots) const {
    slots.resize(end - begin);
    const auto page = static_cast<std::size_t>(page_size_);
    for (std::size_t t = begin; t < end; ++t) {
      slots[t - begin] = static_cast<std::int64_t>(pages[t / page]) * page_size_ + static_cast<std::int64_t>(t % page);
    }
  }

  Status find(SequenceId id, const char* what, Sequence*& out) {
    auto it = sequences_.find(id);
    if (it != sequences_.end()) {
      out = it->second.get();
      return {};
    }
    if (id != 0 && id < next_id_) {
      return failed_precondition(fmt::format("{}: sequence {} has already finished or been aborted", what, id));
    }
    return not_found(fmt::format("{}: no sequence {}", what, id));
  }

  std::unique_ptr<Sequence> take(SequenceId id) {
    auto it = sequences_.find(id);
    std::unique_ptr<Sequence> seq = std::move(it->second);
    sequences_.erase(it);
    return seq;
  }

  const EngineConfig config_;
  const std::int32_t page_size_;
  mutable detail::SpinThenBlockMutex mutex_;
  std::unique_ptr<PagedKvPool> pool_;
  std::unique_ptr<TierManager> tiers_;  // the host pool in it outlives tree_ (see ~Engine)
  std::unique_ptr<RadixTree> tree_;
  std::unordered_map<SequenceId, std::unique_ptr<Sequence>> sequences_;
  SequenceId next_id_ = 1;
  std::int64_t admitting_pages_ = 0;  // pages of admissions loading from the host, lock down (under the mutex)
  PrefixMatch match_;                 // scratch, under the mutex
  EngineMetrics metrics_;
  SrcTracker src_;                      // its own lock: SRC steps never hold up the prefix cache
  PrefixPins pins_;                     // mutex_'s
  PrefixHints hints_;                   // mutex_'s
  mutable std::mutex clm_parts_mutex_;  // guards the two pointers below
  std::shared_ptr<const SnapshotProjection> projection_;
  std::shared_ptr<const SnapshotAdapter> adapter_;
  std::unique_ptr<SnapshotStore> store_;            // set once by create()
  std::shared_ptr<ClmWatch> clm_watch_;             // set once by create(); the store's events hold it too
  std::unique_ptr<KvEventRecorder> kv_recorder_;    // KV events: the tree's observer, and
  std::unique_ptr<KvEventPublisher> kv_publisher_;  // its publisher (both set once by create())
};

}  // namespace clm

// The code of the snapshot calls, out of the class.
#include "clm/engine/engine_snapshots.hpp"
