// tests/capi/test_capi_options.cpp: the C ABI's versions and options as a
// host sees them (only clm.h and libclmcache.so.0): clm_version against the
// header and the project, the documented defaults of the init functions and
// of the static initialisers (CLM_*_INIT), the struct sizes of every published
// version (and none between them), and one test per option value the library
// refuses (status code, clm_last_error()).
#include "clm.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <iterator>
#include <limits>
#include <set>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "capi_checks.hpp"
#include "capi_engine.hpp"

// =============================================================================
// Versions
// =============================================================================

TEST_CASE("clm_version matches the header macros and the project version", "[capi][version]") {
  CHECK(clm_version() == CLM_VERSION_NUMBER);
  CHECK(CLM_VERSION_NUMBER == CLM_VERSION_MAJOR * 10000 + CLM_VERSION_MINOR * 100 + CLM_VERSION_PATCH);
  const std::string expected = std::to_string(CLM_VERSION_MAJOR) + "." + std::to_string(CLM_VERSION_MINOR) + "." +
                               std::to_string(CLM_VERSION_PATCH);
  REQUIRE(clm_version_string() != nullptr);
  CHECK(std::string(clm_version_string()) == expected);
#ifdef CLM_TEST_PROJECT_VERSION
  CHECK(expected == CLM_TEST_PROJECT_VERSION);  // clm.h agrees with project(VERSION) (the SONAME's source)
#endif
}

// =============================================================================
// Defaults
// =============================================================================

TEST_CASE("options_init fills the documented defaults", "[capi][options]") {
  clm_engine_options o;
  std::memset(&o, 0xAB, sizeof o);
  REQUIRE_OK(clm_engine_options_init(&o, sizeof o));
  CHECK(o.struct_size == sizeof o);
  CHECK(o.num_pages == 0);
  CHECK(o.page_size == 16);
  CHECK(o.num_layers == 1);
  CHECK(o.kv_heads == 1);
  CHECK(o.head_dim == 128);
  CHECK(o.kv_dtype == CLM_KV_F16);
  CHECK(o.memory == CLM_MEMORY_HOST);
  CHECK(o.device == 0);
  CHECK(o.eviction_policy == CLM_EVICT_LRU);
  CHECK(o.slru_protected_fraction == Approx(0.2));

  clm_admit_options a;
  std::memset(&a, 0xAB, sizeof a);
  REQUIRE_OK(clm_admit_options_init(&a, sizeof a));
  CHECK(a.struct_size == sizeof a);
  CHECK(a.cache_salt == nullptr);
  CHECK(a.cache_salt_len == 0);
  CHECK(a.adapter_id == 0);
  CHECK(a.priority == 0);
  CHECK(a.priority_update == CLM_PRIORITY_RAISE);

  // num_pages has no default: the defaults alone do not make an engine.
  clm_engine* e = nullptr;
  CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT, clm_engine_create(&e, &o));
  CHECK(e == nullptr);
}

namespace {
// The init function's result, written over zeroed memory, is byte for byte `from_macro`.
template <class Struct>
bool same_as_init(const Struct& from_macro, clm_status (*init)(Struct*, size_t)) {
  Struct from_init;
  std::memset(&from_init, 0, sizeof from_init);
  REQUIRE(init(&from_init, sizeof from_init) == CLM_OK);
  return std::memcmp(&from_macro, &from_init, sizeof from_init) == 0;
}
}  // namespace

// clm.h's static initialisers are C++ braced initialisers too (no narrowing,
// no missing field: warnings are errors here); tests/capi/c99_header.c checks
// them field by field in C99.
TEST_CASE("CLM_*_INIT: the static initialisers give the init functions' defaults, in C++ too", "[capi][options]") {
  static const clm_engine_options engine_defaults = CLM_ENGINE_OPTIONS_INIT;
  static const clm_admit_options admit_defaults = CLM_ADMIT_OPTIONS_INIT;
  static const clm_adapter_options adapter_defaults = CLM_ADAPTER_OPTIONS_INIT;
  static const clm_attention_params params_defaults = CLM_ATTENTION_PARAMS_INIT;
  CHECK(same_as_init(engine_defaults, clm_engine_options_init));
  CHECK(same_as_init(admit_defaults, clm_admit_options_init));
  CHECK(same_as_init(adapter_defaults, clm_adapter_options_init));
  CHECK(same_as_init(params_defaults, clm_attention_params_init));

  // As a host uses them: no init call before create and admit.
  clm_engine_options o = CLM_ENGINE_OPTIONS_INIT;
  o.num_pages = 4;
  o.page_size = 4;
  o.memory = CLM_MEMORY_NONE;
  EnginePtr engine = make_engine(o);
  const clm_admit_options a = CLM_ADMIT_OPTIONS_INIT;
  const std::vector<int32_t> prompt = tokens_from(1, 5);
  SeqPtr seq = admit(engine.get(), prompt, &a);
  CHECK(page_table(seq.get()).size() == 2);
}

