#include "transport/faulty_transport.h"

#include <utility>

#include "absl/strings/str_cat.h"

namespace ps {

// ----------------------------------------------------------------- faults

const char* RpcMethodName(RpcMethod m) {
  switch (m) {
    case RpcMethod::kPush:
      return "push";
    case RpcMethod::kPull:
      return "pull";
    case RpcMethod::kClock:
      return "clock";
    case RpcMethod::kFinish:
      return "finish";
    case RpcMethod::kControl:
      return "control";
    case RpcMethod::kStatus:
      return "status";
    case RpcMethod::kReplicate:
      return "replicate";
  }
  return "?";
}

DelayedCalls::~DelayedCalls() {
  State* st = state_.get();
  for (;;) {
    std::function<void()> fn;
    {
      absl::MutexLock l(&st->mu);
      if (st->calls.empty()) return;
      auto it = st->calls.begin();
      clock_->Cancel(it->second.first);
      fn = std::move(it->second.second);
      st->calls.erase(it);
    }
    fn();
  }
}

void DelayedCalls::After(absl::Duration d, std::function<void()> fn) {
  State* st = state_.get();
  absl::MutexLock l(&st->mu);
  const uint64_t key = st->next_key++;
  auto& slot = st->calls[key];
  slot.second = std::move(fn);
  // mu is held until the timer id is stored; the timer takes mu first.
  slot.first = clock_->RunAfter(d, [state = state_, key] {
    std::function<void()> f = Take(state.get(), key);
    if (f) f();
  });
}

std::function<void()> DelayedCalls::Take(State* state, uint64_t key) {
  absl::MutexLock l(&state->mu);
  auto it = state->calls.find(key);
  if (it == state->calls.end()) return nullptr;
  std::function<void()> fn = std::move(it->second.second);
  state->calls.erase(it);
  return fn;
}

FaultyServerClient::FaultyServerClient(std::shared_ptr<ServerClient> inner,
                                       FaultOptions options,
                                       DelayedCalls* delayed,
                                       FaultStats* stats)
    : inner_(std::move(inner)),
      options_(std::move(options)),
      delayed_(delayed),
      stats_(stats),
      rng_(options_.seed) {}

Fault FaultyServerClient::Decide(RpcMethod m) {
  ++stats_->calls;
  absl::MutexLock l(&mu_);
  const int64_t index = calls_[m]++;
  Fault f = Fault::kNone;
  if (options_.schedule) {
    f = options_.schedule(m, index);
  } else {
    const FaultRates* r = nullptr;
    switch (m) {
      case RpcMethod::kPush:
        r = &options_.push;
        break;
      case RpcMethod::kPull:
        r = &options_.pull;
        break;
      case RpcMethod::kClock:
        r = &options_.clock;
        break;
      case RpcMethod::kFinish:
        r = &options_.finish;
        break;
      case RpcMethod::kControl:
        r = &options_.control;
        break;
      case RpcMethod::kStatus:
        r = &options_.status;
        break;
      case RpcMethod::kReplicate:
        r = &options_.replicate;
        break;
    }
    // One draw per call, whatever the rates, so the sequence of decisions
    // depends only on the seed and the call order.
    const double u = std::uniform_real_distribution<double>(0.0, 1.0)(rng_);
    if (u < r->drop_request) {
      f = Fault::kDropRequest;
    } else if (u < r->drop_request + r->drop_reply) {
      f = Fault::kDropReply;
    } else if (u < r->drop_request + r->drop_reply + r->delay) {
      f = Fault::kDelay;
    }
  }
  switch (f) {
    case Fault::kDropRequest:
      ++stats_->dropped_requests;
      break;
    case Fault::kDropReply:
      ++stats_->dropped_replies;
      break;
    case Fault::kDelay:
      ++stats_->delayed;
      break;
    case Fault::kNone:
      break;
  }
  return f;
}

template <typename Req, typename Resp, typename Call>
void FaultyServerClient::Async(RpcMethod m, std::shared_ptr<const Req> req,
                               absl::Time deadline, Callback<Resp> done,
                               Call call) {
  // `call` captures only the inner client (shared), never `this`, so a
  // delayed delivery does not depend on this decorator's lifetime.
  switch (Decide(m)) {
    case Fault::kDropRequest: {
      Resp r;
      done(absl::UnavailableError(absl::StrCat(
               "fault injection: ", RpcMethodName(m), " request lost")),
           &r);
      return;
    }
    case Fault::kDropReply: {
      call(std::move(req), deadline,
           [m, done = std::move(done)](const absl::Status&, Resp*) {
             Resp r;
             done(absl::UnavailableError(absl::StrCat(
                      "fault injection: ", RpcMethodName(m), " reply lost")),
                  &r);
           });
      return;
    }
    case Fault::kDelay:
      delayed_->After(options_.delay, [call, req = std::move(req), deadline,
                                       done = std::move(done)]() mutable {
        call(std::move(req), deadline, std::move(done));
      });
      return;
    case Fault::kNone:
      call(std::move(req), deadline, std::move(done));
      return;
  }
}

void FaultyServerClient::Push(std::shared_ptr<const proto::PushRequest> req,
                              absl::Time deadline,
                              Callback<proto::PushResponse> done) {
  Async<proto::PushRequest, proto::PushResponse>(
      RpcMethod::kPush, std::move(req), deadline, std::move(done),
      [inner = inner_](std::shared_ptr<const proto::PushRequest> r,
                       absl::Time d, Callback<proto::PushResponse> cb) {
        inner->Push(std::move(r), d, std::move(cb));
      });
}

void FaultyServerClient::Pull(std::shared_ptr<const proto::PullRequest> req,
                              absl::Time deadline,
                              Callback<proto::PullResponse> done) {
  Async<proto::PullRequest, proto::PullResponse>(
      RpcMethod::kPull, std::move(req), deadline, std::move(done),
      [inner = inner_](std::shared_ptr<const proto::PullRequest> r,
                       absl::Time d, Callback<proto::PullResponse> cb) {
        inner->Pull(std::move(r), d, std::move(cb));
      });
}

void FaultyServerClient::Clock(std::shared_ptr<const proto::ClockRequest> req,
                               absl::Time deadline,
                               Callback<proto::ClockResponse> done) {
  Async<proto::ClockRequest, proto::ClockResponse>(
      RpcMethod::kClock, std::move(req), deadline, std::move(done),
      [inner = inner_](std::shared_ptr<const proto::ClockRequest> r,
                       absl::Time d, Callback<proto::ClockResponse> cb) {
        inner->Clock(std::move(r), d, std::move(cb));
      });
}

void FaultyServerClient::Replicate(
    std::shared_ptr<const proto::ReplicateRequest> req, absl::Time deadline,
    Callback<proto::ReplicateResponse> done) {
  Async<proto::ReplicateRequest, proto::ReplicateResponse>(
      RpcMethod::kReplicate, std::move(req), deadline, std::move(done),
      [inner = inner_](std::shared_ptr<const proto::ReplicateRequest> r,
                       absl::Time d, Callback<proto::ReplicateResponse> cb) {
        inner->Replicate(std::move(r), d, std::move(cb));
      });
}

absl::Status FaultyServerClient::Finish(const proto::FinishRequest& req,
                                        absl::Time deadline) {
  switch (Decide(RpcMethod::kFinish)) {
    case Fault::kDropRequest:
      return absl::UnavailableError("fault injection: finish request lost");
    case Fault::kDropReply:
      (void)inner_->Finish(req, deadline);
      return absl::UnavailableError("fault injection: finish reply lost");
    case Fault::kDelay:
      options_.timers->SleepFor(options_.delay);
      [[fallthrough]];
    case Fault::kNone:
      break;
  }
  return inner_->Finish(req, deadline);
}

absl::StatusOr<proto::ServerControlResponse> FaultyServerClient::Control(
    const proto::ServerControlRequest& req, absl::Time deadline) {
  switch (Decide(RpcMethod::kControl)) {
    case Fault::kDropRequest:
      return absl::UnavailableError("fault injection: control request lost");
    case Fault::kDropReply:
      (void)inner_->Control(req, deadline);
      return absl::UnavailableError("fault injection: control reply lost");
    case Fault::kDelay:
      options_.timers->SleepFor(options_.delay);
      [[fallthrough]];
    case Fault::kNone:
      break;
  }
  return inner_->Control(req, deadline);
}

absl::StatusOr<proto::ServerStatus> FaultyServerClient::GetStatus(
    absl::Time deadline) {
  switch (Decide(RpcMethod::kStatus)) {
    case Fault::kDropRequest:
      return absl::UnavailableError("fault injection: status request lost");
    case Fault::kDropReply:
      (void)inner_->GetStatus(deadline);
      return absl::UnavailableError("fault injection: status reply lost");
    case Fault::kDelay:
      options_.timers->SleepFor(options_.delay);
      [[fallthrough]];
    case Fault::kNone:
      break;
  }
  return inner_->GetStatus(deadline);
}

FaultyClientFactory::FaultyClientFactory(ClientFactory* inner,
                                         FaultOptions options,
                                         FaultStats* stats)
    : inner_(inner),
      options_(std::move(options)),
      stats_(stats != nullptr ? stats : &own_stats_),
      delayed_(options_.timers) {}

FaultyClientFactory::~FaultyClientFactory() = default;

std::shared_ptr<ServerClient> FaultyClientFactory::Server(
    const std::string& address) {
  absl::MutexLock l(&mu_);
  auto it = clients_.find(address);
  if (it != clients_.end()) return it->second;
  FaultOptions o = options_;
  // FNV-1a of the address: a fixed, platform-independent mix.
  uint64_t h = 1469598103934665603ULL;
  for (unsigned char c : address) h = (h ^ c) * 1099511628211ULL;
  o.seed ^= h;
  auto client = std::make_shared<FaultyServerClient>(
      inner_->Server(address), std::move(o), &delayed_, stats_);
  clients_.emplace(address, client);
  return client;
}

std::shared_ptr<SchedulerClient> FaultyClientFactory::Scheduler(
    const std::string& address) {
  return inner_->Scheduler(address);
}

}  // namespace ps
