// tests/tiers/redis_server.hpp: a real redis-server for a test, on 127.0.0.1
// and a free port, with nothing persisted (--save '' --appendonly no) in a
// temporary directory; killed when the object goes. stop() and restart() (on
// the same port) play a server that goes down and comes back.
//
//   clm_test::RedisServer redis;
//   redis.start();                                   // throws if redis-server is missing or mute
//   open_storage_backend(redis.url("t1:"), layout, backend);
//   auto raw = redis.connect();                      // the test's own commands
//   clm_test::RedisReply r = clm_test::redis_command(raw, "TTL %s", "clm:...");
//
// A missing redis-server is a failure, not a skip (std::runtime_error out of
// start(); CLM_REDIS_SERVER names another binary). The server is started with
// PR_SET_PDEATHSIG, so it dies with the test even if the test crashes: call
// start() from the thread that lives as long as the server (the test's own).
#pragma once

#include <arpa/inet.h>
#include <fcntl.h>
#include <hiredis/hiredis.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "store/store_test_support.hpp"  // TempDir

namespace clm_test {

struct RedisContextFree {
  void operator()(redisContext* c) const { redisFree(c); }
};
using RedisConnection = std::unique_ptr<redisContext, RedisContextFree>;
struct RedisReplyFree {
  void operator()(redisReply* r) const { freeReplyObject(r); }
};
using RedisReply = std::unique_ptr<redisReply, RedisReplyFree>;

// One command on a raw connection; throws when the connection fails.
template <typename... Args>
RedisReply redis_command(const RedisConnection& c, const char* format, Args... args) {
  RedisReply reply(static_cast<redisReply*>(redisCommand(c.get(), format, args...)));
  if (!reply) throw std::runtime_error(fmt::format("redis command '{}' failed: {}", format, c->errstr));
  return reply;
}

// A port nothing listens on now (the kernel's pick for a socket bound to 0).
inline int free_local_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) throw std::runtime_error("free_local_port: socket() failed");
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof addr;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    ::close(fd);
    throw std::runtime_error("free_local_port: bind/getsockname failed");
  }
  ::close(fd);
  return ntohs(addr.sin_port);
}

class RedisServer {
 public:
  RedisServer() = default;
  // extra: more redis-server arguments ("--requirepass", "pw"); a server that
  // wants AUTH counts as up when it answers PING with NOAUTH.
  explicit RedisServer(std::vector<std::string> extra) : extra_(std::move(extra)) {}
  ~RedisServer() { stop(); }
  RedisServer(const RedisServer&) = delete;
  RedisServer& operator=(const RedisServer&) = delete;

  // On a free port the first time; on the same port after stop().
  void start() {
    if (pid_ > 0) return;
    if (binary_.empty()) binary_ = find_binary();
    if (port_ != 0) {
      launch();
      return;
    }
    // Another process may take the port between our pick and the server's
    // bind: a few picks.
    std::string last;
    for (int attempt = 0; attempt < 5; ++attempt) {
      port_ = free_local_port();
      try {
        launch();
        return;
      } catch (const std::runtime_error& e) {
        last = e.what();
      }
    }
    port_ = 0;
    throw std::runtime_error(last);
  }

