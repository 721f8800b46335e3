// lib/store/chinese_fold.cpp: Traditional-to-Simplified folding with OpenCC
// (chinese_fold.hpp).
//
// OpenCC looks a dictionary named in a configuration up in the working
// directory before the configuration's own folder, so a TSPhrases.ocd2 in the
// host's working directory would change every key. The configuration is
// therefore read here, each dictionary's file name made absolute (the
// configuration's folder), and handed to OpenCC as text: the dictionaries
// loaded are the ones hashed into config_name(), wherever the host runs.
#include "chinese_fold.hpp"

#include <fmt/format.h>
#include <opencc/Config.hpp>
#include <opencc/Converter.hpp>
#include <opencc/Exception.hpp>

#include <cstdint>
#include <exception>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <new>
#include <sstream>
#include <utility>
#include <vector>

#include "clm/store/suffix_key.hpp"
#include "suffix_text.hpp"

#ifndef CLM_OPENCC_T2S_CONFIG
#error "CLM_OPENCC_T2S_CONFIG (the path of OpenCC's t2s.json) comes from lib/store/CMakeLists.txt"
#endif
#ifndef CLM_OPENCC_VERSION
#error "CLM_OPENCC_VERSION comes from lib/store/CMakeLists.txt"
#endif

namespace clm::store_detail {

namespace {

Status read_file(const std::string& path, std::string& out) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return io_error(fmt::format("chinese fold: cannot open {} (is libopencc-data installed?)", path));
  std::ostringstream buf;
  buf << in.rdbuf();
  if (in.bad()) return io_error(fmt::format("chinese fold: cannot read {}", path));
  out = std::move(buf).str();
  return {};
}

// The folder of `path`, with its trailing '/'; empty for a bare file name.
std::string folder_of(const std::string& path) {
  const auto slash = path.rfind('/');
  return slash == std::string::npos ? std::string() : path.substr(0, slash + 1);
}

std::string file_name_of(const std::string& path) {
  const auto slash = path.rfind('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

constexpr bool is_json_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

// Rewrites each "file": "NAME" of an OpenCC configuration to "folder + NAME"
// (a NAME that is already absolute stays), listing the paths in `files`. A
// small scan, not a JSON parser: OpenCC parses the result, and a "file" value
// with an escape in it (none in OpenCC's own configurations) is refused.
Status absolute_dict_paths(const std::string& config, const std::string& folder, std::string& out,
                           std::vector<std::string>& files) {
  static constexpr std::string_view kKey = "\"file\"";
  out.clear();
  files.clear();
  std::size_t pos = 0;
  while (true) {
    const auto key = config.find(kKey, pos);
    if (key == std::string::npos) break;
    std::size_t i = key + kKey.size();
    auto skip_space = [&] {
      while (i < config.size() && is_json_space(config[i])) ++i;
    };
    skip_space();
    if (i >= config.size() || config[i] != ':') {  // "file" as a value, not a key
      out.append(config, pos, i - pos);
      pos = i;
      continue;
    }
    ++i;
    skip_space();
    if (i >= config.size() || config[i] != '"') return invalid_argument("chinese fold: a \"file\" that is no string");
    ++i;
    const auto end = config.find('"', i);
    if (end == std::string::npos) return invalid_argument("chinese fold: an unterminated \"file\" string");
    std::string name = config.substr(i, end - i);
    if (name.empty() || name.find('\\') != std::string::npos) {
      return invalid_argument(fmt::format("chinese fold: unsupported dictionary file name \"{}\"", name));
    }
    if (name.front() != '/') name = folder + name;
    out.append(config, pos, i - pos);
    out += name;
    files.push_back(std::move(name));
    pos = end;
  }
  out.append(config, pos, std::string::npos);
  if (files.empty()) return invalid_argument("chinese fold: the configuration names no dictionary");
  return {};
}

}  // namespace

ChineseFolder::~ChineseFolder() = default;

Status ChineseFolder::create(std::unique_ptr<ChineseFolder>& out) { return create(CLM_OPENCC_T2S_CONFIG, out); }

Status ChineseFolder::create(const std::string& config_path, std::unique_ptr<ChineseFolder>& out) {
  try {
    // Absolute, so that no dictionary is looked up in the working directory.
    const std::string path = std::filesystem::absolute(config_path).string();
    const std::string folder = folder_of(path);
    if (folder.find_first_of("\"\\") != std::string::npos) {
      return invalid_argument(fmt::format("chinese fold: unsupported folder {} (a quote or backslash)", folder));
    }
    std::string config;
    CLM_RETURN_IF_ERROR(read_file(path, config));
    std::string json;
    std::vector<std::string> files;
    if (Status s = absolute_dict_paths(config, folder, json, files); !s.ok()) {
      return invalid_argument(fmt::format("{} ({})", s.message(), path));
    }
    // What config_name() hashes: the configuration, then each dictionary's
    // file name and bytes, in the order the configuration names them.
    std::string hashed = config;
    for (const std::string& f : files) {
      std::string bytes;
      CLM_RETURN_IF_ERROR(read_file(f, bytes));
      hashed += '\0';
      hashed += file_name_of(f);
      hashed += '\0';
      hashed += bytes;
    }

    std::unique_ptr<ChineseFolder> folder_out(new ChineseFolder());
    opencc::Config opencc_config;
    // NewFromString parses its argument in place: `json` is not used again.
    folder_out->converter_ = opencc_config.NewFromString(json, "");
    if (!folder_out->converter_) return {StatusCode::internal, "chinese fold: OpenCC returned no converter"};
    folder_out->config_name_ =
        fmt::format("OpenCC {} {} data:{:016x}", CLM_OPENCC_VERSION, file_name_of(path), key_fingerprint(hashed));
    out = std::move(folder_out);
    return {};
  } catch (const std::bad_alloc&) {
    return out_of_memory("chinese fold: out of host memory opening OpenCC");
  } catch (const opencc::Exception& e) {
    return io_error(fmt::format("chinese fold: OpenCC cannot load {}: {}", config_path, e.what()));
  } catch (const std::exception& e) {
    return io_error(fmt::format("chinese fold: OpenCC cannot load {}: {}", config_path, e.what()));
  } catch (...) {
    return {StatusCode::internal, fmt::format("chinese fold: OpenCC threw opening {}", config_path)};
  }
}

Status ChineseFolder::fold(std::string_view utf8, std::string& out) const {
  // Checked before OpenCC sees anything (it assumes well-formed UTF-8), and
  // the fast path: no CJK code point, nothing to fold.
  bool any_cjk = false;
  for (std::size_t i = 0; i < utf8.size();) {
    const std::size_t at = i;
    char32_t cp = 0;
    if (!decode_utf8(utf8, i, cp)) return invalid_argument(fmt::format("invalid UTF-8 at byte {}", at));
    any_cjk = any_cjk || is_cjk_ideograph(cp);
  }
  try {
    if (!any_cjk) {
      out.assign(utf8.data(), utf8.size());  // assign copes with `utf8` viewing `out`
      return {};
    }
    std::string folded;
    folded.reserve(utf8.size());
    std::unique_lock<std::mutex> lock(mu_, std::defer_lock);
    std::string run;
    for (std::size_t i = 0; i < utf8.size();) {
      const std::size_t start = i;
      char32_t cp = 0;
      decode_utf8(utf8, i, cp);  // well-formed: checked above
      if (!is_cjk_ideograph(cp)) {
        folded.append(utf8.data() + start, i - start);
        continue;
      }
      // The maximal run of CJK code points from here.
      std::size_t end = i;
      while (end < utf8.size()) {
        std::size_t next = end;
        decode_utf8(utf8, next, cp);
        if (!is_cjk_ideograph(cp)) break;
        end = next;
      }
      run.assign(utf8.data() + start, end - start);
      if (!lock.owns_lock()) lock.lock();
      folded += converter_->Convert(run);
      i = end;
    }
    out = std::move(folded);
    return {};
  } catch (const std::bad_alloc&) {
    return out_of_memory("chinese fold: out of host memory");
  } catch (const opencc::Exception& e) {
    return {StatusCode::internal, fmt::format("chinese fold: OpenCC failed: {}", e.what())};
  } catch (const std::exception& e) {
    return {StatusCode::internal, fmt::format("chinese fold: OpenCC failed: {}", e.what())};
  } catch (...) {
    return {StatusCode::internal, "chinese fold: OpenCC threw"};
  }
}

}  // namespace clm::store_detail
