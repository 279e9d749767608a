#include "transport/fake_transport.h"

namespace ps {
namespace {

template <typename T>
std::optional<T> PopFront(std::deque<T>* q) {
  if (q->empty()) return std::nullopt;
  std::optional<T> v(std::move(q->front()));
  q->pop_front();
  return v;
}

}  // namespace

// ------------------------------------------------------------ server

void FakeServerClient::Push(std::shared_ptr<const proto::PushRequest> req,
                            absl::Time deadline,
                            Callback<proto::PushResponse> done) {
  absl::MutexLock l(&mu_);
  ++pushes_received_;
  pushes_.push_back(HeldPush{std::move(req), deadline, std::move(done)});
}

void FakeServerClient::PushBorrowed(
    std::shared_ptr<const proto::PushRequest> req, BorrowedValues vals,
    absl::Time deadline, Callback<proto::PushResponse> done) {
  {
    absl::MutexLock l(&mu_);
    if (!vals.pieces.empty()) ++borrowed_received_;
  }
  ServerClient::PushBorrowed(std::move(req), std::move(vals), deadline,
                             std::move(done));
}

int64_t FakeServerClient::borrowed_pushes_received() const {
  absl::MutexLock l(&mu_);
  return borrowed_received_;
}

void FakeServerClient::Pull(std::shared_ptr<const proto::PullRequest> req,
                            absl::Time deadline,
                            Callback<proto::PullResponse> done) {
  absl::MutexLock l(&mu_);
  ++pulls_received_;
  pulls_.push_back(HeldPull{std::move(req), deadline, std::move(done)});
}

void FakeServerClient::Clock(std::shared_ptr<const proto::ClockRequest> req,
                             absl::Time deadline,
                             Callback<proto::ClockResponse> done) {
  absl::MutexLock l(&mu_);
  ++clocks_received_;
  clocks_.push_back(HeldClock{std::move(req), deadline, std::move(done)});
}

absl::Status FakeServerClient::Finish(const proto::FinishRequest& req,
                                      absl::Time) {
  std::function<absl::Status(const proto::FinishRequest&)> fn;
  {
    absl::MutexLock l(&mu_);
    finish_requests_.push_back(req);
    fn = finish_;
  }
  return fn ? fn(req) : absl::OkStatus();
}

absl::StatusOr<proto::ServerControlResponse> FakeServerClient::Control(
    const proto::ServerControlRequest& req, absl::Time) {
  std::function<absl::StatusOr<proto::ServerControlResponse>(
      const proto::ServerControlRequest&)>
      fn;
  {
    absl::MutexLock l(&mu_);
    fn = control_;
  }
  if (fn) return fn(req);
  return proto::ServerControlResponse();
}

absl::StatusOr<proto::ServerStatus> FakeServerClient::GetStatus(absl::Time) {
  absl::MutexLock l(&mu_);
  ++status_calls_;
  if (!status_error_.ok()) return status_error_;
  return proto::ServerStatus();
}

void FakeServerClient::set_status_error(absl::Status s) {
  absl::MutexLock l(&mu_);
  status_error_ = std::move(s);
}

int64_t FakeServerClient::status_calls() const {
  absl::MutexLock l(&mu_);
  return status_calls_;
}

std::optional<HeldPush> FakeServerClient::NextPush() {
  absl::MutexLock l(&mu_);
  return PopFront(&pushes_);
}

std::optional<HeldPull> FakeServerClient::NextPull() {
  absl::MutexLock l(&mu_);
  return PopFront(&pulls_);
}

std::optional<HeldClock> FakeServerClient::NextClock() {
  absl::MutexLock l(&mu_);
  return PopFront(&clocks_);
}

size_t FakeServerClient::held_pushes() const {
  absl::MutexLock l(&mu_);
  return pushes_.size();
}

size_t FakeServerClient::held_pulls() const {
  absl::MutexLock l(&mu_);
  return pulls_.size();
}

size_t FakeServerClient::held_clocks() const {
  absl::MutexLock l(&mu_);
  return clocks_.size();
}

int64_t FakeServerClient::pushes_received() const {
  absl::MutexLock l(&mu_);
  return pushes_received_;
}

int64_t FakeServerClient::pulls_received() const {
  absl::MutexLock l(&mu_);
  return pulls_received_;
}

int64_t FakeServerClient::clocks_received() const {
  absl::MutexLock l(&mu_);
  return clocks_received_;
}

void FakeServerClient::set_finish_handler(
    std::function<absl::Status(const proto::FinishRequest&)> fn) {
  absl::MutexLock l(&mu_);
  finish_ = std::move(fn);
}

std::vector<proto::FinishRequest> FakeServerClient::finish_requests() const {
  absl::MutexLock l(&mu_);
  return finish_requests_;
}

void FakeServerClient::set_control_handler(
    std::function<absl::StatusOr<proto::ServerControlResponse>(
        const proto::ServerControlRequest&)>
        fn) {
  absl::MutexLock l(&mu_);
  control_ = std::move(fn);
}

// ------------------------------------------------------------ scheduler

void FakeSchedulerClient::set_view(const proto::ClusterView& view) {
  absl::MutexLock l(&mu_);
  view_ = view;
}

int64_t FakeSchedulerClient::get_view_calls() const {
  absl::MutexLock l(&mu_);
  return get_view_calls_;
}

void FakeSchedulerClient::set_get_view_handler(
    std::function<absl::StatusOr<proto::GetViewResponse>(
        const proto::GetViewRequest&)>
        fn) {
  absl::MutexLock l(&mu_);
  get_view_ = std::move(fn);
}

absl::StatusOr<proto::RegisterResponse> FakeSchedulerClient::Register(
    const proto::RegisterRequest&, absl::Time) {
  return proto::RegisterResponse();
}

absl::StatusOr<proto::GetViewResponse> FakeSchedulerClient::GetView(
    const proto::GetViewRequest& req, absl::Time) {
  std::function<absl::StatusOr<proto::GetViewResponse>(
      const proto::GetViewRequest&)>
      fn;
  proto::GetViewResponse resp;
  {
    absl::MutexLock l(&mu_);
    ++get_view_calls_;
    fn = get_view_;
    if (!fn) {
      if (!view_.has_value()) {
        return absl::UnavailableError("fake scheduler: no view set");
      }
      resp.set_ready(true);
      *resp.mutable_view() = *view_;
    }
  }
  if (fn) return fn(req);
  return resp;
}

absl::StatusOr<proto::HeartbeatResponse> FakeSchedulerClient::Heartbeat(
    const proto::HeartbeatRequest&, absl::Time) {
  return proto::HeartbeatResponse();
}

absl::StatusOr<proto::GetWorkResponse> FakeSchedulerClient::GetWork(
    const proto::GetWorkRequest& req, absl::Time) {
  std::function<absl::StatusOr<proto::GetWorkResponse>(
      const proto::GetWorkRequest&)>
      fn;
  {
    absl::MutexLock l(&mu_);
    fn = get_work_;
  }
  if (fn) return fn(req);
  proto::GetWorkResponse resp;
  resp.set_state(proto::WORK_DONE);
  return resp;
}

void FakeSchedulerClient::set_get_work_handler(
    std::function<absl::StatusOr<proto::GetWorkResponse>(
        const proto::GetWorkRequest&)>
        fn) {
  absl::MutexLock l(&mu_);
  get_work_ = std::move(fn);
}

absl::Status FakeSchedulerClient::Barrier(const proto::BarrierRequest&,
                                          absl::Time) {
  return absl::OkStatus();
}

absl::Status FakeSchedulerClient::WorkerDone(const proto::WorkerDoneRequest&,
                                             absl::Time) {
  return absl::OkStatus();
}

absl::Status FakeSchedulerClient::ServerDone(const proto::ServerDoneRequest&,
                                             absl::Time) {
  return absl::OkStatus();
}

absl::StatusOr<proto::SetConsistencyResponse>
FakeSchedulerClient::SetConsistency(const proto::SetConsistencyRequest&,
                                    absl::Time) {
  return proto::SetConsistencyResponse();
}

absl::StatusOr<proto::StatusResponse> FakeSchedulerClient::Status(
    const proto::StatusRequest&, absl::Time) {
  return proto::StatusResponse();
}

// ------------------------------------------------------------ factory

FakeClientFactory::FakeClientFactory()
    : scheduler_(std::make_shared<FakeSchedulerClient>()) {}

std::shared_ptr<FakeServerClient> FakeClientFactory::Get(
    const std::string& address) {
  absl::MutexLock l(&mu_);
  std::shared_ptr<FakeServerClient>& c = servers_[address];
  if (c == nullptr) c = std::make_shared<FakeServerClient>();
  return c;
}

std::shared_ptr<ServerClient> FakeClientFactory::Server(
    const std::string& address) {
  return Get(address);
}

std::shared_ptr<SchedulerClient> FakeClientFactory::Scheduler(
    const std::string&) {
  return scheduler_;
}

FakeServerClient* FakeClientFactory::server(const std::string& address) {
  return Get(address).get();
}

}  // namespace ps