// =============================================================================
// Bad input: struct sizes this library does not know
// =============================================================================

namespace {
// A caller's struct that may be bigger than ours, to see that nothing is written.
template <class Struct>
struct Oversized {
  alignas(Struct) unsigned char bytes[sizeof(Struct) + 8];
  Oversized() { std::memset(bytes, 0xAB, sizeof bytes); }
  Struct* get() { return reinterpret_cast<Struct*>(bytes); }
  bool untouched() const {
    return std::all_of(std::begin(bytes), std::end(bytes), [](unsigned char b) { return b == 0xAB; });
  }
};
}  // namespace

TEST_CASE("unknown struct_size: engine_options_init", "[capi][bad][struct_size]") {
  for (size_t size : {size_t{0}, size_t{1}, sizeof(clm_engine_options) + 8}) {
    Oversized<clm_engine_options> o;
    INFO("struct_size " << size);
    CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT, clm_engine_options_init(o.get(), size));
    CHECK(o.untouched());
  }
}

TEST_CASE("unknown struct_size: admit_options_init", "[capi][bad][struct_size]") {
  for (size_t size : {size_t{0}, size_t{1}, sizeof(clm_admit_options) + 8}) {
    Oversized<clm_admit_options> o;
    INFO("struct_size " << size);
    CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT, clm_admit_options_init(o.get(), size));
    CHECK(o.untouched());
  }
}

TEST_CASE("unknown struct_size: engine_create", "[capi][bad][struct_size]") {
  for (size_t size : {size_t{0}, size_t{1}, sizeof(clm_engine_options) + 8}) {
    clm_engine_options o = engine_options(4, 4);
    o.struct_size = static_cast<uint32_t>(size);
    clm_engine* e = reinterpret_cast<clm_engine*>(uintptr_t{0x1});
    INFO("struct_size " << size);
    CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT, clm_engine_create(&e, &o));
    CHECK(e == nullptr);
  }
}

TEST_CASE("unknown struct_size: engine_admit", "[capi][bad][struct_size]") {
  EnginePtr engine = make_engine(4, 4);
  const std::vector<int32_t> t = {1, 2, 3};
  for (size_t size : {size_t{0}, size_t{1}, sizeof(clm_admit_options) + 8}) {
    clm_admit_options o = admit_options();
    o.struct_size = static_cast<uint32_t>(size);
    clm_seq* s = reinterpret_cast<clm_seq*>(uintptr_t{0x1});
    INFO("struct_size " << size);
    CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT, clm_engine_admit(&s, engine.get(), t.data(), t.size(), &o));
    CHECK(s == nullptr);
  }
  const clm_metrics m = metrics(engine.get());
  CHECK(m.admitted == 0);
  CHECK(m.active_sequences == 0);
  CHECK(m.pages_used == 0);
}

TEST_CASE("unknown struct_size: engine_metrics", "[capi][bad][struct_size]") {
  EnginePtr engine = make_engine(4, 4);
  for (size_t size : {size_t{0}, size_t{1}, sizeof(clm_metrics) + 8}) {
    Oversized<clm_metrics> m;
    const auto struct_size = static_cast<uint32_t>(size);
    std::memcpy(m.bytes, &struct_size, sizeof struct_size);
    INFO("struct_size " << size);
    CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT, clm_engine_metrics(m.get(), engine.get()));
    CHECK(
        std::all_of(m.bytes + sizeof struct_size, m.bytes + sizeof m.bytes, [](unsigned char b) { return b == 0xAB; }));
  }
}

TEST_CASE("unknown struct_size: engine_kv_layout", "[capi][bad][struct_size]") {
  EnginePtr engine = make_engine(4, 4);
  for (size_t size : {size_t{0}, size_t{1}, sizeof(clm_kv_layout) + 8}) {
    Oversized<clm_kv_layout> l;
    const auto struct_size = static_cast<uint32_t>(size);
    std::memcpy(l.bytes, &struct_size, sizeof struct_size);
    INFO("struct_size " << size);
    CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT, clm_engine_kv_layout(l.get(), engine.get()));
    CHECK(
        std::all_of(l.bytes + sizeof struct_size, l.bytes + sizeof l.bytes, [](unsigned char b) { return b == 0xAB; }));
  }
  // Only struct_size bytes are written.
  Oversized<clm_kv_layout> l;
  const auto struct_size = static_cast<uint32_t>(sizeof(clm_kv_layout));
  std::memcpy(l.bytes, &struct_size, sizeof struct_size);
  REQUIRE_OK(clm_engine_kv_layout(l.get(), engine.get()));
  CHECK(std::all_of(l.bytes + sizeof(clm_kv_layout), l.bytes + sizeof l.bytes,
                    [](unsigned char b) { return b == 0xAB; }));
  CHECK(l.get()->num_pages == 4);
}

