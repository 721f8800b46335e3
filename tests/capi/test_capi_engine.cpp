// tests/capi/test_capi.cpp: the C ABI as a host sees it. Only clm.h and the
// shared library libclmcache.so.0 are used here (no clm:: type, no core
// header): lifecycle, page tables and slots, cache hits, tenant isolation,
// metrics, FlashInfer CSR arrays, threads, and one test per bad input (status
// code, clm_last_error(), no crash).
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
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>
#include <numeric>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

#if defined(__has_include)
#if __has_include("clm/engine.hpp")
#error "test_capi must see only clm.h, as a host linking libclmcache.so does"
#endif
#endif

#if defined(__has_feature)
#if __has_feature(address_sanitizer)
#define CLM_TEST_HAS_ASAN 1
#endif
#endif
#ifndef CLM_TEST_HAS_ASAN
#define CLM_TEST_HAS_ASAN 0
#endif

#include "capi_checks.hpp"

namespace {

clm_engine_options engine_options(int32_t num_pages, int32_t page_size, int32_t memory = CLM_MEMORY_NONE) {
  clm_engine_options o;
  std::memset(&o, 0xAB, sizeof o);
  REQUIRE(clm_engine_options_init(&o, sizeof o) == CLM_OK);
  o.num_pages = num_pages;
  o.page_size = page_size;
  o.memory = memory;
  o.head_dim = 8;  // small pools: these tests are about page ids
  return o;
}

EnginePtr make_engine(const clm_engine_options& o) {
  clm_engine* e = nullptr;
  REQUIRE_OK(clm_engine_create(&e, &o));
  REQUIRE(e != nullptr);
  return EnginePtr(e);
}
EnginePtr make_engine(int32_t num_pages, int32_t page_size) { return make_engine(engine_options(num_pages, page_size)); }

clm_admit_options admit_options() {
  clm_admit_options o;
  std::memset(&o, 0xAB, sizeof o);
  REQUIRE(clm_admit_options_init(&o, sizeof o) == CLM_OK);
  return o;
}

SeqPtr admit(clm_engine* e, const std::vector<int32_t>& tokens, const clm_admit_options* o = nullptr) {
  clm_seq* s = nullptr;
  REQUIRE_OK(clm_engine_admit(&s, e, tokens.data(), tokens.size(), o));
  REQUIRE(s != nullptr);
  return SeqPtr(s);
}

SeqPtr admit_salted(clm_engine* e, const std::vector<int32_t>& tokens, const std::string& salt, int32_t adapter = 0) {
  clm_admit_options o = admit_options();
  o.cache_salt = salt.data();
  o.cache_salt_len = salt.size();
  o.adapter_id = adapter;
  return admit(e, tokens, &o);
}

clm_metrics metrics(const clm_engine* e) {
  clm_metrics m;
  std::memset(&m, 0, sizeof m);
  m.struct_size = sizeof m;
  REQUIRE_OK(clm_engine_metrics(&m, e));
  return m;
}

std::vector<int32_t> page_table(const clm_seq* s) {
  size_t n = 12345;
  const int32_t* p = clm_seq_page_table(s, &n);
  REQUIRE((p != nullptr || n == 0));
  return p ? std::vector<int32_t>(p, p + n) : std::vector<int32_t>{};
}

std::vector<int64_t> slots(const clm_seq* s) {
  size_t n = 12345;
  const int64_t* p = clm_seq_slots(s, &n);
  REQUIRE((p != nullptr || n == 0));
  return p ? std::vector<int64_t>(p, p + n) : std::vector<int64_t>{};
}

std::vector<int32_t> tokens_from(int32_t first, size_t n) {
  std::vector<int32_t> t(n);
  std::iota(t.begin(), t.end(), first);
  return t;
}

std::vector<int32_t> concat(std::vector<int32_t> a, const std::vector<int32_t>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

int32_t pages_for(size_t tokens, int32_t page_size) {
  return static_cast<int32_t>((tokens + static_cast<size_t>(page_size) - 1) / static_cast<size_t>(page_size));
}

// Slots of token positions [begin, end) of a sequence with this page table.
std::vector<int64_t> expected_slots(const std::vector<int32_t>& table, size_t begin, size_t end, int32_t page_size) {
  std::vector<int64_t> out;
  const auto ps = static_cast<size_t>(page_size);
  for (size_t t = begin; t < end; ++t) {
    out.push_back(int64_t{table.at(t / ps)} * page_size + static_cast<int64_t>(t % ps));
  }
  return out;
}

// Every pool page is free, the cache's, or held by running sequences; with no
// sequence running, every used page is the cache's, and nothing stays locked.
void check_idle_accounting(const clm_engine* e, int32_t num_pages, int32_t page_size) {
  const clm_metrics m = metrics(e);
  CHECK(m.active_sequences == 0);
  CHECK(m.pages_used + m.pages_free == num_pages);
  CHECK(int64_t{m.pages_used} * page_size == m.cached_tokens);
  CHECK(m.evictable_tokens == m.cached_tokens);
  CHECK(m.protected_tokens == 0);
}

// A finished or aborted sequence keeps its cached-token count, and has no
// pages or slots any more (they belong to the cache or to other sequences).
void check_ended_accessors(const clm_seq* s, int32_t cached) {
  CHECK(clm_seq_cached_tokens(s) == cached);
  size_t n = 77;
  CHECK(clm_seq_page_table(s, &n) == nullptr);
  CHECK(n == 0);
  n = 77;
  CHECK(clm_seq_slots(s, &n) == nullptr);
  CHECK(n == 0);
}

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
    if (returned) return std::string(clm_status_name(status)) + " (" + std::to_string(status) + "): \"" + message + "\"";
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
// Version and status names
// =============================================================================

TEST_CASE("clm_version matches the header macros and the project version", "[capi][version]") {
  CHECK(clm_version() == CLM_VERSION_NUMBER);
  CHECK(CLM_VERSION_NUMBER == CLM_VERSION_MAJOR * 10000 + CLM_VERSION_MINOR * 100 + CLM_VERSION_PATCH);
  const std::string expected = std::to_string(CLM_VERSION_MAJOR) + "." + std::to_string(CLM_VERSION_MINOR) + "." +
                               std::to_string(CLM_VERSION_PATCH);
  REQUIRE(clm_version_string() != nullptr);
  CHECK(std::string(clm_version_string()) == expected);
#ifdef CLM_TEST_PROJECT_VERSION
  CHECK(expected == CLM_TEST_PROJECT_VERSION);  // clm.h agrees with project(VERSION) (the SONAME's source)
#endif
}

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
  for (clm_status unknown : {1, -8, 100, -100, std::numeric_limits<int32_t>::max(), std::numeric_limits<int32_t>::min()}) {
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
// Lifecycle
// =============================================================================

TEST_CASE("options_init fills the documented defaults", "[capi][options]") {
  clm_engine_options o;
  std::memset(&o, 0xAB, sizeof o);
  REQUIRE_OK(clm_engine_options_init(&o, sizeof o));
  CHECK(o.struct_size == sizeof o);
  CHECK(o.num_pages == 0);
  CHECK(o.page_size == 16);
  CHECK(o.num_layers == 1);
  CHECK(o.kv_heads == 1);
  CHECK(o.head_dim == 128);
  CHECK(o.kv_dtype == CLM_KV_F16);
  CHECK(o.memory == CLM_MEMORY_HOST);
  CHECK(o.device == 0);
  CHECK(o.eviction_policy == CLM_EVICT_LRU);
  CHECK(o.slru_protected_fraction == Approx(0.2));

  clm_admit_options a;
  std::memset(&a, 0xAB, sizeof a);
  REQUIRE_OK(clm_admit_options_init(&a, sizeof a));
  CHECK(a.struct_size == sizeof a);
  CHECK(a.cache_salt == nullptr);
  CHECK(a.cache_salt_len == 0);
  CHECK(a.adapter_id == 0);
  CHECK(a.priority == 0);
  CHECK(a.priority_update == CLM_PRIORITY_RAISE);

  // num_pages has no default: the defaults alone do not make an engine.
  clm_engine* e = nullptr;
  CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT, clm_engine_create(&e, &o));
  CHECK(e == nullptr);
}

TEST_CASE("admit, extend, finish: page table and slots stay consistent", "[capi][lifecycle]") {
  constexpr int32_t kPages = 64, kPs = 4;
  EnginePtr engine = make_engine(kPages, kPs);
  const std::vector<int32_t> prompt = tokens_from(100, 10);

  SeqPtr seq = admit(engine.get(), prompt);
  CHECK(clm_seq_cached_tokens(seq.get()) == 0);
  std::vector<int32_t> table = page_table(seq.get());
  REQUIRE(table.size() == 3);  // ceil(10 / 4)
  CHECK(std::set<int32_t>(table.begin(), table.end()).size() == table.size());
  for (int32_t p : table) CHECK((p >= 0 && p < kPages));
  CHECK(slots(seq.get()) == expected_slots(table, 0, 10, kPs));

  {
    clm_metrics m = metrics(engine.get());
    CHECK(m.admitted == 1);
    CHECK(m.active_sequences == 1);
    CHECK(m.pages_used == 3);
    CHECK(m.pages_free == kPages - 3);
    CHECK(m.tokens_queried == 10);
    CHECK(m.tokens_hit == 0);
    CHECK(m.cached_tokens == 0);
  }

  // Decode: one token fills row 2 of the last page; the next two need a page.
  const std::vector<int32_t> out1 = {7};
  REQUIRE_OK(clm_seq_extend(seq.get(), out1.data(), out1.size()));
  CHECK(page_table(seq.get()) == table);
  CHECK(slots(seq.get()) == expected_slots(table, 10, 11, kPs));

  const std::vector<int32_t> out2 = {8, 9};
  REQUIRE_OK(clm_seq_extend(seq.get(), out2.data(), out2.size()));
  const std::vector<int32_t> grown = page_table(seq.get());
  REQUIRE(grown.size() == 4);
  CHECK(std::equal(table.begin(), table.end(), grown.begin()));  // old pages keep their places
  CHECK(slots(seq.get()) == expected_slots(grown, 11, 13, kPs));
  CHECK(metrics(engine.get()).pages_used == 4);

  // Every slot handed out lies in a page of the table.
  for (int64_t slot : slots(seq.get())) {
    CHECK(std::find(grown.begin(), grown.end(), static_cast<int32_t>(slot / kPs)) != grown.end());
  }

  // An empty extend is fine and hands out no slots.
  REQUIRE_OK(clm_seq_extend(seq.get(), nullptr, 0));
  CHECK(slots(seq.get()).empty());
  CHECK(page_table(seq.get()) == grown);

  REQUIRE_OK(clm_seq_finish(seq.get()));
  {
    clm_metrics m = metrics(engine.get());
    CHECK(m.finished == 1);
    CHECK(m.active_sequences == 0);
    CHECK(m.cached_tokens == 12);  // 13 tokens: the page-aligned part is published
    CHECK(m.inserted_tokens == 12);
    CHECK(m.pages_used == 3);      // the partial last page went back to the pool
  }
  check_idle_accounting(engine.get(), kPages, kPs);
  check_ended_accessors(seq.get(), 0);
  seq.reset();

  // Prompt + output is reusable.
  const std::vector<int32_t> full = concat(prompt, {7, 8, 9});
  SeqPtr again = admit(engine.get(), full);
  CHECK(clm_seq_cached_tokens(again.get()) == 12);
  const std::vector<int32_t> again_table = page_table(again.get());
  REQUIRE(again_table.size() == 4);
  CHECK(std::equal(again_table.begin(), again_table.begin() + 3, grown.begin()));
  CHECK(slots(again.get()) == expected_slots(again_table, 12, 13, kPs));
  REQUIRE_OK(clm_seq_abort(again.get()));
  check_ended_accessors(again.get(), 12);
  CHECK(metrics(engine.get()).aborted == 1);
  check_idle_accounting(engine.get(), kPages, kPs);
}

TEST_CASE("cached tokens of a repeated prompt: page-aligned, at most len-1", "[capi][lifecycle]") {
  for (int32_t ps : {1, 4, 16}) {
    constexpr size_t kLen = 40;
    EnginePtr engine = make_engine(256, ps);
    const std::vector<int32_t> cached = tokens_from(1, kLen);
    {
      SeqPtr first = admit(engine.get(), cached);
      REQUIRE_OK(clm_seq_finish(first.get()));
    }
    const int64_t stored = static_cast<int64_t>(kLen) / ps * ps;
    CHECK(metrics(engine.get()).cached_tokens == stored);

    uint64_t queried = kLen, hit = 0;
    for (size_t len = 1; len <= kLen + 5; ++len) {
      // A prefix of the cached prompt (and, past kLen, new tokens after it).
      std::vector<int32_t> prompt = tokens_from(1, len);
      const int64_t expected = std::min<int64_t>(stored, static_cast<int64_t>(len - 1) / ps * ps);
      SeqPtr s = admit(engine.get(), prompt);
      INFO("page_size " << ps << ", prompt length " << len);
      CHECK(clm_seq_cached_tokens(s.get()) == expected);
      const std::vector<int32_t> table = page_table(s.get());
      CHECK(static_cast<int32_t>(table.size()) == pages_for(len, ps));
      CHECK(slots(s.get()) == expected_slots(table, static_cast<size_t>(expected), len, ps));
      REQUIRE_OK(clm_seq_abort(s.get()));  // abort: the cache stays as it was
      queried += len;
      hit += static_cast<uint64_t>(expected);
    }
    const clm_metrics m = metrics(engine.get());
    CHECK(m.tokens_queried == queried);
    CHECK(m.tokens_hit == hit);
    CHECK(m.hit_rate == Approx(static_cast<double>(hit) / static_cast<double>(queried)));
    CHECK(m.admitted == 1 + kLen + 5);
    CHECK(m.finished == 1);
    CHECK(m.aborted == kLen + 5);
    CHECK(m.cached_tokens == stored);
    check_idle_accounting(engine.get(), 256, ps);
  }
}

TEST_CASE("a changed token ends the reuse at its page", "[capi][lifecycle]") {
  EnginePtr engine = make_engine(64, 4);
  const std::vector<int32_t> base = tokens_from(1, 20);
  SeqPtr first = admit(engine.get(), base);
  REQUIRE_OK(clm_seq_finish(first.get()));
  for (size_t changed = 0; changed < 20; ++changed) {
    std::vector<int32_t> prompt = base;
    prompt[changed] = 999;
    SeqPtr s = admit(engine.get(), prompt);
    INFO("token " << changed << " changed");
    CHECK(clm_seq_cached_tokens(s.get()) == static_cast<int32_t>(changed / 4 * 4));
  }
}

TEST_CASE("tenants are isolated by cache salt and adapter", "[capi][lifecycle][salt]") {
  EnginePtr engine = make_engine(128, 4);
  const std::vector<int32_t> prompt = tokens_from(50, 17);
  {
    SeqPtr a = admit_salted(engine.get(), prompt, "tenant-a");
    REQUIRE_OK(clm_seq_finish(a.get()));
  }
  CHECK(clm_seq_cached_tokens(admit_salted(engine.get(), prompt, "tenant-a").get()) == 16);
  CHECK(clm_seq_cached_tokens(admit_salted(engine.get(), prompt, "tenant-b").get()) == 0);
  CHECK(clm_seq_cached_tokens(admit(engine.get(), prompt).get()) == 0);  // no salt is a tenant of its own
  CHECK(clm_seq_cached_tokens(admit_salted(engine.get(), prompt, "tenant-a", 3).get()) == 0);  // other adapter
  CHECK(clm_seq_cached_tokens(admit_salted(engine.get(), prompt, std::string("tenant-a\0x", 10)).get()) == 0);
  CHECK(clm_seq_cached_tokens(admit_salted(engine.get(), prompt, "tenant-").get()) == 0);

  // The salt is bytes [0, len): embedded NULs count, and it is copied at admit.
  {
    std::string salt("t\0z", 3);
    SeqPtr a = admit_salted(engine.get(), prompt, salt);
    salt.assign("xxx");
    REQUIRE_OK(clm_seq_finish(a.get()));
  }
  CHECK(clm_seq_cached_tokens(admit_salted(engine.get(), prompt, std::string("t\0z", 3)).get()) == 16);
  CHECK(clm_seq_cached_tokens(admit_salted(engine.get(), prompt, "t").get()) == 0);

  // A NULL salt with length 0 is "no salt".
  {
    SeqPtr none = admit(engine.get(), prompt);
    REQUIRE_OK(clm_seq_finish(none.get()));
  }
  clm_admit_options o = admit_options();
  o.cache_salt = nullptr;
  o.cache_salt_len = 0;
  CHECK(clm_seq_cached_tokens(admit(engine.get(), prompt, &o).get()) == 16);
  check_idle_accounting(engine.get(), 128, 4);
}

TEST_CASE("two sequences with the same prompt publish once and leak nothing", "[capi][lifecycle]") {
  EnginePtr engine = make_engine(32, 4);
  const std::vector<int32_t> prompt = tokens_from(1, 12);
  SeqPtr a = admit(engine.get(), prompt);
  SeqPtr b = admit(engine.get(), prompt);
  CHECK(metrics(engine.get()).pages_used == 6);
  REQUIRE_OK(clm_seq_finish(a.get()));
  REQUIRE_OK(clm_seq_finish(b.get()));  // b's pages duplicate a's: they go back
  const clm_metrics m = metrics(engine.get());
  CHECK(m.cached_tokens == 12);
  CHECK(m.inserted_tokens == 12);
  CHECK(m.finished == 2);
  check_idle_accounting(engine.get(), 32, 4);
}

TEST_CASE("clm_seq_free aborts a running sequence", "[capi][lifecycle]") {
  EnginePtr engine = make_engine(16, 4);
  SeqPtr s = admit(engine.get(), tokens_from(1, 9));
  CHECK(metrics(engine.get()).pages_used == 3);
  s.reset();
  const clm_metrics m = metrics(engine.get());
  CHECK(m.aborted == 1);
  CHECK(m.finished == 0);
  CHECK(m.cached_tokens == 0);
  check_idle_accounting(engine.get(), 16, 4);
}

TEST_CASE("a full pool evicts unlocked prefixes, never locked ones", "[capi][lifecycle][eviction]") {
  constexpr int32_t kPages = 4, kPs = 4;
  EnginePtr engine = make_engine(kPages, kPs);
  {
    SeqPtr a = admit(engine.get(), tokens_from(1, 8));  // 2 pages, cached at finish
    REQUIRE_OK(clm_seq_finish(a.get()));
  }
  CHECK(metrics(engine.get()).cached_tokens == 8);
  // 16 new tokens need all 4 pages: the cached 2 are evicted.
  {
    SeqPtr b = admit(engine.get(), tokens_from(100, 16));
    const clm_metrics m = metrics(engine.get());
    CHECK(m.evicted_tokens == 8);
    CHECK(m.evictions >= 1);
    CHECK(m.cached_tokens == 0);
    CHECK(m.pages_free == 0);
  }
  // A running sequence's cached prefix is locked: not evictable.
  {
    SeqPtr c = admit(engine.get(), tokens_from(1, 8));
    REQUIRE_OK(clm_seq_finish(c.get()));
  }
  SeqPtr d = admit(engine.get(), tokens_from(1, 9));  // reuses the 8, locks them, 1 new page
  CHECK(clm_seq_cached_tokens(d.get()) == 8);
  clm_seq* e = nullptr;
  const std::vector<int32_t> big = tokens_from(500, 9);  // 3 pages: only 1 free, 0 evictable
  CHECK_STATUS(CLM_ERR_OUT_OF_MEMORY, clm_engine_admit(&e, engine.get(), big.data(), big.size(), nullptr));
  CHECK(e == nullptr);
  CHECK(clm_seq_cached_tokens(d.get()) == 8);
  REQUIRE_OK(clm_seq_abort(d.get()));
  check_idle_accounting(engine.get(), kPages, kPs);
}

TEST_CASE("plan_admission says what admit takes from the pool, and changes nothing", "[capi][lifecycle][plan]") {
  constexpr int32_t kPages = 4, kPs = 4;
  EnginePtr engine = make_engine(kPages, kPs);
  auto plan = [&](const std::vector<int32_t>& t) {
    clm_admission_plan p;
    p.struct_size = sizeof p;
    p.cached_tokens = -1;
    const clm_metrics before = metrics(engine.get());
    REQUIRE_OK(clm_engine_plan_admission(&p, engine.get(), t.data(), t.size(), nullptr));
    const clm_metrics after = metrics(engine.get());
    CHECK(after.tokens_queried == before.tokens_queried);
    CHECK(after.tokens_hit == before.tokens_hit);
    CHECK(after.evictable_tokens == before.evictable_tokens);
    CHECK(p.pages_free == before.pages_free);
    CHECK(p.evictable_tokens == before.evictable_tokens);
    return p;
  };
  {
    SeqPtr a = admit(engine.get(), tokens_from(1, 8));  // 2 pages, cached at finish
    REQUIRE_OK(clm_seq_finish(a.get()));
  }
  // 9 tokens that start with the cached 8: reuses 2 unlocked pages, allocates 1.
  clm_admission_plan p = plan(tokens_from(1, 9));
  CHECK(p.cached_tokens == 8);
  CHECK(p.new_pages == 1);
  CHECK(p.unlocked_pages == 2);
  CHECK(p.pages_free == 2);
  CHECK(p.evictable_tokens == 8);
  SeqPtr d = admit(engine.get(), tokens_from(1, 9));
  CHECK(clm_seq_cached_tokens(d.get()) == p.cached_tokens);
  clm_metrics m = metrics(engine.get());
  CHECK(m.pages_free == 1);
  CHECK(m.evictable_tokens == 0);
  // The same prefix again: its pages are locked by d now, so nothing comes off the evictable.
  p = plan(tokens_from(1, 12));
  CHECK(p.cached_tokens == 8);
  CHECK(p.new_pages == 1);
  CHECK(p.unlocked_pages == 0);
  // 9 new tokens need 3 pages: 1 free, 0 evictable, so admit would fail, as it does.
  p = plan(tokens_from(500, 9));
  CHECK(p.cached_tokens == 0);
  CHECK(p.new_pages + p.unlocked_pages > p.pages_free + p.evictable_tokens / kPs);
  clm_seq* e = nullptr;
  const std::vector<int32_t> big = tokens_from(500, 9);
  CHECK_STATUS(CLM_ERR_OUT_OF_MEMORY, clm_engine_admit(&e, engine.get(), big.data(), big.size(), nullptr));
  // A tenant of its own matches nothing.
  clm_admit_options o = admit_options();
  o.cache_salt = "tenant 2";
  o.cache_salt_len = 8;
  p.struct_size = sizeof p;
  REQUIRE_OK(clm_engine_plan_admission(&p, engine.get(), big.data(), 9, &o));
  CHECK(p.cached_tokens == 0);
  REQUIRE_OK(clm_seq_abort(d.get()));
  check_idle_accounting(engine.get(), kPages, kPs);
}

TEST_CASE("kv_layout describes the host pool and its pages can be written", "[capi][lifecycle][layout]") {
  struct Case {
    int32_t dtype;
    size_t element;
  };
  for (Case c : {Case{CLM_KV_F32, 4}, Case{CLM_KV_F16, 2}, Case{CLM_KV_BF16, 2}}) {
    clm_engine_options o = engine_options(6, 4, CLM_MEMORY_HOST);
    o.num_layers = 3;
    o.kv_heads = 2;
    o.head_dim = 8;
    o.kv_dtype = c.dtype;
    EnginePtr engine = make_engine(o);
    clm_kv_layout l;
    std::memset(&l, 0xAB, sizeof l);
    l.struct_size = sizeof l;
    REQUIRE_OK(clm_engine_kv_layout(&l, engine.get()));
    CHECK(l.struct_size == sizeof l);
    INFO("dtype " << c.dtype);
    REQUIRE(l.base != nullptr);
    CHECK(l.layer_bytes == 2 * size_t{4} * 2 * 8 * c.element);
    CHECK(l.page_bytes == 3 * l.layer_bytes);
    CHECK(l.num_pages == 6);
    CHECK(l.page_size == 4);
    CHECK(l.num_layers == 3);
    CHECK(l.kv_heads == 2);
    CHECK(l.head_dim == 8);
    CHECK(l.kv_dtype == c.dtype);
    CHECK(l.memory == CLM_MEMORY_HOST);
    // The whole pool is addressable (ASan checks the bounds).
    std::memset(l.base, 0x5A, l.page_bytes * static_cast<size_t>(l.num_pages));
    // K and V of one token of every layer, at the slots the engine hands out.
    SeqPtr s = admit(engine.get(), tokens_from(1, 6));
    const size_t block = l.layer_bytes / 2;
    for (int64_t slot : slots(s.get())) {
      const auto page = static_cast<size_t>(slot / l.page_size), row = static_cast<size_t>(slot % l.page_size);
      for (size_t layer = 0; layer < static_cast<size_t>(l.num_layers); ++layer) {
        char* k = static_cast<char*>(l.base) + page * l.page_bytes + layer * l.layer_bytes +
                  row * static_cast<size_t>(l.kv_heads * l.head_dim) * c.element;
        std::memset(k, 1, static_cast<size_t>(l.kv_heads * l.head_dim) * c.element);
        std::memset(k + block, 2, static_cast<size_t>(l.kv_heads * l.head_dim) * c.element);
      }
    }
  }
  // CLM_MEMORY_NONE keeps no bytes.
  EnginePtr none = make_engine(6, 4);
  clm_kv_layout l;
  l.struct_size = sizeof l;
  REQUIRE_OK(clm_engine_kv_layout(&l, none.get()));
  CHECK(l.base == nullptr);
  CHECK(l.memory == CLM_MEMORY_NONE);
  CHECK(l.num_pages == 6);
}

TEST_CASE("every eviction policy and every priority from 0 to 100 work", "[capi][lifecycle][eviction]") {
  for (int32_t policy : {CLM_EVICT_LRU, CLM_EVICT_LFU, CLM_EVICT_SLRU, CLM_EVICT_PRIORITY, CLM_EVICT_GHOST_SLRU}) {
    clm_engine_options o = engine_options(8, 2);
    o.eviction_policy = policy;
    o.slru_protected_fraction = 0.5;
    EnginePtr engine = make_engine(o);
    for (int32_t priority : {0, 1, 50, 100}) {
      clm_admit_options a = admit_options();
      a.priority = priority;
      const std::vector<int32_t> prompt = tokens_from(priority * 10, 5);  // 3 pages: forces eviction
      SeqPtr s = admit(engine.get(), prompt, &a);
      REQUIRE_OK(clm_seq_finish(s.get()));
    }
    INFO("policy " << policy);
    CHECK(metrics(engine.get()).finished == 4);
    check_idle_accounting(engine.get(), 8, 2);
  }
}

// A conversation admitted at priority 1 (its next turn expected), then at 0
// (that turn came). With CLM_PRIORITY_RAISE its first turn keeps 1 and
// outlives a newer prompt; with CLM_PRIORITY_SET the second admission drops it
// to 0, and it goes first. A V1-sized struct (no priority_update) raises.
TEST_CASE("priority_update: raise keeps the highest priority, set the latest", "[capi][lifecycle][eviction]") {
  constexpr size_t kV1 = offsetof(clm_admit_options, priority) + sizeof(int32_t);
  for (const int32_t update : {CLM_PRIORITY_RAISE, CLM_PRIORITY_SET, -1}) {  // -1: a V1 caller
    INFO("priority_update " << update);
    clm_engine_options eo = engine_options(8, 4);
    eo.eviction_policy = CLM_EVICT_PRIORITY;
    EnginePtr engine = make_engine(eo);
    auto run = [&](const std::vector<int32_t>& prompt, int32_t priority) {
      clm_admit_options a = admit_options();
      a.priority = priority;
      if (update >= 0) {
        a.priority_update = update;
      } else {
        a.struct_size = static_cast<uint32_t>(kV1);
        a.priority_update = 0x7ead;  // past a V1 struct: never read
      }
      SeqPtr s = admit(engine.get(), prompt, &a);
      REQUIRE_OK(clm_seq_finish(s.get()));
    };
    auto cached = [&](std::vector<int32_t> prompt) {
      prompt.push_back(9999);
      clm_admission_plan p;
      p.struct_size = sizeof p;
      REQUIRE_OK(clm_engine_plan_admission(&p, engine.get(), prompt.data(), prompt.size(), nullptr));
      return p.cached_tokens;
    };
    const std::vector<int32_t> first_turn = tokens_from(0, 8), older = tokens_from(100, 8), newer = tokens_from(200, 8);
    std::vector<int32_t> second_turn = first_turn;
    for (int32_t t : tokens_from(50, 8)) second_turn.push_back(t);
    run(first_turn, 1);
    run(older, 0);
    run(second_turn, 0);
    run(newer, 0);
    CHECK(metrics(engine.get()).pages_free == 0);
    SeqPtr probe = admit(engine.get(), tokens_from(300, 24));  // 6 pages: evicts three 2-page leaves
    const bool set = update == CLM_PRIORITY_SET;
    CHECK(cached(older) == 0);
    CHECK(cached(second_turn) == (set ? 0 : 8));  // its own tail went; set: its first turn too
    CHECK(cached(first_turn) == (set ? 0 : 8));
    CHECK(cached(newer) == (set ? 8 : 0));
    REQUIRE_OK(clm_seq_abort(probe.get()));
  }
}

TEST_CASE("metrics count what the host did", "[capi][metrics]") {
  constexpr int32_t kPages = 32, kPs = 4;
  EnginePtr engine = make_engine(kPages, kPs);
  clm_metrics m0 = metrics(engine.get());
  CHECK(m0.struct_size == sizeof(clm_metrics));
  CHECK(m0.admitted == 0);
  CHECK(m0.pages_used == 0);
  CHECK(m0.pages_free == kPages);
  CHECK(m0.hit_rate == 0.0);
  CHECK(m0.metadata_bytes > 0);

  const std::vector<int32_t> p = tokens_from(1, 10);
  SeqPtr a = admit(engine.get(), p);   // queried 10, hit 0
  REQUIRE_OK(clm_seq_finish(a.get()));  // inserts 8
  SeqPtr b = admit(engine.get(), p);   // queried 10, hit 8
  SeqPtr c = admit(engine.get(), tokens_from(1000, 5));  // queried 5
  REQUIRE_OK(clm_seq_abort(c.get()));
  clm_seq* rejected = nullptr;
  const std::vector<int32_t> too_big = tokens_from(2000, 200);  // 50 pages > 32
  REQUIRE(clm_engine_admit(&rejected, engine.get(), too_big.data(), too_big.size(), nullptr) ==
          CLM_ERR_OUT_OF_MEMORY);  // queried 200, rejected
  const std::vector<int32_t> bad = {1, -1};
  REQUIRE(clm_engine_admit(&rejected, engine.get(), bad.data(), bad.size(), nullptr) == CLM_ERR_INVALID_ARGUMENT);

  const clm_metrics m = metrics(engine.get());
  CHECK(m.admitted == 3);
  CHECK(m.finished == 1);
  CHECK(m.aborted == 1);
  CHECK(m.rejected == 1);
  CHECK(m.active_sequences == 1);
  CHECK(m.tokens_queried == 10 + 10 + 5 + 200);
  CHECK(m.tokens_hit == 8);
  CHECK(m.hit_rate == Approx(8.0 / 225.0));
  CHECK(m.inserted_tokens == 8);
  CHECK(m.cached_tokens == 8);
  CHECK(m.protected_tokens == 8);  // b locks them
  CHECK(m.evictable_tokens == 0);
  CHECK(m.pages_used == 3);        // 2 cached + b's third page
  CHECK(m.pages_used + m.pages_free == kPages);
  CHECK(m.evictions == 0);
  CHECK(m.evicted_tokens == 0);

  // Only struct_size bytes are written.
  struct {
    clm_metrics m;
    unsigned char after[8];
  } padded;
  std::memset(&padded, 0xCD, sizeof padded);
  padded.m.struct_size = sizeof(clm_metrics);
  REQUIRE_OK(clm_engine_metrics(&padded.m, engine.get()));
  for (unsigned char byte : padded.after) CHECK(byte == 0xCD);
  CHECK(padded.m.admitted == 3);
}

TEST_CASE("batch_page_table gives FlashInfer CSR arrays", "[capi][batch]") {
  constexpr int32_t kPs = 4;
  EnginePtr engine = make_engine(64, kPs);
  // Prompts of 1, 4, 5, 8, 13 tokens, then decode steps: 1, 4, 5+3, 8+1, 13+2 tokens,
  // whose last pages hold 1, 4 (full), 4 (filled by decoding), 1 (a new page) and 3 rows.
  std::vector<SeqPtr> owned;
  std::vector<size_t> lengths;
  for (size_t len : {size_t{1}, size_t{4}, size_t{5}, size_t{8}, size_t{13}}) {
    owned.push_back(admit(engine.get(), tokens_from(static_cast<int32_t>(len) * 100, len)));
    lengths.push_back(len);
  }
  const std::vector<int32_t> decode = {3};
  REQUIRE_OK(clm_seq_extend(owned[3].get(), decode.data(), decode.size()));
  lengths[3] += 1;
  const std::vector<int32_t> decode3 = {4, 5, 6};
  REQUIRE_OK(clm_seq_extend(owned[2].get(), decode3.data(), decode3.size()));
  lengths[2] += 3;
  const std::vector<int32_t> decode2 = {7, 8};
  REQUIRE_OK(clm_seq_extend(owned[4].get(), decode2.data(), decode2.size()));
  lengths[4] += 2;

  std::vector<clm_seq*> seqs;
  for (auto& s : owned) seqs.push_back(s.get());
  const size_t n = seqs.size();
  std::vector<int32_t> indptr(n + 1, -7), last(n, -7), indices(64, -7);
  size_t n_indices = 999;
  REQUIRE_OK(clm_engine_batch_page_table(indptr.data(), indices.data(), indices.size(), &n_indices, last.data(),
                                         engine.get(), seqs.data(), n));
  CHECK(indptr[0] == 0);
  CHECK(static_cast<size_t>(indptr[n]) == n_indices);
  for (size_t i = 0; i < n; ++i) {
    INFO("sequence " << i << " of length " << lengths[i]);
    const std::vector<int32_t> table = page_table(seqs[i]);
    CHECK(static_cast<int32_t>(table.size()) == pages_for(lengths[i], kPs));
    REQUIRE(indptr[i + 1] - indptr[i] == static_cast<int32_t>(table.size()));
    CHECK(std::equal(table.begin(), table.end(), indices.begin() + indptr[i]));
    CHECK(last[i] >= 1);
    CHECK(last[i] <= kPs);
    CHECK(last[i] == static_cast<int32_t>(lengths[i]) - (static_cast<int32_t>(table.size()) - 1) * kPs);
  }
  CHECK(last == std::vector<int32_t>{1, 4, 4, 1, 3});
  for (size_t k = n_indices; k < indices.size(); ++k) CHECK(indices[k] == -7);  // nothing past n_indices

  SECTION("a sequence named twice is refused, and nothing is written") {
    std::vector<clm_seq*> twice = {seqs[4], seqs[1], seqs[4]};
    std::vector<int32_t> ip(4, -7), lp(3, -7), ix(16, -7);
    size_t ni = 999;
    CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT, clm_engine_batch_page_table(ip.data(), ix.data(), ix.size(), &ni, lp.data(),
                                                                       engine.get(), twice.data(), twice.size()));
    CHECK(std::string(clm_last_error()).find("more than once") != std::string::npos);
    CHECK(ip == std::vector<int32_t>(4, -7));
    CHECK(lp == std::vector<int32_t>(3, -7));
    CHECK(ix == std::vector<int32_t>(16, -7));
  }
  SECTION("an empty batch") {
    int32_t ip[1] = {-7};
    size_t ni = 999;
    REQUIRE_OK(clm_engine_batch_page_table(ip, nullptr, 0, &ni, nullptr, engine.get(), nullptr, 0));
    CHECK(ip[0] == 0);
    CHECK(ni == 0);
  }
  SECTION("too small an indices buffer: an error, n_indices says the size, indices untouched") {
    const size_t needed = n_indices;
    for (size_t capacity : {size_t{0}, needed / 2, needed - 1}) {
      std::vector<int32_t> ix(needed + 4, -7);
      size_t ni = 0;
      INFO("capacity " << capacity);
      CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT,
                   clm_engine_batch_page_table(indptr.data(), ix.data(), capacity, &ni, last.data(), engine.get(),
                                               seqs.data(), n));
      CHECK(ni == needed);
      CHECK(std::all_of(ix.begin(), ix.end(), [](int32_t v) { return v == -7; }));
    }
    // Sizing call: indices NULL, capacity 0.
    size_t ni = 0;
    CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT, clm_engine_batch_page_table(indptr.data(), nullptr, 0, &ni, last.data(),
                                                                       engine.get(), seqs.data(), n));
    CHECK(ni == needed);
    // Exactly enough is enough.
    std::vector<int32_t> exact(needed);
    REQUIRE_OK(clm_engine_batch_page_table(indptr.data(), exact.data(), exact.size(), &ni, last.data(),
                                           engine.get(), seqs.data(), n));
    CHECK(std::equal(exact.begin(), exact.end(), indices.begin()));
  }
}

