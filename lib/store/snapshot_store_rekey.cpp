// lib/store/snapshot_store_rekey.cpp: SnapshotStore::rekey (clm/store/
// snapshot_store.hpp): every key made again from its text under the current
// rules, rows moved between shards through an outbox, or the rules adopted.
#include "clm/store/snapshot_store.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <filesystem>
#include <list>
#include <map>
#include <mutex>
#include <set>
#include <thread>
#include <unordered_map>
#include <unordered_set>

#include <fmt/format.h>

#include "snapshot_store_impl.hpp"

namespace clm {

using store_detail::kStoreFormat;
using namespace store_impl;  // NOLINT(google-build-using-namespace): the store's own helpers

// ---- rekey ------------------------------------------------------------------

namespace {

constexpr std::size_t kRekeyChunk = 1024;  // rows read at a time

using Shards = std::vector<std::unique_ptr<StoreShard>>;

// Deletes every index file of the store (shard-NN.<tenant>.hnsw, its .meta,
// temporary files): their labels name the old keys, and moved rows left them.
Status remove_index_files(const std::string& dir) {
  std::error_code ec;
  std::vector<std::filesystem::path> doomed;
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind("shard-", 0) == 0 && name.find(".hnsw") != std::string::npos) doomed.push_back(entry.path());
  }
  if (ec) return io_error(fmt::format("rekey: cannot list {}: {}", dir, ec.message()));
  for (const auto& path : doomed) {
    if (!std::filesystem::remove(path, ec) && ec) {
      return io_error(fmt::format("rekey: cannot delete the index file {}: {}", path.string(), ec.message()));
    }
  }
  return {};
}

// The key a row's text makes now, or why it makes none that may be served.
bool rekey_text(const SuffixKeyer& keyer, const std::string& text, SuffixKey& key, std::string& why) {
  const Status made = keyer.make_key(text, key);
  if (!made.ok()) {
    why = fmt::format("{}: {}", made.code_name(), made.message());
    return false;
  }
  if (key.low_information) {
    why = key.abstain_reason.empty() ? fmt::format("abstained: low information ({})", key.key)
                                     : fmt::format("abstained: {}", key.abstain_reason);
    return false;
  }
  return true;
}

struct RekeyRun {
  const SnapshotStoreConfig& config;
  const SuffixKeyer& keyer;
  Shards& shards;
  RekeyReport& report;
  ConsistentHashRing ring;
  std::map<std::string, RekeyReport::Drop> drops;

  void drop(const std::string& why, const std::string& text) {
    RekeyReport::Drop& d = drops[why];
    if (d.rows++ == 0) {
      d.reason = why;
      d.example = text;
    }
    ++report.dropped;
  }

  // Rows of shard s: new keys in place, rows of other shards to the outbox,
  // rows without a servable key deleted; one transaction.
  Status rows_of(std::int32_t s) {
    StoreShard& shard = *shards[static_cast<std::size_t>(s)];
    store_detail::ShardTransaction tx(shard);
    CLM_RETURN_IF_ERROR(tx.begin());
    std::vector<store_detail::RekeyRow> rows;
    std::int64_t after = 0;
    SuffixKey key;
    std::string why;
    do {
      CLM_RETURN_IF_ERROR(shard.rekey_rows(after, kRekeyChunk, rows));
      for (const store_detail::RekeyRow& row : rows) {
        after = row.id;
        if (!row.text) {
          ++report.kept;
          continue;
        }
        if (!rekey_text(keyer, *row.text, key, why)) {
          CLM_RETURN_IF_ERROR(shard.rekey_delete(row.id));
          CLM_RETURN_IF_ERROR(shard.drop_blacklisted(row.tenant, row.fingerprint, report.blacklist_dropped));
          drop(why, *row.text);
          continue;
        }
        ++report.rekeyed;
        const bool changed = key.key != row.key || key.fingerprint != row.fingerprint;
        if (changed) {
          ++report.changed;
          CLM_RETURN_IF_ERROR(shard.drop_blacklisted(row.tenant, row.fingerprint, report.blacklist_dropped));
        }
        if (route(ring, row.tenant, key.group) != s) {
          ++report.moved;
          CLM_RETURN_IF_ERROR(shard.rekey_to_outbox(row.id));  // its key is made again on delivery
        } else if (changed || key.group != row.group) {
          CLM_RETURN_IF_ERROR(shard.rekey_update(row.id, key));
        }
      }
    } while (rows.size() == kRekeyChunk);
    CLM_RETURN_IF_ERROR(shard.drop_sightings(report.sightings_dropped));
    return tx.commit();
  }

