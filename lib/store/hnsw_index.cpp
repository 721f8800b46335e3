// lib/store/hnsw_index.cpp: the snapshot store's HNSW index over hnswlib
// (hnsw_index.hpp), and the one file of clmcache that includes hnswlib.
//
// NO_MANUAL_VECTORIZATION: the index measures with our dot_product, so
// hnswlib's SIMD kernels (which read one element past a vector's end, and
// which would define cpuid/AVXCapable with external linkage) are not compiled.
#define NO_MANUAL_VECTORIZATION 1

#include "hnsw_index.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <new>
#include <sstream>

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#endif

#include <fmt/format.h>
#include <hnswlib/hnswlib.h>

#include "clm/store/suffix_key.hpp"  // key_fingerprint (FNV-1a 64) for the file checksum

namespace clm::store_detail {

namespace {

float dot_scalar(const float* a, const float* b, std::size_t n) {
  float s0 = 0, s1 = 0, s2 = 0, s3 = 0;  // four chains: the loop is not bound by one add's latency
  std::size_t i = 0;
  for (; i + 4 <= n; i += 4) {
    s0 += a[i] * b[i];
    s1 += a[i + 1] * b[i + 1];
    s2 += a[i + 2] * b[i + 2];
    s3 += a[i + 3] * b[i + 3];
  }
  for (; i < n; ++i) s0 += a[i] * b[i];
  return (s0 + s1) + (s2 + s3);
}

#if defined(__x86_64__) && defined(__GNUC__)
__attribute__((target("avx2,fma"))) float dot_avx2(const float* a, const float* b, std::size_t n) {
  __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
  std::size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc0);
    acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), acc1);
  }
  for (; i + 8 <= n; i += 8) acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc0);
  acc0 = _mm256_add_ps(acc0, acc1);
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(acc0), _mm256_extractf128_ps(acc0, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
  float total = _mm_cvtss_f32(s);
  for (; i < n; ++i) total += a[i] * b[i];
  return total;
}
#endif

using DotFn = float (*)(const float*, const float*, std::size_t);
DotFn pick_dot() {
#if defined(__x86_64__) && defined(__GNUC__)
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return dot_avx2;
#endif
  return dot_scalar;
}
const DotFn kDot = pick_dot();

// Unit vectors under inner product: distance = 1 - cosine (what hnswlib's
// InnerProductSpace computes, with our kernel).
class UnitInnerProductSpace : public hnswlib::SpaceInterface<float> {
 public:
  explicit UnitInnerProductSpace(std::size_t dim) : dim_(dim) {}
  std::size_t get_data_size() override { return dim_ * sizeof(float); }
  hnswlib::DISTFUNC<float> get_dist_func() override { return &distance; }
  void* get_dist_func_param() override { return &dim_; }

 private:
  static float distance(const void* a, const void* b, const void* param) {
    return 1.0f -
           kDot(static_cast<const float*>(a), static_cast<const float*>(b), *static_cast<const std::size_t*>(param));
  }
  std::size_t dim_;
};

Status io_failure(const std::string& what, const std::string& path) {
  return {StatusCode::io_error, fmt::format("{} {}: {}", what, path, std::strerror(errno))};
}

Status fsync_path(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) return io_failure("hnsw index: cannot open", path);
  const int rc = ::fsync(fd);
  ::close(fd);
  if (rc != 0) return io_failure("hnsw index: fsync failed for", path);
  return {};
}

Status read_file(const std::string& path, std::string& out) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return io_failure("hnsw index: cannot read", path);
  std::ostringstream buffer;
  buffer << in.rdbuf();
  if (in.bad()) return io_failure("hnsw index: read failed for", path);
  out = std::move(buffer).str();
  return {};
}

