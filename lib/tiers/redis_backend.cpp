// lib/tiers/redis_backend.cpp: the redis:// storage tier, on hiredis (0.14's
// blocking API). A page is ONE value, header + payload (clm/tiers/page_file.hpp),
// under prefix + the key's 64 hex digits; a batch is one pipeline (every
// command sent, then every reply read) on one connection of a small pool.
//
// Failure: a call whose connection breaks (server down, timeout) returns
// io_error, and the pool drops that connection and the idle ones (they lead
// to the same server). A call on a connection reused from the pool retries
// once on a fresh one, so the first call after a server restart does not fail
// for a stale socket. After a failed connect no other is tried for
// kReconnectBackoff: calls fail at once meanwhile, instead of each waiting out
// a connect timeout against a server that is down.
#include <hiredis/hiredis.h>
#include <pthread.h>
#include <signal.h>

#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "clm/tiers/page_file.hpp"
#include "storage_backends.hpp"

namespace clm::tiers_detail {

namespace {

constexpr int kMaxConnections = 4;
constexpr auto kReconnectBackoff = std::chrono::milliseconds(100);
// A SET pipeline reads its replies after this many bytes of commands, so a
// large batch is not copied into hiredis' output buffer all at once.
constexpr std::size_t kPipelineBytes = std::size_t{16} << 20;

struct ContextFree {
  void operator()(redisContext* c) const { redisFree(c); }
};
using ContextPtr = std::unique_ptr<redisContext, ContextFree>;
struct ReplyFree {
  void operator()(redisReply* r) const { freeReplyObject(r); }
};
using ReplyPtr = std::unique_ptr<redisReply, ReplyFree>;

// hiredis writes with write(2): to a socket the server has closed, that
// raises SIGPIPE, whose default action would end the host process. Blocked
// for the duration of a call on this thread, and a SIGPIPE it raised taken
// off the pending set before unblocking (as libcurl does).
class SigpipeBlock {
 public:
  SigpipeBlock() {
    sigemptyset(&pipe_);
    sigaddset(&pipe_, SIGPIPE);
    sigset_t pending;
    sigemptyset(&pending);
    was_pending_ = sigpending(&pending) == 0 && sigismember(&pending, SIGPIPE) == 1;
    blocked_ = pthread_sigmask(SIG_BLOCK, &pipe_, &old_) == 0;
  }
  ~SigpipeBlock() {
    if (!blocked_) return;
    const int saved_errno = errno;
    sigset_t pending;
    sigemptyset(&pending);
    if (!was_pending_ && sigpending(&pending) == 0 && sigismember(&pending, SIGPIPE) == 1) {
      const timespec zero{0, 0};
      while (sigtimedwait(&pipe_, nullptr, &zero) < 0 && errno == EINTR) {
      }
    }
    pthread_sigmask(SIG_SETMASK, &old_, nullptr);
    errno = saved_errno;
  }
  SigpipeBlock(const SigpipeBlock&) = delete;
  SigpipeBlock& operator=(const SigpipeBlock&) = delete;

 private:
  sigset_t pipe_{};
  sigset_t old_{};
  bool was_pending_ = false;
  bool blocked_ = false;
};

// What one pipeline tallies; added to the counters only when the call succeeds
// (a retried call must not count twice).
struct Tally {
  std::uint64_t found = 0, missing = 0, repaired = 0, written = 0, dropped = 0, error_replies = 0;
  std::vector<PageFault> refusals;  // one per refused value
};

class RedisBackend final : public StorageBackend {
 public:
  RedisBackend(std::string url, const StorageUrl& parsed, std::string password, const PageLayout& layout,
               const PageSeal& seal)
      : url_(std::move(url)),
        host_(parsed.host),
        port_(parsed.port),
        db_(parsed.db),
        user_(parsed.user),
        password_(std::move(password)),
        prefix_(parsed.prefix),
        ttl_s_(parsed.ttl_s),
        timeout_{parsed.timeout_ms / 1000, static_cast<suseconds_t>(parsed.timeout_ms % 1000) * 1000},
        layout_(layout),
        seal_(seal),
        page_bytes_(layout.page_bytes()) {}

