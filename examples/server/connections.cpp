// examples/server/connections.cpp: clm_server's connections (connections.hpp).
#include "connections.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>

namespace clm_server {

namespace {

// The numeric address and port of a socket's end (getsockname/getpeername).
bool socket_end(int fd, bool peer, std::string& address, int& port) {
  sockaddr_storage storage{};
  socklen_t length = sizeof(storage);
  auto* addr = reinterpret_cast<sockaddr*>(&storage);
  if ((peer ? getpeername(fd, addr, &length) : getsockname(fd, addr, &length)) != 0) return false;
  char text[INET6_ADDRSTRLEN] = {};
  if (storage.ss_family == AF_INET) {
    const auto* in = reinterpret_cast<const sockaddr_in*>(&storage);
    inet_ntop(AF_INET, &in->sin_addr, text, sizeof(text));
    port = ntohs(in->sin_port);
  } else if (storage.ss_family == AF_INET6) {
    const auto* in6 = reinterpret_cast<const sockaddr_in6*>(&storage);
    inet_ntop(AF_INET6, &in6->sin6_addr, text, sizeof(text));
    port = ntohs(in6->sin6_port);
  } else {
    return false;
  }
  address = text;
  return true;
}

// Each connected socket of this process whose local port is `local_port`:
// visit(fd, remote address, remote port) until it returns false.
void for_each_connection(int local_port, const std::function<bool(int, const std::string&, int)>& visit) {
  std::error_code error;
  for (const auto& entry : std::filesystem::directory_iterator("/proc/self/fd", error)) {
    char* end = nullptr;
    const std::string name = entry.path().filename().string();
    const long number = std::strtol(name.c_str(), &end, 10);
    if (end == name.c_str() || *end != '\0') continue;
    const auto fd = static_cast<int>(number);
    struct stat st {};
    if (fstat(fd, &st) != 0 || !S_ISSOCK(st.st_mode)) continue;
    std::string local, remote;
    int port = -1, remote_port = -1;
    if (socket_end(fd, false, local, port) && port == local_port && socket_end(fd, true, remote, remote_port) &&
        !visit(fd, remote, remote_port)) {
      return;
    }
  }
}

}  // namespace

BoundedTaskQueue::BoundedTaskQueue(std::size_t threads, std::size_t max_pending)
    : max_pending_(std::max<std::size_t>(max_pending, 1)) {
  for (std::size_t i = 0; i < threads; ++i) workers_.emplace_back([this] { work(); });
}

BoundedTaskQueue::~BoundedTaskQueue() { shutdown(); }

void BoundedTaskQueue::enqueue(std::function<void()> fn) {
  std::unique_lock lock(mutex_);
  room_.wait(lock, [&] { return jobs_.size() < max_pending_ || stopping_; });
  jobs_.push_back(std::move(fn));
  ready_.notify_one();
}

void BoundedTaskQueue::shutdown() {
  {
    std::lock_guard lock(mutex_);
    if (stopping_ && workers_.empty()) return;
    stopping_ = true;
  }
  ready_.notify_all();
  room_.notify_all();
  for (std::thread& t : workers_) t.join();
  workers_.clear();
}

void BoundedTaskQueue::work() {
  for (;;) {
    std::function<void()> fn;
    {
      std::unique_lock lock(mutex_);
      ready_.wait(lock, [&] { return stopping_ || !jobs_.empty(); });
      if (jobs_.empty()) return;  // stopping, and every accepted connection served
      fn = std::move(jobs_.front());
      jobs_.pop_front();
      room_.notify_one();
    }
    fn();
  }
}

ConnectionWatchdog::ConnectionWatchdog(int port, std::chrono::milliseconds timeout) : port_(port), timeout_(timeout) {
  thread_ = std::thread([this] { run(); });
}

ConnectionWatchdog::~ConnectionWatchdog() {
  {
    std::lock_guard lock(mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  thread_.join();
}

void ConnectionWatchdog::busy(const std::string& address, int port, bool busy) {
  std::lock_guard lock(mutex_);
  Conn& c = connections_[{address, port}];
  c.busy = busy;
  c.idle_since = std::chrono::steady_clock::now();
}

void ConnectionWatchdog::run() {
  std::unique_lock lock(mutex_);
  while (!wake_.wait_for(lock, std::chrono::milliseconds(250), [&] { return stop_; })) {
    lock.unlock();
    look(std::chrono::steady_clock::now());
    lock.lock();
  }
}

void ConnectionWatchdog::look(std::chrono::steady_clock::time_point now) {
  std::vector<std::pair<int, std::pair<std::string, int>>> sockets;  // the scan, outside the lock
  for_each_connection(port_, [&](int fd, const std::string& remote, int remote_port) {
    sockets.push_back({fd, {remote, remote_port}});
    return true;
  });
  std::lock_guard lock(mutex_);
  for (auto& [key, c] : connections_) c.seen = false;
  for (const auto& [fd, key] : sockets) {
    auto [it, fresh] = connections_.try_emplace(key);
    Conn& c = it->second;
    if (fresh) c.idle_since = now;
    c.seen = true;
    if (c.busy || now - c.idle_since < timeout_) continue;
    // The same peer still (the number may have been reused since the scan): cut it off.
    std::string remote;
    int remote_port = -1;
    if (socket_end(fd, true, remote, remote_port) && remote == key.first && remote_port == key.second) {
      ::shutdown(fd, SHUT_RDWR);
      ++closed_;
      c.idle_since = now;  // once
    }
  }
  // A connection gone is gone, marked busy or not (a client that left mid-request is never logged).
  std::erase_if(connections_, [](const auto& entry) { return !entry.second.seen; });
}

int connection_fd(const httplib::Request& request) {
  int found = -1;
  for_each_connection(request.local_port, [&](int fd, const std::string& remote, int remote_port) {
    if (remote_port != request.remote_port || remote != request.remote_addr) return true;
    found = fd;
    return false;
  });
  return found;
}

bool peer_closed(int fd) {
  pollfd p{.fd = fd, .events = POLLIN | POLLRDHUP, .revents = 0};
  if (poll(&p, 1, 0) <= 0) return false;
  if ((p.revents & (POLLRDHUP | POLLHUP | POLLERR)) != 0) return true;
  char byte;
  return recv(fd, &byte, 1, MSG_PEEK | MSG_DONTWAIT) == 0;
}

}  // namespace clm_server
