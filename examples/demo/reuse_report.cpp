// examples/demo/reuse_report.cpp: the pairs (question asked, question served) of a run.
#include "reuse_report.hpp"

#include <algorithm>
#include <fstream>
#include <map>
#include <tuple>
#include <utility>

#include <fmt/format.h>

namespace tiny_llama_demo {

namespace {

struct Source {
  std::int32_t user = 0, turn = 0;
  const Question* question = nullptr;
};

bool makes_a_version(clm::RecordResult r) {
  return r == clm::RecordResult::admitted || r == clm::RecordResult::new_version || r == clm::RecordResult::drifted;
}

}  // namespace

std::int64_t ReuseReport::hits() const {
  std::int64_t n = 0;
  for (const ReusePair& p : pairs) n += p.hits;
  return n;
}

std::int64_t ReuseReport::other_intent_hits() const {
  std::int64_t n = 0;
  for (const ReusePair& p : pairs) n += p.other_intent() ? p.hits : 0;
  return n;
}

std::int64_t ReuseReport::other_intent_pairs() const {
  return std::count_if(pairs.begin(), pairs.end(), [](const ReusePair& p) { return p.other_intent(); });
}

ReuseReport reuse_report(const RunReport& run) {
  ReuseReport report;
  // key -> version -> the request whose record made that version (the first
  // one recorded under the key made version 1).
  std::map<std::string, std::map<std::int32_t, Source>> made;
  for (const RequestRecord& r : run.requests) {
    const tiny_llama::ClmRequestCounts& clm = r.result.clm;
    std::vector<ReusePair> mine;
    for (const tiny_llama::ClmServed& s : clm.served) {
      const auto same = std::find_if(mine.begin(), mine.end(), [&](const ReusePair& p) {
        return std::tie(p.level, p.key, p.version) == std::tie(s.level, s.key, s.version);
      });
      if (same != mine.end()) {
        ++same->hits;
        same->similarity = std::max(same->similarity, s.similarity);
        continue;
      }
      ReusePair p;
      p.user = r.user;
      p.turn = r.turn;
      p.asked = r.question;
      p.level = s.level;
      p.key = s.key;
      p.version = s.version;
      p.similarity = s.similarity;
      p.hits = 1;
      p.first_forward = s.forward;
      if (const auto key = made.find(s.key); key != made.end() && s.level != clm::SnapshotLevel::fallback) {
        const auto version = key->second.find(s.version);
        if (version != key->second.end()) {
          p.has_source = true;
          p.source_user = version->second.user;
          p.source_turn = version->second.turn;
          p.source = *version->second.question;
        }
      }
      mine.push_back(std::move(p));
    }
    report.pairs.insert(report.pairs.end(), std::make_move_iterator(mine.begin()), std::make_move_iterator(mine.end()));
    // After its own lookups: a request is never served its own record.
    if (clm.recorded && !clm.key.empty() && makes_a_version(clm.record_result)) {
      made[clm.key].emplace(clm.record_version, Source{r.user, r.turn, &r.question});  // the first maker stays
    }
  }
  return report;
}

std::string format_reuse(const ReuseReport& report, const std::string& tsv_path) {
  std::string out;
  for (const ReusePair& p : report.pairs) {
    const char* mark = !p.has_source ? "?" : p.other_intent() ? "OTHER" : "same";
    const std::string served = p.has_source ? fmt::format("\"{}\" [{}]", p.source.text, p.source.intent)
                                            : std::string("(no question: not made by a recorded request)");
    out += fmt::format("  {:<5}  asked \"{}\" [{}] <- served {} ({}, {} v{}, similarity {:.3f}, {} hit{})\n", mark,
                       p.asked.text, p.asked.intent, served, clm::snapshot_level_name(p.level), p.key, p.version,
                       p.similarity, p.hits, p.hits == 1 ? "" : "s");
  }
  out += fmt::format("  reuse: {} hits in {} pairs, of which from another intent: {} hits in {} pairs{}\n",
                     report.hits(), report.pairs.size(), report.other_intent_hits(), report.other_intent_pairs(),
                     report.pairs.empty() ? " (no lookup was served a snapshot)" : " (marked OTHER)");
  if (!tsv_path.empty()) out += fmt::format("  the pairs, as TSV: {}\n", tsv_path);
  return out;
}

clm::Status write_reuse_tsv(const ReuseReport& report, const std::string& path) {
  std::ofstream out(path, std::ios::trunc);
  if (!out) return clm::io_error(fmt::format("cannot write '{}'", path));
  out << "asked_user\tasked_turn\tasked_intent\tasked\tserved_user\tserved_turn\tserved_intent\tserved\tlevel\tkey\t"
         "version\tsimilarity\thits\tother_intent\n";
  for (const ReusePair& p : report.pairs) {
    out << fmt::format("{}\t{}\t{}\t{}\t", p.user, p.turn, p.asked.intent, p.asked.text);
    if (p.has_source) {
      out << fmt::format("{}\t{}\t{}\t{}\t", p.source_user, p.source_turn, p.source.intent, p.source.text);
    } else {
      out << "-\t-\t-\t-\t";
    }
    out << fmt::format("{}\t{}\t{}\t{:.4f}\t{}\t{}\n", clm::snapshot_level_name(p.level), p.key, p.version,
                       p.similarity, p.hits, p.other_intent() ? 1 : 0);
  }
  out.close();
  if (!out) return clm::io_error(fmt::format("cannot write '{}'", path));
  return {};
}

}  // namespace tiny_llama_demo
