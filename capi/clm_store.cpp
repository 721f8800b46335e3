// capi/clm_store.cpp: the C ABI of CLM's semantic snapshot store (clm.h,
// "the snapshot store" and "the snapshot store by hand"): suffix keys,
// lookups, records, outcome reports, fallbacks, flush and eviction; versions,
// pins, rollback, deletion and the blacklist. Conversion only; the logic is in
// clm::Engine (lookup_snapshots, record_snapshot, report_snapshot_outcome,
// suffix_key) and clm::SnapshotStore.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

#include "capi_internal.hpp"
#include "clm/store/snapshot_store.hpp"
#include "clm/store/suffix_key.hpp"

using namespace clm_capi;

namespace {

constexpr std::size_t kMaxBatch = std::size_t{1} << 20;  // sequences per call

clm_status no_store(const char* fn) {
  return fail(CLM_ERR_FAILED_PRECONDITION, fmt::format("{}: the engine has no snapshot store "
                                                       "(clm_engine_options.snapshot_store_path was not set)",
                                                       fn));
}

clm::SnapshotStore* store_of(const clm_engine* engine) { return engine->state->engine->snapshot_store(); }

clm_status check_kind(int32_t suffix_kind, const char* fn) {
  if (suffix_kind != CLM_SUFFIX_TEXT && suffix_kind != CLM_SUFFIX_KEY) {
    return fail(CLM_ERR_INVALID_ARGUMENT,
                fmt::format("{}: unknown suffix_kind {} (CLM_SUFFIX_TEXT or CLM_SUFFIX_KEY)", fn, suffix_kind));
  }
  return CLM_OK;
}

// One suffix as the Engine takes it. The views point into the caller's arrays.
clm_status suffix_ref(const char* fn, const char* what, const char* suffix, std::size_t suffix_len, const char* group,
                      std::size_t group_len, int32_t suffix_kind, clm::SuffixRef& out) {
  if (!suffix && suffix_len > 0) return fail(CLM_ERR_INVALID_ARGUMENT, fmt::format("{}: {} is NULL", fn, what));
  if (!group && group_len > 0) {
    return fail(CLM_ERR_INVALID_ARGUMENT, fmt::format("{}: the group of {} is NULL with a length", fn, what));
  }
  if (suffix_kind == CLM_SUFFIX_TEXT && group_len > 0) {
    return fail(CLM_ERR_INVALID_ARGUMENT,
                fmt::format("{}: {} is CLM_SUFFIX_TEXT but has a group (groups are for CLM_SUFFIX_KEY)", fn, what));
  }
  out.text = suffix ? std::string_view(suffix, suffix_len) : std::string_view();
  out.is_key = suffix_kind == CLM_SUFFIX_KEY;
  out.group = group ? std::string_view(group, group_len) : std::string_view();
  return CLM_OK;
}

clm_snapshot_hit to_c(const clm::SnapshotHit& hit) {
  clm_snapshot_hit out;
  std::memset(&out, 0, sizeof out);  // reserved bytes and the key's tail
  out.level = static_cast<int32_t>(hit.level);
  out.similarity = hit.similarity;
  out.version = hit.version;
  out.key_len = static_cast<uint32_t>(std::min<std::size_t>(hit.key.size(), UINT32_MAX));
  out.fingerprint = hit.fingerprint;
  out.stable = hit.stable ? 1 : 0;
  const std::size_t copied = std::min(hit.key.size(), sizeof out.key - 1);
  out.key_truncated = copied < hit.key.size() ? 1 : 0;
  std::memcpy(out.key, hit.key.data(), copied);
  return out;
}

// The tenant and key an administrative call names, checked: the key made
// by the engine's keyer (or the host's own), never a low-information one.
clm_status admin_target(const char* fn, const clm_engine* engine, const char* tenant_salt, std::size_t salt_len,
                        int32_t adapter_id, const char* suffix, std::size_t suffix_len, const char* group,
                        std::size_t group_len, int32_t suffix_kind, clm::SnapshotStore*& store, std::string& tenant,
                        clm::SuffixKey& key) {
  if (!engine) return null_argument(fn, "engine");
  if (!tenant_salt && salt_len > 0) return null_argument(fn, "tenant_salt (with salt_len > 0)");
  if (salt_len > kMaxSaltBytes) {
    return fail(CLM_ERR_INVALID_ARGUMENT, fmt::format("{}: salt_len {} exceeds {} bytes", fn, salt_len, kMaxSaltBytes));
  }
  if (clm_status s = check_kind(suffix_kind, fn)) return s;
  clm::SuffixRef ref;
  if (clm_status s = suffix_ref(fn, "the suffix", suffix, suffix_len, group, group_len, suffix_kind, ref)) return s;
  store = store_of(engine);
  if (!store) return no_store(fn);
  if (clm_status s = report(engine->state->engine->suffix_key(ref, key))) return s;
  if (key.low_information) {
    return fail(CLM_ERR_NOT_FOUND, fmt::format("{}: the text's key {} abstained ({}): nothing is stored under it", fn,
                                               key.key, key.abstain_reason));
  }
  tenant = clm::Engine::snapshot_tenant(tenant_salt ? std::string_view(tenant_salt, salt_len) : std::string_view(),
                                        adapter_id);
  return CLM_OK;
}

}  // namespace

