#include "transport/inproc_transport.h"

#include <utility>

#include "absl/strings/str_cat.h"

namespace ps {

std::string InProcServerAddress(int id) {
  return absl::StrCat("inproc:server:", id);
}

namespace {

// Calls one ServerHandler directly.
class InProcServerClient : public ServerClient {
 public:
  explicit InProcServerClient(ServerHandler* handler) : node_(handler) {}

  void Push(std::shared_ptr<const proto::PushRequest> req, absl::Time,
            Callback<proto::PushResponse> done) override {
    auto resp = std::make_shared<proto::PushResponse>();
    const proto::PushRequest& r = *req;
    node_->Push(r, resp.get(),
                [req = std::move(req), resp, done = std::move(done)](
                    const absl::Status& s) { done(s, resp.get()); });
  }

  void Pull(std::shared_ptr<const proto::PullRequest> req, absl::Time,
            Callback<proto::PullResponse> done) override {
    auto resp = std::make_shared<proto::PullResponse>();
    const proto::PullRequest& r = *req;
    node_->Pull(r, resp.get(),
                [req = std::move(req), resp, done = std::move(done)](
                    const absl::Status& s) { done(s, resp.get()); });
  }

  void Clock(std::shared_ptr<const proto::ClockRequest> req, absl::Time,
             Callback<proto::ClockResponse> done) override {
    const proto::ClockRequest& r = *req;
    node_->ClockAsync(r, [req = std::move(req), done = std::move(done)](
                             const absl::Status& s) {
      proto::ClockResponse resp;
      done(s, &resp);
    });
  }

  absl::Status Finish(const proto::FinishRequest& req, absl::Time) override {
    return node_->Finish(req);
  }

  absl::StatusOr<proto::ServerControlResponse> Control(
      const proto::ServerControlRequest& req, absl::Time) override {
    return node_->Control(req);
  }

  absl::StatusOr<proto::ServerStatus> GetStatus(absl::Time) override {
    return node_->GetStatus();
  }

  void Replicate(std::shared_ptr<const proto::ReplicateRequest> req,
                 absl::Time, Callback<proto::ReplicateResponse> done) override {
    absl::Status s = node_->Replicate(*req);
    proto::ReplicateResponse resp;
    done(s, &resp);
  }

 private:
  ServerHandler* const node_;
};

// The client of an address nobody registered: everything is UNAVAILABLE.
class UnreachableServerClient : public ServerClient {
 public:
  explicit UnreachableServerClient(std::string address)
      : error_(absl::UnavailableError(
            absl::StrCat("no in-process node at '", address, "'"))) {}
  void Push(std::shared_ptr<const proto::PushRequest>, absl::Time,
            Callback<proto::PushResponse> done) override {
    proto::PushResponse r;
    done(error_, &r);
  }
  void Pull(std::shared_ptr<const proto::PullRequest>, absl::Time,
            Callback<proto::PullResponse> done) override {
    proto::PullResponse r;
    done(error_, &r);
  }
  void Clock(std::shared_ptr<const proto::ClockRequest>, absl::Time,
             Callback<proto::ClockResponse> done) override {
    proto::ClockResponse r;
    done(error_, &r);
  }
  absl::Status Finish(const proto::FinishRequest&, absl::Time) override {
    return error_;
  }
  absl::StatusOr<proto::ServerControlResponse> Control(
      const proto::ServerControlRequest&, absl::Time) override {
    return error_;
  }
  absl::StatusOr<proto::ServerStatus> GetStatus(absl::Time) override {
    return error_;
  }

 private:
  const absl::Status error_;
};

// Calls a SchedulerHandler directly.
class InProcSchedulerClient : public SchedulerClient {
 public:
  explicit InProcSchedulerClient(SchedulerHandler* core) : core_(core) {}

