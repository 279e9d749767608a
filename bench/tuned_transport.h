// Benchmark-only transport pieces: parsing of extra gRPC channel arguments
// (GrpcTransportOptions.extra_channel_args, so a tuning can be measured
// before anyone changes the shared settings) and a scheduler client that is
// never reachable.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "transport/grpc_transport.h"
#include "transport/transport.h"

namespace ps::bench {

// Parses "name=value,name=value" (empty: none). INVALID_ARGUMENT on a part
// without '='.
absl::StatusOr<std::vector<GrpcArg>> ParseGrpcArgs(const std::string& spec);

// A scheduler nobody can reach: every call fails with UNAVAILABLE. The
// benchmark's view never changes, so a KVWorker never needs a real one.
class UnreachableScheduler : public SchedulerClient {
 public:
  absl::StatusOr<proto::RegisterResponse> Register(
      const proto::RegisterRequest&, absl::Time) override {
    return Unavailable();
  }
  absl::StatusOr<proto::GetViewResponse> GetView(const proto::GetViewRequest&,
                                                 absl::Time) override {
    return Unavailable();
  }
  absl::StatusOr<proto::HeartbeatResponse> Heartbeat(
      const proto::HeartbeatRequest&, absl::Time) override {
    return Unavailable();
  }
  absl::StatusOr<proto::GetWorkResponse> GetWork(
      const proto::GetWorkRequest&, absl::Time) override {
    return Unavailable();
  }
  absl::Status Barrier(const proto::BarrierRequest&, absl::Time) override {
    return Unavailable();
  }
  absl::Status WorkerDone(const proto::WorkerDoneRequest&,
                          absl::Time) override {
    return Unavailable();
  }
  absl::Status ServerDone(const proto::ServerDoneRequest&,
                          absl::Time) override {
    return Unavailable();
  }
  absl::StatusOr<proto::SetConsistencyResponse> SetConsistency(
      const proto::SetConsistencyRequest&, absl::Time) override {
    return Unavailable();
  }
  absl::StatusOr<proto::StatusResponse> Status(const proto::StatusRequest&,
                                               absl::Time) override {
    return Unavailable();
  }

 private:
  static absl::Status Unavailable() {
    return absl::UnavailableError("benchmark has no scheduler");
  }
};

}  // namespace ps::bench
