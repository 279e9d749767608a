// Typed failure reasons (proto::ErrorReason) attached to absl::Status and
// carried across every transport. Retry decisions read the code and the
// reason, never the message text.
#pragma once

#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "proto/ps.pb.h"

namespace ps {

// A status with `code`, `message` and `reason` attached.
absl::Status ErrorWithReason(absl::StatusCode code, proto::ErrorReason reason,
                             absl::string_view message);

// `s` with `reason` attached (replacing any earlier one). OK stays OK.
absl::Status WithReason(absl::Status s, proto::ErrorReason reason);

// The reason attached to `s`; REASON_UNSPECIFIED when none.
proto::ErrorReason ReasonOf(const absl::Status& s);

// The reason as the bytes of an ErrorDetail (empty when none), and back.
std::string EncodeReason(const absl::Status& s);
absl::Status DecodeReason(absl::Status s, absl::string_view details);

// A status as the code, message and details (the reason's ErrorDetail)
// fields of an answer message carry it (proto::ReplicateResponse on the
// replication stream, proto::DataReply on the data plane), and back; an
// unknown code reads as INTERNAL.
template <typename Reply>
void StatusToReply(const absl::Status& s, Reply* r) {
  r->set_code(static_cast<int>(s.code()));
  if (s.ok()) return;
  r->set_message(std::string(s.message()));
  r->set_details(EncodeReason(s));
}
template <typename Reply>
absl::Status StatusFromReply(const Reply& r) {
  if (r.code() == 0) return absl::OkStatus();
  if (r.code() < 0 ||
      r.code() > static_cast<int>(absl::StatusCode::kUnauthenticated)) {
    return absl::InternalError(absl::StrCat("answer with unknown code ", r.code()));
  }
  return DecodeReason(
      absl::Status(static_cast<absl::StatusCode>(r.code()), r.message()),
      r.details());
}

// `s` with "what: " prepended to its message; code and reason kept.
absl::Status Annotate(const absl::Status& s, absl::string_view what);

// The routing view is stale: refresh, re-slice, resend.
inline bool IsStaleEpoch(const absl::Status& s) {
  return ReasonOf(s) == proto::REASON_STALE_EPOCH;
}

// The server does not hold the key list a request named: resend with keys.
inline bool IsKeysNotCached(const absl::Status& s) {
  return ReasonOf(s) == proto::REASON_KEYS_NOT_CACHED;
}

}  // namespace ps
