// examples/fleet/main.cpp: clm_fleet, a small cache-aware scheduler in front
// of several clm_server instances, and the report that compares it with
// round-robin (fleet.sh runs both on the same requests; docs/fleet.md).
//
//   clm_fleet run --mode aware|round_robin --servers PORT,PORT,... --events EP,EP,... [--replays EP,...]
//                 --model-id ID [--page-size 16] [--conversations 24] [--turns 4] [--clients 4]
//                 [--seed 1] --out RESULT.json
//   clm_fleet report AWARE.json ROUND_ROBIN.json [--plot FILE.png] [--expect-better]
//
// run: subscribes to every instance's KV events (ZeroMQ SUB; a gap in the
// sequence is filled from the replay socket), then plays a fixed set of
// multi-turn conversations (a few tenants, each with its own long system
// prompt; every turn carries the conversation so far, answers included) in
// rounds, `--clients` requests at a time. `aware` sends each request to the
// instance whose events say it holds the longest prefix of the prompt
// (ties: the one with fewer requests in flight, then the first); the prompt's
// block hashes are computed as the instances compute them (fleet_index.hpp).
// `round_robin` sends them in turn. Each answer's usage (cached prompt tokens
// by tier) and server-side TTFT are kept, per instance.
//
// report: a table of both runs (hit rate, device hit rate, TTFT p50/p99 per
// instance and overall), one JSON line per figure (bench_events' format:
// prefix-aware against round-robin in the same fleet.sh run), and a gnuplot
// PNG. --expect-better exits 1 unless the prefix-aware hit rate is at least
// 1.3 times round-robin's (the goal).
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <httplib.h>
#include <nlohmann/json.hpp>
#include <zmq.hpp>

#include "byte_tokenizer.hpp"
#include "clm/tiers/page_seal.hpp"
#include "fleet_index.hpp"

namespace {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

[[noreturn]] void die(const std::string& message) {
  std::fprintf(stderr, "clm_fleet: %s\n", message.c_str());
  std::exit(2);
}

std::vector<std::string> split(const std::string& list) {
  std::vector<std::string> out;
  std::stringstream in(list);
  for (std::string item; std::getline(in, item, ',');) {
    if (!item.empty()) out.push_back(item);
  }
  return out;
}

std::uint64_t be64(const zmq::message_t& m) {
  std::uint64_t v = 0;
  for (std::size_t i = 0; i < 8 && i < m.size(); ++i) v = (v << 8) | static_cast<const unsigned char*>(m.data())[i];
  return v;
}

// ---- the KV-event streams -----------------------------------------------------

// One instance's stream into the index, on a thread of its own: live batches
// in order; a gap (or the start, whose first batches a new subscriber
// misses) is filled from the replay socket first.
class Subscriber {
 public:
  Subscriber(zmq::context_t& ctx, clm_fleet::FleetIndex& index, std::size_t instance, std::string endpoint,
             std::string replay)
      : ctx_(ctx), index_(index), instance_(instance), replay_(std::move(replay)) {
    sub_ = zmq::socket_t(ctx_, zmq::socket_type::sub);
    sub_.set(zmq::sockopt::subscribe, "");
    sub_.set(zmq::sockopt::rcvtimeo, 50);
    sub_.set(zmq::sockopt::rcvhwm, 0);
    sub_.connect(endpoint);
    thread_ = std::thread([this] { run(); });
  }
  ~Subscriber() {
    stop_ = true;
    thread_.join();
  }
  std::uint64_t gaps_filled() const { return gaps_; }

 private:
  void apply(std::uint64_t seq, const zmq::message_t& payload) {
    clm::KvEventBatch batch;
    if (!clm::decode_kv_event_batch(payload.to_string_view(), batch).ok()) die("a KV-event batch did not decode");
    index_.apply(instance_, batch);
    next_ = seq + 1;
  }

  // Every buffered batch from next_ on, through the replay socket.
  void fill_from_replay() {
    if (replay_.empty()) return;
    zmq::socket_t dealer(ctx_, zmq::socket_type::dealer);
    dealer.set(zmq::sockopt::rcvtimeo, 5000);
    dealer.set(zmq::sockopt::linger, 0);
    dealer.connect(replay_);
    std::string start(8, '\0');
    for (int i = 0; i < 8; ++i) start[static_cast<std::size_t>(i)] = static_cast<char>(next_ >> (56 - 8 * i));
    (void)dealer.send(zmq::message_t(), zmq::send_flags::sndmore);
    (void)dealer.send(zmq::buffer(start));
    for (;;) {
      zmq::message_t empty, seq, payload;
      if (!dealer.recv(empty) || !dealer.recv(seq) || !dealer.recv(payload)) die("the replay socket did not answer");
      if (be64(seq) == ~std::uint64_t{0}) return;
      if (be64(seq) >= next_) apply(be64(seq), payload);
    }
  }

