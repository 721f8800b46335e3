// examples/tiny_llama/test_tiny_llama.cpp: the decoder against an independent
// float64 reference, and the equality proof users rely on: with prefix reuse
// (device tier, host tier, a storage directory shared by two engines; page
// sizes 1 and 16; several tenants; a pool small enough to evict), every
// step's logits equal those of a full recompute with no cache (relative error
// <= 1e-5 in f32). Plus the bad input the decoder must refuse.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <map>
#include <random>

#include <fmt/format.h>
#include <catch2/catch.hpp>

#include "byte_tokenizer.hpp"
#include "generator.hpp"
#include "store/store_test_support.hpp"  // TempDir
#include "test_support.hpp"              // fresh_seed
#include "tiny_llama_test_support.hpp"

namespace {

using tiny_llama::ByteTokenizer;
using tiny_llama::GenerateOptions;
using tiny_llama::GenerationResult;
using tiny_llama::LlamaConfig;
using tiny_llama::LlamaWeights;
using tiny_llama_test::engine_config;
using tiny_llama_test::EqualityRun;
using tiny_llama_test::expect_same;
using tiny_llama_test::generate;
using tiny_llama_test::make_stack;
using tiny_llama_test::random_text;
using tiny_llama_test::relative_error;
using tiny_llama_test::run_conversations;
using tiny_llama_test::Stack;

// ---- the independent reference: a dense float64 forward, no pages, no cache --
std::vector<double> reference_logits(const LlamaConfig& c, const LlamaWeights& w,
                                     const std::vector<std::int32_t>& tokens) {
  const std::size_t n = tokens.size(), h = c.hidden, hd = c.head_dim, q_dim = c.q_dim(), kv_dim = c.kv_dim();
  const std::size_t inter = c.intermediate;
  std::vector<double> x(n * h);
  for (std::size_t t = 0; t < n; ++t) {
    for (std::size_t i = 0; i < h; ++i) x[t * h + i] = w.embed[static_cast<std::size_t>(tokens[t]) * h + i];
  }
  const auto norm = [&](const std::vector<double>& in, std::size_t t, const std::vector<float>& weight, double* out) {
    double sum = 0;
    for (std::size_t i = 0; i < h; ++i) sum += in[t * h + i] * in[t * h + i];
    const double scale = 1.0 / std::sqrt(sum / double(h) + c.rms_norm_eps);
    for (std::size_t i = 0; i < h; ++i) out[i] = in[t * h + i] * scale * weight[i];
  };
  const auto linear = [](const double* in, std::size_t k, const std::vector<float>& weight, std::size_t out_dim,
                         double* out) {
    for (std::size_t o = 0; o < out_dim; ++o) {
      double sum = 0;
      for (std::size_t i = 0; i < k; ++i) sum += in[i] * weight[o * k + i];
      out[o] = sum;
    }
  };
  const auto rotate = [&](double* v, std::size_t heads, std::size_t pos) {
    for (std::size_t head = 0; head < heads; ++head) {
      for (std::size_t i = 0; i < hd / 2; ++i) {
        const double angle = double(pos) * std::pow(c.rope_theta, -2.0 * double(i) / double(hd));
        const double x1 = v[head * hd + i], x2 = v[head * hd + i + hd / 2];
        v[head * hd + i] = x1 * std::cos(angle) - x2 * std::sin(angle);
        v[head * hd + i + hd / 2] = x2 * std::cos(angle) + x1 * std::sin(angle);
      }
    }
  };
  std::vector<double> hn(h), q(n * q_dim), k(n * kv_dim), v(n * kv_dim), attn(q_dim), o(h), g(inter), u(inter);
  for (const tiny_llama::LlamaLayerWeights& layer : w.layers) {
    for (std::size_t t = 0; t < n; ++t) {
      norm(x, t, layer.attn_norm, hn.data());
      linear(hn.data(), h, layer.wq, q_dim, &q[t * q_dim]);
      linear(hn.data(), h, layer.wk, kv_dim, &k[t * kv_dim]);
      linear(hn.data(), h, layer.wv, kv_dim, &v[t * kv_dim]);
      rotate(&q[t * q_dim], static_cast<std::size_t>(c.num_heads), t);
      rotate(&k[t * kv_dim], static_cast<std::size_t>(c.num_kv_heads), t);
    }
    std::vector<double> next = x;
    for (std::size_t t = 0; t < n; ++t) {
      for (std::size_t head = 0; head < static_cast<std::size_t>(c.num_heads); ++head) {
        const std::size_t kv_head = head / static_cast<std::size_t>(c.num_heads / c.num_kv_heads);
        std::vector<double> scores(t + 1);
        double top = -1e300;
        for (std::size_t s = 0; s <= t; ++s) {
          double dot = 0;
          for (std::size_t i = 0; i < hd; ++i) dot += q[t * q_dim + head * hd + i] * k[s * kv_dim + kv_head * hd + i];
          scores[s] = dot / std::sqrt(double(hd));
          top = std::max(top, scores[s]);
        }
        double total = 0;
        for (double& s : scores) total += (s = std::exp(s - top));
        for (std::size_t i = 0; i < hd; ++i) {
          double sum = 0;
          for (std::size_t s = 0; s <= t; ++s) sum += scores[s] * v[s * kv_dim + kv_head * hd + i];
          attn[head * hd + i] = sum / total;
        }
      }
      linear(attn.data(), q_dim, layer.wo, h, o.data());
      for (std::size_t i = 0; i < h; ++i) next[t * h + i] += o[i];
    }
    x = next;
    for (std::size_t t = 0; t < n; ++t) {
      norm(x, t, layer.mlp_norm, hn.data());
      linear(hn.data(), h, layer.w_gate, inter, g.data());
      linear(hn.data(), h, layer.w_up, inter, u.data());
      for (std::size_t i = 0; i < inter; ++i) g[i] = g[i] / (1.0 + std::exp(-g[i])) * u[i];
      linear(g.data(), inter, layer.w_down, h, o.data());
      for (std::size_t i = 0; i < h; ++i) x[t * h + i] += o[i];
    }
  }
  norm(x, n - 1, w.final_norm, hn.data());
  std::vector<double> logits(static_cast<std::size_t>(c.vocab_size));
  linear(hn.data(), h, w.output_matrix(), logits.size(), logits.data());
  return logits;
}

}  // namespace