extern "C" {

clm_status clm_suffix_key(char* key, size_t key_capacity, size_t* key_len, uint64_t* fingerprint,
                          const clm_engine* engine, const char* text, size_t text_len) {
  return guarded([&]() -> clm_status {
    const char* fn = "clm_suffix_key";
    if (!key_len) return null_argument(fn, "key_len");
    if (!engine) return null_argument(fn, "engine");
    if (!text && text_len > 0) return null_argument(fn, "text (with text_len > 0)");
    if (!store_of(engine)) return no_store(fn);
    clm::SuffixRef ref;
    ref.text = text ? std::string_view(text, text_len) : std::string_view();
    clm::SuffixKey made;
    if (clm_status s = report(engine->state->engine->suffix_key(ref, made))) return s;
    *key_len = made.key.size();
    if (!key || made.key.size() >= key_capacity) {
      return fail(CLM_ERR_INVALID_ARGUMENT, fmt::format("{}: the key needs {} bytes with its NUL, key holds {}", fn,
                                                        made.key.size() + 1, key ? key_capacity : 0));
    }
    std::memcpy(key, made.key.data(), made.key.size());
    key[made.key.size()] = '\0';
    if (fingerprint) *fingerprint = made.fingerprint;
    return CLM_OK;
  });
}

clm_status clm_engine_lookup_snapshots(clm_snapshot_hit* hits, float* snapshots, size_t snapshots_len, uint8_t* apply,
                                       clm_engine* engine, clm_seq* const* seqs, size_t n_seqs,
                                       const char* const* suffixes, const size_t* suffix_lens,
                                       const char* const* groups, const size_t* group_lens, int32_t suffix_kind,
                                       const float* queries, size_t queries_len) {
  return guarded([&]() -> clm_status {
    const char* fn = "clm_engine_lookup_snapshots";
    if (!engine) return null_argument(fn, "engine");
    if (n_seqs > kMaxBatch) {
      return fail(CLM_ERR_INVALID_ARGUMENT, fmt::format("{}: n_seqs {} exceeds {}", fn, n_seqs, kMaxBatch));
    }
    if (!hits && n_seqs > 0) return null_argument(fn, "hits");
    if (!apply && n_seqs > 0) return null_argument(fn, "apply");
    if (!snapshots && snapshots_len > 0) return null_argument(fn, "snapshots (with snapshots_len > 0)");
    if (!suffixes && n_seqs > 0) return null_argument(fn, "suffixes");
    if (!suffix_lens && n_seqs > 0) return null_argument(fn, "suffix_lens");
    if (groups && !group_lens && n_seqs > 0) return null_argument(fn, "group_lens (with groups)");
    if (!queries && queries_len > 0) return null_argument(fn, "queries (with queries_len > 0)");
    if (clm_status s = check_kind(suffix_kind, fn)) return s;
    if (groups && suffix_kind == CLM_SUFFIX_TEXT) {
      return fail(CLM_ERR_INVALID_ARGUMENT, fmt::format("{}: groups are for CLM_SUFFIX_KEY; pass NULL with "
                                                        "CLM_SUFFIX_TEXT",
                                                        fn));
    }
    clm::SnapshotStore* store = store_of(engine);
    if (!store) return no_store(fn);
    const auto dim = static_cast<std::size_t>(store->config().snapshot_dim);
    if (snapshots_len != n_seqs * dim) {
      return fail(CLM_ERR_INVALID_ARGUMENT, fmt::format("{}: snapshots_len {} is not n_seqs * snapshot_dim = {} * {}",
                                                        fn, snapshots_len, n_seqs, dim));
    }
    if (queries && queries_len != n_seqs * dim) {
      return fail(CLM_ERR_INVALID_ARGUMENT,
                  fmt::format("{}: queries_len {} is not n_seqs * snapshot_dim = {} * {} (queries NULL: no level 2)",
                              fn, queries_len, n_seqs, dim));
    }
    std::vector<clm::SequenceId> ids;
    if (clm_status s = sequence_ids(engine, seqs, n_seqs, fn, ids)) return s;
    std::vector<clm::SuffixRef> refs(n_seqs);
    for (std::size_t i = 0; i < n_seqs; ++i) {
      const std::string what = fmt::format("suffixes[{}]", i);
      if (clm_status s = suffix_ref(fn, what.c_str(), suffixes[i], suffix_lens[i], groups ? groups[i] : nullptr,
                                    groups ? group_lens[i] : 0, suffix_kind, refs[i])) {
        return s;
      }
    }
    // Written to the caller's arrays only once the whole batch succeeded.
    std::vector<clm::SnapshotHit> found(n_seqs);
    std::vector<float> out(snapshots_len);
    std::vector<std::uint8_t> flags(n_seqs);
    if (clm_status s = report(engine->state->engine->lookup_snapshots(ids, refs, {queries, queries ? queries_len : 0},
                                                                      found, out, flags))) {
      return s;
    }
    for (std::size_t i = 0; i < n_seqs; ++i) hits[i] = to_c(found[i]);
    std::copy(out.begin(), out.end(), snapshots);
    std::copy(flags.begin(), flags.end(), apply);
    return CLM_OK;
  });
}

clm_status clm_engine_record_snapshot(int32_t* result, int32_t* version, clm_engine* engine, clm_seq* seq,
                                      const char* suffix, size_t suffix_len, const char* group, size_t group_len,
                                      int32_t suffix_kind, const float* snapshot, size_t snapshot_len) {
  return guarded([&]() -> clm_status {
    const char* fn = "clm_engine_record_snapshot";
    if (!result) return null_argument(fn, "result");
    if (!version) return null_argument(fn, "version");
    if (!engine) return null_argument(fn, "engine");
    if (!snapshot && snapshot_len > 0) return null_argument(fn, "snapshot (with snapshot_len > 0)");
    if (clm_status s = check_kind(suffix_kind, fn)) return s;
    clm::SuffixRef ref;
    if (clm_status s = suffix_ref(fn, "suffix", suffix, suffix_len, group, group_len, suffix_kind, ref)) return s;
    if (!store_of(engine)) return no_store(fn);
    std::vector<clm::SequenceId> ids;
    if (clm_status s = sequence_ids(engine, &seq, 1, fn, ids)) return s;
    clm::RecordOutcome outcome;
    if (clm_status s = report(engine->state->engine->record_snapshot(ids[0], ref, {snapshot, snapshot_len}, outcome))) {
      return s;
    }
    *result = static_cast<int32_t>(outcome.result);
    *version = outcome.version;
    return CLM_OK;
  });
}

clm_status clm_engine_report_snapshot_outcome(clm_engine* engine, clm_seq* const* seqs, size_t n_seqs,
                                              const uint8_t* correct) {
  return guarded([&]() -> clm_status {
    const char* fn = "clm_engine_report_snapshot_outcome";
    if (!engine) return null_argument(fn, "engine");
    if (n_seqs > kMaxBatch) {
      return fail(CLM_ERR_INVALID_ARGUMENT, fmt::format("{}: n_seqs {} exceeds {}", fn, n_seqs, kMaxBatch));
    }
    if (!correct && n_seqs > 0) return null_argument(fn, "correct");
    if (!store_of(engine)) return no_store(fn);
    std::vector<clm::SequenceId> ids;
    if (clm_status s = sequence_ids(engine, seqs, n_seqs, fn, ids)) return s;
    return report(engine->state->engine->report_snapshot_outcome(ids, {correct, n_seqs}));
  });
}

clm_status clm_engine_set_fallback_snapshot(clm_engine* engine, const char* tenant_salt, size_t salt_len,
                                            int32_t adapter_id, const char* name, size_t name_len,
                                            const float* snapshot, size_t snapshot_len) {
  return guarded([&]() -> clm_status {
    const char* fn = "clm_engine_set_fallback_snapshot";
    if (!engine) return null_argument(fn, "engine");
    if (!tenant_salt && salt_len > 0) return null_argument(fn, "tenant_salt (with salt_len > 0)");
    if (salt_len > kMaxSaltBytes) {
      return fail(CLM_ERR_INVALID_ARGUMENT,
                  fmt::format("{}: salt_len {} exceeds {} bytes", fn, salt_len, kMaxSaltBytes));
    }
    if (!name && name_len > 0) return null_argument(fn, "name (with name_len > 0)");
    if (!snapshot && snapshot_len > 0) return null_argument(fn, "snapshot (with snapshot_len > 0)");
    clm::SnapshotStore* store = store_of(engine);
    if (!store) return no_store(fn);
    const std::string tenant = clm::Engine::snapshot_tenant(
        tenant_salt ? std::string_view(tenant_salt, salt_len) : std::string_view(), adapter_id);
    return report(store->set_fallback(tenant, name ? std::string_view(name, name_len) : std::string_view(),
                                      {snapshot, snapshot_len}));
  });
}

clm_status clm_engine_flush_snapshot_store(clm_engine* engine) {
  return guarded([&]() -> clm_status {
    const char* fn = "clm_engine_flush_snapshot_store";
    if (!engine) return null_argument(fn, "engine");
    clm::SnapshotStore* store = store_of(engine);
    if (!store) return no_store(fn);
    return report(store->flush());
  });
}

clm_status clm_engine_evict_snapshots(int64_t* deleted, clm_engine* engine) {
  return guarded([&]() -> clm_status {
    const char* fn = "clm_engine_evict_snapshots";
    if (!deleted) return null_argument(fn, "deleted");
    if (!engine) return null_argument(fn, "engine");
    clm::SnapshotStore* store = store_of(engine);
    if (!store) return no_store(fn);
    clm::EvictionReport evicted;
    if (clm_status s = report(store->evict(evicted))) return s;
    *deleted = evicted.deleted;
    return CLM_OK;
  });
}

// ---- administration ----------------------------------------------------------

clm_status clm_engine_snapshot_versions(clm_snapshot_version* versions, size_t capacity, size_t* count,
                                        clm_engine* engine, const char* tenant_salt, size_t salt_len,
                                        int32_t adapter_id, const char* suffix, size_t suffix_len, const char* group,
                                        size_t group_len, int32_t suffix_kind) {
  return guarded([&]() -> clm_status {
    const char* fn = "clm_engine_snapshot_versions";
    if (!count) return null_argument(fn, "count");
    if (!versions && capacity > 0) return null_argument(fn, "versions (with capacity > 0)");
    clm::SnapshotStore* store = nullptr;
    std::string tenant;
    clm::SuffixKey key;
    if (clm_status s = admin_target(fn, engine, tenant_salt, salt_len, adapter_id, suffix, suffix_len, group, group_len,
                                    suffix_kind, store, tenant, key)) {
      return s;
    }
    std::vector<clm::SnapshotVersionInfo> list;
    if (clm_status s = report(store->list_versions(tenant, key, list))) return s;
    *count = list.size();
    if (list.size() > capacity) {
      return fail(CLM_ERR_INVALID_ARGUMENT,
                  fmt::format("{}: the key has {} versions, capacity is {}", fn, list.size(), capacity));
    }
    for (std::size_t i = 0; i < list.size(); ++i) {
      clm_snapshot_version v;
      std::memset(&v, 0, sizeof v);
      v.version = list[i].version;
      v.readable = list[i].readable ? 1 : 0;
      v.stable = list[i].stable ? 1 : 0;
      v.pinned = list[i].pinned ? 1 : 0;
      v.served = list[i].served ? 1 : 0;
      v.created_at = list[i].created_at_s;
      v.last_used = list[i].last_used_s;
      v.usage_count = list[i].usage_count;
      v.confirmations = list[i].confirmations;
      versions[i] = v;
    }
    return CLM_OK;
  });
}

clm_status clm_engine_pin_snapshot_version(clm_engine* engine, const char* tenant_salt, size_t salt_len,
                                           int32_t adapter_id, const char* suffix, size_t suffix_len, const char* group,
                                           size_t group_len, int32_t suffix_kind, int32_t version) {
  return guarded([&]() -> clm_status {
    clm::SnapshotStore* store = nullptr;
    std::string tenant;
    clm::SuffixKey key;
    if (clm_status s = admin_target("clm_engine_pin_snapshot_version", engine, tenant_salt, salt_len, adapter_id,
                                    suffix, suffix_len, group, group_len, suffix_kind, store, tenant, key)) {
      return s;
    }
    return report(store->pin_version(tenant, key, version));
  });
}

clm_status clm_engine_unpin_snapshot_version(clm_engine* engine, const char* tenant_salt, size_t salt_len,
                                             int32_t adapter_id, const char* suffix, size_t suffix_len,
                                             const char* group, size_t group_len, int32_t suffix_kind) {
  return guarded([&]() -> clm_status {
    clm::SnapshotStore* store = nullptr;
    std::string tenant;
    clm::SuffixKey key;
    if (clm_status s = admin_target("clm_engine_unpin_snapshot_version", engine, tenant_salt, salt_len, adapter_id,
                                    suffix, suffix_len, group, group_len, suffix_kind, store, tenant, key)) {
      return s;
    }
    return report(store->unpin_version(tenant, key));
  });
}

clm_status clm_engine_roll_back_snapshot_key(int64_t* deleted, clm_engine* engine, const char* tenant_salt,
                                             size_t salt_len, int32_t adapter_id, const char* suffix, size_t suffix_len,
                                             const char* group, size_t group_len, int32_t suffix_kind,
                                             int32_t version) {
  return guarded([&]() -> clm_status {
    const char* fn = "clm_engine_roll_back_snapshot_key";
    if (!deleted) return null_argument(fn, "deleted");
    clm::SnapshotStore* store = nullptr;
    std::string tenant;
    clm::SuffixKey key;
    if (clm_status s = admin_target(fn, engine, tenant_salt, salt_len, adapter_id, suffix, suffix_len, group, group_len,
                                    suffix_kind, store, tenant, key)) {
      return s;
    }
    std::int64_t n = 0;
    if (clm_status s = report(store->roll_back(tenant, key, version, n))) return s;
    *deleted = n;
    return CLM_OK;
  });
}

clm_status clm_engine_delete_snapshot_key(int64_t* deleted, clm_engine* engine, const char* tenant_salt,
                                          size_t salt_len, int32_t adapter_id, const char* suffix, size_t suffix_len,
                                          const char* group, size_t group_len, int32_t suffix_kind) {
  return guarded([&]() -> clm_status {
    const char* fn = "clm_engine_delete_snapshot_key";
    if (!deleted) return null_argument(fn, "deleted");
    clm::SnapshotStore* store = nullptr;
    std::string tenant;
    clm::SuffixKey key;
    if (clm_status s = admin_target(fn, engine, tenant_salt, salt_len, adapter_id, suffix, suffix_len, group, group_len,
                                    suffix_kind, store, tenant, key)) {
      return s;
    }
    std::int64_t n = 0;
    if (clm_status s = report(store->delete_key(tenant, key, n))) return s;
    *deleted = n;
    return CLM_OK;
  });
}

clm_status clm_engine_delete_snapshot_tenant(int64_t* deleted_rows, clm_engine* engine, const char* tenant_salt,
                                             size_t salt_len, int32_t adapter_id) {
  return guarded([&]() -> clm_status {
    const char* fn = "clm_engine_delete_snapshot_tenant";
    if (!deleted_rows) return null_argument(fn, "deleted_rows");
    if (!engine) return null_argument(fn, "engine");
    if (!tenant_salt && salt_len > 0) return null_argument(fn, "tenant_salt (with salt_len > 0)");
    if (salt_len > kMaxSaltBytes) {
      return fail(CLM_ERR_INVALID_ARGUMENT,
                  fmt::format("{}: salt_len {} exceeds {} bytes", fn, salt_len, kMaxSaltBytes));
    }
    clm::SnapshotStore* store = store_of(engine);
    if (!store) return no_store(fn);
    clm::TenantDeletionReport r;
    if (clm_status s = report(store->delete_tenant(
            clm::Engine::snapshot_tenant(tenant_salt ? std::string_view(tenant_salt, salt_len) : std::string_view(),
                                         adapter_id),
            r))) {
      return s;
    }
    *deleted_rows = r.rows;
    return CLM_OK;
  });
}

clm_status clm_engine_blacklist_snapshot_key(clm_engine* engine, const char* tenant_salt, size_t salt_len,
                                             int32_t adapter_id, const char* suffix, size_t suffix_len,
                                             const char* group, size_t group_len, int32_t suffix_kind,
                                             const char* reason, size_t reason_len, int64_t until_ms) {
  return guarded([&]() -> clm_status {
    const char* fn = "clm_engine_blacklist_snapshot_key";
    if (!reason && reason_len > 0) return null_argument(fn, "reason (with reason_len > 0)");
    clm::SnapshotStore* store = nullptr;
    std::string tenant;
    clm::SuffixKey key;
    if (clm_status s = admin_target(fn, engine, tenant_salt, salt_len, adapter_id, suffix, suffix_len, group, group_len,
                                    suffix_kind, store, tenant, key)) {
      return s;
    }
    return report(store->blacklist_key(tenant, key, reason ? std::string_view(reason, reason_len) : std::string_view(),
                                       until_ms));
  });
}

clm_status clm_engine_snapshot_blacklist(clm_snapshot_blacklist_entry* entries, size_t capacity, size_t* count,
                                         clm_engine* engine) {
  return guarded([&]() -> clm_status {
    const char* fn = "clm_engine_snapshot_blacklist";
    if (!count) return null_argument(fn, "count");
    if (!entries && capacity > 0) return null_argument(fn, "entries (with capacity > 0)");
    if (!engine) return null_argument(fn, "engine");
    clm::SnapshotStore* store = store_of(engine);
    if (!store) return no_store(fn);
    std::vector<clm::BlacklistEntry> list;
    if (clm_status s = report(store->list_blacklist(list))) return s;
    *count = list.size();
    if (list.size() > capacity) {
      return fail(CLM_ERR_INVALID_ARGUMENT,
                  fmt::format("{}: {} entries are in force, capacity is {}", fn, list.size(), capacity));
    }
    // Copies text into a NUL-terminated field of CLM_SNAPSHOT_KEY_BYTES, its first bytes if longer.
    auto copy_text = [](std::string_view text, char* field, uint32_t& len, uint8_t& truncated) {
      const std::size_t copied = std::min<std::size_t>(text.size(), CLM_SNAPSHOT_KEY_BYTES - 1);
      std::memcpy(field, text.data(), copied);
      len = static_cast<uint32_t>(std::min<std::size_t>(text.size(), UINT32_MAX));
      truncated = copied < text.size() ? 1 : 0;
    };
    for (std::size_t i = 0; i < list.size(); ++i) {
      const clm::BlacklistEntry& e = list[i];
      clm_snapshot_blacklist_entry out;
      std::memset(&out, 0, sizeof out);
      out.until_ms = e.until_ms;
      out.fingerprint = e.fingerprint;
      out.by_hand = e.by_hand ? 1 : 0;
      std::string_view salt;
      clm::Engine::snapshot_tenant_parts(e.tenant, salt, out.adapter_id);
      copy_text(salt, out.salt, out.salt_len, out.salt_truncated);
      copy_text(e.key, out.key, out.key_len, out.key_truncated);
      copy_text(e.reason, out.reason, out.reason_len, out.reason_truncated);
      entries[i] = out;
    }
    return CLM_OK;
  });
}

clm_status clm_engine_unblacklist_snapshot_key(clm_engine* engine, const char* tenant_salt, size_t salt_len,
                                               int32_t adapter_id, const char* suffix, size_t suffix_len,
                                               const char* group, size_t group_len, int32_t suffix_kind) {
  return guarded([&]() -> clm_status {
    clm::SnapshotStore* store = nullptr;
    std::string tenant;
    clm::SuffixKey key;
    if (clm_status s = admin_target("clm_engine_unblacklist_snapshot_key", engine, tenant_salt, salt_len, adapter_id,
                                    suffix, suffix_len, group, group_len, suffix_kind, store, tenant, key)) {
      return s;
    }
    return report(store->unblacklist_key(tenant, key));
  });
}

}  // extern "C"
