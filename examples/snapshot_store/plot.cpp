// examples/snapshot_store/plot.cpp: `clm_store plot`: a PNG of one key's
// snapshot vectors on their two top principal components (snapshot_pca.hpp),
// one colour per version, with its nearest other keys' vectors in grey on
// the same axes, so that a person sees whether the key holds one meaning (one
// cluster) or two (退款 and 退货 merged under one key: two clusters, and
// versions that flip between them). Opened read-only; gnuplot draws it.
//
//   $ clm_store plot --store snaps --tenant acme --key REFUND --group after-sale --out refund.png
//   $ clm_store plot --store snaps "I want my money back" --top 8 --out refund.png --points refund.tsv
#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include "clm/store/snapshot_pca.hpp"
#include "commands.hpp"

extern char** environ;  // NOLINT(readability-redundant-declaration): posix_spawn passes it on

namespace clm_store_cli {

const std::string_view kPlotUsage =
    "usage: clm_store plot --store DIR (TEXT | --text TEXT | --key K [--group G]) --out FILE.png\n"
    "                      [--tenant T] [--top N] [--points FILE.tsv] [--lexicons DIR]\n"
    "\n"
    "Draws a key's snapshot vectors (every stored version) on the two top principal components\n"
    "of those vectors (PCA in float64, centred on them), one colour per version, and the\n"
    "vectors of its N nearest other keys of the tenant (any group, any shard) in grey on the\n"
    "same axes, each labelled with its key and its best cosine to the key's vectors. The\n"
    "title gives the key, its rows and the share of the variance along each axis. One\n"
    "cluster: the key means one thing. Two clusters, with versions flipping between them:\n"
    "two meanings under one key (blacklist it, or split it with the lexicons). A neighbour\n"
    "drawn close may still lie far off the plane: its cosine says how near it is.\n"
    "\n"
    "  TEXT, --text TEXT      the user's text, keyed as ingest keys it\n"
    "  --key K [--group G]    a host's own key and group, as ingested\n"
    "  --tenant T             the tenant (default: empty)\n"
    "  --top N                nearest other keys drawn, 0..64 (default 5)\n"
    "  --out FILE.png         the picture (gnuplot, pngcairo or png)\n"
    "  --points FILE.tsv      also the projected points: kind (row or neighbour), key,\n"
    "                         version, x, y; one line each, after a # header\n"
    "  --lexicons DIR         the lexicons the store was made with (ingest's; default: built-in)\n"
    "\n"
    "Opens the store read-only (beside a server that holds it) and writes nothing to it.\n"
    "Refused, exit status 2, nothing drawn: a key with no row, a key with one row (no\n"
    "shape to plot), gnuplot not on PATH (Debian: gnuplot-nox).\n";

namespace {

constexpr std::int32_t kDefaultTop = 5;
// Up to this many versions get a colour and a legend line each; more share
// one colour scale with a bar.
constexpr std::size_t kMaxLegendVersions = 12;
constexpr std::size_t kMaxVersionLabels = 24;  // the key's points named by version up to this many
constexpr const char* kVersionColours[kMaxLegendVersions] = {"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728",
                                                             "#9467bd", "#8c564b", "#e377c2", "#17becf",
                                                             "#bcbd22", "#393b79", "#e7ba52", "#843c39"};

// The executable `program` in a directory of PATH; empty when none.
std::string find_on_path(std::string_view program) {
  const char* path = std::getenv("PATH");
  std::string_view dirs = path ? path : "";
  while (!dirs.empty()) {
    const auto colon = dirs.find(':');
    const std::string_view dir = dirs.substr(0, colon);
    dirs = colon == std::string_view::npos ? std::string_view() : dirs.substr(colon + 1);
    const std::string candidate = fmt::format("{}/{}", dir.empty() ? "." : dir, program);
    if (::access(candidate.c_str(), X_OK) == 0) return candidate;
  }
  return {};
}

// A gnuplot string in double quotes (a title needs "\n"): backslash and quote
// escaped, a line break as \n, other control characters as spaces. Drawn with noenhanced, so ^ _ @ stay.
std::string gnuplot_string(std::string_view s) {
  std::string out = "\"";
  for (const char c : s) {
    if (c == '\\' || c == '"') {
      out += '\\';
      out += c;
    } else if (c == '\n') {
      out += "\\n";  // a line break in a title
    } else if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) {
      out += ' ';
    } else {
      out += c;
    }
  }
  return out + "\"";
}

// A field of the points file: no tab or line break inside.
std::string tsv_field(std::string_view s) {
  std::string out(s);
  std::replace_if(
      out.begin(), out.end(), [](char c) { return c == '\t' || c == '\n' || c == '\r'; }, ' ');
  return out;
}

// A file made by mkstemp under $TMPDIR (else /tmp), removed with the object.
class TempFile {
 public:
  explicit TempFile(std::string_view name) {
    const char* tmp = std::getenv("TMPDIR");
    path_ = fmt::format("{}/clm_store_plot.{}.XXXXXX", tmp && *tmp ? tmp : "/tmp", name);
    fd_ = ::mkstemp(path_.data());
    if (fd_ < 0) throw Failure{fmt::format("cannot make a temporary file {}: {}", path_, std::strerror(errno))};
  }
  ~TempFile() {
    if (fd_ >= 0) ::close(fd_);
    ::unlink(path_.c_str());
  }
  TempFile(const TempFile&) = delete;
  TempFile& operator=(const TempFile&) = delete;

