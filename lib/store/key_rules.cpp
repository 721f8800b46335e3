// lib/store/key_rules.cpp: the suffix keyer's key rules (key_rules.hpp):
// tokens from normalised text, then clauses, then the key. One pass per step,
// bounded work per unit: time is linear in the text whatever it holds.
#include "key_rules.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cstddef>
#include <initializer_list>
#include <string>
#include <unordered_set>
#include <utility>

#include "english_words.hpp"
#include "key_clause.hpp"
#include "suffix_text.hpp"

namespace clm::store_detail {

namespace {

constexpr std::size_t kMaxKeyBytes = 256;

struct Token {
  enum Kind : std::uint8_t {
    action,
    object,
    detail,
    entity,
    negation,
    negation_after,
    question,
    aux,
    polite,
    greeting,
    role,
    subject,      // a stopword named SUBJECT or SPEAKER (i, we, 我): an auxiliary after it does not ask
    coordinator,  // a stopword named AND (and, 和): objects it joins may come in any order
    speaker,      // a stopword named ME (me, us): the speaker as what is acted on
    disposal,     // a stopword named DISPOSAL (把, 将): what follows is acted on
    want,         // a stopword named WANT (want, need, 要, 想): the clause asks for what it names
    sequence,     // a stopword named SEQUENCE (then, 先, 再, 然后): the actions' order is asked for
    benefactive,  // 给, 帮, 给我, 帮我: for whom, or a request (benefactive_roles reads which)
    perfective,   // a stopword named PERFECTIVE (了, 过): with a subject and no request, what was done
    turn,         // a stopword named TURN_OF_CLAUSE (but, if, although): what follows is said of another thing
    unknown,
    clause_end,
  } kind = unknown;
  std::uint32_t name = 0;
  std::string text;            // an entity's canonical text, an unknown word
  bool question_mark = false;  // clause_end: a question mark
  bool soft = false;           // clause_end: made by a rule (before, after; "and" then a subject), not the text
  bool past = false;           // an action in a past form ("cancelled", "sent")
  bool names_speaker = false;  // subject: the speaker's word for itself, also what is acted on (我)
  bool counted = false;        // entity: a number before a measure word (2张), so it counts something
  bool article = false;        // entity: "one", or 1 before a measure word (一张): "a", unless counts are compared
  bool both = false;           // entity: "both", the number 2, unless it opens "both X and Y" (drop_articles)
  bool particle = false;       // unknown: "off" or "back" apart from its verb ("take my card off"), until separated_off
  bool denies_saying = false;  // unknown: a negated word for saying ("I never said"): no request follows
  bool inverts = false;        // negation: an auxiliary's (isn't, hasn't, can't), which may open a question
  bool subordinate = false;    // question: "when" then who or what ("charge me when it ships"), unless asked about
  bool what_it_is = false;     // question: 多少 after 是 (账号是多少): what it is, not how much there is
  bool before_thing_only = false;  // detail: kept only right before a thing ("the right earbud", not "that's right")
  bool reported = false;           // action, object: after 已经 or 被, what was done ("订单已经取消了")
  bool actor = false;              // object, entity: who acts for the speaker (邻居帮我签收: BY.)
  bool prefers = false;   // want: rather, prefer, would sooner ("than" or "over" after it names what is not wanted)
  bool needs = false;     // want: need, 需要, 要 (NEED), which in a question asks whether one must: ASK_MUST
  bool passive = false;   // want: needs to be, has to be (WANT_DONE): only a past form after it is asked for
  bool gerund = false;    // action: a form in -ing ("checking"), which after "to" names a thing
  bool dao = false;       // action: 到 alone, which after a verb says where to (改到周六, 转到储蓄账户)
  bool owner = false;     // object: before 's (POSSESSIVE), so it owns the thing after it ("my neighbor's parcel")
  bool someones = false;  // object: right after my, our, your (OWNER): someone's own, "my neighbor"
  bool after_preposition = false;  // object: right after in, at, of or for (PREPOSITION), not "on"
  bool modifies = false;           // object, entity: right before 的 (OF), so it says which thing follows
  bool nominal = false;  // action: named as a thing ("the cancellation", 解除冻结): undoing it reverses it
  bool fine = false;     // negation_after: a word for fine ("the modem is fine", 没问题): no problem with it
  bool unable = false;  // negation, negation_after: what cannot be done (can't, 无法, 登录不了), not what must not
  bool contrast = false;      // negation: says which thing is meant (not, instead of, rather than, except)
  bool does_not = false;      // negation: denies what something does ("won't", "isn't"), unlike "mustn't"
  bool instead = false;       // negation: instead of, rather than, but not, 而不是: what follows is the other option
  bool forbids = false;       // negation: don't, do not: with "yet", still a prohibition ("don't ship it yet")
  bool condition = false;     // turn: if, 如果 (CONDITION): what follows is a condition, not a request
  bool can_you = false;       // polite: 能帮我, 你可以 (POLITE_CAN_YOU): asks the one asked to act, 了吗 or not
  bool refuses = false;       // negation: don't want: "don't want my plan to renew" is "don't renew my plan"
  bool denies = false;        // negation: 不是, which before another negation denies what that one states
  bool commands = false;      // object: opens its clause before "the", "my", "a": its verb, asked for ("refund my fee")
  bool verb_first = false;    // object: 退, 退款, 预约 opening a Chinese clause: its verb, when a thing follows
  bool chinese_verb = false;  // object: 退, 退款, 预约 in Chinese, a verb wherever it stands
  bool copular = false;  // speaker: "the buyer is me", "I am the buyer", 我是受益人: the speaker in a role (SELF)
  bool step_first = false;     // object, entity, detail: the step between 先 and 再 before any verb (FIRST.)
  std::string described = {};  // thing: the details that describe it alone among things joined by and ("LARGE.")
};

// Where an entity pattern matched: [begin, end) of the normalised text, and
// the run that names the entity.
struct PatternMatch {
  std::size_t begin = 0, end = 0;
  Span run;
};

// A number word the lexicon does not claim ("one" and 一 are mostly "a";
// words with 一 in them are lexicon entries), or nullptr: its value, and how
// it combines with the words beside it (twenty five, 二十三, 十万, 二〇二六).
struct Numeral {
  enum Kind : std::uint8_t {
    value,       // a number of its own: two, 三, twenty, fifteen
    multiplier,  // multiplies what is before it in its group: hundred, 十, 百, 千
    group,       // closes a group and multiplies it: thousand, 万
  } kind = value;
  std::uint64_t amount = 0;
  // 百, 千, 万: one digit right after it, ending the number, counts the next
  // place down (一千五 is 1500, 三百五 350, 一万五 15000; 一千零五 is 1005).
  bool shortens = false;
};

const Numeral* numeral_value(std::string_view unit) {
  using N = Numeral;
  static constexpr std::pair<std::string_view, Numeral> kNumerals[] = {
      {"two", {N::value, 2}},
      {"three", {N::value, 3}},
      {"four", {N::value, 4}},
      {"five", {N::value, 5}},
      {"six", {N::value, 6}},
      {"seven", {N::value, 7}},
      {"eight", {N::value, 8}},
      {"nine", {N::value, 9}},
      {"ten", {N::value, 10}},
      {"eleven", {N::value, 11}},
      {"twelve", {N::value, 12}},
      {"fifteen", {N::value, 15}},
      {"twenty", {N::value, 20}},
      {"thirty", {N::value, 30}},
      {"forty", {N::value, 40}},
      {"fifty", {N::value, 50}},
      {"hundred", {N::multiplier, 100}},
      {"thousand", {N::group, 1000}},
      {"〇", {N::value, 0}},
      {"零", {N::value, 0}},
      {"一", {N::value, 1}},
      {"二", {N::value, 2}},
      {"两", {N::value, 2}},
      {"三", {N::value, 3}},
      {"四", {N::value, 4}},
      {"五", {N::value, 5}},
      {"六", {N::value, 6}},
      {"七", {N::value, 7}},
      {"八", {N::value, 8}},
      {"九", {N::value, 9}},
      {"十", {N::multiplier, 10}},
      {"百", {N::multiplier, 100, true}},
      {"千", {N::multiplier, 1000, true}},
      {"万", {N::group, 10000, true}},
  };
  for (const auto& [word, numeral] : kNumerals) {
    if (unit == word) return &numeral;
  }
  return nullptr;
}

// The value of numbers side by side, some of them words (twenty five: 25;
// 二十三: 23; 十二: 12; 10万: 100000; 二〇二六: 2026; two thousand five hundred:
// 2500), or false where they make no one number ("twenty thirty").
bool numeral_sum(const std::vector<Numeral>& parts, std::uint64_t& out) {
  constexpr std::uint64_t kMax = 1'000'000'000'000ULL;
  std::uint64_t total = 0, group = 0, number = 0;
  bool has_number = false, spoken_tens = false;  // spoken_tens: "twenty", waiting for "five"
  for (const Numeral& p : parts) {
    if (p.amount > kMax || number > kMax || group > kMax || total > kMax) return false;
    switch (p.kind) {
      case Numeral::multiplier:
        group += (has_number ? number : 1) * p.amount;
        has_number = spoken_tens = false;
        number = 0;
        break;
      case Numeral::group:
        group += number;
        total += (group == 0 ? 1 : group) * p.amount;
        group = number = 0;
        has_number = spoken_tens = false;
        break;
      case Numeral::value:
        if (!has_number) {
          number = p.amount;
          spoken_tens = p.amount >= 20 && p.amount < 100 && p.amount % 10 == 0;
        } else if (spoken_tens && p.amount < 10) {
          number += p.amount;  // twenty five
          spoken_tens = false;
        } else if (p.amount < 10) {
          number = number * 10 + p.amount;  // 二〇二六: digit by digit
        } else {
          return false;
        }
        has_number = true;
        break;
    }
  }
  const bool shortened = parts.size() >= 2 && parts.back().kind == Numeral::value && parts.back().amount >= 1 &&
                         parts.back().amount <= 9 && parts[parts.size() - 2].shortens;
  if (shortened) number *= parts[parts.size() - 2].amount / 10;
  out = total + group + number;
  return out <= kMax;
}

// Whether a token kind only says who (我, me, 给我, want): 已经 and 被 look past it for their verb.
bool says_who(Token::Kind kind) {
  return kind == Token::subject || kind == Token::speaker || kind == Token::benefactive || kind == Token::want;
}

// Whether an English surface is a verb's past form: a word in -ed or an
// irregular past. "My flight was cancelled" and "I cancelled my order" report
// what happened; "cancel my flight" asks for it.
bool is_past_form(const std::vector<std::string_view>& units, std::size_t first, std::size_t count) {
  // Irregular pasts that are not also present forms ("put", "set", "hit",
  // "quit", "split", "shut" are both, so they cannot tell).
  static constexpr std::string_view kIrregular[] = {
      "sent",   "paid",  "bought",  "made",  "done",    "gone", "came", "went",  "lost",  "broke", "taken", "took",
      "given",  "gave",  "forgot",  "chose", "chosen",  "held", "kept", "sold",  "spent", "told",  "found", "frozen",
      "stolen", "stole", "written", "wrote", "brought", "left", "won",  "begun", "began", "got",
  };
  for (std::size_t k = first; k < first + count; ++k) {
    const std::string_view w = units[k];
    if (w.size() > 3 && w.substr(w.size() - 2) == "ed" && std::all_of(w.begin(), w.end(), is_ascii_alnum)) {
      return true;
    }
    if (std::find(std::begin(kIrregular), std::end(kIrregular), w) != std::end(kIrregular)) return true;
  }
  return false;
}

// Whether a verb whose past is its present ("reset", "put", "set") is in
// its past: after who did it ("I just reset my password", "they reset it")
// or after been, got, have, is, already ("my password has been reset"); "you
// reset my password" reports it too. Not after "can I", "do I" or "could
// you", which ask for it ("could you reset my password").
bool same_in_past_after_who(const std::vector<std::string_view>& units, std::size_t at, std::size_t count) {
  static constexpr std::string_view kSameInPast[] = {"reset", "put", "set", "quit", "shut", "cut", "split", "hit"};
  if (count != 1 || at == 0 ||
      std::find(std::begin(kSameInPast), std::end(kSameInPast), units[at]) == std::end(kSameInPast)) {
    return false;
  }
  std::size_t before = at - 1;
  if (units[before] == "just" && before > 0) --before;
  static constexpr std::string_view kWho[] = {"i", "we", "you", "they", "he", "she", "someone", "somebody"};
  static constexpr std::string_view kDone[] = {"been", "got", "already", "have", "has",
                                               "had",  "ve",  "is",      "was",  "were"};
  if (std::find(std::begin(kDone), std::end(kDone), units[before]) != std::end(kDone)) return true;
  if (std::find(std::begin(kWho), std::end(kWho), units[before]) == std::end(kWho)) return false;
  static constexpr std::string_view kAsking[] = {"can", "could", "may", "should", "would", "will", "do", "did"};
  return before == 0 || std::find(std::begin(kAsking), std::end(kAsking), units[before - 1]) == std::end(kAsking);
}

bool is_ascii_word(std::string_view unit) {
  return !unit.empty() &&
         std::all_of(unit.begin(), unit.end(), [](char c) { return static_cast<unsigned char>(c) < 0x80; });
}

// Whether the token at `at` opens its clause: nothing before it in the
// clause but greetings and polite forms ("please refund my fee").
bool opens_clause(const std::vector<Token>& tokens, std::size_t at) {
  for (std::size_t k = at; k > 0; --k) {
    const Token::Kind kind = tokens[k - 1].kind;
    if (kind == Token::clause_end) return true;
    if (kind != Token::greeting && kind != Token::polite) return false;
  }
  return true;
}

// Whether an English word after a thing's name makes the name a verb
// ("refund the fee", "order a pizza", "return it", "refund everything"); never
// "that" ("the modem that's broken").
bool opens_what_a_verb_acts_on(std::string_view unit) {
  for (std::string_view w :
       {"the", "a",    "an",    "my",    "your",       "our", "their", "his",  "her",  "it",   "them", "me",
        "us",  "this", "these", "those", "everything", "all", "half",  "just", "only", "both", "to"}) {
    if (unit == w) return true;
  }
  return false;
}

// Whether a Chinese word for a thing is also its verb when it opens a
// clause before what it acts on (退年费: refund the annual fee; 退款原路返回;
// 预约明天下午: book tomorrow afternoon). Not 订单, 账单: they name things only.
bool names_its_verb(std::string_view name) { return name == "RETURN" || name == "REFUND" || name == "APPOINTMENT"; }

// Whether the `count` units from `first` are one of `phrases`, each its words
// separated by single spaces ("rather than"; Chinese units are characters: "而 不 是").
bool is_one_of(const std::vector<std::string_view>& units, std::size_t first, std::size_t count,
               std::initializer_list<std::string_view> phrases) {
  for (std::string_view phrase : phrases) {
    std::size_t k = 0;
    bool same = true;
    for (std::size_t start = 0; same && start <= phrase.size(); ++k) {
      const std::size_t space = std::min(phrase.find(' ', start), phrase.size());
      same = k < count && units[first + k] == phrase.substr(start, space - start);
      start = space + 1;
    }
    if (same && k == count) return true;
  }
  return false;
}

// Whether the negation's words say which thing is meant rather than deny
// what is said ("not", "instead of", "rather than", "except"; not "don't",
// "isn't", 不).
bool says_which_is_meant(const std::vector<std::string_view>& units, std::size_t first, std::size_t count) {
  return is_one_of(units, first, count,
                   {"not", "instead of", "rather than", "but not", "except", "except for", "apart from", "aside from",
                    "other than", "excluding"});
}

// Whether the negation's words deny what something does or is ("doesn't",
// "won't", "isn't", "aren't"): after a thing, "the app won't open", a fault;
// not "mustn't", "shouldn't", "no need to", which forbid.
bool says_it_does_not(const std::vector<std::string_view>& units, std::size_t first, std::size_t count) {
  return is_one_of(units, first, count,
                   {"doesn t", "doesnt", "does not", "don t", "dont", "do not", "won t", "wont", "will not", "isn t",
                    "isnt", "is not", "aren t", "arent", "are not"});
}

// Whether the negation's words name the other option ("instead of", "rather
// than", "but not", 而不是): not "not" alone ("confirmation not received").
bool names_the_other_option(const std::vector<std::string_view>& units, std::size_t first, std::size_t count) {
  return is_one_of(units, first, count, {"instead of", "rather than", "but not", "而 不 是"});
}

// Whether the negation's words forbid ("don't", "do not"): with "yet", still a prohibition.
bool says_do_not(const std::vector<std::string_view>& units, std::size_t first, std::size_t count) {
  return is_one_of(units, first, count, {"don t", "dont", "do not"});
}

// Whether a thing is a person one gives, pays or calls (妈妈, 朋友, 房东): 给我
// before it is 给 and the speaker's own person (给我妈转账), not 给我 (I want).
// A verb, or a thing that is its verb in Chinese (退, 退款, 预约): what
// acts, wherever it stands.
bool acts_as_verb(const Token& t) { return t.kind == Token::action || (t.kind == Token::object && t.chinese_verb); }

// 我取消了订单, 你们退了押金, 我退了押金: 了 between the verb at t and its
// thing, after who did it, reports it (a request puts 了 at the end:
// 把订单取消了); not after a want, a polite form or an auxiliary.
bool done_before_its_thing(const Token* begin, const Token* t, const Token* end) {
  return t + 2 < end && t[1].kind == Token::perfective && (t[2].kind == Token::object || t[2].kind == Token::entity) &&
         std::any_of(begin, t, [](const Token& x) { return x.kind == Token::subject; }) &&
         std::none_of(begin, t, [](const Token& x) {
           return x.kind == Token::want || x.kind == Token::polite || x.kind == Token::aux;
         });
}

bool is_person(const Lexicon& lex, const Token& t) {
  return t.kind == Token::object && is_person_name(lex.names[t.name]);
}

// Whether "when" before units[at] opens a clause of its own ("when it ships",
// "when my order arrives"), not a question ("when will it ship", "when is it
// due"), and is not asked about ("do you know when it ships").
bool starts_a_clause_after_when(const std::vector<std::string_view>& units, std::size_t at) {
  static constexpr std::string_view kWho[] = {"it", "i", "you", "we", "they", "my", "the", "your", "our", "he", "she"};
  if (std::find(std::begin(kWho), std::end(kWho), units[at]) == std::end(kWho)) return false;
  if (at < 2) return true;
  static constexpr std::string_view kKnowing[] = {"know", "idea", "wondering", "wonder", "sure", "check", "ask"};
  if (std::find(std::begin(kKnowing), std::end(kKnowing), units[at - 2]) != std::end(kKnowing)) return false;
  // "tell me when my subscription renews" asks when; "call me when you arrive" does not.
  return !(at >= 3 && (units[at - 2] == "me" || units[at - 2] == "us") &&
           (units[at - 3] == "tell" || units[at - 3] == "show"));
}

// A word after which a verb's word names a thing: "the cancellation", "my
// freeze", 订单的取消.
bool names_a_thing_next(std::string_view unit) {
  for (std::string_view w :
       {"the", "a", "an", "my", "your", "our", "their", "his", "her", "its", "this", "that", "of", "的"}) {
    if (unit == w) return true;
  }
  return false;
}

bool has_ascii_digit(std::string_view unit) { return std::any_of(unit.begin(), unit.end(), is_ascii_digit); }

std::size_t offset_of(std::string_view norm, std::string_view unit) {
  return static_cast<std::size_t>(unit.data() - norm.data());
}

// Leftmost, non-overlapping matches of the patterns, tried in order at each
// unit's start.
void find_pattern_matches(const std::vector<Pattern>& patterns, std::string_view norm,
                          const std::vector<std::string_view>& units, std::vector<PatternMatch>& out) {
  out.clear();
  if (patterns.empty()) return;
  MatchScratch scratch;
  std::size_t covered = 0;
  for (std::string_view unit : units) {
    const std::size_t start = offset_of(norm, unit);
    if (start < covered) continue;
    for (const Pattern& p : patterns) {
      if (p.first_byte >= 0 && static_cast<unsigned char>(norm[start]) != p.first_byte) continue;
      PatternMatch m;
      m.begin = start;
      if (match_at(p, norm, start, m.run, scratch, &m.end)) {
        covered = m.end;
        out.push_back(m);
        break;
      }
    }
  }
}

class Tokenizer {
 public:
  Tokenizer(const Lexicon& lex, std::string_view norm) : lex_(lex), norm_(norm) {}