  // Delivers shard s's outbox: each row into its new shard (with the
  // (shard, id) it came from in that shard's inbox), then out of the outbox.
  // Rows some shard's inbox already holds (delivered before a crash) are only
  // taken out.
  Status deliver(std::int32_t s, const std::set<std::pair<std::int32_t, std::int64_t>>& delivered) {
    StoreShard& source = *shards[static_cast<std::size_t>(s)];
    std::vector<store_detail::MovedRow> rows;
    SuffixKey key;
    std::string why;
    do {
      CLM_RETURN_IF_ERROR(source.outbox_rows(0, kRekeyChunk, rows));
      std::map<std::int32_t, std::vector<std::pair<const store_detail::MovedRow*, SuffixKey>>> by_target;
      for (const store_detail::MovedRow& row : rows) {
        if (delivered.count({s, row.id})) continue;
        if (!rekey_text(keyer, row.text, key, why)) {  // possible when a rerun has other rules than the first run
          drop(why, row.text);
          continue;
        }
        by_target[route(ring, row.tenant, key.group)].emplace_back(&row, key);
      }
      for (const auto& [t, batch] : by_target) {
        StoreShard& target = *shards[static_cast<std::size_t>(t)];
        store_detail::ShardTransaction tx(target);
        CLM_RETURN_IF_ERROR(tx.begin());
        for (const auto& [row, new_key] : batch) CLM_RETURN_IF_ERROR(target.receive(*row, s, new_key));
        CLM_RETURN_IF_ERROR(tx.commit());
      }
      store_detail::ShardTransaction tx(source);
      CLM_RETURN_IF_ERROR(tx.begin());
      for (const store_detail::MovedRow& row : rows) CLM_RETURN_IF_ERROR(source.outbox_delete(row.id));
      CLM_RETURN_IF_ERROR(tx.commit());
    } while (!rows.empty());
    return {};
  }

  Status run(std::uint64_t rules) {
    // 1. Mark every shard (and create its outbox and inbox) before any row
    // changes: from here until step 5, open() refuses the store.
    for (auto& shard : shards) {
      store_detail::ShardTransaction tx(*shard);
      CLM_RETURN_IF_ERROR(tx.begin());
      const auto from = static_cast<std::uint64_t>(shard->meta_value("key_rules").value_or(0));
      CLM_RETURN_IF_ERROR(shard->begin_rekey(from, rules));
      CLM_RETURN_IF_ERROR(tx.commit());
    }
    CLM_RETURN_IF_ERROR(remove_index_files(config.path));
    // 2. New keys, shard by shard.
    for (std::int32_t s = 0; s < config.num_shards; ++s) CLM_RETURN_IF_ERROR(rows_of(s));
    // 3. Rows that change shards.
    std::set<std::pair<std::int32_t, std::int64_t>> delivered;
    for (auto& shard : shards) {
      std::vector<std::pair<std::int32_t, std::int64_t>> inbox;
      CLM_RETURN_IF_ERROR(shard->inbox(inbox));
      delivered.insert(inbox.begin(), inbox.end());
    }
    for (std::int32_t s = 0; s < config.num_shards; ++s) CLM_RETURN_IF_ERROR(deliver(s, delivered));
    // 4. Versions of keys that became one.
    for (auto& shard : shards) {
      store_detail::ShardTransaction tx(*shard);
      CLM_RETURN_IF_ERROR(tx.begin());
      CLM_RETURN_IF_ERROR(shard->renumber_versions(report.versions_renumbered));
      CLM_RETURN_IF_ERROR(tx.commit());
    }
    // 5. The new rules, once every shard is done.
    for (auto& shard : shards) {
      store_detail::ShardTransaction tx(*shard);
      CLM_RETURN_IF_ERROR(tx.begin());
      CLM_RETURN_IF_ERROR(shard->finish_rekey(rules));
      CLM_RETURN_IF_ERROR(tx.commit());
    }
    for (auto& [why, d] : drops) report.drops.push_back(std::move(d));
    std::stable_sort(report.drops.begin(), report.drops.end(),
                     [](const RekeyReport::Drop& a, const RekeyReport::Drop& b) { return a.rows > b.rows; });
    return {};
  }
};

}  // namespace

