// tests/fuzz/fuzz_capi_ops.cpp: libFuzzer target for sequences of C ABI calls
// (capi/clm.h) on one engine: create with fuzzed options, then admit / extend
// / finish / abort / free / page tables / batch tables / metrics / engine free,
// with random salts, adapters, priorities, lengths and page sizes, invalid
// arguments included (negative tokens, NULL handles and buffers, wrong
// struct sizes, calls on ended sequences and after the engine is freed).
// Eviction comes from pool pressure: pools of 1 to 48 pages.
//
//   make build-fuzz && build-fuzz/tests/fuzz/fuzz_capi_ops tests/fuzz/corpus/capi_ops
//   tests/fuzz/run.sh build-fuzz 30     (every target, on a copy of its corpus)
//   CLM_FUZZ_TRACE=1 build-fuzz/tests/fuzz/fuzz_capi_ops crash-<sha1>   (the calls of one input)
//
// Invariants, checked after every call while the engine lives:
//  - every status is CLM_OK or one of the documented codes; a failure has a
//    message (clm_last_error), and a refused admit writes no handle;
//  - metrics: pages_used + pages_free == num_pages; evictable + protected ==
//    cached; cached is page-aligned; active_sequences == the running handles;
//    pages_used == cached pages + every running sequence's own pages;
//    protected == the pages of the running sequences' cached prefixes;
//  - per running sequence: cached_tokens page-aligned and below the prompt's
//    length; its page table has ceil(length / page_size) ids in the pool; its
//    own pages (past the cached prefix) belong to no one else; the slots of
//    the last admit / extend are exactly page_table[pos / T] * T + pos % T;
//  - finish publishes: admitting the same tokens plus one right after a
//    finish hits every full page of them;
//  - a refused call changes nothing: no page, sequence or cached token moves
//    (an admit refused for want of pages may have evicted);
//  - after the engine is freed: every call on its sequences is
//    CLM_ERR_FAILED_PRECONDITION and they have no pages.
// ASan's leak check covers the handles: every one is freed at the end.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "clm.h"
#include "fuzz/fuzz_support.hpp"

namespace {

using Tokens = std::vector<std::int32_t>;

bool known_status(clm_status s) { return s <= CLM_OK && s >= CLM_ERR_IO; }

// CLM_FUZZ_TRACE=1: every checked call (but the metrics after each) and its
// status on stderr, to read a reproducer.
bool tracing() {
  static const bool on = std::getenv("CLM_FUZZ_TRACE") != nullptr;
  return on;
}

void check_status(clm_status s, const char* call) {
  if (tracing() && std::strcmp(call, "clm_engine_metrics") != 0)
    fmt::print(stderr, "{} -> {} {}\n", call, clm_status_name(s), s == CLM_OK ? "" : clm_last_error());
  FUZZ_CHECK(known_status(s), "{} returned {}", call, s);
  if (s != CLM_OK) {
    const char* msg = clm_last_error();
    FUZZ_CHECK(msg != nullptr && msg[0] != '\0', "{} failed ({}) without a message", call, clm_status_name(s));
  }
}

// A sequence the fuzzer holds. The namespace is kept to admit it again.
struct Seq {
  clm_seq* handle = nullptr;
  bool running = true;
  Tokens tokens;          // prompt + extensions
  std::size_t added = 0;  // tokens of the last admit / extend (their slots)
  std::string salt;
  bool has_salt = false;
  std::int32_t adapter = 0;
};

class Driver {
 public:
  explicit Driver(clm_fuzz::ByteReader& in) : in_(in) {}

  ~Driver() {
    for (Seq& s : seqs_) clm_seq_free(s.handle);
    clm_engine_free(engine_);
  }

