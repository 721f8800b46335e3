// examples/tiny_llama/cuda/llama_launch.hpp: the launches of the CUDA
// decoder's own kernels, callable from plain C++ (cuda_llama_model.cpp).
// Each returns a cudaError_t as an int (0: launched). llama_kernels.cu
// implements them with CUDA launches; tests/gpu/emulated_llama_launch.cpp
// with the CPU emulator, so that the same kernel source runs without a GPU.
//
//   const int err = launch_rms_norm(Dims{rows, 1, 1}, RmsNormArgs{x, w, h, hidden, eps}, stream);
#pragma once

#include "llama_kernel_args.hpp"

namespace tiny_llama::cuda_detail {

int launch_embed(Dims grid, const EmbedArgs& args, void* stream);
int launch_rms_norm(Dims grid, const RmsNormArgs& args, void* stream);
int launch_split_qkv(Dims grid, const SplitQkvArgs& args, void* stream);
int launch_copy_rows(Dims grid, const CopyRowsArgs& args, void* stream);
int launch_silu_mul(Dims grid, const SiluMulArgs& args, void* stream);
int launch_add(Dims grid, const AddArgs& args, void* stream);

}  // namespace tiny_llama::cuda_detail
