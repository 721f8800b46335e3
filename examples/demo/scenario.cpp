// examples/demo/scenario.cpp: the FAQ excerpt and the users' questions.
#include "scenario.hpp"

#include <cstdio>
#include <filesystem>
#include <memory>
#include <random>

#include <fmt/format.h>

namespace tiny_llama_demo {

namespace {

// Topics of a Debian support desk; each with paraphrases, in both languages.
struct Topic {
  std::vector<std::string> english;
  std::vector<std::string> chinese;
};

const std::vector<Topic>& topics() {
  static const std::vector<Topic> kTopics = {
      {{"How do I upgrade from Debian 11 to Debian 12?", "What is the right way to upgrade Debian 11 to 12?",
        "Can you walk me through upgrading bullseye to bookworm?"},
       {"如何从 Debian 11 升级到 Debian 12？", "怎样把 Debian 11 升级到 12？"}},
      {{"What is the difference between stable, testing and unstable?", "Should I run stable, testing or unstable?",
        "How do stable, testing and unstable differ?"},
       {"stable、testing 和 unstable 有什么区别？", "我应该用 stable 还是 testing？"}},
      {{"How do I install a package with apt?", "What command installs a package?",
        "How can I install software from the Debian archive?"},
       {"如何用 apt 安装软件包？", "怎样从 Debian 仓库安装软件？"}},
      {{"Is Debian free software?", "Can I use Debian at no cost?", "Do I have to pay for Debian?"},
       {"Debian 是自由软件吗？", "使用 Debian 需要付费吗？"}},
      {{"Where do I report a bug?", "How can I file a bug report against a package?"},
       {"如何报告软件包的缺陷？", "在哪里提交错误报告？"}},
      {{"What are the contrib and non-free areas?", "Why are some packages in non-free?"},
       {"contrib 和 non-free 区是什么？", "为什么有些软件包在 non-free 里？"}},
      {{"How do I find out which version of Debian I am running?", "How can I check my Debian release?"},
       {"如何查看我正在运行的 Debian 版本？", "怎么知道自己的 Debian 是哪个版本？"}},
      {{"What hardware architectures does Debian support?", "Does Debian run on ARM computers?"},
       {"Debian 支持哪些硬件架构？", "Debian 能在 ARM 电脑上运行吗？"}},
  };
  return kTopics;
}

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
  std::mt19937_64 rng(options.seed);
  std::vector<Question> asked;
  const auto& all = topics();
  for (std::int32_t u = 0; u < options.users; ++u) {
    ScenarioUser user;
    user.arrival_step = u * options.arrival_gap_steps;
    const bool chinese = u % 3 == 2;
    for (std::int32_t t = 0; t < options.turns; ++t) {
      Question q;
      if (!asked.empty() && std::uniform_real_distribution<double>(0, 1)(rng) < options.repeat_probability) {
        q = asked[std::uniform_int_distribution<std::size_t>(0, asked.size() - 1)(rng)];
        q.repeated = true;
      } else {
        q.topic = static_cast<std::int32_t>(std::uniform_int_distribution<std::size_t>(0, all.size() - 1)(rng));
        const auto& variants =
            chinese ? all[static_cast<std::size_t>(q.topic)].chinese : all[static_cast<std::size_t>(q.topic)].english;
        q.text = variants[std::uniform_int_distribution<std::size_t>(0, variants.size() - 1)(rng)];
        q.chinese = chinese;
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
