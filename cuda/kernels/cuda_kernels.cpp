// clm/device/cuda_kernels.hpp over the CUDA runtime: the workspace, host validation
// (plan.cpp), uploads through pinned staging buffers, and the launches of
// kernels.cu. Plain C++: the CUDA runtime API is a C API.
#include "clm/device/cuda_kernels.hpp"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <initializer_list>
#include <limits>
#include <map>
#include <tuple>
#include <vector>

#include <fmt/format.h>

#include "device/device_staging.hpp"
#include "launch.hpp"
#include "plan.hpp"

namespace clm::cuda {

using detail::as_stream;
using detail::DeviceBuffer;
using detail::DeviceGuard;
using detail::Dims;
using detail::GrowthPolicy;
using detail::launch_status;

namespace {

// Where a range of memory lives, from the pointer attributes of its first and
// last byte.
struct Placement {
  enum Kind { device, pinned_host, pageable_host } kind = pageable_host;
  void* device_pointer = nullptr;  // device-accessible address of the first byte (null: none)
};

Status place(const void* pointer, std::size_t bytes, int device, const char* what, Placement& out) {
  if (pointer == nullptr) return invalid_argument(fmt::format("{}: null pointer", what));
  cudaPointerAttributes first{}, last{};
  CLM_CUDA_TRY(cudaPointerGetAttributes(&first, pointer), "cudaPointerGetAttributes");
  const void* end = static_cast<const unsigned char*>(pointer) + (bytes == 0 ? 0 : bytes - 1);
  CLM_CUDA_TRY(cudaPointerGetAttributes(&last, end), "cudaPointerGetAttributes");
  if (first.type != last.type) {
    return invalid_argument(
        fmt::format("{}: the first and last byte of its {} bytes are different kinds of memory "
                    "(is the buffer too small?)",
                    what, bytes));
  }
  switch (first.type) {
    case cudaMemoryTypeDevice:
    case cudaMemoryTypeManaged:
      if (first.type == cudaMemoryTypeDevice && (first.device != device || last.device != device)) {
        return invalid_argument(
            fmt::format("{}: memory of device {}, but the workspace is on device {}", what, first.device, device));
      }
      if (static_cast<const unsigned char*>(last.devicePointer) -
              static_cast<const unsigned char*>(first.devicePointer) !=
          static_cast<std::ptrdiff_t>(bytes == 0 ? 0 : bytes - 1)) {
        return invalid_argument(fmt::format("{}: its {} bytes are not one device allocation", what, bytes));
      }
      out.kind = Placement::device;
      out.device_pointer = first.devicePointer;
      return {};
    case cudaMemoryTypeHost:
      out.kind = Placement::pinned_host;
      out.device_pointer = nullptr;
      if (first.devicePointer != nullptr && last.devicePointer != nullptr &&
          static_cast<const unsigned char*>(last.devicePointer) -
                  static_cast<const unsigned char*>(first.devicePointer) ==
              static_cast<std::ptrdiff_t>(bytes == 0 ? 0 : bytes - 1)) {
        out.device_pointer = first.devicePointer;
      }
      return {};
    default:
      out.kind = Placement::pageable_host;
      out.device_pointer = nullptr;
      return {};
  }
}

// A buffer the kernels read or write: must be device (or managed) memory.
Status check_device_buffer(const void* pointer, std::size_t bytes, int device, const char* what) {
  Placement p;
  CLM_RETURN_IF_ERROR(place(pointer, bytes, device, what, p));
  if (p.kind != Placement::device) {
    return invalid_argument(fmt::format("{}: must be device memory, got {} host memory", what,
                                        p.kind == Placement::pinned_host ? "pinned" : "pageable"));
  }
  if (p.device_pointer != pointer) {
    return invalid_argument(fmt::format("{}: not directly addressable by the device", what));
  }
  return {};
}

Status check_pool_memory(const PagedKvView& kv, int device, const char* what, Placement& out) {
  const std::size_t bytes = kv.page_bytes * static_cast<std::size_t>(kv.num_pages);
  CLM_RETURN_IF_ERROR(place(kv.base, bytes, device, what, out));
  const bool on_device = out.kind == Placement::device;
  if (kv.memory == MemoryKind::device && !on_device) {
    return invalid_argument(fmt::format("{}: the view says MemoryKind::device, but its memory is host memory", what));
  }
  if (kv.memory == MemoryKind::host && on_device) {
    return invalid_argument(fmt::format("{}: the view says MemoryKind::host, but its memory is device memory", what));
  }
  if (kv.memory == MemoryKind::none) return failed_precondition(fmt::format("{}: the pool keeps no KV bytes", what));
  return {};
}

}  // namespace

// ============================================================================
// Workspace
// ============================================================================
// A planned decode batch and the device buffers it runs from.
struct DecodeSlot {
  DeviceBuffer meta;      // items, merge_indptr, indices
  DeviceBuffer partials;  // partial outputs + lse
  detail::DecodePlan plan;
  bool planned = false;
  const std::int32_t* indices = nullptr;  // device
  const detail::DecodeItem* items = nullptr;
  const std::int32_t* merge_indptr = nullptr;
};

struct Workspace::Impl {
  int device = 0;
  int sm_count = 1;
  detail::StagingRing<8> staging{std::size_t{1} << 16};
  DeviceBuffer call_meta;  // per call: prefill pages, write_kv slots, copy pairs
  cudaEvent_t last_call = nullptr;
  bool has_last_call = false;

