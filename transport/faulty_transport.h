// A fault-injecting decorator of the transport seam: FaultyServerClient
// wraps any ServerClient and loses requests (the server never sees them),
// loses replies after the server applied the request, or delays requests,
// decided by a seeded RNG or an explicit schedule. FaultyClientFactory wraps
// every server client of another factory. Delays go through an injected
// Clock, so a test with a FakeClock decides when a delayed call arrives.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "proto/ps.pb.h"
#include "transport/transport.h"

namespace ps {

// ------------------------------------------------------------ fault injection

enum class RpcMethod {
  kPush,
  kPull,
  kClock,
  kFinish,
  kControl,
  kStatus,
  kReplicate,  // server to server (issue 9)
};
const char* RpcMethodName(RpcMethod m);

enum class Fault {
  kNone,
  kDropRequest,  // lost before delivery: the server never sees it
  kDropReply,    // delivered and applied; the caller gets UNAVAILABLE
  kDelay,        // delivered after FaultOptions::delay (on options.clock)
};

// Probabilities, per call, of each fault (checked in this order; their sum
// should be <= 1).
struct FaultRates {
  double drop_request = 0;
  double drop_reply = 0;
  double delay = 0;
};

struct FaultOptions {
  uint64_t seed = 1;
  FaultRates push, pull, clock;
  FaultRates replicate;  // a primary's log entries to a backup
  // Synchronous calls; off by default.
  FaultRates finish, control, status;
  absl::Duration delay = absl::Milliseconds(5);
  // Delays run on this clock's timers (synchronous calls sleep on it).
  // Must outlive the factory.
  Clock* timers = Clock::Real();
  // When set, decides each call instead of the rates: gets the method and
  // the index of the call among this client's calls of that method (from 0).
  std::function<Fault(RpcMethod, int64_t index)> schedule;
};

// Counts of what a FaultyServerClient did. Thread-safe.
struct FaultStats {
  std::atomic<int64_t> calls{0};
  std::atomic<int64_t> dropped_requests{0};
  std::atomic<int64_t> dropped_replies{0};
  std::atomic<int64_t> delayed{0};
};

// Calls delayed on a Clock. Destruction runs whatever is still waiting, at
// once, so no callback is lost. Thread-safe.
class DelayedCalls {
 public:
  explicit DelayedCalls(Clock* clock) : clock_(clock) {}
  ~DelayedCalls();
  void After(absl::Duration d, std::function<void()> fn);

 private:
  // Shared with the timers, so a timer that fires while the destructor runs
  // finds its call already taken instead of a destroyed object.
  struct State {
    absl::Mutex mu;
    uint64_t next_key ABSL_GUARDED_BY(mu) = 0;
    // key -> (timer, function); whoever runs the call removes it first.
    std::map<uint64_t, std::pair<Clock::TimerId, std::function<void()>>>
        calls ABSL_GUARDED_BY(mu);
  };
  // Removes `key` and returns its function (empty when already taken).
  static std::function<void()> Take(State* state, uint64_t key);

  Clock* const clock_;
  const std::shared_ptr<State> state_ = std::make_shared<State>();
};

// Wraps `inner`. A dropped request or reply is reported with UNAVAILABLE (as
// a lost connection would be), so a correct client retries it. Thread-safe.
class FaultyServerClient : public ServerClient {
 public:
  // `delayed` (for kDelay) and `stats` must outlive the client.
  FaultyServerClient(std::shared_ptr<ServerClient> inner, FaultOptions options,
                     DelayedCalls* delayed, FaultStats* stats);

  void Push(std::shared_ptr<const proto::PushRequest> req, absl::Time deadline,
            Callback<proto::PushResponse> done) override;
  void Pull(std::shared_ptr<const proto::PullRequest> req, absl::Time deadline,
            Callback<proto::PullResponse> done) override;
  void Clock(std::shared_ptr<const proto::ClockRequest> req,
             absl::Time deadline, Callback<proto::ClockResponse> done) override;
  absl::Status Finish(const proto::FinishRequest& req,
                      absl::Time deadline) override;
  absl::StatusOr<proto::ServerControlResponse> Control(
      const proto::ServerControlRequest& req, absl::Time deadline) override;
  absl::StatusOr<proto::ServerStatus> GetStatus(absl::Time deadline) override;
  void Replicate(std::shared_ptr<const proto::ReplicateRequest> req,
                 absl::Time deadline,
                 Callback<proto::ReplicateResponse> done) override;

 private:
  Fault Decide(RpcMethod m);
  template <typename Req, typename Resp, typename Call>
  void Async(RpcMethod m, std::shared_ptr<const Req> req, absl::Time deadline,
             Callback<Resp> done, Call call);

  const std::shared_ptr<ServerClient> inner_;
  const FaultOptions options_;
  DelayedCalls* const delayed_;
  FaultStats* const stats_;
  absl::Mutex mu_;
  std::mt19937_64 rng_ ABSL_GUARDED_BY(mu_);
  std::map<RpcMethod, int64_t> calls_ ABSL_GUARDED_BY(mu_);
};

// Wraps every server client of `inner` in a FaultyServerClient (one per
// address, each seeded with options.seed mixed with the address); the
// scheduler client passes through unchanged. `inner` must outlive it.
class FaultyClientFactory : public ClientFactory {
 public:
  // `stats`, when given, receives the counts instead of this factory's own
  // (so they survive the factory); it must outlive the factory.
  FaultyClientFactory(ClientFactory* inner, FaultOptions options,
                      FaultStats* stats = nullptr);
  ~FaultyClientFactory() override;

  std::shared_ptr<ServerClient> Server(const std::string& address) override;
  std::shared_ptr<SchedulerClient> Scheduler(
      const std::string& address) override;

  // Totals over every client made so far.
  const FaultStats& stats() const { return *stats_; }

 private:
  ClientFactory* const inner_;
  const FaultOptions options_;
  FaultStats own_stats_;
  FaultStats* const stats_;
  absl::Mutex mu_;
  std::map<std::string, std::shared_ptr<ServerClient>> clients_
      ABSL_GUARDED_BY(mu_);
  DelayedCalls delayed_;  // last: destroyed first, running delayed calls
};

}  // namespace ps
