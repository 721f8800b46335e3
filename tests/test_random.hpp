// tests/test_random.hpp: randomness the tests and benches share: a fresh seed
// per run (each test prints it, so a failure can be replayed), and prompts of
// random token ids. Only the standard library, so the C ABI's tests (which see
// nothing but clm.h) and the benches include it as well as the core's tests
// (through test_support.hpp).
//
//   const std::uint32_t seed = clm_test::fresh_seed();
//   INFO("seed " << seed);
//   std::mt19937 rng(seed);
//   const std::vector<std::int32_t> prompt = clm_test::random_tokens(rng, 41, 50000);
#pragma once

#include <cstddef>
#include <cstdint>
#include <random>
#include <vector>

namespace clm_test {

inline std::uint32_t fresh_seed() { return std::random_device{}(); }

// `n` token ids in [0, vocab), each rng() % vocab, from any standard engine
// (std::mt19937, std::mt19937_64): one draw per id, so a seed gives the same
// prompt however the caller spells its vocabulary's size.
template <class Rng>
std::vector<std::int32_t> random_tokens(Rng& rng, std::size_t n, std::int32_t vocab) {
  std::vector<std::int32_t> tokens(n);
  const auto v = static_cast<typename Rng::result_type>(vocab);
  for (std::int32_t& t : tokens) t = static_cast<std::int32_t>(rng() % v);
  return tokens;
}

}  // namespace clm_test