  void run(const std::vector<std::string_view>& units, const std::vector<PatternMatch>& matches,
           std::vector<Token>& out) {
    out_ = &out;
    std::size_t next_match = 0;
    std::string probe;
    for (std::size_t i = 0; i < units.size();) {
      const std::size_t at = offset_of(norm_, units[i]);
      if (next_match < matches.size() && at >= matches[next_match].begin) {
        const PatternMatch& m = matches[next_match++];
        add_entity(std::string(norm_.substr(m.run.begin, m.run.end - m.run.begin)));
        while (i < units.size() && offset_of(norm_, units[i]) < m.end) ++i;
        continue;
      }
      const std::string_view unit = units[i];
      if (unit.size() == 1 && (unit[0] == kClauseBreak || unit[0] == kQuestionBreak)) {
        flush_unit_as_detail();
        out.push_back({Token::clause_end, 0, {}, unit[0] == kQuestionBreak});
        clause_start_ = out.size();
        last_entity_ = false;
        done_mark_ = done_waits_for_action_ = false;
        all_mark_ = false;
        ++i;
        continue;
      }
      // "the buyer is me", 受益人是我, "I am the buyer", 我是受益人: the speaker
      // said to be who plays a role is part of what is said ("my sister is
      // the beneficiary" is not "I am"). speaker_plays_a_role keeps it only in
      // a clause that names a role.
      const bool ends_here = i + 1 == units.size() || units[i + 1] == "and" || units[i + 1] == "和" ||
                             (units[i + 1].size() == 1 && units[i + 1][0] == kClauseBreak);
      if ((unit == "me" || unit == "我") && i > 0 && is_one_of(units, i - 1, 1, {"is", "was", "是"}) && ends_here) {
        flush_unit_as_detail();
        out.push_back({Token::speaker, 0, {}, false});
        out.back().copular = true;
        last_entity_ = false;
        ++i;
        continue;
      }
      if ((unit == "i" || unit == "我") && i + 1 < units.size() && is_one_of(units, i + 1, 1, {"am", "m", "是"})) {
        flush_unit_as_detail();
        out.push_back({Token::speaker, 0, {}, false});
        out.back().copular = true;
      }
      // "my customer no is 0045": after a thing, "no" then is or was and a
      // number is the word for number, not a negation.
      if (unit == "no" && !out.empty() && out.back().kind == Token::object && i + 2 < units.size() &&
          (units[i + 1] == "is" || units[i + 1] == "was") && has_ascii_digit(units[i + 2])) {
        ++i;
        continue;
      }
      // The longest lexicon entry here, never reaching into a pattern's match.
      const std::size_t limit = next_match < matches.size() ? matches[next_match].begin : norm_.size();
      probe.clear();
      std::int32_t best = -1;
      std::size_t best_len = 0;
      for (std::size_t k = 0; k < lex_.max_units && i + k < units.size(); ++k) {
        if (offset_of(norm_, units[i + k]) >= limit) break;
        if (k) probe.push_back(' ');
        probe.append(units[i + k]);
        const auto it = lex_.surfaces.find(probe);
        if (it == lex_.surfaces.end()) break;
        if (it->second >= 0) {
          best = it->second;
          best_len = k + 1;
        }
      }
      // After to, from, in or via comes a place's name: "a flight to Nice" is
      // no pleasantry and "to Porto" no slip of "port". A name the lexicon
      // lacks is an unknown word, and the key abstains.
      const bool names_a_place = i > 0 && is_one_of(units, i - 1, 1, {"to", "from", "in", "via"});
      if (names_a_place && best >= 0 && best_len == 1 && unit == "nice") best = -1;
      // 我点的是中杯, 我点了两杯: 点 after who orders is ordering (点单), not
      // o'clock. 我点的外卖 names the takeout, as 我的外卖 does: left as it was.
      const bool names_what_was_ordered = i + 2 < units.size() && units[i + 1] == "的" && units[i + 2] != "是";
      if (best >= 0 && best_len == 1 && unit == "点" && i > 0 && !names_what_was_ordered &&
          is_one_of(units, i - 1, 1, {"我", "你", "他", "她", "们"})) {
        if (const auto order = lex_.surfaces.find("点 单"); order != lex_.surfaces.end() && order->second >= 0) {
          best = order->second;
        }
      }
      if (best < 0 && (best = corrected_spelling(unit)) >= 0) {
        best_len = 1;
        // After a thing and to ("a flight to Porto", "my flight to bostn")
        // a slip is mended only into a thing, a place: not "port".
        if (names_a_place && out.size() >= 2 && out.back().kind == Token::role &&
            out[out.size() - 2].kind == Token::object &&
            lex_.entries[static_cast<std::size_t>(best)].category != Category::object) {
          best = -1;
        }
      }
      // "deposit my check", "stop payment on check 204": after the, my, a, or before a number, the
      // word is the cheque, not the verb "check" (QUERY).
      if (best >= 0 && best_len == 1 && (unit == "check" || unit == "checks") &&
          ((i > 0 && names_a_thing_next(units[i - 1])) || (i + 1 < units.size() && has_ascii_digit(units[i + 1])))) {
        if (const auto cheque = lex_.surfaces.find("cheque"); cheque != lex_.surfaces.end() && cheque->second >= 0) {
          best = cheque->second;
        }
      }
      if (best < 0) {
        if (has_ascii_digit(unit)) {
          add_number(unit);
        } else if (names_next_number(units, i,
                                     next_match < matches.size() ? matches[next_match].begin : norm_.size())) {
          flush_unit_as_detail();
          last_entity_ = false;
          id_prefix_ = unit;  // "MU 5137", "TKT-88120": the letters are part of the id
        } else if (const Numeral* numeral = numeral_value(unit)) {
          add_entity({}, numeral);  // "two rooms", 两件: numbers written out are numbers
        } else if (in_name_slot(units, i)) {
          add_entity(std::string(unit));  // "Dr Patel", "14 Elm Street": a name, whole in the key
        } else {
          flush_unit_as_detail();
          out.push_back({Token::unknown, 0, std::string(unit), false});
          last_entity_ = false;
        }
        ++i;
        continue;
      }
      const bool past = is_past_form(units, i, best_len) || same_in_past_after_who(units, i, best_len);
      const bool dao = best_len == 1 && units[i] == "到";
      const bool gerund = units[i + best_len - 1].size() > 5 && units[i + best_len - 1].ends_with("ing");
      // "the cancellation", "my booking cancellation", 订单的取消, 解除冻结 and 账户冻结 (right after
      // a verb or a thing): an action named as a thing, which an undoing acts on ("cancel and
      // delete", 取消和冻结 have and between them).
      const bool nominal = i > 0 && (names_a_thing_next(units[i - 1]) ||
                                     (!is_ascii_word(units[i]) && last_token_end_ == i && !out.empty() &&
                                      (out.back().kind == Token::action || out.back().kind == Token::object)));
      const bool english_noun = is_ascii_word(units[i]) && (units[i].ends_with("tion") || units[i].ends_with("sion") ||
                                                            units[i].ends_with("al") || units[i].ends_with("ure"));
      const std::string_view first_unit = units[i];
      i += best_len;
      const bool done_before = done_mark_;
      const std::size_t tokens_before = out.size();
      add_entry(lex_.entries[static_cast<std::size_t>(best)]);
      if (out.size() > tokens_before && out.back().kind == Token::negation) {
        // isn't, hasn't, didn't, can't: an auxiliary's own negation, which opening a question is
        // that auxiliary asking (negated_yes_no_question).
        static constexpr std::string_view kAux[] = {"isn",   "aren",   "wasn",  "weren", "hasn",   "haven", "didn",
                                                    "don",   "doesn",  "can",   "isnt",  "arent",  "wasnt", "werent",
                                                    "hasnt", "havent", "didnt", "dont",  "doesnt", "cant"};
        out.back().inverts = std::find(std::begin(kAux), std::end(kAux), first_unit) != std::end(kAux);
      }
      // 已经把押金退给我了: after 把 and what it takes, a thing's name right after
      // another thing or a detail is its verb (退: RETURN).
      const bool verb_after_disposal =
          done_waits_for_action_ && out.size() > tokens_before && out.size() >= 2 &&
          (out.back().kind == Token::action ||
           (out.back().kind == Token::object &&
            (out[out.size() - 2].kind == Token::object || out[out.size() - 2].kind == Token::detail ||
             out[out.size() - 2].kind == Token::entity)));
      if (done_before && out.size() > tokens_before &&
          (out.back().kind == Token::disposal ||
           (out.back().kind == Token::benefactive && name_in(lex_.names[out.back().name], {"FOR", "POLITE_FOR"})))) {
        // 已经把订单取消了, 已经给房东转账了: past 把 or 给 and what it takes, to the verb
        done_waits_for_action_ = true;
      } else if (done_before && out.size() > tokens_before && out.size() >= 2 && is_person(lex_, out.back()) &&
                 out[out.size() - 2].kind == Token::benefactive) {
        done_waits_for_action_ = true;  // 已经给我妹转了: 给, my sister, then the verb
      } else if (done_before && out.size() > tokens_before &&
                 (out.back().kind == Token::detail || out.back().kind == Token::entity ||
                  (out.back().kind == Token::negation && is_ascii_word(first_unit)))) {
        // 已经远程重启: a detail before the verb leaves it to the verb ("thanks for not charging me": so does
        // an English negation)
      } else if (done_before && out.size() > tokens_before && !says_who(out.back().kind) &&
                 (!done_waits_for_action_ || verb_after_disposal)) {
        // 订单已经取消了, 卡被冻结了, 已经给我退款了: the first word after 已经
        // or 被 (past who), when a verb, was done.
        if (out.back().kind == Token::action || out.back().kind == Token::object) {
          out.back().past = out.back().reported = true;
        }
        done_mark_ = done_waits_for_action_ = false;
      }
      if (past && !out.empty() && (out.back().kind == Token::action || out.back().kind == Token::object)) {
        out.back().past = true;  // an object's past form is its verb's: "you refunded me" (make_clause)
      }
      // 取消好了, 退完了, 取消成功了: a verb, what completes it and 了 report it done (asked with 吗,
      // whether; before 再 or 就, a step to finish first: 身份核实完了再销户).
      const bool step_first = i < units.size() && (units[i] == "再" || units[i] == "就");
      if (best_len == 1 && first_unit == "了" && !step_first && i >= 3 && out.size() >= 2 &&
          out.back().kind == Token::perfective) {
        const std::size_t le = i - 1;  // 了
        const bool succeeded = units[le - 2] == "成" && units[le - 1] == "功";
        std::size_t verb = out.size() - 2;
        if (succeeded && verb > 0 && out[verb].kind == Token::action && lex_.names[out[verb].name] == "SUCCEED") --verb;
        if ((succeeded || units[le - 1] == "好" || units[le - 1] == "完") && out[verb].kind == Token::action &&
            lex_.names[out[verb].name] != "SUCCEED") {
          out[verb].past = out[verb].reported = true;
        }
      }
      // 过 right after a verb says it was done once (取消过订单了, 订单取消过了): never a request, as 了
      // may be. Not 过来, 过去 after it, which say where to (送过来).
      const bool toward = i < units.size() && (units[i] == "来" || units[i] == "去");
      if (best_len == 1 && first_unit == "过" && !toward && out.size() >= 2 && out.back().kind == Token::perfective &&
          out[out.size() - 2].kind == Token::action) {
        out[out.size() - 2].past = out[out.size() - 2].reported = true;
      }
      // 都取消, 全取消, 都退了: 都 or 全 right before the verb says all of them, as 全部
      // does ("取消一个" cancels one), and stands where 全部 would, before
      // the verb. Before anything else (都三天了, 都不行) it says nothing the
      // key keeps.
      if (all_mark_ && first_unit != "都" && first_unit != "全") {
        all_mark_ = false;
        if (out.size() == tokens_before + 1 &&
            (out.back().kind == Token::action ||
             (out.back().kind == Token::object && names_its_verb(lex_.names[out.back().name])))) {
          if (const auto full = lex_.surfaces.find("全 部"); full != lex_.surfaces.end() && full->second >= 0) {
            add_entry(lex_.entries[static_cast<std::size_t>(full->second)]);
            if (out.size() == tokens_before + 2) std::swap(out[tokens_before], out[tokens_before + 1]);
          }
        }
      }
      // Not after a list (电视和宽带都暂停: both, as without 都) nor after one
      // and a measure (一条都收不到: not even one).
      if (best_len == 1 && (first_unit == "都" || first_unit == "全")) {
        const std::size_t du = i - 1;
        const bool after_one = (du >= 1 && units[du - 1] == "一") || (du >= 2 && units[du - 2] == "一");
        // (A list joined by 、 has no and: two things before 都 are one too.)
        const auto clause = out.begin() + static_cast<std::ptrdiff_t>(clause_start_);
        const bool after_list =
            std::any_of(clause, out.end(), [](const Token& t) { return t.kind == Token::coordinator; }) ||
            std::count_if(clause, out.end(), [](const Token& t) { return t.kind == Token::object; }) >= 2;
        all_mark_ = !after_one && !after_list;
      }
      if (dao && !out.empty() && out.back().kind == Token::action) out.back().dao = true;
      if (gerund && !out.empty() && out.back().kind == Token::action) out.back().gerund = true;
      if (out.size() > tokens_before && out.back().kind == Token::object && i < units.size() &&
          opens_clause(out, tokens_before) && opens_what_a_verb_acts_on(units[i])) {
        out.back().commands = true;  // "refund the annual fee", "order a large pizza"
      }
      if (out.size() > tokens_before && out.back().kind == Token::object && !is_ascii_word(units[i - best_len]) &&
          opens_clause(out, tokens_before) && names_its_verb(lex_.names[out.back().name])) {
        out.back().verb_first = true;  // 退年费, 预约明天下午: a command when a thing follows (make_clause)
      }
      if (out.size() > tokens_before && out.back().kind == Token::object && !is_ascii_word(units[i - best_len]) &&
          names_its_verb(lex_.names[out.back().name])) {
        out.back().chinese_verb = true;  // 衬衫退掉: a verb after its thing (return_of_what_is_named_first)
      }
      if (out.size() > tokens_before && out.back().kind == Token::question && i - best_len > 0 &&
          units[i - best_len - 1] == "是" && lex_.names[out.back().name] == "AMOUNT") {
        out.back().what_it_is = true;  // 卡号是多少: what the number is, not how much is on the card
      }
      if (out.size() > tokens_before && out.back().kind == Token::question && best_len == 1 &&
          (units[i - 1] == "when" || units[i - 1] == "wen") && i < units.size() &&
          starts_a_clause_after_when(units, i)) {
        out.back().subordinate = true;  // when_as_conjunction decides
      }
      if (out.size() > tokens_before && out.back().kind == Token::negation) {
        out.back().contrast = says_which_is_meant(units, i - best_len, best_len);
        out.back().does_not = says_it_does_not(units, i - best_len, best_len);
        out.back().instead = names_the_other_option(units, i - best_len, best_len);
        out.back().forbids = says_do_not(units, i - best_len, best_len);
        out.back().refuses = is_one_of(units, i - best_len, best_len, {"don t want", "dont want", "do not want"});
        out.back().denies = is_one_of(units, i - best_len, best_len, {"不 是", "并 不 是"});
        // "never call me again" forbids, as "don't call me" does; "I never got my refund" reports.
        if (best_len == 1 && units[i - 1] == "never" && opens_clause(out, tokens_before)) out.back().past = false;
      }
      if ((nominal || english_noun) && out.size() > tokens_before && out.back().kind == Token::action) {
        out.back().nominal = true;
      }
      if (out.size() > tokens_before) last_token_end_ = i;
    }
    flush_unit_as_detail();
  }

 private:
  // The action, object or detail an English word not in the lexicon is one
  // slip away from ("resnd", "chaneg", "bookng", "rooom"), or -1: one letter
  // dropped, added, changed or two swapped, when every word that close means
  // the same thing. A word of the English word list is never mended, nor a
  // word under five letters, where one slip turns one word into another; the tries per word are bounded (about
  // 54 per letter, up to 24 letters), so the keyer stays linear.
  std::int32_t corrected_spelling(std::string_view unit) const {
    constexpr std::size_t kMinLetters = 5, kMaxLetters = 24;
    if (unit.size() < kMinLetters || unit.size() > kMaxLetters) return -1;
    if (!std::all_of(unit.begin(), unit.end(), [](char c) { return c >= 'a' && c <= 'z'; })) return -1;
    if (is_english_word(unit)) return -1;  // "older" is a word, not a slip of "order"
    std::int32_t found = -1;
    bool ambiguous = false;
    std::string probe;
    const auto consider = [&](const std::string& word) {
      if (word.size() < kMinLetters - 1 || ambiguous) return;
      const auto it = lex_.surfaces.find(word);
      if (it == lex_.surfaces.end() || it->second < 0) return;
      const Entry& e = lex_.entries[static_cast<std::size_t>(it->second)];
      if (e.category != Category::action && e.category != Category::object && e.category != Category::detail) return;
      if (found >= 0 && lex_.entries[static_cast<std::size_t>(found)].name != e.name) ambiguous = true;
      found = it->second;
    };
    const std::string word(unit);
    for (std::size_t k = 0; k < word.size(); ++k) {  // a letter too many
      probe = word;
      probe.erase(k, 1);
      consider(probe);
    }
    for (std::size_t k = 0; k + 1 < word.size(); ++k) {  // two letters swapped
      probe = word;
      std::swap(probe[k], probe[k + 1]);
      if (probe != word) consider(probe);
    }
    for (std::size_t k = 0; k <= word.size(); ++k) {  // a letter missing, a letter wrong
      for (char c = 'a'; c <= 'z'; ++c) {
        probe = word;
        probe.insert(k, 1, c);
        consider(probe);
        if (k < word.size() && word[k] != c) {
          probe = word;
          probe[k] = c;
          consider(probe);
        }
      }
    }
    return ambiguous ? -1 : found;
  }

  // Whether units[i], a word of at most four letters the lexicon does not
  // know, is the letters of the id right after it ("tkt 88120", "MU 5137"):
  // the next unit has a digit and no pattern's match starts there.
  bool names_next_number(const std::vector<std::string_view>& units, std::size_t i, std::size_t next_match) const {
    const std::string_view unit = units[i];
    if (unit.size() > 4 || !std::all_of(unit.begin(), unit.end(), [](char c) { return c >= 'a' && c <= 'z'; })) {
      return false;
    }
    return i + 1 < units.size() && has_ascii_digit(units[i + 1]) && offset_of(norm_, units[i + 1]) < next_match;
  }

  // Whether units[i], a word the lexicon does not know, stands where only a
  // name does: after "dr" or "doctor" ("Dr Patel", the doctor's name), or
  // between a house number and the word for a street ("14 Elm Street", "9
  // Pine Rd"). Elsewhere an unknown word may change what is asked: the key
  // abstains.
  static bool in_name_slot(const std::vector<std::string_view>& units, std::size_t i) {
    const std::string_view unit = units[i];
    if (!std::all_of(unit.begin(), unit.end(), [](char c) { return c >= 'a' && c <= 'z'; })) return false;
    if (i > 0 && (units[i - 1] == "dr" || units[i - 1] == "doctor")) return true;
    return i > 0 && i + 1 < units.size() && has_ascii_digit(units[i - 1]) &&
           name_in(units[i + 1], {"street", "st", "road", "rd", "avenue", "ave", "lane", "ln", "drive", "way"});
  }

  // A unit with a digit: "7pm" is the number 7 and the unit pm, as "7 pm" is;
  // anything else ("789a", "5g", "4th") is one entity.
  void add_number(std::string_view unit) {
    if (unit.size() > 2) {
      const std::string_view digits = unit.substr(0, unit.size() - 2), suffix = unit.substr(unit.size() - 2);
      const auto it = lex_.surfaces.find(std::string(suffix));
      if ((suffix == "am" || suffix == "pm") && std::all_of(digits.begin(), digits.end(), is_ascii_digit) &&
          it != lex_.surfaces.end() && it->second >= 0) {
        add_entity(std::string(digits));
        add_entry(lex_.entries[static_cast<std::size_t>(it->second)]);
        return;
      }
    }
    add_entity(std::string(unit));
  }

  // Numbers side by side are one entity, written without what separated them
  // ("0161 496 0732", "0161-496-0732" and "01614960732" are one phone
  // number; "SW1A 1AA" is "sw1a1aa"); with number words among them, their
  // value (二十三 and "twenty three" are 23, 十万 and 10万 100000), or, where
  // they make no one number, the parts with a '-' between them. A unit just
  // before a number waits for it.
  void add_entity(std::string text, const Numeral* word = nullptr) {
    if (!id_prefix_.empty()) {
      text.insert(0, id_prefix_);
      id_prefix_ = {};
      last_entity_ = false;
    }
    if (last_entity_ && !out_->empty() && out_->back().kind == Token::entity && !pending_unit_) {
      if (word != nullptr || spelled_) {
        spelled_ = true;
        if (plain_number_ && (word != nullptr || add_digits(text))) {
          if (word != nullptr) parts_.push_back(*word);
          std::uint64_t value = 0;
          if (numeral_sum(parts_, value)) {
            out_->back().text = std::to_string(value);
            return;
          }
        }
        plain_number_ = false;
        out_->back().text += '-';
        out_->back().text += word != nullptr ? std::to_string(word->amount) : text;
        return;
      }
      out_->back().text += text;
      plain_number_ = plain_number_ && add_digits(text);
      return;
    }
    parts_.clear();
    spelled_ = word != nullptr;
    if (word != nullptr) {
      parts_.push_back(*word);
      text = std::to_string(word->amount);
      plain_number_ = !pending_unit_;
    } else {
      plain_number_ = !pending_unit_ && add_digits(text);
    }
    if (pending_unit_) {
      text += unit_suffix(pending_unit_name_);
      pending_unit_ = false;
    }
    out_->push_back({Token::entity, 0, std::move(text), false});
    last_entity_ = true;
  }

  // Records digits as a part of the number being read (its digits one by
  // one: "10" then 万 is 10 x 10000); false for what is not all digits.
  bool add_digits(std::string_view text) {
    if (text.empty() || text.size() > 12 || !std::all_of(text.begin(), text.end(), is_ascii_digit)) return false;
    for (char c : text) parts_.push_back({Numeral::value, static_cast<std::uint64_t>(c - '0')});
    return true;
  }

  // "6:45pm", "6.45 p.m." and "18:45" are one time: a time of day before am
  // or pm becomes the 24-hour clock's four digits (1845; 12am is 0000). False,
  // and `text` untouched, for any other unit or for what is no time of day.
  static bool twenty_four_hour(std::string& text, std::string_view unit) {
    if ((unit != "AM" && unit != "PM") || text.empty() || text.size() > 4 ||
        !std::all_of(text.begin(), text.end(), is_ascii_digit)) {
      return false;
    }
    const int value = std::stoi(text);
    const int hour = text.size() <= 2 ? value : value / 100, minute = text.size() <= 2 ? 0 : value % 100;
    if (hour < 1 || hour > 12 || minute > 59) return false;
    text = fmt::format("{:02}{:02}", hour % 12 + (unit == "PM" ? 12 : 0), minute);
    return true;
  }

  // 号 after a number past 31 ("6630号订单") is "number", not a day of the month.
  static bool names_no_day(const std::string& text, std::string_view unit) {
    return unit == "DAY_OF_MONTH" && text.size() <= 12 && !text.empty() &&
           std::all_of(text.begin(), text.end(), is_ascii_digit) && std::stoull(text) > 31;
  }

  // (Not MONTH: 1月 is January.)
  static bool is_span_of_time(std::string_view unit) {
    return unit == "MINUTE" || unit == "HOUR" || unit == "DAY" || unit == "NIGHT" || unit == "WEEK" || unit == "YEAR";
  }

  std::string unit_suffix(std::uint32_t name) const {
    std::string s = lex_.names[name];
    std::transform(s.begin(), s.end(), s.begin(), [](char c) { return c >= 'A' && c <= 'Z' ? char(c + 32) : c; });
    return s;
  }

  // A unit with no number after it says which unit is meant ("in dollars"): a detail.
  // A clock's unit with no number says nothing (安静点: "a bit quieter").
  void flush_unit_as_detail() {
    if (!pending_unit_) return;
    if (lex_.names[pending_unit_name_] == "OCLOCK") {
      pending_unit_ = false;
      return;
    }
    out_->push_back({Token::detail, pending_unit_name_, {}, false});
    pending_unit_ = false;
  }

