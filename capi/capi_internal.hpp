// capi/capi_internal.hpp: what the C ABI's source files share: the handle
// types behind clm.h's opaque pointers, the thread-local error message, the
// exception guard and the versioned-struct helpers. Not installed.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstring>
#include <exception>
#include <initializer_list>
#include <memory>
#include <new>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "clm.h"
#include "clm/engine.hpp"

namespace clm_capi {

// The message clm_last_error returns: one per thread.
inline std::string& last_error_message() {
  thread_local std::string message;
  return message;
}

inline clm_status fail(clm_status code, std::string message) {
  last_error_message() = std::move(message);
  return code;
}
inline clm_status report(const clm::Status& s) {
  return s.ok() ? CLM_OK : fail(static_cast<clm_status>(s.code()), s.message());
}

// Runs body, turning any exception into a status: nothing throws through the ABI.
template <class Body>
clm_status guarded(Body&& body) noexcept {
  try {
    return body();
  } catch (const std::bad_alloc&) {
    return fail(CLM_ERR_OUT_OF_MEMORY, "out of host memory");
  } catch (const std::exception& e) {
    return fail(CLM_ERR_INTERNAL, fmt::format("internal error: {}", e.what()));
  } catch (...) {
    return fail(CLM_ERR_INTERNAL, "internal error: unknown exception");
  }
}

// Versioned structs: a caller's struct_size must be the size of a version
// this library published (its last field's end, or that rounded up to the
// struct's alignment, as the caller's sizeof has it); any other size would cut
// a field in two. Only the fields the caller's size covers are read or written.
template <class Struct>
clm_status check_struct_size(std::size_t size, std::initializer_list<std::size_t> versions, const char* what) {
  constexpr std::size_t align = alignof(Struct);
  for (std::size_t v : versions) {
    if (size == v || size == (v + align - 1) / align * align) return CLM_OK;
  }
  if (size == sizeof(Struct)) return CLM_OK;
  std::string known;
  for (std::size_t v : versions) known += fmt::format("{}, ", v);
  return fail(CLM_ERR_INVALID_ARGUMENT,
              fmt::format("{}: struct_size {} is not the size of a version this library knows ({}{})", what, size,
                          known, sizeof(Struct)));
}
// The sizes of the first version of each struct: frozen. A later version
// appends fields and accepts callers compiled with any published version.
constexpr std::size_t kMaxTokens = clm::Engine::kMaxTokens;  // per call
constexpr std::size_t kMaxSaltBytes = std::size_t{1} << 16;  // a salt names a tenant, not a document
constexpr std::size_t kEngineOptionsV1 = offsetof(clm_engine_options, slru_protected_fraction) + sizeof(double);
constexpr std::size_t kAdmitOptionsV1 = offsetof(clm_admit_options, priority) + sizeof(int32_t);
constexpr std::size_t kMetricsV1 = offsetof(clm_metrics, metadata_bytes) + sizeof(uint64_t);
constexpr std::size_t kKvLayoutV1 = offsetof(clm_kv_layout, memory) + sizeof(int32_t);
constexpr std::size_t kAdmissionPlanV1 = offsetof(clm_admission_plan, evictable_tokens) + sizeof(int64_t);
constexpr std::size_t kAdapterOptionsV1 = offsetof(clm_adapter_options, residual_scale) + sizeof(float);
constexpr std::size_t kAttentionParamsV1 = offsetof(clm_attention_params, stream) + sizeof(void*);
// Version 2 (the SRC head), frozen too: version 3 (the snapshot store) appends
// to it, and a caller of any of these sizes gets the later fields' defaults.
constexpr std::size_t kEngineOptionsV2 = offsetof(clm_engine_options, n_special_token_ids) + sizeof(size_t);
constexpr std::size_t kMetricsV2 = offsetof(clm_metrics, src_injections) + sizeof(uint64_t);
static_assert(kEngineOptionsV1 < kEngineOptionsV2 && kEngineOptionsV2 < sizeof(clm_engine_options));
static_assert(kMetricsV1 < kMetricsV2 && kMetricsV2 < sizeof(clm_metrics));
static_assert(offsetof(clm_engine_options, snapshot_store_path) >= kEngineOptionsV2, "version 3 appends");
static_assert(offsetof(clm_metrics, store_lookups) >= kMetricsV2, "version 3 appends");
// Version 3, frozen: version 4 (the tiers) appends to it.
constexpr std::size_t kEngineOptionsV3 = offsetof(clm_engine_options, snapshot_lookup_timeout_us) + sizeof(int32_t);
constexpr std::size_t kMetricsV3 = offsetof(clm_metrics, has_snapshot_store) + sizeof(int32_t);
static_assert(kEngineOptionsV2 < kEngineOptionsV3 && kEngineOptionsV3 < sizeof(clm_engine_options));
static_assert(kMetricsV2 < kMetricsV3 && kMetricsV3 < sizeof(clm_metrics));
static_assert(offsetof(clm_engine_options, host_pages) >= kEngineOptionsV3, "version 4 appends");
static_assert(offsetof(clm_metrics, has_tiers) >= kMetricsV3, "version 4 appends");
// Version 4, frozen: version 5 (the store's reader and maintenance) appends to it.
constexpr std::size_t kEngineOptionsV4 = offsetof(clm_engine_options, storage_batch_pages) + sizeof(int32_t);
static_assert(kEngineOptionsV3 < kEngineOptionsV4 && kEngineOptionsV4 < sizeof(clm_engine_options));
static_assert(offsetof(clm_engine_options, snapshot_read_only) >= kEngineOptionsV4, "version 5 appends");
constexpr std::size_t kMetricsV4 = offsetof(clm_metrics, storage_evicted_pages) + sizeof(uint64_t);
static_assert(kMetricsV3 < kMetricsV4 && kMetricsV4 < sizeof(clm_metrics));
static_assert(offsetof(clm_metrics, storage_foreign_model_pages) >= kMetricsV4, "version 5 appends");
// Version 5, frozen: version 6 (model id, page secret) appends to it.
constexpr std::size_t kEngineOptionsV5 =
    offsetof(clm_engine_options, snapshot_maintenance_interval_ms) + sizeof(int64_t);
static_assert(kEngineOptionsV4 < kEngineOptionsV5 && kEngineOptionsV5 < sizeof(clm_engine_options));
static_assert(offsetof(clm_engine_options, model_id) >= kEngineOptionsV5, "version 6 appends");
// Version 6, frozen: version 7 (KV events) appends to it.
constexpr std::size_t kEngineOptionsV6 = offsetof(clm_engine_options, breaker_open_ms) + sizeof(double);
static_assert(kEngineOptionsV5 < kEngineOptionsV6 && kEngineOptionsV6 < sizeof(clm_engine_options));
static_assert(offsetof(clm_engine_options, kv_events) >= kEngineOptionsV6, "version 7 appends");
constexpr std::size_t kMetricsV5 = offsetof(clm_metrics, queued_fetches) + sizeof(int64_t);
static_assert(kMetricsV4 < kMetricsV5 && kMetricsV5 < sizeof(clm_metrics));
static_assert(offsetof(clm_metrics, has_kv_events) >= kMetricsV5, "version 6 appends");
// Version 7, frozen: version 8 (divergence) appends to it.
constexpr std::size_t kEngineOptionsV7 = offsetof(clm_engine_options, kv_events_token_ids) + sizeof(int32_t);
static_assert(kEngineOptionsV6 < kEngineOptionsV7 && kEngineOptionsV7 < sizeof(clm_engine_options));
static_assert(offsetof(clm_engine_options, divergence) >= kEngineOptionsV7, "version 8 appends");
constexpr std::size_t kMetricsV6 = offsetof(clm_metrics, kv_events_next_sequence) + sizeof(uint64_t);
static_assert(kMetricsV5 < kMetricsV6 && kMetricsV6 < sizeof(clm_metrics));
static_assert(offsetof(clm_metrics, diverged_lookups) >= kMetricsV6, "version 7 appends");
// Version 8, frozen: version 9 (CLM anomalies) appends to it.
constexpr std::size_t kEngineOptionsV8 = offsetof(clm_engine_options, divergence_context_tokens) + sizeof(int32_t);
static_assert(kEngineOptionsV7 < kEngineOptionsV8 && kEngineOptionsV8 < sizeof(clm_engine_options));
static_assert(offsetof(clm_engine_options, clm_watch) >= kEngineOptionsV8, "version 9 appends");
constexpr std::size_t kMetricsV7 = offsetof(clm_metrics, match_depth_sum_tokens) + sizeof(uint64_t);
static_assert(kMetricsV6 < kMetricsV7 && kMetricsV7 < sizeof(clm_metrics));
static_assert(offsetof(clm_metrics, clm_watch_sightings) >= kMetricsV7, "version 8 appends");
constexpr std::size_t kLowSrcKeyV1 = sizeof(clm_low_src_key);
constexpr std::size_t kWatchEventV1 = sizeof(clm_watch_event);
constexpr std::size_t kAdmitOptionsV2 = offsetof(clm_admit_options, priority_update) + sizeof(int32_t);
static_assert(offsetof(clm_admit_options, tenant) >= kAdmitOptionsV2, "version 3 appends");
constexpr std::size_t kBranchPointV1 = sizeof(clm_branch_point);
constexpr std::size_t kKvEventBatchV1 = sizeof(clm_kv_event_batch);
static_assert(offsetof(clm_admit_options, priority_update) >= kAdmitOptionsV1, "version 2 appends");
static_assert(CLM_PRIORITY_RAISE == static_cast<int>(clm::PriorityUpdate::raise) &&
                  CLM_PRIORITY_SET == static_cast<int>(clm::PriorityUpdate::set),
              "clm_admit_options.priority_update is cast to clm::PriorityUpdate");
// widen() copies a caller's struct whole, padding included: the older
// versions of the structs a caller passes in end on their alignment, so that
// no padding lands on a later field.
static_assert(kAdmitOptionsV1 % alignof(clm_admit_options) == 0);
static_assert(kEngineOptionsV1 % alignof(clm_engine_options) == 0 &&
              kEngineOptionsV2 % alignof(clm_engine_options) == 0 &&
              kEngineOptionsV3 % alignof(clm_engine_options) == 0 &&
              kEngineOptionsV4 % alignof(clm_engine_options) == 0 &&
              kEngineOptionsV5 % alignof(clm_engine_options) == 0 &&
              kEngineOptionsV6 % alignof(clm_engine_options) == 0 &&
              kEngineOptionsV8 % alignof(clm_engine_options) == 0 && kMetricsV5 % alignof(clm_metrics) == 0 &&
              kMetricsV7 % alignof(clm_metrics) == 0 && sizeof(clm_engine_options) % alignof(clm_engine_options) == 0);

// A caller's struct of `size` bytes as this library's full struct: the
// caller's fields, and the defaults for fields its version did not have.
template <class Struct>
Struct widen(const Struct* caller, std::size_t size, const Struct& defaults) {
  Struct full = defaults;
  std::memcpy(static_cast<void*>(&full), caller, std::min(size, sizeof(Struct)));
  return full;
}

inline clm_status null_argument(const char* function, const char* name) {
  return fail(CLM_ERR_INVALID_ARGUMENT, fmt::format("{}: {} is NULL", function, name));
}

// Version 7 of the options (KV events) as the engine's configuration, the
// host's callback as its sink (clm_kv_events.cpp).
clm_status kv_events_config(const clm_engine_options& options, clm::KvEventsConfig& config);

// The engine is shared with its sequence handles, so that a handle outliving
// clm_engine_free fails cleanly instead of touching freed memory.
struct EngineState {
  std::unique_ptr<clm::Engine> engine;
  std::atomic<bool> closed{false};
};
}  // namespace clm_capi

