// lib/events/kv_event_publisher.cpp: the ZeroMQ side of KV events
// (clm/events/kv_event_publisher.hpp): a PUB socket, an optional ROUTER for
// replay, one thread that batches, encodes, sends and serves replays, woken
// by an eventfd when a batch fills up.
#include "clm/events/kv_event_publisher.hpp"

#include <sys/eventfd.h>
#include <unistd.h>

#include <fmt/format.h>
#include <zmq.hpp>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

namespace clm {

bool kv_events_endpoint_binds(std::string_view endpoint) {
  if (endpoint.find('*') != std::string_view::npos || endpoint.find("::") != std::string_view::npos) return true;
  if (endpoint.starts_with("ipc://") || endpoint.starts_with("inproc://")) return true;
  if (!endpoint.starts_with("tcp://")) return false;
  std::string_view host = endpoint.substr(6);
  host = host.substr(0, host.rfind(':'));
  return host.starts_with("127.") || host == "localhost" || host == "[::1]";
}

Status parse_kv_replay_request(std::span<const std::string_view> frames, std::uint64_t& start) {
  if (frames.size() != 3) {
    return invalid_argument(
        fmt::format("replay request: {} frames, expected [identity, \"\", 8-byte start]", frames.size()));
  }
  if (!frames[1].empty()) return invalid_argument("replay request: no empty delimiter frame");
  if (frames[2].size() != 8) {
    return invalid_argument(fmt::format("replay request: a {}-byte start sequence, expected 8", frames[2].size()));
  }
  std::uint64_t v = 0;
  for (char c : frames[2]) v = (v << 8) | static_cast<unsigned char>(c);
  start = v;
  return {};
}

namespace {

std::string be64(std::uint64_t v) {
  std::string out(8, '\0');
  for (int i = 7; i >= 0; --i, v >>= 8) out[static_cast<std::size_t>(i)] = static_cast<char>(v & 0xff);
  return out;
}

Status check_config(const KvEventsConfig& c) {
  auto bad = [](std::string what) { return invalid_argument("kv_events: " + what); };
  if (c.sink && !c.replay_endpoint.empty()) {
    return bad("a sink and a replay endpoint: with a sink no socket is opened (replay is the host's bus's)");
  }
  if (!c.sink && c.endpoint.empty()) return bad("an endpoint is needed (tcp://127.0.0.1:5557, ipc://...)");
  if (c.topic.size() > KvEventsConfig::kMaxTopicBytes) {
    return bad(
        fmt::format("topic of {} bytes, over the {}-byte limit", c.topic.size(), KvEventsConfig::kMaxTopicBytes));
  }
  if (c.batch_interval_ms < 0 || c.batch_interval_ms > 60000) {
    return bad(fmt::format("batch_interval_ms must be in [0, 60000], got {}", c.batch_interval_ms));
  }
  if (c.max_batch_events < 1 || c.max_batch_events > 65536) {
    return bad(fmt::format("max_batch_events must be in [1, 65536], got {}", c.max_batch_events));
  }
  if (c.queue_events < c.max_batch_events) {
    return bad(
        fmt::format("queue_events ({}) must hold a batch (max_batch_events {})", c.queue_events, c.max_batch_events));
  }
  if (c.buffer_batches < 0 || c.buffer_batches > 1000000) {
    return bad(fmt::format("buffer_batches must be in [0, 1000000], got {}", c.buffer_batches));
  }
  if (c.send_hwm < 1) return bad(fmt::format("send_hwm must be >= 1, got {}", c.send_hwm));
  if (c.data_parallel_rank < 0)
    return bad(fmt::format("data_parallel_rank must be >= 0, got {}", c.data_parallel_rank));
  return {};
}

// Binds or connects `socket`; the endpoint as bound (ZMQ_LAST_ENDPOINT).
Status attach(zmq::socket_t& socket, const std::string& endpoint, bool bind, const char* what, std::string& out) {
  try {
    if (bind) {
      socket.bind(endpoint);
      out = socket.get(zmq::sockopt::last_endpoint);
    } else {
      socket.connect(endpoint);
      out = endpoint;
    }
  } catch (const zmq::error_t& e) {
    const std::string message = fmt::format("kv_events: cannot {} the {} endpoint \"{}\": {}",
                                            bind ? "bind" : "connect", what, endpoint, e.what());
    if (e.num() == EINVAL || e.num() == EPROTONOSUPPORT || e.num() == ENOCOMPATPROTO) return invalid_argument(message);
    return io_error(message);
  }
  return {};
}

// Payloads ZeroMQ sends without a copy and hands back once sent (from its
// I/O thread), so that their storage serves batch after batch: a copy per
// batch, or a fresh buffer each time, meant large allocations and frees on
// two threads, whose page faults and TLB shootdowns reached the engine's
// thread too.
struct PayloadPool {
  struct Payload {
    PayloadPool* pool;
    std::string bytes;
  };
  static constexpr std::size_t kMaxFree = 8;
  std::mutex mutex;
  std::vector<std::unique_ptr<Payload>> free;