namespace {
// The sizes a caller of a published version passes: each version's last
// field's end, and that rounded up to the struct's alignment (its sizeof).
template <class Struct>
std::set<size_t> published_sizes(std::initializer_list<size_t> ends) {
  std::set<size_t> sizes;
  for (size_t end : ends) {
    sizes.insert(end);
    sizes.insert((end + alignof(Struct) - 1) / alignof(Struct) * alignof(Struct));
  }
  sizes.insert(sizeof(Struct));
  return sizes;
}
}  // namespace

TEST_CASE("struct_size: only the sizes of published versions, never one that cuts a field",
          "[capi][bad][struct_size]") {
  const std::set<size_t> options_sizes = published_sizes<clm_engine_options>(
      {offsetof(clm_engine_options, slru_protected_fraction) + sizeof(double),
       offsetof(clm_engine_options, n_special_token_ids) + sizeof(size_t),
       offsetof(clm_engine_options, snapshot_lookup_timeout_us) + sizeof(int32_t),
       offsetof(clm_engine_options, storage_batch_pages) + sizeof(int32_t),
       offsetof(clm_engine_options, snapshot_maintenance_interval_ms) + sizeof(int64_t),
       offsetof(clm_engine_options, breaker_open_ms) + sizeof(double),
       offsetof(clm_engine_options, kv_events_token_ids) + sizeof(int32_t),
       offsetof(clm_engine_options, divergence_context_tokens) + sizeof(int32_t)});
  const std::set<size_t> metrics_sizes =
      published_sizes<clm_metrics>({offsetof(clm_metrics, metadata_bytes) + sizeof(uint64_t),
                                    offsetof(clm_metrics, src_injections) + sizeof(uint64_t),
                                    offsetof(clm_metrics, has_snapshot_store) + sizeof(int32_t),
                                    offsetof(clm_metrics, storage_evicted_pages) + sizeof(uint64_t),
                                    offsetof(clm_metrics, queued_fetches) + sizeof(int64_t),
                                    offsetof(clm_metrics, kv_events_next_sequence) + sizeof(uint64_t),
                                    offsetof(clm_metrics, match_depth_sum_tokens) + sizeof(uint64_t)});
  const std::set<size_t> layout_sizes =
      published_sizes<clm_kv_layout>({offsetof(clm_kv_layout, memory) + sizeof(int32_t)});
  const std::set<size_t> admit_sizes =
      published_sizes<clm_admit_options>({offsetof(clm_admit_options, priority) + sizeof(int32_t),
                                          offsetof(clm_admit_options, priority_update) + sizeof(int32_t)});
  const std::set<size_t> plan_sizes =
      published_sizes<clm_admission_plan>({offsetof(clm_admission_plan, evictable_tokens) + sizeof(int64_t)});
  const std::set<size_t> adapter_sizes =
      published_sizes<clm_adapter_options>({offsetof(clm_adapter_options, residual_scale) + sizeof(float)});
  const std::set<size_t> params_sizes =
      published_sizes<clm_attention_params>({offsetof(clm_attention_params, stream) + sizeof(void*)});
  CHECK(options_sizes.count(sizeof(clm_engine_options) - 4) == 0);  // odd sizes exist between versions

  EnginePtr engine = make_engine(4, 4);
  for (size_t size = 0; size <= sizeof(clm_engine_options) + 8; ++size) {
    INFO("clm_engine_options of " << size << " bytes");
    const bool known = options_sizes.count(size) == 1;
    Oversized<clm_engine_options> o;
    CHECK(clm_engine_options_init(o.get(), size) == (known ? CLM_OK : CLM_ERR_INVALID_ARGUMENT));
    if (!known) CHECK(o.untouched());
    clm_engine_options full = engine_options(4, 4);
    full.struct_size = static_cast<uint32_t>(size);
    clm_engine* e = nullptr;
    CHECK(clm_engine_create(&e, &full) == (known ? CLM_OK : CLM_ERR_INVALID_ARGUMENT));
    CHECK((e != nullptr) == known);
    clm_engine_free(e);
  }
  for (size_t size = 0; size <= sizeof(clm_metrics) + 8; ++size) {
    INFO("clm_metrics of " << size << " bytes");
    const bool known = metrics_sizes.count(size) == 1;
    Oversized<clm_metrics> m;
    const auto struct_size = static_cast<uint32_t>(size);
    std::memcpy(m.bytes, &struct_size, sizeof struct_size);
    CHECK(clm_engine_metrics(m.get(), engine.get()) == (known ? CLM_OK : CLM_ERR_INVALID_ARGUMENT));
    const size_t written = known ? size : sizeof struct_size;
    CHECK(std::all_of(m.bytes + written, m.bytes + sizeof m.bytes, [](unsigned char b) { return b == 0xAB; }));
  }
  for (size_t size = 0; size <= sizeof(clm_kv_layout) + 8; ++size) {
    INFO("clm_kv_layout of " << size << " bytes");
    const bool known = layout_sizes.count(size) == 1;
    Oversized<clm_kv_layout> l;
    const auto struct_size = static_cast<uint32_t>(size);
    std::memcpy(l.bytes, &struct_size, sizeof struct_size);
    CHECK(clm_engine_kv_layout(l.get(), engine.get()) == (known ? CLM_OK : CLM_ERR_INVALID_ARGUMENT));
    const size_t written = known ? size : sizeof struct_size;
    CHECK(std::all_of(l.bytes + written, l.bytes + sizeof l.bytes, [](unsigned char b) { return b == 0xAB; }));
  }
  const std::vector<int32_t> prompt = {1, 2, 3, 4, 5};
  for (size_t size = 0; size <= sizeof(clm_admission_plan) + 8; ++size) {
    INFO("clm_admission_plan of " << size << " bytes");
    const bool known = plan_sizes.count(size) == 1;
    Oversized<clm_admission_plan> p;
    const auto struct_size = static_cast<uint32_t>(size);
    std::memcpy(p.bytes, &struct_size, sizeof struct_size);
    CHECK(clm_engine_plan_admission(p.get(), engine.get(), prompt.data(), prompt.size(), nullptr) ==
          (known ? CLM_OK : CLM_ERR_INVALID_ARGUMENT));
    const size_t written = known ? size : sizeof struct_size;
    CHECK(std::all_of(p.bytes + written, p.bytes + sizeof p.bytes, [](unsigned char b) { return b == 0xAB; }));
  }
  for (size_t size = 0; size <= sizeof(clm_admit_options) + 8; ++size) {
    INFO("clm_admit_options of " << size << " bytes");
    Oversized<clm_admit_options> o;
    const bool known = admit_sizes.count(size) == 1;
    CHECK(clm_admit_options_init(o.get(), size) == (known ? CLM_OK : CLM_ERR_INVALID_ARGUMENT));
    if (!known) CHECK(o.untouched());
  }
  for (size_t size = 0; size <= sizeof(clm_adapter_options) + 8; ++size) {
    INFO("clm_adapter_options of " << size << " bytes");
    Oversized<clm_adapter_options> o;
    const bool known = adapter_sizes.count(size) == 1;
    CHECK(clm_adapter_options_init(o.get(), size) == (known ? CLM_OK : CLM_ERR_INVALID_ARGUMENT));
    if (!known) CHECK(o.untouched());
  }
  for (size_t size = 0; size <= sizeof(clm_attention_params) + 8; ++size) {
    INFO("clm_attention_params of " << size << " bytes");
    Oversized<clm_attention_params> o;
    const bool known = params_sizes.count(size) == 1;
    CHECK(clm_attention_params_init(o.get(), size) == (known ? CLM_OK : CLM_ERR_INVALID_ARGUMENT));
    if (!known) CHECK(o.untouched());
  }
}

