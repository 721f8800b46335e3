// clm/engine/engine_snapshots.hpp: the Engine's CLM snapshot calls, out of
// the class: injecting snapshots into a batch's hidden states, and the
// snapshot store's lookups, records and outcome reports under each running
// sequence's tenant. engine.hpp declares and documents them, and includes
// this header at its end; include that one. In short (docs/clm.md):
//
//   std::vector<clm::SnapshotHit> hits(n);
//   std::vector<float> snapshots(n * dim);
//   std::vector<std::uint8_t> apply(n);
//   CLM_RETURN_IF_ERROR(engine->lookup_snapshots(ids, suffixes, queries, hits, snapshots, apply));
//   CLM_RETURN_IF_ERROR(engine->inject_snapshots(ids, hidden, indptr, snapshots, apply, layer));
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "clm/engine.hpp"

namespace clm {

inline Status Engine::inject_snapshots(std::span<const SequenceId> ids, ActivationView hidden_states,
                                       std::span<const std::int32_t> indptr, std::span<const float> snapshots,
                                       std::span<const std::uint8_t> apply, std::int32_t layer) {
  const std::shared_ptr<const SnapshotAdapter> adapter = snapshot_adapter();
  if (!adapter) return failed_precondition("inject_snapshots: no snapshot adapter is installed");
  if (apply.size() != ids.size()) {
    return invalid_argument(fmt::format("inject_snapshots: {} sequences but {} apply flags", ids.size(), apply.size()));
  }
  return src_.with_baseline_flags(ids, [&](std::span<const std::uint8_t> baseline, std::uint64_t& injected) {
    std::vector<std::uint8_t> effective(ids.size());
    std::uint64_t sequences = 0;  // that get the delta on at least one row
    for (std::size_t i = 0; i < ids.size(); ++i) {
      effective[i] = apply[i] != 0 && baseline[i] == 0 ? 1 : 0;
      if (effective[i] != 0 && i + 1 < indptr.size() && indptr[i + 1] > indptr[i]) ++sequences;
    }
    CLM_RETURN_IF_ERROR(adapter->inject_batch(hidden_states, indptr, snapshots, effective, layer));
    injected = adapter->injects_at(layer) ? sequences : 0;
    return Status{};
  });
}

inline Status Engine::suffix_key(const SuffixRef& suffix, SuffixKey& out) const {
  if (!store_) return failed_precondition("suffix_key: the engine has no snapshot store");
  if (suffix.is_key) return SuffixKeyer::from_host_key(suffix.text, suffix.group, out);
  return store_->keyer().make_key(suffix.text, out);
}

inline Status Engine::lookup_snapshots(std::span<const SequenceId> ids, std::span<const SuffixRef> suffixes,
                                       std::span<const float> queries, std::span<SnapshotHit> hits,
                                       std::span<float> snapshots, std::span<std::uint8_t> apply) {
  if (!store_) return failed_precondition("lookup_snapshots: the engine has no snapshot store");
  const auto dim = static_cast<std::size_t>(store_->config().snapshot_dim);
  const std::size_t n = ids.size();
  if (suffixes.size() != n || hits.size() != n || apply.size() != n || snapshots.size() != n * dim ||
      (!queries.empty() && queries.size() != n * dim)) {
    return invalid_argument(fmt::format(
        "lookup_snapshots: {} sequences need {} suffixes, hits and apply flags and {} snapshot values ({} queries, "
        "or none); got {}, {}, {}, {} and {}",
        n, n, n * dim, n * dim, suffixes.size(), hits.size(), apply.size(), snapshots.size(), queries.size()));
  }
  CLM_RETURN_IF_ERROR(check_distinct(ids, "lookup_snapshots"));
  for (std::size_t i = 0; i < queries.size(); i += dim) {  // what the store would refuse, before any lookup
    CLM_RETURN_IF_ERROR(check_snapshot_vector(queries.subspan(i, dim), static_cast<std::int32_t>(dim),
                                              fmt::format("lookup_snapshots: query {}", i / dim)));
  }
  std::vector<SuffixKey> keys(n);
  for (std::size_t i = 0; i < n; ++i) {
    Status made = suffix_key(suffixes[i], keys[i]);
    if (!made.ok()) return Status(made.code(), fmt::format("lookup_snapshots: suffix {}: {}", i, made.message()));
  }
  std::vector<std::string> tenants;
  CLM_RETURN_IF_ERROR(tenants_of(ids, "lookup_snapshots", tenants));
  std::vector<std::uint8_t> found(n, 0);
  for (std::size_t i = 0; i < n; ++i) {
    std::span<float> out = snapshots.subspan(i * dim, dim);
    std::fill(out.begin(), out.end(), 0.0f);
    CLM_RETURN_IF_ERROR(
        store_->lookup(tenants[i], keys[i], queries.empty() ? queries : queries.subspan(i * dim, dim), hits[i], out));
    found[i] = hits[i].level != SnapshotLevel::miss ? 1 : 0;
    apply[i] = found[i];
  }
  // The CLM watch: each sequence's last SRC score with the key it looks up,
  // once per sequence and key (a host looks up every step).
  struct Sighting {
    std::size_t index = 0;
    float score = 0.0f;
    std::string name;  // the tenant's name, or its salt (named by its digest below)
    bool named = false;
  };
  std::vector<Sighting> sightings;
  if (config_.clm_watch.enabled) {
    for (std::size_t i = 0; i < n; ++i) {
      float score = 0.0f;
      if (!keys[i].key.empty() && src_.last_score(ids[i], score)) sightings.push_back({i, score, {}, false});
    }
  }
  {
    std::lock_guard lock(mutex_);
    std::erase_if(sightings, [&](Sighting& s) {
      auto it = sequences_.find(ids[s.index]);
      if (it == sequences_.end()) return true;
      std::vector<std::uint64_t>& watched = it->second->watched_fingerprints;
      if (std::find(watched.begin(), watched.end(), keys[s.index].fingerprint) != watched.end()) return true;
      if (watched.size() == Sequence::kMaxWatchedKeys) watched.erase(watched.begin());
      watched.push_back(keys[s.index].fingerprint);
      s.named = !it->second->tenant_name.empty();
      s.name = s.named ? it->second->tenant_name : it->second->salt;
      return false;
    });
    for (std::size_t i = 0; i < n; ++i) {
      auto it = sequences_.find(ids[i]);
      if (it == sequences_.end()) continue;  // ended meanwhile
      // The pair is kept: a wrong level-2 serve blames the served key for
      // this query key only (breaker (b)).
      it->second->looked_up = found[i] ? keys[i] : SuffixKey{};
      it->second->served = SnapshotHit{};
      if (found[i]) {
        it->second->served.level = hits[i].level;
        it->second->served.key = hits[i].key;  // another key's at levels 2 and 3
        it->second->served.fingerprint = hits[i].fingerprint;
        it->second->served.version = hits[i].version;
      }
    }
  }
  for (const Sighting& s : sightings) {  // outside the engine's lock: a digest is a SHA-256
    std::string_view salt;
    std::int32_t adapter_id = 0;
    snapshot_tenant_parts(tenants[s.index], salt, adapter_id);
    clm_watch_->sighting(tenants[s.index], s.named ? s.name : KvEventRecorder::salt_digest(s.name), adapter_id,
                         keys[s.index].key, s.score);
  }
  return src_.report_retrieval(ids, found);
}

inline Status Engine::record_snapshot(SequenceId id, const SuffixRef& suffix, std::span<const float> snapshot,
                                      RecordOutcome& outcome) {
  if (!store_) return failed_precondition("record_snapshot: the engine has no snapshot store");
  SuffixKey key;
  CLM_RETURN_IF_ERROR(suffix_key(suffix, key));
  std::string tenant, tenant_name;
  {
    std::lock_guard lock(mutex_);
    Sequence* seq = nullptr;
    CLM_RETURN_IF_ERROR(find(id, "record_snapshot", seq));
    tenant = seq->tenant();
    tenant_name = seq->tenant_name;
  }
  // The store's events for this tenant (a version now, a blacklist later) carry its name.
  clm_watch_->name_tenant(tenant, tenant_name);
  return store_->record(tenant, key, snapshot, outcome);
}

inline Status Engine::report_snapshot_outcome(std::span<const SequenceId> ids, std::span<const std::uint8_t> correct) {
  if (!store_) return failed_precondition("report_snapshot_outcome: the engine has no snapshot store");
  if (correct.size() != ids.size()) {
    return invalid_argument(
        fmt::format("report_snapshot_outcome: {} sequences but {} outcomes", ids.size(), correct.size()));
  }
  CLM_RETURN_IF_ERROR(check_distinct(ids, "report_snapshot_outcome"));
  std::vector<std::string> tenants;
  CLM_RETURN_IF_ERROR(tenants_of(ids, "report_snapshot_outcome", tenants));
  std::vector<SuffixKey> queries(ids.size());
  std::vector<SnapshotHit> served(ids.size());
  {
    std::lock_guard lock(mutex_);
    for (std::size_t i = 0; i < ids.size(); ++i) {
      Sequence* seq = nullptr;
      CLM_RETURN_IF_ERROR(find(ids[i], "report_snapshot_outcome", seq));
      if (seq->served.level == SnapshotLevel::miss) {
        return failed_precondition(fmt::format(
            "report_snapshot_outcome: sequence {} was served no snapshot by its last lookup, or it was reported",
            ids[i]));
      }
    }
    for (std::size_t i = 0; i < ids.size(); ++i) {  // one report per served snapshot
      Sequence& seq = *sequences_.find(ids[i])->second;
      queries[i] = std::move(seq.looked_up);
      served[i] = std::move(seq.served);
      seq.looked_up = SuffixKey{};
      seq.served = SnapshotHit{};
    }
  }
  for (std::size_t i = 0; i < ids.size(); ++i) {
    CLM_RETURN_IF_ERROR(store_->report_outcome(tenants[i], queries[i], served[i], correct[i] != 0));
  }
  return {};
}

inline Status Engine::check_distinct(std::span<const SequenceId> ids, const char* what) {
  std::vector<SequenceId> sorted(ids.begin(), ids.end());
  std::sort(sorted.begin(), sorted.end());
  const auto twice = std::adjacent_find(sorted.begin(), sorted.end());
  if (twice != sorted.end()) return invalid_argument(fmt::format("{}: sequence {} is listed twice", what, *twice));
  return {};
}

inline Status Engine::tenants_of(std::span<const SequenceId> ids, const char* what, std::vector<std::string>& out) {
  std::lock_guard lock(mutex_);
  out.resize(ids.size());
  for (std::size_t i = 0; i < ids.size(); ++i) {
    Sequence* seq = nullptr;
    CLM_RETURN_IF_ERROR(find(ids[i], what, seq));
    out[i] = seq->tenant();
  }
  return {};
}

}  // namespace clm
