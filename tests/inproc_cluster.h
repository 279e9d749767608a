// A whole parameter-server job inside one process, for tests and benchmarks:
//
//  * ServerNodeHandler / SchedulerCoreHandler: ServerNode and SchedulerCore
//    adapted to the in-process transport's handler interfaces
//    (transport/inproc_transport.h), so InProcClientFactory reaches them.
//  * LocalCluster: a SchedulerCore, S ServerNodes and W workers (each
//    RunWorkerWith on its own thread) built from one JobConfig, over the
//    in-process transport (optionally wrapped per worker, e.g. in a
//    FaultyClientFactory from transport/faulty_transport.h).
#pragma once

#include <atomic>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/config.h"
#include "transport/faulty_transport.h"
#include "transport/inproc_transport.h"
#include "transport/transport.h"
#include "proto/report.pb.h"
#include "scheduler/scheduler.h"
#include "server/server_node.h"

namespace ps {

// A ServerNode as the in-process transport's ServerHandler. Control:
// set_consistency -> SetConsistency, new_view -> Configure(id, view),
// save_and_exit -> SaveModel("", resp). `node` must outlive it. After every
// call that changes the node it runs ServerNode::CheckInvariants and keeps
// the first violation (violation()); LocalCluster::Run fails with it.
class ServerNodeHandler : public ServerHandler {
 public:
  ServerNodeHandler(int id, ServerNode* node) : id_(id), node_(node) {}
  void Push(const proto::PushRequest& req, proto::PushResponse* resp,
            Done done) override;
  void Pull(const proto::PullRequest& req, proto::PullResponse* resp,
            Done done) override;
  absl::Status Clock(const proto::ClockRequest& req) override;
  void ClockAsync(const proto::ClockRequest& req, Done done) override;
  absl::Status Finish(const proto::FinishRequest& req) override;
  absl::StatusOr<proto::ServerControlResponse> Control(
      const proto::ServerControlRequest& req) override;
  absl::StatusOr<proto::ServerStatus> GetStatus() override;
  absl::Status Replicate(const proto::ReplicateRequest& req) override;

  // OK, or the first invariant violation seen after a call.
  absl::Status violation() const;

  // Issue 9 (server failure): from now on every call fails with
  // UNAVAILABLE, as for a process that was SIGKILLed.
  void Kill();
  // Runs at the start of every Push (LocalCluster's kill gate). Set before
  // the first call.
  void set_before_push(std::function<void()> f) { before_push_ = std::move(f); }
  bool killed() const { return killed_.load(); }

 private:
  void Check();
  absl::Status Dead() const;

  std::atomic<bool> killed_{false};
  // Replication batches received: odd ones go as through shared memory.
  std::atomic<uint64_t> replicated_{0};
  std::function<void()> before_push_;
  // Pulls the node has not answered yet: a kill answers them UNAVAILABLE
  // (their connection broke); the node's later answer is dropped.
  struct PullSlot {
    Done done;
    bool answered ABSL_GUARDED_BY(mu) = false;
    absl::Mutex mu;
  };
  absl::Mutex pulls_mu_;
  std::set<std::shared_ptr<PullSlot>> pulls_ ABSL_GUARDED_BY(pulls_mu_);
  const int id_;
  ServerNode* const node_;
  mutable absl::Mutex mu_;
  absl::Status violation_ ABSL_GUARDED_BY(mu_);
};

// A SchedulerCore as the in-process transport's SchedulerHandler. ServerDone
// is a no-op (SchedulerCore collects model files through
// Control(save_and_exit)). `core` must outlive it.
class SchedulerCoreHandler : public SchedulerHandler {
 public:
  explicit SchedulerCoreHandler(SchedulerCore* core) : core_(core) {}
  absl::StatusOr<proto::RegisterResponse> Register(
      const proto::RegisterRequest& req) override;
  absl::StatusOr<proto::GetViewResponse> GetView(
      const proto::GetViewRequest& req, absl::Time deadline) override;
  absl::StatusOr<proto::HeartbeatResponse> Heartbeat(
      const proto::HeartbeatRequest& req) override;
  absl::StatusOr<proto::GetWorkResponse> GetWork(
      const proto::GetWorkRequest& req) override;
  absl::Status Barrier(const proto::BarrierRequest& req,
                       absl::Time deadline) override;
  absl::Status WorkerDone(const proto::WorkerDoneRequest& req) override;
  absl::Status ServerDone(const proto::ServerDoneRequest& req) override;
  absl::StatusOr<proto::SetConsistencyResponse> SetConsistency(
      const proto::SetConsistencyRequest& req) override;
  absl::StatusOr<proto::StatusResponse> Status(
      const proto::StatusRequest& req) override;

