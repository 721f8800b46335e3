// clm_tokenize: the token ids of each line of stdin, one JSON array a line,
// for a person checking where page boundaries fall in a prompt.
//
//   clm_tokenize --tokenizer tokenizer.json < prompt.txt
//   echo 'Debian 是什么？' | clm_tokenize --tokenizer tokenizer.json     # [75880, 220, 105518, 11319]
//
// Each line is encoded without its newline. Exit status: 0; 1 when the
// tokenizer file cannot be loaded or a line is not valid UTF-8 (the message
// names the line); 2 on a usage error.
#include <cstdio>
#include <iostream>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>

#include "hf_tokenizer.hpp"

namespace {

constexpr const char* kUsage =
    "usage: clm_tokenize --tokenizer FILE\n"
    "  reads stdin and prints the token ids of each line as one JSON array per line\n";

}  // namespace

int main(int argc, char** argv) {
  std::string path;
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    if (arg == "--tokenizer" && i + 1 < argc) {
      path = argv[++i];
    } else if (arg == "--help" || arg == "-h") {
      fmt::print("{}", kUsage);
      return 0;
    } else {
      fmt::print(stderr, "clm_tokenize: unknown argument '{}'\n{}", arg, kUsage);
      return 2;
    }
  }
  if (path.empty()) {
    fmt::print(stderr, "clm_tokenize: --tokenizer FILE is required\n{}", kUsage);
    return 2;
  }
  clm_tokenizer::HfTokenizer tokenizer;
  if (const clm::Status s = clm_tokenizer::HfTokenizer::load(path, tokenizer); !s.ok()) {
    fmt::print(stderr, "clm_tokenize: {}: {}\n", s.code_name(), s.message());
    return 1;
  }
  std::ios::sync_with_stdio(false);
  std::string line;
  std::vector<std::int32_t> ids;
  for (long number = 1; std::getline(std::cin, line); ++number) {
    ids.clear();
    if (const clm::Status s = tokenizer.encode(line, ids); !s.ok()) {
      fmt::print(stderr, "clm_tokenize: line {}: {}\n", number, s.message());
      return 1;
    }
    fmt::print("[{}]\n", fmt::join(ids, ", "));
  }
  return 0;
}
