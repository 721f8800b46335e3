// tests/capi/test_capi_errors.cpp: the C ABI's errors as a host sees them
// (only clm.h and libclmcache.so.0): status names, the thread-local
// clm_last_error(), and one test per bad input (NULL handles and
// out-parameters, tokens and lengths, calls in the wrong state, a full pool, a
// device that is not there): the status code, a message of the call's own in
// clm_last_error(), no crash. (Bad option values: test_capi_options.cpp.)
//
// Calls that might crash (lengths that overflow, where the library could read
// past the caller's buffer) run in a forked child on a buffer followed by an
// inaccessible page, so a crash fails one test instead of killing the run.
#include "clm.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <iterator>
#include <limits>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <catch2/catch.hpp>

#if defined(__has_feature)
#if __has_feature(address_sanitizer)
#define CLM_TEST_HAS_ASAN 1
#endif
#endif
#ifndef CLM_TEST_HAS_ASAN
#define CLM_TEST_HAS_ASAN 0
#endif

#include "capi_checks.hpp"
#include "capi_engine.hpp"

namespace {

// `n` token ids at the very end of a readable page that is followed by an
// inaccessible one: reading one id past them faults at once.
class GuardedTokens {
 public:
  explicit GuardedTokens(size_t n, int32_t first = 1) {
    page_ = static_cast<size_t>(sysconf(_SC_PAGESIZE));
    void* m = mmap(nullptr, 2 * page_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    REQUIRE(m != MAP_FAILED);
    base_ = static_cast<char*>(m);
    REQUIRE(mprotect(base_ + page_, page_, PROT_NONE) == 0);
    REQUIRE(n * sizeof(int32_t) <= page_);
    data_ = reinterpret_cast<int32_t*>(base_ + page_) - n;
    for (size_t i = 0; i < n; ++i) data_[i] = first + static_cast<int32_t>(i);
  }
  ~GuardedTokens() { munmap(base_, 2 * page_); }
  GuardedTokens(const GuardedTokens&) = delete;
  GuardedTokens& operator=(const GuardedTokens&) = delete;
  const int32_t* data() const { return data_; }
  char* end_of_readable() const { return base_ + page_; }

 private:
  size_t page_ = 0;
  char* base_ = nullptr;
  int32_t* data_ = nullptr;
};

struct ChildOutcome {
  bool returned = false;  // the call returned (else the child crashed or hung)
  int wait_status = 0;
  clm_status status = 0;
  std::string message;
  std::string describe() const {
    if (returned)
      return std::string(clm_status_name(status)) + " (" + std::to_string(status) + "): \"" + message + "\"";
    if (WIFSIGNALED(wait_status)) return "crashed with signal " + std::to_string(WTERMSIG(wait_status));
    if (WIFEXITED(wait_status)) return "died with exit code " + std::to_string(WEXITSTATUS(wait_status));
    return "died";
  }
};

// Runs `call` in a forked child (a copy of this process: handles made before
// stay valid there) and reports what it returned, or that it crashed. The
// child's output is discarded (ASan's report included); a call that hangs is
// killed after 10 s.
template <class Call>
ChildOutcome run_in_child(Call call) {
  int fds[2];
  REQUIRE(pipe(fds) == 0);
  std::fflush(nullptr);
  const pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    close(fds[0]);
    for (int sig : {SIGSEGV, SIGBUS, SIGABRT, SIGILL, SIGFPE}) signal(sig, SIG_DFL);  // not Catch's handlers
    const int devnull = open("/dev/null", O_WRONLY);
    if (devnull >= 0) {
      dup2(devnull, STDOUT_FILENO);
      dup2(devnull, STDERR_FILENO);
    }
    alarm(10);
#if !defined(__SANITIZE_ADDRESS__) && !CLM_TEST_HAS_ASAN
    // A runaway allocation fails at once rather than paging (ASan, whose
    // shadow needs the address space, caps allocations at 1 TiB itself).
    const rlimit address_space{rlim_t{16} << 30, rlim_t{16} << 30};
    setrlimit(RLIMIT_AS, &address_space);
#endif
    const clm_status s = call();
    const char* message = clm_last_error();
    if (write(fds[1], &s, sizeof s) != static_cast<ssize_t>(sizeof s)) _exit(3);
    if (write(fds[1], message, std::strlen(message)) < 0) _exit(3);
    _exit(0);  // no atexit handlers: the parent owns the handles
  }
  close(fds[1]);
  std::string data;
  char buffer[512];
  for (ssize_t n; (n = read(fds[0], buffer, sizeof buffer)) > 0;) data.append(buffer, static_cast<size_t>(n));
  close(fds[0]);
  ChildOutcome out;
  REQUIRE(waitpid(pid, &out.wait_status, 0) == pid);
  if (WIFEXITED(out.wait_status) && WEXITSTATUS(out.wait_status) == 0 && data.size() >= sizeof(clm_status)) {
    out.returned = true;
    std::memcpy(&out.status, data.data(), sizeof out.status);
    out.message = data.substr(sizeof(clm_status));
  }
  return out;
}

#define CHECK_CHILD_STATUS(expected, ...)                    \
  do {                                                       \
    const ChildOutcome outcome_ = run_in_child(__VA_ARGS__); \
    INFO(#__VA_ARGS__ << "\n  -> " << outcome_.describe());  \
    CHECK(outcome_.returned);                                \
    if (outcome_.returned) {                                 \
      CHECK(outcome_.status == (expected));                  \
      CHECK_FALSE(outcome_.message.empty());                 \
    }                                                        \
  } while (0)

constexpr size_t kOverflowLengths[] = {std::numeric_limits<size_t>::max(), size_t{1} << 40};

}  // namespace

// =============================================================================
// Status names and the last error
// =============================================================================

TEST_CASE("clm_status_name names every status code", "[capi][status]") {
  const std::pair<clm_status, std::string> names[] = {
      {CLM_OK, "ok"},
      {CLM_ERR_INVALID_ARGUMENT, "invalid_argument"},
      {CLM_ERR_OUT_OF_MEMORY, "out_of_memory"},
      {CLM_ERR_NOT_FOUND, "not_found"},
      {CLM_ERR_FAILED_PRECONDITION, "failed_precondition"},
      {CLM_ERR_UNSUPPORTED, "unsupported"},
      {CLM_ERR_INTERNAL, "internal"},
      {CLM_ERR_IO, "io_error"},
  };
  std::set<std::string> seen;
  for (const auto& [code, name] : names) {
    INFO("code " << code);
    REQUIRE(clm_status_name(code) != nullptr);
    CHECK(std::string(clm_status_name(code)) == name);
    seen.insert(clm_status_name(code));
  }
  CHECK(seen.size() == std::size(names));
  // The codes are 0 and -1..-7, contiguous.
  CHECK(CLM_ERR_INVALID_ARGUMENT == -1);
  CHECK(CLM_ERR_IO == -7);
  for (clm_status unknown :
       {1, -8, 100, -100, std::numeric_limits<int32_t>::max(), std::numeric_limits<int32_t>::min()}) {
    INFO("code " << unknown);
    REQUIRE(clm_status_name(unknown) != nullptr);
    CHECK(std::string(clm_status_name(unknown)) == "unknown");
  }
}

TEST_CASE("clm_last_error is empty on a thread that has not failed", "[capi][error]") {
  std::string fresh = "not set";
  std::thread([&] { fresh = clm_last_error(); }).join();
  CHECK(fresh.empty());
}

TEST_CASE("clm_last_error is thread-local", "[capi][error][threads]") {
  // Thread B fails first ...
  clm_engine_options o = engine_options(4, 4);
  o.num_pages = 0;
  clm_engine* e = nullptr;
  REQUIRE(clm_engine_create(&e, &o) == CLM_ERR_INVALID_ARGUMENT);
  const std::string mine = clm_last_error();
  REQUIRE_FALSE(mine.empty());

  // ... then thread A fails differently, and succeeds, many times, at the same time as B reads.
  std::atomic<bool> stop{false};
  std::atomic<int> b_changed{0};
  std::thread b_reader([&] {
    (void)clm_engine_create(&e, &o);  // B2: its own error, on its own thread
    const std::string own = clm_last_error();
    while (!stop) {
      if (own != clm_last_error()) ++b_changed;
    }
  });
  std::string theirs;
  std::thread a([&] {
    for (int i = 0; i < 2000; ++i) {
      (void)clm_seq_finish(nullptr);
      (void)clm_engine_options_init(nullptr, 0);
    }
    theirs = clm_last_error();
  });
  a.join();
  stop = true;
  b_reader.join();
  CHECK(theirs.find("clm_engine_options_init") != std::string::npos);
  CHECK(b_changed == 0);
  CHECK(std::string(clm_last_error()) == mine);  // this thread's message survived both
  CHECK(e == nullptr);
}

// =============================================================================
// Bad input: NULL handles and out-parameters
// =============================================================================

TEST_CASE("NULL: options_init", "[capi][bad][null]") {
  CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT, clm_engine_options_init(nullptr, sizeof(clm_engine_options)));
  CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT, clm_admit_options_init(nullptr, sizeof(clm_admit_options)));
}

