// tests/bench/bench_keys.cpp: how precise the suffix key is (clm/store/suffix_key.hpp,
// docs/snapshot-store.md) on labelled utterance pairs, English and Chinese:
// the twenty tuning sets (tuning, tuning2 .. tuning20; tuning14 English only, tuning20 Chinese only) and the three
// frozen held-out sets (heldout, heldout2, heldout3) of tests/data/suffix_keys/ (their README says who wrote them, and
// how).
//
//   bench_keys [DATA_DIR [SETS]]   (default: the source tree's tests/data/suffix_keys,
//                                   all sets; SETS: comma-separated, e.g. tuning,tuning3)
//
// A rule writer measures the tuning sets only (SETS without the held-out
// ones): a held-out set is measured once, after the rules are frozen.
//
// A pair is `same` (an answer cached for one answers the other) or `differ`.
// A key is *served* when make_key accepts the text and does not flag it
// low-information (what levels 1 and 2 of the store may serve). Per set,
// language and category, and for the aggregates `all`, `polarity`
// (negation, contrast, question_command, undo) and `customer_service`
// (everything but open_domain), it prints:
//   false_hit_rate       differ pairs whose two keys are served and equal
//   paraphrase_hit_rate  same pairs whose two keys are served and equal
//   abstention_rate      utterances whose key is not served
//   key_collision_rate   differ pairs with equal keys, served or not
// each against the same figure for the exact normalised text (a cache without
// a keyer: two utterances match when their normal forms are equal), computed
// in the same run. Then the whole store (clm/store/snapshot_store.hpp, in
// memory, admission at the first record, each pair its own tenant): A's
// snapshot is recorded under A's key with a random unit vector, and B is
// looked up under B's key with a query at cosine 0.9 to it (level 2's worst
// case) and with an independent one:
//   store_false_hit_rate_cos09 / _independent        differ pairs served A's snapshot
//   store_paraphrase_hit_rate_cos09 / _independent   same pairs served A's snapshot
// against the key-alone false-hit and paraphrase rates of the same pairs. Rates are fractions of the pairs counted in
// `case`'s `n=`; with no false hit among n pairs the rate is below about 3/n (95%). CLM_BENCH_SMOKE=1 reads the first
// 40 pairs of each file.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>

#include "bench_common.hpp"
#include "clm/store/snapshot_store.hpp"
#include "clm/store/suffix_key.hpp"

namespace {

namespace fs = std::filesystem;

struct Pair {
  std::string category;
  bool same = false;
  std::string a, b;
};

// id <TAB> category <TAB> same|differ <TAB> text_a <TAB> text_b; '#' comments.
std::vector<Pair> read_pairs(const fs::path& file, std::size_t limit) {
  std::ifstream in(file);
  if (!in) clm_bench::die(fmt::format("cannot read {}", file.string()));
  std::vector<Pair> pairs;
  std::string line;
  for (int number = 1; std::getline(in, line) && pairs.size() < limit; ++number) {
    if (line.empty() || line[0] == '#') continue;
    std::vector<std::string> fields;
    for (std::size_t at = 0;;) {
      const std::size_t tab = line.find('\t', at);
      fields.push_back(line.substr(at, tab == std::string::npos ? std::string::npos : tab - at));
      if (tab == std::string::npos) break;
      at = tab + 1;
    }
    if (fields.size() != 5 || (fields[2] != "same" && fields[2] != "differ")) {
      clm_bench::die(fmt::format("{}:{}: want id, category, same|differ, text_a, text_b", file.string(), number));
    }
    pairs.push_back({fields[1], fields[2] == "same", fields[3], fields[4]});
  }
  return pairs;
}

// What one utterance gives: its key when served, its normal form when it has one.
struct Keyed {
  bool served = false;
  bool keyed = false;  // make_key accepted it (served or low-information)
  std::string key;
  bool normalised = false;
  std::string normal_form;
};

Keyed key_of(const clm::SuffixKeyer& keyer, const std::string& text) {
  Keyed k;
  clm::SuffixKey key;
  if (keyer.make_key(text, key).ok()) {
    k.keyed = true;
    k.key = key.key;
    k.served = !key.low_information;
  }
  k.normalised = keyer.normalise(text, k.normal_form).ok();
  return k;
}

struct Counts {
  std::size_t differ = 0, same = 0, utterances = 0;
  std::size_t false_hits = 0, paraphrase_hits = 0, abstained = 0, collisions = 0;
  std::size_t text_false_hits = 0, text_paraphrase_hits = 0, text_abstained = 0, text_collisions = 0;