  void add_entry(const Entry& e) {
    if (e.category == Category::unit) {
      if (last_entity_ && !out_->empty() && out_->back().kind == Token::entity) {
        std::string& text = out_->back().text;
        if (text == "1" && is_span_of_time(lex_.names[e.name])) {
          // "1 night" is "one night", "a night" (一晚 as 一件): the span, unless counts are compared.
          out_->back().article = true;
          out_->push_back({Token::detail, e.name, {}, false});
          last_entity_ = false;
          return;
        }
        if (!twenty_four_hour(text, lex_.names[e.name]) && !names_no_day(text, lex_.names[e.name])) {
          text += unit_suffix(e.name);  // "20 dollars": 20usd
        }
        last_entity_ = false;
        return;
      }
      flush_unit_as_detail();
      pending_unit_ = true;  // "$20": waits for its number
      pending_unit_name_ = e.name;
      return;
    }
    flush_unit_as_detail();
    if (e.category == Category::stopword && lex_.names[e.name] == "MEASURE" && last_entity_ && !out_->empty() &&
        out_->back().kind == Token::entity) {
      out_->back().counted = true;
      out_->back().article = out_->back().text == "1";  // 一件, 一张: "a", as "one" is in English; 两件 is still 2
    }
    last_entity_ = false;
    switch (e.category) {
      case Category::action:
        out_->push_back({Token::action, e.name, {}, false});
        break;
      case Category::object:
        out_->push_back({Token::object, e.name, {}, false});
        out_->back().someones = owner_word_at_ == out_->size() - 1;
        out_->back().after_preposition = preposition_at_ == out_->size() - 1;
        break;
      case Category::detail:
        if (lex_.names[e.name] == "ABOVE" && prefers_in_clause()) {
          out_->push_back({Token::negation, 0, {}, false});  // "I'd prefer a callback over an email"
          break;
        }
        // "退房后再退押金": what comes after AFTER or BEFORE is another clause,
        // so the two sides keep their places ("退押金后再退房" differs).
        if (lex_.names[e.name] == "AFTER" || lex_.names[e.name] == "BEFORE") {
          end_clause();
        }
        out_->push_back({Token::detail, e.name, {}, false});
        break;
      case Category::negation: {
        const std::string& name = lex_.names[e.name];
        for_now_before_negation();
        const bool after = name == "NOT_AFTER" || name == "NOT_AFTER_ABLE";
        out_->push_back({after ? Token::negation_after : Token::negation, 0, {}, false});
        out_->back().past = name == "NOT_PAST";
        out_->back().unable = name == "NOT_ABLE" || name == "NOT_AFTER_ABLE";
        last_negation_at_ = out_->size() - 1;
        break;
      }
      case Category::question:
        out_->push_back({Token::question, e.name, {}, false});
        break;
      case Category::aux:
        out_->push_back({Token::aux, e.name, {}, false});
        break;
      case Category::polite:
        if (lex_.names[e.name] == "POLITE_FOR" || lex_.names[e.name] == "POLITE_FOR_ME") {
          out_->push_back({Token::benefactive, e.name, {}, false});
        } else if (lex_.names[e.name] == "POLITE_UNLESS_ASKED_WHY" && out_->size() > clause_start_ &&
                   out_->back().kind == Token::question && lex_.names[out_->back().name] == "REASON") {
          // "can't you cancel it?" asks politely; "why can't you cancel it?" asks why it cannot be done.
          out_->push_back({Token::negation, 0, {}, false});
          out_->back().unable = true;
        } else {
          out_->push_back({Token::polite, 0, {}, false});
          out_->back().can_you = lex_.names[e.name] == "POLITE_CAN_YOU";
        }
        break;
      case Category::greeting:
        out_->push_back({Token::greeting, e.name, {}, false});
        break;
      case Category::role:
        out_->push_back({Token::role, e.name, {}, false});
        break;
      case Category::stopword:
        if (lex_.names[e.name] == "SUBJECT") out_->push_back({Token::subject, 0, {}, false});
        if (lex_.names[e.name] == "SPEAKER") {
          out_->push_back({Token::subject, 0, {}, false});
          out_->back().names_speaker = true;
        }
        if (lex_.names[e.name] == "AND") out_->push_back({Token::coordinator, 0, {}, false});
        if (lex_.names[e.name] == "OF" && !out_->empty() &&
            (out_->back().kind == Token::object || out_->back().kind == Token::entity)) {
          out_->back().modifies = true;  // 账户上的姓名: the account's name
        }
        if (lex_.names[e.name] == "TURN_OF_CLAUSE" || lex_.names[e.name] == "CONDITION") {
          out_->push_back({Token::turn, 0, {}, false});
          out_->back().condition = lex_.names[e.name] == "CONDITION";
        }
        if (lex_.names[e.name] == "ME") out_->push_back({Token::speaker, 0, {}, false});
        if (lex_.names[e.name] == "DISPOSAL") out_->push_back({Token::disposal, 0, {}, false});
        if (lex_.names[e.name] == "WANT" || lex_.names[e.name] == "NEED" || lex_.names[e.name] == "PREFER" ||
            lex_.names[e.name] == "WANT_DONE") {
          out_->push_back({Token::want, 0, {}, false});
          out_->back().passive = lex_.names[e.name] == "WANT_DONE";
          out_->back().needs = lex_.names[e.name] == "NEED";
          out_->back().prefers = lex_.names[e.name] == "PREFER";
          if (out_->back().prefers) prefers_at_ = out_->size() - 1;
        }
        // "I'd rather have a replacement than my money back": after a
        // preference, than (and over) says what is not wanted, as "rather than"
        // and "instead of" do; the reverse is another request.
        if (lex_.names[e.name] == "THAN" && prefers_in_clause()) {
          out_->push_back({Token::negation, 0, {}, false});
          than_at_ = out_->size();
        }
        // "I'd rather pay at check-in than now": now, compared, is a time (URGENT, as "immediately" is).
        if (lex_.names[e.name] == "NOW" && than_at_ == out_->size()) {
          const auto urgent = lex_.by_name.find("URGENT");
          if (urgent != lex_.by_name.end()) out_->push_back({Token::detail, urgent->second, {}, false});
        }
        // "no refund yet", "not refunded yet": not done yet, as 还没 says; no prohibition ("don't refund").
        if (lex_.names[e.name] == "YET") {
          if (last_negation_at_ != SIZE_MAX && last_negation_at_ >= clause_start_) {
            Token& negation = (*out_)[last_negation_at_];
            negation.past = negation.past || !negation.forbids;  // "don't ship it yet" still forbids
          }
        }
        // "I don't need it anymore so cancel my order", "cancel my order because I don't need it": the
        // reason is a clause of its own, as after a comma, so its negation stays there. "so" after a
        // clause with nothing done, wanted or denied is a degree ("my bill is so high").
        if (lex_.names[e.name] == "BECAUSE" && out_->size() > clause_start_) break_clause();
        if (lex_.names[e.name] == "SO_THEN" &&
            std::any_of(out_->begin() + static_cast<std::ptrdiff_t>(clause_start_), out_->end(), [](const Token& t) {
              return t.kind == Token::action || t.kind == Token::negation || t.kind == Token::want;
            })) {
          break_clause();
        }
        if (lex_.names[e.name] == "SEQUENCE") out_->push_back({Token::sequence, 0, {}, false});
        if (lex_.names[e.name] == "FIRST_OR_FOR_NOW") out_->push_back({Token::sequence, e.name, {}, false});
        if (lex_.names[e.name] == "THEN_OR_AGAIN") then_or_again();
        if (lex_.names[e.name] == "PERFECTIVE") out_->push_back({Token::perfective, 0, {}, false});
        if ((lex_.names[e.name] == "COMMAND" || lex_.names[e.name] == "TAKE" || lex_.names[e.name] == "TURN" ||
             lex_.names[e.name] == "PUSH") &&
            opens_clause(*out_, out_->size())) {
          out_->push_back({Token::want, e.name, {}, false});  // "put my son on the policy" asks for it
        }
        if (lex_.names[e.name] == "OFF" || lex_.names[e.name] == "BACK") {
          // Unknown until separated_off finds its verb: an "off" it cannot read keeps the key abstaining
          // ("leave the tip off my bill" is not "leave the tip on my bill"); a "back" it cannot read goes.
          out_->push_back({Token::unknown, 0, lex_.names[e.name] == "OFF" ? "off" : "back", false});
          out_->back().particle = true;
        }
        if (lex_.names[e.name] == "SAY" && !out_->empty() && out_->back().kind == Token::negation) {
          // "I never said I didn't want the warranty", "I didn't ask for this": what was said is denied,
          // and what follows is no request; the key abstains (KeyRules::build).
          out_->push_back({Token::unknown, 0, "said", false});
          out_->back().denies_saying = true;
        }
        if (lex_.names[e.name] == "FINE") {
          out_->push_back({Token::negation_after, 0, {}, false});
          out_->back().fine = true;
        }
        if (lex_.names[e.name] == "DONE") done_mark_ = true;  // 已经, 被: the next verb was done
        if (lex_.names[e.name] == "RIGHT_SIDE") {
          // "the right earbud" is not "the left earbud"; "that's right" says nothing.
          out_->push_back({Token::detail, e.name, {}, false});
          out_->back().before_thing_only = true;
        }
        if (lex_.names[e.name] == "FOR" || lex_.names[e.name] == "WANT_FOR_ME") {
          out_->push_back({Token::benefactive, e.name, {}, false});
        }
        if (lex_.names[e.name] == "OWNER") owner_word_at_ = out_->size();
        // "on my card", "for my trip": only an article or my, our, your between a preposition and its thing.
        if (lex_.names[e.name] == "ON") {
          // A particle until separated_off reads it ("turn the heating on"), or a preposition ("on my card").
          out_->push_back({Token::unknown, 0, "on", false});
          out_->back().particle = true;
        }
        if (lex_.names[e.name] == "PREPOSITION") {
          preposition_at_ = out_->size();
        } else if (lex_.names[e.name] != "OWNER" && lex_.names[e.name] != "ARTICLE") {
          preposition_at_ = SIZE_MAX;
        }
        // "my neighbor's": 's after someone's own; before a thing it owns it
        // (make_clause). Without my, it names a kind: "a children's menu" is
        // "a kids menu", "the doctor's visit" "the doctor visit".
        if (lex_.names[e.name] == "POSSESSIVE" && !out_->empty() && out_->back().kind == Token::object &&
            out_->back().someones) {
          out_->back().owner = true;
        }
        if (lex_.names[e.name] == "BOTH") {
          out_->push_back({Token::entity, 0, "2", false});  // "cancel both orders" is "cancel two orders"
          out_->back().both = true;
        }
        if (lex_.names[e.name] == "ONE") {
          out_->push_back({Token::entity, 0, "1", false});  // "a", unless counts are compared (drop_articles)
          out_->back().article = true;
        }
        break;
      case Category::unit:
        break;
    }
  }

  // 先 right before a negation is "for now", as 暂时 is (先别发货 = 暂时别发货); elsewhere "first".
  void for_now_before_negation() {
    if (out_->size() <= clause_start_ || out_->back().kind != Token::sequence ||
        lex_.names[out_->back().name] != "FIRST_OR_FOR_NOW") {
      return;
    }
    const auto for_now = lex_.by_name.find("TEMPORARY");
    if (for_now != lex_.by_name.end()) out_->back() = Token{Token::detail, for_now->second, {}, false};
  }
  // 再: "then" after 先 or an action (先退款，再退货; 取消订单再退款; not one done:
  // 把已关闭的工单再打开), opening a clause
  // after another (押金退了，再把房费结清), right after a
  // time (下午再送, 12点以后再送) or the one who waits (我再等等), "any more" after a
  // negation in its clause (别再发了): each as a word of sequence. Else "again",
  // before its verb (把工单再打开, as 重新打开).
  void then_or_again() {
    // Tokens are only appended and clauses only start later: each token is looked at once, however
    // many 再 there are (a scan from the start for each made "订单再" repeated quadratic).
    for (; then_scanned_ < out_->size(); ++then_scanned_) {
      const Token& t = (*out_)[then_scanned_];
      sequence_seen_ = sequence_seen_ || t.kind == Token::sequence || (t.kind == Token::action && !t.reported);
    }
    if (negation_scan_clause_ != clause_start_) {
      negation_scan_clause_ = negation_scan_at_ = clause_start_;
      negation_in_clause_ = false;
    }
    for (; negation_scan_at_ < out_->size(); ++negation_scan_at_) {
      const Token& t = (*out_)[negation_scan_at_];
      negation_in_clause_ = negation_in_clause_ || t.kind == Token::negation || t.kind == Token::negation_after;
    }
    const bool then =
        sequence_seen_ || negation_in_clause_ ||
        (clause_start_ > 0 && out_->size() == clause_start_) ||  // ...，再把房费结清
        (out_->size() > clause_start_ && (out_->back().kind == Token::detail || out_->back().kind == Token::entity ||
                                          out_->back().kind == Token::subject));
    if (then) {
      out_->push_back({Token::sequence, 0, {}, false});
      return;
    }
    const auto again = lex_.by_name.find("AGAIN");
    if (again != lex_.by_name.end()) out_->push_back({Token::detail, again->second, {}, false});
  }
  // Whether a preference (rather, prefer) came earlier in the clause being read.
  bool prefers_in_clause() const { return prefers_at_ != SIZE_MAX && clause_start_ <= prefers_at_; }
  void end_clause() {
    out_->push_back({Token::clause_end, 0, {}, false});
    out_->back().soft = true;
    clause_start_ = out_->size();
  }
  // A break as the text's own comma: the clause before asks only what it asks itself.
  void break_clause() {
    out_->push_back({Token::clause_end, 0, {}, false});
    clause_start_ = out_->size();
  }