struct clm_engine {
  std::shared_ptr<clm_capi::EngineState> state;
};
struct clm_seq {
  std::shared_ptr<clm_capi::EngineState> state;
  clm::Admission admission;         // id, cached tokens, page table, slots of the prompt
  std::vector<std::int64_t> slots;  // of the last extend
  bool extended = false;
  bool ended = false;
  const char* ended_by = "";
};

namespace clm_capi {

inline clm_status check_running(const clm_seq* seq, const char* function) {
  if (!seq) return null_argument(function, "seq");
  if (seq->state->closed) return fail(CLM_ERR_FAILED_PRECONDITION, fmt::format("{}: the engine was freed", function));
  if (seq->ended) {
    return fail(CLM_ERR_FAILED_PRECONDITION, fmt::format("{}: the sequence was already {}", function, seq->ended_by));
  }
  return CLM_OK;
}

// The engine's ids of `seqs`, each running and belonging to `engine`.
inline clm_status sequence_ids(const clm_engine* engine, clm_seq* const* seqs, std::size_t n_seqs, const char* fn,
                               std::vector<clm::SequenceId>& ids) {
  if (!seqs && n_seqs > 0) return null_argument(fn, "seqs");
  ids.resize(n_seqs);
  for (std::size_t i = 0; i < n_seqs; ++i) {
    if (clm_status s = check_running(seqs[i], fn)) return s;
    if (seqs[i]->state != engine->state) {
      return fail(CLM_ERR_INVALID_ARGUMENT, fmt::format("{}: seqs[{}] belongs to another engine", fn, i));
    }
    ids[i] = seqs[i]->admission.seq;
  }
  return CLM_OK;
}

}  // namespace clm_capi
