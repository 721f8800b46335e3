// examples/tiny_llama/cuda/llama_launch.hpp implemented with the CPU emulator
// (cuda_emu.hpp) instead of CUDA launches: with fake_cudart.cpp,
// fake_cublas.cpp and the library's kernels (emulated_launch.cpp), this runs
// the CUDA decoder (cuda_llama_model.cpp) end to end without a GPU, for
// test_cuda_llama_emulated. Launches complete before they return.
#include "cuda_emu.hpp"  // first: the kernels compile over it

#include "cuda/llama_kernels.cuh"
#include "cuda/llama_launch.hpp"

namespace tiny_llama::cuda_detail {

namespace {
clm_emu::Dim emu(Dims d) { return clm_emu::Dim{d.x, d.y, d.z}; }
}  // namespace

int launch_embed(Dims grid, const EmbedArgs& args, void*) {
  clm_emu::launch(emu(grid), kRowThreads, &embed_kernel, args);
  return 0;
}

int launch_rms_norm(Dims grid, const RmsNormArgs& args, void*) {
  clm_emu::launch(emu(grid), kRowThreads, &rms_norm_kernel, args);
  return 0;
}

int launch_split_qkv(Dims grid, const SplitQkvArgs& args, void*) {
  clm_emu::launch(emu(grid), kRowThreads, &split_qkv_kernel, args);
  return 0;
}

int launch_copy_rows(Dims grid, const CopyRowsArgs& args, void*) {
  clm_emu::launch(emu(grid), kRowThreads, &copy_rows_kernel, args);
  return 0;
}

int launch_silu_mul(Dims grid, const SiluMulArgs& args, void*) {
  clm_emu::launch(emu(grid), kElementwiseThreads, &silu_mul_kernel, args);
  return 0;
}

int launch_add(Dims grid, const AddArgs& args, void*) {
  clm_emu::launch(emu(grid), kElementwiseThreads, &add_kernel, args);
  return 0;
}

}  // namespace tiny_llama::cuda_detail