TEST_CASE("random init: the same weights on 1, 3 or all threads, and every element drawn", "[tiny_llama]") {
  const std::uint32_t seed = clm_test::fresh_seed();
  INFO("seed " << seed);
  LlamaConfig c = tiny_llama_test::small_config(2);
  c.hidden = 256;
  c.intermediate = 811;  // gate, up and down: 207,616 draws each, three uneven shares of 3 threads
  c.tie_word_embeddings = false;
  LlamaWeights one, three, all;
  tiny_llama::random_llama_weights(c, seed, one, 1);
  tiny_llama::random_llama_weights(c, seed, three, 3);
  tiny_llama::random_llama_weights(c, seed, all);
  const auto tensors = [](const LlamaWeights& w) {
    std::vector<const std::vector<float>*> t{&w.embed, &w.final_norm, &w.lm_head};
    for (const auto& l : w.layers) {
      for (const auto* x : {&l.attn_norm, &l.wq, &l.wk, &l.wv, &l.wo, &l.mlp_norm, &l.w_gate, &l.w_up, &l.w_down}) {
        t.push_back(x);
      }
    }
    return t;
  };
  const auto a = tensors(one), b = tensors(three), d = tensors(all);
  for (std::size_t i = 0; i < a.size(); ++i) {
    INFO("tensor " << i);
    CHECK(*a[i] == *b[i]);
    CHECK(*a[i] == *d[i]);
  }
  // Every share drawn: no element left at 0, and the spread of the fan-in scaling.
  for (const std::vector<float>* x : {&three.layers[0].w_gate, &three.layers[1].w_down}) {
    const double fan_in = x == &three.layers[0].w_gate ? c.hidden : c.intermediate;
    double sum2 = 0;
    std::size_t zeros = 0;
    for (float v : *x) {
      zeros += v == 0.0f ? 1 : 0;
      sum2 += double(v) * v;
    }
    CHECK(zeros == 0);
    CHECK(std::sqrt(sum2 / static_cast<double>(x->size()) * fan_in) == Approx(1.0).epsilon(0.02));
  }
}

TEST_CASE("the decoder's logits equal a dense float64 reference", "[tiny_llama]") {
  const std::uint32_t seed = clm_test::fresh_seed();
  INFO("seed " << seed);
  const LlamaConfig c = tiny_llama_test::small_config(3);
  LlamaWeights w;
  tiny_llama::random_llama_weights(c, seed, w);
  // A workspace reserved at creation (smaller than the prompt: it grows) changes nothing.
  for (const auto& [page_size, workspace_rows] : {std::pair{1, 0}, std::pair{16, 0}, std::pair{16, 24}}) {
    Stack s = make_stack(c, w, engine_config(c, page_size, 4096), 2, workspace_rows);
    std::mt19937 rng(seed);
    const auto prompt = random_text(rng, 30, 90);
    GenerateOptions o;
    o.max_new_tokens = 6;
    o.keep_logits = true;
    const auto result = generate(s, {prompt}, {o});
    std::vector<std::int32_t> seen = prompt;
    for (std::size_t step = 0; step < result[0].tokens.size(); ++step) {
      const std::vector<double> expected = reference_logits(c, w, seen);
      std::vector<float> expected_f(expected.begin(), expected.end());
      const double error = relative_error(
          std::span(result[0].logits).subspan(step * static_cast<std::size_t>(c.vocab_size), expected.size()),
          expected_f);
      INFO("page " << page_size << " workspace " << workspace_rows << " step " << step << " relative error " << error);
      REQUIRE(error <= 1e-4);  // f32 against f64, through 3 layers
      seen.push_back(result[0].tokens[step]);
    }
  }
}

