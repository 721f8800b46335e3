// The CLM model-side kernels (clm_kernels.cuh) and their launches; the host
// side is cuda_clm.cpp.
#include "clm_kernels.cuh"
#include "clm_launch.hpp"

namespace clm::cuda::detail {

namespace {
dim3 clm_dim3(Dims d) { return dim3(d.x, d.y, d.z); }
cudaStream_t clm_stream(void* stream) { return static_cast<cudaStream_t>(stream); }
}  // namespace

int launch_masked_mean(int dtype, bool vec, Dims grid, const MaskedMeanArgs& args, void* stream) {
  return with_masked_mean_kernel(dtype, vec, [&](MaskedMeanKernel kernel) {
    kernel<<<clm_dim3(grid), kMeanThreads, 0, clm_stream(stream)>>>(args);
    return static_cast<int>(cudaGetLastError());
  });
}

int launch_running_sum(int dtype, Dims grid, const RunningSumArgs& args, void* stream) {
  return with_running_sum_kernel(dtype, [&](RunningSumKernel kernel) {
    kernel<<<clm_dim3(grid), kMeanThreads, 0, clm_stream(stream)>>>(args);
    return static_cast<int>(cudaGetLastError());
  });
}

int launch_head_finish(bool gelu_erf, Dims grid, const HeadFinishArgs& args, void* stream) {
  return with_head_finish_kernel(gelu_erf ? 1 : 0, [&](HeadFinishKernel kernel) {
    kernel<<<clm_dim3(grid), kHeadThreads, 0, clm_stream(stream)>>>(args);
    return static_cast<int>(cudaGetLastError());
  });
}

int launch_adapter_add(int dtype, bool vec, Dims grid, const AdapterAddArgs& args, void* stream) {
  return with_adapter_add_kernel(dtype, vec, [&](AdapterAddKernel kernel) {
    kernel<<<clm_dim3(grid), kAddThreads, 0, clm_stream(stream)>>>(args);
    return static_cast<int>(cudaGetLastError());
  });
}

int launch_adapter_check(Dims grid, const AdapterCheckArgs& args, void* stream) {
  adapter_check_kernel<<<clm_dim3(grid), kAddThreads, 0, clm_stream(stream)>>>(args);
  return static_cast<int>(cudaGetLastError());
}

}  // namespace clm::cuda::detail