  const Lexicon& lex_;
  std::string_view norm_;
  std::vector<Token>* out_ = nullptr;
  bool last_entity_ = false;
  bool done_mark_ = false;              // 已经 or 被 read, its verb not yet
  bool all_mark_ = false;               // 都 read: all of them, if a verb comes next
  bool done_waits_for_action_ = false;  // 已经把: only a verb takes the mark, not what 把 takes
  std::size_t clause_start_ = 0;        // the first token of the clause being read
  // then_or_again's view of the tokens before it, kept as they come: up to then_scanned_, whether a
  // sequence word or an action not done came; in the clause at negation_scan_clause_, up to
  // negation_scan_at_, whether a negation came.
  std::size_t then_scanned_ = 0, negation_scan_clause_ = 0, negation_scan_at_ = 0;
  bool sequence_seen_ = false, negation_in_clause_ = false;
  std::size_t last_negation_at_ = SIZE_MAX;  // the last negation read (its clause: clause_start_)
  std::size_t last_token_end_ = SIZE_MAX;    // the unit after the last one that gave a token
  std::size_t prefers_at_ = SIZE_MAX;        // the last preference read
  std::size_t owner_word_at_ = SIZE_MAX;     // where the last my, our, your was: the next token is theirs
  std::size_t preposition_at_ = SIZE_MAX;    // where the last in, at, of, for was: the next thing is its
  std::size_t than_at_ = SIZE_MAX;           // right after a preference's "than" ("than now")
  // The entity being read, while numbers come: its parts, whether a number
  // word is among them, and whether it is all numbers (no id letters, no unit).
  std::vector<Numeral> parts_;
  bool spelled_ = false;
  bool plain_number_ = false;
  bool pending_unit_ = false;
  std::uint32_t pending_unit_name_ = 0;
  std::string_view id_prefix_;  // letters waiting for the number they name
};

// Undoing an action is the action that reverses it: "undo the cancellation",
// "cancel the cancellation", 解除冻结 and "lift the freeze" are "reinstate",
// "unfreeze" (RESUME, UNFREEZE), as their own words are; and beside the
// reversing action, the action reversed says nothing more: "reinstate my
// cancelled booking" is "reinstate my booking", 恢复被停机的号码 is 号码复机.
// The undoing is still never the action itself nor its negation: "undo the
// cancellation" is not "cancel", nor "don't cancel".
const char* reverse_of(std::string_view action) {
  static constexpr std::pair<std::string_view, const char*> kReverse[] = {
      {"CANCEL", "RESUME"}, {"PAUSE", "RESUME"},  {"DELETE", "RESUME"}, {"FREEZE", "UNFREEZE"},
      {"LOCK", "UNLOCK"},   {"BLOCK", "UNBLOCK"}, {"CLOSE", "REOPEN"},  {"DISABLE", "ENABLE"},
  };
  for (const auto& [done, reverse] : kReverse) {
    if (action == done) return reverse;
  }
  return nullptr;
}

// Whether 帮我 or 把 comes next, after details only (能马上帮我..., 能远程帮我...,
// 能把发票发我吗: someone is asked to act on it, as 你能 asks; not "can I
// please ...", which asks whether one may, nor 订单能取消吗, whether it can be).
bool for_me_after_details(const Lexicon& lex, const Token* t, const Token* end) {
  while (t != end && t->kind == Token::detail) ++t;
  return t != end && (t->kind == Token::disposal || ((t->kind == Token::polite || t->kind == Token::benefactive) &&
                                                     lex.names[t->name] == "POLITE_FOR_ME"));
}

void undo_to_reverse(std::vector<Element>& actions) {
  const auto undoes = [](std::string_view a) {
    return a == "UNDO" || a == "CANCEL" || a == "LIFT" || a == "WITHDRAW" || a == "DELETE";
  };
  std::vector<Element> out;
  out.reserve(actions.size());
  // The reverse of `undone`, when `undoer` undoes it or is that reverse ("release the hold" is "release
  // the order": RESUME): an action named as a thing ("the cancellation"), never one joined to it
  // ("cancel and delete").
  const auto reverse_when_undone = [&undoes](const Element& undoer, const Element& undone) -> const char* {
    if (undoer.negated || undone.negated || undone.past || !undone.nominal) return nullptr;
    const char* reverse = reverse_of(undone.text);
    return reverse != nullptr && (undoes(undoer.text) || undoer.text == reverse) ? reverse : nullptr;
  };
  for (std::size_t i = 0; i < actions.size(); ++i) {
    Element& a = actions[i];
    if (i + 1 < actions.size()) {
      Element& b = actions[i + 1];
      // "undo the cancellation"; 预约的取消撤销掉 (what is undone first)
      const char* reverse = reverse_when_undone(a, b);
      Element* undoer = &a;
      if (reverse == nullptr) {
        reverse = reverse_when_undone(b, a);
        undoer = &b;
      }
      if (reverse != nullptr) {
        undoer->text = reverse;
        out.push_back(std::move(*undoer));
        ++i;  // the undone action is in its reverse
        continue;
      }
    }
    out.push_back(std::move(a));
  }
  // The actions asked for, looked up once per action reported (linear however many there are).
  std::unordered_set<std::string_view> asked;
  for (const Element& b : out) {
    if (!b.past && !b.negated) asked.insert(b.text);
  }
  const auto reversed_beside = [&asked](const Element& a) {
    const char* reverse = a.past && !a.negated ? reverse_of(a.text) : nullptr;
    return reverse != nullptr && asked.count(reverse) > 0;
  };
  std::vector<bool> drop(out.size());
  for (std::size_t i = 0; i < out.size(); ++i) drop[i] = reversed_beside(out[i]);
  actions.clear();
  for (std::size_t i = 0; i < out.size(); ++i) {
    if (!drop[i]) actions.push_back(std::move(out[i]));
  }
}

// The clause between two breaks, from its tokens.
// Whether the detail at `t` stands between a negation and the thing it
// negates, with only details beside it: "not my new SIM", 不要红色的那件.
bool describes_negated_thing(const Token* t, const Token* begin, const Token* end) {
  const Token* after = t + 1;
  while (after != end && after->kind == Token::detail) ++after;
  const Token* before = t;
  while (before != begin && before[-1].kind == Token::detail) --before;
  return after != end && (after->kind == Token::object || after->kind == Token::entity) && before != begin &&
         before[-1].kind == Token::negation;
}

// "(I don't want) my subscription to renew": a thing, then to and a verb, is
// what the verb acts on; a negation before the thing is the verb's ("don't
// renew my subscription"). Looks a few tokens ahead only (linear on any text).
bool wanted_thing_then_its_verb(const Lexicon& lex, const Token* t, const Token* end) {
  constexpr int kLookAhead = 6;
  if (t == end || (t->kind != Token::object && t->kind != Token::entity)) return false;
  for (int seen = 0; t != end && seen < kLookAhead; ++t, ++seen) {
    if (t->kind == Token::role) {
      return lex.names[t->name] == "TO" && t + 1 != end && t[1].kind == Token::action;
    }
    if (t->kind != Token::object && t->kind != Token::entity && t->kind != Token::detail) return false;
  }
  return false;
}

Clause make_clause(const Lexicon& lex, std::uint32_t query, const Token* begin, const Token* end, bool question_mark,
                   bool polite_earlier) {
  Clause c;
  const bool two_actions_and_someone =
      std::count_if(begin, end, [](const Token& t) { return t.kind == Token::action; }) >= 2 &&
      std::any_of(begin, end, [&lex](const Token& t) { return is_person(lex, t); });
  bool pending_not = false;
  bool pending_past = false;          // the negation was of what happened: "didn't", 没
  bool pending_unable = false;        // the negation says what cannot be done: can't, 无法
  bool not_wanted = false;            // the negation is of a want: "I don't need the hotel anymore"
  bool not_waits_for_action = false;  // the pending negation is the next action's (别把卡注销)
  bool rest_not_meant = false;  // after "instead of", 而不是: every thing up to a role or action is the other option
  bool want_then_things = false;  // a want, then only things and details since ("I want my order cancelled")
  std::string role;               // the role of the very next token ("FROM.")
  bool polite = false, question_word = false;
  bool asks_how = false;  // a question word for how or when
  bool first = true;      // no token of the clause seen yet but greetings and polite forms
  std::string aux, aux_after_subject;
  bool after_subject = false;  // the token before this one was the clause's first, a subject
  std::pair<std::size_t, std::size_t> things_before_action{0, 0};  // objects, entities
  bool speaker_after_action = false;
  bool wants = false;                  // want, need, 要: a request for what the clause names, as please is
  bool needs = false;                  // need, 需要: asked, whether one must (要交押金吗 is not 交押金了吗)
  bool fine_after_thing = false;       // a word for fine after a thing ("the modem is fine")
  bool perfective = false;             // 了 or 过 read: with a subject and no request, a report (我取消订单了)
  bool contrasts_unnamed = false;      // the pending negation came after what the action acts on
  const Token* last_acted_on = begin;  // the last action, object or entity of the clause (or its start)
  const Token* last_action = nullptr;  // the clause's last action, if any
  for (const Token* t = begin; t != end; ++t) {
    if (t->kind == Token::action || t->kind == Token::object || t->kind == Token::entity) last_acted_on = t;
    if (t->kind == Token::action) last_action = t;
  }
  for (const Token* t = begin; t != end; ++t) {
    const std::size_t before[3] = {c.objects.size(), c.entities.size(), c.details.size()};
    std::string this_role;
    this_role.swap(role);  // a role governs the next token only ("want to cancel": no role for CANCEL)
    switch (t->kind) {
      case Token::action: {
        rest_not_meant = false;
        if (this_role == "FROM." || (this_role == "TO." && t->gerund)) {
          // "from checking": after from, a verb's form names a thing (which way
          // the money goes is not lost with it), and so does one in -ing after
          // to ("to checking"). Otherwise, after to it is a verb ("want to cancel").
          // "checking" there is the checking account, as "my checking account" is.
          const bool checking = t->name == query && t->gerund;
          c.objects.push_back({this_role + (checking ? "CURRENT_ACCOUNT" : lex.names[t->name]), pending_not});
          pending_not = false;
          break;
        }
        if (c.actions.empty()) things_before_action = {c.objects.size(), c.entities.size()};
        // "I want my subscription cancelled", "the hotel needs to be cancelled": a thing wanted in a past
        // form is what is asked for, not what was done.
        // (Not one before a thing: "a refund for my cancelled flight".)
        const bool after_thing = t != begin && (t[-1].kind == Token::object || t[-1].kind == Token::entity);
        const bool after_passive = t - begin >= 2 && t[-1].kind == Token::want && t[-1].passive &&
                                   (t[-2].kind == Token::object || t[-2].kind == Token::entity);
        const bool asked_done = t->past && ((want_then_things && after_thing) || after_passive) &&
                                (t + 1 == end || (t[1].kind != Token::object && t[1].kind != Token::entity));
        c.actions.push_back(
            {lex.names[t->name], pending_not,
             (t->past && !asked_done) || (pending_not && pending_past) || done_before_its_thing(begin, t, end)});
        c.actions.back().nominal = t->nominal;
        c.actions.back().unable = pending_not && pending_unable;
        pending_not = false;
        break;
      }
      case Token::object:
      case Token::entity: {
        // "my payment was refunded", "my order got returned": a thing that is its verb, in its past
        // form after the thing it was done to, reports it too, unless it is asked for ("I want my payment refunded",
        // "my payment needs to be refunded").
        const bool after_what_it_was_done_to =
            t->past && t != begin && names_its_verb(lex.names[t->name]) &&
            ((t[-1].kind == Token::aux && lex.names[t[-1].name] == "ASK") || t[-1].kind == Token::object ||
             t[-1].kind == Token::entity) &&
            !(want_then_things || (t[-1].kind == Token::want && t[-1].passive)) &&
            (t + 1 == end || (t[1].kind != Token::object && t[1].kind != Token::entity));
        if (t->kind == Token::object && this_role.empty() &&
            (t->reported || (t->chinese_verb && done_before_its_thing(begin, t, end)) ||
             (t->past && t != begin && t[-1].kind == Token::subject) ||
             (t->past && t - begin >= 2 && t[-1].kind == Token::aux && t[-2].kind == Token::subject) ||
             after_what_it_was_done_to ||
             (pending_not && pending_past && !not_waits_for_action && names_its_verb(lex.names[t->name])))) {
          // (押金还没退, "you didn't refund my deposit": not done, which 别退押金 forbids.)
          // 我退了押金: 了 between it and its thing, after who did it, as 我取消了订单.
          // 你们已经给我退款了: a thing that is its verb, after 已经, reports it (REFUND_DONE); so does
          // its past form after who did it ("I returned item 2" is not "return item 2"; "the named
          // driver", "what's covered" are no report).
          if (c.actions.empty()) things_before_action = {c.objects.size(), c.entities.size()};
          c.actions.push_back({lex.names[t->name], pending_not, true});
          c.actions.back().unable = pending_not && pending_unable;
          pending_not = false;
          break;
        }
        // "refund the annual fee" asks for the refund; "did you refund the annual fee?" asks about it.
        if (t->commands && this_role.empty() && c.actions.empty()) wants = true;
        if (t->verb_first && this_role.empty() && c.actions.empty() && t + 1 != end &&
            (t[1].kind == Token::object || t[1].kind == Token::entity || t[1].kind == Token::detail)) {
          wants = true;  // 退年费 asks for the refund; 退年费了吗 asks about it
        }
        auto& list = t->kind == Token::object ? c.objects : c.entities;
        // "my neighbor's parcel" is not "my parcel" for my neighbor: the owner
        // is OF. ("'s" before a state, "the item's broken", is "is").
        // A thing's is its part: "my room's AC" is "the AC in my room".
        const bool owns = t->owner && t + 1 != end && (t[1].kind == Token::object || t[1].kind == Token::entity) &&
                          is_person(lex, *t);
        // 改机票上的日期而不是票上的姓名: the name is on the ticket not meant, as the ticket is.
        const bool negated = (pending_not && !not_waits_for_action) || rest_not_meant;
        list.push_back({this_role + (t->step_first ? "FIRST." : "") + (t->actor ? "BY." : "") + (owns ? "OF." : "") +
                            t->described + (t->kind == Token::entity ? t->text : lex.names[t->name]),
                        negated});
        list.back().given_up = negated && (pending_unable || not_wanted) && !rest_not_meant;
        list.back().commands = t->commands;
        list.back().context = t->kind == Token::object && lex.names[t->name] == "ACCOUNT" && list.size() > 1 &&
                              this_role.empty() && !pending_not &&
                              (t[-1].kind == Token::object || t[-1].kind == Token::detail);
        if (negated) pending_not = false;
        break;
      }
      case Token::detail:
        // "rather than a window one", "Thursday, not Wednesday": with no thing
        // or action after it in the clause, a negation's detail is what is not meant.
        c.details.push_back({this_role + (t->step_first ? "FIRST." : "") + lex.names[t->name],
                             (pending_not && !not_waits_for_action && t > last_acted_on) || rest_not_meant});
        if (c.details.back().negated) {
          pending_not = false;
        } else if (pending_not && !not_waits_for_action && describes_negated_thing(t, begin, end)) {
          // "activate my SIM, not my new SIM": new is the SIM's not meant (the negation stays the SIM's).
          c.details.back().negated = true;
        }
        c.details.back().given_up = c.details.back().negated && (pending_unable || not_wanted) && !rest_not_meant;
        break;
      case Token::role:
        rest_not_meant = false;
        // "I want to return my order", "I'd like to tip the driver": to after a
        // want is the verb's, not a direction (the return is not where anything goes).
        // ("I need you to email me": past the one asked, too.)
        if (lex.names[t->name] == "TO" && t != begin &&
            (t[-1].kind == Token::want ||
             (t - 1 != begin && t[-1].kind == Token::subject && t[-2].kind == Token::want))) {
          break;
        }
        role = lex.names[t->name] + ".";
        break;
      case Token::negation:
        // 不是没收到货 ("it is not that I didn't get the goods") denies 没收到货: one more thing it says.
        if (t != begin && t[-1].kind == Token::negation && t[-1].denies && pending_not) {
          c.details.push_back({"NOT_SO", false});
        }
        pending_not = true;
        pending_past = t->past;
        not_wanted = false;
        rest_not_meant = t->instead;
        // 别把卡注销, 还没把卡注销: a negation before 把 is the verb's, not the card's; so is one before
        // who it is for or where it goes, with a verb after (别给我弟转50欧元, 还没从我卡里扣款).
        // So is one opening a question before what it asks about ("why isn't my order cancelled?").
        not_waits_for_action = (t + 1 != end && (t[1].kind == Token::disposal ||
                                                 (last_action != nullptr && last_action > t &&
                                                  (((t == begin || t[-1].kind == Token::question) && t->does_not &&
                                                    (t[1].kind == Token::object || t[1].kind == Token::entity)) ||
                                                   t[1].kind == Token::benefactive || t[1].kind == Token::role ||
                                                   t[1].kind == Token::polite || t[1].kind == Token::want)))) ||
                               (t->refuses && wanted_thing_then_its_verb(lex, t + 1, end));
        // "the label isn't printing", "my card won't work": a thing opening
        // the clause, then a negated action, is what it cannot do (a fault,
        // as "I can't print the label"), not "don't print the label".
        pending_unable =
            t->unable || (t->does_not && c.actions.empty() && t != begin &&
                          (t[-1].kind == Token::object || t[-1].kind == Token::entity) && t + 1 != end &&
                          t[1].kind == Token::action && !t[1].past && std::all_of(begin, t, [](const Token& b) {
                            return b.kind == Token::object || b.kind == Token::entity || b.kind == Token::detail;
                          }));
        // "charge it to the company card and not mine": after what an action
        // acts on (or a thing), a negation with nothing after it contrasts
        // with what is not named; it does not negate the action.
        contrasts_unnamed = t->contrast && c.actions.size() + c.objects.size() + c.entities.size() > 0 && t != begin &&
                            t[-1].kind != Token::action;
        break;
      case Token::negation_after:
        if (t->fine) {
          fine_after_thing = fine_after_thing || c.objects.size() + c.entities.size() > 0;
          break;
        }
        if (!c.actions.empty()) {
          c.actions.back().negated = true;
          c.actions.back().unable = t->unable;
        } else {
          pending_not = true;
          pending_unable = t->unable;
        }
        break;
      case Token::question:
        if (lex.names[t->name] == "QMARK") {
          question_mark = true;  // 吗, 呢: a spoken question mark, which a polite form outranks
          // ... but not 了吗: 帮我值机了吗 asks whether it was done, however politely; 能帮我把滞纳金退了吗
          // still asks to act (能帮我 asks whether one can, that is, to do it).
          if (t != begin && t[-1].kind == Token::perfective &&
              std::none_of(begin, t, [](const Token& p) { return p.kind == Token::polite && p.can_you; })) {
            question_word = true;
          }
        } else {
          question_word = true;
          // Where, before an act asked for, asks how ("where do I pay my water bill", 自动续费在哪里关);
          // after an act or of one done, the place ("where was it delivered": not "was it delivered?");
          // with no act but asking, what ("where is my order", "check where my parcel is"). (到哪了,
          // 送到哪里了 ask how far a parcel got: QUERY.)
          const bool where = lex.names[t->name] == "WHERE";
          const bool where_to_act = where && last_action != nullptr && last_action > t && !last_action->past;
          // how, when: asked so, "can" adds nothing ("how can I cancel" is "how do I cancel"); never
          // how much ("how much can I withdraw" asks a limit) nor whether ("whether I can switch").
          asks_how = asks_how || lex.names[t->name] == "TIME" || lex.names[t->name] == "METHOD" || where_to_act;
          if (where_to_act) {
            c.details.push_back({"METHOD", false});
          } else if (where && last_action != nullptr && last_action->name != query) {
            c.details.push_back({"LOCATION", false});
          } else if (t->name != query && !where) {
            c.details.push_back({lex.names[t->name], false});
            c.details.back().asked = true;
            c.details.back().what_it_is = t->what_it_is;
          }
        }
        break;
      case Token::aux:
        // Opening the clause, an auxiliary asks ("can I cancel"); after a
        // subject it states ("I can cancel"), unless the clause asks anyway
        // ("我可以取消吗", "I can cancel it?").
        // Before an action, after what it is about, it asks too when the
        // clause is a question ("订单能取消吗", 特价商品能退款吗: 退款 is a thing
        // and its verb).
        if (first && lex.names[t->name] == "ASK_ABLE" && for_me_after_details(lex, t + 1, end)) {
          polite = true;  // 能马上帮我冻结银行卡吗 asks as 能帮我 does: "can you", not "can I"
          break;
        }
        if (first) aux = lex.names[t->name];
        if ((after_subject || (t + 1 != end && (t[1].kind == Token::action || t[1].kind == Token::object))) &&
            aux.empty() && aux_after_subject.empty()) {
          aux_after_subject = lex.names[t->name];
        }
        break;
      case Token::polite:
        polite = true;
        break;
      case Token::speaker:
        if (t->copular) {
          c.objects.push_back({"SELF", pending_not});
          pending_not = false;
          break;
        }
        speaker_after_action = !c.actions.empty();
        if (two_actions_and_someone) {
          // "remind me to call mum" is not "remind mum to call me": who is asked to do what is in where I am.
          c.objects.push_back({"SELF", pending_not});
          pending_not = false;
        } else if (this_role == "TO.") {
          // Where it goes, as "to Friday" says when: a detail.
          c.details.push_back({"TO.SELF", pending_not});
          c.details.back().to_speaker = true;
          pending_not = false;
        } else if (pending_not && (contrasts_unnamed ||
                                   (t != begin && t[-1].kind == Token::negation && t - 1 == begin && t + 1 == end))) {
          // "give the upgrade to my partner rather than me", "..., not mine": the speaker is not meant.
          c.objects.push_back({"SELF", true});
          pending_not = false;
        }
        // "Refund me for ...": a thing's name before me, opening the clause, is its verb: a request
        // ("you refunded me" reports one).
        if (c.actions.empty() && c.objects.size() == 1 && c.entities.empty() && t != begin &&
            t[-1].kind == Token::object && !t[-1].past) {
          wants = true;
        }
        break;
      case Token::want:
        not_wanted = not_wanted || pending_not;
        wants = wants || !t->passive;
        needs = needs || t->needs;
        rest_not_meant = false;  // "instead of a voucher I want cash back": the want names what is meant
        break;
      case Token::sequence:
        break;
      case Token::subject:
        // 我 after an action, a role or 把, and not before what it owns
        // (接我 but not 接我妈, 从我 but not 从我家): the speaker, acted on.
        if (t->names_speaker && t != begin &&
            (t[-1].kind == Token::action || t[-1].kind == Token::role || t[-1].kind == Token::disposal) &&
            (t + 1 == end || (t[1].kind != Token::object && t[1].kind != Token::detail))) {
          c.objects.push_back({this_role + "SELF", pending_not});
          pending_not = false;
        } else {
          role = this_role;  // 从我家: FROM is the home's
          // 房东欠我押金 is not 我欠房东押金: 我 right after the action, with
          // things before it, is acted on, as "the landlord owes me" (BY.).
          // (After 把 what comes before the action is what it acts on: 把合同发给我妈.)
          if (t->names_speaker && t != begin && t[-1].kind == Token::action && c.actions.size() == 1 &&
              things_before_action.first + things_before_action.second > 0 &&
              std::none_of(begin, t, [](const Token& b) { return b.kind == Token::disposal; })) {
            speaker_after_action = true;
          }
          // 退我年费, as "refund me": a thing's name before 我, opening the clause, is its verb: a request.
          if (t->names_speaker && t - 1 == begin && t[-1].kind == Token::object && c.actions.empty() &&
              c.objects.size() == 1 && c.entities.empty()) {
            wants = true;
          }
        }
        break;
      case Token::perfective:
        perfective = true;
        break;
      case Token::greeting:
      case Token::disposal:
      case Token::benefactive:
      case Token::coordinator:
      case Token::turn:
        // "if you cancel my order, ..." sets a condition; it asks for nothing. After a check or a
        // doubt, if is whether ("check if my payment went through", "I don't know if I want to").
        if (t->condition &&
            !(t != begin && (t[-1].kind == Token::question || (t[-1].kind == Token::action && t[-1].name == query) ||
                             (t[-1].kind == Token::detail && lex.names[t[-1].name] == "UNSURE")))) {
          c.details.push_back({"IF", false});
          c.conditional = c.conditional || t == begin;
        }
        break;
      case Token::unknown:
      case Token::clause_end:
        break;
    }
    if (t->kind == Token::negation && !this_role.empty()) role = this_role;  // "from not X" keeps FROM
    want_then_things =
        (t->kind == Token::want && !t->prefers) ||
        (want_then_things && (t->kind == Token::object || t->kind == Token::entity || t->kind == Token::detail));
    std::size_t list_index = 0;
    for (auto* list : {&c.objects, &c.entities, &c.details}) {
      for (std::size_t k = before[list_index]; k < list->size(); ++k)
        (*list)[k].at = static_cast<std::size_t>(t - begin);
      ++list_index;
    }
    after_subject = first && t->kind == Token::subject;
    if (t->kind != Token::greeting && t->kind != Token::polite) first = false;
  }
  if (pending_not && contrasts_unnamed) {
    pending_not = false;  // "deliver to the front door instead of the back"
  }
  // 付款成功没有, 退款了没: 没 closing the clause right after its verb asks (a statement puts it before).
  const bool ends_asking_whether_done =
      end - begin >= 2 && end[-1].kind == Token::negation && end[-1].past && end[-2].kind == Token::action;
  // 我的押金退回来没有？: 没有 closing a question after a thing that is its verb (退) asks too.
  const bool asks_with_closing_not = question_mark && end - begin >= 2 && end[-1].kind == Token::negation &&
                                     end[-1].past && end[-2].kind == Token::object;
  if (pending_not) {
    if ((question_mark || ends_asking_whether_done) && !question_word && aux.empty() &&
        (!c.actions.empty() || asks_with_closing_not) && !pending_unable) {
      question_word = true;  // 支付成功没有？: the negation asks, it does not negate
    } else if (!c.actions.empty()) {
      c.actions.back().negated = true;  // 登录不了
      c.actions.back().unable = pending_unable;
    } else {
      c.negated = true;
    }
  }
  if (speaker_after_action) {
    // "The seller owes me $40" is not "I owe the seller $40": what comes
    // before the action, with the speaker after it, is who acts (BY.).
    for (std::size_t i = 0; i < things_before_action.first; ++i) {
      if (!c.objects[i].text.starts_with("BY.")) c.objects[i].text.insert(0, "BY.");
    }
    for (std::size_t i = 0; i < things_before_action.second; ++i) {
      if (!c.entities[i].text.starts_with("BY.")) c.entities[i].text.insert(0, "BY.");
    }
  }
  // "the outstanding invoices on my account" are "my outstanding invoices":
  // the speaker's account, right after what the request acts on, says nothing
  // more (to or from an account, one of two things joined by and, or what an
  // action acts on, does).
  std::erase_if(c.objects, [](const Element& e) { return e.context; });
  // "ship it to me" is "ship it": the speaker it goes to says nothing more,
  // unless something else goes somewhere ("charge the order to my company and
  // ship it to me" is not "charge the order to me and ship it to my company").
  const auto goes_elsewhere = [](const Element& e) { return e.text.starts_with("TO.") && !e.to_speaker; };
  if (std::none_of(c.objects.begin(), c.objects.end(), goes_elsewhere) &&
      std::none_of(c.entities.begin(), c.entities.end(), goes_elsewhere) &&
      std::none_of(c.details.begin(), c.details.end(), goes_elsewhere)) {
    std::erase_if(c.details, [](const Element& e) { return e.to_speaker && !e.negated; });
  }
  if (!c.entities.empty() && !c.objects.empty()) {
    // "flight number BA2490" is "flight BA2490": beside the id and what it
    // names, the word for an id says nothing more.
    std::erase_if(c.details, [](const Element& d) { return d.text == "NUMBER"; });
  }
  if (c.actions.size() == 1 && !c.actions[0].negated && !c.actions[0].past &&
      (c.actions[0].text == "SEND" || c.actions[0].text == "BRING") && !c.objects.empty() &&
      std::none_of(c.objects.begin(), c.objects.end(), [](const Element& e) { return e.text.starts_with("TO."); }) &&
      std::none_of(c.entities.begin(), c.entities.end(), [](const Element& e) { return e.text.starts_with("TO."); })) {
    // "send me the invoice", "send the invoice", "bring me a towel": a request
    // for the invoice, a towel, as "I need the invoice" is. Sent somewhere
    // else ("to my accountant"), the sending is the request. 账单发我: the
    // speaker it goes to (SELF) says nothing more, as "me" does.
    c.actions.clear();
    std::erase_if(c.objects, [](const Element& e) { return e.text == "SELF" && !e.negated; });
    wants = true;
  }
  // 把漫游费退回来: 把, then what is acted on, then a thing that is its verb
  // (退回), is a command ("ATM把我的卡吞了" ends in what happened to it), and
  // so is one with details after its verb: 把送货预约在上午 asks for the
  // booking; 送货是预约在上午吗 asks about it.
  if (c.actions.empty() && end - begin >= 3) {
    const Token* disposal = std::find_if(begin, end - 2, [](const Token& t) { return t.kind == Token::disposal; });
    const auto things_after = std::count_if(disposal, end, [](const Token& t) { return t.kind == Token::object; });
    const Token* last_thing = end;
    while (last_thing != disposal &&
           (last_thing[-1].kind == Token::detail || last_thing[-1].kind == Token::perfective)) {
      --last_thing;  // 把高级会员退了: 了 after the verb is no thing
    }
    if (disposal != end - 2 && last_thing != disposal && last_thing[-1].kind == Token::object &&
        (last_thing == end || things_after >= 2)) {
      wants = true;
    }
  }
  if (question_word) {
    // "I'm not sure where my parcel is" asks where it is: the doubt is the question.
    std::erase_if(c.details, [](const Element& d) { return d.text == "UNSURE"; });
  }
  // "could you cancel my order, not my subscription?": the question mark of
  // a request asked politely earlier in the text is the request's, not a question.
  const bool asks = !aux.empty() || question_word || (question_mark && !polite && !polite_earlier);
  c.asks_politely = (polite || wants) && !asks && !c.negated;
  if (aux.empty() && asks) aux = aux_after_subject;
  // "do I need to pay a deposit?", 要交押金吗: whether one must, not whether it was done
  // (with a question word, 要怎么改 is "how to change": how, not whether).
  if (needs && asks && !question_word && (aux.empty() || aux == "ASK")) aux = "ASK_MUST";
  // "when can it ship?", 啥时候能发出来, "how can I cancel?": asked when or how, can is only when or how
  // it will be ("when will it ship?", "how do I cancel?").
  if (aux == "ASK_ABLE" && asks_how) aux = "ASK";
  if (asks && (aux.empty() || aux == "ASK") && c.actions.empty() && !c.objects.empty()) {
    // "is my order on its way?" asks whether it has shipped ("has my order been dispatched?").
    const auto on_its_way =
        std::find_if(c.details.begin(), c.details.end(), [](const Element& d) { return d.text == "IN_TRANSIT"; });
    if (on_its_way != c.details.end() && !on_its_way->negated) {
      c.details.erase(on_its_way);
      c.actions.push_back({"SHIP", false});
    }
  }
  const auto is_plain_query = [query, &lex](const Element& e) { return !e.negated && e.text == lex.names[query]; };
  const bool other_action =
      std::any_of(c.actions.begin(), c.actions.end(), [&](const Element& e) { return e.text != lex.names[query]; });
  if (!aux.empty() && aux != "ASK") {
    c.mood = aux;  // can i ...: ASK_ABLE, its own question
  } else if (asks && !other_action) {
    // A question about the state of something is the action QUERY.
    if (c.actions.empty() && (!c.objects.empty() || !c.entities.empty() || !c.details.empty())) {
      c.actions.push_back({lex.names[query], false});
    } else if (c.actions.empty()) {
      c.mood = "ASK";
    }
  } else if (asks || (other_action && std::any_of(c.actions.begin(), c.actions.end(), is_plain_query))) {
    // A question about an action ("has 789 shipped", "check whether 789
    // shipped"): ASK and the action; the QUERY is the question's form.
    c.mood = "ASK";
    c.actions.erase(std::remove_if(c.actions.begin(), c.actions.end(), is_plain_query), c.actions.end());
  } else if (c.actions.empty() && !c.details.empty() &&
             (!c.asks_politely || std::any_of(c.details.begin(), c.details.end(),
                                              [](const Element& d) { return d.text == "STATUS" && !d.negated; }))) {
    // "refund status of order 7" asks; "I want a refund for the late delivery" does not. A status
    // asked for politely is asked about: "status of flight UA 482, please".
    c.actions.push_back({lex.names[query], false});
    c.states = true;
  }
  c.about_someone = std::any_of(begin, end, [](const Token& t) { return t.kind == Token::subject; });
  c.fine = fine_after_thing && c.mood.empty() && !asks && !c.negated && c.actions.empty() && c.details.empty() &&
           std::none_of(c.objects.begin(), c.objects.end(), is_negated) &&
           std::none_of(c.entities.begin(), c.entities.end(), is_negated);
  // "move $300 into savings" is "transfer $300 to savings": money moved is transferred (a move of house,
  // of an appointment or a seat stays MOVE).
  const auto is_money = [](const Element& e) {
    for (std::string_view unit : {"usd", "eur", "gbp", "cny", "jpy"}) {
      if (e.text.size() > unit.size() && e.text.ends_with(unit)) return true;
    }
    return e.text == "MONEY" || e.text.ends_with(".MONEY");
  };
  if (std::any_of(c.entities.begin(), c.entities.end(), is_money) ||
      std::any_of(c.objects.begin(), c.objects.end(), is_money)) {
    for (Element& a : c.actions) {
      if (a.text == "MOVE") a.text = "TRANSFER";
    }
  }
  // What is booked for a time, moved, is rescheduled: "move my appointment to Friday" is "change
  // my appointment to Friday", "reschedule my appointment".
  const auto is_booked_for_a_time = [](const Element& e) {
    return name_in(e.text, {"APPOINTMENT", "BOOKING", "DELIVERY", "FLIGHT", "TABLE"});
  };
  if (std::any_of(c.objects.begin(), c.objects.end(), is_booked_for_a_time)) {
    for (Element& a : c.actions) {
      if (a.text == "MOVE") a.text = "CHANGE";
    }
  }
  // A request withdrawn is cancelled: "withdraw my refund request" is "cancel my refund request"
  // (money withdrawn is not: "withdraw $100 from my savings").
  const auto is_request = [](const Element& e) {
    return name_in(e.text, {"REFUND", "RETURN", "APPLICATION", "CLAIM"});
  };
  if (std::any_of(c.objects.begin(), c.objects.end(), is_request)) {
    for (Element& a : c.actions) {
      if (a.text == "WITHDRAW" && !a.nominal) a.text = "CANCEL";
    }
  }
  for (Element& a : c.actions) {
    // "I can't wait any longer", "I can't attend": what only the speaker does, they will not do
    // ("I don't want to wait"); no one is asked for help with it.
    if (a.unable && (a.text == "WAIT" || a.text == "ATTEND")) a.unable = false;
  }
  undo_to_reverse(c.actions);
  if (perfective && !polite && !wants && c.mood.empty() && !asks &&
      std::any_of(begin, end, [](const Token& t) { return t.kind == Token::subject && !t.names_speaker; })) {
    // 你们取消订单了, 您给我退款了: the one asked did it; 帮我把订单取消了 and 我要取消订单了 still ask.
    // (我忘记密码了 states the speaker's problem, as "I forgot my password" does.)
    for (Element& a : c.actions) a.past = a.past || (!a.negated && a.text != lex.names[query]);
  }
  if (c.mood.empty() && !asks) {
    // A statement of what happened: not the request to do it.
    for (Element& a : c.actions) {
      if (a.past) a.text += "_DONE";
    }
  }
  for (std::string_view place : {"TO.", "FROM."}) {
    std::size_t with_role = 0;
    for (const auto* list : {&c.objects, &c.entities, &c.details}) {
      with_role += static_cast<std::size_t>(
          std::count_if(list->begin(), list->end(), [&](const Element& e) { return e.text.starts_with(place); }));
    }
    c.interleaved = c.interleaved || with_role >= 2;
  }
  // Objects, entities and details keep their order, as actions do: sorted,
  // "退机票" would meet "机票退了" (a paraphrase), but "swap my aisle seat for
  // a window seat" would meet its reverse, and on the tuning pairs the second
  // kind outnumbers the first. A repeated one counts once, unless things go
  // to different places.
  for (auto* list : {&c.objects, &c.entities, &c.details}) {
    if (c.interleaved) break;  // "50 to my dad and 50 to me": each one counts
    std::vector<Element> unique;
    for (Element& e : *list) {
      const std::string shown = e.shown();
      if (std::none_of(unique.begin(), unique.end(), [&](const Element& u) { return u.shown() == shown; })) {
        unique.push_back(std::move(e));
      }
    }
    *list = std::move(unique);
  }
  return c;
}

// "Breakfast isn't included, is it?" asks what "is breakfast included?"
// asks, "you charged me twice, didn't you?" what "did you charge me twice?"
// does: a tag of the other polarity after a statement makes it that
// question, its one negation the tag's. (Both negated or neither, it stays.)
void tag_question(std::vector<Token>& tokens) {
  if (tokens.size() < 4 || tokens.back().kind != Token::clause_end || !tokens.back().question_mark) return;
  std::size_t tag = tokens.size() - 1;  // the tag: tokens[tag, size - 1)
  while (tag > 0 && tokens[tag - 1].kind != Token::clause_end) --tag;
  if (tag < 2 || tokens[tag - 1].soft) return;  // a comma of the text's own before it
  bool aux = false, subject = false, tag_negated = false;
  for (std::size_t k = tag; k + 1 < tokens.size(); ++k) {
    const Token& t = tokens[k];
    if (t.kind == Token::aux && !aux) {
      aux = true;
    } else if (t.kind == Token::negation && t.inverts && !tag_negated && !aux) {
      tag_negated = aux = true;  // isn't, didn't: the auxiliary and its negation
    } else if (t.kind == Token::subject && !subject) {
      subject = true;
    } else {
      return;
    }
  }
  if (!aux) return;  // ("is it", "did you": one auxiliary entry with its subject)
  std::size_t statement = tag - 1;
  while (statement > 0 && tokens[statement - 1].kind != Token::clause_end) --statement;
  std::vector<std::size_t> negations;
  for (std::size_t k = statement; k + 1 < tag; ++k) {
    if (tokens[k].kind == Token::negation || tokens[k].kind == Token::negation_after) negations.push_back(k);
  }
  if (negations.size() + (tag_negated ? 1 : 0) != 1) return;
  tokens[tag - 1].question_mark = true;
  tokens.erase(tokens.begin() + static_cast<std::ptrdiff_t>(tag), tokens.end());
  if (!negations.empty()) tokens.erase(tokens.begin() + static_cast<std::ptrdiff_t>(negations[0]));
}

// "Isn't my policy active yet?" asks what "is my policy active yet?" asks,
// "haven't you received my payment?" what "have you received my payment?"
// does, "can't I cancel online?" "can I cancel online?": a yes-or-no question
// opened by an auxiliary's negation is that auxiliary's question. Not after a
// question word ("why hasn't my order shipped?" is not "why has it?"), nor
// where the negation says what is ("my order hasn't shipped?") or forbids
// ("don't cancel my order?").
void negated_yes_no_question(const Lexicon& lex, std::vector<Token>& tokens) {
  const auto ask = lex.by_name.find("ASK"), ask_able = lex.by_name.find("ASK_ABLE");
  if (ask == lex.by_name.end() || ask_able == lex.by_name.end()) return;  // a host's lexicon without them
  std::size_t begin = 0;
  for (std::size_t i = 0; i <= tokens.size(); ++i) {
    if (i < tokens.size() && tokens[i].kind != Token::clause_end) continue;
    const bool asked = i < tokens.size() && tokens[i].question_mark;
    std::size_t first = begin;
    while (first < i && (tokens[first].kind == Token::greeting || tokens[first].kind == Token::polite)) ++first;
    // Inverted: who or what it asks about comes next ("isn't my", "haven't you"), not the verb ("don't cancel it?").
    const auto inverted = [](const Token& t) {
      return t.kind == Token::subject || t.kind == Token::object || t.kind == Token::entity || t.kind == Token::detail;
    };
    if (asked && first + 1 < i && tokens[first].kind == Token::negation && tokens[first].inverts &&
        inverted(tokens[first + 1])) {
      const bool unable = tokens[first].unable;
      tokens[first] = Token{Token::aux, unable ? ask_able->second : ask->second, {}, false};
    }
    begin = i + 1;
  }
}

// A clock time with its part of the day is the 24-hour clock's: 下午3点 is
// 15:00 and "3 pm", 晚上7点半 19:30, 下午6点45 18:45, "8 o'clock in the
// morning" 08:00. Only hours the part of the day can have are read (下午3点,
// not 下午9点).
void part_of_day_clock(const Lexicon& lex, std::vector<Token>& tokens) {
  const auto hour_of = [](const Token& t) -> int {
    if (t.kind != Token::entity || !t.text.ends_with("oclock") || t.text.size() > 8) return -1;
    const std::string_view digits = std::string_view(t.text).substr(0, t.text.size() - 6);
    if (digits.empty() || !std::all_of(digits.begin(), digits.end(), is_ascii_digit)) return -1;
    const int hour = std::stoi(std::string(digits));
    return hour >= 1 && hour <= 12 ? hour : -1;
  };
  // The hour on the 24-hour clock, or -1 where the part of the day has no such hour.
  const auto in_part = [](std::string_view part, int hour) -> int {
    if (part == "MORNING" || part == "EARLY_MORNING") return hour == 12 ? 0 : hour <= 11 ? hour : -1;
    if (part == "AFTERNOON") return hour == 12 ? 12 : hour <= 7 ? hour + 12 : -1;
    if (part == "EVENING") return hour == 12 ? 0 : hour >= 5 ? hour + 12 : -1;
    if (part == "NOON") return hour == 12 ? 12 : hour <= 2 ? hour + 12 : -1;
    return -1;
  };
  for (std::size_t i = 0; i + 1 < tokens.size(); ++i) {
    // 下午3点 (the part first), "3 o'clock in the afternoon" (the hour first).
    const bool part_first = tokens[i].kind == Token::detail;
    Token& part = tokens[part_first ? i : i + 1];
    Token& clock = tokens[part_first ? i + 1 : i];
    if (part.kind != Token::detail) continue;
    const int hour = hour_of(clock);
    if (hour < 0) continue;
    const int on_clock = in_part(lex.names[part.name], hour);
    if (on_clock < 0) continue;
    // 三点半: half past; 6点45: 6:45.
    const std::size_t after = part_first ? i + 2 : i + 1;
    const bool half = part_first && after < tokens.size() && tokens[after].kind == Token::detail &&
                      lex.names[tokens[after].name] == "HALF";
    const bool minutes = part_first && after < tokens.size() && tokens[after].kind == Token::entity &&
                         tokens[after].text.size() == 2 && is_ascii_digit(tokens[after].text[0]) &&
                         is_ascii_digit(tokens[after].text[1]) && tokens[after].text[0] <= '5';
    clock.text = fmt::format("{:02}{}", on_clock, half ? "30" : minutes ? tokens[after].text : "00");
    if (half || minutes) tokens.erase(tokens.begin() + static_cast<std::ptrdiff_t>(after));
    tokens.erase(tokens.begin() + static_cast<std::ptrdiff_t>(part_first ? i : i + 1));
  }
}

// A date is one entity, however it is written: "1 July 2026", "July 1st,
// 2026", "2026年7月1日" and "2026-07-01" are 20260701; without a year, "4
// March", "March 4th" and "3月4日" are m0304 (never 0304, which "03/04" is:
// day and month in some order). Only a day of 1 to 31 beside a month's name
// (or 月 after a month of 1 to 12), and a year of four digits, are read.
void merge_dates(const Lexicon& lex, std::vector<Token>& tokens) {
  static constexpr std::string_view kMonths[] = {"JANUARY", "FEBRUARY", "MARCH",     "APRIL",   "MAY",      "JUNE",
                                                 "JULY",    "AUGUST",   "SEPTEMBER", "OCTOBER", "NOVEMBER", "DECEMBER"};
  const auto number = [](const Token& t, std::string_view suffix, int low, int high, std::size_t max_digits) {
    if (t.kind != Token::entity || t.text.size() <= suffix.size() ||
        std::string_view(t.text).substr(t.text.size() - suffix.size()) != suffix) {
      return -1;
    }
    const std::string_view digits = std::string_view(t.text).substr(0, t.text.size() - suffix.size());
    if (digits.size() > max_digits || !std::all_of(digits.begin(), digits.end(), is_ascii_digit)) return -1;
    int value = 0;
    for (char c : digits) value = value * 10 + (c - '0');
    return value >= low && value <= high ? value : -1;
  };
  const auto month_of = [&](const Token& t) {
    if (t.kind != Token::detail) return -1;
    const auto it = std::find(std::begin(kMonths), std::end(kMonths), lex.names[t.name]);
    return it == std::end(kMonths) ? -1 : static_cast<int>(it - std::begin(kMonths)) + 1;
  };
  const auto day_of = [&](const Token& t) {  // 4, 4th, 1st
    int day = number(t, "", 1, 31, 2);
    for (std::string_view ordinal : {"st", "nd", "rd", "th"}) day = day > 0 ? day : number(t, ordinal, 1, 31, 2);
    return day;
  };
  const auto year_of = [&](const Token& t) { return number(t, "", 1900, 2199, 4); };
  std::vector<Token> out;
  out.reserve(tokens.size());
  for (std::size_t i = 0; i < tokens.size();) {
    const auto at = [&](std::size_t k) -> const Token* { return i + k < tokens.size() ? &tokens[i + k] : nullptr; };
    int day = -1, month = -1, year = -1;
    std::size_t used = 0;
    if (at(1) && (day = day_of(tokens[i])) > 0 && (month = month_of(*at(1))) > 0) {
      used = 2;  // 1 July
    } else if (at(1) && (month = month_of(tokens[i])) > 0 && (day = day_of(*at(1))) > 0) {
      used = 2;  // July 1
    } else if (at(2) && (year = number(tokens[i], "year", 1900, 2199, 4)) > 0 &&
               (month = number(*at(1), "month", 1, 12, 2)) > 0 &&
               (day = number(*at(2), "day_of_month", 1, 31, 2)) > 0) {
      used = 3;  // 2026年7月1日
    } else if (at(1) && (month = number(tokens[i], "month", 1, 12, 2)) > 0 &&
               (day = number(*at(1), "day_of_month", 1, 31, 2)) > 0) {
      used = 2;  // 7月1日
    }
    if (used == 2 && year < 0) {
      // A year after it: "1 July 2026", "July 1, 2026" (the comma is a clause break).
      if (at(2) && (year = year_of(*at(2))) > 0) {
        used = 3;
      } else if (at(3) && at(2)->kind == Token::clause_end && !at(2)->question_mark && (year = year_of(*at(3))) > 0) {
        used = 4;
      }
    }
    if (used == 0) {
      out.push_back(std::move(tokens[i++]));
      continue;
    }
    out.push_back({Token::entity, 0,
                   year > 0 ? fmt::format("{:04}{:02}{:02}", year, month, day) : fmt::format("m{:02}{:02}", month, day),
                   false});
    i += used;
  }
  tokens = std::move(out);
}

// Whether an action passes something to someone (转账, 付, 打电话, 发, 回复,
// 退款): 给 and a thing before it say who receives (给妈妈转账 = 转账给妈妈).
// Other actions are done for the thing or on it (给手机充值, 给订单加备注).
bool gives_to(const Lexicon& lex, const Token& t) {
  return (t.kind == Token::action && name_in(lex.names[t.name], {"TRANSFER", "PAY", "CONTACT", "SEND", "REPLY"})) ||
         (t.kind == Token::object && t.chinese_verb && lex.names[t.name] == "REFUND");
}

// 给, 帮 and their forms with 我 say for whom something is done, or ask for
// it. "我给商家发错货了" (to the merchant) is not "商家给我发错货了" (the
// merchant, to me), nor "我帮邻居签收了快递" "邻居帮我签收了快递": after the
// speaker, 给 or 帮 before a thing and an action makes the thing where it
// goes (TO.); after a thing, 给我 or 帮我 before an action and what it acts on
// makes the thing who acts (BY.). 给 right after an action, or before a thing
// and an action that gives, says who receives (转账给妈妈 = 给妈妈转账, not
// 妈妈给我转账: TO.). Anywhere else they are what they were: 帮我 and 帮 a
// polite form (帮我取消订单), 给我 a want (给我退款), 给 nothing.
void benefactive_roles(const Lexicon& lex, std::vector<Token>& tokens) {
  if (std::none_of(tokens.begin(), tokens.end(), [](const Token& t) { return t.kind == Token::benefactive; })) return;
  const auto to = lex.by_name.find("TO");
  const auto polite_for_me = lex.by_name.find("POLITE_FOR_ME");
  const auto is_thing = [](const Token& t) { return t.kind == Token::object || t.kind == Token::entity; };
  // Per token, in one pass each way (linear however long a clause is): the
  // end of its clause, the first action at or after it in the clause (its end
  // when there is none), and whether an action or a thing came before it in
  // the clause.
  const std::size_t n = tokens.size();
  std::vector<std::size_t> clause_end(n + 1, n), action_after(n + 1, n);
  for (std::size_t i = n; i-- > 0;) {
    clause_end[i] = tokens[i].kind == Token::clause_end ? i : clause_end[i + 1];
    // 同事帮我预约体检: 预约, a thing that is its verb, acts as a verb does.
    action_after[i] = acts_as_verb(tokens[i]) || tokens[i].kind == Token::clause_end ? i : action_after[i + 1];
  }
  std::vector<bool> acted_before(n, false);
  for (std::size_t i = 1; i < n; ++i) {
    const Token& b = tokens[i - 1];
    acted_before[i] =
        b.kind != Token::clause_end && (acted_before[i - 1] || b.kind == Token::action || b.kind == Token::object);
  }
  std::vector<Token> out;
  out.reserve(n);
  for (std::size_t k = 0; k < n; ++k) {
    Token& t = tokens[k];
    if (t.kind != Token::benefactive) {
      out.push_back(std::move(t));
      continue;
    }
    const std::string& name = lex.names[t.name];
    const std::size_t end = clause_end[k];
    // 订单给取消了: after a thing, 给 right before a verb and 了 says 被, what was done to it (with 把,
    // 把订单给取消了, and without 了, 订单给取消一下, it still asks).
    if (name == "FOR" && !out.empty() && is_thing(out.back()) && k + 2 < end && tokens[k + 1].kind == Token::action &&
        tokens[k + 2].kind == Token::perfective &&
        std::none_of(out.begin(), out.end(), [](const Token& x) { return x.kind == Token::disposal; })) {
      tokens[k + 1].past = tokens[k + 1].reported = true;
      continue;
    }
    // 给我妈: 给 and the speaker's mother, not 给我 and 妈.
    const bool to_own_person = name == "WANT_FOR_ME" && k + 1 < end && is_person(lex, tokens[k + 1]);
    if ((name == "FOR" || to_own_person) && to != lex.by_name.end() && k + 1 < end && is_thing(tokens[k + 1])) {
      const bool after_action = !out.empty() && (out.back().kind == Token::action ||
                                                 (out.back().kind == Token::object && out.back().chinese_verb));
      std::size_t verb = k + 2;
      while (verb < end && tokens[verb].kind == Token::detail) ++verb;
      if (after_action || (verb < end && gives_to(lex, tokens[verb]))) {
        // 给卖家退款 = 退款给卖家: a verb named as a thing goes first, as it would.
        if (!after_action && verb == k + 2 && tokens[verb].kind == Token::object) {
          out.push_back(std::move(tokens[verb]));
          out.push_back({Token::role, to->second, {}, false});
          out.push_back(std::move(tokens[k + 1]));
          k = verb;
          continue;
        }
        out.push_back({Token::role, to->second, {}, false});
        continue;
      }
    }
    const bool for_speaker = name == "POLITE_FOR_ME" || name == "WANT_FOR_ME";
    // The speaker who acts: 我 with no action or thing before it in its clause
    // (提醒我给妈妈打电话: 我 is reminded).
    const bool after_speaker =
        k > 0 && tokens[k - 1].kind == Token::subject && tokens[k - 1].names_speaker && !acted_before[k - 1];
    std::size_t thing = k + 1;  // 帮我儿子: the son, after the speaker who owns him
    if (thing + 1 < end && tokens[thing].kind == Token::subject && tokens[thing].names_speaker &&
        is_thing(tokens[thing + 1])) {
      ++thing;
    }
    // 我帮我儿子付: 帮我 read as one word, the 我 is the son's.
    const bool speaker_owns_next = for_speaker && after_speaker && thing == k + 1 && thing < end;
    if ((!for_speaker || speaker_owns_next) && after_speaker && to != lex.by_name.end() && thing < end &&
        is_thing(tokens[thing]) && action_after[thing] < end) {
      out.push_back({Token::role, to->second, {}, false});
      continue;
    }
    // What the action acts on, right after it (details between): 签收了快递, 发错货; not 升级到500兆.
    const std::size_t action = action_after[k + 1];
    std::size_t acted_on = action + 1;  // 我儿子帮我改了地址: 了 between, too
    while (acted_on < end && (tokens[acted_on].kind == Token::detail || tokens[acted_on].kind == Token::perfective)) {
      ++acted_on;
    }
    if (for_speaker && !out.empty() && is_thing(out.back()) && action < end && !tokens[action].dao && acted_on < end &&
        is_thing(tokens[acted_on])) {
      out.back().actor = true;
      continue;
    }
    if (name == "POLITE_FOR" || name == "POLITE_FOR_ME") out.push_back({Token::polite, t.name, {}, false});
    if (name == "WANT_FOR_ME") {
      // 能给我退款吗 asks someone to give: 能帮我退款吗, not "I want".
      std::size_t before = out.size();
      while (before > 0 && out[before - 1].kind == Token::detail) --before;
      const bool asked_of_someone = before > 0 && out[before - 1].kind == Token::aux &&
                                    lex.names[out[before - 1].name] == "ASK_ABLE" && polite_for_me != lex.by_name.end();
      out.push_back(asked_of_someone ? Token{Token::benefactive, polite_for_me->second, {}, false}
                                     : Token{Token::want, 0, {}, false});
    }
  }
  tokens = std::move(out);
}

// Who did what, read from who opens a clause (rules v53 to v56):
// - 我把密码重置了, 我老公把订单取消了, 我儿子帮我改地址了: who opens the clause,
//   then 把 or (someone else) 帮我, then the verb and a closing 了 reports
//   what was done; without who did it (把订单取消了, 帮我把订单取消了) it still
//   asks. Someone other than the speaker did it (BY.).
// - 谢谢帮我开了发票: thanks, then 帮我 and a verb with 了, likewise.
// - 我儿子能帮我…吗, 我能帮我爸…吗: whether someone can, not "can you".
// - "my colleague paid for me", "my partner didn't receive it", 司机撤回了对我的
//   评价: someone opening the clause right before a past verb (or a negation
//   and the verb, or a verb and 了) did it.
void done_by_who_opens_the_clause(const Lexicon& lex, std::vector<Token>& tokens) {
  const auto describes = [](const Token& t) {
    return (t.kind == Token::object && !t.chinese_verb) || t.kind == Token::entity || t.kind == Token::detail ||
           t.kind == Token::role;
  };
  std::size_t start = 0;
  for (std::size_t end = 0; end <= tokens.size(); ++end) {
    if (end < tokens.size() && tokens[end].kind != Token::clause_end) continue;
    std::size_t k = start;
    // 谢谢帮我开了发票, 谢谢你帮我解冻了健身卡: thanks for what was done, as 你帮我 would report it.
    const bool thanks = k < end && tokens[k].kind == Token::greeting && lex.names[tokens[k].name] == "THANKS";
    if (thanks) {
      ++k;
      while (k < end && tokens[k].kind == Token::subject && !tokens[k].names_speaker) ++k;
      if (k < end && tokens[k].kind == Token::polite && lex.names[tokens[k].name] == "POLITE_FOR_ME") ++k;
    }
    bool person = false;
    while (k < end && ((tokens[k].kind == Token::subject && tokens[k].names_speaker) || is_person(lex, tokens[k]))) {
      person = person || is_person(lex, tokens[k]);
      ++k;
    }
    // 我儿子能帮我改地址吗: whether someone else can, not "can you"; 我能帮我爸改套餐吗: whether I can.
    if (k > start && k < end && tokens[k].kind == Token::polite && tokens[k].can_you) {
      if (const auto able = lex.by_name.find("ASK_ABLE"); able != lex.by_name.end()) {
        tokens[k] = Token{Token::aux, able->second, {}, false};
        for (std::size_t i = start; i < k; ++i) {
          if (is_person(lex, tokens[i])) tokens[i].actor = true;
        }
      }
    }
    // 我儿子帮我把地址改了: someone, 帮我 (read as please), then 把.
    const bool helps = person && k > start && k + 1 < end && tokens[k].kind == Token::polite &&
                       lex.names[tokens[k].name] == "POLITE_FOR_ME" && tokens[k + 1].kind == Token::disposal;
    if (helps) {
      tokens.erase(tokens.begin() + static_cast<std::ptrdiff_t>(k));
      --end;
    }
    const bool disposal = k > start && k < end && tokens[k].kind == Token::disposal;
    const bool acts_for_speaker = helps || (person && k > start && tokens[k - 1].actor);
    // The verb: before a closing 了, things between (改地址了), or right
    // before 了 with only its things after (改了地址).
    std::size_t verb = end;
    if (end >= start + 2 && tokens[end - 1].kind == Token::perfective) {
      std::size_t j = end - 1;
      while (j > k && describes(tokens[j - 1])) --j;
      if (j > k && acts_as_verb(tokens[j - 1])) verb = j - 1;
    } else {
      std::size_t j = end;
      while (j > k && describes(tokens[j - 1])) --j;
      if (j > k + 1 && j < end && tokens[j - 1].kind == Token::perfective && acts_as_verb(tokens[j - 2])) verb = j - 2;
    }
    // "my colleague paid for me", "my mom booked it": someone opening the
    // clause right before a verb in its past form did it ("I paid for my
    // colleague" is not the same). So does one before a negation and the
    // verb ("my partner didn't receive the fine, I did"), and in Chinese one
    // right before a verb and 了 (司机撤回了对我的评价).
    const std::size_t after_not = k < end && tokens[k].kind == Token::negation ? k + 1 : k;
    const bool verb_done_next =
        after_not < end &&
        ((tokens[after_not].kind == Token::action && (tokens[after_not].past || after_not > k)) ||
         (acts_as_verb(tokens[after_not]) && after_not + 1 < end && tokens[after_not + 1].kind == Token::perfective));
    if (!thanks && k > start && is_person(lex, tokens[k - 1]) && verb_done_next && !tokens[k - 1].owner &&
        !tokens[k - 1].modifies) {
      tokens[k - 1].actor = true;
      if (after_not + 1 < end && tokens[after_not + 1].kind == Token::perfective) {
        tokens[after_not].past = tokens[after_not].reported = true;
      }
    }
    if ((disposal || acts_for_speaker || (thanks && k > start + 1)) && verb < end && verb >= k) {
      tokens[verb].past = tokens[verb].reported = true;
      for (std::size_t i = start; i < k; ++i) {
        if (is_person(lex, tokens[i])) tokens[i].actor = true;
      }
    }
    start = end + 1;
  }
}

// 寄不寄, 免不免, 退不退: a word, a negation, the same word again asks a
// yes-no question about it, as 吗 does (寄吗); neither side is negated.
void a_not_a_questions(const Lexicon& lex, std::vector<Token>& tokens) {
  const auto qmark = lex.by_name.find("QMARK");
  if (qmark == lex.by_name.end() ||
      std::none_of(tokens.begin(), tokens.end(), [](const Token& t) { return t.kind == Token::negation; })) {
    return;
  }
  std::vector<Token> out;
  out.reserve(tokens.size());
  for (std::size_t i = 0; i < tokens.size(); ++i) {
    const bool word =
        tokens[i].kind == Token::action || tokens[i].kind == Token::detail || tokens[i].kind == Token::object;
    const bool asks = word && i + 2 < tokens.size() && tokens[i + 1].kind == Token::negation &&
                      tokens[i + 2].kind == tokens[i].kind && tokens[i + 2].name == tokens[i].name;
    out.push_back(std::move(tokens[i]));
    if (asks) {
      out.push_back(Token{Token::question, qmark->second, {}, false});
      i += 2;
    }
  }
  tokens = std::move(out);
}

// "One" and 一 before a measure word are "a" (一张票 is 张票 is "a ticket"),
// unless the clause compares counts: "two adult tickets and one child ticket"
// is not "one adult ticket and two child tickets", nor 2张成人票1张儿童票
// 1张成人票2张儿童票. Counts are compared where two numbers count things (each
// before a measure word), or where two numbers are joined by "and". "Both"
// is 2 ("cancel both orders"), except in a clause with "and": "cancel both
// the order and the subscription" only joins them.
// The speaker's copular mark ("the buyer is me", 我是受益人) stays only in a
// clause that names a role someone plays: "I am the beneficiary" is not "the
// beneficiary", but "I'm calling about my order" names none.
void speaker_plays_a_role(const Lexicon& lex, std::vector<Token>& tokens) {
  const auto plays_a_role = [&lex](const Token& t) {
    return (t.kind == Token::object || t.kind == Token::detail) &&
           name_in(lex.names[t.name], {"BUYER", "BENEFICIARY", "OWNER", "CAR_OWNER", "ACCOUNT_HOLDER", "CARDHOLDER",
                                       "POLICYHOLDER", "PASSENGER", "SENDER", "USER", "RECIPIENT", "DRIVER"});
  };
  std::size_t start = 0;
  for (std::size_t i = 0; i <= tokens.size(); ++i) {
    if (i < tokens.size() && tokens[i].kind != Token::clause_end) continue;
    const auto first = tokens.begin() + static_cast<std::ptrdiff_t>(start);
    const auto last = tokens.begin() + static_cast<std::ptrdiff_t>(i);
    if (std::none_of(first, last, plays_a_role)) {
      const auto kept = std::remove_if(first, last, [](const Token& t) { return t.copular; });
      const auto removed = static_cast<std::size_t>(last - kept);
      tokens.erase(kept, last);
      i -= removed;
    }
    start = i + 1;
  }
}

void drop_articles(std::vector<Token>& tokens) {
  const auto is_number = [](const Token& t) {
    return t.kind == Token::entity && !t.text.empty() && std::all_of(t.text.begin(), t.text.end(), is_ascii_digit);
  };
  std::size_t begin = 0;
  for (std::size_t i = 0; i <= tokens.size(); ++i) {
    if (i < tokens.size() && tokens[i].kind != Token::clause_end) continue;
    std::size_t counted = 0, numbers = 0;
    bool joined = false;
    for (std::size_t k = begin; k < i; ++k) {
      counted += tokens[k].counted ? 1 : 0;
      numbers += is_number(tokens[k]) ? 1 : 0;
      joined = joined || tokens[k].kind == Token::coordinator;
    }
    if (counted >= 2 || (joined && numbers >= 2)) {
      for (std::size_t k = begin; k < i; ++k) tokens[k].article = false;  // compared: one is 1
    }
    if (joined) {
      for (std::size_t k = begin; k < i; ++k) tokens[k].article = tokens[k].article || tokens[k].both;  // both X and Y
    }
    begin = i + 1;
  }
  std::erase_if(tokens, [](const Token& t) { return t.article; });
}

// "the right earbud" is a side, as "the left earbud" is; "that's right" and
// "right, refund me" say nothing: such a detail stays only right before a thing.
void drop_sides_without_thing(std::vector<Token>& tokens) {
  if (std::none_of(tokens.begin(), tokens.end(), [](const Token& t) { return t.before_thing_only; })) return;
  std::vector<Token> out;
  out.reserve(tokens.size());
  for (std::size_t i = 0; i < tokens.size(); ++i) {
    const bool thing_next =
        i + 1 < tokens.size() && (tokens[i + 1].kind == Token::object || tokens[i + 1].kind == Token::entity);
    if (!tokens[i].before_thing_only || thing_next) out.push_back(std::move(tokens[i]));
  }
  tokens = std::move(out);
}

// 到 after a verb says where to, as 成 does: 改到周六 is 改成周六, 转200块到储
// 蓄账户 is "transfer 200 to savings", not "transfer" and "arrive". So 到 alone,
// with an action before it in its clause and a thing right after it, is the
// role TO ("到了", "快递到没到" still arrive).
void dao_after_verb(const Lexicon& lex, std::vector<Token>& tokens) {
  const auto to = lex.by_name.find("TO");
  if (to == lex.by_name.end()) return;  // a lexicon of the host's own, without roles
  std::vector<Token> out;               // written anew, not inserted into: linear however many 到 there are
  out.reserve(tokens.size() + 4);
  bool action_before = false;
  for (std::size_t i = 0; i < tokens.size(); ++i) {
    Token& t = tokens[i];
    if (t.kind == Token::clause_end) action_before = false;
    // The thing may be the speaker's own (发到我邮箱).
    std::size_t next = i + 1;
    if (next < tokens.size() && tokens[next].kind == Token::subject && tokens[next].names_speaker) ++next;
    const bool thing_after =
        next < tokens.size() && (tokens[next].kind == Token::object || tokens[next].kind == Token::entity ||
                                 tokens[next].kind == Token::detail);
    if (t.kind == Token::action && t.dao && action_before && thing_after) {
      out.push_back(Token{Token::role, to->second, {}, false});
      continue;
    }
    // Between two things with no verb before it, 到 goes from the first to the second: 深圳到成都多少钱
    // is not 成都到深圳多少钱 (the second is where to; the 到 still arrives). Not after money, a verb of
    // its own (退款到银行卡了吗 is 退的钱到银行卡了吗: where it arrives, as before).
    const bool between_things = t.kind == Token::action && t.dao && !action_before && i > 0 &&
                                tokens[i - 1].kind == Token::object && !tokens[i - 1].chinese_verb &&
                                !name_in(lex.names[tokens[i - 1].name], {"REFUND", "MONEY"}) && i + 1 < tokens.size() &&
                                tokens[i + 1].kind == Token::object;
    if (t.kind == Token::action) action_before = true;
    out.push_back(std::move(t));
    if (between_things) out.push_back(Token{Token::role, to->second, {}, false});
  }
  tokens = std::move(out);
}

// "Move $200 into savings from checking" is "from checking to savings": a
// thing moved to one place from another is said in either order, so "to B
// from A" reads as "from A to B". A role governs the one token after it, so
// what comes after the two stays where it was.
void from_before_to(const Lexicon& lex, std::vector<Token>& tokens) {
  const auto from = lex.by_name.find("FROM");
  const auto to = lex.by_name.find("TO");
  if (from == lex.by_name.end() || to == lex.by_name.end()) return;
  // What make_clause reads as a thing there, a verb in -ing too ("from checking").
  const auto is_thing = [&](std::size_t at) {
    const Token& t = tokens[at];
    return t.kind == Token::object || t.kind == Token::entity || (t.kind == Token::action && t.gerund);
  };
  const auto is_role = [&](std::size_t at, std::uint32_t name) {
    return tokens[at].kind == Token::role && tokens[at].name == name;
  };
  for (std::size_t i = 0; i + 3 < tokens.size(); ++i) {
    if (is_role(i, to->second) && is_thing(i + 1) && is_role(i + 2, from->second) && is_thing(i + 3)) {
      std::swap(tokens[i], tokens[i + 2]);
      std::swap(tokens[i + 1], tokens[i + 3]);
      i += 3;
    }
  }
}

// "charge me when it ships", "I get an error when I try to pay": when, then
// who or what, joins what happens to the rest of the clause and asks no time
// (it made statements questions: "ASK-PAY-ERROR+TIME"); it is dropped. Opening
// a clause that ends in a question mark it still asks ("when my order will
// arrive?").
void when_as_conjunction(std::vector<Token>& tokens) {
  if (std::none_of(tokens.begin(), tokens.end(), [](const Token& t) { return t.subordinate; })) return;
  // Whether each token's clause ends in a question mark, in one pass from the end.
  std::vector<bool> asked(tokens.size() + 1, false);
  for (std::size_t i = tokens.size(); i-- > 0;) {
    asked[i] = tokens[i].kind == Token::clause_end ? tokens[i].question_mark : asked[i + 1];
  }
  std::vector<Token> out;
  out.reserve(tokens.size());
  for (std::size_t i = 0; i < tokens.size(); ++i) {
    const bool opens = out.empty() || out.back().kind == Token::clause_end;
    if (!tokens[i].subordinate || (opens && asked[i])) out.push_back(std::move(tokens[i]));
  }
  tokens = std::move(out);
}

// "take my Visa off the account", "turn the heating off", "call it off",
// "drop the parcel off at reception": off apart from its verb makes the verb
// what the two words say together, as "take off", "turn off", "call off" and
// "drop off" do (remove, disable, cancel, drop off); what comes after a thing
// taken off is what it is taken from. Any other "off" stays unknown. So
// "send the headphones back" and "ship it back" return, as "send back" does
// (not "send the headphones", which asks for them), "push my flight back"
// postpones; any other "back" goes.
void separated_off(const Lexicon& lex, std::vector<Token>& tokens) {
  if (std::none_of(tokens.begin(), tokens.end(), [](const Token& t) { return t.particle; })) return;
  const auto named = [&lex](std::string_view name) -> std::int64_t {
    const auto it = lex.by_name.find(std::string(name));
    return it == lex.by_name.end() ? -1 : static_cast<std::int64_t>(it->second);
  };
  const auto what_it_makes = [&](const Token& verb) -> std::string_view {
    const std::string& name = lex.names[verb.name];
    if (verb.kind == Token::want) return name == "TAKE" ? "DELETE" : name == "TURN" ? "DISABLE" : "";
    if (verb.kind != Token::action) return "";
    if (name == "CHANGE" || name == "CLOSE") return "DISABLE";  // switch, shut
    if (name == "CONTACT") return "CANCEL";                     // call
    if (name == "DELETE") return "DROP_OFF";                    // drop
    return "";
  };
  const auto between = [](const Token& t) {
    return t.kind == Token::object || t.kind == Token::entity || t.kind == Token::detail || t.kind == Token::speaker ||
           t.kind == Token::subject;  // "take me off", "call it off"
  };
  constexpr std::size_t kMaxBetween = 6;  // a bounded look back: linear however many there are
  std::vector<bool> drop(tokens.size(), false);
  std::vector<std::size_t> from_before;  // where a FROM goes (before the thing taken from)
  const std::int64_t return_name = named("RETURN");
  const std::int64_t postpone_name = named("POSTPONE");
  for (std::size_t k = 0; k < tokens.size(); ++k) {
    if (!tokens[k].particle) continue;
    if (tokens[k].text == "on") {
      // "turn the heating on", "switch roaming on for my trip", "switch it on
      // again": enable. Before what it is on ("change the address on my
      // billing info", "rebook me on the 11am") it is no particle.
      drop[k] = true;
      std::size_t j = k;
      while (j > 0 && k - j < kMaxBetween && between(tokens[j - 1])) --j;
      const Token* next = k + 1 < tokens.size() ? &tokens[k + 1] : nullptr;
      const bool thing_on = next != nullptr && between(*next) &&
                            !(next->kind == Token::object && next->after_preposition) &&
                            !(next->kind == Token::detail && name_in(lex.names[next->name], {"AGAIN", "TEMPORARY"}));
      const bool turns = j > 0 && j < k &&
                         ((tokens[j - 1].kind == Token::want && lex.names[tokens[j - 1].name] == "TURN") ||
                          (tokens[j - 1].kind == Token::action && lex.names[tokens[j - 1].name] == "CHANGE"));
      // Before a thing, on is its preposition: "the phone and email on the insurance file" (a place).
      if (thing_on && next->kind == Token::object) tokens[k + 1].after_preposition = true;
      const std::int64_t enable = named("ENABLE");
      if (turns && !thing_on && enable >= 0) {
        const bool past = tokens[j - 1].past;
        tokens[j - 1] = Token{Token::action, static_cast<std::uint32_t>(enable), {}, false};
        tokens[j - 1].past = past;
      }
      continue;
    }
    const bool back = tokens[k].text == "back";
    drop[k] = back;
    std::size_t j = k;
    while (j > 0 && k - j < kMaxBetween && between(tokens[j - 1])) --j;
    if (j == 0) continue;
    if (back) {
      Token& verb = tokens[j - 1];
      // "push my flight back": postpone it, as "push back" does.
      if (verb.kind == Token::want && lex.names[verb.name] == "PUSH" && postpone_name >= 0) {
        verb = Token{Token::action, static_cast<std::uint32_t>(postpone_name), {}, false};
        continue;
      }
      const bool sends = verb.kind == Token::action && name_in(lex.names[verb.name], {"SEND", "SHIP"});
      if (sends && return_name >= 0) {
        const bool past = verb.past;
        verb = Token{Token::object, static_cast<std::uint32_t>(return_name), {}, false};
        verb.past = past;
        // Opening its clause, the return is asked for, as "return my old router" is.
        verb.commands = j == 1 || tokens[j - 2].kind == Token::clause_end;
      }
      continue;
    }
    const std::string_view made = what_it_makes(tokens[j - 1]);
    const std::int64_t name = made.empty() ? -1 : named(made);
    if (name < 0) continue;
    const bool past = tokens[j - 1].past;
    tokens[j - 1] = Token{Token::action, static_cast<std::uint32_t>(name), {}, false};
    tokens[j - 1].past = past;
    drop[k] = true;
    // "take my Visa off the account": the account is what it is taken from (not "take off the discount").
    if (made == "DELETE" && j < k && k + 1 < tokens.size() &&
        (tokens[k + 1].kind == Token::object || tokens[k + 1].kind == Token::entity)) {
      from_before.push_back(k + 1);
    }
  }
  const auto from = lex.by_name.find("FROM");
  std::vector<Token> out;
  out.reserve(tokens.size() + from_before.size());
  std::size_t next_from = 0;
  for (std::size_t k = 0; k < tokens.size(); ++k) {
    if (next_from < from_before.size() && from_before[next_from] == k) {
      if (from != lex.by_name.end()) out.push_back({Token::role, from->second, {}, false});
      ++next_from;
    }
    if (!drop[k]) out.push_back(std::move(tokens[k]));
  }
  tokens = std::move(out);
}

// "the card ending (in) 4417" names the card by its last digits, as 尾号4417
// does: an end right after a thing and right before a number of three digits
// or more ends nothing ("my trial ends in 3 days" still ends).
void ending_as_last_digits(const Lexicon& lex, std::vector<Token>& tokens) {
  const auto end = lex.by_name.find("END");
  const auto last_digits = lex.by_name.find("LAST_DIGITS");
  if (end == lex.by_name.end() || last_digits == lex.by_name.end()) return;
  for (std::size_t i = 1; i + 1 < tokens.size(); ++i) {
    if (tokens[i].kind == Token::action && tokens[i].name == end->second && tokens[i - 1].kind == Token::object &&
        tokens[i + 1].kind == Token::entity && tokens[i + 1].text.size() >= 3 &&
        std::all_of(tokens[i + 1].text.begin(), tokens[i + 1].text.end(), is_ascii_digit)) {
      tokens[i] = Token{Token::detail, last_digits->second, {}, false};
    }
  }
}

// 耳机我想退回去, 电影票帮我退一下, 把机票退了: what is returned or refunded,
// named first, then who wants it or 把 before it, then 退 or 退款 last, asks
// for it as 我要退耳机 does; the return goes before the things. Without
// those words the thing may be who returns ("卖家退款给我" is not "退款给卖家").
void return_of_what_is_named_first(const Lexicon& lex, std::vector<Token>& tokens) {
  const auto returns = [&lex](const Token& t) {
    return t.kind == Token::object && (lex.names[t.name] == "RETURN" || lex.names[t.name] == "REFUND");
  };
  const auto is_marker = [](const Token& t) {
    return t.kind == Token::subject || t.kind == Token::want || t.kind == Token::benefactive || t.kind == Token::polite;
  };
  const auto is_named = [](const Token& t) {
    return t.kind == Token::object || t.kind == Token::entity || t.kind == Token::detail;
  };
  // A few words each way: a clause that names more before its 退 is no such request, and each 退 looks
  // back a bounded way (linear however many there are).
  constexpr std::size_t kMarkers = 4, kNamed = 8;
  for (std::size_t r = 1; r < tokens.size(); ++r) {
    if (!returns(tokens[r]) || tokens[r].past || tokens[r].reported) continue;  // "the shoes I returned"
    std::size_t k = r;
    while (k > 0 && r - k < kMarkers && is_marker(tokens[k - 1])) --k;
    bool marked = k < r;
    const std::size_t things_end = k;
    while (k > 0 && things_end - k < kNamed && is_named(tokens[k - 1])) --k;
    const std::size_t things_begin = k;
    if (things_begin == things_end || std::none_of(tokens.begin() + static_cast<std::ptrdiff_t>(things_begin),
                                                   tokens.begin() + static_cast<std::ptrdiff_t>(things_end),
                                                   [](const Token& t) { return t.kind == Token::object; })) {
      continue;  // 把年费退回来: with details alone, 退 stays where it reads as the verb
    }
    if (k > 0 && tokens[k - 1].kind == Token::disposal) {
      marked = true;
      --k;
    }
    while (k > 0 && (tokens[k - 1].kind == Token::polite || tokens[k - 1].kind == Token::benefactive ||
                     tokens[k - 1].kind == Token::subject || tokens[k - 1].kind == Token::want)) {
      --k;  // 我想把上一单退款, 我想上一单退款: who wants it, before 把 or the things
    }
    // 衬衫退掉，裤子留着: right after the things, 退 closing its clause asks for it too (not 卖家退款了,
    // nor "my tax return").
    // 订单的钱退给我: money returned to someone is no one returning.
    const bool money_back = !marked && lex.names[tokens[r - 1].name] == "MONEY" &&
                            tokens[r - 1].kind == Token::object && r + 1 < tokens.size() &&
                            tokens[r + 1].kind == Token::want;  // 给我, read by benefactive_roles
    const std::size_t after = money_back ? r + 2 : r + 1;
    const bool closes_clause =
        tokens[r].chinese_verb && (after == tokens.size() || tokens[after].kind == Token::clause_end);
    if (!(marked || closes_clause) || (k > 0 && tokens[k - 1].kind != Token::clause_end)) continue;
    const std::size_t moved = money_back ? r - 1 : r;  // the money goes with its return (money_in_its_action)
    std::rotate(tokens.begin() + static_cast<std::ptrdiff_t>(things_begin),
                tokens.begin() + static_cast<std::ptrdiff_t>(moved),
                tokens.begin() + static_cast<std::ptrdiff_t>(r + 1));
  }
}

// "Please, cancel my order" and "two adult tickets, please": a clause of
// nothing but a polite form is part of the clause it stands beside (the next
// one, or the last), so please asks for what that clause names.
void attach_lone_polite(std::vector<Token>& tokens) {
  std::size_t begin = 0;
  for (std::size_t i = 0; i <= tokens.size(); ++i) {
    if (i < tokens.size() && tokens[i].kind != Token::clause_end) continue;
    const bool lone_polite = i > begin && std::all_of(tokens.begin() + static_cast<std::ptrdiff_t>(begin),
                                                      tokens.begin() + static_cast<std::ptrdiff_t>(i),
                                                      [](const Token& t) { return t.kind == Token::polite; });
    if (lone_polite) {
      if (i < tokens.size() && !tokens[i].question_mark) {
        tokens[i].kind = Token::polite;  // joins the next clause (a second polite form says nothing more)
      } else if (begin > 0 && !tokens[begin - 1].question_mark) {
        tokens[begin - 1].kind = Token::polite;  // joins the one before
      }
    }
    begin = i + 1;
  }
}

// "The landlord pays the water bill and I pay the electricity", "I'm paying
// and my mother is the recipient": a subject of its own after "and" starts
// another clause, so who does what stays ("I pay the water bill and the
// landlord pays the electricity" differs).
void split_at_new_subject(std::vector<Token>& tokens) {
  for (std::size_t i = 0; i + 2 < tokens.size(); ++i) {
    if (tokens[i].kind == Token::coordinator && tokens[i + 1].kind == Token::subject) {
      tokens[i] = Token{Token::clause_end, 0, {}, false};
      tokens[i].soft = true;
    }
  }
}

// 先申请售后再确认收货, 先满减再用积分: a first step named as a thing (售后,
// 满减), before 再 and a verb, is the step done first; in one clause its
// name would meet the verb's things in their sections, whichever came first
// (先确认收货再申请售后). It is marked FIRST.; a first step that is a verb
// keeps the order of actions as it did.
void first_step_named_as_thing(const Lexicon& lex, std::vector<Token>& tokens) {
  std::size_t start = 0;
  for (std::size_t end = 0; end <= tokens.size(); ++end) {
    if (end < tokens.size() && tokens[end].kind != Token::clause_end) continue;
    std::size_t first = end, then = end;
    for (std::size_t i = start; i < end; ++i) {
      if (tokens[i].kind != Token::sequence) continue;
      if (first == end && lex.names[tokens[i].name] == "FIRST_OR_FOR_NOW") {
        first = i;
      } else if (first != end && lex.names[tokens[i].name] != "FIRST_OR_FOR_NOW") {
        then = i;
        break;
      }
    }
    const auto is_action = [](const Token& t) { return t.kind == Token::action; };
    const auto at = [&tokens](std::size_t i) { return tokens.begin() + static_cast<std::ptrdiff_t>(i); };
    if (then < end && std::none_of(at(first), at(then), is_action) && std::any_of(at(then), at(end), is_action)) {
      for (std::size_t i = first + 1; i < then; ++i) {
        Token& t = tokens[i];
        if (t.kind == Token::object || t.kind == Token::entity || t.kind == Token::detail) t.step_first = true;
      }
    }
    start = end + 1;
  }
}

// "外卖多放点香菜而不是多放辣", "book it for the 8th rather than move it": a
// contrast word before an action, after another action of its clause, starts
// a clause of its own, so what each action acts on stays its own (in one
// clause the coriander and the spice met in their sections, whichever was
// asked for). So does "keep" after an action and what it acts on ("cancel the
// flight but keep the hotel": join_contrasts reads what is kept as not meant).
void split_at_contrasted_action(const Lexicon& lex, std::vector<Token>& tokens) {
  const auto keep = lex.by_name.find("KEEP");
  const auto keeps = [&](std::size_t i) {
    return keep != lex.by_name.end() && tokens[i].kind == Token::action && tokens[i].name == keep->second;
  };
  const auto contrasts_action = [&](std::size_t i) {
    if (tokens[i].kind != Token::negation || !tokens[i].instead) return false;
    std::size_t next = i + 1;
    while (next < tokens.size() && tokens[next].kind == Token::detail) ++next;
    // (Not a verb's word naming a thing: "instead of my work one".)
    return next < tokens.size() && tokens[next].kind == Token::action && !tokens[next].nominal;
  };
  // Where to split: the action read before in the clause, whether it was keep, and whether a thing
  // came after it ("keep the add-on and cancel the plan" splits before cancel).
  bool action_in_clause = false, thing_after_action = false, kept = false;
  const auto splits_here = [&](std::size_t i) {
    if (tokens[i].kind == Token::clause_end) action_in_clause = thing_after_action = kept = false;
    const bool split =
        action_in_clause && (contrasts_action(i) || (tokens[i].kind == Token::action && thing_after_action &&
                                                     (keeps(i) || kept) && !tokens[i].nominal));
    if (tokens[i].kind == Token::action) {
      action_in_clause = true;
      thing_after_action = false;
      kept = keeps(i);
    }
    if (tokens[i].kind == Token::object || tokens[i].kind == Token::entity) thing_after_action = true;
    if (split) thing_after_action = false;
    return split;
  };
  bool any = false;
  for (std::size_t i = 0; i < tokens.size() && !any; ++i) any = splits_here(i);
  if (!any) return;
  std::vector<Token> out;
  out.reserve(tokens.size() + 4);
  action_in_clause = thing_after_action = kept = false;
  for (std::size_t i = 0; i < tokens.size(); ++i) {
    if (splits_here(i)) {
      if (!out.empty() && out.back().kind == Token::coordinator) out.pop_back();  // "... and keep the hotel"
      out.push_back(Token{Token::clause_end, 0, {}, false});
      out.back().soft = true;
    }
    out.push_back(std::move(tokens[i]));
  }
  tokens = std::move(out);
}

// Whether a token is a word for a sequence: then, first, before, after, next, 先, 再, 然后.
bool says_sequence(const Lexicon& lex, const Token& t) {
  if (t.kind == Token::sequence) return true;
  const std::string& name = lex.names[t.name];
  return t.kind == Token::detail && (name == "FIRST" || name == "AFTER" || name == "BEFORE" || name == "NEXT");
}

// Whether tokens [first, last) order the requests in them: money and sending,
// which depend on what was done before them (a price charged before or after
// a coupon, a parcel sent before or after its address changed), or a word for
// a sequence (then, first, before, after, next, 先, 再, 然后) with a refund, a
// return or an exchange (先退款，我再寄回商品: who goes first) or with what
// cannot be undone ("export my data, then delete my account"; "reset my
// password, then unlock my account") among them. Other steps in a sequence
// stand apart: 挂失旧卡，再补一张新卡 is 补一张新卡，把旧卡挂失.
bool orders_requests(const Lexicon& lex, const Token* first, const Token* last) {
  bool sequence = false, lasting = false;
  for (const Token* t = first; t != last; ++t) {
    const std::string& name = lex.names[t->name];
    if (t->kind == Token::action && name_in(name, {"CHARGE", "PAY", "APPLY", "SEND", "SHIP", "TRANSFER"})) return true;
    sequence = sequence || says_sequence(lex, *t);
    lasting = lasting || (t->kind == Token::object && name_in(name, {"REFUND", "RETURN", "EXCHANGE"})) ||
              (t->kind == Token::action && name_in(name, {"DELETE", "CLOSE", "RESET", "CANCEL", "CLEAR", "TOP_UP"}));
  }
  return sequence && lasting;
}

// Requests joined by "and" come in any order: "reset my password and unlock
// my account" is "unlock my account and reset my password", 取消订单和退款 is
// 退款和取消订单. A clause with two actions or more, an "and" before each
// one but the first, and no word that orders them (then, first, before,
// after, 先, 再, 然后) is cut before each such "and" into clauses of their
// own, as a comma would cut them (重置密码并解锁账号 is 解锁账号，顺便重置密码),
// and the parts are sorted by what they name. Anything that orders them
// keeps them as written, and so do requests that pay, charge, apply, send,
// ship or transfer.
void sort_requests(const Lexicon& lex, std::vector<Token>& tokens) {
  const auto opens_request = [&tokens](std::size_t i, std::size_t end) {
    // "and" then, past an auxiliary, a want or a negation, an action
    if (tokens[i].kind != Token::coordinator) return false;
    std::size_t k = i + 1;
    while (k < end && (tokens[k].kind == Token::aux || tokens[k].kind == Token::want ||
                       tokens[k].kind == Token::negation || tokens[k].kind == Token::polite)) {
      ++k;
    }
    return k < end && tokens[k].kind == Token::action;
  };
  const auto name_of = [&lex](const Token& t) {
    return t.kind == Token::entity ? "#" + t.text : std::to_string(static_cast<int>(t.kind)) + lex.names[t.name];
  };
  std::vector<Token> out;  // written clause by clause: linear however many there are
  out.reserve(tokens.size());
  std::size_t begin = 0;
  for (std::size_t i = 0; i <= tokens.size(); ++i) {
    if (i < tokens.size() && tokens[i].kind != Token::clause_end) continue;
    const std::size_t end = i;
    std::size_t actions = 0;
    const bool ordered = orders_requests(lex, tokens.data() + begin, tokens.data() + end);
    std::vector<std::size_t> cuts;  // the "and"s that open a request
    for (std::size_t k = begin; k < end; ++k) {
      actions += tokens[k].kind == Token::action ? 1 : 0;
      if (opens_request(k, end)) cuts.push_back(k);
    }
    // Each part names what it acts on: "upgrade the kids' plan and downgrade
    // mine" has no thing after downgrade, so which plan goes which way would
    // be lost; "confirm and cancel order 789" is one thing done in order. A
    // detail is one ("change my delivery date and add a note for the driver").
    bool every_part_is_a_request = true;
    for (std::size_t c = 0, from = begin; c <= cuts.size() && actions >= 2; ++c) {
      const std::size_t to = c < cuts.size() ? cuts[c] : end;
      const auto part_begin = tokens.begin() + static_cast<std::ptrdiff_t>(from);
      const auto part_end = tokens.begin() + static_cast<std::ptrdiff_t>(to);
      // And one action each: in 酒店和租车都取消 the "and" joins the hotel to the car, not two requests.
      every_part_is_a_request =
          every_part_is_a_request &&
          std::any_of(part_begin, part_end,
                      [](const Token& t) {
                        return t.kind == Token::object || t.kind == Token::entity || t.kind == Token::detail;
                      }) &&
          std::count_if(part_begin, part_end, [](const Token& t) { return t.kind == Token::action; }) == 1;
      from = to + 1;
    }
    if (actions >= 2 && actions == cuts.size() + 1 && !ordered && every_part_is_a_request) {
      // "I want to cancel my card and close my account": who asks, and how,
      // opens the clause for every part; it stays first, and the parts sort after it.
      std::size_t from = begin;
      while (from < end && (tokens[from].kind == Token::subject || tokens[from].kind == Token::want ||
                            tokens[from].kind == Token::polite || tokens[from].kind == Token::aux ||
                            tokens[from].kind == Token::greeting ||
                            (tokens[from].kind == Token::role && lex.names[tokens[from].name] == "TO" && from > begin &&
                             (tokens[from - 1].kind == Token::want || tokens[from - 1].kind == Token::subject)))) {
        ++from;
      }
      const std::size_t parts_begin = from;
      // Who asks, and how: before the first part, and again before each later one.
      const std::vector<Token> asker(tokens.begin() + static_cast<std::ptrdiff_t>(begin),
                                     tokens.begin() + static_cast<std::ptrdiff_t>(parts_begin));
      out.insert(out.end(), asker.begin(), asker.end());
      std::vector<std::pair<std::string, std::vector<Token>>> parts;
      for (std::size_t c = 0; c <= cuts.size(); ++c) {
        const std::size_t to = c < cuts.size() ? cuts[c] : end;
        std::string name;
        for (std::size_t k = from; k < to; ++k) name += name_of(tokens[k]) + " ";
        parts.emplace_back(std::move(name), std::vector<Token>(tokens.begin() + static_cast<std::ptrdiff_t>(from),
                                                               tokens.begin() + static_cast<std::ptrdiff_t>(to)));
        from = to + 1;
      }
      std::stable_sort(parts.begin(), parts.end(), [](const auto& x, const auto& y) { return x.first < y.first; });
      // Each part is a clause of its own, as it would be after a comma ("reset my password, unlock my
      // account", 重置密码，顺便把账户解锁), with who asks, and how, before each.
      for (std::size_t c = 0; c < parts.size(); ++c) {
        if (c > 0) {
          out.push_back(Token{Token::clause_end, 0, {}, false});
          out.back().soft = true;
          out.insert(out.end(), asker.begin(), asker.end());
        }
        for (Token& t : parts[c].second) out.push_back(std::move(t));
      }
    } else {
      out.insert(out.end(), tokens.begin() + static_cast<std::ptrdiff_t>(begin),
                 tokens.begin() + static_cast<std::ptrdiff_t>(end));
    }
    if (end < tokens.size()) out.push_back(std::move(tokens[end]));
    begin = i + 1;
  }
  tokens = std::move(out);
}

// Things joined by "and" under one action come in any order: "cancel the
// parking pass and the concert tickets" is "cancel the concert tickets and the
// parking pass", 加一份米饭和一瓶可乐 is 加一瓶可乐和一份米饭. A conjunct is a
// run of objects and entities after the details that describe it; runs
// joined by coordinators are sorted by what they name. When every run opens
// with the same details they stay details ("a new SIM and a new charger" is
// "a new charger and a new SIM"); otherwise a run's details go into its first
// thing's name, since the key keeps details apart from things ("the large
// pizza and the drink": LARGE.PIZZA+DRINK, not "the pizza and the large
// drink"). Nothing else moves: actions keep their order (a sequence), and
// runs with a role or a negation before the first or after the last stay as
// they are ("from the twin and the king room", "X and Y not").
void sort_conjuncts(const Lexicon& lex, std::vector<Token>& tokens) {
  if (std::none_of(tokens.begin(), tokens.end(), [](const Token& t) { return t.kind == Token::coordinator; })) return;
  const auto is_thing = [](const Token& t) { return t.kind == Token::object || t.kind == Token::entity; };
  const auto text_of = [&lex](const Token& t) { return t.kind == Token::entity ? "#" + t.text : lex.names[t.name]; };
  // The end of the details from `at` when a thing follows them, else `at`.
  const auto after_details = [&](std::size_t at) {
    std::size_t end = at;
    while (end < tokens.size() && tokens[end].kind == Token::detail) ++end;
    return end < tokens.size() && is_thing(tokens[end]) ? end : at;
  };
  const auto details_of = [&](std::size_t begin) {
    std::string names;
    for (std::size_t k = begin; k < after_details(begin); ++k) names += lex.names[tokens[k].name] + ".";
    return names;
  };
  // Read from tokens, written to out: linear however many groups there are.
  std::vector<Token> out;
  out.reserve(tokens.size());
  const auto copy = [&](std::size_t from, std::size_t to) {
    for (std::size_t k = from; k < to; ++k) out.push_back(tokens[k]);
  };
  for (std::size_t i = 0; i < tokens.size();) {
    if (i > 0 && tokens[i - 1].kind == Token::negation) {
      copy(i, i + 1);
      ++i;
      continue;
    }
    if (!is_thing(tokens[after_details(i)])) {
      // Past a run of details with no thing after it at once (each one would find the same).
      std::size_t next = i + 1;
      if (tokens[i].kind == Token::detail) {
        while (next < tokens.size() && tokens[next].kind == Token::detail) ++next;
        if (next < tokens.size() && is_thing(tokens[next])) next = i + 1;  // a later start of the run does
      }
      copy(i, next);
      i = next;
      continue;
    }
    // Runs [begin, end) joined by single coordinators, from i: details, then things.
    std::vector<std::pair<std::size_t, std::size_t>> runs;
    for (std::size_t at = i;;) {
      std::size_t end = after_details(at);
      while (end < tokens.size() && is_thing(tokens[end])) ++end;
      runs.emplace_back(at, end);
      if (end + 1 >= tokens.size() || tokens[end].kind != Token::coordinator ||
          !is_thing(tokens[after_details(end + 1)])) {
        break;
      }
      at = end + 1;
    }
    const std::size_t group_end = runs.back().second;
    const bool followed_by_negation = group_end < tokens.size() && (tokens[group_end].kind == Token::negation_after ||
                                                                    tokens[group_end].kind == Token::negation);
    // Behind a role, only a plain list the role alone governs ("from texts and emails"): in "the tip to the
    // restaurant and the fee to me" each thing has its own role after it.
    const bool behind_role = i > 0 && tokens[i - 1].kind == Token::role;
    std::size_t after_group = group_end;
    while (after_group < tokens.size() && tokens[after_group].kind == Token::detail) ++after_group;
    const bool plain_list =
        std::all_of(runs.begin(), runs.end(), [](const auto& r) { return r.second == r.first + 1; }) &&
        (after_group == tokens.size() || tokens[after_group].kind != Token::role);
    if (behind_role && !plain_list) {  // the thing the role names stays first; a list may start after it
      copy(i, i + 1);
      ++i;
      continue;
    }
    if (runs.size() < 2 || followed_by_negation) {
      copy(i, group_end);
      i = group_end;
      continue;
    }
    // What one run alone says of its things may be said of them all. A place after a preposition that
    // ends the last run ("a checkup and a cleaning at the dentist"), or the thing after 的 in the last run
    // (车险和家财险的地址: the address of both), stays after the sorted runs; what owns the first run's thing
    // before 的 (账户上的姓名和身份证号: the account's name and id number) stays before them. Said in more than
    // one run, each run keeps its own ("the invoice for order 1 and the receipt for order 2").
    const auto first_in_run = [&](const auto& r, auto&& is_mark) {
      for (std::size_t k = after_details(r.first) + 1; k < r.second; ++k) {
        if (is_mark(tokens[k - 1], tokens[k])) return k;
      }
      return r.second;
    };
    const auto is_place = [](const Token& t) { return t.kind == Token::object && t.after_preposition; };
    const auto place = [&](const Token&, const Token& t) { return is_place(t); };
    const auto after_de = [](const Token& before, const Token&) { return before.modifies; };
    const auto marked_in = [&](auto begin, auto end, auto&& is_mark) {
      return std::any_of(begin, end, [&](const auto& r) { return first_in_run(r, is_mark) < r.second; });
    };
    std::size_t shared_begin = group_end, owner_end = runs[0].first;
    // (A place anywhere in an earlier run, its first thing too: "put us in row 5 and the kids in row 20".)
    const auto has_place = [&](const auto& r) {
      return std::any_of(tokens.begin() + static_cast<std::ptrdiff_t>(r.first),
                         tokens.begin() + static_cast<std::ptrdiff_t>(r.second), is_place);
    };
    if (std::none_of(runs.begin(), runs.end() - 1, has_place)) shared_begin = first_in_run(runs.back(), place);
    if (shared_begin == group_end && !marked_in(runs.begin(), runs.end() - 1, after_de)) {
      shared_begin = first_in_run(runs.back(), after_de);
    }
    if (!marked_in(runs.begin() + 1, runs.end(), after_de) && first_in_run(runs[0], after_de) < runs[0].second) {
      owner_end = first_in_run(runs[0], after_de);
    }
    runs.back().second = shared_begin;
    copy(runs[0].first, owner_end);
    runs[0].first = owner_end;
    const std::string first_details = details_of(runs[0].first);
    const bool same_details =
        std::all_of(runs.begin(), runs.end(), [&](const auto& r) { return details_of(r.first) == first_details; });
    std::vector<std::pair<std::string, std::vector<Token>>> conjuncts;
    for (const auto& [b, e] : runs) {
      const std::size_t first = after_details(b);
      std::vector<Token> run(tokens.begin() + static_cast<std::ptrdiff_t>(same_details ? b : first),
                             tokens.begin() + static_cast<std::ptrdiff_t>(e));
      std::string name;
      if (!same_details) name = run[0].described = details_of(b);
      for (std::size_t k = first; k < e; ++k) name += text_of(tokens[k]) + " ";
      conjuncts.emplace_back(std::move(name), std::move(run));
    }
    std::stable_sort(conjuncts.begin(), conjuncts.end(),
                     [](const auto& x, const auto& y) { return x.first < y.first; });
    // Runs whose details went into their things are shorter than what they replace.
    for (std::size_t c = 0; c < conjuncts.size(); ++c) {
      for (Token& t : conjuncts[c].second) out.push_back(std::move(t));
      if (c + 1 < conjuncts.size()) out.push_back(Token{Token::coordinator, 0, {}, false});
    }
    copy(shared_begin, group_end);
    i = group_end;
  }
  tokens = std::move(out);
}

// The action a reported one names ("CANCEL" for CANCEL_DONE), or empty.
std::string_view reported_action(const Element& a) {
  const std::string_view text(a.text);
  return a.past && text.ends_with("_DONE") ? text.substr(0, text.size() - 5) : std::string_view();
}

// Whether keeping a thing is what not doing `action` to it means ("keep my
// address, don't delete it"): an action that ends, removes or changes it.
bool keeping_undoes(std::string_view action) {
  return reverse_of(action) != nullptr ||
         name_in(action, {"END", "DOWNGRADE", "CHANGE", "RETURN", "UNSUBSCRIBE", "UPGRADE", "SPLIT", "MERGE"});
}

// "酒店不住了，帮我退订", "I can't make tomorrow's appointment, please cancel":
// what is given up (no longer wanted, 不...了, or what cannot be used), beside
// a request only to end something, is what it ends, not an option set aside
// ("not the hotel, cancel it" still is): whether a clause gives up its things,
bool gives_up(const Clause& c) {
  if (c.negated) return true;
  bool any = false;
  for (const auto* list : {&c.objects, &c.entities, &c.details}) {
    for (const Element& e : *list) {
      if (e.negated && !e.given_up) return false;
      any = any || e.given_up;
    }
  }
  return any;
}

// and whether one asks only to end something, naming nothing.
bool only_ends(const Clause& c) {
  return c.mood.empty() && !c.negated && c.objects.empty() && c.entities.empty() && c.details.empty() &&
         !c.actions.empty() && std::all_of(c.actions.begin(), c.actions.end(), [](const Element& a) {
           return !a.negated && !a.past &&
                  name_in(a.text,
                          {"CANCEL", "UNSUBSCRIBE", "END", "DELETE", "CLOSE", "DISABLE", "PAUSE", "RETURN", "REFUND"});
         });
}

// A clause of actions alone acts on what the clause beside it names: "my
// account is locked, please unlock it" is "unlock my account", "my card was
// stolen, please report it" "report my card stolen", 收货地址请保留，不要删
// 别删我的收货地址. The clause beside it names things and asks nothing of its
// own: no action, or
// one it asked about (QUERY), or what was done that the request reverses
// (LOCK_DONE, then UNLOCK), or "keep" beside a "don't". Anything else stays
// two clauses: "my order has shipped, cancel it" is not "cancel my order".
void resolve_bare_actions(const Lexicon& lex, std::uint32_t query, const std::vector<Token>& tokens,
                          std::vector<Clause>& clauses) {
  // "先寄新的，再退旧的": clauses in a sequence are each their own request.
  const bool sequence =
      std::any_of(tokens.begin(), tokens.end(), [&lex](const Token& t) { return says_sequence(lex, t); });
  if (sequence || clauses.size() < 2) return;
  const auto acts_alone = [&](const Clause& c) {
    return c.objects.empty() && c.entities.empty() && !c.negated && !c.interleaved &&
           std::any_of(c.actions.begin(), c.actions.end(),
                       [&](const Element& a) { return a.text != lex.names[query]; });
  };
  const auto names_things = [](const Clause& c) {
    return (!c.objects.empty() || !c.entities.empty()) && !c.interleaved && !c.negated && !c.fine && c.mood.empty();
  };
  // Whether `with`'s actions all give way to `request`'s: what the request
  // asks is all that is asked.
  const auto gives_way = [&](const Clause& with, const Clause& request) {
    const bool request_negated = std::any_of(request.actions.begin(), request.actions.end(), is_negated);
    // What the request asks, looked up once per action beside it (linear however many there are).
    std::unordered_set<std::string_view> asked;
    for (const Element& r : request.actions) {
      if (!r.negated) asked.insert(r.text);
    }
    const bool keeping_undone = std::all_of(request.actions.begin(), request.actions.end(),
                                            [](const Element& r) { return !r.negated || keeping_undoes(r.text); });
    return std::all_of(with.actions.begin(), with.actions.end(), [&](const Element& a) {
      if (a.negated) return false;
      if (a.text == lex.names[query]) return true;
      // 订单8830不要了，麻烦取消, 密码忘了，帮我重置: the same action asked again, with nothing of its
      // own, asks what was asked ("I pay the excess" beside "my employer pays the premium" says more).
      if (asked.count(a.text) > 0 && request.details.empty()) return true;
      // "keep my address, don't delete it"; not "keep my plan, I don't want to wait".
      if (a.text == "KEEP") return request_negated && keeping_undone;
      const std::string_view done = reported_action(a);
      if (done.empty()) return false;
      const char* reverse = reverse_of(done);
      return asked.count("UNDO") > 0 || (reverse != nullptr && asked.count(reverse) > 0);
    });
  };
  // The clause of actions alone comes after what it acts on ("..., please
  // unlock it"), or before it when it says what not to do ("don't replace
  // it, just refund me"); one that asks before it ("no thanks on the upgrade,
  // email my statements") is a request of its own.
  const auto all_negated = [](const Clause& c) { return std::all_of(c.actions.begin(), c.actions.end(), is_negated); };
  // The request takes what the named clause names, in its place (a new list:
  // linear however many clauses). An undo there undoes what was reported:
  // "my order was cancelled, undo it" reinstates the order (RESUME), as
  // "undo the cancellation" does; it is not "undo my order".
  const auto take_things = [](Clause& request, Clause& named) {
    if (only_ends(request) && gives_up(named)) {
      for (auto* list : {&named.objects, &named.entities, &named.details}) {
        for (Element& e : *list) e.negated = false;
      }
    }
    for (Element& r : request.actions) {
      if (r.negated || r.text != "UNDO") continue;
      for (const Element& a : named.actions) {
        if (const char* reverse = reverse_of(reported_action(a))) {
          r.text = reverse;
          break;
        }
      }
    }
    request.objects = std::move(named.objects);
    request.entities = std::move(named.entities);
    std::move(request.details.begin(), request.details.end(), std::back_inserter(named.details));
    request.details = std::move(named.details);
  };
  // 我要的是中号披萨，你们送来的是大号: details on both sides describe two
  // things (what was asked for, what came), not one thing acted on.
  const auto describes_another = [](const Clause& request, const Clause& named) {
    return !request.details.empty() && !named.details.empty() && named.actions.empty();
  };
  std::vector<Clause> resolved;
  resolved.reserve(clauses.size());
  for (std::size_t i = 0; i < clauses.size(); ++i) {
    Clause& c = clauses[i];
    if (!resolved.empty() && acts_alone(c) && names_things(resolved.back()) && gives_way(resolved.back(), c) &&
        !describes_another(c, resolved.back())) {
      take_things(c, resolved.back());
      resolved.back() = std::move(c);
    } else if (i == 1 && acts_alone(resolved[0]) && all_negated(resolved[0]) && names_things(c) &&
               gives_way(c, resolved[0])) {
      take_things(resolved[0], c);
    } else {
      resolved.push_back(std::move(c));
    }
  }
  clauses = std::move(resolved);
}

// A clause that is nothing but what is not meant ("contact me on my mobile,
// not my landline", "instead of a callback, email me") says which of the
// things beside it is asked for: its things join the request next to it (the
// one before, or for the first clause the one after), as "call my mobile
// rather than my landline" has them in one clause. And in any clause the
// things not meant come after the ones meant ("email me instead of calling"
// is "instead of calling, email me"); each keeps its negation, so "X, not Y"
// still differs from "Y, not X".
void join_contrasts(std::vector<Clause>& clauses) {
  // Things all negated ("not my landline"), or a negation after them that
  // governs nothing else (二月的不要), and no action of its own: none, or the
  // QUERY its details alone gave it ("not the vegan one").
  const auto bare_contrast = [](const Clause& c) {
    const bool acts = !c.actions.empty() && !(c.states && c.actions.size() == 1);
    if (!c.mood.empty() || c.interleaved || acts || c.objects.size() + c.entities.size() + c.details.size() == 0) {
      return false;
    }
    // Details alone about someone ("I'm not happy") state something; they name no alternative.
    if (c.objects.empty() && c.entities.empty() && c.about_someone) return false;
    bool all_negated = true, none_negated = true;
    for (const auto* list : {&c.objects, &c.entities, &c.details}) {
      all_negated = all_negated && std::all_of(list->begin(), list->end(), is_negated);
      none_negated = none_negated && std::none_of(list->begin(), list->end(), is_negated);
    }
    return c.negated ? none_negated : all_negated;
  };
  // Its parts, each not meant, into the clause it joins.
  const auto join = [](Clause& contrast, Clause& host) {
    for (auto [from, to] : {std::pair{&contrast.objects, &host.objects}, std::pair{&contrast.entities, &host.entities},
                            std::pair{&contrast.details, &host.details}}) {
      for (Element& e : *from) {
        e.negated = true;
        to->push_back(std::move(e));
      }
    }
  };
  // "the modem is fine" beside another request or report says which thing it
  // is not about ("the modem is broken, the router is fine" is "the modem is
  // broken, not the router"). Beside a negation it accepts instead ("no need
  // to call me back, email is fine"; "a voucher is fine, I don't need a
  // refund"), and stays what it was.
  const auto says_no = [](const Clause& c) {
    return c.negated || std::any_of(c.actions.begin(), c.actions.end(), is_negated) ||
           std::any_of(c.objects.begin(), c.objects.end(), is_negated) ||
           std::any_of(c.entities.begin(), c.entities.end(), is_negated);
  };
  // "cancel the flight, keep the hotel" is "cancel the flight, not the hotel": what is kept, beside a request
  // to end, remove or change something, is what that request is not about.
  const auto removes = [](const Clause& c) {
    if (!c.mood.empty()) return false;
    // 退机票, 退M码那件: 退 names its verb, and what it acts on is beside it.
    const bool returns_thing = c.actions.empty() && c.objects.size() + c.entities.size() + c.details.size() >= 2 &&
                               std::any_of(c.objects.begin(), c.objects.end(), [](const Element& o) {
                                 return !o.negated && (o.text == "RETURN" || o.text == "REFUND");
                               });
    return returns_thing || std::any_of(c.actions.begin(), c.actions.end(), [](const Element& a) {
             return !a.negated && !a.past && (keeping_undoes(a.text) || a.text == "REFUND");
           });
  };
  const auto only_keeps = [](const Clause& c) {
    return c.mood.empty() && !c.negated && !c.interleaved && c.actions.size() == 1 && c.actions[0].text == "KEEP" &&
           !c.actions[0].negated && !c.actions[0].past && c.objects.size() + c.entities.size() + c.details.size() > 0 &&
           std::none_of(c.objects.begin(), c.objects.end(), is_negated) &&
           std::none_of(c.entities.begin(), c.entities.end(), is_negated) &&
           std::none_of(c.details.begin(), c.details.end(), is_negated);
  };
  if (clauses.size() >= 2 && std::any_of(clauses.begin(), clauses.end(), removes)) {
    for (Clause& c : clauses) {
      if (!only_keeps(c)) continue;
      c.actions.clear();
      for (auto* list : {&c.objects, &c.entities, &c.details}) {
        for (Element& e : *list) e.negated = true;
      }
    }
  }
  const bool fine_is_contrast = clauses.size() >= 2 && std::none_of(clauses.begin(), clauses.end(), says_no) &&
                                std::any_of(clauses.begin(), clauses.end(), [](const Clause& c) { return !c.fine; });
  for (Clause& c : clauses) {
    if (c.fine && fine_is_contrast) c.negated = true;
  }
  // What is given up, beside a request only to end something, is what it ends (gives_up).
  const auto join_into = [&](Clause& contrast, Clause& host) {
    if (!(gives_up(contrast) && only_ends(host))) {
      join(contrast, host);
      return;
    }
    for (auto [from, to] : {std::pair{&contrast.objects, &host.objects}, std::pair{&contrast.entities, &host.entities},
                            std::pair{&contrast.details, &host.details}}) {
      for (Element& e : *from) {
        e.negated = false;
        to->push_back(std::move(e));
      }
    }
  };
  std::vector<Clause> joined;
  joined.reserve(clauses.size());
  std::vector<Clause> waiting;  // bare contrasts before the first request
  for (Clause& c : clauses) {
    if (bare_contrast(c)) {
      if (!joined.empty() && !joined.back().interleaved) {
        join_into(c, joined.back());
      } else {
        waiting.push_back(std::move(c));
      }
      continue;
    }
    if (!waiting.empty() && joined.empty() && !c.interleaved) {
      for (Clause& w : waiting) join_into(w, c);
      waiting.clear();
    }
    std::move(waiting.begin(), waiting.end(), std::back_inserter(joined));
    waiting.clear();
    joined.push_back(std::move(c));
  }
  std::move(waiting.begin(), waiting.end(), std::back_inserter(joined));
  for (Clause& c : joined) {
    // (With a but, each side's things are its own: "the order said no onions but it came with onions".)
    if (c.interleaved || c.turns) continue;
    const auto meant = [](const Element& e) { return !e.negated; };
    std::stable_partition(c.objects.begin(), c.objects.end(), meant);
    std::stable_partition(c.entities.begin(), c.entities.end(), meant);
    std::stable_partition(c.details.begin(), c.details.end(), meant);
  }
  clauses = std::move(joined);
}

// A request beside the one it replaces, in a clause of its own, says what
// "X, not Y" says in one: 寄到公司，别寄家里 is 寄到公司，不是家里 (the same
// action: the refused clause's things are the ones not meant), "downgrade my
// plan, don't upgrade it" is "downgrade my plan rather than upgrade it"
// (another action: it is the one not meant, and the things, named in one
// clause only, are both's). Not when both name things of their own ("don't
// cancel my order, refund my subscription" keeps which goes with which), nor
// beside what cannot be done or was done ("I can't wait, cancel my order").
void merge_refused_alternative(std::vector<Clause>& clauses) {
  if (clauses.size() != 2) return;
  const auto plain = [](const Clause& c) {
    return c.mood.empty() && !c.negated && !c.interleaved && !c.states && !c.actions.empty() &&
           std::none_of(c.objects.begin(), c.objects.end(), is_negated) &&
           std::none_of(c.entities.begin(), c.entities.end(), is_negated) &&
           std::none_of(c.details.begin(), c.details.end(), is_negated);
  };
  const auto refused = [&plain](const Clause& c) {
    return plain(c) && c.actions.size() == 1 && c.actions[0].negated && !c.actions[0].past && !c.actions[0].unable;
  };
  const auto asked = [&plain](const Clause& c) {
    return plain(c) &&
           std::none_of(c.actions.begin(), c.actions.end(), [](const Element& a) { return a.negated || a.past; });
  };
  const bool first_refused = refused(clauses[0]) && asked(clauses[1]);
  if (!first_refused && !(refused(clauses[1]) && asked(clauses[0]))) return;
  Clause& no = clauses[first_refused ? 0 : 1];
  Clause& yes = clauses[first_refused ? 1 : 0];
  const auto things = [](const Clause& c) { return c.objects.size() + c.entities.size() + c.details.size(); };
  const bool same_action = yes.actions.size() == 1 && yes.actions[0].text == no.actions[0].text;
  if (same_action ? things(no) == 0 : (things(no) > 0 && things(yes) > 0)) return;
  if (!same_action) yes.actions.push_back(std::move(no.actions[0]));
  for (auto [from, to] : {std::pair{&no.objects, &yes.objects}, std::pair{&no.entities, &yes.entities},
                          std::pair{&no.details, &yes.details}}) {
    for (Element& e : *from) {
      e.negated = same_action;
      to->push_back(std::move(e));
    }
  }
  Clause merged = std::move(yes);
  clauses.assign(1, std::move(merged));
}

// "Can you check?", "please look it up", 帮忙看看, "where is it?" beside
// one other clause asks about what that clause says: things named alone
// ("my order number is 55120, where is it") are what is asked about ("where
// is order 55120"); beside a request or a report, the check asks nothing
// more ("my refund hasn't arrived, can you check?"). Not a check refused:
// "not checking" may name an account ("the savings account was overcharged,
// not checking"). A check alone says too little to be served.
void join_bare_check(std::vector<Clause>& clauses) {
  if (clauses.size() != 2) return;
  const auto bare_check = [](const Clause& c) {
    return c.mood.empty() && c.actions.size() == 1 && c.actions[0].text == "QUERY" && !c.actions[0].negated &&
           c.objects.empty() && c.entities.empty() && c.details.empty();
  };
  const std::size_t check = bare_check(clauses[0]) ? 0 : bare_check(clauses[1]) ? 1 : 2;
  if (check == 2) return;
  Clause& other = clauses[1 - check];
  if (other.actions.empty()) other.actions.push_back(clauses[check].actions[0]);
  clauses.erase(clauses.begin() + static_cast<std::ptrdiff_t>(check));
}

// A problem reported beside a request, in a clause of its own, describes
// what the request acts on, as a detail of its thing would: "block my credit
// card, it's been lost" is "I lost my credit card, please block it", 挂失银行卡，
// 卡不见了 is 我银行卡丢了，帮我挂失. Only a report (problem_said_is_reported)
// of nothing but the request's own things, beside one clause that acts on
// them ("my card was cancelled, it was stolen" is "my stolen card was
// cancelled"); not beside a but or in a sequence, where each keeps its own.
void join_reported_problem(std::vector<Clause>& clauses) {
  if (clauses.size() != 2) return;
  const auto plain = [](const Clause& c) { return !c.turns && !c.sequenced; };
  // (An entity of its own, "card 4821 was stolen", is no detail of the request's thing.)
  const auto reported = [&plain](const Clause& c, const Clause& request) {
    return plain(c) && c.actions.size() == 1 && c.actions[0].text == "REPORT" && c.entities.empty() &&
           std::all_of(c.objects.begin(), c.objects.end(), [&request](const Element& o) {
             return std::any_of(request.objects.begin(), request.objects.end(),
                                [&o](const Element& r) { return r.text == o.text; });
           });
  };
  const auto requests = [&plain](const Clause& c) { return plain(c) && !c.states && !c.actions.empty(); };
  std::size_t report = 2;
  if (reported(clauses[1], clauses[0]) && requests(clauses[0])) report = 1;
  if (reported(clauses[0], clauses[1]) && requests(clauses[1])) report = 0;
  if (report == 2) return;
  Clause& request = clauses[1 - report];
  for (Element& d : clauses[report].details) request.details.push_back(std::move(d));
  clauses.erase(clauses.begin() + static_cast<std::ptrdiff_t>(report));
}

// A clause of nothing but a span, a date, a count or an id ("it's been 10
// days", 都10天了, "two nights") beside one other clause says when, how long
// or how many for that clause: 都10天了，退款还没收到 is 退款十天了还没到账. Its
// things join the other clause where they were written (before or after its
// own), so which of two dates came first stays.
void join_lone_entities(std::vector<Clause>& clauses) {
  if (clauses.size() != 2) return;
  // (What is not meant, "not the 14th", joined its request before: join_contrasts.)
  const auto lone = [](const Clause& c) {
    return c.mood.empty() && c.actions.empty() && c.objects.empty() && !c.entities.empty();
  };
  const std::size_t at = lone(clauses[0]) ? 0 : lone(clauses[1]) ? 1 : 2;
  if (at == 2 || lone(clauses[1 - at]) || clauses[1 - at].actions.empty()) return;
  Clause& into = clauses[1 - at];
  for (auto [from, to] :
       {std::pair{&clauses[at].entities, &into.entities}, std::pair{&clauses[at].details, &into.details}}) {
    to->insert(at == 0 ? to->begin() : to->end(), std::make_move_iterator(from->begin()),
               std::make_move_iterator(from->end()));
  }
  clauses.erase(clauses.begin() + static_cast<std::ptrdiff_t>(at));
}

// Requests in clauses of their own come in any order, as requests joined by
// "and" do: 周六的配送取消，周日的保留 is 周日的保留，周六的配送取消, "return the
// shirt, keep the trousers" is "keep the trousers, return the shirt". Each
// clause keeps what it says (its negation, its things), so "X, not Y" stays
// apart from "Y, not X". Clauses stay as written when anything orders them
// (orders_requests: "apply the coupon, then charge my card") or when one is a
// bare negation ("no, cancel it" answers what came before). Returns each
// clause's text (Clause::render) in the key's order, clauses in that order.
std::vector<std::string> sort_clauses(const Lexicon& lex, const std::vector<Token>& tokens,
                                      std::vector<Clause>& clauses) {
  std::vector<std::pair<std::string, Clause>> rendered;
  for (Clause& c : clauses) {
    std::string text;
    c.render(text);
    rendered.emplace_back(std::move(text), std::move(c));
  }
  const bool ordered = orders_requests(lex, tokens.data(), tokens.data() + tokens.size()) ||
                       std::any_of(rendered.begin(), rendered.end(), [](const auto& r) {
                         const Clause& c = r.second;
                         return c.negated && c.actions.empty() && c.objects.empty() && c.entities.empty();
                       });
  if (!ordered) {
    std::stable_sort(rendered.begin(), rendered.end(), [](const auto& x, const auto& y) { return x.first < y.first; });
  }
  std::vector<std::string> texts;
  clauses.clear();
  for (auto& [text, c] : rendered) {
    texts.push_back(std::move(text));
    clauses.push_back(std::move(c));
  }
  return texts;
}

}  // namespace

Status KeyRules::build(std::string_view norm, SuffixKey& key) const {
  std::vector<std::string_view> units;
  split_units(norm, units);
  std::vector<PatternMatch> matches;
  find_pattern_matches(patterns, norm, units, matches);
  std::vector<Token> tokens;
  Tokenizer(lexicon, norm).run(units, matches, tokens);
  speaker_plays_a_role(lexicon, tokens);
  separated_off(lexicon, tokens);
  when_as_conjunction(tokens);
  benefactive_roles(lexicon, tokens);
  done_by_who_opens_the_clause(lexicon, tokens);
  tag_question(tokens);
  negated_yes_no_question(lexicon, tokens);
  merge_dates(lexicon, tokens);
  part_of_day_clock(lexicon, tokens);
  a_not_a_questions(lexicon, tokens);
  drop_articles(tokens);
  drop_sides_without_thing(tokens);
  dao_after_verb(lexicon, tokens);
  from_before_to(lexicon, tokens);
  ending_as_last_digits(lexicon, tokens);
  return_of_what_is_named_first(lexicon, tokens);
  attach_lone_polite(tokens);
  split_at_new_subject(tokens);
  split_at_contrasted_action(lexicon, tokens);
  first_step_named_as_thing(lexicon, tokens);
  sort_requests(lexicon, tokens);
  sort_conjuncts(lexicon, tokens);

  const Token* unknown = nullptr;
  bool any_greeting = false;
  std::uint32_t greeting = 0;  // the last one
  for (const Token& t : tokens) {
    if (t.kind == Token::unknown && unknown == nullptr) unknown = &t;
    if (t.kind == Token::greeting) {
      any_greeting = true;
      greeting = t.name;
    }
  }
  // A clause a rule split off (before, after) asks when the text's clause
  // around it asks: 我可以换回之前那个邮箱吗 asks whether, as a whole.
  bool asked_later = false;
  for (std::size_t i = tokens.size(); i-- > 0;) {
    Token& t = tokens[i];
    if (t.kind == Token::clause_end && !t.soft) asked_later = t.question_mark;
    if (t.kind == Token::question && lexicon.names[t.name] == "QMARK") asked_later = true;
    if (t.kind == Token::clause_end && t.soft) t.question_mark = asked_later;
  }
  std::vector<Clause> clauses;
  std::size_t start = 0;
  bool polite_earlier = false;  // a polite form in an earlier clause ("could you ..., not ...?")
  for (std::size_t i = 0; i <= tokens.size(); ++i) {
    if (i < tokens.size() && tokens[i].kind != Token::clause_end) continue;
    const bool question_mark = i < tokens.size() && tokens[i].question_mark;
    Clause c = make_clause(lexicon, query, tokens.data() + start, tokens.data() + i, question_mark, polite_earlier);
    c.question_mark = question_mark;
    c.sequenced = std::any_of(tokens.data() + start, tokens.data() + i,
                              [this](const Token& t) { return says_sequence(lexicon, t); });
    c.coordinated = std::any_of(tokens.data() + start, tokens.data() + i,
                                [](const Token& t) { return t.kind == Token::coordinator; });
    c.turns =
        std::any_of(tokens.data() + start, tokens.data() + i, [](const Token& t) { return t.kind == Token::turn; });
    polite_earlier = polite_earlier || std::any_of(tokens.data() + start, tokens.data() + i,
                                                   [](const Token& t) { return t.kind == Token::polite; });
    if (!c.empty()) clauses.push_back(std::move(c));
    start = i + 1;
  }

  resolve_bare_actions(lexicon, query, tokens, clauses);
  join_contrasts(clauses);
  merge_refused_alternative(clauses);
  for (Clause& c : clauses) reword_clause(c);
  join_reported_problem(clauses);
  join_bare_check(clauses);
  join_lone_entities(clauses);
  SuffixKey k;
  for (const std::string& text : sort_clauses(lexicon, tokens, clauses)) {
    if (!k.key.empty()) k.key.push_back('|');
    k.key += text;
  }
  for (const Clause& c : clauses) {
    for (const Element& a : c.actions) {
      if (!k.action.empty()) k.action.push_back('+');
      k.action += a.shown();
    }
    for (const Element& e : c.entities) {
      if (!k.entity.empty()) k.entity.push_back('+');
      k.entity += e.shown();
    }
    for (const Element& o : c.objects) {
      if (k.object.empty() && !o.negated) k.object = o.text;
    }
    for (const Element& d : c.details) k.details.push_back(d.shown());
  }
  std::sort(k.details.begin(), k.details.end());
  k.details.erase(std::unique(k.details.begin(), k.details.end()), k.details.end());

  if (unknown != nullptr) {
    k.low_information = true;
    k.abstain_reason = unknown->denies_saying ? std::string("a denial of what was said")
                                              : fmt::format("unknown word \"{}\"", unknown->text);
  } else if (clauses.empty() || (any_greeting && std::all_of(clauses.begin(), clauses.end(),
                                                             [](const Clause& c) { return c.says_nothing(); }))) {
    if (!any_greeting) return invalid_argument("no content");
    k.key = lexicon.names[greeting];
    k.low_information = true;
    k.abstain_reason = "a greeting or thanks only";
  } else if (std::none_of(clauses.begin(), clauses.end(), [](const Clause& c) { return c.says_enough(); })) {
    k.low_information = true;
    k.abstain_reason = "no clause has an action with an object or an entity";
  } else if (std::all_of(clauses.begin(), clauses.end(),
                         [](const Clause& c) { return c.conditional && c.mood.empty() && !c.question_mark; })) {
    // "if you cancel my order I'll be upset", "if you cancel my order, I'll
    // leave": what follows the condition is lost, and it is what was said.
    k.low_information = true;
    k.abstain_reason = "a condition and nothing asked on it";
  }
  if (k.key.size() > kMaxKeyBytes) {
    // As long as a host key may be, at most: a longer one names no request people repeat.
    k.low_information = true;
    k.abstain_reason = fmt::format("a key longer than {} bytes", kMaxKeyBytes);
    k.key.clear();
    k.entity.clear();
  }
  if (k.key.empty()) k.key = "LOW_INFO";
  k.fingerprint = key_fingerprint(k.key);
  // Level 2 looks for a snapshot within the group, so the group is the whole
  // meaning, details included: without them "a window seat" met "an aisle
  // seat", Friday met Saturday and "to Tuesday, not Wednesday" its reverse
  // (33 must-differ pairs of the third tuning set, rules v4 and v5). A host
  // that knows which keys may share a snapshot names a group of its own
  // (SuffixKeyer::from_host_key).
  k.group = k.fingerprint;
  key = std::move(k);
  return Status::success();
}

}  // namespace clm::store_detail
