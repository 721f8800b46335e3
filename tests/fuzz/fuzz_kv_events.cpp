// tests/fuzz/fuzz_kv_events.cpp: libFuzzer target for the KV event wire form
// (clm/events/kv_event.hpp) and the replay request parser
// (clm/events/kv_event_publisher.hpp) on arbitrary bytes.
//
//   make build-fuzz && build-fuzz/tests/fuzz/fuzz_kv_events tests/fuzz/corpus/kv_events
//
// Input: byte 0 picks what is fuzzed. Even: the rest is a payload for
// decode_kv_event_batch; a refusal is invalid_argument with a message and
// leaves the output untouched; an accepted batch, encoded again in each
// layout and decoded, comes back equal (the legacy layout without extra
// keys). Odd: the rest is split into frames at each 0xff byte and given to
// parse_kv_replay_request; an accepted request is exactly three frames, the
// second empty, the third 8 bytes whose big-endian value is the start.
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "clm/events/kv_event.hpp"
#include "clm/events/kv_event_publisher.hpp"
#include "fuzz/fuzz_support.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 1) return 0;
  const std::string_view rest(reinterpret_cast<const char*>(data + 1), size - 1);
  if ((data[0] & 1) == 0) {
    clm::KvEventBatch batch;
    batch.ts = -7.0;
    const clm::Status s = clm::decode_kv_event_batch(rest, batch);
    if (!s.ok()) {
      FUZZ_CHECK(s.code() == clm::StatusCode::invalid_argument && !s.message().empty(), "refusal {}: {}", s.code_name(),
                 s.message());
      FUZZ_CHECK(batch.ts == -7.0 && batch.events.empty(), "a refused payload changed the output");
      return 0;
    }
    for (auto layout : {clm::KvEventLayout::array, clm::KvEventLayout::legacy, clm::KvEventLayout::map}) {
      std::string again;
      const clm::Status e = clm::encode_kv_event_batch(batch, layout, again);
      if (!e.ok()) {
        // Only what cannot be sent as it is: token ids that do not fill the blocks.
        FUZZ_CHECK(e.code() == clm::StatusCode::invalid_argument, "encode: {}", e.message());
        return 0;
      }
      clm::KvEventBatch back;
      const clm::Status d = clm::decode_kv_event_batch(again, back);
      FUZZ_CHECK(d.ok(), "our own bytes refused: {}", d.message());
      clm::KvEventBatch want = batch;
      if (!want.data_parallel_rank) want.data_parallel_rank = std::nullopt;
      if (layout == clm::KvEventLayout::legacy) {
        for (auto& ev : want.events) ev.extra_key.clear();
      }
      FUZZ_CHECK(back == want, "layout {}: the batch did not come back equal", static_cast<int>(layout));
    }
    return 0;
  }
  std::vector<std::string_view> frames;
  std::size_t at = 0;
  for (std::size_t i = 0; i <= rest.size(); ++i) {
    if (i == rest.size() || static_cast<unsigned char>(rest[i]) == 0xff) {
      frames.push_back(rest.substr(at, i - at));
      at = i + 1;
    }
  }
  std::uint64_t start = 12345;
  const clm::Status s = clm::parse_kv_replay_request(frames, start);
  if (!s.ok()) {
    FUZZ_CHECK(start == 12345 && !s.message().empty(), "a refused request changed the start");
    return 0;
  }
  FUZZ_CHECK(frames.size() == 3 && frames[1].empty() && frames[2].size() == 8, "accepted a malformed request");
  std::uint64_t v = 0;
  for (char c : frames[2]) v = (v << 8) | static_cast<unsigned char>(c);
  FUZZ_CHECK(v == start, "start {} from bytes meaning {}", start, v);
  return 0;
}
