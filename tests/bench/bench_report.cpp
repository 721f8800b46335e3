// tests/bench/bench_report.cpp: writes the benchmark report (docs/benchmarks.md)
// from the results one run of tests/bench/report.sh collected, and the gnuplot
// scripts of its plots (report.sh runs gnuplot on them afterwards).
//
//   bench_report RESULTS_DIR DOCS_DIR
//
// RESULTS_DIR holds what report.sh wrote:
//   machine.tsv          key<TAB>value: cpu, cores, memory, kernel, date, commit, smoke, load_*
//   runs.tsv             program<TAB>exit status<TAB>seconds<TAB>command, one line per program run
//   <program>.jsonl      its stdout: one figure per line, as print_figure (bench_common.hpp) prints
//                        {"bench","case","metric","value","unit","baseline_metric","baseline","ratio"}
//   replay_sweep.jsonl   one `replay --json` object per (workload, policy, capacity)
// It writes DOCS_DIR/benchmarks.md, and RESULTS_DIR/plots/<name>.dat + <name>.gp
// whose output is DOCS_DIR/bench-<name>.png. DOCS_DIR/bench-ann.png, when
// present, is tests/bench/plot_store.sh's plot of bench_store's ANN sweep.
//
// Exit status: 0 written, 1 unreadable input or unwritable output, 2 usage.
#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr std::string_view kReplaySweepFile = "replay_sweep.jsonl";
constexpr std::string_view kReplaySweepProgram = "replay_sweep";
constexpr std::string_view kE2eProgram = "bench_e2e";
constexpr std::string_view kStoreProgram = "bench_store";
constexpr std::string_view kAnnPlot = "bench-ann.png";
constexpr std::string_view kAnnCaseMarker = "/ann_ef";  // bench_store's "<dataset>/ann_ef<ef_search>"

// Thrown for input or output the report cannot be made from; main prints it.
struct ReportError {
  std::string message;
};

// ---- inputs ------------------------------------------------------------------------

struct Figure {
  std::string bench;
  std::string bench_case;
  std::string metric;
  double value = 0;
  std::string unit;
  std::string baseline_metric;
  double baseline = 0;
  double ratio = 0;
};

struct ProgramRun {
  std::string program;
  int exit_status = 0;
  double seconds = 0;
  std::string command;
  std::vector<Figure> figures;
  std::vector<std::string> unparsed_lines;  // stdout lines that were not figures (kept, not hidden)
};

struct ReplayPoint {
  std::string workload;  // as given to --workload: "gsp" or "mooncake:PATH"
  std::string policy;
  std::int64_t page_size = 0;
  std::int64_t capacity = 0;
  std::int64_t evicted_tokens = 0;
  std::int64_t requests = 0;
  std::int64_t prompt_tokens = 0;
  std::optional<double> hit_rate;  // null in the JSON when it is not finite
};

using Machine = std::map<std::string, std::string>;

std::vector<std::string> split_tabs(const std::string& line) {
  std::vector<std::string> fields;
  std::size_t start = 0;
  for (std::size_t tab; (tab = line.find('\t', start)) != std::string::npos; start = tab + 1) {
    fields.push_back(line.substr(start, tab - start));
  }
  fields.push_back(line.substr(start));
  return fields;
}

std::vector<std::string> read_lines(const fs::path& path) {
  std::ifstream in(path);
  if (!in) throw ReportError{fmt::format("cannot read {}", path.string())};
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) {
    if (!line.empty()) lines.push_back(line);
  }
  return lines;
}

Machine read_machine(const fs::path& results) {
  Machine machine;
  for (const std::string& line : read_lines(results / "machine.tsv")) {
    const auto fields = split_tabs(line);
    if (fields.size() == 2) machine[fields[0]] = fields[1];
  }
  return machine;
}

std::string machine_field(const Machine& machine, const std::string& key) {
  const auto it = machine.find(key);
  return it == machine.end() || it->second.empty() ? "unknown" : it->second;
}

// One stdout line as a figure, or nothing when it is not one (not JSON, a
// missing field, a value such as inf that JSON cannot hold).
std::optional<Figure> parse_figure(const std::string& line) {
  const json object = json::parse(line, nullptr, /*allow_exceptions=*/false);
  if (!object.is_object()) return std::nullopt;
  auto text = [&](const char* key) -> std::optional<std::string> {
    const auto it = object.find(key);
    if (it == object.end() || !it->is_string()) return std::nullopt;
    return it->get<std::string>();
  };
  auto number = [&](const char* key) -> std::optional<double> {
    const auto it = object.find(key);
    if (it == object.end() || !it->is_number()) return std::nullopt;
    return it->get<double>();
  };
  const auto bench = text("bench"), bench_case = text("case"), metric = text("metric"), unit = text("unit"),
             baseline_metric = text("baseline_metric");
  const auto value = number("value"), baseline = number("baseline"), ratio = number("ratio");
  if (!bench || !bench_case || !metric || !unit || !baseline_metric || !value || !baseline || !ratio) {
    return std::nullopt;
  }
  return Figure{*bench, *bench_case, *metric, *value, *unit, *baseline_metric, *baseline, *ratio};
}

