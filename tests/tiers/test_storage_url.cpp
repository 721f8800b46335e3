// Storage tier URLs (clm/tiers/storage_url.hpp): a table of good URLs and what
// they parse to, a table of bad ones and the part each refusal must name, and
// open_storage_backend refusing the same, and bad layouts, before any I/O.
#include <memory>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "clm/tiers/storage_backend.hpp"
#include "clm/tiers/storage_url.hpp"
#include "tiers_test_support.hpp"

namespace {

clm::StorageUrl file_url(std::string path, std::uint64_t capacity_mb = 8192) {  // the default cap: 8 GiB
  clm::StorageUrl u;
  u.scheme = clm::StorageUrl::Scheme::file;
  u.path = std::move(path);
  u.capacity_mb = capacity_mb;
  return u;
}

clm::StorageUrl redis_url(std::string host, std::int32_t port = 6379, std::int32_t db = 0,
                          std::string prefix = "clm:", std::int64_t ttl = 86'400, std::int32_t timeout_ms = 200) {
  clm::StorageUrl u;
  u.scheme = clm::StorageUrl::Scheme::redis;
  u.host = std::move(host);
  u.port = port;
  u.db = db;
  u.prefix = std::move(prefix);
  u.ttl_s = ttl;
  u.timeout_ms = timeout_ms;
  return u;
}

clm::StorageUrl with_auth(clm::StorageUrl u, std::string user, std::string password, std::string file) {
  u.user = std::move(user);
  u.password = std::move(password);
  u.password_file = std::move(file);
  return u;
}

void check_same(const clm::StorageUrl& got, const clm::StorageUrl& want) {
  CHECK(got.user == want.user);
  CHECK(got.password == want.password);
  CHECK(got.password_file == want.password_file);
  CHECK(got.scheme == want.scheme);
  CHECK(got.path == want.path);
  CHECK(got.capacity_mb == want.capacity_mb);
  CHECK(got.host == want.host);
  CHECK(got.port == want.port);
  CHECK(got.db == want.db);
  CHECK(got.prefix == want.prefix);
  CHECK(got.ttl_s == want.ttl_s);
  CHECK(got.timeout_ms == want.timeout_ms);
}

}  // namespace

