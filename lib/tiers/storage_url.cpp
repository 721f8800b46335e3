// lib/tiers/storage_url.cpp: storage tier URLs (clm/tiers/storage_url.hpp) and
// open_storage_backend, which sends each scheme to its backend.
#include "clm/tiers/storage_url.hpp"

#include <algorithm>
#include <charconv>
#include <cstdint>
#include <limits>
#include <new>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "clm/tiers/page_file.hpp"
#include "clm/tiers/storage_backend.hpp"
#include "storage_backends.hpp"

namespace clm {

namespace {

// The largest numbers the options take: beyond them a value is a typo, and
// capacity_mb << 20 must fit in 64 bits.
constexpr std::uint64_t kMaxCapacityMb = std::uint64_t{1} << 40;
constexpr std::uint64_t kMaxTtlS = std::numeric_limits<std::int32_t>::max();
constexpr std::uint64_t kMaxTimeoutMs = 3'600'000;
constexpr std::uint64_t kMaxDb = std::numeric_limits<std::int32_t>::max();

int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// %XX escapes decoded; '+' stays '+' (these are not form fields). A decoded
// NUL is refused: paths and prefixes are C strings somewhere below.
Status percent_decode(std::string_view in, std::string_view what, std::string& out) {
  out.clear();
  for (std::size_t i = 0; i < in.size(); ++i) {
    if (in[i] != '%') {
      out.push_back(in[i]);
      continue;
    }
    const bool complete = i + 2 < in.size();
    const int hi = complete ? hex_value(in[i + 1]) : -1;
    const int lo = complete ? hex_value(in[i + 2]) : -1;
    if (hi < 0 || lo < 0) return invalid_argument(fmt::format("{}: bad %-escape at '{}'", what, in.substr(i, 3)));
    if (hi == 0 && lo == 0) return invalid_argument(fmt::format("{}: %00 (a NUL byte) is not allowed", what));
    out.push_back(static_cast<char>(hi * 16 + lo));
    i += 2;
  }
  return {};
}

// A decimal number in 0..max, digits only (no sign, no spaces, no suffix).
Status parse_number(std::string_view text, std::uint64_t max, std::string_view what, std::uint64_t& out) {
  std::uint64_t v = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (text.empty() || ec == std::errc::invalid_argument || end != text.data() + text.size()) {
    return invalid_argument(fmt::format("{}: '{}' is not a non-negative integer", what, text));
  }
  if (ec == std::errc::result_out_of_range || v > max) {
    return invalid_argument(fmt::format("{}: {} is over the largest allowed, {}", what, text, max));
  }
  out = v;
  return {};
}

struct Option {
  std::string name;
  std::string value;  // decoded
};

// "a=1&b=x%20y" -> {a, 1}, {b, x y}. Empty segments (a trailing '&') are skipped.
Status parse_query(std::string_view query, std::string_view what, std::vector<Option>& out) {
  std::set<std::string, std::less<>> seen;
  while (!query.empty()) {
    const std::size_t amp = query.find('&');
    const std::string_view part = query.substr(0, amp);
    query = amp == std::string_view::npos ? std::string_view{} : query.substr(amp + 1);
    if (part.empty()) continue;
    const std::size_t eq = part.find('=');
    if (eq == std::string_view::npos) {
      return invalid_argument(fmt::format("{}: option '{}' has no value (name=value)", what, part));
    }
    Option option;
    option.name = std::string(part.substr(0, eq));
    if (option.name.empty()) return invalid_argument(fmt::format("{}: option '{}' has no name", what, part));
    if (!seen.insert(option.name).second) {
      return invalid_argument(fmt::format("{}: option '{}' given twice", what, option.name));
    }
    CLM_RETURN_IF_ERROR(
        percent_decode(part.substr(eq + 1), fmt::format("{}: option {}", what, option.name), option.value));
    out.push_back(std::move(option));
  }
  return {};
}

Status parse_file_url(std::string_view location, std::string_view query, std::string_view what, StorageUrl& u) {
  CLM_RETURN_IF_ERROR(percent_decode(location, fmt::format("{}: path", what), u.path));
  if (u.path.empty()) return invalid_argument(fmt::format("{}: empty path (file:///some/dir)", what));
  std::vector<Option> options;
  CLM_RETURN_IF_ERROR(parse_query(query, what, options));
  for (const Option& o : options) {
    if (o.name == "capacity_mb") {
      CLM_RETURN_IF_ERROR(parse_number(o.value, kMaxCapacityMb, fmt::format("{}: capacity_mb", what), u.capacity_mb));
    } else {
      return invalid_argument(fmt::format("{}: unknown option '{}' (file:// takes capacity_mb)", what, o.name));
    }
  }
  return {};
}

Status parse_redis_url(std::string_view location, std::string_view query, std::string_view what, StorageUrl& u) {
  // Credentials end at the last '@' (a raw '/' in a password stays in it, as
  // redact_storage_url reads it); the host and db follow.
  std::string_view userinfo;
  bool has_userinfo = false;
  if (const std::size_t at = location.rfind('@'); at != std::string_view::npos) {
    userinfo = location.substr(0, at);
    location = location.substr(at + 1);
    has_userinfo = true;
  }
  const std::size_t slash = location.find('/');
  const std::string_view authority = location.substr(0, slash);
  const std::string_view db = slash == std::string_view::npos ? std::string_view{} : location.substr(slash + 1);
  if (has_userinfo) {
    const std::size_t colon = userinfo.find(':');  // none: the password comes from password_file
    CLM_RETURN_IF_ERROR(percent_decode(userinfo.substr(0, colon), fmt::format("{}: user", what), u.user));
    if (colon != std::string_view::npos) {
      CLM_RETURN_IF_ERROR(percent_decode(userinfo.substr(colon + 1), fmt::format("{}: password", what), u.password));
      if (u.password.empty()) return invalid_argument(fmt::format("{}: an empty password", what));
    }
  }
  std::string_view host = authority;
  std::string_view port;
  bool has_port = false;
  if (!authority.empty() && authority.front() == '[') {
    const std::size_t close = authority.find(']');
    if (close == std::string_view::npos) return invalid_argument(fmt::format("{}: '[' without ']' in the host", what));
    host = authority.substr(1, close - 1);
    const std::string_view after = authority.substr(close + 1);
    if (!after.empty()) {
      if (after.front() != ':') {
        return invalid_argument(fmt::format("{}: '{}' after the IPv6 host, expected ':port'", what, after));
      }
      has_port = true;
      port = after.substr(1);
    }
  } else if (const std::size_t colon = authority.find(':'); colon != std::string_view::npos) {
    if (authority.find(':', colon + 1) != std::string_view::npos) {
      return invalid_argument(fmt::format("{}: an IPv6 host must be in brackets, [::1]:6379", what));
    }
    host = authority.substr(0, colon);
    has_port = true;
    port = authority.substr(colon + 1);
  }
  if (host.empty()) return invalid_argument(fmt::format("{}: no host (redis://host:port/db)", what));
  CLM_RETURN_IF_ERROR(percent_decode(host, fmt::format("{}: host", what), u.host));
  if (has_port) {
    std::uint64_t p = 0;
    CLM_RETURN_IF_ERROR(parse_number(port, 65535, fmt::format("{}: port", what), p));
    if (p == 0) return invalid_argument(fmt::format("{}: port 0 (must be 1..65535)", what));
    u.port = static_cast<std::int32_t>(p);
  }
  if (!db.empty()) {
    std::uint64_t d = 0;
    CLM_RETURN_IF_ERROR(parse_number(db, kMaxDb, fmt::format("{}: database number", what), d));
    u.db = static_cast<std::int32_t>(d);
  }
  std::vector<Option> options;
  CLM_RETURN_IF_ERROR(parse_query(query, what, options));
  for (const Option& o : options) {
    std::uint64_t v = 0;
    if (o.name == "prefix") {
      u.prefix = o.value;
    } else if (o.name == "ttl") {
      CLM_RETURN_IF_ERROR(parse_number(o.value, kMaxTtlS, fmt::format("{}: ttl", what), v));
      u.ttl_s = static_cast<std::int64_t>(v);
    } else if (o.name == "password_file") {
      if (o.value.empty()) return invalid_argument(fmt::format("{}: password_file is empty", what));
      u.password_file = o.value;
    } else if (o.name == "timeout_ms") {
      CLM_RETURN_IF_ERROR(parse_number(o.value, kMaxTimeoutMs, fmt::format("{}: timeout_ms", what), v));
      if (v == 0) return invalid_argument(fmt::format("{}: timeout_ms 0 (must be at least 1)", what));
      u.timeout_ms = static_cast<std::int32_t>(v);
    } else {
      return invalid_argument(
          fmt::format("{}: unknown option '{}' (redis:// takes prefix, ttl, timeout_ms, password_file)", what, o.name));
    }
  }
  if (!u.password.empty() && !u.password_file.empty()) {
    return invalid_argument(fmt::format("{}: a password both in the URL and in password_file (give one)", what));
  }
  if (has_userinfo && u.password.empty() && u.password_file.empty()) {
    return invalid_argument(
        fmt::format("{}: a user without a password (redis://user:password@host, or password_file=)", what));
  }
  return {};
}

Status parse_storage_url_unguarded(std::string_view url, StorageUrl& out) {
  const std::string what = fmt::format("storage URL '{}'", redact_storage_url(url));
  if (url.find('#') != std::string_view::npos) return invalid_argument(fmt::format("{}: a fragment (#)", what));
  const std::size_t sep = url.find("://");
  if (sep == std::string_view::npos) return invalid_argument(fmt::format("{}: no scheme (file:// or redis://)", what));
  const std::string_view scheme = url.substr(0, sep);
  const std::string_view rest = url.substr(sep + 3);
  const std::size_t question = rest.find('?');
  const std::string_view location = rest.substr(0, question);
  const std::string_view query = question == std::string_view::npos ? std::string_view{} : rest.substr(question + 1);
  StorageUrl u;
  if (scheme == "file") {
    u.scheme = StorageUrl::Scheme::file;
    CLM_RETURN_IF_ERROR(parse_file_url(location, query, what, u));
  } else if (scheme == "redis") {
    u.scheme = StorageUrl::Scheme::redis;
    CLM_RETURN_IF_ERROR(parse_redis_url(location, query, what, u));
  } else {
    return invalid_argument(fmt::format("{}: unknown scheme '{}' (file:// or redis://)", what, scheme));
  }
  out = std::move(u);
  return {};
}

}  // namespace

Status parse_storage_url(std::string_view url, StorageUrl& out) {
  try {
    return parse_storage_url_unguarded(url, out);
  } catch (const std::bad_alloc&) {
    return out_of_memory("parse_storage_url: out of memory");
  }
}

std::string redact_storage_url(std::string_view url) {
  std::string out(url);
  const std::size_t sep = out.find("://");
  if (sep == std::string::npos) return out;
  const std::size_t start = sep + 3;
  // Up to the query: a raw '#' (or '/') in a password is hidden too, though
  // the parser then refuses the URL (a fragment) and names it in its message.
  const std::size_t end = std::min(out.find('?', start), out.size());
  const std::size_t at = end > start ? out.rfind('@', end - 1) : std::string::npos;
  if (at == std::string::npos || at < start) return out;
  const std::size_t colon = out.find(':', start);
  if (colon == std::string::npos || colon > at) return out;  // no password: nothing to hide
  return out.replace(colon + 1, at - colon - 1, "***");
}

Status open_storage_backend(std::string_view url, const PageLayout& layout, const PageSeal& seal,
                            std::unique_ptr<StorageBackend>& out) {
  StorageUrl parsed;
  CLM_RETURN_IF_ERROR(parse_storage_url(url, parsed));
  CLM_RETURN_IF_ERROR(check_page_layout(layout));
  if (seal.model == Digest32{}) {
    return invalid_argument(
        "open_storage_backend: no model id in the seal (PageSeal::create): pages of every model "
        "would share one name");
  }
  try {
    switch (parsed.scheme) {
      case StorageUrl::Scheme::file:
        return tiers_detail::open_file_backend(parsed, redact_storage_url(url), layout, seal, out);
      case StorageUrl::Scheme::redis:
        return tiers_detail::open_redis_backend(parsed, redact_storage_url(url), layout, seal, out);
    }
  } catch (const std::bad_alloc&) {
    return out_of_memory("open_storage_backend: out of memory");
  }
  return Status(StatusCode::internal, "open_storage_backend: unhandled scheme");
}

}  // namespace clm