  void run() {
    if (!create()) return;
    for (int step = 0; step < 64 && in_.remaining() > 0; ++step) {
      // Only the call right after a finish may admit the finished tokens again.
      just_finished_ = last_finished_;
      last_finished_ = -1;
      switch (in_.range<int>(0, 13)) {
        case 0:
        case 1:
        case 2:
          op_admit();
          break;
        case 3:
        case 4:
          op_extend();
          break;
        case 5:
          op_finish();
          break;
        case 6:
          op_abort();
          break;
        case 7:
          op_free();
          break;
        case 8:
          op_batch_page_table();
          break;
        case 9:
          op_metrics_text();
          break;
        case 10:
          op_null_handles();
          break;
        case 11:
          op_kv_layout();
          break;
        case 12:
          op_readmit_finished();
          break;
        default:
          if (in_.range<int>(0, 7) == 0) op_engine_free();
          break;
      }
      check_all();
    }
  }

 private:
  // ---- engine ---------------------------------------------------------------
  bool create() {
    clm_engine_options opts;
    const int size_mode = in_.range<int>(0, 15);
    const std::size_t struct_size = size_mode == 0 ? 3 : size_mode == 1 ? sizeof(opts) + 8 : sizeof(opts);
    clm_status s = clm_engine_options_init(&opts, struct_size);
    check_status(s, "clm_engine_options_init");
    if (s != CLM_OK) {
      FUZZ_CHECK(s == CLM_ERR_INVALID_ARGUMENT && struct_size != sizeof(opts), "options_init refused its own size");
      return false;
    }
    opts.num_pages = in_.range<std::int32_t>(-1, 48);
    opts.page_size = in_.range<std::int32_t>(-1, 8);
    if (in_.flag()) opts.page_size = 16;
    opts.num_layers = in_.range<std::int32_t>(0, 2);
    opts.kv_heads = in_.range<std::int32_t>(0, 2);
    opts.head_dim = in_.range<std::int32_t>(0, 8);
    opts.kv_dtype = in_.range<std::int32_t>(-1, 3);
    opts.memory = in_.range<std::int32_t>(0, 3) == 0 ? CLM_MEMORY_HOST : CLM_MEMORY_NONE;
    opts.eviction_policy = in_.range<std::int32_t>(-1, 6);  // 5: belady, which only the replay tool may use
    constexpr double kFractions[] = {0.2, 0.0, 1.0, 0.5, -0.5, 1.5};
    opts.slru_protected_fraction = kFractions[in_.range<int>(0, 5)];
    if (in_.range<int>(0, 31) == 0) opts.struct_size = 5;  // a size no version has
    s = clm_engine_create(in_.range<int>(0, 63) == 0 ? nullptr : &engine_, &opts);
    check_status(s, "clm_engine_create");
    if (s != CLM_OK) {
      FUZZ_CHECK(engine_ == nullptr, "a refused create wrote a handle");
      return false;
    }
    FUZZ_CHECK(opts.num_pages >= 1 && opts.page_size >= 1 && opts.num_layers >= 1 && opts.kv_heads >= 1 &&
                   opts.head_dim >= 1 && opts.kv_dtype >= 0 && opts.kv_dtype <= 2 &&
                   opts.eviction_policy >= CLM_EVICT_LRU && opts.eviction_policy <= CLM_EVICT_GHOST_SLRU,
               "create accepted num_pages {} page_size {} layers {} heads {} dim {} dtype {} policy {}", opts.num_pages,
               opts.page_size, opts.num_layers, opts.kv_heads, opts.head_dim, opts.kv_dtype, opts.eviction_policy);
    num_pages_ = opts.num_pages;
    page_size_ = opts.page_size;
    return true;
  }

  void op_engine_free() {
    clm_engine_free(engine_);
    engine_ = nullptr;
    for (Seq& s : seqs_) {
      FUZZ_CHECK(clm_seq_extend(s.handle, nullptr, 0) == CLM_ERR_FAILED_PRECONDITION, "extend after engine free");
      FUZZ_CHECK(clm_seq_finish(s.handle) == CLM_ERR_FAILED_PRECONDITION, "finish after engine free");
      FUZZ_CHECK(clm_seq_abort(s.handle) == CLM_ERR_FAILED_PRECONDITION, "abort after engine free");
      std::size_t n = 7;
      FUZZ_CHECK(clm_seq_page_table(s.handle, &n) == nullptr && n == 0, "a page table after engine free");
      FUZZ_CHECK(clm_seq_slots(s.handle, &n) == nullptr && n == 0, "slots after engine free");
      s.running = false;
    }
  }

