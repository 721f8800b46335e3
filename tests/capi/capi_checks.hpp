// tests/capi/capi_checks.hpp: what the C ABI tests share: RAII over the
// handles and the status checks (the code, and a message of the call's own in
// clm_last_error()). Only clm.h, as a host sees it.
#pragma once

#include <memory>
#include <string>

#include <catch2/catch.hpp>

#include "clm.h"

// ---- RAII over the handles (so a failed REQUIRE leaks nothing under LSan) ----
struct EngineFree {
  void operator()(clm_engine* e) const { clm_engine_free(e); }
};
struct SeqFree {
  void operator()(clm_seq* s) const { clm_seq_free(s); }
};
using EnginePtr = std::unique_ptr<clm_engine, EngineFree>;
using SeqPtr = std::unique_ptr<clm_seq, SeqFree>;

// Sets this thread's last error to a message no test expects, and returns it,
// so a check can tell that the call under test wrote its own message. (The
// buffer is large enough that even a library accepting the size would not
// write past it.)
inline std::string prime_last_error() {
  alignas(16) static unsigned char big[16384];
  const clm_status s = clm_engine_options_init(reinterpret_cast<clm_engine_options*>(big), 12345);
  std::string primed = clm_last_error();
  REQUIRE(s == CLM_ERR_INVALID_ARGUMENT);
  REQUIRE_FALSE(primed.empty());
  return primed;
}

// The call fails with exactly `expected`, writes a message of its own to
// clm_last_error(), and returns (no crash).
#define CHECK_STATUS(expected, ...)                                                                          \
  do {                                                                                                       \
    const std::string primed_ = prime_last_error();                                                          \
    const clm_status got_ = (__VA_ARGS__);                                                                   \
    const std::string message_ = clm_last_error();                                                           \
    INFO(#__VA_ARGS__ << "\n  -> " << clm_status_name(got_) << " (" << got_ << "): \"" << message_ << "\""); \
    CHECK(got_ == (expected));                                                                               \
    CHECK_FALSE(message_.empty());                                                                           \
    CHECK(message_ != primed_);                                                                              \
  } while (0)

#define REQUIRE_OK(call)                                                                                      \
  do {                                                                                                        \
    const clm_status got_ = (call);                                                                           \
    INFO(#call << "\n  -> " << clm_status_name(got_) << " (" << got_ << "): \"" << clm_last_error() << "\""); \
    REQUIRE(got_ == CLM_OK);                                                                                  \
  } while (0)