// Every program report.sh ran, in the order it ran them, with its figures.
std::vector<ProgramRun> read_runs(const fs::path& results) {
  std::vector<ProgramRun> runs;
  for (const std::string& line : read_lines(results / "runs.tsv")) {
    const auto fields = split_tabs(line);
    if (fields.size() != 4) throw ReportError{fmt::format("runs.tsv: not 4 tab-separated fields: {}", line)};
    ProgramRun run;
    run.program = fields[0];
    try {
      run.exit_status = std::stoi(fields[1]);
      run.seconds = std::stod(fields[2]);
    } catch (const std::exception&) {
      throw ReportError{fmt::format("runs.tsv: bad exit status or seconds: {}", line)};
    }
    run.command = fields[3];
    if (run.program != kReplaySweepProgram) {
      const fs::path output = results / (run.program + ".jsonl");
      if (fs::exists(output)) {
        for (const std::string& out_line : read_lines(output)) {
          if (auto figure = parse_figure(out_line)) {
            run.figures.push_back(std::move(*figure));
          } else {
            run.unparsed_lines.push_back(out_line);
          }
        }
      }
    }
    runs.push_back(std::move(run));
  }
  return runs;
}

std::vector<ReplayPoint> read_replay_sweep(const fs::path& results) {
  std::vector<ReplayPoint> points;
  const fs::path path = results / kReplaySweepFile;
  if (!fs::exists(path)) return points;
  for (const std::string& line : read_lines(path)) {
    const json object = json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (!object.is_object()) throw ReportError{fmt::format("{}: not a JSON object: {}", path.string(), line)};
    try {
      ReplayPoint p;
      p.workload = object.at("workload").get<std::string>();
      p.policy = object.at("policy").get<std::string>();
      p.page_size = object.at("page_size").get<std::int64_t>();
      p.capacity = object.at("capacity").get<std::int64_t>();
      p.evicted_tokens = object.at("evicted_tokens").get<std::int64_t>();
      p.requests = object.at("requests").get<std::int64_t>();
      p.prompt_tokens = object.at("prompt_tokens").get<std::int64_t>();
      if (object.at("hit_rate").is_number()) p.hit_rate = object.at("hit_rate").get<double>();
      points.push_back(std::move(p));
    } catch (const json::exception& e) {
      throw ReportError{fmt::format("{}: {}: {}", path.string(), e.what(), line)};
    }
  }
  return points;
}

const ProgramRun* find_run(const std::vector<ProgramRun>& runs, std::string_view program) {
  for (const ProgramRun& run : runs) {
    if (run.program == program) return &run;
  }
  return nullptr;
}

// ---- formatting --------------------------------------------------------------------

// Figures span ns to requests/s: four significant digits, no exponent below 1e7.
std::string number(double x) {
  if (!std::isfinite(x)) return "n/a";
  if (x != 0 && (std::fabs(x) >= 1e7 || std::fabs(x) < 1e-4)) return fmt::format("{:.4g}", x);
  std::string s = fmt::format("{:.4g}", x);
  if (s.find('e') != std::string::npos) s = fmt::format("{:.0f}", x);
  return s;
}

