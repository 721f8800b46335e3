// examples/tokenizer/hf_tokenizer.cpp: loading tokenizer.json (nlohmann-json)
// and the encode pipeline of hf_tokenizer.hpp: added tokens split off the raw
// text (leftmost, longest), each remaining segment normalised (ICU), split
// into pieces (qwen_split.hpp), and each piece's bytes merged by rank (BPE on
// token ids, through a flat hash table of the merges).
#include "hf_tokenizer.hpp"

#include <unicode/bytestream.h>
#include <unicode/normalizer2.h>
#include <unicode/stringpiece.h>
#include <unicode/uchar.h>
#include <unicode/utf8.h>

#include <algorithm>
#include <array>
#include <exception>
#include <fstream>
#include <limits>
#include <new>
#include <queue>
#include <sstream>
#include <unordered_map>
#include <utility>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "qwen_split.hpp"

namespace clm_tokenizer {

namespace {

using nlohmann::json;

// Ids above this are refused: a file may not make us allocate gigabytes for
// one token id (Qwen3's largest is 151,668).
constexpr std::int32_t kMaxTokenId = (1 << 24) - 1;
constexpr std::uint32_t kNoRank = std::numeric_limits<std::uint32_t>::max();

// The ranked merges: (left id, right id) -> (rank, merged id), open addressing
// with linear probing; BPE looks a pair up for every neighbour it forms.
class MergeTable {
 public:
  struct Merge {
    std::uint32_t rank = kNoRank;
    std::int32_t merged = -1;
  };

  void reserve(std::size_t count) {
    std::size_t capacity = 16;
    while (capacity < 2 * count) capacity *= 2;
    keys_.assign(capacity, kEmpty);
    values_.assign(capacity, Merge{});
    mask_ = capacity - 1;
  }
  // A pair merged twice keeps the later rank, as Hugging Face's map does.
  void insert(std::int32_t left, std::int32_t right, Merge merge) {
    const std::uint64_t key = pack(left, right);
    std::size_t slot = hash(key);
    while (keys_[slot] != kEmpty && keys_[slot] != key) slot = (slot + 1) & mask_;
    keys_[slot] = key;
    values_[slot] = merge;
  }
  Merge find(std::int32_t left, std::int32_t right) const {
    const std::uint64_t key = pack(left, right);
    for (std::size_t slot = hash(key);; slot = (slot + 1) & mask_) {
      if (keys_[slot] == key) return values_[slot];
      if (keys_[slot] == kEmpty) return {};
    }
  }

 private:
  static constexpr std::uint64_t kEmpty = std::numeric_limits<std::uint64_t>::max();
  static std::uint64_t pack(std::int32_t left, std::int32_t right) {
    return (static_cast<std::uint64_t>(static_cast<std::uint32_t>(left)) << 32) | static_cast<std::uint32_t>(right);
  }
  std::size_t hash(std::uint64_t key) const {
    return static_cast<std::size_t>((key * 0x9E3779B97F4A7C15ull) >> 20) & mask_;
  }