TEST_CASE("NULL: engine_create", "[capi][bad][null]") {
  const clm_engine_options o = engine_options(4, 4);
  CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT, clm_engine_create(nullptr, &o));
  clm_engine* e = reinterpret_cast<clm_engine*>(uintptr_t{0x1});
  CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT, clm_engine_create(&e, nullptr));
  CHECK(e == nullptr);  // *out is cleared on failure
}

TEST_CASE("NULL: engine_kv_layout", "[capi][bad][null]") {
  EnginePtr engine = make_engine(4, 4);
  clm_kv_layout l;
  l.struct_size = sizeof l;
  CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT, clm_engine_kv_layout(nullptr, engine.get()));
  CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT, clm_engine_kv_layout(&l, nullptr));
}

TEST_CASE("NULL: engine_admit", "[capi][bad][null]") {
  EnginePtr engine = make_engine(4, 4);
  const std::vector<int32_t> t = {1, 2, 3};
  clm_seq* s = reinterpret_cast<clm_seq*>(uintptr_t{0x1});
  CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT, clm_engine_admit(nullptr, engine.get(), t.data(), t.size(), nullptr));
  CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT, clm_engine_admit(&s, nullptr, t.data(), t.size(), nullptr));
  CHECK(s == nullptr);
  s = reinterpret_cast<clm_seq*>(uintptr_t{0x1});
  CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT, clm_engine_admit(&s, engine.get(), nullptr, 3, nullptr));
  CHECK(s == nullptr);
  clm_admit_options o = admit_options();
  o.cache_salt = nullptr;
  o.cache_salt_len = 5;
  CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT, clm_engine_admit(&s, engine.get(), t.data(), t.size(), &o));
  CHECK(s == nullptr);
  const clm_metrics m = metrics(engine.get());
  CHECK(m.admitted == 0);
  CHECK(m.pages_used == 0);
}

