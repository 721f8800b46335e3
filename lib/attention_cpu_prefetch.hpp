// lib/attention_cpu_prefetch.hpp: the decode's prefetch stream, one per chunk
// of a sequence: the rows the chunk reads, in the order the walk reads them
// (per block of tokens, the K rows of its pages, then their V rows; each
// page's part a contiguous run), one 64-byte line at a time into L2, kept a
// fixed number of bytes ahead of what the walk has read.
//
//   PrefetchStream pf(kv, chunk.pages, chunk.begin, chunk.end, 64);  // may run kLeadBytes ahead
//   pf.consume(bytes);   // the walk is about to read these: the stream may run that much further
//   pf.pace(bytes);      // inside a loop that reads `bytes`: as many lines go out, up to that limit
//                        // (P V: every kPaceRows rows)
//   pf.catch_up();       // what is still allowed goes out
//
// Why paced, and in the walk's order: the walk used to prefetch each token's
// K and V rows a fixed 32 tokens ahead while it computed the scores, so the
// lines went out in bursts during QK and none during P V, and the V of a
// block's last pages came late. Issued evenly through both phases, in the
// order they are read, the same lines let one core read bf16 KV from memory
// about 20 % faster, f32 KV 15-20 % (docs/kernels.md).
//
// Included by attention_cpu_avx2.cpp and attention_cpu_avx512.cpp inside their
// target-pragma regions (their P V kernels pace it), and by the tests, each
// into its own anonymous namespace.
#pragma once

#include <xmmintrin.h>  // _mm_prefetch

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "clm/detail/attention_cpu.hpp"

namespace clm::detail {
namespace {

class PrefetchStream {
 public:
  // How far ahead of the reads the stream runs: enough lines in flight to
  // cover the memory latency at one core's bandwidth, several times over
  // (64 KiB was slower, 192-384 KiB no faster).
  static constexpr std::int64_t kLeadBytes = 128 * 1024;

  // P V paces the stream once every this many rows it reads: once a row, the
  // bookkeeping cost as much as it gained with the KV in L3.
  static constexpr int kPaceRows = 4;

  // The rows of tokens [begin, end) of a sequence whose pages are `pages`, in
  // the walk's order: per block of `block` tokens from `begin`, the K rows of
  // its pages, then their V rows. Nothing goes out yet: the first catch_up()
  // sends the first kLeadBytes with what was consumed.
  PrefetchStream(const KvLayer& kv, const std::int32_t* pages, std::int64_t begin, std::int64_t end, int block)
      : kv_(kv), pages_(pages), end_(end), block_(block), block_end_(begin), token_(begin), limit_(kLeadBytes) {}

  void consume(std::int64_t bytes) { limit_ += bytes; }

  void pace(std::int64_t bytes) {
    credit_ += bytes;
    while (credit_ >= kLine && issued_ < limit_) {
      line();
      credit_ -= kLine;
    }
  }

  void catch_up() {
    while (issued_ < limit_) line();
    credit_ = 0;
  }

  // Bytes of the chunk's rows whose lines have gone out.
  std::int64_t issued() const { return issued_; }

  // The next line of the stream and how many of the rows' bytes it starts
  // (64, or what is left of a run), or nullptr after the last.
  const char* next_line(std::int64_t& bytes) {
    if (left_ <= 0 && !next_run()) return nullptr;
    const char* at = at_;
    bytes = std::min(left_, kLine);
    at_ += bytes;
    left_ -= bytes;
    return at;
  }

 private:
  static constexpr std::int64_t kLine = 64;

  void line() {
    std::int64_t bytes = 0;
    const char* at = next_line(bytes);
    if (at == nullptr) {
      limit_ = issued_;  // every row of the chunk is on its way
      return;
    }
    _mm_prefetch(at, _MM_HINT_T2);
    issued_ += bytes;
  }

  // The next contiguous run: the rest of one page's K (or V) rows in the current block.
  bool next_run() {
    if (token_ >= block_end_) {
      if (!in_v_) {  // the block's K rows are out: now its V rows
        in_v_ = true;
        token_ = block_begin_;
      } else {
        if (block_end_ >= end_) return false;
        block_begin_ = block_end_;
        block_end_ = std::min(end_, block_begin_ + block_);
        in_v_ = false;
        token_ = block_begin_;
      }
    }
    const std::int64_t page = token_ / kv_.page_size;
    const std::int64_t first = token_ - page * kv_.page_size;
    const std::int64_t last = std::min<std::int64_t>(kv_.page_size, block_end_ - page * kv_.page_size);
    at_ = kv_.base + static_cast<std::size_t>(pages_[page]) * kv_.page_stride +
          static_cast<std::size_t>(first) * kv_.row_bytes + (in_v_ ? kv_.v_offset : 0);
    left_ = (last - first) * static_cast<std::int64_t>(kv_.row_bytes);
    token_ = page * kv_.page_size + last;
    return true;
  }

  const KvLayer& kv_;
  const std::int32_t* pages_;
  std::int64_t end_;
  std::int64_t block_;
  std::int64_t block_begin_ = 0;
  std::int64_t block_end_;   // of the current block; the first opens on the first line
  std::int64_t token_;       // the next token of the current block and half
  bool in_v_ = true;         // so that the first run opens the first block's K rows
  std::int64_t limit_;       // bytes the stream may have issued
  std::int64_t issued_ = 0;  // bytes issued
  std::int64_t credit_ = 0;  // bytes read by pace() not yet matched by a line
  const char* at_ = nullptr;
  std::int64_t left_ = 0;
};

}  // namespace
}  // namespace clm::detail
