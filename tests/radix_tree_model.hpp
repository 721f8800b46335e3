// tests/radix_tree_model.hpp: the naive reference model of RadixTree + PagedKvPool
// and the driver that checks the tree against it step by step. Shared by the
// property test (tests/test_radix_tree_property.cpp, seeded random runs) and
// the differential fuzzer (tests/fuzz/fuzz_radix_tree_diff.cpp, where the
// fuzzer's bytes make every choice).
//
//   clm_test::radix_model::Config config{16, clm::EvictionPolicy::lru, 128, 8};
//   clm_test::radix_model::PropertyRun run(config, seed, [](const std::string& what) { FAIL(what); });
//   run.run(100000);  // every step checked; on_failure gets the first failed check
//
// The reference model is an uncompressed trie with one entry per cached page
// (key: parent entry + the page's tokens; value: the pool page id), with per
// entry the lock count, last access tick, hit count and priority. It knows
// nothing about compressed nodes, hash edges or the eviction heap. Eviction is
// not predicted exactly (ties and node boundaries are the tree's business):
// after each call that may evict, the driver reads which pages the tree gave up
// and checks that the set is legal (whole subtrees, unlocked, enough tokens,
// and in policy order; the last leaf may give up only its tail, which splits
// it: at most one such split a call).
//
// SLRU's protected segment is capped: when a match overflows it, the least
// recently used protected nodes fall back to probation (with a fresh access
// tick). Which of several nodes with the same tick goes is the heap's choice,
// so the model tracks, per entry, whether it may be protected and/or
// probationary and the range of its access tick, and checks the eviction order
// on key bounds.
//
// ghost_slru is SLRU (a larger segment, the same uncertainty) plus the ghost:
// the model knows where the tree's nodes end (a match or insert ends a node
// where its path ends, a new leaf is one node), so it groups what an eviction
// gave up into the leaves the tree evicted and remembers each probationary one
// by (parent entry, first page), as the tree does. The tree's ghost is a FIFO
// trimmed from the front to its token cap, and the order of the leaves within
// one eviction is the heap's: a leaf is "certainly" remembered while even the
// worst order keeps it, forgotten once even the best order drops it, "maybe"
// in between (and when its segment was unsure). An insert whose new leaf's key
// is certainly remembered must land in the protected segment, a maybe leaves
// its segment unsure; the tree's ghost_tokens() is checked against the bounds.
// An insert with a priority above 0 protects its whole path, new leaf and all
// (and priorities order ghost_slru's leaves first, through eviction_key).
//
// Every step is followed by the full check: tree.check_invariants(); cached,
// evictable and protected tokens against the model; every pool page's owner
// and reference count (tree xor test xor free: nothing leaked or freed twice);
// owns_page. Every match is compared page by page with the model, and every
// few thousand steps each cached leaf is matched in its own namespace and in
// another one. 6 namespaces (3 salts x 2 adapters).
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "clm/cache/radix_tree.hpp"

