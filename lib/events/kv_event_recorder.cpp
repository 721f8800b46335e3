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

// ---- the recording thread (the tree owner's lock) ----------------------------

bool KvEventRecorder::described(std::int32_t index, std::uint32_t generation) const {
  const auto slot = static_cast<std::size_t>(index);
  return slot < known_.size() && known_[slot].described && known_[slot].generation == generation;
}

const std::int32_t* KvEventRecorder::Log::put(std::span<const std::int32_t> tokens) {
  if (tokens.empty()) return nullptr;
  std::size_t at = block, offset = used;
  while (at < blocks.size() && blocks[at].capacity - offset < tokens.size()) {
    ++at;  // the rest of a block too small for these is left unused until the log is cleared
    offset = 0;
  }
  if (at == blocks.size()) {
    const std::size_t capacity = std::max(kLogBlockTokens, tokens.size());
    Block fresh{std::make_unique_for_overwrite<std::int32_t[]>(capacity), capacity};
    blocks.push_back(std::move(fresh));  // may throw: then nothing changed
  }
  std::int32_t* out = blocks[at].data.get() + offset;
  std::copy(tokens.begin(), tokens.end(), out);
  block = at;
  used = offset + tokens.size();
  return out;
}

void KvEventRecorder::Log::clear() noexcept {
  records.clear();
  events = 0;
  block = 0;
  used = 0;
  // After a burst or a resync: blocks past kMaxLogTokens in all are freed.
  std::size_t kept = 0, keep = 0;
  while (keep < blocks.size() && kept + blocks[keep].capacity <= kMaxLogTokens) kept += blocks[keep++].capacity;
  blocks.resize(keep);
  if (records.capacity() > kMaxLogTokens / 16) std::vector<Record>().swap(records);
}

KvEventRecorder::Record KvEventRecorder::node_record(const RadixTree& tree, std::int32_t index, const NodeView& v,
                                                     Op op) const {
  Record r;
  r.op = op;
  r.index = index;
  r.generation = v.ref.generation;
  r.pages = v.tokens.size() / static_cast<std::size_t>(page_size_);
  if (v.parent >= 0) {
    r.parent = v.parent;
    r.parent_generation = tree.node_view(v.parent).ref.generation;
  }
  return r;
}

void KvEventRecorder::append(Log& log, const Record& r, std::span<const std::int32_t> tokens) {
  // Room first, then the copies, which cannot throw: a failed append leaves the log as it was.
  if (log.records.size() == log.records.capacity()) {
    log.records.reserve(std::max<std::size_t>(256, 2 * log.records.size()));
  }
  Record copy = r;
  copy.tokens = log.put(tokens);
  copy.token_count = tokens.size();
  log.records.push_back(copy);
  if (r.op != Op::define) ++log.events;
}

const KvEventRecorder::Namespace& KvEventRecorder::describe(const RadixTree& tree, std::int32_t index, bool fold_own,
                                                            Log& log) const {
  std::int32_t chain[64];  // bottom-up: nodes the taking thread does not know (rarely more than one or two)
  std::vector<std::int32_t> long_chain;
  std::size_t depth = 0;
  const Namespace* ns = nullptr;
  for (std::int32_t n = index; n >= 0;) {
    const NodeView v = tree.node_view(n);
    if (described(n, v.ref.generation)) {
      ns = known_[static_cast<std::size_t>(n)].ns;
      break;
    }
    if (depth < std::size(chain)) {
      chain[depth] = n;
    } else {
      if (long_chain.empty()) long_chain.assign(chain, chain + depth);
      long_chain.push_back(n);
    }
    ++depth;
    n = v.parent;
  }
  auto at = [&](std::size_t i) { return long_chain.empty() ? chain[i] : long_chain[i]; };
  if (ns == nullptr) ns = &namespace_of(tree, at(depth - 1));  // nothing known up to the namespace's root
  for (std::size_t i = depth; i-- > 0;) {
    const std::int32_t n = at(i);
    const auto slot = static_cast<std::size_t>(n);
    if (slot >= known_.size()) known_.resize(std::max(slot + 1, 2 * known_.size()));
    if (n == index && fold_own) {
      known_[slot] = Known{tree.node_view(n).ref.generation, false, ns};  // the caller's record describes it
      continue;
    }
    const NodeView v = tree.node_view(n);
    Record r = node_record(tree, n, v, Op::define);
    r.ns = ns;
    append(log, r, v.tokens);
    known_[slot] = Known{v.ref.generation, true, ns};
  }
  return *ns;
}

