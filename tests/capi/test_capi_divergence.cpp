// The C ABI of divergence hot spots (clm_engine_divergence_report, the
// report's accessors, the options and metrics fields), as a host sees it: a
// timestamp planted in one named tenant's system prompt is the report's first
// point, tenants are named as admitted (a salt only by its digest), older
// struct versions keep working, and bad input gets a status.
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "capi_engine.hpp"

namespace {

struct ReportFree {
  void operator()(clm_divergence_report* r) const { clm_divergence_report_free(r); }
};
using ReportPtr = std::unique_ptr<clm_divergence_report, ReportFree>;

ReportPtr take_report(clm_engine* e, int32_t top, uint64_t min_branches, const std::string* tenant = nullptr) {
  clm_divergence_report* r = nullptr;
  REQUIRE_OK(clm_engine_divergence_report(&r, e, top, min_branches, tenant ? tenant->data() : nullptr,
                                          tenant ? tenant->size() : 0));
  REQUIRE(r != nullptr);
  return ReportPtr(r);
}

clm_branch_point point(const clm_divergence_report* r, size_t i) {
  clm_branch_point p;
  std::memset(&p, 0xAB, sizeof p);
  p.struct_size = sizeof p;
  REQUIRE_OK(clm_divergence_report_point(&p, r, i));
  return p;
}

std::string tenant_of(const clm_branch_point& p) { return std::string(p.tenant, p.tenant_len); }

// One request that runs to its end: admit, one decoded token, finish.
void request(clm_engine* e, const std::vector<int32_t>& prompt, const clm_admit_options& o) {
  SeqPtr s = admit(e, prompt, &o);
  const int32_t next = 7;
  REQUIRE_OK(clm_seq_extend(s.get(), &next, 1));
  REQUIRE_OK(clm_seq_finish(s.get()));
}

}  // namespace

TEST_CASE("divergence: a timestamp in one tenant's system prompt is the first point, named as admitted",
          "[capi][divergence]") {
  const std::uint32_t seed = std::random_device{}();
  INFO("seed " << seed);
  std::mt19937 rng(seed);
  const int32_t page = 16;
  EnginePtr e = make_engine(4096, page);
  const int32_t planted = std::uniform_int_distribution<int32_t>(64, 300)(rng);
  INFO("timestamp at token " << planted);
  std::vector<int32_t> system(400);
  for (auto& t : system) t = std::uniform_int_distribution<int32_t>(100, 50000)(rng);
  const std::string acme = "acme", other = "globex", acme_salt = "secret-salt-acme";
  for (int i = 0; i < 60; ++i) {
    // acme: the time, a second a request, as two digit tokens; then a question.
    std::vector<int32_t> prompt = system;
    prompt[static_cast<size_t>(planted)] = i / 10;
    prompt[static_cast<size_t>(planted) + 1] = i % 10;
    for (int k = 0; k < 20; ++k) prompt.push_back(60000 + 20 * i + k);
    clm_admit_options o = admit_options();
    o.cache_salt = acme_salt.data();
    o.cache_salt_len = acme_salt.size();
    o.tenant = acme.data();
    o.tenant_len = acme.size();
    request(e.get(), prompt, o);
    // globex: one conversation that grows turn by turn (each turn reuses the last).
    std::vector<int32_t> chat(system.begin(), system.begin() + 100);
    for (int k = 0; k < 10 * (i + 1); ++k) chat.push_back(70000 + k);
    o.cache_salt = other.data();
    o.cache_salt_len = other.size();
    o.tenant = other.data();
    o.tenant_len = other.size();
    request(e.get(), chat, o);
  }
  ReportPtr r = take_report(e.get(), 3, 2);
  REQUIRE(clm_divergence_report_count(r.get()) >= 1);
  CHECK(clm_divergence_report_window_ms(r.get()) == 3600000);
  const clm_branch_point top = point(r.get(), 0);
  CHECK(tenant_of(top) == acme);
  CHECK(std::abs(top.depth - planted) <= page);
  CHECK(top.depth % page == 0);
  CHECK(top.branches >= 50);  // the seconds digit changes every request; the tens digit every ten
  CHECK(top.hits == 0);
  REQUIRE(top.n_before == 8);
  REQUIRE(top.n_after == 8);
  // The context is the request's: the tokens on either side of the split.
  for (size_t k = 0; k < top.n_before; ++k) {
    const auto at = static_cast<size_t>(top.depth) - top.n_before + k;
    if (at != static_cast<size_t>(planted) && at != static_cast<size_t>(planted) + 1)
      CHECK(top.before[k] == system[at]);
  }
  for (size_t i = 0; i < clm_divergence_report_count(r.get()); ++i) {
    const std::string t = tenant_of(point(r.get(), i));
    CHECK(t.find("secret") == std::string::npos);
    CHECK((t == acme || t == other));
  }
  // One tenant's only.
  r = take_report(e.get(), 5, 1, &other);
  for (size_t i = 0; i < clm_divergence_report_count(r.get()); ++i) CHECK(tenant_of(point(r.get(), i)) == other);

  clm_metrics m;
  std::memset(&m, 0, sizeof m);
  m.struct_size = sizeof m;
  REQUIRE_OK(clm_engine_metrics(&m, e.get()));
  CHECK(m.diverged_lookups >= top.branches);
  uint64_t lookups = 0;
  for (uint64_t c : m.match_depth_counts) lookups += c;
  CHECK(lookups == 120);
  CHECK(m.match_depth_sum_tokens > 0);
}

