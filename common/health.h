// Whether a node is ready to serve, as the outside world asks it: through
// gRPC's standard health-checking service (grpc.health.v1.Health, gRPC's
// own implementation, served on the node's gRPC port) and through the
// /healthz route of its metrics endpoint (common/metrics_http.h; workers
// run no gRPC server, so that route is theirs).
//
// What each name reports (grpc.health.v1.HealthCheckRequest.service):
//   ""             the node's life cycle: NOT_SERVING while starting
//                  (a server: until it has registered and installed the
//                  cluster view), SERVING while it works, NOT_SERVING again
//                  once it is stopping (the job ended, or a drained server
//                  left it). Kubernetes readiness probes ask this.
//   <its service>  the same ("ps.proto.Server", "ps.proto.Scheduler").
//   "liveness"     SERVING for as long as the gRPC server runs, whatever
//                  the life cycle: a liveness probe that must not kill a
//                  node that is still registering.
// The health service needs no cluster token (probes cannot send one); it is
// the only service that does not (transport/grpc_transport.h).
#pragma once

#include <atomic>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "grpcpp/health_check_service_interface.h"

namespace ps {

enum class Serving { kStarting, kServing, kStopping };
// "starting", "serving", "stopping".
const char* ServingName(Serving s);

// The health service's name for liveness (see above).
inline constexpr char kLivenessService[] = "liveness";

// Turns on gRPC's default health-checking service for every grpc::Server the
// process builds from now on (grpc::EnableDefaultHealthCheckService). Call
// before the first grpc::ServerBuilder is made.
void EnableGrpcHealthService();

// The life cycle of one node. Thread-safe.
class NodeHealth {
 public:
  // `services`: the gRPC service names whose status follows the state,
  // besides "" (which always does).
  explicit NodeHealth(std::vector<std::string> services = {});

  // Reports through `h` (a server's GetHealthCheckService(); null: gRPC's
  // health service is not on, nothing is reported there) from now on: the
  // current state at once, "liveness" SERVING. `h` must stay valid until
  // Detach() (grpc::Server::Shutdown turns every name NOT_SERVING itself).
  void Attach(grpc::HealthCheckServiceInterface* h);
  void Detach();

  // Moves to `s`; `why` says what happened ("registered", "job over").
  void Set(Serving s, std::string why);

  Serving state() const { return state_.load(std::memory_order_acquire); }
  bool serving() const { return state() == Serving::kServing; }
  // "serving", or e.g. "stopping: job over".
  std::string Describe() const;

 private:
  void PublishLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::vector<std::string> services_;  // constant after construction
  std::atomic<Serving> state_{Serving::kStarting};
  mutable absl::Mutex mu_;
  std::string why_ ABSL_GUARDED_BY(mu_) = "not registered yet";
  grpc::HealthCheckServiceInterface* grpc_ ABSL_GUARDED_BY(mu_) = nullptr;
};

}  // namespace ps