  DecodeSlot decode;  // the host's decode_plan, for its decode_run calls
  // Prefill with few new tokens runs as a decode batch (one row per new
  // token); its own slot, so that it never replaces the host's plan.
  DecodeSlot small_prefill;
  std::map<std::tuple<int, int, int>, int> blocks_per_sm;  // (dtype, head_dim, G) -> occupancy

  ~Impl() {
    DeviceGuard guard;
    if (!guard.enter(device).ok()) return;
    // Every call waits for the previous one, so the last call's event covers
    // all work that may still use these buffers.
    if (has_last_call) cudaEventSynchronize(last_call);
    staging.release();
    for (DeviceBuffer* b : {&decode.meta, &decode.partials, &small_prefill.meta, &small_prefill.partials, &call_meta}) {
      if (b->pointer) cudaFree(b->pointer);
    }
    if (last_call) cudaEventDestroy(last_call);
  }

  // Orders this call after the workspace's previous one (possibly on another stream).
  Status begin(cudaStream_t stream) {
    if (has_last_call) CLM_CUDA_TRY(cudaStreamWaitEvent(stream, last_call, 0), "cudaStreamWaitEvent");
    return {};
  }
  Status end(cudaStream_t stream) {
    CLM_CUDA_TRY(cudaEventRecord(last_call, stream), "cudaEventRecord");
    has_last_call = true;
    return {};
  }

  // Device buffers grow to exactly what a call needs (at least 64 KiB).
  static constexpr GrowthPolicy kGrowth{false, std::size_t{1} << 16, "cudaMalloc (workspace)"};
  Status reserve(DeviceBuffer& b, std::size_t bytes, cudaStream_t stream) {
    return detail::reserve(b, bytes, stream, kGrowth);
  }
  // Uploads `parts` (host ranges), each 16-byte aligned, into `dst`; returns
  // the device address of each part.
  Status upload(std::initializer_list<detail::UploadPart> parts, DeviceBuffer& dst, cudaStream_t stream,
                std::vector<void*>& addresses) {
    return staging.upload(parts, dst, kGrowth, stream, addresses);
  }