  Status exists(std::span<const PageKey> keys, std::span<std::uint8_t> found) override {
    CLM_RETURN_IF_ERROR(check_batch("redis storage exists", keys.size(), found.size(), keys.size()));
    counters_.pages_checked.fetch_add(keys.size(), std::memory_order_relaxed);
    if (keys.empty()) return {};
    return guard_alloc("redis storage exists", [&]() -> Status {
      const std::vector<std::string> names = key_names(keys);
      Tally tally;
      const Status status = with_connection("EXISTS", [&](redisContext* c) -> Status {
        tally = {};
        for (const std::string& name : names) {
          if (redisAppendCommand(c, "EXISTS %b", name.data(), name.size()) != REDIS_OK) return failure(c, "EXISTS");
        }
        for (std::size_t i = 0; i < names.size(); ++i) {
          ReplyPtr reply;
          CLM_RETURN_IF_ERROR(next_reply(c, "EXISTS", reply));
          const bool there = reply->type == REDIS_REPLY_INTEGER && reply->integer > 0;
          found[i] = there ? 1 : 0;
          tally.missing += there ? 0 : 1;
          tally.error_replies += reply->type == REDIS_REPLY_ERROR ? 1 : 0;
        }
        return {};
      });
      if (!status.ok()) return status;
      commit(tally);
      return {};
    });
  }

  Status get_pages(std::span<const PageKey> keys, std::span<std::byte* const> pages,
                   std::span<std::uint8_t> found) override {
    CLM_RETURN_IF_ERROR(check_batch("redis storage get", keys.size(), found.size(), pages.size()));
    if (keys.empty()) return {};
    return guard_alloc("redis storage get", [&]() -> Status {
      const std::vector<std::string> names = key_names(keys);
      Tally tally;
      std::vector<std::size_t> refused;
      const Status status = with_connection("GET", [&](redisContext* c) -> Status {
        tally = {};
        refused.clear();
        for (const std::string& name : names) {
          if (redisAppendCommand(c, "GET %b", name.data(), name.size()) != REDIS_OK) return failure(c, "GET");
        }
        for (std::size_t i = 0; i < names.size(); ++i) {
          ReplyPtr reply;
          CLM_RETURN_IF_ERROR(next_reply(c, "GET", reply));
          found[i] = 0;
          if (reply->type == REDIS_REPLY_NIL) {
            ++tally.missing;
          } else if (reply->type != REDIS_REPLY_STRING) {
            ++tally.error_replies;  // WRONGTYPE, LOADING, ...: not a page, not now
          } else {
            const std::span<const std::byte> value(reinterpret_cast<const std::byte*>(reply->str), reply->len);
            std::span<const std::byte> payload;
            PageFault fault = PageFault::none;
            if (decode_page(value, keys[i], layout_, seal_, payload, fault).ok()) {
              std::memcpy(pages[i], payload.data(), page_bytes_);
              found[i] = 1;
              ++tally.found;
            } else {
              tally.refusals.push_back(fault);
              refused.push_back(i);
            }
          }
        }
        return delete_refused(c, names, refused, tally);
      });
      if (!status.ok()) return status;
      commit(tally);
      return {};
    });
  }

