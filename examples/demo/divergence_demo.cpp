// examples/demo/divergence_demo.cpp: the divergence passes' table (divergence_demo.hpp).
#include "divergence_demo.hpp"

#include <fmt/format.h>

#include "byte_tokenizer.hpp"

namespace tiny_llama_demo {

TimestampPass timestamp_pass(std::string label, const RunReport& run, clm::Engine& engine) {
  TimestampPass pass;
  pass.label = std::move(label);
  for (const RequestRecord& r : run.requests) {
    ++pass.requests;
    pass.prompt_tokens += r.result.prompt_tokens;
    pass.cached_tokens += r.result.cached_tokens;
  }
  pass.report_status = engine.divergence_report({.top_per_tenant = 1}, pass.report);
  return pass;
}

std::string render_byte_tokens(std::span<const std::int32_t> tokens) {
  using tiny_llama::ByteTokenizer;
  std::string bytes, out;
  auto flush = [&] {
    for (char c : ByteTokenizer::valid_utf8(bytes)) {
      if (c == '\n') {
        out += "\\n";
      } else if (static_cast<unsigned char>(c) < 0x20) {
        out += fmt::format("\\x{:02x}", static_cast<unsigned char>(c));
      } else {
        out.push_back(c);
      }
    }
    bytes.clear();
  };
  for (const std::int32_t t : tokens) {
    if (t >= 0 && t < 256) {
      bytes.push_back(static_cast<char>(t));
      continue;
    }
    flush();
    switch (t) {
      case ByteTokenizer::kBeginOfText:
        out += "<|begin_of_text|>";
        break;
      case ByteTokenizer::kStartHeader:
        out += "<|start_header_id|>";
        break;
      case ByteTokenizer::kEndHeader:
        out += "<|end_header_id|>";
        break;
      case ByteTokenizer::kEndOfTurn:
        out += "<|eot_id|>";
        break;
      default:
        out += fmt::format("<{}>", t);
    }
  }
  flush();
  return out;
}

void print_timestamp_passes(const std::vector<TimestampPass>& passes) {
  fmt::print("\nWhere prompts split off the cache (divergence report, docs/observability.md)\n");
  fmt::print("  {:<34} {:>8} {:>14} {:>14} {:>9}\n", "run (cache on)", "requests", "prompt tokens", "cached tokens",
             "hit rate");
  for (const TimestampPass& p : passes) {
    fmt::print("  {:<34} {:>8} {:>14} {:>14} {:>9.3f}\n", p.label, p.requests, p.prompt_tokens, p.cached_tokens,
               p.hit_rate());
  }
  for (const TimestampPass& p : passes) {
    fmt::print("  {}: ", p.label);
    if (!p.report_status.ok()) {
      fmt::print("no report: {}\n", p.report_status.message());
      continue;
    }
    if (p.report.points.empty()) {
      fmt::print("no branch point split at twice\n");
      continue;
    }
    const clm::BranchPoint& b = p.report.points.front();
    fmt::print("tenant {}, token {}: {} requests split off there, {} went on past it into a cached branch\n",
               b.tenant.empty() ? "(none)" : b.tenant, b.depth, b.branches, b.hits);
    fmt::print("      before  \"{}\"\n", render_byte_tokens(b.before));
    fmt::print("      request \"{}\"\n", render_byte_tokens(b.after));
    fmt::print("      cached  \"{}\"\n", render_byte_tokens(b.cached_after));
  }
}

}  // namespace tiny_llama_demo
