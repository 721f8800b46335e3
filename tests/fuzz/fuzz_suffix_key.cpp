// tests/fuzz/fuzz_suffix_key.cpp: libFuzzer target for the suffix-key
// normaliser and keyer (clm::SuffixKeyer, clm/store/suffix_key.hpp) with the
// built-in lexicons, on arbitrary bytes, and for from_host_key.
//
//   make build-fuzz && build-fuzz/tests/fuzz/fuzz_suffix_key tests/fuzz/corpus/suffix_key
//   tests/fuzz/run.sh build-fuzz 30     (every target, on a copy of its corpus)
//
// Checks: no crash, leak, read out of bounds or undefined behaviour (ASan,
// UBSan); a refusal is invalid_argument with a message and leaves the output
// untouched; invalid UTF-8 is always refused; normalising is idempotent
// (normalise(normalise(x)) == normalise(x)); an accepted key is printable
// ASCII, its fingerprint is key_fingerprint(key), and making it twice gives
// the same key (make_key is a function of the text alone), as does making it
// from the normalised text (a function of that alone). from_host_key
// (the input split at its first NUL) accepts exactly 1..256 printable ASCII
// bytes with a group of at most 256.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "clm/store/suffix_key.hpp"
#include "fuzz/fuzz_support.hpp"

namespace {

const clm::SuffixKeyer& keyer() {
  static const std::unique_ptr<clm::SuffixKeyer> k = [] {
    std::unique_ptr<clm::SuffixKeyer> made;
    const clm::Status s = clm::SuffixKeyer::create({}, made);
    FUZZ_CHECK(s.ok(), "SuffixKeyer::create: {}", s.message());
    return made;
  }();
  return *k;
}

void check_refusal(const clm::Status& s) {
  FUZZ_CHECK(s.code() == clm::StatusCode::invalid_argument && !s.message().empty(), "refused with {}: '{}'",
             s.code_name(), s.message());
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  const clm::SuffixKeyer& k = keyer();

  std::string normalised = "untouched";
  const clm::Status n = k.normalise(text, normalised);
  if (!n.ok()) {
    check_refusal(n);
    FUZZ_CHECK(normalised == "untouched", "a refused normalise wrote its output");
  } else {
    FUZZ_CHECK(clm_fuzz::valid_utf8(text), "normalise accepted invalid UTF-8");
    FUZZ_CHECK(clm_fuzz::valid_utf8(normalised), "normalise wrote invalid UTF-8");
    std::string twice;
    const clm::Status again = k.normalise(normalised, twice);
    FUZZ_CHECK(again.ok() && twice == normalised, "normalise is not idempotent: '{}' -> '{}' ({})", normalised, twice,
               again.message());
  }

  clm::SuffixKey key;
  key.key = "untouched";
  const clm::Status m = k.make_key(text, key);
  if (!m.ok()) {
    check_refusal(m);
    FUZZ_CHECK(key.key == "untouched" && key.fingerprint == 0, "a refused make_key wrote its output");
  } else {
    FUZZ_CHECK(n.ok(), "make_key accepted text normalise refused");
    FUZZ_CHECK(!key.key.empty() && clm_fuzz::printable_ascii(key.key), "key '{}' is not printable ASCII", key.key);
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

  const std::size_t split = text.find('\0');
  const std::string_view host = text.substr(0, split);
  const std::string_view group = split == std::string_view::npos ? std::string_view() : text.substr(split + 1);
  clm::SuffixKey hk;
  const clm::Status h = clm::SuffixKeyer::from_host_key(host, group, hk);
  const bool valid = !host.empty() && host.size() <= 256 && clm_fuzz::printable_ascii(host) && group.size() <= 256 &&
                     clm_fuzz::printable_ascii(group);
  FUZZ_CHECK(h.ok() == valid, "from_host_key('{}', '{}'): {}", host, group, h.ok() ? "accepted" : h.message());
  if (!h.ok()) check_refusal(h);
  if (h.ok()) FUZZ_CHECK(hk.key == host && hk.fingerprint == clm::key_fingerprint(host), "host key changed");
  return 0;
}