  Status set_pages(std::span<const PageKey> keys, std::span<const std::byte* const> pages,
                   std::span<std::uint8_t> written) override {
    CLM_RETURN_IF_ERROR(check_batch("redis storage set", keys.size(), written.size(), pages.size()));
    if (keys.empty()) return {};
    return guard_alloc("redis storage set", [&]() -> Status {
      const std::vector<std::string> names = key_names(keys);
      const std::string ttl = std::to_string(ttl_s_);
      const std::string tail = ttl_s_ > 0 ? fmt::format("\r\n$2\r\nEX\r\n${}\r\n{}\r\n", ttl.size(), ttl) : "\r\n";
      const std::size_t value_bytes = kPageHeaderSize + page_bytes_;
      Tally tally;
      const Status status = with_connection("SET", [&](redisContext* c) -> Status {
        tally = {};
        for (std::size_t begin = 0; begin < keys.size();) {
          // Commands for pages [begin, end), up to kPipelineBytes, then their replies.
          std::size_t end = begin, pending = 0;
          for (; end < keys.size() && (end == begin || pending < kPipelineBytes); ++end) {
            const std::span<const std::byte> payload(pages[end], page_bytes_);
            PageHeaderBytes header;
            CLM_RETURN_IF_ERROR(encode_page_header(keys[end], layout_, seal_, payload, header));
            // SET key value [EX ttl] in RESP, the value's bulk string written in
            // pieces (header, payload) so the payload is copied once, into
            // hiredis' output buffer. The blocking API sends the buffer as it is.
            const std::string head = fmt::format("*{}\r\n$3\r\nSET\r\n${}\r\n{}\r\n${}\r\n", ttl_s_ > 0 ? 5 : 3,
                                                 names[end].size(), names[end], value_bytes);
            if (redisAppendFormattedCommand(c, head.data(), head.size()) != REDIS_OK ||
                redisAppendFormattedCommand(c, reinterpret_cast<const char*>(header.data()), header.size()) !=
                    REDIS_OK ||
                redisAppendFormattedCommand(c, reinterpret_cast<const char*>(payload.data()), payload.size()) !=
                    REDIS_OK ||
                redisAppendFormattedCommand(c, tail.data(), tail.size()) != REDIS_OK) {
              return failure(c, "SET");
            }
            pending += head.size() + value_bytes + tail.size();
          }
          for (std::size_t i = begin; i < end; ++i) {
            ReplyPtr reply;
            CLM_RETURN_IF_ERROR(next_reply(c, "SET", reply));
            const bool ok = reply->type == REDIS_REPLY_STATUS;
            written[i] = ok ? 1 : 0;
            tally.written += ok ? 1 : 0;
            tally.dropped += ok ? 0 : 1;  // an error reply: OOM (maxmemory), READONLY replica, ...
          }
          begin = end;
        }
        return {};
      });
      if (!status.ok()) return status;
      commit(tally);
      return {};
    });
  }

  // One connection made and put in the pool (open's check of the credentials).
  Status probe() {
    ContextPtr c;
    bool reused = false;
    CLM_RETURN_IF_ERROR(acquire(c, reused));
    release(std::move(c), true);
    return {};
  }

  const PageLayout& layout() const override { return layout_; }
  const PageSeal& seal() const override { return seal_; }
  StorageStats stats() const override { return counters_.load(); }
  const std::string& url() const override { return url_; }

  ~RedisBackend() override {
    std::lock_guard lock(pool_mu_);
    idle_.clear();
  }

 private:
  std::vector<std::string> key_names(std::span<const PageKey> keys) const {
    std::vector<std::string> names;
    names.reserve(keys.size());
    for (const PageKey& key : keys) names.push_back(prefix_ + key.hex());
    return names;
  }

  std::string where() const { return fmt::format("redis {}:{}", host_, port_); }

  Status failure(redisContext* c, std::string_view command) const {
    return io_error(fmt::format("{}: {}: {}", where(), command, c->err ? c->errstr : "cannot queue the command"));
  }

  Status next_reply(redisContext* c, std::string_view command, ReplyPtr& out) const {
    void* raw = nullptr;
    if (redisGetReply(c, &raw) != REDIS_OK || raw == nullptr) {
      if (raw) freeReplyObject(raw);
      if (c->err == 0) c->err = REDIS_ERR_OTHER;  // never reuse a connection whose replies are out of step
      return failure(c, command);
    }
    out.reset(static_cast<redisReply*>(raw));
    return {};
  }

