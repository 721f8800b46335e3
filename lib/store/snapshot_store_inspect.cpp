// lib/store/snapshot_store_inspect.cpp: what a store tells about itself
// (snapshot_store.hpp, "inspection", and read_layout): per-shard counts and
// file sizes, a check of every row, the rows eviction would take, a key's
// rows with those of its nearest other keys (clm_store plot). Reads
// only: a read-only store answers them, and tools (clm_store) use them
// instead of SQL of their own.
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>

#include <fmt/format.h>

#include "snapshot_store_impl.hpp"

namespace clm {

using store_detail::StoreShard;
using store_impl::check_key;
using store_impl::current_exception_status;

namespace {

std::uint64_t file_bytes(const std::filesystem::path& p) {
  std::error_code ec;
  const std::uintmax_t n = std::filesystem::file_size(p, ec);
  return ec ? 0 : static_cast<std::uint64_t>(n);
}

constexpr std::size_t kProblemsShown = 20;

constexpr std::int32_t kMaxNeighbourKeys = 64;
// Index entries read per row of the key: its own rows and those of the
// neighbours' versions crowd the nearest entries, so each neighbour wanted
// gets room for several of its versions.
double cosine(std::span<const float> a, std::span<const float> b) {
  double ab = 0, aa = 0, bb = 0;
  for (std::size_t i = 0; i < a.size() && i < b.size(); ++i) {
    ab += static_cast<double>(a[i]) * b[i];
    aa += static_cast<double>(a[i]) * a[i];
    bb += static_cast<double>(b[i]) * b[i];
  }
  return aa > 0 && bb > 0 ? std::clamp(ab / std::sqrt(aa * bb), -1.0, 1.0) : 0.0;
}

std::size_t neighbour_search_width(std::size_t key_rows, std::int32_t max_neighbour_keys) {
  return std::min<std::size_t>(key_rows + 16 * static_cast<std::size_t>(max_neighbour_keys) + 64, 4096);
}

}  // namespace

Status SnapshotStore::read_layout(const std::string& path, StoreLayout& out) try {
  out = {};
  std::error_code ec;
  const std::string first = fmt::format("{}/shard-00.db", path);
  if (!std::filesystem::is_regular_file(first, ec)) {
    return not_found(fmt::format("no snapshot store at {} (no {})", path, first));
  }
  // The shard's own open reads store_meta without writing (a shard database
  // opened read-only); the layout it checks against is the one it reports.
  store_detail::ShardSettings settings;
  settings.dir = path;
  settings.read_only = true;
  std::unique_ptr<StoreShard> shard;
  CLM_RETURN_IF_ERROR(StoreShard::open(settings, shard));
  const auto shards = shard->meta_value("num_shards"), dim = shard->meta_value("snapshot_dim");
  if (!shards || !dim || *shards < 1 || *shards > 256 || *dim < 1 || *dim > 4096) {
    return failed_precondition(fmt::format("{}: store_meta lacks a valid num_shards / snapshot_dim", first));
  }
  out.num_shards = static_cast<std::int32_t>(*shards);
  out.snapshot_dim = static_cast<std::int32_t>(*dim);
  out.format = static_cast<std::int32_t>(shard->format());
  out.key_rules = static_cast<std::uint64_t>(shard->meta_value("key_rules").value_or(0));
  return {};
} catch (...) {
  return current_exception_status("read_layout");
}

Status SnapshotStore::shard_statistics(std::vector<ShardStatistics>& out) try {
  Impl& im = *impl_;
  out.clear();
  const std::int64_t now = im.now_ms();
  for (std::int32_t s = 0; s < im.config.num_shards; ++s) {
    StoreShard& shard = *im.shards[static_cast<std::size_t>(s)];
    ShardStatistics st;
    st.shard = s;
    {
      std::lock_guard lock(shard.mutex);
      shard.set_write_deadline();
      StoreShard::Counts c;
      CLM_RETURN_IF_ERROR(shard.counts(now, c));
      st.rows = c.rows;
      st.keys = c.keys;
      st.tenants = c.tenants;
      st.max_version = c.max_version;
      st.sightings = c.sightings;
      st.blacklisted = c.blacklisted;
      st.fallbacks = c.fallbacks;
      for (const auto& [tenant, t] : shard.indexes) {
        if (t.index && !t.rebuilding) st.indexed += static_cast<std::int64_t>(t.index->size());
      }
    }
    if (!shard.settings().dir.empty()) {
      for (const std::string& db : {shard.db_path(), shard.usage_path()}) {
        st.db_bytes += file_bytes(db);
        st.wal_bytes += file_bytes(db + "-wal");
      }
      // shard-NN.<tenant tag>.hnsw and its .meta; temporary files are not the index.
      const std::string prefix = fmt::format("shard-{:02}.", s);
      std::error_code ec;
      for (const auto& e : std::filesystem::directory_iterator(shard.settings().dir, ec)) {
        const std::string name = e.path().filename().string();
        if (name.rfind(prefix, 0) != 0 || name.find(".tmp.") != std::string::npos) continue;
        const bool index = name.ends_with(".hnsw");
        if (!index && !name.ends_with(".hnsw.meta")) continue;
        st.index_files += index ? 1 : 0;
        st.index_bytes += file_bytes(e.path());
      }
    }
    out.push_back(st);
  }
  return {};
} catch (...) {
  out.clear();
  return current_exception_status("shard_statistics");
}

Status SnapshotStore::verify(VerifyReport& report) try {
  Impl& im = *impl_;
  report = {};
  auto note = [&](std::string problem) {
    ++report.damaged;
    if (static_cast<std::size_t>(report.damaged) <= kProblemsShown) report.problems.push_back(std::move(problem));
  };
  for (auto& shard : im.shards) {
    std::lock_guard lock(shard->mutex);
    shard->set_write_deadline();
    const Status integrity = shard->integrity_check();
    if (!integrity.ok()) {
      report.integrity_ok = false;
      report.problems.insert(report.problems.begin(), integrity.message());
    }
    CLM_RETURN_IF_ERROR(shard->verify_rows(note, report.rows, report.fallbacks));
  }
  if (static_cast<std::size_t>(report.damaged) > kProblemsShown) {
    report.problems.push_back(
        fmt::format("... and {} more damaged rows", static_cast<std::size_t>(report.damaged) - kProblemsShown));
  }
  return {};
} catch (...) {
  return current_exception_status("verify");
}

Status SnapshotStore::eviction_candidates(std::vector<EvictionCandidate>& out) try {
  Impl& im = *impl_;
  out.clear();
  const std::int64_t cutoff_s = store_impl::eviction_cutoff_s(im.now_ms(), im.config.evict_after_days);
  for (std::int32_t s = 0; s < im.config.num_shards; ++s) {
    StoreShard& shard = *im.shards[static_cast<std::size_t>(s)];
    std::vector<StoreShard::EvictionRow> rows;
    {
      const store_detail::WriteLocks locks(shard);  // no usage count in flight while it looks
      CLM_RETURN_IF_ERROR(shard.eviction_rows(cutoff_s, im.config.evict_min_usage, rows));
    }
    for (auto& r : rows)
      out.push_back({s, std::move(r.tenant), std::move(r.key), r.version, r.usage_count, r.last_used_s});
  }
  std::stable_sort(out.begin(), out.end(), [](const EvictionCandidate& a, const EvictionCandidate& b) {
    return a.last_used_s < b.last_used_s;
  });
  return {};
} catch (...) {
  out.clear();
  return current_exception_status("eviction_candidates");
}

Status SnapshotStore::key_vectors(std::string_view tenant, const SuffixKey& key, std::int32_t max_neighbour_keys,
                                  KeyVectors& out) try {
  Impl& im = *impl_;
  out = {};
  CLM_RETURN_IF_ERROR(check_key(key, tenant, "key_vectors"));
  if (max_neighbour_keys < 0 || max_neighbour_keys > kMaxNeighbourKeys) {
    return invalid_argument(
        fmt::format("key_vectors: {} neighbour keys asked for (0..{})", max_neighbour_keys, kMaxNeighbourKeys));
  }
  const std::int32_t home = im.shard_of(tenant, key.group);
  {
    StoreShard& shard = *im.shards[static_cast<std::size_t>(home)];
    std::lock_guard lock(shard.mutex);
    shard.set_write_deadline();
    CLM_RETURN_IF_ERROR(shard.key_row_vectors(tenant, key, out.rows, out.unreadable));
  }
  if (out.rows.empty() && out.unreadable == 0) {
    return not_found(fmt::format("key_vectors: key \"{}\" has no stored row in this tenant", key.key));
  }
  out.key = key.key;
  out.fingerprint = key.fingerprint;
  out.shard = home;
  out.blacklisted = im.blacklisted(tenant, key.fingerprint);
  if (max_neighbour_keys == 0 || out.rows.empty()) return {};

  // Every shard's index of the tenant: a key's nearest keys need not share
  // its group, and other groups route to other shards.
  struct Nearest {
    std::string key;
    float similarity = -2.0f;
  };
  std::map<std::pair<std::int32_t, std::uint64_t>, Nearest> nearest;  // (shard, fingerprint) -> best cosine
  const std::size_t width = neighbour_search_width(out.rows.size(), max_neighbour_keys);
  const std::size_t ef = std::max(width, static_cast<std::size_t>(im.config.ann_ef_search));
  std::vector<std::pair<float, std::int64_t>> found;
  for (std::int32_t s = 0; s < im.config.num_shards; ++s) {
    StoreShard& shard = *im.shards[static_cast<std::size_t>(s)];
    std::lock_guard lock(shard.mutex);
    const auto t = shard.indexes.find(std::string(tenant));
    if (t == shard.indexes.end()) continue;
    if (t->second.rebuilding || !t->second.index) {
      out.neighbours_complete = out.neighbours_complete && !t->second.rebuilding;
      continue;
    }
    for (const SnapshotRowVector& row : out.rows) {
      CLM_RETURN_IF_ERROR(t->second.index->search(row.vector, width, ef, found));
      for (const auto& [similarity, id] : found) {
        const auto label = t->second.labels.find(id);
        if (label == t->second.labels.end()) continue;
        if (label->second.fingerprint == key.fingerprint && label->second.key == key.key) continue;  // itself
        Nearest& n = nearest[{s, label->second.fingerprint}];
        if (similarity > n.similarity) n = {label->second.key, similarity};
      }
    }
  }
  std::vector<std::pair<std::pair<std::int32_t, std::uint64_t>, Nearest>> ranked(nearest.begin(), nearest.end());
  std::stable_sort(ranked.begin(), ranked.end(),
                   [](const auto& a, const auto& b) { return a.second.similarity > b.second.similarity; });
  for (auto& [where, n] : ranked) {
    if (out.neighbours.size() == static_cast<std::size_t>(max_neighbour_keys)) break;
    NeighbourKeyVectors neighbour;
    neighbour.key = std::move(n.key);
    neighbour.fingerprint = where.second;
    neighbour.shard = where.first;
    SuffixKey other;
    other.key = neighbour.key;
    other.fingerprint = neighbour.fingerprint;
    std::int64_t unreadable = 0;
    {
      StoreShard& shard = *im.shards[static_cast<std::size_t>(where.first)];
      std::lock_guard lock(shard.mutex);
      shard.set_write_deadline();
      CLM_RETURN_IF_ERROR(shard.key_row_vectors(tenant, other, neighbour.rows, unreadable));
    }
    if (neighbour.rows.empty()) continue;  // deleted since its index entry was made, or unreadable
    // The exact cosine of the rows as stored: the index ranks by the inner
    // product of f16 vectors, whose lengths are 1 only to f16 precision.
    double best = -1.0;
    for (const SnapshotRowVector& theirs : neighbour.rows) {
      for (const SnapshotRowVector& mine : out.rows) best = std::max(best, cosine(theirs.vector, mine.vector));
    }
    neighbour.similarity = static_cast<float>(best);
    out.neighbours.push_back(std::move(neighbour));
  }
  std::stable_sort(
      out.neighbours.begin(), out.neighbours.end(),
      [](const NeighbourKeyVectors& a, const NeighbourKeyVectors& b) { return a.similarity > b.similarity; });
  return {};
} catch (...) {
  out = {};
  return current_exception_status("key_vectors");
}

}  // namespace clm
