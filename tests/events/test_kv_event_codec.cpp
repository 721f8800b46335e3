// Tests of the KV event wire form (include/clm/events/kv_event.hpp): bytes
// derived by hand from vLLM's format (the fixture below, field by field),
// random batches round-tripped in every layout, and damaged payloads that
// must be refused, never crash.
#include <catch2/catch.hpp>

#include <cmath>
#include <limits>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include <msgpack.hpp>

#include "clm/events/kv_event.hpp"
#include "test_support.hpp"

namespace {

std::string unhex(std::string_view hex) {
  std::string out;
  for (std::size_t i = 0; i < hex.size();) {
    if (hex[i] == ' ' || hex[i] == '\n') {
      ++i;
      continue;
    }
    out.push_back(static_cast<char>(std::stoi(std::string(hex.substr(i, 2)), nullptr, 16)));
    i += 2;
  }
  return out;
}

clm::KvEvent random_event(std::mt19937_64& rng) {
  clm::KvEvent e;
  e.kind = static_cast<clm::KvEventKind>(rng() % 3);
  if (e.kind == clm::KvEventKind::all_blocks_cleared) return e;
  e.medium = rng() % 2 ? clm::KvMedium::cpu : clm::KvMedium::gpu;
  e.block_hashes.resize(1 + rng() % 5);
  for (auto& h : e.block_hashes) h = rng() >> (rng() % 64);  // small ones too: still 0xcf on the wire
  if (e.kind == clm::KvEventKind::block_removed) return e;
  if (rng() % 2) e.parent_block_hash = rng();
  e.block_size = static_cast<std::int32_t>(1 + rng() % 32);
  // Every page's ids, or (KvEventsConfig::token_ids off) none.
  if (rng() % 4 != 0) e.token_ids.resize(e.block_hashes.size() * static_cast<std::size_t>(e.block_size));
  for (auto& t : e.token_ids) t = static_cast<std::int32_t>(rng() % 200000);
  if (rng() % 2) e.lora_id = static_cast<std::int32_t>(1 + rng() % 1000);
  if (rng() % 2) e.extra_key = "salt:" + std::to_string(rng());
  return e;
}

}  // namespace

TEST_CASE("KV events: a BlockStored batch is vLLM's bytes, field by field") {
  // ts 1757500000.25, two blocks of 4 tokens (1..8), no parent, no adapter,
  // on the GPU, no tenant; derived from vLLM's field order by hand.
  clm::KvEventBatch batch{.ts = 1757500000.25, .events = {}, .data_parallel_rank = 0};
  clm::KvEvent stored;
  stored.block_hashes = {0xDEADBEEF12345678ULL, 0x0123456789ABCDEFULL};
  stored.token_ids = {1, 2, 3, 4, 5, 6, 7, 8};
  stored.block_size = 4;
  batch.events.push_back(stored);
  const std::string expected = unhex(
      "93 cb 41 da 30 54 98 10 00 00 91 9c ab 42 6c 6f 63 6b 53 74 6f 72 65 64"  // [ts, [BlockStored(12):
      " 92 cf de ad be ef 12 34 56 78 cf 01 23 45 67 89 ab cd ef c0"             // hashes, parent nil,
      " 98 01 02 03 04 05 06 07 08 04 c0 a3 47 50 55 c0 92 c0 c0 00"  // tokens, 4, lora nil, GPU, name nil, extra,
                                                                      // group 0,
      " ae 66 75 6c 6c 5f 61 74 74 65 6e 74 69 6f 6e c0 00");         // "full_attention", nil]], rank 0
  std::string payload;
  REQUIRE(clm::encode_kv_event_batch(batch, clm::KvEventLayout::array, payload).ok());
  CHECK(payload == expected);
  clm::KvEventBatch back;
  REQUIRE(clm::decode_kv_event_batch(expected, back).ok());
  CHECK(back == batch);

  // The legacy layout: BlockRemoved of 3 fields and AllBlocksCleared, with a parent.
  clm::KvEventBatch legacy{.ts = 1757500000.25, .events = {}, .data_parallel_rank = 0};
  clm::KvEvent removed;
  removed.kind = clm::KvEventKind::block_removed;
  removed.block_hashes = {0x0123456789ABCDEFULL};
  clm::KvEvent cleared;
  cleared.kind = clm::KvEventKind::all_blocks_cleared;
  legacy.events = {removed, cleared};
  REQUIRE(clm::encode_kv_event_batch(legacy, clm::KvEventLayout::legacy, payload).ok());
  CHECK(payload == unhex("93 cb 41 da 30 54 98 10 00 00 92"
                         " 93 ac 42 6c 6f 63 6b 52 65 6d 6f 76 65 64 91 cf 01 23 45 67 89 ab cd ef a3 47 50 55"
                         " 91 b0 41 6c 6c 42 6c 6f 63 6b 73 43 6c 65 61 72 65 64 00"));
}

