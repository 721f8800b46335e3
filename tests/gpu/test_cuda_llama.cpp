// The CUDA decoder of examples/tiny_llama (cuda/cuda_llama_model.hpp) on a
// GPU: its logits against the CPU LlamaModel on the same weights and
// teacher-forced ragged batches (prefill, chunked prefill and decode rows
// mixed, decode rows not first); the equality proof on the device (multi-turn
// conversations through the Generator with prefix reuse against a full
// recompute with no cache, relative error <= 1e-5 per step's logits, page
// sizes 1 and 16, two tenants, evictions; and that it can fail: corrupted
// cached pages change the logits); the observer's slow path (hooks
// see and change the same rows as on the CPU); and bad input (bad batches
// refused with nothing written to the pool, pools in the wrong memory, head
// sizes the CUDA attention lacks, make_decoder's choice). The engine's
// invariants are checked after every request. Without a usable CUDA device
// the GPU cases print "SKIPPED (no usable CUDA device: ...)" (ctest reports
// them skipped).
//
// The same file is built as test_cuda_llama_emulated over the fake CUDA
// runtime (fake_cudart.cpp), the test-only fake cuBLAS (fake_cublas.cpp) and
// the CPU emulator running the real kernel source (the library's attention
// through emulated_launch.cpp, the decoder's own kernels through
// emulated_llama_launch.cpp), with small shapes (CLM_TEST_EMULATED_GPU).
#include <catch2/catch.hpp>

#include <cuda_runtime_api.h>

#include <cstring>
#include <random>
#include <vector>

#include "cuda/cuda_llama_model.hpp"
#include "gpu_test_support.hpp"
#include "llama_model.hpp"
#include "test_support.hpp"  // fresh_seed
#include "tiny_llama_test_support.hpp"