namespace clm_test::radix_model {

using clm::EvictionPolicy;
using clm::NodeRef;
using clm::StatusCode;
using Tokens = std::vector<std::int32_t>;
using Pages = std::vector<std::int32_t>;

std::uint64_t mix(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// Choices for the run: from `choices` while they last (a fuzzer's input steers
// every decision: one byte for n <= 256, two for n <= 65536, else eight,
// little-endian, modulo n), then from a stream seeded with `seed`. The bytes
// are not copied: they must outlive the Rng.
class Rng {
 public:
  explicit Rng(std::uint64_t seed, std::span<const std::uint8_t> choices = {}) : state_(seed), choices_(choices) {}
  std::uint64_t next() { return mix(state_++); }
  // Uniform in [0, n) (the stream's part); 0 when n == 0.
  std::uint64_t below(std::uint64_t n) {
    if (n == 0) return 0;
    if (choices_.empty()) return next() % n;
    const std::size_t want = n <= 0x100 ? 1 : n <= 0x10000 ? 2 : 8;
    const std::size_t take = std::min(want, choices_.size());
    std::uint64_t v = 0;
    for (std::size_t i = 0; i < take; ++i) v |= static_cast<std::uint64_t>(choices_[i]) << (8 * i);
    choices_ = choices_.subspan(take);
    return v % n;
  }
  std::size_t index(std::size_t n) { return static_cast<std::size_t>(below(n)); }
  std::int64_t range(std::int64_t lo, std::int64_t hi) {  // inclusive
    return lo + static_cast<std::int64_t>(below(static_cast<std::uint64_t>(hi - lo + 1)));
  }
  std::int32_t range32(std::int64_t lo, std::int64_t hi) { return static_cast<std::int32_t>(range(lo, hi)); }
  bool percent(int p) { return below(100) < static_cast<std::uint64_t>(p); }

 private:
  std::uint64_t state_;
  std::span<const std::uint8_t> choices_;
};

// ---- namespaces ----------------------------------------------------------------

constexpr std::array<std::string_view, 3> kSalts = {"", "tenant-a", "tenant-b"};
constexpr std::array<std::int32_t, 2> kAdapters = {0, 7};
constexpr int kNamespaces = static_cast<int>(kSalts.size() * kAdapters.size());

clm::CacheNamespace namespace_of(int ns) {
  return clm::CacheNamespace{kSalts[static_cast<std::size_t>(ns) % kSalts.size()],
                             kAdapters[static_cast<std::size_t>(ns) / kSalts.size()]};
}

// ---- the reference model ---------------------------------------------------------

struct Entry {
  std::int64_t parent = -1;  // -1: a namespace root
  int ns = 0;
  Tokens tokens;             // the page's tokens (empty for a root)
  std::int32_t page = -1;    // pool page id (-1 for a root)
  std::int32_t locks = 0;    // held locks whose prefix covers this entry
  std::int32_t own_locks = 0;// held locks on a handle that ends at this entry
  std::uint64_t last_access = 0;  // exact, but for SLRU only while it may be protected
  std::uint32_t hits = 0;
  std::uint8_t priority = 0;
  // SLRU segment: may be protected (then last_access is exact) and/or may be
  // probationary (then its access tick is in [probation_lo, probation_hi]).
  bool may_protected = false;
  bool may_probation = true;
  std::uint64_t probation_lo = 0, probation_hi = 0;
  std::map<Tokens, std::int64_t> children;
  std::optional<NodeRef> ref;  // the tree's handle for the node that ends here, once seen
  bool ends_node = false;      // the tree's node holding this page ends here
};

// ghost_slru: an evicted leaf the tree's ghost may remember.
struct GhostEntry {
  std::int64_t tokens = 0;
  std::int64_t batch = 0;  // the eviction call that remembered it (order within a call unknown)
  bool certain = true;     // certainly remembered (else maybe)
};
using GhostKey = std::pair<std::int64_t, Tokens>;  // parent entry, first page

class Model {
 public:
  Model(std::int32_t page_size, EvictionPolicy policy, std::int32_t num_pages, double protected_fraction,
        double ghost_memory = clm::kDefaultGhostMemory)
      : ps_(page_size),
        policy_(policy),
        // The same expressions as the tree's.
        protected_cap_(static_cast<std::int64_t>(std::clamp(protected_fraction, 0.0, 1.0) * num_pages * page_size)),
        ghost_cap_(
            policy == EvictionPolicy::ghost_slru
                ? static_cast<std::int64_t>(std::clamp(ghost_memory, 0.0, clm::kMaxGhostMemory) * num_pages * page_size)
                : 0),
        owner_(static_cast<std::size_t>(num_pages), -1) {
    for (int ns = 0; ns < kNamespaces; ++ns) {
      Entry root;
      root.ns = ns;
      roots_.push_back(add(std::move(root)));
    }
  }

  std::int32_t page_size() const { return ps_; }
  std::uint64_t tick() const { return tick_; }
  bool alive(std::int64_t id) const { return entries_.count(id) != 0; }
  bool has_children(std::int64_t id) const {
    return std::any_of(entries_.begin(), entries_.end(), [&](const auto& kv) { return kv.second.parent == id; });
  }
  const Entry& at(std::int64_t id) const { return entries_.at(id); }
  Entry& at(std::int64_t id) { return entries_.at(id); }
  std::int64_t root(int ns) const { return roots_[static_cast<std::size_t>(ns)]; }
  bool is_root(std::int64_t id) const { return at(id).parent < 0; }
  std::int64_t owner(std::int32_t page) const {
    return page >= 0 && static_cast<std::size_t>(page) < owner_.size() ? owner_[static_cast<std::size_t>(page)] : -1;
  }
  const std::unordered_map<std::int64_t, Entry>& entries() const { return entries_; }

  // Bounds on the entry's eviction key (equal unless SLRU's segment is unsure).
  std::uint64_t key_lo(std::int64_t id) const {
    const Entry& e = at(id);
    if (!slru()) return clm::eviction_key(policy_, e.last_access, e.hits, e.priority, false);
    return e.may_probation ? clm::eviction_key(policy_, e.probation_lo, e.hits, e.priority, false)
                           : clm::eviction_key(policy_, e.last_access, e.hits, e.priority, true);
  }
  std::uint64_t key_hi(std::int64_t id) const {
    const Entry& e = at(id);
    if (!slru()) return clm::eviction_key(policy_, e.last_access, e.hits, e.priority, false);
    return e.may_protected ? clm::eviction_key(policy_, e.last_access, e.hits, e.priority, true)
                           : clm::eviction_key(policy_, e.probation_hi, e.hits, e.priority, false);
  }
  // Whether every entry's key is at most its parent's, so that a leaf sorts
  // before the entries above it. It holds for lru, lfu and priority while
  // every insert raises priorities (an insert that covers an entry covers its
  // parent); a PriorityUpdate::set insert of a short prefix can lower a parent
  // below its children. SLRU's segments break it too (a demoted parent).
  bool keys_monotone() const {
    if (slru()) return false;
    for (const auto& [id, e] : entries_) {
      if (e.parent >= 0 && !is_root(e.parent) && key_hi(id) > key_lo(e.parent)) return false;
    }
    return true;
  }
  // A protected segment: slru and ghost_slru.
  bool slru() const { return clm::is_segmented(policy_); }
  bool ghost() const { return policy_ == EvictionPolicy::ghost_slru; }
  std::int64_t ghost_capacity() const { return ghost_cap_; }
  // Bounds on the tokens the tree's ghost remembers.
  std::int64_t ghost_tokens_lo() const {
    std::int64_t sum = 0;
    for (const auto& [key, g] : ghost_) sum += g.certain ? g.tokens : 0;
    return sum;
  }
  std::int64_t ghost_tokens_hi() const {
    std::int64_t sum = 0;
    for (const auto& [key, g] : ghost_) sum += g.tokens;
    return sum;
  }
  std::int64_t ghost_admissions() const { return ghost_admissions_; }
  std::int64_t ghost_unsure_admissions() const { return ghost_unsure_admissions_; }
  std::int64_t demotions() const { return demotions_; }  // entries demoted (or maybe demoted)
  bool segment_unsure(std::int64_t id) const { return at(id).may_protected && at(id).may_probation; }

  // Entries (below the root) of the longest cached prefix of tokens[0, limit),
  // a page at a time.
  std::vector<std::int64_t> walk(int ns, const Tokens& tokens, std::size_t limit) const {
    std::vector<std::int64_t> path;
    std::int64_t id = root(ns);
    const auto page = static_cast<std::size_t>(ps_);
    for (std::size_t pos = 0; pos + page <= limit; pos += page) {
      const Entry& e = at(id);
      const Tokens key(tokens.begin() + static_cast<std::ptrdiff_t>(pos),
                       tokens.begin() + static_cast<std::ptrdiff_t>(pos + page));
      auto it = e.children.find(key);
      if (it == e.children.end()) break;
      id = it->second;
      path.push_back(id);
    }
    return path;
  }

  Pages pages_of(const std::vector<std::int64_t>& path) const {
    Pages pages;
    for (std::int64_t id : path) pages.push_back(at(id).page);
    return pages;
  }

  // The path from the root down to `id` (the root excluded).
  std::vector<std::int64_t> path_to(std::int64_t id) const {
    std::vector<std::int64_t> path;
    for (; !is_root(id); id = at(id).parent) path.push_back(id);
    std::reverse(path.begin(), path.end());
    return path;
  }
  Tokens tokens_to(std::int64_t id) const {
    Tokens t;
    for (std::int64_t e : path_to(id)) t.insert(t.end(), at(e).tokens.begin(), at(e).tokens.end());
    return t;
  }

  // match_prefix: one tick; every page on the matched path is touched and hit.
  std::vector<std::int64_t> match(int ns, const Tokens& tokens) {
    std::vector<std::int64_t> path = walk(ns, tokens, tokens.size() - 1);
    ++tick_;
    for (std::int64_t id : path) {
      Entry& e = at(id);
      e.last_access = tick_;
      ++e.hits;
      if (slru()) {  // a hit: into the protected segment
        e.may_protected = true;
        e.may_probation = false;
      }
    }
    if (!path.empty()) at(path.back()).ends_node = true;  // the tree splits the node there
    if (slru()) enforce_protected_cap();
    return path;
  }

  // SLRU: while the protected segment holds more than its cap, its least
  // recently used node falls back to probation with access tick = now. Nodes
  // with equal ticks go in an order the model cannot know: an entry is
  // certainly kept when even everything at least as recent fits the cap,
  // certainly demoted when what is certainly protected and more recent does
  // not, and unsure otherwise.
  void enforce_protected_cap() {
    std::vector<std::pair<std::uint64_t, std::int64_t>> candidates;  // (tick, id), newest first
    for (const auto& [id, e] : entries_) {
      if (e.parent >= 0 && e.may_protected) candidates.emplace_back(e.last_access, id);
    }
    std::sort(candidates.begin(), candidates.end(), std::greater<>());
    std::int64_t newer_max = 0;  // tokens that may be protected, in newer groups
    std::int64_t newer_min = 0;  // tokens certainly protected, in newer groups
    for (std::size_t i = 0; i < candidates.size();) {
      std::size_t j = i;
      std::int64_t group_max = 0, group_min = 0;
      for (; j < candidates.size() && candidates[j].first == candidates[i].first; ++j) {
        group_max += ps_;
        group_min += at(candidates[j].second).may_probation ? 0 : ps_;
      }
      const bool kept = newer_max + group_max <= protected_cap_;
      const bool demoted = newer_min > protected_cap_;
      if (!kept) {
        demotions_ += static_cast<std::int64_t>(j - i);
        for (std::size_t k = i; k < j; ++k) {
          Entry& e = at(candidates[k].second);
          e.probation_lo = e.may_probation ? std::min(e.probation_lo, tick_) : tick_;
          e.probation_hi = tick_;
          e.may_probation = true;
          if (demoted) e.may_protected = false;
        }
      }
      newer_max += group_max;
      newer_min += group_min;
      i = j;
    }
  }

  // Whether insert(tokens, pages) must succeed (StatusCode::ok) or be refused,
  // from the documented contract alone. `held(p)` says the test holds page p.
  template <class Held>
  StatusCode predict_insert(int ns, const Tokens& tokens, const Pages& pages, int priority, int update,
                            Held held) const {
    if (tokens.empty() || priority < 0 || priority > clm::kMaxPriority) return StatusCode::invalid_argument;
    if (update != 0 && update != 1) return StatusCode::invalid_argument;  // raise or set
    for (std::int32_t t : tokens) {
      if (t < 0) return StatusCode::invalid_argument;
    }
    const std::size_t store_pages = tokens.size() / static_cast<std::size_t>(ps_);
    if (pages.size() < store_pages) return StatusCode::invalid_argument;
    if (store_pages == 0) return StatusCode::ok;
    const std::vector<std::int64_t> path = walk(ns, tokens, store_pages * static_cast<std::size_t>(ps_));
    auto allocated = [&](std::int32_t p) { return owner(p) >= 0 || held(p); };
    std::map<std::int32_t, int> duplicates;
    for (std::size_t i = 0; i < path.size(); ++i) {
      const std::int32_t p = pages[i];
      if (p == at(path[i]).page) continue;
      if (!allocated(p) || owner(p) >= 0) return StatusCode::invalid_argument;
      ++duplicates[p];
    }
    std::set<std::int32_t> fresh;
    for (std::size_t i = path.size(); i < store_pages; ++i) {
      const std::int32_t p = pages[i];
      if (!allocated(p) || owner(p) >= 0 || !fresh.insert(p).second) return StatusCode::invalid_argument;
    }
    for (const auto& [p, count] : duplicates) {
      // Each duplicate gives up one reference; the test holds one of each page.
      if (fresh.count(p) != 0 || count > 1) return StatusCode::invalid_argument;
    }
    return StatusCode::ok;
  }

  // Applies a successful insert; returns the path of all stored pages.
  // `set`: PriorityUpdate::set, the path takes `priority`; else each entry keeps its highest.
  std::vector<std::int64_t> insert(int ns, const Tokens& tokens, const Pages& pages, int priority, bool set) {
    const std::size_t store_pages = tokens.size() / static_cast<std::size_t>(ps_);
    std::vector<std::int64_t> path = walk(ns, tokens, store_pages * static_cast<std::size_t>(ps_));
    if (store_pages == 0) return path;
    ++tick_;
    const auto prio = static_cast<std::uint8_t>(priority);
    for (std::int64_t id : path) {
      Entry& e = at(id);
      e.last_access = tick_;
      e.probation_lo = e.probation_hi = tick_;  // whichever segment it is in
      e.priority = set ? prio : std::max(e.priority, prio);
    }
    if (!path.empty()) at(path.back()).ends_node = true;  // the tree splits the node there
    std::int64_t parent = path.empty() ? root(ns) : path.back();
    const std::size_t first_new = path.size();
    for (std::size_t i = path.size(); i < store_pages; ++i) {
      Entry e;
      e.parent = parent;
      e.ns = ns;
      e.tokens.assign(tokens.begin() + static_cast<std::ptrdiff_t>(i * static_cast<std::size_t>(ps_)),
                      tokens.begin() + static_cast<std::ptrdiff_t>((i + 1) * static_cast<std::size_t>(ps_)));
      e.page = pages[i];
      e.last_access = e.probation_lo = e.probation_hi = tick_;
      e.priority = prio;
      const Tokens key = e.tokens;
      const std::int32_t page = e.page;
      const std::int64_t id = add(std::move(e));
      at(parent).children.emplace(key, id);
      owner_[static_cast<std::size_t>(page)] = id;
      path.push_back(id);
      parent = id;
    }
    if (first_new < path.size()) {  // the new pages are one leaf
      at(path.back()).ends_node = true;
      if (ghost()) admit_by_ghost(std::span<const std::int64_t>(path).subspan(first_new));
    }
    if (ghost() && prio > 0) {  // the host vouches for it: the whole path is protected
      for (std::int64_t id : path) {
        Entry& e = at(id);
        e.may_protected = true;
        e.may_probation = false;
      }
    }
    if (ghost()) enforce_protected_cap();
    return path;
  }

  // ghost_slru: a new leaf whose key the ghost remembers starts protected.
  void admit_by_ghost(std::span<const std::int64_t> leaf) {
    const Entry& first = at(leaf.front());
    auto it = ghost_.find(GhostKey{first.parent, first.tokens});
    if (it == ghost_.end()) return;
    const bool certain = it->second.certain;
    ghost_.erase(it);  // the tree forgets the key either way
    ++(certain ? ghost_admissions_ : ghost_unsure_admissions_);
    for (std::int64_t id : leaf) {
      Entry& e = at(id);
      e.may_protected = true;
      e.may_probation = !certain;
    }
  }

  // The tree's last leaf of an eviction may give up only its tail: it splits
  // the leaf there, so the entry before the first page given up now ends a
  // node (the head stays, a node of its own). Returns how many such splits
  // `gone` shows.
  int mark_split_tails(const std::vector<std::int64_t>& gone) {
    const std::set<std::int64_t> set(gone.begin(), gone.end());
    int splits = 0;
    for (std::int64_t id : gone) {
      const std::int64_t parent = at(id).parent;
      if (is_root(parent) || set.count(parent) != 0) continue;
      if (!at(parent).ends_node) {
        at(parent).ends_node = true;
        ++splits;
      }
    }
    return splits;
  }

  // ghost_slru: the tree evicted the entries `gone` (whole leaves, or a leaf's
  // tail after mark_split_tails, in an order the heap chose); remembers the
  // probationary leaves among them, then trims.
  void remember_evicted(const std::vector<std::int64_t>& gone) {
    if (!ghost() || ghost_cap_ <= 0) return;
    const std::set<std::int64_t> set(gone.begin(), gone.end());
    ++batch_;
    for (std::int64_t id : gone) {
      const Entry& start = at(id);
      if (!is_root(start.parent) && !at(start.parent).ends_node) continue;  // not the first page of a node
      std::int64_t tokens = 0;
      bool may_protected = false, may_probation = false;
      for (std::int64_t e = id;;) {
        const Entry& entry = at(e);
        tokens += ps_;
        may_protected = may_protected || entry.may_protected;
        may_probation = may_probation || entry.may_probation;
        if (entry.ends_node) break;
        e = entry.children.begin()->second;  // inside a node: exactly one child
      }
      if (!may_probation) continue;  // protected leaves are not remembered
      ghost_[GhostKey{start.parent, start.tokens}] = GhostEntry{tokens, batch_, !may_protected};
    }
    trim_ghost();
  }

  // The tree drops the oldest remembered leaves while it holds more than its
  // cap. A leaf is dropped for sure when even as the last of its batch what
  // is certainly remembered from there on exceeds the cap; it is kept for sure
  // when even as the first of its batch all that may be remembered from there
  // on fits.
  void trim_ghost() {
    std::map<std::int64_t, std::int64_t> batch_lo, batch_hi;  // tokens per batch
    for (const auto& [key, g] : ghost_) {
      batch_lo[g.batch] += g.certain ? g.tokens : 0;
      batch_hi[g.batch] += g.tokens;
    }
    std::map<std::int64_t, std::int64_t> newer_lo, newer_hi;  // tokens in strictly newer batches
    std::int64_t lo = 0, hi = 0;
    for (auto it = batch_hi.rbegin(); it != batch_hi.rend(); ++it) {
      newer_lo[it->first] = lo;
      newer_hi[it->first] = hi;
      lo += batch_lo[it->first];
      hi += it->second;
    }
    for (auto it = ghost_.begin(); it != ghost_.end();) {
      GhostEntry& g = it->second;
      if (g.tokens + newer_lo[g.batch] > ghost_cap_) {
        it = ghost_.erase(it);
        continue;
      }
      if (newer_hi[g.batch] + batch_hi[g.batch] > ghost_cap_) g.certain = false;
      ++it;
    }
  }

  void lock(std::int64_t id, int delta) {
    at(id).own_locks += delta;
    for (; !is_root(id); id = at(id).parent) at(id).locks += delta;
  }

  // Removes entries the tree evicted (a set closed under descendants).
  void remove(const std::vector<std::int64_t>& gone) {
    const std::set<std::int64_t> set(gone.begin(), gone.end());
    for (std::int64_t id : gone) {
      Entry& e = at(id);
      if (set.count(e.parent) == 0) at(e.parent).children.erase(e.tokens);
      owner_[static_cast<std::size_t>(e.page)] = -1;
    }
    for (std::int64_t id : gone) entries_.erase(id);
  }

  std::int64_t cached_pages() const { return static_cast<std::int64_t>(entries_.size()) - kNamespaces; }
  std::int64_t locked_pages() const {
    std::int64_t n = 0;
    for (const auto& [id, e] : entries_) n += (e.parent >= 0 && e.locks > 0);
    return n;
  }
  std::int64_t evictable_pages() const { return cached_pages() - locked_pages(); }

 private:
  std::int64_t add(Entry e) {
    const std::int64_t id = next_id_++;
    entries_.emplace(id, std::move(e));
    return id;
  }

  std::int32_t ps_;
  EvictionPolicy policy_;
  std::int64_t protected_cap_;
  std::int64_t ghost_cap_;
  std::map<GhostKey, GhostEntry> ghost_;
  std::int64_t batch_ = 0;
  std::int64_t ghost_admissions_ = 0;
  std::int64_t ghost_unsure_admissions_ = 0;
  std::int64_t demotions_ = 0;
  std::unordered_map<std::int64_t, Entry> entries_;
  std::vector<std::int64_t> roots_;
  std::vector<std::int64_t> owner_;  // page -> entry id, -1 when not the tree's
  std::int64_t next_id_ = 0;
  std::uint64_t tick_ = 0;
};

// ---- the driver ----------------------------------------------------------------

struct Config {
  std::int32_t page_size;
  EvictionPolicy policy;
  std::int32_t num_pages;
  std::int32_t max_pages;  // pages per generated sequence
  double protected_fraction = clm::kDefaultSlruProtectedFraction;  // SLRU's and ghost_slru's cap
  double ghost_memory = clm::kDefaultGhostMemory;                  // ghost_slru's ghost, in pool capacities
};

using FailureHandler = std::function<void(const std::string&)>;

struct Handle {
  NodeRef ref;
  std::int64_t entry;  // model entry the node ends at (a root entry on a miss)
};

constexpr std::size_t kMaxLocks = 4;
constexpr std::size_t kMaxHandles = 48;
constexpr std::size_t kMaxHistory = 48;
constexpr std::size_t kMaxPastMatches = 16;

struct PastMatch {
  int ns;
  Tokens tokens;
  Pages pages;
};

class PropertyRun {
 public:
  // on_failure gets the message of the first failed check; the run aborts if it
  // returns (Catch2's FAIL throws instead). choices: as Rng's.
  PropertyRun(const Config& config, std::uint64_t seed, FailureHandler on_failure,
              std::span<const std::uint8_t> choices = {})
      : on_failure_(std::move(on_failure)),
        cfg_(config),
        ps_(config.page_size),
        rng_(seed, choices),
        model_(config.page_size, config.policy, config.num_pages, config.protected_fraction, config.ghost_memory),
        held_(static_cast<std::size_t>(config.num_pages), 0) {
    clm::PagedKvPoolConfig pc;
    pc.num_pages = cfg_.num_pages;
    pc.page_size = cfg_.page_size;
    pc.memory = clm::MemoryKind::none;
    const clm::Status created = clm::PagedKvPool::create(pc, pool_);
    if (!created.ok()) fail(__LINE__, "created.ok()", "PagedKvPool::create: {}", created.message());
    tree_ = std::make_unique<clm::RadixTree>(*pool_, cfg_.policy, cfg_.protected_fraction, nullptr, cfg_.ghost_memory);
    make_templates();
    make_prompts();
  }

  void run(std::int64_t ops) {
    const std::int64_t sweep_every = std::max<std::int64_t>(1, std::min<std::int64_t>(2000, ops / 10));
    for (step_ = 0; step_ < ops; ++step_) {
      const auto r = rng_.below(100);
      if (r < 26) {
        op_match();
      } else if (r < 50) {
        op_insert();
      } else if (r < 58) {
        op_lock_handle();
      } else if (r < 68) {
        op_unlock();
      } else if (r < 76) {
        op_evict();
      } else if (r < 82) {
        op_allocate_to_stash();
      } else if (r < 87) {
        op_release_stash();
      } else if (r < 95) {
        op_bad_call();
      } else {
        op_match_other_namespaces();
      }
      check_all();
      if ((step_ + 1) % sweep_every == 0) sweep();
    }
    finish();
  }

  std::int64_t evicted_total() const { return evicted_total_; }
  std::string stats() const {
    return fmt::format(
        "page_size {} {}: {} steps, {} inserts ok, {} refused, {} evicted tokens, {} hit tokens, {} OOM, "
        "{} lock ok, {} stale, peak cached {} tokens, tick {}, hit rate {:.2f}; SLRU: {} demotions, "
        "{:.2f} unsure entries on average; ghost: {} admissions, {} unsure",
        ps_, clm::eviction_policy_name(cfg_.policy), step_, inserts_ok_, inserts_refused_, evicted_total_, hit_tokens_,
        ooms_, locks_ok_, locks_stale_, peak_cached_, model_.tick(), hit_rate_, demoted_total_,
        static_cast<double>(unsure_total_) / static_cast<double>(std::max<std::int64_t>(step_, 1)),
        model_.ghost_admissions(), model_.ghost_unsure_admissions());
  }
  std::int64_t inserts_ok() const { return inserts_ok_; }
  std::int64_t inserts_refused() const { return inserts_refused_; }
  std::int64_t hits() const { return hit_tokens_; }

 private:
  // ---- failure reporting ------------------------------------------------------
  template <class... Args>
  [[noreturn]] void fail(int line, const char* cond, fmt::format_string<Args...> format, Args&&... args) {
    const std::string what = fmt::format(format, std::forward<Args>(args)...);
    on_failure_(fmt::format("step {} ({}), line {}: check `{}` failed: {}", step_, op_, line, cond, what));
    std::abort();
  }
#define PCHECK(cond, ...)                            \
  do {                                               \
    if (!(cond)) fail(__LINE__, #cond, __VA_ARGS__); \
  } while (0)

  // ---- sequences ------------------------------------------------------------
  void make_templates() {
    if (ps_ == 1) {
      templates_ = {{0}, {1}, {2}, {std::numeric_limits<std::int32_t>::max()}};
      return;
    }
    const auto page = static_cast<std::size_t>(ps_);
    Tokens t0(page);
    for (auto& t : t0) t = rng_.range32(0, 2);
    Tokens t1 = t0;  // differs from t0 only in its last token
    t1.back() = (t1.back() + 1) % 3;
    Tokens t2 = t0;  // differs from t0 only in the middle
    t2[page / 2] = 3;
    Tokens t3(page);  // large ids
    for (auto& t : t3) t = rng_.percent(50) ? std::numeric_limits<std::int32_t>::max() : 0x40000000;
    templates_ = {t0, t1, t2, t3};
  }

  void make_prompts() {
    for (int i = 0; i < 3; ++i) {
      Tokens prompt;
      const std::int32_t pages = rng_.range32(1, std::max(1, cfg_.max_pages / 2));
      for (std::int32_t j = 0; j < pages; ++j) {
        const Tokens p = random_page();
        prompt.insert(prompt.end(), p.begin(), p.end());
      }
      prompts_.push_back(prompt);
    }
  }

  Tokens random_page() {
    const auto r = rng_.below(100);
    Tokens p = templates_[r < 55 ? 0 : r < 72 ? 1 : r < 88 ? 2 : 3];
    if (rng_.percent(6)) p[rng_.index(p.size())] = rng_.range32(0, 3);  // a rare page
    return p;
  }

  void append_tail(Tokens& t) {
    if (ps_ > 1 && rng_.percent(50)) {
      const std::int32_t tail = rng_.range32(1, ps_ - 1);
      const Tokens& pattern = templates_[rng_.index(2)];  // often a prefix of a common page
      for (std::int32_t i = 0; i < tail; ++i) {
        t.push_back(rng_.percent(80) ? pattern[static_cast<std::size_t>(i)] : rng_.range32(0, 3));
      }
    }
  }

  Tokens fresh_sequence() {
    Tokens t;
    if (rng_.percent(50)) {  // one of a few shared "system prompts"
      const Tokens& prompt = prompts_[rng_.index(prompts_.size())];
      t.assign(prompt.begin(), prompt.end());
    }
    const std::int32_t pages = rng_.range32(0, cfg_.max_pages - static_cast<std::int32_t>(t.size()) / ps_);
    for (std::int32_t i = 0; i < pages; ++i) {
      const Tokens p = random_page();
      t.insert(t.end(), p.begin(), p.end());
    }
    append_tail(t);
    if (t.empty()) t.push_back(rng_.range32(0, 3));
    return t;
  }

  Tokens pick_sequence() {
    if (history_.empty() || rng_.percent(30)) return fresh_sequence();
    Tokens t = history_[rng_.index(history_.size())];
    const auto r = rng_.below(100);
    if (r < 35) return t;
    if (r < 60) {  // a prefix (maybe not page aligned)
      t.resize(static_cast<std::size_t>(rng_.range(1, static_cast<std::int64_t>(t.size()))));
      return t;
    }
    if (r < 90) {  // extended
      t.resize(t.size() / static_cast<std::size_t>(ps_) * static_cast<std::size_t>(ps_));
      const std::int32_t more = rng_.range32(1, 3);
      for (std::int32_t i = 0; i < more; ++i) {
        const Tokens p = random_page();
        t.insert(t.end(), p.begin(), p.end());
      }
      append_tail(t);
    } else {  // diverges somewhere, maybe inside a page
      t.resize(rng_.index(t.size()));
      const Tokens rest = fresh_sequence();
      t.insert(t.end(), rest.begin(), rest.end());
    }
    t.resize(std::min(t.size(), max_tokens()));
    return t;
  }

  // No sequence is longer: bounds what one evicted leaf can hold.
  std::size_t max_tokens() const {
    return static_cast<std::size_t>(cfg_.max_pages + 2) * static_cast<std::size_t>(ps_);
  }

  void remember_sequence(const Tokens& t) {
    if (history_.size() < kMaxHistory) {
      history_.push_back(t);
    } else {
      history_[rng_.index(history_.size())] = t;
    }
  }

  // Skewed, so that sequences come back to the namespace they were cached in.
  int pick_ns() { return rng_.percent(50) ? 0 : static_cast<int>(rng_.below(kNamespaces)); }

  int pick_priority() {
    const auto r = rng_.below(100);
    if (r < 40) return 0;
    if (r < 55) return 100;
    if (r < 70) return 50;
    return rng_.range32(0, clm::kMaxPriority);
  }

  std::int64_t ps64() const { return ps_; }

  // ---- handles ----------------------------------------------------------------
  // Records the tree's handle for the node ending at `entry`, and checks that a
  // live node keeps one identity (splits keep the handle on the lower part).
  void note_handle(NodeRef ref, std::int64_t entry) {
    Entry& e = model_.at(entry);
    // The tree drops a namespace root once nothing hangs below it and no lock
    // holds it, and makes a new one on the next call: the model's eternal root
    // entry then stands for a new handle.
    if (e.ref && model_.is_root(entry) && !(*e.ref == ref)) {
      const clm::Status old_root = tree_->unlock(*e.ref);
      PCHECK(old_root.code() == StatusCode::not_found, "namespace root changed handle while live: {}",
             old_root.message());
      e.ref.reset();
    }
    if (e.ref) {
      PCHECK(*e.ref == ref, "node ending at entry {} changed handle: ({}, {}) -> ({}, {})", entry, e.ref->index,
             e.ref->generation, ref.index, ref.generation);
    } else {
      const auto key = std::make_pair(ref.index, ref.generation);
      auto it = ref_owner_.find(key);
      PCHECK(it == ref_owner_.end() || !model_.alive(it->second), "handle ({}, {}) names two live nodes", ref.index,
             ref.generation);
      ref_owner_[key] = entry;
      e.ref = ref;
    }
    if (handles_.size() < kMaxHandles) {
      handles_.push_back({ref, entry});
    } else {
      handles_[rng_.index(handles_.size())] = {ref, entry};
    }
  }

  bool lock_handle(const Handle& h) {
    const clm::Status s = tree_->lock(h.ref);
    if (!model_.alive(h.entry) || dropped_root(h, s)) {
      PCHECK(s.code() == StatusCode::not_found && !s.message().empty(), "lock of a stale handle: {} {}",
             s.code_name(), s.message());
      ++locks_stale_;
      return false;
    }
    PCHECK(s.ok(), "lock of a live handle failed: {}", s.message());
    model_.lock(h.entry, +1);
    ++locks_ok_;
    return true;
  }

  // A handle to a namespace root the tree dropped (once nothing was cached
  // below it and no lock held it; the next call in the namespace makes a new
  // root). The model keeps one eternal root entry per namespace, so a root
  // handle answering not_found is taken as such a dropped root; everything the
  // drop could break is still checked by check_invariants after the step.
  bool dropped_root(const Handle& h, const clm::Status& s) {
    if (!model_.is_root(h.entry) || s.code() != StatusCode::not_found) return false;
    Entry& root = model_.at(h.entry);
    PCHECK(root.own_locks == 0 || !(root.ref && *root.ref == h.ref), "a locked namespace root was dropped");
    if (root.ref && *root.ref == h.ref) root.ref.reset();
    return true;
  }

  void unlock_handle(const Handle& h) {
    const clm::Status s = tree_->unlock(h.ref);
    PCHECK(s.ok(), "unlock of a held lock failed: {}", s.message());
    model_.lock(h.entry, -1);
  }

  // ---- checked calls ------------------------------------------------------------
  std::pair<clm::PrefixMatch, std::int64_t> do_match(int ns, const Tokens& t) {
    // peek_prefix first: what the match will find, touching nothing (the
    // metrics, and every later step's comparison with the model, would show it).
    const clm::RadixTreeMetrics metrics_before = tree_->metrics();
    clm::PrefixPeek peek;
    peek.cached_tokens = -5;
    const clm::Status peeked = tree_->peek_prefix(t, namespace_of(ns), peek);
    PCHECK(peeked.ok(), "peek_prefix failed: {}", peeked.message());
    const clm::RadixTreeMetrics metrics_after = tree_->metrics();
    PCHECK(metrics_after.match_calls == metrics_before.match_calls &&
               metrics_after.tokens_queried == metrics_before.tokens_queried &&
               metrics_after.tokens_hit == metrics_before.tokens_hit && metrics_after.nodes == metrics_before.nodes &&
               metrics_after.namespaces == metrics_before.namespaces &&
               metrics_after.protected_tokens == metrics_before.protected_tokens,
           "peek_prefix changed the tree's metrics");
    clm::PrefixMatch m;
    m.cached_tokens = -5;
    const clm::Status s = tree_->match_prefix(t, namespace_of(ns), m);
    PCHECK(s.ok(), "match_prefix failed: {}", s.message());
    const std::vector<std::int64_t> path = model_.match(ns, t);
    std::int64_t unlocked_pages = 0;
    for (std::int64_t id : path) unlocked_pages += model_.at(id).locks == 0;
    PCHECK(peek.cached_tokens == static_cast<std::int64_t>(path.size()) * ps_ && peek.host_tokens == 0,
           "peek in ns {}: cached {} host {}, model {}", ns, peek.cached_tokens, peek.host_tokens,
           path.size() * static_cast<std::size_t>(ps_));
    PCHECK(peek.unlocked_tokens == unlocked_pages * ps_, "peek in ns {}: unlocked {}, model {}", ns,
           peek.unlocked_tokens, unlocked_pages * ps_);
    const Pages expect = model_.pages_of(path);
    const auto len = static_cast<std::int64_t>(t.size());
    PCHECK(m.cached_tokens % ps_ == 0, "cached_tokens {} not page aligned", m.cached_tokens);
    PCHECK(m.cached_tokens <= len - 1, "cached_tokens {} > len-1 = {}", m.cached_tokens, len - 1);
    PCHECK(m.cached_tokens == static_cast<std::int64_t>(path.size()) * ps_,
           "match in ns {} of {} tokens: tree cached {}, model {} (tokens {})", ns, len, m.cached_tokens,
           path.size() * static_cast<std::size_t>(ps_), t);
    PCHECK(m.pages == expect, "match pages differ: tree {} model {}", m.pages, expect);
    hit_tokens_ += m.cached_tokens;
    const std::int64_t entry = path.empty() ? model_.root(ns) : path.back();
    note_handle(m.node, entry);
    return {std::move(m), entry};
  }

  // Checks what one evict()/allocate_pages() call gave up, and drops it from the
  // model. `requested`: tokens the call had to free (0: none).
  void observe_eviction(std::int64_t requested, std::int64_t evictable_before, std::int64_t reported) {
    const bool monotone = model_.keys_monotone();  // of the keys before the eviction: the model's are unchanged
    std::vector<std::int64_t> gone;
    for (const auto& [id, e] : model_.entries()) {
      if (e.parent >= 0 && !tree_->owns_page(e.page)) gone.push_back(id);
    }
    const std::int64_t freed = static_cast<std::int64_t>(gone.size()) * ps_;
    PCHECK(reported == freed, "evicted tokens reported {}, pages given up {}", reported, freed);
    if (evictable_before >= requested) {
      PCHECK(freed >= requested, "asked to free {} of {} evictable tokens, freed {}", requested, evictable_before,
             freed);
    } else {
      PCHECK(freed == evictable_before, "asked to free {} > {} evictable tokens, freed only {}", requested,
             evictable_before, freed);
    }
    // Leaves until enough, the last one only as far as needed: less than a
    // page past it (the driver injects no allocation failures, which would
    // make the tree evict a whole leaf instead of splitting it).
    PCHECK(requested > 0 || freed == 0, "nothing to free, but {} tokens evicted", freed);
    PCHECK(requested >= evictable_before || freed - requested < ps_, "asked {} freed {}: a page or more past it",
           requested, freed);
    if (gone.empty()) return;
    const std::set<std::int64_t> set(gone.begin(), gone.end());
    std::uint64_t max_gone = 0;  // the largest key evicted (a lower bound on it)
    for (std::int64_t id : gone) {
      const Entry& e = model_.at(id);
      PCHECK(e.locks == 0, "entry {} (page {}) evicted with {} locks", id, e.page, e.locks);
      for (const auto& [tokens, child] : e.children) {
        PCHECK(set.count(child) != 0, "entry {} evicted but its child {} stays", id, child);
      }
      max_gone = std::max(max_gone, model_.key_lo(id));
    }
    // Where keys grow from a leaf to the root (not under SLRU, where a demoted
    // parent may sort before its protected child, nor after a set priority
    // lowered a parent: keys_monotone), the heap evicts in key order: it
    // stops as soon as enough is free, and the last leaf it took (a subset of
    // the entries with the largest key) was needed.
    if (monotone) {
      std::int64_t last_key_tokens = 0;
      for (std::int64_t id : gone) last_key_tokens += model_.key_lo(id) == max_gone ? ps_ : 0;
      PCHECK(freed - last_key_tokens < requested, "asked {} freed {}, {} of them before the last key", requested,
             freed, freed - last_key_tokens);
    }
    // Leaves that were leaves all along were candidates at every step.
    std::vector<std::int64_t> leaves_before;
    for (const auto& [id, e] : model_.entries()) {
      if (e.parent >= 0 && e.children.empty() && e.locks == 0 && set.count(id) == 0) leaves_before.push_back(id);
    }
    PCHECK(model_.mark_split_tails(gone) <= 1, "one eviction split more than one leaf");
    model_.remember_evicted(gone);
    model_.remove(gone);
    auto check_stays = [&](std::int64_t id) {
      PCHECK(model_.key_hi(id) >= max_gone,
             "eviction order: evicted a key {} while leaf entry {} (page {}) with key {} stays (policy {})", max_gone,
             id, model_.at(id).page, model_.key_hi(id), clm::eviction_policy_name(cfg_.policy));
    };
    for (std::int64_t id : leaves_before) check_stays(id);
    if (monotone) {  // and, keys being monotone, so were the leaves it uncovered
      for (const auto& [id, e] : model_.entries()) {
        if (e.parent >= 0 && e.children.empty() && e.locks == 0) check_stays(id);
      }
    }
    evicted_total_ += freed;
  }

  // tree.allocate_pages(k): model-predicted out_of_memory, or k fresh pages now
  // held by the test, with eviction checked.
  std::optional<Pages> do_allocate(std::size_t k) {
    const std::int64_t free_before = pool_->free_pages();
    const std::int64_t evictable_before = model_.evictable_pages() * ps_;
    const std::uint64_t evicted_metric = tree_->metrics().evicted_tokens;
    Pages out(k, -7);
    const clm::Status s = tree_->allocate_pages(out);
    const std::int64_t short_pages = static_cast<std::int64_t>(k) - free_before;
    const auto reported = static_cast<std::int64_t>(tree_->metrics().evicted_tokens - evicted_metric);
    if (short_pages > 0 && short_pages * ps_ > evictable_before) {
      PCHECK(s.code() == StatusCode::out_of_memory && !s.message().empty(),
             "allocate_pages({}) with {} free and {} evictable tokens: {} {}", k, free_before, evictable_before,
             s.code_name(), s.message());
      PCHECK(std::all_of(out.begin(), out.end(), [](std::int32_t p) { return p == -7; }), "out written on failure");
      observe_eviction(0, evictable_before, reported);
      ++ooms_;
      return std::nullopt;
    }
    PCHECK(s.ok(), "allocate_pages({}) with {} free and {} evictable tokens failed: {}", k, free_before,
           evictable_before, s.message());
    observe_eviction(std::max<std::int64_t>(short_pages, 0) * ps_, evictable_before, reported);
    for (std::int32_t p : out) {
      PCHECK(pool_->valid_id(p), "allocated page {} invalid", p);
      PCHECK(!held_[static_cast<std::size_t>(p)], "allocated page {} twice", p);
      PCHECK(model_.owner(p) < 0 && !tree_->owns_page(p), "allocated page {} is cached", p);
      PCHECK(pool_->ref_count(p) == 1, "allocated page {} has ref count {}", p, pool_->ref_count(p));
      held_[static_cast<std::size_t>(p)] = 1;
    }
    return out;
  }

  // k pages for the test: from the stash first, then allocate_pages.
  std::optional<Pages> acquire(std::size_t k) {
    Pages out;
    while (out.size() < k && !stash_.empty()) {
      out.push_back(stash_.back());
      stash_.pop_back();
    }
    if (out.size() < k) {
      std::optional<Pages> more = do_allocate(k - out.size());
      if (!more) {
        stash_.insert(stash_.end(), out.begin(), out.end());
        return std::nullopt;
      }
      out.insert(out.end(), more->begin(), more->end());
    }
    return out;
  }

  void release_pages(const Pages& pages) {
    const clm::Status s = pool_->release(pages);
    PCHECK(s.ok(), "release of held pages failed: {}", s.message());
    for (std::int32_t p : pages) held_[static_cast<std::size_t>(p)] = 0;
  }

  std::optional<Handle> do_insert(int ns, const Tokens& t, Pages& pages, int priority, clm::PriorityUpdate update) {
    const StatusCode expect =
        model_.predict_insert(ns, t, pages, priority, static_cast<int>(update),
                              [&](std::int32_t p) { return pool_->valid_id(p) && held_[static_cast<std::size_t>(p)]; });
    const Pages given = pages;
    const std::int64_t free_before = pool_->free_pages();
    clm::InsertOutcome out{-5, -5, NodeRef{}};
    const clm::Status s = tree_->insert(t, pages, namespace_of(ns), out, priority, update);
    if (expect != StatusCode::ok) {
      PCHECK(s.code() == expect && !s.message().empty(), "insert expected {}, got {} ({}); pages {}",
             clm::status_code_name(expect), s.code_name(), s.message(), given);
      PCHECK(pages == given, "refused insert changed pages: {} -> {}", given, pages);
      PCHECK(pool_->free_pages() == free_before, "refused insert changed the pool");
      ++inserts_refused_;
      return std::nullopt;
    }
    PCHECK(s.ok(), "insert failed: {} {}; pages {} tokens {}", s.code_name(), s.message(), given, t);
    ++inserts_ok_;
    const std::size_t store_pages = t.size() / static_cast<std::size_t>(ps_);
    const std::size_t cached_before = model_.walk(ns, t, store_pages * static_cast<std::size_t>(ps_)).size();
    const std::vector<std::int64_t> path = model_.insert(ns, t, given, priority, update == clm::PriorityUpdate::set);
    PCHECK(out.cached_tokens == static_cast<std::int64_t>(cached_before) * ps_, "insert cached_tokens {} model {}",
           out.cached_tokens, cached_before * static_cast<std::size_t>(ps_));
    PCHECK(out.stored_tokens == static_cast<std::int64_t>(store_pages) * ps_, "insert stored_tokens {}",
           out.stored_tokens);
    // Duplicates were released; new pages are the tree's; the rest stay ours.
    for (std::size_t i = 0; i < store_pages; ++i) {
      const std::int32_t p = given[i];
      if (i < cached_before && p == model_.at(path[i]).page) continue;
      held_[static_cast<std::size_t>(p)] = 0;
    }
    const Pages tree_pages = model_.pages_of(path);
    PCHECK(std::equal(tree_pages.begin(), tree_pages.end(), pages.begin()), "insert wrote pages {}, model has {}",
           pages, tree_pages);
    PCHECK(std::equal(pages.begin() + static_cast<std::ptrdiff_t>(store_pages), pages.end(),
                      given.begin() + static_cast<std::ptrdiff_t>(store_pages)),
           "insert changed pages past the stored ones: {} -> {}", given, pages);
    const std::int64_t entry = path.empty() ? model_.root(ns) : path.back();
    note_handle(out.node, entry);
    return Handle{out.node, entry};
  }

  // Pages the test still holds after an insert: back to the stash or the pool.
  void settle(const Pages& candidates) {
    std::set<std::int32_t> seen;
    Pages release;
    for (std::int32_t p : candidates) {
      if (!pool_->valid_id(p) || !held_[static_cast<std::size_t>(p)] || !seen.insert(p).second) continue;
      if (std::find(stash_.begin(), stash_.end(), p) != stash_.end()) continue;
      if (stash_.size() < stash_cap() && rng_.percent(40)) {
        stash_.push_back(p);
      } else {
        release.push_back(p);
      }
    }
    if (!release.empty()) release_pages(release);
  }

  std::size_t stash_cap() const { return static_cast<std::size_t>(cfg_.num_pages / 6); }

  // ---- operations ------------------------------------------------------------
  void op_match() {
    op_ = "match";
    const int ns = pick_ns();
    const Tokens t = pick_sequence();
    auto [m, entry] = do_match(ns, t);
    const PastMatch past{ns, t, m.pages};
    if (past_matches_.size() < kMaxPastMatches) {
      past_matches_.push_back(past);
    } else {
      past_matches_[rng_.index(past_matches_.size())] = past;
    }
    if (locks_.size() < kMaxLocks && rng_.percent(30)) {
      op_ = "match+lock";
      const Handle h{m.node, entry};
      if (lock_handle(h)) locks_.push_back(h);
    }
  }

  void op_match_other_namespaces() {
    op_ = "match across namespaces";
    // The same tokens in every namespace: hits only where inserted there.
    const Tokens t = pick_sequence();
    for (int ns = 0; ns < kNamespaces; ++ns) do_match(ns, t);
  }

  void corrupt(Pages& pages, std::size_t store_pages) {
    const auto r = rng_.below(7);
    const std::size_t i = rng_.index(std::max<std::size_t>(pages.size(), 1));
    if (r == 0 && store_pages > 0) {  // too few pages
      pages.resize(store_pages - 1);
      return;
    }
    if (pages.empty()) return;
    switch (r) {
      case 1: {  // a free page
        for (std::int32_t p = 0; p < cfg_.num_pages; ++p) {
          if (pool_->ref_count(p) == 0) {
            pages[i] = p;
            break;
          }
        }
        break;
      }
      case 2: {  // a page the tree holds
        std::vector<std::int32_t> owned;
        for (std::int32_t p = 0; p < cfg_.num_pages; ++p) {
          if (model_.owner(p) >= 0) owned.push_back(p);
        }
        if (!owned.empty()) pages[i] = owned[rng_.index(owned.size())];
        break;
      }
      case 3:  // a page passed twice
        pages[i] = pages[rng_.index(pages.size())];
        break;
      case 4:  // an invalid id
        pages[i] = rng_.percent(50) ? -1 : cfg_.num_pages;
        break;
      case 5:  // anything
        pages[i] = rng_.range32(0, cfg_.num_pages - 1);
        break;
      default:  // a stash page (held by the test, unused)
        if (!stash_.empty()) pages[i] = stash_[rng_.index(stash_.size())];
        break;
    }
  }

  void op_insert() {
    op_ = "insert";
    int ns = pick_ns();
    Tokens t = pick_sequence();
    const auto mode = rng_.below(100);
    Pages pages;
    if (mode >= 45 && mode < 55 && !past_matches_.empty()) {
      // The pages an earlier match returned, used later: the cache may have
      // changed since (stale ids are refused, or count as duplicates).
      const PastMatch& past = past_matches_[rng_.index(past_matches_.size())];
      ns = past.ns;
      t = past.tokens;
      if (rng_.percent(50)) {
        const Tokens p = random_page();
        t.insert(t.end(), p.begin(), p.end());
        t.resize(std::min(t.size(), max_tokens()));
      }
      pages = past.pages;
    }
    const std::size_t store_pages = t.size() / static_cast<std::size_t>(ps_);
    const int priority = pick_priority();
    const clm::PriorityUpdate update = rng_.percent(30) ? clm::PriorityUpdate::set : clm::PriorityUpdate::raise;
    const std::size_t extra = rng_.percent(10) ? static_cast<std::size_t>(rng_.range(1, 2)) : 0;
    Pages fresh;
    std::optional<Handle> hit_lock;
    if (mode >= 45 && mode < 55 && !past_matches_.empty()) {
      op_ = "insert (pages of an earlier match)";
      std::optional<Pages> got = acquire(store_pages - pages.size() + extra);
      if (!got) return;
      fresh = *got;
      pages.insert(pages.end(), fresh.begin(), fresh.end());
    } else if (mode < 45) {
      // The documented flow: match, lock the hit, allocate the rest, insert.
      op_ = "insert (match, lock, allocate, insert)";
      auto [m, entry] = do_match(ns, t);
      if (locks_.size() < kMaxLocks && rng_.percent(70)) {
        const Handle h{m.node, entry};
        if (lock_handle(h)) hit_lock = h;
      }
      pages = m.pages;
      std::optional<Pages> got = acquire(store_pages - pages.size() + extra);
      if (!got) {
        if (hit_lock) unlock_handle(*hit_lock);
        return;
      }
      fresh = *got;
      pages.insert(pages.end(), fresh.begin(), fresh.end());
    } else {
      // Pages planned from the model: the tree's own ids or fresh duplicates for
      // the cached part (allocating may evict some of it: stale ids are refused).
      op_ = mode < 93 ? "insert (planned pages)" : "insert (corrupted pages)";
      const std::vector<std::int64_t> path = model_.walk(ns, t, store_pages * static_cast<std::size_t>(ps_));
      const Pages planned = model_.pages_of(path);
      std::vector<char> dup(path.size(), 0);
      std::size_t dups = 0;
      for (auto& d : dup) {
        d = rng_.percent(20) ? 1 : 0;
        dups += static_cast<std::size_t>(d);
      }
      std::optional<Pages> got = acquire(store_pages - path.size() + dups + extra);
      if (!got) return;
      fresh = *got;
      std::size_t f = 0;
      for (std::size_t i = 0; i < path.size(); ++i) pages.push_back(dup[i] ? fresh[f++] : planned[i]);
      while (f < fresh.size()) pages.push_back(fresh[f++]);
      if (mode >= 93) corrupt(pages, store_pages);
    }
    const Pages given = pages;
    std::optional<Handle> done = do_insert(ns, t, pages, priority, update);
    remember_sequence(t);
    // A corrupted insert may have consumed a stash page.
    stash_.erase(std::remove_if(stash_.begin(), stash_.end(),
                                [&](std::int32_t p) { return !held_[static_cast<std::size_t>(p)]; }),
                 stash_.end());
    Pages candidates = given;
    candidates.insert(candidates.end(), fresh.begin(), fresh.end());
    settle(candidates);
    if (done && locks_.size() < kMaxLocks && rng_.percent(30)) {
      if (lock_handle(*done)) locks_.push_back(*done);
    }
    if (hit_lock) unlock_handle(*hit_lock);
  }

  void op_lock_handle() {
    op_ = "lock a recent handle";
    if (handles_.empty()) return;
    if (locks_.size() >= kMaxLocks) {
      op_unlock();
      return;
    }
    const Handle h = handles_[rng_.index(handles_.size())];
    if (lock_handle(h)) locks_.push_back(h);
  }

  void op_unlock() {
    op_ = "unlock";
    if (!locks_.empty() && rng_.percent(85)) {
      const std::size_t i = rng_.index(locks_.size());
      const Handle h = locks_[i];
      locks_.erase(locks_.begin() + static_cast<std::ptrdiff_t>(i));
      unlock_handle(h);
      return;
    }
    if (handles_.empty()) return;
    op_ = "unlock a recent handle";
    const Handle h = handles_[rng_.index(handles_.size())];
    const clm::Status s = tree_->unlock(h.ref);
    if (!model_.alive(h.entry) || dropped_root(h, s)) {
      PCHECK(s.code() == StatusCode::not_found && !s.message().empty(), "unlock of a stale handle: {} {}",
             s.code_name(), s.message());
    } else if (model_.at(h.entry).own_locks == 0) {
      PCHECK(s.code() == StatusCode::failed_precondition && !s.message().empty(),
             "unlock without lock: {} {}", s.code_name(), s.message());
    } else {
      PCHECK(s.ok(), "unlock of a locked handle: {}", s.message());
      model_.lock(h.entry, -1);
      auto it = std::find_if(locks_.begin(), locks_.end(), [&](const Handle& l) { return l.entry == h.entry; });
      PCHECK(it != locks_.end(), "model lock without a held lock");
      locks_.erase(it);
    }
  }

  void op_evict() {
    op_ = "evict";
    const auto r = rng_.below(100);
    const std::int64_t all = static_cast<std::int64_t>(cfg_.num_pages) * ps_;
    std::int64_t n;
    if (r < 8) {
      n = 0;
    } else if (r < 85) {
      n = rng_.range(1, std::max<std::int64_t>(1, 2 * cfg_.max_pages * ps64()));
    } else if (r < 98) {
      n = rng_.range(1, all);
    } else {
      n = std::numeric_limits<std::int64_t>::max();
    }
    const std::int64_t evictable_before = model_.evictable_pages() * ps_;
    const std::uint64_t evicted_metric = tree_->metrics().evicted_tokens;
    std::int64_t evicted = -1;
    const clm::Status s = tree_->evict(n, &evicted);
    PCHECK(s.ok(), "evict({}) failed: {}", n, s.message());
    PCHECK(static_cast<std::int64_t>(tree_->metrics().evicted_tokens - evicted_metric) == evicted,
           "metrics.evicted_tokens moved by {}, evict reported {}", tree_->metrics().evicted_tokens - evicted_metric,
           evicted);
    observe_eviction(n, evictable_before, evicted);
  }

  void op_allocate_to_stash() {
    op_ = "allocate_pages";
    // Mostly small; sometimes most of the pool, or more than all of it.
    const std::size_t k = static_cast<std::size_t>(rng_.percent(90) ? rng_.range(1, std::max(1, cfg_.num_pages / 5))
                                                                     : rng_.range(cfg_.num_pages / 2, cfg_.num_pages + 2));
    std::optional<Pages> got = do_allocate(k);
    if (!got) return;
    stash_.insert(stash_.end(), got->begin(), got->end());
    if (stash_.size() > stash_cap()) {
      const Pages extra(stash_.begin() + static_cast<std::ptrdiff_t>(stash_cap()), stash_.end());
      stash_.resize(stash_cap());
      release_pages(extra);
    }
  }

  void op_release_stash() {
    op_ = "release stash";
    if (stash_.empty()) return;
    const std::size_t n = static_cast<std::size_t>(rng_.range(1, static_cast<std::int64_t>(stash_.size())));
    const Pages out(stash_.end() - static_cast<std::ptrdiff_t>(n), stash_.end());
    stash_.resize(stash_.size() - n);
    release_pages(out);
  }

  void op_bad_call() {
    op_ = "bad call";
    const int ns = pick_ns();
    const std::int64_t cached = tree_->cached_tokens();
    const std::uint64_t tick = model_.tick();
    clm::Status s;
    StatusCode expect = StatusCode::invalid_argument;
    switch (rng_.below(7)) {
      case 0: {
        op_ = "bad call: match with a negative token";
        Tokens t = pick_sequence();
        t[rng_.index(t.size())] = rng_.percent(50) ? -1 : std::numeric_limits<std::int32_t>::min();
        clm::PrefixMatch m;
        s = tree_->match_prefix(t, namespace_of(ns), m);
        break;
      }
      case 1: {
        op_ = "bad call: match of nothing";
        clm::PrefixMatch m;
        s = tree_->match_prefix({}, namespace_of(ns), m);
        break;
      }
      case 2: {
        const Tokens t = pick_sequence();
        Pages pages(t.size() / static_cast<std::size_t>(ps_), 0);
        clm::InsertOutcome out;
        if (rng_.percent(50)) {
          op_ = "bad call: insert with a bad priority";
          s = tree_->insert(t, pages, namespace_of(ns), out, rng_.percent(50) ? -1 : clm::kMaxPriority + 1);
        } else {
          op_ = "bad call: insert with a bad priority update";
          s = tree_->insert(t, pages, namespace_of(ns), out, pick_priority(),
                            static_cast<clm::PriorityUpdate>(rng_.range32(2, 255)));
        }
        break;
      }
      case 3: {
        op_ = "bad call: insert with a negative token";
        Tokens t = pick_sequence();
        // At least a page (see "insert validates token ids when shorter than a page").
        t.resize(std::max(t.size(), static_cast<std::size_t>(ps_)), 0);
        t[rng_.index(t.size())] = -7;
        Pages pages(t.size() / static_cast<std::size_t>(ps_), 0);
        clm::InsertOutcome out;
        s = tree_->insert(t, pages, namespace_of(ns), out);
        break;
      }
      case 4:
        op_ = "bad call: evict(<0)";
        s = tree_->evict(rng_.percent(50) ? -1 : std::numeric_limits<std::int64_t>::min());
        break;
      case 5:
        op_ = "bad call: lock of a made-up handle";
        expect = StatusCode::not_found;
        s = tree_->lock(rng_.percent(50) ? NodeRef{} : NodeRef{1 << 30, 1});
        break;
      default:
        op_ = "bad call: unlock of a made-up handle";
        expect = StatusCode::not_found;
        s = tree_->unlock(NodeRef{-3, 0});
        break;
    }
    PCHECK(s.code() == expect && !s.message().empty(), "expected {}, got {} ({})", clm::status_code_name(expect),
           s.code_name(), s.message());
    PCHECK(tree_->cached_tokens() == cached && model_.tick() == tick, "a refused call changed the tree");
  }

  // Matches every cached leaf (plus one token) in its own namespace and in
  // another one: a full structural comparison of tree and model.
  void sweep() {
    op_ = "sweep";
    std::vector<std::int64_t> leaves;
    for (const auto& [id, e] : model_.entries()) {
      if (e.parent >= 0 && e.children.empty()) leaves.push_back(id);
    }
    std::sort(leaves.begin(), leaves.end());
    for (std::int64_t id : leaves) {
      if (!model_.alive(id)) continue;
      Tokens t = model_.tokens_to(id);
      t.push_back(rng_.range32(0, 3));
      const int ns = model_.at(id).ns;
      auto [m, entry] = do_match(ns, t);
      PCHECK(entry == id, "sweep: leaf {} matched as entry {}", id, entry);
      do_match((ns + 1 + static_cast<int>(rng_.below(kNamespaces - 1))) % kNamespaces, t);
    }
    check_all();
  }

  void finish() {
    op_ = "finish";
    // Evict everything evictable: only locked prefixes stay.
    op_evict_all();
    for (const auto& [id, e] : model_.entries()) {
      PCHECK(e.parent < 0 || e.locks > 0, "unlocked entry {} survived evicting everything", id);
    }
    while (!locks_.empty()) {
      unlock_handle(locks_.back());
      locks_.pop_back();
    }
    check_all();
    PCHECK(tree_->protected_tokens() == 0, "protected tokens {} with no locks", tree_->protected_tokens());
    release_pages(stash_);
    stash_.clear();
    // The destructor gives back every page it still holds.
    hit_rate_ = tree_->metrics().hit_rate();
    tree_.reset();
    PCHECK(pool_->free_pages() == pool_->num_pages(), "{} of {} pages free after the tree is gone",
           pool_->free_pages(), pool_->num_pages());
  }

  void op_evict_all() {
    const std::int64_t evictable_before = model_.evictable_pages() * ps_;
    std::int64_t evicted = -1;
    const clm::Status s = tree_->evict(std::numeric_limits<std::int64_t>::max(), &evicted);
    PCHECK(s.ok(), "evict(all) failed: {}", s.message());
    observe_eviction(std::numeric_limits<std::int64_t>::max(), evictable_before, evicted);
    PCHECK(tree_->evictable_tokens() == 0, "evictable {} after evicting all", tree_->evictable_tokens());
  }

  // ---- after every step ----------------------------------------------------------
  void check_all() {
    const clm::Status inv = tree_->check_invariants();
    PCHECK(inv.ok(), "{}", inv.message());
    const std::int64_t cached = model_.cached_pages() * ps_;
    peak_cached_ = std::max(peak_cached_, cached);
    if (model_.slru()) {
      std::int64_t unsure = 0;
      for (const auto& [id, e] : model_.entries()) unsure += e.parent >= 0 && model_.segment_unsure(id);
      unsure_total_ += unsure;
      demoted_total_ = model_.demotions();
    }
    const std::int64_t locked = model_.locked_pages() * ps_;
    PCHECK(tree_->cached_tokens() == cached, "cached_tokens {} model {}", tree_->cached_tokens(), cached);
    if (model_.ghost()) {
      PCHECK(tree_->ghost_tokens() >= model_.ghost_tokens_lo() && tree_->ghost_tokens() <= model_.ghost_tokens_hi(),
             "ghost holds {} tokens, model [{}, {}]", tree_->ghost_tokens(), model_.ghost_tokens_lo(),
             model_.ghost_tokens_hi());
      PCHECK(tree_->ghost_tokens() <= model_.ghost_capacity(), "ghost holds {} tokens, cap {}", tree_->ghost_tokens(),
             model_.ghost_capacity());
      check_protected_segment();
    }
    PCHECK(tree_->protected_tokens() == locked, "protected_tokens {} model {}", tree_->protected_tokens(), locked);
    PCHECK(tree_->evictable_tokens() == cached - locked, "evictable_tokens {} model {}", tree_->evictable_tokens(),
           cached - locked);
    PCHECK(tree_->evictable_tokens() + tree_->protected_tokens() == tree_->cached_tokens(),
           "evictable + protected != cached");
    std::int64_t owned = 0, held = 0, free = 0;
    for (std::int32_t p = 0; p < cfg_.num_pages; ++p) {
      const bool by_tree = model_.owner(p) >= 0;
      const bool by_test = held_[static_cast<std::size_t>(p)] != 0;
      PCHECK(!(by_tree && by_test), "page {} both cached and held by the test", p);
      PCHECK(tree_->owns_page(p) == by_tree, "owns_page({}) = {}, model {}", p, tree_->owns_page(p), by_tree);
      const int refs = (by_tree ? 1 : 0) + (by_test ? 1 : 0);
      PCHECK(pool_->ref_count(p) == refs, "page {} ref count {}, expected {} (tree {}, test {})", p,
             pool_->ref_count(p), refs, by_tree, by_test);
      owned += by_tree;
      held += by_test;
      free += refs == 0;
    }
    PCHECK(owned == model_.cached_pages(), "model owner table out of step");
    PCHECK(pool_->free_pages() == free, "pool free_pages {} but {} pages have no holder", pool_->free_pages(), free);
    PCHECK(pool_->free_pages() + owned + held == pool_->num_pages(), "leak: free {} + tree {} + test {} != {}",
           pool_->free_pages(), owned, held, pool_->num_pages());
    const clm::RadixTreeMetrics metrics = tree_->metrics();
    PCHECK(metrics.cached_tokens == cached && metrics.pages_free == pool_->free_pages(), "metrics out of step");
  }
  // ghost_slru: the segment of every node the model knows a handle for, and
  // the protected segment's size, against what the model is sure of.
  void check_protected_segment() {
    std::int64_t lo = 0, hi = 0;
    for (const auto& [id, e] : model_.entries()) {
      if (e.parent < 0) continue;
      lo += e.may_probation ? 0 : ps_;
      hi += e.may_protected ? ps_ : 0;
      if (!e.ref || model_.segment_unsure(id)) continue;
      PCHECK(tree_->in_protected_segment(*e.ref) == e.may_protected,
             "node ending at entry {} (page {}) is {}protected, model says {}", id, e.page,
             tree_->in_protected_segment(*e.ref) ? "" : "not ", e.may_protected);
    }
    PCHECK(tree_->protected_segment_tokens() >= lo && tree_->protected_segment_tokens() <= hi,
           "protected segment holds {} tokens, model [{}, {}]", tree_->protected_segment_tokens(), lo, hi);
  }

#undef PCHECK

  FailureHandler on_failure_;
  Config cfg_;
  std::int32_t ps_;
  Rng rng_;
  Model model_;
  std::unique_ptr<clm::PagedKvPool> pool_;
  std::unique_ptr<clm::RadixTree> tree_;
  std::vector<char> held_;  // per page: held by the test (one reference)
  Pages stash_;             // held pages not in use
  std::vector<Handle> locks_;
  std::vector<Handle> handles_;
  std::map<std::pair<std::int32_t, std::uint32_t>, std::int64_t> ref_owner_;
  std::vector<Tokens> templates_;
  std::vector<Tokens> prompts_;
  std::vector<Tokens> history_;
  std::vector<PastMatch> past_matches_;
  std::int64_t step_ = 0;
  const char* op_ = "";
  std::int64_t evicted_total_ = 0;
  std::int64_t inserts_ok_ = 0;
  std::int64_t inserts_refused_ = 0;
  std::int64_t hit_tokens_ = 0;
  std::int64_t ooms_ = 0;
  std::int64_t locks_ok_ = 0;
  std::int64_t locks_stale_ = 0;
  std::int64_t peak_cached_ = 0;
  double hit_rate_ = 0;
  std::int64_t unsure_total_ = 0;
  std::int64_t demoted_total_ = 0;
};

}  // namespace clm_test::radix_model