TEST_CASE("NULL and bad input: engine_plan_admission", "[capi][bad][null]") {
  EnginePtr engine = make_engine(4, 4);
  const std::vector<int32_t> t = {1, 2, 3};
  clm_admission_plan p;
  p.struct_size = sizeof p;
  CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT, clm_engine_plan_admission(nullptr, engine.get(), t.data(), t.size(), nullptr));
  CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT, clm_engine_plan_admission(&p, nullptr, t.data(), t.size(), nullptr));
  CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT, clm_engine_plan_admission(&p, engine.get(), nullptr, 3, nullptr));
  CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT, clm_engine_plan_admission(&p, engine.get(), t.data(), 0, nullptr));
  const std::vector<int32_t> negative = {1, -2, 3};
  CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT,
               clm_engine_plan_admission(&p, engine.get(), negative.data(), negative.size(), nullptr));
  clm_admit_options o = admit_options();
  o.cache_salt = nullptr;
  o.cache_salt_len = 5;
  CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT, clm_engine_plan_admission(&p, engine.get(), t.data(), t.size(), &o));
  o = admit_options();
  o.priority = 101;
  CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT, clm_engine_plan_admission(&p, engine.get(), t.data(), t.size(), &o));
  CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT,
               clm_engine_plan_admission(&p, engine.get(), t.data(), size_t{1} << 40, nullptr));
  const clm_metrics m = metrics(engine.get());
  CHECK(m.tokens_queried == 0);
  CHECK(m.pages_used == 0);
}

