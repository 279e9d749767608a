// gRPC face of the SchedulerCore: converts and authenticates, and refuses
// enum values outside the proto's (a role or consistency mode the core does
// not know) with INVALID_ARGUMENT.
#pragma once

#include <set>
#include <string>

#include "absl/synchronization/mutex.h"

#include "proto/ps.grpc.pb.h"
#include "scheduler/scheduler.h"

namespace ps {

class SessionReactor;

// Session (issue 9) is a callback method: an open session holds no thread.
class SchedulerService final
    : public proto::Scheduler::WithCallbackMethod_Session<
          proto::Scheduler::Service> {
 public:
  // `core` must outlive the service.
  SchedulerService(SchedulerCore* core, std::string token)
      : core_(core), token_(std::move(token)) {}

  grpc::Status Register(grpc::ServerContext* ctx,
                        const proto::RegisterRequest* req,
                        proto::RegisterResponse* resp) override;
  grpc::Status GetView(grpc::ServerContext* ctx,
                       const proto::GetViewRequest* req,
                       proto::GetViewResponse* resp) override;
  grpc::Status Heartbeat(grpc::ServerContext* ctx,
                         const proto::HeartbeatRequest* req,
                         proto::HeartbeatResponse* resp) override;
  grpc::Status GetWork(grpc::ServerContext* ctx,
                       const proto::GetWorkRequest* req,
                       proto::GetWorkResponse* resp) override;
  grpc::Status Barrier(grpc::ServerContext* ctx,
                       const proto::BarrierRequest* req,
                       proto::BarrierResponse* resp) override;
  grpc::Status WorkerDone(grpc::ServerContext* ctx,
                          const proto::WorkerDoneRequest* req,
                          proto::WorkerDoneResponse* resp) override;
  grpc::Status ServerDone(grpc::ServerContext* ctx,
                          const proto::ServerDoneRequest* req,
                          proto::ServerDoneResponse* resp) override;
  grpc::Status SetConsistency(grpc::ServerContext* ctx,
                              const proto::SetConsistencyRequest* req,
                              proto::SetConsistencyResponse* resp) override;
  grpc::Status Status(grpc::ServerContext* ctx,
                      const proto::StatusRequest* req,
                      proto::StatusResponse* resp) override;
  // Checkpoints (issue 9).
  grpc::Status Checkpoint(grpc::ServerContext* ctx,
                          const proto::CheckpointRequest* req,
                          proto::CheckpointResponse* resp) override;
  // Elasticity (issue 9).
  grpc::Status Drain(grpc::ServerContext* ctx, const proto::DrainRequest* req,
                     proto::DrainResponse* resp) override;
  // Failure detection (issue 9): open until the node's connection closes
  // or the scheduler stops; SchedulerCore::OpenSession / CloseSession.
  grpc::ServerWriteReactor<proto::SessionEvent>* Session(
      grpc::CallbackServerContext* ctx,
      const proto::SessionRequest* req) override;
  // Ends every open session (OK) and refuses new ones: the job is over.
  // Without it a shutdown waits out its deadline for nodes still running.
  void EndSessions();

 private:
  friend class SessionReactor;
  // A session's reactor ends (OnDone).
  void Forget(SessionReactor* r);

  SchedulerCore* const core_;
  const std::string token_;
  absl::Mutex sessions_mu_;
  std::set<SessionReactor*> sessions_ ABSL_GUARDED_BY(sessions_mu_);
  bool sessions_ended_ ABSL_GUARDED_BY(sessions_mu_) = false;
};

}  // namespace ps
