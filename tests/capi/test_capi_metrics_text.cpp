// tests/capi/test_capi_metrics_text.cpp: clm_engine_metrics_text as a host
// sees it (only clm.h and libclmcache.so.0): the buffer protocol of
// clm_suffix_key (sizing call, exact fit, a buffer one byte short is an error
// that writes nothing, the length always set), a text that grows between the
// sizing call and the next, values that agree with clm_engine_metrics, and bad
// arguments.
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

// The whole text by the sizing call, then a buffer of exactly that size.
std::string metrics_text(const clm_engine* engine) {
  size_t length = 0;
  CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT, clm_engine_metrics_text(nullptr, 0, &length, engine));
  REQUIRE(length > 0);
  std::string text(length + 1, '\x7f');
  size_t again = 0;
  REQUIRE_OK(clm_engine_metrics_text(text.data(), text.size(), &again, engine));
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

TEST_CASE("capi metrics text: a sizing call, an exact fit, and a buffer too small that is left untouched",
          "[capi][metrics]") {
  EnginePtr engine = make_engine();
  serve(engine.get(), 5);
  const std::string whole = metrics_text(engine.get());
  const std::string needed = std::to_string(whole.size() + 1);

  // The sizing call: the length, and a message with the size needed.
  size_t length = 0;
  CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT, clm_engine_metrics_text(nullptr, 0, &length, engine.get()));
  CHECK(length == whole.size());
  CHECK(std::string(clm_last_error()).find(needed) != std::string::npos);
  // A NULL text holds nothing, whatever its capacity says: the same answer.
  length = 0;
  CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT, clm_engine_metrics_text(nullptr, 64, &length, engine.get()));
  CHECK(length == whole.size());

  // Too small, down to one byte short (no room for the NUL): an error, the
  // length, and not one byte written.
  for (size_t capacity : {size_t{0}, size_t{1}, size_t{17}, whole.size() - 1, whole.size()}) {
    INFO("capacity " << capacity);
    std::vector<char> buf(whole.size() + 16, '\x7f');  // the sentinel, past capacity too
    length = 0;
    CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT, clm_engine_metrics_text(buf.data(), capacity, &length, engine.get()));
    CHECK(length == whole.size());
    CHECK(std::string(clm_last_error()).find(needed) != std::string::npos);
    CHECK(std::all_of(buf.begin(), buf.end(), [](char c) { return c == '\x7f'; }));
  }

  // Exactly enough, and more than enough: the text and its NUL, nothing after.
  for (size_t capacity : {whole.size() + 1, whole.size() + 9}) {
    INFO("capacity " << capacity);
    std::vector<char> buf(capacity + 8, '\x7f');  // 8 guard bytes past capacity
    length = 0;
    REQUIRE_OK(clm_engine_metrics_text(buf.data(), capacity, &length, engine.get()));
    CHECK(length == whole.size());
    CHECK(std::string(buf.data(), length) == whole);
    CHECK(buf[length] == '\0');
    for (size_t i = length + 1; i < buf.size(); ++i) CHECK(buf[i] == '\x7f');
  }
}

TEST_CASE("capi metrics text: a text that grew since the sizing call is reported, and the retry loop gets it",
          "[capi][metrics]") {
  EnginePtr engine = make_engine();
  serve(engine.get(), 5);
  size_t sized = 0;
  CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT, clm_engine_metrics_text(nullptr, 0, &sized, engine.get()));
  serve(engine.get(), 9);  // tokens queried 5 -> 14, admitted 1 -> 2, ...: longer numbers

  // A buffer sized by the first call is now too small: nothing written, the new length.
  std::vector<char> buf(sized + 1, '\x7f');
  size_t length = 0;
  CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT, clm_engine_metrics_text(buf.data(), buf.size(), &length, engine.get()));
  CHECK(length > sized);
  CHECK(std::all_of(buf.begin(), buf.end(), [](char c) { return c == '\x7f'; }));

  // The loop clm.h gives, starting from the stale size.
  size_t capacity = buf.size();
  clm_status s = CLM_OK;
  int calls = 0;
  while ((s = clm_engine_metrics_text(buf.data(), capacity, &length, engine.get())) == CLM_ERR_INVALID_ARGUMENT &&
         length >= capacity) {
    capacity = length + 1 + 256;
    buf.resize(capacity);
    REQUIRE(++calls < 4);
  }
  REQUIRE(s == CLM_OK);
  CHECK(buf[length] == '\0');
  CHECK(std::string(buf.data(), length) == metrics_text(engine.get()));
  CHECK(value_of(std::string(buf.data(), length), "clm_prefix_cache_queries_total") == 14.0);
}

TEST_CASE("capi metrics text: bad arguments are statuses with a message", "[capi][metrics][errors]") {
  EnginePtr engine = make_engine();
  char buf[64];
  std::memset(buf, 'x', sizeof buf);
  size_t length = 7;
  CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT, clm_engine_metrics_text(buf, sizeof buf, &length, nullptr));
  CHECK(std::string(clm_last_error()).find("engine") != std::string::npos);
  CHECK(length == 7);  // no engine, no length
  CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT, clm_engine_metrics_text(buf, sizeof buf, nullptr, engine.get()));
  CHECK(std::string(clm_last_error()).find("text_len") != std::string::npos);
  CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT, clm_engine_metrics_text(nullptr, 0, nullptr, nullptr));
  CHECK(std::all_of(buf, buf + sizeof buf, [](char c) { return c == 'x'; }));
}
