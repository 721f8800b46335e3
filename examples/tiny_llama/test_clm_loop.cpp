// examples/tiny_llama/test_clm_loop.cpp: CLM in the decoder's loop, end to
// end: conversations with repeated and paraphrased questions (random bytes)
// are collected with CLM off (ClmCollector), trained by the real clm_fit
// through train_clm.sh, and run again with CLM on (ClmLoop) over a snapshot
// store on disk. Checked: repeated suffixes are found at level exact; an
// injection changes the hidden states only at the adapter's layers and only
// for the sequences that got a snapshot, so the logits equal a CLM-off run's
// until a sequence's first injection and differ from there; baseline mode
// (CLM off per request, or no loop installed) computes exactly the CLM-off
// logits; bad trained files and bad settings give a clear status.
#include <sys/wait.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <set>
#include <sstream>

#include <fmt/format.h>
#include <catch2/catch.hpp>

#include "byte_tokenizer.hpp"
#include "clm/model/snapshot_adapter.hpp"
#include "clm/model/snapshot_projection.hpp"
#include "clm/model/src_head.hpp"
#include "clm_collect.hpp"
#include "clm_loop.hpp"
#include "generator.hpp"
#include "store/store_test_support.hpp"  // TempDir
#include "test_support.hpp"              // fresh_seed
#include "tiny_llama_test_support.hpp"