  PayloadPool() { free.reserve(kMaxFree); }
  std::unique_ptr<Payload> get() {
    {
      std::lock_guard guard(mutex);
      if (!free.empty()) {
        std::unique_ptr<Payload> p = std::move(free.back());
        free.pop_back();
        return p;
      }
    }
    return std::unique_ptr<Payload>(new Payload{this, {}});
  }
  // ZeroMQ's free function (zmq_msg_init_data): the message was sent or dropped.
  static void give_back(void*, void* hint) noexcept {
    std::unique_ptr<Payload> p(static_cast<Payload*>(hint));
    std::lock_guard guard(p->pool->mutex);
    if (p->pool->free.size() < kMaxFree) p->pool->free.push_back(std::move(p));  // within capacity
  }
};

}  // namespace

struct KvEventPublisher::State {
  KvEventsConfig config;
  KvEventRecorder& recorder;
  std::function<void()> resync;
  PayloadPool payloads;  // before the context: messages still queued give their payloads back as it closes
  zmq::context_t context{1};
  zmq::socket_t pub;  // none with a sink
  zmq::socket_t router;
  std::string endpoint, replay_endpoint;
  int wake_fd = -1;
  std::thread thread;
  std::atomic<bool> stop{false}, flush_requested{false};
  std::atomic<bool> in_flight{false};  // events taken from the recorder and not yet sent
  std::mutex stop_mutex;               // one stop() joins the thread

  // The thread's own: the replay buffer (with a replay socket only), and the
  // string each batch is encoded into (its storage kept from batch to batch).
  std::deque<std::pair<std::uint64_t, std::string>> buffer;
  std::string encoded;
  std::vector<KvEvent> events;           // a sink's batch, kept from batch to batch
  std::vector<KvEventView> batch_views;  // a socket's batch, into the recorder's log

  std::atomic<std::uint64_t> published_events{0}, published_batches{0}, replay_requests{0}, replay_refused{0},
      send_failures{0}, next_sequence{0};
  std::mutex idle_mutex;
  std::condition_variable idle;  // signalled after each round of sends

  State(const KvEventsConfig& c, KvEventRecorder& r, std::function<void()> s)
      : config(c), recorder(r), resync(std::move(s)) {}
  ~State() {
    if (wake_fd >= 0) ::close(wake_fd);
  }

  void wake() const {
    const std::uint64_t one = 1;
    (void)!::write(wake_fd, &one, sizeof one);
  }