  const std::string& path() const { return path_; }
  int fd() const { return fd_; }
  void write(std::string_view text) {
    while (!text.empty()) {
      const ssize_t n = ::write(fd_, text.data(), text.size());
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) throw Failure{fmt::format("writing {} failed: {}", path_, std::strerror(errno))};
      text.remove_prefix(static_cast<std::size_t>(n));
    }
  }
  std::string read_back() const {
    std::ifstream in(path_, std::ios::binary);
    return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  }

 private:
  std::string path_;
  int fd_ = -1;
};

// Runs `gnuplot script` with stdin from /dev/null and stderr into `errors`;
// its exit status, or -1 when it did not run.
int run_gnuplot(const std::string& gnuplot, const std::string& script, TempFile& errors) {
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_adddup2(&actions, errors.fd(), STDOUT_FILENO);
  posix_spawn_file_actions_adddup2(&actions, errors.fd(), STDERR_FILENO);
  std::string arg0 = gnuplot, arg1 = script;
  char* argv[] = {arg0.data(), arg1.data(), nullptr};
  pid_t pid = 0;
  const int spawned = ::posix_spawn(&pid, gnuplot.c_str(), &actions, nullptr, argv, environ);
  posix_spawn_file_actions_destroy(&actions);
  if (spawned != 0) return -1;
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0) {
    if (errno != EINTR) return -1;
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

bool is_png(const std::string& path) {
  static constexpr unsigned char kSignature[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
  std::ifstream in(path, std::ios::binary);
  char head[8] = {};
  if (!in.read(head, sizeof head)) return false;
  return std::memcmp(head, kSignature, sizeof head) == 0;
}

std::string percent(double share) { return fmt::format("{:.1f}%", 100.0 * share); }

struct Point {
  std::string key;
  std::int32_t version = 0;
  double x = 0, y = 0;
};

}  // namespace

int cmd_plot(const Args& args) {
  const NamedSuffix suffix = named_suffix(args);  // usage errors before anything opens
  const std::string out_path = args.required("--out");
  if (!out_path.ends_with(".png"))
    throw UsageError{fmt::format("--out {}: the picture is a PNG: name it FILE.png", out_path)};
  const auto points_path = args.get("--points");
  if (points_path && points_path->empty()) throw UsageError{"--points: empty"};
  const std::int32_t top = args.integer<std::int32_t>("--top", 0, 64).value_or(kDefaultTop);
  const std::string tenant = args.get("--tenant").value_or("");
  const std::string gnuplot = find_on_path("gnuplot");
  if (gnuplot.empty()) {
    throw Failure{"gnuplot is not on PATH: the picture needs it (Debian: apt-get install gnuplot-nox)"};
  }

  clm::SnapshotStoreConfig config = store_config(args, false);
  config.rebuild_in_background = false;  // a missing index is built before the search, not skipped
  std::unique_ptr<clm::SnapshotStore> store = open_reader(config);
  const clm::SuffixKey key = key_of(suffix, *store);
  if (key.low_information) {
    throw Failure{
        fmt::format("the text's key {} abstained ({}): nothing is stored under it", key.key, key.abstain_reason)};
  }
  clm::KeyVectors kv;
  check(store->key_vectors(tenant, key, top, kv), "key_vectors");
  const std::string unreadable_note =
      kv.unreadable > 0 ? fmt::format(" ({} more fail their checks: `clm_store check`)", kv.unreadable) : std::string();
  if (kv.rows.size() < 2) {
    throw Failure{fmt::format("key {} has {} readable row{}{}: a key with one row has no shape to plot; nothing drawn",
                              kv.key, kv.rows.size(), kv.rows.size() == 1 ? "" : "s", unreadable_note)};
  }
  std::vector<float> flat;
  for (const auto& r : kv.rows) flat.insert(flat.end(), r.vector.begin(), r.vector.end());
  clm::SnapshotPlane plane;
  check(clm::fit_snapshot_plane(flat, config.snapshot_dim, plane), "the key's principal components");

  std::vector<Point> rows, neighbours;
  std::set<std::int32_t> versions;
  for (const auto& r : kv.rows) {
    const auto [x, y] = plane.project(r.vector);
    rows.push_back({kv.key, r.version, x, y});
    versions.insert(r.version);
  }
  for (const auto& n : kv.neighbours) {
    for (const auto& r : n.rows) {
      const auto [x, y] = plane.project(r.vector);
      neighbours.push_back({n.key, r.version, x, y});
    }
  }

  // The data: one block per version (or one block with the version as a
  // third column, past kMaxLegendVersions), then the neighbours' block.
  TempFile data("data"), script("gp"), errors("err");
  const bool legend_per_version = versions.size() <= kMaxLegendVersions;
  std::string text;
  std::size_t blocks = 0;
  if (legend_per_version) {
    for (const std::int32_t v : versions) {
      for (const Point& p : rows) {
        if (p.version == v) text += fmt::format("{:.9g} {:.9g}\n", p.x, p.y);
      }
      text += "\n\n";
      ++blocks;
    }
  } else {
    for (const Point& p : rows) text += fmt::format("{:.9g} {:.9g} {}\n", p.x, p.y, p.version);
    text += "\n\n";
    ++blocks;
  }
  const std::size_t neighbour_block = blocks;
  for (const Point& p : neighbours) text += fmt::format("{:.9g} {:.9g}\n", p.x, p.y);
  data.write(text);

  const bool flat_key = !(plane.total_variance > 0);
  const std::string tenant_note = tenant.empty() ? std::string() : fmt::format(", tenant {}", printable(tenant));
  const std::string title =
      fmt::format("{}{}{}: {} rows, versions {}..{}\n{}", kv.key, tenant_note, kv.blacklisted ? " (blacklisted)" : "",
                  kv.rows.size(), *versions.begin(), *versions.rbegin(),
                  flat_key ? std::string("every row is the same vector: variance 0")
                           : fmt::format("PC1 {} of the variance ({:.3g}), PC2 {} ({:.3g})", percent(plane.share[0]),
                                         plane.variance[0], percent(plane.share[1]), plane.variance[1]));
  std::string gp;
  gp +=
      "if (strstrt(GPVAL_TERMINALS, 'pngcairo') > 0) {\n"
      "  set terminal pngcairo size 1100,760 enhanced font 'sans,11'\n"
      "} else {\n"
      "  set terminal png size 1100,760\n"
      "}\n";
  gp += fmt::format("set output {}\n", gnuplot_string(out_path));
  gp += fmt::format("set title {} noenhanced\n", gnuplot_string(title));
  gp += fmt::format("set xlabel {} noenhanced\n", gnuplot_string(fmt::format("PC1 ({})", percent(plane.share[0]))));
  gp += fmt::format("set ylabel {} noenhanced\n", gnuplot_string(fmt::format("PC2 ({})", percent(plane.share[1]))));
  gp +=
      "set grid lc rgb '#dddddd'\nset key outside right top noenhanced\nset offsets graph 0.05, graph 0.05, "
      "graph 0.05, graph 0.05\n";
  // Each neighbour's label at its first point, with its best cosine; each of
  // the key's points with its version while they are few enough to read.
  std::size_t label = 1;
  for (const auto& n : kv.neighbours) {
    const auto [x, y] = plane.project(n.rows.front().vector);
    gp += fmt::format(
        "set label {} {} at {:.9g},{:.9g} offset 0.8,0.6 front textcolor rgb '#555555' font ',9' noenhanced\n", label++,
        gnuplot_string(fmt::format("{} ({:.2f})", n.key, n.similarity)), x, y);
  }
  if (rows.size() <= kMaxVersionLabels) {
    for (const Point& p : rows) {
      gp += fmt::format("set label {} 'v{}' at {:.9g},{:.9g} offset -0.6,-1.1 front font ',8'\n", label++, p.version,
                        p.x, p.y);
    }
  }
  const std::string data_file = gnuplot_string(data.path());
  std::vector<std::string> plots;
  if (legend_per_version) {
    std::size_t block = 0;
    for (const std::int32_t v : versions) {
      plots.push_back(fmt::format("{} index {} using 1:2 with points pt 7 ps 1.8 lc rgb '{}' title 'v{}'", data_file,
                                  block, kVersionColours[block], v));
      ++block;
    }
  } else {
    gp += "set cblabel 'version'\nset palette rgbformulae 33,13,10\n";
    plots.push_back(
        fmt::format("{} index 0 using 1:2:3 with points pt 7 ps 1.8 lc palette title 'versions'", data_file));
  }
  if (!neighbours.empty()) {
    plots.push_back(fmt::format(
        "{} index {} using 1:2 with points pt 6 ps 1.4 lw 1.5 lc rgb '#9a9a9a' title 'nearest other keys ({})'",
        data_file, neighbour_block, kv.neighbours.size()));
  }
  gp += "plot ";
  for (std::size_t i = 0; i < plots.size(); ++i) gp += (i ? ", \\\n     " : "") + plots[i];
  gp += "\nset output\n";
  script.write(gp);

  const int status = run_gnuplot(gnuplot, script.path(), errors);
  if (status != 0 || !is_png(out_path)) {
    std::error_code ignored;
    fs::remove(out_path, ignored);  // never a broken picture left behind as the result
    std::string said = errors.read_back();
    if (said.size() > 2000) said.resize(2000);
    throw Failure{fmt::format("gnuplot ({}) {}; nothing drawn{}{}", gnuplot,
                              status < 0    ? std::string("did not run")
                              : status != 0 ? fmt::format("exited with status {}", status)
                                            : std::string("wrote no PNG"),
                              said.empty() ? "" : ":\n", said)};
  }

  // The points, written once the picture is: a refusal leaves neither.
  if (points_path) {
    std::ofstream points(*points_path, std::ios::binary | std::ios::trunc);
    if (!points) throw Failure{fmt::format("cannot write {}: {}", *points_path, std::strerror(errno))};
    points << "# kind\tkey\tversion\tx\ty\n";
    for (const auto* set : {&rows, &neighbours}) {
      for (const Point& p : *set) {
        points << fmt::format("{}\t{}\t{}\t{:.9g}\t{:.9g}\n", set == &rows ? "row" : "neighbour", tsv_field(p.key),
                              p.version, p.x, p.y);
      }
    }
    points.close();
    if (!points) throw Failure{fmt::format("writing {} failed", *points_path)};
  }

  fmt::print("clm_store plot: {} (shard {}{}{}): {} rows, versions {}..{} -> {}\n", kv.key, kv.shard, tenant_note,
             kv.blacklisted ? ", blacklisted" : "", kv.rows.size(), *versions.begin(), *versions.rbegin(), out_path);
  if (flat_key) {
    fmt::print("  every row is the same vector: variance 0 (one point)\n");
  } else {
    fmt::print("  PC1  {:>6} of the variance ({:.4g})\n  PC2  {:>6} ({:.4g})\n", percent(plane.share[0]),
               plane.variance[0], percent(plane.share[1]), plane.variance[1]);
  }
  if (kv.unreadable > 0) fmt::print("  note: {} rows fail their checks, left out (`clm_store check`)\n", kv.unreadable);
  if (!kv.neighbours_complete) fmt::print("  note: an index was being rebuilt: some neighbours may be missing\n");
  fmt::print("  nearest other keys:{}\n", kv.neighbours.empty() ? " none" : "");
  for (const auto& n : kv.neighbours) {
    fmt::print("    {:.4f}  {}  ({} row{}, shard {})\n", n.similarity, n.key, n.rows.size(),
               n.rows.size() == 1 ? "" : "s", n.shard);
  }
  if (points_path) fmt::print("  points: {}\n", *points_path);
  return 0;
}

}  // namespace clm_store_cli
