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
//   file://<path>[?capacity_mb=N]           file:///var/cache/clm is /var/cache/clm
//   redis://<host>[:port][/db][?prefix=P&ttl=S&timeout_ms=T]
//                                           host may be [IPv6]; port 6379, db 0 by default
// Option values are percent-decoded (the path too); options are separated by
// '&'. invalid_argument, naming the part, for an unknown scheme or option, an
// option given twice or without '=', a bad %-escape, an empty path or host, a
// port outside 1..65535, a negative or non-numeric number, credentials (user@)
// or a fragment (#).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "clm/status.hpp"

namespace clm {

struct StorageUrl {
  enum class Scheme : std::uint8_t { file, redis };
  Scheme scheme = Scheme::file;

  // file://
  std::string path;
  std::uint64_t capacity_mb = 0;  // MiB of page files kept; 0 = no cap

  // redis://
  std::string host;  // without the brackets of an IPv6 address
  std::int32_t port = 6379;
  std::int32_t db = 0;
  std::string prefix = "clm:";    // of every key: prefix + the page key's 64 hex digits
  std::int64_t ttl_s = 0;         // 0 = pages never expire
  std::int32_t timeout_ms = 200;  // connect, and each socket read or write
};

Status parse_storage_url(std::string_view url, StorageUrl& out);

}  // namespace clm
