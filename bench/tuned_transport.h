// Benchmark-only transport pieces: a copy of the project's gRPC server client
// (common/grpc_transport.cc) whose channel arguments can be overridden, so a
// gRPC tuning can be measured before anyone changes the shared settings, and
// a scheduler client that is never reachable.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/transport.h"
#include "grpcpp/grpcpp.h"

namespace ps::bench {

// A gRPC channel argument: an integer when the value parses as one, a string
// otherwise.
struct GrpcArg {
  std::string name;
  std::string value;
};

// Parses "name=value,name=value" (empty: none). INVALID_ARGUMENT on a part
// without '='.
absl::StatusOr<std::vector<GrpcArg>> ParseGrpcArgs(const std::string& spec);

// Applies `args` on top of `base` (a later setting of a name wins).
void ApplyGrpcArgs(const std::vector<GrpcArg>& args,
                   grpc::ChannelArguments* base);
void ApplyGrpcArgs(const std::vector<GrpcArg>& args,
                   grpc::ServerBuilder* builder);

// Like GrpcClientFactory, but each server channel gets DefaultChannelArgs()
// plus `extra`. Scheduler() returns an UnreachableScheduler. Thread-safe.
class TunedClientFactory : public ClientFactory {
 public:
  TunedClientFactory(int channels_per_server, std::vector<GrpcArg> extra);
  std::shared_ptr<ServerClient> Server(const std::string& address) override;
  std::shared_ptr<SchedulerClient> Scheduler(
      const std::string& address) override;

 private:
  const int channels_per_server_;
  const std::vector<GrpcArg> extra_;
  absl::Mutex mu_;
  std::vector<std::pair<std::string, std::shared_ptr<ServerClient>>> servers_
      ABSL_GUARDED_BY(mu_);
};

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
  absl::StatusOr<proto::GetShardResponse> GetShard(
      const proto::GetShardRequest&, absl::Time) override {
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
