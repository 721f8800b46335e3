// tests/fuzz/fuzz_api_keys.cpp: libFuzzer target for clm_server's API keys
// file (examples/server/api_keys.hpp) and the Authorization header's parser.
//
//   make build-fuzz && build-fuzz/tests/fuzz/fuzz_api_keys tests/fuzz/corpus/api_keys
//
// The input is split at its first 0xff byte: before it, a keys file; after
// it, an Authorization header value. A refused file is a message and leaves
// the table as it was (empty here); an accepted one holds at least one key,
// and a lookup of the header's token finds at most that key whose digest is
// the token's, whose tenant is 1 to 256 bytes; a rate-limited key, asked
// again at once past its minute's worth, refuses with a positive retry time.
#include <chrono>
#include <cstdint>
#include <string_view>

#include "api_keys.hpp"
#include "fuzz/fuzz_support.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  std::string_view input(reinterpret_cast<const char*>(data), size);
  std::string_view header;
  if (const auto cut = input.find('\xff'); cut != std::string_view::npos) {
    header = input.substr(cut + 1);
    input = input.substr(0, cut);
  }
  const std::string_view token = clm_server::bearer_token(header);
  FUZZ_CHECK(token.size() <= header.size(), "the token is longer than its header");
  clm_server::ApiKeys keys;
  const std::string error = clm_server::ApiKeys::parse(input, keys);
  if (!error.empty()) {
    FUZZ_CHECK(keys.size() == 0, "a refused file left {} keys", keys.size());
    return 0;
  }
  FUZZ_CHECK(keys.size() >= 1, "an accepted file without keys");
  const clm_server::ApiKey* key = keys.find(token);
  if (key == nullptr) return 0;
  FUZZ_CHECK(!key->tenant.empty() && key->tenant.size() <= clm_server::ApiKeys::kMaxTenantBytes, "tenant of {} bytes",
             key->tenant.size());
  const auto now = std::chrono::steady_clock::now();
  double retry = 0;
  bool refused = false;
  for (int i = 0; i <= key->requests_per_minute && i < 2000; ++i) {
    refused = !keys.take_request(*key, now, retry);
    if (refused) break;
  }
  if (key->requests_per_minute > 0 && key->requests_per_minute < 2000) {
    FUZZ_CHECK(refused && retry > 0, "{} requests at once passed a limit of {} a minute", key->requests_per_minute + 1,
               key->requests_per_minute);
  }
  return 0;
}
