// clm/events/kv_event.hpp: one change to the KV cache as a cache-aware router
// sees it (a KV event: pages stored on a tier, removed from it, or all of
// them cleared), a batch of them, and their wire form: vLLM's KV events,
// msgpack-encoded, as llm-d's KV-cache indexer, NVIDIA Dynamo's router,
// AIBrix and SGLang's gateway decode them (docs/fleet.md).
//
//   clm::KvEventBatch batch{.ts = 1757500000.25, .data_parallel_rank = 0};
//   clm::KvEvent stored{.kind = clm::KvEventKind::block_stored, .medium = clm::KvMedium::gpu};
//   stored.block_hashes = {0xdeadbeef12345678, 0x0123456789abcdef};
//   stored.token_ids = {1, 2, 3, 4, 5, 6, 7, 8};
//   stored.block_size = 4;
//   batch.events.push_back(stored);
//   std::string payload;
//   CLM_RETURN_IF_ERROR(clm::encode_kv_event_batch(batch, clm::KvEventLayout::array, payload));
//   clm::KvEventBatch back;
//   CLM_RETURN_IF_ERROR(clm::decode_kv_event_batch(payload, back));  // any layout
//
// The batch is the array [ts (float64), events, data_parallel_rank]; each
// event, in the default layout, is a tagged array in vLLM's field order:
//   ["BlockStored", block_hashes, parent_block_hash, token_ids, block_size,
//    lora_id, medium, lora_name, extra_keys, group_idx, kv_cache_spec_kind,
//    kv_cache_spec_sliding_window]
//   ["BlockRemoved", block_hashes, medium, group_idx]
//   ["AllBlocksCleared"]
// Block hashes are always sent as msgpack uint64 (0xcf and 8 bytes): llm-d
// refuses narrower integers. One block is one page.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "clm/status.hpp"

namespace clm {

enum class KvEventKind : std::uint8_t { block_stored, block_removed, all_blocks_cleared };

// The tier a block is on: the engine's pool (GPU, vLLM's name for its own
// cache wherever its memory lives) or the host tier (CPU). The shared storage
// tier has no events: it changes behind any one engine's back.
enum class KvMedium : std::uint8_t { gpu, cpu };

// The wire layout of each event (the batch is the same array in all three):
//   array:  the tagged array of vLLM before its events became maps (12 and 4
//           fields): new llm-d, AIBrix, vLLM's own decoders of that time;
//   legacy: the 7- and 3-field arrays llm-d-kv-cache-manager up to 2025 needs;
//   map:    {"type": tag, field: value...} as vLLM sends since mid-2026
//           (optional fields left out when empty).
enum class KvEventLayout : std::uint8_t { array, legacy, map };

struct KvEvent {
  KvEventKind kind = KvEventKind::block_stored;
  KvMedium medium = KvMedium::gpu;
  std::vector<std::uint64_t> block_hashes;         // stored, removed: one per page, in path order
  std::optional<std::uint64_t> parent_block_hash;  // stored: the page before the first; none at a prefix's start
  std::vector<std::int32_t> token_ids;             // stored: block_hashes.size() * block_size ids, or none
  std::int32_t block_size = 0;                     // stored: tokens per page
  std::optional<std::int32_t> lora_id;             // stored: the adapter, when not 0
  // stored: each block's extra key, vLLM's field for cache_salt: the tenant's
  // salt digest ("salt:" and 32 hex digits), empty for the default tenant.
  std::string extra_key;
  bool operator==(const KvEvent&) const = default;
};

// An event's fields without their storage (spans into the caller's): what
// the encoder reads, so that a publisher encodes straight from the
// recorder's log (KvEventRecorder::take_views) without building KvEvents.
struct KvEventView {
  KvEventKind kind = KvEventKind::block_stored;
  KvMedium medium = KvMedium::gpu;
  std::span<const std::uint64_t> block_hashes;
  std::optional<std::uint64_t> parent_block_hash;
  std::span<const std::int32_t> token_ids;
  std::int32_t block_size = 0;
  std::optional<std::int32_t> lora_id;
  std::string_view extra_key;

  static KvEventView of(const KvEvent& e) {
    return {e.kind, e.medium, e.block_hashes, e.parent_block_hash, e.token_ids, e.block_size, e.lora_id, e.extra_key};
  }
};

struct KvEventBatch {
  double ts = 0.0;  // seconds since the epoch
  std::vector<KvEvent> events;
  std::optional<std::int32_t> data_parallel_rank;
  bool operator==(const KvEventBatch&) const = default;
};

// Limits a decoder holds any payload to, whatever it claims.
inline constexpr std::size_t kMaxKvEventPayloadBytes = 64u << 20;

// `out` is replaced by the payload, in its own storage (a publisher encodes
// every batch into one string, which then allocates nothing batch after
// batch). invalid_argument, `out` untouched, for what cannot be sent as it is
// (a ts that is not finite, token ids that are neither none nor
// block_hashes.size() * block_size, a block size under 1); out_of_memory
// leaves `out` empty.
Status encode_kv_event_batch(const KvEventBatch& batch, KvEventLayout layout, std::string& out);
// The same from views: the batch [ts, events, data_parallel_rank].
Status encode_kv_event_views(double ts, std::span<const KvEventView> events,
                             std::optional<std::int32_t> data_parallel_rank, KvEventLayout layout, std::string& out);

// Any of the three layouts, and vLLM's shorter arrays of earlier versions.
// invalid_argument naming what is wrong, `out` untouched; never reads past
// `payload`, never allocates more than a bounded multiple of its size.
Status decode_kv_event_batch(std::string_view payload, KvEventBatch& out);

std::string_view kv_event_tag(KvEventKind kind);
std::string_view kv_medium_name(KvMedium medium);  // "GPU", "CPU"

}  // namespace clm