TEST_CASE("an engine serves many threads at once", "[capi][threads]") {
  constexpr int32_t kPages = 256, kPs = 4;
  constexpr int kThreads = 4, kRequests = 150;
  EnginePtr engine = make_engine(kPages, kPs);
  const std::vector<int32_t> system = tokens_from(1, 32);
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int r = 0; r < kRequests; ++r) {
        // A shared system prompt, then a tail shared by every 3rd request of this thread.
        std::vector<int32_t> prompt = concat(system, tokens_from(10000 * (t + 1) + 100 * (r % 3), 9));
        clm_seq* s = nullptr;
        if (clm_engine_admit(&s, engine.get(), prompt.data(), prompt.size(), nullptr) != CLM_OK) {
          ++failures;
          continue;
        }
        size_t n = 0;
        const int64_t* sl = clm_seq_slots(s, &n);
        if (n != prompt.size() - static_cast<size_t>(clm_seq_cached_tokens(s)) || (n > 0 && sl == nullptr)) ++failures;
        const int32_t out[2] = {r, t};
        if (clm_seq_extend(s, out, 2) != CLM_OK) ++failures;
        if ((r % 4 == 3 ? clm_seq_abort(s) : clm_seq_finish(s)) != CLM_OK) ++failures;
        clm_seq_free(s);
        if (r % 10 == 0) {
          clm_metrics m;
          m.struct_size = sizeof m;
          if (clm_engine_metrics(&m, engine.get()) != CLM_OK) ++failures;
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  CHECK(failures == 0);
  const clm_metrics m = metrics(engine.get());
  CHECK(m.admitted == uint64_t{kThreads} * kRequests);
  CHECK(m.finished + m.aborted == m.admitted);
  CHECK(m.tokens_hit > 0);
  check_idle_accounting(engine.get(), kPages, kPs);
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
// Bad input: struct sizes this library does not know
// =============================================================================

namespace {
// A caller's struct that may be bigger than ours, to see that nothing is written.
template <class Struct>
struct Oversized {
  alignas(Struct) unsigned char bytes[sizeof(Struct) + 8];
  Oversized() { std::memset(bytes, 0xAB, sizeof bytes); }
  Struct* get() { return reinterpret_cast<Struct*>(bytes); }
  bool untouched() const {
    return std::all_of(std::begin(bytes), std::end(bytes), [](unsigned char b) { return b == 0xAB; });
  }
};
}  // namespace

TEST_CASE("unknown struct_size: engine_options_init", "[capi][bad][struct_size]") {
  for (size_t size : {size_t{0}, size_t{1}, sizeof(clm_engine_options) + 8}) {
    Oversized<clm_engine_options> o;
    INFO("struct_size " << size);
    CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT, clm_engine_options_init(o.get(), size));
    CHECK(o.untouched());
  }
}

TEST_CASE("unknown struct_size: admit_options_init", "[capi][bad][struct_size]") {
  for (size_t size : {size_t{0}, size_t{1}, sizeof(clm_admit_options) + 8}) {
    Oversized<clm_admit_options> o;
    INFO("struct_size " << size);
    CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT, clm_admit_options_init(o.get(), size));
    CHECK(o.untouched());
  }
}