  std::vector<std::uint64_t> keys_;
  std::vector<Merge> values_;
  std::size_t mask_ = 0;
};

struct AddedToken {
  std::string content;
  std::int32_t id = 0;
  bool special = false;
  bool lstrip = false;
  bool rstrip = false;
};

enum class NormalizerForm { nfc, nfd, nfkc, nfkd };

// GPT-2's byte-level alphabet: printable bytes stand for themselves, the
// others (controls, space, 0x7F-0xA0, 0xAD) for U+0100 upwards in order.
std::array<char32_t, 256> byte_level_alphabet() {
  std::array<char32_t, 256> to_char{};
  char32_t next = 256;
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    to_char[static_cast<std::size_t>(b)] = printable ? static_cast<char32_t>(b) : next++;
  }
  return to_char;
}

// The byte offset of the first byte that does not begin a well-formed UTF-8
// sequence, or npos.
std::size_t first_invalid_utf8(std::string_view text) {
  const auto* bytes = reinterpret_cast<const std::uint8_t*>(text.data());
  const auto length = static_cast<std::int64_t>(text.size());
  std::int64_t at = 0;
  while (at < length) {
    if (bytes[at] < 0x80) {
      ++at;
      continue;
    }
    const std::int64_t start = at;
    std::int32_t i = 0;
    const auto window = static_cast<std::int32_t>(std::min<std::int64_t>(length - start, 4));
    UChar32 c;
    U8_NEXT(bytes + start, i, window, c);
    if (c < 0) return static_cast<std::size_t>(start);
    at = start + i;
  }
  return std::string_view::npos;
}

void append_lossy_utf8(std::string_view bytes, std::string& out) {
  const auto* data = reinterpret_cast<const std::uint8_t*>(bytes.data());
  const auto length = static_cast<std::int64_t>(bytes.size());
  std::int64_t at = 0;
  while (at < length) {
    const std::int64_t start = at;
    std::int32_t i = 0;
    const auto window = static_cast<std::int32_t>(std::min<std::int64_t>(length - start, 4));
    UChar32 c;
    U8_NEXT(data + start, i, window, c);  // an ill-formed part: its maximal subpart, as Rust's from_utf8_lossy
    if (c < 0) {
      out.append("\xEF\xBF\xBD");
    } else {
      out.append(bytes.substr(static_cast<std::size_t>(start), static_cast<std::size_t>(i)));
    }
    at = start + i;
  }
}

// `s` without the White_Space code points at its front or its back (valid UTF-8).
std::string_view trim_white_space(std::string_view s, bool front) {
  const auto* bytes = reinterpret_cast<const std::uint8_t*>(s.data());
  const auto length = static_cast<std::int32_t>(s.size());
  if (front) {
    std::int32_t at = 0;
    while (at < length) {
      std::int32_t next = at;
      UChar32 c;
      U8_NEXT(bytes, next, length, c);
      if (c < 0 || !u_isUWhiteSpace(c)) break;
      at = next;
    }
    return s.substr(static_cast<std::size_t>(at));
  }
  std::int32_t end = length;
  while (end > 0) {
    std::int32_t prev = end;
    UChar32 c;
    U8_PREV(bytes, 0, prev, c);
    if (c < 0 || !u_isUWhiteSpace(c)) break;
    end = prev;
  }
  return s.substr(0, static_cast<std::size_t>(end));
}

std::string shown(std::string_view s) {
  constexpr std::size_t kMax = 60;
  std::string out = json(std::string(s.substr(0, kMax))).dump(-1, ' ', true, json::error_handler_t::replace);
  if (s.size() > kMax) out += "...";
  return out;
}

// The members a file gives, each checked for its JSON type.
const json* member(const json& object, const char* name) {
  const auto it = object.find(name);
  return it == object.end() ? nullptr : &*it;
}
bool flag_or(const json& object, const char* name, bool fallback, bool& value, std::string& error) {
  const json* v = member(object, name);
  if (v == nullptr || v->is_null()) {
    value = fallback;
    return true;
  }
  if (!v->is_boolean()) {
    error = fmt::format("'{}' must be true or false", name);
    return false;
  }
  value = v->get<bool>();
  return true;
}
bool type_of(const json& object, std::string& type) {
  const json* t = member(object, "type");
  if (t == nullptr || !t->is_string()) return false;
  type = t->get<std::string>();
  return true;
}

}  // namespace

struct HfTokenizer::Impl {
  std::vector<std::string> token_bytes;  // by id: the raw bytes a token decodes to
  std::vector<std::uint8_t> token_kind;  // by id: 0 none (a hole), 1 vocabulary, 2 added, 3 added special
  std::unordered_map<std::string, std::int32_t> bytes_to_id;  // vocabulary tokens, by their raw bytes
  std::unordered_map<std::string, std::int32_t> text_to_id;   // every token, by its text in the file
  std::array<std::int32_t, 256> byte_id{};
  MergeTable merges;
  bool ignore_merges = false;
  std::vector<const icu::Normalizer2*> normalizers;
  std::vector<AddedToken> added;                                    // longest first
  std::array<std::vector<std::uint32_t>, 256> added_by_first_byte;  // indexes into `added`
  std::int32_t im_start = -1;
  std::int32_t im_end = -1;

  clm::Status build(const json& root);
  clm::Status build_normalizer(const json* config);
  clm::Status check_pre_tokenizer(const json* config) const;
  clm::Status build_model(const json& model);
  clm::Status build_added_tokens(const json* config);

  void encode_plain(std::string_view segment, SplitScratch& scratch, std::vector<Piece>& pieces,
                    std::vector<std::int32_t>& out) const;
  void bpe(std::string_view piece, std::vector<std::int32_t>& out) const;
  void bpe_long(std::string_view piece, std::vector<std::int32_t>& out) const;
};

namespace {

clm::Status malformed(std::string what) { return clm::invalid_argument("tokenizer.json: " + what); }
clm::Status refused(std::string what) { return clm::unsupported("tokenizer.json: " + what); }

}  // namespace

