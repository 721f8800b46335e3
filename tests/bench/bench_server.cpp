// bench_server: clm_server under load from Debian's wrk, cache on against
// cache off (--prefix-cache off) on the same requests. wrk plays the demo's
// customer-service conversations (examples/demo/scenario.hpp: a 1.5 KB FAQ
// system prompt, three questions per user, English and Chinese) with
// tests/bench/bench_server.lua, one connection per wrk thread, each turn
// sending back the answers the server gave, at 1, 16 and 64 connections.
// Every run starts a fresh server (a cold cache), so both sides see the same
// conversations from the same start; on and off alternate which goes first.
// One JSON object per figure (medians of the runs):
//   server/<conns>  requests_per_s          cache on; baseline cache off
//   server/<conns>  ttft_p50_s, ttft_p99_s  server-side time to first token
//                                           (timings.ttft_seconds) of every
//                                           answer, cache on; baseline off
//   server/<conns>  latency_p99_s           wrk's whole-request latency
//   server/all      responses_5xx           5xx answers over every run (none
//                                           is expected: no drain, no deadline
//                                           set); baseline: every answer
//   server/rss      rss_end_bytes           the server's resident memory at
//                                           the end of the longest run (64
//                                           connections, cache on, 4 x as
//                                           long); baseline: after its first
//                                           tenth (the 64k-token pool has
//                                           filled by then: growth past it
//                                           would be a leak)
// CLM_BENCH_SMOKE=1: 1 and 2 connections, 4 s, one run each.
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "bench_common.hpp"
#include "scenario.hpp"

extern char** environ;

namespace {

using clm_bench::die;
using clm_bench::median;
using clm_bench::print_figure;
namespace fs = std::filesystem;

constexpr int kMaxTokens = 16;

// The server's model: small enough that a 64-connection run answers
// thousands of requests, large enough that a 1.6k-token prefill costs
// what a cache saves.
constexpr const char* kModelConfig =
    R"({"vocab_size": 272, "hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 4,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64, "max_position_embeddings": 4096})";

