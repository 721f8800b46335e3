// examples/demo/demo_run.cpp: the scenario's arrival loop and progress bar.
#include "demo_run.hpp"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>

#include <fmt/format.h>

#include "byte_tokenizer.hpp"
#include "hf_tokenizer.hpp"

namespace tiny_llama_demo {

namespace {

using tiny_llama::ByteTokenizer;

class ProgressBar {
 public:
  ProgressBar(std::string label, std::int64_t total, bool enabled)
      : label_(std::move(label)), total_(total), enabled_(enabled), terminal_(isatty(STDERR_FILENO) != 0) {}
  void update(std::int64_t done, std::int64_t cached, std::int64_t prompt) {
    if (!enabled_) return;
    const int width = 30;
    const int filled = static_cast<int>(width * done / std::max<std::int64_t>(1, total_));
    const int decile = static_cast<int>(10 * done / std::max<std::int64_t>(1, total_));
    if (!terminal_ && decile == last_decile_) return;
    last_decile_ = decile;
    const std::string line = fmt::format("{:<22} [{}{}] {:>4}/{} requests, {:5.1f}% of prompt tokens cached", label_,
                                         std::string(static_cast<std::size_t>(filled), '#'),
                                         std::string(static_cast<std::size_t>(width - filled), '.'), done, total_,
                                         prompt ? 100.0 * double(cached) / double(prompt) : 0.0);
    std::fprintf(stderr, terminal_ ? "\r%s" : "%s\n", line.c_str());
    if (terminal_ && done == total_) std::fprintf(stderr, "\n");
    std::fflush(stderr);
  }

