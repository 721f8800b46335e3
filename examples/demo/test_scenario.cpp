// examples/demo/test_scenario.cpp: the demo's questions file (parse_questions,
// read_questions, make_scenario: every malformed line is named by its
// number) and the reuse pairs it prints (reuse_report: which question's
// snapshot each request was served, and whether its intent was another).
#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include <catch2/catch.hpp>

#include "reuse_report.hpp"
#include "scenario.hpp"

namespace {

using tiny_llama_demo::Question;

// A folder of its own under the system's temporary folder, removed at the end.
struct TempFolder {
  TempFolder() {
    std::string pattern = (std::filesystem::temp_directory_path() / "test-demo-scenario.XXXXXX").string();
    REQUIRE(mkdtemp(pattern.data()) != nullptr);
    path = pattern;
  }
  ~TempFolder() {
    std::error_code ignored;
    std::filesystem::remove_all(path, ignored);
  }
  std::filesystem::path path;
};

std::string parse_error(const std::string& text) {
  std::vector<Question> out;
  const clm::Status s = tiny_llama_demo::parse_questions(text, "q.tsv", out);
  REQUIRE_FALSE(s.ok());
  CHECK(s.code() == clm::StatusCode::invalid_argument);
  return s.message();
}

}  // namespace

TEST_CASE("parse_questions: intent, language and question per line, and comments and blank lines skipped") {
  std::vector<Question> out;
  const std::string text =
      "# a comment\n"
      "\n"
      "install_package\ten\tHow do I install a package?\r\n"
      "install_package\tzh\t如何安装软件包？\n"
      "report_bug2\ten\t  Where do I report a bug?  \n"
      "# the last line has no newline\n"
      "report_bug2\ten\tHow do I file a bug?";
  REQUIRE(tiny_llama_demo::parse_questions(text, "q.tsv", out).ok());
  REQUIRE(out.size() == 4);
  CHECK(out[0].intent == "install_package");
  CHECK(out[0].language == "en");
  CHECK(out[0].text == "How do I install a package?");  // the \r of a CRLF line is not part of it
  CHECK(out[1].language == "zh");
  CHECK(out[1].text == "如何安装软件包？");
  CHECK(out[2].text == "Where do I report a bug?");  // spaces around it trimmed
  CHECK(out[3].intent == "report_bug2");
  CHECK_FALSE(out[3].repeated);
}

TEST_CASE("parse_questions: a malformed line is named by its number") {
  const std::string good = "# header\ninstall_package\ten\tHow do I install a package?\n";
  CHECK(parse_error(good + "install_package\tHow do I install it?\n") ==
        "q.tsv:3: expected intent<TAB>language<TAB>question, found 2 tab-separated field(s)");
  CHECK(parse_error(good + "\ninstall_package\ten\tHow?\textra\n") ==
        "q.tsv:4: expected intent<TAB>language<TAB>question, found 4 tab-separated field(s)");
  CHECK(parse_error(good + "Install_Package\ten\tHow do I install it?\n") ==
        "q.tsv:3: intent 'Install_Package' is not a name of [a-z][a-z0-9_]*");
  CHECK(parse_error(good + "2nd_intent\ten\tHow do I install it?\n") ==
        "q.tsv:3: intent '2nd_intent' is not a name of [a-z][a-z0-9_]*");
  CHECK(parse_error(good + "install_package\tenglish\tHow do I install it?\n") ==
        "q.tsv:3: language 'english' is not a code of 2 or 3 letters a-z");
  CHECK(parse_error(good + "install_package\ten\t   \n") == "q.tsv:3: the question is empty");
  CHECK(parse_error(good + "report_bug\ten\tHow do I install a package?\n") ==
        "q.tsv:3: the question \"How do I install a package?\" is already on line 2");
  CHECK(parse_error("# only comments\n\n") == "q.tsv: no questions");
  CHECK(parse_error("") == "q.tsv: no questions");
}

