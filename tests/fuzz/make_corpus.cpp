// tests/fuzz/make_corpus.cpp: writes the fuzzers' seed corpora
// (tests/fuzz/corpus/<target>/) with the library's own encoders: safetensors
// files from serialize_safetensors, snapshot BLOBs from encode_snapshot_blob,
// stored pages from encode_page_header, suffix-key texts in English and
// Chinese, short C ABI call sequences, radix-tree runs, KV event batches (from
// encode_kv_event_batch), a replay request and small tokenizer.json files
// (tokenizer_json_seed.hpp), in the byte format
// their fuzzers read (clm_fuzz::ByteReader: one byte per choice, front to back).
// Deterministic: running it again rewrites the same files. Built on demand.
//
//   cmake --build build-fuzz --target clm_fuzz_make_corpus
//   build-fuzz/tests/fuzz/clm_fuzz_make_corpus tests/fuzz/corpus
#include <sys/stat.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "clm/events/kv_event.hpp"
#include "clm/io/safetensors.hpp"
#include "clm/status.hpp"
#include "clm/store/snapshot_blob.hpp"
#include "clm/tiers/page_file.hpp"
#include "fuzz/fuzz_support.hpp"
#include "fuzz/tokenizer_json_seed.hpp"

namespace {

using Bytes = std::vector<std::uint8_t>;

std::string g_root;

void write(const std::string& target, const std::string& name, const void* data, std::size_t size) {
  const std::string dir = g_root + "/" + target;
  ::mkdir(dir.c_str(), 0755);
  std::ofstream out(dir + "/" + name, std::ios::binary | std::ios::trunc);
  out.write(static_cast<const char*>(data), static_cast<std::streamsize>(size));
  if (!out) {
    std::fprintf(stderr, "cannot write %s/%s\n", dir.c_str(), name.c_str());
    std::exit(1);
  }
}
void write(const std::string& target, const std::string& name, const Bytes& bytes) {
  write(target, name, bytes.data(), bytes.size());
}

void require(const clm::Status& s, const char* what) {
  if (!s.ok()) {
    std::fprintf(stderr, "%s: %s\n", what, s.message().c_str());
    std::exit(1);
  }
}

template <class T>
std::span<const std::byte> as_bytes_of(const std::vector<T>& v) {
  return std::as_bytes(std::span<const T>(v));
}

// ---- (b) safetensors ---------------------------------------------------------
void safetensors() {
  auto file = [](const std::string& name, const std::vector<clm::TensorToWrite>& tensors,
                 const std::map<std::string, std::string>& metadata) {
    std::vector<std::byte> bytes;
    require(clm::serialize_safetensors(tensors, metadata, bytes), "serialize_safetensors");
    write("safetensors", name, bytes.data(), bytes.size());
  };
  const std::vector<float> m = {1.0f, -2.5f, 0.125f, 3.0f};
  file("f32_matrix", {{"w", clm::TensorDType::f32, {2, 2}, as_bytes_of(m)}}, {});
  const std::vector<std::uint16_t> h = {0x3c00, 0xc000, 0x0001};  // 1, -2, the smallest subnormal
  const std::vector<std::uint16_t> bf = {0x3f80, 0x7f80};         // 1, +inf: get_f32 refuses it
  const std::vector<std::int64_t> i = {-7};
  const std::vector<std::uint8_t> u = {0, 1, 254, 255};
  const std::vector<std::uint8_t> b = {0, 1};
  file("mixed_dtypes_metadata",
       {{"half", clm::TensorDType::f16, {3}, as_bytes_of(h)},
        {"brain", clm::TensorDType::bf16, {2, 1}, as_bytes_of(bf)},
        {"count", clm::TensorDType::i64, {1}, as_bytes_of(i)},
        {"bytes", clm::TensorDType::u8, {2, 2}, as_bytes_of(u)},
        {"mask", clm::TensorDType::boolean, {2}, as_bytes_of(b)}},
       {{"format", "pt"}, {"gelu", "tanh"}});
  const std::vector<float> one = {0.5f};
  file("empty_and_scalar",
       {{"empty", clm::TensorDType::f32, {0, 4}, {}}, {"scalar", clm::TensorDType::f32, {}, as_bytes_of(one)}}, {});
  const std::vector<float> w1(16, 0.25f), b1(2, 0.0f), w2(2, 1.0f), b2(1, -0.5f);
  file("src_head",
       {{"src_head.w1", clm::TensorDType::f32, {2, 8}, as_bytes_of(w1)},
        {"src_head.b1", clm::TensorDType::f32, {2}, as_bytes_of(b1)},
        {"src_head.w2", clm::TensorDType::f32, {2}, as_bytes_of(w2)},
        {"src_head.b2", clm::TensorDType::f32, {1}, as_bytes_of(b2)}},
       {{"gelu", "erf"}, {"名前", "\"quoted\"\n\tescaped"}});
}

// ---- (c) suffix keys -----------------------------------------------------------
void suffix_keys() {
  const char* texts[] = {
      "帮我查下订单#ORD-789的状态",
      "Please check the status of order 789",
      "Don't check order 789",
      "订单789现在啥情况",
      "我的订单什么时候发货？",
      "登录不了",
      "ＯＲＤ－７８９　取消订单",
      "How do I cancel order #12345 and get a refund?",
      "hi",
      "谢谢！",
      "payment failed for order 555, please retry",
      // from_host_key: key, NUL, group
      "tenant-a:faq:shipping\0tenant-a:faq",
  };
  int n = 0;
  for (const char* t : texts) {
    std::string_view text(t);
    if (text.find("tenant-a:faq:shipping") == 0) text = std::string_view(t, std::strlen(t) + 1 + 12);
    write("suffix_key", "text_" + std::to_string(n++), text.data(), text.size());
  }
}

// ---- (d) snapshot BLOBs ----------------------------------------------------------
// Input: dim mode, dim byte, checksum mode (1: 8 checksum bytes follow), BLOB.
// Both BLOB formats (1: the byte-wise checksum, "dim_N"; 2: the word-wise one, "f2_dim_N").
void snapshot_blobs() {
  for (std::uint16_t format : {clm::kSnapshotBlobBytewise, clm::kSnapshotBlobWordwise}) {
    const std::string prefix = format == clm::kSnapshotBlobBytewise ? "" : "f2_";
    for (int dim : {1, 4, 32}) {
      std::vector<float> v(static_cast<std::size_t>(dim));
      for (int i = 0; i < dim; ++i) v[static_cast<std::size_t>(i)] = static_cast<float>(i % 5) * 0.25f - 0.5f;
      std::vector<std::uint8_t> blob;
      clm::encode_snapshot_blob(v, blob, format);
      Bytes in = {0, 0, 0};  // the dim the size says, the true checksum
      in.insert(in.end(), blob.begin(), blob.end());
      write("snapshot_blob", prefix + "dim_" + std::to_string(dim), in);
      // The dim and the checksum given explicitly.
      Bytes given = {1, static_cast<std::uint8_t>(dim + 2), 1};
      const std::uint64_t sum = clm::snapshot_checksum(blob);
      for (int b = 0; b < 8; ++b) given.push_back(static_cast<std::uint8_t>(sum >> (8 * b)));
      given.insert(given.end(), blob.begin(), blob.end());
      write("snapshot_blob", prefix + "dim_" + std::to_string(dim) + "_given", given);
    }
  }
}

// ---- (e) stored pages -------------------------------------------------------------
// fuzz_page_file's kLayout: page_size 2, 1 layer, 1 head, head_dim 4, f16.
void pages() {
  const clm::PageLayout layout{2, 1, 1, 4, clm::KvDType::f16};
  std::vector<std::byte> payload(layout.page_bytes());
  for (std::size_t i = 0; i < payload.size(); ++i) payload[i] = static_cast<std::byte>(i * 7 + 1);
  clm::PageSeal seal;
  if (!clm::PageSeal::create(clm_fuzz::kPageModel, clm_fuzz::kPageSecret, seal).ok()) std::abort();
  auto value = [&](const clm::PageKey& key) {
    clm::PageHeaderBytes header;
    if (!clm::encode_page_header(key, layout, seal, payload, header).ok()) std::abort();
    // Signing draws a random nonce: a fixed one instead (its tag and checksum anew), so the files stay the same.
    std::array<std::uint8_t, clm::kPageNonceBytes> nonce{};
    for (std::size_t i = 0; i < nonce.size(); ++i) nonce[i] = static_cast<std::uint8_t>(i + 1);
    std::array<std::uint8_t, clm::kPageTagBytes> tag{};
    if (!seal.signer->tag(nonce, std::span(header).first(clm::kPageMacOffset), payload, tag).ok()) std::abort();
    std::memcpy(header.data() + clm::kPageMacOffset, nonce.data(), nonce.size());
    std::memcpy(header.data() + clm::kPageMacOffset + nonce.size(), tag.data(), tag.size());
    clm::page_file_detail::put_le(header.data() + clm::kPageChecksumOffset,
                                  clm::page_file_detail::checksum(header, payload), 8);
    Bytes out(header.size() + payload.size());
    std::memcpy(out.data(), header.data(), header.size());
    std::memcpy(out.data() + header.size(), payload.data(), payload.size());
    return out;
  };
  clm::PageKey fixed;
  fixed.bytes.fill(0x5a);
  Bytes in = {0};  // mode 0: the value, read under the fixed key
  const Bytes v = value(fixed);
  in.insert(in.end(), v.begin(), v.end());
  write("page_file", "value_fixed_key", in);
  const std::int32_t chain[] = {1, 2};
  const clm::PageKey key = clm::next_page_key(clm::PageKey::root(), chain, {.scope = seal.key_scope()});
  in = {2};  // mode 2: read under the key the value names
  const Bytes w = value(key);
  in.insert(in.end(), w.begin(), w.end());
  write("page_file", "value_own_key", in);
  // Mode 1 | 32: built by the fuzzer from key, flip position and byte, payload.
  in = {33};
  in.insert(in.end(), key.bytes.begin(), key.bytes.end());
  in.insert(in.end(), {72, 0, 0xff});  // flips the checksum's first byte
  for (std::byte b : payload) in.push_back(static_cast<std::uint8_t>(b));
  write("page_file", "built_flipped_checksum", in);
}

// ---- (a) C ABI call sequences ----------------------------------------------------
// The bytes fuzz_capi_ops's driver reads, in its order (see its create() and
// op_*()): one byte per choice.
class CapiSeq {
 public:
  // num_pages 1..48, page_size 1..8, policy 0..3, host memory or none.
  CapiSeq& create(int num_pages, int page_size, int policy, bool host) {
    put(5);                  // struct size: sizeof
    put(num_pages + 1);      // range(-1, 48)
    put(page_size + 1);      // range(-1, 8)
    put(0);                  // page size as given, not 16
    put(1), put(1), put(4);  // layers, heads, head_dim
    put(1 + 1);              // kv_dtype f16 (range -1..3)
    put(host ? 0 : 1);       // memory: 0 is host
    put(policy + 1);         // range(-1, 4)
    put(0), put(1), put(1);  // SLRU fraction 0.2; struct_size kept; out non-NULL
    return *this;
  }
  // op 0: a fresh prompt of `tokens` (ids 0..3), salt 0..3 (4: none), adapter, priority.
  CapiSeq& admit(const std::vector<int>& tokens, int salt, int adapter, int priority, bool history) {
    put(0);
    if (history) put(0);  // not from the history
    put(static_cast<int>(tokens.size()));
    for (int t : tokens) put(t);
    put(salt);
    put(adapter + 1);
    put(priority + 1);
    put(1), put(1), put(1);  // struct_size kept; with options; tokens non-NULL
    return *this;
  }
  CapiSeq& extend(int seq, const std::vector<int>& tokens) {
    put(3), put(seq);
    put(0);  // not from the history (there always is one by then)
    put(static_cast<int>(tokens.size()));
    for (int t : tokens) put(t);
    if (!tokens.empty()) put(1);  // tokens non-NULL
    return *this;
  }
  CapiSeq& finish(int seq) { return put(5), put(seq), *this; }
  CapiSeq& abort(int seq) { return put(6), put(seq), *this; }
  CapiSeq& free(int seq) { return put(7), put(seq), *this; }
  CapiSeq& readmit() { return put(12), *this; }
  CapiSeq& batch(std::vector<int> seqs) {
    put(8), put(static_cast<int>(seqs.size()));
    for (int s : seqs) put(s);
    return put(1), *this;  // indices large enough
  }
  CapiSeq& metrics_text() { return put(9), *this; }
  CapiSeq& null_handles() { return put(10), *this; }
  CapiSeq& engine_free() { return put(13), put(0), *this; }
  const Bytes& bytes() const { return bytes_; }

