// examples/server/api_keys.cpp: the API keys file and its lookups (api_keys.hpp).
#include "api_keys.hpp"

#include <algorithm>
#include <fstream>
#include <set>
#include <sstream>

#include <fmt/format.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <nlohmann/json.hpp>

namespace clm_server {
namespace {

bool sha256(std::string_view bytes, std::array<unsigned char, 32>& out) {
  unsigned int length = 0;
  return EVP_Digest(bytes.data(), bytes.size(), out.data(), &length, EVP_sha256(), nullptr) == 1 && length == 32;
}

bool parse_hex_digest(std::string_view hex, std::array<unsigned char, 32>& out) {
  if (hex.size() != 64) return false;
  const auto nibble = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  for (std::size_t i = 0; i < 32; ++i) {
    const int high = nibble(hex[2 * i]), low = nibble(hex[2 * i + 1]);
    if (high < 0 || low < 0) return false;
    out[i] = static_cast<unsigned char>(high * 16 + low);
  }
  return true;
}

// A token travels in a header: printable ASCII without spaces.
bool valid_token(std::string_view token) {
  return std::all_of(token.begin(), token.end(), [](char c) { return c > 0x20 && c < 0x7f; });
}

// UTF-8 is not checked here (the salt is bytes); control characters are refused.
bool valid_tenant(std::string_view tenant) {
  return !tenant.empty() && tenant.size() <= ApiKeys::kMaxTenantBytes &&
         std::none_of(tenant.begin(), tenant.end(),
                      [](char c) { return static_cast<unsigned char>(c) < 0x20 || c == 0x7f; });
}

}  // namespace

std::string ApiKeys::load(const std::string& path, ApiKeys& out) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return fmt::format("--api-keys: cannot read {}", path);
  std::ostringstream text;
  text << in.rdbuf();
  if (std::string error = parse(text.str(), out); !error.empty()) return fmt::format("--api-keys {}: {}", path, error);
  return {};
}

std::string ApiKeys::parse(std::string_view text, ApiKeys& out) {
  nlohmann::json doc;
  try {
    doc = nlohmann::json::parse(text.begin(), text.end());
  } catch (const nlohmann::json::exception&) {
    return "not JSON";  // nlohmann's message quotes the text, which may hold a token
  }
  if (!doc.is_object() || doc.size() != 1 || !doc.contains("keys") || !doc["keys"].is_array()) {
    return R"(must be {"keys": [...]})";
  }
  const nlohmann::json& entries = doc["keys"];
  if (entries.empty()) return "\"keys\" is empty: every request would be refused";
  if (entries.size() > kMaxKeys) return fmt::format("more than {} keys", kMaxKeys);
  std::vector<ApiKey> keys;
  keys.reserve(entries.size());
  std::set<std::array<unsigned char, 32>> seen;
  for (std::size_t i = 0; i < entries.size(); ++i) {
    const nlohmann::json& e = entries[i];
    const auto where = [&](std::string_view what) { return fmt::format("keys[{}]: {}", i, what); };
    if (!e.is_object()) return where("not an object");
    ApiKey key;
    key.index = i;
    bool has_key = false;
    for (const auto& [field, value] : e.items()) {
      if (field == "key") {
        if (!value.is_string()) return where("\"key\" must be a string");
        const std::string& token = value.get_ref<const std::string&>();
        if (token.size() < kMinTokenBytes || token.size() > kMaxTokenBytes || !valid_token(token)) {
          return where(fmt::format("\"key\" must be {} to {} printable ASCII characters without spaces", kMinTokenBytes,
                                   kMaxTokenBytes));
        }
        if (!sha256(token, key.digest)) return where("SHA-256 failed");
        if (has_key) return where("both \"key\" and \"key_sha256\"");
        has_key = true;
      } else if (field == "key_sha256") {
        if (!value.is_string() || !parse_hex_digest(value.get_ref<const std::string&>(), key.digest)) {
          return where("\"key_sha256\" must be 64 hex digits");
        }
        if (has_key) return where("both \"key\" and \"key_sha256\"");
        has_key = true;
      } else if (field == "tenant") {
        if (!value.is_string() || !valid_tenant(value.get_ref<const std::string&>())) {
          return where(
              fmt::format("\"tenant\" must be a string of 1 to {} bytes without control characters", kMaxTenantBytes));
        }
        key.tenant = value.get<std::string>();
      } else if (field == "requests_per_minute") {
        if (!value.is_number_integer() || value.get<std::int64_t>() < 0 || value.get<std::int64_t>() > 1000000) {
          return where("\"requests_per_minute\" must be an integer in [0, 1000000] (0: no limit)");
        }
        key.requests_per_minute = value.get<std::int32_t>();
      } else if (field == "admin") {
        if (!value.is_boolean()) return where("\"admin\" must be true or false");
        key.admin = value.get<bool>();
      } else {
        return where(fmt::format("unknown field \"{}\" (key, key_sha256, tenant, requests_per_minute, admin)",
                                 field.substr(0, 64)));
      }
    }
    if (!has_key) return where("needs \"key\" or \"key_sha256\"");
    if (key.tenant.empty()) return where("needs \"tenant\"");
    if (!seen.insert(key.digest).second) return where("the same token as an earlier entry");
    keys.push_back(std::move(key));
  }
  std::lock_guard lock(out.buckets_mutex_);
  out.buckets_.assign(keys.size(), Bucket{});
  out.keys_ = std::move(keys);
  return {};
}