// hnswlib 0.6.2's file layout, walked as its loadIndex walks it, over bytes
// already in memory: a file that passes cannot make loadIndex read past its end.
Status check_layout(const std::string& bytes, std::size_t dim, const std::string& path) {
  std::size_t at = 0;
  auto take = [&](void* dst, std::size_t n) {
    if (bytes.size() - at < n) return false;
    std::memcpy(dst, bytes.data() + at, n);
    at += n;
    return true;
  };
  std::size_t offset_level0 = 0, max_elements = 0, count = 0, per_element = 0, label_offset = 0, offset_data = 0;
  int max_level = 0;
  unsigned int entry = 0;
  std::size_t max_m = 0, max_m0 = 0, m = 0, ef_construction = 0;
  double mult = 0;
  const bool header = take(&offset_level0, sizeof offset_level0) && take(&max_elements, sizeof max_elements) &&
                      take(&count, sizeof count) && take(&per_element, sizeof per_element) &&
                      take(&label_offset, sizeof label_offset) && take(&offset_data, sizeof offset_data) &&
                      take(&max_level, sizeof max_level) && take(&entry, sizeof entry) && take(&max_m, sizeof max_m) &&
                      take(&max_m0, sizeof max_m0) && take(&m, sizeof m) && take(&mult, sizeof mult) &&
                      take(&ef_construction, sizeof ef_construction);
  const std::size_t links0 = max_m0 * sizeof(unsigned int) + sizeof(unsigned int);
  if (!header || m < 2 || m > 10000 || max_m0 != 2 * m || max_m != m || count > max_elements ||
      per_element != links0 + dim * sizeof(float) + sizeof(hnswlib::labeltype) || offset_data != links0 ||
      label_offset != links0 + dim * sizeof(float) || (count > 0 && (entry >= count || max_level < 0))) {
    return invalid_argument(fmt::format("hnsw index {}: the header does not describe a {}-d index", path, dim));
  }
  if (count > (bytes.size() - at) / per_element) return invalid_argument(fmt::format("hnsw index {}: truncated", path));
  at += count * per_element;
  const std::size_t links = max_m * sizeof(unsigned int) + sizeof(unsigned int);
  for (std::size_t i = 0; i < count; ++i) {
    unsigned int size = 0;
    if (!take(&size, sizeof size)) return invalid_argument(fmt::format("hnsw index {}: truncated", path));
    if (size % links != 0 || size / links > static_cast<std::size_t>(max_level) || bytes.size() - at < size) {
      return invalid_argument(fmt::format("hnsw index {}: element {} has a bad link list", path, i));
    }
    at += size;
  }
  if (at != bytes.size())
    return invalid_argument(fmt::format("hnsw index {}: {} bytes past the end", path, bytes.size() - at));
  return {};
}

std::string meta_path(const std::string& path) { return path + ".meta"; }

}  // namespace

float dot_product(const float* a, const float* b, std::size_t n) { return kDot(a, b, n); }

struct HnswIndex::Impl {
  explicit Impl(const HnswParams& p) : params(p), space(static_cast<std::size_t>(p.dim)) {}
  HnswParams params;
  UnitInnerProductSpace space;
  std::unique_ptr<hnswlib::HierarchicalNSW<float>> index;
  std::int64_t max_label = -1;
};