clm::Status HfTokenizer::Impl::build_normalizer(const json* config) {
  if (config == nullptr || config->is_null()) return {};
  if (!config->is_object()) return malformed("'normalizer' must be an object or null");
  std::string type;
  if (!type_of(*config, type)) return malformed("the normalizer has no 'type'");
  if (type == "Sequence") {
    const json* list = member(*config, "normalizers");
    if (list == nullptr || !list->is_array()) return malformed("a Sequence normalizer needs a 'normalizers' array");
    for (const json& n : *list) CLM_RETURN_IF_ERROR(build_normalizer(&n));
    return {};
  }
  UErrorCode error = U_ZERO_ERROR;
  const icu::Normalizer2* form = nullptr;
  if (type == "NFC") {
    form = icu::Normalizer2::getNFCInstance(error);
  } else if (type == "NFD") {
    form = icu::Normalizer2::getNFDInstance(error);
  } else if (type == "NFKC") {
    form = icu::Normalizer2::getNFKCInstance(error);
  } else if (type == "NFKD") {
    form = icu::Normalizer2::getNFKDInstance(error);
  } else {
    return refused(fmt::format("normalizer '{}' is not supported (NFC, NFD, NFKC, NFKD and Sequence are)", type));
  }
  if (U_FAILURE(error) || form == nullptr) {
    return clm::Status(clm::StatusCode::internal,
                       fmt::format("ICU has no {} normaliser: {}", type, u_errorName(error)));
  }
  normalizers.push_back(form);
  return {};
}

clm::Status HfTokenizer::Impl::check_pre_tokenizer(const json* config) const {
  constexpr const char* kExpected =
      "only Qwen2/Qwen3's pre-tokenizer is supported: a Sequence of Split (their regex, Isolated) and ByteLevel "
      "(use_regex false, add_prefix_space false)";
  if (config == nullptr || !config->is_object()) return refused(fmt::format("no pre_tokenizer; {}", kExpected));
  std::string type;
  if (!type_of(*config, type)) return malformed("the pre_tokenizer has no 'type'");
  const json* list = member(*config, "pretokenizers");
  if (type != "Sequence" || list == nullptr || !list->is_array() || list->size() != 2 || !(*list)[0].is_object() ||
      !(*list)[1].is_object()) {
    return refused(fmt::format("pre_tokenizer '{}': {}", type, kExpected));
  }
  const json& split = (*list)[0];
  const json& byte_level = (*list)[1];
  std::string split_type, byte_level_type;
  if (!type_of(split, split_type) || split_type != "Split" || !type_of(byte_level, byte_level_type) ||
      byte_level_type != "ByteLevel") {
    return refused(kExpected);
  }
  const json* pattern = member(split, "pattern");
  const json* regex = pattern != nullptr && pattern->is_object() ? member(*pattern, "Regex") : nullptr;
  if (regex == nullptr || !regex->is_string())
    return refused(fmt::format("the Split has no Regex pattern; {}", kExpected));
  if (regex->get<std::string>() != kQwenSplitPattern) {
    return refused(fmt::format("Split regex {} is not Qwen's; {}", shown(regex->get<std::string>()), kExpected));
  }
  const json* behavior = member(split, "behavior");
  bool invert = false, prefix_space = false, use_regex = true;
  std::string error;
  if (behavior == nullptr || !behavior->is_string() || behavior->get<std::string>() != "Isolated" ||
      !flag_or(split, "invert", false, invert, error) || invert) {
    return refused(fmt::format("the Split must be Isolated and not inverted; {}", kExpected));
  }
  if (!flag_or(byte_level, "add_prefix_space", true, prefix_space, error) ||
      !flag_or(byte_level, "use_regex", true, use_regex, error)) {
    return malformed("ByteLevel pre-tokenizer: " + error);
  }
  if (prefix_space || use_regex)
    return refused(fmt::format("ByteLevel with add_prefix_space or use_regex; {}", kExpected));
  return {};
}