  // ---- inputs ---------------------------------------------------------------
  std::int32_t token() {
    const auto b = in_.byte();
    if (b < 224) return b % 4;  // few distinct ids: prefixes are shared
    if (b < 248) return b;
    if (b < 252) return std::numeric_limits<std::int32_t>::max();
    return b < 254 ? -1 : std::numeric_limits<std::int32_t>::min();
  }

  Tokens tokens(std::size_t max) {
    Tokens t;
    // Often a known sequence's prefix, so admissions hit.
    if (!history_.empty() && in_.flag()) {
      const Tokens& h = history_[in_.range<std::size_t>(0, history_.size() - 1)];
      t.assign(h.begin(), h.begin() + static_cast<std::ptrdiff_t>(in_.range<std::size_t>(0, h.size())));
    }
    const std::size_t more = in_.range<std::size_t>(0, max);
    for (std::size_t i = 0; i < more; ++i) t.push_back(token());
    return t;
  }

  Seq* pick() {
    if (seqs_.empty()) return nullptr;
    return &seqs_[in_.range<std::size_t>(0, seqs_.size() - 1)];
  }

  static bool all_valid(const Tokens& t) {
    return std::all_of(t.begin(), t.end(), [](std::int32_t x) { return x >= 0; });
  }

  // ---- operations -----------------------------------------------------------
  void op_admit() {
    if (engine_ == nullptr || seqs_.size() >= 16) return;
    Seq seq;
    seq.tokens = tokens(static_cast<std::size_t>(4 * page_size_));
    clm_admit_options opts;
    FUZZ_CHECK(clm_admit_options_init(&opts, sizeof opts) == CLM_OK, "admit_options_init");
    constexpr const char* kSalts[] = {"tenant-a", "tenant-b", "a\0b", ""};
    const int salt = in_.range<int>(0, 5);
    if (salt < 4) {
      seq.salt.assign(kSalts[salt], salt == 2 ? 3 : std::strlen(kSalts[salt]));
      seq.has_salt = true;
      opts.cache_salt = seq.salt.data();
      opts.cache_salt_len = seq.salt.size();
    } else if (salt == 5 && in_.flag()) {
      opts.cache_salt = nullptr;  // NULL with a length: refused
      opts.cache_salt_len = 3;
    }
    seq.adapter = in_.range<std::int32_t>(-1, 2);
    opts.adapter_id = seq.adapter;
    opts.priority = in_.range<std::int32_t>(-1, 101);
    opts.priority_update = in_.range<std::int32_t>(-1, 2);  // raise, set, or neither: refused
    if (in_.range<int>(0, 31) == 0) opts.struct_size = 2;
    const bool use_opts = in_.range<int>(0, 7) != 0;
    if (!use_opts) seq.has_salt = false, seq.adapter = 0;
    const bool null_tokens = in_.range<int>(0, 31) == 0;
    admit(seq, use_opts ? &opts : nullptr, null_tokens);
  }

