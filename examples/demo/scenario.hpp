// examples/demo/scenario.hpp: the customer-service scenario of `make demo`
// and bench_e2e. A support bot's long system prompt of real text (the Debian
// FAQ, English and Chinese, from Debian's debian-faq and debian-faq-zh-cn
// packages), and users who arrive one after another and ask multi-turn
// questions, in English or Chinese, repeated and paraphrased. The questions
// come from a file (examples/demo/questions.tsv), each with its intent:
// questions of one intent are paraphrases of each other.
//
//   tiny_llama_demo::ScenarioOptions options;   // 12 users x 3 turns, questions.tsv
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
#include <string_view>
#include <vector>

#include "clm/status.hpp"

namespace tiny_llama_demo {

struct ScenarioOptions {
  // intent<TAB>language<TAB>question per line (questions.tsv's header says
  // more); empty: examples/demo/questions.tsv of the source tree built from.
  std::string questions;
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
  std::string intent;     // "install_package": questions of one intent are paraphrases of each other
  std::string language;   // "en", "zh": as in the questions file
  bool repeated = false;  // asked verbatim before, by anyone
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

// Reads the questions and the FAQ files (gzip, through `gzip -dc`) and draws
// the users: each turn, with repeat_probability a question asked before (by
// anyone), else an intent drawn uniformly among those with a question in the
// user's language, then one of its questions in that language. not_found
// naming the package when a FAQ file is missing; a malformed questions file
// as read_questions says.
clm::Status make_scenario(const ScenarioOptions& options, Scenario& out);

// The questions of a questions file's text, in file order. An error is
// invalid_argument starting "NAME:LINE: " (`name`: the file's path): a line
// that is not three tab-separated fields, an intent not of [a-z][a-z0-9_]*, a
// language not of 2 or 3 letters a-z, an empty question, a question already
// on an earlier line (repeats are found by their text); or "NAME: " and no
// question at all.
clm::Status parse_questions(std::string_view text, std::string_view name, std::vector<Question>& out);
// The same, from the file at `path` (not_found when it does not exist).
clm::Status read_questions(const std::string& path, std::vector<Question>& out);
// examples/demo/questions.tsv of the source tree this program was built from.
std::string default_questions_path();

// Text of `path` (gzip-compressed when it ends in .gz).
clm::Status read_text(const std::string& path, std::string& out);

// From the second line that starts with `heading` (the first is the table of
// contents), whitespace runs collapsed to one space, cut to at most
// `max_bytes` at a character boundary.
std::string faq_excerpt(const std::string& faq, const std::string& heading, std::size_t max_bytes);

}  // namespace tiny_llama_demo
