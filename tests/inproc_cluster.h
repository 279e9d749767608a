// A whole parameter-server job inside one process, for tests and benchmarks:
//
//  * InProcClientFactory: the transport seam (transport/transport.h) with no
//    network. "inproc:server:<i>" addresses reach ServerNode objects and
//    "inproc:scheduler" reaches a SchedulerCore; calls go straight to their
//    methods.
//  * FaultyServerClient / FaultyClientFactory: a decorator over any
//    ServerClient that loses requests (the server never sees them), loses
//    replies after the server applied the request, or delays requests,
//    decided by a seeded RNG or an explicit schedule.
//  * LocalCluster: a SchedulerCore, S ServerNodes and W workers (each
//    RunWorkerWith on its own thread) built from one JobConfig.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/config.h"
#include "transport/transport.h"
#include "scheduler/scheduler.h"
#include "server/server_node.h"

namespace ps {

// "inproc:server:<id>".
std::string InProcServerAddress(int id);
inline constexpr char kInProcSchedulerAddress[] = "inproc:scheduler";

// Maps in-process addresses to nodes. Register nodes before handing out
// clients; registered objects must outlive the factory and every client it
// made. Thread-safe.
//
// Semantics of the clients:
//  * Push/Pull/Clock call the node at once; the callback runs on the
//    caller's thread (before the call returns) or, for a pull that waits
//    for consistency, on whichever thread releases it (a ClockTick, Finish
//    or ServerNode::Tick). The shared request and a heap response stay
//    alive until then. Deadlines are not enforced: a waiting pull ends by
//    the node's own wait_ms (ServerNode::Tick) instead.
//  * Control: set_consistency -> SetConsistency, new_view ->
//    Configure(<id>, view), save_and_exit -> SaveModel("", resp).
//  * An unknown address gives clients that answer UNAVAILABLE.
class InProcClientFactory : public ClientFactory {
 public:
  InProcClientFactory() = default;

  void AddServer(int id, ServerNode* node);
  void SetScheduler(SchedulerCore* scheduler);

  std::shared_ptr<ServerClient> Server(const std::string& address) override;
  std::shared_ptr<SchedulerClient> Scheduler(
      const std::string& address) override;

 private:
  absl::Mutex mu_;
  std::map<std::string, std::shared_ptr<ServerClient>> servers_
      ABSL_GUARDED_BY(mu_);
  std::shared_ptr<SchedulerClient> scheduler_ ABSL_GUARDED_BY(mu_);
};

// ------------------------------------------------------------ fault injection

enum class RpcMethod { kPush, kPull, kClock, kFinish, kControl, kStatus };
const char* RpcMethodName(RpcMethod m);

enum class Fault {
  kNone,
  kDropRequest,  // lost before delivery: the server never sees it
  kDropReply,    // delivered and applied; the caller gets UNAVAILABLE
  kDelay,        // delivered after FaultOptions::delay (real time)
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
  // Synchronous calls; off by default.
  FaultRates finish, control, status;
  absl::Duration delay = absl::Milliseconds(5);
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

// Runs functions at a later time on one background thread. Destruction
// runs whatever is still queued, at once, so no callback is lost.
class Delayer {
 public:
  Delayer();
  ~Delayer();
  void After(absl::Duration d, std::function<void()> fn);

 private:
  void Loop();
  absl::Mutex mu_;
  std::multimap<absl::Time, std::function<void()>> queue_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  bool changed_ ABSL_GUARDED_BY(mu_) = false;  // queue_ grew
  std::thread thread_;
};

// Wraps `inner`. A dropped request or reply is reported with UNAVAILABLE (as
// a lost connection would be), so a correct client retries it. Thread-safe.
class FaultyServerClient : public ServerClient {
 public:
  // `delayer` (for kDelay) and `stats` must outlive the client.
  FaultyServerClient(std::shared_ptr<ServerClient> inner, FaultOptions options,
                     Delayer* delayer, FaultStats* stats);

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

 private:
  Fault Decide(RpcMethod m);
  template <typename Req, typename Resp, typename Call>
  void Async(RpcMethod m, std::shared_ptr<const Req> req, absl::Time deadline,
             Callback<Resp> done, Call call);

  const std::shared_ptr<ServerClient> inner_;
  const FaultOptions options_;
  Delayer* const delayer_;
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
  Delayer delayer_;  // last: destroyed first, running delayed calls
};

// -------------------------------------------------------------- LocalCluster

struct LocalClusterOptions {
  JobConfig config;
  // Makes the client factory worker `w` uses, wrapping the in-process one
  // (e.g. a FaultyClientFactory). Unset: the in-process factory itself.
  std::function<std::unique_ptr<ClientFactory>(int worker,
                                               ClientFactory* inproc)>
      worker_clients;
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
  std::unique_ptr<SchedulerCore> scheduler_;
  std::vector<std::unique_ptr<ServerNode>> servers_;
  std::shared_ptr<SchedulerClient> scheduler_client_;
  proto::ClusterView view_;
  std::vector<int> worker_ids_;
  std::vector<absl::Status> worker_status_;
  bool started_ = false;
};

// Reads the number stored under "key" in a flat JSON object such as the
// scheduler's report (the first occurrence of "key":). NOT_FOUND when absent,
// INVALID_ARGUMENT when it is not a number (e.g. null).
absl::StatusOr<double> JsonNumber(const std::string& json,
                                  const std::string& key);

}  // namespace ps