  Status decode_occupancy(KvDType dtype, int head_dim, int heads_per_block, int& blocks) {
    const auto key = std::make_tuple(static_cast<int>(dtype), head_dim, heads_per_block);
    if (auto it = blocks_per_sm.find(key); it != blocks_per_sm.end()) {
      blocks = it->second;
      return {};
    }
    blocks = 1;
    CLM_RETURN_IF_ERROR(
        launch_status(detail::decode_blocks_per_sm(static_cast<int>(dtype), head_dim, heads_per_block, &blocks),
                      "cudaOccupancyMaxActiveBlocksPerMultiprocessor"));
    blocks = std::max(blocks, 1);
    blocks_per_sm.emplace(key, blocks);
    return {};
  }
};

Workspace::Workspace(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Workspace::~Workspace() = default;
int Workspace::device() const { return impl_->device; }
int Workspace::sm_count() const { return impl_->sm_count; }
std::size_t Workspace::device_bytes() const {
  const Impl& w = *impl_;
  return w.decode.meta.capacity + w.decode.partials.capacity + w.small_prefill.meta.capacity +
         w.small_prefill.partials.capacity + w.call_meta.capacity;
}

Status Workspace::create(int device, std::unique_ptr<Workspace>& out) {
  CLM_RETURN_IF_ERROR(detail::check_usable_device(device));
  DeviceGuard guard;
  CLM_RETURN_IF_ERROR(guard.enter(device));
  auto impl = std::make_unique<Impl>();
  impl->device = device;
  CLM_CUDA_TRY(cudaDeviceGetAttribute(&impl->sm_count, cudaDevAttrMultiProcessorCount, device),
               "cudaDeviceGetAttribute");
  CLM_RETURN_IF_ERROR(impl->staging.create_events());
  CLM_CUDA_TRY(cudaEventCreateWithFlags(&impl->last_call, cudaEventDisableTiming), "cudaEventCreate");
  out.reset(new Workspace(std::move(impl)));
  return {};
}

namespace {

// What every call does first: the device, the stream's device, the ordering.
Status enter(Workspace::Impl& w, DeviceGuard& guard, void* stream) {
  CLM_RETURN_IF_ERROR(guard.enter(w.device));
  if (stream != nullptr) {
    int stream_device = -1;
    CLM_CUDA_TRY(cudaStreamGetDevice(as_stream(stream), &stream_device), "cudaStreamGetDevice");
    if (stream_device != w.device) {
      return invalid_argument(
          fmt::format("the stream belongs to device {}, the workspace to device {}", stream_device, w.device));
    }
  }
  return w.begin(as_stream(stream));
}

}  // namespace

// ============================================================================
// decode
// ============================================================================
namespace {

Status plan_into(Workspace::Impl& w, DecodeSlot& slot, const PagedKvView& kv, const AttentionParams& params,
                 std::span<const std::int32_t> indptr, std::span<const std::int32_t> indices,
                 std::span<const std::int32_t> last_page_len, void* stream, const DecodeOptions& options) {
  slot.planned = false;
  // Host checks first: nothing touches the device for a malformed batch.
  CLM_RETURN_IF_ERROR(detail::validate_kernel_view(kv, 0));
  CLM_RETURN_IF_ERROR(detail::validate_heads(kv, params));
  DeviceGuard guard;
  CLM_RETURN_IF_ERROR(guard.enter(w.device));
  const detail::HeadBlocking heads = detail::choose_head_blocking(params.num_q_heads / kv.kv_heads);
  detail::DecodeTuning tuning;
  tuning.sm_count = w.sm_count;
  tuning.chunk_tokens = options.chunk_tokens;
  CLM_RETURN_IF_ERROR(w.decode_occupancy(kv.dtype, kv.head_dim, heads.heads_per_block, tuning.blocks_per_sm));
  detail::DecodePlan plan;
  CLM_RETURN_IF_ERROR(detail::plan_decode(kv, params, indptr, indices, last_page_len, tuning, plan));
  if (options.device_indices != nullptr && plan.nnz > 0) {
    CLM_RETURN_IF_ERROR(check_device_buffer(options.device_indices, static_cast<std::size_t>(plan.nnz) * 4, w.device,
                                            "decode: options.device_indices"));
  }
  CLM_RETURN_IF_ERROR(enter(w, guard, stream));
  const cudaStream_t s = as_stream(stream);
  const bool upload_indices = options.device_indices == nullptr;
  std::vector<void*> at;
  CLM_RETURN_IF_ERROR(w.upload({{plan.items.data(), plan.items.size() * sizeof(detail::DecodeItem)},
                                {plan.merge_indptr.data(), plan.merge_indptr.size() * sizeof(std::int32_t)},
                                {indices.data(), upload_indices ? static_cast<std::size_t>(plan.nnz) * 4 : 0}},
                               slot.meta, s, at));
  CLM_RETURN_IF_ERROR(w.reserve(slot.partials, detail::decode_partial_floats(plan) * sizeof(float), s));
  slot.items = static_cast<const detail::DecodeItem*>(at[0]);
  slot.merge_indptr = static_cast<const std::int32_t*>(at[1]);
  slot.indices = upload_indices ? static_cast<const std::int32_t*>(at[2]) : options.device_indices;
  slot.plan = std::move(plan);
  slot.planned = true;
  return w.end(s);
}

Status run_slot(Workspace::Impl& w, const DecodeSlot& slot, const PagedKvView& kv, const AttentionParams& params,
                const float* q, float* out, void* stream) {
  if (!slot.planned) {
    return failed_precondition("decode_run: no decode_plan on this workspace (or the last one failed)");
  }
  const detail::DecodePlan& plan = slot.plan;
  CLM_RETURN_IF_ERROR(detail::check_decode_run(plan, kv, params));
  DeviceGuard guard;
  CLM_RETURN_IF_ERROR(guard.enter(w.device));
  Placement pool;
  CLM_RETURN_IF_ERROR(check_pool_memory(kv, w.device, "decode: kv", pool));
  if (plan.batch == 0) return {};
  const std::size_t act_bytes =
      static_cast<std::size_t>(plan.batch) * static_cast<std::size_t>(plan.num_q_heads) * plan.head_dim * sizeof(float);
  CLM_RETURN_IF_ERROR(detail::check_no_overlap(q, out, act_bytes, "decode"));
  CLM_RETURN_IF_ERROR(check_device_buffer(q, act_bytes, w.device, "decode: q"));
  CLM_RETURN_IF_ERROR(check_device_buffer(out, act_bytes, w.device, "decode: out"));
  CLM_RETURN_IF_ERROR(enter(w, guard, stream));
  const cudaStream_t s = as_stream(stream);
  float* partial_out = static_cast<float*>(slot.partials.pointer);
  float* partial_lse = partial_out + plan.items.size() * static_cast<std::size_t>(plan.num_q_heads) * plan.head_dim;
  const detail::DecodeArgs args =
      detail::make_decode_args(plan, kv, params, slot.indices, slot.items, q, partial_out, partial_lse);
  CLM_RETURN_IF_ERROR(launch_status(detail::launch_decode(static_cast<int>(kv.dtype), kv.head_dim,
                                                          plan.heads.heads_per_block, plan.decode_grid, args, stream),
                                    "decode kernel launch"));
  const detail::MergeArgs merge = detail::make_merge_args(plan, slot.merge_indptr, partial_out, partial_lse, out);
  CLM_RETURN_IF_ERROR(
      launch_status(detail::launch_merge(kv.head_dim, plan.merge_grid, merge, stream), "decode merge kernel launch"));
  return w.end(s);
}

}  // namespace

Status decode_plan(Workspace& ws, const PagedKvView& kv, const AttentionParams& params,
                   std::span<const std::int32_t> indptr, std::span<const std::int32_t> indices,
                   std::span<const std::int32_t> last_page_len, void* stream, const DecodeOptions& options) {
  Workspace::Impl& w = ws.impl();
  return plan_into(w, w.decode, kv, params, indptr, indices, last_page_len, stream, options);
}

Status decode_run(Workspace& ws, const PagedKvView& kv, const AttentionParams& params, const float* q, float* out,
                  void* stream) {
  Workspace::Impl& w = ws.impl();
  return run_slot(w, w.decode, kv, params, q, out, stream);
}

Status paged_decode_attention(Workspace& ws, const PagedKvView& kv, const AttentionParams& params, const float* q,
                              std::span<const std::int32_t> indptr, std::span<const std::int32_t> indices,
                              std::span<const std::int32_t> last_page_len, float* out, void* stream,
                              const DecodeOptions& options) {
  CLM_RETURN_IF_ERROR(decode_plan(ws, kv, params, indptr, indices, last_page_len, stream, options));
  return decode_run(ws, kv, params, q, out, stream);
}

// ============================================================================
// prefill
// ============================================================================
Status paged_prefill_attention(Workspace& ws, const PagedKvView& kv, const AttentionParams& params, const float* q,
                               std::int32_t n_new, std::span<const std::int32_t> pages, std::int32_t kv_len, float* out,
                               void* stream) {
  Workspace::Impl& w = ws.impl();
  CLM_RETURN_IF_ERROR(detail::validate_prefill(kv, params, n_new, pages, kv_len));
  DeviceGuard guard;
  CLM_RETURN_IF_ERROR(guard.enter(w.device));
  Placement pool;
  CLM_RETURN_IF_ERROR(check_pool_memory(kv, w.device, "prefill: kv", pool));
  if (n_new == 0) return {};
  const std::size_t act_bytes =
      static_cast<std::size_t>(n_new) * static_cast<std::size_t>(params.num_q_heads) * kv.head_dim * sizeof(float);
  CLM_RETURN_IF_ERROR(detail::check_no_overlap(q, out, act_bytes, "prefill"));
  CLM_RETURN_IF_ERROR(check_device_buffer(q, act_bytes, w.device, "prefill: q"));
  CLM_RETURN_IF_ERROR(check_device_buffer(out, act_bytes, w.device, "prefill: out"));
  const std::size_t used = static_cast<std::size_t>(detail::prefill_pages_used(kv, kv_len));
  if (n_new <= detail::kSmallPrefillRows) {
    // A few new tokens over a prefix: the prefill kernel would give each
    // (kv head, query tile) one block walking the whole prefix alone (8
    // blocks for n_new = 1); as a decode batch, one row per new token (row i
    // sees the first kv_len - n_new + i + 1 tokens, over the same pages),
    // split-K spreads the prefix over every SM.
    std::vector<std::int32_t> indptr{0}, indices, last_page_len;
    for (std::int32_t i = 0; i < n_new; ++i) {
      const std::int32_t len = kv_len - n_new + i + 1;
      const std::int32_t row_pages = (len + kv.page_size - 1) / kv.page_size;
      indices.insert(indices.end(), pages.begin(), pages.begin() + row_pages);
      indptr.push_back(static_cast<std::int32_t>(indices.size()));
      last_page_len.push_back(len - (row_pages - 1) * kv.page_size);
    }
    CLM_RETURN_IF_ERROR(plan_into(w, w.small_prefill, kv, params, indptr, indices, last_page_len, stream, {}));
    return run_slot(w, w.small_prefill, kv, params, q, out, stream);
  }
  CLM_RETURN_IF_ERROR(enter(w, guard, stream));
  const cudaStream_t s = as_stream(stream);
  std::vector<void*> at;
  CLM_RETURN_IF_ERROR(w.upload({{pages.data(), used * sizeof(std::int32_t)}}, w.call_meta, s, at));
  const detail::PrefillArgs args =
      detail::make_prefill_args(kv, params, n_new, kv_len, static_cast<const std::int32_t*>(at[0]), q, out);
  CLM_RETURN_IF_ERROR(launch_status(detail::launch_prefill(static_cast<int>(kv.dtype), kv.head_dim,
                                                           detail::prefill_grid(kv, params, n_new), args, stream),
                                    "prefill kernel launch"));
  return w.end(s);
}

// ============================================================================
// write_kv
// ============================================================================
Status write_kv(Workspace& ws, const PagedKvView& kv, std::int32_t layer, const float* k, const float* v,
                std::span<const std::int64_t> slots, void* stream) {
  Workspace::Impl& w = ws.impl();
  CLM_RETURN_IF_ERROR(detail::validate_write_kv(kv, layer, slots));
  DeviceGuard guard;
  CLM_RETURN_IF_ERROR(guard.enter(w.device));
  Placement pool;
  CLM_RETURN_IF_ERROR(check_pool_memory(kv, w.device, "write_kv: kv", pool));
  if (slots.empty()) return {};
  const std::size_t row_bytes = static_cast<std::size_t>(kv.kv_heads) * kv.head_dim * sizeof(float);
  CLM_RETURN_IF_ERROR(check_device_buffer(k, slots.size() * row_bytes, w.device, "write_kv: k"));
  CLM_RETURN_IF_ERROR(check_device_buffer(v, slots.size() * row_bytes, w.device, "write_kv: v"));
  CLM_RETURN_IF_ERROR(enter(w, guard, stream));
  const cudaStream_t s = as_stream(stream);
  std::vector<void*> at;
  CLM_RETURN_IF_ERROR(w.upload({{slots.data(), slots.size() * sizeof(std::int64_t)}}, w.call_meta, s, at));
  const detail::WriteKvArgs args = detail::make_write_kv_args(kv, layer, static_cast<const std::int64_t*>(at[0]), k, v);
  CLM_RETURN_IF_ERROR(
      launch_status(detail::launch_write_kv(static_cast<int>(kv.dtype), Dims{static_cast<unsigned>(slots.size()), 1, 1},
                                            args, stream),
                    "write_kv kernel launch"));
  return w.end(s);
}

// ============================================================================
// page copies
// ============================================================================
namespace {

constexpr std::size_t kKernelCopyMaxPageBytes = 256 * 1024;

Status copy_impl(Workspace& ws, const PagedKvView& dst, std::span<const std::int32_t> dst_pages, const PagedKvView& src,
                 std::span<const std::int32_t> src_pages, void* stream, const CopyOptions& options) {
  Workspace::Impl& w = ws.impl();
  CLM_RETURN_IF_ERROR(detail::validate_copy(dst, dst_pages, src, src_pages));
  if (options.method != CopyMethod::automatic && options.method != CopyMethod::memcpy &&
      options.method != CopyMethod::kernel) {
    return invalid_argument("copy: unknown CopyMethod");
  }
  DeviceGuard guard;
  CLM_RETURN_IF_ERROR(guard.enter(w.device));
  Placement d, s;
  CLM_RETURN_IF_ERROR(check_pool_memory(dst, w.device, "copy: dst", d));
  CLM_RETURN_IF_ERROR(check_pool_memory(src, w.device, "copy: src", s));
  if (dst_pages.empty()) return {};
  const std::size_t page_bytes = src.page_bytes;
  const bool kernel_possible = d.device_pointer != nullptr && s.device_pointer != nullptr &&
                               detail::copy_kernel_supports(page_bytes) &&
                               reinterpret_cast<std::uintptr_t>(d.device_pointer) % 16 == 0 &&
                               reinterpret_cast<std::uintptr_t>(s.device_pointer) % 16 == 0;
  bool use_kernel = false;
  switch (options.method) {
    case CopyMethod::kernel:
      if (!kernel_possible) {
        return unsupported(
            "copy: the copy kernel needs both sides device-accessible (device memory, or pinned and mapped host "
            "memory) and page_bytes a multiple of 16");
      }
      use_kernel = true;
      break;
    case CopyMethod::memcpy:
      use_kernel = false;
      break;
    default:  // small pages, and at least one side on the device
      use_kernel = kernel_possible && page_bytes < kKernelCopyMaxPageBytes &&
                   (d.kind == Placement::device || s.kind == Placement::device);
      break;
  }
  CLM_RETURN_IF_ERROR(enter(w, guard, stream));
  const cudaStream_t st = as_stream(stream);
  if (use_kernel) {
    std::vector<std::int32_t> pairs(2 * dst_pages.size());
    for (std::size_t i = 0; i < dst_pages.size(); ++i) {
      pairs[2 * i] = src_pages[i];
      pairs[2 * i + 1] = dst_pages[i];
    }
    std::vector<void*> at;
    CLM_RETURN_IF_ERROR(w.upload({{pairs.data(), pairs.size() * sizeof(std::int32_t)}}, w.call_meta, st, at));
    detail::CopyArgs args{};
    args.src = static_cast<const unsigned char*>(s.device_pointer);
    args.dst = static_cast<unsigned char*>(d.device_pointer);
    args.page_bytes = page_bytes;
    args.units = page_bytes / 16;
    args.pairs = static_cast<const std::int32_t*>(at[0]);
    CLM_RETURN_IF_ERROR(launch_status(
        detail::launch_copy(detail::copy_grid(dst_pages.size(), page_bytes), args, stream), "copy kernel launch"));
  } else {
    for (const detail::CopyRun& run : detail::coalesce_runs(dst_pages, src_pages)) {
      CLM_CUDA_TRY(
          cudaMemcpyAsync(static_cast<unsigned char*>(dst.base) + static_cast<std::size_t>(run.dst) * page_bytes,
                          static_cast<const unsigned char*>(src.base) + static_cast<std::size_t>(run.src) * page_bytes,
                          static_cast<std::size_t>(run.count) * page_bytes, cudaMemcpyDefault, st),
          "cudaMemcpyAsync (copy_pages)");
    }
  }
  return w.end(st);
}

// A view of `count` consecutive pages at `buffer`, laid out like `like`.
PagedKvView buffer_view(void* buffer, const PagedKvView& like, std::size_t count, MemoryKind memory) {
  PagedKvView v = like;
  v.base = buffer;
  v.num_pages = static_cast<std::int32_t>(count);
  v.memory = memory;
  return v;
}

Status buffer_memory(const void* buffer, const PagedKvView& like, std::size_t count, int device, MemoryKind& out) {
  if (buffer == nullptr) return invalid_argument("buffer: null pointer");
  DeviceGuard guard;
  CLM_RETURN_IF_ERROR(guard.enter(device));
  Placement p;
  CLM_RETURN_IF_ERROR(place(buffer, like.page_bytes * count, device, "buffer", p));
  out = p.kind == Placement::device ? MemoryKind::device : MemoryKind::host;
  return {};
}

}  // namespace

Status copy_pages(Workspace& ws, const PagedKvView& dst, std::span<const std::int32_t> dst_pages,
                  const PagedKvView& src, std::span<const std::int32_t> src_pages, void* stream,
                  const CopyOptions& options) {
  return copy_impl(ws, dst, dst_pages, src, src_pages, stream, options);
}

Status gather_pages(Workspace& ws, void* buffer, const PagedKvView& src, std::span<const std::int32_t> pages,
                    void* stream, const CopyOptions& options) {
  if (pages.empty()) return detail::validate_view(src, "gather: src");
  if (pages.size() > static_cast<std::size_t>(std::numeric_limits<std::int32_t>::max())) {
    return invalid_argument("gather: too many pages");
  }
  CLM_RETURN_IF_ERROR(detail::validate_view(src, "gather: src"));
  MemoryKind memory{};
  CLM_RETURN_IF_ERROR(buffer_memory(buffer, src, pages.size(), ws.device(), memory));
  std::vector<std::int32_t> slots(pages.size());
  for (std::size_t i = 0; i < slots.size(); ++i) slots[i] = static_cast<std::int32_t>(i);
  return copy_impl(ws, buffer_view(buffer, src, pages.size(), memory), slots, src, pages, stream, options);
}

Status scatter_pages(Workspace& ws, const PagedKvView& dst, std::span<const std::int32_t> pages, const void* buffer,
                     void* stream, const CopyOptions& options) {
  if (pages.empty()) return detail::validate_view(dst, "scatter: dst");
  if (pages.size() > static_cast<std::size_t>(std::numeric_limits<std::int32_t>::max())) {
    return invalid_argument("scatter: too many pages");
  }
  CLM_RETURN_IF_ERROR(detail::validate_view(dst, "scatter: dst"));
  MemoryKind memory{};
  CLM_RETURN_IF_ERROR(buffer_memory(buffer, dst, pages.size(), ws.device(), memory));
  std::vector<std::int32_t> slots(pages.size());
  for (std::size_t i = 0; i < slots.size(); ++i) slots[i] = static_cast<std::int32_t>(i);
  // The buffer is only read; the view's pointer is not const.
  return copy_impl(ws, dst, pages, buffer_view(const_cast<void*>(buffer), dst, pages.size(), memory), slots, stream,
                   options);
}

// ============================================================================
// helpers
// ============================================================================
Status pin_host_memory(void* pointer, std::size_t bytes) {
  if (pointer == nullptr || bytes == 0) return invalid_argument("pin_host_memory: null pointer or no bytes");
  CLM_CUDA_TRY(cudaHostRegister(pointer, bytes, cudaHostRegisterPortable | cudaHostRegisterMapped), "cudaHostRegister");
  return {};
}

Status unpin_host_memory(void* pointer) {
  if (pointer == nullptr) return invalid_argument("unpin_host_memory: null pointer");
  CLM_CUDA_TRY(cudaHostUnregister(pointer), "cudaHostUnregister");
  return {};
}

Status synchronize(void* stream) {
  CLM_CUDA_TRY(cudaStreamSynchronize(as_stream(stream)), "cudaStreamSynchronize");
  CLM_CUDA_TRY(cudaGetLastError(), "asynchronous error");
  return {};
}

}  // namespace clm::cuda