TEST_CASE("prefix reuse never changes the logits: device tier, page sizes 1 and 16, tenants, evictions",
          "[tiny_llama][equality]") {
  const std::uint32_t seed = clm_test::fresh_seed();
  INFO("seed " << seed);
  const LlamaConfig c = tiny_llama_test::small_config(3);
  LlamaWeights w;
  tiny_llama::random_llama_weights(c, seed, w);
  std::mt19937 rng(seed ^ 0x5eed);
  const auto system_prompt = random_text(rng, 100, 160);
  for (const std::int32_t page_size : {1, 16}) {
    INFO("page size " << page_size);
    // 8 conversations of up to ~450 tokens each over 3 tenants in a pool of
    // 1024 tokens: later turns evict earlier ones' pages.
    Stack cached = make_stack(c, w, engine_config(c, page_size, 1024));
    Stack baseline = make_stack(c, w, engine_config(c, page_size, 8192));
    const EqualityRun run = run_conversations(cached, baseline, seed + page_size, 3, 8, 4, system_prompt);
    const clm::EngineMetrics m = cached.engine->metrics();
    // Reuse happened: over 50 seeds 31-52% of prompt tokens came from the
    // cache (which pages survive depends on the random lengths), so a fifth.
    CHECK(run.cached_tokens > run.prompt_tokens / 5);
    CHECK(m.cache.evicted_tokens > 0);  // and so did evictions
    // A tenant that never ran gets nothing of the others' identical system prompt.
    std::vector<std::int32_t> probe{ByteTokenizer::kBeginOfText};
    probe.insert(probe.end(), system_prompt.begin(), system_prompt.end());
    GenerateOptions stranger;
    stranger.max_new_tokens = 1;
    stranger.cache_salt = "tenant-never-seen";
    CHECK(generate(cached, {probe}, {stranger})[0].cached_tokens == 0);
    const clm::Status invariants = cached.engine->check_invariants();
    REQUIRE(invariants.ok());
  }
}

TEST_CASE("prefix reuse never changes the logits: host tier and a storage directory shared by two engines",
          "[tiny_llama][equality][tiers]") {
  const std::uint32_t seed = clm_test::fresh_seed();
  INFO("seed " << seed);
  const LlamaConfig c = tiny_llama_test::small_config(3);
  LlamaWeights w;
  tiny_llama::random_llama_weights(c, seed, w);
  std::mt19937 rng(seed ^ 0x7135);
  const auto system_prompt = random_text(rng, 100, 160);
  clm_test::TempDir storage;
  const std::int32_t page_size = 16;
  clm::EngineConfig tiered = engine_config(c, page_size, 512);  // a small device tier: evicts to the host
  tiered.tiers.host_pages = 8192 / page_size;
  tiered.tiers.storage_url = "file://" + storage.str();
  tiered.model_id = "test-model";                            // storage pages are one model's
  tiered.tiers.write_policy = clm::WritePolicy::write_back;  // every evicted page goes to the host
  Stack baseline = make_stack(c, w, engine_config(c, page_size, 8192));
  EqualityRun first;
  {
    Stack cached = make_stack(c, w, tiered);
    first = run_conversations(cached, baseline, seed, 2, 6, 3, system_prompt);
    cached.engine->wait_for_tiers();
    CHECK(first.host_tokens > 0);  // pages came back from the host tier
  }
  // A second engine over the same directory starts empty on device and host:
  // what it finds of the same conversations' prefixes, storage gave it.
  Stack second = make_stack(c, w, tiered);
  const EqualityRun again = run_conversations(second, baseline, seed, 2, 6, 2, system_prompt);
  CHECK(again.storage_tokens > 0);
  CHECK(again.cached_tokens > 0);
  const clm::Status invariants = second.engine->check_invariants();
  REQUIRE(invariants.ok());
}