clm::Status HfTokenizer::Impl::build_model(const json& model) {
  if (!model.is_object()) return malformed("'model' must be an object");
  std::string type;
  if (const json* t = member(model, "type"); t != nullptr) {
    if (!type_of(model, type)) return malformed("model 'type' must be a string");
    if (type != "BPE") return refused(fmt::format("model type '{}' is not supported (BPE is)", type));
  }
  std::string error;
  bool byte_fallback = false;
  if (!flag_or(model, "byte_fallback", false, byte_fallback, error) ||
      !flag_or(model, "ignore_merges", false, ignore_merges, error)) {
    return malformed("model: " + error);
  }
  if (byte_fallback) return refused("BPE with byte_fallback (a SentencePiece-style vocabulary) is not supported");
  if (const json* d = member(model, "dropout"); d != nullptr && !d->is_null()) {
    return refused("BPE dropout is for training; a file that sets it is not supported");
  }
  for (const char* affix : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    const json* a = member(model, affix);
    if (a != nullptr && !a->is_null() && !(a->is_string() && a->get_ref<const std::string&>().empty())) {
      return refused(fmt::format("BPE with a {} is not supported", affix));
    }
  }

  const json* vocab = member(model, "vocab");
  if (vocab == nullptr || !vocab->is_object()) return malformed("model 'vocab' must be an object of token: id");
  const std::array<char32_t, 256> to_char = byte_level_alphabet();
  std::unordered_map<char32_t, std::uint8_t> to_byte;
  for (int b = 0; b < 256; ++b) to_byte[to_char[static_cast<std::size_t>(b)]] = static_cast<std::uint8_t>(b);

  text_to_id.reserve(vocab->size());
  bytes_to_id.reserve(vocab->size());
  for (const auto& [text, id_value] : vocab->items()) {
    if (!id_value.is_number_integer())
      return malformed(fmt::format("vocab token {}: the id is not an integer", shown(text)));
    const auto id64 = id_value.get<std::int64_t>();
    if (id64 < 0 || id64 > kMaxTokenId) {
      return malformed(fmt::format("vocab token {}: id {} is outside 0..{}", shown(text), id64, kMaxTokenId));
    }
    if (text.empty()) return malformed(fmt::format("vocab id {} is the empty string", id64));
    const auto id = static_cast<std::int32_t>(id64);
    if (static_cast<std::size_t>(id) >= token_kind.size()) {
      token_kind.resize(static_cast<std::size_t>(id) + 1, 0);
      token_bytes.resize(static_cast<std::size_t>(id) + 1);
    }
    if (token_kind[static_cast<std::size_t>(id)] != 0) {
      return malformed(fmt::format("vocab id {} is given to two tokens (one is {})", id, shown(text)));
    }
    // The token's bytes: each byte-level character is one byte; a character
    // outside that alphabet stands for its own UTF-8 (as Hugging Face decodes it).
    std::string bytes;
    const auto* p = reinterpret_cast<const std::uint8_t*>(text.data());
    const auto length = static_cast<std::int32_t>(text.size());
    for (std::int32_t at = 0; at < length;) {
      const std::int32_t start = at;
      UChar32 c;
      U8_NEXT(p, at, length, c);
      const auto it = c >= 0 ? to_byte.find(static_cast<char32_t>(c)) : to_byte.end();
      if (it != to_byte.end()) {
        bytes.push_back(static_cast<char>(it->second));
      } else {
        bytes.append(text, static_cast<std::size_t>(start), static_cast<std::size_t>(at - start));
      }
    }
    token_kind[static_cast<std::size_t>(id)] = 1;
    text_to_id.emplace(text, id);
    bytes_to_id.emplace(bytes, id);
    token_bytes[static_cast<std::size_t>(id)] = std::move(bytes);
  }
  // Byte-level BPE starts every piece from its bytes: all 256 must be tokens.
  for (int b = 0; b < 256; ++b) {
    std::string text;
    std::uint8_t buffer[4];
    std::int32_t n = 0;
    U8_APPEND_UNSAFE(buffer, n, static_cast<UChar32>(to_char[static_cast<std::size_t>(b)]));
    text.assign(reinterpret_cast<const char*>(buffer), static_cast<std::size_t>(n));
    const auto it = text_to_id.find(text);
    if (it == text_to_id.end()) {
      return malformed(fmt::format("the vocabulary lacks the byte-level token {} for byte 0x{:02X}", shown(text), b));
    }
    byte_id[static_cast<std::size_t>(b)] = it->second;
  }

  const json* merge_list = member(model, "merges");
  if (merge_list == nullptr || !merge_list->is_array()) return malformed("model 'merges' must be an array");
  merges.reserve(merge_list->size());
  std::uint32_t rank = 0;
  for (const json& m : *merge_list) {
    std::string left, right;
    if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
      left = m[0].get<std::string>();
      right = m[1].get<std::string>();
    } else if (m.is_string()) {  // the format before tokenizers 0.20: "left right"
      const std::string& line = m.get_ref<const std::string&>();
      const std::size_t space = line.find(' ');
      if (space == std::string::npos || line.find(' ', space + 1) != std::string::npos) {
        return malformed(fmt::format("merge {} ({}) is not two tokens separated by one space", rank, shown(line)));
      }
      left = line.substr(0, space);
      right = line.substr(space + 1);
    } else {
      return malformed(fmt::format("merge {} is neither [left, right] nor \"left right\"", rank));
    }
    const auto l = text_to_id.find(left);
    const auto r = text_to_id.find(right);
    const auto merged = text_to_id.find(left + right);
    if (l == text_to_id.end() || r == text_to_id.end()) {
      return malformed(fmt::format("merge {} ({} + {}) references unknown token {}", rank, shown(left), shown(right),
                                   shown(l == text_to_id.end() ? left : right)));
    }
    if (merged == text_to_id.end()) {
      return malformed(fmt::format("merge {} ({} + {}) makes {}, which the vocabulary lacks", rank, shown(left),
                                   shown(right), shown(left + right)));
    }
    merges.insert(l->second, r->second, {rank, merged->second});
    ++rank;
  }
  return {};
}

