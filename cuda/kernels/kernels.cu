// The CUDA kernels (kernels.cuh) and their launches; everything else of
// clmcache_cuda is plain C++ (cuda_kernels.cpp, plan.cpp).
#include "kernels.cuh"
#include "launch.hpp"

namespace clm::cuda::detail {

namespace {
dim3 to_dim3(Dims d) { return dim3(d.x, d.y, d.z); }
cudaStream_t as_stream(void* stream) { return static_cast<cudaStream_t>(stream); }
}  // namespace

int launch_decode(int dtype, int head_dim, int heads_per_block, Dims grid, const DecodeArgs& args, void* stream) {
  return with_decode_kernel(dtype, head_dim, heads_per_block, [&](DecodeKernel kernel) {
    kernel<<<to_dim3(grid), kDecodeThreads, 0, as_stream(stream)>>>(args);
    return static_cast<int>(cudaGetLastError());
  });
}

int launch_merge(int head_dim, Dims grid, const MergeArgs& args, void* stream) {
  return with_merge_kernel(head_dim, [&](MergeKernel kernel) {
    kernel<<<to_dim3(grid), static_cast<unsigned>(head_dim), 0, as_stream(stream)>>>(args);
    return static_cast<int>(cudaGetLastError());
  });
}

int launch_prefill(int dtype, int head_dim, Dims grid, const PrefillArgs& args, void* stream) {
  return with_prefill_kernel(dtype, head_dim, [&](PrefillKernel kernel) {
    kernel<<<to_dim3(grid), kPrefillThreads, 0, as_stream(stream)>>>(args);
    return static_cast<int>(cudaGetLastError());
  });
}

int launch_write_kv(int dtype, Dims grid, const WriteKvArgs& args, void* stream) {
  return with_write_kv_kernel(dtype, [&](WriteKvKernel kernel) {
    kernel<<<to_dim3(grid), kWriteKvThreads, 0, as_stream(stream)>>>(args);
    return static_cast<int>(cudaGetLastError());
  });
}

int launch_copy(Dims grid, const CopyArgs& args, void* stream) {
  copy_pages_kernel<<<to_dim3(grid), kCopyThreads, 0, as_stream(stream)>>>(args);
  return static_cast<int>(cudaGetLastError());
}

int decode_blocks_per_sm(int dtype, int head_dim, int heads_per_block, int* blocks) {
  return with_decode_kernel(dtype, head_dim, heads_per_block, [&](DecodeKernel kernel) {
    return static_cast<int>(cudaOccupancyMaxActiveBlocksPerMultiprocessor(blocks, kernel, kDecodeThreads, 0));
  });
}

}  // namespace clm::cuda::detail