TEST_CASE("KV events: random batches come back equal from every layout") {
  const std::uint32_t seed = clm_test::fresh_seed();
  INFO("seed " << seed);
  std::mt19937_64 rng(seed);
  for (int round = 0; round < 300; ++round) {
    clm::KvEventBatch batch;
    batch.ts = static_cast<double>(rng() % 2000000000) + 0.5;
    if (rng() % 4) batch.data_parallel_rank = static_cast<std::int32_t>(rng() % 8);
    const std::size_t n = rng() % 12;
    for (std::size_t i = 0; i < n; ++i) batch.events.push_back(random_event(rng));
    for (auto layout : {clm::KvEventLayout::array, clm::KvEventLayout::legacy, clm::KvEventLayout::map}) {
      std::string payload;
      REQUIRE(clm::encode_kv_event_batch(batch, layout, payload).ok());
      clm::KvEventBatch back;
      const clm::Status s = clm::decode_kv_event_batch(payload, back);
      INFO("layout " << static_cast<int>(layout) << ": " << s.message());
      REQUIRE(s.ok());
      clm::KvEventBatch want = batch;
      if (layout == clm::KvEventLayout::legacy) {
        for (auto& e : want.events) e.extra_key.clear();  // the 7-field event has no extra keys
      }
      CHECK(back == want);
      // Every hash is 0xcf and 8 bytes: count them in the payload.
      std::size_t hashes = 0;
      for (const auto& e : batch.events) hashes += e.block_hashes.size() + (e.parent_block_hash ? 1 : 0);
      std::size_t cf = 0;
      for (char c : payload) cf += static_cast<unsigned char>(c) == 0xcf;
      CHECK(cf >= hashes);
    }
  }
}

TEST_CASE("KV events: token ids take msgpack-c's shortest form at every boundary, and reuse leaves nothing behind") {
  // The encoder writes token ids itself (one pass, no stream call per id): each must be the bytes msgpack-c's
  // own pack_int32 writes, from the int32 extremes through every width's edges.
  const std::vector<std::int32_t> edges = {std::numeric_limits<std::int32_t>::min(),
                                           -32769,
                                           -32768,
                                           -129,
                                           -128,
                                           -33,
                                           -32,
                                           -1,
                                           0,
                                           1,
                                           127,
                                           128,
                                           255,
                                           256,
                                           65535,
                                           65536,
                                           151642,
                                           std::numeric_limits<std::int32_t>::max()};
  const std::uint32_t seed = clm_test::fresh_seed();
  INFO("seed " << seed);
  std::mt19937_64 rng(seed);
  std::string payload(100000, 'x');  // a longer earlier payload: replaced, not appended to
  for (int round = 0; round < 50; ++round) {
    clm::KvEvent e;
    e.kind = clm::KvEventKind::block_stored;
    e.block_size = static_cast<std::int32_t>(1 + rng() % 8);
    e.block_hashes.resize(1 + rng() % 6);
    e.token_ids.resize(e.block_hashes.size() * static_cast<std::size_t>(e.block_size));
    for (auto& t : e.token_ids) {
      const std::int32_t edge = edges[rng() % edges.size()];
      t = rng() % 2 ? edge : static_cast<std::int32_t>(static_cast<std::uint32_t>(rng()));
    }
    clm::KvEventBatch batch{.ts = 1.5, .events = {e}, .data_parallel_rank = std::nullopt};
    REQUIRE(clm::encode_kv_event_batch(batch, clm::KvEventLayout::array, payload).ok());
    msgpack::sbuffer want;
    msgpack::packer<msgpack::sbuffer> packer(want);
    packer.pack_array(static_cast<std::uint32_t>(e.token_ids.size()));
    for (std::int32_t t : e.token_ids) packer.pack_int32(t);
    const std::string ids(want.data(), want.size());
    CHECK(payload.find(ids) != std::string::npos);
    // Decoders take ids of 0 and up (an engine has no others): the same batch without negatives comes back equal.
    for (auto& t : batch.events[0].token_ids) t &= std::numeric_limits<std::int32_t>::max();
    REQUIRE(clm::encode_kv_event_batch(batch, clm::KvEventLayout::array, payload).ok());
    clm::KvEventBatch back;
    REQUIRE(clm::decode_kv_event_batch(payload, back).ok());
    CHECK(back == batch);
  }
}

