#include "transport/errors.h"

#include "gtest/gtest.h"
#include "transport/grpc_transport.h"

namespace ps {
namespace {

TEST(ErrorReason, SurvivesGrpcConversion) {
  absl::Status s = ErrorWithReason(absl::StatusCode::kFailedPrecondition,
                                   proto::REASON_STALE_EPOCH, "epoch 3 vs 4");
  absl::Status back = FromGrpcStatus(ToGrpcStatus(s));
  EXPECT_EQ(back.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(back.message(), "epoch 3 vs 4");
  EXPECT_EQ(ReasonOf(back), proto::REASON_STALE_EPOCH);
  EXPECT_TRUE(IsStaleEpoch(back));
}

TEST(ErrorReason, MessageTextIsNotAReason) {
  // Regression (issue 8.4): retries were decided by words in the message.
  absl::Status s = absl::FailedPreconditionError("stale-epoch waited");
  EXPECT_FALSE(IsStaleEpoch(s));
  EXPECT_EQ(ReasonOf(FromGrpcStatus(ToGrpcStatus(s))),
            proto::REASON_UNSPECIFIED);
}

TEST(ErrorReason, AnnotateKeepsCodeAndReason) {
  absl::Status s = Annotate(
      ErrorWithReason(absl::StatusCode::kDeadlineExceeded,
                      proto::REASON_CONSISTENCY_TIMEOUT, "lagging"),
      "pull from S[1]");
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(s.message(), "pull from S[1]: lagging");
  EXPECT_EQ(ReasonOf(s), proto::REASON_CONSISTENCY_TIMEOUT);
}

TEST(ErrorReason, GarbageDetailsAreIgnored) {
  absl::Status s = DecodeReason(absl::UnavailableError("x"), "\xff\xff\xff");
  EXPECT_EQ(ReasonOf(s), proto::REASON_UNSPECIFIED);
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable);
}

TEST(ErrorReason, OkStaysOk) {
  EXPECT_TRUE(WithReason(absl::OkStatus(), proto::REASON_JOB_FAILED).ok());
  EXPECT_EQ(ReasonOf(absl::OkStatus()), proto::REASON_UNSPECIFIED);
}

}  // namespace
}  // namespace ps