clm::Status HfTokenizer::Impl::build_added_tokens(const json* config) {
  if (config == nullptr || config->is_null()) return {};
  if (!config->is_array()) return malformed("'added_tokens' must be an array");
  for (const json& t : *config) {
    if (!t.is_object()) return malformed("an added token must be an object");
    const json* id_value = member(t, "id");
    const json* content = member(t, "content");
    if (id_value == nullptr || !id_value->is_number_integer() || content == nullptr || !content->is_string() ||
        content->get_ref<const std::string&>().empty()) {
      return malformed("an added token needs an integer 'id' and a non-empty 'content'");
    }
    AddedToken token;
    token.content = content->get<std::string>();
    const auto id64 = id_value->get<std::int64_t>();
    if (id64 < 0 || id64 > kMaxTokenId) {
      return malformed(fmt::format("added token {}: id {} is outside 0..{}", shown(token.content), id64, kMaxTokenId));
    }
    token.id = static_cast<std::int32_t>(id64);
    bool single_word = false, normalized = false;
    std::string error;
    if (!flag_or(t, "special", false, token.special, error) || !flag_or(t, "lstrip", false, token.lstrip, error) ||
        !flag_or(t, "rstrip", false, token.rstrip, error) || !flag_or(t, "single_word", false, single_word, error) ||
        !flag_or(t, "normalized", false, normalized, error)) {
      return malformed(fmt::format("added token {}: {}", shown(token.content), error));
    }
    if (single_word)
      return refused(fmt::format("added token {} is single_word, which is not supported", shown(token.content)));
    const auto index = static_cast<std::size_t>(token.id);
    if (index >= token_kind.size()) {
      token_kind.resize(index + 1, 0);
      token_bytes.resize(index + 1);
    }
    if (token_kind[index] == 1) {
      // The same token listed in the vocabulary too is fine; another token's id is not.
      const auto it = text_to_id.find(token.content);
      if (it == text_to_id.end() || it->second != token.id) {
        return malformed(fmt::format("added token {} takes id {}, which the vocabulary gives another token",
                                     shown(token.content), token.id));
      }
    } else if (token_kind[index] >= 2) {
      return malformed(fmt::format("two added tokens have id {}", token.id));
    }
    if (const auto it = text_to_id.find(token.content); it != text_to_id.end() && it->second != token.id) {
      return malformed(fmt::format("added token {} has id {}, the vocabulary gives it {}", shown(token.content),
                                   token.id, it->second));
    }
    token_kind[index] = token.special ? 3 : 2;
    token_bytes[index] = token.content;
    text_to_id[token.content] = token.id;
    if (token.content == "<|im_start|>") im_start = token.id;
    if (token.content == "<|im_end|>") im_end = token.id;
    added.push_back(std::move(token));
  }
  // Longest first: at one position the longest added token wins.
  std::stable_sort(added.begin(), added.end(),
                   [](const AddedToken& a, const AddedToken& b) { return a.content.size() > b.content.size(); });
  for (std::size_t i = 0; i < added.size(); ++i) {
    added_by_first_byte[static_cast<std::uint8_t>(added[i].content[0])].push_back(static_cast<std::uint32_t>(i));
  }
  return {};
}

clm::Status HfTokenizer::Impl::build(const json& root) {
  if (!root.is_object()) return malformed("the top level must be an object");
  const json* model = member(root, "model");
  if (model == nullptr) return malformed("there is no 'model'");
  CLM_RETURN_IF_ERROR(build_model(*model));
  CLM_RETURN_IF_ERROR(build_normalizer(member(root, "normalizer")));
  CLM_RETURN_IF_ERROR(check_pre_tokenizer(member(root, "pre_tokenizer")));
  CLM_RETURN_IF_ERROR(build_added_tokens(member(root, "added_tokens")));
  std::string type;
  const json* decoder = member(root, "decoder");
  if (decoder == nullptr || !decoder->is_object() || !type_of(*decoder, type) || type != "ByteLevel") {
    return refused("the decoder must be ByteLevel (byte-level BPE)");
  }
  if (const json* post = member(root, "post_processor"); post != nullptr && !post->is_null()) {
    if (!post->is_object() || !type_of(*post, type) || type != "ByteLevel") {
      return refused(
          "post_processor must be ByteLevel or null: one that adds tokens (TemplateProcessing) is not supported");
    }
  }
  return {};
}

