// capi/clm_divergence.cpp: the C ABI of divergence hot spots
// (clm_engine_divergence_report and the report's accessors) over
// clm::Engine::divergence_report. Conversion only.
#include <cstring>
#include <string>
#include <utility>

#include <fmt/format.h>

#include "capi_internal.hpp"
#include "clm.h"

using namespace clm_capi;

// The report a host holds: the Engine's, whose strings and arrays the points' pointers name.
struct clm_divergence_report {
  clm::DivergenceReport report;
};

extern "C" {

clm_status clm_engine_divergence_report(clm_divergence_report** out, clm_engine* engine, int32_t top_per_tenant,
                                        uint64_t min_branches, const char* tenant, size_t tenant_len) {
  return guarded([&]() -> clm_status {
    const char* fn = "clm_engine_divergence_report";
    if (!out) return null_argument(fn, "out");
    *out = nullptr;
    if (!engine) return null_argument(fn, "engine");
    if (!tenant && tenant_len > 0) return null_argument(fn, "tenant (with tenant_len > 0)");
    if (tenant_len > kMaxSaltBytes) {
      return fail(CLM_ERR_INVALID_ARGUMENT,
                  fmt::format("{}: tenant_len {} exceeds {} bytes", fn, tenant_len, kMaxSaltBytes));
    }
    clm::DivergenceReportOptions options;
    options.top_per_tenant = top_per_tenant;
    options.min_branches = min_branches;
    if (tenant) options.tenant = std::string_view(tenant, tenant_len);
    auto held = std::make_unique<clm_divergence_report>();
    if (clm_status s = report(engine->state->engine->divergence_report(options, held->report))) return s;
    *out = held.release();
    return CLM_OK;
  });
}

size_t clm_divergence_report_count(const clm_divergence_report* report) {
  return report ? report->report.points.size() : 0;
}

int64_t clm_divergence_report_window_ms(const clm_divergence_report* report) {
  return report ? report->report.window_ms : 0;
}

clm_status clm_divergence_report_point(clm_branch_point* out, const clm_divergence_report* report, size_t index) {
  return guarded([&]() -> clm_status {
    const char* fn = "clm_divergence_report_point";
    if (!out) return null_argument(fn, "out");
    if (!report) return null_argument(fn, "report");
    if (clm_status s = check_struct_size<clm_branch_point>(out->struct_size, {kBranchPointV1}, fn)) return s;
    if (index >= report->report.points.size()) {
      return fail(CLM_ERR_INVALID_ARGUMENT,
                  fmt::format("{}: index {} is past the report's {} points", fn, index, report->report.points.size()));
    }
    const clm::BranchPoint& p = report->report.points[index];
    const clm_branch_point full{
        out->struct_size, p.tenant.data(), p.tenant.size(),       p.adapter_id,         p.depth,
        p.branches,       p.hits,          p.overcount,           p.before.data(),      p.before.size(),
        p.after.data(),   p.after.size(),  p.cached_after.data(), p.cached_after.size()};
    std::memcpy(out, &full, out->struct_size);
    return CLM_OK;
  });
}

void clm_divergence_report_free(clm_divergence_report* report) { delete report; }

}  // extern "C"