  // Admits `seq` (tokens, namespace); on success keeps it. The return: the status.
  clm_status admit(Seq seq, const clm_admit_options* opts, bool null_tokens = false) {
    const State before = state();
    clm_seq* handle = reinterpret_cast<clm_seq*>(&seq);  // must be overwritten
    const clm_status s =
        clm_engine_admit(&handle, engine_, null_tokens ? nullptr : seq.tokens.data(), seq.tokens.size(), opts);
    check_status(s, "clm_engine_admit");
    if (s != CLM_OK) {
      FUZZ_CHECK(handle == nullptr, "a refused admit wrote a handle");
      check_unchanged(before, s == CLM_ERR_OUT_OF_MEMORY, "clm_engine_admit");
      return s;
    }
    FUZZ_CHECK(handle != nullptr, "admit returned no handle");
    FUZZ_CHECK(!seq.tokens.empty() && all_valid(seq.tokens) && !null_tokens, "admit accepted bad tokens");
    seq.handle = handle;
    const std::int32_t cached = clm_seq_cached_tokens(handle);
    FUZZ_CHECK(cached >= 0 && cached % page_size_ == 0 && static_cast<std::size_t>(cached) < seq.tokens.size(),
               "cached_tokens {} of {} (page size {})", cached, seq.tokens.size(), page_size_);
    seq.added = seq.tokens.size() - static_cast<std::size_t>(cached);
    history_.push_back(seq.tokens);
    if (history_.size() > 8) history_.erase(history_.begin());
    seqs_.push_back(std::move(seq));
    check_slots(seqs_.back());
    return s;
  }

  void op_extend() {
    Seq* seq = pick();
    if (seq == nullptr) return;
    const Tokens more = tokens(static_cast<std::size_t>(2 * page_size_));
    const bool null_tokens = !more.empty() && in_.range<int>(0, 31) == 0;
    const State before = state();
    const clm_status s = clm_seq_extend(seq->handle, null_tokens ? nullptr : more.data(), more.size());
    check_status(s, "clm_seq_extend");
    if (!seq->running) {
      FUZZ_CHECK(s == CLM_ERR_FAILED_PRECONDITION, "extend of an ended sequence: {}", clm_status_name(s));
      return;
    }
    if (s != CLM_OK) {
      check_unchanged(before, s == CLM_ERR_OUT_OF_MEMORY, "clm_seq_extend");
      return;
    }
    FUZZ_CHECK(all_valid(more) && !null_tokens, "extend accepted bad tokens");
    seq->tokens.insert(seq->tokens.end(), more.begin(), more.end());
    seq->added = more.size();
    check_slots(*seq);
  }

  void op_finish() {
    Seq* seq = pick();
    if (seq == nullptr) return;
    end(*seq, clm_seq_finish(seq->handle), "clm_seq_finish");
  }

  void op_abort() {
    Seq* seq = pick();
    if (seq == nullptr) return;
    end(*seq, clm_seq_abort(seq->handle), "clm_seq_abort");
  }

  void end(Seq& seq, clm_status s, const char* call) {
    check_status(s, call);
    if (!seq.running) {
      FUZZ_CHECK(s == CLM_ERR_FAILED_PRECONDITION, "{} of an ended sequence: {}", call, clm_status_name(s));
      return;
    }
    FUZZ_CHECK(s == CLM_OK, "{} of a running sequence: {} {}", call, clm_status_name(s), clm_last_error());
    seq.running = false;
    std::size_t n = 7;
    FUZZ_CHECK(clm_seq_page_table(seq.handle, &n) == nullptr && n == 0, "an ended sequence has a page table");
    last_finished_ = call == std::string("clm_seq_finish") ? &seq - seqs_.data() : -1;
  }

  void op_free() {
    if (seqs_.empty()) return;
    const std::size_t i = in_.range<std::size_t>(0, seqs_.size() - 1);
    clm_seq_free(seqs_[i].handle);  // aborts a running one
    seqs_.erase(seqs_.begin() + static_cast<std::ptrdiff_t>(i));
  }

  // Finish publishes: the same tokens plus one hit every full page of them
  // (nothing can evict between the finish and the match).
  void op_readmit_finished() {
    if (engine_ == nullptr || just_finished_ < 0 || seqs_.size() >= 16) return;
    const Seq& done = seqs_[static_cast<std::size_t>(just_finished_)];
    Seq seq;
    seq.tokens = done.tokens;
    seq.tokens.push_back(1);
    seq.salt = done.salt;
    seq.has_salt = done.has_salt;
    seq.adapter = done.adapter;
    clm_admit_options opts;
    FUZZ_CHECK(clm_admit_options_init(&opts, sizeof opts) == CLM_OK, "admit_options_init");
    if (seq.has_salt) opts.cache_salt = seq.salt.data(), opts.cache_salt_len = seq.salt.size();
    opts.adapter_id = seq.adapter;
    const std::size_t n = done.tokens.size();
    if (admit(seq, &opts) != CLM_OK) return;
    const std::int32_t cached = clm_seq_cached_tokens(seqs_.back().handle);
    const auto full = static_cast<std::int32_t>(n / static_cast<std::size_t>(page_size_)) * page_size_;
    FUZZ_CHECK(cached == full, "after finishing {} tokens, admitting them again hits {}, not {}", n, cached, full);
  }