TEST_CASE("unknown struct_size: engine_create", "[capi][bad][struct_size]") {
  for (size_t size : {size_t{0}, size_t{1}, sizeof(clm_engine_options) + 8}) {
    clm_engine_options o = engine_options(4, 4);
    o.struct_size = static_cast<uint32_t>(size);
    clm_engine* e = reinterpret_cast<clm_engine*>(uintptr_t{0x1});
    INFO("struct_size " << size);
    CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT, clm_engine_create(&e, &o));
    CHECK(e == nullptr);
  }
}

TEST_CASE("unknown struct_size: engine_admit", "[capi][bad][struct_size]") {
  EnginePtr engine = make_engine(4, 4);
  const std::vector<int32_t> t = {1, 2, 3};
  for (size_t size : {size_t{0}, size_t{1}, sizeof(clm_admit_options) + 8}) {
    clm_admit_options o = admit_options();
    o.struct_size = static_cast<uint32_t>(size);
    clm_seq* s = reinterpret_cast<clm_seq*>(uintptr_t{0x1});
    INFO("struct_size " << size);
    CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT, clm_engine_admit(&s, engine.get(), t.data(), t.size(), &o));
    CHECK(s == nullptr);
  }
  const clm_metrics m = metrics(engine.get());
  CHECK(m.admitted == 0);
  CHECK(m.active_sequences == 0);
  CHECK(m.pages_used == 0);
}