TEST_CASE("divergence: a caller of admit options version 2 is named by its salt's digest", "[capi][divergence]") {
  EnginePtr e = make_engine(1024, 4);
  const std::string salt = "tenant-salt-9";
  for (int i = 0; i < 4; ++i) {
    std::vector<int32_t> prompt(32);
    std::iota(prompt.begin(), prompt.end(), 1);
    for (size_t k = 16; k < prompt.size(); ++k) prompt[k] = 1000 * (i + 1) + static_cast<int32_t>(k);
    // The version-2 struct ends after priority_update; tenant is garbage past it, never read.
    clm_admit_options o;
    std::memset(&o, 0xAB, sizeof o);
    o.struct_size = offsetof(clm_admit_options, priority_update) + sizeof(int32_t) + 4;  // its sizeof: 40
    o.cache_salt = salt.data();
    o.cache_salt_len = salt.size();
    o.adapter_id = 0;
    o.priority = 0;
    o.priority_update = CLM_PRIORITY_RAISE;
    request(e.get(), prompt, o);
  }
  ReportPtr r = take_report(e.get(), 3, 1);
  REQUIRE(clm_divergence_report_count(r.get()) == 1);
  const clm_branch_point p = point(r.get(), 0);
  const std::string name = tenant_of(p);
  CHECK(name.rfind("salt:", 0) == 0);
  CHECK(name.size() == 37);
  CHECK(name.find(salt) == std::string::npos);
  CHECK(p.depth == 16);
  CHECK(p.branches == 3);
}

TEST_CASE("divergence: options, older metrics and bad input", "[capi][divergence]") {
  SECTION("switched off: no counters, the report is a failed precondition") {
    clm_engine_options o = engine_options(256, 4);
    CHECK(o.divergence == 1);
    CHECK(o.divergence_branch_points == 256);
    CHECK(o.divergence_window_ms == 3600000);
    CHECK(o.divergence_context_tokens == 8);
    o.divergence = 0;
    EnginePtr e = make_engine(o);
    std::vector<int32_t> prompt(20, 5);
    request(e.get(), prompt, admit_options());
    clm_divergence_report* r = reinterpret_cast<clm_divergence_report*>(1);
    CHECK_STATUS(CLM_ERR_FAILED_PRECONDITION, clm_engine_divergence_report(&r, e.get(), 3, 1, nullptr, 0));
    CHECK(r == nullptr);
    clm_metrics m;
    std::memset(&m, 0, sizeof m);
    m.struct_size = sizeof m;
    REQUIRE_OK(clm_engine_metrics(&m, e.get()));
    CHECK(m.match_depth_counts[0] + m.match_depth_counts[1] == 0);
  }
  SECTION("a version-6 metrics caller gets nothing written past its struct") {
    EnginePtr e = make_engine(256, 4);
    request(e.get(), std::vector<int32_t>(20, 5), admit_options());
    clm_metrics m;
    std::memset(&m, 0xCD, sizeof m);
    m.struct_size = offsetof(clm_metrics, kv_events_next_sequence) + sizeof(uint64_t);
    REQUIRE_OK(clm_engine_metrics(&m, e.get()));
    CHECK(m.tokens_queried == 20);
    const auto* tail = reinterpret_cast<const unsigned char*>(&m) + m.struct_size;
    for (size_t k = 0; k < sizeof m - m.struct_size; ++k) CHECK(tail[k] == 0xCD);
  }
  SECTION("out-of-range options are refused, naming the field") {
    struct Case {
      void (*set)(clm_engine_options&);
      const char* field;
    };
    for (const Case& c : {Case{[](clm_engine_options& o) { o.divergence = 2; }, "divergence"},
                          Case{[](clm_engine_options& o) { o.divergence_branch_points = 8; }, "branch_points"},
                          Case{[](clm_engine_options& o) { o.divergence_window_ms = 1; }, "window_ms"},
                          Case{[](clm_engine_options& o) { o.divergence_context_tokens = 65; }, "context_tokens"}}) {
      clm_engine_options o = engine_options(64, 4);
      c.set(o);
      clm_engine* e = reinterpret_cast<clm_engine*>(1);
      CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT, clm_engine_create(&e, &o));
      CHECK(std::string(clm_last_error()).find(c.field) != std::string::npos);
    }
  }
  SECTION("bad arguments") {
    EnginePtr e = make_engine(256, 4);
    clm_divergence_report* r = nullptr;
    CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT, clm_engine_divergence_report(nullptr, e.get(), 3, 1, nullptr, 0));
    CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT, clm_engine_divergence_report(&r, nullptr, 3, 1, nullptr, 0));
    CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT, clm_engine_divergence_report(&r, e.get(), 0, 1, nullptr, 0));
    CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT, clm_engine_divergence_report(&r, e.get(), 3, 1, nullptr, 4));
    CHECK(r == nullptr);
    clm_admit_options o = admit_options();
    o.tenant = nullptr;
    o.tenant_len = 3;
    clm_seq* s = nullptr;
    const std::vector<int32_t> prompt(8, 1);
    CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT, clm_engine_admit(&s, e.get(), prompt.data(), prompt.size(), &o));
    CHECK(s == nullptr);
    ReportPtr report = take_report(e.get(), 3, 1);
    clm_branch_point p = CLM_BRANCH_POINT_INIT;
    CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT, clm_divergence_report_point(&p, report.get(), 0));  // empty report
    p.struct_size = 12;
    CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT, clm_divergence_report_point(&p, report.get(), 0));
    CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT, clm_divergence_report_point(nullptr, report.get(), 0));
    CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT, clm_divergence_report_point(&p, nullptr, 0));
    CHECK(clm_divergence_report_count(nullptr) == 0);
    clm_divergence_report_free(nullptr);
  }
}