  void op_batch_page_table() {
    if (engine_ == nullptr) return;
    std::vector<clm_seq*> batch;
    std::vector<std::size_t> picked;
    std::set<std::size_t> chosen;
    const std::size_t n = in_.range<std::size_t>(0, seqs_.size());
    bool valid = true;
    for (std::size_t k = 0; k < n; ++k) {
      const std::size_t i = in_.range<std::size_t>(0, seqs_.size() - 1);
      valid = valid && seqs_[i].running && chosen.insert(i).second;
      batch.push_back(seqs_[i].handle);
      picked.push_back(i);
    }
    std::vector<std::int32_t> indptr(batch.size() + 1, -1), last(batch.size() + 1, -1);
    std::vector<std::int32_t> indices(static_cast<std::size_t>(num_pages_) * 16 + 1, -1);
    const std::size_t capacity = in_.flag() ? indices.size() : in_.range<std::size_t>(0, 4);
    std::size_t needed = 0;
    const clm_status s = clm_engine_batch_page_table(indptr.data(), indices.data(), capacity, &needed, last.data(),
                                                     engine_, batch.data(), batch.size());
    check_status(s, "clm_engine_batch_page_table");
    if (!valid) {
      FUZZ_CHECK(s != CLM_OK, "a batch with an ended or repeated sequence was accepted");
      return;
    }
    if (s != CLM_OK) {
      FUZZ_CHECK(s == CLM_ERR_INVALID_ARGUMENT && needed > capacity, "batch refused: {} {}", clm_status_name(s),
                 clm_last_error());
      return;
    }
    FUZZ_CHECK(indptr[0] == 0, "indptr[0] = {}", indptr[0]);
    for (std::size_t k = 0; k < batch.size(); ++k) {
      std::size_t pages = 0;
      const std::int32_t* table = clm_seq_page_table(batch[k], &pages);
      FUZZ_CHECK(static_cast<std::size_t>(indptr[k + 1] - indptr[k]) == pages, "indptr of sequence {}", k);
      FUZZ_CHECK(std::equal(table, table + pages, indices.begin() + indptr[k]), "indices of sequence {}", k);
      const std::size_t len = seqs_[picked[k]].tokens.size();
      const std::size_t in_last = len - (pages - 1) * static_cast<std::size_t>(page_size_);
      FUZZ_CHECK(last[k] == static_cast<std::int32_t>(in_last), "last_page_len {} for {} tokens", last[k], len);
    }
    FUZZ_CHECK(needed == static_cast<std::size_t>(indptr[batch.size()]), "n_indices {}", needed);
  }

  void op_metrics_text() {
    if (engine_ == nullptr) return;
    std::size_t len = 0;
    clm_status s = clm_engine_metrics_text(nullptr, 0, &len, engine_);
    check_status(s, "clm_engine_metrics_text (sizing)");
    FUZZ_CHECK(s == CLM_ERR_INVALID_ARGUMENT && len > 0, "sizing call: {} {}", clm_status_name(s), len);
    std::string text(len + 1, '\x7f');
    std::size_t len2 = 0;
    s = clm_engine_metrics_text(text.data(), text.size(), &len2, engine_);
    check_status(s, "clm_engine_metrics_text");
    FUZZ_CHECK(s == CLM_OK && len2 == len && text[len] == '\0', "metrics text: {} {} {}", clm_status_name(s), len,
               len2);
  }