  // The next batch of at most `max` events, to the sink (as events) or the
  // socket (encoded straight from the recorder's log); numbered and counted.
  void send_batch(std::size_t max) {
    const double ts = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
    const std::uint64_t seq = next_sequence.load(std::memory_order_relaxed);
    std::size_t sent = 0;
    if (config.sink) {
      KvEventBatch batch;
      batch.ts = ts;
      batch.data_parallel_rank = config.data_parallel_rank;
      batch.events.swap(events);  // the last batch's events: their storage serves again
      sent = recorder.take(batch.events, max);
      if (sent == 0) {  // only records that describe nodes were left, or the batch was lost: nothing to send
        events.swap(batch.events);
        return;
      }
      try {
        config.sink(seq, batch);
      } catch (...) {
        send_failures.fetch_add(1, std::memory_order_relaxed);
      }
      events.swap(batch.events);
    } else {
      sent = recorder.take_views(batch_views, max);
      if (sent == 0) return;  // only records that describe nodes were left, or the batch was lost
      const bool keep_for_replay = config.buffer_batches > 0 && !config.replay_endpoint.empty();
      std::unique_ptr<PayloadPool::Payload> lent;  // without replay: encoded in a pooled payload, sent without a copy
      try {
        if (!keep_for_replay) lent = payloads.get();
      } catch (const std::bad_alloc&) {
        send_failures.fetch_add(1, std::memory_order_relaxed);
        return;
      }
      std::string& payload = lent ? lent->bytes : encoded;
      if (!encode_kv_event_views(ts, batch_views, config.data_parallel_rank, config.layout, payload).ok()) {
        send_failures.fetch_add(1, std::memory_order_relaxed);
        return;
      }
      try {
        (void)pub.send(zmq::buffer(config.topic), zmq::send_flags::sndmore | zmq::send_flags::dontwait);
        (void)pub.send(zmq::buffer(be64(seq)), zmq::send_flags::sndmore | zmq::send_flags::dontwait);
        if (lent) {
          zmq::message_t message(payload.data(), payload.size(), &PayloadPool::give_back, lent.get());
          (void)lent.release();  // the message's now: ZeroMQ gives it back, sent or not
          (void)pub.send(std::move(message), zmq::send_flags::dontwait);
        } else {
          (void)pub.send(zmq::buffer(payload), zmq::send_flags::dontwait);
        }
      } catch (const zmq::error_t&) {
        send_failures.fetch_add(1, std::memory_order_relaxed);
      }
      if (keep_for_replay) {
        try {
          std::string oldest;
          if (buffer.size() == static_cast<std::size_t>(config.buffer_batches)) {
            oldest = std::move(buffer.front().second);
            buffer.pop_front();
          }
          buffer.emplace_back(seq, std::move(encoded));
          encoded = std::move(oldest);  // the oldest batch's storage serves the next one
        } catch (const std::bad_alloc&) {
          send_failures.fetch_add(1, std::memory_order_relaxed);  // sent, but not kept for replay
        }
      }
    }
    next_sequence.store(seq + 1, std::memory_order_relaxed);
    published_events.fetch_add(sent, std::memory_order_relaxed);
    published_batches.fetch_add(1, std::memory_order_relaxed);
  }

  // One reply frame set [identity, "", seq, payload]; false when ZeroMQ would not take it.
  bool reply(const zmq::message_t& identity, const std::string& seq, const std::string& payload) {
    try {
      const auto more = zmq::send_flags::sndmore | zmq::send_flags::dontwait;
      if (!router.send(zmq::buffer(identity.data(), identity.size()), more)) return false;
      (void)router.send(zmq::message_t(), more);
      (void)router.send(zmq::buffer(seq), more);
      (void)router.send(zmq::buffer(payload), zmq::send_flags::dontwait);
      return true;
    } catch (const zmq::error_t&) {
      return false;
    }
  }

