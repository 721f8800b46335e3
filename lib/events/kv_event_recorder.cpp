// lib/events/kv_event_recorder.cpp: the radix tree's changes as KV events
// (clm/events/kv_event_recorder.hpp).
#include "clm/events/kv_event_recorder.hpp"

#include <openssl/evp.h>

#include "clm/detail/fast_checksum.hpp"

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
  return detail::fast_checksum(page_tokens.data(), page_tokens.size_bytes(), parent);
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

void KvEventRecorder::node_event(const RadixTree& tree, std::int32_t index, KvMedium medium, bool stored,
                                 KvEvent& out) const {
  const NodeView v = tree.node_view(index);
  const std::size_t pages = v.tokens.size() / static_cast<std::size_t>(page_size_);
  // Every field set anew; the vectors and the string keep their storage (a recycled event's).
  out.kind = stored ? KvEventKind::block_stored : KvEventKind::block_removed;
  out.medium = medium;
  out.block_hashes.clear();
  out.parent_block_hash.reset();
  out.token_ids.clear();
  out.block_size = 0;
  out.lora_id.reset();
  out.extra_key.clear();
  std::optional<std::uint64_t> parent;
  const Namespace* ns = nullptr;
  const Tail* cached = known_entry(index, v.ref.generation);
  if (cached != nullptr && cached->hashes.size() >= pages) {
    // Hashed before: the node's pages are the entry's last ones (all of them, or the lower half of a split).
    const std::vector<std::uint64_t>& h = cached->hashes;
    ns = cached->ns;
    out.block_hashes.assign(h.end() - static_cast<std::ptrdiff_t>(pages), h.end());
    if (h.size() > pages) {
      parent = h[h.size() - pages - 1];
    } else if (v.parent >= 0) {
      parent = known_tail(tree, v.parent).hashes.back();
    }
  } else {
    std::uint64_t above;
    if (v.parent >= 0) {
      const Tail& up = known_tail(tree, v.parent);  // copied out before hash_node inserts
      ns = up.ns;
      above = up.hashes.back();
      parent = above;
    } else {
      ns = &namespace_of(tree, index);
      above = ns->seed;
    }
    out.block_hashes = hash_node(index, v, *ns, above).hashes;
  }
  if (!stored) return;
  out.parent_block_hash = parent;
  if (token_ids_) out.token_ids.assign(v.tokens.begin(), v.tokens.end());
  out.block_size = page_size_;
  if (ns->adapter_id != 0) out.lora_id = ns->adapter_id;
  out.extra_key = ns->digest;
}

// Under queue_mutex_: what is queued, and `also` more, are lost; a resync
// will describe the whole tree as it is then, these changes included.
void KvEventRecorder::lose_queue(std::uint64_t also) noexcept {
  dropped_.fetch_add(queue_.size() - queue_head_ + also, std::memory_order_relaxed);
  queue_.clear();
  queue_head_ = 0;
  resync_needed_.store(true, std::memory_order_release);
}

KvEvent KvEventRecorder::spare_event() noexcept {
  if (local_spares_.empty()) {
    std::lock_guard guard(queue_mutex_);
    local_spares_.swap(spares_);  // no allocation: the two buffers change hands
  }
  if (local_spares_.empty()) return KvEvent{};
  KvEvent e = std::move(local_spares_.back());
  local_spares_.pop_back();
  return e;
}

void KvEventRecorder::recycle(std::vector<KvEvent>& used) noexcept {
  // Sorted into returned_ (the taking thread's own) outside the lock; under
  // it, only a swap, so the recording thread never waits on this loop.
  for (KvEvent& e : used) {
    if (returned_.size() >= kMaxSpares) break;
    const std::size_t tokens = e.token_ids.capacity();
    if (tokens > kMaxSpareTokens || returned_tokens_ + tokens > kMaxSpareTokenTotal) continue;
    if (returned_.size() == returned_.capacity()) {
      try {
        returned_.reserve(std::min(kMaxSpares, std::max<std::size_t>(64, 2 * returned_.capacity())));
      } catch (const std::bad_alloc&) {
        break;
      }
    }
    returned_.push_back(std::move(e));  // within capacity: cannot throw
    returned_tokens_ += tokens;
  }
  used.clear();
  std::lock_guard guard(queue_mutex_);
  if (spares_.empty()) {  // else the recording thread has not used the last ones yet: these wait
    spares_.swap(returned_);
    returned_tokens_ = 0;
  }
}