TEST_CASE("unknown struct_size: engine_metrics", "[capi][bad][struct_size]") {
  EnginePtr engine = make_engine(4, 4);
  for (size_t size : {size_t{0}, size_t{1}, sizeof(clm_metrics) + 8}) {
    Oversized<clm_metrics> m;
    const auto struct_size = static_cast<uint32_t>(size);
    std::memcpy(m.bytes, &struct_size, sizeof struct_size);
    INFO("struct_size " << size);
    CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT, clm_engine_metrics(m.get(), engine.get()));
    CHECK(std::all_of(m.bytes + sizeof struct_size, m.bytes + sizeof m.bytes,
                      [](unsigned char b) { return b == 0xAB; }));
  }
}

TEST_CASE("unknown struct_size: engine_kv_layout", "[capi][bad][struct_size]") {
  EnginePtr engine = make_engine(4, 4);
  for (size_t size : {size_t{0}, size_t{1}, sizeof(clm_kv_layout) + 8}) {
    Oversized<clm_kv_layout> l;
    const auto struct_size = static_cast<uint32_t>(size);
    std::memcpy(l.bytes, &struct_size, sizeof struct_size);
    INFO("struct_size " << size);
    CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT, clm_engine_kv_layout(l.get(), engine.get()));
    CHECK(std::all_of(l.bytes + sizeof struct_size, l.bytes + sizeof l.bytes,
                      [](unsigned char b) { return b == 0xAB; }));
  }
  // Only struct_size bytes are written.
  Oversized<clm_kv_layout> l;
  const auto struct_size = static_cast<uint32_t>(sizeof(clm_kv_layout));
  std::memcpy(l.bytes, &struct_size, sizeof struct_size);
  REQUIRE_OK(clm_engine_kv_layout(l.get(), engine.get()));
  CHECK(std::all_of(l.bytes + sizeof(clm_kv_layout), l.bytes + sizeof l.bytes,
                    [](unsigned char b) { return b == 0xAB; }));
  CHECK(l.get()->num_pages == 4);
}

