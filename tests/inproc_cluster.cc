#include "tests/inproc_cluster.h"

#include <stdlib.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <string_view>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "common/logging.h"
#include "worker/worker_runner.h"

namespace ps {

std::string InProcServerAddress(int id) {
  return absl::StrCat("inproc:server:", id);
}

namespace {

// Calls one ServerNode directly.
class InProcServerClient : public ServerClient {
 public:
  InProcServerClient(int id, ServerNode* node) : id_(id), node_(node) {}

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
    absl::Status s = node_->ClockTick(*req);
    proto::ClockResponse resp;
    done(s, &resp);
  }

  absl::Status Finish(const proto::FinishRequest& req, absl::Time) override {
    return node_->Finish(req);
  }

  absl::StatusOr<proto::ServerControlResponse> Control(
      const proto::ServerControlRequest& req, absl::Time) override {
    proto::ServerControlResponse resp;
    absl::Status s;
    switch (req.cmd_case()) {
      case proto::ServerControlRequest::kSetConsistency:
        s = node_->SetConsistency(req.set_consistency());
        break;
      case proto::ServerControlRequest::kNewView:
        s = node_->Configure(id_, req.new_view());
        break;
      case proto::ServerControlRequest::kSaveAndExit:
        s = node_->SaveModel("", &resp);
        break;
      default:
        s = absl::InvalidArgumentError("control: no command");
    }
    if (!s.ok()) return s;
    return resp;
  }

  absl::StatusOr<proto::ServerStatus> GetStatus(absl::Time) override {
    return node_->Status();
  }

 private:
  const int id_;
  ServerNode* const node_;
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

// Calls a SchedulerCore directly.
class InProcSchedulerClient : public SchedulerClient {
 public:
  explicit InProcSchedulerClient(SchedulerCore* core) : core_(core) {}

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
  absl::StatusOr<proto::GetShardResponse> GetShard(
      const proto::GetShardRequest& req, absl::Time) override {
    return core_->GetShard(req);
  }
  absl::Status Barrier(const proto::BarrierRequest& req,
                       absl::Time deadline) override {
    return core_->Barrier(req, deadline);
  }
  absl::Status WorkerDone(const proto::WorkerDoneRequest& req,
                          absl::Time) override {
    return core_->WorkerDone(req);
  }
  absl::Status ServerDone(const proto::ServerDoneRequest&,
                          absl::Time) override {
    // SchedulerCore collects model files through Control(save_and_exit).
    return absl::OkStatus();
  }
  absl::StatusOr<proto::SetConsistencyResponse> SetConsistency(
      const proto::SetConsistencyRequest& req, absl::Time) override {
    return core_->SetConsistency(req);
  }
  absl::StatusOr<proto::StatusResponse> Status(const proto::StatusRequest&,
                                               absl::Time) override {
    return core_->Status();
  }

