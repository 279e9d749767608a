#ifndef PS_COMMON_PROTO_SPAN_H_
#define PS_COMMON_PROTO_SPAN_H_

#include <cstddef>

#include "absl/types/span.h"
#include "google/protobuf/repeated_field.h"

namespace ps {

// The elements of a repeated scalar field, for loops over them. A generated
// accessor (`req.range_ids(i)`) is two calls into libprotobuf per element
// (RepeatedField<T>::Get and ::elements are not inlined: libprotobuf
// instantiates RepeatedField<int32_t> and the like itself, as extern
// templates), which profiles of the per-range loops that run per clock and
// per replica entry showed at about 6 % of a replicated server's samples.
template <typename T>
absl::Span<const T> AsSpan(const google::protobuf::RepeatedField<T>& f) {
  return absl::MakeConstSpan(f.data(), static_cast<size_t>(f.size()));
}

}  // namespace ps

#endif  // PS_COMMON_PROTO_SPAN_H_
