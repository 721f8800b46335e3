// tests/capi/test_capi_metrics_text.cpp: clm_engine_metrics_text as a host
// sees it (only clm.h and libclmcache.so.0): the snprintf-like buffer
// protocol (sizing call, exact fit, truncation that still ends in a NUL, no
// byte written past capacity), values that agree with clm_engine_metrics,
// and bad arguments.
#include "clm.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "capi_checks.hpp"

namespace {

EnginePtr make_engine() {
  clm_engine_options o;
  REQUIRE_OK(clm_engine_options_init(&o, sizeof o));
  o.num_pages = 8;
  o.page_size = 4;
  o.memory = CLM_MEMORY_NONE;
  clm_engine* e = nullptr;
  REQUIRE_OK(clm_engine_create(&e, &o));
  return EnginePtr(e);
}

// One request of `n` tokens from 1, finished.
void serve(clm_engine* engine, int32_t n) {
  std::vector<int32_t> prompt(static_cast<size_t>(n));
  for (int32_t i = 0; i < n; ++i) prompt[static_cast<size_t>(i)] = i + 1;
  clm_seq* s = nullptr;
  REQUIRE_OK(clm_engine_admit(&s, engine, prompt.data(), prompt.size(), nullptr));
  SeqPtr seq(s);
  REQUIRE_OK(clm_seq_finish(seq.get()));
}

std::string metrics_text(const clm_engine* engine) {
  size_t length = 0;
  REQUIRE_OK(clm_engine_metrics_text(engine, nullptr, 0, &length));
  std::string text(length + 1, '\x7f');
  size_t again = 0;
  REQUIRE_OK(clm_engine_metrics_text(engine, text.data(), text.size(), &again));
  REQUIRE(again == length);
  REQUIRE(text[length] == '\0');
  text.resize(length);
  return text;
}

// The value of the sample line that starts with `series` + ' '.
double value_of(const std::string& text, const std::string& series) {
  const size_t at = text.find("\n" + series + " ");
  INFO(series);
  REQUIRE(at != std::string::npos);
  return std::stod(text.substr(at + series.size() + 2));
}

}  // namespace

TEST_CASE("capi metrics text: a sizing call, then the whole text, which agrees with clm_engine_metrics",
          "[capi][metrics]") {
  EnginePtr engine = make_engine();
  serve(engine.get(), 9);
  serve(engine.get(), 9);  // 8 of 9 tokens cached: a hit
  const std::string text = metrics_text(engine.get());
  CHECK(text.rfind("# HELP clm_", 0) == 0);
  CHECK(text.back() == '\n');
  CHECK(std::strlen(text.c_str()) == text.size());

  clm_metrics m;
  std::memset(&m, 0, sizeof m);
  m.struct_size = sizeof m;
  REQUIRE_OK(clm_engine_metrics(&m, engine.get()));
  CHECK(m.tokens_hit == 8);
  CHECK(value_of(text, "clm_prefix_cache_queries_total") == static_cast<double>(m.tokens_queried));
  CHECK(value_of(text, "clm_prefix_cache_hits_total") == static_cast<double>(m.tokens_hit));
  CHECK(value_of(text, R"(clm_cached_tokens_total{source="device"})") == static_cast<double>(m.tokens_hit));
  CHECK(value_of(text, "clm_sequences_admitted_total") == static_cast<double>(m.admitted));
  CHECK(value_of(text, "clm_evictable_tokens") == static_cast<double>(m.evictable_tokens));
  CHECK(value_of(text, R"(clm_kv_pool_pages{state="free"})") == static_cast<double>(m.pages_free));
}

TEST_CASE("capi metrics text: a buffer too small gets a NUL-terminated prefix and the whole length",
          "[capi][metrics]") {
  EnginePtr engine = make_engine();
  serve(engine.get(), 5);
  const std::string whole = metrics_text(engine.get());
  for (size_t capacity : {size_t{1}, size_t{2}, size_t{17}, whole.size(), whole.size() + 1, whole.size() + 9}) {
    INFO("capacity " << capacity);
    std::vector<char> buf(capacity + 8, '\x7f');  // 8 guard bytes past capacity
    size_t length = 0;
    REQUIRE_OK(clm_engine_metrics_text(engine.get(), buf.data(), capacity, &length));
    CHECK(length == whole.size());
    const size_t kept = std::min(capacity - 1, whole.size());
    CHECK(std::string(buf.data(), kept) == whole.substr(0, kept));
    CHECK(buf[kept] == '\0');
    for (size_t i = capacity; i < buf.size(); ++i) CHECK(buf[i] == '\x7f');
  }
  // Capacity 0 writes nothing, even with a buffer.
  char untouched = 'x';
  size_t length = 0;
  REQUIRE_OK(clm_engine_metrics_text(engine.get(), &untouched, 0, &length));
  CHECK(untouched == 'x');
  CHECK(length == whole.size());
}

TEST_CASE("capi metrics text: bad arguments are statuses with a message", "[capi][metrics][errors]") {
  EnginePtr engine = make_engine();
  char buf[64];
  size_t length = 0;
  CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT, clm_engine_metrics_text(nullptr, buf, sizeof buf, &length));
  CHECK(std::string(clm_last_error()).find("engine") != std::string::npos);
  CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT, clm_engine_metrics_text(engine.get(), buf, sizeof buf, nullptr));
  CHECK(std::string(clm_last_error()).find("length") != std::string::npos);
  CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT, clm_engine_metrics_text(engine.get(), nullptr, 16, &length));
  CHECK(std::string(clm_last_error()).find("buf") != std::string::npos);
}