namespace {
// The sizes a caller of a published version passes: each version's last
// field's end, and that rounded up to the struct's alignment (its sizeof).
template <class Struct>
std::set<size_t> published_sizes(std::initializer_list<size_t> ends) {
  std::set<size_t> sizes;
  for (size_t end : ends) {
    sizes.insert(end);
    sizes.insert((end + alignof(Struct) - 1) / alignof(Struct) * alignof(Struct));
  }
  sizes.insert(sizeof(Struct));
  return sizes;
}
}  // namespace

TEST_CASE("struct_size: only the sizes of published versions, never one that cuts a field",
          "[capi][bad][struct_size]") {
  const std::set<size_t> options_sizes =
      published_sizes<clm_engine_options>({offsetof(clm_engine_options, slru_protected_fraction) + sizeof(double),
                                           offsetof(clm_engine_options, n_special_token_ids) + sizeof(size_t),
                                           offsetof(clm_engine_options, snapshot_lookup_timeout_us) + sizeof(int32_t)});
  const std::set<size_t> metrics_sizes =
      published_sizes<clm_metrics>({offsetof(clm_metrics, metadata_bytes) + sizeof(uint64_t),
                                    offsetof(clm_metrics, src_injections) + sizeof(uint64_t),
                                    offsetof(clm_metrics, has_snapshot_store) + sizeof(int32_t)});
  const std::set<size_t> layout_sizes =
      published_sizes<clm_kv_layout>({offsetof(clm_kv_layout, memory) + sizeof(int32_t)});
  const std::set<size_t> admit_sizes =
      published_sizes<clm_admit_options>({offsetof(clm_admit_options, priority) + sizeof(int32_t)});
  const std::set<size_t> plan_sizes =
      published_sizes<clm_admission_plan>({offsetof(clm_admission_plan, evictable_tokens) + sizeof(int64_t)});
  const std::set<size_t> adapter_sizes =
      published_sizes<clm_adapter_options>({offsetof(clm_adapter_options, residual_scale) + sizeof(float)});
  const std::set<size_t> params_sizes =
      published_sizes<clm_attention_params>({offsetof(clm_attention_params, stream) + sizeof(void*)});
  CHECK(options_sizes.count(sizeof(clm_engine_options) - 4) == 0);  // odd sizes exist between versions

  EnginePtr engine = make_engine(4, 4);
  for (size_t size = 0; size <= sizeof(clm_engine_options) + 8; ++size) {
    INFO("clm_engine_options of " << size << " bytes");
    const bool known = options_sizes.count(size) == 1;
    Oversized<clm_engine_options> o;
    CHECK(clm_engine_options_init(o.get(), size) == (known ? CLM_OK : CLM_ERR_INVALID_ARGUMENT));
    if (!known) CHECK(o.untouched());
    clm_engine_options full = engine_options(4, 4);
    full.struct_size = static_cast<uint32_t>(size);
    clm_engine* e = nullptr;
    CHECK(clm_engine_create(&e, &full) == (known ? CLM_OK : CLM_ERR_INVALID_ARGUMENT));
    CHECK((e != nullptr) == known);
    clm_engine_free(e);
  }
  for (size_t size = 0; size <= sizeof(clm_metrics) + 8; ++size) {
    INFO("clm_metrics of " << size << " bytes");
    const bool known = metrics_sizes.count(size) == 1;
    Oversized<clm_metrics> m;
    const auto struct_size = static_cast<uint32_t>(size);
    std::memcpy(m.bytes, &struct_size, sizeof struct_size);
    CHECK(clm_engine_metrics(m.get(), engine.get()) == (known ? CLM_OK : CLM_ERR_INVALID_ARGUMENT));
    const size_t written = known ? size : sizeof struct_size;
    CHECK(std::all_of(m.bytes + written, m.bytes + sizeof m.bytes, [](unsigned char b) { return b == 0xAB; }));
  }
  for (size_t size = 0; size <= sizeof(clm_kv_layout) + 8; ++size) {
    INFO("clm_kv_layout of " << size << " bytes");
    const bool known = layout_sizes.count(size) == 1;
    Oversized<clm_kv_layout> l;
    const auto struct_size = static_cast<uint32_t>(size);
    std::memcpy(l.bytes, &struct_size, sizeof struct_size);
    CHECK(clm_engine_kv_layout(l.get(), engine.get()) == (known ? CLM_OK : CLM_ERR_INVALID_ARGUMENT));
    const size_t written = known ? size : sizeof struct_size;
    CHECK(std::all_of(l.bytes + written, l.bytes + sizeof l.bytes, [](unsigned char b) { return b == 0xAB; }));
  }
  const std::vector<int32_t> prompt = {1, 2, 3, 4, 5};
  for (size_t size = 0; size <= sizeof(clm_admission_plan) + 8; ++size) {
    INFO("clm_admission_plan of " << size << " bytes");
    const bool known = plan_sizes.count(size) == 1;
    Oversized<clm_admission_plan> p;
    const auto struct_size = static_cast<uint32_t>(size);
    std::memcpy(p.bytes, &struct_size, sizeof struct_size);
    CHECK(clm_engine_plan_admission(p.get(), engine.get(), prompt.data(), prompt.size(), nullptr) ==
          (known ? CLM_OK : CLM_ERR_INVALID_ARGUMENT));
    const size_t written = known ? size : sizeof struct_size;
    CHECK(std::all_of(p.bytes + written, p.bytes + sizeof p.bytes, [](unsigned char b) { return b == 0xAB; }));
  }
  for (size_t size = 0; size <= sizeof(clm_admit_options) + 8; ++size) {
    INFO("clm_admit_options of " << size << " bytes");
    Oversized<clm_admit_options> o;
    const bool known = admit_sizes.count(size) == 1;
    CHECK(clm_admit_options_init(o.get(), size) == (known ? CLM_OK : CLM_ERR_INVALID_ARGUMENT));
    if (!known) CHECK(o.untouched());
  }
  for (size_t size = 0; size <= sizeof(clm_adapter_options) + 8; ++size) {
    INFO("clm_adapter_options of " << size << " bytes");
    Oversized<clm_adapter_options> o;
    const bool known = adapter_sizes.count(size) == 1;
    CHECK(clm_adapter_options_init(o.get(), size) == (known ? CLM_OK : CLM_ERR_INVALID_ARGUMENT));
    if (!known) CHECK(o.untouched());
  }
  for (size_t size = 0; size <= sizeof(clm_attention_params) + 8; ++size) {
    INFO("clm_attention_params of " << size << " bytes");
    Oversized<clm_attention_params> o;
    const bool known = params_sizes.count(size) == 1;
    CHECK(clm_attention_params_init(o.get(), size) == (known ? CLM_OK : CLM_ERR_INVALID_ARGUMENT));
    if (!known) CHECK(o.untouched());
  }
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
    CHECK(clm_seq_cached_tokens(s) == 0);
    // An ended sequence has no pages: its accessors answer NULL and 0.
    size_t n = 77;
    CHECK(clm_seq_page_table(s, &n) == nullptr);
    CHECK(n == 0);
    n = 77;
    CHECK(clm_seq_slots(s, &n) == nullptr);
    CHECK(n == 0);
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
  CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT,
               clm_engine_batch_page_table(indptr, indices, 4, &n, last, a.get(), seqs, 2));
  CHECK(std::string(clm_last_error()).find("another engine") != std::string::npos);
  CHECK(std::all_of(std::begin(indices), std::end(indices), [](int32_t v) { return v == -7; }));
  // Each engine's own sequence alone is fine.
  REQUIRE_OK(clm_engine_batch_page_table(indptr, indices, 4, &n, last, b.get(), seqs + 1, 1));
  CHECK(n == 1);
}

