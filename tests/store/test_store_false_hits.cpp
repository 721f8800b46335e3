// The labelled set (tests/data/suffix_pairs.tsv) through the whole store, not
// just the key: for a pair that must differ (a negation, an opposite action,
// another entity), text A's snapshot is stored and text B is looked up with
// the very same vector, the worst case for level 2. Any hit is a false hit.
// Paraphrase pairs are looked up with a noisy copy and should hit (level 1 or
// 2). Reported per language; the false-hit rate must stay at or below 1%.
#include <fstream>
#include <map>
#include <sstream>

#include <catch2/catch.hpp>

#include "clm/store/snapshot_store.hpp"
#include "store/store_test_support.hpp"
#include "test_support.hpp"

namespace {

struct Pair {
  std::string lang, relation, a, b;
};

std::vector<Pair> read_pairs() {
  std::ifstream in(std::string(CLM_TEST_DATA_DIR) + "/suffix_pairs.tsv");
  REQUIRE(in);
  std::vector<Pair> pairs;
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    std::istringstream fields(line);
    Pair p;
    std::getline(fields, p.lang, '\t');
    std::getline(fields, p.relation, '\t');
    std::getline(fields, p.a, '\t');
    std::getline(fields, p.b, '\t');
    REQUIRE(!p.b.empty());
    pairs.push_back(std::move(p));
  }
  return pairs;
}

}  // namespace

TEST_CASE("labelled pairs through the store: false hits <= 1%, paraphrase hits reported", "[store][labelled]") {
  const std::uint32_t seed = clm_test::fresh_seed();
  INFO("seed " << seed);
  std::mt19937 rng(seed);
  constexpr int kDim = 64;
  clm::SnapshotStoreConfig config;
  config.path = ":memory:";
  config.num_shards = 4;
  config.snapshot_dim = kDim;
  config.min_usage_threshold = 1;        // the defaults otherwise: floor 0.80, top 3
  config.lookup_timeout_us = 2'000'000;  // no busy misses (level 2 included) on a loaded machine
  std::unique_ptr<clm::SnapshotStore> store;
  REQUIRE(clm::SnapshotStore::open(config, store).ok());
  const std::vector<Pair> pairs = read_pairs();
  REQUIRE(pairs.size() >= 300);

  struct Tally {
    int differ = 0, false_key = 0, false_ann = 0, para = 0, para_exact = 0, para_ann = 0;
  };
  std::map<std::string, Tally> tally;
  std::vector<float> out(kDim);
  int index = 0;
  for (const Pair& p : pairs) {
    const std::string tenant = fmt::format("pair-{}", index++);  // pairs never see each other
    clm::SuffixKey a, b;
    INFO(p.lang << " " << p.relation << ": \"" << p.a << "\" / \"" << p.b << "\"");
    if (!store->keyer().make_key(p.a, a).ok() || !store->keyer().make_key(p.b, b).ok()) {
      // Text with no content has no key: it can never hit, nor be hit.
      if (p.relation == "paraphrase") ++tally[p.lang].para;
      if (p.relation != "paraphrase") ++tally[p.lang].differ;
      continue;
    }
    const std::vector<float> v = clm_test::random_unit(rng, kDim);
    clm::RecordOutcome o;
    REQUIRE(store->record(tenant, a, v, o).ok());
    clm::SnapshotHit hit;
    Tally& t = tally[p.lang];
    if (p.relation == "paraphrase") {
      ++t.para;
      REQUIRE(store->lookup(tenant, b, clm_test::noisy(v, 0.02, rng), hit, out).ok());
      t.para_exact += hit.level == clm::SnapshotLevel::exact ? 1 : 0;
      t.para_ann += hit.level == clm::SnapshotLevel::ann ? 1 : 0;
    } else {
      ++t.differ;
      REQUIRE(store->lookup(tenant, b, v, hit, out).ok());
      if (hit.level == clm::SnapshotLevel::exact) ++t.false_key;
      if (hit.level == clm::SnapshotLevel::ann) ++t.false_ann;
      if (hit.level != clm::SnapshotLevel::miss) WARN("false hit (" << clm::snapshot_level_name(hit.level) << ")");
    }
  }
  Tally all;
  for (const auto& [lang, t] : tally) {
    std::printf(
        "labelled pairs %s: false hits %d + %d of %d must-differ pairs (%.2f%%); paraphrase hits %d exact + %d "
        "ann of %d (%.1f%%)\n",
        lang.c_str(), t.false_key, t.false_ann, t.differ, 100.0 * (t.false_key + t.false_ann) / t.differ, t.para_exact,
        t.para_ann, t.para, 100.0 * (t.para_exact + t.para_ann) / t.para);
    all.differ += t.differ;
    all.false_key += t.false_key;
    all.false_ann += t.false_ann;
    all.para += t.para;
    all.para_exact += t.para_exact;
    all.para_ann += t.para_ann;
  }
  const double false_rate = static_cast<double>(all.false_key + all.false_ann) / all.differ;
  const double para_rate = static_cast<double>(all.para_exact + all.para_ann) / all.para;
  INFO("false-hit rate " << false_rate << ", paraphrase hit rate " << para_rate);
  CHECK(false_rate <= 0.01);
  CHECK(para_rate >= 0.6);  // loose: catches a keyer or store that stopped matching paraphrases
}