  void serve_replays() {
    for (int served = 0; served < 64; ++served) {  // a bounded round: batches keep going out
      // The request's frames, the first four kept: a longer one is refused whole.
      std::vector<zmq::message_t> frames;
      std::size_t parts = 0;
      try {
        for (bool more = true; more;) {
          zmq::message_t part;
          if (!router.recv(part, parts == 0 ? zmq::recv_flags::dontwait : zmq::recv_flags::none)) break;
          more = part.more();
          if (++parts <= 4) frames.push_back(std::move(part));
        }
      } catch (const zmq::error_t&) {
        return;
      }
      if (parts == 0) return;
      if (parts > 4) frames.resize(2);  // identity and delimiter: refused below, answered with the end marker
      const bool delimited = frames.size() >= 2 && frames[1].size() == 0;
      std::vector<std::string_view> views;
      for (std::size_t i = 0; i < parts && i < frames.size(); ++i)
        views.emplace_back(frames[i].data<char>(), frames[i].size());
      if (parts > frames.size()) views.resize(parts);  // frames past the fourth: counted, not kept
      std::uint64_t start = 0;
      if (!parse_kv_replay_request(views, start).ok()) {
        replay_refused.fetch_add(1, std::memory_order_relaxed);
        // A client that waits for an answer gets the end marker: nothing.
        if (delimited) (void)reply(frames[0], be64(~std::uint64_t{0}), {});
        continue;
      }
      replay_requests.fetch_add(1, std::memory_order_relaxed);  // one from the future: only the end marker
      bool ok = true;
      for (const auto& [seq, payload] : buffer) {
        if (seq < start) continue;
        if (!(ok = reply(frames[0], be64(seq), payload))) break;
      }
      if (!ok || !reply(frames[0], be64(~std::uint64_t{0}), {})) send_failures.fetch_add(1, std::memory_order_relaxed);
    }
  }