namespace {

using clm_test::kFull;
using clm_test::skip_without_gpu;
using tiny_llama::ForwardBatch;
using tiny_llama::GenerateOptions;
using tiny_llama::LlamaConfig;
using tiny_llama::LlamaWeights;
using tiny_llama_test::engine_config;
using tiny_llama_test::make_stack;
using tiny_llama_test::random_text;
using tiny_llama_test::relative_error;
using tiny_llama_test::Stack;

// head_dim 64 (the smallest the CUDA attention has) with GQA 2; on the
// emulator 2 layers of hidden 128, on a GPU 4 layers of hidden 512.
LlamaConfig cuda_config() {
  LlamaConfig c;
  c.vocab_size = 300;
  c.hidden = kFull ? 512 : 128;
  c.intermediate = kFull ? 1408 : 256;
  c.num_layers = kFull ? 4 : 2;
  c.num_heads = kFull ? 8 : 2;
  c.num_kv_heads = kFull ? 4 : 1;
  c.head_dim = 64;
  c.max_position = 2048;
  return c;
}

clm::EngineConfig device_engine(const LlamaConfig& c, std::int32_t page_size, std::int32_t pool_tokens) {
  clm::EngineConfig e = engine_config(c, page_size, pool_tokens);
  e.pool.memory = clm::MemoryKind::device;
  return e;
}

// The whole device pool's bytes, on the host.
std::vector<unsigned char> pool_bytes(const clm::Engine& engine) {
  const clm::PagedKvPool& pool = engine.pool();
  std::vector<unsigned char> bytes(pool.storage_bytes());
  CLM_CUDA_OK(cudaMemcpy(bytes.data(), pool.data(), bytes.size(), cudaMemcpyDeviceToHost));
  return bytes;
}

// Two engines (host pool + CPU decoder, device pool + CUDA decoder) fed the
// same sequences step by step: what a caller's own scheduling looks like.
struct Pair {
  Stack cpu, gpu;
  std::vector<clm::SequenceId> cpu_ids, gpu_ids;
  std::vector<std::int32_t> lengths;  // tokens whose K/V are in the pool
};

// A batch entry: sequence `index` of the pair (admitted with `tokens` when it
// has no id yet, else extended by them).
struct Part {
  std::size_t index;
  std::vector<std::int32_t> tokens;
};

// Runs one forward of `parts` on both decoders; returns the worst relative
// error between their logits, sequence by sequence (and the CUDA decoder's
// logits in gpu_logits when given).
double step_both(Pair& p, const std::vector<Part>& parts, std::vector<float>* gpu_logits = nullptr) {
  const auto vocab = static_cast<std::size_t>(p.cpu.model->config().vocab_size);
  double worst = 0.0;
  std::vector<std::vector<float>> logits;
  for (Stack* s : {&p.cpu, &p.gpu}) {
    std::vector<clm::SequenceId>& ids = s == &p.cpu ? p.cpu_ids : p.gpu_ids;
    ForwardBatch batch;
    for (const Part& part : parts) {
      if (ids.size() <= part.index) ids.resize(part.index + 1, 0);
      if (p.lengths.size() <= part.index) p.lengths.resize(part.index + 1, 0);
      if (ids[part.index] == 0) {
        clm::Admission a;
        REQUIRE_OK(s->engine->admit(part.tokens, {}, a));
        REQUIRE(a.cached_tokens == 0);
        ids[part.index] = a.seq;
        batch.add(a.seq, part.tokens, 0, a.slots, a.page_table);
      } else {
        std::vector<std::int64_t> slots;
        std::vector<std::int32_t> table;
        REQUIRE_OK(s->engine->extend(ids[part.index], part.tokens, slots, &table));
        batch.add(ids[part.index], part.tokens, p.lengths[part.index], slots, table);
      }
    }
    logits.emplace_back(parts.size() * vocab, -1.0f);
    REQUIRE_OK(s->model->forward(batch, logits.back()));
  }
  for (const Part& part : parts) p.lengths[part.index] += static_cast<std::int32_t>(part.tokens.size());
  if (gpu_logits) *gpu_logits = logits[1];
  for (std::size_t i = 0; i < parts.size(); ++i) {
    worst = std::max(worst, relative_error(std::span(logits[1]).subspan(i * vocab, vocab),
                                           std::span(logits[0]).subspan(i * vocab, vocab)));
  }
  return worst;
}

void finish_all(Pair& p) {
  for (Stack* s : {&p.cpu, &p.gpu}) {
    for (clm::SequenceId id : s == &p.cpu ? p.cpu_ids : p.gpu_ids) REQUIRE_OK(s->engine->finish(id));
    REQUIRE_OK(s->engine->check_invariants());
  }
}

// Teacher-forced ragged batches: prefills of several lengths (one of a single
// row, which takes the decode path), a chunked prefill onto a sequence's
// earlier rows, decode rows placed after prefill rows (the CUDA decoder
// gathers them), then decode steps.
double compare_with_cpu(Pair& p, std::mt19937& rng, int decode_steps) {
  double worst = 0.0;
  std::uniform_int_distribution<int> token(0, 255);
  worst = std::max(worst, step_both(p, {{0, random_text(rng, 30, 70)}, {1, {7}}}));
  worst = std::max(worst, step_both(p, {{2, random_text(rng, 10, 40)},
                                        {0, {token(rng)}},
                                        {1, random_text(rng, 5, 20)},
                                        {3, random_text(rng, 2, 2)}}));
  for (int step = 0; step < decode_steps; ++step) {
    std::vector<Part> parts;
    for (std::size_t i = 0; i < 4; ++i) parts.push_back({i, {token(rng)}});
    worst = std::max(worst, step_both(p, parts));
  }
  finish_all(p);
  return worst;
}

// Records the rows each hook sees and changes the residual stream (a
// row- and layer-dependent shift), so that the CPU and CUDA decoders can be
// compared on both.
class ShiftingObserver final : public tiny_llama::LayerObserver {
 public:
  std::vector<float> attention_outputs, final_hidden;

