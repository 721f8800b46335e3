// examples/tiny_llama/llama_model.cpp: the decoder's forward pass.
#include "llama_model.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <new>

#include <fmt/format.h>

#include "clm/kernels/attention.hpp"
#include "clm/kernels/dense_gemm.hpp"

namespace tiny_llama {

namespace {
using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }
}  // namespace

clm::Status LlamaModel::create(const LlamaConfig& config, LlamaWeights weights, clm::Engine& engine,
                               const ModelOptions& options, std::unique_ptr<LlamaModel>& out) {
  const clm::PagedKvPoolConfig& pool = engine.pool().config();
  CLM_RETURN_IF_ERROR(check_decoder_setup(config, weights, pool));
  if (pool.memory != clm::MemoryKind::host) {
    return clm::unsupported("tiny_llama: the CPU decoder needs a host pool (MemoryKind::host)");
  }
  // Rows past the context of every running sequence at once is a mistake, not a reservation.
  const std::int64_t most_rows = std::int64_t{config.max_position} * 1024;
  if (options.workspace_rows < 0 || options.workspace_rows > most_rows) {
    return clm::invalid_argument(
        fmt::format("tiny_llama: workspace_rows {} is outside [0, {}]", options.workspace_rows, most_rows));
  }
  try {
    out.reset(new LlamaModel(config, std::move(weights), engine, options));
  } catch (const std::bad_alloc&) {
    return clm::out_of_memory("tiny_llama: no host memory for the packed weights and the workspace");
  }
  return {};
}

LlamaModel::LlamaModel(const LlamaConfig& config, LlamaWeights weights, clm::Engine& engine,
                       const ModelOptions& options)
    : config_(config),
      weights_(std::move(weights)),
      engine_(engine),
      threads_(options.threads > 0 ? options.threads
                                   : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()))),
      workers_(threads_) {
  rope_table(config, rope_cos_, rope_sin_);
  // Every weight packed once for clm::gemm_nt (clm/kernels/dense_gemm.hpp), whose
  // rows then do not depend on the batch around them. q, k and v (and gate
  // and up) read the same normalised rows: one product over the stacked
  // weights instead of three (two). The packed copies replace the originals.
  const auto pack = [](std::initializer_list<std::vector<float>*> parts, std::int64_t k) {
    std::vector<float> stacked;
    for (std::vector<float>* w : parts) {
      stacked.insert(stacked.end(), w->begin(), w->end());
      std::vector<float>().swap(*w);
    }
    return clm::PackedWeight(stacked.data(), static_cast<std::int64_t>(stacked.size()) / k, k);
  };
  const std::int64_t h = config.hidden, inter = config.intermediate;
  for (LlamaLayerWeights& l : weights_.layers) {
    packed_.push_back({pack({&l.wq, &l.wk, &l.wv}, h), pack({&l.wo}, config.q_dim()), pack({&l.w_gate, &l.w_up}, h),
                       pack({&l.w_down}, inter)});
  }
  const std::vector<float>& output = weights_.output_matrix();
  lm_head_ = clm::PackedWeight(output.data(), config.vocab_size, h);
  std::vector<float>().swap(weights_.lm_head);  // empty when tied to embed, which stays
  reserve_rows(options.workspace_rows);
}

void LlamaModel::matmul(const float* a, std::int64_t m, const clm::PackedWeight& w, float* c) {
  const auto start = Clock::now();
  struct Account {
    double& seconds;
    Clock::time_point start;
    ~Account() { seconds += seconds_since(start); }
  } account{gemm_seconds_, start};
  const std::int64_t n = w.n();
  const int threads = workers_.threads();
  if (threads == 1 || m * n * w.k() < (1 << 18)) {
    clm::gemm_nt(a, m, w, c, n);
    return;
  }
  // Each thread takes whole panels of the weight (columns of c) and all of
  // a's rows: the weight is read once in all, and a's rows, the smaller
  // operand here, by every thread.
  const std::int64_t panels = (w.panels() + threads - 1) / threads;
  workers_.run(threads, [&](std::int64_t t) {
    const std::int64_t begin = t * panels * clm::PackedWeight::kPanel;
    const std::int64_t end = std::min(n, begin + panels * clm::PackedWeight::kPanel);
    if (begin < end) clm::gemm_nt(a, m, w, c, n, begin, end);
  });
}

void LlamaModel::for_rows(std::int64_t rows, const std::function<void(std::int64_t, std::int64_t)>& body) {
  // Below this many rows a row-wise pass takes about as long as waking a thread.
  constexpr std::int64_t kMinRowsPerThread = 8;
  const std::int64_t tasks = std::min<std::int64_t>(workers_.threads(), rows / kMinRowsPerThread);
  if (tasks <= 1) {
    body(0, rows);
    return;
  }
  const std::int64_t per_task = (rows + tasks - 1) / tasks;
  workers_.run(tasks, [&](std::int64_t t) {
    const std::int64_t begin = t * per_task, end = std::min(rows, begin + per_task);
    if (begin < end) body(begin, end);
  });
}

