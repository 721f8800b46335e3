// tests/fuzz/fuzz_page_file.cpp: libFuzzer target for the stored page format
// (clm/tiers/page_file.hpp) on arbitrary bytes, through both of its readers:
// decode_page (what the Redis backend calls on a value) and the file
// backend's get_pages (which reads the header and the payload separately, from
// a file written here with the fuzzer's bytes).
//
//   make build-fuzz && build-fuzz/tests/fuzz/fuzz_page_file tests/fuzz/corpus/page_file
//   tests/fuzz/run.sh build-fuzz 30     (every target, on a copy of its corpus)
//
// Input: byte 0 is the mode. Mode bit 0 clear: the rest is a stored value,
// read as a page of the fixed layout kLayout under a key from the value's own
// key field (so the fuzzer can match it) or a fixed one. Bit 0 set: the value
// is built with encode_page_header from a layout and key taken from the
// input, sealed with the readers' seal (model and secret, page_seal.hpp), or
// unsigned (bit 6), or for another model (bit 7), then one byte of it is
// replaced (or none), so the checks behind the checksum and the signature are
// reached. Checks: no crash, leak or read outside the value
// (ASan); decode_page and the file backend agree on every value; a refusal
// says why and leaves the payload untouched; an accepted value is exactly
// what encode_page_header writes for it, and the file backend returns the
// same payload bytes.
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "clm/tiers/page_file.hpp"
#include "clm/tiers/storage_backend.hpp"
#include "fuzz/fuzz_support.hpp"

namespace {

// The file backend's layout (fixed when it is opened): 32-byte pages.
constexpr clm::PageLayout kLayout{2, 1, 1, 4, clm::KvDType::f16};

clm::PageSeal seal_of(const char* model, const char* secret) {
  clm::PageSeal seal;
  const clm::Status s = clm::PageSeal::create(model, secret, seal);
  FUZZ_CHECK(s.ok(), "PageSeal::create: {}", s.message());
  return seal;
}
// Every reader's seal (make_corpus.cpp writes its seeds with the same).
const clm::PageSeal& reader_seal() {
  static const clm::PageSeal seal = seal_of(clm_fuzz::kPageModel, clm_fuzz::kPageSecret);
  return seal;
}

// A file backend in a fresh temporary directory, for the whole run.
struct FileBackend {
  std::string root;
  std::unique_ptr<clm::StorageBackend> backend;