// =============================================================================
// Bad input: options
// =============================================================================

TEST_CASE("unknown enum values in engine options", "[capi][bad][options]") {
  struct Case {
    const char* field;
    int32_t clm_engine_options::*member;
    std::vector<int32_t> values;
  };
  const int32_t lo = std::numeric_limits<int32_t>::min(), hi = std::numeric_limits<int32_t>::max();
  const Case cases[] = {
      {"kv_dtype", &clm_engine_options::kv_dtype, {-1, 3, lo, hi}},
      {"memory", &clm_engine_options::memory, {-1, 3, lo, hi}},
      {"eviction_policy", &clm_engine_options::eviction_policy, {-1, 5, 6, lo, hi}},
  };
  for (const Case& c : cases) {
    for (int32_t v : c.values) {
      clm_engine_options o = engine_options(4, 4, CLM_MEMORY_HOST);
      o.*c.member = v;
      clm_engine* e = reinterpret_cast<clm_engine*>(uintptr_t{0x1});
      INFO(c.field << " = " << v);
      CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT, clm_engine_create(&e, &o));
      CHECK(e == nullptr);
      CHECK(std::string(clm_last_error()).find(c.field) != std::string::npos);
    }
  }
}

TEST_CASE("eviction_policy 5 (belady) is refused with a pointer to the replay tool", "[capi][bad][options]") {
  clm_engine_options o = engine_options(4, 4, CLM_MEMORY_HOST);
  o.eviction_policy = 5;
  clm_engine* e = reinterpret_cast<clm_engine*>(uintptr_t{0x1});
  CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT, clm_engine_create(&e, &o));
  CHECK(e == nullptr);
  const std::string message = clm_last_error();
  CHECK(message.find("belady") != std::string::npos);
  CHECK(message.find("replay") != std::string::npos);
}