TEST_CASE("the equality check can fail: corrupted cached K/V pages change the logits", "[tiny_llama][equality]") {
  const std::uint32_t seed = clm_test::fresh_seed();
  INFO("seed " << seed);
  const LlamaConfig c = tiny_llama_test::small_config(3);
  LlamaWeights w;
  tiny_llama::random_llama_weights(c, seed, w);
  Stack cached = make_stack(c, w, engine_config(c, 16, 4096));
  Stack baseline = make_stack(c, w, engine_config(c, 16, 4096));
  std::mt19937 rng(seed);
  const auto prompt = random_text(rng, 64, 64);
  GenerateOptions o;
  o.max_new_tokens = 2;
  o.keep_logits = true;
  generate(cached, {prompt}, {o});
  // The prompt's pages are cached now; negate layer 0's K and V in every page
  // (a shift of one value can happen to move the logits by little).
  const clm::PagedKvPool& pool = cached.engine->pool();
  const std::size_t layer_values = 2 * static_cast<std::size_t>(pool.config().page_size) *
                                   static_cast<std::size_t>(c.num_kv_heads) * static_cast<std::size_t>(c.head_dim);
  for (std::int32_t page = 0; page < pool.num_pages(); ++page) {
    float* kv = static_cast<float*>(pool.k_data(page, 0));  // K, then V, of layer 0
    for (std::size_t i = 0; i < layer_values; ++i) kv[i] = -kv[i];
  }
  auto longer = prompt;
  longer.push_back(7);
  const auto reused = generate(cached, {longer}, {o});
  REQUIRE(reused[0].cached_tokens > 0);
  GenerateOptions off = o;
  off.use_cache = false;
  const auto recomputed = generate(baseline, {longer}, {off});
  CHECK(relative_error(std::span(reused[0].logits).first(static_cast<std::size_t>(c.vocab_size)),
                       std::span(recomputed[0].logits).first(static_cast<std::size_t>(c.vocab_size))) > 1e-3);
}

namespace {
// Each request's answer, run together with the others, is the one it gets alone
// (page 16, a pool with room to spare, one thread).
void expect_answers_alone(const LlamaConfig& c, const LlamaWeights& w,
                          const std::vector<std::vector<std::int32_t>>& prompts,
                          const std::vector<GenerateOptions>& options, const std::vector<GenerationResult>& together) {
  EqualityRun run;
  for (std::size_t i = 0; i < prompts.size(); ++i) {
    INFO("request " << i);
    REQUIRE(together[i].status.ok());
    Stack alone = make_stack(c, w, engine_config(c, 16, 8192), 1);
    const auto single = generate(alone, {prompts[i]}, {options[i]});
    expect_same(together[i], single[0], c.vocab_size, run);
  }
}
}  // namespace

TEST_CASE("continuous batching: requests joining and leaving give the answers they give alone", "[tiny_llama]") {
  const std::uint32_t seed = clm_test::fresh_seed();
  INFO("seed " << seed);
  const LlamaConfig c = tiny_llama_test::small_config(3);
  LlamaWeights w;
  tiny_llama::random_llama_weights(c, seed, w);
  std::mt19937 rng(seed);
  std::vector<std::vector<std::int32_t>> prompts;
  std::vector<GenerateOptions> options;
  for (int i = 0; i < 10; ++i) {
    prompts.push_back(random_text(rng, 1, 120));
    GenerateOptions o;
    o.max_new_tokens = std::uniform_int_distribution<int>(1, 20)(rng);  // they leave at different steps
    o.keep_logits = true;
    o.use_cache = false;
    options.push_back(o);
  }
  Stack together = make_stack(c, w, engine_config(c, 16, 8192));
  expect_answers_alone(c, w, prompts, options, generate(together, prompts, options));
}

TEST_CASE("continuous batching in a pool too small for every request at once: waiting leaves the cache alone",
          "[tiny_llama]") {
  // A request that waits for room must not be matched, locked, counted or
  // evicted for on every step it waits: the engine sees one admission per
  // request, and the cache's counts are those of the requests themselves.
  const std::uint32_t seed = clm_test::fresh_seed();
  INFO("seed " << seed);
  const LlamaConfig c = tiny_llama_test::small_config(3);
  LlamaWeights w;
  tiny_llama::random_llama_weights(c, seed, w);
  std::mt19937 rng(seed);
  constexpr std::int32_t kPage = 16, kPoolTokens = 512;
  const auto shared = random_text(rng, 40, 80);  // a system prompt every request starts with
  std::vector<std::vector<std::int32_t>> prompts;
  std::vector<GenerateOptions> options;
  std::int64_t pages_at_once = 0;
  std::uint64_t prompt_tokens = 0;
  for (int i = 0; i < 10; ++i) {
    std::vector<std::int32_t> prompt = shared;
    const auto tail = random_text(rng, 20, 120);
    prompt.insert(prompt.end(), tail.begin(), tail.end());
    GenerateOptions o;
    o.max_new_tokens = std::uniform_int_distribution<int>(1, 20)(rng);
    o.keep_logits = true;
    pages_at_once += (static_cast<std::int64_t>(prompt.size()) + o.max_new_tokens + kPage - 1) / kPage;
    prompt_tokens += prompt.size();
    prompts.push_back(std::move(prompt));
    options.push_back(o);
  }
  REQUIRE(pages_at_once > kPoolTokens / kPage);  // so some requests must wait
  Stack tight = make_stack(c, w, engine_config(c, kPage, kPoolTokens));
  const auto batched = generate(tight, prompts, options);
  const clm::EngineMetrics m = tight.engine->metrics();
  CHECK(m.admitted == prompts.size());
  CHECK(m.aborted == 0);
  CHECK(m.rejected == 0);
  CHECK(m.finished == prompts.size());
  CHECK(m.cache.match_calls == prompts.size());
  CHECK(m.cache.tokens_queried == prompt_tokens);
  expect_answers_alone(c, w, prompts, options, batched);
}

