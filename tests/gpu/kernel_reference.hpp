// tests/gpu/kernel_reference.hpp: float64 references and test data for the CUDA
// kernels, shared by test_cuda_kernels.cpp (on a GPU) and
// test_cuda_emulated.cpp (the same kernels on the CPU emulator).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <new>
#include <numeric>
#include <random>
#include <span>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "clm/kernels/attention.hpp"
#include "kernels/half_bits.hpp"

namespace clm_test {

using clm::KvDType;

struct Geometry {
  std::int32_t num_pages = 1;
  std::int32_t page_size = 16;
  std::int32_t num_layers = 1;
  std::int32_t kv_heads = 1;
  std::int32_t head_dim = 128;
  KvDType dtype = KvDType::f32;
};

inline std::string describe(const Geometry& g) {
  return fmt::format("{} D={} H_kv={} page={} layers={} pages={}", clm::kv_dtype_name(g.dtype), g.head_dim, g.kv_heads,
                     g.page_size, g.num_layers, g.num_pages);
}

// f32 -> the dtype's bits and back (round to nearest even, as the kernels).
inline std::uint32_t to_bits(KvDType dtype, float x) {
  switch (dtype) {
    case KvDType::f16: return clm::cuda::soft::float_to_f16(x);
    case KvDType::bf16: return clm::cuda::soft::float_to_bf16(x);
    default: {
      std::uint32_t u;
      std::memcpy(&u, &x, 4);
      return u;
    }
  }
}
inline float quantize(KvDType dtype, float x) {
  switch (dtype) {
    case KvDType::f16: return clm::cuda::soft::f16_to_float(clm::cuda::soft::float_to_f16(x));
    case KvDType::bf16: return clm::cuda::soft::bf16_to_float(clm::cuda::soft::float_to_bf16(x));
    default: return x;
  }
}

struct AlignedFree {
  void operator()(void* p) const { std::free(p); }
};

// The bytes of a pool, in host memory, with paged_kv_pool.hpp's layout.
class HostPool {
 public:
  explicit HostPool(const Geometry& g) : g_(g) {
    // Exactly the pool's bytes (so ASan sees any overrun), 256-byte aligned.
    void* p = nullptr;
    if (posix_memalign(&p, 256, std::max<std::size_t>(total_bytes(), 1)) != 0) throw std::bad_alloc();
    data_.reset(static_cast<unsigned char*>(p));
  }
  const Geometry& geometry() const { return g_; }
  std::size_t elem_bytes() const { return clm::kv_dtype_bytes(g_.dtype); }
  std::size_t block_bytes() const {
    return static_cast<std::size_t>(g_.page_size) * g_.kv_heads * g_.head_dim * elem_bytes();
  }
  std::size_t layer_bytes() const { return 2 * block_bytes(); }
  std::size_t page_bytes() const { return layer_bytes() * g_.num_layers; }
  std::size_t total_bytes() const { return page_bytes() * g_.num_pages; }
  unsigned char* data() { return data_.get(); }
  const unsigned char* data() const { return data_.get(); }

  // A view of these bytes, or of the same layout at `base` (e.g. a device copy).
  clm::PagedKvView view(clm::MemoryKind memory, void* base = nullptr) const {
    clm::PagedKvView v;
    v.base = base ? base : const_cast<unsigned char*>(data_.get());
    v.dtype = g_.dtype;
    v.memory = memory;
    v.num_pages = g_.num_pages;
    v.page_size = g_.page_size;
    v.num_layers = g_.num_layers;
    v.kv_heads = g_.kv_heads;
    v.head_dim = g_.head_dim;
    v.page_bytes = page_bytes();
    v.layer_bytes = layer_bytes();
    return v;
  }

  // Every element uniform in [-1, 1] (never all zeros), in the pool's dtype.
  void fill_random(std::mt19937_64& rng) {
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    const std::size_t n = total_bytes() / elem_bytes();
    for (std::size_t i = 0; i < n; ++i) store(i, u(rng));
  }
  void fill_bytes(unsigned char byte) { std::memset(data_.get(), byte, total_bytes()); }