TEST_CASE("NULL: seq_extend, seq_finish, seq_abort", "[capi][bad][null]") {
  const std::vector<int32_t> t = {1};
  CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT, clm_seq_extend(nullptr, t.data(), t.size()));
  CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT, clm_seq_extend(nullptr, nullptr, 0));
  CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT, clm_seq_finish(nullptr));
  CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT, clm_seq_abort(nullptr));

  EnginePtr engine = make_engine(4, 4);
  SeqPtr s = admit(engine.get(), {1, 2, 3});
  CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT, clm_seq_extend(s.get(), nullptr, 2));
  CHECK(page_table(s.get()).size() == 1);
  CHECK(slots(s.get()).size() == 3);  // still the admit's
  REQUIRE_OK(clm_seq_finish(s.get()));
}

TEST_CASE("NULL: seq accessors return nothing", "[capi][bad][null]") {
  size_t n = 77;
  CHECK(clm_seq_cached_tokens(nullptr) == 0);
  CHECK(clm_seq_page_table(nullptr, &n) == nullptr);
  CHECK(n == 0);
  n = 77;
  CHECK(clm_seq_slots(nullptr, &n) == nullptr);
  CHECK(n == 0);
  CHECK(clm_seq_page_table(nullptr, nullptr) == nullptr);
  CHECK(clm_seq_slots(nullptr, nullptr) == nullptr);

  // A NULL count on a live sequence is allowed (the array is still returned).
  EnginePtr engine = make_engine(4, 4);
  SeqPtr s = admit(engine.get(), {1, 2, 3, 4, 5});
  const int32_t* table = clm_seq_page_table(s.get(), nullptr);
  REQUIRE(table != nullptr);
  CHECK(table[0] == page_table(s.get())[0]);
  CHECK(clm_seq_slots(s.get(), nullptr) != nullptr);
}

TEST_CASE("NULL: batch_page_table", "[capi][bad][null]") {
  EnginePtr engine = make_engine(8, 4);
  SeqPtr s = admit(engine.get(), {1, 2, 3, 4, 5});
  clm_seq* seqs[] = {s.get()};
  int32_t indptr[2], last[1], indices[4];
  size_t n = 0;
  CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT,
               clm_engine_batch_page_table(nullptr, indices, 4, &n, last, engine.get(), seqs, 1));
  CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT,
               clm_engine_batch_page_table(indptr, indices, 4, nullptr, last, engine.get(), seqs, 1));
  CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT,
               clm_engine_batch_page_table(indptr, indices, 4, &n, nullptr, engine.get(), seqs, 1));
  CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT, clm_engine_batch_page_table(indptr, indices, 4, &n, last, nullptr, seqs, 1));
  CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT,
               clm_engine_batch_page_table(indptr, indices, 4, &n, last, engine.get(), nullptr, 1));
  clm_seq* with_null[] = {s.get(), nullptr};
  int32_t indptr3[3], last2[2];
  CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT,
               clm_engine_batch_page_table(indptr3, indices, 4, &n, last2, engine.get(), with_null, 2));
  // NULL indices with a capacity that claims room: nothing is written through it.
  CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT,
               clm_engine_batch_page_table(indptr, nullptr, 4, &n, last, engine.get(), seqs, 1));
  CHECK(n == 2);
}

TEST_CASE("NULL: engine_metrics", "[capi][bad][null]") {
  EnginePtr engine = make_engine(4, 4);
  clm_metrics m;
  m.struct_size = sizeof m;
  CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT, clm_engine_metrics(nullptr, engine.get()));
  CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT, clm_engine_metrics(&m, nullptr));
}