// ---- encode ----------------------------------------------------------------

void HfTokenizer::Impl::bpe(std::string_view piece, std::vector<std::int32_t>& out) const {
  if (piece.size() == 1) {
    out.push_back(byte_id[static_cast<std::uint8_t>(piece[0])]);
    return;
  }
  if (ignore_merges) {
    if (const auto it = bytes_to_id.find(std::string(piece)); it != bytes_to_id.end()) {
      out.push_back(it->second);
      return;
    }
  }
  // Short pieces (nearly all): merge the lowest-ranked pair, leftmost first,
  // until none merges, scanning an array. Long ones: a heap (bpe_long).
  constexpr std::size_t kShort = 64;
  if (piece.size() > kShort) {
    bpe_long(piece, out);
    return;
  }
  std::array<std::int32_t, kShort> ids;
  std::array<MergeTable::Merge, kShort> pair;  // pair[k]: merging ids[k] and ids[k + 1]
  std::size_t n = piece.size();
  for (std::size_t k = 0; k < n; ++k) ids[k] = byte_id[static_cast<std::uint8_t>(piece[k])];
  for (std::size_t k = 0; k + 1 < n; ++k) pair[k] = merges.find(ids[k], ids[k + 1]);
  while (n > 1) {
    std::size_t best = 0;
    for (std::size_t k = 1; k + 1 < n; ++k) {
      if (pair[k].rank < pair[best].rank) best = k;
    }
    if (pair[best].rank == kNoRank) break;
    ids[best] = pair[best].merged;
    for (std::size_t k = best + 1; k + 1 < n; ++k) ids[k] = ids[k + 1];
    for (std::size_t k = best + 1; k + 2 < n; ++k) pair[k] = pair[k + 1];
    --n;
    if (best > 0) pair[best - 1] = merges.find(ids[best - 1], ids[best]);
    if (best + 1 < n) pair[best] = merges.find(ids[best], ids[best + 1]);
  }
  out.insert(out.end(), ids.begin(), ids.begin() + static_cast<std::ptrdiff_t>(n));
}

// The same merges in O(n log n): symbols in a linked list, candidate merges in
// a min-heap by (rank, position); a candidate whose symbols changed is stale
// and skipped when popped, as Hugging Face's word merge does.
void HfTokenizer::Impl::bpe_long(std::string_view piece, std::vector<std::int32_t>& out) const {
  const std::size_t n = piece.size();
  struct Symbol {
    std::int32_t id;
    std::int32_t prev;
    std::int32_t next;
  };
  std::vector<Symbol> symbols(n);
  for (std::size_t k = 0; k < n; ++k) {
    symbols[k] = {byte_id[static_cast<std::uint8_t>(piece[k])], static_cast<std::int32_t>(k) - 1,
                  k + 1 < n ? static_cast<std::int32_t>(k + 1) : -1};
  }
  using Candidate = std::pair<std::uint32_t, std::int32_t>;  // (rank, left symbol)
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<>> heap;
  auto push = [&](std::int32_t left) {
    const std::int32_t right = symbols[static_cast<std::size_t>(left)].next;
    if (right < 0) return;
    const MergeTable::Merge m =
        merges.find(symbols[static_cast<std::size_t>(left)].id, symbols[static_cast<std::size_t>(right)].id);
    if (m.rank != kNoRank) heap.push({m.rank, left});
  };
  for (std::size_t k = 0; k + 1 < n; ++k) push(static_cast<std::int32_t>(k));
  while (!heap.empty()) {
    const auto [rank, left] = heap.top();
    heap.pop();
    Symbol& l = symbols[static_cast<std::size_t>(left)];
    if (l.id < 0 || l.next < 0) continue;  // merged away, or nothing to its right any more
    Symbol& r = symbols[static_cast<std::size_t>(l.next)];
    const MergeTable::Merge m = merges.find(l.id, r.id);
    if (m.rank != rank) continue;  // stale: one of the two changed since
    l.id = m.merged;
    r.id = -1;
    l.next = r.next;
    if (r.next >= 0) symbols[static_cast<std::size_t>(r.next)].prev = left;
    if (l.prev >= 0) push(l.prev);
    push(left);
  }
  for (std::int32_t k = 0; k >= 0; k = symbols[static_cast<std::size_t>(k)].next) {
    out.push_back(symbols[static_cast<std::size_t>(k)].id);
  }
}

