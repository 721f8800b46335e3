// cuda/model/clm_args.hpp: the plain arguments and launch constants of the CLM
// model-side kernels (cuda/model/clm_kernels.cuh): the SRC head's masked mean and
// fused finish, and the snapshot adapter's add. No CUDA includes: shared by the
// device code, the host glue (cuda_clm.cpp, cuda_src_sums.cpp,
// cuda_snapshot_adapter.cpp) and the CPU emulation
// (tests/gpu/emulated_clm_launch.cpp).
#pragma once

#include <cstdint>

#include "kernels/kernel_args.hpp"

namespace clm::cuda::detail {

// ---- launch constants ----------------------------------------------------------
inline constexpr int kMeanThreads = 128;    // masked mean: one 16-byte chunk (or one element) of a row per thread
inline constexpr int kHeadThreads = 256;    // fused bias + GELU + dot + sigmoid: one block per sequence
inline constexpr int kAddThreads = 128;     // adapter add: one chunk of a row per thread
inline constexpr int kAddRowsPerItem = 16;  // rows of one sequence per adapter-add block
inline constexpr int kMeanMinChunk = 32;    // a split sequence's parts have at least this many tokens

// ---- data errors the kernels report (bits of ClmRecord::error) --------------------
enum ClmError : std::int32_t {
  kErrNonFinite = 1,  // a NaN or Inf in attn_out (special positions included)
  kErrEmpty = 2,      // a sequence with no non-special position
  kErrLogit = 4,      // a non-finite logit (the activations overflow f32)
  kErrDelta = 8,      // adapter: a non-finite delta (a NaN/Inf snapshot, or W s overflows f32)
};

// What the kernels of one score call found. A fresh one ("none found": error 0,
// the first_* fields INT32_MAX, blocks_done 0) is uploaded with every call; the
// last block of the finish kernel merges a failed call's record into the
// head's sticky record, which the host reads back (and resets).
struct ClmRecord {
  std::int32_t error;
  std::int32_t nonfinite_token;  // smallest token index holding a NaN/Inf
  std::int32_t nonfinite_seq;    // its sequence (sequences own increasing token ranges)
  std::int32_t empty_seq;        // smallest sequence with no non-special position
  std::int32_t logit_seq;        // smallest sequence with a non-finite logit
  std::uint32_t blocks_done;     // finish-kernel blocks done (last-block detection)
  std::int32_t calls_failed;     // sticky record only: failed calls merged into it
  std::int32_t pad;
};
static_assert(sizeof(ClmRecord) == 32);

// ---- masked mean -------------------------------------------------------------------------
// Tokens [tok_begin, tok_end) of sequence `seq`. split < 0: the whole sequence
// (the block writes its mean); else the index of the sequence in the split
// table (the block writes a partial sum; the last of its parts to finish sums
// the parts in order and writes the mean).
struct MeanItem {
  std::int32_t seq;
  std::int32_t tok_begin;
  std::int32_t tok_end;
  std::int32_t split;
};
static_assert(sizeof(MeanItem) == 16);

struct MeanSplit {
  std::int32_t first_item;
  std::int32_t parts;
};

// grid = (items, col_tiles): with items == null, item b is sequence b with
// tokens [indptr[b], indptr[b+1]) (no sequence split).
struct MaskedMeanArgs {
  const unsigned char* x;  // attn_out [tokens][cols] in the view's dtype
  std::uint64_t row_bytes;
  std::int32_t cols;
  std::int32_t col_tiles;
  const std::int32_t* token_ids;  // [tokens]
  const std::int32_t* special;    // sorted, distinct
  std::int32_t num_special;
  std::int32_t pad;
  const std::int32_t* indptr;  // [batch + 1]
  const MeanItem* items;       // null: one item per sequence
  const MeanSplit* splits;
  float* means;                  // [batch][cols]
  float* partial_sums;           // [items][cols]
  std::int32_t* partial_counts;  // [items][col_tiles]
  std::uint32_t* counters;       // [splits][col_tiles], zero at launch
  ClmRecord* rec;
};

// ---- running sums (SrcTracker::step_device, CudaSrcSums) ------------------------------
// grid = (batch, col_tiles), kMeanThreads threads, one column per thread.
// Sequence b: sums[rows[b].write] = (rows[b].read < 0 ? 0 : sums[rows[b].read])
// + its non-special rows of x in f64; means[b] = that / (counts[b] + added),
// as f32 (0 when nothing was ever summed); added[b] = rows summed.
struct SumRows {  // clm::SrcSumRows (src_tracker.hpp), the same layout
  std::int32_t read;
  std::int32_t write;
};

struct RunningSumArgs {
  const unsigned char* x;  // attn_out [tokens][cols] in the view's dtype
  std::uint64_t row_bytes;
  std::int32_t cols;
  std::int32_t num_special;
  const std::int32_t* token_ids;  // [tokens]
  const std::int32_t* special;    // sorted, distinct
  const std::int32_t* indptr;     // [batch + 1]
  const SumRows* rows;            // [batch]
  const std::int64_t* counts;     // [batch]: rows summed before this step
  double* sums;                   // [rows][cols]
  float* means;                   // [batch][cols]
  std::int32_t* added;            // [batch]
  ClmRecord* rec;
};

// ---- fused bias + GELU + dot with w2 + b2 + sigmoid -----------------------------
// grid = (batch), kHeadThreads threads; GELU variant as a template parameter.
struct HeadFinishArgs {
  const float* z;   // [batch][inner] = means W1^T (cuBLAS)
  const float* b1;  // [inner]
  const float* w2;  // [inner]
  float b2;
  std::int32_t inner;
  std::int32_t batch;
  std::int32_t accumulate;  // 1: merge a failed call's record into `sticky`
  float* logits;            // [batch] scratch
  float* scores;            // [batch]: written only when the call found no error
  ClmRecord* rec;
  ClmRecord* sticky;
};

// ---- snapshot adapter: hidden_states rows += delta[seq] + bias --------------------
struct AddItem {
  std::int32_t seq;
  std::int32_t row_begin;
  std::int32_t row_end;
  std::int32_t pad;
};
static_assert(sizeof(AddItem) == 16);

// grid = (items, col_tiles).
struct AdapterAddArgs {
  unsigned char* x;  // hidden_states [rows][cols] in the view's dtype
  std::uint64_t row_bytes;
  std::int32_t cols;
  std::int32_t pad;
  const AddItem* items;
  const float* delta;           // [batch][cols] = residual_scale * W s (cuBLAS)
  const float* bias;            // [cols] = residual_scale * b
  const std::int32_t* refused;  // the prepare's record error: nonzero -> add nothing
};

// grid = (batch): flags a delta + bias with a NaN/Inf in `rec` (kErrDelta, the
// smallest such sequence in nonfinite_seq).
struct AdapterCheckArgs {
  const float* delta;  // [batch][cols]
  const float* bias;   // [cols]
  std::int32_t cols;
  std::int32_t pad;
  ClmRecord* rec;
};

}  // namespace clm::cuda::detail
