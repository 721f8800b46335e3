// examples/demo/scenario.cpp: the FAQ excerpt, the questions file and the
// users' questions.
#include "scenario.hpp"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <map>
#include <memory>
#include <random>

#include <fmt/format.h>

namespace tiny_llama_demo {

namespace {

#ifndef CLM_DEMO_QUESTIONS
#error "CLM_DEMO_QUESTIONS: the path of examples/demo/questions.tsv (examples/demo/CMakeLists.txt defines it)"
#endif

bool is_intent(std::string_view s) {
  if (s.empty() || s[0] < 'a' || s[0] > 'z') return false;
  return std::all_of(s.begin(), s.end(),
                     [](char c) { return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_'; });
}

bool is_language(std::string_view s) {
  return s.size() >= 2 && s.size() <= 3 && std::all_of(s.begin(), s.end(), [](char c) { return c >= 'a' && c <= 'z'; });
}

// The questions of one intent in one language, in file order.
struct IntentQuestions {
  std::string intent;
  std::vector<const Question*> questions;
};

void collapse_whitespace(const std::string& in, std::string& out) {
  bool space = false;
  for (char c : in) {
    if (c == ' ' || c == '\n' || c == '\t' || c == '\r') {
      space = !out.empty();
      continue;
    }
    if (space) out.push_back(' ');
    space = false;
    out.push_back(c);
  }
}

}  // namespace

std::int64_t Scenario::questions() const {
  std::int64_t n = 0;
  for (const ScenarioUser& u : users) n += static_cast<std::int64_t>(u.questions.size());
  return n;
}

std::string default_questions_path() { return CLM_DEMO_QUESTIONS; }

clm::Status parse_questions(std::string_view text, std::string_view name, std::vector<Question>& out) {
  std::vector<Question> questions;
  std::map<std::string, std::int64_t, std::less<>> line_of;  // question text -> its line
  std::int64_t number = 0;
  for (std::size_t pos = 0; pos < text.size();) {
    std::size_t end = text.find('\n', pos);
    if (end == std::string_view::npos) end = text.size();
    std::string_view line = text.substr(pos, end - pos);
    pos = end + 1;
    ++number;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.empty() || line[0] == '#') continue;
    const auto error = [&](const std::string& what) {
      return clm::invalid_argument(fmt::format("{}:{}: {}", name, number, what));
    };
    std::vector<std::string_view> fields;
    for (std::size_t at = 0;;) {
      const std::size_t tab = line.find('\t', at);
      fields.push_back(line.substr(at, tab == std::string_view::npos ? std::string_view::npos : tab - at));
      if (tab == std::string_view::npos) break;
      at = tab + 1;
    }
    if (fields.size() != 3) {
      return error(
          fmt::format("expected intent<TAB>language<TAB>question, found {} tab-separated field(s)", fields.size()));
    }
    if (!is_intent(fields[0])) return error(fmt::format("intent '{}' is not a name of [a-z][a-z0-9_]*", fields[0]));
    if (!is_language(fields[1])) {
      return error(fmt::format("language '{}' is not a code of 2 or 3 letters a-z", fields[1]));
    }
    std::string_view question = fields[2];
    while (!question.empty() && question.front() == ' ') question.remove_prefix(1);
    while (!question.empty() && question.back() == ' ') question.remove_suffix(1);
    if (question.empty()) return error("the question is empty");
    const auto [seen, added] = line_of.emplace(std::string(question), number);
    if (!added) return error(fmt::format("the question \"{}\" is already on line {}", question, seen->second));
    Question q;
    q.text = std::string(question);
    q.intent = std::string(fields[0]);
    q.language = std::string(fields[1]);
    questions.push_back(std::move(q));
  }
  if (questions.empty()) return clm::invalid_argument(fmt::format("{}: no questions", name));
  out = std::move(questions);
  return {};
}

clm::Status read_questions(const std::string& path, std::vector<Question>& out) {
  std::string text;
  CLM_RETURN_IF_ERROR(read_text(path, text));
  return parse_questions(text, path, out);
}

clm::Status read_text(const std::string& path, std::string& out) {
  if (!std::filesystem::exists(path)) return clm::not_found(fmt::format("{} does not exist", path));
  const bool gz = path.size() > 3 && path.compare(path.size() - 3, 3, ".gz") == 0;
  std::string text;
  if (gz) {
    // gzip is on every Debian system (it is Essential); no zlib dependency for one file.
    const std::string command = fmt::format("gzip -dc '{}'", path);
    std::unique_ptr<FILE, int (*)(FILE*)> pipe(popen(command.c_str(), "r"), pclose);
    if (!pipe) return clm::io_error(fmt::format("cannot run {}", command));
    char buffer[65536];
    std::size_t n;
    while ((n = std::fread(buffer, 1, sizeof buffer, pipe.get())) > 0) text.append(buffer, n);
    if (pclose(pipe.release()) != 0) return clm::io_error(fmt::format("{} failed", command));
  } else {
    std::unique_ptr<FILE, int (*)(FILE*)> file(std::fopen(path.c_str(), "rb"), std::fclose);
    if (!file) return clm::io_error(fmt::format("cannot read {}", path));
    char buffer[65536];
    std::size_t n;
    while ((n = std::fread(buffer, 1, sizeof buffer, file.get())) > 0) text.append(buffer, n);
  }
  out = std::move(text);
  return {};
}

std::string faq_excerpt(const std::string& faq, const std::string& heading, std::size_t max_bytes) {
  std::size_t at = std::string::npos;
  int seen = 0;
  for (std::size_t pos = 0; pos < faq.size();) {
    const std::size_t end = faq.find('\n', pos);
    const std::size_t line_end = end == std::string::npos ? faq.size() : end;
    if (faq.compare(pos, heading.size(), heading) == 0 && ++seen == 2) {
      at = pos;
      break;
    }
    pos = line_end + 1;
  }
  if (at == std::string::npos) at = 0;
  std::string text;
  collapse_whitespace(faq.substr(at, max_bytes * 4), text);
  std::size_t cut = std::min(max_bytes, text.size());
  while (cut > 0 && cut < text.size() && (static_cast<unsigned char>(text[cut]) & 0xC0) == 0x80) --cut;
  return text.substr(0, cut);
}

clm::Status make_scenario(const ScenarioOptions& options, Scenario& out) {
  if (options.users < 1 || options.turns < 1 || options.system_bytes < 0 || options.arrival_gap_steps < 0) {
    return clm::invalid_argument("scenario: users and turns must be >= 1, system_bytes and the gap >= 0");
  }
  std::vector<Question> all;
  CLM_RETURN_IF_ERROR(read_questions(options.questions.empty() ? default_questions_path() : options.questions, all));
  std::string en, zh;
  clm::Status read = read_text(options.faq_en, en);
  if (!read.ok()) return clm::not_found(fmt::format("{} (install Debian's debian-faq: make deps)", read.message()));
  read = read_text(options.faq_zh, zh);
  if (!read.ok())
    return clm::not_found(fmt::format("{} (install Debian's debian-faq-zh-cn: make deps)", read.message()));
  const auto english_bytes = static_cast<std::size_t>(options.system_bytes) * 2 / 3;
  Scenario s;
  s.system_prompt =
      "You are the support assistant of the Debian project. Answer the user's questions from the "
      "FAQ below, briefly, in the user's language.\n\n" +
      faq_excerpt(en, "1.2. ", english_bytes) + "\n\n" +
      faq_excerpt(zh, "1.2. ", static_cast<std::size_t>(options.system_bytes) - english_bytes);
  // The file's languages and intents in order of first appearance; the
  // questions of each intent by language.
  std::vector<std::string> languages;
  std::map<std::string, std::vector<IntentQuestions>> by_language;
  for (const Question& q : all) {
    if (std::find(languages.begin(), languages.end(), q.language) == languages.end()) languages.push_back(q.language);
    std::vector<IntentQuestions>& intents = by_language[q.language];
    auto it =
        std::find_if(intents.begin(), intents.end(), [&](const IntentQuestions& i) { return i.intent == q.intent; });
    if (it == intents.end()) it = intents.insert(intents.end(), IntentQuestions{q.intent, {}});
    it->questions.push_back(&q);
  }
  std::mt19937_64 rng(options.seed);
  std::vector<Question> asked;
  for (std::int32_t u = 0; u < options.users; ++u) {
    ScenarioUser user;
    user.arrival_step = u * options.arrival_gap_steps;
    // Two users in three speak the file's first language, every third its second.
    const std::string& language = languages[u % 3 == 2 && languages.size() > 1 ? 1 : 0];
    const std::vector<IntentQuestions>& intents = by_language[language];
    for (std::int32_t t = 0; t < options.turns; ++t) {
      Question q;
      if (!asked.empty() && std::uniform_real_distribution<double>(0, 1)(rng) < options.repeat_probability) {
        q = asked[std::uniform_int_distribution<std::size_t>(0, asked.size() - 1)(rng)];
        q.repeated = true;
      } else {
        const IntentQuestions& intent = intents[std::uniform_int_distribution<std::size_t>(0, intents.size() - 1)(rng)];
        q = *intent.questions[std::uniform_int_distribution<std::size_t>(0, intent.questions.size() - 1)(rng)];
        for (const Question& before : asked) q.repeated = q.repeated || before.text == q.text;
        asked.push_back(q);
      }
      user.questions.push_back(q);
    }
    s.users.push_back(std::move(user));
  }
  out = std::move(s);
  return {};
}

}  // namespace tiny_llama_demo
