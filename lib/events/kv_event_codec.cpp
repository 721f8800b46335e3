// lib/events/kv_event_codec.cpp: KV events to and from msgpack
// (clm/events/kv_event.hpp), through msgpack-c (Debian's libmsgpack-cxx-dev,
// header-only, used without Boost).
#include <msgpack.hpp>

#include <fmt/format.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>

#include "clm/events/kv_event.hpp"

namespace clm {

namespace {

constexpr std::string_view kStored = "BlockStored", kRemoved = "BlockRemoved", kCleared = "AllBlocksCleared";

// msgpack-c's stream over the caller's string: a publisher that encodes each
// batch into the same string reuses its capacity, so a steady stream of
// batches allocates (and page-faults in) no new memory.
struct StringStream {
  std::string& out;
  void write(const char* data, std::size_t n) { out.append(data, n); }
};
using Packer = msgpack::packer<StringStream>;

// One int32 as msgpack-c's pack_int32 writes it (the shortest form); returns
// the byte after it.
char* put_int32(char* at, std::int32_t v) {
  const auto u = static_cast<std::uint32_t>(v);
  auto put_be = [&](unsigned char tag, int bytes) {
    *at++ = static_cast<char>(tag);
    for (int b = bytes - 1; b >= 0; --b) *at++ = static_cast<char>((u >> (8 * b)) & 0xffu);
  };
  if (v < -(1 << 5)) {
    if (v < -(1 << 15)) {
      put_be(0xd2, 4);
    } else if (v < -(1 << 7)) {
      put_be(0xd1, 2);
    } else {
      put_be(0xd0, 1);
    }
  } else if (v < (1 << 7)) {
    *at++ = static_cast<char>(u & 0xffu);  // positive or negative fixint
  } else if (v < (1 << 8)) {
    put_be(0xcc, 1);
  } else if (v < (1 << 16)) {
    put_be(0xcd, 2);
  } else {
    put_be(0xce, 4);
  }
  return at;
}

// An array of token ids, written in one pass into room made for the longest
// form (five bytes an id) instead of one stream write per id: token ids are
// most of a batch's bytes.
// A non-negative id is written as one little-endian 8-byte store of its form
// (tag and big-endian value) and an advance by the form's length, with no
// branch on its width; negative ids (an engine has none) take put_int32.
void pack_token_ids(Packer& p, std::string& out, std::span<const std::int32_t> ids) {
  static_assert(std::endian::native == std::endian::little, "the 8-byte store writes the tag first");
  p.pack_array(static_cast<std::uint32_t>(ids.size()));
  const std::size_t at = out.size();
  out.resize(at + 5 * ids.size() + 3);  // + 3: the last 8-byte store's slack
  char* w = out.data() + at;
  for (std::int32_t t : ids) {
    if (t < 0) {
      w = put_int32(w, t);
      continue;
    }
    const auto u = static_cast<std::uint32_t>(t);
    const std::uint64_t forms[4] = {
        u,                                                                               // fixint
        0xccu | (std::uint64_t{u} << 8),                                                 // uint8
        0xcdu | (std::uint64_t{__builtin_bswap16(static_cast<std::uint16_t>(u))} << 8),  // uint16
        0xceu | (std::uint64_t{__builtin_bswap32(u)} << 8)};                             // uint32
    const int form = (u >= 128u) + (u >= 256u) + (u >= 65536u);
    std::memcpy(w, &forms[form], 8);
    w += (0x05030201u >> (8 * form)) & 0xffu;  // 1, 2, 3 or 5 bytes
  }
  out.resize(static_cast<std::size_t>(w - out.data()));
}

void pack_string(Packer& p, std::string_view s) {
  p.pack_str(static_cast<std::uint32_t>(s.size()));
  p.pack_str_body(s.data(), static_cast<std::uint32_t>(s.size()));
}

// Always 0xcf and 8 bytes: llm-d refuses hashes in narrower integers.
void pack_hashes(Packer& p, std::span<const std::uint64_t> hashes) {
  p.pack_array(static_cast<std::uint32_t>(hashes.size()));
  for (std::uint64_t h : hashes) p.pack_fix_uint64(h);
}

void pack_extra_keys(Packer& p, const KvEventView& e) {
  p.pack_array(static_cast<std::uint32_t>(e.block_hashes.size()));
  for (std::size_t i = 0; i < e.block_hashes.size(); ++i) {
    if (e.extra_key.empty()) {
      p.pack_nil();
    } else {
      p.pack_array(1);
      pack_string(p, e.extra_key);
    }
  }
}

// Always 0xcb and 8 bytes of IEEE float64: msgpack-c's pack_double writes a
// whole number as an integer, and AIBrix refuses a ts that is not a float64.
void pack_float64(StringStream& buffer, double d) {
  std::uint64_t bits;
  std::memcpy(&bits, &d, sizeof bits);
  char out[9];
  out[0] = static_cast<char>(0xcb);
  for (int i = 8; i >= 1; --i, bits >>= 8) out[i] = static_cast<char>(bits & 0xff);
  buffer.write(out, sizeof out);
}

void pack_optional_int(Packer& p, const std::optional<std::int32_t>& v) {
  if (v) {
    p.pack_int32(*v);
  } else {
    p.pack_nil();
  }
}

Status check_event(const KvEventView& e) {
  if (e.kind != KvEventKind::block_stored) return {};
  if (e.block_size < 1) return invalid_argument(fmt::format("KV event: block_size {} (>= 1 expected)", e.block_size));
  // None at all is allowed: KvEventsConfig::token_ids off.
  if (!e.token_ids.empty() && e.token_ids.size() != e.block_hashes.size() * static_cast<std::size_t>(e.block_size)) {
    return invalid_argument(fmt::format("KV event: {} token ids for {} blocks of {} (all or none)", e.token_ids.size(),
                                        e.block_hashes.size(), e.block_size));
  }
  return {};
}

void pack_event_array(Packer& p, std::string& out, const KvEventView& e, bool legacy) {
  switch (e.kind) {
    case KvEventKind::block_stored:
      p.pack_array(legacy ? 7 : 12);
      pack_string(p, kStored);
      pack_hashes(p, e.block_hashes);
      if (e.parent_block_hash) {
        p.pack_fix_uint64(*e.parent_block_hash);
      } else {
        p.pack_nil();
      }
      pack_token_ids(p, out, e.token_ids);
      p.pack_int32(e.block_size);
      pack_optional_int(p, e.lora_id);
      pack_string(p, kv_medium_name(e.medium));
      if (legacy) return;
      p.pack_nil();  // lora_name: the host names its adapters by id
      pack_extra_keys(p, e);
      p.pack_int32(0);  // group_idx: one KV cache group
      pack_string(p, "full_attention");
      p.pack_nil();  // kv_cache_spec_sliding_window
      return;
    case KvEventKind::block_removed:
      p.pack_array(legacy ? 3 : 4);
      pack_string(p, kRemoved);
      pack_hashes(p, e.block_hashes);
      pack_string(p, kv_medium_name(e.medium));
      if (!legacy) p.pack_int32(0);
      return;
    case KvEventKind::all_blocks_cleared:
      p.pack_array(1);
      pack_string(p, kCleared);
      return;
  }
}

// vLLM's map events: the fields without a default always, the others only when set.
void pack_event_map(Packer& p, std::string& out, const KvEventView& e) {
  switch (e.kind) {
    case KvEventKind::block_stored:
      p.pack_map(e.extra_key.empty() ? 10 : 11);
      pack_string(p, "type");
      pack_string(p, kStored);
      pack_string(p, "block_hashes");
      pack_hashes(p, e.block_hashes);
      pack_string(p, "parent_block_hash");
      if (e.parent_block_hash) {
        p.pack_fix_uint64(*e.parent_block_hash);
      } else {
        p.pack_nil();
      }
      pack_string(p, "token_ids");
      pack_token_ids(p, out, e.token_ids);
      pack_string(p, "block_size");
      p.pack_int32(e.block_size);
      pack_string(p, "lora_id");
      pack_optional_int(p, e.lora_id);
      pack_string(p, "medium");
      pack_string(p, kv_medium_name(e.medium));
      pack_string(p, "lora_name");
      p.pack_nil();
      if (!e.extra_key.empty()) {
        pack_string(p, "extra_keys");
        pack_extra_keys(p, e);
      }
      pack_string(p, "group_idx");
      p.pack_int32(0);
      pack_string(p, "kv_cache_spec_kind");
      pack_string(p, "full_attention");
      return;
    case KvEventKind::block_removed:
      p.pack_map(4);
      pack_string(p, "type");
      pack_string(p, kRemoved);
      pack_string(p, "block_hashes");
      pack_hashes(p, e.block_hashes);
      pack_string(p, "medium");
      pack_string(p, kv_medium_name(e.medium));
      pack_string(p, "group_idx");
      p.pack_int32(0);
      return;
    case KvEventKind::all_blocks_cleared:
      p.pack_map(1);
      pack_string(p, "type");
      pack_string(p, kCleared);
      return;
  }
}

// ---- decoding ----------------------------------------------------------------

Status bad(std::string_view what) { return invalid_argument(fmt::format("KV event batch: {}", what)); }

bool is_nil(const msgpack::object& o) { return o.type == msgpack::type::NIL; }

Status read_string(const msgpack::object& o, std::string_view what, std::string_view& out) {
  if (o.type != msgpack::type::STR) return bad(fmt::format("{} is not a string", what));
  out = {o.via.str.ptr, o.via.str.size};
  return {};
}

Status read_int(const msgpack::object& o, std::string_view what, std::int64_t low, std::int64_t high,
                std::int64_t& out) {
  if (o.type == msgpack::type::POSITIVE_INTEGER) {
    if (o.via.u64 > static_cast<std::uint64_t>(high)) return bad(fmt::format("{} {} is too large", what, o.via.u64));
    out = static_cast<std::int64_t>(o.via.u64);
  } else if (o.type == msgpack::type::NEGATIVE_INTEGER) {
    out = o.via.i64;
  } else {
    return bad(fmt::format("{} is not an integer", what));
  }
  if (out < low || out > high) return bad(fmt::format("{} {} is out of range", what, out));
  return {};
}

// A hash: any integer (a negative one as its 64 bits), or bytes (their last 8, big-endian, as vLLM and llm-d read
// them).
Status read_hash(const msgpack::object& o, std::uint64_t& out) {
  switch (o.type) {
    case msgpack::type::POSITIVE_INTEGER:
      out = o.via.u64;
      return {};
    case msgpack::type::NEGATIVE_INTEGER:
      out = static_cast<std::uint64_t>(o.via.i64);
      return {};
    case msgpack::type::BIN: {
      if (o.via.bin.size < 8) return bad("a block hash of fewer than 8 bytes");
      out = 0;
      for (std::uint32_t i = o.via.bin.size - 8; i < o.via.bin.size; ++i) {
        out = (out << 8) | static_cast<unsigned char>(o.via.bin.ptr[i]);
      }
      return {};
    }
    default:
      return bad("a block hash is neither an integer nor bytes");
  }
}

Status read_hashes(const msgpack::object& o, std::vector<std::uint64_t>& out) {
  if (o.type != msgpack::type::ARRAY) return bad("block_hashes is not an array");
  out.resize(o.via.array.size);
  for (std::uint32_t i = 0; i < o.via.array.size; ++i) CLM_RETURN_IF_ERROR(read_hash(o.via.array.ptr[i], out[i]));
  return {};
}

Status read_medium(const msgpack::object& o, KvMedium& out) {
  if (is_nil(o)) {
    out = KvMedium::gpu;  // vLLM's default
    return {};
  }
  std::string_view name;
  CLM_RETURN_IF_ERROR(read_string(o, "medium", name));
  std::string lower(name);
  std::transform(lower.begin(), lower.end(), lower.begin(), [](char c) { return c >= 'A' && c <= 'Z' ? c + 32 : c; });
  if (lower == "gpu") {
    out = KvMedium::gpu;
  } else if (lower == "cpu") {
    out = KvMedium::cpu;
  } else {
    return bad(fmt::format("unknown medium \"{}\"", name.substr(0, 32)));
  }
  return {};
}

// Fields by name, whichever layout carried them.
struct Fields {
  const msgpack::object* hashes = nullptr;
  const msgpack::object* parent = nullptr;
  const msgpack::object* tokens = nullptr;
  const msgpack::object* block_size = nullptr;
  const msgpack::object* lora_id = nullptr;
  const msgpack::object* medium = nullptr;
  const msgpack::object* extra_keys = nullptr;
};

Status decode_fields(KvEventKind kind, const Fields& f, KvEvent& e) {
  e = KvEvent{};
  e.kind = kind;
  if (kind == KvEventKind::all_blocks_cleared) return {};
  if (!f.hashes) return bad("an event without block_hashes");
  CLM_RETURN_IF_ERROR(read_hashes(*f.hashes, e.block_hashes));
  if (f.medium) CLM_RETURN_IF_ERROR(read_medium(*f.medium, e.medium));
  if (kind == KvEventKind::block_removed) return {};
  if (!f.tokens || !f.block_size) return bad("a BlockStored without token_ids or block_size");
  if (f.parent && !is_nil(*f.parent)) {
    std::uint64_t parent = 0;
    CLM_RETURN_IF_ERROR(read_hash(*f.parent, parent));
    e.parent_block_hash = parent;
  }
  if (f.tokens->type != msgpack::type::ARRAY) return bad("token_ids is not an array");
  e.token_ids.resize(f.tokens->via.array.size);
  for (std::uint32_t i = 0; i < f.tokens->via.array.size; ++i) {
    std::int64_t t = 0;
    CLM_RETURN_IF_ERROR(
        read_int(f.tokens->via.array.ptr[i], "a token id", 0, std::numeric_limits<std::int32_t>::max(), t));
    e.token_ids[i] = static_cast<std::int32_t>(t);
  }
  std::int64_t block_size = 0;
  CLM_RETURN_IF_ERROR(read_int(*f.block_size, "block_size", 0, std::numeric_limits<std::int32_t>::max(), block_size));
  e.block_size = static_cast<std::int32_t>(block_size);
  if (f.lora_id && !is_nil(*f.lora_id)) {
    std::int64_t lora = 0;
    CLM_RETURN_IF_ERROR(read_int(*f.lora_id, "lora_id", std::numeric_limits<std::int32_t>::min(),
                                 std::numeric_limits<std::int32_t>::max(), lora));
    e.lora_id = static_cast<std::int32_t>(lora);
  }
  if (f.extra_keys && !is_nil(*f.extra_keys)) {
    // The first string of the first block's keys (every block carries the same one).
    if (f.extra_keys->type != msgpack::type::ARRAY) return bad("extra_keys is not an array");
    for (std::uint32_t i = 0; i < f.extra_keys->via.array.size; ++i) {
      const msgpack::object& keys = f.extra_keys->via.array.ptr[i];
      if (is_nil(keys)) continue;
      if (keys.type != msgpack::type::ARRAY) return bad("a block's extra keys are not an array");
      if (i == 0 && keys.via.array.size > 0 && keys.via.array.ptr[0].type == msgpack::type::STR) {
        e.extra_key.assign(keys.via.array.ptr[0].via.str.ptr, keys.via.array.ptr[0].via.str.size);
      }
    }
  }
  return {};
}

Status tag_kind(std::string_view tag, KvEventKind& kind) {
  if (tag == kStored) {
    kind = KvEventKind::block_stored;
  } else if (tag == kRemoved) {
    kind = KvEventKind::block_removed;
  } else if (tag == kCleared) {
    kind = KvEventKind::all_blocks_cleared;
  } else {
    return bad(fmt::format("unknown event \"{}\"", tag.substr(0, 32)));
  }
  return {};
}

Status decode_event(const msgpack::object& o, KvEvent& e) {
  Fields f;
  KvEventKind kind;
  if (o.type == msgpack::type::ARRAY) {
    const msgpack::object_array& a = o.via.array;
    if (a.size == 0) return bad("an empty event");
    std::string_view tag;
    CLM_RETURN_IF_ERROR(read_string(a.ptr[0], "an event's tag", tag));
    CLM_RETURN_IF_ERROR(tag_kind(tag, kind));
    auto at = [&a](std::uint32_t i) { return i < a.size ? &a.ptr[i] : nullptr; };
    if (kind == KvEventKind::block_stored) {
      if (a.size < 5) return bad("a BlockStored of fewer than 5 fields");
      f = {at(1), at(2), at(3), at(4), at(5), at(6), at(8)};
    } else if (kind == KvEventKind::block_removed) {
      if (a.size < 2) return bad("a BlockRemoved without block_hashes");
      f.hashes = at(1);
      f.medium = at(2);
    }
  } else if (o.type == msgpack::type::MAP) {
    const msgpack::object_map& m = o.via.map;
    std::string_view tag;
    bool tagged = false;
    for (std::uint32_t i = 0; i < m.size; ++i) {
      std::string_view key;
      CLM_RETURN_IF_ERROR(read_string(m.ptr[i].key, "a field name", key));
      const msgpack::object* v = &m.ptr[i].val;
      if (key == "type") {
        CLM_RETURN_IF_ERROR(read_string(*v, "type", tag));
        tagged = true;
      } else if (key == "block_hashes") {
        f.hashes = v;
      } else if (key == "parent_block_hash") {
        f.parent = v;
      } else if (key == "token_ids") {
        f.tokens = v;
      } else if (key == "block_size") {
        f.block_size = v;
      } else if (key == "lora_id") {
        f.lora_id = v;
      } else if (key == "medium") {
        f.medium = v;
      } else if (key == "extra_keys") {
        f.extra_keys = v;
      }
    }
    if (!tagged) return bad("a map event without \"type\"");
    CLM_RETURN_IF_ERROR(tag_kind(tag, kind));
  } else {
    return bad("an event is neither an array nor a map");
  }
  return decode_fields(kind, f, e);
}

}  // namespace

std::string_view kv_event_tag(KvEventKind kind) {
  switch (kind) {
    case KvEventKind::block_stored:
      return kStored;
    case KvEventKind::block_removed:
      return kRemoved;
    case KvEventKind::all_blocks_cleared:
      return kCleared;
  }
  return "?";
}

std::string_view kv_medium_name(KvMedium medium) { return medium == KvMedium::cpu ? "CPU" : "GPU"; }

Status encode_kv_event_views(double ts, std::span<const KvEventView> events,
                             std::optional<std::int32_t> data_parallel_rank, KvEventLayout layout, std::string& out) {
  if (!std::isfinite(ts)) return invalid_argument("KV event batch: ts is not a finite number of seconds");
  for (const KvEventView& e : events) CLM_RETURN_IF_ERROR(check_event(e));
  out.clear();  // its capacity stays
  try {
    StringStream stream{out};
    Packer p(stream);
    p.pack_array(3);
    pack_float64(stream, ts);
    p.pack_array(static_cast<std::uint32_t>(events.size()));
    for (const KvEventView& e : events) {
      if (layout == KvEventLayout::map) {
        pack_event_map(p, out, e);
      } else {
        pack_event_array(p, out, e, layout == KvEventLayout::legacy);
      }
    }
    pack_optional_int(p, data_parallel_rank);
  } catch (const std::bad_alloc&) {
    out.clear();
    return out_of_memory("KV event batch: out of memory encoding it");
  }
  return {};
}

Status encode_kv_event_batch(const KvEventBatch& batch, KvEventLayout layout, std::string& out) {
  std::vector<KvEventView> views;
  try {
    views.reserve(batch.events.size());
  } catch (const std::bad_alloc&) {
    return out_of_memory("KV event batch: out of memory encoding it");
  }
  for (const KvEvent& e : batch.events) views.push_back(KvEventView::of(e));
  return encode_kv_event_views(batch.ts, views, batch.data_parallel_rank, layout, out);
}

Status decode_kv_event_batch(std::string_view payload, KvEventBatch& out) {
  if (payload.size() > kMaxKvEventPayloadBytes) {
    return bad(fmt::format("{} bytes, over the {}-byte limit", payload.size(), kMaxKvEventPayloadBytes));
  }
  try {
    // Every element takes at least a byte of the payload, so these limits
    // bound the decoder's memory by the payload's size; depth: batch, events,
    // event, extra keys, one block's keys.
    const msgpack::unpack_limit limit(payload.size(), payload.size(), payload.size(), payload.size(), 0, 6);
    std::size_t offset = 0;
    const msgpack::object_handle handle =
        msgpack::unpack(payload.data(), payload.size(), offset, nullptr, nullptr, limit);
    if (offset != payload.size()) return bad("bytes after the batch");
    const msgpack::object& root = handle.get();
    if (root.type != msgpack::type::ARRAY || root.via.array.size < 2 || root.via.array.size > 3) {
      return bad("not an array [ts, events, data_parallel_rank]");
    }
    const msgpack::object& ts = root.via.array.ptr[0];
    KvEventBatch batch;
    if (ts.type == msgpack::type::FLOAT64 || ts.type == msgpack::type::FLOAT32) {
      batch.ts = ts.via.f64;
    } else {
      return bad("ts is not a float");
    }
    if (!std::isfinite(batch.ts)) return bad("ts is not a finite number of seconds");
    const msgpack::object& events = root.via.array.ptr[1];
    if (events.type != msgpack::type::ARRAY) return bad("events is not an array");
    batch.events.resize(events.via.array.size);
    for (std::uint32_t i = 0; i < events.via.array.size; ++i) {
      CLM_RETURN_IF_ERROR(decode_event(events.via.array.ptr[i], batch.events[i]));
    }
    if (root.via.array.size == 3 && !is_nil(root.via.array.ptr[2])) {
      std::int64_t rank = 0;
      CLM_RETURN_IF_ERROR(
          read_int(root.via.array.ptr[2], "data_parallel_rank", 0, std::numeric_limits<std::int32_t>::max(), rank));
      batch.data_parallel_rank = static_cast<std::int32_t>(rank);
    }
    out = std::move(batch);
    return {};
  } catch (const msgpack::unpack_error& e) {
    return bad(fmt::format("not msgpack ({})", e.what()));
  } catch (const std::bad_alloc&) {
    return out_of_memory("KV event batch: out of memory decoding it");
  }
}

}  // namespace clm