// =============================================================================
// Bad input: options
// =============================================================================

TEST_CASE("unknown enum values in engine options", "[capi][bad][options]") {
  struct Case {
    const char* field;
    int32_t clm_engine_options::*member;
    std::vector<int32_t> values;
  };
  const int32_t lo = std::numeric_limits<int32_t>::min(), hi = std::numeric_limits<int32_t>::max();
  const Case cases[] = {
      {"kv_dtype", &clm_engine_options::kv_dtype, {-1, 3, lo, hi}},
      {"memory", &clm_engine_options::memory, {-1, 3, lo, hi}},
      {"eviction_policy", &clm_engine_options::eviction_policy, {-1, 5, 6, lo, hi}},
  };
  for (const Case& c : cases) {
    for (int32_t v : c.values) {
      clm_engine_options o = engine_options(4, 4, CLM_MEMORY_HOST);
      o.*c.member = v;
      clm_engine* e = reinterpret_cast<clm_engine*>(uintptr_t{0x1});
      INFO(c.field << " = " << v);
      CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT, clm_engine_create(&e, &o));
      CHECK(e == nullptr);
      CHECK(std::string(clm_last_error()).find(c.field) != std::string::npos);
    }
  }
}

TEST_CASE("eviction_policy 5 (belady) is refused with a pointer to the replay tool", "[capi][bad][options]") {
  clm_engine_options o = engine_options(4, 4, CLM_MEMORY_HOST);
  o.eviction_policy = 5;
  clm_engine* e = reinterpret_cast<clm_engine*>(uintptr_t{0x1});
  CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT, clm_engine_create(&e, &o));
  CHECK(e == nullptr);
  const std::string message = clm_last_error();
  CHECK(message.find("belady") != std::string::npos);
  CHECK(message.find("replay") != std::string::npos);
}

