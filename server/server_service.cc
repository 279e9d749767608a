#include "server/server_service.h"

#include <cstring>
#include <memory>
#include <vector>

#include "absl/time/clock.h"
#include "absl/strings/str_cat.h"
#include "transport/grpc_transport.h"
#include "transport/wire_fields.h"
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
                                              const grpc::ByteBuffer* request,
                                              grpc::ByteBuffer* response) {
  absl::Status auth = CheckToken(*ctx, token_);
  if (!auth.ok()) return Reply(ctx, auth);
  const int64_t t0 = metrics_ != nullptr ? MonotonicNanos() : 0;
  // Keys and values stay where gRPC received them, or are copied once into
  // this thread's warm scratch: ServerNode::Push reads them before it
  // returns, and `wire` goes with this handler.
  constexpr int kBig[] = {proto::PushRequest::kKeysFieldNumber,
                          proto::PushRequest::kValsFieldNumber};
  WireFields wire;
  proto::PushRequest req;
  absl::Status parsed = wire.Parse(*request, kBig, &req);
  if (!parsed.ok()) {
    if (metrics_ != nullptr) {
      metrics_->Record(PushPullMetrics::kPush, -1, request->Length(), -1,
                       /*ok=*/false);
    }
    return Reply(ctx, absl::InvalidArgumentError(
                          absl::StrCat("malformed PushRequest: ",
                                       parsed.message())));
  }
  // The answer may come after this handler (a replicated push waits for
  // its backups); it is written into `response`, which lives until Finish.
  // One allocation per push, and a callback of one pointer, which
  // std::function holds without allocating; `done` runs exactly once.
  struct Call {
    proto::PushResponse resp;
    grpc::ServerUnaryReactor* reactor;
    Counter* errors;  // metrics (issue 11); may be null
    grpc::ByteBuffer* response;
  };
  auto* call = new Call{
      {},
      ctx->DefaultReactor(),
      metrics_ != nullptr ? metrics_->Errors(PushPullMetrics::kPush, req.table())
                          : nullptr,
      response};
  grpc::ServerUnaryReactor* r = call->reactor;
  node_->Push(req, wire.field(0), wire.field(1), &call->resp,
              [call](const absl::Status& s) {
                std::unique_ptr<Call> own(call);
                if (!s.ok() && call->errors != nullptr) call->errors->Add();
                if (s.ok()) {
                  bool owned = false;
                  grpc::SerializationTraits<proto::PushResponse>::Serialize(
                      call->resp, call->response, &owned)
                      .IgnoreError();  // a bool field: cannot fail
                }
                call->reactor->Finish(ToGrpcStatus(s));
              });
  if (metrics_ != nullptr) {
    metrics_->Record(PushPullMetrics::kPush, req.table(),
                     wire.field(0).size() + wire.field(1).size(),
                     MonotonicNanos() - t0, /*ok=*/true);
  }
  return r;
}

