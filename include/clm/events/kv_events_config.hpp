// clm/events/kv_events_config.hpp: how an Engine publishes its KV events
// (EngineConfig::kv_events; clm/events/kv_event.hpp for the events, and
// docs/fleet.md for pointing a router at them). Off by default, and then
// nothing is recorded.
//
//   clm::EngineConfig config;
//   config.kv_events.enabled = true;
//   config.kv_events.endpoint = "tcp://127.0.0.1:5557";          // PUB: topic, 8-byte seq, payload
//   config.kv_events.replay_endpoint = "tcp://127.0.0.1:5558";   // ROUTER: missed batches again
//   config.kv_events.topic = "kv@pod-3@llama-3-8b";              // llm-d's kv@<pod>@<model>
//   // or, for a bus of the host's own:
//   // config.kv_events.sink = [&](std::uint64_t seq, const clm::KvEventBatch& b) { ... };
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "clm/events/kv_event.hpp"

namespace clm {

// Whether the publisher binds its endpoint or connects to a router that does.
// automatic: as vLLM decides (a wildcard host, "*" or "::", ipc:// and
// inproc:// bind), and a loopback host (127.x.x.x, localhost, [::1]) binds
// too, so that the default endpoint serves subscribers on this machine only.
enum class KvEventsBind : std::uint8_t { automatic, bind, connect };

struct KvEventsConfig {
  bool enabled = false;
  std::string endpoint = "tcp://127.0.0.1:5557";  // the PUB socket
  KvEventsBind bind = KvEventsBind::automatic;
  std::string replay_endpoint;  // the ROUTER socket for replay requests (always bound); empty: none
  std::string topic;            // the first frame of every message (up to kMaxTopicBytes)
  KvEventLayout layout = KvEventLayout::array;
  // A batch goes out every batch_interval_ms, or as soon as it holds
  // max_batch_events events, whichever comes first.
  std::int32_t batch_interval_ms = 10;
  std::int32_t max_batch_events = 1024;
  // Events recorded and not yet published, at most; past it they are dropped
  // (counted) and the publisher resyncs: AllBlocksCleared, then every cached
  // page, so that no subscriber keeps a wrong picture.
  std::int32_t queue_events = 1 << 17;
  std::int32_t buffer_batches = 10000;  // batches the replay socket can send again
  std::int32_t send_hwm = 100000;       // ZeroMQ's high-water mark of the PUB socket, in messages
  std::int32_t data_parallel_rank = 0;  // the batch's third field (not added to the port: the host picks the endpoint)
  // false: BlockStored events carry no token ids (an empty array), for
  // routers that key on our block hashes; they cost the engine a copy of
  // every page's tokens otherwise.
  bool token_ids = true;
  // For a host that publishes on its own bus (NATS, Kafka): set, no socket is
  // opened (endpoint unused, replay_endpoint must be empty) and each batch is
  // handed to this instead, in order, on the publisher's one thread (never an
  // engine call's). It must not call back into the Engine; what it throws is
  // caught and counted as a send failure (the batch is still numbered).
  // `sequence` is the batch's number: 0, 1, 2, ... with no gaps.
  std::function<void(std::uint64_t sequence, const KvEventBatch&)> sink;

  static constexpr std::size_t kMaxTopicBytes = 256;
};

// What the publisher has done (EngineMetrics::kv_events).
struct KvEventsMetrics {
  bool enabled = false;
  std::uint64_t recorded_events = 0;   // events the tree's changes made
  std::uint64_t published_events = 0;  // sent in a batch
  std::uint64_t published_batches = 0;
  std::uint64_t dropped_events = 0;   // recorded while the queue was full: lost, then resynced
  std::uint64_t resyncs = 0;          // AllBlocksCleared + every cached page, after drops
  std::uint64_t replay_requests = 0;  // served on the replay socket
  std::uint64_t replay_refused = 0;   // malformed replay requests (wrong frames or length)
  std::uint64_t send_failures = 0;    // messages ZeroMQ would not take (a full replay client)
  std::int64_t queued_events = 0;     // recorded, not yet published, now
  std::uint64_t next_sequence = 0;    // the sequence number the next batch gets
  bool resync_pending = false;        // events are being dropped until a resync
};

}  // namespace clm