namespace {
// sample_token's distribution written another way, in long double: each
// token's penalty counted by scanning, the top-k set by ranks, the nucleus
// by the mass ranked before each token.
std::vector<long double> reference_distribution(std::span<const float> logits, std::span<const std::int32_t> generated,
                                                const tiny_llama::SamplingParams& p) {
  const std::size_t vocab = logits.size();
  std::vector<long double> z(vocab), prob(vocab);
  for (std::size_t i = 0; i < vocab; ++i) {
    const auto count = std::count(generated.begin(), generated.end(), static_cast<std::int32_t>(i));
    z[i] = logits[i] - p.frequency_penalty * static_cast<long double>(count) - (count > 0 ? p.presence_penalty : 0.0f);
  }
  const long double top = *std::max_element(z.begin(), z.end());
  for (std::size_t i = 0; i < vocab; ++i) prob[i] = std::exp((z[i] - top) / p.temperature);
  const auto before = [&](std::size_t j, std::size_t i) { return prob[j] > prob[i] || (prob[j] == prob[i] && j < i); };
  std::vector<bool> in(vocab, true);
  if (p.top_k > 0) {
    for (std::size_t i = 0; i < vocab; ++i) {
      std::size_t rank = 0;
      for (std::size_t j = 0; j < vocab; ++j) rank += before(j, i) ? 1 : 0;
      in[i] = rank < static_cast<std::size_t>(p.top_k);
    }
  }
  long double mass = 0;
  for (std::size_t i = 0; i < vocab; ++i) mass += in[i] ? prob[i] : 0;
  std::vector<bool> nucleus = in;
  for (std::size_t i = 0; i < vocab; ++i) {
    if (!in[i]) continue;
    long double ahead = 0;
    for (std::size_t j = 0; j < vocab; ++j) ahead += (in[j] && before(j, i)) ? prob[j] : 0;
    nucleus[i] = ahead < p.top_p * mass;
  }
  long double kept = 0;
  for (std::size_t i = 0; i < vocab; ++i) kept += nucleus[i] ? prob[i] : 0;
  std::vector<long double> q(vocab, 0);
  for (std::size_t i = 0; i < vocab; ++i) q[i] = nucleus[i] ? prob[i] / kept : 0;
  return q;
}
}  // namespace

