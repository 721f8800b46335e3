// cuda/model/clm_launch.hpp: the launches of the CLM kernels (cuda/model/clm_kernels.cu),
// callable from plain C++ (cuda_clm.cpp, cuda_src_sums.cpp, cuda_snapshot_adapter.cpp).
// Each returns a cudaError_t as an int (0: launched), or -1 when no kernel
// instance matches (the host checks prevent that).
// tests/gpu/emulated_clm_launch.cpp implements the same functions over the CPU
// emulator.
#pragma once

#include "model/clm_args.hpp"

namespace clm::cuda::detail {

int launch_masked_mean(int dtype, bool vec, Dims grid, const MaskedMeanArgs& args, void* stream);
int launch_running_sum(int dtype, Dims grid, const RunningSumArgs& args, void* stream);
int launch_head_finish(bool gelu_erf, Dims grid, const HeadFinishArgs& args, void* stream);
int launch_adapter_add(int dtype, bool vec, Dims grid, const AdapterAddArgs& args, void* stream);
int launch_adapter_check(Dims grid, const AdapterCheckArgs& args, void* stream);

}  // namespace clm::cuda::detail