  std::size_t element_index(std::int32_t page, std::int32_t layer, bool value, std::int32_t row, std::int32_t head,
                            std::int32_t d) const {
    const std::size_t per_block = block_bytes() / elem_bytes();
    return (static_cast<std::size_t>(page) * g_.num_layers + layer) * 2 * per_block + (value ? per_block : 0) +
           (static_cast<std::size_t>(row) * g_.kv_heads + head) * g_.head_dim + d;
  }
  double k(std::int32_t page, std::int32_t layer, std::int32_t row, std::int32_t head, std::int32_t d) const {
    return load(element_index(page, layer, false, row, head, d));
  }
  double v(std::int32_t page, std::int32_t layer, std::int32_t row, std::int32_t head, std::int32_t d) const {
    return load(element_index(page, layer, true, row, head, d));
  }
  void store(std::size_t element, float x) {
    const std::uint32_t bits = to_bits(g_.dtype, x);
    if (elem_bytes() == 4) {
      std::memcpy(data_.get() + element * 4, &bits, 4);
    } else {
      const auto h = static_cast<std::uint16_t>(bits);
      std::memcpy(data_.get() + element * 2, &h, 2);
    }
  }
  double load(std::size_t element) const {
    if (elem_bytes() == 4) {
      float f;
      std::memcpy(&f, data_.get() + element * 4, 4);
      return f;
    }
    std::uint16_t h;
    std::memcpy(&h, data_.get() + element * 2, 2);
    return g_.dtype == KvDType::f16 ? clm::cuda::soft::f16_to_float(h) : clm::cuda::soft::bf16_to_float(h);
  }

 private:
  Geometry g_;
  std::unique_ptr<unsigned char, AlignedFree> data_;
};

inline std::vector<float> random_floats(std::size_t n, std::mt19937_64& rng) {
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> x(n);
  for (float& f : x) f = u(rng);
  return x;
}

// A decode batch in CSR form over distinct random pages of a pool.
struct Batch {
  std::vector<std::int32_t> lens;
  std::vector<std::int32_t> indptr{0};
  std::vector<std::int32_t> indices;
  std::vector<std::int32_t> last_page_len;
};

inline std::int32_t pages_for(std::int32_t len, std::int32_t page_size) { return (len + page_size - 1) / page_size; }

inline std::int32_t pages_needed(std::span<const std::int32_t> lens, std::int32_t page_size) {
  std::int32_t n = 0;
  for (std::int32_t len : lens) n += pages_for(len, page_size);
  return n;
}

inline Batch make_batch(std::span<const std::int32_t> lens, std::int32_t page_size, std::int32_t num_pages,
                        std::mt19937_64& rng) {
  std::vector<std::int32_t> ids(static_cast<std::size_t>(num_pages));
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), rng);
  Batch b;
  b.lens.assign(lens.begin(), lens.end());
  std::size_t next = 0;
  for (std::int32_t len : lens) {
    const std::int32_t n = pages_for(len, page_size);
    for (std::int32_t i = 0; i < n; ++i) b.indices.push_back(ids.at(next++));
    b.indptr.push_back(static_cast<std::int32_t>(b.indices.size()));
    b.last_page_len.push_back(len - (n - 1) * page_size);
  }
  return b;
}

inline double scale_of(const clm::AttentionParams& p, std::int32_t head_dim) {
  // The kernels use the f32 scale; so does the reference (then in f64).
  return p.softmax_scale != 0.0f ? static_cast<double>(p.softmax_scale)
                                 : static_cast<double>(static_cast<float>(1.0 / std::sqrt(static_cast<double>(head_dim))));
}