HnswIndex::HnswIndex(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
HnswIndex::~HnswIndex() = default;

namespace {
Status check_params(const HnswParams& p) {
  if (p.dim < 1 || p.dim > 65536 || p.m < 2 || p.m > 100 || p.ef_construction < 1) {
    return invalid_argument(
        fmt::format("hnsw index: bad parameters dim {} m {} ef_construction {}", p.dim, p.m, p.ef_construction));
  }
  return {};
}
constexpr std::size_t kInitialCapacity = 1024;
}  // namespace

Status HnswIndex::create(const HnswParams& params, std::unique_ptr<HnswIndex>& out) {
  CLM_RETURN_IF_ERROR(check_params(params));
  try {
    auto impl = std::make_unique<Impl>(params);
    impl->index = std::make_unique<hnswlib::HierarchicalNSW<float>>(
        &impl->space, kInitialCapacity, static_cast<std::size_t>(params.m),
        static_cast<std::size_t>(params.ef_construction), 100);
    out.reset(new HnswIndex(std::move(impl)));
    return {};
  } catch (const std::bad_alloc&) {
    return out_of_memory("hnsw index: out of host memory");
  } catch (const std::exception& e) {
    return {StatusCode::internal, fmt::format("hnsw index: {}", e.what())};
  }
}

Status HnswIndex::load(const std::string& path, const HnswParams& params, std::unique_ptr<HnswIndex>& out) {
  CLM_RETURN_IF_ERROR(check_params(params));
  std::string meta_text;
  CLM_RETURN_IF_ERROR(read_file(meta_path(path), meta_text));
  unsigned long long dim = 0, size = 0, checksum = 0;
  if (std::sscanf(meta_text.c_str(), "CLMHNSW1 dim=%llu size=%llu checksum=%llx", &dim, &size, &checksum) != 3) {
    return invalid_argument(fmt::format("hnsw index {}: its .meta file is malformed", path));
  }
  if (dim != static_cast<unsigned long long>(params.dim)) {
    return invalid_argument(fmt::format("hnsw index {}: dim {} where {} was expected", path, dim, params.dim));
  }
  std::string bytes;
  CLM_RETURN_IF_ERROR(read_file(path, bytes));
  if (bytes.size() != size) {
    return invalid_argument(fmt::format("hnsw index {}: {} bytes where its .meta says {}", path, bytes.size(), size));
  }
  if (key_fingerprint(bytes) != checksum)
    return invalid_argument(fmt::format("hnsw index {}: checksum mismatch", path));
  CLM_RETURN_IF_ERROR(check_layout(bytes, static_cast<std::size_t>(params.dim), path));
  bytes.clear();
  bytes.shrink_to_fit();
  try {
    auto impl = std::make_unique<Impl>(params);
    impl->index = std::make_unique<hnswlib::HierarchicalNSW<float>>(&impl->space, path, false, 0);
    // hnswlib 0.6.2's loading constructor leaves num_deleted_ uninitialised
    // and then adds the deleted marks to it: count them again.
    impl->index->num_deleted_ = 0;
    for (std::size_t i = 0; i < impl->index->cur_element_count; ++i) {
      impl->index->num_deleted_ += impl->index->isMarkedDeleted(static_cast<hnswlib::tableint>(i)) ? 1 : 0;
    }
    for (const auto& [label, internal] : impl->index->label_lookup_) {
      impl->max_label = std::max(impl->max_label, static_cast<std::int64_t>(label));
    }
    out.reset(new HnswIndex(std::move(impl)));
    return {};
  } catch (const std::bad_alloc&) {
    return out_of_memory(fmt::format("hnsw index {}: out of host memory", path));
  } catch (const std::exception& e) {
    return invalid_argument(fmt::format("hnsw index {}: {}", path, e.what()));
  }
}

Status HnswIndex::serialize(const std::string& path, PendingSave& out) const try {
  const auto& x = *impl_->index;
  out.path = path;
  out.dim = impl_->params.dim;
  out.bytes.clear();
  // hnswlib's saveIndex, field for field, into memory.
  auto put = [&](const auto& pod) { out.bytes.append(reinterpret_cast<const char*>(&pod), sizeof pod); };
  std::size_t links_bytes = 0;
  for (std::size_t i = 0; i < x.cur_element_count; ++i) {
    links_bytes +=
        x.element_levels_[i] > 0 ? x.size_links_per_element_ * static_cast<std::size_t>(x.element_levels_[i]) : 0;
  }
  out.bytes.reserve(128 + x.cur_element_count * (x.size_data_per_element_ + sizeof(unsigned int)) + links_bytes);
  put(x.offsetLevel0_);
  put(x.max_elements_);
  put(x.cur_element_count);
  put(x.size_data_per_element_);
  put(x.label_offset_);
  put(x.offsetData_);
  put(x.maxlevel_);
  put(x.enterpoint_node_);
  put(x.maxM_);
  put(x.maxM0_);
  put(x.M_);
  put(x.mult_);
  put(x.ef_construction_);
  out.bytes.append(x.data_level0_memory_, x.cur_element_count * x.size_data_per_element_);
  for (std::size_t i = 0; i < x.cur_element_count; ++i) {
    const unsigned int size =
        x.element_levels_[i] > 0
            ? static_cast<unsigned int>(x.size_links_per_element_ * static_cast<std::size_t>(x.element_levels_[i]))
            : 0u;
    put(size);
    if (size) out.bytes.append(x.linkLists_[i], size);
  }
  return {};
} catch (const std::bad_alloc&) {
  out.bytes.clear();
  return out_of_memory(fmt::format("hnsw index {}: out of host memory for its save", path));
}

Status HnswIndex::publish(const PendingSave& save) {
  static std::atomic<std::uint64_t> counter{0};
  const std::string& path = save.path;
  const std::string tmp = fmt::format("{}.tmp.{}.{}", path, ::getpid(), counter++);
  const std::string meta_tmp = tmp + ".meta";
  auto discard = [&] {
    std::remove(tmp.c_str());
    std::remove(meta_tmp.c_str());
  };
  // What serialize copied must describe the index whole before it replaces a file.
  Status checked = check_layout(save.bytes, static_cast<std::size_t>(save.dim), path);
  if (!checked.ok()) return {StatusCode::internal, fmt::format("hnsw index: not saved: {}", checked.message())};
  {
    std::ofstream data(tmp, std::ios::binary | std::ios::trunc);
    data.write(save.bytes.data(), static_cast<std::streamsize>(save.bytes.size()));
    data.flush();
    if (!data) {
      discard();
      return io_failure("hnsw index: cannot write", tmp);
    }
  }
  const std::string& bytes = save.bytes;
  {
    std::ofstream meta(meta_tmp, std::ios::binary | std::ios::trunc);
    meta << fmt::format("CLMHNSW1 dim={} size={} checksum={:x}\n", save.dim, bytes.size(), key_fingerprint(bytes));
    meta.flush();
    if (!meta) {
      discard();
      return io_failure("hnsw index: cannot write", meta_tmp);
    }
  }
  Status synced = fsync_path(tmp);
  if (synced.ok()) synced = fsync_path(meta_tmp);
  if (!synced.ok()) {
    discard();
    return synced;
  }
  // Index first, then its meta: a crash between the two leaves a checksum
  // that does not match, which load reports and the store answers by rebuilding.
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    discard();
    return io_failure("hnsw index: cannot rename onto", path);
  }
  if (std::rename(meta_tmp.c_str(), meta_path(path).c_str()) != 0) {
    std::remove(meta_tmp.c_str());
    return io_failure("hnsw index: cannot rename onto", meta_path(path));
  }
  const std::string dir = std::filesystem::path(path).parent_path().string();
  return fsync_path(dir.empty() ? "." : dir);
}