grpc::ServerUnaryReactor* ServerService::Pull(grpc::CallbackServerContext* ctx,
                                              const grpc::ByteBuffer* request,
                                              grpc::ByteBuffer* response) {
  absl::Status auth = CheckToken(*ctx, token_);
  if (!auth.ok()) return Reply(ctx, auth);
  struct Call {
    proto::PullRequest req;
    // The keys, where received or in a copy of the call's own: a pull that
    // waits reads them after this handler returned.
    WireFields wire{WireFields::Scratchpad::kOwned};
    proto::PullResponse resp;
    grpc::Slice vals;
    int64_t t0 = 0;  // metrics (issue 11)
  };
  auto call = std::make_shared<Call>();
  if (metrics_ != nullptr) call->t0 = MonotonicNanos();
  constexpr int kBig[] = {proto::PullRequest::kKeysFieldNumber};
  absl::Status parsed = call->wire.Parse(*request, kBig, &call->req);
  if (!parsed.ok()) {
    if (metrics_ != nullptr) {
      metrics_->Record(PushPullMetrics::kPull, -1, request->Length(), -1,
                       /*ok=*/false);
    }
    return Reply(ctx, absl::InvalidArgumentError(absl::StrCat(
                          "malformed PullRequest: ", parsed.message())));
  }
  auto* r = ctx->DefaultReactor();
  // A waiting pull gives up when its caller does: a client that abandons
  // its call (deadline) does not leave the wait behind until wait_ms.
  absl::Duration left = absl::InfiniteDuration();
  if (ctx->deadline() != std::chrono::system_clock::time_point::max()) {
    left = absl::FromChrono(ctx->deadline()) - absl::Now();
  }
  node_->Pull(
      call->req, call->wire.field(0), &call->resp,
      [this, r, call, response](const absl::Status& s) {
        if (metrics_ != nullptr) {
          metrics_->Record(PushPullMetrics::kPull, call->req.table(),
                           call->wire.field(0).size() + call->vals.size(),
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

// The backup's end of a ReplicateStream: read a batch, apply it, answer
// with its status, read the next. One operation at a time, so a peer can
// make the server hold at most one batch per stream.
class ServerService::ReplicateStreamReactor
    : public grpc::ServerBidiReactor<proto::ReplicateRequest,
                                     proto::ReplicateResponse> {
 public:
  explicit ReplicateStreamReactor(ServerService* service)
      : service_(service), node_(service->node_) {}

  // After the service knows the reactor (OnDone may follow at once).
  void Start(const absl::Status& auth) {
    if (!auth.ok()) {
      FinishOnce(ToGrpcStatus(auth));
      return;
    }
    StartRead(&req_);
  }

  // Finishes the call (once, whoever asks first).
  void FinishOnce(const grpc::Status& s) {
    {
      absl::MutexLock l(&mu_);
      if (finished_) return;
      finished_ = true;
    }
    Finish(s);
  }

  void OnReadDone(bool ok) override {
    if (!ok) {  // the primary closed or cancelled the call
      FinishOnce(grpc::Status::OK);
      return;
    }
    {
      absl::MutexLock l(&mu_);
      if (finished_) return;  // EndStreams: the server is going away
    }
    const absl::Status s = node_->Replicate(req_);
    req_.Clear();
    resp_.Clear();
    StatusToReply(s, &resp_);
    StartWrite(&resp_);
  }

  void OnWriteDone(bool ok) override {
    if (!ok) {
      FinishOnce(grpc::Status(grpc::StatusCode::UNAVAILABLE,
                              "replication answer not sent"));
      return;
    }
    {
      absl::MutexLock l(&mu_);
      if (finished_) return;
    }
    StartRead(&req_);
  }

  // EndStreams holds a pin while it finishes the call from outside, so
  // that an OnDone run meanwhile (Finish may run it inline) leaves the
  // delete to the last Unpin.
  void Pin() {
    absl::MutexLock l(&mu_);
    ++pins_;
  }
  void Unpin() {
    bool last;
    {
      absl::MutexLock l(&mu_);
      last = --pins_ == 0 && done_;
    }
    if (last) delete this;
  }

  void OnDone() override {
    service_->Forget(this);
    bool pinned;
    {
      absl::MutexLock l(&mu_);
      done_ = true;
      pinned = pins_ > 0;
    }
    if (!pinned) delete this;
  }

 private:
  ServerService* const service_;
  ServerNode* const node_;
  proto::ReplicateRequest req_;
  proto::ReplicateResponse resp_;
  absl::Mutex mu_;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  bool done_ ABSL_GUARDED_BY(mu_) = false;
  int pins_ ABSL_GUARDED_BY(mu_) = 0;
};

grpc::ServerBidiReactor<proto::ReplicateRequest, proto::ReplicateResponse>*
ServerService::ReplicateStream(grpc::CallbackServerContext* ctx) {
  auto* r = new ReplicateStreamReactor(this);
  {
    absl::MutexLock l(&streams_mu_);
    streams_.insert(r);
  }
  r->Start(CheckToken(*ctx, token_));
  return r;
}

void ServerService::Forget(ReplicateStreamReactor* r) {
  absl::MutexLock l(&streams_mu_);
  streams_.erase(r);
}

void ServerService::EndStreams() {
  std::vector<ReplicateStreamReactor*> open;
  {
    absl::MutexLock l(&streams_mu_);
    for (ReplicateStreamReactor* r : streams_) {
      r->Pin();
      open.push_back(r);
    }
  }
  // Outside streams_mu_: Finish may run OnDone, which takes it.
  for (ReplicateStreamReactor* r : open) {
    r->FinishOnce(grpc::Status(grpc::StatusCode::UNAVAILABLE,
                               "server shutting down"));
    r->Unpin();
  }
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
      // A joining server is in the scheduler's views (and gets their
      // broadcasts) from its JoinCluster on, but knows its id only once it
      // configured itself with the join's answer: until then, retry.
      if (node_->id() < 0) {
        return Reply(ctx, absl::UnavailableError(
                              "server not configured yet (joining); retry"));
      }
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
  {
    absl::MutexLock l(&data_mu_);
    resp->set_data_port(data_port_);
    resp->set_data_socket(data_socket_);
  }
  return Reply(ctx, absl::OkStatus());
}

void DataService::Push(const proto::PushRequest& req,
                       absl::Span<const char> keys, absl::Span<const char> vals,
                       DataReplyTo reply) {
  const int64_t t0 = metrics_ != nullptr ? MonotonicNanos() : 0;
  // As ServerService::Push: one allocation per push; `done` runs once.
  struct Call {
    proto::PushResponse resp;
    DataReplyTo reply;
    Counter* errors;  // metrics (issue 11); may be null
  };
  auto* call = new Call{
      {},
      std::move(reply),
      metrics_ != nullptr ? metrics_->Errors(PushPullMetrics::kPush, req.table())
                          : nullptr};
  node_->Push(req, absl::string_view(keys.data(), keys.size()),
              absl::string_view(vals.data(), vals.size()), &call->resp,
              [call](const absl::Status& s) {
                std::unique_ptr<Call> own(call);
                if (!s.ok() && call->errors != nullptr) call->errors->Add();
                call->reply.Send(s, &call->resp);
              });
  if (metrics_ != nullptr) {
    metrics_->Record(PushPullMetrics::kPush, req.table(),
                     keys.size() + vals.size(), MonotonicNanos() - t0,
                     /*ok=*/true);
  }
}

void DataService::Pull(const proto::PullRequest& req,
                       absl::Span<const char> keys, absl::Duration wait,
                       DataReplyTo reply) {
  struct Call {
    proto::PullRequest req;
    // The keys, copied: a pull that waits reads them after this returned
    // (uint64 storage: 8-byte aligned, as ServerNode::Pull needs).
    std::vector<uint64_t> keys;
    proto::PullResponse resp;
    std::unique_ptr<float[]> vals;  // written by the node, sent as is
    size_t floats = 0;
    int64_t t0 = 0;  // metrics (issue 11)
    DataReplyTo reply;
  };
  auto call = std::make_shared<Call>(Call{req, {}, {}, nullptr, 0, 0, reply});
  if (metrics_ != nullptr) call->t0 = MonotonicNanos();
  call->keys.resize(keys.size() / sizeof(uint64_t));
  if (!keys.empty()) std::memcpy(call->keys.data(), keys.data(), keys.size());
  node_->Pull(
      call->req,
      absl::string_view(reinterpret_cast<const char*>(call->keys.data()),
                        keys.size()),
      &call->resp,
      [this, call](const absl::Status& s) {
        char* slot = call->reply.Slot(call->floats * sizeof(float));
        const absl::Span<const char> vals(
            call->vals != nullptr ? reinterpret_cast<const char*>(call->vals.get())
                                  : slot,
            call->floats * sizeof(float));
        if (metrics_ != nullptr) {
          metrics_->Record(PushPullMetrics::kPull, call->req.table(),
                           call->keys.size() * sizeof(uint64_t) + vals.size(),
                           MonotonicNanos() - call->t0, s.ok());
        }
        call->reply.Send(s, &call->resp, vals);
      },
      wait,
      [call](size_t floats) {
        call->floats = floats;
        // Straight into the worker's shared memory when it offered room
        // (transport/shared_arena.h): Send then copies nothing.
        if (char* slot = call->reply.Slot(floats * sizeof(float))) {
          return reinterpret_cast<float*>(slot);
        }
        // Uninitialised: the node writes every float.
        call->vals.reset(new float[floats]);
        return call->vals.get();
      });
}

void DataService::Replicate(const proto::ReplicateRequest& req,
                            absl::Span<const char> vals, DataReplyTo reply) {
  reply.Send(node_->Replicate(req, vals), nullptr);
}

void DataService::Clock(const proto::ClockRequest& req, DataReplyTo reply) {
  node_->ClockTick(req, [reply = std::move(reply)](const absl::Status& s) {
    proto::ClockResponse resp;
    reply.Send(s, &resp);
  });
}

}  // namespace ps