 private:
  CapiSeq& put(int b) {
    bytes_.push_back(static_cast<std::uint8_t>(b));
    return *this;
  }
  Bytes bytes_;
};

void capi_sequences() {
  // Two requests share a system prompt; the second hits it.
  write("capi_ops", "shared_prefix",
        CapiSeq()
            .create(16, 4, 0, false)
            .admit({0, 1, 2, 3, 0, 1, 2, 3, 1}, 0, 0, 0, false)
            .extend(0, {2, 2})
            .finish(0)
            .readmit()
            .admit({0, 1, 2, 3, 0, 1, 2, 3, 3, 3}, 0, 0, 0, true)
            .batch({0, 1})
            .abort(1)
            .bytes());
  // A small pool: admissions evict, then run out of pages.
  write("capi_ops", "pool_pressure",
        CapiSeq()
            .create(3, 2, 1, true)
            .admit({1, 1, 1, 1, 1}, 1, 1, 50, false)
            .finish(0)
            .admit({2, 2, 2, 2, 2}, 1, 1, 10, true)
            .admit({3, 3, 3, 3, 3}, 2, 0, 0, true)
            .metrics_text()
            .free(0)
            .bytes());
  // Sequences outliving their engine, and NULL handles.
  write("capi_ops", "engine_freed_first",
        CapiSeq()
            .create(8, 1, 2, false)
            .admit({0, 1, 2}, 4, 0, 0, false)
            .null_handles()
            .engine_free()
            .finish(0)
            .free(0)
            .bytes());
  // Priority eviction with salts; an extend that crosses pages.
  write("capi_ops", "priority_salts",
        CapiSeq()
            .create(12, 3, 3, false)
            .admit({0, 0, 0, 1, 1, 1, 2}, 2, 0, 100, false)
            .extend(0, {3, 3, 3, 3, 3})
            .finish(0)
            .readmit()
            .admit({0, 0, 0, 1, 1, 1, 2}, 3, 1, 0, true)
            .abort(1)
            .bytes());
}

// ---- (f) radix tree runs -----------------------------------------------------------
// 4 configuration bytes, then choices from a fixed stream (the driver's Rng).
void radix_runs() {
  std::uint64_t state = 0x2545f4914f6cdd1dULL;
  auto next = [&] {
    state ^= state << 13, state ^= state >> 7, state ^= state << 17;
    return static_cast<std::uint8_t>(state);
  };
  const struct {
    const char* name;
    std::uint8_t config;  // page size (bits 0-1), policy (2-3), protected fraction (4-5)
    std::uint8_t pages, max_pages;
  } runs[] = {
      {"ps1_lru", 0x00, 24, 7}, {"ps4_slru", 0x1a, 40, 3}, {"ps16_priority", 0x0f, 8, 2}, {"ps2_lfu", 0x25, 16, 5}};
  for (const auto& r : runs) {
    Bytes in = {r.config, r.pages, r.max_pages, 1};
    for (int i = 0; i < 600; ++i) in.push_back(next());
    write("radix_tree_diff", r.name, in);
  }
}

// ---- (h) KV event batches and replay requests -------------------------------------
void kv_events() {
  std::mt19937_64 rng(7);
  for (auto layout : {clm::KvEventLayout::array, clm::KvEventLayout::legacy, clm::KvEventLayout::map}) {
    clm::KvEventBatch batch{.ts = 1757500000.25, .events = {}, .data_parallel_rank = 0};
    clm::KvEvent stored;
    stored.block_hashes = {rng(), rng()};
    stored.parent_block_hash = rng();
    stored.block_size = 2;
    stored.token_ids = {1, 2, 3, 4};
    stored.lora_id = 3;
    stored.extra_key = "salt:0123456789abcdef0123456789abcdef";
    clm::KvEvent removed;
    removed.kind = clm::KvEventKind::block_removed;
    removed.medium = clm::KvMedium::cpu;
    removed.block_hashes = {rng()};
    clm::KvEvent cleared;
    cleared.kind = clm::KvEventKind::all_blocks_cleared;
    batch.events = {cleared, stored, removed};
    std::string payload;
    if (!clm::encode_kv_event_batch(batch, layout, payload).ok()) std::abort();
    Bytes in = {0};
    in.insert(in.end(), payload.begin(), payload.end());
    write("kv_events", fmt::format("batch_layout{}", static_cast<int>(layout)), in);
  }
  // A replay request: identity, 0xff, (empty), 0xff, 8 bytes of start.
  write("kv_events", "replay_request", {1, 'i', 'd', 0xff, 0xff, 0, 0, 0, 0, 0, 0, 0, 42});
}

// ---- (i) tokenizer.json files, then a NUL and a text to encode ----------------------
void tokenizer_files() {
  const struct {
    const char* name;
    clm_fuzz::TokenizerSeed seed;
    std::string text;
  } files[] = {
      {"qwen_chat", clm_fuzz::TokenizerSeed::qwen, "<|im_start|>user\nthe thing's 你好 42<|im_end|>\n"},
      {"legacy_merges", clm_fuzz::TokenizerSeed::legacy_merges, "ing in  the\r\n\n  end   "},
      {"stripped_added", clm_fuzz::TokenizerSeed::stripped_added, "a <|im_end|> b<|im_start|>  c \xEF\xBC\xA1"},
  };
  for (const auto& f : files) {
    std::string bytes = clm_fuzz::small_tokenizer_json(f.seed).dump(1);
    bytes.push_back('\0');
    bytes += f.text;
    write("tokenizer_json", f.name, bytes.data(), bytes.size());
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s CORPUS_DIR (tests/fuzz/corpus)\n", argv[0]);
    return 2;
  }
  g_root = argv[1];
  ::mkdir(g_root.c_str(), 0755);
  safetensors();
  suffix_keys();
  snapshot_blobs();
  pages();
  capi_sequences();
  radix_runs();
  kv_events();
  tokenizer_files();
  return 0;
}
