// lib/store/store_shard_inspect.cpp: what a shard tells about itself
// (store_shard.hpp, "inspection"): counts, a read of every row with its
// checks, the rows eviction would take, a key's rows with their snapshots.
// Reads only, so a read-only shard answers them; rare calls, each prepares
// its statements when it runs.
#include <algorithm>

#include <fmt/format.h>

#include "clm/store/snapshot_blob.hpp"
#include "store_shard.hpp"

namespace clm::store_detail {

namespace {
std::string printable(std::span<const std::uint8_t> b) {
  std::string out;
  for (const std::uint8_t c : b) {
    if (c >= 0x20 && c < 0x7f && c != '"' && c != '\\') {
      out.push_back(static_cast<char>(c));
    } else {
      out += fmt::format("\\x{:02x}", c);
    }
  }
  return out;
}
}  // namespace

Status StoreShard::counts(std::int64_t now_ms, Counts& out) {
  out = {};
  struct Query {
    const char* sql;
    std::int64_t* into;  // nullptr: the first query, three columns
    bool binds_now;
  };
  const Query queries[] = {
      {"SELECT count(*), count(DISTINCT tenant), coalesce(max(version), 0) FROM semantic_snapshots", nullptr, false},
      {"SELECT count(*) FROM (SELECT DISTINCT tenant, suffix_hash, suffix_key FROM semantic_snapshots)", &out.keys,
       false},
      {"SELECT count(*) FROM suffix_sightings", &out.sightings, false},
      {"SELECT count(*) FROM blacklist WHERE until_ms >= ?1", &out.blacklisted, true},
      {"SELECT count(*) FROM fallback_snapshots", &out.fallbacks, false},
  };
  for (const auto& [sql, into, binds_now] : queries) {
    Statement q;
    CLM_RETURN_IF_ERROR(db_.prepare(sql, q));
    if (binds_now) q.bind_int(1, now_ms);
    const int rc = q.step();
    if (rc != SQLITE_ROW) return done(rc, "counting a shard's rows");
    if (into) {
      *into = q.column_int(0);
    } else {
      out.rows = q.column_int(0);
      out.tenants = q.column_int(1);
      out.max_version = q.column_int(2);
    }
  }
  return {};
}

Status StoreShard::verify_rows(const std::function<void(std::string)>& damaged, std::int64_t& rows,
                               std::int64_t& fallbacks) {
  std::vector<float> scratch(static_cast<std::size_t>(settings_.dim));
  Statement q;
  CLM_RETURN_IF_ERROR(
      db_.prepare("SELECT id, tenant, suffix_key, suffix_hash, version, dim, snapshot, checksum FROM semantic_snapshots"
                  " ORDER BY id",
                  q));
  int rc;
  while ((rc = q.step()) == SQLITE_ROW) {
    ++rows;
    const std::string where =
        fmt::format("shard {:02} row {} (tenant \"{}\", {} v{})", settings_.index, q.column_int(0),
                    printable(q.column_blob(1)), q.column_text(2), q.column_int(4));
    if (static_cast<std::uint64_t>(q.column_int(3)) != key_fingerprint(q.column_text(2))) {
      damaged(fmt::format("{}: suffix_hash is not the key's fingerprint", where));
    }
    const Status blob =
        q.column_int(5) != settings_.dim
            ? invalid_argument(fmt::format("dim column {}, the store's is {}", q.column_int(5), settings_.dim))
            : decode_snapshot_blob(q.column_blob(6), settings_.dim, static_cast<std::uint64_t>(q.column_int(7)),
                                   scratch);
    if (!blob.ok()) damaged(fmt::format("{}: {}", where, blob.message()));
  }
  CLM_RETURN_IF_ERROR(done(rc, "reading every row"));
  Statement f;
  CLM_RETURN_IF_ERROR(db_.prepare("SELECT tenant, name, snapshot, checksum FROM fallback_snapshots", f));
  while ((rc = f.step()) == SQLITE_ROW) {
    ++fallbacks;
    const Status blob =
        decode_snapshot_blob(f.column_blob(2), settings_.dim, static_cast<std::uint64_t>(f.column_int(3)), scratch);
    if (!blob.ok()) {
      damaged(fmt::format("shard {:02} fallback \"{}\" (tenant \"{}\"): {}", settings_.index, f.column_text(1),
                          printable(f.column_blob(0)), blob.message()));
    }
  }
  return done(rc, "reading every fallback");
}

Status StoreShard::eviction_rows(std::int64_t unused_before_s, std::int64_t min_usage, std::vector<EvictionRow>& out) {
  // The rule of evict()'s own query (evictable_), with the counts a lookup
  // noted but did not write yet: they only ever keep a row.
  Statement q;
  CLM_RETURN_IF_ERROR(
      db_.prepare("SELECT s.id, s.tenant, s.suffix_key, s.version, coalesce(u.usage_count, 0) AS used,"
                  " coalesce(u.last_used, s.created_at) AS last FROM semantic_snapshots s"
                  " LEFT JOIN usage.snapshot_usage u ON u.id = s.id"
                  " WHERE last < ?1 AND used < ?2 ORDER BY last, s.id",
                  q));
  q.bind_int(1, unused_before_s);
  q.bind_int(2, min_usage);
  int rc;
  while ((rc = q.step()) == SQLITE_ROW) {
    EvictionRow r;
    const std::int64_t id = q.column_int(0);
    const auto t = q.column_blob(1);
    r.tenant.assign(reinterpret_cast<const char*>(t.data()), t.size());
    r.key.assign(q.column_text(2));
    r.version = static_cast<std::int32_t>(q.column_int(3));
    r.usage_count = q.column_int(4);
    r.last_used_s = q.column_int(5);
    if (const auto pending = pending_usage_.find(id); pending != pending_usage_.end()) {
      r.usage_count += pending->second.count;
      r.last_used_s = std::max(r.last_used_s, pending->second.last_s);
      if (r.usage_count >= min_usage || r.last_used_s >= unused_before_s) continue;
    }
    out.push_back(std::move(r));
  }
  return done(rc, "finding the rows eviction would take");
}

Status StoreShard::key_row_vectors(std::string_view tenant, const SuffixKey& key, std::vector<SnapshotRowVector>& out,
                                   std::int64_t& unreadable) {
  Statement q;
  CLM_RETURN_IF_ERROR(
      db_.prepare("SELECT id, version, created_at, confirmations, snapshot, checksum FROM semantic_snapshots"
                  " WHERE suffix_hash = ?1 AND tenant = ?2 AND suffix_key = ?3 ORDER BY version, id",
                  q));
  q.bind_int(1, static_cast<std::int64_t>(key.fingerprint));  // SQLite stores i64
  q.bind_blob(2, tenant);
  q.bind_text(3, key.key);
  out.clear();
  unreadable = 0;
  int rc;
  while ((rc = q.step()) == SQLITE_ROW) {
    SnapshotRowVector r;
    r.id = q.column_int(0);
    r.version = static_cast<std::int32_t>(q.column_int(1));
    r.created_at_s = q.column_int(2);
    r.confirmations = q.column_int(3);
    r.vector.resize(static_cast<std::size_t>(settings_.dim));
    if (!decode_snapshot_blob(q.column_blob(4), settings_.dim, static_cast<std::uint64_t>(q.column_int(5)), r.vector)
             .ok()) {
      ++unreadable;
      continue;
    }
    out.push_back(std::move(r));
  }
  return done(rc, "reading a key's rows");
}

}  // namespace clm::store_detail