namespace {

using tiny_llama::ByteTokenizer;
using tiny_llama::ClmFiles;
using tiny_llama::ClmLoop;
using tiny_llama::GenerateOptions;
using tiny_llama::GenerationResult;
using tiny_llama::LlamaConfig;
using tiny_llama::LlamaWeights;

constexpr std::int32_t kSnapshotDim = 16;
// test_tiny_llama's shape with a fourth layer: SRC at 0, injection at 1, 2 and 3.
constexpr std::int32_t kLayers = 4;
using tiny_llama_test::make_stack;
using tiny_llama_test::small_config;
using tiny_llama_test::Stack;

tiny_llama::ClmCollectConfig collect_config(std::int32_t snapshot_dim = kSnapshotDim) {
  tiny_llama::ClmCollectConfig config;
  config.snapshot_dim = snapshot_dim;
  return config;
}

// An engine for the model; with a snapshot store in `store_dir` unless it is empty.
clm::EngineConfig engine_config(const LlamaConfig& c, const std::string& store_dir) {
  clm::EngineConfig e;
  e.pool = tiny_llama::kv_pool_for(c, 16, 1024 * 16, clm::KvDType::f32);
  e.special_token_ids = {ByteTokenizer::kBeginOfText, ByteTokenizer::kStartHeader, ByteTokenizer::kEndHeader,
                         ByteTokenizer::kEndOfTurn};
  e.src_gate.threshold_override = 0.0f;  // every scored step looks up: the loop's mechanics, not the head's skill
  if (!store_dir.empty()) {
    e.snapshot_store.path = store_dir;
    e.snapshot_store.num_shards = 2;
    e.snapshot_store.snapshot_dim = kSnapshotDim;
    e.snapshot_store.min_usage_threshold = 1;  // stored at the first sighting
    e.snapshot_store.rebuild_in_background = false;
  }
  return e;
}

std::vector<GenerationResult> generate(Stack& s, const std::vector<std::vector<std::int32_t>>& prompts,
                                       const GenerateOptions& options) {
  std::vector<GenerationResult> results(prompts.size());
  for (std::size_t i = 0; i < prompts.size(); ++i) {
    s.generator->submit(prompts[i], options, nullptr, [&results, i](const GenerationResult& r) { results[i] = r; });
  }
  const clm::Status ran = s.generator->run_until_idle();
  INFO(ran.message());
  REQUIRE(ran.ok());
  for (const GenerationResult& r : results) {
    INFO(r.status.message());
    REQUIRE(r.status.ok());
  }
  return results;
}

// ---- the workload: chats asking repeated and paraphrased questions ----------
std::vector<std::int32_t> random_bytes(std::mt19937& rng, int min_len, int max_len) {
  std::uniform_int_distribution<int> len(min_len, max_len), byte(0, 255);
  std::vector<std::int32_t> out(static_cast<std::size_t>(len(rng)));
  for (auto& t : out) t = byte(rng);
  return out;
}

// The same question with two bytes changed: another suffix key, a near state.
std::vector<std::int32_t> paraphrase(std::vector<std::int32_t> q, std::mt19937& rng) {
  std::uniform_int_distribution<std::size_t> at(0, q.size() - 1);
  std::uniform_int_distribution<int> byte(0, 255);
  for (int k = 0; k < 2; ++k) q[at(rng)] = byte(rng);
  return q;
}

struct Workload {
  std::vector<std::int32_t> system;                            // the shared system message
  std::vector<std::vector<std::vector<std::int32_t>>> rounds;  // [round][chat]: the question asked
};

// Round 0: chat c asks question c; 1: another chat's question of round 0
// (a repeat); 2: a paraphrase of its own; 3: a repeat again; 4: a new one.
Workload make_workload(std::uint32_t seed, int chats) {
  std::mt19937 rng(seed);
  Workload w;
  w.system = random_bytes(rng, 40, 60);
  std::vector<std::vector<std::int32_t>> pool;
  for (int i = 0; i < 2 * chats; ++i) pool.push_back(random_bytes(rng, 12, 30));
  const auto n = static_cast<std::size_t>(chats);
  w.rounds.resize(5);
  for (std::size_t c = 0; c < n; ++c) {
    w.rounds[0].push_back(pool[c]);
    w.rounds[1].push_back(pool[(c + 1) % n]);
    w.rounds[2].push_back(paraphrase(pool[c], rng));
    w.rounds[3].push_back(pool[(c + 2) % n]);
    w.rounds[4].push_back(pool[n + c]);
  }
  return w;
}

std::vector<std::int32_t> ask(std::vector<std::int32_t> history, const std::vector<std::int32_t>& question) {
  ByteTokenizer::append_header("user", history);
  history.insert(history.end(), question.begin(), question.end());
  history.push_back(ByteTokenizer::kEndOfTurn);
  ByteTokenizer::append_header("assistant", history);
  return history;
}

std::vector<std::int32_t> opening(const Workload& w) {
  std::vector<std::int32_t> h{ByteTokenizer::kBeginOfText};
  ByteTokenizer::append_header("system", h);
  h.insert(h.end(), w.system.begin(), w.system.end());
  h.push_back(ByteTokenizer::kEndOfTurn);
  return h;
}

// Runs the rounds one after another on each stack (the same prompts on all:
// the histories grow by the first stack's answers). multi_turn = false: every
// question opens a chat of its own. Returns [stack][round][chat].
using Runs = std::vector<std::vector<std::vector<GenerationResult>>>;
Runs run_workload(const std::vector<Stack*>& stacks, const Workload& w, const std::vector<GenerateOptions>& options,
                  bool multi_turn) {
  Runs runs(stacks.size());
  std::vector<std::vector<std::int32_t>> histories(w.rounds[0].size(), opening(w));
  for (const auto& round : w.rounds) {
    std::vector<std::vector<std::int32_t>> prompts;
    for (std::size_t c = 0; c < round.size(); ++c) {
      prompts.push_back(ask(multi_turn ? histories[c] : opening(w), round[c]));
    }
    for (std::size_t s = 0; s < stacks.size(); ++s) runs[s].push_back(generate(*stacks[s], prompts, options[s]));
    for (std::size_t c = 0; c < round.size(); ++c) {
      histories[c] = prompts[c];
      const auto& answer = runs[0].back()[c].tokens;
      histories[c].insert(histories[c].end(), answer.begin(), answer.end());
      histories[c].push_back(ByteTokenizer::kEndOfTurn);
    }
  }
  return runs;
}

GenerateOptions options(bool use_clm, bool use_cache = true) {
  GenerateOptions o;
  o.max_new_tokens = 12;  // no stop token: every run schedules the same batches
  o.keep_logits = true;
  o.cache_salt = "acme";
  o.use_cache = use_cache;
  o.use_clm = use_clm;
  return o;
}

// ---- collect and train --------------------------------------------------------
struct Command {
  int exit_code = -1;
  std::string out, err;
};

std::string read_text(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

Command run_train_clm(const clm_test::TempDir& dir, const std::string& args) {
  const std::string out = dir.str() + "/train.out", err = dir.str() + "/train.err";
  const std::string command = fmt::format("{} {} >{} 2>{}", TRAIN_CLM_SCRIPT, args, out, err);
  const int status = std::system(command.c_str());
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, read_text(out), read_text(err)};
}

// Runs the workload with a collector (CLM off), writes its files, trains them
// with train_clm.sh into dir/trained. Returns the trained files.
ClmFiles collect_and_train(const LlamaConfig& c, const LlamaWeights& w, std::uint32_t seed,
                           const clm_test::TempDir& dir) {
  Stack s = make_stack(c, w, engine_config(c, ""));
  std::unique_ptr<tiny_llama::ClmCollector> collector;
  REQUIRE(tiny_llama::ClmCollector::create(c, s.engine->config().special_token_ids, collect_config(), collector).ok());
  collector->install(*s.model, *s.generator);
  run_workload({&s}, make_workload(seed ^ 0xc011ec7, 6), {options(false)}, true);
  collector->uninstall(*s.model, *s.generator);
  const tiny_llama::ClmCollectStats stats = collector->stats();
  CHECK(stats.conversations == 30);
  CHECK(stats.feature_rows == 30 * 11);  // every answer token but the last is fed back
  CHECK(stats.adapter_pairs >= 12);      // rounds 1 and 3 repeat round 0's questions
  const std::string collect = dir.str() + "/collect", trained = dir.str() + "/trained";
  const clm::Status written = collector->write(collect);
  INFO(written.message());
  REQUIRE(written.ok());
  const Command train = run_train_clm(dir, fmt::format("{} {} {}", CLM_FIT_BINARY, collect, trained));
  INFO(train.out << train.err);
  REQUIRE(train.exit_code == 0);
  for (const char* step : {"train_clm: labels: {", "train_clm: src-head: {", "train_clm: projection: {",
                           "train_clm: adapter: {", "train_clm: done"}) {
    CHECK_THAT(train.out, Catch::Contains(step));
  }
  const ClmFiles files = ClmFiles::in(trained);
  REQUIRE(files.present());
  return files;
}

std::unique_ptr<ClmLoop> make_loop(Stack& s, const ClmFiles& files) {
  std::unique_ptr<ClmLoop> loop;
  const clm::Status created = ClmLoop::create(*s.engine, s.model->config(), files, {}, loop);
  INFO(created.message());
  REQUIRE(created.ok());
  loop->install(*s.model, *s.generator);
  return loop;
}

double relative_error(std::span<const float> a, std::span<const float> b) {
  double diff = 0.0, scale = 0.0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    diff = std::max(diff, std::abs(double(a[i]) - double(b[i])));
    scale = std::max(scale, std::abs(double(b[i])));
  }
  return diff / std::max(scale, 1e-30);
}