  clm::Status on_attention_output(std::int32_t, const ForwardBatch& batch, const float* rows) override {
    const std::size_t n = static_cast<std::size_t>(batch.rows()) * hidden_;
    attention_outputs.insert(attention_outputs.end(), rows, rows + n);
    return {};
  }
  clm::Status after_layer(std::int32_t layer, const ForwardBatch& batch, float* hidden) override {
    for (std::int32_t r = 0; r < batch.rows(); ++r) {
      for (std::int32_t i = 0; i < hidden_; i += 7) {
        hidden[static_cast<std::size_t>(r) * hidden_ + i] += 0.25f * static_cast<float>((r + layer + i) % 5 - 2);
      }
    }
    return {};
  }
  clm::Status on_final_hidden(const ForwardBatch& batch, const float* last_rows) override {
    final_hidden.assign(last_rows, last_rows + batch.size() * static_cast<std::size_t>(hidden_));
    return {};
  }
  explicit ShiftingObserver(std::int32_t hidden) : hidden_(hidden) {}

 private:
  std::int32_t hidden_;
};

// The equality proof on the device: conversations of two tenants, turn after
// turn, through the Generator with prefix reuse in a pool small enough that
// later turns evict earlier ones' pages, against a full recompute with no
// cache; every step's logits within 1e-5 (run_conversations). The emulator
// runs every thread of the attention kernels as a fiber, so its
// conversations are short: 4 of 2 turns over a 20-30 token system prompt.
void device_equality(std::int32_t page_size) {
  const std::uint32_t seed = clm_test::fresh_seed();
  INFO("seed " << seed << ", page size " << page_size);
  const LlamaConfig c = cuda_config();
  LlamaWeights w;
  tiny_llama::random_llama_weights(c, seed, w);
  std::mt19937 rng(seed ^ 0xc0da);
  const auto system_prompt = random_text(rng, kFull ? 100 : 20, kFull ? 160 : 30);
  Stack cached = make_stack(c, w, device_engine(c, page_size, kFull ? 1024 : 320));
  Stack baseline = make_stack(c, w, device_engine(c, page_size, 8192));
  const tiny_llama_test::EqualityRun run = tiny_llama_test::run_conversations(
      cached, baseline, seed + static_cast<std::uint32_t>(page_size), 2, kFull ? 8 : 4, kFull ? 4 : 2, system_prompt);
  std::cout << "device equality, page size " << page_size << ": worst relative error " << run.worst_error << ", "
            << run.cached_tokens << " of " << run.prompt_tokens << " prompt tokens cached, "
            << cached.engine->metrics().cache.evicted_tokens << " evicted\n";
  // Reuse happened (about a fifth to two fifths of the prompts on the
  // emulator's short conversations, where evictions take a large share).
  CHECK(run.cached_tokens > run.prompt_tokens / 8);
  CHECK(cached.engine->metrics().cache.evicted_tokens > 0);  // and so did evictions
  REQUIRE_OK(cached.engine->check_invariants());
}

}  // namespace

TEST_CASE("the CUDA decoder's logits match the CPU decoder's on ragged batches", "[cuda_llama]") {
  if (skip_without_gpu()) return;
  const std::uint32_t seed = clm_test::fresh_seed();
  INFO("seed " << seed);
  const LlamaConfig c = cuda_config();
  LlamaWeights w;
  tiny_llama::random_llama_weights(c, seed, w);
  for (const std::int32_t page_size : {1, 16}) {
    INFO("page size " << page_size);
    Pair p{make_stack(c, w, engine_config(c, page_size, 4096)),
           make_stack(c, w, device_engine(c, page_size, 4096)),
           {},
           {},
           {}};
    REQUIRE(dynamic_cast<tiny_llama::CudaLlamaModel*>(p.gpu.model.get()) != nullptr);
    std::mt19937 rng(seed + static_cast<std::uint32_t>(page_size));
    const double worst = compare_with_cpu(p, rng, kFull ? 12 : 4);
    // Both are f32 implementations of the same arithmetic in different
    // orders (GEMM blocking, attention tiles and softmax rescaling); each is
    // within 1e-4 of a float64 reference (test_tiny_llama), so they agree to
    // that bound. Seen: ~1e-6.
    std::cout << "CUDA vs CPU decoder, page size " << page_size << ": worst relative error " << worst << "\n";
    CHECK(worst <= 1e-4);
  }
}