const ApiKey* ApiKeys::find(std::string_view token) const {
  std::array<unsigned char, 32> digest{};
  if (!sha256(token, digest)) return nullptr;
  const ApiKey* found = nullptr;
  for (const ApiKey& key : keys_) {
    // No early exit: the time taken says nothing of which entry, if any, matched.
    const bool match = CRYPTO_memcmp(key.digest.data(), digest.data(), digest.size()) == 0;
    found = match ? &key : found;
  }
  return found;
}

bool ApiKeys::take_request(const ApiKey& key, std::chrono::steady_clock::time_point now, double& retry_after_s) {
  retry_after_s = 0;
  if (key.requests_per_minute == 0) return true;
  const double capacity = key.requests_per_minute;
  const double per_second = capacity / 60.0;
  std::lock_guard lock(buckets_mutex_);
  Bucket& b = buckets_.at(key.index);
  if (!b.started) {
    b = {.tokens = capacity, .refilled = now, .started = true};
  } else {
    const double elapsed = std::chrono::duration<double>(now - b.refilled).count();
    b.tokens = std::min(capacity, b.tokens + std::max(0.0, elapsed) * per_second);
    b.refilled = now;
  }
  if (b.tokens >= 1.0) {
    b.tokens -= 1.0;
    return true;
  }
  retry_after_s = (1.0 - b.tokens) / per_second;
  return false;
}

std::string_view bearer_token(std::string_view authorization) {
  constexpr std::string_view kScheme = "Bearer ";
  if (authorization.size() <= kScheme.size()) return {};
  // The scheme is case-insensitive (RFC 9110).
  for (std::size_t i = 0; i < kScheme.size(); ++i) {
    const char c = authorization[i];
    const char lower = c >= 'A' && c <= 'Z' ? static_cast<char>(c - 'A' + 'a') : c;
    const char want = kScheme[i] >= 'A' && kScheme[i] <= 'Z' ? static_cast<char>(kScheme[i] - 'A' + 'a') : kScheme[i];
    if (lower != want) return {};
  }
  std::string_view token = authorization.substr(kScheme.size());
  while (!token.empty() && token.front() == ' ') token.remove_prefix(1);
  while (!token.empty() && token.back() == ' ') token.remove_suffix(1);
  return token;
}

}  // namespace clm_server