  void op_null_handles() {
    std::size_t n = 7;
    FUZZ_CHECK(clm_seq_extend(nullptr, nullptr, 0) == CLM_ERR_INVALID_ARGUMENT, "extend(NULL)");
    FUZZ_CHECK(clm_seq_finish(nullptr) == CLM_ERR_INVALID_ARGUMENT, "finish(NULL)");
    FUZZ_CHECK(clm_seq_abort(nullptr) == CLM_ERR_INVALID_ARGUMENT, "abort(NULL)");
    FUZZ_CHECK(clm_seq_page_table(nullptr, &n) == nullptr && n == 0, "page_table(NULL)");
    FUZZ_CHECK(clm_seq_cached_tokens(nullptr) == 0, "cached_tokens(NULL)");
    clm_seq_free(nullptr);
    clm_engine_free(nullptr);
    clm_seq* out = nullptr;
    const std::int32_t t[] = {1, 2};
    FUZZ_CHECK(clm_engine_admit(&out, nullptr, t, 2, nullptr) == CLM_ERR_INVALID_ARGUMENT && out == nullptr,
               "admit(engine NULL)");
    FUZZ_CHECK(clm_engine_admit(nullptr, engine_, t, 2, nullptr) == CLM_ERR_INVALID_ARGUMENT, "admit(out NULL)");
    clm_metrics m;
    m.struct_size = sizeof m;
    FUZZ_CHECK(clm_engine_metrics(&m, nullptr) == CLM_ERR_INVALID_ARGUMENT, "metrics(engine NULL)");
    if (engine_ != nullptr) {
      m.struct_size = 4;
      FUZZ_CHECK(clm_engine_metrics(&m, engine_) == CLM_ERR_INVALID_ARGUMENT, "metrics with a bad struct_size");
      FUZZ_CHECK(clm_engine_metrics(nullptr, engine_) == CLM_ERR_INVALID_ARGUMENT, "metrics(out NULL)");
    }
  }

  void op_kv_layout() {
    if (engine_ == nullptr) return;
    clm_kv_layout layout;
    layout.struct_size = sizeof layout;
    const clm_status s = clm_engine_kv_layout(&layout, engine_);
    check_status(s, "clm_engine_kv_layout");
    FUZZ_CHECK(s == CLM_OK && layout.num_pages == num_pages_ && layout.page_size == page_size_, "kv_layout");
  }

  // ---- checks ---------------------------------------------------------------
  struct State {
    std::int64_t cached = 0;
    std::int32_t used = 0;
    std::int64_t active = 0;
    std::vector<std::vector<std::int32_t>> tables;
  };

  clm_metrics metrics() {
    clm_metrics m;
    std::memset(&m, 0, sizeof m);
    m.struct_size = sizeof m;
    const clm_status s = clm_engine_metrics(&m, engine_);
    check_status(s, "clm_engine_metrics");
    FUZZ_CHECK(s == CLM_OK, "metrics: {}", clm_last_error());
    return m;
  }

  State state() {
    State st;
    if (engine_ == nullptr) return st;
    const clm_metrics m = metrics();
    st.cached = m.cached_tokens;
    st.used = m.pages_used;
    st.active = m.active_sequences;
    for (const Seq& s : seqs_) {
      std::size_t n = 0;
      const std::int32_t* table = clm_seq_page_table(s.handle, &n);
      st.tables.emplace_back(table, table + n);
    }
    return st;
  }

  // A refused call moved nothing; one refused for want of pages may have
  // evicted (cached tokens and used pages only go down then).
  void check_unchanged(const State& before, bool may_evict, const char* call) {
    const State after = state();
    FUZZ_CHECK(after.active == before.active && after.tables == before.tables, "a refused {} changed sequences", call);
    if (may_evict) {
      FUZZ_CHECK(after.cached <= before.cached && after.used <= before.used, "a refused {} grew the cache", call);
    } else {
      FUZZ_CHECK(after.cached == before.cached && after.used == before.used,
                 "a refused {} changed the cache ({} -> {})", call, before.cached, after.cached);
    }
  }

