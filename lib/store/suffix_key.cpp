// lib/store/suffix_key.cpp: the suffix keyer of clm/store/suffix_key.hpp, and
// its key rules: create() builds the keyer from its config, make_key() finds
// the entity (entity_pattern.hpp) in the normalised text (suffix_text.hpp),
// tokenises the rest greedily, longest match first, over the lexicons
// (suffix_lexicon.hpp), and folds the tokens into a key.
// No regular expressions and no recursion: every step is one pass over the
// text with bounded work per position, so time is linear in the text whatever
// it holds. The keyer is immutable after create().
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

#include "entity_pattern.hpp"
#include "suffix_lexicon.hpp"
#include "suffix_text.hpp"

namespace clm {

using store_detail::Category;
using store_detail::Entry;
using store_detail::Lexicon;
using store_detail::match_at;
using store_detail::MatchScratch;
using store_detail::normalise_text;
using store_detail::parse_pattern;
using store_detail::Pattern;
using store_detail::Span;
using store_detail::split_units;

namespace {

// The entity patterns when SuffixKeyerConfig::entity_patterns is empty: order
// numbers, English and Chinese, then any run of 3 to 20 digits.
const char* const kBuiltinPatterns[] = {
    "order number ?{d:1-20}", "order no ?{d:1-20}", "order ?{d:1-20}", "ord ?{d:1-20}",  "订单号码 ?{d:1-20}",
    "订单编号 ?{d:1-20}",     "订单号 ?{d:1-20}",   "订单 ?{d:1-20}",  "单号 ?{d:1-20}", "{d:3-20}",
};

}  // namespace

struct SuffixKeyer::Impl {
  std::size_t max_text_bytes = 0;
  std::vector<Pattern> patterns;
  Lexicon lexicon;
  std::uint32_t query = 0;  // the name QUERY
};

SuffixKeyer::SuffixKeyer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
SuffixKeyer::~SuffixKeyer() = default;

Status SuffixKeyer::create(const SuffixKeyerConfig& config, std::unique_ptr<SuffixKeyer>& out) {
  try {
    if (config.max_text_bytes == 0) return invalid_argument("max_text_bytes must be positive");
    auto impl = std::make_unique<Impl>();
    impl->max_text_bytes = config.max_text_bytes;
    if (config.entity_patterns.empty()) {
      for (const char* p : kBuiltinPatterns) {
        impl->patterns.emplace_back();
        CLM_RETURN_IF_ERROR(parse_pattern(p, impl->patterns.back()));
      }
    } else {
      for (const std::string& p : config.entity_patterns) {
        impl->patterns.emplace_back();
        CLM_RETURN_IF_ERROR(parse_pattern(p, impl->patterns.back()));
      }
    }
    if (config.lexicon_dir.empty()) {
      CLM_RETURN_IF_ERROR(impl->lexicon.load_builtin());
    } else {
      CLM_RETURN_IF_ERROR(impl->lexicon.load_directory(config.lexicon_dir));
    }
    CLM_RETURN_IF_ERROR(impl->lexicon.check_names());
    impl->query = impl->lexicon.intern("QUERY");
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
    if (text.size() > impl_->max_text_bytes) {
      return invalid_argument(
          fmt::format("text of {} bytes is over max_text_bytes ({})", text.size(), impl_->max_text_bytes));
    }
    std::string norm;
    CLM_RETURN_IF_ERROR(normalise_text(text, norm));
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
    const Lexicon& lex = im.lexicon;
    if (text.size() > im.max_text_bytes) {
      return invalid_argument(
          fmt::format("text of {} bytes is over max_text_bytes ({})", text.size(), im.max_text_bytes));
    }
    std::string norm;
    CLM_RETURN_IF_ERROR(normalise_text(text, norm));
    if (norm.empty()) return invalid_argument("no content");

    // 2. Entity: patterns in order, each at its leftmost match.
    SuffixKey key;
    Span run;
    bool found = false;
    {
      MatchScratch scratch;
      for (const Pattern& p : im.patterns) {
        for (std::size_t start = 0; start < norm.size() && !found; ++start) {
          const auto b = static_cast<unsigned char>(norm[start]);
          if ((b & 0xC0) == 0x80 || (p.first_byte >= 0 && b != p.first_byte)) continue;
          found = match_at(p, norm, start, run, scratch);
        }
        if (found) break;
      }
    }
    if (found) {
      key.entity = norm.substr(run.begin, run.end - run.begin);
      std::fill(norm.begin() + static_cast<std::ptrdiff_t>(run.begin),
                norm.begin() + static_cast<std::ptrdiff_t>(run.end), ' ');
    }

    // 3 and 4. Tokens: greedy longest match over units; unknown units dropped.
    std::vector<std::string_view> units;
    split_units(norm, units);
    struct Action {
      std::uint32_t name;
      bool negated;
    };
    std::vector<Action> actions;
    std::vector<std::uint32_t> objects;
    std::vector<std::string> details;
    bool asks = false;         // a question word or a detail: a question
    bool pending_not = false;  // a negation waiting for its action
    bool any_greeting = false;
    std::uint32_t greeting = 0;  // the last one
    std::string probe;
    for (std::size_t i = 0; i < units.size();) {
      probe.clear();
      std::int32_t best = -1;
      std::size_t best_len = 0;
      for (std::size_t k = 0; k < lex.max_units && i + k < units.size(); ++k) {
        if (k) probe.push_back(' ');
        probe.append(units[i + k]);
        const auto it = lex.surfaces.find(probe);
        if (it == lex.surfaces.end()) break;
        if (it->second >= 0) {
          best = it->second;
          best_len = k + 1;
        }
      }
      if (best < 0) {
        ++i;
        continue;
      }
      i += best_len;
      const Entry& e = lex.entries[static_cast<std::size_t>(best)];
      switch (e.category) {
        case Category::action:
          actions.push_back({e.name, pending_not});
          pending_not = false;
          break;
        case Category::object:
          objects.push_back(e.name);
          break;
        case Category::detail:
          details.push_back(lex.names[e.name]);
          asks = true;
          break;
        case Category::question:
          if (e.name != im.query) details.push_back(lex.names[e.name]);
          asks = true;
          break;
        case Category::negation:
          pending_not = true;
          break;
        case Category::greeting:
          any_greeting = true;
          greeting = e.name;
          break;
        case Category::stopword:
          break;
      }
    }

    // 5. Polarity: a negation with no action after it ("登录不了", "用不了")
    // negates the action before it.
    bool dangling_not = false;
    if (pending_not) {
      if (!actions.empty()) {
        actions.back().negated = true;
      } else {
        dangling_not = true;
      }
    }
    // The action: every action but QUERY, polarised, sorted by name, joined
    // by '+' ("PAY+NOT-SUCCEED"), so that a negated or opposite action
    // anywhere in the text changes the group and level 2 cannot cross it. A
    // QUERY beside a real action is only the question's form ("check whether
    // 789 shipped" asks what "has 789 shipped?" asks), unless negated.
    std::sort(actions.begin(), actions.end(), [&lex](const Action& x, const Action& y) {
      return x.name == y.name ? x.negated < y.negated : lex.names[x.name] < lex.names[y.name];
    });
    actions.erase(
        std::unique(actions.begin(), actions.end(),
                    [](const Action& x, const Action& y) { return x.name == y.name && x.negated == y.negated; }),
        actions.end());
    const bool only_query =
        std::all_of(actions.begin(), actions.end(), [&im](const Action& x) { return x.name == im.query; });
    std::string action;
    for (const Action& a : actions) {
      if (a.name == im.query && !a.negated && !only_query) continue;
      if (!action.empty()) action.push_back('+');
      if (a.negated) action += "NOT-";
      action += lex.names[a.name];
    }
    if (actions.empty() && asks) action = lex.names[im.query];  // a detail or a question word alone asks: QUERY
    // Objects: the first in sorted order is the object, the others details, so
    // "refund for order 7" and "订单7的退款" agree.
    std::vector<std::string> object_names;
    for (std::uint32_t o : objects) object_names.push_back(lex.names[o]);
    std::sort(object_names.begin(), object_names.end());
    object_names.erase(std::unique(object_names.begin(), object_names.end()), object_names.end());
    if (!object_names.empty()) {
      key.object = object_names.front();
      details.insert(details.end(), object_names.begin() + 1, object_names.end());
    }
    std::sort(details.begin(), details.end());
    details.erase(std::unique(details.begin(), details.end()), details.end());

    const bool content = !key.object.empty() || !key.entity.empty() || !actions.empty() || !details.empty();
    if (!content) {
      if (!any_greeting) return invalid_argument("no content");
      key.key = lex.names[greeting];
      key.low_information = true;
    } else {
      if (dangling_not) action = action.empty() ? std::string("NOT") : "NOT-" + action;
      key.action = std::move(action);
      key.details = std::move(details);
      for (const std::string* part : {&key.object, &key.entity, &key.action}) {
        if (part->empty()) continue;
        if (!key.key.empty()) key.key.push_back('-');
        key.key += *part;
      }
      for (const std::string& d : key.details) {
        if (!key.key.empty()) key.key.push_back('-');
        key.key += d;
      }
    }
    key.fingerprint = key_fingerprint(key.key);
    key.group = key_fingerprint(key.entity + "|" + key.action);
    out = std::move(key);
    return Status::success();
  } catch (const std::bad_alloc&) {
    return out_of_memory("suffix key: out of memory");
  } catch (const std::exception& e) {
    return {StatusCode::internal, fmt::format("suffix key: {}", e.what())};
  }
}

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
