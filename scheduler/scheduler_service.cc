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

}  // namespace ps
