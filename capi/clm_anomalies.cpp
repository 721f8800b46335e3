// capi/clm_anomalies.cpp: the C ABI of CLM anomalies (clm_engine_clm_anomalies
// and the report's accessors) over clm::Engine::clm_anomalies. Conversion only.
#include <cstring>
#include <memory>
#include <string>

#include <fmt/format.h>

#include "capi_internal.hpp"
#include "clm.h"

using namespace clm_capi;

// The report a host holds: the Engine's, whose strings the entries' pointers name.
struct clm_anomaly_report {
  clm::ClmAnomalyReport report;
};

static_assert(CLM_WATCH_EVENT_BLACKLISTED == static_cast<int>(clm::ClmEvent::Kind::blacklisted) &&
                  CLM_WATCH_EVENT_UNBLACKLISTED == static_cast<int>(clm::ClmEvent::Kind::unblacklisted) &&
                  CLM_WATCH_EVENT_VERSION_CREATED == static_cast<int>(clm::ClmEvent::Kind::version_created) &&
                  CLM_WATCH_EVENT_DRIFT == static_cast<int>(clm::ClmEvent::Kind::drift) &&
                  CLM_WATCH_EVENT_LOW_SRC == static_cast<int>(clm::ClmEvent::Kind::low_src),
              "clm_watch_event.kind is cast from clm::ClmEvent::Kind");

namespace {
clm_status check_index(const char* fn, size_t index, size_t count, const char* what) {
  if (index < count) return CLM_OK;
  return fail(CLM_ERR_INVALID_ARGUMENT, fmt::format("{}: index {} is past the report's {} {}", fn, index, count, what));
}
}  // namespace

extern "C" {

clm_status clm_engine_clm_anomalies(clm_anomaly_report** out, const clm_engine* engine) {
  return guarded([&]() -> clm_status {
    const char* fn = "clm_engine_clm_anomalies";
    if (!out) return null_argument(fn, "out");
    *out = nullptr;
    if (!engine) return null_argument(fn, "engine");
    auto held = std::make_unique<clm_anomaly_report>();
    if (clm_status s = report(engine->state->engine->clm_anomalies(held->report))) return s;
    *out = held.release();
    return CLM_OK;
  });
}

size_t clm_anomaly_report_low_src_count(const clm_anomaly_report* report) {
  return report ? report->report.low_src_keys.size() : 0;
}

size_t clm_anomaly_report_event_count(const clm_anomaly_report* report) {
  return report ? report->report.events.size() : 0;
}

int64_t clm_anomaly_report_window_ms(const clm_anomaly_report* report) { return report ? report->report.window_ms : 0; }

int64_t clm_anomaly_report_min_sightings(const clm_anomaly_report* report) {
  return report ? report->report.min_sightings : 0;
}

float clm_anomaly_report_low_src(const clm_anomaly_report* report) { return report ? report->report.low_src : 0.0f; }

clm_status clm_anomaly_report_low_src_key(clm_low_src_key* out, const clm_anomaly_report* report, size_t index) {
  return guarded([&]() -> clm_status {
    const char* fn = "clm_anomaly_report_low_src_key";
    if (!out) return null_argument(fn, "out");
    if (!report) return null_argument(fn, "report");
    if (clm_status s = check_struct_size<clm_low_src_key>(out->struct_size, {kLowSrcKeyV1}, fn)) return s;
    if (clm_status s = check_index(fn, index, report->report.low_src_keys.size(), "low-SRC keys")) return s;
    const clm::LowSrcKey& k = report->report.low_src_keys[index];
    const clm_low_src_key full{out->struct_size, k.adapter_id, k.tenant.data(),
                               k.tenant.size(),  k.key.data(), k.key.size(),
                               k.sightings,      k.median_src, 0};
    std::memcpy(out, &full, out->struct_size);
    return CLM_OK;
  });
}

clm_status clm_anomaly_report_event(clm_watch_event* out, const clm_anomaly_report* report, size_t index) {
  return guarded([&]() -> clm_status {
    const char* fn = "clm_anomaly_report_event";
    if (!out) return null_argument(fn, "out");
    if (!report) return null_argument(fn, "report");
    if (clm_status s = check_struct_size<clm_watch_event>(out->struct_size, {kWatchEventV1}, fn)) return s;
    if (clm_status s = check_index(fn, index, report->report.events.size(), "events")) return s;
    const clm::ClmEvent& e = report->report.events[index];
    const clm_watch_event full{out->struct_size,
                               static_cast<int32_t>(e.kind),
                               e.time_ms,
                               e.tenant.data(),
                               e.tenant.size(),
                               e.key.data(),
                               e.key.size(),
                               e.reason.data(),
                               e.reason.size(),
                               e.until_ms,
                               e.adapter_id,
                               e.version,
                               e.by_breaker ? 1 : 0,
                               e.median_src,
                               e.sightings};
    std::memcpy(out, &full, out->struct_size);
    return CLM_OK;
  });
}

clm_status clm_anomaly_report_event_json(char* line, size_t line_capacity, size_t* line_len,
                                         const clm_anomaly_report* report, size_t index) {
  return guarded([&]() -> clm_status {
    const char* fn = "clm_anomaly_report_event_json";
    if (!line_len) return null_argument(fn, "line_len");
    if (!report) return null_argument(fn, "report");
    if (clm_status s = check_index(fn, index, report->report.events.size(), "events")) return s;
    const std::string made = clm::clm_event_json(report->report.events[index]);
    *line_len = made.size();
    if (!line || made.size() >= line_capacity) {
      return fail(CLM_ERR_INVALID_ARGUMENT, fmt::format("{}: the line needs {} bytes with its NUL, line holds {}", fn,
                                                        made.size() + 1, line ? line_capacity : 0));
    }
    std::memcpy(line, made.data(), made.size());
    line[made.size()] = '\0';
    return CLM_OK;
  });
}

void clm_anomaly_report_free(clm_anomaly_report* report) { delete report; }

}  // extern "C"