TEST_CASE("sampling: penalties, top_k and top_p give the distribution a long-double reference computes",
          "[tiny_llama][sampling]") {
  const std::uint32_t seed = clm_test::fresh_seed();
  INFO("seed " << seed);
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 2.0f);
  std::uniform_real_distribution<float> unit(0.0f, 1.0f);
  constexpr int kVocab = 50, kDraws = 20000;
  for (int trial = 0; trial < 40; ++trial) {
    INFO("trial " << trial);
    std::vector<float> logits(kVocab);
    for (float& l : logits) l = normal(rng);
    std::vector<std::int32_t> generated(20);
    for (auto& t : generated) t = static_cast<std::int32_t>(rng() % 12);  // repeats, in the low ids
    tiny_llama::SamplingParams p;
    p.temperature = 0.2f + 1.3f * unit(rng);
    p.top_p = trial % 3 == 0 ? 1.0f : 0.05f + 0.95f * unit(rng);
    p.top_k = trial % 4 == 0 ? 0 : static_cast<std::int32_t>(1 + rng() % kVocab);
    if (trial % 2 == 1) {
      p.presence_penalty = 4.0f * unit(rng) - 2.0f;
      p.frequency_penalty = 4.0f * unit(rng) - 2.0f;
    }
    const std::vector<long double> q = reference_distribution(logits, generated, p);
    std::vector<int> drawn(kVocab, 0);
    for (int d = 0; d < kDraws; ++d) {
      ++drawn[static_cast<std::size_t>(tiny_llama::sample_token(logits, generated, p, (d + 0.5) / kDraws))];
    }
    for (std::size_t i = 0; i < kVocab; ++i) {
      INFO("token " << i << ": drawn " << drawn[i] << " of " << kDraws << ", expected p " << static_cast<double>(q[i]));
      if (q[i] == 0) CHECK(drawn[i] == 0);
      // The draws are the inverse CDF on an even grid: each count is within 2 of q * kDraws.
      CHECK(std::abs(static_cast<double>(drawn[i]) - static_cast<double>(q[i]) * kDraws) <= 2.0);
    }
    // Greedy takes the penalised maximum whatever u is.
    p.temperature = 0.0f;
    std::vector<long double> z(kVocab);
    for (std::size_t i = 0; i < kVocab; ++i) {
      const auto count = std::count(generated.begin(), generated.end(), static_cast<std::int32_t>(i));
      z[i] =
          logits[i] - p.frequency_penalty * static_cast<long double>(count) - (count > 0 ? p.presence_penalty : 0.0f);
    }
    const auto best = static_cast<std::int32_t>(std::max_element(z.begin(), z.end()) - z.begin());
    CHECK(tiny_llama::sample_token(logits, generated, p, 0.3) == best);
    CHECK(tiny_llama::sample_token(logits, generated, p, 0.9) == best);
  }
}

TEST_CASE("cancel: a waiting and a running request end with the reason given, release their pages, publish none",
          "[tiny_llama]") {
  const std::uint32_t seed = clm_test::fresh_seed();
  INFO("seed " << seed);
  const LlamaConfig c = tiny_llama_test::small_config(3);
  LlamaWeights w;
  tiny_llama::random_llama_weights(c, seed, w);
  std::mt19937 rng(seed);
  Stack s = make_stack(c, w, engine_config(c, 16, 8192));
  // max_batch 1 (make_stack's generator takes the default): rebuild one that runs one request at a time.
  tiny_llama::Generator one_at_a_time(*s.model, {.max_batch = 1});
  const auto first = random_text(rng, 40, 80), second = random_text(rng, 40, 80), third = random_text(rng, 40, 80);
  GenerateOptions o;
  o.max_new_tokens = 50;
  std::vector<GenerationResult> results(3);
  int tokens_of_first = 0;
  const auto done = [&](int i) {
    return [&, i](const GenerationResult& r) {
      results[static_cast<std::size_t>(i)] = r;
      const clm::Status invariants = s.engine->check_invariants();
      INFO(invariants.message());
      REQUIRE(invariants.ok());
    };
  };
  const std::uint64_t running = one_at_a_time.submit(
      first, o, [&](std::int32_t) { return ++tokens_of_first < 1000; }, done(0));
  const std::uint64_t waiting = one_at_a_time.submit(second, o, nullptr, done(1));
  (void)one_at_a_time.submit(third, o, nullptr, done(2));
  REQUIRE(one_at_a_time.step().ok());  // the first is admitted and prefilled; the others wait (max_batch 1)
  REQUIRE(one_at_a_time.running() == 1);
  REQUIRE(one_at_a_time.waiting() == 2);
  one_at_a_time.cancel(running, "timeout");
  one_at_a_time.cancel(waiting, "cancelled");
  one_at_a_time.cancel(987654, "cancelled");  // no such request: ignored
  REQUIRE(one_at_a_time.run_until_idle().ok());
  CHECK(results[0].finish_reason == "timeout");
  CHECK(results[0].tokens.size() >= 1);
  CHECK(results[0].tokens.size() < 50);
  CHECK(results[1].finish_reason == "cancelled");
  CHECK(results[1].tokens.empty());
  CHECK(results[2].finish_reason == "length");
  const clm::EngineMetrics m = s.engine->metrics();
  CHECK(m.active_sequences == 0);
  CHECK(m.aborted == 1);   // the running one, released
  CHECK(m.finished == 1);  // only the third published its pages
  CHECK(m.admitted == 2);  // the cancelled waiting one never was
  // Nothing of the cancelled requests is cached: their prompts find nothing (the third's pages are its own).
  clm::AdmissionPlan plan;
  REQUIRE(s.engine->plan_admission(first, {}, plan).ok());
  CHECK(plan.cached_tokens == 0);
}

