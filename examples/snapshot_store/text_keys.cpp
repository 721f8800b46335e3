// examples/snapshot_store/text_keys.cpp: `clm_store key`: the suffix key of each line of text, as the store would make
// it.
#include "commands.hpp"

namespace clm_store_cli {

// ---- key ---------------------------------------------------------------------

const std::string_view kKeyUsage =
    "usage: clm_store key [--json] [--lexicons DIR [--replace-lexicons]] < lines.txt\n"
    "\n"
    "Prints, for each line of UTF-8 text on stdin, its suffix key and the key's fingerprint\n"
    "(FNV-1a 64, hex), tab-separated, and for a key that abstained (low information: never\n"
    "served at levels 1 and 2) a third column \"abstained: <why>\". A line the keyer refuses (invalid UTF-8, no "
    "content,\n"
    "over 16 KiB) gets its error on stderr and an empty line on stdout, so output lines match\n"
    "input lines; the other lines go on, and the exit status is 1 at the end.\n"
    "\n"
    "  --json          one JSON object per line: line, key, fingerprint, group, entity, action,\n"
    "                  object, details, low_information, abstain_reason (a failed line: line,\n"
    "                  error, code)\n"
    "  --lexicons DIR  a directory of *.tsv lexicons added to the built-in ones\n"
    "  --replace-lexicons  DIR's lexicons instead of the built-in ones\n";

int cmd_key(const Args& args) {
  args.no_positionals();
  const bool json = args.has("--json");
  std::unique_ptr<clm::SuffixKeyer> keyer;
  check(clm::SuffixKeyer::create(keyer_config(args), keyer), "cannot load the lexicons");

  std::string line;
  std::size_t n = 0, failed = 0;
  while (std::getline(std::cin, line)) {
    ++n;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    clm::SuffixKey k;
    const clm::Status s = keyer->make_key(line, k);
    if (!s.ok()) {
      ++failed;
      std::fflush(stdout);  // keeps stdout and stderr in order on a terminal
      fmt::print(stderr, "clm_store key: line {}: {}: {}\n", n, s.code_name(), s.message());
      if (json) {
        fmt::print("{}\n", dump(Json{{"line", n}, {"error", s.message()}, {"code", s.code_name()}}));
      } else {
        fmt::print("\n");
      }
      continue;
    }
    if (json) {
      Json j;
      j["line"] = n;
      j["key"] = k.key;
      j["fingerprint"] = hex(k.fingerprint);
      j["group"] = hex(k.group);
      j["entity"] = k.entity;
      j["action"] = k.action;
      j["object"] = k.object;
      j["details"] = k.details;
      j["low_information"] = k.low_information;
      j["abstain_reason"] = k.abstain_reason;
      fmt::print("{}\n", dump(j));
    } else {
      // A third column for an abstained key: the store never serves it at levels 1 and 2.
      if (k.low_information) {
        fmt::print("{}\t{}\tabstained: {}\n", k.key, hex(k.fingerprint), k.abstain_reason);
      } else {
        fmt::print("{}\t{}\n", k.key, hex(k.fingerprint));
      }
    }
  }
  if (std::cin.bad()) throw Failure{"reading stdin failed"};
  if (failed) {
    std::fflush(stdout);
    fmt::print(stderr, "clm_store key: {} of {} lines failed\n", failed, n);
    return kExitProblem;
  }
  return 0;
}

}  // namespace clm_store_cli