TEST_CASE("good storage URLs parse to their parts", "[tiers][url]") {
  struct Good {
    std::string url;
    clm::StorageUrl want;
  };
  // The redis rows start from file_url("")'s defaults for the file fields.
  const std::vector<Good> table = {
      {"file:///var/cache/clm", file_url("/var/cache/clm")},
      {"file:///var/cache/clm?capacity_mb=4096", file_url("/var/cache/clm", 4096)},
      {"file:///tmp/a%20b/c%3Fd?capacity_mb=0", file_url("/tmp/a b/c?d", 0)},
      {"file://relative/dir?capacity_mb=1&", file_url("relative/dir", 1)},
      {"file:///x?&&capacity_mb=7", file_url("/x", 7)},
      {"file:///x?capacity_mb=1099511627776", file_url("/x", 1099511627776ull)},  // 2^40, the largest
      {"redis://127.0.0.1:6379/0?prefix=clm:&ttl=3600", redis_url("127.0.0.1", 6379, 0, "clm:", 3600)},
      {"redis://cache.internal", redis_url("cache.internal")},
      {"redis://cache.internal/", redis_url("cache.internal")},
      {"redis://h:1/15", redis_url("h", 1, 15)},
      {"redis://h:65535/2?timeout_ms=1500", redis_url("h", 65535, 2, "clm:", 86'400, 1500)},
      {"redis://[::1]:7000/3", redis_url("::1", 7000, 3)},
      {"redis://[::1]", redis_url("::1")},
      {"redis://h?prefix=team%3Aa%2Fb%26c%3D", redis_url("h", 6379, 0, "team:a/b&c=")},
      {"redis://h?prefix=", redis_url("h", 6379, 0, "")},
      {"redis://h?prefix=a+b%25", redis_url("h", 6379, 0, "a+b%")},
      {"redis://h?ttl=0&timeout_ms=1&prefix=p", redis_url("h", 6379, 0, "p", 0, 1)},
      {"redis://h?ttl=2147483647", redis_url("h", 6379, 0, "clm:", 2147483647)},
      {"redis://:s3cret@h:7000/1", with_auth(redis_url("h", 7000, 1), "", "s3cret", "")},
      {"redis://alice:p%40ss%2Fw@h", with_auth(redis_url("h"), "alice", "p@ss/w", "")},
      {"redis://alice:raw/pass@h/2", with_auth(redis_url("h", 6379, 2), "alice", "raw/pass", "")},
      {"redis://alice@h?password_file=%2Frun%2Fclm%20pw", with_auth(redis_url("h"), "alice", "", "/run/clm pw")},
      {"redis://h?password_file=/run/pw", with_auth(redis_url("h"), "", "", "/run/pw")},
  };
  for (const Good& g : table) {
    INFO(g.url);
    clm::StorageUrl got;
    const clm::Status s = clm::parse_storage_url(g.url, got);
    INFO(s.message());
    REQUIRE(s.ok());
    check_same(got, g.want);
  }
}

TEST_CASE("bad storage URLs are refused, naming the bad part", "[tiers][url]") {
  struct Bad {
    std::string url;
    std::string names;  // the message must contain this
  };
  const std::vector<Bad> table = {
      {"", "no scheme"},
      {"/var/cache/clm", "no scheme"},
      {"http://h/x", "unknown scheme 'http'"},
      {"File:///x", "unknown scheme 'File'"},
      {"file://", "empty path"},
      {"file://?capacity_mb=1", "empty path"},
      {"file:///x?capacity_mb=-1", "capacity_mb"},
      {"file:///x?capacity_mb=12MB", "capacity_mb"},
      {"file:///x?capacity_mb=", "capacity_mb"},
      {"file:///x?capacity_mb= 1", "capacity_mb"},
      {"file:///x?capacity_mb=1099511627777", "capacity_mb"},
      {"file:///x?capacity_mb=99999999999999999999999", "capacity_mb"},
      {"file:///x?capacity=1", "unknown option 'capacity'"},
      {"file:///x?ttl=5", "unknown option 'ttl'"},
      {"file:///x?capacity_mb", "has no value"},
      {"file:///x?=3", "has no name"},
      {"file:///x?capacity_mb=1&capacity_mb=2", "given twice"},
      {"file:///x%2", "%-escape"},
      {"file:///x%zz", "%-escape"},
      {"file:///x%00y", "NUL"},
      {"file:///x#frag", "fragment"},
      {"redis://", "no host"},
      {"redis://:6379/0", "no host"},
      {"redis://h:0", "port 0"},
      {"redis://h:65536", "port"},
      {"redis://h:-1", "port"},
      {"redis://h:", "port"},
      {"redis://h:63x9", "port"},
      {"redis://h:6379/x", "database"},
      {"redis://h:6379/-1", "database"},
      {"redis://h:6379/0/1", "database"},
      {"redis://h?ttl=-5", "ttl"},
      {"redis://h?ttl=1.5", "ttl"},
      {"redis://h?ttl=2147483648", "ttl"},
      {"redis://h?timeout_ms=0", "timeout_ms"},
      {"redis://h?timeout_ms=abc", "timeout_ms"},
      {"redis://h?db=2", "unknown option 'db'"},
      {"redis://h?password=x", "unknown option 'password'"},
      {"redis://user@h:6379", "a user without a password"},
      {"redis://user:@h:6379", "an empty password"},
      {"redis://:pw@h?password_file=/run/secret", "both in the URL and in password_file"},
      {"redis://h?password_file=", "password_file is empty"},
      {"redis://u:p%zz@h", "%-escape"},
      {"redis://::1:6379", "brackets"},
      {"redis://[::1:6379", "without ']'"},
      {"redis://[::1]x", "after the IPv6 host"},
      {"redis://h?prefix=%G1", "%-escape"},
  };
  for (const Bad& b : table) {
    INFO(b.url);
    clm::StorageUrl got = redis_url("untouched", 1, 2, "p", 3, 4);
    const clm::Status s = clm::parse_storage_url(b.url, got);
    INFO(s.message());
    CHECK(s.code() == clm::StatusCode::invalid_argument);
    CHECK_THAT(s.message(), Catch::Contains(b.names));
    check_same(got, redis_url("untouched", 1, 2, "p", 3, 4));  // the output is left alone
  }
}

TEST_CASE("open_storage_backend refuses bad URLs and layouts before touching anything", "[tiers][url]") {
  const clm::PageLayout layout{16, 2, 2, 64, clm::KvDType::f16};
  std::unique_ptr<clm::StorageBackend> out;
  for (const char* url :
       {"ftp://x", "file://", "redis://h:99999", "redis://h?bogus=1", "file:///tmp/x?capacity_mb=z"}) {
    INFO(url);
    CHECK(clm::open_storage_backend(url, layout, clm_test::test_seal(), out).code() ==
          clm::StatusCode::invalid_argument);
    CHECK(out == nullptr);
  }
  // A layout with no pages is refused whatever the URL; no directory is made for it.
  const std::string dir = "/nonexistent-clm-test-dir/never-created";
  const clm::Status s =
      clm::open_storage_backend("file://" + dir, {0, 2, 2, 64, clm::KvDType::f16}, clm_test::test_seal(), out);
  INFO(s.message());
  CHECK(s.code() == clm::StatusCode::invalid_argument);
  CHECK_THAT(s.message(), Catch::Contains("page_size"));
  CHECK(out == nullptr);
  // A Redis server that is not there is not an error at open (it connects lazily).
  REQUIRE(clm::open_storage_backend("redis://127.0.0.1:1/0?timeout_ms=50", layout, clm_test::test_seal(), out).ok());
  REQUIRE(out != nullptr);
  CHECK(out->url() == "redis://127.0.0.1:1/0?timeout_ms=50");
  CHECK(out->layout() == layout);
}

TEST_CASE("a storage URL's password is never shown: redact_storage_url, messages, url()", "[tiers][url]") {
  const std::vector<std::pair<std::string, std::string>> table = {
      {"redis://:s3cret@h:7000/1", "redis://:***@h:7000/1"},
      {"redis://alice:s3cret@h", "redis://alice:***@h"},
      {"redis://alice:raw/s3cret@h/2?ttl=5", "redis://alice:***@h/2?ttl=5"},
      {"redis://alice:s3@cret@h", "redis://alice:***@h"},  // the last '@' ends the credentials
      {"redis://alice:s3#cret@h", "redis://alice:***@h"},  // a raw '#': refused below, still hidden
      {"redis://alice@h:6379?password_file=/x", "redis://alice@h:6379?password_file=/x"},
      {"redis://h:6379/0?prefix=a@b:c", "redis://h:6379/0?prefix=a@b:c"},
      {"file:///var/cache/clm", "file:///var/cache/clm"},
      {"not a url", "not a url"},
  };
  for (const auto& [url, want] : table) {
    INFO(url);
    CHECK(clm::redact_storage_url(url) == want);
  }
  // A URL refused for another part names it without the password.
  for (const char* bad :
       {"redis://:s3cret@h:99999", "redis://alice:s3cret@h?bogus=1", "redis://alice:s3cret@", "redis://a:s3c#ret@h"}) {
    INFO(bad);
    clm::StorageUrl u;
    const clm::Status s = clm::parse_storage_url(bad, u);
    CHECK(s.code() == clm::StatusCode::invalid_argument);
    CHECK(s.message().find("s3c") == std::string::npos);
    CHECK_THAT(s.message(), Catch::Contains("***"));
  }
}