TEST_CASE("bad input: weights, config, prompts and batches are refused with a clear status", "[tiny_llama]") {
  const LlamaConfig c = tiny_llama_test::small_config(3);
  LlamaWeights w;
  tiny_llama::random_llama_weights(c, 3, w);
  clm_test::TempDir dir;
  const std::string weights_path = dir.str() + "/model.safetensors", config_path = dir.str() + "/config.json";
  REQUIRE(tiny_llama::save_llama_weights(weights_path, c, w, config_path).ok());
  SECTION("a saved model loads back bit for bit") {
    LlamaConfig loaded_config;
    REQUIRE(tiny_llama::load_llama_config(config_path, loaded_config).ok());
    LlamaWeights loaded;
    REQUIRE(tiny_llama::load_llama_weights(weights_path, loaded_config, loaded).ok());
    CHECK(loaded.embed == w.embed);
    CHECK(loaded.layers[2].w_down == w.layers[2].w_down);
    CHECK(loaded.lm_head == w.lm_head);
  }
  SECTION("a config.json that disagrees with the weights") {
    LlamaConfig wrong = c;
    wrong.intermediate = 128;
    LlamaWeights loaded;
    const clm::Status s = tiny_llama::load_llama_weights(weights_path, wrong, loaded);
    CHECK(s.code() == clm::StatusCode::invalid_argument);
    CHECK_THAT(s.message(), Catch::Contains("gate_proj"));
    wrong = c;
    wrong.num_layers = 2;
    CHECK(tiny_llama::load_llama_weights(weights_path, wrong, loaded).code() == clm::StatusCode::invalid_argument);
  }
  SECTION("a missing or mis-shaped tensor") {
    LlamaWeights broken = w;
    broken.layers[1].wk.resize(broken.layers[1].wk.size() / 2);
    // Written by hand: the library's writer checks sizes against shapes, so the shape goes in wrong too.
    std::vector<clm::TensorToWrite> tensors;
    tensors.push_back({"model.embed_tokens.weight",
                       clm::TensorDType::f32,
                       {c.vocab_size, c.hidden},
                       std::as_bytes(std::span(w.embed))});
    REQUIRE(clm::write_safetensors(dir.str() + "/partial.safetensors", tensors).ok());
    LlamaWeights loaded;
    CHECK(tiny_llama::load_llama_weights(dir.str() + "/partial.safetensors", c, loaded).code() ==
          clm::StatusCode::not_found);
    tensors.clear();
    const std::int64_t half_rows = c.kv_dim() / 2;
    tensors.push_back({"model.layers.0.self_attn.k_proj.weight",
                       clm::TensorDType::f32,
                       {half_rows, c.hidden},
                       std::as_bytes(std::span(broken.layers[1].wk))});
    REQUIRE(clm::write_safetensors(dir.str() + "/misshaped.safetensors", tensors).ok());
    CHECK(tiny_llama::load_llama_weights(dir.str() + "/misshaped.safetensors", c, loaded).code() !=
          clm::StatusCode::ok);
    CHECK(loaded.embed.empty());  // nothing half-loaded
  }
  SECTION("config.json errors") {
    LlamaConfig parsed;
    CHECK(tiny_llama::parse_llama_config("{", parsed).code() == clm::StatusCode::invalid_argument);
    CHECK(tiny_llama::parse_llama_config(R"({"hidden_size": 64})", parsed).code() == clm::StatusCode::invalid_argument);
    CHECK(
        tiny_llama::parse_llama_config(
            R"({"vocab_size":10,"hidden_size":64,"intermediate_size":8,"num_hidden_layers":1,"num_attention_heads":3})",
            parsed)
            .code() == clm::StatusCode::invalid_argument);  // 64 / 3 heads: odd head_dim
    CHECK(
        tiny_llama::parse_llama_config(
            R"({"vocab_size":-1,"hidden_size":64,"intermediate_size":8,"num_hidden_layers":1,"num_attention_heads":4})",
            parsed)
            .code() == clm::StatusCode::invalid_argument);
  }
  SECTION("an engine whose pool does not fit the model") {
    clm::EngineConfig e = engine_config(c, 16, 1024);
    e.pool.kv_heads = 4;
    std::unique_ptr<clm::Engine> engine;
    REQUIRE(clm::Engine::create(e, engine).ok());
    std::unique_ptr<tiny_llama::LlamaModel> model;
    CHECK(tiny_llama::LlamaModel::create(c, w, *engine, {}, model).code() == clm::StatusCode::invalid_argument);
    CHECK(model == nullptr);
  }
  SECTION("a workspace of negative or absurd size") {
    std::unique_ptr<clm::Engine> engine;
    REQUIRE(clm::Engine::create(engine_config(c, 16, 1024), engine).ok());
    std::unique_ptr<tiny_llama::LlamaModel> model;
    for (const std::int64_t rows : {std::int64_t{-1}, std::int64_t{1} << 40}) {
      const clm::Status s = tiny_llama::LlamaModel::create(c, w, *engine, {.workspace_rows = rows}, model);
      CHECK(s.code() == clm::StatusCode::invalid_argument);
      CHECK_THAT(s.message(), Catch::Contains("workspace_rows"));
      CHECK(model == nullptr);
    }
  }
  SECTION("make_decoder: the CPU decoder for a host pool, nothing for a pool without bytes") {
    std::unique_ptr<clm::Engine> engine;
    REQUIRE(clm::Engine::create(engine_config(c, 16, 1024), engine).ok());
    std::unique_ptr<tiny_llama::Decoder> decoder;
    REQUIRE(tiny_llama::make_decoder(c, w, *engine, {.threads = 1}, decoder).ok());
    CHECK(dynamic_cast<tiny_llama::LlamaModel*>(decoder.get()) != nullptr);
    clm::EngineConfig no_bytes = engine_config(c, 16, 1024);
    no_bytes.pool.memory = clm::MemoryKind::none;
    std::unique_ptr<clm::Engine> none_engine;
    REQUIRE(clm::Engine::create(no_bytes, none_engine).ok());
    decoder.reset();
    const clm::Status refused = tiny_llama::make_decoder(c, w, *none_engine, {}, decoder);
    CHECK(refused.code() == clm::StatusCode::unsupported);
    CHECK_THAT(refused.message(), Catch::Contains("MemoryKind::none"));
    CHECK(decoder == nullptr);
  }
  SECTION("prompts: too long for the context, empty, outside the vocabulary; the generator keeps serving") {
    Stack s = make_stack(c, w, engine_config(c, 16, 8192));
    std::vector<clm::Status> statuses;
    const auto record = [&](const GenerationResult& r) { statuses.push_back(r.status); };
    s.generator->submit(std::vector<std::int32_t>(static_cast<std::size_t>(c.max_position), 1), {}, nullptr, record);
    s.generator->submit({}, {}, nullptr, record);
    s.generator->submit({1, 2, c.vocab_size}, {}, nullptr, record);
    s.generator->submit({1, 2, -1}, {}, nullptr, record);
    GenerateOptions hot;
    hot.temperature = -1.0f;
    s.generator->submit({1, 2}, hot, nullptr, record);
    REQUIRE(statuses.size() == 5);
    for (const clm::Status& st : statuses) CHECK(st.code() == clm::StatusCode::invalid_argument);
    const auto fine = generate(s, {{1, 2, 3}}, {GenerateOptions{}});
    CHECK(fine[0].tokens.size() == 32);
    CHECK(s.engine->metrics().active_sequences == 0);
  }
  SECTION("a malformed batch writes nothing") {
    Stack s = make_stack(c, w, engine_config(c, 16, 1024));
    clm::Admission a;
    const std::vector<std::int32_t> prompt{1, 2, 3, 4};
    REQUIRE(s.engine->admit(prompt, {}, a).ok());
    std::vector<float> logits(static_cast<std::size_t>(c.vocab_size));
    tiny_llama::ForwardBatch b;
    b.add(a.seq, prompt, 0, a.slots, a.page_table);
    b.tokens[1] = c.vocab_size;  // outside the vocabulary
    CHECK(s.model->forward(b, logits).code() == clm::StatusCode::invalid_argument);
    b = {};
    b.add(a.seq, prompt, c.max_position - 2, a.slots, a.page_table);  // past the context
    CHECK(s.model->forward(b, logits).code() == clm::StatusCode::invalid_argument);
    b = {};
    b.add(a.seq, prompt, 0, a.slots, std::span(a.page_table).first(0));  // no pages for its tokens
    CHECK(s.model->forward(b, logits).code() == clm::StatusCode::invalid_argument);
    b = {};
    b.add(a.seq, prompt, 0, a.slots, a.page_table);
    b.page_indices[0] = s.engine->pool().num_pages();  // a page outside the pool
    CHECK(s.model->forward(b, logits).code() == clm::StatusCode::invalid_argument);
    b = {};
    b.add(a.seq, prompt, 0, a.slots, a.page_table);
    b.slots[2] = -1;  // a slot outside the pool
    CHECK(s.model->forward(b, logits).code() == clm::StatusCode::invalid_argument);
    b = {};
    b.add(a.seq, prompt, 0, a.slots, a.page_table);
    std::vector<float> short_logits(3);
    CHECK(s.model->forward(b, short_logits).code() == clm::StatusCode::invalid_argument);
    CHECK(std::all_of(logits.begin(), logits.end(), [](float v) { return v == 0.0f; }));
    REQUIRE(s.engine->abort(a.seq).ok());
    REQUIRE(s.engine->check_invariants().ok());
  }
}
