#include "server/server_service.h"

#include "absl/time/clock.h"
#include "transport/grpc_transport.h"
#include "common/logging.h"

namespace ps {

namespace {
// Finishes `ctx`'s default reactor with `s`.
grpc::ServerUnaryReactor* Reply(grpc::CallbackServerContext* ctx,
                                const absl::Status& s) {
  auto* r = ctx->DefaultReactor();
  r->Finish(ToGrpcStatus(s));
  return r;
}
}  // namespace

ServerService::ServerService(ServerNode* node, std::string token,
                             std::function<void()> on_save_and_exit,
                             PushPullMetrics* metrics)
    : node_(node),
      token_(std::move(token)),
      on_save_and_exit_(std::move(on_save_and_exit)),
      metrics_(metrics) {}

grpc::ServerUnaryReactor* ServerService::Push(grpc::CallbackServerContext* ctx,
                                              const proto::PushRequest* req,
                                              proto::PushResponse* resp) {
  absl::Status auth = CheckToken(*ctx, token_);
  if (!auth.ok()) return Reply(ctx, auth);
  auto* r = ctx->DefaultReactor();
  if (metrics_ == nullptr) {
    node_->Push(*req, resp,
                [r](const absl::Status& s) { r->Finish(ToGrpcStatus(s)); });
    return r;
  }
  // Metrics (issue 11): the callback keeps to two pointers, so that
  // std::function holds it without allocating.
  const int64_t t0 = MonotonicNanos();
  const int table = req->table();
  const uint64_t bytes = req->keys().size() + req->vals().size();
  Counter* errors = metrics_->Errors(PushPullMetrics::kPush, table);
  node_->Push(*req, resp, [r, errors](const absl::Status& s) {
    if (!s.ok()) errors->Add();
    r->Finish(ToGrpcStatus(s));
  });
  metrics_->Record(PushPullMetrics::kPush, table, bytes,
                   MonotonicNanos() - t0, /*ok=*/true);
  return r;
}

grpc::ServerUnaryReactor* ServerService::Pull(grpc::CallbackServerContext* ctx,
                                              const grpc::ByteBuffer* request,
                                              grpc::ByteBuffer* response) {
  absl::Status auth = CheckToken(*ctx, token_);
  if (!auth.ok()) return Reply(ctx, auth);
  struct Call {
    proto::PullRequest req;
    proto::PullResponse resp;
    grpc::Slice vals;
    int64_t t0 = 0;  // metrics (issue 11)
  };
  auto call = std::make_shared<Call>();
  if (metrics_ != nullptr) call->t0 = MonotonicNanos();
  grpc::ByteBuffer in(*request);  // shares the slices
  if (!grpc::SerializationTraits<proto::PullRequest>::Deserialize(&in,
                                                                 &call->req)
           .ok()) {
    if (metrics_ != nullptr) {
      metrics_->Record(PushPullMetrics::kPull, -1, request->Length(), -1,
                       /*ok=*/false);
    }
    return Reply(ctx, absl::InvalidArgumentError("malformed PullRequest"));
  }
  auto* r = ctx->DefaultReactor();
  // A waiting pull gives up when its caller does: a client that abandons
  // its call (deadline) does not leave the wait behind until wait_ms.
  absl::Duration left = absl::InfiniteDuration();
  if (ctx->deadline() != std::chrono::system_clock::time_point::max()) {
    left = absl::FromChrono(ctx->deadline()) - absl::Now();
  }
  node_->Pull(
      call->req, &call->resp,
      [this, r, call, response](const absl::Status& s) {
        if (metrics_ != nullptr) {
          metrics_->Record(PushPullMetrics::kPull, call->req.table(),
                           call->req.keys().size() + call->vals.size(),
                           MonotonicNanos() - call->t0, s.ok());
        }
        if (s.ok()) *response = PullReplyWire(call->resp, std::move(call->vals));
        r->Finish(ToGrpcStatus(s));
      },
      left,
      [call](size_t floats) {
        call->vals = grpc::Slice(floats * sizeof(float));  // uninitialised
        return reinterpret_cast<float*>(const_cast<uint8_t*>(call->vals.begin()));
      });
  return r;
}

grpc::ServerUnaryReactor* ServerService::Clock(grpc::CallbackServerContext* ctx,
                                               const proto::ClockRequest* req,
                                               proto::ClockResponse*) {
  absl::Status auth = CheckToken(*ctx, token_);
  if (!auth.ok()) return Reply(ctx, auth);
  auto* r = ctx->DefaultReactor();
  node_->ClockTick(*req,
                   [r](const absl::Status& s) { r->Finish(ToGrpcStatus(s)); });
  return r;
}

grpc::ServerUnaryReactor* ServerService::Replicate(
    grpc::CallbackServerContext* ctx, const proto::ReplicateRequest* req,
    proto::ReplicateResponse*) {
  absl::Status auth = CheckToken(*ctx, token_);
  if (!auth.ok()) return Reply(ctx, auth);
  return Reply(ctx, node_->Replicate(*req));
}

grpc::ServerUnaryReactor* ServerService::Finish(
    grpc::CallbackServerContext* ctx, const proto::FinishRequest* req,
    proto::FinishResponse*) {
  absl::Status auth = CheckToken(*ctx, token_);
  if (!auth.ok()) return Reply(ctx, auth);
  auto* r = ctx->DefaultReactor();
  node_->Finish(*req, [r](const absl::Status& s) { r->Finish(ToGrpcStatus(s)); });
  return r;
}

grpc::ServerUnaryReactor* ServerService::Control(
    grpc::CallbackServerContext* ctx, const proto::ServerControlRequest* req,
    proto::ServerControlResponse* resp) {
  absl::Status auth = CheckToken(*ctx, token_);
  if (!auth.ok()) return Reply(ctx, auth);
  switch (req->cmd_case()) {
    case proto::ServerControlRequest::kSetConsistency:
      return Reply(ctx, node_->SetConsistency(req->set_consistency()));
    case proto::ServerControlRequest::kNewView:
      return Reply(ctx, node_->Configure(node_->id(), req->new_view(),
                                         resp->mutable_join_clocks()));
    case proto::ServerControlRequest::kSaveAndExit: {
      absl::Status s = node_->SaveModel("", resp);
      if (s.ok() && req->save_kept_copy()) s = node_->SaveKeptCopy(resp);
      if (s.ok()) {
        PS_LOG_INFO("model shard written: {} ({} keys, {} non-zero)",
                    resp->model_path(), resp->keys(), resp->nonzeros());
        if (on_save_and_exit_) on_save_and_exit_();
      }
      return Reply(ctx, s);
    }
    case proto::ServerControlRequest::kKeepModelCopy:  // issue 12
      node_->KeepModelCopy();
      return Reply(ctx, absl::OkStatus());
    case proto::ServerControlRequest::kCheckpoint:  // checkpoints (issue 9)
      return Reply(ctx, node_->Checkpoint(req->checkpoint(), resp));
    default:
      return Reply(ctx, absl::InvalidArgumentError("empty control command"));
  }
}

grpc::ServerUnaryReactor* ServerService::GetStatus(
    grpc::CallbackServerContext* ctx, const proto::ServerStatusRequest*,
    proto::ServerStatus* resp) {
  absl::Status auth = CheckToken(*ctx, token_);
  if (!auth.ok()) return Reply(ctx, auth);
  *resp = node_->Status();
  return Reply(ctx, absl::OkStatus());
}

}  // namespace ps