// Watches the loop's after_layer: which rows it changes, at which layers.
class InjectionSpy final : public tiny_llama::LayerObserver {
 public:
  InjectionSpy(ClmLoop& loop, std::int32_t hidden) : loop_(loop), hidden_(static_cast<std::size_t>(hidden)) {}
  clm::Status on_attention_output(std::int32_t layer, const tiny_llama::ForwardBatch& b, const float* rows) override {
    return loop_.on_attention_output(layer, b, rows);
  }
  clm::Status after_layer(std::int32_t layer, const tiny_llama::ForwardBatch& b, float* hidden) override {
    const std::vector<float> before(hidden, hidden + static_cast<std::size_t>(b.rows()) * hidden_);
    CLM_RETURN_IF_ERROR(loop_.after_layer(layer, b, hidden));
    std::set<std::int32_t> expected;  // the last rows of the sequences that got a snapshot
    const auto& inject = loop_.layers().inject;
    if (std::find(inject.begin(), inject.end(), layer) != inject.end()) {
      for (clm::SequenceId id : loop_.injecting()) {
        const auto i = static_cast<std::size_t>(std::find(b.ids.begin(), b.ids.end(), id) - b.ids.begin());
        expected.insert(b.indptr[i + 1] - 1);
      }
    }
    for (std::int32_t r = 0; r < b.rows(); ++r) {
      const bool changed = std::memcmp(before.data() + static_cast<std::size_t>(r) * hidden_,
                                       hidden + static_cast<std::size_t>(r) * hidden_, hidden_ * sizeof(float)) != 0;
      if (changed != (expected.count(r) != 0)) ++violations;
      if (changed) ++changed_rows;
    }
    return {};
  }
  clm::Status on_final_hidden(const tiny_llama::ForwardBatch& b, const float* last_rows) override {
    return loop_.on_final_hidden(b, last_rows);
  }
  std::int64_t violations = 0, changed_rows = 0;

