// clm/kernels/kv_dtype.hpp: element types a KV page can hold, and where pages live.
#pragma once

#include <cstddef>
#include <cstdint>

namespace clm {

enum class KvDType : std::uint8_t { f32 = 0, f16 = 1, bf16 = 2 };

inline std::size_t kv_dtype_bytes(KvDType dtype) { return dtype == KvDType::f32 ? 4 : 2; }

inline const char* kv_dtype_name(KvDType dtype) {
  switch (dtype) {
    case KvDType::f32: return "f32";
    case KvDType::f16: return "f16";
    case KvDType::bf16: return "bf16";
  }
  return "unknown";
}

// Where the KV bytes of a pool live. `none` keeps page ids and reference
// counts only: for hosts whose KV tensors are their own (they index them with
// our page ids), and for replaying traces without paying for KV memory.
enum class MemoryKind : std::uint8_t { none = 0, host = 1, device = 2 };

}  // namespace clm
