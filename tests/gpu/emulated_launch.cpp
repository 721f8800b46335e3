// cuda/kernels/launch.hpp implemented with the CPU emulator (cuda_emu.hpp) instead of
// CUDA launches: with fake_cudart.cpp, this runs clmcache_cuda's public API
// (cuda/kernels/cuda_kernels.cpp) end to end on machines without a GPU, for
// test_cuda_kernels_emulated. Launches complete before they return.
#include "cuda_emu.hpp"  // first: the kernels compile over it

#include "kernels/kernels.cuh"
#include "kernels/launch.hpp"

namespace clm::cuda::detail {

namespace {
clm_emu::Dim emu(Dims d) { return clm_emu::Dim{d.x, d.y, d.z}; }
}  // namespace

int launch_decode(int dtype, int head_dim, int heads_per_block, Dims grid, const DecodeArgs& args, void*) {
  return with_decode_kernel(dtype, head_dim, heads_per_block, [&](DecodeKernel kernel) {
    clm_emu::launch(emu(grid), kDecodeThreads, kernel, args);
    return 0;
  });
}

int launch_merge(int head_dim, Dims grid, const MergeArgs& args, void*) {
  return with_merge_kernel(head_dim, [&](MergeKernel kernel) {
    clm_emu::launch(emu(grid), static_cast<unsigned>(head_dim), kernel, args);
    return 0;
  });
}

int launch_prefill(int dtype, int head_dim, Dims grid, const PrefillArgs& args, void*) {
  return with_prefill_kernel(dtype, head_dim, [&](PrefillKernel kernel) {
    clm_emu::launch(emu(grid), kPrefillThreads, kernel, args);
    return 0;
  });
}

int launch_write_kv(int dtype, Dims grid, const WriteKvArgs& args, void*) {
  return with_write_kv_kernel(dtype, [&](WriteKvKernel kernel) {
    clm_emu::launch(emu(grid), kWriteKvThreads, kernel, args);
    return 0;
  });
}

int launch_copy(Dims grid, const CopyArgs& args, void*) {
  clm_emu::launch(emu(grid), kCopyThreads, &copy_pages_kernel, args);
  return 0;
}

int decode_blocks_per_sm(int, int, int, int* blocks) {
  *blocks = 2;
  return 0;
}

}  // namespace clm::cuda::detail