Status SnapshotStore::rekey(const SnapshotStoreConfig& config, bool adopt, RekeyReport& report) try {
  report = RekeyReport{};
  CLM_RETURN_IF_ERROR(check_config(config));
  const std::string& dir = config.path;
  if (dir == ":memory:") return invalid_argument("rekey: a \":memory:\" store keeps nothing to rekey");
  std::error_code ec;
  if (!std::filesystem::is_directory(dir, ec)) {
    return not_found(fmt::format("rekey: no snapshot store at {} (no such directory)", dir));
  }
  if (!std::filesystem::exists(dir + "/shard-00.db", ec)) {
    return not_found(fmt::format("rekey: no snapshot store at {} (no shard-00.db)", dir));
  }
  std::unique_ptr<SuffixKeyer> keyer;
  CLM_RETURN_IF_ERROR(SuffixKeyer::create(config.keyer, keyer));
  const std::uint64_t rules = keyer->rules_fingerprint();
  report.new_rules = rules;
  report.adopted = adopt;
  {
    DirectoryLock lock;  // declared first: released after the shards close
    CLM_RETURN_IF_ERROR(lock.acquire(dir));
    Shards shards;
    // Read and check every shard before anything is written.
    for (std::int32_t s = 0; s < config.num_shards; ++s) {
      std::unique_ptr<StoreShard> shard;
      CLM_RETURN_IF_ERROR(StoreShard::open(shard_settings(config, s, rules), shard));
      if (s == 0 && shard->fresh()) {
        return not_found(fmt::format("rekey: no snapshot store at {} (shard-00.db holds none)", dir));
      }
      CLM_RETURN_IF_ERROR(shard->check_shape());
      shards.push_back(std::move(shard));
    }
    report.old_format = static_cast<std::int32_t>(kStoreFormat);
    for (const auto& shard : shards) {
      if (shard->fresh()) continue;
      report.old_format = std::min(report.old_format, static_cast<std::int32_t>(shard->format()));
      if (shard->meta_value("rekey_to")) report.resumed = true;
    }
    // The rules the keys had: those of the first shard an interrupted rekey
    // marked (it recorded them), else shard 0's.
    report.old_rules = static_cast<std::uint64_t>(shards[0]->meta_value("key_rules").value_or(0));
    for (const auto& shard : shards) {
      if (const auto from = shard->meta_value("rekey_from")) {
        report.old_rules = static_cast<std::uint64_t>(*from);
        break;
      }
    }
    if (adopt && report.resumed) {
      return failed_precondition(fmt::format(
          "rekey --adopt: a rekey of {} was interrupted, and some of its keys are new already: run `clm_store rekey "
          "{}` (without --adopt) to finish it",
          dir, dir));
    }
    if (!adopt && report.old_format < 2) {
      return failed_precondition(fmt::format(
          "rekey: {} is a format-1 store: its rows keep no text to make keys from. Run `clm_store rekey --adopt "
          "{}` to keep its keys under the current rules",
          dir, dir));
    }
    for (auto& shard : shards) {
      CLM_RETURN_IF_ERROR(shard->start(false));
      std::int64_t rows = 0, in_transit = 0;
      CLM_RETURN_IF_ERROR(shard->rekey_counts(rows, in_transit));
      report.rows_before += rows + in_transit;
    }
    if (adopt) {
      for (auto& shard : shards) {
        store_detail::ShardTransaction tx(*shard);
        CLM_RETURN_IF_ERROR(tx.begin());
        CLM_RETURN_IF_ERROR(shard->adopt(rules));
        CLM_RETURN_IF_ERROR(tx.commit());
      }
      report.kept = report.rows_before;
    } else {
      RekeyRun run{config, *keyer, shards, report, ConsistentHashRing(config.num_shards), {}};
      CLM_RETURN_IF_ERROR(run.run(rules));
    }
  }  // the directory lock is released: the store may open
  // Opening rebuilds the index files rekey deleted, and checks the result.
  SnapshotStoreConfig reopen = config;
  reopen.rebuild_in_background = false;
  std::unique_ptr<SnapshotStore> store;
  const Status opened = open(reopen, store);
  if (!opened.ok()) {
    return {opened.code(),
            fmt::format("rekey: the keys are done, but the store does not open: {} (its index files are rebuilt at "
                        "the next open)",
                        opened.message())};
  }
  const SnapshotStoreMetrics m = store->metrics();
  report.indexes_rebuilt = static_cast<std::int64_t>(m.index_rebuilds);
  report.rows_after = m.snapshots;
  return {};
} catch (...) {
  return current_exception_status("rekey");
}

}  // namespace clm