TEST_CASE("out-of-range sizes in engine options", "[capi][bad][options]") {
  struct Case {
    const char* field;
    int32_t clm_engine_options::*member;
  };
  const Case cases[] = {{"num_pages", &clm_engine_options::num_pages},   {"page_size", &clm_engine_options::page_size},
                        {"num_layers", &clm_engine_options::num_layers}, {"kv_heads", &clm_engine_options::kv_heads},
                        {"head_dim", &clm_engine_options::head_dim}};
  for (const Case& c : cases) {
    std::vector<int32_t> bad = {0, -1, std::numeric_limits<int32_t>::min()};
    if (c.member != &clm_engine_options::num_pages) bad.push_back(std::numeric_limits<int32_t>::max());
    for (int32_t v : bad) {
      clm_engine_options o = engine_options(4, 4, CLM_MEMORY_HOST);
      o.*c.member = v;
      clm_engine* e = reinterpret_cast<clm_engine*>(uintptr_t{0x1});
      INFO(c.field << " = " << v);
      CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT, clm_engine_create(&e, &o));
      CHECK(e == nullptr);
    }
  }
  for (double f : {-0.1, 1.5, std::nan(""), std::numeric_limits<double>::infinity()}) {
    clm_engine_options o = engine_options(4, 4);
    o.eviction_policy = CLM_EVICT_SLRU;
    o.slru_protected_fraction = f;
    clm_engine* e = nullptr;
    INFO("slru_protected_fraction = " << f);
    CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT, clm_engine_create(&e, &o));
    CHECK(e == nullptr);
  }
  // A host pool whose byte size overflows size_t.
  clm_engine_options o = engine_options(std::numeric_limits<int32_t>::max(), 1 << 20, CLM_MEMORY_HOST);
  o.num_layers = 1 << 20;
  o.kv_heads = 1 << 20;
  o.head_dim = 1 << 20;
  clm_engine* e = nullptr;
  CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT, clm_engine_create(&e, &o));
  CHECK(e == nullptr);
}