 private:
  ClmLoop& loop_;
  std::size_t hidden_;
};

}  // namespace

TEST_CASE("CLM in the loop: collect, train through train_clm.sh, then repeated suffixes hit at level exact",
          "[clm_loop]") {
  const std::uint32_t seed = clm_test::fresh_seed();
  INFO("seed " << seed);
  const LlamaConfig c = small_config(kLayers);
  LlamaWeights w;
  tiny_llama::random_llama_weights(c, seed, w);
  clm_test::TempDir dir;
  const ClmFiles files = collect_and_train(c, w, seed, dir);

  const std::string store_dir = dir.str() + "/store";
  const Workload workload = make_workload(seed, 4);
  {
    Stack s = make_stack(c, w, engine_config(c, store_dir));
    std::unique_ptr<ClmLoop> loop = make_loop(s, files);
    CHECK(loop->layers().src == 0);  // the defaults: injection at the last 3 layers, the SRC head below them
    CHECK(loop->layers().inject == std::vector<std::int32_t>{1, 2, 3});
    const Runs runs = run_workload({&s}, workload, {options(true)}, true);
    const auto& rounds = runs[0];
    for (const GenerationResult& r : rounds[0]) {  // nothing stored yet: every lookup misses
      CHECK(r.clm.src_steps == 12);
      CHECK(r.clm.hits_exact + r.clm.hits_ann + r.clm.hits_fallback == 0);
      CHECK(r.clm.first_injected_step == -1);
      CHECK(r.clm.recorded);
      CHECK(r.clm.served.empty());
      CHECK(r.clm.key.rfind("TEXT-", 0) == 0);  // random bytes: the hashed host key
      CHECK(r.clm.record_result != clm::RecordResult::not_written);
    }
    for (const std::size_t round : {1u, 3u}) {  // questions round 0 asked: found by their key at the prefill
      for (const GenerationResult& r : rounds[round]) {
        INFO("round " << round << " request " << r.request);
        CHECK(r.clm.hits_exact >= 1);
        CHECK(r.clm.first_injected_step == 0);
        CHECK(r.clm.injected_steps >= 1);
        // Every hit is listed; the first, at the prefill, is the request's own key, served by key.
        CHECK(r.clm.served.size() == static_cast<std::size_t>(r.clm.hits_exact + r.clm.hits_ann + r.clm.hits_fallback));
        REQUIRE_FALSE(r.clm.served.empty());
        CHECK(r.clm.served[0].level == clm::SnapshotLevel::exact);
        CHECK(r.clm.served[0].forward == 0);
        CHECK(r.clm.served[0].key == r.clm.key);
        CHECK(r.clm.served[0].version >= 1);
      }
    }
    const tiny_llama::ClmLoopStats stats = loop->stats();
    INFO(tiny_llama::format_clm_stats(stats));
    CHECK(stats.requests == 20);
    CHECK(stats.hashed_suffixes == 20);  // random bytes have no lexicon key
    CHECK(stats.src_steps == 20 * 12);
    CHECK(stats.lookups() == stats.reuse_decisions);
    CHECK(stats.hits_exact >= 8);
    CHECK(stats.lookups_with_query > 0);
    CHECK(stats.injected_steps > 0);
    CHECK(stats.records == 20);
    CHECK(stats.record_errors == 0);
    std::uint64_t histogram = 0;
    for (std::uint64_t n : stats.score_histogram) histogram += n;
    CHECK(histogram == stats.src_steps);
    CHECK(stats.score_quantile(0.0) <= stats.score_quantile(0.5));
    CHECK(stats.score_quantile(0.5) <= stats.score_quantile(1.0));
    const clm::EngineMetrics m = s.engine->metrics();
    CHECK(m.src.steps == stats.src_steps);
    CHECK(m.store.hits_exact == stats.hits_exact);
    CHECK(m.store.snapshots > 0);
    // Another tenant asking round 0's first question finds nothing of acme's.
    GenerateOptions stranger = options(true);
    stranger.cache_salt = "globex";
    const auto other = generate(s, {ask(opening(workload), workload.rounds[0][0])}, stranger);
    CHECK(other[0].clm.hits_exact + other[0].clm.hits_ann + other[0].clm.hits_fallback == 0);
    const clm::Status invariants = s.engine->check_invariants();
    INFO(invariants.message());
    REQUIRE(invariants.ok());
    REQUIRE(s.engine->metrics().active_sequences == 0);
  }
  // The store is SQLite files on disk: a new engine over them serves the same snapshots.
  bool has_database = false;
  for (const auto& entry : std::filesystem::directory_iterator(store_dir)) {
    has_database |= entry.path().extension() == ".db";
  }
  CHECK(has_database);
  Stack again = make_stack(c, w, engine_config(c, store_dir));
  std::unique_ptr<ClmLoop> loop = make_loop(again, files);
  CHECK(again.engine->metrics().store.snapshots > 0);
  const auto repeated = generate(again, {ask(opening(workload), workload.rounds[0][1])}, options(true));
  CHECK(repeated[0].clm.hits_exact >= 1);
  CHECK(again.engine->check_invariants().ok());
}