  void add(const Pair& p, const Keyed& a, const Keyed& b) {
    const bool key_hit = a.served && b.served && a.key == b.key;
    const bool text_hit = a.normalised && b.normalised && a.normal_form == b.normal_form;
    (p.same ? same : differ) += 1;
    if (p.same) {
      paraphrase_hits += key_hit;
      text_paraphrase_hits += text_hit;
    } else {
      false_hits += key_hit;
      text_false_hits += text_hit;
      collisions += a.keyed && b.keyed && a.key == b.key;
      text_collisions += text_hit;
    }
    utterances += 2;
    abstained += !a.served + !b.served;
    text_abstained += !a.normalised + !b.normalised;
  }
};

double rate(std::size_t n, std::size_t of) { return of ? double(n) / double(of) : 0.0; }

void print(const std::string& set_lang, const std::string& group, const Counts& c) {
  const std::string name = fmt::format("{}/{}/n={}", set_lang, group, c.same + c.differ);
  if (c.differ) {
    clm_bench::print_figure("keys", name, "false_hit_rate", rate(c.false_hits, c.differ), "fraction",
                            "exact_text_false_hit_rate", rate(c.text_false_hits, c.differ));
    clm_bench::print_figure("keys", name, "key_collision_rate", rate(c.collisions, c.differ), "fraction",
                            "exact_text_collision_rate", rate(c.text_collisions, c.differ));
  }
  if (c.same) {
    clm_bench::print_figure("keys", name, "paraphrase_hit_rate", rate(c.paraphrase_hits, c.same), "fraction",
                            "exact_text_paraphrase_hit_rate", rate(c.text_paraphrase_hits, c.same));
  }
  clm_bench::print_figure("keys", name, "abstention_rate", rate(c.abstained, c.utterances), "fraction",
                          "exact_text_abstention_rate", rate(c.text_abstained, c.utterances));
}

// The whole store's answers to one pair: was B served A's snapshot, with a
// query at cosine 0.9 to A's vector ([0]) and with an independent one ([1]).
using StoreServed = std::array<bool, 2>;

struct StoreCounts {
  std::size_t differ = 0, same = 0, false_hits = 0, paraphrase_hits = 0;
  void add(const Pair& p, bool served) {
    (p.same ? same : differ) += 1;
    (p.same ? paraphrase_hits : false_hits) += served;
  }
};

std::vector<float> random_unit(std::mt19937_64& rng, int dim) {
  std::normal_distribution<float> normal;
  std::vector<float> v(static_cast<std::size_t>(dim));
  double norm = 0;
  for (float& x : v) {
    x = normal(rng);
    norm += double(x) * x;
  }
  for (float& x : v) x = static_cast<float>(x / std::sqrt(norm));
  return v;
}

// A unit vector at cosine `c` to the unit vector `a`.
std::vector<float> at_cosine(std::mt19937_64& rng, const std::vector<float>& a, float c) {
  std::vector<float> u = random_unit(rng, static_cast<int>(a.size()));
  double dot = 0;
  for (std::size_t i = 0; i < a.size(); ++i) dot += double(u[i]) * a[i];
  double norm = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    u[i] -= static_cast<float>(dot * a[i]);
    norm += double(u[i]) * u[i];
  }
  const double s = std::sqrt(1.0 - double(c) * c) / std::sqrt(norm);
  for (std::size_t i = 0; i < a.size(); ++i) u[i] = static_cast<float>(c * a[i] + s * u[i]);
  return u;
}

// Each pair its own tenant of one in-memory store: A recorded under its key
// (admitted at the first record), B looked up under its key.
std::vector<StoreServed> run_store(const std::vector<Pair>& pairs, std::uint64_t seed) {
  constexpr int kDim = 64;
  clm::SnapshotStoreConfig config;
  config.path = ":memory:";
  config.num_shards = 4;
  config.snapshot_dim = kDim;
  config.min_usage_threshold = 1;
  config.rebuild_in_background = false;
  std::unique_ptr<clm::SnapshotStore> store;
  clm_bench::check(clm::SnapshotStore::open(config, store), "SnapshotStore::open");
  std::mt19937_64 rng(seed);
  std::vector<StoreServed> served(pairs.size(), StoreServed{});
  std::vector<float> injected(kDim);
  for (std::size_t i = 0; i < pairs.size(); ++i) {
    const Pair& p = pairs[i];
    const std::string tenant = fmt::format("pair-{}", i);
    const std::vector<float> a = random_unit(rng, kDim);
    const std::array<std::vector<float>, 2> queries = {at_cosine(rng, a, 0.9f), random_unit(rng, kDim)};
    clm::SuffixKey key_a, key_b;
    const bool stored = store->keyer().make_key(p.a, key_a).ok() && [&] {
      clm::RecordOutcome outcome;
      return store->record(tenant, key_a, a, outcome).ok() && outcome.version > 0;
    }();
    if (!stored || !store->keyer().make_key(p.b, key_b).ok()) continue;
    for (std::size_t q = 0; q < queries.size(); ++q) {
      clm::SnapshotHit hit;
      clm_bench::check(store->lookup(tenant, key_b, queries[q], hit, injected), "lookup");
      served[i][q] = hit.level != clm::SnapshotLevel::miss;
    }
  }
  return served;
}