  // Deletes the string values get_pages refused (their page keys' names), so
  // that exists() stops counting them and the next store writes them again.
  // A value another instance rewrote in between is deleted too: a miss, never
  // a wrong page. Other types (a list under our prefix) are left alone.
  Status delete_refused(redisContext* c, const std::vector<std::string>& names, const std::vector<std::size_t>& refused,
                        Tally& tally) const {
    for (std::size_t i : refused) {
      if (redisAppendCommand(c, "DEL %b", names[i].data(), names[i].size()) != REDIS_OK) return failure(c, "DEL");
    }
    for (std::size_t n = 0; n < refused.size(); ++n) {
      ReplyPtr reply;
      CLM_RETURN_IF_ERROR(next_reply(c, "DEL", reply));
      if (reply->type == REDIS_REPLY_INTEGER && reply->integer > 0) ++tally.repaired;
      tally.error_replies += reply->type == REDIS_REPLY_ERROR ? 1 : 0;
    }
    return {};
  }

  void commit(const Tally& t) {
    counters_.pages_read.fetch_add(t.found, std::memory_order_relaxed);
    counters_.bytes_read.fetch_add(t.found * page_bytes_, std::memory_order_relaxed);
    counters_.pages_missing.fetch_add(t.missing, std::memory_order_relaxed);
    for (PageFault fault : t.refusals) counters_.count_refusal(fault);
    counters_.repaired_pages.fetch_add(t.repaired, std::memory_order_relaxed);
    counters_.pages_written.fetch_add(t.written, std::memory_order_relaxed);
    counters_.bytes_written.fetch_add(t.written * page_bytes_, std::memory_order_relaxed);
    counters_.dropped_writes.fetch_add(t.dropped, std::memory_order_relaxed);
    if (t.error_replies > 0) counters_.errors.fetch_add(1, std::memory_order_relaxed);
  }

  // Runs one pipeline on a pooled connection (see the file comment for the
  // retry); io_error, counted in errors, when no connection serves it.
  template <typename Pipeline>
  Status with_connection(std::string_view command, Pipeline&& pipeline) {
    const SigpipeBlock no_sigpipe;
    Status status;
    for (int attempt = 0; attempt < 2; ++attempt) {
      ContextPtr c;
      bool reused = false;
      status = acquire(c, reused);
      if (!status.ok()) break;
      try {
        status = pipeline(c.get());
      } catch (...) {
        release(std::move(c), false);  // replies may be left unread
        throw;
      }
      const bool broken = c->err != 0;
      release(std::move(c), !broken);
      if (!broken || !reused) break;
    }
    if (!status.ok()) {
      counters_.errors.fetch_add(1, std::memory_order_relaxed);
      if (status.code() != StatusCode::io_error) status = io_error(fmt::format("{}: {}", command, status.message()));
    }
    return status;
  }

  Status acquire(ContextPtr& out, bool& reused) {
    std::unique_lock lock(pool_mu_);
    pool_cv_.wait(lock, [&] { return !idle_.empty() || open_ < kMaxConnections; });
    if (!idle_.empty()) {
      out = std::move(idle_.back());
      idle_.pop_back();
      reused = true;
      return {};
    }
    const auto now = std::chrono::steady_clock::now();
    if (now < retry_after_) {
      return io_error(fmt::format("{}: unreachable (no new connection for {} ms after: {})", where(),
                                  kReconnectBackoff.count(), last_connect_error_));
    }
    ++open_;
    lock.unlock();
    Status s = connect(out);
    if (s.ok()) {
      reused = false;
      return s;
    }
    lock.lock();
    --open_;
    retry_after_ = std::chrono::steady_clock::now() + kReconnectBackoff;
    last_connect_error_ = s.message();
    pool_cv_.notify_one();
    return s;
  }

  void release(ContextPtr c, bool healthy) {
    std::lock_guard lock(pool_mu_);
    if (healthy) {
      idle_.push_back(std::move(c));
    } else {
      // The idle connections lead to the same server: most likely dead too.
      c.reset();
      open_ -= 1 + static_cast<int>(idle_.size());
      idle_.clear();
    }
    pool_cv_.notify_all();
  }