TEST_CASE("CLM in the loop: injections change only the adapter's layers of the sequences that got a snapshot",
          "[clm_loop]") {
  const std::uint32_t seed = clm_test::fresh_seed();
  INFO("seed " << seed);
  const LlamaConfig c = small_config(kLayers);
  LlamaWeights w;
  tiny_llama::random_llama_weights(c, seed, w);
  clm_test::TempDir dir;
  const ClmFiles files = collect_and_train(c, w, seed, dir);

  Stack on = make_stack(c, w, engine_config(c, dir.str() + "/store"));
  Stack off = make_stack(c, w, engine_config(c, ""));
  std::unique_ptr<ClmLoop> loop = make_loop(on, files);
  InjectionSpy spy(*loop, c.hidden);
  on.model->set_observer(&spy);  // the loop stays the generator's request listener
  // One question per chat: a cached prefix never holds a row some earlier
  // request injected into (the last prompt row is never reused), so every
  // difference from the CLM-off run is this request's own injection.
  const Runs runs = run_workload({&off, &on}, make_workload(seed, 5), {options(false), options(true)}, false);

  CHECK(spy.violations == 0);
  CHECK(spy.changed_rows > 0);
  const auto vocab = static_cast<std::size_t>(c.vocab_size);
  int injected = 0, untouched = 0;
  for (std::size_t round = 0; round < runs[0].size(); ++round) {
    for (std::size_t chat = 0; chat < runs[0][round].size(); ++chat) {
      const GenerationResult& plain = runs[0][round][chat];
      const GenerationResult& clm = runs[1][round][chat];
      INFO("round " << round << " chat " << chat << " first injection at " << clm.clm.first_injected_step);
      const auto first = clm.clm.first_injected_step;
      const std::size_t equal_steps = first < 0 ? plain.tokens.size() : static_cast<std::size_t>(first);
      for (std::size_t step = 0; step < equal_steps; ++step) {
        INFO("step " << step);
        REQUIRE(clm.tokens[step] == plain.tokens[step]);
        REQUIRE(std::memcmp(clm.logits.data() + step * vocab, plain.logits.data() + step * vocab,
                            vocab * sizeof(float)) == 0);
      }
      if (first < 0) {
        ++untouched;
        continue;
      }
      ++injected;
      const auto at = static_cast<std::size_t>(first) * vocab;
      CHECK(relative_error(std::span(clm.logits).subspan(at, vocab), std::span(plain.logits).subspan(at, vocab)) >
            1e-4);
    }
  }
  CHECK(injected > 0);
  CHECK(untouched >= 5);  // round 0: the store was empty
  CHECK(on.engine->check_invariants().ok());
  CHECK(off.engine->check_invariants().ok());
}