TEST_CASE("the shipped questions file: intents with paraphrases, in English and Chinese") {
  std::vector<Question> questions;
  const clm::Status s = tiny_llama_demo::read_questions(tiny_llama_demo::default_questions_path(), questions);
  INFO(s.message());
  REQUIRE(s.ok());
  std::map<std::pair<std::string, std::string>, int> per_intent_language;
  std::set<std::string> intents;
  for (const Question& q : questions) {
    ++per_intent_language[{q.intent, q.language}];
    intents.insert(q.intent);
  }
  CHECK(intents.size() >= 4);
  for (const std::string& intent : intents) {
    INFO(intent);
    CHECK(per_intent_language[{intent, "en"}] >= 2);  // paraphrases
    CHECK(per_intent_language[{intent, "zh"}] >= 1);
  }
  CHECK(questions.front().language == "en");  // the language of two users in three
}

TEST_CASE("read_questions and make_scenario: a malformed file is named with the line") {
  TempFolder dir;
  const std::string path = (dir.path / "questions.tsv").string();
  {
    std::ofstream out(path);
    out << "# questions\ninstall_package\ten\tHow do I install a package?\nreport_bug en Where do I report a bug?\n";
  }
  std::vector<Question> questions;
  clm::Status s = tiny_llama_demo::read_questions(path, questions);
  REQUIRE_FALSE(s.ok());
  CHECK(s.message() == path + ":3: expected intent<TAB>language<TAB>question, found 1 tab-separated field(s)");

  tiny_llama_demo::ScenarioOptions options;
  options.questions = path;
  tiny_llama_demo::Scenario scenario;
  s = tiny_llama_demo::make_scenario(options, scenario);
  REQUIRE_FALSE(s.ok());
  CHECK(s.message() == path + ":3: expected intent<TAB>language<TAB>question, found 1 tab-separated field(s)");

  options.questions = (dir.path / "missing.tsv").string();
  s = tiny_llama_demo::make_scenario(options, scenario);
  CHECK(s.code() == clm::StatusCode::not_found);
}

TEST_CASE("make_scenario: questions from the file, by the user's language, with repeats") {
  tiny_llama_demo::ScenarioOptions options;
  // make deps installs debian-faq: without it this fails, it does not pass unseen.
  INFO("the Debian FAQ (" << options.faq_en << ", " << options.faq_zh << "): make deps installs debian-faq");
  REQUIRE(std::filesystem::exists(options.faq_en));
  REQUIRE(std::filesystem::exists(options.faq_zh));
  std::vector<Question> file;
  REQUIRE(tiny_llama_demo::read_questions(tiny_llama_demo::default_questions_path(), file).ok());
  std::map<std::string, Question> by_text;
  for (const Question& q : file) by_text[q.text] = q;
  options.users = 12;
  options.turns = 3;
  tiny_llama_demo::Scenario scenario;
  REQUIRE(tiny_llama_demo::make_scenario(options, scenario).ok());
  REQUIRE(scenario.users.size() == 12);
  std::set<std::string> asked;
  int repeated = 0;
  for (std::size_t u = 0; u < scenario.users.size(); ++u) {
    for (const Question& q : scenario.users[u].questions) {
      INFO("user " << u << ": " << q.text);
      REQUIRE(by_text.count(q.text) == 1);
      CHECK(by_text[q.text].intent == q.intent);
      CHECK(q.language == by_text[q.text].language);
      // A repeat may be another user's question, in another language.
      if (!q.repeated) CHECK(q.language == (u % 3 == 2 ? "zh" : "en"));
      CHECK(q.repeated == (asked.count(q.text) == 1));
      repeated += q.repeated ? 1 : 0;
      asked.insert(q.text);
    }
  }
  CHECK(repeated > 0);
}