void LlamaModel::reserve_rows(std::int64_t rows) {
  if (rows <= reserved_rows_) return;
  const LlamaConfig& c = config_;
  const auto grow = [rows](std::vector<float>& v, std::int64_t width) {
    v.resize(static_cast<std::size_t>(rows * width));
  };
  for (std::vector<float>* v : {&x_, &h_, &o_}) grow(*v, c.hidden);
  for (std::vector<float>* v : {&q_, &attn_}) grow(*v, c.q_dim());
  for (std::vector<float>* v : {&k_, &v_}) grow(*v, c.kv_dim());
  grow(gate_, c.intermediate);
  grow(wide_, std::max<std::int64_t>(c.q_dim() + 2 * c.kv_dim(), 2 * std::int64_t{c.intermediate}));
  positions_.resize(static_cast<std::size_t>(rows));
  reserved_rows_ = rows;
}

void LlamaModel::rms_norm(const float* x, std::int64_t begin, std::int64_t end, const std::vector<float>& weight,
                          float* out) const {
  const std::int64_t h = config_.hidden;
  for (std::int64_t r = begin; r < end; ++r) {
    const float* in = x + r * h;
    double sum = 0.0;  // double: the norm of a row never depends on the batch around it
    for (std::int64_t i = 0; i < h; ++i) sum += double(in[i]) * in[i];
    const auto scale = static_cast<float>(1.0 / std::sqrt(sum / double(h) + config_.rms_norm_eps));
    for (std::int64_t i = 0; i < h; ++i) out[r * h + i] = in[i] * scale * weight[static_cast<std::size_t>(i)];
  }
}

void LlamaModel::rope_row(float* x, std::int32_t heads, std::int32_t position) const {
  const std::int32_t d = config_.head_dim, half = d / 2;
  const float* cos = rope_cos_.data() + static_cast<std::size_t>(position) * half;
  const float* sin = rope_sin_.data() + static_cast<std::size_t>(position) * half;
  for (std::int32_t head = 0; head < heads; ++head) {
    float* v = x + head * d;
    for (std::int32_t i = 0; i < half; ++i) {
      const float x1 = v[i], x2 = v[i + half];
      v[i] = x1 * cos[i] - x2 * sin[i];
      v[i + half] = x2 * cos[i] + x1 * sin[i];
    }
  }
}

clm::Status LlamaModel::attention(std::int32_t layer, const ForwardBatch& b, const float* q, float* out) {
  const clm::PagedKvView kv = clm::PagedKvView::of(engine_.pool());
  clm::AttentionParams params;
  params.layer = layer;
  params.num_q_heads = config_.num_heads;
  params.num_threads = threads_;
  const std::int64_t q_dim = config_.q_dim();
  const std::int32_t page_size = engine_.page_size();
  // Decode rows (one new token) go to one batched call; prefill rows one sequence at a time.
  clm::PagedBatch decode{{0}, {}, {}};
  std::vector<std::int32_t> decode_rows;
  for (std::size_t i = 0; i < b.ids.size(); ++i) {
    const std::int32_t row = b.indptr[i], rows = b.indptr[i + 1] - row;
    const std::int32_t kv_len = b.first_position[i] + rows;
    const auto pages = std::span(b.page_indices)
                           .subspan(static_cast<std::size_t>(b.page_indptr[i]),
                                    static_cast<std::size_t>(b.page_indptr[i + 1] - b.page_indptr[i]));
    if (rows == 1) {
      decode.indices.insert(decode.indices.end(), pages.begin(), pages.end());
      decode.indptr.push_back(static_cast<std::int32_t>(decode.indices.size()));
      decode.last_page_len.push_back(kv_len - (static_cast<std::int32_t>(pages.size()) - 1) * page_size);
      decode_rows.push_back(row);
      continue;
    }
    CLM_RETURN_IF_ERROR(
        clm::paged_prefill_attention(kv, params, q + row * q_dim, rows, pages, kv_len, out + row * q_dim));
  }
  if (decode_rows.empty()) return {};
  std::vector<float> dq(decode_rows.size() * static_cast<std::size_t>(q_dim)), dout(dq.size());
  for (std::size_t j = 0; j < decode_rows.size(); ++j) {
    std::memcpy(dq.data() + j * q_dim, q + decode_rows[j] * q_dim, static_cast<std::size_t>(q_dim) * sizeof(float));
  }
  CLM_RETURN_IF_ERROR(clm::paged_decode_attention(kv, params, dq.data(), decode.indptr, decode.indices,
                                                  decode.last_page_len, dout.data()));
  for (std::size_t j = 0; j < decode_rows.size(); ++j) {
    std::memcpy(out + decode_rows[j] * q_dim, dout.data() + j * q_dim, static_cast<std::size_t>(q_dim) * sizeof(float));
  }
  return {};
}

