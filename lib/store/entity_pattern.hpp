// lib/store/entity_pattern.hpp: the entity patterns of the suffix keyer
// (SuffixKeyerConfig::entity_patterns in clm/store/suffix_key.hpp): the
// pattern type, the parser of its small language (literals, '?' after a
// literal, one {d:MIN-MAX} or {a:MIN-MAX} run) and a linear-time matcher over
// normalised text (suffix_text.hpp). No regular expressions and no recursion:
// a match attempt costs O(elements^2) whatever the text. Internal to
// lib/store.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "clm/status.hpp"

namespace clm::store_detail {

struct PatternElem {
  enum Kind : std::uint8_t { literal, separator, digits, alnum } kind = literal;
  bool optional = false;
  std::string text;  // literal: one normalised code point
  std::size_t min = 0, max = 0;
};

struct Pattern {
  std::vector<PatternElem> elems;
  // The byte every match starts with, when the first element is a required
  // literal: most start positions are then rejected by one comparison.
  int first_byte = -1;
};

constexpr std::size_t kMaxPatternElems = 64;
constexpr std::size_t kMaxRunLength = 64;

// One pattern of SuffixKeyerConfig::entity_patterns; invalid_argument, naming
// the pattern, for one that does not parse.
Status parse_pattern(std::string_view src, Pattern& out);

struct Span {
  std::size_t begin = 0, end = 0;
};

// A match attempt's states, kept across attempts so that matching allocates
// nothing. `seen` marks, per offset from the start, the states already in
// `next`: offsets stay below kMaxOffset (each literal takes one code point,
// the run at most kMaxRunLength bytes).
constexpr std::size_t kMaxOffset = kMaxPatternElems * 4 + kMaxRunLength + 1;
struct MatchScratch {
  std::vector<std::pair<std::size_t, Span>> cur, next;
  std::array<std::uint32_t, kMaxOffset + 1> seen{};
  std::uint32_t stamp = 0;
};

// Where `p` matches `norm` starting at `start`: the run's span, or false. The
// states are the text positions reachable after each element, at most one
// more per element, so a match attempt costs O(elements^2) whatever the text.
// `end`, when given, is where the whole match ends.
bool match_at(const Pattern& p, std::string_view norm, std::size_t start, Span& run, MatchScratch& m,
              std::size_t* end = nullptr);

}  // namespace clm::store_detail