TEST_CASE("out-of-range sizes in engine options", "[capi][bad][options]") {
  struct Case {
    const char* field;
    int32_t clm_engine_options::*member;
  };
  const Case cases[] = {{"num_pages", &clm_engine_options::num_pages},
                        {"page_size", &clm_engine_options::page_size},
                        {"num_layers", &clm_engine_options::num_layers},
                        {"kv_heads", &clm_engine_options::kv_heads},
                        {"head_dim", &clm_engine_options::head_dim}};
  for (const Case& c : cases) {
    std::vector<int32_t> bad = {0, -1, std::numeric_limits<int32_t>::min()};
    if (c.member != &clm_engine_options::num_pages) bad.push_back(std::numeric_limits<int32_t>::max());
    for (int32_t v : bad) {
      clm_engine_options o = engine_options(4, 4, CLM_MEMORY_HOST);
      o.*c.member = v;
      clm_engine* e = reinterpret_cast<clm_engine*>(uintptr_t{0x1});
      INFO(c.field << " = " << v);
      CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT, clm_engine_create(&e, &o));
      CHECK(e == nullptr);
    }
  }
  for (double f : {-0.1, 1.5, std::nan(""), std::numeric_limits<double>::infinity()}) {
    clm_engine_options o = engine_options(4, 4);
    o.eviction_policy = CLM_EVICT_SLRU;
    o.slru_protected_fraction = f;
    clm_engine* e = nullptr;
    INFO("slru_protected_fraction = " << f);
    CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT, clm_engine_create(&e, &o));
    CHECK(e == nullptr);
  }
  // A host pool whose byte size overflows size_t.
  clm_engine_options o = engine_options(std::numeric_limits<int32_t>::max(), 1 << 20, CLM_MEMORY_HOST);
  o.num_layers = 1 << 20;
  o.kv_heads = 1 << 20;
  o.head_dim = 1 << 20;
  clm_engine* e = nullptr;
  CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT, clm_engine_create(&e, &o));
  CHECK(e == nullptr);
}

TEST_CASE("priority outside 0 to 100, or a priority_update that is neither raise nor set", "[capi][bad][options]") {
  clm_engine_options eo = engine_options(8, 4);
  eo.eviction_policy = CLM_EVICT_PRIORITY;
  EnginePtr engine = make_engine(eo);
  const std::vector<int32_t> t = {1, 2, 3};
  for (int32_t p : {-1, 101, std::numeric_limits<int32_t>::min(), std::numeric_limits<int32_t>::max()}) {
    clm_admit_options o = admit_options();
    o.priority = p;
    clm_seq* s = reinterpret_cast<clm_seq*>(uintptr_t{0x1});
    INFO("priority " << p);
    CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT, clm_engine_admit(&s, engine.get(), t.data(), t.size(), &o));
    CHECK(s == nullptr);
  }
  for (int32_t u : {-1, 2, std::numeric_limits<int32_t>::max()}) {
    clm_admit_options o = admit_options();
    o.priority = 1;
    o.priority_update = u;
    clm_seq* s = reinterpret_cast<clm_seq*>(uintptr_t{0x1});
    INFO("priority_update " << u);
    CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT, clm_engine_admit(&s, engine.get(), t.data(), t.size(), &o));
    CHECK(std::string(clm_last_error()).find("priority_update") != std::string::npos);
    CHECK(s == nullptr);
  }
  const clm_metrics m = metrics(engine.get());
  CHECK(m.admitted == 0);
  CHECK(m.pages_used == 0);
  CHECK(m.tokens_queried == 0);
}
