// tests/fuzz/suffix_key_checks.hpp: the suffix keyer's contract as the two
// suffix-key fuzzers check it (fuzz_suffix_key with the built-in rules,
// fuzz_suffix_rules with a host's): a refusal is invalid_argument with a
// message and leaves the output untouched; normalising accepts valid UTF-8
// only, writes valid UTF-8 and is idempotent; an accepted key is printable
// ASCII with fingerprint == key_fingerprint(key), the same on a second call,
// and a function of the normalised text alone.
//
//   clm_fuzz::check_make_key(keyer, text);   // FUZZ_CHECKs, which abort on a breach
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "clm/store/suffix_key.hpp"
#include "fuzz/fuzz_support.hpp"

namespace clm_fuzz {

// Well-formed UTF-8 (no overlongs, surrogates or code points past U+10FFFF).
inline bool valid_utf8(std::string_view s) {
  for (std::size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    std::size_t n;
    std::uint32_t cp;
    if (c < 0x80) {
      ++i;
      continue;
    } else if ((c & 0xe0) == 0xc0) {
      n = 1, cp = c & 0x1f;
    } else if ((c & 0xf0) == 0xe0) {
      n = 2, cp = c & 0x0f;
    } else if ((c & 0xf8) == 0xf0) {
      n = 3, cp = c & 0x07;
    } else {
      return false;
    }
    if (s.size() - i <= n) return false;  // truncated
    for (std::size_t k = 1; k <= n; ++k) {
      const auto d = static_cast<unsigned char>(s[i + k]);
      if ((d & 0xc0) != 0x80) return false;
      cp = (cp << 6) | (d & 0x3f);
    }
    const std::uint32_t min = n == 1 ? 0x80 : n == 2 ? 0x800 : 0x10000;
    if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return false;
    i += n + 1;
  }
  return true;
}

inline bool printable_ascii(std::string_view s) {
  for (char c : s) {
    if (c < 0x20 || c > 0x7e) return false;
  }
  return true;
}

inline void check_refusal(const clm::Status& s) {
  FUZZ_CHECK(s.code() == clm::StatusCode::invalid_argument && !s.message().empty(), "refused with {}: '{}'",
             s.code_name(), s.message());
}

// normalise(text): true with the normal form in `out` when accepted.
inline bool check_normalise(const clm::SuffixKeyer& k, std::string_view text, std::string& out) {
  out = "untouched";
  const clm::Status n = k.normalise(text, out);
  if (!n.ok()) {
    check_refusal(n);
    FUZZ_CHECK(out == "untouched", "a refused normalise wrote its output");
    return false;
  }
  FUZZ_CHECK(valid_utf8(text), "normalise accepted invalid UTF-8");
  FUZZ_CHECK(valid_utf8(out), "normalise wrote invalid UTF-8");
  std::string twice;
  const clm::Status again = k.normalise(out, twice);
  FUZZ_CHECK(again.ok() && twice == out, "normalise is not idempotent: '{}' -> '{}' ({})", out, twice, again.message());
  return true;
}

// make_key(text), against its refusal, its key and the key of the normal form.
inline void check_make_key(const clm::SuffixKeyer& k, std::string_view text) {
  clm::SuffixKey key;
  key.key = "untouched";
  const clm::Status m = k.make_key(text, key);
  if (!m.ok()) {
    check_refusal(m);
    FUZZ_CHECK(key.key == "untouched" && key.fingerprint == 0, "a refused make_key wrote its output");
    return;
  }
  std::string normalised;
  FUZZ_CHECK(check_normalise(k, text, normalised), "make_key accepted text normalise refused");
  FUZZ_CHECK(!key.key.empty() && printable_ascii(key.key), "key '{}' is not printable ASCII", key.key);
  FUZZ_CHECK(key.fingerprint == clm::key_fingerprint(key.key), "fingerprint of '{}'", key.key);
  clm::SuffixKey again;
  const clm::Status m2 = k.make_key(text, again);
  FUZZ_CHECK(m2.ok() && again.key == key.key && again.group == key.group, "make_key is not deterministic");
  // The key is a function of the normalised text (every later step reads only that).
  clm::SuffixKey of_normalised;
  const clm::Status m3 = k.make_key(normalised, of_normalised);
  FUZZ_CHECK(m3.ok() && of_normalised.key == key.key && of_normalised.group == key.group,
             "the key of '{}' is '{}', of its normal form '{}' it is '{}' ({})", text, key.key, normalised,
             of_normalised.key, m3.message());
}

}  // namespace clm_fuzz
