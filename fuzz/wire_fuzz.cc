// Fuzz target for WireFields (transport/wire_fields.h), what the server's
// raw Push and Pull handlers read a peer's bytes with: the input's first
// byte says how the rest is cut into slices (as gRPC may deliver it), the
// rest is read as a PushRequest with keys and values apart, and as a
// PullRequest with keys apart. Checks, besides "no crash": whatever
// WireFields accepts, protobuf accepts too and reads the same (the fields
// apart equal protobuf's, every other field as well), and the fields apart
// are aligned to WireFields::kAlign.
#include <algorithm>
#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

#include "fuzz/fuzz_util.h"
#include "proto/ps.pb.h"
#include "transport/wire_fields.h"

namespace ps::fuzz {
namespace {

// `bytes` in slices of `step` bytes (one slice when step is 0), each a
// copy, so their addresses are whatever gRPC's allocator gives.
std::vector<grpc::Slice> Cut(const std::string& bytes, size_t step) {
  std::vector<grpc::Slice> out;
  if (step == 0) {
    out.emplace_back(bytes);
    return out;
  }
  for (size_t at = 0; at < bytes.size(); at += step) {
    out.emplace_back(bytes.data() + at, std::min(step, bytes.size() - at));
  }
  return out;
}

bool Aligned(absl::string_view v) {
  return v.empty() ||
         reinterpret_cast<uintptr_t>(v.data()) % WireFields::kAlign == 0;
}

template <typename Msg>
void Check(const std::string& bytes, size_t step,
           absl::Span<const int> big) {
  WireFields w;
  Msg meta;
  if (!w.Parse(Cut(bytes, step), big, &meta).ok()) return;
  Msg whole;
  PS_FUZZ_CHECK(whole.ParseFromString(bytes));
  Msg merged = meta;
  if constexpr (std::is_same_v<Msg, proto::PushRequest>) {
    PS_FUZZ_CHECK(meta.keys().empty() && meta.vals().empty());
    PS_FUZZ_CHECK(w.field(0) == whole.keys());
    PS_FUZZ_CHECK(w.field(1) == whole.vals());
    PS_FUZZ_CHECK(Aligned(w.field(0)) && Aligned(w.field(1)));
    merged.set_keys(std::string(w.field(0)));
    merged.set_vals(std::string(w.field(1)));
  } else {
    PS_FUZZ_CHECK(meta.keys().empty());
    PS_FUZZ_CHECK(w.field(0) == whole.keys());
    PS_FUZZ_CHECK(Aligned(w.field(0)));
    merged.set_keys(std::string(w.field(0)));
  }
  // Same fields (serialisation is deterministic for equal messages of one
  // binary; unknown fields are kept in order by both).
  PS_FUZZ_CHECK(merged.SerializeAsString() == whole.SerializeAsString());
}

}  // namespace

int Wire(const uint8_t* data, size_t size) {
  static bool quiet = (QuietProtobuf(), true);
  (void)quiet;
  if (size == 0) return 0;
  const size_t step = data[0] % 40;
  const std::string bytes(reinterpret_cast<const char*>(data) + 1, size - 1);
  constexpr int kPush[] = {proto::PushRequest::kKeysFieldNumber,
                           proto::PushRequest::kValsFieldNumber};
  constexpr int kPull[] = {proto::PullRequest::kKeysFieldNumber};
  Check<proto::PushRequest>(bytes, step, kPush);
  Check<proto::PullRequest>(bytes, step, kPull);
  return 0;
}

}  // namespace ps::fuzz