 private:
  std::string label_;
  std::int64_t total_;
  bool enabled_, terminal_;
  int last_decile_ = -1;
};

}  // namespace

double quantile(std::vector<double> values, double p) {
  if (values.empty()) return 0.0;
  std::sort(values.begin(), values.end());
  const auto rank = static_cast<std::size_t>(std::ceil(p * double(values.size())));
  return values[std::min(values.size() - 1, rank == 0 ? 0 : rank - 1)];
}

clm::Status run_scenario(tiny_llama::Generator& generator, const Scenario& scenario, const RunOptions& options,
                         RunReport& out) {
  struct UserState {
    std::vector<std::int32_t> history;
    std::vector<std::int32_t> byte_history;  // with a tokenizer: the same conversation in byte tokens
    std::int32_t next_turn = 0;
    bool waiting = false;  // a request of this user is in the generator
  };
  const clm_tokenizer::HfTokenizer* const tokenizer = options.tokenizer;
  if (tokenizer != nullptr && options.timestamp != Timestamp::none) {
    return clm::invalid_argument("run_scenario: a timestamp in the prompt is for byte tokens only");
  }
  std::vector<UserState> users(scenario.users.size());
  for (UserState& u : users) {
    if (tokenizer != nullptr) {
      CLM_RETURN_IF_ERROR(tokenizer->append_chat_message({"system", scenario.system_prompt}, u.history));
      u.byte_history = ByteTokenizer::apply_chat_template({{"system", scenario.system_prompt}}, false);
    } else {
      u.history = ByteTokenizer::apply_chat_template({{"system", scenario.system_prompt}}, false);
    }
  }
  const std::size_t system_tokens = users.empty() ? 0 : users.front().history.size();
  std::int64_t submitted = 0;
  auto clock_text = [&] {  // 10:00:00, a second a request
    const std::int64_t t = 36000 + submitted;
    return fmt::format("{:02}:{:02}:{:02}", t / 3600 % 24, t / 60 % 60, t % 60);
  };
  RunReport report;
  const std::int64_t total = scenario.questions();
  std::int64_t done = 0, cached = 0, prompt = 0;
  ProgressBar bar(options.label, total, options.progress);
  clm::Status failure;
  const auto start = std::chrono::steady_clock::now();
  std::int64_t step = 0;
  while (done < total) {
    std::int64_t next_arrival = -1;
    for (std::size_t u = 0; u < users.size(); ++u) {
      UserState& state = users[u];
      const ScenarioUser& user = scenario.users[u];
      if (state.waiting || state.next_turn >= static_cast<std::int32_t>(user.questions.size())) continue;
      if (state.next_turn == 0 && user.arrival_step > step) {
        if (next_arrival < 0 || user.arrival_step < next_arrival) next_arrival = user.arrival_step;
        continue;
      }
      const std::int32_t turn = state.next_turn;
      const Question& question = user.questions[static_cast<std::size_t>(turn)];
      if (tokenizer != nullptr) {
        CLM_RETURN_IF_ERROR(tokenizer->append_chat_message({"user", question.text}, state.history));
        CLM_RETURN_IF_ERROR(tokenizer->append_generation_prompt(state.history));
        ByteTokenizer::append_message({"user", question.text}, state.byte_history);
        ByteTokenizer::append_header("assistant", state.byte_history);
      } else {
        const std::string text = options.timestamp == Timestamp::prompt_end
                                     ? fmt::format("{}\n(sent at {})", question.text, clock_text())
                                     : question.text;
        ByteTokenizer::append_message({"user", text}, state.history);
        ByteTokenizer::append_header("assistant", state.history);
      }
      std::vector<std::int32_t> request_prompt = state.history;
      if (options.timestamp == Timestamp::system_top) {
        // This request's system prompt, then the conversation after the shared one.
        request_prompt = ByteTokenizer::apply_chat_template(
            {{"system", fmt::format("Current time: {}\n{}", clock_text(), scenario.system_prompt)}}, false);
        request_prompt.insert(request_prompt.end(), state.history.begin() + static_cast<std::ptrdiff_t>(system_tokens),
                              state.history.end());
      }
      ++submitted;
      const auto byte_prompt_tokens =
          static_cast<std::int64_t>(tokenizer != nullptr ? state.byte_history.size() : state.history.size());
      tiny_llama::GenerateOptions o;
      o.max_new_tokens = options.max_new_tokens;
      o.temperature = options.temperature;
      o.seed = static_cast<std::uint64_t>(u) * 1000 + static_cast<std::uint64_t>(turn);
      o.cache_salt = "debian-support";  // one tenant: the bot's users share its system prompt
      o.tenant = options.tenant;
      o.use_cache = options.use_cache;
      if (options.prepare) options.prepare(static_cast<std::int32_t>(u), turn, question, o);
      state.waiting = true;
      generator.submit(
          std::move(request_prompt), o, nullptr,
          [&, u, turn, question, byte_prompt_tokens](const tiny_llama::GenerationResult& r) {
            UserState& s = users[u];
            s.waiting = false;
            ++s.next_turn;
            ++done;
            if (!r.status.ok() && failure.ok()) {
              failure = clm::Status(r.status.code(), fmt::format("user {} turn {}: {}", u, turn, r.status.message()));
            }
            // The answer's tokens, then the end of the assistant's turn, join the history.
            s.history.insert(s.history.end(), r.tokens.begin(), r.tokens.end());
            if (tokenizer != nullptr) {
              // ChatML ends a turn with <|im_end|>\n; the byte conversation gets the answer's text.
              std::string answer;
              clm::Status t = tokenizer->decode(r.tokens, answer);
              s.history.push_back(tokenizer->end_of_turn_id());
              if (t.ok()) t = tokenizer->encode("\n", s.history);
              if (!t.ok() && failure.ok()) failure = t;
              ByteTokenizer::encode(answer, s.byte_history);
              s.byte_history.push_back(ByteTokenizer::kEndOfTurn);
            } else {
              s.history.push_back(ByteTokenizer::kEndOfTurn);
            }
            cached += r.cached_tokens;
            prompt += r.prompt_tokens;
            report.requests.push_back({static_cast<std::int32_t>(u), turn, question, r, byte_prompt_tokens});
          });
    }
    if (generator.pending() == 0) {
      if (next_arrival < 0) break;  // nothing runs and no one is left to arrive
      step = next_arrival;
      continue;
    }
    CLM_RETURN_IF_ERROR(generator.step());
    CLM_RETURN_IF_ERROR(failure);
    ++step;
    bar.update(done, cached, prompt);
  }
  CLM_RETURN_IF_ERROR(failure);
  report.wall_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  report.steps = step;
  out = std::move(report);
  return {};
}

}  // namespace tiny_llama_demo
