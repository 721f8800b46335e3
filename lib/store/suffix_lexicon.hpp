// lib/store/suffix_lexicon.hpp: the suffix keyer's lexicons (data/suffix_keys/,
// format in SuffixKeyerConfig::lexicon_dir of clm/store/suffix_key.hpp): the
// categories, the entries, and Lexicon, which the loader fills from the
// built-in lexicons (compiled in by cmake/embed_lexicons.cmake) or a directory
// of *.tsv files, checking every line (fields, category, canonical name,
// surface limits, one category per name) and naming file and line in its
// errors. Internal to lib/store: the key rules (suffix_key.cpp) look surfaces
// up in a loaded Lexicon and never change it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "clm/status.hpp"

namespace clm::store_detail {

enum class Category : std::uint8_t {
  action,
  object,
  detail,
  negation,  // NOT_ governs what follows it in its clause; NOT_AFTER the action before it (登录不了)
  stopword,
  greeting,
  question,  // a question word: QUERY, or the detail it asks for
  aux,       // an auxiliary that opens a yes-no question (has, did, can i): its name is the question's kind
  polite,    // a request's politeness (please, can you, 麻烦): a command even with a question mark
  unit,      // a currency or unit (usd, $, pm, 元) that belongs to the number beside it
  role,      // a preposition that says which way (from: FROM, to: TO), for the word right after it
};

struct Entry {
  Category category = Category::stopword;
  std::uint32_t name = 0;  // index into Lexicon::names
};

// Names, entries and surfaces of every lexicon loaded, checked as a whole.
struct Lexicon {
  std::vector<std::string> names;  // canonical names
  // The category that owns each name (action, object, detail, greeting, aux,
  // unit or role: one name, one meaning); none yet for names only negations,
  // stopwords, polite forms or question words use.
  std::vector<std::optional<Category>> owner;
  std::unordered_map<std::string, std::uint32_t> by_name;
  std::vector<Entry> entries;
  // Every surface (units joined by ' ') and each of its unit prefixes: the
  // entry index, or -1 for a prefix that is no surface of its own. Lookups
  // stop at the first unit sequence that is no prefix.
  std::unordered_map<std::string, std::int32_t> surfaces;
  std::size_t max_units = 1;
  // Question words' names other than QUERY, with "file:line": checked to be
  // details once every file is read.
  std::vector<std::pair<std::uint32_t, std::string>> question_names;
  // Every file loaded, its name's last part and its text's fingerprint, in
  // load order: what the keyer's rules_fingerprint covers.
  std::string source_digest;

  // The id of a canonical name, added if new.
  std::uint32_t intern(std::string_view name) {
    const auto it = by_name.find(std::string(name));
    if (it != by_name.end()) return it->second;
    const auto id = static_cast<std::uint32_t>(names.size());
    names.emplace_back(name);
    owner.emplace_back();
    by_name.emplace(std::string(name), id);
    return id;
  }

  // The built-in lexicons, one file at a time in file-name order.
  Status load_builtin();
  // A directory's *.tsv files, in file-name order; io_error when it cannot be
  // read, invalid_argument when it has no *.tsv file.
  Status load_directory(const std::string& dir);
  // One file's text; `file` names it in errors ("file:line: why").
  Status load(std::string_view file, std::string_view text);
  // Once every file is loaded: a question word names QUERY or a detail.
  Status check_names() const;
};

}  // namespace clm::store_detail