TEST_CASE("reuse_report: the served snapshot's question is the one whose record made that version") {
  using clm::SnapshotLevel;
  tiny_llama_demo::RunReport run;
  const auto request = [&](std::int32_t user, std::int32_t turn, const std::string& text, const std::string& intent) {
    tiny_llama_demo::RequestRecord r;
    r.user = user;
    r.turn = turn;
    r.question.text = text;
    r.question.intent = intent;
    r.question.language = "en";
    run.requests.push_back(r);
    return &run.requests.back().result.clm;
  };
  run.requests.reserve(8);
  // In order of completion. A makes version 1 of K; B confirms it; C is
  // served it twice and a fallback once; D makes version 2; E is served both.
  auto* a = request(0, 0, "How do I install a package?", "install_package");
  a->recorded = true;
  a->key = "K";
  a->record_result = clm::RecordResult::admitted;
  a->record_version = 1;
  auto* b = request(1, 0, "What command installs a package?", "install_package");
  b->recorded = true;
  b->key = "K";
  b->record_result = clm::RecordResult::confirmed;
  b->record_version = 1;
  auto* c = request(2, 0, "Is Debian free software?", "cost_and_license");
  c->served = {{SnapshotLevel::exact, "K", 1, 0.5f, 0},
               {SnapshotLevel::fallback, "*", 0, 1.0f, 1},
               {SnapshotLevel::exact, "K", 1, 0.75f, 2}};
  auto* d = request(0, 1, "Where do I report a bug?", "report_bug");
  d->recorded = true;
  d->key = "K";
  d->record_result = clm::RecordResult::new_version;
  d->record_version = 2;
  auto* e = request(1, 1, "How can I install software?", "install_package");
  e->served = {{SnapshotLevel::ann, "K", 1, 0.9f, 0}, {SnapshotLevel::ann, "K", 2, 0.8f, 1}};

  const tiny_llama_demo::ReuseReport reuse = tiny_llama_demo::reuse_report(run);
  REQUIRE(reuse.pairs.size() == 4);
  const auto& c_k = reuse.pairs[0];
  CHECK(c_k.asked.text == "Is Debian free software?");
  CHECK(c_k.has_source);
  CHECK(c_k.source.text == "How do I install a package?");  // A made version 1, B only confirmed it
  CHECK(c_k.hits == 2);
  CHECK(c_k.similarity == 0.75f);
  CHECK(c_k.other_intent());
  const auto& c_fallback = reuse.pairs[1];
  CHECK(c_fallback.level == SnapshotLevel::fallback);
  CHECK_FALSE(c_fallback.has_source);
  CHECK_FALSE(c_fallback.other_intent());
  CHECK(reuse.pairs[2].source.text == "How do I install a package?");
  CHECK_FALSE(reuse.pairs[2].other_intent());
  CHECK(reuse.pairs[3].version == 2);
  CHECK(reuse.pairs[3].source.text == "Where do I report a bug?");
  CHECK(reuse.pairs[3].other_intent());
  CHECK(reuse.hits() == 5);
  CHECK(reuse.other_intent_hits() == 3);
  CHECK(reuse.other_intent_pairs() == 2);

  const std::string text = tiny_llama_demo::format_reuse(reuse, "pairs.tsv");
  CHECK_THAT(text, Catch::Contains("  OTHER  asked \"Is Debian free software?\" [cost_and_license] <- served \"How do "
                                   "I install a package?\" [install_package] (exact, K v1, similarity 0.750, 2 hits)"));
  CHECK_THAT(text, Catch::Contains("  ?      asked \"Is Debian free software?\" [cost_and_license] <- served (no "));
  CHECK_THAT(text, Catch::Contains("  same   asked \"How can I install software?\" [install_package]"));
  CHECK_THAT(text, Catch::Contains("  reuse: 5 hits in 4 pairs, of which from another intent: 3 hits in 2 pairs"));
  CHECK_THAT(text, Catch::Contains("  the pairs, as TSV: pairs.tsv"));

  TempFolder dir;
  const std::string path = (dir.path / "pairs.tsv").string();
  REQUIRE(tiny_llama_demo::write_reuse_tsv(reuse, path).ok());
  std::ifstream in(path);
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  REQUIRE(lines.size() == 5);
  CHECK(lines[0].rfind("asked_user\tasked_turn\tasked_intent\tasked\tserved_user", 0) == 0);
  CHECK(lines[1] ==
        "2\t0\tcost_and_license\tIs Debian free software?\t0\t0\tinstall_package\tHow do I install a package?\texact\t"
        "K\t1\t0.7500\t2\t1");
  CHECK(lines[2] == "2\t0\tcost_and_license\tIs Debian free software?\t-\t-\t-\t-\tfallback\t*\t0\t1.0000\t1\t0");

  const tiny_llama_demo::ReuseReport none = tiny_llama_demo::reuse_report({});
  CHECK_THAT(tiny_llama_demo::format_reuse(none, ""),
             Catch::Equals("  reuse: 0 hits in 0 pairs, of which from another intent: 0 hits in 0 pairs (no lookup "
                           "was served a snapshot)\n"));
}
