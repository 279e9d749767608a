// The scheduler's logic, free of RPC: membership (register, heartbeat,
// failure detection), the cluster view (routing by consistent hashing with
// virtual nodes, consistency settings, tables), data-shard assignment,
// barriers, and the end of the job (servers write the model, a JSON report
// is written). The gRPC service (scheduler_service.h) and the in-process
// transport call it.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/clock.h"
#include "common/config.h"
#include "transport/transport.h"
#include "proto/ps.pb.h"

namespace ps {

struct SchedulerOptions {
  JobConfig config;
  std::string report_path;  // empty: no report file
  Clock* clock = Clock::Real();
  // Used to reach servers (save the model, push view changes, status).
  // Must outlive the scheduler.
  ClientFactory* clients = nullptr;
};

class SchedulerCore {
 public:
  explicit SchedulerCore(SchedulerOptions options);

  // Assigns an id (the requested one when free). Once the configured number
  // of servers and workers registered, the view becomes ready (epoch 1).
  // RESOURCE_EXHAUSTED when the role is full, INVALID_ARGUMENT for a bad
  // role or a server without address.
  absl::StatusOr<proto::RegisterResponse> Register(
      const proto::RegisterRequest& req);
  // Returns once the view is ready with an epoch > known_epoch, or at
  // min(deadline, now + wait_ms) with whatever is there (ready=false).
  absl::StatusOr<proto::GetViewResponse> GetView(
      const proto::GetViewRequest& req, absl::Time deadline);
  absl::StatusOr<proto::HeartbeatResponse> Heartbeat(
      const proto::HeartbeatRequest& req);
  absl::StatusOr<proto::GetShardResponse> GetShard(
      const proto::GetShardRequest& req);
  // Blocks until every live member of the group arrived at barrier `name`;
  // DEADLINE_EXCEEDED naming the missing ids otherwise.
  absl::Status Barrier(const proto::BarrierRequest& req, absl::Time deadline);
  // Records a worker's final statistics. When the last live worker is done,
  // asks every server to write its model shard, writes the report and marks
  // the job done.
  absl::Status WorkerDone(const proto::WorkerDoneRequest& req);
  // Changes mode/tau while the job runs and forwards it to every server.
  absl::StatusOr<proto::SetConsistencyResponse> SetConsistency(
      const proto::SetConsistencyRequest& req);
  absl::StatusOr<proto::StatusResponse> Status();

  // Marks nodes silent for longer than the heartbeat timeout dead. A dead
  // worker is dropped from the clocks (the servers get a new view); a dead
  // server fails the job (its ranges have no replica yet). Call
  // periodically.
  void CheckHeartbeats();

  // Blocks until the job ended: OK when it finished, the failure otherwise,
  // DEADLINE_EXCEEDED at the deadline.
  absl::Status WaitForEnd(absl::Time deadline);
  // Ends the job with an error (e.g. from a signal handler thread).
  void Fail(const absl::Status& status);

  // The JSON report of a finished job (also written to report_path).
  std::string ReportJson() const;

 private:
  struct Node {
    proto::NodeInfo info;
    absl::Time last_seen;
  };
  struct WorkerResult {
    proto::WorkerDoneRequest done;
  };

  void BuildViewLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  int LiveWorkersLocked() const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  std::string ReportJsonLocked() const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // Sends the current view to every server (outside mu_).
  void BroadcastView(const proto::ClusterView& view);
  // Ends the job: save models, write the report (called without mu_).
  void Finalize();

  const SchedulerOptions options_;
  const std::string config_yaml_;
  const absl::Time start_;

  mutable absl::Mutex mu_;
  std::vector<Node> servers_ ABSL_GUARDED_BY(mu_);
  std::vector<Node> workers_ ABSL_GUARDED_BY(mu_);
  bool ready_ ABSL_GUARDED_BY(mu_) = false;
  absl::Time ready_time_ ABSL_GUARDED_BY(mu_);
  proto::ClusterView view_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, std::set<int>> barriers_ ABSL_GUARDED_BY(mu_);
  std::map<int, proto::WorkerDoneRequest> done_ ABSL_GUARDED_BY(mu_);
  std::vector<proto::ServerControlResponse> models_ ABSL_GUARDED_BY(mu_);
  bool finalizing_ ABSL_GUARDED_BY(mu_) = false;
  bool ended_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status end_status_ ABSL_GUARDED_BY(mu_);
  absl::Time end_time_ ABSL_GUARDED_BY(mu_);
};

// Parses the consistency section into its wire form.
proto::ConsistencyConfig ToProto(const ConsistencyConfig& c);

}  // namespace ps
