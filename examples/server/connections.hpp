// examples/server/connections.hpp: what clm_server does with its TCP
// connections that cpp-httplib 0.11 leaves to it: a thread pool that bounds
// the connections waiting for a thread (BoundedTaskQueue), a watchdog that
// closes connections whose request head does not arrive in time
// (ConnectionWatchdog: httplib bounds each read, not a head, and has no hook
// before the head is read), and a request's own socket, found by both its
// ends, so that a handler can see its client leave (connection_fd,
// peer_closed).
//
//   http.new_task_queue = [] { return new clm_server::BoundedTaskQueue(16, 64); };
//   clm_server::ConnectionWatchdog watchdog(port, std::chrono::seconds(10));
//   watchdog.busy(request.remote_addr, request.remote_port, true);   // a head arrived
//   int fd = clm_server::connection_fd(request);
//   if (fd >= 0 && clm_server::peer_closed(fd)) cancel();
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <httplib.h>

namespace clm_server {

// httplib's thread pool with a bound on the connections waiting for a
// thread: past it enqueue() blocks the accepting thread, so further
// connections wait in the kernel's backlog instead of in our memory.
class BoundedTaskQueue final : public httplib::TaskQueue {
 public:
  BoundedTaskQueue(std::size_t threads, std::size_t max_pending);
  ~BoundedTaskQueue() override;
  void enqueue(std::function<void()> fn) override;
  void shutdown() override;

 private:
  void work();
  const std::size_t max_pending_;
  std::mutex mutex_;
  std::condition_variable ready_, room_;
  std::deque<std::function<void()>> jobs_;
  bool stopping_ = false;
  std::vector<std::thread> workers_;
};

// Closes connections that send no complete request head in time. Every
// 250 ms it looks at the process's sockets on the server's port; a
// connection with no request being handled (busy() marks one when its head
// has arrived, and unmarks it once the response is written) for `timeout`
// since it appeared or since its last response is shut down, which ends the
// read that holds its thread. TLS handshakes are heads too.
class ConnectionWatchdog {
 public:
  ConnectionWatchdog(int port, std::chrono::milliseconds timeout);
  ~ConnectionWatchdog();
  void busy(const std::string& address, int port, bool busy);
  std::uint64_t closed() const { return closed_.load(); }  // connections shut down so far

 private:
  struct Conn {
    std::chrono::steady_clock::time_point idle_since{};
    bool busy = false;
    bool seen = false;
  };
  void run();
  void look(std::chrono::steady_clock::time_point now);

  const int port_;
  const std::chrono::milliseconds timeout_;
  std::mutex mutex_;
  std::condition_variable wake_;
  bool stop_ = false;
  std::map<std::pair<std::string, int>, Conn> connections_;
  std::atomic<std::uint64_t> closed_{0};
  std::thread thread_;
};

// The socket of a request's connection, matched among the process's sockets
// by both ends (the handler's thread owns it until it returns, so the number
// stays its own); -1 when not found.
int connection_fd(const httplib::Request& request);

// Whether the client closed (or reset) its side: readable with nothing to read.
bool peer_closed(int fd);

}  // namespace clm_server