TEST_CASE("CLM in the loop: baseline mode computes exactly the CLM-off logits", "[clm_loop]") {
  const std::uint32_t seed = clm_test::fresh_seed();
  INFO("seed " << seed);
  const LlamaConfig c = small_config(kLayers);
  LlamaWeights w;
  tiny_llama::random_llama_weights(c, seed, w);
  clm_test::TempDir dir;
  const ClmFiles files = collect_and_train(c, w, seed, dir);

  Stack plain = make_stack(c, w, engine_config(c, ""));
  Stack flagged = make_stack(c, w, engine_config(c, dir.str() + "/store-a"));  // loop installed, use_clm off
  Stack removed = make_stack(c, w, engine_config(c, dir.str() + "/store-b"));  // loop created, then uninstalled
  std::unique_ptr<ClmLoop> flagged_loop = make_loop(flagged, files);
  std::unique_ptr<ClmLoop> removed_loop = make_loop(removed, files);
  removed_loop->uninstall(*removed.model, *removed.generator);
  const Runs runs = run_workload({&plain, &flagged, &removed}, make_workload(seed, 4),
                                 {options(false), options(false), options(true)}, true);
  for (std::size_t run = 1; run < runs.size(); ++run) {
    for (std::size_t round = 0; round < runs[0].size(); ++round) {
      for (std::size_t chat = 0; chat < runs[0][round].size(); ++chat) {
        const GenerationResult& a = runs[0][round][chat];
        const GenerationResult& b = runs[run][round][chat];
        INFO("run " << run << " round " << round << " chat " << chat);
        CHECK(b.tokens == a.tokens);
        REQUIRE(b.logits.size() == a.logits.size());
        CHECK(std::memcmp(b.logits.data(), a.logits.data(), a.logits.size() * sizeof(float)) == 0);
        CHECK(b.clm.src_steps == 0);
        CHECK(b.cached_tokens == a.cached_tokens);
      }
    }
  }
  const tiny_llama::ClmLoopStats stats = flagged_loop->stats();
  CHECK(stats.baseline_requests == 20);
  CHECK(stats.requests == 0);
  CHECK(stats.lookups() == 0);
  CHECK(flagged.engine->metrics().src.steps == 0);
  CHECK(removed_loop->stats().requests == 0);
  CHECK(removed.engine->metrics().src.steps == 0);
  for (Stack* s : {&plain, &flagged, &removed}) CHECK(s->engine->check_invariants().ok());
}