void KvEventRecorder::push(KvEvent&& event) noexcept {
  recorded_.fetch_add(1, std::memory_order_relaxed);
  bool wake = false;
  {
    std::lock_guard guard(queue_mutex_);
    if (resync_needed_.load(std::memory_order_relaxed)) {
      dropped_.fetch_add(1, std::memory_order_relaxed);
      return;
    }
    const std::size_t queued = queue_.size() - queue_head_;
    if (queued >= capacity_) {
      lose_queue(1);
      wake = static_cast<bool>(wake_);
    } else {
      try {
        if (queued == 0) oldest_ = std::chrono::steady_clock::now();
        queue_.push_back(std::move(event));
      } catch (const std::bad_alloc&) {
        lose_queue(1);
      }
      wake = wake_ && queue_.size() - queue_head_ == wake_threshold_;
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
  KvEvent event = spare_event();
  try {
    node_event(tree, index, tier == Tier::host ? KvMedium::cpu : KvMedium::gpu, stored, event);
    if (!stored) {
      // A node that leaves both tiers is freed: its entry goes with it.
      const NodeView v = tree.node_view(index);
      if ((tier == Tier::device && !v.on_host) || (tier == Tier::host && !v.on_device)) {
        tails_[static_cast<std::size_t>(index)].hashes.clear();  // its storage stays for the slot's next node
      }
    }
  } catch (const std::bad_alloc&) {  // no hashes: lost, and the resync will say it
    recorded_.fetch_add(1, std::memory_order_relaxed);
    std::lock_guard guard(queue_mutex_);
    lose_queue(1);
    return;
  }
  push(std::move(event));
}

void KvEventRecorder::pages_stored(const RadixTree& tree, std::int32_t index, Tier tier) noexcept {
  record(tree, index, tier, true);
}

void KvEventRecorder::pages_removed(const RadixTree& tree, std::int32_t index, Tier tier) noexcept {
  record(tree, index, tier, false);
}

void KvEventRecorder::record_cleared() noexcept {
  KvEvent cleared;
  cleared.kind = KvEventKind::all_blocks_cleared;
  push(std::move(cleared));
}

void KvEventRecorder::resync(const RadixTree& tree) noexcept {
  std::vector<KvEvent> events;
  try {
    std::vector<std::int32_t> nodes;
    tree.nodes_top_down(nodes);
    events.reserve(2 * nodes.size() + 1);
    KvEvent cleared;
    cleared.kind = KvEventKind::all_blocks_cleared;
    events.push_back(std::move(cleared));
    for (KvMedium medium : {KvMedium::gpu, KvMedium::cpu}) {
      for (std::int32_t n : nodes) {
        const NodeView v = tree.node_view(n);
        if (!(medium == KvMedium::gpu ? v.on_device : v.on_host)) continue;
        KvEvent e;
        node_event(tree, n, medium, true, e);
        events.push_back(std::move(e));
      }
    }
  } catch (const std::bad_alloc&) {
    return;  // still needed: the next try may have the memory
  }
  {
    std::lock_guard guard(queue_mutex_);
    // What was recorded since the drop is in the snapshot: it replaces the queue.
    recorded_.fetch_add(events.size(), std::memory_order_relaxed);
    queue_ = std::move(events);
    queue_head_ = 0;
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
      KvEvent e;
      node_event(tree, n, medium, false, e);
      hashes.insert(hashes.end(), e.block_hashes.begin(), e.block_hashes.end());
    }
    out = std::move(hashes);
    return {};
  } catch (const std::bad_alloc&) {
    return out_of_memory("cached_blocks: no memory for the list");
  }
}

std::size_t KvEventRecorder::take(std::vector<KvEvent>& out, std::size_t max) {
  out.clear();
  std::lock_guard guard(queue_mutex_);
  if (queue_head_ == 0 && queue_.size() <= max) {
    // All of it: the two vectors change hands (the queue gets `out`'s empty
    // storage), so the recording thread never waits for events to be moved.
    out.swap(queue_);
    return out.size();
  }
  const std::size_t n = std::min(max, queue_.size() - queue_head_);
  out.reserve(n);  // the caller's vector, reused batch after batch: allocates once
  const auto first = queue_.begin() + static_cast<std::ptrdiff_t>(queue_head_);
  std::move(first, first + static_cast<std::ptrdiff_t>(n), std::back_inserter(out));
  queue_head_ += n;
  if (queue_head_ == queue_.size()) {
    queue_.clear();  // the moved-from events hold no storage; the capacity stays
    queue_head_ = 0;
  } else {
    // Taken ones are moved-from: dropped from the front now and then, so the vector does not only grow.
    if (queue_head_ >= 4096 && queue_head_ * 2 >= queue_.size()) {
      queue_.erase(queue_.begin(), queue_.begin() + static_cast<std::ptrdiff_t>(queue_head_));
      queue_head_ = 0;
    }
    oldest_ = std::chrono::steady_clock::now();
  }
  return n;
}

std::size_t KvEventRecorder::queued() const {
  std::lock_guard guard(queue_mutex_);
  return queue_.size() - queue_head_;
}

std::chrono::steady_clock::time_point KvEventRecorder::oldest() const {
  std::lock_guard guard(queue_mutex_);
  return oldest_;
}

void KvEventRecorder::set_wakeup(std::size_t threshold, std::function<void()> wake) {
  std::lock_guard guard(queue_mutex_);
  wake_threshold_ = std::max<std::size_t>(threshold, 1);
  wake_ = std::move(wake);
}

}  // namespace clm