TEST_CASE("the CUDA decoder with a head_dim 128 model matches the CPU decoder", "[cuda_llama]") {
  if (skip_without_gpu()) return;
  if (!kFull) return;  // the emulator covers head_dim 64: the same host code, one more kernel instance
  const std::uint32_t seed = clm_test::fresh_seed();
  INFO("seed " << seed);
  LlamaConfig c = cuda_config();
  c.head_dim = 128;
  c.num_heads = 4;
  LlamaWeights w;
  tiny_llama::random_llama_weights(c, seed, w);
  Pair p{make_stack(c, w, engine_config(c, 16, 4096)), make_stack(c, w, device_engine(c, 16, 4096)), {}, {}, {}};
  std::mt19937 rng(seed);
  CHECK(compare_with_cpu(p, rng, 8) <= 1e-4);
}

TEST_CASE("prefix reuse on the device never changes the logits: page size 1, two tenants, evictions",
          "[cuda_llama][equality]") {
  if (skip_without_gpu()) return;
  device_equality(1);
}

TEST_CASE("prefix reuse on the device never changes the logits: page size 16, two tenants, evictions",
          "[cuda_llama][equality]") {
  if (skip_without_gpu()) return;
  device_equality(16);
}

TEST_CASE("the device equality check can fail: corrupted cached K/V pages change the logits",
          "[cuda_llama][equality]") {
  if (skip_without_gpu()) return;
  const std::uint32_t seed = clm_test::fresh_seed();
  INFO("seed " << seed);
  const LlamaConfig c = cuda_config();
  LlamaWeights w;
  tiny_llama::random_llama_weights(c, seed, w);
  Stack cached = make_stack(c, w, device_engine(c, 16, 1024));
  Stack baseline = make_stack(c, w, device_engine(c, 16, 1024));
  std::mt19937 rng(seed);
  const auto prompt = random_text(rng, 64, 64);
  GenerateOptions o;
  o.max_new_tokens = 2;
  o.keep_logits = true;
  tiny_llama_test::generate(cached, {prompt}, {o});
  // The prompt's pages are cached on the device now: negate layer 0's K and V
  // in every page (K, then V, at the start of each page).
  const clm::PagedKvPool& pool = cached.engine->pool();
  std::vector<unsigned char> bytes = pool_bytes(*cached.engine);
  for (std::int32_t page = 0; page < pool.num_pages(); ++page) {
    auto* kv = reinterpret_cast<float*>(bytes.data() + static_cast<std::size_t>(page) * pool.page_bytes());
    for (std::size_t i = 0; i < pool.layer_bytes() / sizeof(float); ++i) kv[i] = -kv[i];
  }
  CLM_CUDA_OK(cudaMemcpy(pool.data(), bytes.data(), bytes.size(), cudaMemcpyHostToDevice));
  auto longer = prompt;
  longer.push_back(7);
  const auto reused = tiny_llama_test::generate(cached, {longer}, {o});
  REQUIRE(reused[0].cached_tokens > 0);
  GenerateOptions off = o;
  off.use_cache = false;
  const auto recomputed = tiny_llama_test::generate(baseline, {longer}, {off});
  const auto vocab = static_cast<std::size_t>(c.vocab_size);
  CHECK(relative_error(std::span(reused[0].logits).first(vocab), std::span(recomputed[0].logits).first(vocab)) > 1e-3);
}