namespace {

// A ByteSink into a std::string, without ICU's template (which needs RTTI-free builds to agree on it).
class StringSink : public icu::ByteSink {
 public:
  explicit StringSink(std::string& out) : out_(out) {}
  void Append(const char* bytes, int32_t n) override { out_.append(bytes, static_cast<std::size_t>(n)); }

 private:
  std::string& out_;
};

}  // namespace

void HfTokenizer::Impl::encode_plain(std::string_view segment, SplitScratch& scratch, std::vector<Piece>& pieces,
                                     std::vector<std::int32_t>& out) const {
  if (segment.empty()) return;
  std::string normalized;
  for (const icu::Normalizer2* form : normalizers) {
    UErrorCode error = U_ZERO_ERROR;
    const icu::StringPiece in(segment.data(), static_cast<std::int32_t>(segment.size()));
    if (form->isNormalizedUTF8(in, error) && U_SUCCESS(error)) continue;  // most text: no copy
    std::string next;
    StringSink sink(next);
    error = U_ZERO_ERROR;
    form->normalizeUTF8(0, in, sink, nullptr, error);
    if (U_FAILURE(error)) continue;  // only on invalid UTF-8, which encode refused before
    normalized = std::move(next);
    segment = normalized;
  }
  pieces.clear();
  split_qwen_pieces(segment, scratch, pieces);
  for (const Piece& p : pieces) bpe(segment.substr(p.begin, p.end - p.begin), out);
}

HfTokenizer::HfTokenizer() = default;
HfTokenizer::~HfTokenizer() = default;
HfTokenizer::HfTokenizer(HfTokenizer&&) noexcept = default;
HfTokenizer& HfTokenizer::operator=(HfTokenizer&&) noexcept = default;

clm::Status HfTokenizer::parse(std::string_view json_text, HfTokenizer& out) {
  try {
    json root = json::parse(json_text, nullptr, /*allow_exceptions=*/false);
    if (root.is_discarded()) return malformed("not valid JSON");
    auto impl = std::make_unique<Impl>();
    CLM_RETURN_IF_ERROR(impl->build(root));
    out.impl_ = std::move(impl);
    return {};
  } catch (const std::bad_alloc&) {
    return clm::out_of_memory("tokenizer.json: out of memory while loading");
  } catch (const std::exception& e) {  // nlohmann's type errors, should a check above miss one
    return malformed(e.what());
  }
}

clm::Status HfTokenizer::load(const std::string& path, HfTokenizer& out) {
  std::ifstream file(path, std::ios::binary);
  if (!file) return clm::io_error(fmt::format("cannot open tokenizer file '{}'", path));
  std::ostringstream text;
  text << file.rdbuf();
  if (file.bad()) return clm::io_error(fmt::format("cannot read tokenizer file '{}'", path));
  clm::Status s = parse(text.view(), out);
  if (!s.ok()) return clm::Status(s.code(), fmt::format("{}: {}", path, s.message()));
  return s;
}

std::int32_t HfTokenizer::vocab_size() const { return impl_ ? static_cast<std::int32_t>(impl_->token_kind.size()) : 0; }

clm::Status HfTokenizer::encode(std::string_view text, std::vector<std::int32_t>& out, SpecialTokens special) const {
  if (!impl_) return clm::failed_precondition("encode: no tokenizer loaded");
  if (text.size() >= std::numeric_limits<std::uint32_t>::max()) {
    return clm::invalid_argument("encode: a text of 4 GiB or more");
  }
  if (const std::size_t bad = first_invalid_utf8(text); bad != std::string_view::npos) {
    return clm::invalid_argument(
        fmt::format("encode: invalid UTF-8 at byte {} (0x{:02X})", bad, static_cast<std::uint8_t>(text[bad])));
  }
  const std::size_t first_new = out.size();
  try {
    const Impl& t = *impl_;
    SplitScratch scratch;
    std::vector<Piece> pieces;
    std::size_t segment_start = 0;
    std::size_t at = 0;
    bool strip_leading = false;  // the added token before this segment has rstrip
    auto flush = [&](std::size_t end, bool strip_trailing) {
      std::string_view segment = text.substr(segment_start, end - segment_start);
      // lstrip/rstrip: the whitespace beside such a token belongs to it.
      if (strip_leading) segment = trim_white_space(segment, /*front=*/true);
      if (strip_trailing) segment = trim_white_space(segment, /*front=*/false);
      t.encode_plain(segment, scratch, pieces, out);
    };
    while (at < text.size()) {
      const AddedToken* match = nullptr;
      for (const std::uint32_t index : t.added_by_first_byte[static_cast<std::uint8_t>(text[at])]) {
        const AddedToken& candidate = t.added[index];
        if (special == SpecialTokens::as_text && candidate.special) continue;
        if (text.compare(at, candidate.content.size(), candidate.content) == 0) {
          match = &candidate;
          break;  // longest first
        }
      }
      if (match == nullptr) {
        ++at;
        continue;
      }
      flush(at, match->lstrip);
      out.push_back(match->id);
      at += match->content.size();
      segment_start = at;
      strip_leading = match->rstrip;
    }
    flush(text.size(), false);
    return {};
  } catch (const std::bad_alloc&) {
    out.resize(first_new);
    return clm::out_of_memory("encode: out of memory");
  }
}

