#include "transport/grpc_transport.h"

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <vector>

#include "absl/strings/numbers.h"
#include "proto/ps.grpc.pb.h"

namespace ps {

grpc::Status ToGrpcStatus(const absl::Status& s) {
  if (s.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(s.code()),
                      std::string(s.message()), EncodeReason(s));
}

absl::Status FromGrpcStatus(const grpc::Status& s) {
  if (s.ok()) return absl::OkStatus();
  return DecodeReason(absl::Status(static_cast<absl::StatusCode>(s.error_code()),
                                   s.error_message()),
                      s.error_details());
}

absl::Status CheckToken(const grpc::ServerContextBase& ctx,
                        const std::string& expected) {
  if (expected.empty()) return absl::OkStatus();
  const auto& md = ctx.client_metadata();
  auto it = md.find(kTokenHeader);
  if (it == md.end()) {
    return absl::UnauthenticatedError("missing cluster token");
  }
  if (std::string_view(it->second.data(), it->second.size()) != expected) {
    return absl::UnauthenticatedError("wrong cluster token");
  }
  return absl::OkStatus();
}

grpc::ChannelArguments DefaultChannelArgs() {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(-1);
  args.SetMaxSendMessageSize(-1);
  // Bigger HTTP/2 windows: large pushes would otherwise stall on
  // flow-control round trips.
  args.SetInt(GRPC_ARG_HTTP2_BDP_PROBE, 1);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, 10000);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 10000);
  args.SetInt(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  // Bug "A ~5 s stall while connecting": gRPC takes the *minimum*
  // reconnect backoff as the minimum connect timeout (doc/connection-
  // backoff.md: MIN_CONNECT_TIMEOUT), so at 100 ms a handshake with a busy
  // peer was cut off ("tcp handshaker shutdown") and the call waited for
  // later attempts. Give a connect 5 s; retries still start after 100 ms
  // (initial backoff) and back off to at most 1 s.
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 5000);
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  return args;
}

void ConfigureServerBuilder(grpc::ServerBuilder* builder) {
  builder->SetMaxReceiveMessageSize(-1);
  builder->SetMaxSendMessageSize(-1);
  builder->AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  builder->AddChannelArgument(
      GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, 5000);
}

void ApplyGrpcArgs(const std::vector<GrpcArg>& args,
                   grpc::ChannelArguments* base) {
  for (const GrpcArg& a : args) {
    int v;
    if (absl::SimpleAtoi(a.value, &v)) {
      base->SetInt(a.name, v);
    } else {
      base->SetString(a.name, a.value);
    }
  }
}

void ApplyGrpcArgs(const std::vector<GrpcArg>& args,
                   grpc::ServerBuilder* builder) {
  for (const GrpcArg& a : args) {
    int v;
    if (absl::SimpleAtoi(a.value, &v)) {
      builder->AddChannelArgument(a.name, v);
    } else {
      builder->AddChannelArgument(a.name, a.value);
    }
  }
}

std::string TokenFromEnv(const std::string& fallback) {
  const char* t = std::getenv("PS_AUTH_TOKEN");
  if (t != nullptr && *t != '\0') return t;
  return fallback;
}

namespace {

std::chrono::system_clock::time_point ToDeadline(absl::Time t) {
  absl::Time cap = absl::Now() + absl::Hours(24);
  if (t > cap) t = cap;
  return absl::ToChronoTime(t);
}

void Prepare(grpc::ClientContext* ctx, absl::Time deadline,
             const std::string& token) {
  ctx->set_deadline(ToDeadline(deadline));
  if (!token.empty()) ctx->AddMetadata(kTokenHeader, token);
}

class GrpcServerClient : public ServerClient {
 public:
  GrpcServerClient(const std::string& address, const GrpcTransportOptions& o)
      : token_(o.token), inflight_(std::make_shared<Inflight>()) {
    for (int i = 0; i < std::max(1, o.channels_per_server); ++i) {
      grpc::ChannelArguments args = DefaultChannelArgs();
      // Distinct args and a local subchannel pool give each channel its own
      // TCP connection.
      args.SetInt("ps.channel_index", i);
      args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
      ApplyGrpcArgs(o.extra_channel_args, &args);
      stubs_.push_back(proto::Server::NewStub(grpc::CreateCustomChannel(
          address, grpc::InsecureChannelCredentials(), args)));
    }
  }