TEST_CASE("the observer's slow path: hooks see and change the same rows as on the CPU", "[cuda_llama]") {
  if (skip_without_gpu()) return;
  const std::uint32_t seed = clm_test::fresh_seed();
  INFO("seed " << seed);
  const LlamaConfig c = cuda_config();
  LlamaWeights w;
  tiny_llama::random_llama_weights(c, seed, w);
  Pair p{make_stack(c, w, engine_config(c, 16, 4096)), make_stack(c, w, device_engine(c, 16, 4096)), {}, {}, {}};
  ShiftingObserver cpu_spy(c.hidden), gpu_spy(c.hidden);
  p.cpu.model->set_observer(&cpu_spy);
  p.gpu.model->set_observer(&gpu_spy);
  std::mt19937 rng(seed);
  const std::vector<Part> parts{{0, random_text(rng, 20, 40)}, {1, {3}}};
  std::vector<float> observed;
  CHECK(step_both(p, parts, &observed) <= 1e-4);
  REQUIRE(gpu_spy.attention_outputs.size() == cpu_spy.attention_outputs.size());
  CHECK(relative_error(gpu_spy.attention_outputs, cpu_spy.attention_outputs) <= 1e-4);
  REQUIRE(gpu_spy.final_hidden.size() == 2 * static_cast<std::size_t>(c.hidden));
  REQUIRE(gpu_spy.final_hidden.size() == cpu_spy.final_hidden.size());
  CHECK(relative_error(gpu_spy.final_hidden, cpu_spy.final_hidden) <= 1e-4);
  finish_all(p);
  // The shifts reached the device: without the observer the logits differ.
  Pair plain{make_stack(c, w, engine_config(c, 16, 4096)), make_stack(c, w, device_engine(c, 16, 4096)), {}, {}, {}};
  std::vector<float> unobserved;
  CHECK(step_both(plain, parts, &unobserved) <= 1e-4);
  CHECK(relative_error(observed, unobserved) > 1e-3);
  finish_all(plain);
}

TEST_CASE("bad input without a device: pools in the wrong memory, head sizes, make_decoder's choice", "[cuda_llama]") {
  const LlamaConfig c = cuda_config();
  LlamaWeights w;
  tiny_llama::random_llama_weights(c, 5, w);
  std::unique_ptr<clm::Engine> host_engine;
  REQUIRE_OK(clm::Engine::create(engine_config(c, 16, 1024), host_engine));
  std::unique_ptr<tiny_llama::CudaLlamaModel> cuda_model;
  // A host pool where the CUDA decoder needs a device one.
  REQUIRE_ERROR(tiny_llama::CudaLlamaModel::create(c, w, *host_engine, {}, cuda_model), clm::StatusCode::unsupported,
                "MemoryKind::device");
  CHECK(cuda_model == nullptr);
  // A head size the CUDA attention does not have.
  LlamaConfig odd = c;
  odd.head_dim = 32;
  odd.num_heads = 4;
  odd.num_kv_heads = 2;
  LlamaWeights odd_weights;
  tiny_llama::random_llama_weights(odd, 5, odd_weights);
  std::unique_ptr<clm::Engine> odd_engine;
  REQUIRE_OK(clm::Engine::create(engine_config(odd, 16, 1024), odd_engine));
  REQUIRE_ERROR(tiny_llama::CudaLlamaModel::create(odd, odd_weights, *odd_engine, {}, cuda_model),
                clm::StatusCode::unsupported, "head_dim 64 and 128");
  // The pool's shape and the weights are checked as the CPU decoder checks them.
  clm::EngineConfig wrong_shape = engine_config(c, 16, 1024);
  wrong_shape.pool.num_layers = c.num_layers + 1;
  std::unique_ptr<clm::Engine> wrong_engine;
  REQUIRE_OK(clm::Engine::create(wrong_shape, wrong_engine));
  REQUIRE_ERROR(tiny_llama::CudaLlamaModel::create(c, w, *wrong_engine, {}, cuda_model),
                clm::StatusCode::invalid_argument, "layers");
  LlamaWeights short_weights = w;
  short_weights.layers[1].w_up.pop_back();
  REQUIRE_ERROR(tiny_llama::CudaLlamaModel::create(c, short_weights, *host_engine, {}, cuda_model),
                clm::StatusCode::invalid_argument, "up_proj");
  // make_decoder: a host pool gets the CPU decoder; a pool without bytes nothing.
  std::unique_ptr<tiny_llama::Decoder> decoder;
  REQUIRE_OK(tiny_llama::make_decoder(c, w, *host_engine, {.threads = 1}, decoder));
  CHECK(dynamic_cast<tiny_llama::LlamaModel*>(decoder.get()) != nullptr);
  clm::EngineConfig no_bytes = engine_config(c, 16, 1024);
  no_bytes.pool.memory = clm::MemoryKind::none;
  std::unique_ptr<clm::Engine> none_engine;
  REQUIRE_OK(clm::Engine::create(no_bytes, none_engine));
  decoder.reset();
  REQUIRE_ERROR(tiny_llama::make_decoder(c, w, *none_engine, {}, decoder), clm::StatusCode::unsupported,
                "MemoryKind::none");
  CHECK(decoder == nullptr);
  CHECK(tiny_llama::cuda_decoder_built());
}

