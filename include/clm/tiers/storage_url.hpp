// clm/tiers/storage_url.hpp: a storage tier URL (clm/tiers/storage_backend.hpp)
// taken apart, for open_storage_backend and for whoever checks a URL before
// opening it (a config loader, a CLI flag).
//
//   clm::StorageUrl u;
//   CLM_RETURN_IF_ERROR(clm::parse_storage_url("redis://10.0.0.7:6380/2?prefix=team%3Aa:&ttl=600", u));
//   // u.scheme == redis, u.host == "10.0.0.7", u.port == 6380, u.db == 2,
//   // u.prefix == "team:a:", u.ttl_s == 600, u.timeout_ms == 200
//
// Forms:
//   file://<path>[?capacity_mb=N]           file:///var/cache/clm is /var/cache/clm;
//                                           8192 MiB unless given, 0: no cap
//   redis://[[user]:password@]<host>[:port][/db][?prefix=P&ttl=S&timeout_ms=T&password_file=F]
//                                           ttl 86400 s unless given, 0: no expiry;
//                                           AUTH with the password (and the ACL user)
//                                           of the URL, or the first line of file F
//                                           host may be [IPv6]; port 6379, db 0 by default
// Option values are percent-decoded (the path too); options are separated by
// '&'. invalid_argument, naming the part, for an unknown scheme or option, an
// option given twice or without '=', a bad %-escape, an empty path or host, a
// port outside 1..65535, a negative or non-numeric number, a user without a
// password, a password both in the URL and in password_file, or a fragment
// (#). Messages show the URL as redact_storage_url does.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "clm/status.hpp"

namespace clm {

struct StorageUrl {
  // Storage shared by many instances is capped unless its owner says
  // otherwise: a directory grows to 8 GiB, a Redis page lives a day.
  static constexpr std::uint64_t kDefaultCapacityMb = 8192;
  static constexpr std::int64_t kDefaultTtlS = 86'400;

  enum class Scheme : std::uint8_t { file, redis };
  Scheme scheme = Scheme::file;

  // file://
  std::string path;
  // MiB of page files kept: 8 GiB unless the URL says; capacity_mb=0 is no cap.
  std::uint64_t capacity_mb = kDefaultCapacityMb;

  // redis://
  std::string host;  // without the brackets of an IPv6 address
  std::int32_t port = 6379;
  std::int32_t db = 0;
  std::string prefix = "clm:";        // of every key: prefix + the page key's 64 hex digits
  std::string user;                   // ACL user for AUTH; empty: the default user
  std::string password;               // AUTH password from the URL; empty: none (or password_file)
  std::string password_file;          // the password is this file's first line (never world-readable)
  std::int64_t ttl_s = kDefaultTtlS;  // seconds a page lives: 24 h unless the URL says; ttl=0 is forever
  std::int32_t timeout_ms = 200;      // connect, and each socket read or write
};

Status parse_storage_url(std::string_view url, StorageUrl& out);

// The URL with its password (if any) written "***": what is printed, logged or
// reported wherever a storage URL appears (StorageBackend::url() too).
std::string redact_storage_url(std::string_view url);

}  // namespace clm
