// tests/fuzz/fuzz_radix_tree_diff.cpp: differential libFuzzer target: RadixTree
// + PagedKvPool against the naive reference model of tests/radix_tree_model.hpp
// (the property test's), with the fuzzer's bytes making every choice.
//
//   make build-fuzz && build-fuzz/tests/fuzz/fuzz_radix_tree_diff tests/fuzz/corpus/radix_tree_diff
//   tests/fuzz/run.sh build-fuzz 30     (every target, on a copy of its corpus)
//
// Input: bytes 0-3 pick the configuration (page size 1, 2, 4 or 16; policy
// lru, lfu, slru or priority, or for byte 0 >= 192 ghost_slru with a ghost of
// 0, 0.5, 1 or 4 pool capacities; a pool of 8 to 128 pages; sequences of up to
// 1 to 8 pages; the protected fraction); the rest feeds the driver's Rng, one
// or two bytes per decision (match, insert with hit / planned / corrupted
// pages, lock, unlock, evict, allocate, release, bad calls, other namespaces),
// then a stream seeded from the input. Operations: 16 + one per 4 input bytes,
// at most 400 (short runs: more of them per second; the property test does the
// long ones). The oracle is the model's, checked after every step:
// check_invariants, cached / evictable / protected tokens, every page's owner
// and reference count, every match page by page, eviction sets legal and in
// policy order, refused calls change nothing; at the end the tree is
// destroyed and every page must be free again.
#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

#include "fuzz/fuzz_support.hpp"
#include "radix_tree_model.hpp"

namespace model = clm_test::radix_model;

namespace {
constexpr std::int64_t kMaxOps = 400;
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 4) return 0;
  constexpr std::array<std::int32_t, 4> kPageSizes = {1, 2, 4, 16};
  constexpr std::array<clm::EvictionPolicy, 4> kPolicies = {clm::EvictionPolicy::lru, clm::EvictionPolicy::lfu,
                                                            clm::EvictionPolicy::slru, clm::EvictionPolicy::priority};
  constexpr std::array<double, 4> kProtected = {0.0, 0.2, 0.5, 1.0};
  model::Config config{};
  config.page_size = kPageSizes[data[0] % 4];
  config.policy = kPolicies[(data[0] / 4) % 4];
  config.protected_fraction = kProtected[(data[0] / 16) % 4];
  // A quarter of the inputs run ghost_slru, bits 2-3 then pick its ghost's size.
  constexpr std::array<double, 4> kGhostMemory = {0.0, 0.5, 1.0, 4.0};
  if (data[0] >= 192) {
    config.policy = clm::EvictionPolicy::ghost_slru;
    config.ghost_memory = kGhostMemory[(data[0] / 4) % 4];
  }
  config.num_pages = 8 + data[1] % 121;  // 8..128
  config.max_pages = 1 + data[2] % 8;
  const std::uint64_t seed = model::mix(data[3]);
  const std::span<const std::uint8_t> choices(data + 4, size - 4);
  const std::int64_t ops = std::min<std::int64_t>(kMaxOps, 16 + static_cast<std::int64_t>(size / 4));
  model::PropertyRun run(
      config, seed, [](const std::string& what) { FUZZ_CHECK(false, "{}", what); }, choices);
  run.run(ops);
  return 0;
}