void print_store(const std::string& set_lang, const std::string& group, const std::array<StoreCounts, 2>& store,
                 const Counts& keys) {
  const std::string name = fmt::format("{}/{}/n={}", set_lang, group, keys.same + keys.differ);
  const char* query[] = {"cos09", "independent"};
  for (std::size_t q = 0; q < store.size(); ++q) {
    const StoreCounts& c = store[q];
    if (c.differ) {
      clm_bench::print_figure("keys", name, fmt::format("store_false_hit_rate_{}", query[q]),
                              rate(c.false_hits, c.differ), "fraction", "key_false_hit_rate",
                              rate(keys.false_hits, keys.differ));
    }
    if (c.same) {
      clm_bench::print_figure("keys", name, fmt::format("store_paraphrase_hit_rate_{}", query[q]),
                              rate(c.paraphrase_hits, c.same), "fraction", "key_paraphrase_hit_rate",
                              rate(keys.paraphrase_hits, keys.same));
    }
  }
}

bool polarity(const std::string& category) {
  return category == "negation" || category == "contrast" || category == "question_command" || category == "undo";
}

}  // namespace

int main(int argc, char** argv) {
  const fs::path dir = argc > 1 ? fs::path(argv[1]) : fs::path(CLM_KEYS_DATA_DIR);
  const std::size_t limit = clm_bench::smoke_run() ? 40 : SIZE_MAX;
  std::unique_ptr<clm::SuffixKeyer> keyer;
  clm_bench::check(clm::SuffixKeyer::create({}, keyer), "SuffixKeyer::create");

  std::vector<std::string> sets;
  for (std::string_view list = argc > 2 ? std::string_view(argv[2])
                                        : "tuning,tuning2,tuning3,tuning4,tuning5,tuning6,tuning7,tuning8,tuning9,"
                                          "tuning10,tuning11,tuning12,tuning13,tuning14,tuning15,tuning16,tuning17,"
                                          "tuning18,tuning19,tuning20,heldout,heldout2,heldout3";
       !list.empty();) {
    const std::size_t comma = list.find(',');
    sets.emplace_back(list.substr(0, comma));
    static constexpr std::string_view kSets[] = {"tuning",   "tuning2",  "tuning3",  "tuning4",  "tuning5",  "tuning6",
                                                 "tuning7",  "tuning8",  "tuning9",  "tuning10", "tuning11", "tuning12",
                                                 "tuning13", "tuning14", "tuning15", "tuning16", "tuning17", "tuning18",
                                                 "tuning19", "tuning20", "heldout",  "heldout2", "heldout3"};
    if (std::find(std::begin(kSets), std::end(kSets), sets.back()) == std::end(kSets)) {
      clm_bench::die(
          fmt::format("unknown set \"{}\" (tuning, tuning2 .. tuning20, heldout, heldout2, heldout3)", sets.back()));
    }
    list = comma == std::string_view::npos ? std::string_view() : list.substr(comma + 1);
  }
  for (const std::string& set : sets) {
    std::size_t languages = 0;  // a set may be one language's only (tuning14: English)
    for (const char* lang : {"en", "zh"}) {
      const fs::path file = dir / fmt::format("{}_{}.tsv", set, lang);
      if (!fs::exists(file)) continue;
      ++languages;
      const std::vector<Pair> pairs = read_pairs(file, limit);
      if (pairs.empty()) clm_bench::die(fmt::format("{}: no pairs", file.string()));
      // Both measures of every pair, then their tallies per group (fixed seed:
      // the same vectors every run).
      const std::vector<StoreServed> served = run_store(pairs, 1);
      struct Tally {
        Counts keys;
        std::array<StoreCounts, 2> store;
      };
      std::map<std::string, Tally> tallies;  // all, polarity, customer_service and each category
      for (std::size_t i = 0; i < pairs.size(); ++i) {
        const Pair& p = pairs[i];
        const Keyed a = key_of(*keyer, p.a), b = key_of(*keyer, p.b);
        std::vector<std::string> groups = {"all", p.category};
        if (polarity(p.category)) groups.emplace_back("polarity");
        if (p.category != "open_domain") groups.emplace_back("customer_service");
        for (const std::string& group : groups) {
          Tally& t = tallies[group];
          t.keys.add(p, a, b);
          for (std::size_t q = 0; q < served[i].size(); ++q) t.store[q].add(p, served[i][q]);
        }
      }
      const std::string set_lang = fmt::format("{}/{}", set, lang);
      for (const auto& [group, t] : tallies) {
        print(set_lang, group, t.keys);
        print_store(set_lang, group, t.store, t.keys);
      }
    }
    if (languages == 0) clm_bench::die(fmt::format("{}: no {}_en.tsv or {}_zh.tsv", dir.string(), set, set));
  }
  return 0;
}
