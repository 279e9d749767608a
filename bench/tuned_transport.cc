#include "bench/tuned_transport.h"

#include <algorithm>
#include <atomic>
#include <chrono>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/grpc_transport.h"
#include "proto/ps.grpc.pb.h"

namespace ps::bench {

absl::StatusOr<std::vector<GrpcArg>> ParseGrpcArgs(const std::string& spec) {
  std::vector<GrpcArg> out;
  for (absl::string_view part : absl::StrSplit(spec, ',', absl::SkipEmpty())) {
    const size_t eq = part.find('=');
    if (eq == absl::string_view::npos || eq == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("grpc arg \"", part, "\": expected name=value"));
    }
    out.push_back(
        {std::string(part.substr(0, eq)), std::string(part.substr(eq + 1))});
  }
  return out;
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

namespace {

// The data-plane part of common/grpc_transport.cc's GrpcServerClient, kept
// line for line except for the channel arguments. The control calls are not
// used by the benchmark.
class TunedServerClient : public ServerClient {
 public:
  TunedServerClient(const std::string& address, int channels,
                    const std::vector<GrpcArg>& extra) {
    for (int i = 0; i < std::max(1, channels); ++i) {
      grpc::ChannelArguments args = DefaultChannelArgs();
      args.SetInt("ps.channel_index", i);
      args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
      ApplyGrpcArgs(extra, &args);
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
  void Clock(std::shared_ptr<const proto::ClockRequest> req,
             absl::Time deadline,
             Callback<proto::ClockResponse> done) override {
    Start<proto::ClockRequest, proto::ClockResponse>(
        std::move(req), deadline, std::move(done),
        [](proto::Server::Stub* s, auto* ctx, auto* rq, auto* rs, auto cb) {
          s->async()->Clock(ctx, rq, rs, std::move(cb));
        });
  }
  absl::Status Finish(const proto::FinishRequest&, absl::Time) override {
    return absl::UnimplementedError("not used by the benchmark");
  }
  absl::StatusOr<proto::ServerControlResponse> Control(
      const proto::ServerControlRequest&, absl::Time) override {
    return absl::UnimplementedError("not used by the benchmark");
  }
  absl::StatusOr<proto::ServerStatus> GetStatus(absl::Time) override {
    return absl::UnimplementedError("not used by the benchmark");
  }

 private:
  proto::Server::Stub* NextStub() {
    return stubs_[next_.fetch_add(1, std::memory_order_relaxed) % stubs_.size()]
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
    call->ctx.set_deadline(
        absl::ToChronoTime(std::min(deadline, absl::Now() + absl::Hours(24))));
    fn(NextStub(), &call->ctx, call->req.get(), &call->resp,
       [call](grpc::Status s) {
         call->done(FromGrpcStatus(s), &call->resp);
         delete call;
       });
  }

  std::vector<std::unique_ptr<proto::Server::Stub>> stubs_;
  std::atomic<uint64_t> next_{0};
};

}  // namespace

TunedClientFactory::TunedClientFactory(int channels_per_server,
                                       std::vector<GrpcArg> extra)
    : channels_per_server_(channels_per_server), extra_(std::move(extra)) {}

std::shared_ptr<ServerClient> TunedClientFactory::Server(
    const std::string& address) {
  absl::MutexLock l(&mu_);
  for (const auto& [a, c] : servers_) {
    if (a == address) return c;
  }
  auto c = std::make_shared<TunedServerClient>(address, channels_per_server_,
                                               extra_);
  servers_.emplace_back(address, c);
  return c;
}

std::shared_ptr<SchedulerClient> TunedClientFactory::Scheduler(
    const std::string&) {
  return std::make_shared<UnreachableScheduler>();
}

}  // namespace ps::bench
