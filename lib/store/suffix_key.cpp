// lib/store/suffix_key.cpp: the suffix keyer of clm/store/suffix_key.hpp:
// create() builds the keyer from its config (lexicons: suffix_lexicon.hpp,
// entity patterns: entity_pattern.hpp), make_key() normalises the text
// (suffix_text.hpp) and hands it to the key rules (key_rules.hpp). The keyer
// is immutable after create().
#include "clm/store/suffix_key.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <new>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "chinese_fold.hpp"
#include "english_words.hpp"
#include "entity_pattern.hpp"
#include "key_rules.hpp"
#include "suffix_lexicon.hpp"
#include "suffix_text.hpp"

namespace clm {

using store_detail::Lexicon;
using store_detail::normalise_text;
using store_detail::parse_pattern;
using store_detail::Pattern;

struct SuffixKeyer::Impl {
  std::size_t max_text_bytes = 0;
  std::vector<Pattern> patterns;
  Lexicon lexicon;
  std::uint32_t query = 0;  // the name QUERY
  std::uint64_t rules_fingerprint = 0;
  std::unique_ptr<store_detail::ChineseFolder> folder;  // Traditional Chinese to Simplified

  // Step 1: the size check, Traditional Chinese folded, then normalised.
  Status normalise(std::string_view text, std::string& norm) const {
    if (text.size() > max_text_bytes) {
      return invalid_argument(fmt::format("text of {} bytes is over max_text_bytes ({})", text.size(), max_text_bytes));
    }
    // OpenCC's t2s is not idempotent (a character's Simplified form may map
    // on again: a fuzzed text folded to 苧, which folds to 苎), and normalising
    // normal text must change nothing: fold to a fixed point (chains are
    // short; four passes bound it).
    std::string folded(text), next;
    for (int pass = 0; pass < 4; ++pass) {
      CLM_RETURN_IF_ERROR(folder->fold(folded, next));
      if (next == folded) break;
      folded.swap(next);
    }
    return normalise_text(folded, norm, store_detail::Clauses::keep);
  }
};

SuffixKeyer::SuffixKeyer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
SuffixKeyer::~SuffixKeyer() = default;

Status SuffixKeyer::create(const SuffixKeyerConfig& config, std::unique_ptr<SuffixKeyer>& out) {
  try {
    if (config.max_text_bytes == 0) return invalid_argument("max_text_bytes must be positive");
    auto impl = std::make_unique<Impl>();
    impl->max_text_bytes = config.max_text_bytes;
    for (const std::string& p : config.entity_patterns) {
      impl->patterns.emplace_back();
      CLM_RETURN_IF_ERROR(parse_pattern(p, impl->patterns.back()));
    }
    if (config.lexicon_dir.empty() && config.replace_builtin_lexicons) {
      return invalid_argument("replace_builtin_lexicons needs a lexicon_dir to replace them with");
    }
    if (!config.replace_builtin_lexicons) CLM_RETURN_IF_ERROR(impl->lexicon.load_builtin());
    if (!config.lexicon_dir.empty()) CLM_RETURN_IF_ERROR(impl->lexicon.load_directory(config.lexicon_dir));
    CLM_RETURN_IF_ERROR(impl->lexicon.check_names());
    CLM_RETURN_IF_ERROR(store_detail::ChineseFolder::create(impl->folder));
    impl->query = impl->lexicon.intern("QUERY");
    // The rules: their version, the lexicons' text as loaded, the patterns.
    std::string rules = fmt::format("clm suffix key rules v{}\n", kRulesVersion);
    rules += impl->lexicon.source_digest;
    for (const std::string& p : config.entity_patterns) rules += fmt::format("pattern {}\n", p);
    rules += fmt::format("fold {}\n", impl->folder->config_name());
    rules += fmt::format("english words {:016x}\n", store_detail::english_words_fingerprint());
    impl->rules_fingerprint = key_fingerprint(rules);
    out.reset(new SuffixKeyer(std::move(impl)));
    return Status::success();
  } catch (const std::bad_alloc&) {
    return out_of_memory("suffix keyer: out of memory");
  } catch (const std::exception& e) {
    return {StatusCode::internal, fmt::format("suffix keyer: {}", e.what())};
  }
}

Status SuffixKeyer::normalise(std::string_view text, std::string& out) const {
  try {
    std::string norm;
    CLM_RETURN_IF_ERROR(impl_->normalise(text, norm));
    out = std::move(norm);
    return Status::success();
  } catch (const std::bad_alloc&) {
    return out_of_memory("suffix key: out of memory");
  } catch (const std::exception& e) {
    return {StatusCode::internal, fmt::format("suffix key: {}", e.what())};
  }
}

Status SuffixKeyer::make_key(std::string_view text, SuffixKey& out) const {
  try {
    const Impl& im = *impl_;
    std::string norm;
    CLM_RETURN_IF_ERROR(im.normalise(text, norm));
    if (norm.empty() || norm == "?") return invalid_argument("no content");
    SuffixKey key;
    CLM_RETURN_IF_ERROR((store_detail::KeyRules{im.lexicon, im.patterns, im.query}.build(norm, key)));
    key.source = std::string(text);
    out = std::move(key);
    return Status::success();
  } catch (const std::bad_alloc&) {
    return out_of_memory("suffix key: out of memory");
  } catch (const std::exception& e) {
    return {StatusCode::internal, fmt::format("suffix key: {}", e.what())};
  }
}

std::uint64_t SuffixKeyer::rules_fingerprint() const { return impl_->rules_fingerprint; }

Status SuffixKeyer::from_host_key(std::string_view key, std::string_view group, SuffixKey& out) {
  try {
    auto printable = [](std::string_view s) {
      return std::all_of(s.begin(), s.end(), [](char c) { return c >= 0x20 && c <= 0x7E; });
    };
    if (key.empty() || key.size() > 256)
      return invalid_argument(fmt::format("host key of {} bytes (1..256)", key.size()));
    if (!printable(key)) return invalid_argument("host key is not printable ASCII");
    if (group.size() > 256) return invalid_argument(fmt::format("host group of {} bytes (at most 256)", group.size()));
    if (!printable(group)) return invalid_argument("host group is not printable ASCII");
    SuffixKey k;
    k.key = std::string(key);
    k.fingerprint = key_fingerprint(key);
    k.group = key_fingerprint(group.empty() ? key : group);
    out = std::move(k);
    return Status::success();
  } catch (const std::bad_alloc&) {
    return out_of_memory("suffix key: out of memory");
  } catch (const std::exception& e) {
    return {StatusCode::internal, fmt::format("suffix key: {}", e.what())};
  }
}

}  // namespace clm