Status HnswIndex::add(std::span<const float> unit_vector, std::int64_t label) {
  if (unit_vector.size() != static_cast<std::size_t>(impl_->params.dim) || label < 0) {
    return invalid_argument(fmt::format("hnsw index: add of {} values with label {}", unit_vector.size(), label));
  }
  try {
    auto& index = *impl_->index;
    if (index.cur_element_count >= index.max_elements_ &&
        index.label_lookup_.find(static_cast<hnswlib::labeltype>(label)) == index.label_lookup_.end()) {
      index.resizeIndex(std::max<std::size_t>(kInitialCapacity, index.max_elements_ * 2));
    }
    index.addPoint(unit_vector.data(), static_cast<hnswlib::labeltype>(label));
    impl_->max_label = std::max(impl_->max_label, label);
    return {};
  } catch (const std::bad_alloc&) {
    return out_of_memory("hnsw index: out of host memory");
  } catch (const std::exception& e) {
    return {StatusCode::internal, fmt::format("hnsw index: {}", e.what())};
  }
}

void HnswIndex::remove(std::int64_t label) {
  auto& index = *impl_->index;
  const auto it = index.label_lookup_.find(static_cast<hnswlib::labeltype>(label));
  if (it == index.label_lookup_.end() || index.isMarkedDeleted(it->second)) return;
  index.markDelete(static_cast<hnswlib::labeltype>(label));
}

Status HnswIndex::search(std::span<const float> query, std::size_t k, std::size_t ef,
                         std::vector<std::pair<float, std::int64_t>>& out) const {
  out.clear();
  if (query.size() != static_cast<std::size_t>(impl_->params.dim)) {
    return invalid_argument(
        fmt::format("hnsw index: query of {} values, index of {}", query.size(), impl_->params.dim));
  }
  try {
    auto& index = *impl_->index;
    index.setEf(ef);
    auto heap = index.searchKnn(query.data(), k);  // worst first
    out.resize(heap.size());
    for (std::size_t i = out.size(); i-- > 0; heap.pop()) {
      out[i] = {1.0f - heap.top().first, static_cast<std::int64_t>(heap.top().second)};
    }
    return {};
  } catch (const std::bad_alloc&) {
    return out_of_memory("hnsw index: out of host memory");
  } catch (const std::exception& e) {
    return {StatusCode::internal, fmt::format("hnsw index: {}", e.what())};
  }
}

std::size_t HnswIndex::size() const { return impl_->index->cur_element_count - impl_->index->num_deleted_; }
std::size_t HnswIndex::deleted() const { return impl_->index->num_deleted_; }
std::int64_t HnswIndex::max_label() const { return impl_->max_label; }

}  // namespace clm::store_detail
