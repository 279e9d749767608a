#include "tests/inproc_cluster.h"

#include <stdlib.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <limits>
#include <string_view>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "common/job_report.h"
#include "common/logging.h"
#include "common/membership.h"
#include "transport/data_plane.h"
#include "worker/worker_runner.h"

namespace ps {

// ------------------------------------------------------------- adapters

void ServerNodeHandler::Check() {
  absl::Status s = node_->CheckInvariants();
  if (s.ok()) return;
  absl::MutexLock l(&mu_);
  if (violation_.ok()) {
    PS_LOG_ERROR("invariant violated: {}", s.ToString());
    violation_ = s;
  }
}

absl::Status ServerNodeHandler::violation() const {
  absl::MutexLock l(&mu_);
  return violation_;
}

absl::Status ServerNodeHandler::Dead() const {
  return absl::UnavailableError(absl::StrCat("S[", id_, "] was killed"));
}

void ServerNodeHandler::Push(const proto::PushRequest& req,
                             proto::PushResponse* resp, Done done) {
  if (before_push_) before_push_();
  if (killed()) {
    done(Dead());
    return;
  }
  node_->Push(req, resp, [this, done = std::move(done)](const absl::Status& s) {
    Check();
    done(s);
  });
}

void ServerNodeHandler::Pull(const proto::PullRequest& req,
                             proto::PullResponse* resp, Done done) {
  if (killed()) {
    done(Dead());
    return;
  }
  auto slot = std::make_shared<PullSlot>();
  slot->done = std::move(done);
  {
    absl::MutexLock l(&pulls_mu_);
    pulls_.insert(slot);
  }
  node_->Pull(req, resp, [this, slot](const absl::Status& s) {
    {
      absl::MutexLock l(&pulls_mu_);
      pulls_.erase(slot);
    }
    absl::MutexLock l(&slot->mu);
    if (slot->answered) return;
    slot->answered = true;
    slot->done(s);
  });
}

void ServerNodeHandler::Kill() {
  killed_.store(true);
  std::set<std::shared_ptr<PullSlot>> pulls;
  {
    absl::MutexLock l(&pulls_mu_);
    pulls = pulls_;
  }
  for (const auto& slot : pulls) {
    absl::MutexLock l(&slot->mu);
    if (slot->answered) continue;
    slot->answered = true;
    slot->done(Dead());
  }
}

absl::Status ServerNodeHandler::Clock(const proto::ClockRequest& req) {
  if (killed()) return Dead();
  absl::Status s = node_->ClockTick(req);
  Check();
  return s;
}

void ServerNodeHandler::ClockAsync(const proto::ClockRequest& req,
                                   Done done) {
  if (killed()) {
    done(Dead());
    return;
  }
  node_->ClockTick(req, [this, done = std::move(done)](const absl::Status& s) {
    Check();
    done(s);
  });
}

absl::Status ServerNodeHandler::Finish(const proto::FinishRequest& req) {
  if (killed()) return Dead();
  absl::Status s = node_->Finish(req);
  Check();
  return s;
}

absl::StatusOr<proto::ServerControlResponse> ServerNodeHandler::Control(
    const proto::ServerControlRequest& req) {
  if (killed()) return Dead();
  proto::ServerControlResponse resp;
  absl::Status s;
  switch (req.cmd_case()) {
    case proto::ServerControlRequest::kSetConsistency:
      s = node_->SetConsistency(req.set_consistency());
      break;
    case proto::ServerControlRequest::kNewView:
      s = node_->Configure(id_, req.new_view(), resp.mutable_join_clocks());
      break;
    case proto::ServerControlRequest::kSaveAndExit:
      s = node_->SaveModel("", &resp);
      if (s.ok() && req.save_kept_copy()) s = node_->SaveKeptCopy(&resp);
      break;
    case proto::ServerControlRequest::kKeepModelCopy:  // issue 12
      node_->KeepModelCopy();
      break;
    case proto::ServerControlRequest::kCheckpoint:  // checkpoints (issue 9)
      s = node_->Checkpoint(req.checkpoint(), &resp);
      break;
    default:
      s = absl::InvalidArgumentError("control: no command");
  }
  Check();
  if (!s.ok()) return s;
  return resp;
}

absl::StatusOr<proto::ServerStatus> ServerNodeHandler::GetStatus() {
  if (killed()) return Dead();
  return node_->Status();
}

absl::Status ServerNodeHandler::Replicate(const proto::ReplicateRequest& req) {
  if (killed()) return Dead();
  // Every other batch with rows arrives as through the data plane's shared
  // memory (issue 9): its rows' entries outside the request, named by
  // offset in the values (ReplicateHead), so that the backup's reading of
  // them runs under every in-process replication test too.
  std::vector<absl::string_view> entries;
  proto::ReplicateRequest head;
  if (replicated_.fetch_add(1) % 2 == 1) head = ReplicateHead(req, &entries);
  absl::Status s;
  if (entries.empty()) {
    s = node_->Replicate(req);
  } else {
    size_t bytes = 0;
    for (absl::string_view e : entries) bytes += data_plane::Align8(e.size());
    std::vector<uint64_t> vals(bytes / 8);  // 8-byte aligned, as an arena's
    char* at = reinterpret_cast<char*>(vals.data());
    for (absl::string_view e : entries) {
      std::memcpy(at, e.data(), e.size());
      at += data_plane::Align8(e.size());
    }
    s = node_->Replicate(
        head, absl::Span<const char>(reinterpret_cast<const char*>(vals.data()),
                                     bytes));
  }
  Check();
  return s;
}

absl::StatusOr<proto::RegisterResponse> SchedulerCoreHandler::Register(
    const proto::RegisterRequest& req) {
  return core_->Register(req);
}

absl::StatusOr<proto::GetViewResponse> SchedulerCoreHandler::GetView(
    const proto::GetViewRequest& req, absl::Time deadline) {
  return core_->GetView(req, deadline);
}

absl::StatusOr<proto::HeartbeatResponse> SchedulerCoreHandler::Heartbeat(
    const proto::HeartbeatRequest& req) {
  return core_->Heartbeat(req);
}

absl::StatusOr<proto::GetWorkResponse> SchedulerCoreHandler::GetWork(
    const proto::GetWorkRequest& req) {
  return core_->GetWork(req);
}

absl::Status SchedulerCoreHandler::Barrier(const proto::BarrierRequest& req,
                                           absl::Time deadline) {
  return core_->Barrier(req, deadline);
}

absl::Status SchedulerCoreHandler::WorkerDone(
    const proto::WorkerDoneRequest& req) {
  return core_->WorkerDone(req);
}

absl::Status SchedulerCoreHandler::ServerDone(const proto::ServerDoneRequest&) {
  return absl::OkStatus();
}

absl::StatusOr<proto::SetConsistencyResponse>
SchedulerCoreHandler::SetConsistency(const proto::SetConsistencyRequest& req) {
  return core_->SetConsistency(req);
}

absl::StatusOr<proto::StatusResponse> SchedulerCoreHandler::Status(
    const proto::StatusRequest&) {
  return core_->Status();
}

// ------------------------------------------------------------ LocalCluster

LocalCluster::LocalCluster(LocalClusterOptions options)
    : options_(std::move(options)) {}

LocalCluster::~LocalCluster() {
  // The scheduler's background threads (a rebalance after a failover, say)
  // call the servers' handlers, which go before it (members in reverse):
  // they end first. Found as a crash (a call through a destroyed handler)
  // at the end of FailoverTest.ExactCounterWhenTwoServersDieAtOnce.
  if (scheduler_ != nullptr) scheduler_->Close();
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
  // Checkpoints (issue 9): resume / restore_from, as ps_scheduler does.
  absl::StatusOr<std::string> restore = ResolveRestore(config);
  if (!restore.ok()) return restore.status();
  so.restore_from = *restore;
  scheduler_ = std::make_unique<SchedulerCore>(so);
  scheduler_handler_ = std::make_unique<SchedulerCoreHandler>(scheduler_.get());
  clients_.SetScheduler(scheduler_handler_.get());
  scheduler_client_ = clients_.Scheduler(kInProcSchedulerAddress);

  const int num_servers = config.cluster.num_servers;
  const int num_workers = config.cluster.num_workers;
  for (int i = 0; i < num_servers + options_.spare_servers; ++i) {
    servers_.push_back(std::make_unique<ServerNode>());
    ClientFactory* peers = &clients_;  // replication (issue 9)
    if (options_.server_peers) {
      peer_clients_.push_back(options_.server_peers(i, &clients_));
      peers = peer_clients_.back().get();
    }
    servers_.back()->SetPeers(peers);
    servers_.back()->SetReplicationLinger(
        absl::Milliseconds(config.fault_tolerance.replication_linger_ms));
    servers_.back()->SetReplicationDeltas(
        config.fault_tolerance.replicate_deltas);
    servers_.back()->SetSuspectHandler([this, i](int server,
                                               absl::Duration silent) {
      proto::GetViewRequest req;
      // Named, as ps_server does: the scheduler believes only live nodes.
      req.set_role(proto::ROLE_SERVER);
      req.set_id(i);
      req.set_wait_ms(0);
      req.set_known_epoch(std::numeric_limits<int64_t>::max());
      req.add_suspect_servers(server);
      req.add_suspect_silent_ms(absl::ToInt64Milliseconds(silent));
      (void)scheduler_->GetView(req, absl::Now() + absl::Seconds(1));
    });
    server_handlers_.push_back(
        std::make_unique<ServerNodeHandler>(i, servers_.back().get()));
    server_handlers_.back()->set_before_push([this] { BeforePush(); });
    clients_.AddServer(i, server_handlers_.back().get());
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
  drain_status_.assign(options_.drain_servers.size(),
                       absl::UnknownError("not run"));
  join_status_.assign(options_.join_after_pushes.size(),
                      absl::UnknownError("not run"));
  std::vector<std::thread> drains;  // joined after the ticker
  // Workers that join the running job: started by the ticker, joined
  // after it (when they are all known).
  std::vector<std::thread> joiners;  // only the ticker adds
  // (id, status); id -1: never started (the job ended first).
  std::vector<std::pair<int, absl::Status>> joined(
      options_.join_workers_after_pushes.size(), {-1, absl::OkStatus()});
  auto run_joiner = [this, &joined](size_t slot) {
    proto::RegisterRequest reg;
    reg.set_role(proto::ROLE_WORKER);
    absl::StatusOr<Membership> m =
        JoinCluster(scheduler_client_.get(), "in-process scheduler", reg,
                    absl::Now() + absl::Seconds(30));
    if (!m.ok()) {
      joined[slot] = {-2, m.status()};
      PS_LOG_ERROR("joining worker: {}", m.status().ToString());
      return;
    }
    joined[slot].first = m->id;
    PS_LOG_INFO("test: W[{}] joined, starting at clock {}", m->id,
                m->view.workers(m->id).start_clock());
    std::unique_ptr<ClientFactory> own;
    ClientFactory* clients = &clients_;
    if (options_.worker_clients) {
      own = options_.worker_clients(m->id, &clients_);
      clients = own.get();
    }
    absl::Status st =
        RunWorkerWith(m->id, m->view, clients, scheduler_client_.get());
    own.reset();
    joined[slot].second = st;
    if (!st.ok()) {
      PS_LOG_ERROR("W[{}] failed: {}", m->id, st.ToString());
      scheduler_->Fail(absl::Status(
          st.code(), absl::StrCat("W[", m->id, "]: ", st.message())));
    }
  };
  std::thread ticker([&] {
    const absl::Duration hb =
        absl::Milliseconds(options_.config.cluster.heartbeat_ms);
    absl::Time next_hb = absl::InfinitePast();
    size_t next_kill = 0, next_join = 0, next_drain = 0, next_worker = 0;
    while (!stop.WaitForNotificationWithTimeout(options_.tick_every)) {
      for (auto& node : servers_) node->Tick();
      int64_t pushes = 0;
      for (auto& node : servers_) pushes += node->Status().pushes();
      if (next_kill < options_.kill_servers.size()) {
        const auto& k = options_.kill_servers[next_kill];
        if (pushes_received() >= k.after_pushes) {
          KillServer(k.server);
          ++next_kill;
          absl::MutexLock l(&gate_mu_);
          kills_done_ = next_kill;  // lets the pushes waiting for it go
        }
      }
      if (next_join < options_.join_after_pushes.size() &&
          pushes >= options_.join_after_pushes[next_join]) {
        const int id = options_.config.cluster.num_servers +
                       static_cast<int>(next_join);
        join_status_[next_join] = JoinServer(id);
        ++next_join;
      }
      if (next_worker < options_.join_workers_after_pushes.size() &&
          pushes >= options_.join_workers_after_pushes[next_worker]) {
        joiners.emplace_back(run_joiner, next_worker++);
      }
      if (next_drain < options_.drain_servers.size() &&
          pushes >= options_.drain_servers[next_drain].after_pushes) {
        const size_t i = next_drain++;
        drains.emplace_back([this, i] {
          proto::DrainRequest d;
          d.set_server(options_.drain_servers[i].server);
          drain_status_[i] = scheduler_->Drain(d).status();
        });
      }
      if (absl::Now() >= next_hb) {
        for (int i = 0; i < num_servers(); ++i) {
          if (server_handlers_[i]->killed()) continue;
          proto::HeartbeatRequest h;
          servers_[i]->FillHeartbeat(&h);
          h.set_id(i);  // a spare not configured yet has no id of its own
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
      std::shared_ptr<SchedulerClient> scheduler = scheduler_client_;
      if (options_.worker_scheduler) {
        scheduler = options_.worker_scheduler(id, scheduler_client_);
      }
      absl::Status st = RunWorkerWith(id, view_, clients, scheduler.get());
      own.reset();  // flushes delayed calls while the servers are alive
      worker_status_[w] = st;
      if (options_.killed_workers.contains(id)) {
        PS_LOG_INFO("W[{}] (killed by the test) ended: {}", id, st.ToString());
        return;
      }
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
  for (std::thread& t : drains) t.join();
  for (std::thread& t : joiners) t.join();  // the ticker adds no more
  joined_workers_ = joined;
  for (const auto& [id, st] : joined) {
    if (end.ok() && !st.ok()) end = st;
  }
  for (const auto& h : server_handlers_) {
    if (absl::Status v = h->violation(); !v.ok()) return v;
  }
  if (!end.ok()) return end;
  for (int w = 0; w < num_workers; ++w) {
    if (options_.killed_workers.contains(worker_ids_[w])) continue;
    if (!worker_status_[w].ok()) return worker_status_[w];
  }
  return absl::OkStatus();
}

absl::Status LocalCluster::JoinServer(int i) {
  if (i < 0 || i >= num_servers()) {
    return absl::InvalidArgumentError(absl::StrCat("no spare server ", i));
  }
  proto::RegisterRequest r;
  r.set_role(proto::ROLE_SERVER);
  r.set_address(InProcServerAddress(i));
  absl::StatusOr<proto::RegisterResponse> resp = scheduler_->Register(r);
  if (!resp.ok()) return resp.status();
  if (resp->id() != i) {
    return absl::InternalError(
        absl::StrCat("spare server ", i, " joined as ", resp->id()));
  }
  absl::Status s = servers_[i]->Configure(i, resp->view());
  // The scheduler's broadcast of a newer view may have come first.
  if (!s.ok() && servers_[i]->epoch() >= resp->view().epoch()) {
    return absl::OkStatus();
  }
  return s;
}

void LocalCluster::BeforePush() {
  absl::MutexLock l(&gate_mu_);
  ++gate_pushes_;
  const auto& kills = options_.kill_servers;
  auto go = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(gate_mu_) {
    return kills_done_ >= kills.size() ||
           gate_pushes_ <= kills[kills_done_].after_pushes;
  };
  // The ticker kills within a tick; the bound only keeps a broken test
  // from hanging (it then fails on what it checks).
  gate_mu_.AwaitWithTimeout(absl::Condition(&go), absl::Seconds(30));
}

void LocalCluster::KillServer(int i) {
  PS_LOG_WARN("test: killing S[{}]", i);
  server_handlers_[i]->Kill();
  servers_[i]->SetPeers(nullptr);
  servers_[i]->SetSuspectHandler(nullptr);
  // Its connections break: callers waiting for its answers get UNAVAILABLE.
  servers_[i]->CancelAll(
      absl::UnavailableError(absl::StrCat("S[", i, "] was killed")));
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
    const int i = static_cast<int>(&node - servers_.data());
    if (server_handlers_[i]->killed()) continue;  // failed over
    // Only the owned ranges: a backup's copies would count twice.
    const std::vector<int> owned = node->OwnedRanges();
    auto part = t->Snapshot(&owned);
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

proto::JobReport ParseReportOrEmpty(const std::string& json) {
  absl::StatusOr<proto::JobReport> r = ParseJobReport(json);
  return r.ok() ? *std::move(r) : proto::JobReport();
}

bool HasFailover(const std::string& json, const std::string& node) {
  const proto::JobReport r = ParseReportOrEmpty(json);
  return std::any_of(
      r.failovers().begin(), r.failovers().end(),
      [&](const proto::JobReport::Failover& f) { return f.node() == node; });
}

std::optional<proto::JobReport::MembershipChange> FindMembership(
    const std::string& json, const std::string& event,
    const std::string& node) {
  const proto::JobReport r = ParseReportOrEmpty(json);
  for (const auto& m : r.membership()) {
    if (m.event() == event && m.node() == node) return m;
  }
  return std::nullopt;
}

std::optional<proto::JobReport::Worker> FindWorker(const std::string& json,
                                                   int id) {
  const proto::JobReport r = ParseReportOrEmpty(json);
  for (const auto& w : r.per_worker()) {
    if (w.id() == id) return w;
  }
  return std::nullopt;
}

}  // namespace ps