TEST_CASE("NULL: free functions are no-ops", "[capi][bad][null]") {
  const std::string before = prime_last_error();
  clm_engine_free(nullptr);
  clm_seq_free(nullptr);
  CHECK(std::string(clm_last_error()) == before);  // and report nothing
}

// =============================================================================
// Bad input: tokens and lengths
// =============================================================================

TEST_CASE("empty prompt", "[capi][bad][tokens]") {
  EnginePtr engine = make_engine(4, 4);
  const int32_t t[1] = {1};
  clm_seq* s = reinterpret_cast<clm_seq*>(uintptr_t{0x1});
  CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT, clm_engine_admit(&s, engine.get(), t, 0, nullptr));
  CHECK(s == nullptr);
  CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT, clm_engine_admit(&s, engine.get(), nullptr, 0, nullptr));
  CHECK(s == nullptr);
  const clm_metrics m = metrics(engine.get());
  CHECK(m.admitted == 0);
  CHECK(m.pages_used == 0);
}

TEST_CASE("negative token ids", "[capi][bad][tokens]") {
  EnginePtr engine = make_engine(16, 4);
  {
    SeqPtr cached = admit(engine.get(), tokens_from(1, 9));
    REQUIRE_OK(clm_seq_finish(cached.get()));
  }
  const clm_metrics before = metrics(engine.get());
  for (size_t at : {size_t{0}, size_t{5}, size_t{8}, size_t{9}}) {
    for (int32_t bad : {-1, std::numeric_limits<int32_t>::min()}) {
      std::vector<int32_t> prompt = tokens_from(1, 10);  // 8 of them are cached
      prompt[at] = bad;
      clm_seq* s = reinterpret_cast<clm_seq*>(uintptr_t{0x1});
      INFO("id " << bad << " at " << at);
      CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT, clm_engine_admit(&s, engine.get(), prompt.data(), prompt.size(), nullptr));
      CHECK(s == nullptr);
    }
  }
  const clm_metrics after = metrics(engine.get());
  CHECK(after.admitted == before.admitted);
  CHECK(after.pages_used == before.pages_used);
  CHECK(after.active_sequences == 0);

  // In extend: refused, and the sequence is unchanged.
  SeqPtr s = admit(engine.get(), tokens_from(1, 3));
  const std::vector<int32_t> table = page_table(s.get());
  const std::vector<int32_t> bad_tail = {4, 5, -3};
  CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT, clm_seq_extend(s.get(), bad_tail.data(), bad_tail.size()));
  CHECK(page_table(s.get()) == table);
  CHECK(metrics(engine.get()).pages_used == before.pages_used + 1);
  const std::vector<int32_t> good = {4};
  REQUIRE_OK(clm_seq_extend(s.get(), good.data(), good.size()));
  CHECK(slots(s.get()) == expected_slots(table, 3, 4, 4));  // the bad extend took no position
}

TEST_CASE("lengths that overflow: engine_admit", "[capi][bad][overflow]") {
  EnginePtr engine = make_engine(16, 4);
  const GuardedTokens tokens(4);
  for (size_t n : kOverflowLengths) {
    INFO("n_tokens " << n);
    CHECK_CHILD_STATUS(CLM_ERR_INVALID_ARGUMENT, [&] {
      clm_seq* s = nullptr;
      return clm_engine_admit(&s, engine.get(), tokens.data(), n, nullptr);
    });
  }
  CHECK(metrics(engine.get()).admitted == 0);
}

// A huge n_tokens must be refused before any id is read (an early version
// validated every id first, reading past the caller's buffer).
TEST_CASE("lengths that overflow: seq_extend", "[capi][bad][overflow]") {
  EnginePtr engine = make_engine(16, 4);
  SeqPtr s = admit(engine.get(), {1, 2, 3});
  const GuardedTokens tokens(4);
  for (size_t n : kOverflowLengths) {
    INFO("n_tokens " << n);
    CHECK_CHILD_STATUS(CLM_ERR_INVALID_ARGUMENT, [&] { return clm_seq_extend(s.get(), tokens.data(), n); });
  }
}

