// gRPC implementation of the transport interfaces, plus the helpers every
// gRPC service of the project shares (status conversion, authentication,
// channel and server settings).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/container/flat_hash_map.h"
#include "transport/transport.h"
#include "grpcpp/grpcpp.h"

namespace ps {

// Metadata key carrying the cluster token.
inline constexpr char kTokenHeader[] = "x-ps-token";

grpc::Status ToGrpcStatus(const absl::Status& s);
absl::Status FromGrpcStatus(const grpc::Status& s);

// OK when `expected` is empty or the call carries it; UNAUTHENTICATED
// otherwise.
absl::Status CheckToken(const grpc::ServerContextBase& ctx,
                        const std::string& expected);

// Settings every channel and server uses: no message size limit (big pushes
// are normal), larger flow-control windows, keepalive.
grpc::ChannelArguments DefaultChannelArgs();
void ConfigureServerBuilder(grpc::ServerBuilder* builder);

// The token the processes of a job share: $PS_AUTH_TOKEN, else `fallback`.
std::string TokenFromEnv(const std::string& fallback);

// A gRPC channel argument set on top of DefaultChannelArgs(): an integer
// when the value parses as one, a string otherwise.
struct GrpcArg {
  std::string name;
  std::string value;
};
void ApplyGrpcArgs(const std::vector<GrpcArg>& args,
                   grpc::ChannelArguments* base);
void ApplyGrpcArgs(const std::vector<GrpcArg>& args,
                   grpc::ServerBuilder* builder);

struct GrpcTransportOptions {
  std::string token;
  int channels_per_server = 2;  // separate TCP connections, round-robin
  std::vector<GrpcArg> extra_channel_args;  // for server channels (tuning)
};

class GrpcClientFactory : public ClientFactory {
 public:
  explicit GrpcClientFactory(GrpcTransportOptions options);
  std::shared_ptr<ServerClient> Server(const std::string& address) override;
  std::shared_ptr<SchedulerClient> Scheduler(
      const std::string& address) override;

 private:
  const GrpcTransportOptions options_;
  absl::Mutex mu_;
  absl::flat_hash_map<std::string, std::shared_ptr<ServerClient>> servers_
      ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, std::shared_ptr<SchedulerClient>>
      schedulers_ ABSL_GUARDED_BY(mu_);
};

}  // namespace ps
