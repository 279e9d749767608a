#include "scheduler/scheduler_service.h"

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "transport/grpc_transport.h"

namespace ps {
namespace {

absl::Time DeadlineOf(const grpc::ServerContext* ctx) {
  auto d = ctx->deadline();
  if (d == std::chrono::system_clock::time_point::max()) {
    return absl::Now() + absl::Hours(1);
  }
  return absl::FromChrono(d);
}

template <typename Resp>
grpc::Status Fill(absl::StatusOr<Resp> r, Resp* out) {
  if (!r.ok()) return ToGrpcStatus(r.status());
  *out = std::move(*r);
  return grpc::Status::OK;
}

}  // namespace

#define PS_AUTH()                                      \
  do {                                                 \
    absl::Status a = CheckToken(*ctx, token_);         \
    if (!a.ok()) return ToGrpcStatus(a);               \
  } while (0)

grpc::Status SchedulerService::Register(grpc::ServerContext* ctx,
                                        const proto::RegisterRequest* req,
                                        proto::RegisterResponse* resp) {
  PS_AUTH();
  if (!proto::Role_IsValid(req->role()) || req->role() == proto::ROLE_UNKNOWN) {
    return ToGrpcStatus(absl::InvalidArgumentError(
        absl::StrCat("register: unknown role ", req->role())));
  }
  return Fill(core_->Register(*req), resp);
}

grpc::Status SchedulerService::GetView(grpc::ServerContext* ctx,
                                       const proto::GetViewRequest* req,
                                       proto::GetViewResponse* resp) {
  PS_AUTH();
  return Fill(core_->GetView(*req, DeadlineOf(ctx)), resp);
}

grpc::Status SchedulerService::Heartbeat(grpc::ServerContext* ctx,
                                         const proto::HeartbeatRequest* req,
                                         proto::HeartbeatResponse* resp) {
  PS_AUTH();
  if (!proto::Role_IsValid(req->role())) {
    return ToGrpcStatus(absl::InvalidArgumentError(
        absl::StrCat("heartbeat: unknown role ", req->role())));
  }
  return Fill(core_->Heartbeat(*req), resp);
}

grpc::Status SchedulerService::GetWork(grpc::ServerContext* ctx,
                                       const proto::GetWorkRequest* req,
                                       proto::GetWorkResponse* resp) {
  PS_AUTH();
  return Fill(core_->GetWork(*req), resp);
}

grpc::Status SchedulerService::Barrier(grpc::ServerContext* ctx,
                                       const proto::BarrierRequest* req,
                                       proto::BarrierResponse*) {
  PS_AUTH();
  return ToGrpcStatus(core_->Barrier(*req, DeadlineOf(ctx)));
}

grpc::Status SchedulerService::WorkerDone(grpc::ServerContext* ctx,
                                          const proto::WorkerDoneRequest* req,
                                          proto::WorkerDoneResponse*) {
  PS_AUTH();
  return ToGrpcStatus(core_->WorkerDone(*req));
}

grpc::Status SchedulerService::ServerDone(grpc::ServerContext* ctx,
                                          const proto::ServerDoneRequest*,
                                          proto::ServerDoneResponse*) {
  PS_AUTH();
  return grpc::Status::OK;  // servers report through Control's reply
}

grpc::Status SchedulerService::SetConsistency(
    grpc::ServerContext* ctx, const proto::SetConsistencyRequest* req,
    proto::SetConsistencyResponse* resp) {
  PS_AUTH();
  if (!proto::ConsistencyMode_IsValid(req->consistency().mode())) {
    return ToGrpcStatus(absl::InvalidArgumentError(absl::StrCat(
        "set consistency: unknown mode ", req->consistency().mode())));
  }
  return Fill(core_->SetConsistency(*req), resp);
}

grpc::Status SchedulerService::Status(grpc::ServerContext* ctx,
                                      const proto::StatusRequest* req,
                                      proto::StatusResponse* resp) {
  PS_AUTH();
  return Fill(core_->Status(req->brief()), resp);
}

// Checkpoints (issue 9).
grpc::Status SchedulerService::Checkpoint(grpc::ServerContext* ctx,
                                          const proto::CheckpointRequest*,
                                          proto::CheckpointResponse* resp) {
  PS_AUTH();
  return Fill(core_->Checkpoint(), resp);
}

// Elasticity (issue 9).
grpc::Status SchedulerService::Drain(grpc::ServerContext* ctx,
                                     const proto::DrainRequest* req,
                                     proto::DrainResponse* resp) {
  PS_AUTH();
  return Fill(core_->Drain(*req), resp);
}

#undef PS_AUTH

// One node's session: nothing is written; it ends when the call is
// cancelled (the node's connection closed, or the scheduler shuts down) or
// the job is over (SchedulerService::EndSessions).
class SessionReactor final
    : public grpc::ServerWriteReactor<proto::SessionEvent> {
 public:
  SessionReactor(SchedulerService* service, proto::Role role, int id)
      : service_(service), role_(role), id_(id) {}

  // Finishes at once with the refusal, or stays open. Runs before Session
  // returns the reactor, so before any OnCancel.
  void Start(absl::Status refused) {
    if (!refused.ok()) {
      FinishOnce(ToGrpcStatus(refused));
      return;
    }
    absl::MutexLock l(&mu_);
    open_ = true;
  }

  void OnCancel() override {
    {
      absl::MutexLock l(&mu_);
      if (open_) {
        open_ = false;
        service_->core_->CloseSession(role_, id_);
      }
    }
    FinishOnce(grpc::Status::CANCELLED);
  }

  void OnDone() override {
    service_->Forget(this);
    delete this;
  }

  void FinishOnce(const grpc::Status& s) {
    {
      absl::MutexLock l(&mu_);
      if (finished_) return;
      finished_ = true;
    }
    Finish(s);
  }

 private:
  SchedulerService* const service_;
  const proto::Role role_;
  const int id_;
  absl::Mutex mu_;
  bool open_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
};

grpc::ServerWriteReactor<proto::SessionEvent>* SchedulerService::Session(
    grpc::CallbackServerContext* ctx, const proto::SessionRequest* req) {
  auto* reactor = new SessionReactor(this, req->role(), req->id());
  absl::Status refused = CheckToken(*ctx, token_);
  if (refused.ok() &&
      (!proto::Role_IsValid(req->role()) ||
       (req->role() != proto::ROLE_SERVER &&
        req->role() != proto::ROLE_WORKER))) {
    refused = absl::InvalidArgumentError(
        absl::StrCat("session: a node is a server or a worker, not role ",
                     req->role()));
  }
  {
    absl::MutexLock l(&sessions_mu_);
    sessions_.insert(reactor);
    if (refused.ok() && sessions_ended_) {
      refused = absl::FailedPreconditionError("session: the job is over");
    }
  }
  if (refused.ok()) refused = core_->OpenSession(req->role(), req->id());
  reactor->Start(refused);
  return reactor;
}

void SchedulerService::EndSessions() {
  absl::MutexLock l(&sessions_mu_);
  sessions_ended_ = true;
  // Finish never runs OnDone (and so Forget) on this thread.
  for (SessionReactor* r : sessions_) r->FinishOnce(grpc::Status::OK);
}

void SchedulerService::Forget(SessionReactor* r) {
  absl::MutexLock l(&sessions_mu_);
  sessions_.erase(r);
}

}  // namespace ps
