// clm/device/cuda_kernels.hpp: the CUDA versions of the kernels of attention.hpp
// (library clmcache_cuda, built from cuda/ when nvcc is found; sm_80 and sm_90).
// A plain C++ header: streams are passed as void* (a cudaStream_t; null is the
// default stream) and device buffers as pointers.
//
//   std::unique_ptr<clm::cuda::Workspace> ws;
//   CLM_RETURN_IF_ERROR(clm::cuda::Workspace::create(/*device=*/0, ws));
//   clm::PagedKvView kv = clm::PagedKvView::of(pool);   // a MemoryKind::device pool
//   // once per step: validate the batch on the host, split it, upload it
//   CLM_RETURN_IF_ERROR(clm::cuda::decode_plan(*ws, kv, params, batch.indptr, batch.indices,
//                                              batch.last_page_len, stream));
//   for (int layer = 0; layer < L; ++layer) {
//     params.layer = layer;
//     CLM_RETURN_IF_ERROR(clm::cuda::write_kv(*ws, kv, layer, d_k, d_v, slots, stream));
//     CLM_RETURN_IF_ERROR(clm::cuda::decode_run(*ws, kv, params, d_q, d_out, stream));
//   }
//   CLM_RETURN_IF_ERROR(clm::cuda::synchronize(stream));
//
// Shapes and semantics are those of attention.hpp: f32 activations, KV in the
// pool's dtype (f32/f16/bf16), q head h reads kv head h / (num_q_heads / kv_heads).
// The attention kernels support head_dim 64 and 128 (others: unsupported).
//
// Validation. Every entry point checks on the host, before any launch: the
// view's geometry and that its memory is where its MemoryKind says (pointer
// attributes of the first and last byte), head counts, layer, every page id
// and slot the kernels will touch (which is why page tables and slots are
// passed as host arrays: they are validated, then uploaded through the
// workspace), and that activation buffers (q, out, k, v) are device memory of
// the workspace's device, first and last byte. A failed check returns
// invalid_argument (or unsupported) and launches nothing. CUDA errors become a
// Status carrying cudaGetErrorString's text (out_of_memory for allocation
// failures, unsupported without a usable device, internal otherwise).
// Kernels run asynchronously: an error inside a kernel surfaces at the next
// call that synchronises, e.g. clm::cuda::synchronize(stream).
//
// Threads and streams. A Workspace is not thread-safe; use one per host thread
// (or serialise). Calls on one workspace may use different streams: each call
// waits (on the device) for the workspace's previous call, so they execute in
// call order. Buffers passed to a call must stay valid until it completes on
// the device; host arrays (page ids, slots) may be reused as soon as it returns.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>

#include "clm/kernels/attention.hpp"
#include "clm/status.hpp"

namespace clm::cuda {

// Device scratch for the kernels on one device: the uploaded batch metadata
// (through a small ring of pinned staging buffers), the decode plan, and the
// split-K partial outputs. Grows as needed; never shrinks.
class Workspace {
 public:
  // unsupported when `device` is not a usable CUDA device.
  static Status create(int device, std::unique_ptr<Workspace>& out);
  ~Workspace();
  Workspace(const Workspace&) = delete;
  Workspace& operator=(const Workspace&) = delete;

  int device() const;
  int sm_count() const;
  std::size_t device_bytes() const;  // device memory held

  struct Impl;
  Impl& impl() { return *impl_; }

