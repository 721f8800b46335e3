// TierManager: the workers of the tiered KV cache (clm/tiers/tier_manager.hpp).
//
// Locks: the engine lock (the tree, the pools) and queue_mutex_ (queues,
// counts) are never held together, except that queue_mutex_ may be taken
// briefly while the engine lock is held, never the other way round.
#include "clm/tiers/tier_manager.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <utility>

#include <fmt/format.h>
#include <openssl/crypto.h>

#include "clm/tiers/page_key.hpp"

namespace clm {

struct TierManager::CopyJob {
  NodeRef locked;  // the device node whose path is copied, locked until done
  std::int32_t first_page = 0;
  std::vector<std::int32_t> device_pages;
  std::vector<std::int32_t> host_pages;  // the job's until insert_host takes them
  std::vector<std::int32_t> tokens;      // the path, from the namespace root
  std::string salt;
  std::int32_t adapter_id = 0;
};

struct TierManager::StoreJob {
  NodeRef pinned;                       // host_pinned until done
  PathBelow path;                       // the pinned node's path below the deepest node whose page keys are known
  PageKey above_key = PageKey::root();  // the key of the last page above `path`
};

struct TierManager::FetchJob {
  std::vector<std::int32_t> tokens;  // whole pages
  std::string salt;
  std::int32_t adapter_id = 0;
  std::int32_t first_page = 0;
  std::int32_t cached_pages = 0;  // whole pages the tree held when asked: read only if storage has more
  // Progress, under queue_mutex_.
  std::int32_t landed_pages = 0;
  int waiters = 0;            // admissions waiting for it (none: a prefetch, the first a full queue drops)
  std::uint64_t started = 0;  // its place in the order fetches started (0: queued)
  bool done = false;
  bool failed = false;
  std::condition_variable progress;

