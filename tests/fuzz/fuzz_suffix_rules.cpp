// tests/fuzz/fuzz_suffix_rules.cpp: libFuzzer target for the suffix keyer's
// rules as a host supplies them (clm/store/suffix_key.hpp, SuffixKeyerConfig):
// a lexicon file (the loader: fields, categories, canonical names, limits)
// and entity patterns (their parser and the linear-time matcher), then one
// utterance keyed under them.
//
//   make build-fuzz && build-fuzz/tests/fuzz/fuzz_suffix_rules tests/fuzz/corpus/suffix_rules
//
// The input is three parts split at NUL bytes: the lexicon file's text (empty:
// the built-in lexicons), the entity patterns one per line (no part or an
// empty one: the built-in patterns), and the utterance. The lexicon is
// written as lexicon.tsv in a folder under TMPDIR (tests/fuzz/run.sh gives
// each target its own, and removes it).
//
// Checks: no crash, leak, out-of-bounds read or undefined behaviour (ASan,
// UBSan), and no input slower than libFuzzer's -timeout (the matcher is
// linear); a refused lexicon or pattern is invalid_argument with a message,
// and a refused lexicon names its file; the same rules
// load the same way twice; under rules that load, make_key behaves as with
// the built-in ones (fuzz_suffix_key): a refusal leaves the output untouched,
// an accepted key is printable ASCII with fingerprint == key_fingerprint(key),
// and keying is a function of the text (twice, and from its normal form).
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "clm/store/suffix_key.hpp"
#include "fuzz/suffix_key_checks.hpp"

namespace {

namespace fs = std::filesystem;

// One lexicon folder for the run, under $TMPDIR: tests/fuzz/run.sh's
// temporary directory, removed with it (libFuzzer ends without atexit).
const fs::path& lexicon_dir() {
  static const fs::path dir = [] {
    std::string pattern = (fs::temp_directory_path() / "clm-fuzz-rules.XXXXXX").string();
    FUZZ_CHECK(mkdtemp(pattern.data()) != nullptr, "mkdtemp({}) failed", pattern);
    return fs::path(pattern);
  }();
  return dir;
}

clm::Status make_keyer(const clm::SuffixKeyerConfig& config, std::unique_ptr<clm::SuffixKeyer>& out) {
  const clm::Status s = clm::SuffixKeyer::create(config, out);
  if (!s.ok()) {
    FUZZ_CHECK(s.code() == clm::StatusCode::invalid_argument && !s.message().empty(), "create refused with {}: '{}'",
               s.code_name(), s.message());
    FUZZ_CHECK(out == nullptr, "a refused create set its output");
  }
  return s;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  const std::size_t first = input.find('\0');
  const std::string_view lexicon = input.substr(0, first);
  std::string_view patterns, text;
  if (first != std::string_view::npos) {
    const std::size_t second = input.find('\0', first + 1);
    patterns = input.substr(first + 1, second == std::string_view::npos ? std::string_view::npos : second - first - 1);
    if (second != std::string_view::npos) text = input.substr(second + 1);
  }

  clm::SuffixKeyerConfig config;
  config.max_text_bytes = 4096;
  if (!lexicon.empty()) {
    const fs::path file = lexicon_dir() / "lexicon.tsv";
    std::ofstream out(file, std::ios::binary | std::ios::trunc);
    out.write(lexicon.data(), static_cast<std::streamsize>(lexicon.size()));
    out.close();
    FUZZ_CHECK(out.good(), "writing {}", file.string());
    config.lexicon_dir = lexicon_dir().string();
    config.replace_builtin_lexicons = true;
  }
  for (std::size_t at = 0; at < patterns.size();) {
    const std::size_t end = std::min(patterns.find('\n', at), patterns.size());
    config.entity_patterns.emplace_back(patterns.substr(at, end - at));
    at = end + 1;
  }

  std::unique_ptr<clm::SuffixKeyer> keyer;
  const clm::Status created = make_keyer(config, keyer);
  // The same rules load the same way again (the loader keeps no state).
  std::unique_ptr<clm::SuffixKeyer> second;
  const clm::Status again = make_keyer(config, second);
  FUZZ_CHECK(again.code() == created.code() && again.message() == created.message(),
             "the same rules loaded twice: '{}' then '{}'", created.message(), again.message());
  if (!created.ok()) {
    // With the built-in patterns (always valid), a refusal is the lexicon's:
    // it names the file (and the line, where one line is at fault).
    if (!lexicon.empty() && config.entity_patterns.empty()) {
      FUZZ_CHECK(created.message().find("lexicon.tsv") != std::string::npos, "a refused lexicon, not named: '{}'",
                 created.message());
    }
    return 0;
  }
  clm_fuzz::check_make_key(*keyer, text);
  return 0;
}
