// lib/kernels/attention_cpu_prefetch.hpp: the decode's prefetch stream, one per chunk
// of a sequence: the rows the chunk reads, in the order the walk reads them
// (per block of tokens, the K rows of its pages, then their V rows; each
// page's part a contiguous run), one 64-byte line at a time, kept a fixed
// number of bytes ahead of what the walk has read.
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
// Why a run at a time, and into L1: the lines of a run go out in one tight
// loop (a prefetch and an add each), where a call per line cost the kernels a
// quarter of their speed with the KV in cache; and prefetcht0 kept more of
// this VM's reads in flight from memory than prefetcht2 (docs/kernels.md).
//
// BasicPrefetchStream<SendLine> sends each line through SendLine (the tests
// record them); the kernels use PrefetchStream, which prefetches.
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

// The kernels' line: a prefetch into L1.
struct PrefetchLine {
  void operator()(const char* at) const { _mm_prefetch(at, _MM_HINT_T0); }
};

template <class SendLine = PrefetchLine>
class BasicPrefetchStream {
 public:
  // How far ahead of the reads the stream runs: enough lines in flight to
  // cover the memory latency at one core's bandwidth, several times over
  // (64 KiB was slower, 192-384 KiB no faster; with prefetcht0, 64 and 256
  // KiB no faster).
  static constexpr std::int64_t kLeadBytes = 128 * 1024;

  // P V paces the stream once every this many rows it reads: once a row, the
  // bookkeeping cost as much as it gained with the KV in L3.
  static constexpr int kPaceRows = 4;

  // The rows of tokens [begin, end) of a sequence whose pages are `pages`, in
  // the walk's order: per block of `block` tokens from `begin`, the K rows of
  // its pages, then their V rows. Nothing goes out yet: the first catch_up()
  // sends the first kLeadBytes with what was consumed.
  BasicPrefetchStream(const KvLayer& kv, const std::int32_t* pages, std::int64_t begin, std::int64_t end, int block,
                      SendLine send = SendLine())
      : send_(send),
        kv_(kv),
        pages_(pages),
        end_(end),
        block_(block),
        block_end_(begin),
        token_(begin),
        limit_(kLeadBytes) {}

  void consume(std::int64_t bytes) { limit_ += bytes; }

  void pace(std::int64_t bytes) {
    credit_ += bytes;
    if (credit_ < kLine || issued_ >= limit_) return;
    const std::int64_t before = issued_;
    send_until(std::min(limit_, issued_ + credit_ / kLine * kLine));
    credit_ = std::max<std::int64_t>(0, credit_ - (issued_ - before));
  }

  void catch_up() {
    send_until(limit_);
    credit_ = 0;
  }

  // Bytes of the chunk's rows whose lines have gone out.
  std::int64_t issued() const { return issued_; }

 private:
  static constexpr std::int64_t kLine = 64;

  // Sends the stream's lines until `target` bytes of rows have gone out (or
  // all of them), a run at a time: one prefetch and one add a line.
  void send_until(std::int64_t target) {
    while (issued_ < target) {
      if (left_ <= 0 && !next_run()) {
        limit_ = issued_;  // every row of the chunk is on its way
        return;
      }
      const std::int64_t n = std::min(left_, (target - issued_ + kLine - 1) / kLine * kLine);
      for (const char *at = at_, *stop = at_ + n; at < stop; at += kLine) send_(at);
      at_ += n;
      left_ -= n;
      issued_ += n;
    }
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

  [[no_unique_address]] SendLine send_;
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

using PrefetchStream = BasicPrefetchStream<>;

}  // namespace
}  // namespace clm::detail
