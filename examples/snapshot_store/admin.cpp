// examples/snapshot_store/admin.cpp: the commands of `clm_store` with which
// an administrator corrects a store by hand (clm/store/snapshot_store.hpp,
// "administration"): a key's versions, pinning one, unpinning, rolling back,
// deleting a key or a whole tenant, and the blacklist. Each names its key as
// `lookup` does (a text, or --key and --group) under --tenant.
//
//   $ clm_store versions --store snaps "cancel order 789"
//   $ clm_store pin --store snaps --version 1 "cancel order 789"
//   $ clm_store blacklist --store snaps --reason "wrong answer" --hours 24 --key faq-12 --group orders
//   $ clm_store blacklist --store snaps --list
//   $ clm_store delete-tenant --store snaps --tenant acme
#include "admin.hpp"

namespace clm_store_cli {

namespace {

// The key a command names (named_suffix, key_of), never one the keyer
// abstained on: nothing is stored under it.
clm::SuffixKey stored_key(const NamedSuffix& suffix, const clm::SnapshotStore& store) {
  clm::SuffixKey key = key_of(suffix, store);
  if (key.low_information) {
    throw Failure{fmt::format("the text's key {} abstained ({}): it is never stored", key.key, key.abstain_reason)};
  }
  return key;
}

struct Opened {
  std::unique_ptr<clm::SnapshotStore> store;
  clm::SuffixKey key;
  std::string tenant;
};

// read_only: for the commands that only read (versions), which then run
// beside a server that holds the store.
Opened open_for_key(const Args& args, bool read_only = false) {
  const NamedSuffix suffix = named_suffix(args);  // usage errors before the store opens
  Opened o;
  o.store = read_only ? open_reader(store_config(args, false)) : open_store(store_config(args, false));
  o.key = stored_key(suffix, *o.store);
  o.tenant = args.get("--tenant").value_or("");
  return o;
}

}  // namespace

int cmd_versions(const Args& args) {
  Opened o = open_for_key(args, true);
  std::vector<clm::SnapshotVersionInfo> versions;
  check(o.store->list_versions(o.tenant, o.key, versions), "list_versions");
  if (args.has("--json")) {
    Json j;
    j["key"] = o.key.key;
    j["fingerprint"] = hex(o.key.fingerprint);
    j["tenant"] = printable(o.tenant);
    Json list = Json::array();
    for (const auto& v : versions) {
      list.push_back(Json{{"version", v.version},
                          {"created_at", v.created_at_s},
                          {"last_used", v.last_used_s},
                          {"usage_count", v.usage_count},
                          {"confirmations", v.confirmations},
                          {"readable", v.readable},
                          {"stable", v.stable},
                          {"pinned", v.pinned},
                          {"served", v.served}});
    }
    j["versions"] = list;
    fmt::print("{}\n", dump(j));
    return 0;
  }
  fmt::print("key {}  (fingerprint {}, tenant \"{}\"): {} version(s), newest first\n", o.key.key,
             hex(o.key.fingerprint), printable(o.tenant), versions.size());
  fmt::print("  {:>7}  {:<20}  {:<20}  {:>7}  {:>13}  {}\n", "version", "created", "last used", "usage",
             "confirmations", "state");
  for (const auto& v : versions) {
    std::string state;
    for (const auto& [on, word] : {std::pair{v.served, "served"}, std::pair{v.pinned, "pinned"},
                                   std::pair{v.stable, "stable"}, std::pair{!v.readable, "UNREADABLE"}}) {
      if (on) state += state.empty() ? word : std::string(", ") + word;
    }
    fmt::print("  {:>7}  {:<20}  {:<20}  {:>7}  {:>13}  {}\n", v.version, utc_ms(v.created_at_s * 1000),
               utc_ms(v.last_used_s * 1000), v.usage_count, v.confirmations, state);
  }
  return 0;
}

int cmd_pin(const Args& args) {
  const auto version = args.integer<std::int32_t>("--version", 1, std::numeric_limits<std::int32_t>::max());
  if (!version) throw UsageError{"--version is required"};
  Opened o = open_for_key(args);
  check(o.store->pin_version(o.tenant, o.key, *version), "pin_version");
  fmt::print("clm_store pin: {} serves version {} until `clm_store unpin`\n", o.key.key, *version);
  return 0;
}

int cmd_unpin(const Args& args) {
  Opened o = open_for_key(args);
  check(o.store->unpin_version(o.tenant, o.key), "unpin_version");
  fmt::print("clm_store unpin: {} serves its newest stable version again\n", o.key.key);
  return 0;
}

int cmd_rollback(const Args& args) {
  const auto version = args.integer<std::int32_t>("--to", 1, std::numeric_limits<std::int32_t>::max());
  if (!version) throw UsageError{"--to is required"};
  Opened o = open_for_key(args);
  std::int64_t deleted = 0;
  check(o.store->roll_back(o.tenant, o.key, *version, deleted), "roll_back");
  if (args.has("--json")) {
    fmt::print("{}\n", dump(Json{{"key", o.key.key}, {"to", *version}, {"deleted", deleted}}));
  } else {
    fmt::print("clm_store rollback: {} is back at version {}: {} newer version(s) deleted\n", o.key.key, *version,
               deleted);
  }
  return 0;
}

int cmd_delete_key(const Args& args) {
  Opened o = open_for_key(args);
  std::int64_t deleted = 0;
  check(o.store->delete_key(o.tenant, o.key, deleted), "delete_key");
  if (args.has("--json")) {
    fmt::print("{}\n", dump(Json{{"key", o.key.key}, {"deleted", deleted}}));
  } else {
    fmt::print("clm_store delete-key: {}: {} version(s) deleted\n", o.key.key, deleted);
  }
  return 0;
}

int cmd_delete_tenant(const Args& args) {
  args.no_positionals();
  if (!args.has("--tenant")) throw UsageError{"--tenant is required (--tenant '' names the empty tenant)"};
  const std::string tenant = *args.get("--tenant");
  auto store = open_store(store_config(args, false));
  clm::TenantDeletionReport r;
  check(store->delete_tenant(tenant, r), "delete_tenant");
  if (args.has("--json")) {
    fmt::print("{}\n", dump(Json{{"tenant", printable(tenant)},
                                 {"rows", r.rows},
                                 {"sightings", r.sightings},
                                 {"blacklist", r.blacklist},
                                 {"pins", r.pins},
                                 {"fallbacks", r.fallbacks}}));
  } else {
    fmt::print(
        "clm_store delete-tenant: \"{}\": {} rows, {} admission counts, {} blacklist entries, {} pins, {} "
        "fallbacks deleted\n",
        printable(tenant), r.rows, r.sightings, r.blacklist, r.pins, r.fallbacks);
  }
  return 0;
}

int cmd_blacklist(const Args& args) {
  if (args.has("--list")) {
    args.no_positionals();
    for (const char* flag : {"--text", "--key", "--group", "--reason", "--hours"}) {
      if (args.has(flag)) throw UsageError{fmt::format("--list takes no {}", flag)};
    }
    auto store = open_reader(store_config(args, false));
    std::vector<clm::BlacklistEntry> entries;
    check(store->list_blacklist(entries), "list_blacklist");
    if (args.has("--json")) {
      Json list = Json::array();
      for (const auto& e : entries) {
        list.push_back(Json{{"tenant", printable(e.tenant)},
                            {"key", e.key},
                            {"fingerprint", hex(e.fingerprint)},
                            {"until_ms", e.until_ms},
                            {"reason", e.reason},
                            {"by_hand", e.by_hand}});
      }
      fmt::print("{}\n", dump(list));
      return 0;
    }
    fmt::print("{} key(s) blacklisted\n", entries.size());
    for (const auto& e : entries) {
      fmt::print("  \"{}\"  {}  until {}  {}  {}\n", printable(e.tenant), e.key, utc_ms(e.until_ms),
                 e.by_hand ? "by hand" : "breaker", e.reason);
    }
    return 0;
  }
  const std::string reason = args.required("--reason");
  const double hours = args.real("--hours", 1e-3, 24.0 * 365 * 100).value_or(24.0);
  Opened o = open_for_key(args);
  const std::int64_t until = now_ms() + static_cast<std::int64_t>(hours * 3600.0 * 1000.0);
  check(o.store->blacklist_key(o.tenant, o.key, reason, until), "blacklist_key");
  fmt::print("clm_store blacklist: {} refused at every level until {}\n", o.key.key, utc_ms(until));
  return 0;
}

int cmd_unblacklist(const Args& args) {
  Opened o = open_for_key(args);
  check(o.store->unblacklist_key(o.tenant, o.key), "unblacklist_key");
  fmt::print("clm_store unblacklist: {} is served again\n", o.key.key);
  return 0;
}

}  // namespace clm_store_cli