 private:
  SchedulerCore* const core_;
};

// -------------------------------------------------------------- LocalCluster

struct LocalClusterOptions {
  JobConfig config;
  // Makes the client factory worker `w` uses, wrapping the in-process one
  // (e.g. a FaultyClientFactory). Unset: the in-process factory itself.
  std::function<std::unique_ptr<ClientFactory>(int worker,
                                               ClientFactory* inproc)>
      worker_clients;
  // Issue 9: makes the client factory server `s` replicates to its backups
  // with (e.g. a FaultyClientFactory that loses copies). Unset: the
  // in-process one.
  std::function<std::unique_ptr<ClientFactory>(int server,
                                               ClientFactory* inproc)>
      server_peers;
  // Issue 9 (worker failure): wraps the scheduler client worker `w` uses
  // (e.g. to cut it off). Unset: the shared in-process one.
  std::function<std::shared_ptr<SchedulerClient>(
      int worker, std::shared_ptr<SchedulerClient> inproc)>
      worker_scheduler;
  // Workers the test kills: their own failure is not the job's (the
  // scheduler detects the death and decides); Run ignores their status.
  std::set<int> killed_workers;
  // Issue 9 (server failure): servers "SIGKILLed" (KillServer) once the
  // servers together received this many push requests, in order. A push
  // request beyond that count waits until the kill happened, so the kill
  // comes at the same point of the job however fast the machine.
  struct ServerKill {
    int server = 0;
    int64_t after_pushes = 0;
  };
  std::vector<ServerKill> kill_servers;
  // Elasticity (issue 9): servers built (ids num_servers, num_servers + 1,
  // ...) and reachable, but not registered: JoinServer(id) makes one join
  // the running job.
  int spare_servers = 0;
  // Run: the spares join in id order, spare i once the servers together
  // acknowledged join_after_pushes[i] push requests; drain_servers are
  // drained (SchedulerCore::Drain, on a thread of their own) likewise.
  std::vector<int64_t> join_after_pushes;
  struct ServerDrain {
    int server = 0;
    int64_t after_pushes = 0;
  };
  std::vector<ServerDrain> drain_servers;
  // Issue 9: a worker joins the running job (registers, as a new worker
  // process would, through JoinCluster, then trains) once the servers
  // together acknowledged each of these many push requests.
  std::vector<int64_t> join_workers_after_pushes;
  // Where the servers write the model at the end. Empty: a fresh directory
  // under the system temp dir, removed by the destructor.
  std::string model_dir;
  std::string report_path;  // empty: no report file
  absl::Duration tick_every = absl::Milliseconds(10);
  // The whole job must end by then (DEADLINE_EXCEEDED otherwise).
  absl::Duration timeout = absl::Seconds(300);
};

// One job in this process. Not thread-safe: drive it from one thread.
class LocalCluster {
 public:
  explicit LocalCluster(LocalClusterOptions options);
  ~LocalCluster();

  LocalCluster(const LocalCluster&) = delete;
  LocalCluster& operator=(const LocalCluster&) = delete;

  // Builds the scheduler and the servers, registers every node and
  // configures the servers with the ready view. Called by Run if needed.
  absl::Status Start();

  // Runs every worker to the end and waits for the job to end: the
  // scheduler's end status, else the first failing worker's status. Call
  // once.
  absl::Status Run();

  // The scheduler's JSON report (after Run).
  std::string ReportJson() const;
  // Status of each worker's RunWorkerWith (after Run).
  const std::vector<absl::Status>& worker_status() const {
    return worker_status_;
  }

