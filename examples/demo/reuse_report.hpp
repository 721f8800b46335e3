// examples/demo/reuse_report.hpp: what CLM reused in a run, for people. For
// each snapshot the store served a request (GenerationResult::clm.served,
// filled by tiny_llama::ClmLoop), the question asked and the question whose
// snapshot it was, with the level, key and similarity, and whether the two
// questions have different intents (scenario.hpp: questions of one intent
// are paraphrases of each other): a snapshot of another intent is reuse that
// should not have happened.
//
//   const tiny_llama_demo::ReuseReport reuse = tiny_llama_demo::reuse_report(run_report);
//   std::printf("%s", tiny_llama_demo::format_reuse(reuse, "reuse.tsv").c_str());
//   CLM_RETURN_IF_ERROR(tiny_llama_demo::write_reuse_tsv(reuse, "reuse.tsv"));
//
// The question whose snapshot was served: the request whose record made the
// served version of the key (the store's RecordResult admitted: version 1;
// new_version or drifted: a later one). The first question recorded under a
// key is therefore the source of its version 1, whatever questions confirmed
// that version afterwards; a version no recorded request made (a fallback,
// level 3, which the host registers) has no source question. Records happen
// when a request ends, before its completion callback, and a request is
// served only what was recorded before, so the requests are replayed in
// their order of completion (RunReport::requests).
//
// A request that got the same snapshot (level, key, version) in several
// forwards makes one pair: `hits` counts the forwards, `similarity` is the
// best of them.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "clm/status.hpp"
#include "clm/store/snapshot_store.hpp"
#include "demo_run.hpp"

namespace tiny_llama_demo {

struct ReusePair {
  std::int32_t user = 0, turn = 0;  // who asked
  Question asked;
  bool has_source = false;  // false: no recorded request made the served version (a fallback)
  std::int32_t source_user = 0, source_turn = 0;
  Question source;  // the question whose snapshot was served, when has_source
  clm::SnapshotLevel level = clm::SnapshotLevel::miss;
  std::string key;
  std::int32_t version = 0;
  float similarity = 0.0f;  // the best over its hits
  std::int64_t hits = 0;    // forwards of the request that got this snapshot
  std::int32_t first_forward = 0;

  // The served snapshot is a question of another intent than the one asked.
  bool other_intent() const { return has_source && source.intent != asked.intent; }
};

struct ReuseReport {
  std::vector<ReusePair> pairs;  // by the asking request's completion, then its first forward
  std::int64_t hits() const;
  std::int64_t other_intent_hits() const;
  std::int64_t other_intent_pairs() const;
};

ReuseReport reuse_report(const RunReport& run);

// One line per pair ("  OTHER  asked "..." [intent] <- served "..." [intent]
// (level, key vN, similarity S, H hits)"; "same" for the same intent, "?"
// without a source question), then the totals:
// "  reuse: H hits in P pairs, of which from another intent: h hits in p pairs"
// and, when tsv_path is not empty, the line naming the file.
std::string format_reuse(const ReuseReport& report, const std::string& tsv_path);

// The pairs as TSV, a header row first: asked_user, asked_turn, asked_intent,
// asked, served_user, served_turn, served_intent, served ("-" for the four
// without a source question), level, key, version, similarity, hits,
// other_intent (1 or 0). Questions hold no tab or newline (the questions file
// is TSV). io_error naming the file when it cannot be written.
clm::Status write_reuse_tsv(const ReuseReport& report, const std::string& path);

}  // namespace tiny_llama_demo
