// lib/store/key_clause.hpp: one clause of a suffix key as the key rules read
// it (key_rules.cpp), and the rewording that makes one request said in other
// words one clause (clause_words.cpp). Internal to lib/store.
//
//   Clause c;                        // made by key_rules.cpp from its tokens
//   c.actions = {{"SEND"}};          // "send me a new debit card"
//   c.objects = {{"DEBIT_CARD"}};
//   c.details = {{"NEW"}};
//   reword_clause(c);                // the replacement asked for
//   std::string key;
//   c.render(key);                   // "EXCHANGE-DEBIT_CARD"
#pragma once

#include <algorithm>
#include <cstddef>
#include <initializer_list>
#include <string>
#include <string_view>
#include <vector>

namespace clm::store_detail {

// Whether a name is one of `names`: the short lists of names a rule reads
// ("CANCEL", "END", ...).
inline bool name_in(std::string_view text, std::initializer_list<std::string_view> names) {
  return std::find(names.begin(), names.end(), text) != names.end();
}

// Whether a thing is someone (妈妈, "my son", the landlord, a driver, a pet):
// who does what to whom is in the order two of them are named, and what is
// theirs is not what is the speaker's ("my neighbor's parcel").
inline bool is_person_name(std::string_view text) {
  return name_in(
      text,
      {"MOTHER",  "FATHER",   "PARENTS", "GRANDMOTHER", "GRANDFATHER", "WIFE",   "HUSBAND", "GIRLFRIEND", "BOYFRIEND",
       "SISTER",  "BROTHER",  "SON",     "DAUGHTER",    "CHILD",       "FRIEND", "FAMILY",  "TEACHER",    "COLLEAGUE",
       "BOSS",    "LANDLORD", "TENANT",  "NEIGHBOR",    "DRIVER",      "STORE",  "BUYER",   "CUSTOMER",   "SELF",
       "PARTNER", "AGENT",    "DOCTOR",  "ACCOUNTANT",  "ROOMMATE",    "BABY",   "PET",     "DOG",        "CAT"});
}

struct Element {
  std::string text;  // a name, or an entity's text, after its role: "FROM.MONTHLY"
  bool negated = false;
  bool past = false;        // an action reported, not asked for
  bool context = false;     // the account a request is about, after what it acts on ("the card on my account")
  bool to_speaker = false;  // "to me": kept only beside another destination
  bool commands = false;    // object: a verb named as a thing, opening its clause ("return my tax file")
  bool nominal = false;     // an action named as a thing ("the cancellation"): undoing it reverses it
  bool unable = false;      // negated as what cannot be done ("I can't cancel my order"), not as what must not
  bool given_up = false;    // negated as what cannot be used or is not wanted ("I can't make my appointment")
  bool asked = false;       // detail: a question word's ("when": TIME), what the clause asks for
  bool what_it_is = false;  // detail: AMOUNT from 是多少, which asks what a thing is (账号是多少)
  std::size_t at = 0;       // the token it came from (Clause::interleaved)
  // "I can't cancel my order" asks for help with what "don't cancel my order" forbids: CANNOT, not NOT.
  std::string shown() const { return negated ? (unable ? "CANNOT-" : "NOT-") + text : text; }
};

inline bool is_negated(const Element& e) { return e.negated; }

struct Clause {
  std::string mood;            // "", "ASK", or an aux's name ("ASK_ABLE")
  bool negated = false;        // a negation that governs nothing in it: "no, ..."
  bool asks_politely = false;  // a polite form with no question of its own: "late checkout please"
  bool fine = false;           // things and a word for fine, nothing else: "the modem is fine", 路由器没问题
  bool states = false;         // its QUERY came from details alone, not a question ("refund status of order 7")
  bool about_someone = false;  // a subject in it ("I'm not happy"): a statement, not a contrast
  bool sequenced = false;      // a word for a sequence in it (then, first, 先, 再): its order is meant
  bool coordinated = false;    // an "and" in it: which detail goes with which thing may be in the order
  bool turns = false;          // a but, an if, an although in it: each side's things are its own
  bool question_mark = false;  // it ends in a question mark
  bool conditional = false;    // it opens with if, 如果: a condition, which alone asks for nothing
  // Two things go to different places, or come from them ("transfer 50 to my
  // dad and 20 to me"): objects, entities and details in one section, in the
  // order written, so which goes where is kept.
  bool interleaved = false;
  std::vector<Element> actions, objects, entities, details;

  bool empty() const { return mood.empty() && says_nothing(); }
  // Nothing but a mood ("你好，在吗？"): no request in it.
  bool says_nothing() const {
    return !negated && actions.empty() && objects.empty() && entities.empty() && details.empty();
  }
  // An action with what it acts on, or things that name the request without
  // a verb (退押金: RETURN+DEPOSIT, "order 789 refund"); never an action or a
  // detail alone ("cancel it" needs the conversation to say what "it" is).
  // A polite request for one thing is one too ("late checkout please",
  // "could you give me a wake-up call", 请帮我延迟退房): please asks for it.
  bool says_enough() const {
    const std::size_t things = objects.size() + entities.size();
    const bool requested = asks_politely && actions.empty() && objects.size() == 1 &&
                           std::none_of(objects.begin(), objects.end(), is_negated);
    return (!actions.empty() && things >= 1) || things >= 2 || requested;
  }

  void render(std::string& out) const {
    auto section = [&out](auto&& parts, auto&& text_of) {
      if (parts.empty()) return;
      if (!out.empty() && out.back() != '|') out.push_back('-');
      bool first = true;
      for (const auto& p : parts) {
        if (!first) out.push_back('+');
        first = false;
        out += text_of(p);
      }
    };
    auto element = [](const Element& e) { return e.shown(); };
    if (negated) section(std::vector<std::string>{"NOT"}, [](const std::string& s) { return s; });
    if (!mood.empty()) section(std::vector<std::string>{mood}, [](const std::string& s) { return s; });
    section(actions, element);
    if (interleaved) {
      std::vector<const Element*> things;
      for (const auto* list : {&objects, &entities, &details}) {
        for (const Element& e : *list) things.push_back(&e);
      }
      std::stable_sort(things.begin(), things.end(), [](const Element* x, const Element* y) { return x->at < y->at; });
      section(things, [](const Element* e) { return e->shown(); });
      return;
    }
    section(objects, element);
    section(entities, element);
    section(details, element);
  }
};

// Makes one request said in other words one clause, each rule in its turn
// (clause_words.cpp): "send me a new card" is "replace my card", "close my
// credit card" "cancel" it, "where do I pay" ... Only what the clause says is
// read; its words, order and polarity stay the key rules' (key_rules.cpp).
void reword_clause(Clause& c);

}  // namespace clm::store_detail