  FileBackend() {
    // Under $TMPDIR: run.sh's temporary directory, removed with it.
    const char* tmp = std::getenv("TMPDIR");
    std::string dir = std::string(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp") + "/clm-fuzz-page-file-XXXXXX";
    FUZZ_CHECK(::mkdtemp(dir.data()) != nullptr, "mkdtemp {} failed", dir);
    root = dir;
    const clm::Status s = clm::open_storage_backend("file://" + root, kLayout, reader_seal(), backend);
    FUZZ_CHECK(s.ok(), "open_storage_backend: {}", s.message());
  }

  std::string path_of(const clm::PageKey& key) const {
    const std::string hex = key.hex();
    return root + "/" + hex.substr(0, 2) + "/" + hex;
  }

  // found, and the payload read into `slot`.
  bool get(const clm::PageKey& key, std::span<const std::byte> value, std::vector<std::byte>& slot) {
    const std::string path = path_of(key);
    ::mkdir((root + "/" + key.hex().substr(0, 2)).c_str(), 0755);
    {
      std::ofstream file(path, std::ios::binary | std::ios::trunc);
      file.write(reinterpret_cast<const char*>(value.data()), static_cast<std::streamsize>(value.size()));
      FUZZ_CHECK(file.good(), "cannot write {}", path);
    }
    slot.assign(kLayout.page_bytes(), std::byte{0});
    std::byte* pages[] = {slot.data()};
    std::uint8_t found[] = {0};
    const clm::Status s = backend->get_pages(std::span(&key, 1), pages, found);
    FUZZ_CHECK(s.ok(), "file backend get_pages: {}", s.message());
    ::unlink(path.c_str());  // a refused page is already gone
    return found[0] != 0;
  }
};

clm::PageKey key_from(clm_fuzz::ByteReader& in) {
  clm::PageKey key;
  for (auto& b : key.bytes) b = in.byte();
  return key;
}

clm::PageLayout layout_from(clm_fuzz::ByteReader& in) {
  clm::PageLayout layout;
  layout.page_size = in.range<std::int32_t>(-1, 8);
  layout.num_layers = in.range<std::int32_t>(-1, 4);
  layout.kv_heads = in.range<std::int32_t>(0, 4);
  layout.head_dim = in.range<std::int32_t>(0, 16);
  layout.dtype = static_cast<clm::KvDType>(in.range<int>(0, 3));
  return layout;
}

void check_decode(std::span<const std::byte> value, const clm::PageKey& key, const clm::PageLayout& layout) {
  const std::span<const std::byte> untouched(value.data(), std::size_t{0});
  std::span<const std::byte> payload = untouched;
  clm::PageFault fault = clm::PageFault::none;
  const clm::Status s = clm::decode_page(value, key, layout, reader_seal(), payload, fault);
  FUZZ_CHECK(s.ok() == (fault == clm::PageFault::none), "fault {} with status {}", static_cast<int>(fault),
             s.code_name());
  if (!s.ok()) {
    FUZZ_CHECK(s.code() == clm::StatusCode::invalid_argument && !s.message().empty(), "refused with {}: '{}'",
               s.code_name(), s.message());
    FUZZ_CHECK(payload.data() == untouched.data() && payload.empty(), "a refused value set the payload");
    return;
  }
  FUZZ_CHECK(clm::check_page_layout(layout).ok(), "accepted a page of an impossible layout");
  FUZZ_CHECK(value.size() == clm::kPageHeaderSize + layout.page_bytes(), "accepted {} bytes", value.size());
  FUZZ_CHECK(payload.data() == value.data() + clm::kPageHeaderSize && payload.size() == layout.page_bytes(),
             "payload does not point at the value's payload");
  clm::PageHeaderBytes header;
  FUZZ_CHECK(clm::encode_page_header(key, layout, reader_seal(), payload, header).ok(), "cannot encode");
  const clm::PageSigner* signer = reader_seal().signer.get();
  if (signer == nullptr) {
    FUZZ_CHECK(std::equal(header.begin(), header.end(), value.begin()),
               "accepted a header that differs from its encoding");
    return;
  }
  // Signed, a page draws a fresh nonce each time: all but the signature (and the checksum over it) as encoded,
  // and the tag the signer computes under the value's own nonce.
  const std::size_t signature_end = clm::kPageMacOffset + sizeof(clm::PageSignature);
  FUZZ_CHECK(std::equal(header.begin(), header.begin() + clm::kPageMacOffset, value.begin()) &&
                 std::equal(header.begin() + signature_end, header.begin() + clm::kPageChecksumOffset,
                            value.begin() + signature_end),
             "accepted a header that differs from its encoding");
  std::array<std::uint8_t, clm::kPageNonceBytes> nonce{};
  std::memcpy(nonce.data(), value.data() + clm::kPageMacOffset, nonce.size());
  std::array<std::uint8_t, clm::kPageTagBytes> tag{};
  FUZZ_CHECK(signer->tag(nonce, std::span(value).first(clm::kPageMacOffset), payload, tag).ok(), "cannot sign");
  FUZZ_CHECK(std::memcmp(tag.data(), value.data() + clm::kPageMacOffset + nonce.size(), tag.size()) == 0,
             "accepted a page whose tag is not its signer's");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static FileBackend files;
  clm_fuzz::ByteReader in(data, size);
  const auto mode = in.byte();
  std::vector<std::byte> value;
  clm::PageKey key;
  clm::PageLayout layout = kLayout;
  if ((mode & 1) == 0) {
    const std::span<const std::uint8_t> raw = in.rest();
    value.resize(raw.size());
    if (!raw.empty()) std::memcpy(value.data(), raw.data(), raw.size());
    if ((mode & 2) != 0 && value.size() >= 44) {
      std::memcpy(key.bytes.data(), value.data() + 12, key.bytes.size());  // its own key
    } else {
      key.bytes.fill(0x5a);
    }
  } else {
    key = key_from(in);
    const clm::PageKey written_key = (mode & 2) != 0 ? key_from(in) : key;
    const clm::PageLayout written_layout = (mode & 4) != 0 ? layout_from(in) : kLayout;
    if ((mode & 8) != 0) layout = layout_from(in);
    const auto flip_at = in.range<std::uint16_t>(0, 0xffff);
    const auto flip_to = in.byte();
    // The payload: the input's bytes, cut or padded to what the layout holds
    // (an impossible layout gets whatever is left).
    const std::span<const std::uint8_t> rest = in.rest();
    std::vector<std::uint8_t> raw(rest.begin(), rest.end());
    if (clm::check_page_layout(written_layout).ok() && (mode & 16) == 0) raw.resize(written_layout.page_bytes());
    std::vector<std::byte> body(raw.size());
    if (!raw.empty()) std::memcpy(body.data(), raw.data(), raw.size());
    static const clm::PageSeal unsigned_seal = seal_of(clm_fuzz::kPageModel, "");
    static const clm::PageSeal other_model = seal_of("another model", clm_fuzz::kPageSecret);
    const clm::PageSeal& seal = (mode & 64) != 0 ? unsigned_seal : (mode & 128) != 0 ? other_model : reader_seal();
    clm::PageHeaderBytes header;
    FUZZ_CHECK(clm::encode_page_header(written_key, written_layout, seal, body, header).ok(), "cannot encode");
    value.assign(header.begin(), header.end());
    value.insert(value.end(), body.begin(), body.end());
    if ((mode & 32) != 0 && !value.empty()) value[flip_at % value.size()] = static_cast<std::byte>(flip_to);
  }

  // Only valid layouts are asked for: every reader is opened with one.
  if (clm::check_page_layout(layout).ok()) check_decode(value, key, layout);

  // The file backend against decode_page, for its own layout.
  std::span<const std::byte> payload;
  clm::PageFault fault = clm::PageFault::none;
  const bool decoded = clm::decode_page(value, key, kLayout, reader_seal(), payload, fault).ok();
  std::vector<std::byte> slot;
  const bool found = files.get(key, value, slot);
  FUZZ_CHECK(found == decoded, "the file backend {} a value decode_page {}", found ? "served" : "refused",
             decoded ? "accepts" : "refuses");
  if (found) FUZZ_CHECK(std::equal(slot.begin(), slot.end(), payload.begin(), payload.end()), "payloads differ");
  return 0;
}
