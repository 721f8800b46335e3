// clm/engine/admission.hpp: what the Engine's request calls take and give
// back: the options of an admission (AdmitOptions), the sequence it starts
// and the pages it holds (SequenceId, Admission), what an admission would
// take found without admitting (AdmissionPlan), and the page tables of
// running sequences in the form attention kernels read (PagedBatch).
// engine.hpp, which includes this header, shows the lifecycle:
//
//   clm::Admission a;
//   CLM_RETURN_IF_ERROR(engine->admit(prompt, {.cache_salt = "tenant-7", .priority = 50}, a));
//   // prompt[0, a.cached_tokens) is cached in a.page_table; a.slots: where the rest's K/V go
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "clm/cache/eviction_policy.hpp"

namespace clm {

struct AdmitOptions {
  std::string_view cache_salt;  // requests with different salts never share pages
  std::int32_t adapter_id = 0;  // nor do requests computed with different adapters
  // The tenant's name in reports (Engine::divergence_report), e.g. the
  // server's API-key tenant; without one a report names the salt's digest,
  // never the salt. Not part of the namespace: only the salt separates.
  std::string_view tenant = {};
  int priority = 0;  // 0-100, lowest evicted first: EvictionPolicy::priority
                     // and ghost_slru (eviction_policy.hpp); others ignore it
  // How `priority` meets the priority already cached along the prompt: raise
  // keeps the highest (a shared prefix stays at the highest any request gave
  // it); set replaces it (a hint that expires: eviction_policy.hpp).
  PriorityUpdate priority_update = PriorityUpdate::raise;
};

using SequenceId = std::uint64_t;  // 0 is never a sequence

// What Engine::pin_prefix pinned: the pin's id (for unpin) and how many
// tokens of the prefix, in whole pages, it holds on the pool.
struct PinResult {
  std::uint64_t pin = 0;
  std::int32_t pinned_tokens = 0;
};

struct Admission {
  SequenceId seq = 0;
  std::int32_t cached_tokens = 0;  // page-aligned, <= prompt length - 1
  // Of cached_tokens, how many were copied in from the host tier and, of
  // those, how many the host tier had just fetched from storage for this
  // admission; the rest were on the device. All are in their pages when
  // admit() returns.
  std::int32_t host_tokens = 0;
  std::int32_t storage_tokens = 0;
  std::vector<std::int32_t> page_table;  // ceil(len / page_size) pages covering the prompt
  std::vector<std::int64_t> slots;       // for prompt[cached_tokens, len): page * page_size + row
};

// What admit() would take from the pool, found without admitting
// (Engine::plan_admission). A scheduler that admits only what can run to the
// end checks this first, so that a request waiting for room is not matched,
// counted, made hotter or evicted for on every step it waits.
struct AdmissionPlan {
  std::int32_t cached_tokens = 0;   // on the device now: admit() reuses them (it may also load some from the host tier)
  std::int32_t new_pages = 0;       // pages admit() allocates: the prompt's, less the cached ones
  std::int32_t unlocked_pages = 0;  // cached pages no sequence holds: admit() locks them, so they stop being evictable
  // The pool at the same instant: free pages, and the tokens eviction could free.
  std::int32_t pages_free = 0;
  std::int64_t evictable_tokens = 0;
};

// FlashInfer's paged-KV batch description: sequence i uses
// indices[indptr[i], indptr[i+1]), and rows [0, last_page_len[i]) of its last page.
struct PagedBatch {
  std::vector<std::int32_t> indptr;
  std::vector<std::int32_t> indices;
  std::vector<std::int32_t> last_page_len;
};

}  // namespace clm