  void Push(std::shared_ptr<const proto::PushRequest> req, absl::Time deadline,
            Callback<proto::PushResponse> done) override {
    Start<proto::PushRequest, proto::PushResponse>(
        std::move(req), deadline, std::move(done),
        [](proto::Server::Stub* s, auto* ctx, auto* rq, auto* rs, auto cb) {
          s->async()->Push(ctx, rq, rs, std::move(cb));
        });
  }
  void Pull(std::shared_ptr<const proto::PullRequest> req, absl::Time deadline,
            Callback<proto::PullResponse> done) override {
    Start<proto::PullRequest, proto::PullResponse>(
        std::move(req), deadline, std::move(done),
        [](proto::Server::Stub* s, auto* ctx, auto* rq, auto* rs, auto cb) {
          s->async()->Pull(ctx, rq, rs, std::move(cb));
        });
  }
  void Clock(std::shared_ptr<const proto::ClockRequest> req, absl::Time deadline,
             Callback<proto::ClockResponse> done) override {
    Start<proto::ClockRequest, proto::ClockResponse>(
        std::move(req), deadline, std::move(done),
        [](proto::Server::Stub* s, auto* ctx, auto* rq, auto* rs, auto cb) {
          s->async()->Clock(ctx, rq, rs, std::move(cb));
        });
  }
  // Calls still in flight hold the channels: wait for them (bounded), so a
  // channel is never destroyed on gRPC's own callback thread.
  ~GrpcServerClient() override {
    absl::MutexLock l(&inflight_->mu);
    auto idle = [this]() ABSL_SHARED_LOCKS_REQUIRED(inflight_->mu) {
      return inflight_->count == 0;
    };
    inflight_->mu.AwaitWithTimeout(absl::Condition(&idle), absl::Seconds(10));
  }

  absl::Status Finish(const proto::FinishRequest& req,
                      absl::Time deadline) override {
    grpc::ClientContext ctx;
    Prepare(&ctx, deadline, token_);
    proto::FinishResponse resp;
    return FromGrpcStatus(NextStub()->Finish(&ctx, req, &resp));
  }
  absl::StatusOr<proto::ServerControlResponse> Control(
      const proto::ServerControlRequest& req, absl::Time deadline) override {
    grpc::ClientContext ctx;
    Prepare(&ctx, deadline, token_);
    proto::ServerControlResponse resp;
    absl::Status s = FromGrpcStatus(NextStub()->Control(&ctx, req, &resp));
    if (!s.ok()) return s;
    return resp;
  }
  absl::StatusOr<proto::ServerStatus> GetStatus(absl::Time deadline) override {
    grpc::ClientContext ctx;
    Prepare(&ctx, deadline, token_);
    proto::ServerStatusRequest req;
    proto::ServerStatus resp;
    absl::Status s = FromGrpcStatus(NextStub()->GetStatus(&ctx, req, &resp));
    if (!s.ok()) return s;
    return resp;
  }

 private:
  proto::Server::Stub* NextStub() {
    return stubs_[next_.fetch_add(1, std::memory_order_relaxed) %
                  stubs_.size()]
        .get();
  }

