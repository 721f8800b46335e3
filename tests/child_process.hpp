// tests/child_process.hpp: a forked child for the tests that need a second
// process: one the test kills with SIGKILL at a moment it picks (the crash
// tests), or one that must exit 0 by itself (a writer under a file-size limit,
// a second engine on one redis-server). The child reports on a pipe.
//
//   clm_test::ChildProcess child([&](int report_fd) {
//     ...                              // write progress records to report_fd
//     return 0;                        // the child's exit code
//   });
//   std::int32_t step = 0;
//   REQUIRE(child.read(step));         // waits for its first record
//   child.kill();                      // SIGKILL; REQUIREs that the signal ended it
//   while (child.read(step)) {}        // the whole records it sent before
//
// The child ends with _exit, so no atexit handler and no destructor of the
// parent's objects runs in it; an exception out of the body (a failed REQUIRE)
// ends it with code 99. A child still running when the object goes is killed
// and reaped, so a failed REQUIRE in the parent leaves no process behind.
#pragma once

#include <signal.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstdio>
#include <type_traits>

#include <catch2/catch.hpp>

namespace clm_test {

class ChildProcess {
 public:
  static constexpr int kThrew = 99;  // the exit code of a body that threw

  // Forks; the child runs body(write end of the pipe) and exits with what it
  // returns (an int), or 0 when it returns nothing.
  template <class Body>
  explicit ChildProcess(Body&& body) {
    int fds[2];
    REQUIRE(::pipe(fds) == 0);
    std::fflush(nullptr);  // what stdio holds would otherwise be written by both
    pid_ = ::fork();
    REQUIRE(pid_ >= 0);
    if (pid_ == 0) {
      ::close(fds[0]);
      int code = kThrew;
      try {
        if constexpr (std::is_void_v<decltype(body(fds[1]))>) {
          body(fds[1]);
          code = 0;
        } else {
          code = body(fds[1]);
        }
      } catch (...) {
      }
      ::_exit(code);
    }
    ::close(fds[1]);
    fd_ = fds[0];
  }
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;
  ~ChildProcess() {
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      int ignored = 0;
      ::waitpid(pid_, &ignored, 0);
    }
    if (fd_ >= 0) ::close(fd_);
  }

  // One whole record the child wrote; false at the end of the pipe, or when
  // the child died in the middle of the record.
  template <class T>
  bool read(T& record) {
    return read_bytes(&record, sizeof record);
  }
  bool read_bytes(void* out, std::size_t n) {
    auto* at = static_cast<char*>(out);
    for (std::size_t got = 0; got < n;) {
      const ssize_t r = ::read(fd_, at + got, n - got);
      if (r < 0 && errno == EINTR) continue;
      if (r <= 0) return false;
      got += static_cast<std::size_t>(r);
    }
    return true;
  }

  // SIGKILL, then REQUIREs that the signal, not the child itself, ended it.
  void kill() {
    REQUIRE(pid_ > 0);  // once reaped, never signal: kill(-1) would reach every process we may signal
    REQUIRE(::kill(pid_, SIGKILL) == 0);
    const int status = reap();
    if (!WIFSIGNALED(status)) FAIL("the child exited by itself with status " << WEXITSTATUS(status));
  }

  // Waits for the child to exit by itself and returns its exit code
  // (REQUIREs that no signal ended it).
  int exit_code() {
    const int status = reap();
    INFO("the child was ended by signal " << (WIFSIGNALED(status) ? WTERMSIG(status) : 0));
    REQUIRE(WIFEXITED(status));
    return WEXITSTATUS(status);
  }

 private:
  int reap() {
    REQUIRE(pid_ > 0);  // a child is reaped once
    int status = 0;
    REQUIRE(::waitpid(pid_, &status, 0) == pid_);
    pid_ = -1;
    return status;
  }

  pid_t pid_ = -1;
  int fd_ = -1;
};

}  // namespace clm_test
