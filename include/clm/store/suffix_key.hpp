// clm/store/suffix_key.hpp: the suffix key of CLM's snapshot store
// (docs/snapshot-store.md). One function turns a user's text into the key
// under which a semantic snapshot is stored and found again; the store uses
// it offline (ingest) and online (lookup) alike, because cleaning that differs
// between the two silently drops reuse to zero.
//
//   std::unique_ptr<clm::SuffixKeyer> keyer;
//   CLM_RETURN_IF_ERROR(clm::SuffixKeyer::create({}, keyer));   // built-in lexicons
//   clm::SuffixKey k;
//   CLM_RETURN_IF_ERROR(keyer->make_key("帮我查下订单#ORD-789的状态", k));
//   // k.key == "ORDER-789-QUERY-STATUS", k.fingerprint == clm::key_fingerprint(k.key)
//   CLM_RETURN_IF_ERROR(keyer->make_key("Please check the status of order 789", k));  // the same key
//   CLM_RETURN_IF_ERROR(keyer->make_key("Don't check order 789", k));   // "ORDER-789-NOT-QUERY": another key
//
// What make_key does, in order:
//  1. Normalise: reject invalid UTF-8 and text over max_text_bytes; fold
//     full-width forms to half-width (NFKC for U+FF01..U+FF5E and U+3000),
//     ASCII case to lower, every run of whitespace and punctuation (ASCII and
//     CJK) to one separator.
//  2. Entity: the first match of the configured entity patterns (order
//     numbers, ids), canonicalised to its identifying part ("#ORD-789",
//     "order 789" and "订单789" all give "789").
//  3. Tokens: ASCII words split on separators; CJK text matched greedily
//     (longest lexicon entry first) against the lexicons.
//  4. Lexicons (data/suffix_keys/*.tsv, shipped and compiled in; a host may
//     load its own directory): each entry maps a surface form to a category
//     (action, object, detail, negation, stopword, greeting, question) and a
//     canonical name: 查/查询/query/check -> action QUERY; 订单/order -> object
//     ORDER; a question word (what, 吗, when, 多少) names QUERY or the detail
//     it asks for (when -> TIME). Stopwords are dropped; words in no lexicon
//     are dropped too (they carry the paraphrase noise the key is meant to
//     ignore).
//  5. Polarity: a negation (not, don't, 不, 没, ...) before an action makes it
//     NOT-<ACTION>; one after the last action negates that one (登录不了); one
//     with no action at all makes the action NOT (NOT-QUERY for a question).
//     Opposite actions (CANCEL / CONFIRM, ENABLE / DISABLE) are distinct
//     canonical names. The action is every polarised action, sorted and
//     joined by '+' ("PAY+NOT-SUCCEED"), less a QUERY beside another action
//     (the form of the question, not its subject). So a question and its
//     opposite never share a key, and never agree for the store's level-2
//     filter either. No action but a detail or a question word is QUERY
//     ("订单789现在啥情况" asks).
//  6. Key: OBJECT-ENTITY-ACTION-DETAIL..., absent parts left out, details
//     sorted and unique. Of several objects the first in sorted order is the
//     object and the others join the details, so word order never matters.
//     Text with no action, object, entity or detail but a greeting ("hi",
//     "thanks", 你好, 谢谢) is low_information with the key GREETING or THANKS
//     (the last one; the store's cold fallback serves those). Text with
//     nothing at all is invalid_argument ("no content").
//
// The fingerprint is FNV-1a 64 over the key's bytes: stable across runs,
// machines and versions, since the store persists it. `group` is the
// fingerprint of what the store's similarity level must agree on (entity and
// polarised action), and routes a key to its shard.
//
// A host that has its own keys skips the text path: from_host_key(key, group).
//
// Errors (Status, never exceptions): invalid_argument for invalid UTF-8, text
// over max_text_bytes, text with no content; io_error / invalid_argument for a
// lexicon directory that cannot be read or has malformed lines (naming file
// and line). SuffixKeyer is immutable after create: make_key is safe to call
// from any number of threads at once.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "clm/status.hpp"

namespace clm {

// FNV-1a 64: the fingerprint of a key (persisted; never change it).
constexpr std::uint64_t key_fingerprint(std::string_view bytes) {
  std::uint64_t h = 0xcbf29ce484222325ULL;
  for (char c : bytes) {
    h ^= static_cast<std::uint8_t>(c);
    h *= 0x100000001b3ULL;
  }
  return h;
}

struct SuffixKey {
  std::string key;                   // readable: "ORDER-789-QUERY-STATUS"
  std::uint64_t fingerprint = 0;     // key_fingerprint(key)
  std::uint64_t group = 0;           // key_fingerprint of "<entity>|<action>": what level 2 must agree on
  std::string entity;                // "789", or empty
  std::string action;                // "QUERY", "NOT-QUERY", "CANCEL", "PAY+NOT-SUCCEED", ... or empty
  std::string object;                // "ORDER", or empty
  std::vector<std::string> details;  // "STATUS", ... sorted, unique
  bool low_information = false;      // greetings and thanks: the cold fallback's suffixes
};

struct SuffixKeyerConfig {
  // A directory of *.tsv lexicons replacing the built-in ones (empty: built-in).
  // Each line: surface<TAB>category<TAB>CANONICAL, '#' starts a comment (at
  // a line's start or after a blank); categories: action, object, detail,
  // negation, stopword, greeting, question. CANONICAL is [A-Z][A-Z0-9_]*, one
  // category's only (QUERY: an action's); a question's is QUERY or a detail's.
  std::string lexicon_dir;
  // Entity patterns, tried in order; the first that matches wins. Syntax (no
  // regular expressions: linear time on any input): a literal prefix, then
  // '{d:MIN-MAX}' for a run of MIN..MAX ASCII digits or '{a:MIN-MAX}' for
  // letters and digits, and '?' after a literal character makes it optional.
  // Matching runs on the normalised text, and literals are normalised like it
  // ("ORD-" is "ord" then a separator, which also matches at the text's start
  // or end); a run is a whole run of its class, and a match never starts or
  // ends inside an ASCII word. The canonical entity is what the {...} run
  // matched. Empty: the built-in patterns (order numbers as "ord-789", "#789",
  // "order 789", "订单789", bare runs of 3+ digits).
  std::vector<std::string> entity_patterns;
  std::size_t max_text_bytes = 16 * 1024;  // longer text is invalid_argument, never truncated silently
};

class SuffixKeyer {
 public:
  static Status create(const SuffixKeyerConfig& config, std::unique_ptr<SuffixKeyer>& out);
  ~SuffixKeyer();
  SuffixKeyer(const SuffixKeyer&) = delete;
  SuffixKeyer& operator=(const SuffixKeyer&) = delete;

  // The key of `text` (UTF-8). `out` is untouched on error.
  Status make_key(std::string_view text, SuffixKey& out) const;

  // The normalised form of `text` (step 1), for tools and tests.
  Status normalise(std::string_view text, std::string& out) const;

  // A host's own key: 1..256 bytes of printable ASCII; group (at most 256
  // bytes of printable ASCII, or empty) names what level 2 must agree on
  // (empty: the key itself, so level 2 only finds other versions' neighbours
  // of the same key).
  static Status from_host_key(std::string_view key, std::string_view group, SuffixKey& out);

 private:
  struct Impl;
  explicit SuffixKeyer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace clm