// indptr is int32, so any n_seqs > INT32_MAX - 1 is an invalid argument,
// refused before anything is allocated (not INTERNAL or OUT_OF_MEMORY).
TEST_CASE("lengths that overflow: batch_page_table n_seqs", "[capi][bad][overflow]") {
  EnginePtr engine = make_engine(16, 4);
  SeqPtr s = admit(engine.get(), {1, 2, 3});
  // One real handle at the end of a readable page.
  const GuardedTokens guard(sizeof(clm_seq*) / sizeof(int32_t));
  auto** seqs = reinterpret_cast<clm_seq**>(guard.end_of_readable() - sizeof(clm_seq*));
  *seqs = s.get();
  for (size_t n : kOverflowLengths) {
    INFO("n_seqs " << n);
    CHECK_CHILD_STATUS(CLM_ERR_INVALID_ARGUMENT, [&] {
      int32_t indptr[2], last[1], indices[4];
      size_t n_indices = 0;
      return clm_engine_batch_page_table(indptr, indices, 4, &n_indices, last, engine.get(), seqs, n);
    });
  }
}

// A salt longer than the library's bound is an invalid argument, refused
// before anything is copied or allocated.
TEST_CASE("lengths that overflow: cache_salt_len", "[capi][bad][overflow]") {
  EnginePtr engine = make_engine(16, 4);
  const GuardedTokens salt(2);
  const std::vector<int32_t> t = {1, 2, 3};
  for (size_t n : kOverflowLengths) {
    INFO("cache_salt_len " << n);
    CHECK_CHILD_STATUS(CLM_ERR_INVALID_ARGUMENT, [&] {
      clm_admit_options o;
      clm_admit_options_init(&o, sizeof o);
      o.cache_salt = reinterpret_cast<const char*>(salt.data());
      o.cache_salt_len = n;
      clm_seq* s = nullptr;
      return clm_engine_admit(&s, engine.get(), t.data(), t.size(), &o);
    });
  }
}

// =============================================================================
// Bad input: wrong state
// =============================================================================

TEST_CASE("finish after abort", "[capi][bad][state]") {
  EnginePtr engine = make_engine(8, 4);
  SeqPtr s = admit(engine.get(), {1, 2, 3, 4, 5});
  REQUIRE_OK(clm_seq_abort(s.get()));
  CHECK_STATUS(CLM_ERR_FAILED_PRECONDITION, clm_seq_finish(s.get()));
  check_ended_accessors(s.get(), 0);
  CHECK(std::string(clm_last_error()).find("abort") != std::string::npos);
  const clm_metrics m = metrics(engine.get());
  CHECK(m.finished == 0);
  CHECK(m.aborted == 1);
  CHECK(m.cached_tokens == 0);
  check_idle_accounting(engine.get(), 8, 4);
}

TEST_CASE("double finish", "[capi][bad][state]") {
  EnginePtr engine = make_engine(8, 4);
  SeqPtr s = admit(engine.get(), {1, 2, 3, 4, 5});
  REQUIRE_OK(clm_seq_finish(s.get()));
  CHECK_STATUS(CLM_ERR_FAILED_PRECONDITION, clm_seq_finish(s.get()));
  check_ended_accessors(s.get(), 0);
  CHECK(std::string(clm_last_error()).find("finish") != std::string::npos);
  const clm_metrics m = metrics(engine.get());
  CHECK(m.finished == 1);
  CHECK(m.cached_tokens == 4);
  check_idle_accounting(engine.get(), 8, 4);
}

TEST_CASE("abort after finish", "[capi][bad][state]") {
  EnginePtr engine = make_engine(8, 4);
  SeqPtr s = admit(engine.get(), {1, 2, 3, 4, 5});
  REQUIRE_OK(clm_seq_finish(s.get()));
  CHECK_STATUS(CLM_ERR_FAILED_PRECONDITION, clm_seq_abort(s.get()));
  const clm_metrics m = metrics(engine.get());
  CHECK(m.aborted == 0);
  CHECK(m.cached_tokens == 4);  // the published prefix stays
  check_idle_accounting(engine.get(), 8, 4);
}