clm::Status LlamaModel::forward(const ForwardBatch& b, std::span<float> logits) {
  CLM_RETURN_IF_ERROR(check_forward_batch(config_, engine_.pool().config(), b, logits));
  const auto start = Clock::now();
  gemm_seconds_ = 0;
  double attention_seconds = 0;
  const LlamaConfig& c = config_;
  const std::int64_t rows = b.rows(), h = c.hidden, q_dim = c.q_dim(), kv_dim = c.kv_dim(), inter = c.intermediate;
  const auto n = static_cast<std::int64_t>(b.ids.size());
  reserve_rows(rows);
  for (std::int64_t i = 0; i < n; ++i) {
    for (std::int32_t r = b.indptr[static_cast<std::size_t>(i)]; r < b.indptr[static_cast<std::size_t>(i) + 1]; ++r) {
      positions_[static_cast<std::size_t>(r)] =
          b.first_position[static_cast<std::size_t>(i)] + (r - b.indptr[static_cast<std::size_t>(i)]);
    }
  }
  for (std::int64_t r = 0; r < rows; ++r) {
    std::memcpy(x_.data() + r * h, weights_.embed.data() + std::int64_t{b.tokens[static_cast<std::size_t>(r)]} * h,
                static_cast<std::size_t>(h) * sizeof(float));
  }
  const clm::PagedKvView kv = clm::PagedKvView::of(engine_.pool());
  float *x = x_.data(), *o = o_.data();
  for (std::int32_t layer = 0; layer < c.num_layers; ++layer) {
    const LlamaLayerWeights& w = weights_.layers[static_cast<std::size_t>(layer)];
    for_rows(rows, [&](std::int64_t begin, std::int64_t end) { rms_norm(x, begin, end, w.attn_norm, h_.data()); });
    const std::int64_t qkv_dim = q_dim + 2 * kv_dim;
    const LayerWeights& packed = packed_[static_cast<std::size_t>(layer)];
    matmul(h_.data(), rows, packed.qkv, wide_.data());
    for_rows(rows, [&](std::int64_t begin, std::int64_t end) {
      for (std::int64_t r = begin; r < end; ++r) {
        const float* row = wide_.data() + r * qkv_dim;
        float *q = q_.data() + r * q_dim, *k = k_.data() + r * kv_dim;
        std::memcpy(q, row, static_cast<std::size_t>(q_dim) * sizeof(float));
        std::memcpy(k, row + q_dim, static_cast<std::size_t>(kv_dim) * sizeof(float));
        std::memcpy(v_.data() + r * kv_dim, row + q_dim + kv_dim, static_cast<std::size_t>(kv_dim) * sizeof(float));
        rope_row(q, c.num_heads, positions_[static_cast<std::size_t>(r)]);
        rope_row(k, c.num_kv_heads, positions_[static_cast<std::size_t>(r)]);
      }
    });
    const auto attention_start = Clock::now();
    CLM_RETURN_IF_ERROR(clm::write_kv(kv, layer, k_.data(), v_.data(), b.slots));
    CLM_RETURN_IF_ERROR(attention(layer, b, q_.data(), attn_.data()));
    attention_seconds += seconds_since(attention_start);
    matmul(attn_.data(), rows, packed.o, o);
    if (observer_) CLM_RETURN_IF_ERROR(observer_->on_attention_output(layer, b, o));
    for_rows(rows, [&](std::int64_t begin, std::int64_t end) {
      for (std::int64_t i = begin * h; i < end * h; ++i) x[i] += o[i];
      rms_norm(x, begin, end, w.mlp_norm, h_.data());
    });
    matmul(h_.data(), rows, packed.gate_up, wide_.data());
    for_rows(rows, [&](std::int64_t begin, std::int64_t end) {
      for (std::int64_t r = begin; r < end; ++r) {
        const float* gate = wide_.data() + r * 2 * inter;
        const float* up = gate + inter;
        float* out = gate_.data() + r * inter;
        for (std::int64_t i = 0; i < inter; ++i)
          out[i] = gate[i] / (1.0f + std::exp(-gate[i])) * up[i];  // SiLU(gate) * up
      }
    });
    matmul(gate_.data(), rows, packed.down, o);
    for_rows(rows, [&](std::int64_t begin, std::int64_t end) {
      for (std::int64_t i = begin * h; i < end * h; ++i) x[i] += o[i];
    });
    if (observer_) CLM_RETURN_IF_ERROR(observer_->after_layer(layer, b, x));
  }
  last_.resize(static_cast<std::size_t>(n * h));
  for (std::int64_t i = 0; i < n; ++i) {
    const std::int64_t last_row = b.indptr[static_cast<std::size_t>(i) + 1] - 1;
    std::memcpy(last_.data() + i * h, x + last_row * h, static_cast<std::size_t>(h) * sizeof(float));
  }
  rms_norm(last_.data(), 0, n, weights_.final_norm, last_.data());
  if (observer_) CLM_RETURN_IF_ERROR(observer_->on_final_hidden(b, last_.data()));
  matmul(last_.data(), n, lm_head_, logits.data());
  ForwardSeconds& account = rows > n ? profile_.prefill : profile_.decode;
  account.gemm += gemm_seconds_;
  account.attention += attention_seconds;
  account.other += seconds_since(start) - gemm_seconds_ - attention_seconds;
  account.forwards += 1;
  account.rows += rows;
  return {};
}

}  // namespace tiny_llama
