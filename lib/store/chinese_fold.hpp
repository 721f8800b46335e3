// lib/store/chinese_fold.hpp: Traditional Chinese folded to Simplified for the
// suffix keyer (clm/store/suffix_key.hpp), with OpenCC (Debian's
// libopencc-dev and libopencc-data) and its t2s.json configuration: phrases
// first (TSPhrases), then characters (TSCharacters). Only CJK code points
// change (U+3400..U+9FFF, U+F900..U+FAFF, U+20000..U+3FFFF): every other code
// point is copied as it is, and text with none is returned unchanged without
// calling OpenCC. Internal to lib/store.
//
//   std::unique_ptr<ChineseFolder> folder;
//   CLM_RETURN_IF_ERROR(ChineseFolder::create(folder));
//   std::string out;
//   CLM_RETURN_IF_ERROR(folder->fold("請幫我取消訂單 #123", out));  // out == "请帮我取消订单 #123"
//   folder->config_name();  // "OpenCC 1.1.5 t2s.json data:<16 hex digits>", for the rules fingerprint
#pragma once

#include <memory>
#include <mutex>
#include <string>
#include <string_view>

#include "clm/status.hpp"

namespace opencc {
class Converter;
}

namespace clm::store_detail {

// The code points ChineseFolder hands to OpenCC: the CJK Unified Ideographs
// (Extension A and the basic block), the Compatibility Ideographs, and planes
// 2 and 3 (Extensions B to H and the supplement of compatibility ideographs).
constexpr bool is_cjk_ideograph(char32_t cp) {
  return (cp >= 0x3400 && cp <= 0x9FFF) || (cp >= 0xF900 && cp <= 0xFAFF) || (cp >= 0x20000 && cp <= 0x3FFFF);
}

class ChineseFolder {
 public:
  // Opens OpenCC once with the t2s.json that CMake found at configure time
  // (cmake/FindOpenCC.cmake: /usr/share/opencc/t2s.json on Debian).
  // io_error when the configuration or a dictionary it names cannot be read
  // or loaded (libopencc-data missing), out_of_memory, internal.
  static Status create(std::unique_ptr<ChineseFolder>& out);
  // The same with another OpenCC configuration file.
  static Status create(const std::string& config_path, std::unique_ptr<ChineseFolder>& out);

  ~ChineseFolder();
  ChineseFolder(const ChineseFolder&) = delete;
  ChineseFolder& operator=(const ChineseFolder&) = delete;

  // `utf8` with its Traditional characters folded to Simplified, into `out`
  // (which `utf8` may view). Each maximal run of CJK code points goes to
  // OpenCC (no OpenCC dictionary entry holds another code point, so no phrase
  // spans a run's end); the rest is copied. invalid_argument for text that is
  // not well-formed UTF-8 (checked before OpenCC sees it), naming the byte
  // offset; out_of_memory; internal if OpenCC fails. `out` is unspecified after
  // an error. Safe to call from many threads at once.
  Status fold(std::string_view utf8, std::string& out) const;

  // What this folder applies: "OpenCC <version> <config file name>
  // data:<FNV-1a 64 of the configuration and every dictionary it names, in
  // hexadecimal>". The version is the one OpenCC's pkg-config file gives
  // (Debian's 1.1.6 still says 1.1.5), so the data hash is what tells two
  // installations' folding apart. Folded keys are comparable only under one
  // config_name().
  std::string config_name() const { return config_name_; }

 private:
  ChineseFolder() = default;

  std::shared_ptr<opencc::Converter> converter_;
  std::string config_name_;
  // OpenCC does not document that one converter may convert on many threads
  // at once (1.1.6's Convert only reads, but nothing promises that it stays
  // so): calls into it are serialised. Only text with CJK code points takes
  // the lock, and a query's runs are short (microseconds each).
  mutable std::mutex mu_;
};

}  // namespace clm::store_detail
