// cuda/model/clm_launch.hpp implemented with the CPU emulator (cuda_emu.hpp) instead
// of CUDA launches: with fake_cudart.cpp and fake_cublas.cpp this runs the CLM
// public API (cuda/model/cuda_*.cpp) end to end without a GPU, for
// test_cuda_clm_emulated. Launches complete before they return.
#include "cuda_emu.hpp"  // first: the kernels compile over it

#include "model/clm_kernels.cuh"
#include "model/clm_launch.hpp"

namespace clm::cuda::detail {

namespace {
clm_emu::Dim emu(Dims d) { return clm_emu::Dim{d.x, d.y, d.z}; }
}  // namespace

int launch_masked_mean(int dtype, bool vec, Dims grid, const MaskedMeanArgs& args, void*) {
  return with_masked_mean_kernel(dtype, vec, [&](MaskedMeanKernel kernel) {
    clm_emu::launch(emu(grid), kMeanThreads, kernel, args);
    return 0;
  });
}

int launch_running_sum(int dtype, Dims grid, const RunningSumArgs& args, void*) {
  return with_running_sum_kernel(dtype, [&](RunningSumKernel kernel) {
    clm_emu::launch(emu(grid), kMeanThreads, kernel, args);
    return 0;
  });
}

int launch_head_finish(bool gelu_erf, Dims grid, const HeadFinishArgs& args, void*) {
  return with_head_finish_kernel(gelu_erf ? 1 : 0, [&](HeadFinishKernel kernel) {
    clm_emu::launch(emu(grid), kHeadThreads, kernel, args);
    return 0;
  });
}

int launch_adapter_add(int dtype, bool vec, Dims grid, const AdapterAddArgs& args, void*) {
  return with_adapter_add_kernel(dtype, vec, [&](AdapterAddKernel kernel) {
    clm_emu::launch(emu(grid), kAddThreads, kernel, args);
    return 0;
  });
}

int launch_adapter_check(Dims grid, const AdapterCheckArgs& args, void*) {
  clm_emu::launch(emu(grid), kAddThreads, &adapter_check_kernel, args);
  return 0;
}

}  // namespace clm::cuda::detail