TEST_CASE("double abort and extend after the end", "[capi][bad][state]") {
  EnginePtr engine = make_engine(8, 4);
  SeqPtr s = admit(engine.get(), {1, 2, 3, 4, 5});
  REQUIRE_OK(clm_seq_abort(s.get()));
  CHECK_STATUS(CLM_ERR_FAILED_PRECONDITION, clm_seq_abort(s.get()));
  const int32_t t[1] = {6};
  CHECK_STATUS(CLM_ERR_FAILED_PRECONDITION, clm_seq_extend(s.get(), t, 1));
  SeqPtr f = admit(engine.get(), {1, 2, 3, 4, 5});
  REQUIRE_OK(clm_seq_finish(f.get()));
  CHECK_STATUS(CLM_ERR_FAILED_PRECONDITION, clm_seq_extend(f.get(), t, 1));
  // An ended sequence in a batch.
  clm_seq* seqs[] = {f.get()};
  int32_t indptr[2], last[1], indices[4];
  size_t n = 0;
  CHECK_STATUS(CLM_ERR_FAILED_PRECONDITION,
               clm_engine_batch_page_table(indptr, indices, 4, &n, last, engine.get(), seqs, 1));
  check_idle_accounting(engine.get(), 8, 4);
}

TEST_CASE("calls on a sequence after clm_engine_free", "[capi][bad][state]") {
  clm_engine* engine = nullptr;
  const clm_engine_options o = engine_options(8, 4);
  REQUIRE_OK(clm_engine_create(&engine, &o));
  clm_seq* running = nullptr;
  clm_seq* finished = nullptr;
  const std::vector<int32_t> t = {1, 2, 3, 4, 5};
  REQUIRE_OK(clm_engine_admit(&running, engine, t.data(), t.size(), nullptr));
  REQUIRE_OK(clm_engine_admit(&finished, engine, t.data(), t.size(), nullptr));
  REQUIRE_OK(clm_seq_finish(finished));
  const std::vector<int32_t> table = page_table(running);
  clm_engine_free(engine);

  const int32_t more[1] = {6};
  for (clm_seq* s : {running, finished}) {
    CHECK_STATUS(CLM_ERR_FAILED_PRECONDITION, clm_seq_extend(s, more, 1));
    CHECK_STATUS(CLM_ERR_FAILED_PRECONDITION, clm_seq_finish(s));
    CHECK_STATUS(CLM_ERR_FAILED_PRECONDITION, clm_seq_abort(s));
    check_ended_accessors(s, 0);  // no pages or slots, and no cached tokens: the engine is gone
  }
  CHECK_FALSE(table.empty());

  // Such a handle in another engine's batch.
  EnginePtr other = make_engine(8, 4);
  clm_seq* seqs[] = {running};
  int32_t indptr[2], last[1], indices[4];
  size_t n = 0;
  CHECK_STATUS(CLM_ERR_FAILED_PRECONDITION,
               clm_engine_batch_page_table(indptr, indices, 4, &n, last, other.get(), seqs, 1));

  // The handles are still freed (the pool goes with the last; LSan checks).
  clm_seq_free(running);
  clm_seq_free(finished);
}

TEST_CASE("a sequence of another engine in batch_page_table", "[capi][bad][state]") {
  EnginePtr a = make_engine(8, 4);
  EnginePtr b = make_engine(8, 4);
  SeqPtr sa = admit(a.get(), {1, 2, 3});
  SeqPtr sb = admit(b.get(), {1, 2, 3});
  clm_seq* seqs[] = {sa.get(), sb.get()};
  int32_t indptr[3] = {-7, -7, -7}, last[2] = {-7, -7}, indices[4] = {-7, -7, -7, -7};
  size_t n = 0;
  CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT, clm_engine_batch_page_table(indptr, indices, 4, &n, last, a.get(), seqs, 2));
  CHECK(std::string(clm_last_error()).find("another engine") != std::string::npos);
  CHECK(std::all_of(std::begin(indices), std::end(indices), [](int32_t v) { return v == -7; }));
  // Each engine's own sequence alone is fine.
  REQUIRE_OK(clm_engine_batch_page_table(indptr, indices, 4, &n, last, b.get(), seqs + 1, 1));
  CHECK(n == 1);
}

