// clm/store/suffix_key.hpp: the suffix key of CLM's snapshot store
// (docs/snapshot-store.md). One function turns a user's text into the key
// under which a semantic snapshot is stored and found again; the store uses
// it offline (ingest) and online (lookup) alike, because cleaning that differs
// between the two silently drops reuse to zero.
//
//   std::unique_ptr<clm::SuffixKeyer> keyer;
//   CLM_RETURN_IF_ERROR(clm::SuffixKeyer::create({}, keyer));   // built-in lexicons
//   clm::SuffixKey k;
//   CLM_RETURN_IF_ERROR(keyer->make_key("Please check the status of order 789", k));
//   // k.key == "QUERY-ORDER-789-STATUS", k.fingerprint == clm::key_fingerprint(k.key)
//   CLM_RETURN_IF_ERROR(keyer->make_key("帮我查下订单789的状态", k));   // the same key
//   CLM_RETURN_IF_ERROR(keyer->make_key("Don't check order 789", k));  // "NOT-QUERY-ORDER-789": another key
//   CLM_RETURN_IF_ERROR(keyer->make_key("what's the weather like", k));
//   // k.low_information: the keyer does not know "weather", so it does not claim to know what is asked
//
// Precision first: a key that two different requests share serves one of
// them the other's answer, which is worse than no answer at all (a miss costs
// one prefill). So the keyer abstains (low_information, with abstain_reason)
// whenever it cannot say what the text asks, and the store never serves an
// abstained key at level 1 or 2. What make_key does, in order:
//  1. Normalise: reject invalid UTF-8 and text over max_text_bytes; fold
//     full-width forms to half-width (NFKC for U+FF01..U+FF5E, U+3000,
//     U+FFE5), Traditional Chinese to Simplified (OpenCC), ASCII case to
//     lower, every run of whitespace and punctuation (ASCII and CJK) to one
//     break: a clause break for , ; ! 。 and a full stop before a space, a
//     question break for ?, else a space. A point or comma between digits
//     stays in the number ("7.25", "1,000" is 1000). '$', '%' and other
//     currency signs are words of their own.
//  2. Tokens: ASCII words split on breaks; CJK text matched greedily (longest
//     lexicon entry first) against the lexicons; the configured entity
//     patterns' matches; a word with a digit is a number, numbers side by
//     side are one entity, written without their separators ("ORD-2024-0001":
//     ORDER, 20240001; "0161 496 0732" and "01614960732" alike) and a unit
//     beside a number joins it ("$20", "20 dollars":
//     20usd). A word in no lexicon that is not a number makes the key abstain.
//  3. Lexicons (data/suffix_keys/*.tsv, shipped and compiled in; a host may
//     load its own directory): each entry maps a surface form to a category
//     and a canonical name: actions (查/check -> QUERY), objects (订单/order ->
//     ORDER), details (STATUS, TIME), negations, question words (when ->
//     TIME), auxiliaries that open a yes-no question (has, did -> ASK; can i
//     -> ASK_ABLE), polite forms (please, can you, 帮我), units (usd, 元),
//     roles (from, to, 从: which way), greetings and stopwords. Number words
//     ("two", 两) are numbers.
//  4. Clauses, each on its own: a negation governs the next action, object or
//     entity of its clause, with only details after it those ("instead of the
//     noon one"), or with nothing after it the action before it
//     (登录不了); it never reaches past a clause break, so "I don't want to
//     wait, cancel my order" asks to cancel. A clause opened by an auxiliary,
//     or with a question word, or ending in a question mark without a polite
//     form, asks: about the state of something (QUERY: "where is my order",
//     "has my order shipped" is ASK-SHIP) or whether one may (ASK_ABLE: "can
//     I cancel my order?"), never the command ("cancel my order", "can you
//     cancel my order?"). An action in a past form, or under a negation of
//     the past (didn't, 没), is a report, not a request: "my flight was
//     cancelled" is CANCEL_DONE-FLIGHT, not CANCEL-FLIGHT. Actions, objects,
//     entities and details each keep their order, so "cancel 789, not 456"
//     and "cancel 456, not 789", "cancel my confirmation" and "confirm my
//     cancellation" differ; a role word keeps a direction ("from monthly to
//     annual": FROM.MONTHLY+TO.ANNUAL).
//  5. Key: the clauses joined by '|'; per clause its NOT (a negation that
//     governs nothing), mood, actions, objects, entities and details, the
//     parts of each joined by '+' and the sections by '-', a negated part
//     written NOT-<PART>: "NOT-CANCEL-ORDER-789", "CANCEL-ORDER-789+NOT-456".
//     A clause of nothing but what is not meant ("..., not 456"; "..., the
//     router is fine" beside another request or report) joins the clause
//     beside it, and in a clause the parts not meant come after the others.
//     Undoing an action named as a thing is the action that reverses it
//     ("lift the freeze": UNFREEZE; "undo the cancellation", 取消订单的取消:
//     RESUME), never the action nor its negation. A clause of actions alone
//     acts on what the clause beside it names when that one asks nothing of
//     its own ("my account is locked, please unlock it": UNLOCK-ACCOUNT).
//     A key is issued only when a clause has an action with an object or an
//     entity, or two of those (退押金: RETURN+DEPOSIT); an action alone
//     ("cancel it"), a detail alone, a greeting ("hi", 谢谢: key
//     GREETING or THANKS) or an unknown word is low_information. Text with
//     nothing at all is invalid_argument ("no content").
//
// The fingerprint is FNV-1a 64 over the key's bytes: stable across runs,
// machines and versions, since the store persists it. `group` is the
// fingerprint of what the store's similarity level must agree on, and routes
// a key to its shard: for a keyed text, the whole key, details included (rules
// v5: without them "a window seat" met "an aisle seat" at level 2); a host key
// may name a group several keys share (from_host_key). Keys are comparable only under the
// same rules: rules_fingerprint() names them, and the store refuses to open
// with other ones.
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
  std::string key;                   // readable: "QUERY-ORDER-789-STATUS"
  std::uint64_t fingerprint = 0;     // key_fingerprint(key)
  std::uint64_t group = 0;           // what level 2 must agree on: the key itself for keyed text
  std::string entity;                // every entity, in order, joined by '+': "789", "789+NOT-456", or empty
  std::string action;                // every action, in order: "QUERY", "NOT-CANCEL", "UNDO+CANCEL", ... or empty
  std::string object;                // the first object asked for: "ORDER", or empty
  std::vector<std::string> details;  // "STATUS", ... sorted, unique
  // Abstained: the key does not say enough to pick one answer (a greeting, an
  // action with no object or entity, a word the keyer does not know, ...).
  // The store never serves such a key at level 1 or 2 and never stores it;
  // only a level-3 fallback the host registered for it may answer.
  bool low_information = false;
  std::string abstain_reason;  // why low_information, for people ("unknown word \"weather\""); empty otherwise
  std::string source;          // the text make_key was given; empty for a host key. The store keeps it so that
                               // `clm_store rekey` can rebuild keys under new rules.
};

