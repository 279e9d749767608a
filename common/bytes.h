// Packing of key and value arrays into protobuf `bytes` fields. The wire
// format is the host's little-endian layout (x86-64, aarch64).
#pragma once

#include <cstdint>
#include <cstring>
#include <string>

#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace ps {

template <typename T>
inline void PackTo(std::string* out, absl::Span<const T> v) {
  out->resize(v.size() * sizeof(T));
  if (!v.empty()) std::memcpy(out->data(), v.data(), out->size());
}

// A read-only view of a packed array; empty when the byte count is not a
// multiple of sizeof(T) (callers check `ByteCountOk` first).
template <typename T>
inline bool ByteCountOk(absl::string_view bytes) {
  return bytes.size() % sizeof(T) == 0;
}

template <typename T>
inline absl::Span<const T> ViewAs(absl::string_view bytes) {
  // protobuf's std::string storage is at least 8-byte aligned for heap
  // buffers; small-string storage is within the string object, aligned too;
  // WireFields views are aligned to 8 (transport/wire_fields.h).
  return absl::Span<const T>(reinterpret_cast<const T*>(bytes.data()),
                             bytes.size() / sizeof(T));
}

template <typename T>
inline absl::Span<T> MutableViewAs(std::string* bytes) {
  return absl::Span<T>(reinterpret_cast<T*>(bytes->data()),
                       bytes->size() / sizeof(T));
}

}  // namespace ps