  template <typename Req, typename Resp, typename Fn>
  void Start(std::shared_ptr<const Req> req, absl::Time deadline,
             Callback<Resp> done, Fn fn) {
    struct Call {
      grpc::ClientContext ctx;
      std::shared_ptr<const Req> req;
      Resp resp;
      Callback<Resp> done;
    };
    auto* call = new Call;
    call->req = std::move(req);
    call->done = std::move(done);
    Prepare(&call->ctx, deadline, token_);
    {
      absl::MutexLock l(&inflight_->mu);
      ++inflight_->count;
    }
    fn(NextStub(), &call->ctx, call->req.get(), &call->resp,
       [call, inflight = inflight_](grpc::Status s) {
         call->done(FromGrpcStatus(s), &call->resp);
         delete call;
         absl::MutexLock l(&inflight->mu);
         --inflight->count;
       });
  }

  struct Inflight {
    absl::Mutex mu;
    int64_t count ABSL_GUARDED_BY(mu) = 0;
  };

  const std::string token_;
  std::shared_ptr<Inflight> inflight_;
  std::vector<std::unique_ptr<proto::Server::Stub>> stubs_;
  std::atomic<uint64_t> next_{0};
};

class GrpcSchedulerClient : public SchedulerClient {
 public:
  GrpcSchedulerClient(const std::string& address, const std::string& token)
      : token_(token),
        stub_(proto::Scheduler::NewStub(grpc::CreateCustomChannel(
            address, grpc::InsecureChannelCredentials(),
            DefaultChannelArgs()))) {}

#define PS_SYNC_CALL(Method, Req, Resp)                                   \
  absl::StatusOr<Resp> Method(const Req& req, absl::Time deadline)        \
      override {                                                          \
    grpc::ClientContext ctx;                                              \
    Prepare(&ctx, deadline, token_);                                      \
    Resp resp;                                                            \
    absl::Status s = FromGrpcStatus(stub_->Method(&ctx, req, &resp));     \
    if (!s.ok()) return s;                                                \
    return resp;                                                          \
  }
  PS_SYNC_CALL(Register, proto::RegisterRequest, proto::RegisterResponse)
  PS_SYNC_CALL(GetView, proto::GetViewRequest, proto::GetViewResponse)
  PS_SYNC_CALL(Heartbeat, proto::HeartbeatRequest, proto::HeartbeatResponse)
  PS_SYNC_CALL(GetShard, proto::GetShardRequest, proto::GetShardResponse)
  PS_SYNC_CALL(SetConsistency, proto::SetConsistencyRequest,
               proto::SetConsistencyResponse)
  PS_SYNC_CALL(Status, proto::StatusRequest, proto::StatusResponse)
#undef PS_SYNC_CALL

#define PS_SYNC_VOID_CALL(Method, Req, Resp)                              \
  absl::Status Method(const Req& req, absl::Time deadline) override {     \
    grpc::ClientContext ctx;                                              \
    Prepare(&ctx, deadline, token_);                                      \
    Resp resp;                                                            \
    return FromGrpcStatus(stub_->Method(&ctx, req, &resp));               \
  }
  PS_SYNC_VOID_CALL(Barrier, proto::BarrierRequest, proto::BarrierResponse)
  PS_SYNC_VOID_CALL(WorkerDone, proto::WorkerDoneRequest,
                    proto::WorkerDoneResponse)
  PS_SYNC_VOID_CALL(ServerDone, proto::ServerDoneRequest,
                    proto::ServerDoneResponse)
#undef PS_SYNC_VOID_CALL

 private:
  const std::string token_;
  std::unique_ptr<proto::Scheduler::Stub> stub_;
};

}  // namespace

GrpcClientFactory::GrpcClientFactory(GrpcTransportOptions options)
    : options_(std::move(options)) {}

std::shared_ptr<ServerClient> GrpcClientFactory::Server(
    const std::string& address) {
  absl::MutexLock l(&mu_);
  auto& c = servers_[address];
  if (!c) c = std::make_shared<GrpcServerClient>(address, options_);
  return c;
}

std::shared_ptr<SchedulerClient> GrpcClientFactory::Scheduler(
    const std::string& address) {
  absl::MutexLock l(&mu_);
  auto& c = schedulers_[address];
  if (!c) c = std::make_shared<GrpcSchedulerClient>(address, options_.token);
  return c;
}

}  // namespace ps