// Attention of one query (f32 row) over keys [first, last] of a sequence whose
// token t is in pages[t / page_size], row t % page_size; adds into out (f64).
inline void attend(const HostPool& pool, std::int32_t layer, std::int32_t kv_head, double scale, const float* q,
                   std::span<const std::int32_t> pages, std::int32_t first, std::int32_t last, double* out) {
  const Geometry& g = pool.geometry();
  std::vector<double> s(static_cast<std::size_t>(last - first + 1));
  double m = -std::numeric_limits<double>::infinity();
  for (std::int32_t t = first; t <= last; ++t) {
    const std::int32_t page = pages[static_cast<std::size_t>(t / g.page_size)];
    const std::int32_t row = t % g.page_size;
    double dot = 0;
    for (std::int32_t d = 0; d < g.head_dim; ++d) dot += static_cast<double>(q[d]) * pool.k(page, layer, row, kv_head, d);
    s[static_cast<std::size_t>(t - first)] = dot * scale;
    m = std::max(m, dot * scale);
  }
  double sum = 0;
  for (double& x : s) {
    x = std::exp(x - m);
    sum += x;
  }
  for (std::int32_t d = 0; d < g.head_dim; ++d) out[d] = 0;
  for (std::int32_t t = first; t <= last; ++t) {
    const std::int32_t page = pages[static_cast<std::size_t>(t / g.page_size)];
    const std::int32_t row = t % g.page_size;
    const double p = s[static_cast<std::size_t>(t - first)] / sum;
    for (std::int32_t d = 0; d < g.head_dim; ++d) out[d] += p * pool.v(page, layer, row, kv_head, d);
  }
}

// Decode reference: out [batch][Hq][D].
inline std::vector<double> reference_decode(const HostPool& pool, const clm::AttentionParams& params,
                                            const std::vector<float>& q, const Batch& b) {
  const Geometry& g = pool.geometry();
  const std::int32_t hq = params.num_q_heads;
  const std::int32_t group = hq / g.kv_heads;
  const double scale = scale_of(params, g.head_dim);
  std::vector<double> out(b.lens.size() * static_cast<std::size_t>(hq) * g.head_dim);
  for (std::size_t i = 0; i < b.lens.size(); ++i) {
    const std::int32_t len = b.lens[i];
    const std::int32_t first = params.sliding_window > 0 ? std::max(0, len - params.sliding_window) : 0;
    std::span<const std::int32_t> pages(b.indices.data() + b.indptr[i],
                                        static_cast<std::size_t>(b.indptr[i + 1] - b.indptr[i]));
    for (std::int32_t h = 0; h < hq; ++h) {
      const std::size_t row = i * static_cast<std::size_t>(hq) + h;
      attend(pool, params.layer, h / group, scale, q.data() + row * g.head_dim, pages, first, len - 1,
             out.data() + row * g.head_dim);
    }
  }
  return out;
}

// Prefill reference: out [n_new][Hq][D] for the last n_new tokens of kv_len.
inline std::vector<double> reference_prefill(const HostPool& pool, const clm::AttentionParams& params,
                                             const std::vector<float>& q, std::int32_t n_new,
                                             std::span<const std::int32_t> pages, std::int32_t kv_len) {
  const Geometry& g = pool.geometry();
  const std::int32_t hq = params.num_q_heads;
  const std::int32_t group = hq / g.kv_heads;
  const double scale = scale_of(params, g.head_dim);
  std::vector<double> out(static_cast<std::size_t>(n_new) * hq * g.head_dim);
  for (std::int32_t i = 0; i < n_new; ++i) {
    const std::int32_t pos = kv_len - n_new + i;
    const std::int32_t first = params.sliding_window > 0 ? std::max(0, pos - params.sliding_window + 1) : 0;
    for (std::int32_t h = 0; h < hq; ++h) {
      const std::size_t row = static_cast<std::size_t>(i) * hq + h;
      attend(pool, params.layer, h / group, scale, q.data() + row * g.head_dim, pages, first, pos,
             out.data() + row * g.head_dim);
    }
  }
  return out;
}

// max |out - ref| / max |ref|; +inf when out has a NaN (e.g. a poisoned,
// never-written element) or sizes differ.
inline double relative_error(std::span<const float> out, std::span<const double> ref) {
  if (out.size() != ref.size()) return std::numeric_limits<double>::infinity();
  double err = 0, mag = 0;
  for (std::size_t i = 0; i < out.size(); ++i) {
    if (!std::isfinite(out[i])) return std::numeric_limits<double>::infinity();
    err = std::max(err, std::abs(static_cast<double>(out[i]) - ref[i]));
    mag = std::max(mag, std::abs(ref[i]));
  }
  return mag > 0 ? err / mag : err;
}

inline double tolerance(KvDType dtype) { return dtype == KvDType::f32 ? 1e-5 : 1e-2; }

inline void poison(std::vector<float>& x) { std::fill(x.begin(), x.end(), std::numeric_limits<float>::quiet_NaN()); }

}  // namespace clm_test
