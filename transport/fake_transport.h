// Scriptable fakes of the transport seam (transport.h) for unit tests: the
// test decides when, and with what status and response, each call is
// answered.
//
//  * FakeServerClient holds every asynchronous call (Push, Pull, Clock)
//    until the test takes it with NextPush()/NextPull()/NextClock() and
//    answers it with Reply(), on the test's thread. Synchronous calls
//    (Finish, Control, GetStatus) are answered at once by a handler the
//    test may set (default: OK / an empty response).
//  * FakeSchedulerClient answers GetView from a view the test sets (and
//    counts the calls); the other calls answer from handlers the test may
//    set (default: OK with an empty response).
//  * FakeClientFactory hands out one FakeServerClient per address (made on
//    first use) and one FakeSchedulerClient.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "proto/ps.pb.h"
#include "transport/transport.h"

namespace ps {

// One asynchronous call held by a fake, answered when the test says.
template <typename Req, typename Resp>
struct HeldCall {
  std::shared_ptr<const Req> req;
  absl::Time deadline;
  ServerClient::Callback<Resp> done;

  // Runs the caller's callback once with `s` and `resp` (on this thread).
  // Answering twice is a test bug: the second answer is ignored.
  void Reply(const absl::Status& s, Resp resp = Resp()) {
    if (!done) return;
    ServerClient::Callback<Resp> d = std::move(done);
    done = nullptr;
    d(s, &resp);
  }
};

using HeldPush = HeldCall<proto::PushRequest, proto::PushResponse>;
using HeldPull = HeldCall<proto::PullRequest, proto::PullResponse>;
using HeldClock = HeldCall<proto::ClockRequest, proto::ClockResponse>;

// Thread-safe. Calls that are still held when the fake is destroyed are
// dropped unanswered (their callbacks never run).
class FakeServerClient : public ServerClient {
 public:
  void Push(std::shared_ptr<const proto::PushRequest> req, absl::Time deadline,
            Callback<proto::PushResponse> done) override;
  // Counted, then held as a Push of a request with the values in it.
  void PushBorrowed(std::shared_ptr<const proto::PushRequest> req,
                    BorrowedValues vals, absl::Time deadline,
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

  // The oldest held call of that kind, removed from the fake; nullopt when
  // none is held.
  std::optional<HeldPush> NextPush();
  std::optional<HeldPull> NextPull();
  std::optional<HeldClock> NextClock();
  // Held calls not yet taken.
  size_t held_pushes() const;
  size_t held_pulls() const;
  size_t held_clocks() const;
  // Calls received so far (held or not), by kind.
  int64_t pushes_received() const;
  int64_t pulls_received() const;
  int64_t clocks_received() const;
  // Pushes received through PushBorrowed with borrowed values (also in
  // pushes_received).
  int64_t borrowed_pushes_received() const;

  // Answers Finish (default OK); every request is also recorded.
  void set_finish_handler(
      std::function<absl::Status(const proto::FinishRequest&)> fn);
  std::vector<proto::FinishRequest> finish_requests() const;
  void set_control_handler(
      std::function<absl::StatusOr<proto::ServerControlResponse>(
          const proto::ServerControlRequest&)>
          fn);
  // Every later GetStatus answers `s` when it is an error (default: an
  // empty status); counted.
  void set_status_error(absl::Status s);
  int64_t status_calls() const;

 private:
  mutable absl::Mutex mu_;
  absl::Status status_error_ ABSL_GUARDED_BY(mu_);
  int64_t status_calls_ ABSL_GUARDED_BY(mu_) = 0;
  std::deque<HeldPush> pushes_ ABSL_GUARDED_BY(mu_);
  std::deque<HeldPull> pulls_ ABSL_GUARDED_BY(mu_);
  std::deque<HeldClock> clocks_ ABSL_GUARDED_BY(mu_);
  int64_t pushes_received_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t pulls_received_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t clocks_received_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t borrowed_received_ ABSL_GUARDED_BY(mu_) = 0;
  std::function<absl::Status(const proto::FinishRequest&)> finish_
      ABSL_GUARDED_BY(mu_);
  std::vector<proto::FinishRequest> finish_requests_ ABSL_GUARDED_BY(mu_);
  std::function<absl::StatusOr<proto::ServerControlResponse>(
      const proto::ServerControlRequest&)>
      control_ ABSL_GUARDED_BY(mu_);
};

// Thread-safe.
class FakeSchedulerClient : public SchedulerClient {
 public:
  // GetView answers {ready, view} when view.epoch() > known_epoch, else
  // {ready, the same view} as a scheduler with nothing newer would after
  // its wait; UNAVAILABLE before any view is set.
  void set_view(const proto::ClusterView& view);
  int64_t get_view_calls() const;
  // Replaces GetView's answer entirely.
  void set_get_view_handler(
      std::function<absl::StatusOr<proto::GetViewResponse>(
          const proto::GetViewRequest&)>
          fn);

  absl::StatusOr<proto::RegisterResponse> Register(
      const proto::RegisterRequest& req, absl::Time deadline) override;
  absl::StatusOr<proto::GetViewResponse> GetView(
      const proto::GetViewRequest& req, absl::Time deadline) override;
  absl::StatusOr<proto::HeartbeatResponse> Heartbeat(
      const proto::HeartbeatRequest& req, absl::Time deadline) override;
  // Answers with set_get_work_handler's function; WORK_DONE without one.
  absl::StatusOr<proto::GetWorkResponse> GetWork(
      const proto::GetWorkRequest& req, absl::Time deadline) override;
  void set_get_work_handler(
      std::function<absl::StatusOr<proto::GetWorkResponse>(
          const proto::GetWorkRequest&)>
          fn);
  absl::Status Barrier(const proto::BarrierRequest& req,
                       absl::Time deadline) override;
  absl::Status WorkerDone(const proto::WorkerDoneRequest& req,
                          absl::Time deadline) override;
  absl::Status ServerDone(const proto::ServerDoneRequest& req,
                          absl::Time deadline) override;
  absl::StatusOr<proto::SetConsistencyResponse> SetConsistency(
      const proto::SetConsistencyRequest& req, absl::Time deadline) override;
  absl::StatusOr<proto::StatusResponse> Status(
      const proto::StatusRequest& req, absl::Time deadline) override;

 private:
  mutable absl::Mutex mu_;
  std::optional<proto::ClusterView> view_ ABSL_GUARDED_BY(mu_);
  int64_t get_view_calls_ ABSL_GUARDED_BY(mu_) = 0;
  std::function<absl::StatusOr<proto::GetViewResponse>(
      const proto::GetViewRequest&)>
      get_view_ ABSL_GUARDED_BY(mu_);
  std::function<absl::StatusOr<proto::GetWorkResponse>(
      const proto::GetWorkRequest&)>
      get_work_ ABSL_GUARDED_BY(mu_);
};

// Thread-safe.
class FakeClientFactory : public ClientFactory {
 public:
  FakeClientFactory();

  std::shared_ptr<ServerClient> Server(const std::string& address) override;
  std::shared_ptr<SchedulerClient> Scheduler(
      const std::string& address) override;

  // The fake behind `address` (made on first use).
  FakeServerClient* server(const std::string& address);
  FakeSchedulerClient* scheduler() { return scheduler_.get(); }

 private:
  std::shared_ptr<FakeServerClient> Get(const std::string& address);

  const std::shared_ptr<FakeSchedulerClient> scheduler_;
  absl::Mutex mu_;
  std::map<std::string, std::shared_ptr<FakeServerClient>> servers_
      ABSL_GUARDED_BY(mu_);
};

}  // namespace ps
