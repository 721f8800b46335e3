// examples/snapshot_store/admin.hpp: the administration commands of
// `clm_store` (admin.cpp) and their usage texts, for main.cpp's command table.
//
//   {"pin", kPinUsage, flags(kKeyFlags, {"--version"}), kKeySwitches, cmd_pin},
#pragma once

#include "cli.hpp"

namespace clm_store_cli {

inline constexpr std::string_view kVersionsUsage =
    "usage: clm_store versions --store DIR (TEXT | --text TEXT | --key K [--group G]) [--tenant T] [--json]\n"
    "\n"
    "A key's versions, newest first: when made and last used, usage, confirmations, and which\n"
    "one is served (the pinned one, else the newest stable one, else the newest).\n";
inline constexpr std::string_view kPinUsage =
    "usage: clm_store pin --store DIR --version N (TEXT | --text TEXT | --key K [--group G]) [--tenant T]\n"
    "\n"
    "Serves version N of the key from now on, whatever newer versions are recorded, until unpin.\n";
inline constexpr std::string_view kUnpinUsage =
    "usage: clm_store unpin --store DIR (TEXT | --text TEXT | --key K [--group G]) [--tenant T]\n"
    "\n"
    "Lifts a pin: the key's newest stable version is served again.\n";
inline constexpr std::string_view kRollbackUsage =
    "usage: clm_store rollback --store DIR --to N (TEXT | --text TEXT | --key K [--group G]) [--tenant T] "
    "[--json]\n"
    "\n"
    "Deletes the key's versions newer than N; a pin on one of them is lifted.\n";
inline constexpr std::string_view kDeleteKeyUsage =
    "usage: clm_store delete-key --store DIR (TEXT | --text TEXT | --key K [--group G]) [--tenant T] [--json]\n"
    "\n"
    "Deletes every version of a key, with its index entries, admission count, blacklist entry\n"
    "and pin.\n";
inline constexpr std::string_view kDeleteTenantUsage =
    "usage: clm_store delete-tenant --store DIR --tenant T [--json]\n"
    "\n"
    "Deletes everything of one tenant in every shard: rows, index files, admission counts,\n"
    "blacklist entries, pins and fallbacks.\n";
inline constexpr std::string_view kBlacklistUsage =
    "usage: clm_store blacklist --store DIR --reason R [--hours H] (TEXT | --text TEXT | --key K [--group G])\n"
    "                           [--tenant T]\n"
    "       clm_store blacklist --store DIR --list [--json]\n"
    "\n"
    "Refuses a key at every level for H hours (default 24), with the reason; --list shows the\n"
    "entries in force, by hand and the breaker's.\n";
inline constexpr std::string_view kUnblacklistUsage =
    "usage: clm_store unblacklist --store DIR (TEXT | --text TEXT | --key K [--group G]) [--tenant T]\n"
    "\n"
    "Lifts a key's blacklist entry (by hand or the breaker's) and forgets its reported outcomes.\n";

inline const std::vector<std::string_view> kKeyFlags = {"--store", "--shards", "--dim",   "--lexicons",
                                                        "--text",  "--key",    "--group", "--tenant"};

int cmd_versions(const Args& args);
int cmd_pin(const Args& args);
int cmd_unpin(const Args& args);
int cmd_rollback(const Args& args);
int cmd_delete_key(const Args& args);
int cmd_delete_tenant(const Args& args);
int cmd_blacklist(const Args& args);
int cmd_unblacklist(const Args& args);

}  // namespace clm_store_cli