void KvEventRecorder::reset_known() noexcept {
  for (Known& k : known_) k.described = false;
}

// Under queue_mutex_: what is queued (and not yet handed out), and `also`
// more, are lost; a resync will describe the whole tree as it is then, these
// changes included.
void KvEventRecorder::lose_queue(std::uint64_t also) noexcept {
  dropped_.fetch_add(queue_.events + taken_left_ + also, std::memory_order_relaxed);
  queue_.clear();
  taken_left_ = 0;
  ++epoch_;  // the taking thread drops what it has not handed out
  resync_needed_.store(true, std::memory_order_release);
}

void KvEventRecorder::record(const RadixTree& tree, std::int32_t index, Tier tier, bool stored) noexcept {
  recorded_.fetch_add(1, std::memory_order_relaxed);
  if (resync_needed()) {  // the resync to come says it
    dropped_.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  const NodeView v = tree.node_view(index);
  Record r = node_record(tree, index, v, stored ? Op::stored : Op::removed);
  r.medium = tier == Tier::host ? KvMedium::cpu : KvMedium::gpu;
  // A node that leaves both tiers is freed: its entry goes with it.
  r.forget = !stored && ((tier == Tier::device && !v.on_host) || (tier == Tier::host && !v.on_device));
  bool wake = false;
  {
    std::lock_guard guard(queue_mutex_);
    const std::size_t queued = queue_.events + taken_left_;
    if (queued >= capacity_) {
      lose_queue(1);
      wake = static_cast<bool>(wake_);
    } else {
      try {
        if (queue_.events == 0) oldest_ = std::chrono::steady_clock::now();
        const bool new_node = !described(index, v.ref.generation);
        if (new_node) {
          r.ns = &describe(tree, index, /*fold_own=*/true, queue_);  // defines of unknown ancestors first
          r.define = true;
        }
        r.token_ids = stored && token_ids_;
        append(queue_, r,
               r.define || r.token_ids ? v.tokens.first(r.pages * static_cast<std::size_t>(page_size_))
                                       : std::span<const std::int32_t>());
        if (r.define) known_[static_cast<std::size_t>(index)].described = true;
        if (r.forget) known_[static_cast<std::size_t>(index)].described = false;
      } catch (const std::bad_alloc&) {
        lose_queue(1);  // what describe noted goes with the queue: the resync notes all again
      }
      wake = wake_ && queue_.events + taken_left_ == wake_threshold_;
    }
  }
  if (wake) wake_();
}

void KvEventRecorder::pages_stored(const RadixTree& tree, std::int32_t index, Tier tier) noexcept {
  record(tree, index, tier, true);
}

void KvEventRecorder::pages_removed(const RadixTree& tree, std::int32_t index, Tier tier) noexcept {
  record(tree, index, tier, false);
}

void KvEventRecorder::record_cleared() noexcept {
  recorded_.fetch_add(1, std::memory_order_relaxed);
  reset_known();  // the taking thread forgets every entry at AllBlocksCleared
  std::lock_guard guard(queue_mutex_);
  if (resync_needed_.load(std::memory_order_relaxed)) {
    dropped_.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  try {
    if (queue_.events == 0) oldest_ = std::chrono::steady_clock::now();
    append(queue_, Record{}, {});
  } catch (const std::bad_alloc&) {
    lose_queue(1);
  }
}

void KvEventRecorder::resync(const RadixTree& tree) noexcept {
  Log snapshot;
  reset_known();
  try {
    std::vector<std::int32_t> nodes;
    tree.nodes_top_down(nodes);
    append(snapshot, Record{}, {});  // AllBlocksCleared
    for (std::int32_t n : nodes) (void)describe(tree, n, /*fold_own=*/false, snapshot);
    for (KvMedium medium : {KvMedium::gpu, KvMedium::cpu}) {
      for (std::int32_t n : nodes) {
        const NodeView v = tree.node_view(n);
        if (!(medium == KvMedium::gpu ? v.on_device : v.on_host)) continue;
        Record r = node_record(tree, n, v, Op::stored);
        r.medium = medium;
        r.token_ids = token_ids_;
        append(snapshot, r, token_ids_ ? v.tokens : std::span<const std::int32_t>());
      }
    }
  } catch (const std::bad_alloc&) {
    reset_known();
    return;  // still needed: the next try may have the memory
  }
  {
    std::lock_guard guard(queue_mutex_);
    // What was recorded since the drop is in the snapshot: it replaces the queue.
    recorded_.fetch_add(snapshot.events, std::memory_order_relaxed);
    queue_ = std::move(snapshot);
    taken_left_ = 0;
    ++epoch_;
    oldest_ = std::chrono::steady_clock::now();
    resync_needed_.store(false, std::memory_order_release);
    resyncs_.fetch_add(1, std::memory_order_relaxed);
  }
}

std::uint64_t KvEventRecorder::chain_hashes(std::uint64_t above, std::span<const std::int32_t> tokens,
                                            std::vector<std::uint64_t>& out) const {
  const auto page = static_cast<std::size_t>(page_size_);
  for (std::size_t at = 0; at + page <= tokens.size(); at += page) {
    above = next_block_hash(above, tokens.subspan(at, page));
    out.push_back(above);
  }
  return above;
}

Status KvEventRecorder::cached_blocks(const RadixTree& tree, KvMedium medium, std::vector<std::uint64_t>& out) const {
  try {
    // Chained here from the tree, top down (no cache: for tests and tools).
    std::vector<std::int32_t> nodes;
    tree.nodes_top_down(nodes);
    std::map<std::int32_t, std::uint64_t> last;  // each node's last hash
    std::vector<std::uint64_t> hashes, own;
    for (std::int32_t n : nodes) {
      const NodeView v = tree.node_view(n);
      const std::uint64_t above = v.parent >= 0 ? last.at(v.parent) : namespace_of(tree, n).seed;
      own.clear();
      last[n] = v.tokens.empty() ? above : chain_hashes(above, v.tokens, own);
      if (medium == KvMedium::gpu ? v.on_device : v.on_host) hashes.insert(hashes.end(), own.begin(), own.end());
    }
    out = std::move(hashes);
    return {};
  } catch (const std::bad_alloc&) {
    return out_of_memory("cached_blocks: no memory for the list");
  }
}

// ---- the taking thread ----------------------------------------------------------

std::size_t KvEventRecorder::claim(std::size_t max, std::size_t& first, std::size_t& end) {
  std::lock_guard guard(queue_mutex_);
  if (taken_epoch_ != epoch_ || taken_head_ == taken_.records.size()) {
    // What was taken is handed out, or was lost or replaced since: the queue, whole, is next.
    taken_.clear();
    taken_head_ = 0;
    taken_epoch_ = epoch_;
    taken_left_ = queue_.events;
    taken_oldest_ = oldest_;
    std::swap(taken_, queue_);  // the queue gets the emptied log's storage
  }
  first = taken_head_;
  std::size_t events = 0;
  end = first;
  while (end < taken_.records.size() && events < max) {
    if (taken_.records[end].op != Op::define) ++events;
    ++end;
  }
  taken_head_ = end;
  taken_left_ -= events;
  return events;
}

bool KvEventRecorder::build(std::size_t first, std::size_t end) {
  built_.clear();
  batch_hashes_.clear();
  auto entry_of = [&](std::int32_t index, std::uint32_t generation) -> Entry* {
    const auto slot = static_cast<std::size_t>(index);
    if (index < 0 || slot >= entries_.size() || entries_[slot].generation != generation ||
        entries_[slot].hashes.empty()) {
      return nullptr;
    }
    return &entries_[slot];
  };
  for (std::size_t i = first; i < end; ++i) {
    const Record& r = taken_.records[i];
    if (r.op == Op::cleared) {
      for (Entry& e : entries_) e.hashes.clear();
      built_.push_back(Built{&r, 0, 0, std::nullopt, nullptr});
      continue;
    }
    if (r.op == Op::define || r.define) {
      std::uint64_t above = r.ns->seed;
      if (r.parent >= 0) {
        const Entry* up = entry_of(r.parent, r.parent_generation);
        if (up == nullptr) return false;
        above = up->hashes.back();
      }
      const auto slot = static_cast<std::size_t>(r.index);
      if (slot >= entries_.size()) entries_.resize(std::max(slot + 1, 2 * entries_.size()));
      Entry& e = entries_[slot];
      e.generation = r.generation;
      e.ns = r.ns;
      e.hashes.clear();
      (void)chain_hashes(above, std::span(r.tokens, r.token_count), e.hashes);
      if (r.op == Op::define) continue;
    }
    Entry* e = entry_of(r.index, r.generation);
    if (e == nullptr || e->hashes.size() < r.pages) return false;
    Built b{&r, batch_hashes_.size(), r.pages, std::nullopt, e->ns};
    batch_hashes_.insert(batch_hashes_.end(), e->hashes.end() - static_cast<std::ptrdiff_t>(r.pages), e->hashes.end());
    if (r.op == Op::stored) {
      if (e->hashes.size() > r.pages) {
        b.parent = e->hashes[e->hashes.size() - r.pages - 1];
      } else if (r.parent >= 0) {
        const Entry* up = entry_of(r.parent, r.parent_generation);
        if (up == nullptr) return false;
        b.parent = up->hashes.back();
      }
    }
    if (r.forget) e->hashes.clear();  // its storage stays for the slot's next node
    built_.push_back(b);
  }
  return true;
}

KvEventView KvEventRecorder::view(const Built& b) const {
  const Record& r = *b.record;
  KvEventView v;
  v.kind = r.op == Op::stored    ? KvEventKind::block_stored
           : r.op == Op::removed ? KvEventKind::block_removed
                                 : KvEventKind::all_blocks_cleared;
  v.medium = r.medium;
  v.block_hashes = std::span(batch_hashes_).subspan(b.hashes_at, b.hash_count);
  if (r.op != Op::stored) return v;
  if (r.token_ids) v.token_ids = std::span(r.tokens, r.token_count);
  v.parent_block_hash = b.parent;
  v.block_size = page_size_;
  if (b.ns->adapter_id != 0) v.lora_id = b.ns->adapter_id;
  v.extra_key = b.ns->digest;
  return v;
}

std::size_t KvEventRecorder::take_views(std::vector<KvEventView>& out, std::size_t max) {
  out.clear();
  std::size_t first = 0, end = 0;
  const std::size_t n = claim(max, first, end);
  try {
    if (!build(first, end)) {
      // The log names a node this thread has no entry for: never expected; the resync puts it right.
      std::lock_guard guard(queue_mutex_);
      lose_queue(n);
      return 0;
    }
    out.reserve(built_.size());  // the caller's vector, batch after batch: allocates once
  } catch (const std::bad_alloc&) {
    std::lock_guard guard(queue_mutex_);
    lose_queue(n);
    return 0;
  }
  for (const Built& b : built_) out.push_back(view(b));
  return out.size();
}

// Every field set anew; the vectors and the string keep their storage (the
// taking thread's, batch after batch), within the kept bounds.
void KvEventRecorder::fill(const Built& b, KvEvent& out, std::size_t& kept_tokens) const {
  const KvEventView v = view(b);
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

std::size_t KvEventRecorder::take(std::vector<KvEvent>& out, std::size_t max) {
  std::size_t first = 0, end = 0;
  const std::size_t n = claim(max, first, end);
  std::size_t kept_tokens = 0;
  try {
    if (!build(first, end)) {
      out.clear();
      std::lock_guard guard(queue_mutex_);
      lose_queue(n);
      return 0;
    }
    const std::size_t count = built_.size();
    // Events past this batch's count wait in slots_ rather than being destroyed: a batch of another size
    // would otherwise free and allocate their storage, batch after batch.
    while (out.size() > count) {
      slots_.push_back(std::move(out.back()));
      out.pop_back();
    }
    while (out.size() < count) {
      if (slots_.empty()) {
        out.emplace_back();
      } else {
        out.push_back(std::move(slots_.back()));
        slots_.pop_back();
      }
    }
    for (std::size_t i = 0; i < count; ++i) fill(built_[i], out[i], kept_tokens);
  } catch (const std::bad_alloc&) {
    out.clear();
    std::lock_guard guard(queue_mutex_);
    lose_queue(n);
    return 0;
  }
  return out.size();
}

std::size_t KvEventRecorder::queued() const {
  std::lock_guard guard(queue_mutex_);
  return queue_.events + taken_left_;
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