  // SIGKILL, as a crash: clients see their connections reset.
  void stop() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGKILL);
    int status = 0;
    while (::waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
    }
    pid_ = -1;
  }

  void restart() {
    stop();
    start();
  }

  // SIGSTOP / SIGCONT: a server that hangs (connections stay open, nothing answers).
  void pause() {
    if (pid_ > 0) ::kill(pid_, SIGSTOP);
  }
  void resume() {
    if (pid_ > 0) ::kill(pid_, SIGCONT);
  }

  bool running() const { return pid_ > 0; }
  int port() const { return port_; }

  // A storage URL for this server: prefix percent-encoded, then `options`
  // ("ttl=5&timeout_ms=100") as given.
  std::string url(std::string_view prefix = "clm:", std::string_view options = "", int db = 0) const {
    std::string encoded;
    for (unsigned char c : prefix) {
      if (std::isalnum(c) || c == ':' || c == '-' || c == '_' || c == '.') {
        encoded.push_back(static_cast<char>(c));
      } else {
        encoded += fmt::format("%{:02X}", c);
      }
    }
    std::string out = fmt::format("redis://127.0.0.1:{}/{}?prefix={}", port_, db, encoded);
    if (!options.empty()) out += fmt::format("&{}", options);
    return out;
  }

  RedisConnection connect() const {
    RedisConnection c(redisConnectWithTimeout("127.0.0.1", port_, timeval{2, 0}));
    if (!c || c->err) {
      throw std::runtime_error(
          fmt::format("cannot connect to the test redis on port {}: {}", port_, c ? c->errstr : "out of memory"));
    }
    return c;
  }

 private:
  static std::string find_binary() {
    if (const char* env = std::getenv("CLM_REDIS_SERVER"); env && *env) {
      if (::access(env, X_OK) != 0) throw std::runtime_error(fmt::format("CLM_REDIS_SERVER={} is not executable", env));
      return env;
    }
    std::vector<std::string> dirs;
    if (const char* path = std::getenv("PATH")) {
      std::stringstream ss(path);
      for (std::string dir; std::getline(ss, dir, ':');) dirs.push_back(dir);
    }
    for (const char* d : {"/usr/bin", "/usr/sbin", "/usr/local/bin"}) dirs.emplace_back(d);
    for (const std::string& dir : dirs) {
      const std::string candidate = dir + "/redis-server";
      if (::access(candidate.c_str(), X_OK) == 0) return candidate;
    }
    throw std::runtime_error(
        "redis-server not found (PATH, /usr/bin, /usr/sbin, /usr/local/bin): install the redis-server package "
        "(make deps) or set CLM_REDIS_SERVER");
  }

  std::string log_tail() const {
    std::ifstream in(dir_.path() / "redis.log");
    std::stringstream ss;
    ss << in.rdbuf();
    std::string log = ss.str();
    return log.size() > 2000 ? log.substr(log.size() - 2000) : log;
  }

  void launch() {
    const std::string port = std::to_string(port_);
    const std::string dir = dir_.str();
    const std::string log = (dir_.path() / "redis.log").string();
    std::vector<std::string> args = {binary_, "--port",       port, "--bind", "127.0.0.1", "--save",
                                     "",      "--appendonly", "no", "--dir",  dir,         "--daemonize",
                                     "no",    "--databases",  "16"};
    args.insert(args.end(), extra_.begin(), extra_.end());
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    const pid_t parent = ::getpid();
    const pid_t pid = ::fork();
    if (pid < 0) throw std::runtime_error("RedisServer: fork failed");
    if (pid == 0) {
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (::getppid() != parent) _exit(120);  // the test died before prctl
      const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
      if (fd >= 0) {
        ::dup2(fd, 1);
        ::dup2(fd, 2);
        ::close(fd);
      }
      ::execv(argv[0], argv.data());
      _exit(127);
    }
    pid_ = pid;
    // Up when it answers PING; a server that exits (port taken) or stays mute is an error.
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(15);
    while (std::chrono::steady_clock::now() < deadline) {
      int status = 0;
      if (::waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        throw std::runtime_error(fmt::format("redis-server ({}) exited at start on port {} (status {}); log:\n{}",
                                             binary_, port_, status, log_tail()));
      }
      RedisConnection c(redisConnectWithTimeout("127.0.0.1", port_, timeval{0, 200'000}));
      if (c && c->err == 0) {
        RedisReply pong(static_cast<redisReply*>(redisCommand(c.get(), "PING")));
        if (pong && pong->type == REDIS_REPLY_STATUS && std::string_view(pong->str, pong->len) == "PONG") return;
        if (pong && pong->type == REDIS_REPLY_ERROR && std::string_view(pong->str, pong->len).starts_with("NOAUTH")) {
          return;
        }
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    stop();
    throw std::runtime_error(
        fmt::format("redis-server on port {} did not answer PING within 15 s; log:\n{}", port_, log_tail()));
  }

  std::string binary_;
  std::vector<std::string> extra_;
  TempDir dir_;
  pid_t pid_ = -1;
  int port_ = 0;
};

}  // namespace clm_test