 private:
  explicit Workspace(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// ---- decode -----------------------------------------------------------------------
struct DecodeOptions {
  // Split-K chunk length in tokens; 0 picks one from the batch and the device
  // (about 8 waves of blocks, chunks of >= 256 tokens, whole tiles).
  std::int32_t chunk_tokens = 0;
  // Optional device copy of `indices` (same contents, at least indptr.back()
  // entries) for the kernels to read instead of uploading the host array. The
  // host array is still what is validated.
  const std::int32_t* device_indices = nullptr;
};

// Validates a decode batch (FlashInfer CSR: sequence i uses pages
// indices[indptr[i], indptr[i+1]), >= 1 each, and rows [0, last_page_len[i])
// of its last page; its query is its last token), splits each sequence into
// chunks, and uploads the plan. The plan holds for decode_run calls on any view
// of the same geometry (any layer) with the same num_q_heads and
// sliding_window, until the next decode_plan on this workspace.
Status decode_plan(Workspace& ws, const PagedKvView& kv, const AttentionParams& params,
                   std::span<const std::int32_t> indptr, std::span<const std::int32_t> indices,
                   std::span<const std::int32_t> last_page_len, void* stream, const DecodeOptions& options = {});

// Attention of q [batch][num_q_heads][head_dim] (device, f32) over the planned
// batch at params.layer into out (same shape). Two launches: the split-K
// chunk kernel (partial outputs + log-sum-exp in the workspace) and the merge.
Status decode_run(Workspace& ws, const PagedKvView& kv, const AttentionParams& params, const float* q, float* out,
                  void* stream);

// decode_plan + decode_run.
Status paged_decode_attention(Workspace& ws, const PagedKvView& kv, const AttentionParams& params, const float* q,
                              std::span<const std::int32_t> indptr, std::span<const std::int32_t> indices,
                              std::span<const std::int32_t> last_page_len, float* out, void* stream,
                              const DecodeOptions& options = {});

// ---- prefill -----------------------------------------------------------------------
// Causal attention (sliding window when params.sliding_window > 0) of the last
// n_new tokens of a sequence of kv_len tokens, whose K/V (cached prefix and new
// tokens) are in `pages` (host array, >= ceil(kv_len / page_size) ids).
// q, out: [n_new][num_q_heads][head_dim], device, f32.
Status paged_prefill_attention(Workspace& ws, const PagedKvView& kv, const AttentionParams& params, const float* q,
                               std::int32_t n_new, std::span<const std::int32_t> pages, std::int32_t kv_len,
                               float* out, void* stream);

// ---- write_kv -------------------------------------------------------------------------
// Scatters rows k, v [slots.size()][kv_heads][head_dim] (device, f32) into
// their slots (host array; slot = page * page_size + row, each at most once),
// converting to the pool's dtype with round-to-nearest-even.
Status write_kv(Workspace& ws, const PagedKvView& kv, std::int32_t layer, const float* k, const float* v,
                std::span<const std::int64_t> slots, void* stream);

// ---- page copies -------------------------------------------------------------------------
enum class CopyMethod : std::uint8_t {
  automatic = 0,  // kernel for pages < 256 KiB when one side is device memory and the other device-accessible, else memcpy
  memcpy = 1,     // cudaMemcpyAsync per run of consecutive pages (copy engines; no SMs used)
  kernel = 2,     // one gather kernel over all pages (host side: pinned and mapped memory)
};
struct CopyOptions {
  CopyMethod method = CopyMethod::automatic;
};

// Copies whole pages (all layers) dst_pages[i] <- src_pages[i] between two
// pools of the same page layout, each in device memory or in host memory. Host
// memory should be pinned (pin_host_memory, or cudaHostAlloc/cudaMallocHost):
// pageable host memory works with CopyMethod::memcpy only, and is synchronous.
Status copy_pages(Workspace& ws, const PagedKvView& dst, std::span<const std::int32_t> dst_pages,
                  const PagedKvView& src, std::span<const std::int32_t> src_pages, void* stream,
                  const CopyOptions& options = {});
// Packs pages into a contiguous buffer of pages.size() * page_bytes (host or
// device memory), and back.
Status gather_pages(Workspace& ws, void* buffer, const PagedKvView& src, std::span<const std::int32_t> pages,
                    void* stream, const CopyOptions& options = {});
Status scatter_pages(Workspace& ws, const PagedKvView& dst, std::span<const std::int32_t> pages, const void* buffer,
                     void* stream, const CopyOptions& options = {});

// ---- helpers ---------------------------------------------------------------------------------
// Page-locks (and maps) host memory, e.g. a MemoryKind::host pool's data(), so
// that copies are asynchronous and the copy kernel can read it.
Status pin_host_memory(void* pointer, std::size_t bytes);
Status unpin_host_memory(void* pointer);
// Waits for the stream; reports errors of kernels that ran on it.
Status synchronize(void* stream);

}  // namespace clm::cuda