TEST_CASE("CLM in the loop: missing or corrupt trained files and bad settings give a clear status", "[clm_loop]") {
  const LlamaConfig c = small_config(kLayers);
  LlamaWeights w;
  tiny_llama::random_llama_weights(c, 11, w);
  clm_test::TempDir dir;
  // Valid parts written directly (no training needed to break them).
  const ClmFiles good = ClmFiles::in(dir.str());
  {
    std::mt19937 rng(5);
    std::normal_distribution<float> n(0.0f, 1.0f);
    clm::SrcHeadWeights head;
    head.hidden = c.hidden;
    head.w1.resize(static_cast<std::size_t>(c.hidden / 4 * c.hidden));
    head.b1.resize(static_cast<std::size_t>(c.hidden / 4));
    head.w2.resize(static_cast<std::size_t>(c.hidden / 4));
    for (auto* v : {&head.w1, &head.b1, &head.w2})
      for (float& x : *v) x = 0.1f * n(rng);
    REQUIRE(clm::write_src_head(good.head, head, clm::Gelu::tanh).ok());
    std::vector<float> samples(static_cast<std::size_t>(200 * c.hidden));
    for (float& x : samples) x = n(rng);
    clm::SnapshotProjectionWeights projection;
    REQUIRE(clm::fit_pca(clm::ConstActivationView::f32(samples, 200, c.hidden), kSnapshotDim, projection).ok());
    REQUIRE(clm::write_snapshot_projection(good.projection, projection).ok());
    clm::SnapshotAdapterWeights adapter;
    adapter.hidden = c.hidden;
    adapter.snapshot_dim = kSnapshotDim;
    adapter.weight.assign(static_cast<std::size_t>(c.hidden * kSnapshotDim), 0.01f);
    adapter.bias.assign(static_cast<std::size_t>(c.hidden), 0.0f);
    REQUIRE(clm::write_snapshot_adapter(good.adapter, adapter).ok());
    adapter.hidden = 32;
    adapter.weight.resize(static_cast<std::size_t>(32 * kSnapshotDim));
    adapter.bias.resize(32);
    REQUIRE(clm::write_snapshot_adapter(dir.str() + "/narrow_adapter.safetensors", adapter).ok());
  }
  std::ofstream(dir.str() + "/garbage.safetensors") << "not a safetensors file at all";
  Stack s = make_stack(c, w, engine_config(c, dir.str() + "/store"));
  std::unique_ptr<ClmLoop> loop;
  const auto expect_refused = [&](const ClmFiles& files, const tiny_llama::ClmLoopConfig& config,
                                  const std::string& mentions) {
    const clm::Status st = ClmLoop::create(*s.engine, c, files, config, loop);
    INFO(st.message());
    CHECK(!st.ok());
    CHECK_THAT(st.message(), Catch::Contains(mentions));
    CHECK(loop == nullptr);
    CHECK(s.engine->src_head() == nullptr);  // nothing half-installed
    CHECK(s.engine->snapshot_projection() == nullptr);
    CHECK(s.engine->snapshot_adapter() == nullptr);
    return st.code();
  };
  SECTION("a missing file is not_found, naming it") {
    ClmFiles files = good;
    files.adapter = dir.str() + "/nowhere/adapter.safetensors";
    CHECK(!files.present());
    CHECK(expect_refused(files, {}, files.adapter) == clm::StatusCode::not_found);
  }
  SECTION("a corrupt file names the part and the file") {
    for (int part = 0; part < 3; ++part) {
      ClmFiles files = good;
      std::string* target = part == 0 ? &files.head : part == 1 ? &files.projection : &files.adapter;
      *target = dir.str() + "/garbage.safetensors";
      const clm::StatusCode code = expect_refused(files, {}, "garbage.safetensors");
      CHECK((code == clm::StatusCode::invalid_argument || code == clm::StatusCode::io_error));
    }
    ClmFiles swapped = good;
    swapped.head = good.adapter;  // a file of the wrong kind
    CHECK(expect_refused(swapped, {}, "SRC head") == clm::StatusCode::invalid_argument);
  }
  SECTION("parts that do not fit the model or the store") {
    ClmFiles files = good;
    files.adapter = dir.str() + "/narrow_adapter.safetensors";
    CHECK(expect_refused(files, {}, "hidden 32") == clm::StatusCode::invalid_argument);
    Stack other = make_stack(c, w, [&] {
      clm::EngineConfig e = engine_config(c, dir.str() + "/store-8");
      e.snapshot_store.snapshot_dim = 8;
      return e;
    }());
    const clm::Status st = ClmLoop::create(*other.engine, c, good, {}, loop);
    CHECK(st.code() == clm::StatusCode::invalid_argument);
    CHECK_THAT(st.message(), Catch::Contains("snapshot_dim"));
  }
  SECTION("bad layers, and an engine with no store") {
    tiny_llama::ClmLoopConfig config;
    config.layers.inject = {0, 3};
    CHECK(expect_refused(good, config, "SRC layer") == clm::StatusCode::invalid_argument);
    config.layers.inject = {2, 4};
    CHECK(expect_refused(good, config, "outside") == clm::StatusCode::invalid_argument);
    config.layers = {.inject = {2, 3}, .src = 2};
    CHECK(expect_refused(good, config, "SRC layer") == clm::StatusCode::invalid_argument);
    Stack storeless = make_stack(c, w, engine_config(c, ""));
    const clm::Status st = ClmLoop::create(*storeless.engine, c, good, {}, loop);
    CHECK(st.code() == clm::StatusCode::failed_precondition);
    CHECK_THAT(st.message(), Catch::Contains("snapshot store"));
  }
  SECTION("the good files load") {
    const clm::Status st = ClmLoop::create(*s.engine, c, good, {}, loop);
    INFO(st.message());
    CHECK(st.ok());
  }
  SECTION("a collector with nothing collected, and train_clm.sh on bad input") {
    std::unique_ptr<tiny_llama::ClmCollector> collector;
    REQUIRE(tiny_llama::ClmCollector::create(c, {}, collect_config(), collector).ok());
    const clm::Status empty = collector->write(dir.str() + "/empty");
    CHECK(empty.code() == clm::StatusCode::failed_precondition);
    CHECK(tiny_llama::ClmCollector::create(c, {}, collect_config(1000), collector).code() ==
          clm::StatusCode::invalid_argument);

    const std::string out = dir.str() + "/trained";
    Command r = run_train_clm(dir, CLM_FIT_BINARY);
    CHECK(r.exit_code == 1);
    CHECK_THAT(r.err, Catch::Contains("usage"));
    r = run_train_clm(dir, fmt::format("{} {}/missing {}", CLM_FIT_BINARY, dir.str(), out));
    CHECK(r.exit_code == 1);
    CHECK_THAT(r.err, Catch::Contains("does not exist"));
    r = run_train_clm(dir, fmt::format("{}/no_clm_fit {} {}", dir.str(), dir.str(), out));
    CHECK(r.exit_code == 1);
    CHECK_THAT(r.err, Catch::Contains("clm_fit"));
    // A collect directory whose files are garbage: clm_fit's own message comes through.
    const std::string broken = dir.str() + "/broken";
    std::filesystem::create_directories(broken);
    for (const char* f : {"conversations", "src_features", "hidden_samples", "adapter_pairs"}) {
      std::filesystem::copy_file(dir.str() + "/garbage.safetensors", fmt::format("{}/{}.safetensors", broken, f));
    }
    std::ofstream(broken + "/clm_collect.txt") << "snapshot_dim=16\nlabel_ngram=4\nresidual_scale=0.3\n";
    r = run_train_clm(dir, fmt::format("{} {} {}", CLM_FIT_BINARY, broken, out));
    CHECK(r.exit_code == 1);
    CHECK_THAT(r.err, Catch::Contains("labels failed"));
    CHECK(!std::filesystem::exists(out + "/head.safetensors"));
    std::ofstream(broken + "/clm_collect.txt") << "snapshot_dim=sixteen\n";
    r = run_train_clm(dir, fmt::format("{} {} {}", CLM_FIT_BINARY, broken, out));
    CHECK(r.exit_code == 1);
    CHECK_THAT(r.err, Catch::Contains("not a number"));
  }
  CHECK(s.engine->check_invariants().ok());
}
