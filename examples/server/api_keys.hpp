// examples/server/api_keys.hpp: clm_server's API keys (--api-keys FILE): each
// bearer token names a tenant (whose name is the cache salt of its requests,
// so tenants never share pages or cache timing), optionally a rate limit, and
// an admin mark (the debug routes). The file is JSON:
//
//   {"keys": [
//     {"key_sha256": "9f86d0...", "tenant": "acme", "requests_per_minute": 600},
//     {"key": "sk-ops-0123456789abcdef", "tenant": "ops", "admin": true}
//   ]}
//
// `key_sha256` (the hex SHA-256 of the token) keeps the tokens themselves out
// of the file; `key` is the token as is. Only digests are held in memory, a
// lookup compares the presented token's digest with every entry in constant
// time (CRYPTO_memcmp, no early exit), and no token is ever printed.
//
//   clm_server::ApiKeys keys;
//   if (std::string error = clm_server::ApiKeys::load("keys.json", keys); !error.empty()) fail(error);
//   if (const clm_server::ApiKey* key = keys.find(bearer_token)) tenant = key->tenant;
//   double retry_after = 0;
//   if (!keys.take_request(*key, std::chrono::steady_clock::now(), retry_after)) answer_429(retry_after);
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

namespace clm_server {

struct ApiKey {
  std::array<unsigned char, 32> digest{};  // SHA-256 of the bearer token
  std::string tenant;                      // 1 to 256 bytes, no control characters
  std::int32_t requests_per_minute = 0;    // 0: no limit
  bool admin = false;
  std::size_t index = 0;  // its place in the file (its rate limiter)
};

class ApiKeys {
 public:
  static constexpr std::size_t kMaxKeys = 100000;
  static constexpr std::size_t kMaxTenantBytes = 256;
  static constexpr std::size_t kMinTokenBytes = 16;  // shorter tokens are guessable
  static constexpr std::size_t kMaxTokenBytes = 512;

  // Reads `path` into `out`. An empty string, or what is wrong with the file
  // (naming the entry and field, never a token).
  static std::string load(const std::string& path, ApiKeys& out);
  // The same from the file's text (the fuzz target's entry).
  static std::string parse(std::string_view text, ApiKeys& out);

  // The key whose token is `token`, or nullptr. Constant time in the token's
  // content: every entry is compared, all of its bytes.
  const ApiKey* find(std::string_view token) const;
  std::size_t size() const { return keys_.size(); }

  // A token bucket per key of requests_per_minute, refilled continuously (a
  // burst of up to a minute's worth): false when empty, and `retry_after_s`
  // says when the next request is allowed. True at once for a key with no limit.
  bool take_request(const ApiKey& key, std::chrono::steady_clock::time_point now, double& retry_after_s);

  ApiKeys() = default;
  ApiKeys(ApiKeys&& other) noexcept : keys_(std::move(other.keys_)), buckets_(std::move(other.buckets_)) {}
  ApiKeys& operator=(ApiKeys&& other) noexcept {
    keys_ = std::move(other.keys_);
    buckets_ = std::move(other.buckets_);
    return *this;
  }

 private:
  struct Bucket {
    double tokens = 0;
    std::chrono::steady_clock::time_point refilled{};
    bool started = false;
  };
  std::vector<ApiKey> keys_;
  std::mutex buckets_mutex_;
  std::vector<Bucket> buckets_;
};

// The token of an "Authorization: Bearer TOKEN" header value; empty when the
// value is not of that form.
std::string_view bearer_token(std::string_view authorization);

}  // namespace clm_server