struct SuffixKeyerConfig {
  // A directory of *.tsv lexicons added to the built-in ones (a host's own
  // words: product names, its own actions), or replacing them with
  // replace_builtin_lexicons. A surface the built-ins have is an error
  // naming both, unless it means the same.
  // Each line: surface<TAB>category<TAB>CANONICAL, '#' starts a comment (at
  // a line's start or after a blank); categories: action, object, detail,
  // negation, stopword, greeting, question, aux, polite, unit. CANONICAL is
  // [A-Z][A-Z0-9_]*, one category's only (QUERY: an action's); a question's
  // is QUERY, QMARK (a spoken question mark: 吗), WHERE (how, before an act
  // asked for: "where do I pay"; else QUERY) or a detail's; a negation's
  // NOT_ (governs what follows), NOT_PAST (the same, of what happened:
  // didn't, 没) or NOT_AFTER (the action before it: 不了). A stopword named
  // SUBJECT (i, we, 我) says that an auxiliary after it states, not asks; a
  // role (from: FROM, to: TO) marks the word right after it.
  std::string lexicon_dir;
  bool replace_builtin_lexicons = false;
  // Entity patterns, tried in order at each word; the first that matches
  // there is an entity, and matching goes on after it. Syntax (no
  // regular expressions: linear time on any input): a literal prefix, then
  // '{d:MIN-MAX}' for a run of MIN..MAX ASCII digits or '{a:MIN-MAX}' for
  // letters and digits, and '?' after a literal character makes it optional.
  // Matching runs on the normalised text, and literals are normalised like it
  // ("ORD-" is "ord" then a separator, which also matches at the text's start
  // or end); a run is a whole run of its class, and a match never starts or
  // ends inside an ASCII word. The canonical entity is what the {...} run
  // matched. Numbers need no pattern (every word with a digit is one); a
  // pattern names ids without digits ("case {a:4-12}"). Empty: none.
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

  // A fingerprint of the rules this keyer applies: kRulesVersion, every
  // lexicon line loaded (built-in and added), every entity pattern, the
  // Chinese folding and the English word list misspellings are checked
  // against. Keys
  // made under one fingerprint are only comparable with keys made under the
  // same one: the store records it and refuses to open under another.
  std::uint64_t rules_fingerprint() const;
  // The version of the key rules in this library; part of rules_fingerprint().
  static constexpr std::uint32_t kRulesVersion = 61;

 private:
  struct Impl;
  explicit SuffixKeyer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace clm
