// lib/store/snapshot_store_inspect.cpp: what a store tells about itself
// (snapshot_store.hpp, "inspection", and read_layout): per-shard counts and
// file sizes, a check of every row, the rows eviction would take. Reads
// only: a read-only store answers them, and tools (clm_store) use them
// instead of SQL of their own.
#include <algorithm>
#include <filesystem>

#include <fmt/format.h>

#include "snapshot_store_impl.hpp"

namespace clm {

using store_detail::StoreShard;
using store_impl::current_exception_status;

namespace {

std::uint64_t file_bytes(const std::filesystem::path& p) {
  std::error_code ec;
  const std::uintmax_t n = std::filesystem::file_size(p, ec);
  return ec ? 0 : static_cast<std::uint64_t>(n);
}

constexpr std::size_t kProblemsShown = 20;

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

}  // namespace clm