  void run() {
    bool synced = false;
    while (!stop_) {
      zmq::message_t topic, seq, payload;
      if (!sub_.recv(topic)) continue;
      (void)sub_.recv(seq);
      (void)sub_.recv(payload);
      const std::uint64_t s = be64(seq);
      if (s < next_) continue;  // replayed already
      if (!synced || s > next_) {
        if (synced) ++gaps_;
        fill_from_replay();
        synced = true;
        if (s < next_) continue;
      }
      apply(s, payload);
    }
  }

  zmq::context_t& ctx_;
  clm_fleet::FleetIndex& index_;
  const std::size_t instance_;
  const std::string replay_;
  zmq::socket_t sub_;
  std::uint64_t next_ = 0;
  std::atomic<std::uint64_t> gaps_{0};
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

// ---- the conversations ---------------------------------------------------------

struct Conversation {
  std::string tenant;
  std::vector<tiny_llama::ChatMessage> messages;  // so far, answers included
  std::vector<std::string> user_turns;
};

std::string words(std::mt19937& rng, std::size_t n) {
  static const char* const kWords[] = {
      "order",   "account", "refund", "delivery", "invoice", "payment", "router",   "plan",    "card",
      "address", "ticket",  "return", "warranty", "support", "service", "contract", "billing", "upgrade",
      "please",  "when",    "my",     "the",      "is",      "can",     "you",      "help",    "with",
      "change",  "cancel",  "update", "check",    "status",  "since",   "last",     "week",    "today"};
  std::string out;
  for (std::size_t i = 0; i < n; ++i) {
    if (i) out += ' ';
    out += kWords[rng() % std::size(kWords)];
  }
  return out;
}

std::vector<Conversation> make_conversations(std::size_t count, std::size_t turns, std::size_t tenants,
                                             std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<std::string> systems(tenants);
  for (std::size_t t = 0; t < tenants; ++t) {
    systems[t] = fmt::format("You are the support assistant of company {}. {}.", t, words(rng, 30));
  }
  std::vector<Conversation> out(count);
  for (std::size_t c = 0; c < count; ++c) {
    out[c].tenant = fmt::format("tenant-{}", c % tenants);
    out[c].messages.push_back({"system", systems[c % tenants]});
    for (std::size_t t = 0; t < turns; ++t) out[c].user_turns.push_back(words(rng, 20 + rng() % 20) + "?");
  }
  return out;
}

// ---- one run ------------------------------------------------------------------

struct Answer {
  std::size_t instance = 0;
  std::int64_t prompt_tokens = 0, cached = 0, device = 0, host = 0, storage = 0;
  double ttft_seconds = 0;
};

Answer ask(int port, std::size_t instance, Conversation& c, std::int32_t max_tokens) {
  json messages = json::array();
  for (const auto& m : c.messages) messages.push_back({{"role", m.role}, {"content", m.content}});
  const json body = {{"model", "tiny"}, {"messages", messages}, {"max_tokens", max_tokens}, {"temperature", 0}};
  httplib::Client client("127.0.0.1", port);
  client.set_read_timeout(120, 0);
  const httplib::Headers headers = {{"X-Tenant", c.tenant}};
  const auto r = client.Post("/v1/chat/completions", headers, body.dump(), "application/json");
  if (!r) die(fmt::format("no answer from 127.0.0.1:{}", port));
  if (r->status != 200) die(fmt::format("127.0.0.1:{} answered {}: {}", port, r->status, r->body));
  const json doc = json::parse(r->body);
  Answer a;
  a.instance = instance;
  const json& usage = doc.at("usage");
  a.prompt_tokens = usage.at("prompt_tokens").get<std::int64_t>();
  const json& details = usage.at("prompt_tokens_details");
  a.cached = details.at("cached_tokens").get<std::int64_t>();
  a.device = details.at("cached_tokens_by_source").at("device").get<std::int64_t>();
  a.host = details.at("cached_tokens_by_source").at("host").get<std::int64_t>();
  a.storage = details.at("cached_tokens_by_source").at("storage").get<std::int64_t>();
  a.ttft_seconds = doc.at("timings").at("ttft_seconds").get<double>();
  c.messages.push_back({"assistant", doc.at("choices").at(0).at("message").at("content").get<std::string>()});
  return a;
}

double percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const auto at = static_cast<std::size_t>(p * static_cast<double>(v.size() - 1) + 0.5);
  return v[std::min(at, v.size() - 1)];
}

json summary(const std::vector<Answer>& answers) {
  std::int64_t prompt = 0, cached = 0, device = 0, host = 0, storage = 0;
  std::vector<double> ttft;
  for (const Answer& a : answers) {
    prompt += a.prompt_tokens;
    cached += a.cached;
    device += a.device;
    host += a.host;
    storage += a.storage;
    ttft.push_back(a.ttft_seconds);
  }
  const auto rate = [&](std::int64_t n) {
    return prompt > 0 ? static_cast<double>(n) / static_cast<double>(prompt) : 0;
  };
  return {{"requests", answers.size()},
          {"prompt_tokens", prompt},
          {"cached_tokens", cached},
          {"hit_rate", rate(cached)},
          {"device_hit_rate", rate(device)},
          {"host_hit_rate", rate(host)},
          {"storage_hit_rate", rate(storage)},
          {"ttft_p50_ms", 1e3 * percentile(ttft, 0.5)},
          {"ttft_p99_ms", 1e3 * percentile(ttft, 0.99)}};
}

struct RunFlags {
  std::string mode, out, model_id;
  std::vector<int> ports;
  std::vector<std::string> events, replays;
  std::int32_t page_size = 16, max_tokens = 48;
  std::size_t conversations = 24, turns = 4, tenants = 6, clients = 4;
  std::uint32_t seed = 1;
};

int run(const RunFlags& f) {
  const std::size_t n = f.ports.size();
  if (n == 0 || f.events.size() != n || (!f.replays.empty() && f.replays.size() != n)) {
    die("--servers, --events (and --replays) need one entry per instance");
  }
  if (f.mode != "aware" && f.mode != "round_robin") die("--mode is aware or round_robin");
  clm::PageSeal seal;
  if (const clm::Status s = clm::PageSeal::create(f.model_id, {}, seal); !s.ok()) die(s.message());
  const clm::Digest32 scope = seal.key_scope();

  zmq::context_t ctx(1);
  clm_fleet::FleetIndex index(n);
  std::vector<std::unique_ptr<Subscriber>> subscribers;
  for (std::size_t i = 0; i < n; ++i) {
    subscribers.push_back(
        std::make_unique<Subscriber>(ctx, index, i, f.events[i], f.replays.empty() ? "" : f.replays[i]));
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // subscriptions reach the publishers

  std::vector<Conversation> conversations = make_conversations(f.conversations, f.turns, f.tenants, f.seed);
  std::vector<Answer> answers;
  std::mutex answers_mutex;
  std::vector<std::atomic<int>> in_flight(n);
  std::atomic<std::size_t> sent{0};
  std::mt19937 order_rng(f.seed + 1);
  std::vector<std::size_t> order(conversations.size());
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
  for (std::size_t turn = 0; turn < f.turns; ++turn) {
    // Each round in its own order, as users come back when they do (and so
    // that round-robin does not send a conversation to the same instance
    // every turn by the arithmetic of the counts).
    std::shuffle(order.begin(), order.end(), order_rng);
    std::atomic<std::size_t> next{0};
    std::vector<std::thread> clients;
    for (std::size_t t = 0; t < f.clients; ++t) {
      clients.emplace_back([&] {
        for (std::size_t k; (k = next.fetch_add(1)) < conversations.size();) {
          Conversation& conv = conversations[order[k]];
          conv.messages.push_back({"user", conv.user_turns[turn]});
          std::size_t target = 0;
          if (f.mode == "round_robin") {
            target = sent.fetch_add(1) % n;
          } else {
            const auto prompt = tiny_llama::ByteTokenizer::apply_chat_template(conv.messages);
            const auto matched =
                index.matched_pages(clm_fleet::prompt_block_hashes(scope, conv.tenant, prompt, f.page_size));
            for (std::size_t i = 1; i < n; ++i) {
              if (matched[i] > matched[target] ||
                  (matched[i] == matched[target] && in_flight[i].load() < in_flight[target].load())) {
                target = i;
              }
            }
          }
          ++in_flight[target];
          const Answer a = ask(f.ports[target], target, conv, f.max_tokens);
          --in_flight[target];
          std::lock_guard lock(answers_mutex);
          answers.push_back(a);
        }
      });
    }
    for (auto& c : clients) c.join();
    // The turn's events reach the index: until no batch has come for 100 ms
    // (at most 3 s; a loaded machine, a sanitizer, delays them past a fixed wait).
    const auto give_up = Clock::now() + std::chrono::seconds(3);
    for (std::uint64_t seen = index.batches_applied(); Clock::now() < give_up;) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      const std::uint64_t now = index.batches_applied();
      if (now == seen) break;
      seen = now;
    }
    std::fprintf(stderr, "clm_fleet %s: turn %zu of %zu done (%zu requests)\n", f.mode.c_str(), turn + 1, f.turns,
                 answers.size());
  }

  json result = {{"mode", f.mode}, {"instances", json::array()}, {"total", summary(answers)}};
  std::uint64_t gaps = 0;
  for (std::size_t i = 0; i < n; ++i) {
    std::vector<Answer> mine;
    for (const Answer& a : answers) {
      if (a.instance == i) mine.push_back(a);
    }
    result["instances"].push_back(summary(mine));
    gaps += subscribers[i]->gaps_filled();
  }
  result["event_gaps_filled"] = gaps;
  std::ofstream(f.out) << result.dump(2) << "\n";
  return 0;
}

// ---- the report -----------------------------------------------------------------

void figure(const std::string& name, const std::string& metric, double value, const std::string& unit,
            const std::string& baseline_metric, double baseline) {
  const nlohmann::ordered_json line = {{"bench", "fleet"},     {"case", name},
                                       {"metric", metric},     {"value", value},
                                       {"unit", unit},         {"baseline_metric", baseline_metric},
                                       {"baseline", baseline}, {"ratio", baseline != 0 ? value / baseline : 0}};
  std::printf("%s\n", line.dump().c_str());
}

int report(const std::string& aware_file, const std::string& rr_file, const std::string& plot, bool expect_better) {
  json aware, rr;
  std::ifstream(aware_file) >> aware;
  std::ifstream(rr_file) >> rr;
  const std::size_t n = aware.at("instances").size();
  std::printf("%-10s | %-28s | %-28s\n", "", "prefix-aware", "round-robin");
  std::printf("%-10s | %6s %6s %6s %7s | %6s %6s %6s %7s\n", "instance", "reqs", "hit", "device", "TTFTp50", "reqs",
              "hit", "device", "TTFTp50");
  const auto row = [](const std::string& name, const json& a, const json& r) {
    std::printf("%-10s | %6d %5.1f%% %5.1f%% %5.1fms | %6d %5.1f%% %5.1f%% %5.1fms\n", name.c_str(),
                a.at("requests").get<int>(), 100 * a.at("hit_rate").get<double>(),
                100 * a.at("device_hit_rate").get<double>(), a.at("ttft_p50_ms").get<double>(),
                r.at("requests").get<int>(), 100 * r.at("hit_rate").get<double>(),
                100 * r.at("device_hit_rate").get<double>(), r.at("ttft_p50_ms").get<double>());
  };
  for (std::size_t i = 0; i < n; ++i) row(fmt::format("server {}", i), aware["instances"][i], rr["instances"][i]);
  row("all", aware["total"], rr["total"]);
  const json& a = aware["total"];
  const json& r = rr["total"];
  const std::string name = fmt::format("{}_instances/requests={}", n, a.at("requests").get<int>());
  figure(name, "hit_rate_prefix_aware", a.at("hit_rate").get<double>(), "fraction", "hit_rate_round_robin",
         r.at("hit_rate").get<double>());
  figure(name, "device_hit_rate_prefix_aware", a.at("device_hit_rate").get<double>(), "fraction",
         "device_hit_rate_round_robin", r.at("device_hit_rate").get<double>());
  figure(name, "ttft_p50_prefix_aware", a.at("ttft_p50_ms").get<double>(), "ms", "ttft_p50_round_robin",
         r.at("ttft_p50_ms").get<double>());
  figure(name, "ttft_p99_prefix_aware", a.at("ttft_p99_ms").get<double>(), "ms", "ttft_p99_round_robin",
         r.at("ttft_p99_ms").get<double>());
  if (!plot.empty()) {
    const std::string data = plot + ".dat";
    {
      std::ofstream out(data);
      for (std::size_t i = 0; i <= n; ++i) {
        const json& ai = i < n ? aware["instances"][i] : aware["total"];
        const json& ri = i < n ? rr["instances"][i] : rr["total"];
        out << (i < n ? fmt::format("\"server {}\"", i) : std::string("\"all\"")) << ' '
            << 100 * ai.at("hit_rate").get<double>() << ' ' << 100 * ri.at("hit_rate").get<double>() << ' '
            << ai.at("ttft_p50_ms").get<double>() << ' ' << ri.at("ttft_p50_ms").get<double>() << '\n';
      }
    }
    const std::string script = fmt::format(
        "set terminal png size 1000,460 noenhanced\nset output '{}'\nset multiplot layout 1,2 title 'clm_fleet: {} "
        "clm_server instances, one Redis, the same requests'\nset style data histograms\nset style histogram "
        "clustered gap 1\nset style fill solid 0.8 border -1\nset key outside bottom center horizontal\nset grid "
        "ytics\n"
        "set ylabel 'prompt tokens found cached (%)'\nset yrange [0:100]\nplot '{}' using 2:xtic(1) title "
        "'prefix-aware', '' using 3 title 'round-robin'\nset ylabel 'TTFT p50 (ms)'\nset yrange [0:*]\nplot '{}' "
        "using 4:xtic(1) title 'prefix-aware', '' using 5 title 'round-robin'\nunset multiplot\n",
        plot, n, data, data);
    FILE* gp = popen("gnuplot", "w");
    if (!gp) die("gnuplot not found (make deps installs gnuplot-nox)");
    std::fputs(script.c_str(), gp);
    if (pclose(gp) != 0) die("gnuplot failed");
    std::remove(data.c_str());
  }
  // Routing by load alone (no prefix) lands at 0.8-1.25 here; prefix-aware at 1.5-1.8.
  if (expect_better && !(a.at("hit_rate").get<double>() >= 1.3 * r.at("hit_rate").get<double>())) {
    std::fprintf(stderr, "clm_fleet: the prefix-aware hit rate is not 1.3 times round-robin's\n");
    return 1;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) die("usage: clm_fleet run ... | clm_fleet report AWARE.json ROUND_ROBIN.json [--plot F.png]");
  const std::string command = argv[1];
  if (command == "report") {
    if (argc < 4) die("report needs two result files");
    std::string plot;
    bool expect_better = false;
    for (int i = 4; i < argc; ++i) {
      const std::string arg = argv[i];
      if (arg == "--plot" && i + 1 < argc) {
        plot = argv[++i];
      } else if (arg == "--expect-better") {
        expect_better = true;
      } else {
        die("report: unknown argument " + arg);
      }
    }
    return report(argv[2], argv[3], plot, expect_better);
  }
  if (command != "run") die("unknown command " + command);
  RunFlags f;
  for (int i = 2; i < argc; ++i) {
    const std::string arg = argv[i];
    if (i + 1 >= argc) die(arg + " needs a value");
    const std::string value = argv[++i];
    const auto number = [&] {
      try {
        return std::stoul(value);
      } catch (const std::exception&) {
        die(arg + ": not a number: " + value);
      }
    };
    if (arg == "--mode") {
      f.mode = value;
    } else if (arg == "--out") {
      f.out = value;
    } else if (arg == "--model-id") {
      f.model_id = value;
    } else if (arg == "--servers") {
      for (const std::string& p : split(value)) f.ports.push_back(std::stoi(p));
    } else if (arg == "--events") {
      f.events = split(value);
    } else if (arg == "--replays") {
      f.replays = split(value);
    } else if (arg == "--page-size") {
      f.page_size = static_cast<std::int32_t>(number());
    } else if (arg == "--conversations") {
      f.conversations = number();
    } else if (arg == "--turns") {
      f.turns = number();
    } else if (arg == "--tenants") {
      f.tenants = std::max<std::size_t>(1, number());
    } else if (arg == "--clients") {
      f.clients = std::max<std::size_t>(1, number());
    } else if (arg == "--max-tokens") {
      f.max_tokens = static_cast<std::int32_t>(number());
    } else if (arg == "--seed") {
      f.seed = static_cast<std::uint32_t>(number());
    } else {
      die("unknown flag " + arg);
    }
  }
  if (f.out.empty() || f.model_id.empty()) die("run needs --out and --model-id");
  return run(f);
}
