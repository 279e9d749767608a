// The in-process transport: ServerClient / SchedulerClient calls go straight
// to handler objects in the same process, with no network. A whole job then
// runs inside one test or benchmark process (tests/inproc_cluster.h).
//
// transport/ knows nothing of the server or the scheduler: it calls the
// small handler interfaces below, which ServerNode and SchedulerCore are
// adapted to (tests/inproc_cluster.h).
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "proto/ps.pb.h"
#include "transport/transport.h"

namespace ps {

// "inproc:server:<id>".
std::string InProcServerAddress(int id);
inline constexpr char kInProcSchedulerAddress[] = "inproc:scheduler";

// What a parameter server answers. Thread-safe.
class ServerHandler {
 public:
  using Done = std::function<void(const absl::Status&)>;
  virtual ~ServerHandler() = default;
  // `done` runs exactly once: on the caller's thread before the call
  // returns, or later on another thread (a pull waiting for consistency).
  // `req` and `resp` stay valid until then.
  virtual void Push(const proto::PushRequest& req, proto::PushResponse* resp,
                    Done done) = 0;
  virtual void Pull(const proto::PullRequest& req, proto::PullResponse* resp,
                    Done done) = 0;
  virtual absl::Status Clock(const proto::ClockRequest& req) = 0;
  // The form the in-process client calls: `done` may run later on another
  // thread (a clock answered once replicated, issue 9). Default: Clock.
  virtual void ClockAsync(const proto::ClockRequest& req, Done done) {
    done(Clock(req));
  }
  virtual absl::Status Finish(const proto::FinishRequest& req) = 0;
  virtual absl::StatusOr<proto::ServerControlResponse> Control(
      const proto::ServerControlRequest& req) = 0;
  virtual absl::StatusOr<proto::ServerStatus> GetStatus() = 0;
  // Replication (issue 9); UNIMPLEMENTED unless overridden.
  virtual absl::Status Replicate(const proto::ReplicateRequest& req) {
    (void)req;
    return absl::UnimplementedError("replicate: not implemented");
  }
};

// What the scheduler answers. Thread-safe; GetView and Barrier may block
// until `deadline`.
class SchedulerHandler {
 public:
  virtual ~SchedulerHandler() = default;
  virtual absl::StatusOr<proto::RegisterResponse> Register(
      const proto::RegisterRequest& req) = 0;
  virtual absl::StatusOr<proto::GetViewResponse> GetView(
      const proto::GetViewRequest& req, absl::Time deadline) = 0;
  virtual absl::StatusOr<proto::HeartbeatResponse> Heartbeat(
      const proto::HeartbeatRequest& req) = 0;
  virtual absl::StatusOr<proto::GetWorkResponse> GetWork(
      const proto::GetWorkRequest& req) = 0;
  virtual absl::Status Barrier(const proto::BarrierRequest& req,
                               absl::Time deadline) = 0;
  virtual absl::Status WorkerDone(const proto::WorkerDoneRequest& req) = 0;
  virtual absl::Status ServerDone(const proto::ServerDoneRequest& req) = 0;
  virtual absl::StatusOr<proto::SetConsistencyResponse> SetConsistency(
      const proto::SetConsistencyRequest& req) = 0;
  virtual absl::StatusOr<proto::StatusResponse> Status(
      const proto::StatusRequest& req) = 0;
};

// Maps in-process addresses to handlers. Register handlers before handing
// out clients; registered handlers must outlive the factory and every
// client it made. Thread-safe.
//
// Semantics of the clients:
//  * Push/Pull/Clock call the handler at once; the callback runs on the
//    caller's thread (before the call returns) or, for a pull that waits
//    for consistency, on whichever thread releases it. The shared request
//    and a heap response stay alive until then. Deadlines are not enforced:
//    a waiting pull ends by the server's own wait_ms instead.
//  * An unknown address gives clients that answer UNAVAILABLE.
class InProcClientFactory : public ClientFactory {
 public:
  InProcClientFactory() = default;

  // Serves InProcServerAddress(id).
  void AddServer(int id, ServerHandler* handler);
  // Serves kInProcSchedulerAddress.
  void SetScheduler(SchedulerHandler* handler);

  std::shared_ptr<ServerClient> Server(const std::string& address) override;
  std::shared_ptr<SchedulerClient> Scheduler(
      const std::string& address) override;

 private:
  absl::Mutex mu_;
  std::map<std::string, std::shared_ptr<ServerClient>> servers_
      ABSL_GUARDED_BY(mu_);
  std::shared_ptr<SchedulerClient> scheduler_ ABSL_GUARDED_BY(mu_);
};

}  // namespace ps