  Status connect(ContextPtr& out) const {
    ContextPtr c(redisConnectWithTimeout(host_.c_str(), port_, timeout_));
    if (!c) return io_error(fmt::format("{}: cannot allocate a connection", where()));
    if (c->err) return io_error(fmt::format("{}: connect: {}", where(), c->errstr));
    if (redisSetTimeout(c.get(), timeout_) != REDIS_OK) {
      return io_error(fmt::format("{}: cannot set the socket timeout: {}", where(), c->errstr));
    }
    if (!password_.empty()) {
      ReplyPtr reply(static_cast<redisReply*>(
          user_.empty()
              ? redisCommand(c.get(), "AUTH %b", password_.data(), password_.size())
              : redisCommand(c.get(), "AUTH %b %b", user_.data(), user_.size(), password_.data(), password_.size())));
      if (!reply) return io_error(fmt::format("{}: AUTH: {}", where(), c->errstr));
      if (reply->type == REDIS_REPLY_ERROR) {  // WRONGPASS ...: the server's words, never the password
        return failed_precondition(fmt::format("{}: AUTH{} refused: {}", where(),
                                               user_.empty() ? std::string() : fmt::format(" as user '{}'", user_),
                                               std::string_view(reply->str, reply->len)));
      }
    }
    if (db_ != 0) {
      ReplyPtr reply(static_cast<redisReply*>(redisCommand(c.get(), "SELECT %d", db_)));
      if (!reply) return io_error(fmt::format("{}: SELECT {}: {}", where(), db_, c->errstr));
      if (reply->type != REDIS_REPLY_STATUS) {
        return io_error(fmt::format("{}: SELECT {}: {}", where(), db_,
                                    reply->type == REDIS_REPLY_ERROR ? reply->str : "unexpected reply"));
      }
    }
    out = std::move(c);
    return {};
  }

  const std::string url_;
  const std::string host_;
  const int port_;
  const std::int32_t db_;
  const std::string user_;
  const std::string password_;  // never printed
  const std::string prefix_;
  const std::int64_t ttl_s_;
  const timeval timeout_;
  const PageLayout layout_;
  const PageSeal seal_;
  const std::size_t page_bytes_;
  StorageCounters counters_;

  std::mutex pool_mu_;
  std::condition_variable pool_cv_;
  std::vector<ContextPtr> idle_;  // connected, nothing pending
  int open_ = 0;                  // idle + in use
  std::chrono::steady_clock::time_point retry_after_{};
  std::string last_connect_error_;
};

}  // namespace

namespace {

// The password of password_file: its first line. A file others may read is
// refused: the secret would not be one.
Status read_password_file(const std::string& path, std::string& out) {
  std::string text;
  CLM_RETURN_IF_ERROR(read_secret_file(path, "redis password_file", 64 << 10, text));
  out = text.substr(0, text.find('\n'));
  if (!out.empty() && out.back() == '\r') out.pop_back();
  if (out.empty()) return invalid_argument(fmt::format("redis password_file {}: its first line is empty", path));
  return {};
}

}  // namespace

Status open_redis_backend(const StorageUrl& parsed, std::string url, const PageLayout& layout, const PageSeal& seal,
                          std::unique_ptr<StorageBackend>& out) {
  std::string password = parsed.password;
  if (!parsed.password_file.empty()) CLM_RETURN_IF_ERROR(read_password_file(parsed.password_file, password));
  const bool credentials = !password.empty();
  auto backend = std::make_unique<RedisBackend>(std::move(url), parsed, std::move(password), layout, seal);
  // With credentials, one connection now: a refused AUTH is a clear error at
  // start rather than a stream of failed calls. An unreachable server is not
  // an error here (the backend connects lazily, as without credentials).
  if (credentials) {
    const Status first = backend->probe();
    if (first.code() == StatusCode::failed_precondition) return first;
  }
  out = std::move(backend);
  return {};
}

}  // namespace clm::tiers_detail