 private:
  SchedulerCore* const core_;
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
  absl::StatusOr<proto::GetShardResponse> GetShard(
      const proto::GetShardRequest&, absl::Time) override {
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

void InProcClientFactory::AddServer(int id, ServerNode* node) {
  absl::MutexLock l(&mu_);
  servers_[InProcServerAddress(id)] =
      std::make_shared<InProcServerClient>(id, node);
}

void InProcClientFactory::SetScheduler(SchedulerCore* scheduler) {
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
  }
  return "?";
}

Delayer::Delayer() : thread_([this] { Loop(); }) {}

Delayer::~Delayer() {
  {
    absl::MutexLock l(&mu_);
    stop_ = true;
  }
  thread_.join();
}

void Delayer::After(absl::Duration d, std::function<void()> fn) {
  absl::MutexLock l(&mu_);
  queue_.emplace(absl::Now() + d, std::move(fn));
  changed_ = true;
}

void Delayer::Loop() {
  for (;;) {
    std::function<void()> fn;
    {
      absl::MutexLock l(&mu_);
      for (;;) {
        if (!queue_.empty() &&
            (stop_ || queue_.begin()->first <= absl::Now())) {
          break;
        }
        if (stop_) return;  // and nothing left to run
        const absl::Time until = queue_.empty()
                                     ? absl::Now() + absl::Milliseconds(100)
                                     : queue_.begin()->first;
        changed_ = false;
        auto woken = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
          return stop_ || changed_;
        };
        mu_.AwaitWithDeadline(absl::Condition(&woken), until);
      }
      fn = std::move(queue_.begin()->second);
      queue_.erase(queue_.begin());
    }
    fn();
  }
}

FaultyServerClient::FaultyServerClient(std::shared_ptr<ServerClient> inner,
                                       FaultOptions options, Delayer* delayer,
                                       FaultStats* stats)
    : inner_(std::move(inner)),
      options_(std::move(options)),
      delayer_(delayer),
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
      delayer_->After(options_.delay, [call, req = std::move(req), deadline,
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

absl::Status FaultyServerClient::Finish(const proto::FinishRequest& req,
                                        absl::Time deadline) {
  switch (Decide(RpcMethod::kFinish)) {
    case Fault::kDropRequest:
      return absl::UnavailableError("fault injection: finish request lost");
    case Fault::kDropReply:
      (void)inner_->Finish(req, deadline);
      return absl::UnavailableError("fault injection: finish reply lost");
    case Fault::kDelay:
      absl::SleepFor(options_.delay);
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
      absl::SleepFor(options_.delay);
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
      absl::SleepFor(options_.delay);
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
      stats_(stats != nullptr ? stats : &own_stats_) {}

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
      inner_->Server(address), std::move(o), &delayer_, stats_);
  clients_.emplace(address, client);
  return client;
}

std::shared_ptr<SchedulerClient> FaultyClientFactory::Scheduler(
    const std::string& address) {
  return inner_->Scheduler(address);
}

// ------------------------------------------------------------ LocalCluster

LocalCluster::LocalCluster(LocalClusterOptions options)
    : options_(std::move(options)) {}

LocalCluster::~LocalCluster() {
  for (auto& s : servers_) s->CancelAll(absl::CancelledError("cluster gone"));
  if (own_model_dir_) {
    std::error_code ec;
    std::filesystem::remove_all(model_dir_, ec);
  }
}

absl::Status LocalCluster::Start() {
  if (started_) return absl::OkStatus();
  JobConfig config = options_.config;
  model_dir_ = options_.model_dir;
  if (model_dir_.empty()) {
    const char* tmp = std::getenv("TMPDIR");
    std::string tmpl = absl::StrCat(tmp != nullptr && *tmp ? tmp : "/tmp",
                                    "/ps_local_cluster_XXXXXX");
    if (::mkdtemp(tmpl.data()) == nullptr) {
      return absl::UnavailableError(
          absl::StrCat("cannot create a temp dir like ", tmpl));
    }
    model_dir_ = tmpl;
    own_model_dir_ = true;
  }
  config.output.model_dir = model_dir_;
  options_.config = config;

  SchedulerOptions so;
  so.config = config;
  so.report_path = options_.report_path;
  so.clients = &clients_;
  scheduler_ = std::make_unique<SchedulerCore>(so);
  clients_.SetScheduler(scheduler_.get());
  scheduler_client_ = clients_.Scheduler(kInProcSchedulerAddress);

  const int num_servers = config.cluster.num_servers;
  const int num_workers = config.cluster.num_workers;
  for (int i = 0; i < num_servers; ++i) {
    servers_.push_back(std::make_unique<ServerNode>());
    clients_.AddServer(i, servers_.back().get());
  }
  for (int i = 0; i < num_servers; ++i) {
    proto::RegisterRequest r;
    r.set_role(proto::ROLE_SERVER);
    r.set_address(InProcServerAddress(i));
    r.set_requested_id(i);
    absl::StatusOr<proto::RegisterResponse> resp = scheduler_->Register(r);
    if (!resp.ok()) return resp.status();
    if (resp->id() != i) {
      return absl::InternalError(
          absl::StrCat("server registered as ", resp->id(), ", wanted ", i));
    }
  }
  for (int i = 0; i < num_workers; ++i) {
    proto::RegisterRequest r;
    r.set_role(proto::ROLE_WORKER);
    r.set_requested_id(i);
    absl::StatusOr<proto::RegisterResponse> resp = scheduler_->Register(r);
    if (!resp.ok()) return resp.status();
    worker_ids_.push_back(resp->id());
  }
  proto::GetViewRequest gv;
  gv.set_wait_ms(0);
  absl::StatusOr<proto::GetViewResponse> v =
      scheduler_->GetView(gv, absl::Now() + absl::Seconds(1));
  if (!v.ok()) return v.status();
  if (!v->ready()) {
    return absl::InternalError("view not ready after every node registered");
  }
  view_ = v->view();
  for (int i = 0; i < num_servers; ++i) {
    absl::Status s = servers_[i]->Configure(i, view_);
    if (!s.ok()) return s;
  }
  started_ = true;
  return absl::OkStatus();
}

absl::Status LocalCluster::Run() {
  absl::Status s = Start();
  if (!s.ok()) return s;
  const int num_workers = static_cast<int>(worker_ids_.size());
  worker_status_.assign(num_workers, absl::OkStatus());

  // Timers of the processes this replaces: server ticks and heartbeats,
  // the scheduler's failure detector.
  absl::Notification stop;
  std::thread ticker([&] {
    const absl::Duration hb =
        absl::Milliseconds(options_.config.cluster.heartbeat_ms);
    absl::Time next_hb = absl::InfinitePast();
    while (!stop.WaitForNotificationWithTimeout(options_.tick_every)) {
      for (auto& node : servers_) node->Tick();
      if (absl::Now() >= next_hb) {
        for (int i = 0; i < num_servers(); ++i) {
          proto::HeartbeatRequest h;
          h.set_role(proto::ROLE_SERVER);
          h.set_id(i);
          (void)scheduler_->Heartbeat(h);
        }
        next_hb = absl::Now() + hb;
      }
      scheduler_->CheckHeartbeats();
    }
  });

  std::vector<std::thread> workers;
  for (int w = 0; w < num_workers; ++w) {
    workers.emplace_back([this, w] {
      const int id = worker_ids_[w];
      std::unique_ptr<ClientFactory> own;
      ClientFactory* clients = &clients_;
      if (options_.worker_clients) {
        own = options_.worker_clients(id, &clients_);
        clients = own.get();
      }
      absl::Status st =
          RunWorkerWith(id, view_, clients, scheduler_client_.get());
      own.reset();  // flushes delayed calls while the servers are alive
      worker_status_[w] = st;
      if (!st.ok()) {
        PS_LOG_ERROR("W[{}] failed: {}", id, st.ToString());
        scheduler_->Fail(absl::Status(
            st.code(), absl::StrCat("W[", id, "]: ", st.message())));
      }
    });
  }

  absl::Status end = scheduler_->WaitForEnd(absl::Now() + options_.timeout);
  if (!end.ok()) {
    // Unblock workers still waiting on the servers.
    scheduler_->Fail(end);
    for (auto& node : servers_) node->CancelAll(end);
  }
  for (std::thread& t : workers) t.join();
  stop.Notify();
  ticker.join();
  if (!end.ok()) return end;
  for (const absl::Status& st : worker_status_) {
    if (!st.ok()) return st;
  }
  return absl::OkStatus();
}

std::string LocalCluster::ReportJson() const {
  return scheduler_ == nullptr ? std::string() : scheduler_->ReportJson();
}

std::vector<std::pair<uint64_t, std::vector<float>>> LocalCluster::Snapshot(
    int table) const {
  std::vector<std::pair<uint64_t, std::vector<float>>> all;
  for (const auto& node : servers_) {
    const Table* t = node->table(table);
    if (t == nullptr) continue;
    auto part = t->Snapshot();
    all.insert(all.end(), std::make_move_iterator(part.begin()),
               std::make_move_iterator(part.end()));
  }
  std::sort(all.begin(), all.end(),
            [](const auto& a, const auto& b) { return a.first < b.first; });
  return all;
}

absl::StatusOr<double> JsonNumber(const std::string& json,
                                  const std::string& key) {
  const std::string quoted = absl::StrCat("\"", key, "\"");
  size_t at = json.find(quoted);
  while (at != std::string::npos) {
    size_t p = at + quoted.size();
    while (p < json.size() && (json[p] == ' ' || json[p] == '\t' ||
                               json[p] == '\n' || json[p] == '\r')) {
      ++p;
    }
    if (p < json.size() && json[p] == ':') {
      ++p;
      while (p < json.size() && (json[p] == ' ' || json[p] == '\t' ||
                                 json[p] == '\n' || json[p] == '\r')) {
        ++p;
      }
      size_t e = p;
      while (e < json.size() &&
             std::string_view("+-0123456789.eE").find(json[e]) !=
                 std::string::npos) {
        ++e;
      }
      double v;
      if (e == p || !absl::SimpleAtod(json.substr(p, e - p), &v)) {
        return absl::InvalidArgumentError(
            absl::StrCat("\"", key, "\" is not a number"));
      }
      return v;
    }
    at = json.find(quoted, at + 1);  // a value equal to the key, not a key
  }
  return absl::NotFoundError(absl::StrCat("no \"", key, "\" in the JSON"));
}

}  // namespace ps
