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
#include "fuzz/suffix_key_checks.hpp"

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

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  const clm::SuffixKeyer& k = keyer();

  std::string normalised;
  (void)clm_fuzz::check_normalise(k, text, normalised);
  clm_fuzz::check_make_key(k, text);

  const std::size_t split = text.find('\0');
  const std::string_view host = text.substr(0, split);
  const std::string_view group = split == std::string_view::npos ? std::string_view() : text.substr(split + 1);
  clm::SuffixKey hk;
  const clm::Status h = clm::SuffixKeyer::from_host_key(host, group, hk);
  const bool valid = !host.empty() && host.size() <= 256 && clm_fuzz::printable_ascii(host) && group.size() <= 256 &&
                     clm_fuzz::printable_ascii(group);
  FUZZ_CHECK(h.ok() == valid, "from_host_key('{}', '{}'): {}", host, group, h.ok() ? "accepted" : h.message());
  if (!h.ok()) clm_fuzz::check_refusal(h);
  if (h.ok()) FUZZ_CHECK(hk.key == host && hk.fingerprint == clm::key_fingerprint(host), "host key changed");
  return 0;
}