// 1048576 as "1,048,576": capacities are read digit group by digit group.
std::string with_thousands(std::int64_t n) {
  std::string digits = fmt::format("{}", n), out;
  for (std::size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return out;
}

// A capacity as an axis label, three digits at most: 16384 as "16.4k", 3000000 as "3M".
std::string capacity_tic(std::int64_t tokens) {
  const double n = static_cast<double>(tokens);
  if (n >= 1e6) return fmt::format("{:.3g}M", n / 1e6);
  if (n >= 1e3) return fmt::format("{:.3g}k", n / 1e3);
  return fmt::format("{}", tokens);
}

// A table cell: pipes would end the cell.
std::string cell(std::string_view text) {
  std::string out;
  for (const char c : text) {
    if (c == '|')
      out += "\\|";
    else
      out += c;
  }
  return out;
}

std::string workload_title(std::string_view workload) {
  constexpr std::string_view kMooncake = "mooncake:";
  if (workload == "gsp") return "gsp (SGLang generated-shared-prefix: 64 groups x 16 prompts)";
  if (workload.substr(0, kMooncake.size()) == kMooncake) {
    return fmt::format("Mooncake conversation trace ({})",
                       fs::path(workload.substr(kMooncake.size())).filename().string());
  }
  return std::string(workload);
}

// A file-name part from a workload: "gsp", "mooncake", or letters of the name.
std::string workload_slug(std::string_view workload) {
  if (workload.substr(0, 8) == "mooncake") return "mooncake";
  std::string slug;
  for (const char c : workload) {
    if (std::isalnum(static_cast<unsigned char>(c)))
      slug += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  }
  return slug.empty() ? "workload" : slug;
}

// A gnuplot single-quoted string (a quote is doubled there).
std::string gp_quoted(std::string_view text) {
  std::string out = "'";
  for (const char c : text) {
    out += c;
    if (c == '\'') out += '\'';
  }
  out += '\'';
  return out;
}

// ---- the report ----------------------------------------------------------------------

class Report {
 public:
  Report(fs::path results, fs::path docs, Machine machine, std::vector<ProgramRun> runs, std::vector<ReplayPoint> sweep)
      : results_(std::move(results)),
        docs_(std::move(docs)),
        plots_(results_ / "plots"),
        machine_(std::move(machine)),
        runs_(std::move(runs)),
        sweep_(std::move(sweep)) {}

  void write() {
    fs::create_directories(plots_);
    fs::create_directories(docs_);
    header();
    runs_table();
    hit_rate_section();
    ttft_section();
    ann_section();
    fraction_section();
    every_figure_section();
    const fs::path path = docs_ / "benchmarks.md";
    std::ofstream out(path);
    out << md_.str();
    if (!out.flush()) throw ReportError{fmt::format("cannot write {}", path.string())};
  }

 private:
  bool smoke() const { return machine_field(machine_, "smoke") == "1"; }

  std::string machine_line() const {
    return fmt::format("{}, {} cores, {} memory", machine_field(machine_, "cpu"), machine_field(machine_, "cores"),
                       machine_field(machine_, "memory"));
  }

  // The line under every figure: where, how, and against what it was measured.
  void provenance(std::string_view command, std::string_view baseline) {
    md_ << fmt::format("*Machine: {}. Command: `{}`. Baseline (same run): {}.*\n\n", machine_line(), command, baseline);
  }

  std::string command_of(std::string_view program) const {
    const ProgramRun* run = find_run(runs_, program);
    return run ? run->command : std::string(program);
  }

  // What a section says when its programs did not run or printed nothing for
  // it (the smoke test looks for these words).
  void not_measured(std::string_view why) { md_ << fmt::format("Not measured in this run ({}).\n\n", why); }

  void image(std::string_view name, std::string_view alt) { md_ << fmt::format("![{}]({})\n\n", alt, name); }

  // Writes plots_/<name>.dat and <name>.gp; the .gp draws DOCS/bench-<name>.png.
  std::string plot(const std::string& name, const std::string& data, const std::string& script) {
    const std::string png = "bench-" + name + ".png";
    write_file(plots_ / (name + ".dat"), data);
    write_file(plots_ / (name + ".gp"),
               fmt::format("set terminal pngcairo size {} font \",10\" noenhanced\nset output {}\n"
                           "set datafile missing 'NaN'\nset datafile separator '\\t'\ndata = {}\n{}",
                           plot_size(data), gp_quoted((docs_ / png).string()),
                           gp_quoted((plots_ / (name + ".dat")).string()), script));
    return png;
  }

  // Taller for bar charts with many rows (one per data line).
  static std::string plot_size(const std::string& data) {
    const auto rows = std::count(data.begin(), data.end(), '\n');
    return fmt::format("1100,{}", std::max<std::ptrdiff_t>(520, 160 + 26 * rows));
  }

  static void write_file(const fs::path& path, const std::string& text) {
    std::ofstream out(path);
    out << text;
    if (!out.flush()) throw ReportError{fmt::format("cannot write {}", path.string())};
  }

  void header() {
    md_ << "# Benchmarks\n\n";
    md_ << "<!-- Generated by tests/bench/report.sh (`make bench`); edits are overwritten. -->\n\n";
    if (smoke()) {
      md_ << "> **Smoke run (CLM_BENCH_SMOKE=1)**: tiny sizes, one repetition, a truncated trace. These figures "
             "check that the report is made; they are not measurements. Run `make bench` for those.\n\n";
    }
    md_ << fmt::format(
        "Every figure below was measured by `make bench` in one run, on one machine, against a baseline measured in "
        "the same run (interleaved with it where the bench says so), so that a loaded or slow machine moves both "
        "alike. Ratios are value / baseline.\n\n"
        "| | |\n| --- | --- |\n| machine | {} |\n| kernel | {} |\n| date | {} |\n| commit | {} |\n"
        "| load average (1 min) | {} at the start, {} at the end |\n\n",
        cell(machine_line()), cell(machine_field(machine_, "kernel")), cell(machine_field(machine_, "date")),
        cell(machine_field(machine_, "commit")), machine_field(machine_, "load_start"),
        machine_field(machine_, "load_end"));
  }

  void runs_table() {
    md_ << "## Runs\n\nWhat ran, in order, and how long it took (the JSON lines each program printed are in its "
           "`<program>.jsonl` beside the report's inputs).\n\n";
    md_ << "| program | command | seconds | exit status | figures |\n| --- | --- | ---: | --- | ---: |\n";
    for (const ProgramRun& run : runs_) {
      const std::string status = run.exit_status == 0    ? "0"
                                 : run.exit_status == 77 ? "77 (skipped)"
                                                         : fmt::format("**{} (failed)**", run.exit_status);
      const std::size_t figures = run.program == kReplaySweepProgram ? sweep_.size() : run.figures.size();
      md_ << fmt::format("| {} | `{}` | {:.1f} | {} | {} |\n", run.program, cell(run.command), run.seconds, status,
                         figures);
    }
    md_ << "\n";
  }

  // ---- 1. hit rate against capacity ----------------------------------------------

  void hit_rate_section() {
    md_ << "## Hit rate against capacity\n\n";
    if (sweep_.empty()) {
      not_measured("no replay sweep");
      return;
    }
    md_ << "The prompt hit rate (prompt tokens served from the cache / prompt tokens) of `replay` over each "
           "workload, per eviction policy and pool capacity, page size 16 "
           "(`../shared/workloads.md` describes the workloads and the replay protocol). Each point is one "
           "deterministic replay. The largest capacity of each workload is meant to hold every prompt; where it "
           "evicted nothing the table says so, and its hit rate is the most any policy can reach there. `priority` "
           "orders leaves by the priority each insert carries, ties "
           "by LRU; the replay inserts every request at the same priority, so it must match `lru`. `belady` is "
           "the offline optimum (evicts the leaf whose next use is farthest, knowing every request to come; "
           "docs/eviction.md): no engine can run it, it measures how far the others are from what was possible; "
           "the last column is the best of the others against LRU.\n\n";
    std::vector<std::string> workloads;
    for (const ReplayPoint& p : sweep_) {
      if (std::find(workloads.begin(), workloads.end(), p.workload) == workloads.end()) workloads.push_back(p.workload);
    }
    for (const std::string& workload : workloads) hit_rate_workload(workload);
  }

  void hit_rate_workload(const std::string& workload) {
    std::vector<std::string> policies;
    std::set<std::int64_t> capacities;
    std::map<std::pair<std::int64_t, std::string>, const ReplayPoint*> at;
    for (const ReplayPoint& p : sweep_) {
      if (p.workload != workload) continue;
      if (std::find(policies.begin(), policies.end(), p.policy) == policies.end()) policies.push_back(p.policy);
      capacities.insert(p.capacity);
      at[{p.capacity, p.policy}] = &p;
    }
    // The unbounded reference: the largest capacity, if nothing was evicted there under LRU.
    const std::int64_t largest = *capacities.rbegin();
    const ReplayPoint* unbounded = at.count({largest, "lru"}) ? at[{largest, "lru"}] : nullptr;
    if (unbounded && (unbounded->evicted_tokens != 0 || !unbounded->hit_rate)) unbounded = nullptr;
    auto hit = [&](std::int64_t capacity, const std::string& policy) -> std::optional<double> {
      const auto it = at.find({capacity, policy});
      return it == at.end() ? std::nullopt : it->second->hit_rate;
    };
    const ReplayPoint& any = *at.begin()->second;

    md_ << fmt::format("### {}\n\n", workload_title(workload));
    md_ << fmt::format("{} requests, {} prompt tokens, page size {}.\n\n", any.requests, any.prompt_tokens,
                       any.page_size);

    // Table: capacity rows, a column per policy, then the best against LRU.
    md_ << "| capacity (tokens) |";
    for (const std::string& policy : policies) md_ << fmt::format(" {} |", policy);
    md_ << " best online / lru |\n| ---: |";
    for (std::size_t i = 0; i <= policies.size(); ++i) md_ << " ---: |";
    md_ << "\n";
    std::string data = "# capacity";
    for (const std::string& policy : policies) data += "\t" + policy;
    data += "\n";
    for (const std::int64_t capacity : capacities) {
      md_ << fmt::format("| {}{} |", with_thousands(capacity),
                         unbounded && capacity == largest ? " (evicts nothing)" : "");
      data += fmt::format("{}", capacity);
      double best = 0;
      for (const std::string& policy : policies) {
        const auto h = hit(capacity, policy);
        md_ << (h ? fmt::format(" {:.4f} |", *h) : std::string(" n/a |"));
        data += h ? fmt::format("\t{:.6f}", *h) : std::string("\tNaN");
        if (h && policy != "belady") best = std::max(best, *h);  // offline: not a policy to choose
      }
      const auto lru = hit(capacity, "lru");
      md_ << (lru && *lru > 0 ? fmt::format(" {:.3f} |\n", best / *lru) : std::string(" n/a |\n"));
      data += "\n";
    }
    md_ << "\n";

    // A colour, point and dash per policy (in the order the sweep ran them),
    // the same in every plot; points shrink in that order, so that one drawn
    // over an equal one (priority over lru) still shows both.
    constexpr std::string_view kColours[] = {"#1b9e77", "#d95f02", "#7570b3", "#e7298a", "#66a61e", "#a6761d"};
    constexpr int kPointTypes[] = {7, 5, 9, 6, 13, 11};
    std::string tics;  // one tic per measured capacity
    for (const std::int64_t capacity : capacities) {
      tics += fmt::format("{}{} {}", tics.empty() ? "" : ", ", gp_quoted(capacity_tic(capacity)), capacity);
    }
    std::string plots;
    for (std::size_t i = 0; i < policies.size(); ++i) {
      const std::size_t style = i % std::size(kColours);
      plots += fmt::format("{}data using 1:{} with linespoints lw 2 pt {} ps {} dt {} lc rgb '{}' title {}",
                           i ? ", \\\n     " : "", i + 2, kPointTypes[style], 1.6 - 0.25 * static_cast<double>(i),
                           i + 1, kColours[style], gp_quoted(policies[i]));
    }
    if (unbounded) {
      plots += fmt::format(", \\\n     {:.6f} with lines dt 3 lw 1 lc rgb 'gray30' title {}", *unbounded->hit_rate,
                           gp_quoted(fmt::format("no eviction: {:.4f}", *unbounded->hit_rate)));
    }
    const std::string png =
        plot("hit-rate-" + workload_slug(workload), data,
             fmt::format("set title {}\nset xlabel 'pool capacity (tokens, log scale)'\n"
                         "set ylabel 'prompt hit rate (cached / prompt tokens)'\nset logscale x 10\n"
                         "set xtics ({})\nset autoscale xfix\nset yrange [0:*]\n"
                         "set offsets graph 0.04, graph 0.04, graph 0.08, 0\n"
                         // Hit rates rise with capacity: the bottom right stays empty.
                         "set key inside bottom right box opaque\nset grid\n"
                         "plot {}\n",
                         gp_quoted(fmt::format("{}: hit rate against capacity, per eviction policy (page {})",
                                               workload_title(workload), any.page_size)),
                         tics, plots));
    image(png, fmt::format("hit rate against capacity on {}", workload_slug(workload)));
    provenance(sweep_command(workload),
               unbounded ? fmt::format("`lru` at each capacity, and the replay with no eviction ({} tokens, hit rate "
                                       "{:.4f})",
                                       with_thousands(largest), *unbounded->hit_rate)
                         : std::string("`lru` at each capacity"));
  }

  // The sweep's command (its --workload W a placeholder) for one workload.
  std::string sweep_command(const std::string& workload) const {
    std::string command = command_of(kReplaySweepProgram);
    constexpr std::string_view kPlaceholder = "--workload W ";
    if (const auto at = command.find(kPlaceholder); at != std::string::npos) {
      command.replace(at, kPlaceholder.size(), fmt::format("--workload {} ", workload));
    }
    return command;
  }

  // ---- 2. TTFT per turn ----------------------------------------------------------

  // Turn number of a "turn_<n>" case.
  static std::optional<int> turn_of(std::string_view bench_case) {
    constexpr std::string_view kTurn = "turn_";
    if (bench_case.substr(0, kTurn.size()) != kTurn) return std::nullopt;
    try {
      std::size_t used = 0;
      const int turn = std::stoi(std::string(bench_case.substr(kTurn.size())), &used);
      if (used != bench_case.size() - kTurn.size()) return std::nullopt;
      return turn;
    } catch (const std::exception&) {
      return std::nullopt;
    }
  }

  // "p50" from "ttft_p50_ms_cache": the statistic of a TTFT-with-cache metric.
  static std::optional<std::string> ttft_statistic(std::string_view metric) {
    constexpr std::string_view kPrefix = "ttft_", kSuffix = "_ms_cache";
    if (metric.size() <= kPrefix.size() + kSuffix.size() || metric.substr(0, kPrefix.size()) != kPrefix ||
        metric.substr(metric.size() - kSuffix.size()) != kSuffix) {
      return std::nullopt;
    }
    return std::string(metric.substr(kPrefix.size(), metric.size() - kPrefix.size() - kSuffix.size()));
  }

  void ttft_section() {
    md_ << "## TTFT with and without the cache\n\n";
    const ProgramRun* e2e = find_run(runs_, kE2eProgram);
    // statistic -> turn -> (with cache, without), in milliseconds.
    std::map<std::string, std::map<int, std::pair<double, double>>> ttft;
    if (e2e) {
      for (const Figure& f : e2e->figures) {
        const auto turn = turn_of(f.bench_case);
        const auto statistic = ttft_statistic(f.metric);
        if (turn && statistic) ttft[*statistic][*turn] = {f.value, f.baseline};
      }
    }
    if (ttft.empty()) {
      not_measured(e2e ? "bench_e2e printed no turn_<n> TTFT figures" : "bench_e2e did not run");
      return;
    }
    md_ << "Time to first token per conversation turn through the reference decoder, with prefix reuse and with "
           "the cache off (every prompt recomputed), from bench_e2e. Each turn's prompt holds the turns before it: "
           "that shared prefix is what the cache serves.\n\n";
    md_ << "| turn |";
    for (const auto& [statistic, turns] : ttft)
      md_ << fmt::format(" {0} cached (ms) | {0} no cache (ms) | speed-up |", statistic);
    md_ << "\n| ---: |";
    for (std::size_t i = 0; i < ttft.size(); ++i) md_ << " ---: | ---: | ---: |";
    md_ << "\n";
    std::set<int> turns;
    for (const auto& [statistic, by_turn] : ttft) {
      for (const auto& [turn, values] : by_turn) turns.insert(turn);
    }
    std::string data = "# turn";
    for (const auto& [statistic, by_turn] : ttft) data += fmt::format("\t{0}_cache\t{0}_nocache", statistic);
    data += "\n";
    for (const int turn : turns) {
      md_ << fmt::format("| {} |", turn);
      data += fmt::format("{}", turn);
      for (const auto& [statistic, by_turn] : ttft) {
        const auto it = by_turn.find(turn);
        if (it == by_turn.end()) {
          md_ << " n/a | n/a | n/a |";
          data += "\tNaN\tNaN";
          continue;
        }
        const auto [cached, uncached] = it->second;
        md_ << fmt::format(" {} | {} | {} |", number(cached), number(uncached),
                           cached > 0 ? fmt::format("{:.2f}x", uncached / cached) : std::string("n/a"));
        data += fmt::format("\t{:.6g}\t{:.6g}", cached, uncached);
      }
      md_ << "\n";
      data += "\n";
    }
    md_ << "\n";
    constexpr std::string_view kColours[] = {"#1b9e77", "#d95f02", "#7570b3", "#e7298a"};
    std::string plots;
    std::size_t column = 2, series = 0;
    for (const auto& [statistic, by_turn] : ttft) {
      const std::string_view colour = kColours[series++ % std::size(kColours)];
      plots += fmt::format(
          "{}data using 1:{} with linespoints lw 2 pt 7 lc rgb '{}' title {}, \\\n"
          "     data using 1:{} with linespoints lw 2 pt 4 dt 2 lc rgb '{}' title {}",
          plots.empty() ? "" : ", \\\n     ", column, colour, gp_quoted("TTFT " + statistic + ", cache"), column + 1,
          colour, gp_quoted("TTFT " + statistic + ", no cache"));
      column += 2;
    }
    const std::string png = plot("ttft", data,
                                 fmt::format("set title 'TTFT per conversation turn, with and without the prefix "
                                             "cache'\nset xlabel 'turn'\nset ylabel 'time to first token (ms)'\n"
                                             "set xtics 1\nset offsets 0.3, 0.3, 0, 0\nset yrange [0:*]\n"
                                             "set key outside right top vertical\nset grid\n"
                                             "plot {}\n",
                                             plots));
    image(png, "TTFT per turn with and without the cache");
    provenance(e2e->command, "the same conversations with the cache off (`ttft_*_ms_nocache`)");
  }

  // ---- 3. ANN latency against recall -----------------------------------------------

  void ann_section() {
    md_ << "## ANN latency against recall\n\n";
    const ProgramRun* store = find_run(runs_, kStoreProgram);
    // dataset -> ef -> metric -> figure
    std::map<std::string, std::map<int, std::map<std::string, const Figure*>>> sweep;
    if (store) {
      for (const Figure& f : store->figures) {
        const auto marker = f.bench_case.find(kAnnCaseMarker);
        if (marker == std::string::npos) continue;
        try {
          const int ef = std::stoi(f.bench_case.substr(marker + kAnnCaseMarker.size()));
          sweep[f.bench_case.substr(0, marker)][ef][f.metric] = &f;
        } catch (const std::exception&) {
          continue;
        }
      }
    }
    if (sweep.empty()) {
      not_measured(store ? "bench_store printed no ANN sweep" : "bench_store did not run");
      return;
    }
    md_ << "The snapshot store's level-2 lookup (hnswlib inside the store) against raw hnswlib over the same "
           "vectors, one point per `ef_search`: recall@3 against brute force and p99 latency "
           "(`docs/snapshot-store.md` describes the datasets and the targets, dashed: p99 1 ms, recall 0.95).\n\n";
    if (fs::exists(docs_ / kAnnPlot)) {
      image(kAnnPlot, "ANN recall against p99 latency");
    } else {
      md_ << "(No plot: tests/bench/plot_store.sh did not run.)\n\n";
    }
    md_ << "| dataset | ef_search | store p50 (us) | store p99 (us) | hnswlib p99 (us) | store recall@3 | hnswlib "
           "recall@3 |\n| --- | ---: | ---: | ---: | ---: | ---: | ---: |\n";
    for (const auto& [dataset, by_ef] : sweep) {
      for (const auto& [ef, metrics] : by_ef) {
        auto value = [&](const char* metric, bool baseline) {
          const auto it = metrics.find(metric);
          if (it == metrics.end()) return std::string("n/a");
          return number(baseline ? it->second->baseline : it->second->value);
        };
        md_ << fmt::format("| {} | {} | {} | {} | {} | {} | {} |\n", dataset, ef, value("p50_latency", false),
                           value("p99_latency", false), value("p99_latency", true), value("recall@3", false),
                           value("recall@3", true));
      }
    }
    md_ << "\n";
    provenance(store->command, "raw hnswlib (same vectors, M and ef_construction) for latency and recall");
  }

  // ---- 4. bandwidth fractions ------------------------------------------------------

  // Throughput figures whose baseline is what the hardware does at the least
  // (a STREAM-like read, memcpy, Eigen's GEMM): their ratio is the fraction
  // of that bound the code reaches.
  static bool is_throughput(const Figure& f) { return f.unit == "GB/s" || f.unit == "GFLOP/s"; }

  void fraction_section() {
    md_ << "## Kernel bandwidth fractions\n\n";
    std::vector<std::pair<const ProgramRun*, const Figure*>> rows;
    for (const ProgramRun& run : runs_) {
      for (const Figure& f : run.figures) {
        if (is_throughput(f)) rows.emplace_back(&run, &f);
      }
    }
    if (rows.empty()) {
      not_measured("no GB/s or GFLOP/s figures");
      return;
    }
    md_ << "Every GB/s and GFLOP/s figure, as the fraction of its same-run hardware baseline it reaches: attention "
           "kernels against a STREAM-like read of a 1 GiB buffer or Eigen's GEMM on the same matmuls "
           "(`docs/kernels.md`), the CLM head against Eigen's GEMM and a read of its weights (`docs/clm.md`), tier "
           "copies against memcpy (`docs/tiers.md`). 1.0 is the baseline.\n\n";
    md_ << "| program | case | value | baseline | fraction |\n| --- | --- | ---: | ---: | ---: |\n";
    std::string data = "# row\tlabel\tfraction\tprogram index\n";
    std::vector<std::string> programs;
    int row = 0;
    for (const auto& [run, f] : rows) {
      md_ << fmt::format("| {} | {} | {} {} ({}) | {} {} ({}) | {:.3f} |\n", run->program, cell(f->bench_case),
                         number(f->value), f->unit, f->metric, number(f->baseline), f->unit, f->baseline_metric,
                         f->ratio);
      if (std::find(programs.begin(), programs.end(), run->program) == programs.end()) {
        programs.push_back(run->program);
      }
      const auto program_index = std::find(programs.begin(), programs.end(), run->program) - programs.begin();
      data += fmt::format("{}\t{}\t{:.6f}\t{}\n", row++, f->bench + "/" + f->bench_case, f->ratio, program_index);
    }
    md_ << "\n";
    // Horizontal bars (one per figure, top to bottom in table order), coloured
    // by program; no key, as each label starts with the bench's name.
    constexpr std::string_view kColours[] = {"#1b9e77", "#d95f02", "#7570b3", "#e7298a", "#66a61e", "#a6761d"};
    std::string palette;
    for (std::size_t i = 0; i < programs.size(); ++i) {
      palette += fmt::format("{}{} '{}'", i ? ", " : "", i, kColours[i % std::size(kColours)]);
    }
    const std::string png = plot(
        "fractions", data,
        fmt::format("set title 'Throughput as a fraction of its same-run baseline'\n"
                    "set xlabel 'value / same-run baseline (dashed: 1.0, the baseline)'\nset ylabel ''\n"
                    "set yrange [*:*] reverse\nset xrange [0:*]\nset offsets 0, graph 0.05, 0.5, 0.5\n"
                    "set grid x\nunset key\n"
                    "set palette defined ({})\nset cbrange [0:{}]\nunset colorbox\n"
                    "set arrow from 1, graph 0 to 1, graph 1 nohead dt 2 lw 2 lc rgb 'gray30' front\n"
                    "plot data using 3:1:(0):3:($1-0.4):($1+0.4):4:ytic(2) with boxxyerror fs solid 0.45 "
                    "lc palette notitle, \\\n     data using (0):1:(sprintf('%.2f', $3)) with labels left offset 0.5,0 "
                    "notitle\n",
                    palette, std::max<std::size_t>(programs.size(), 2) - 1));
    image(png, "throughput as a fraction of the same-run baseline");
    std::string commands;
    for (const std::string& program : programs) {
      commands += (commands.empty() ? "" : "`, `") + command_of(program);
    }
    provenance(commands, "per row, the baseline named in the table");
  }

  // ---- every figure ----------------------------------------------------------------

  void every_figure_section() {
    md_ << "## Every figure\n\nEvery JSON line each bench program printed, as it printed it.\n\n";
    for (const ProgramRun& run : runs_) {
      if (run.program == kReplaySweepProgram) continue;
      md_ << fmt::format("### {}\n\n", run.program);
      provenance(run.command, "per row, `baseline_metric` measured in the same run");
      if (run.exit_status != 0) {
        md_ << fmt::format("Exit status {}{}: the figures below are what it printed before it stopped.\n\n",
                           run.exit_status, run.exit_status == 77 ? " (skipped: see its log)" : " (failed)");
      }
      if (run.figures.empty()) {
        md_ << "No figures.\n\n";
      } else {
        md_ << "| case | metric | value | unit | baseline metric | baseline | ratio |\n"
               "| --- | --- | ---: | --- | --- | ---: | ---: |\n";
        for (const Figure& f : run.figures) {
          md_ << fmt::format("| {} | {} | {} | {} | {} | {} | {:.4f} |\n", cell(f.bench_case), cell(f.metric),
                             number(f.value), cell(f.unit), cell(f.baseline_metric), number(f.baseline), f.ratio);
        }
        md_ << "\n";
      }
      if (!run.unparsed_lines.empty()) {
        md_ << fmt::format("{} line(s) of its output were not figures:\n\n```\n", run.unparsed_lines.size());
        for (const std::string& line : run.unparsed_lines) md_ << line << "\n";
        md_ << "```\n\n";
      }
    }
  }

  fs::path results_;
  fs::path docs_;
  fs::path plots_;
  Machine machine_;
  std::vector<ProgramRun> runs_;
  std::vector<ReplayPoint> sweep_;
  std::ostringstream md_;
};

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    fmt::print(stderr, "usage: bench_report RESULTS_DIR DOCS_DIR\n");
    return 2;
  }
  try {
    const fs::path results = argv[1];
    Report report(results, argv[2], read_machine(results), read_runs(results), read_replay_sweep(results));
    report.write();
  } catch (const ReportError& error) {
    fmt::print(stderr, "bench_report: {}\n", error.message);
    return 1;
  } catch (const fs::filesystem_error& error) {
    fmt::print(stderr, "bench_report: {}\n", error.what());
    return 1;
  }
  return 0;
}
