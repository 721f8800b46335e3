// clm/events/kv_event_publisher.hpp: sends a KvEventRecorder's events over
// ZeroMQ as vLLM does, on a thread of its own, so that no engine call ever
// waits for a socket. Each message is three frames: the topic, the batch's
// sequence number (8 bytes, big-endian, from 0) and the msgpack batch
// (kv_event.hpp). A batch goes out every batch_interval_ms, or as soon as it
// holds max_batch_events events. With a replay endpoint, a ROUTER socket
// sends the last buffer_batches batches again: a client sends the 8-byte
// big-endian sequence to start from and gets [seq, payload] for each
// buffered batch from it on, then [-1 as 8 bytes, empty].
//
//   std::unique_ptr<clm::KvEventPublisher> publisher;
//   CLM_RETURN_IF_ERROR(clm::KvEventPublisher::create(config.kv_events, recorder,
//                                                     [&] { std::lock_guard l(mutex); recorder.resync(tree); },
//                                                     publisher));
//   publisher->endpoint();          // "tcp://127.0.0.1:5557" (the port a "*" picked)
//   publisher->flush(std::chrono::seconds(1));
//
// After the recorder drops events (its queue was full), the publisher asks
// for a resync through `resync`, which must run recorder.resync(tree) under
// the tree owner's lock.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>

#include "clm/events/kv_event_recorder.hpp"
#include "clm/events/kv_events_config.hpp"
#include "clm/status.hpp"

namespace clm {

class KvEventPublisher {
 public:
  // Binds (or connects) the sockets now: invalid_argument for a malformed
  // configuration (an endpoint ZeroMQ does not take, a topic over
  // kMaxTopicBytes, a size under 1), io_error naming the endpoint when it
  // cannot bind. Nothing is left open on error.
  static Status create(const KvEventsConfig& config, KvEventRecorder& recorder, std::function<void()> resync,
                       std::unique_ptr<KvEventPublisher>& out);
  // Publishes what is queued (for up to a second), then closes the sockets.
  ~KvEventPublisher();
  // Publishes what is queued, then ends the thread: no batch goes out (and
  // no sink is called) once it returns; flush is failed_precondition after.
  // Idempotent; the destructor calls it.
  void stop();
  KvEventPublisher(const KvEventPublisher&) = delete;
  KvEventPublisher& operator=(const KvEventPublisher&) = delete;

  // Returns once every event recorded before the call is published (ok), or
  // after `timeout` (failed_precondition, with what is left).
  Status flush(std::chrono::milliseconds timeout);

  const std::string& endpoint() const;         // as bound: the port a "*" picked; empty with a sink
  const std::string& replay_endpoint() const;  // empty: none
  KvEventsMetrics metrics() const;

 private:
  struct State;
  explicit KvEventPublisher(std::unique_ptr<State> state);
  std::unique_ptr<State> state_;
};

// How KvEventsBind::automatic decides (vLLM's rule, and a loopback host binds).
bool kv_events_endpoint_binds(std::string_view endpoint);

// A replay request as the ROUTER socket receives it: exactly [identity, "",
// 8-byte big-endian start sequence]. invalid_argument naming what is wrong
// (`start` untouched) for any other frames.
Status parse_kv_replay_request(std::span<const std::string_view> frames, std::uint64_t& start);

}  // namespace clm
