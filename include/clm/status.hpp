// clm/status.hpp: the error type of every fallible clmcache call.
//
// A Status carries a code and, when not ok, a message. Nothing in clmcache
// reports an error only by throwing: the C ABI copies the code and message out
// as they are. Codes are negative, and equal the clm_status values of clm.h.
//
//   clm::Status s = pool.allocate(n, pages);
//   if (!s.ok()) fmt::print(stderr, "{}: {}\n", s.code_name(), s.message());
#pragma once

#include <string>
#include <utility>

namespace clm {

enum class StatusCode : int {
  ok = 0,
  invalid_argument = -1,     // the caller passed something malformed
  out_of_memory = -2,        // the pool (or the host) has no room, even after eviction
  not_found = -3,            // a handle or key that does not exist (or no longer does)
  failed_precondition = -4,  // the call is valid, but not in the object's current state
  unsupported = -5,          // not available in this build or on this machine
  internal = -6,             // a broken invariant: a bug in clmcache
  io_error = -7,             // a file, socket or database call failed
};

inline const char* status_code_name(StatusCode code) {
  switch (code) {
    case StatusCode::ok:
      return "ok";
    case StatusCode::invalid_argument:
      return "invalid_argument";
    case StatusCode::out_of_memory:
      return "out_of_memory";
    case StatusCode::not_found:
      return "not_found";
    case StatusCode::failed_precondition:
      return "failed_precondition";
    case StatusCode::unsupported:
      return "unsupported";
    case StatusCode::internal:
      return "internal";
    case StatusCode::io_error:
      return "io_error";
  }
  return "unknown";
}

class [[nodiscard]] Status {
 public:
  Status() = default;  // ok
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status success() { return {}; }
  bool ok() const { return code_ == StatusCode::ok; }
  StatusCode code() const { return code_; }
  const char* code_name() const { return status_code_name(code_); }
  const std::string& message() const { return message_; }

 private:
  StatusCode code_ = StatusCode::ok;
  std::string message_;  // empty when ok: the ok path never allocates
};

inline Status invalid_argument(std::string message) { return {StatusCode::invalid_argument, std::move(message)}; }
inline Status out_of_memory(std::string message) { return {StatusCode::out_of_memory, std::move(message)}; }
inline Status not_found(std::string message) { return {StatusCode::not_found, std::move(message)}; }
inline Status failed_precondition(std::string message) { return {StatusCode::failed_precondition, std::move(message)}; }
inline Status unsupported(std::string message) { return {StatusCode::unsupported, std::move(message)}; }
inline Status io_error(std::string message) { return {StatusCode::io_error, std::move(message)}; }

}  // namespace clm

// Returns early from the enclosing function when `expr` is not ok.
#define CLM_RETURN_IF_ERROR(expr)              \
  do {                                         \
    ::clm::Status clm_status_ = (expr);        \
    if (!clm_status_.ok()) return clm_status_; \
  } while (0)
