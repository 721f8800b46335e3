// examples/replay/workload.hpp: the request streams the replay feeds through
// the prefix cache (see ../shared/workloads.md): SGLang's generated shared
// prefix workload (gsp), JSONL workload files, and the Mooncake trace.
//
// A workload is loaded or generated in full before a replay starts, so that
// timing covers the cache alone. All requests' token ids sit back to back in
// one arena; a Request names its slice.
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "clm/status.hpp"

namespace clm::replay {

// The gsp defaults of SGLang's bench_serving.py (generated-shared-prefix).
struct GspParams {
  std::int32_t groups = 64;
  std::int32_t prompts_per_group = 16;
  std::int32_t system_prompt_tokens = 2048;
  std::int32_t question_tokens = 128;
  std::int32_t output_tokens = 256;
  std::int32_t vocabulary = 128256;
  std::uint64_t seed = 42;  // std::mt19937_64 seed: token draws and the shuffle
};

// Tokens of one Mooncake hash block (block h stands for h*512 .. h*512+511).
inline constexpr std::int32_t kMooncakeBlockTokens = 512;

struct Request {
  std::size_t offset = 0;          // first token in Workload::tokens
  std::int32_t prompt_tokens = 0;  // > 0
  std::int32_t output_tokens = 0;  // decoded tokens; their ids follow the prompt only when output_cached
  std::int32_t salt = 0;           // index into Workload::salts; 0 is the default namespace ""
  // Seconds from this request's arrival to the next request of its
  // conversation; infinity when the conversation ends here. Known only when
  // Workload::has_turn_timing; the replay's next-turn hint reads it.
  double seconds_to_next_turn = std::numeric_limits<double>::infinity();
};

struct Workload {
  std::string name;           // "gsp", the file's path, or "mooncake:<path>"
  bool output_cached = true;  // gsp/jsonl: prompt+output is inserted when a request ends.
                              // mooncake: outputs only hold pages while the request runs.
  std::vector<std::int32_t> tokens;
  std::vector<Request> requests;
  std::vector<std::string> salts{std::string()};
  bool has_turn_timing = false;  // every request's seconds_to_next_turn is known

  std::span<const std::int32_t> prompt(const Request& r) const {
    return {tokens.data() + r.offset, static_cast<std::size_t>(r.prompt_tokens)};
  }
  // Prompt followed by output ids (only meaningful when output_cached).
  std::span<const std::int32_t> prompt_and_output(const Request& r) const {
    return {tokens.data() + r.offset, static_cast<std::size_t>(r.prompt_tokens) + static_cast<std::size_t>(r.output_tokens)};
  }
  std::string_view salt(const Request& r) const { return salts[static_cast<std::size_t>(r.salt)]; }
  std::uint64_t total_prompt_tokens() const;
};

// Generates gsp: per group a system prompt, then per prompt its question and
// output, all ids drawn uniformly from the vocabulary; then the requests are
// shuffled (Fisher-Yates). Draws use a rejection-sampled bounded integer, not
// std::uniform_int_distribution, so the stream is the same on every standard
// library.
Workload generate_gsp(const GspParams& params = {});

// Parses JSONL workload text: one {"prompt":[...],"output":[...],"salt":"..."}
// per line ("output" and "salt" optional; other keys ignored; blank lines
// skipped). `source` names the text in error messages.
Status parse_jsonl_workload(std::string_view text, std::string_view source, Workload& out);
Status read_jsonl_workload(const std::string& path, Workload& out);
Status write_jsonl_workload(const Workload& workload, const std::string& path);

// Parses Mooncake trace text ({"timestamp","input_length","output_length",
// "hash_ids"} per line) into token ids: block h becomes h*512 + 0..511, the
// last block only input_length - 512*(blocks-1) of them. When every line has a
// timestamp (milliseconds, a number >= 0, never decreasing), the workload has
// turn timing: a request continues the conversation of the latest request
// that held the deepest of its blocks an earlier request holds, past the first
// (block 0 is the system prompt every request shares), and
// seconds_to_next_turn is the gap to the first request that continues it.
Status parse_mooncake_trace(std::string_view text, std::string_view source, Workload& out);
Status read_mooncake_trace(const std::string& path, Workload& out);

// "gsp", "mooncake:FILE" or a JSONL FILE.
Status load_workload(std::string_view spec, std::uint64_t gsp_seed, Workload& out);

// The whole file as bytes; io_error when it cannot be read.
Status read_file(const std::string& path, std::string& out);

}  // namespace clm::replay
