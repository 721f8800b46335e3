// lib/store/entity_pattern.cpp: the entity patterns' parser and matcher
// (entity_pattern.hpp).
#include "entity_pattern.hpp"

#include <algorithm>

#include <fmt/format.h>

#include "suffix_text.hpp"

namespace clm::store_detail {

Status parse_pattern(std::string_view src, Pattern& out) {
  auto bad = [&](std::string_view why) { return invalid_argument(fmt::format("entity pattern \"{}\": {}", src, why)); };
  std::vector<PatternElem> elems;
  std::size_t runs = 0;
  std::size_t i = 0;
  while (i < src.size()) {
    if (src[i] == '?') {
      if (elems.empty() || elems.back().kind == PatternElem::digits || elems.back().kind == PatternElem::alnum ||
          elems.back().optional) {
        return bad("'?' must follow a literal character");
      }
      elems.back().optional = true;
      ++i;
      continue;
    }
    if (src[i] == '{') {
      const std::size_t close = src.find('}', i);
      if (close == std::string_view::npos) return bad("unclosed '{'");
      const std::string_view spec = src.substr(i + 1, close - i - 1);  // "d:3-20"
      PatternElem e;
      if (spec.size() < 5 || (spec[0] != 'd' && spec[0] != 'a') || spec[1] != ':')
        return bad("a run is {d:MIN-MAX} or {a:MIN-MAX}");
      e.kind = spec[0] == 'd' ? PatternElem::digits : PatternElem::alnum;
      const std::size_t dash = spec.find('-', 2);
      if (dash == std::string_view::npos) return bad("a run is {d:MIN-MAX} or {a:MIN-MAX}");
      auto number = [](std::string_view s, std::size_t& v) {
        if (s.empty() || s.size() > 3) return false;
        v = 0;
        for (char c : s) {
          if (!is_ascii_digit(c)) return false;
          v = v * 10 + static_cast<std::size_t>(c - '0');
        }
        return true;
      };
      if (!number(spec.substr(2, dash - 2), e.min) || !number(spec.substr(dash + 1), e.max) || e.min < 1 ||
          e.max < e.min || e.max > kMaxRunLength) {
        return bad(fmt::format("run lengths must be 1 <= MIN <= MAX <= {}", kMaxRunLength));
      }
      elems.push_back(e);
      ++runs;
      i = close + 1;
      continue;
    }
    // A literal: normalised like the text, so "ORD-" means "ord" then a separator.
    const std::size_t at = i;
    char32_t cp = 0;
    if (!decode_utf8(src, i, cp)) return bad(fmt::format("invalid UTF-8 at byte {}", at));
    std::string one;
    CLM_RETURN_IF_ERROR(normalise_text(src.substr(at, i - at), one));
    PatternElem e;
    if (one.empty()) {
      e.kind = PatternElem::separator;
      // Separators collapse in the text, so they collapse here too.
      if (!elems.empty() && elems.back().kind == PatternElem::separator && !elems.back().optional) continue;
    } else {
      e.text = std::move(one);
    }
    elems.push_back(std::move(e));
  }
  if (runs != 1) return bad("needs exactly one {d:MIN-MAX} or {a:MIN-MAX} run");
  if (elems.size() > kMaxPatternElems) return bad(fmt::format("longer than {} elements", kMaxPatternElems));
  out.elems = std::move(elems);
  const PatternElem& first = out.elems.front();
  if (first.kind == PatternElem::literal && !first.optional) out.first_byte = static_cast<unsigned char>(first.text[0]);
  return Status::success();
}

bool match_at(const Pattern& p, std::string_view norm, std::size_t start, Span& run, MatchScratch& m,
              std::size_t* end) {
  auto& cur = m.cur;
  auto& next = m.next;
  const std::size_t n = norm.size();
  // A match never starts inside an ASCII word.
  if (start > 0 && start < n && is_ascii_alnum(norm[start - 1]) && is_ascii_alnum(norm[start])) return false;
  cur.clear();
  cur.push_back({start, Span{}});
  for (const PatternElem& e : p.elems) {
    next.clear();
    if (++m.stamp == 0) {  // wrapped: forget every old mark
      std::fill(m.seen.begin(), m.seen.end(), 0);
      m.stamp = 1;
    }
    auto add = [&](std::size_t pos, Span s) {
      std::uint32_t& mark = m.seen[pos - start];
      if (mark == m.stamp) return;
      mark = m.stamp;
      next.push_back({pos, s});
    };
    for (const auto& [pos, span] : cur) {
      if (e.optional) add(pos, span);
      switch (e.kind) {
        case PatternElem::literal:
          if (n - pos >= e.text.size() && norm.compare(pos, e.text.size(), e.text) == 0) add(pos + e.text.size(), span);
          break;
        case PatternElem::separator:
          if (pos < n && (norm[pos] == ' ' || norm[pos] == kClauseBreak || norm[pos] == kQuestionBreak))
            add(pos + 1, span);
          if (pos == 0 || pos == n) add(pos, span);  // punctuation at either end was trimmed
          break;
        case PatternElem::digits:
        case PatternElem::alnum: {
          // The whole run of the class (never a part of it), at most max long.
          std::size_t len = 0;
          auto in_class = [&](char c) { return e.kind == PatternElem::digits ? is_ascii_digit(c) : is_ascii_alnum(c); };
          while (pos + len < n && len <= e.max && in_class(norm[pos + len])) ++len;
          if (len >= e.min && len <= e.max && (pos + len == n || !in_class(norm[pos + len]))) {
            add(pos + len, Span{pos, pos + len});
          }
          break;
        }
      }
    }
    cur.swap(next);
    if (cur.empty()) return false;
  }
  for (const auto& [pos, span] : cur) {
    // ... nor ends inside one.
    if (pos > start && pos < n && is_ascii_alnum(norm[pos - 1]) && is_ascii_alnum(norm[pos])) continue;
    if (span.end == span.begin) continue;
    run = span;
    if (end != nullptr) *end = pos;
    return true;
  }
  return false;
}

}  // namespace clm::store_detail