std::string slurp(const fs::path& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

pid_t spawn(const std::vector<std::string>& args, const fs::path& out, const fs::path& err) {
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 1, out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_addopen(&actions, 2, err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  std::vector<char*> argv;
  for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  pid_t pid = 0;
  const int rc = posix_spawnp(&pid, argv[0], &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  if (rc != 0) die(fmt::format("cannot start {}: {}", args[0], std::strerror(rc)));
  return pid;
}

int wait_exit(pid_t pid) {
  int status = 0;
  if (waitpid(pid, &status, 0) != pid) return -1;
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

std::int64_t rss_bytes(pid_t pid) {
  std::ifstream in(fmt::format("/proc/{}/status", pid));
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stoll(line.substr(6)) * 1024;
  }
  return 0;
}

struct Server {
  pid_t pid = 0;
  int port = 0;
};

Server start_server(const fs::path& dir, bool cache) {
  const fs::path out = dir / "server.out", err = dir / "server.err";
  Server s;
  s.pid = spawn({CLM_SERVER_BIN, "--port", "0", "--config", (dir / "model.json").string(), "--threads", "0",
                 "--page-size", "16", "--pool-tokens", "65536", "--http-threads", "80", "--max-batch", "32",
                 "--default-max-tokens", std::to_string(kMaxTokens), "--prefix-cache", cache ? "on" : "off"},
                out, err);
  for (int i = 0; i < 600; ++i) {
    const std::string text = slurp(out);
    if (const auto at = text.find("listening on 127.0.0.1:"); at != std::string::npos && text.find('\n') != text.npos) {
      s.port = std::stoi(text.substr(at + 23));
      return s;
    }
    int status = 0;
    if (waitpid(s.pid, &status, WNOHANG) == s.pid) die("clm_server exited at start-up: " + slurp(err));
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  die("clm_server did not listen within 60 s");
}

void stop_server(const Server& s, const fs::path& dir) {
  kill(s.pid, SIGTERM);
  const int rc = wait_exit(s.pid);
  if (rc != 0) die(fmt::format("clm_server exited {} after SIGTERM: {}", rc, slurp(dir / "server.err")));
}

struct Run {
  double requests_per_s = 0, ttft_p50 = 0, ttft_p99 = 0, latency_p99 = 0;
  std::int64_t responses = 0, responses_5xx = 0;
  std::int64_t rss_tenth = 0, rss_end = 0;
};

double percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const auto rank = static_cast<std::size_t>(std::ceil(p / 100.0 * static_cast<double>(v.size())));
  return v[std::min(v.size() - 1, rank == 0 ? 0 : rank - 1)];
}

Run run_wrk(const fs::path& dir, bool cache, int connections, int seconds, bool sample_rss) {
  const Server server = start_server(dir, cache);
  const fs::path out = dir / "wrk.out", err = dir / "wrk.err";
  const pid_t wrk = spawn(
      {"wrk", "-t", std::to_string(connections), "-c", std::to_string(connections), "-d", fmt::format("{}s", seconds),
       "--timeout", "120s", "-s", CLM_BENCH_SERVER_LUA, fmt::format("http://127.0.0.1:{}", server.port), "--",
       (dir / "conversations.txt").string(), std::to_string(kMaxTokens), std::to_string(connections)},
      out, err);
  Run run;
  std::atomic<bool> done{false};
  std::thread sampler;
  if (sample_rss) {
    sampler = std::thread([&] {
      const auto start = std::chrono::steady_clock::now();
      const auto tenth = std::chrono::milliseconds(seconds * 100);
      while (!done) {
        const std::int64_t rss = rss_bytes(server.pid);
        if (run.rss_tenth == 0 && std::chrono::steady_clock::now() - start >= tenth) run.rss_tenth = rss;
        run.rss_end = rss;
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
      }
    });
  }
  const int rc = wait_exit(wrk);
  done = true;
  if (sampler.joinable()) sampler.join();
  stop_server(server, dir);
  if (rc != 0) die(fmt::format("wrk exited {}: {}", rc, slurp(err)));
  std::istringstream lines(slurp(out));
  std::string line, last;
  while (std::getline(lines, line)) {
    if (line.rfind("{\"requests\"", 0) == 0) last = line;
  }
  if (last.empty()) die("wrk printed no summary: " + slurp(out) + slurp(err));
  const nlohmann::json summary = nlohmann::json::parse(last);
  std::vector<double> ttft = summary["ttft"].get<std::vector<double>>();
  for (const auto& [status, count] : summary["statuses"].items()) {
    run.responses += count.get<std::int64_t>();
    if (status.front() == '5') run.responses_5xx += count.get<std::int64_t>();
  }
  if (ttft.empty()) die(fmt::format("no answer in {} s at {} connections", seconds, connections));
  if (summary["socket_errors"].get<std::int64_t>() != 0) {
    die(fmt::format("wrk saw {} socket errors", summary["socket_errors"].get<std::int64_t>()));
  }
  run.requests_per_s = static_cast<double>(ttft.size()) / summary["seconds"].get<double>();
  run.ttft_p50 = percentile(ttft, 50);
  run.ttft_p99 = percentile(ttft, 99);
  run.latency_p99 = summary["latency_p99_s"].get<double>();
  return run;
}

}  // namespace

int main() {
  const bool smoke = clm_bench::smoke_run();
  const std::vector<int> levels = smoke ? std::vector<int>{1, 2} : std::vector<int>{1, 16, 64};
  const int runs = smoke ? 1 : 3;
  const int seconds = smoke ? 4 : 15;

  const fs::path dir = fs::temp_directory_path() / fmt::format("bench_server.{}", getpid());
  fs::create_directories(dir);
  std::ofstream(dir / "model.json") << kModelConfig;
  tiny_llama_demo::ScenarioOptions options;
  options.users = 256;
  options.turns = 3;
  tiny_llama_demo::Scenario scenario;
  clm_bench::check(tiny_llama_demo::make_scenario(options, scenario), "make_scenario");
  {
    std::ofstream conversations(dir / "conversations.txt");
    conversations << nlohmann::json(scenario.system_prompt).dump() << "\n";
    for (const auto& user : scenario.users) {
      for (std::size_t t = 0; t < user.questions.size(); ++t) {
        conversations << (t ? "\t" : "") << nlohmann::json(user.questions[t].text).dump();
      }
      conversations << "\n";
    }
  }

  std::int64_t responses = 0, responses_5xx = 0;
  for (const int connections : levels) {
    std::vector<double> rps_on, rps_off, p50_on, p50_off, p99_on, p99_off, lat_on, lat_off;
    for (int r = 0; r < runs; ++r) {
      Run on, off;
      if (r % 2 == 0) {
        on = run_wrk(dir, true, connections, seconds, false);
        off = run_wrk(dir, false, connections, seconds, false);
      } else {
        off = run_wrk(dir, false, connections, seconds, false);
        on = run_wrk(dir, true, connections, seconds, false);
      }
      for (const Run* x : {&on, &off}) {
        responses += x->responses;
        responses_5xx += x->responses_5xx;
      }
      rps_on.push_back(on.requests_per_s);
      rps_off.push_back(off.requests_per_s);
      p50_on.push_back(on.ttft_p50);
      p50_off.push_back(off.ttft_p50);
      p99_on.push_back(on.ttft_p99);
      p99_off.push_back(off.ttft_p99);
      lat_on.push_back(on.latency_p99);
      lat_off.push_back(off.latency_p99);
      std::fprintf(stderr,
                   "bench_server: %d connections, run %d of %d: %.1f requests/s cache on (TTFT p50 %.4f s, p99 %.4f "
                   "s), %.1f off (TTFT p50 %.4f s, p99 %.4f s)\n",
                   connections, r + 1, runs, on.requests_per_s, on.ttft_p50, on.ttft_p99, off.requests_per_s,
                   off.ttft_p50, off.ttft_p99);
    }
    const std::string name = fmt::format("connections={}", connections);
    print_figure("server", name, "requests_per_s", median(rps_on), "requests/s", "requests_per_s_cache_off",
                 median(rps_off));
    print_figure("server", name, "ttft_p50_s", median(p50_on), "s", "ttft_p50_s_cache_off", median(p50_off));
    print_figure("server", name, "ttft_p99_s", median(p99_on), "s", "ttft_p99_s_cache_off", median(p99_off));
    print_figure("server", name, "latency_p99_s", median(lat_on), "s", "latency_p99_s_cache_off", median(lat_off));
  }
  // The longest run: the most connections, cache on, four times as long, its
  // memory sampled; by its first tenth the pool has filled (and evicts since).
  const Run longest = run_wrk(dir, true, levels.back(), 4 * seconds, true);
  responses += longest.responses;
  responses_5xx += longest.responses_5xx;
  std::fprintf(
      stderr, "bench_server: the longest run: %.1f requests/s, RSS %.1f MB after a tenth, %.1f MB at the end\n",
      longest.requests_per_s, static_cast<double>(longest.rss_tenth) / 1e6, static_cast<double>(longest.rss_end) / 1e6);
  print_figure("server", fmt::format("rss/connections={}/seconds={}", levels.back(), 4 * seconds), "rss_end_bytes",
               static_cast<double>(longest.rss_end), "bytes", "rss_after_first_tenth_bytes",
               static_cast<double>(longest.rss_tenth));
  print_figure("server", "all", "responses_5xx", static_cast<double>(responses_5xx), "responses", "responses",
               static_cast<double>(responses));
  std::error_code ignored;
  fs::remove_all(dir, ignored);
  return 0;
}
