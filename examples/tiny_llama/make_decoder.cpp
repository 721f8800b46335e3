// examples/tiny_llama/make_decoder.cpp: the decoder for where the engine's
// pool lives. On its own, apart from decoder.cpp, because it is the one place
// that names the CUDA decoder: the emulated GPU test compiles it over a fake
// CUDA runtime (tests/CMakeLists.txt).
#include "decoder.hpp"
#include "llama_model.hpp"
#if TINY_LLAMA_HAVE_CUDA
#include "cuda/cuda_llama_model.hpp"
#endif

namespace tiny_llama {

bool cuda_decoder_built() { return TINY_LLAMA_HAVE_CUDA != 0; }

clm::Status make_decoder(const LlamaConfig& config, LlamaWeights weights, clm::Engine& engine,
                         const ModelOptions& options, std::unique_ptr<Decoder>& out) {
  switch (engine.pool().config().memory) {
    case clm::MemoryKind::host: {
      std::unique_ptr<LlamaModel> model;
      CLM_RETURN_IF_ERROR(LlamaModel::create(config, std::move(weights), engine, options, model));
      out = std::move(model);
      return {};
    }
    case clm::MemoryKind::device: {
#if TINY_LLAMA_HAVE_CUDA
      std::unique_ptr<CudaLlamaModel> model;
      CLM_RETURN_IF_ERROR(CudaLlamaModel::create(config, std::move(weights), engine, options, model));
      out = std::move(model);
      return {};
#else
      return clm::unsupported(
          "tiny_llama: the engine's pool is device memory, but the CUDA decoder was not built (clmcache was "
          "configured without CUDA)");
#endif
    }
    case clm::MemoryKind::none:
      break;
  }
  return clm::unsupported(
      "tiny_llama: the engine's pool keeps no KV bytes (MemoryKind::none); a decoder needs host or device memory");
}

}  // namespace tiny_llama
