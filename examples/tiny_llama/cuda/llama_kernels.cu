// examples/tiny_llama/cuda/llama_kernels.cu: the CUDA decoder's kernels
// (llama_kernels.cuh) and their launches (llama_launch.hpp); the host side is
// cuda_llama_model.cpp.
#include "llama_kernels.cuh"
#include "llama_launch.hpp"

namespace tiny_llama::cuda_detail {

namespace {
dim3 as_dim3(Dims d) { return dim3(d.x, d.y, d.z); }
cudaStream_t as_stream(void* stream) { return static_cast<cudaStream_t>(stream); }
}  // namespace

int launch_embed(Dims grid, const EmbedArgs& args, void* stream) {
  embed_kernel<<<as_dim3(grid), kRowThreads, 0, as_stream(stream)>>>(args);
  return static_cast<int>(cudaGetLastError());
}

int launch_rms_norm(Dims grid, const RmsNormArgs& args, void* stream) {
  rms_norm_kernel<<<as_dim3(grid), kRowThreads, 0, as_stream(stream)>>>(args);
  return static_cast<int>(cudaGetLastError());
}

int launch_split_qkv(Dims grid, const SplitQkvArgs& args, void* stream) {
  split_qkv_kernel<<<as_dim3(grid), kRowThreads, 0, as_stream(stream)>>>(args);
  return static_cast<int>(cudaGetLastError());
}

int launch_copy_rows(Dims grid, const CopyRowsArgs& args, void* stream) {
  copy_rows_kernel<<<as_dim3(grid), kRowThreads, 0, as_stream(stream)>>>(args);
  return static_cast<int>(cudaGetLastError());
}

int launch_silu_mul(Dims grid, const SiluMulArgs& args, void* stream) {
  silu_mul_kernel<<<as_dim3(grid), kElementwiseThreads, 0, as_stream(stream)>>>(args);
  return static_cast<int>(cudaGetLastError());
}

int launch_add(Dims grid, const AddArgs& args, void* stream) {
  add_kernel<<<as_dim3(grid), kElementwiseThreads, 0, as_stream(stream)>>>(args);
  return static_cast<int>(cudaGetLastError());
}

}  // namespace tiny_llama::cuda_detail
