// cuda/kernels/launch.hpp: the kernel launches of kernels.cu, callable from plain C++
// (cuda_kernels.cpp). Each returns a cudaError_t as an int (0: launched), or
// -1 when no kernel instance matches (the host checks prevent that).
#pragma once

#include "kernels/kernel_args.hpp"

namespace clm::cuda::detail {

int launch_decode(int dtype, int head_dim, int heads_per_block, Dims grid, const DecodeArgs& args, void* stream);
int launch_merge(int head_dim, Dims grid, const MergeArgs& args, void* stream);
int launch_prefill(int dtype, int head_dim, Dims grid, const PrefillArgs& args, void* stream);
int launch_write_kv(int dtype, Dims grid, const WriteKvArgs& args, void* stream);
int launch_copy(Dims grid, const CopyArgs& args, void* stream);

// Resident decode blocks per SM for one kernel instance (for split-K planning).
int decode_blocks_per_sm(int dtype, int head_dim, int heads_per_block, int* blocks);

}  // namespace clm::cuda::detail
