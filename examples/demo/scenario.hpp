// examples/demo/scenario.hpp: the customer-service scenario of `make demo`
// and bench_e2e. A support bot's long system prompt of real text (the Debian
// FAQ, English and Chinese, from Debian's debian-faq and debian-faq-zh-cn
// packages), and users who arrive one after another and ask multi-turn
// questions, in English or Chinese, repeated and paraphrased.
//
//   tiny_llama_demo::ScenarioOptions options;   // 12 users x 3 turns
//   tiny_llama_demo::Scenario scenario;
//   CLM_RETURN_IF_ERROR(tiny_llama_demo::make_scenario(options, scenario));
//   for (const auto& user : scenario.users) ...  // user.questions[turn], user.arrival_step
//
// The conversation of a user is the system prompt, then per turn the
// question and the model's answer: turn k+1's prompt starts with all of turn
// k, which is what prefix reuse finds; and the system prompt is shared by
// every user, which is what it finds first.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "clm/status.hpp"

namespace tiny_llama_demo {

struct ScenarioOptions {
  std::string faq_en = "/usr/share/doc/debian/FAQ/debian-faq.en.txt.gz";
  std::string faq_zh = "/usr/share/doc/debian/FAQ/debian-faq.zh-cn.txt.gz";
  std::int32_t system_bytes = 1536;  // of FAQ text: two thirds English, one third Chinese
  std::int32_t users = 12;
  std::int32_t turns = 3;
  std::int32_t arrival_gap_steps = 6;  // decode steps between two users' arrivals
  double repeat_probability = 0.35;    // a question the user (or another) asked before, verbatim
  std::uint64_t seed = 7;
};

struct Question {
  std::string text;
  std::int32_t topic = 0;  // questions of one topic are paraphrases of each other
  bool repeated = false;   // asked verbatim before, by anyone
  bool chinese = false;
};

struct ScenarioUser {
  std::int32_t arrival_step = 0;
  std::vector<Question> questions;  // one per turn
};

struct Scenario {
  std::string system_prompt;
  std::vector<ScenarioUser> users;
  std::int64_t questions() const;
};

// Reads the FAQ files (gzip, through `gzip -dc`) and draws the users.
// not_found naming the package when a file is missing.
clm::Status make_scenario(const ScenarioOptions& options, Scenario& out);

// Text of `path` (gzip-compressed when it ends in .gz).
clm::Status read_text(const std::string& path, std::string& out);

// From the second line that starts with `heading` (the first is the table of
// contents), whitespace runs collapsed to one space, cut to at most
// `max_bytes` at a character boundary.
std::string faq_excerpt(const std::string& faq, const std::string& heading, std::size_t max_bytes);

}  // namespace tiny_llama_demo