TEST_CASE("KV events: ts is a float64 on the wire even when it is a whole number") {
  // msgpack-c's pack_double writes 1757500000.0 as an integer; AIBrix refuses that.
  for (double ts : {1757500000.0, 0.0, -3.0, 1757500000.25}) {
    clm::KvEventBatch batch{.ts = ts, .events = {}, .data_parallel_rank = 0};
    std::string payload;
    REQUIRE(clm::encode_kv_event_batch(batch, clm::KvEventLayout::array, payload).ok());
    REQUIRE(payload.size() == 12);  // 93, cb + 8 bytes, 90 (no events), 00
    CHECK(static_cast<unsigned char>(payload[1]) == 0xcb);
    clm::KvEventBatch back;
    REQUIRE(clm::decode_kv_event_batch(payload, back).ok());
    CHECK(back.ts == ts);
  }
}

TEST_CASE("KV events: an event that cannot be sent as it is is refused, and nothing written") {
  clm::KvEventBatch batch;
  clm::KvEvent e;
  e.block_hashes = {1, 2};
  e.block_size = 4;
  e.token_ids = {1, 2, 3};  // not 2 x 4
  batch.events.push_back(e);
  std::string payload = "untouched";
  CHECK(clm::encode_kv_event_batch(batch, clm::KvEventLayout::array, payload).code() ==
        clm::StatusCode::invalid_argument);
  CHECK(payload == "untouched");
  batch.events[0].block_size = 0;
  batch.events[0].token_ids.clear();
  CHECK(clm::encode_kv_event_batch(batch, clm::KvEventLayout::array, payload).code() ==
        clm::StatusCode::invalid_argument);
}

TEST_CASE("KV events: damaged payloads are refused, never a crash") {
  const std::uint32_t seed = clm_test::fresh_seed();
  INFO("seed " << seed);
  std::mt19937_64 rng(seed);
  clm::KvEventBatch batch;
  batch.ts = 1.5;
  for (int i = 0; i < 6; ++i) batch.events.push_back(random_event(rng));
  std::string good;
  REQUIRE(clm::encode_kv_event_batch(batch, clm::KvEventLayout::array, good).ok());
  // Every truncation but the whole is refused.
  for (std::size_t len = 0; len < good.size(); ++len) {
    clm::KvEventBatch out;
    out.ts = 42;
    CHECK(!clm::decode_kv_event_batch(std::string_view(good).substr(0, len), out).ok());
    CHECK(out.ts == 42);  // untouched
  }
  // Random byte flips: refused or decoded, never a crash (ASan/UBSan watch).
  int refused = 0;
  for (int round = 0; round < 2000; ++round) {
    std::string bad = good;
    for (int k = 0; k < 1 + static_cast<int>(rng() % 4); ++k) bad[rng() % bad.size()] = static_cast<char>(rng());
    clm::KvEventBatch out;
    refused += !clm::decode_kv_event_batch(bad, out).ok();
  }
  CHECK(refused > 0);
  // Not msgpack, trailing bytes, wrong shapes.
  clm::KvEventBatch out;
  CHECK(!clm::decode_kv_event_batch("hello", out).ok());
  // A ts that is not a finite number (NaN here): no router could order it.
  CHECK(!clm::decode_kv_event_batch(std::string("\x93\xcb\xff\xff\x60\x10\x00\xd2\x8f\x2f\x90\x00", 12), out).ok());
  clm::KvEventBatch nan_batch;
  nan_batch.ts = std::nan("");
  std::string nan_payload;
  CHECK(clm::encode_kv_event_batch(nan_batch, clm::KvEventLayout::array, nan_payload).code() ==
        clm::StatusCode::invalid_argument);
  CHECK(!clm::decode_kv_event_batch(good + "x", out).ok());
  CHECK(!clm::decode_kv_event_batch(std::string("\x91\xcb\x3f\xf8\0\0\0\0\0\0", 10), out).ok());  // [1.5]
  CHECK(!clm::decode_kv_event_batch(std::string("\x93\xcb\x3f\xf8\0\0\0\0\0\0\x91\x91\xa3"
                                                "Foo\x00",
                                                16),
                                    out)
             .ok());
}