  void run() {
    const auto interval = std::chrono::milliseconds(config.batch_interval_ms);
    const auto max_batch = static_cast<std::size_t>(config.max_batch_events);
    for (;;) {
      const bool stopping = stop.load(std::memory_order_acquire);
      std::chrono::milliseconds timeout = std::max(interval, std::chrono::milliseconds(50));
      if (recorder.queued() > 0) {
        const auto due = recorder.oldest() + interval - std::chrono::steady_clock::now();
        timeout = std::clamp(std::chrono::duration_cast<std::chrono::milliseconds>(due), std::chrono::milliseconds(0),
                             timeout);
      }
      if (stopping || flush_requested.load(std::memory_order_acquire)) timeout = std::chrono::milliseconds(0);
      zmq::pollitem_t items[2] = {{nullptr, wake_fd, ZMQ_POLLIN, 0}, {nullptr, 0, ZMQ_POLLIN, 0}};
      int count = 1;
      if (router) {
        items[1].socket = router.handle();
        count = 2;
      }
      try {
        (void)zmq::poll(items, static_cast<std::size_t>(count), timeout);
      } catch (const zmq::error_t&) {
      }
      if (items[0].revents & ZMQ_POLLIN) {
        std::uint64_t ignored;
        (void)!::read(wake_fd, &ignored, sizeof ignored);
      }
      if (count == 2 && (items[1].revents & ZMQ_POLLIN)) serve_replays();
      if (!stopping && recorder.resync_needed() && resync) resync();
      const bool flushing = flush_requested.load(std::memory_order_acquire);
      for (;;) {
        const std::size_t queued = recorder.queued();
        const bool due = queued > 0 && (stopping || flushing || queued >= max_batch ||
                                        std::chrono::steady_clock::now() >= recorder.oldest() + interval);
        if (!due) break;
        in_flight.store(true);
        send_batch(max_batch);
        in_flight.store(false);
      }
      { std::lock_guard guard(idle_mutex); }
      idle.notify_all();
      if (stopping) return;
    }
  }
};

KvEventPublisher::KvEventPublisher(std::unique_ptr<State> state) : state_(std::move(state)) {}

Status KvEventPublisher::create(const KvEventsConfig& config, KvEventRecorder& recorder, std::function<void()> resync,
                                std::unique_ptr<KvEventPublisher>& out) {
  CLM_RETURN_IF_ERROR(check_config(config));
  std::unique_ptr<State> s;
  try {
    s = std::make_unique<State>(config, recorder, std::move(resync));
    s->wake_fd = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (s->wake_fd < 0) return io_error("kv_events: eventfd failed");
    if (!config.sink) {
      s->pub = zmq::socket_t(s->context, zmq::socket_type::pub);
      s->pub.set(zmq::sockopt::sndhwm, config.send_hwm);
      s->pub.set(zmq::sockopt::linger, 1000);
      const bool bind = config.bind == KvEventsBind::bind ||
                        (config.bind == KvEventsBind::automatic && kv_events_endpoint_binds(config.endpoint));
      CLM_RETURN_IF_ERROR(attach(s->pub, config.endpoint, bind, "publish", s->endpoint));
    }
    if (!config.replay_endpoint.empty()) {
      s->router = zmq::socket_t(s->context, zmq::socket_type::router);
      s->router.set(zmq::sockopt::router_mandatory, 1);
      s->router.set(zmq::sockopt::linger, 0);
      s->router.set(zmq::sockopt::maxmsgsize,
                    std::int64_t{1024});  // a request is 8 bytes: a peer sending more is dropped
      CLM_RETURN_IF_ERROR(attach(s->router, config.replay_endpoint, true, "replay", s->replay_endpoint));
    }
  } catch (const zmq::error_t& e) {
    return io_error(fmt::format("kv_events: ZeroMQ: {}", e.what()));
  } catch (const std::bad_alloc&) {
    return out_of_memory("kv_events: no memory for the publisher");
  }
  State* state = s.get();
  recorder.set_wakeup(static_cast<std::size_t>(config.max_batch_events), [state] { state->wake(); });
  try {
    state->thread = std::thread([state] { state->run(); });
  } catch (const std::system_error& e) {
    recorder.set_wakeup(0, {});
    return io_error(fmt::format("kv_events: cannot start the publisher thread: {}", e.what()));
  }
  out.reset(new KvEventPublisher(std::move(s)));
  return {};
}

KvEventPublisher::~KvEventPublisher() { stop(); }

void KvEventPublisher::stop() {
  State& s = *state_;
  std::lock_guard guard(s.stop_mutex);
  s.stop.store(true, std::memory_order_release);
  s.wake();
  if (s.thread.joinable()) s.thread.join();
  s.recorder.set_wakeup(0, {});
}

Status KvEventPublisher::flush(std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  State& s = *state_;
  if (s.stop.load(std::memory_order_acquire)) return failed_precondition("kv_events: the publisher is stopped");
  s.flush_requested.store(true, std::memory_order_release);
  s.wake();
  std::unique_lock lock(s.idle_mutex);
  // While flush_requested holds, the thread goes round without waiting and
  // signals `idle` after each round. In this order: events the thread has
  // taken are in flight until sent.
  const bool done = s.idle.wait_until(
      lock, deadline, [&] { return s.recorder.queued() == 0 && !s.in_flight.load() && !s.recorder.resync_needed(); });
  s.flush_requested.store(false, std::memory_order_release);
  if (!done) {
    return failed_precondition(fmt::format("kv_events: flush timed out with {} events queued", s.recorder.queued()));
  }
  return {};
}

const std::string& KvEventPublisher::endpoint() const { return state_->endpoint; }
const std::string& KvEventPublisher::replay_endpoint() const { return state_->replay_endpoint; }

KvEventsMetrics KvEventPublisher::metrics() const {
  const State& s = *state_;
  KvEventsMetrics m;
  m.enabled = true;
  m.resync_pending = s.recorder.resync_needed();
  m.recorded_events = s.recorder.recorded_events();
  m.published_events = s.published_events.load(std::memory_order_relaxed);
  m.published_batches = s.published_batches.load(std::memory_order_relaxed);
  m.dropped_events = s.recorder.dropped_events();
  m.resyncs = s.recorder.resyncs();
  m.replay_requests = s.replay_requests.load(std::memory_order_relaxed);
  m.replay_refused = s.replay_refused.load(std::memory_order_relaxed);
  m.send_failures = s.send_failures.load(std::memory_order_relaxed);
  m.queued_events = static_cast<std::int64_t>(s.recorder.queued());
  m.next_sequence = s.next_sequence.load(std::memory_order_relaxed);
  return m;
}

}  // namespace clm