TEST_CASE("priority outside 0 to 100, or a priority_update that is neither raise nor set", "[capi][bad][options]") {
  clm_engine_options eo = engine_options(8, 4);
  eo.eviction_policy = CLM_EVICT_PRIORITY;
  EnginePtr engine = make_engine(eo);
  const std::vector<int32_t> t = {1, 2, 3};
  for (int32_t p : {-1, 101, std::numeric_limits<int32_t>::min(), std::numeric_limits<int32_t>::max()}) {
    clm_admit_options o = admit_options();
    o.priority = p;
    clm_seq* s = reinterpret_cast<clm_seq*>(uintptr_t{0x1});
    INFO("priority " << p);
    CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT, clm_engine_admit(&s, engine.get(), t.data(), t.size(), &o));
    CHECK(s == nullptr);
  }
  for (int32_t u : {-1, 2, std::numeric_limits<int32_t>::max()}) {
    clm_admit_options o = admit_options();
    o.priority = 1;
    o.priority_update = u;
    clm_seq* s = reinterpret_cast<clm_seq*>(uintptr_t{0x1});
    INFO("priority_update " << u);
    CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT, clm_engine_admit(&s, engine.get(), t.data(), t.size(), &o));
    CHECK(std::string(clm_last_error()).find("priority_update") != std::string::npos);
    CHECK(s == nullptr);
  }
  const clm_metrics m = metrics(engine.get());
  CHECK(m.admitted == 0);
  CHECK(m.pages_used == 0);
  CHECK(m.tokens_queried == 0);
}

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
