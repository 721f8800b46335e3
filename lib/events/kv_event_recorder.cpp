// lib/events/kv_event_recorder.cpp: the radix tree's changes as KV events
// (clm/events/kv_event_recorder.hpp).
#include "clm/events/kv_event_recorder.hpp"

#include <openssl/evp.h>

#define XXH_INLINE_ALL  // header-only: nothing to link (cmake/Findxxhash.cmake)
#include <xxhash.h>

#include <fmt/format.h>

#include <algorithm>
#include <iterator>
#include <new>
#include <utility>

namespace clm {

KvEventRecorder::KvEventRecorder(std::int32_t page_size, const Digest32& scope, std::size_t capacity, bool token_ids)
    : page_size_(page_size), scope_(scope), capacity_(std::max<std::size_t>(capacity, 1)), token_ids_(token_ids) {}

std::uint64_t KvEventRecorder::namespace_seed(const Digest32& scope, std::string_view salt, std::int32_t adapter_id) {
  std::string bytes(reinterpret_cast<const char*>(scope.data()), scope.size());
  for (int b = 0; b < 4; ++b) bytes.push_back(static_cast<char>(static_cast<std::uint32_t>(salt.size()) >> (8 * b)));
  bytes.append(salt);
  for (int b = 0; b < 4; ++b) bytes.push_back(static_cast<char>(static_cast<std::uint32_t>(adapter_id) >> (8 * b)));
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int length = 0;
  if (EVP_Digest(bytes.data(), bytes.size(), digest, &length, EVP_sha256(), nullptr) != 1 || length < 8) {
    throw std::bad_alloc();  // libcrypto fails only for memory
  }
  std::uint64_t seed = 0;
  for (int i = 0; i < 8; ++i) seed = (seed << 8) | digest[i];
  return seed;
}

std::uint64_t KvEventRecorder::next_block_hash(std::uint64_t parent, std::span<const std::int32_t> page_tokens) {
  return XXH3_64bits_withSeed(page_tokens.data(), page_tokens.size_bytes(), parent);
}

std::string KvEventRecorder::salt_digest(std::string_view salt) {
  if (salt.empty()) return {};
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int length = 0;
  if (EVP_Digest(salt.data(), salt.size(), digest, &length, EVP_sha256(), nullptr) != 1 || length < 16) {
    throw std::bad_alloc();  // libcrypto fails only for memory
  }
  std::string out = "salt:";
  for (unsigned int i = 0; i < 16; ++i) out += fmt::format("{:02x}", digest[i]);
  return out;
}

const KvEventRecorder::Namespace& KvEventRecorder::namespace_of(const RadixTree& tree, std::int32_t index) const {
  const CacheNamespace ns = tree.node_namespace(index);
  auto key = std::make_pair(std::string(ns.salt), ns.adapter_id);
  auto it = namespaces_.find(key);
  if (it == namespaces_.end()) {
    Namespace n{namespace_seed(scope_, ns.salt, ns.adapter_id), salt_digest(ns.salt), ns.adapter_id};
    it = namespaces_.emplace(std::move(key), std::move(n)).first;
  }
  return it->second;
}

KvEventRecorder::Tail& KvEventRecorder::hash_node(std::int32_t index, const NodeView& v, const Namespace& ns,
                                                  std::uint64_t above) const {
  const auto slot = static_cast<std::size_t>(index);
  if (slot >= tails_.size()) tails_.resize(std::max(slot + 1, 2 * tails_.size()));
  Tail& t = tails_[slot];
  t.generation = v.ref.generation;
  t.ns = &ns;
  t.hashes.clear();
  const auto page = static_cast<std::size_t>(page_size_);
  for (std::size_t at = 0; at + page <= v.tokens.size(); at += page) {
    above = next_block_hash(above, v.tokens.subspan(at, page));
    t.hashes.push_back(above);
  }
  return t;
}

const KvEventRecorder::Tail* KvEventRecorder::known_entry(std::int32_t index, std::uint32_t generation) const {
  const auto slot = static_cast<std::size_t>(index);
  if (slot >= tails_.size()) return nullptr;
  const Tail& t = tails_[slot];
  return t.generation == generation && !t.hashes.empty() ? &t : nullptr;
}

// Node `index`'s entry: from the deepest ancestor whose hashes are known (or
// the namespace's seed, the one walk up to a root), chained down.
const KvEventRecorder::Tail& KvEventRecorder::known_tail(const RadixTree& tree, std::int32_t index) const {
  std::vector<std::int32_t> chain;  // bottom-up: nodes whose hashes are not known
  const Namespace* ns = nullptr;
  std::uint64_t above = 0;
  for (std::int32_t n = index; n >= 0;) {
    const NodeView v = tree.node_view(n);
    if (const Tail* known = known_entry(n, v.ref.generation)) {
      if (n == index) return *known;
      ns = known->ns;
      above = known->hashes.back();
      break;
    }
    chain.push_back(n);
    n = v.parent;
  }
  if (ns == nullptr) {  // nothing known up to the namespace's root
    ns = &namespace_of(tree, chain.back());
    above = ns->seed;
  }
  Tail* t = nullptr;
  for (auto it = chain.rbegin(); it != chain.rend(); ++it) {
    t = &hash_node(*it, tree.node_view(*it), *ns, above);
    above = t->hashes.back();
  }
  return *t;
}

KvEventRecorder::Draft KvEventRecorder::node_event(const RadixTree& tree, std::int32_t index, KvMedium medium,
                                                   bool stored) const {
  const NodeView v = tree.node_view(index);
  const std::size_t pages = v.tokens.size() / static_cast<std::size_t>(page_size_);
  Draft d;
  d.kind = stored ? KvEventKind::block_stored : KvEventKind::block_removed;
  d.medium = medium;
  const Tail* cached = known_entry(index, v.ref.generation);
  if (cached != nullptr && cached->hashes.size() >= pages) {
    // Hashed before: the node's pages are the entry's last ones (all of them, or the lower half of a split).
    const std::vector<std::uint64_t>& h = cached->hashes;
    d.ns = cached->ns;
    if (h.size() > pages) {
      d.parent = h[h.size() - pages - 1];
    } else if (v.parent >= 0 && stored) {
      d.parent =
          known_tail(tree, v.parent).hashes.back();  // may hash above and move tails_: `cached` is looked up again
    }
    const Tail& own = *known_entry(index, v.ref.generation);
    d.hashes = std::span(own.hashes).last(pages);
  } else {
    std::uint64_t above;
    if (v.parent >= 0) {
      const Tail& up = known_tail(tree, v.parent);
      d.ns = up.ns;
      above = up.hashes.back();
      d.parent = above;
    } else {
      d.ns = &namespace_of(tree, index);
      above = d.ns->seed;
    }
    d.hashes = hash_node(index, v, *d.ns, above).hashes;
  }
  if (stored && token_ids_) d.tokens = v.tokens.first(pages * static_cast<std::size_t>(page_size_));
  return d;
}

void KvEventRecorder::Log::clear() noexcept {
  records.clear();
  hashes.clear();
  tokens.clear();
  if (tokens.capacity() > kMaxLogTokens) std::vector<std::int32_t>().swap(tokens);  // after a burst or a resync
  if (hashes.capacity() > kMaxLogTokens / 4) std::vector<std::uint64_t>().swap(hashes);
  if (records.capacity() > kMaxLogTokens / 16) std::vector<Record>().swap(records);
}

void KvEventRecorder::append(Log& log, const Draft& d) {
  Record r;
  r.kind = d.kind;
  r.medium = d.medium;
  r.has_parent = d.parent.has_value();
  r.parent = d.parent.value_or(0);
  r.ns = d.ns;
  r.hashes_at = log.hashes.size();
  r.hash_count = d.hashes.size();
  r.tokens_at = log.tokens.size();
  r.token_count = d.tokens.size();
  // Room first, then the copies, which cannot throw: a failed append leaves the log as it was.
  if (log.records.size() == log.records.capacity())
    log.records.reserve(std::max<std::size_t>(256, 2 * log.records.size()));
  if (log.hashes.capacity() - log.hashes.size() < d.hashes.size()) {
    log.hashes.reserve(std::max(log.hashes.size() + d.hashes.size(), 2 * log.hashes.capacity()));
  }
  if (log.tokens.capacity() - log.tokens.size() < d.tokens.size()) {
    log.tokens.reserve(std::max(log.tokens.size() + d.tokens.size(), 2 * log.tokens.capacity()));
  }
  log.hashes.insert(log.hashes.end(), d.hashes.begin(), d.hashes.end());
  log.tokens.insert(log.tokens.end(), d.tokens.begin(), d.tokens.end());
  log.records.push_back(r);
}

// Under queue_mutex_: what is queued (and not yet handed out), and `also`
// more, are lost; a resync will describe the whole tree as it is then, these
// changes included.
void KvEventRecorder::lose_queue(std::uint64_t also) noexcept {
  dropped_.fetch_add(queue_.records.size() + taken_left_ + also, std::memory_order_relaxed);
  queue_.clear();
  taken_left_ = 0;
  ++epoch_;  // the taking thread drops what it has not handed out
  resync_needed_.store(true, std::memory_order_release);
}

void KvEventRecorder::push(const Draft& d) noexcept {
  recorded_.fetch_add(1, std::memory_order_relaxed);
  bool wake = false;
  {
    std::lock_guard guard(queue_mutex_);
    if (resync_needed_.load(std::memory_order_relaxed)) {
      dropped_.fetch_add(1, std::memory_order_relaxed);
      return;
    }
    const std::size_t queued = queue_.records.size() + taken_left_;
    if (queued >= capacity_) {
      lose_queue(1);
      wake = static_cast<bool>(wake_);
    } else {
      try {
        if (queue_.records.empty()) oldest_ = std::chrono::steady_clock::now();
        append(queue_, d);
      } catch (const std::bad_alloc&) {
        lose_queue(1);
      }
      wake = wake_ && queue_.records.size() + taken_left_ == wake_threshold_;
    }
  }
  if (wake) wake_();
}

void KvEventRecorder::record(const RadixTree& tree, std::int32_t index, Tier tier, bool stored) noexcept {
  if (resync_needed()) {  // the resync to come says it
    recorded_.fetch_add(1, std::memory_order_relaxed);
    dropped_.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  Draft d;
  try {
    d = node_event(tree, index, tier == Tier::host ? KvMedium::cpu : KvMedium::gpu, stored);
  } catch (const std::bad_alloc&) {  // no hashes: lost, and the resync will say it
    recorded_.fetch_add(1, std::memory_order_relaxed);
    std::lock_guard guard(queue_mutex_);
    lose_queue(1);
    return;
  }
  push(d);
  if (!stored) {
    // A node that leaves both tiers is freed: its entry goes with it (after the push: the draft points into it).
    const NodeView v = tree.node_view(index);
    if ((tier == Tier::device && !v.on_host) || (tier == Tier::host && !v.on_device)) {
      tails_[static_cast<std::size_t>(index)].hashes.clear();  // its storage stays for the slot's next node
    }
  }
}

void KvEventRecorder::pages_stored(const RadixTree& tree, std::int32_t index, Tier tier) noexcept {
  record(tree, index, tier, true);
}

void KvEventRecorder::pages_removed(const RadixTree& tree, std::int32_t index, Tier tier) noexcept {
  record(tree, index, tier, false);
}

void KvEventRecorder::record_cleared() noexcept {
  Draft cleared;
  cleared.kind = KvEventKind::all_blocks_cleared;
  push(cleared);
}

void KvEventRecorder::resync(const RadixTree& tree) noexcept {
  Log snapshot;
  try {
    std::vector<std::int32_t> nodes;
    tree.nodes_top_down(nodes);
    Draft cleared;
    cleared.kind = KvEventKind::all_blocks_cleared;
    append(snapshot, cleared);
    for (KvMedium medium : {KvMedium::gpu, KvMedium::cpu}) {
      for (std::int32_t n : nodes) {
        const NodeView v = tree.node_view(n);
        if (!(medium == KvMedium::gpu ? v.on_device : v.on_host)) continue;
        append(snapshot, node_event(tree, n, medium, true));
      }
    }
  } catch (const std::bad_alloc&) {
    return;  // still needed: the next try may have the memory
  }
  {
    std::lock_guard guard(queue_mutex_);
    // What was recorded since the drop is in the snapshot: it replaces the queue.
    recorded_.fetch_add(snapshot.records.size(), std::memory_order_relaxed);
    queue_ = std::move(snapshot);
    taken_left_ = 0;
    ++epoch_;
    oldest_ = std::chrono::steady_clock::now();
    resync_needed_.store(false, std::memory_order_release);
    resyncs_.fetch_add(1, std::memory_order_relaxed);
  }
}

Status KvEventRecorder::cached_blocks(const RadixTree& tree, KvMedium medium, std::vector<std::uint64_t>& out) const {
  try {
    std::vector<std::int32_t> nodes;
    tree.nodes_top_down(nodes);
    std::vector<std::uint64_t> hashes;
    for (std::int32_t n : nodes) {
      const NodeView v = tree.node_view(n);
      if (!(medium == KvMedium::gpu ? v.on_device : v.on_host)) continue;
      const Draft d = node_event(tree, n, medium, false);
      hashes.insert(hashes.end(), d.hashes.begin(), d.hashes.end());
    }
    out = std::move(hashes);
    return {};
  } catch (const std::bad_alloc&) {
    return out_of_memory("cached_blocks: no memory for the list");
  }
}

// Every field set anew; the vectors and the string keep their storage (the
// taking thread's, batch after batch), within the kept bounds.
void KvEventRecorder::fill(const Record& r, KvEvent& out, std::size_t& kept_tokens) const {
  const KvEventView v = view(r);
  out.kind = v.kind;
  out.medium = v.medium;
  out.block_hashes.assign(v.block_hashes.begin(), v.block_hashes.end());
  out.parent_block_hash = v.parent_block_hash;
  if (out.token_ids.capacity() > kMaxKeptTokens || kept_tokens + out.token_ids.capacity() > kMaxKeptTokenTotal) {
    std::vector<std::int32_t>().swap(out.token_ids);
  }
  out.token_ids.assign(v.token_ids.begin(), v.token_ids.end());  // a long node's storage goes at this slot's next take
  kept_tokens += out.token_ids.capacity();
  out.block_size = v.block_size;
  out.lora_id = v.lora_id;
  out.extra_key.assign(v.extra_key);
}

void KvEventRecorder::claim(std::size_t max, std::size_t& first, std::size_t& n) {
  std::lock_guard guard(queue_mutex_);
  if (taken_epoch_ != epoch_ || taken_head_ == taken_.records.size()) {
    // What was taken is handed out, or was lost or replaced since: the queue, whole, is next.
    taken_.clear();
    taken_head_ = 0;
    taken_epoch_ = epoch_;
    taken_left_ = queue_.records.size();
    taken_oldest_ = oldest_;
    std::swap(taken_, queue_);  // the queue gets the emptied log's storage
  }
  first = taken_head_;
  n = std::min(max, taken_left_);
  taken_head_ += n;
  taken_left_ -= n;
}

KvEventView KvEventRecorder::view(const Record& r) const {
  KvEventView v;
  v.kind = r.kind;
  v.medium = r.medium;
  v.block_hashes = std::span(taken_.hashes).subspan(r.hashes_at, r.hash_count);
  v.token_ids = std::span(taken_.tokens).subspan(r.tokens_at, r.token_count);
  if (r.kind != KvEventKind::block_stored) return v;
  if (r.has_parent) v.parent_block_hash = r.parent;
  v.block_size = page_size_;
  if (r.ns->adapter_id != 0) v.lora_id = r.ns->adapter_id;
  v.extra_key = r.ns->digest;
  return v;
}

std::size_t KvEventRecorder::take_views(std::vector<KvEventView>& out, std::size_t max) {
  out.clear();
  std::size_t first = 0, n = 0;
  claim(max, first, n);
  try {
    out.reserve(n);  // the caller's vector, batch after batch: allocates once
  } catch (const std::bad_alloc&) {
    std::lock_guard guard(queue_mutex_);
    lose_queue(n);
    return 0;
  }
  for (std::size_t i = 0; i < n; ++i) out.push_back(view(taken_.records[first + i]));
  return n;
}

std::size_t KvEventRecorder::take(std::vector<KvEvent>& out, std::size_t max) {
  std::size_t first = 0, n = 0;
  claim(max, first, n);
  // Outside the lock: only this thread reads taken_, and what is claimed is this batch's.
  std::size_t kept_tokens = 0;
  try {
    // Events past this batch's count wait in slots_ rather than being destroyed: a batch of another size
    // would otherwise free and allocate their storage, batch after batch.
    while (out.size() > n) {
      slots_.push_back(std::move(out.back()));
      out.pop_back();
    }
    while (out.size() < n) {
      if (slots_.empty()) {
        out.emplace_back();
      } else {
        out.push_back(std::move(slots_.back()));
        slots_.pop_back();
      }
    }
    for (std::size_t i = 0; i < n; ++i) fill(taken_.records[first + i], out[i], kept_tokens);
  } catch (const std::bad_alloc&) {
    out.clear();
    std::lock_guard guard(queue_mutex_);
    lose_queue(n);
    return 0;
  }
  return n;
}

std::size_t KvEventRecorder::queued() const {
  std::lock_guard guard(queue_mutex_);
  return queue_.records.size() + taken_left_;
}

std::chrono::steady_clock::time_point KvEventRecorder::oldest() const {
  std::lock_guard guard(queue_mutex_);
  return taken_left_ > 0 ? taken_oldest_ : oldest_;
}

void KvEventRecorder::set_wakeup(std::size_t threshold, std::function<void()> wake) {
  std::lock_guard guard(queue_mutex_);
  wake_threshold_ = std::max<std::size_t>(threshold, 1);
  wake_ = std::move(wake);
}

}  // namespace clm
