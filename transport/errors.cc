#include "transport/errors.h"

#include "absl/strings/str_cat.h"

namespace ps {
namespace {
constexpr char kReasonUrl[] = "type.googleapis.com/ps.proto.ErrorDetail";
}  // namespace

absl::Status ErrorWithReason(absl::StatusCode code, proto::ErrorReason reason,
                             absl::string_view message) {
  return WithReason(absl::Status(code, message), reason);
}

absl::Status WithReason(absl::Status s, proto::ErrorReason reason) {
  if (s.ok()) return s;
  if (reason == proto::REASON_UNSPECIFIED) {
    s.ErasePayload(kReasonUrl);
    return s;
  }
  proto::ErrorDetail d;
  d.set_reason(reason);
  s.SetPayload(kReasonUrl, absl::Cord(d.SerializeAsString()));
  return s;
}

proto::ErrorReason ReasonOf(const absl::Status& s) {
  if (s.ok()) return proto::REASON_UNSPECIFIED;
  auto payload = s.GetPayload(kReasonUrl);
  if (!payload.has_value()) return proto::REASON_UNSPECIFIED;
  proto::ErrorDetail d;
  if (!d.ParseFromString(std::string(*payload))) {
    return proto::REASON_UNSPECIFIED;
  }
  return proto::ErrorReason_IsValid(d.reason()) ? d.reason()
                                                : proto::REASON_UNSPECIFIED;
}

std::string EncodeReason(const absl::Status& s) {
  const proto::ErrorReason r = ReasonOf(s);
  if (r == proto::REASON_UNSPECIFIED) return "";
  proto::ErrorDetail d;
  d.set_reason(r);
  return d.SerializeAsString();
}

absl::Status DecodeReason(absl::Status s, absl::string_view details) {
  if (s.ok() || details.empty()) return s;
  proto::ErrorDetail d;
  // A peer's bytes: anything unparsable or unknown is simply no reason.
  if (!d.ParseFromArray(details.data(), static_cast<int>(details.size())) ||
      !proto::ErrorReason_IsValid(d.reason())) {
    return s;
  }
  return WithReason(std::move(s), d.reason());
}

absl::Status Annotate(const absl::Status& s, absl::string_view what) {
  if (s.ok()) return s;
  return WithReason(absl::Status(s.code(), absl::StrCat(what, ": ", s.message())),
                    ReasonOf(s));
}

}  // namespace ps
