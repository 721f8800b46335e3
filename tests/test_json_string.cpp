// JSON string literals (clm/detail/json_string.hpp) on any bytes: always JSON
// that nlohmann-json (an independent, strict parser) reads, well-formed UTF-8
// kept as it is, each byte of anything else read back as U+FFFD.
#include <catch2/catch.hpp>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <random>
#include <string>

#include "clm/detail/json_string.hpp"
#include "clm/engine/clm_watch.hpp"

namespace {

std::string literal(std::string_view s) {
  std::string out;
  clm::detail::append_json_string(out, s);
  return out;
}

// What the literal of s must read back as, from nlohmann's own view of UTF-8:
// at each offset the shortest run of 1 to 4 bytes that nlohmann accepts as a
// string on its own, or U+FFFD for the byte when none is.
std::string expected_reading(const std::string& s) {
  std::string out;
  for (std::size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c < 0x80) {  // ASCII: itself, escaped or not
      out.push_back(s[i]);
      ++i;
      continue;
    }
    std::size_t taken = 0;
    for (std::size_t len = 2; len <= 4 && i + len <= s.size() && taken == 0; ++len) {
      const std::string quoted = "\"" + s.substr(i, len) + "\"";
      if (nlohmann::json::accept(quoted)) taken = len;
    }
    if (taken == 0) {
      out += "\xEF\xBF\xBD";  // U+FFFD
      ++i;
    } else {
      out += s.substr(i, taken);
      i += taken;
    }
  }
  return out;
}

// Bytes that make every kind of sequence likely: ASCII with quotes,
// backslashes and controls, lead bytes of every length, continuation bytes,
// bytes never in UTF-8, and whole code points of 2 to 4 bytes.
std::string random_bytes(std::mt19937_64& rng) {
  static const std::string pieces[] = {"a",
                                       "\"",
                                       "\\",
                                       "\n",
                                       std::string(1, '\0'),
                                       "\x7F",
                                       "\xC3\xA9",
                                       "\xE8\xAE\xA2",
                                       "\xF0\x9F\x98\x80",
                                       "\xC3",
                                       "\xE8\xAE",
                                       "\x80",
                                       "\xBF",
                                       "\xC0\xAF",
                                       "\xED\xA0\x80",
                                       "\xF4\x90\x80\x80",
                                       "\xF8",
                                       "\xFF",
                                       "\xE0\x80\xAF",
                                       "\x1F"};
  std::uniform_int_distribution<std::size_t> count(0, 24);
  std::uniform_int_distribution<std::size_t> pick(0, std::size(pieces) - 1);
  std::uniform_int_distribution<int> byte(0, 255);
  std::string s;
  for (std::size_t n = count(rng); n > 0; --n) {
    if (rng() % 4 == 0) {
      s.push_back(static_cast<char>(byte(rng)));
    } else {
      s += pieces[pick(rng)];
    }
  }
  return s;
}

}  // namespace

TEST_CASE("json string: any bytes make a JSON string that reads back as its UTF-8, bad bytes as U+FFFD") {
  std::mt19937_64 rng(std::random_device{}());
  for (int run = 0; run < 20000; ++run) {
    const std::string s = random_bytes(rng);
    const std::string lit = literal(s);
    INFO("input of " << s.size() << " bytes");
    REQUIRE(nlohmann::json::accept(lit));
    const std::string read = nlohmann::json::parse(lit).get<std::string>();
    REQUIRE(read == expected_reading(s));
  }
}

TEST_CASE("json string: well-formed UTF-8 comes back byte for byte") {
  for (const std::string& s : {std::string("ORDER-\"7\""), std::string("订单 7744 退款"), std::string("tab\there"),
                               std::string("\xF0\x9F\x98\x80 emoji"), std::string()}) {
    REQUIRE(nlohmann::json::parse(literal(s)).get<std::string>() == s);
  }
}

TEST_CASE("json string: a CLM event line with a tenant name that is not UTF-8 is still one JSON object") {
  clm::ClmEvent e;
  e.kind = clm::ClmEvent::Kind::blacklisted;
  e.tenant = "acme\xFF\xC3";
  e.key = "CANCEL-ORDER\x80";
  e.reason = "bad \xED\xA0\x80 surrogate";
  const nlohmann::json j = nlohmann::json::parse(clm::clm_event_json(e));
  CHECK(j.at("tenant") == "acme\xEF\xBF\xBD\xEF\xBF\xBD");
  CHECK(j.at("key") == "CANCEL-ORDER\xEF\xBF\xBD");
  CHECK(j.at("reason") == "bad \xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD surrogate");
}