clm::Status HfTokenizer::decode_bytes(std::span<const std::int32_t> ids, std::string& out) const {
  if (!impl_) return clm::failed_precondition("decode: no tokenizer loaded");
  for (const std::int32_t id : ids) {
    if (id < 0 || static_cast<std::size_t>(id) >= impl_->token_kind.size() ||
        impl_->token_kind[static_cast<std::size_t>(id)] == 0) {
      return clm::invalid_argument(fmt::format("decode: {} is not a token id of this tokenizer", id));
    }
  }
  for (const std::int32_t id : ids) out += impl_->token_bytes[static_cast<std::size_t>(id)];
  return {};
}

clm::Status HfTokenizer::decode(std::span<const std::int32_t> ids, std::string& out) const {
  std::string bytes;
  CLM_RETURN_IF_ERROR(decode_bytes(ids, bytes));
  out.clear();
  append_lossy_utf8(bytes, out);
  return {};
}

clm::Status HfTokenizer::token_id(std::string_view token, std::int32_t& id) const {
  if (!impl_) return clm::failed_precondition("token_id: no tokenizer loaded");
  const auto it = impl_->text_to_id.find(std::string(token));
  if (it == impl_->text_to_id.end()) return clm::not_found(fmt::format("no token {}", shown(token)));
  id = it->second;
  return {};
}

bool HfTokenizer::is_special(std::int32_t id) const {
  return impl_ && id >= 0 && static_cast<std::size_t>(id) < impl_->token_kind.size() &&
         impl_->token_kind[static_cast<std::size_t>(id)] == 3;
}

std::int32_t HfTokenizer::end_of_turn_id() const { return impl_ ? impl_->im_end : -1; }

clm::Status HfTokenizer::append_chat_message(const ChatMessage& message, std::vector<std::int32_t>& out) const {
  if (!impl_) return clm::failed_precondition("chat template: no tokenizer loaded");
  if (impl_->im_start < 0 || impl_->im_end < 0) {
    return clm::failed_precondition("chat template: this tokenizer has no <|im_start|> and <|im_end|> tokens");
  }
  // One segment as the rendered template gives it: "role\ncontent" between
  // the markers, so the pieces are those of the whole rendered string.
  std::vector<std::int32_t> ids{impl_->im_start};
  CLM_RETURN_IF_ERROR(encode(message.role + "\n" + message.content, ids, SpecialTokens::as_text));
  ids.push_back(impl_->im_end);
  CLM_RETURN_IF_ERROR(encode("\n", ids));
  out.insert(out.end(), ids.begin(), ids.end());
  return {};
}

clm::Status HfTokenizer::append_generation_prompt(std::vector<std::int32_t>& out) const {
  if (!impl_) return clm::failed_precondition("chat template: no tokenizer loaded");
  if (impl_->im_start < 0) return clm::failed_precondition("chat template: this tokenizer has no <|im_start|> token");
  std::vector<std::int32_t> ids{impl_->im_start};
  CLM_RETURN_IF_ERROR(encode("assistant\n", ids));
  out.insert(out.end(), ids.begin(), ids.end());
  return {};
}

clm::Status HfTokenizer::apply_chat_template(std::span<const ChatMessage> messages, std::vector<std::int32_t>& out,
                                             bool add_generation_prompt) const {
  std::vector<std::int32_t> ids;
  for (const ChatMessage& m : messages) CLM_RETURN_IF_ERROR(append_chat_message(m, ids));
  if (add_generation_prompt) CLM_RETURN_IF_ERROR(append_generation_prompt(ids));
  out.insert(out.end(), ids.begin(), ids.end());
  return {};
}

}  // namespace clm_tokenizer
