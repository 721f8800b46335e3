// tests/fuzz/fuzz_support.hpp: what the fuzzers share. FUZZ_CHECK, the oracle
// check: a failed check prints what went wrong and aborts, which libFuzzer
// reports as a crash and saves the input as a reproducer (tests/fuzz/run.sh
// keeps it). ByteReader: choices read front to back, a byte or two each, so a
// seed input can be written by hand or by tests/fuzz/make_corpus.cpp (clang's
// FuzzedDataProvider takes integers from the end).
//
//   clm_fuzz::ByteReader in(data, size);
//   const int op = in.range(0, 9);   // 0 once the input is used up
//   FUZZ_CHECK(s.ok() || !s.message().empty(), "a refused call without a message ({})", s.code_name());
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <span>
#include <string>

#include <fmt/format.h>

namespace clm_fuzz {

// The model and secret fuzz_page_file reads pages with, and make_corpus
// writes its seeds with.
inline constexpr const char* kPageModel = "fuzz-model";
inline constexpr const char* kPageSecret = "the fuzzers' page secret";

[[noreturn]] inline void check_failed(const char* file, int line, const char* cond, const std::string& what) {
  std::fprintf(stderr, "FUZZ_CHECK failed at %s:%d: `%s`: %s\n", file, line, cond, what.c_str());
  std::fflush(stderr);
  std::abort();
}

// Choices from the input, front to back: range(lo, hi) takes one byte when
// the range has at most 256 values, else two (little-endian), modulo its size;
// 0 bytes (lo) once the input is used up.
class ByteReader {
 public:
  ByteReader(const std::uint8_t* data, std::size_t size) : data_(data), size_(size) {}

  std::size_t remaining() const { return size_ - at_; }
  // What is left, all of it.
  std::span<const std::uint8_t> rest() {
    const std::span<const std::uint8_t> out(data_ + at_, size_ - at_);
    at_ = size_;
    return out;
  }
  std::uint8_t byte() { return at_ < size_ ? data_[at_++] : 0; }
  bool flag() { return (byte() & 1) != 0; }
  // Uniform-ish in [lo, hi] (inclusive); hi - lo below 65536.
  template <class T>
  T range(T lo, T hi) {
    const auto span = static_cast<std::uint64_t>(static_cast<std::int64_t>(hi) - static_cast<std::int64_t>(lo)) + 1;
    std::uint64_t v = byte();
    if (span > 256) v |= static_cast<std::uint64_t>(byte()) << 8;
    return static_cast<T>(static_cast<std::int64_t>(lo) + static_cast<std::int64_t>(v % span));
  }

 private:
  const std::uint8_t* data_;
  std::size_t size_;
  std::size_t at_ = 0;
};

}  // namespace clm_fuzz

#define FUZZ_CHECK(cond, ...)                                                                   \
  do {                                                                                          \
    if (!(cond)) ::clm_fuzz::check_failed(__FILE__, __LINE__, #cond, fmt::format(__VA_ARGS__)); \
  } while (0)