  int num_servers() const { return static_cast<int>(servers_.size()); }
  // After Run: how each of options.drain_servers and join_after_pushes went
  // (not run: UNKNOWN).
  const std::vector<absl::Status>& drain_status() const {
    return drain_status_;
  }
  const std::vector<absl::Status>& join_status() const { return join_status_; }
  // After Run: (id, status) of each worker of join_workers_after_pushes
  // (id -1: never started, the job ended first; -2: could not join).
  const std::vector<std::pair<int, absl::Status>>& joined_workers() const {
    return joined_workers_;
  }
  // Issue 9: "SIGKILLs" server `i` (thread-safe; while Run runs): it stops
  // answering and heartbeating, and reaches no other node any more.
  void KillServer(int i);
  bool server_killed(int i) const { return server_handlers_[i]->killed(); }
  // Push requests the servers received so far (all of them, killed or not).
  int64_t pushes_received() const {
    absl::MutexLock l(&gate_mu_);
    return gate_pushes_;
  }
  // Elasticity (issue 9): spare server `i` registers with the running job
  // (the scheduler gives it id i: spares join in id order) and installs the
  // view it gets; the scheduler then moves ranges to it in the background.
  absl::Status JoinServer(int i);
  ServerNode* server(int i) const { return servers_[i].get(); }
  SchedulerCore* scheduler() const { return scheduler_.get(); }
  InProcClientFactory* clients() { return &clients_; }
  const proto::ClusterView& view() const { return view_; }
  const std::string& model_dir() const { return model_dir_; }

  // Every (key, value) of table `table` over all servers, ascending by key.
  std::vector<std::pair<uint64_t, std::vector<float>>> Snapshot(
      int table = 0) const;

 private:
  LocalClusterOptions options_;
  std::string model_dir_;
  bool own_model_dir_ = false;
  InProcClientFactory clients_;
  // options.server_peers' factories; after clients_, before the servers.
  std::vector<std::unique_ptr<ClientFactory>> peer_clients_;
  std::unique_ptr<SchedulerCore> scheduler_;
  std::vector<std::unique_ptr<ServerNode>> servers_;
  // After the nodes they point to (destroyed first).
  std::unique_ptr<SchedulerCoreHandler> scheduler_handler_;
  std::vector<std::unique_ptr<ServerNodeHandler>> server_handlers_;
  // The kill gate (options.kill_servers): push requests received, and how
  // many of the kills were done.
  void BeforePush();
  mutable absl::Mutex gate_mu_;
  int64_t gate_pushes_ ABSL_GUARDED_BY(gate_mu_) = 0;
  size_t kills_done_ ABSL_GUARDED_BY(gate_mu_) = 0;
  std::shared_ptr<SchedulerClient> scheduler_client_;
  proto::ClusterView view_;
  std::vector<int> worker_ids_;
  std::vector<absl::Status> worker_status_;
  std::vector<absl::Status> drain_status_;
  std::vector<absl::Status> join_status_;
  std::vector<std::pair<int, absl::Status>> joined_workers_;
  bool started_ = false;
};

// Reads the number stored under "key" in a flat JSON object such as the
// scheduler's report (the first occurrence of "key":). NOT_FOUND when absent,
// INVALID_ARGUMENT when it is not a number (e.g. null).
absl::StatusOr<double> JsonNumber(const std::string& json,
                                  const std::string& key);

// The report JSON (common/job_report.h) parsed back; an empty JobReport when
// it does not parse (the caller's checks of its fields then fail).
proto::JobReport ParseReportOrEmpty(const std::string& json);
// Whether the report JSON has a failover of `node` ("S[1]").
bool HasFailover(const std::string& json, const std::string& node);
// The report's membership entry for `event` ("joined", "drained") of `node`
// ("S[3]", "W[2]"); nullopt when there is none.
std::optional<proto::JobReport::MembershipChange> FindMembership(
    const std::string& json, const std::string& event, const std::string& node);
// The report's per_worker entry of worker `id`; nullopt when there is none.
std::optional<proto::JobReport::Worker> FindWorker(const std::string& json,
                                                   int id);

}  // namespace ps