  absl::StatusOr<proto::RegisterResponse> Register(
      const proto::RegisterRequest& req, absl::Time) override {
    return core_->Register(req);
  }
  absl::StatusOr<proto::GetViewResponse> GetView(
      const proto::GetViewRequest& req, absl::Time deadline) override {
    return core_->GetView(req, deadline);
  }
  absl::StatusOr<proto::HeartbeatResponse> Heartbeat(
      const proto::HeartbeatRequest& req, absl::Time) override {
    return core_->Heartbeat(req);
  }
  absl::StatusOr<proto::GetWorkResponse> GetWork(
      const proto::GetWorkRequest& req, absl::Time) override {
    return core_->GetWork(req);
  }
  absl::Status Barrier(const proto::BarrierRequest& req,
                       absl::Time deadline) override {
    return core_->Barrier(req, deadline);
  }
  absl::Status WorkerDone(const proto::WorkerDoneRequest& req,
                          absl::Time) override {
    return core_->WorkerDone(req);
  }
  absl::Status ServerDone(const proto::ServerDoneRequest& req,
                          absl::Time) override {
    return core_->ServerDone(req);
  }
  absl::StatusOr<proto::SetConsistencyResponse> SetConsistency(
      const proto::SetConsistencyRequest& req, absl::Time) override {
    return core_->SetConsistency(req);
  }
  absl::StatusOr<proto::StatusResponse> Status(
      const proto::StatusRequest& req, absl::Time) override {
    return core_->Status(req);
  }

 private:
  SchedulerHandler* const core_;
};

class UnreachableSchedulerClient : public SchedulerClient {
 public:
  absl::StatusOr<proto::RegisterResponse> Register(
      const proto::RegisterRequest&, absl::Time) override {
    return Error();
  }
  absl::StatusOr<proto::GetViewResponse> GetView(const proto::GetViewRequest&,
                                                 absl::Time) override {
    return Error();
  }
  absl::StatusOr<proto::HeartbeatResponse> Heartbeat(
      const proto::HeartbeatRequest&, absl::Time) override {
    return Error();
  }
  absl::StatusOr<proto::GetWorkResponse> GetWork(
      const proto::GetWorkRequest&, absl::Time) override {
    return Error();
  }
  absl::Status Barrier(const proto::BarrierRequest&, absl::Time) override {
    return Error();
  }
  absl::Status WorkerDone(const proto::WorkerDoneRequest&,
                          absl::Time) override {
    return Error();
  }
  absl::Status ServerDone(const proto::ServerDoneRequest&,
                          absl::Time) override {
    return Error();
  }
  absl::StatusOr<proto::SetConsistencyResponse> SetConsistency(
      const proto::SetConsistencyRequest&, absl::Time) override {
    return Error();
  }
  absl::StatusOr<proto::StatusResponse> Status(const proto::StatusRequest&,
                                               absl::Time) override {
    return Error();
  }

 private:
  static absl::Status Error() {
    return absl::UnavailableError("no in-process scheduler");
  }
};

}  // namespace

// ---------------------------------------------------------- InProcFactory

void InProcClientFactory::AddServer(int id, ServerHandler* handler) {
  absl::MutexLock l(&mu_);
  servers_[InProcServerAddress(id)] =
      std::make_shared<InProcServerClient>(handler);
}

void InProcClientFactory::SetScheduler(SchedulerHandler* scheduler) {
  absl::MutexLock l(&mu_);
  scheduler_ = std::make_shared<InProcSchedulerClient>(scheduler);
}

std::shared_ptr<ServerClient> InProcClientFactory::Server(
    const std::string& address) {
  absl::MutexLock l(&mu_);
  auto it = servers_.find(address);
  if (it != servers_.end()) return it->second;
  return std::make_shared<UnreachableServerClient>(address);
}

std::shared_ptr<SchedulerClient> InProcClientFactory::Scheduler(
    const std::string& address) {
  absl::MutexLock l(&mu_);
  if (address == kInProcSchedulerAddress && scheduler_ != nullptr) {
    return scheduler_;
  }
  return std::make_shared<UnreachableSchedulerClient>();
}

}  // namespace ps