  bool in(const CacheNamespace& ns) const { return salt == ns.salt && adapter_id == ns.adapter_id; }
};

namespace {

using Clock = std::chrono::steady_clock;
using EngineLock = std::lock_guard<detail::SpinThenBlockMutex>;

}  // namespace

Status TierManager::create(const TierConfig& config, std::string_view model_id, const PagedKvPool& device_pool,
                           std::unique_ptr<TierManager>& out) {
  if (config.host_pages <= 0) return invalid_argument("tiers: host_pages must be > 0 for a host tier");
  if (config.write_policy > WritePolicy::write_back) return invalid_argument("tiers: unknown write policy");
  if (config.prefetch_policy > PrefetchPolicy::timeout) return invalid_argument("tiers: unknown prefetch policy");
  if (!(config.prefetch_timeout_ms >= 0 && config.prefetch_timeout_ms <= 3.6e6) ||
      !(config.prefetch_timeout_per_1k_tokens_ms >= 0 && config.prefetch_timeout_per_1k_tokens_ms <= 3.6e6)) {
    return invalid_argument(fmt::format("tiers: prefetch timeouts must be in [0, 3600000] ms, got {} and {}",
                                        config.prefetch_timeout_ms, config.prefetch_timeout_per_1k_tokens_ms));
  }
  if (config.storage_workers < 1 || config.storage_workers > 64) {
    return invalid_argument(fmt::format("tiers: storage_workers must be in [1, 64], got {}", config.storage_workers));
  }
  if (config.max_queued_fetches < 1 || config.max_queued_fetches > (1 << 20)) {
    return invalid_argument(
        fmt::format("tiers: max_queued_fetches must be in [1, 1048576], got {}", config.max_queued_fetches));
  }
  if (config.breaker_failures < 1 || config.breaker_failures > 1000) {
    return invalid_argument(
        fmt::format("tiers: breaker_failures must be in [1, 1000], got {}", config.breaker_failures));
  }
  if (!(config.admission_deadline_ms >= 0 && config.admission_deadline_ms <= 3.6e6) ||
      !(config.breaker_open_ms >= 0 && config.breaker_open_ms <= 3.6e6)) {
    return invalid_argument(
        fmt::format("tiers: admission_deadline_ms and breaker_open_ms must be in [0, 3600000], got {} and {}",
                    config.admission_deadline_ms, config.breaker_open_ms));
  }
  if (config.storage_batch_pages < 1 || config.storage_batch_pages > 4096) {
    return invalid_argument(
        fmt::format("tiers: storage_batch_pages must be in [1, 4096], got {}", config.storage_batch_pages));
  }
  PagedKvPoolConfig host = device_pool.config();
  host.num_pages = config.host_pages;
  host.memory = device_pool.config().memory == MemoryKind::none ? MemoryKind::none : MemoryKind::host;
  host.pinned = device_pool.config().memory == MemoryKind::device;
  std::unique_ptr<PagedKvPool> host_pool;
  CLM_RETURN_IF_ERROR(PagedKvPool::create(host, host_pool));
  std::unique_ptr<TierManager> tiers(new TierManager(config, std::move(host_pool)));
  CLM_RETURN_IF_ERROR(PageCopier::create(device_pool, *tiers->host_pool_, tiers->copier_));
  if (!config.storage_url.empty()) {
    if (device_pool.config().memory == MemoryKind::none) {
      return invalid_argument("tiers: a storage tier needs KV bytes (the pool's memory kind is none)");
    }
    if (model_id.empty()) {
      return invalid_argument(
          "tiers: a storage tier needs a model id (EngineConfig::model_id, the host's fingerprint of its weights and "
          "config): without one, two models of this layout would be served each other's pages");
    }
    std::string secret;
    CLM_RETURN_IF_ERROR(load_page_secret(config.page_secret_file, config.page_secret_env, secret));
    PageSeal seal;
    const Status sealed = PageSeal::create(model_id, secret, seal);
    OPENSSL_cleanse(secret.data(), secret.size());
    CLM_RETURN_IF_ERROR(sealed);
    tiers->key_scope_ = seal.key_scope();
    CLM_RETURN_IF_ERROR(
        open_storage_backend(config.storage_url, PageLayout::of(device_pool.config()), seal, tiers->storage_));
  } else if (!config.page_secret_file.empty() || !config.page_secret_env.empty()) {
    return invalid_argument("tiers: a page secret without a storage tier (tiers.storage_url) signs nothing");
  }
  out = std::move(tiers);
  return {};
}

TierManager::TierManager(const TierConfig& config, std::unique_ptr<PagedKvPool> host_pool) noexcept
    : config_(config),
      host_pool_(std::move(host_pool)),
      breaker_(config.breaker_failures, std::chrono::milliseconds(static_cast<std::int64_t>(config.breaker_open_ms))) {}

TierManager::~TierManager() { stop(); }

void TierManager::start(RadixTree& tree, detail::SpinThenBlockMutex& engine_mutex) {
  tree_ = &tree;
  engine_mutex_ = &engine_mutex;
  if (config_.write_policy == WritePolicy::write_back) {
    tree.set_write_back([this](std::span<const std::int32_t> device_pages, std::span<const std::int32_t> host_pages) {
      Status copied = copier_->to_host(device_pages, host_pages);
      std::lock_guard q(queue_mutex_);
      if (copied.ok()) metrics_.backed_up_pages += device_pages.size();
      return copied;  // a failure is counted by the tree, with write-backs that found no room
    });
  }
  workers_.emplace_back([this] { copy_worker(); });
  if (storage_) {
    for (int i = 0; i < config_.storage_workers; ++i) workers_.emplace_back([this] { storage_worker(); });
  }
}

void TierManager::stop() {
  {
    std::lock_guard q(queue_mutex_);
    if (stopping_ && workers_.empty()) return;
    stopping_ = true;
  }
  queue_ready_.notify_all();
  for (std::thread& t : workers_) t.join();
  workers_.clear();
  // What no worker took: give back its pages and guards.
  std::deque<std::unique_ptr<CopyJob>> copies;
  std::deque<std::unique_ptr<StoreJob>> stores;
  std::deque<std::shared_ptr<FetchJob>> fetches;
  {
    std::lock_guard q(queue_mutex_);
    copies.swap(copy_queue_);
    stores.swap(store_queue_);
    fetches.swap(fetch_queue_);
    for (auto& f : fetches) {
      f->done = true;
      f->progress.notify_all();
    }
  }
  if (tree_ && (!copies.empty() || !stores.empty())) {
    EngineLock lock(*engine_mutex_);
    for (auto& job : copies) cancel(*job);
    for (auto& job : stores) cancel(*job);
  }
}

void TierManager::drain() {
  std::unique_lock q(queue_mutex_);
  queue_idle_.wait(q, [&] {
    return stopping_ || (copy_queue_.empty() && store_queue_.empty() && fetch_queue_.empty() && running_jobs_ == 0);
  });
}

bool TierManager::copies_in_flight() const {
  std::lock_guard q(queue_mutex_);
  return !copy_queue_.empty() || running_copies_ > 0;
}

void TierManager::wait_for_copies() {
  std::unique_lock q(queue_mutex_);
  queue_idle_.wait(q, [&] { return stopping_ || (copy_queue_.empty() && running_copies_ == 0); });
}

// ---- under the engine lock ------------------------------------------------------

void TierManager::on_hit(NodeRef device_end) {
  if (config_.write_policy == WritePolicy::write_back || !tree_) return;
  const std::uint32_t min_hits = config_.write_policy == WritePolicy::write_through ? 1 : 2;
  auto job = std::make_unique<CopyJob>();
  tree_->backup_candidates(device_end, min_hits, job->first_page, job->locked, job->device_pages);
  if (job->device_pages.empty()) return;
  {
    std::lock_guard q(queue_mutex_);
    if (stopping_) return;
    // One copy of a node at a time: later hits while it is in flight add nothing.
    for (const auto& queued : copy_queue_) {
      if (queued->locked == job->locked) return;
    }
  }
  job->host_pages.resize(job->device_pages.size());
  if (!tree_->allocate_host_pages(job->host_pages).ok()) {
    std::lock_guard q(queue_mutex_);
    ++metrics_.dropped_backups;
    return;
  }
  if (!tree_->lock(job->locked).ok() ||
      !tree_->node_path(job->locked, job->tokens, nullptr, job->salt, job->adapter_id).ok()) {
    (void)host_pool_->release(job->host_pages);
    return;
  }
  {
    std::lock_guard q(queue_mutex_);
    copy_queue_.push_back(std::move(job));
  }
  queue_ready_.notify_all();
}

void TierManager::on_evictions() {
  if (!tree_) return;
  std::vector<NodeRef> backed_up;
  tree_->take_backed_up(backed_up);
  if (!storage_) return;
  for (NodeRef node : backed_up) queue_store(node);
}

void TierManager::queue_store(NodeRef node) {
  auto job = std::make_unique<StoreJob>();
  {
    std::lock_guard q(queue_mutex_);  // the key cache
    const auto known = [&](NodeRef r) { return stored_keys_.contains(key_cache_slot(r)); };
    if (!tree_->node_path_below(node, known, job->path).ok()) return;
    if (job->path.tokens.empty()) return;  // its pages are stored already
    if (job->path.above.index >= 0) job->above_key = stored_keys_.at(key_cache_slot(job->path.above));
  }
  if (!tree_->host_pin(node).ok()) return;
  job->pinned = node;
  {
    std::lock_guard q(queue_mutex_);
    if (!stopping_) {
      store_queue_.push_back(std::move(job));
      job = nullptr;
    }
  }
  if (job) {
    cancel(*job);
    return;
  }
  queue_ready_.notify_all();
}

void TierManager::cancel(CopyJob& job) {
  (void)host_pool_->release(job.host_pages);
  (void)tree_->unlock(job.locked);
}

void TierManager::cancel(StoreJob& job) { (void)tree_->host_unpin(job.pinned); }

void TierManager::count_admission(std::int32_t device_tokens, std::int32_t host_tokens, std::int32_t storage_tokens) {
  std::lock_guard q(queue_mutex_);
  metrics_.device_hit_tokens += static_cast<std::uint64_t>(device_tokens);
  metrics_.host_hit_tokens += static_cast<std::uint64_t>(host_tokens);
  metrics_.storage_hit_tokens += static_cast<std::uint64_t>(storage_tokens);
  if (host_tokens + storage_tokens > 0) ++metrics_.load_backs;
}

// ---- without the engine lock --------------------------------------------------------

Status TierManager::load(std::span<const std::int32_t> host_pages, std::span<const std::int32_t> device_pages) {
  Status copied = copier_->to_device(host_pages, device_pages);
  std::lock_guard q(queue_mutex_);
  if (copied.ok()) metrics_.loaded_pages += host_pages.size();
  return copied;
}

void TierManager::fetch(std::span<const std::int32_t> tokens, const CacheNamespace& ns, std::int32_t host_backed_tokens,
                        std::int32_t cached_tokens, bool wait, FetchOutcome& out) {
  out = FetchOutcome{};
  out.first_token = host_backed_tokens;
  if (!storage_ || !tree_) return;
  const std::int32_t page = host_pool_->page_size();
  const auto whole_pages = static_cast<std::int32_t>(tokens.size() / static_cast<std::size_t>(page));
  const std::int32_t first_page = host_backed_tokens / page;
  if (first_page >= whole_pages) return;
  const std::span<const std::int32_t> pages_of_prompt =
      tokens.first(static_cast<std::size_t>(whole_pages) * static_cast<std::size_t>(page));
  const std::int32_t cached_pages = std::max(first_page, cached_tokens / page);
  std::unique_lock q(queue_mutex_);
  if (stopping_) return;
  if (breaker_.refusing(Clock::now())) {  // storage hangs or is down: ask nothing, queue nothing
    breaker_.count_skip();
    return;
  }
  // One fetch per prefix: join a queued one (which grows to this prompt's
  // pages if it asked fewer), or a running one that asked as many.
  std::shared_ptr<FetchJob> job = fetch_of_prefix(pages_of_prompt, ns, false);
  if (job) {
    if (job->tokens.size() < pages_of_prompt.size()) job->tokens.assign(pages_of_prompt.begin(), pages_of_prompt.end());
    job->first_page = std::min(job->first_page, first_page);
    job->cached_pages = std::min(job->cached_pages, cached_pages);
    ++metrics_.merged_fetches;
  } else if ((job = fetch_of_prefix(pages_of_prompt, ns, true)) && job->tokens.size() >= pages_of_prompt.size()) {
    ++metrics_.merged_fetches;
  } else {
    job = nullptr;
    if (fetch_queue_.size() >= static_cast<std::size_t>(config_.max_queued_fetches)) {
      // Full: the oldest fetch no admission waits for goes (a prefetch), else this one.
      const auto victim = std::find_if(fetch_queue_.begin(), fetch_queue_.end(),
                                       [](const std::shared_ptr<FetchJob>& f) { return f->waiters == 0; });
      ++metrics_.dropped_fetches;
      if (victim == fetch_queue_.end()) return;
      (*victim)->done = true;
      (*victim)->progress.notify_all();
      fetch_queue_.erase(victim);
    }
    job = std::make_shared<FetchJob>();
    job->tokens.assign(pages_of_prompt.begin(), pages_of_prompt.end());
    job->salt.assign(ns.salt);
    job->adapter_id = ns.adapter_id;
    job->first_page = first_page;
    job->cached_pages = cached_pages;
    fetch_queue_.push_back(job);
    queue_ready_.notify_all();
  }
  out.first_token = job->first_page * page;
  if (!wait || config_.prefetch_policy == PrefetchPolicy::best_effort) {
    out.fetched_tokens = job->landed_pages * page;
    return;
  }
  // Whatever the policy, no admission waits past the deadline.
  double ms = config_.admission_deadline_ms;
  if (config_.prefetch_policy == PrefetchPolicy::timeout) {
    const std::int32_t asked = (whole_pages - first_page) * page;
    ms = std::min(ms, config_.prefetch_timeout_ms + config_.prefetch_timeout_per_1k_tokens_ms * asked / 1000.0);
  }
  const auto deadline = Clock::now() + std::chrono::microseconds(static_cast<std::int64_t>(std::ceil(ms * 1000)));
  ++job->waiters;
  if (!job->progress.wait_until(q, deadline, [&] { return job->done; })) {
    out.timed_out = true;
    ++metrics_.prefetch_timeouts;
  }
  --job->waiters;
  out.first_token = job->first_page * page;
  out.fetched_tokens = job->landed_pages * page;
  out.failed = job->failed;
}

std::shared_ptr<TierManager::FetchJob> TierManager::fetch_of_prefix(std::span<const std::int32_t> tokens,
                                                                    const CacheNamespace& ns, bool running) const {
  auto covers = [&](const std::shared_ptr<FetchJob>& f) {
    const std::size_t n = std::min(f->tokens.size(), tokens.size());
    return f->in(ns) && !f->done && n > 0 &&
           std::equal(tokens.begin(), tokens.begin() + static_cast<std::ptrdiff_t>(n), f->tokens.begin());
  };
  if (running) {
    for (const auto& f : running_fetches_) {
      if (covers(f)) return f;
    }
    return nullptr;
  }
  for (const auto& f : fetch_queue_) {
    if (covers(f)) return f;
  }
  return nullptr;
}

TierMetrics TierManager::metrics() const {
  TierMetrics m;
  {
    std::lock_guard q(queue_mutex_);
    m = metrics_;
    m.queued_fetches = static_cast<std::int64_t>(fetch_queue_.size());
    m.breaker_trips = breaker_.trips();
    m.breaker_skips = breaker_.skips();
    m.breaker_state = static_cast<std::int32_t>(breaker_.state());
  }
  m.has_storage = storage_ != nullptr;
  if (storage_) {
    m.storage = storage_->stats();
    m.signed_pages = storage_->seal().signer != nullptr;
  }
  m.host_pages_total = host_pool_->num_pages();
  return m;
}

// ---- workers -------------------------------------------------------------------------

template <typename Job>
bool TierManager::run_counted(Job&& job) {
  try {
    job();
    return true;
  } catch (const std::bad_alloc&) {
    std::lock_guard q(queue_mutex_);
    ++metrics_.worker_failures;
    return false;
  }
}

Status TierManager::insert_host(std::span<const std::int32_t> tokens, std::span<const std::int32_t> host_pages,
                                std::int32_t first_page, const CacheNamespace& ns, InsertOutcome& out) {
  try {
    return tree_->insert_host(tokens, host_pages, first_page, ns, out);
  } catch (const std::bad_alloc&) {
    return out_of_memory("tiers: no host memory to record the host copies");
  }
}

void TierManager::copy_worker() {
  for (;;) {
    std::unique_ptr<CopyJob> job;
    {
      std::unique_lock q(queue_mutex_);
      queue_ready_.wait(q, [&] { return stopping_ || !copy_queue_.empty(); });
      if (stopping_) return;
      job = std::move(copy_queue_.front());
      copy_queue_.pop_front();
      ++running_jobs_;
      ++running_copies_;
    }
    run_counted([&] { run_copy(*job); });
    std::lock_guard q(queue_mutex_);
    --running_jobs_;
    --running_copies_;
    queue_idle_.notify_all();
  }
}

void TierManager::storage_worker() {
  for (;;) {
    std::unique_ptr<StoreJob> store;
    std::shared_ptr<FetchJob> fetch;
    bool allowed = true;
    {
      std::unique_lock q(queue_mutex_);
      queue_ready_.wait(q, [&] { return stopping_ || !fetch_queue_.empty() || !store_queue_.empty(); });
      if (stopping_) return;
      // Fetches first: an admission may be waiting for one.
      if (!fetch_queue_.empty()) {
        fetch = std::move(fetch_queue_.front());
        fetch_queue_.pop_front();
      } else {
        store = std::move(store_queue_.front());
        store_queue_.pop_front();
      }
      // An open breaker skips the job: storage hangs or is down.
      allowed = breaker_.allow(Clock::now());
      if (fetch && !allowed) end_fetch(*fetch, false);
      if (fetch && allowed) {
        fetch->started = ++fetches_started_;
        running_fetches_.push_back(fetch);
      }
      ++running_jobs_;
    }
    if (store && !allowed) {
      EngineLock lock(*engine_mutex_);
      cancel(*store);
    }
    bool answered = true;
    bool ran = false;
    if (fetch && allowed) {
      ran = run_counted([&] { answered = run_fetch(*fetch); });
      if (!ran) {  // given up for want of memory (counted as such): its waiters stop waiting
        std::lock_guard q(queue_mutex_);
        fetch->done = fetch->failed = true;
        fetch->progress.notify_all();
      }
    } else if (store && allowed) {
      ran = run_counted([&] { answered = run_store(*store); });
    }
    std::lock_guard q(queue_mutex_);
    if (fetch && allowed) std::erase(running_fetches_, fetch);
    if (ran) breaker_.report(answered, Clock::now());
    --running_jobs_;
    queue_idle_.notify_all();
  }
}

void TierManager::run_copy(CopyJob& job) {
  const Status copied = copier_->to_host(job.device_pages, job.host_pages);
  EngineLock lock(*engine_mutex_);
  InsertOutcome out;
  Status inserted;
  if (copied.ok()) inserted = insert_host(job.tokens, job.host_pages, job.first_page, {job.salt, job.adapter_id}, out);
  const bool kept = copied.ok() && inserted.ok();
  if (!kept) (void)host_pool_->release(job.host_pages);  // the path above lost its copies meanwhile
  (void)tree_->unlock(job.locked);
  {
    std::lock_guard q(queue_mutex_);
    if (kept) {
      metrics_.backed_up_pages += job.host_pages.size();
    } else {
      ++metrics_.dropped_backups;
    }
    if (inserted.code() == StatusCode::out_of_memory) ++metrics_.worker_failures;
  }
  if (kept && storage_) queue_store(out.node);
}

bool TierManager::run_store(StoreJob& job) {
  const std::int32_t page = host_pool_->page_size();
  const PathBelow& path = job.path;
  const std::size_t pages = path.host_pages.size();
  std::vector<PageKey> keys(pages);
  Status ok = chain_page_keys(job.above_key, path.tokens, page, {path.salt, path.adapter_id, key_scope_}, keys);
  std::vector<std::uint8_t> present(pages, 0);
  if (ok.ok()) ok = storage_->exists(keys, present);
  std::uint64_t stored = 0;
  const auto batch = static_cast<std::size_t>(config_.storage_batch_pages);
  std::vector<PageKey> batch_keys;
  std::vector<const std::byte*> batch_pages;
  std::vector<std::size_t> batch_index;
  std::vector<std::uint8_t> written;
  for (std::size_t i = 0; ok.ok() && i < pages; i += batch) {
    batch_keys.clear();
    batch_pages.clear();
    batch_index.clear();
    for (std::size_t j = i; j < std::min(pages, i + batch); ++j) {
      if (present[j]) continue;
      batch_keys.push_back(keys[j]);
      batch_pages.push_back(static_cast<const std::byte*>(host_pool_->page_data(path.host_pages[j])));
      batch_index.push_back(j);
    }
    if (batch_keys.empty()) continue;
    written.assign(batch_keys.size(), 0);
    ok = storage_->set_pages(batch_keys, batch_pages, written);
    for (std::size_t k = 0; k < written.size(); ++k) {
      stored += written[k];
      if (written[k]) present[batch_index[k]] = 1;
    }
  }
  {
    EngineLock lock(*engine_mutex_);
    (void)tree_->host_unpin(job.pinned);
  }
  // The nodes whose pages (and those above) storage now holds: later jobs below them start there.
  const auto held = static_cast<std::size_t>(std::find(present.begin(), present.end(), 0) - present.begin());
  std::lock_guard q(queue_mutex_);
  for (const auto& [node, end_tokens] : path.nodes) {
    const auto end_page = static_cast<std::size_t>((end_tokens - path.above_tokens) / page);
    if (end_page == 0 || end_page > held) break;
    remember_key(node, keys[end_page - 1]);
  }
  metrics_.stored_pages += stored;
  if (!ok.ok()) ++metrics_.storage_errors;
  return ok.ok();
}

void TierManager::remember_key(NodeRef node, const PageKey& key) {
  if (stored_keys_.size() >= kMaxKeyCacheEntries) stored_keys_.clear();  // bounded; rebuilt as jobs run
  stored_keys_[key_cache_slot(node)] = key;
}

void TierManager::end_fetch(FetchJob& job, bool failed) {
  job.done = true;
  job.failed = failed;
  if (failed) ++metrics_.storage_errors;
  job.progress.notify_all();
}

bool TierManager::run_fetch(FetchJob& job) {
  const std::int32_t page = host_pool_->page_size();
  const auto whole_pages = static_cast<std::int32_t>(job.tokens.size()) / page;
  const CacheNamespace ns{job.salt, job.adapter_id};
  auto finish = [&](bool failed) {
    std::lock_guard q(queue_mutex_);
    end_fetch(job, failed);
  };
  // One fetch per page key: a running fetch of the same first page that
  // started earlier is waited for, and this one starts from what it brought.
  {
    std::unique_lock q(queue_mutex_);
    for (;;) {
      const auto earlier = std::find_if(running_fetches_.begin(), running_fetches_.end(), [&](const auto& f) {
        return f.get() != &job && !f->done && f->started < job.started && f->in(ns) &&
               std::equal(job.tokens.begin(), job.tokens.begin() + page, f->tokens.begin());
      });
      if (earlier == running_fetches_.end() || stopping_) break;
      const std::shared_ptr<FetchJob> hold = *earlier;
      hold->progress.wait(q, [&] { return hold->done || stopping_; });
    }
  }
  // What the tree holds now, and the nodes along it, for the key cache.
  std::vector<std::pair<NodeRef, std::int32_t>> whole;
  {
    std::int32_t cached = 0, host_backed = 0;
    {
      EngineLock lock(*engine_mutex_);
      tree_->storage_coverage(job.tokens, ns, cached, host_backed, whole);
    }
    std::lock_guard q(queue_mutex_);
    job.first_page = std::max(job.first_page, host_backed / page);
    job.cached_pages = std::max(job.cached_pages, cached / page);
  }
  if (job.first_page >= whole_pages) {
    finish(false);
    return true;
  }
  const auto first = static_cast<std::size_t>(job.first_page);
  // Keys from the deepest node above the first page whose key is known, not
  // from the root: a long conversation's turn hashes its own pages.
  std::size_t base = 0;  // keys[i] is page base + i's
  PageKey base_key = PageKey::root();
  {
    std::lock_guard q(queue_mutex_);
    for (auto it = whole.rbegin(); it != whole.rend(); ++it) {
      const auto end_page = static_cast<std::size_t>(it->second / page);
      const auto known = stored_keys_.find(key_cache_slot(it->first));
      if (end_page <= first && known != stored_keys_.end()) {
        base = end_page;
        base_key = known->second;
        break;
      }
    }
  }
  std::vector<PageKey> keys(static_cast<std::size_t>(whole_pages) - base);
  Status ok = chain_page_keys(base_key, std::span(job.tokens).subspan(base * static_cast<std::size_t>(page)), page,
                              {job.salt, job.adapter_id, key_scope_}, keys);
  std::vector<std::uint8_t> present(keys.size() - (first - base), 0);
  if (ok.ok()) ok = storage_->exists(std::span(keys).subspan(first - base), present);
  const auto found = static_cast<std::size_t>(std::find(present.begin(), present.end(), 0) - present.begin());

  // Nothing past what the tree already holds: the pages before it are still
  // on the device, and reading them again would bring nothing.
  if (!ok.ok() || first + found <= static_cast<std::size_t>(job.cached_pages)) {
    finish(!ok.ok());
    return ok.ok();
  }
  // The pages land below the host-backed prefix; its end stays pinned, and
  // the pin moves down to each batch that lands.
  NodeRef pinned;
  // Whether storage holds every page above the first one fetched (the pages
  // before it were fetched, or stored, by this instance): then the nodes the
  // fetched pages land in go into the key cache.
  bool above_stored = first == 0;
  if (first > 0) {
    EngineLock lock(*engine_mutex_);
    if (!tree_->host_pin_prefix(job.tokens, ns, job.first_page * page, pinned).ok()) {
      pinned = NodeRef{};
      finish(false);  // evicted meanwhile: the next request asks again
      return true;
    }
    std::lock_guard q(queue_mutex_);
    above_stored = stored_keys_.contains(key_cache_slot(pinned));
  }
  const auto batch = static_cast<std::size_t>(config_.storage_batch_pages);
  std::vector<std::int32_t> host_pages;
  std::vector<std::byte*> buffers;
  std::vector<std::uint8_t> read;
  for (std::size_t at = first; ok.ok() && at < first + found; at += batch) {
    const std::size_t n = std::min(batch, first + found - at);
    host_pages.assign(n, -1);
    {
      EngineLock lock(*engine_mutex_);
      if (!tree_->allocate_host_pages(host_pages).ok()) break;
    }
    buffers.resize(n);
    for (std::size_t j = 0; j < n; ++j) buffers[j] = static_cast<std::byte*>(host_pool_->page_data(host_pages[j]));
    read.assign(n, 0);
    ok = storage_->get_pages(std::span(keys).subspan(at - base, n), buffers, read);
    const std::size_t good =
        ok.ok() ? static_cast<std::size_t>(std::find(read.begin(), read.end(), 0) - read.begin()) : 0;
    bool landed = false, no_memory = false;
    {
      EngineLock lock(*engine_mutex_);
      InsertOutcome out;
      const Status inserted =
          good > 0 ? insert_host(job.tokens, std::span(host_pages).first(good), static_cast<std::int32_t>(at), ns, out)
                   : Status{};
      no_memory = inserted.code() == StatusCode::out_of_memory;
      if (good > 0 && inserted.ok()) {
        landed = true;
        if (above_stored) {
          std::lock_guard q(queue_mutex_);  // storage holds every page up to the node that ends where they do
          remember_key(out.node, keys[at + good - 1 - base]);
        }
        if (tree_->host_pin(out.node).ok()) {
          if (pinned.index >= 0) (void)tree_->host_unpin(pinned);
          pinned = out.node;
        }
        (void)host_pool_->release(std::span(host_pages).subspan(good));
      } else {
        (void)host_pool_->release(host_pages);
      }
    }
    {
      std::lock_guard q(queue_mutex_);
      if (landed) {
        job.landed_pages += static_cast<std::int32_t>(good);
        metrics_.fetched_pages += good;
      }
      if (no_memory) ++metrics_.worker_failures;
      job.progress.notify_all();
    }
    if (!landed || good < n) break;
  }
  if (pinned.index >= 0) {
    EngineLock lock(*engine_mutex_);
    (void)tree_->host_unpin(pinned);
  }
  finish(!ok.ok());
  return ok.ok();
}

}  // namespace clm