  void check_slots(const Seq& seq) {
    std::size_t n_pages = 0, n_slots = 0;
    const std::int32_t* table = clm_seq_page_table(seq.handle, &n_pages);
    const std::int64_t* slots = clm_seq_slots(seq.handle, &n_slots);
    FUZZ_CHECK(n_slots == seq.added, "{} slots for {} tokens added", n_slots, seq.added);
    const std::size_t first = seq.tokens.size() - seq.added;
    const auto ps = static_cast<std::size_t>(page_size_);
    for (std::size_t k = 0; k < n_slots; ++k) {
      const std::size_t pos = first + k;
      FUZZ_CHECK(pos / ps < n_pages, "slot of token {} past the page table", pos);
      const std::int64_t expect =
          static_cast<std::int64_t>(table[pos / ps]) * page_size_ + static_cast<std::int64_t>(pos % ps);
      FUZZ_CHECK(slots[k] == expect, "slot of token {} is {}, page table says {}", pos, slots[k], expect);
    }
  }

  void check_all() {
    if (engine_ == nullptr) return;
    const clm_metrics m = metrics();
    FUZZ_CHECK(m.pages_used + m.pages_free == num_pages_, "pages used {} + free {} != {}", m.pages_used, m.pages_free,
               num_pages_);
    FUZZ_CHECK(m.evictable_tokens + m.protected_tokens == m.cached_tokens, "evictable {} + protected {} != cached {}",
               m.evictable_tokens, m.protected_tokens, m.cached_tokens);
    FUZZ_CHECK(m.cached_tokens % page_size_ == 0, "cached {} not page-aligned", m.cached_tokens);
    std::int64_t running = 0, own_pages = 0;
    std::set<std::int32_t> own, shared;
    const auto ps = static_cast<std::size_t>(page_size_);
    for (const Seq& s : seqs_) {
      if (!s.running) continue;
      ++running;
      std::size_t n = 0;
      const std::int32_t* table = clm_seq_page_table(s.handle, &n);
      FUZZ_CHECK(n == (s.tokens.size() + ps - 1) / ps, "page table of {} ids for {} tokens", n, s.tokens.size());
      const auto cached = static_cast<std::size_t>(clm_seq_cached_tokens(s.handle)) / ps;
      for (std::size_t i = 0; i < n; ++i) {
        FUZZ_CHECK(table[i] >= 0 && table[i] < num_pages_, "page id {}", table[i]);
        if (i < cached) {
          shared.insert(table[i]);
        } else {
          FUZZ_CHECK(own.insert(table[i]).second, "page {} is two sequences' own", table[i]);
          ++own_pages;
        }
      }
    }
    for (std::int32_t p : shared) FUZZ_CHECK(own.count(p) == 0, "page {} both cached and a sequence's own", p);
    FUZZ_CHECK(m.active_sequences == running, "active_sequences {}, running handles {}", m.active_sequences, running);
    FUZZ_CHECK(m.pages_used == m.cached_tokens / page_size_ + own_pages,
               "pages used {} != cached pages {} + sequences' own pages {}", m.pages_used, m.cached_tokens / page_size_,
               own_pages);
    FUZZ_CHECK(m.protected_tokens == static_cast<std::int64_t>(shared.size()) * page_size_,
               "protected tokens {} but the running prefixes hold {} pages", m.protected_tokens, shared.size());
  }

  clm_fuzz::ByteReader& in_;
  clm_engine* engine_ = nullptr;
  std::int32_t num_pages_ = 0;
  std::int32_t page_size_ = 1;
  std::vector<Seq> seqs_;
  std::vector<Tokens> history_;
  std::ptrdiff_t last_finished_ = -1;  // the sequence the last call finished
  std::ptrdiff_t just_finished_ = -1;  // ... as the current call sees it
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  clm_fuzz::ByteReader in(data, size);
  Driver(in).run();
  return 0;
}