TEST_CASE("bad input on the device: malformed batches are refused and write nothing", "[cuda_llama]") {
  if (skip_without_gpu()) return;
  const LlamaConfig c = cuda_config();
  LlamaWeights w;
  tiny_llama::random_llama_weights(c, 9, w);
  Stack s = make_stack(c, w, device_engine(c, 16, 1024));
  // make_decoder picked the CUDA decoder; the CPU one refuses the device pool.
  REQUIRE(dynamic_cast<tiny_llama::CudaLlamaModel*>(s.model.get()) != nullptr);
  std::unique_ptr<tiny_llama::LlamaModel> cpu_model;
  REQUIRE_ERROR(tiny_llama::LlamaModel::create(c, w, *s.engine, {}, cpu_model), clm::StatusCode::unsupported,
                "host pool");
  // Something in the pool first, so that "nothing written" means something.
  GenerateOptions two_tokens;
  two_tokens.max_new_tokens = 2;
  const auto first =
      tiny_llama_test::generate(s, {{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17}}, {two_tokens});
  REQUIRE(first[0].tokens.size() == 2);
  const std::vector<unsigned char> before = pool_bytes(*s.engine);
  clm::Admission a;
  const std::vector<std::int32_t> prompt{1, 2, 3, 4};
  REQUIRE_OK(s.engine->admit(prompt, {.cache_salt = "another"}, a));
  std::vector<float> logits(static_cast<std::size_t>(c.vocab_size), 0.0f);
  const auto refused = [&](const ForwardBatch& b, std::span<float> out, const char* part) {
    REQUIRE_ERROR(s.model->forward(b, out), clm::StatusCode::invalid_argument, part);
    CHECK(pool_bytes(*s.engine) == before);
  };
  ForwardBatch b;
  b.add(a.seq, prompt, 0, a.slots, a.page_table);
  b.tokens[1] = c.vocab_size;
  refused(b, logits, "vocabulary");
  b = {};
  b.add(a.seq, prompt, c.max_position - 2, a.slots, a.page_table);
  refused(b, logits, "context");
  b = {};
  b.add(a.seq, prompt, 0, a.slots, std::span(a.page_table).first(0));
  refused(b, logits, "pages");
  b = {};
  b.add(a.seq, prompt, 0, a.slots, a.page_table);
  b.page_indices[0] = s.engine->pool().num_pages();
  refused(b, logits, "page id");
  b = {};
  b.add(a.seq, prompt, 0, a.slots, a.page_table);
  b.slots[2] = -1;
  refused(b, logits, "slot");
  b = {};
  b.add(a.seq, prompt, 0, a.slots, a.page_table);
  std::vector<float> short_logits(3);
  refused(b, short_logits, "logits");
  // Two rows into one slot: the CUDA write_kv refuses it before any layer runs.
  b = {};
  b.add(a.seq, prompt, 0, a.slots, a.page_table);
  b.slots[3] = b.slots[2];
  REQUIRE(s.model->forward(b, logits).code() == clm::StatusCode::invalid_argument);
  CHECK(pool_bytes(*s.engine) == before);
  CHECK(std::all_of(logits.begin(), logits.end(), [](float v) { return v == 0.0f; }));
  // The decoder still serves.
  b = {};
  b.add(a.seq, prompt, 0, a.slots, a.page_table);
  REQUIRE_OK(s.model->forward(b, logits));
  REQUIRE_OK(s.engine->abort(a.seq));
  REQUIRE_OK(s.engine->check_invariants());
}
