// lib/store/key_rules.hpp: the key rules of the suffix keyer
// (clm/store/suffix_key.hpp, steps 2 to 6): from normalised text to a key, or
// to a reasoned abstention. Internal to lib/store.
//
//   store_detail::KeyRules rules{lexicon, patterns, query_name};
//   SuffixKey key;
//   CLM_RETURN_IF_ERROR(rules.build("don t cancel order 789|refund it", key));  // normalised text
//   // key.key == "NOT-CANCEL-ORDER-789|REFUND"
//
// The text is read clause by clause (a clause ends at , ; ! 。 ? or a full
// stop before a space), and every unit must be known: a lexicon entry, a
// number or an entity pattern's match. One unknown word and the key
// abstains: the keyer cannot say what the text asks, so it must not claim
// to (precision first: a miss costs one prefill, a wrong hit a wrong
// answer). Per clause, in order of appearance:
//  - mood: a yes-no question opened by an aux (has, did: ASK; can i: ASK_ABLE),
//    a question word, or a question mark without a polite form (can you,
//    please) is ASK; a question about state alone is the action QUERY;
//  - negation: NOT_ governs the next action, object or entity of its clause;
//    with only details after it, those ("book the 8 am flight instead of the
//    noon one"); with nothing, the action before it (NOT_AFTER always does);
//    alone in a clause ("no, ...") it is the clause NOT. It never crosses a
//    clause;
//  - actions, objects, entities and details each keep their order (cancel
//    then confirm is not confirm then cancel; 789 not 456 is not 456 not
//    789; from a twin room to a king room is not the reverse);
//  - a number is an entity, and numbers next to each other one entity
//    ("555 1234", "555-1234": 5551234); a unit beside a number joins it
//    ($20: 20usd).
// The key is the clauses joined by '|', sorted unless something orders them
// (then, first, 先, 再; money and sending; a bare "no, ..."); a clause is its mood, actions,
// objects, entities and details, each section's parts joined by '+' and the
// sections by '-'. The group (what level 2 must agree on) is the key itself,
// details included. A key is issued only when some clause has an action with an
// object or an entity, or two of those (退押金, "order 789 refund");
// otherwise it is low information, with the reason.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "clm/status.hpp"
#include "clm/store/suffix_key.hpp"
#include "entity_pattern.hpp"
#include "suffix_lexicon.hpp"

namespace clm::store_detail {

struct KeyRules {
  const Lexicon& lexicon;
  const std::vector<Pattern>& patterns;
  std::uint32_t query = 0;  // the name QUERY

  // The key of normalised text (normalise_text with Clauses::keep, not
  // empty). invalid_argument "no content" when nothing in it is content.
  Status build(std::string_view norm, SuffixKey& key) const;
};

}  // namespace clm::store_detail