// =============================================================================
// Bad input: the pool and the device
// =============================================================================

TEST_CASE("pool exhaustion: a prompt larger than the pool", "[capi][bad][oom]") {
  constexpr int32_t kPages = 4, kPs = 4;
  EnginePtr engine = make_engine(kPages, kPs);
  SeqPtr holder = admit(engine.get(), tokens_from(1, 5));  // 2 pages held
  const clm_metrics before = metrics(engine.get());
  for (size_t len : {size_t{9}, size_t{17}, size_t{1000}}) {
    const std::vector<int32_t> prompt = tokens_from(100, len);
    clm_seq* s = reinterpret_cast<clm_seq*>(uintptr_t{0x1});
    INFO("prompt of " << len << " tokens");
    CHECK_STATUS(CLM_ERR_OUT_OF_MEMORY, clm_engine_admit(&s, engine.get(), prompt.data(), prompt.size(), nullptr));
    CHECK(s == nullptr);
  }
  const clm_metrics after = metrics(engine.get());
  CHECK(after.pages_used == before.pages_used);
  CHECK(after.pages_free == before.pages_free);
  CHECK(after.active_sequences == before.active_sequences);
  CHECK(after.admitted == before.admitted);
  CHECK(after.rejected == before.rejected + 3);

  // In extend: the decode step that needs a page beyond the pool.
  SeqPtr filler = admit(engine.get(), tokens_from(200, 8));  // the other 2 pages
  REQUIRE(metrics(engine.get()).pages_free == 0);
  const std::vector<int32_t> table = page_table(filler.get());
  const int32_t next[1] = {9};
  CHECK_STATUS(CLM_ERR_OUT_OF_MEMORY, clm_seq_extend(filler.get(), next, 1));
  CHECK(page_table(filler.get()) == table);
  CHECK(metrics(engine.get()).pages_used == kPages);
  // Freeing the holder makes room; the same extend then works.
  REQUIRE_OK(clm_seq_abort(holder.get()));
  REQUIRE_OK(clm_seq_extend(filler.get(), next, 1));
  CHECK(page_table(filler.get()).size() == 3);
  REQUIRE_OK(clm_seq_finish(filler.get()));
  check_idle_accounting(engine.get(), kPages, kPs);
}

TEST_CASE("CLM_MEMORY_DEVICE: unsupported without a GPU, a device pool with one", "[capi][bad][device]") {
  clm_engine_options o = engine_options(4, 4, CLM_MEMORY_DEVICE);
  clm_engine* e = nullptr;
  prime_last_error();
  const clm_status s = clm_engine_create(&e, &o);
  const std::string message = clm_last_error();
  INFO(clm_status_name(s) << ": " << message);
  if (s == CLM_OK) {  // a CUDA build on a machine with a GPU
    EnginePtr engine(e);
    clm_kv_layout l;
    l.struct_size = sizeof l;
    REQUIRE_OK(clm_engine_kv_layout(&l, engine.get()));
    CHECK(l.memory == CLM_MEMORY_DEVICE);
    CHECK(l.base != nullptr);
    SeqPtr seq = admit(engine.get(), {1, 2, 3, 4, 5});
    REQUIRE_OK(clm_seq_finish(seq.get()));
  } else {
    CHECK(s == CLM_ERR_UNSUPPORTED);
    CHECK(e == nullptr);
    CHECK_FALSE(message.empty());
    CHECK(message.find("12345") == std::string::npos);  // not the primed message
  }
  // A device that does not exist is never a success.
  o.device = 1 << 20;
  CHECK_STATUS(CLM_ERR_UNSUPPORTED, clm_engine_create(&e, &o));
  CHECK(e == nullptr);
}
