// The scheduler's logic, free of RPC: membership (register, heartbeat,
// failure detection), the cluster view (routing by consistent hashing with
// virtual nodes, consistency settings, tables), data-shard assignment,
// barriers, and the end of the job (servers write the model, a JSON report
// is written). The gRPC service (scheduler_service.h) and the in-process
// transport call it.
#pragma once

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
#include "common/clock.h"
#include "common/config.h"
#include "scheduler/state_file.h"
#include "scheduler/work_units.h"
#include "transport/transport.h"
#include "proto/ps.pb.h"
#include "proto/report.pb.h"

namespace ps {

// The life cycle of a job: registering -> running -> finishing -> done, or
// failed from any phase. Only moves forward.
enum class JobPhase { kRegistering, kRunning, kFinishing, kDone, kFailed };
// "registering", "running", "finishing", "done", "failed".
const char* JobPhaseName(JobPhase phase);

struct SchedulerOptions {
  JobConfig config;
  std::string report_path;  // empty: no report file
  // Every timer, backoff and deadline of the logic (not the blocking waits
  // of GetView/Barrier/WaitForEnd, which hold an RPC thread in real time).
  Clock* clock = Clock::Real();
  // Used to reach servers (save the model, push view changes, status).
  // Must outlive the scheduler.
  ClientFactory* clients = nullptr;
  // Control calls whose loss matters (view broadcast, save) are retried
  // with exponential backoff from retry_initial up to retry_max while they
  // fail with UNAVAILABLE or DEADLINE_EXCEEDED, each attempt bounded by
  // attempt_timeout; a view broadcast gives up after view_deadline, a save
  // after save_deadline, and the job fails naming the server.
  absl::Duration retry_initial = absl::Milliseconds(50);
  absl::Duration retry_max = absl::Seconds(1);
  absl::Duration attempt_timeout = absl::Seconds(10);
  absl::Duration view_deadline = absl::Seconds(30);
  absl::Duration save_deadline = absl::Seconds(300);
  // Checkpoints (issue 9): a complete checkpoint folder every server loads
  // its keys from at start (ResolveRestore); empty: none.
  std::string restore_from;
  // Scheduler restart (issue 9): the file the scheduler keeps its state in
  // (proto::SchedulerState: membership, view, work units, results),
  // rewritten after every change once the job runs; empty: none.
  std::string state_path;
};

class SchedulerCore {
 public:
  explicit SchedulerCore(SchedulerOptions options);
  // Waits for the failover probes still running.
  ~SchedulerCore();
  // Starts no more background work (probes, rebalancing, joins) and waits
  // for what runs: call before the servers' clients go away (the
  // destructor does it too, which is too late for an owner that destroys
  // its in-process servers first). Idempotent.
  void Close();

  // Assigns an id (the requested one when free). Once the configured number
  // of servers and workers registered, the view becomes ready (epoch 1) and
  // the phase running. RESOURCE_EXHAUSTED when the role is full,
  // INVALID_ARGUMENT for a bad role or a server without address,
  // FAILED_PRECONDITION (reason JOB_FAILED) once the job has ended.
  absl::StatusOr<proto::RegisterResponse> Register(
      const proto::RegisterRequest& req);
  // Returns once the view is ready with an epoch > known_epoch, or at
  // min(deadline, now + wait_ms) with whatever is there (ready=false).
  // req.suspect_servers (failover, issue 9): each live server named there is
  // probed at once on a thread of its own (a status RPC of
  // fault_tolerance.probe_timeout_ms, twice); when neither answers it is
  // dead (FailoverServers), without waiting for its heartbeat deadline.
  // A server that answers its probes while nodes name it having heard
  // nothing from it for heartbeat_timeout_ms (req.suspect_silent_ms: a
  // partial partition, the scheduler reaches it, they do not) is failed
  // over too, when at least two nodes say so or the one saying so is the
  // only live worker; one node alone among several is not believed (its
  // own link may be what is broken) and is logged, unless it has said so
  // for twice the timeout while no other node names the server: a worker
  // is then the one cut off (dropped, with work units), a primary naming
  // its backup has lost its link to it (the backup is failed over).
  // A reply that carries the ready view to a registered node (req.role/id)
  // starts that node's heartbeat deadline.
  absl::StatusOr<proto::GetViewResponse> GetView(
      const proto::GetViewRequest& req, absl::Time deadline);
  // Records that the node is alive. The reply carries the view epoch and,
  // once the job ended, shutdown (and failed + error for a failed job);
  // for a worker also others_min_clock (see ps.proto). INVALID_ARGUMENT for
  // an unknown node, FAILED_PRECONDITION before it registered or for a
  // worker declared dead (work units on: its work went to the others).
  absl::StatusOr<proto::HeartbeatResponse> Heartbeat(
      const proto::HeartbeatRequest& req);
  // A node's session with the scheduler (issue 9, SessionRequest in
  // ps.proto). OpenSession: INVALID_ARGUMENT for an unknown node,
  // FAILED_PRECONDITION before it registered or once it is no longer alive
  // (a worker declared dead). CloseSession, for each session opened: when
  // the node's last open session closes while it is alive and the job runs,
  // a worker silent since its last heartbeat is dropped WorkerGoneAfter()
  // after it (CheckHeartbeats), and a server is probed at once (Probe: a
  // refused connection fails it over).
  absl::Status OpenSession(proto::Role role, int id);
  void CloseSession(proto::Role role, int id);
  // How many sessions of node (role, id) are open (0 for an unknown node).
  int OpenSessions(proto::Role role, int id);
  // Dynamic work (issue 9, scheduler/work_units.h). Records req.finished
  // (units whose pushes were all acknowledged), then answers: a unit lost
  // in an earlier reply (assigned to the worker, neither finished nor in
  // req.holding), else the next queued unit (WORK_UNIT); WORK_WAIT when
  // none is queued but some are in progress elsewhere; WORK_DONE when every
  // unit of every epoch is done, with `evaluate` set for one live worker
  // (the lowest live one when first asked). When the last unit is done and
  // epoch 0 trained no example, the job fails with FAILED_PRECONDITION
  // "trained 0 examples from <data> (<k> lines skipped)".
  // Errors: INVALID_ARGUMENT for an unknown worker or unit, FAILED_PRECONDITION
  // before the cluster is ready, for a worker declared dead, or for a unit
  // not assigned to it; the job's failure (reason JOB_FAILED) once it failed.
  absl::StatusOr<proto::GetWorkResponse> GetWork(
      const proto::GetWorkRequest& req);
  // Blocks until every live member of the group arrived at barrier `name`;
  // DEADLINE_EXCEEDED naming the missing ids otherwise; the job's failure
  // (reason JOB_FAILED) when it failed meanwhile.
  absl::Status Barrier(const proto::BarrierRequest& req, absl::Time deadline);
  // Records a worker's final statistics (idempotent: a retry replaces
  // them). When the last worker is done, asks every server to write its
  // model shard (retried), writes the report and ends the job (done, or
  // failed when a save failed). INVALID_ARGUMENT for an unknown worker; the
  // job's failure (reason JOB_FAILED) when it already failed.
  absl::Status WorkerDone(const proto::WorkerDoneRequest& req);
  // Changes mode/tau while the job runs: a new view (epoch + 1) broadcast to
  // every server. INVALID_ARGUMENT for a bad setting, FAILED_PRECONDITION
  // before the cluster is ready or after the job ended, the failure when a
  // server could not be told (the job then fails).
  absl::StatusOr<proto::SetConsistencyResponse> SetConsistency(
      const proto::SetConsistencyRequest& req);
  // `brief`: without asking the servers for their ServerStatus.
  absl::StatusOr<proto::StatusResponse> Status(bool brief = false);

  // Failover (issue 9, docs/fault_tolerance.md). Marks servers `ids` dead
  // and, with replication on, publishes a view (epoch + 1) in which every
  // range they owned is owned by its first live backup and every range gets
  // its backups back from the live servers (Reassign; the new primaries copy
  // the ranges to new backups in the background); records a failover per
  // server for the report (recovery_ms: from its last heartbeat to the
  // first push acknowledged under the new epoch, as the servers report it).
  // The job fails (UNAVAILABLE naming the server) without replication, and
  // with DATA_LOSS naming a range when no live server holds it.
  // `why`: how it was found ("probe", "heartbeat"). Without mu_.
  //
  // A server whose failover would lose data (the only complete copy of a
  // range, or any server without replication) is not given up on a
  // silence alone: a stopped or overloaded process may come back, and
  // failing it ends the job. It is probed until it answers (nothing
  // happens), refuses the connection (its process is gone: `definitive`,
  // it fails at once) or has been silent for cluster.scheduler_timeout_ms
  // (SchedulerTimeout) since its last heartbeat.
  void FailoverServers(const std::vector<int>& ids, const std::string& why,
                       bool definitive = false);
  // Before failing `ids` over loses a range whose other members are still
  // copying it (as far as their heartbeats said): asks those members for
  // their status, and forgets the copies they now hold. Without mu_.
  void RefreshCopies(const std::vector<int>& ids);

  // Enforces the deadlines. Registering: the job fails with
  // DEADLINE_EXCEEDED naming who is missing once register_timeout_ms passed
  // since construction. Running: a node silent for heartbeat_timeout_ms,
  // counted from its last heartbeat or from when it was told the ready view
  // (never from its registration), is dead. A dead server fails over
  // (FailoverServers; without replication the job fails with UNAVAILABLE
  // naming it). A dead worker
  // (when its data comes in work units: every model) is dropped
  // instead: marked NODE_DEAD in a new view (epoch + 1) broadcast to the
  // servers, so BSP/SSP stop waiting for it, and its unfinished units are
  // queued again for the others; the job fails with UNAVAILABLE only when
  // no worker is left, or when it was the worker chosen to evaluate the
  // test set and it died before reporting. Call periodically.
  void CheckHeartbeats();
  // The scheduler itself did not run for `gap` (stopped, a VM pause, a
  // starved machine): no heartbeat could be taken meanwhile, so every live
  // node's heartbeat deadline starts again now rather than every node being
  // declared dead at once (issue 9). A node that really died meanwhile is
  // found a heartbeat timeout later.
  void NoteStall(absl::Duration gap);

  // Blocks until the job ended: OK when it finished, the failure otherwise,
  // DEADLINE_EXCEEDED at the deadline. The report is written by then.
  absl::Status WaitForEnd(absl::Time deadline);
  // Ends the job with an error (e.g. from a signal handler thread); no-op
  // once it ended.
  void Fail(const absl::Status& status);
  // Once the job ended: whether every node that may still run has heard so
  // (a heartbeat answered with `shutdown`) or is gone (dead, drained, or its
  // session closed with its process), and a status client that asked within
  // kStatusWatchWindow (`ps_status --watch` asks every 200 ms at most) has
  // been answered with the end, so the scheduler need not wait longer for
  // anyone to see it.
  bool EndSeenByAll() const;
  static constexpr absl::Duration kStatusWatchWindow = absl::Seconds(1);

  JobPhase phase() const;

  // Issue 11: the state the metrics endpoint exports, copied under the lock
  // without asking the servers (cheap, unlike Status()).
  struct MetricsView {
    std::vector<proto::NodeInfo> nodes;  // servers, then workers
    JobPhase phase = JobPhase::kRegistering;
    int64_t epoch = 0;      // the view's
    int64_t failovers = 0;  // servers failed over so far
  };
  MetricsView GetMetricsView() const;

  // Scheduler restart (issue 9). Call once, right after construction,
  // before serving: when options.state_path holds the state of this job
  // (same config) that was running, takes it over (membership, view, work
  // units, finished workers' results; every node's heartbeat deadline
  // starts now) and returns true; the caller then serves on the same
  // address and calls ResumeAfterRestore. False when there is no file, or
  // it is of a job that ended (this one starts afresh). FAILED_PRECONDITION
  // for the state of a running job with another config, DATA_LOSS for an
  // unreadable or malformed file.
  absl::StatusOr<bool> RestoreState();
  // After RestoreState returned true, once this scheduler listens: the
  // nodes' heartbeat deadlines start again now, plus kReconnectGrace. A
  // node's channel to the scheduler backed off between connection attempts
  // while no scheduler listened (kMaxReconnectBackoffMs, and gRPC's 20 %
  // jitter), so its first heartbeat may come that long after the scheduler
  // is back, plus a heartbeat period; the deadlines RestoreState started
  // ran while this one was not yet listening (under load, hundreds of ms).
  void NoteListening();
  static constexpr absl::Duration kReconnectGrace =
      absl::Milliseconds(kMaxReconnectBackoffMs * 6 / 5 + 300);
  // The state file's fsync, made outside mu_ when a save since the last
  // one was not synced (SaveStateLocked); call every kStateSyncInterval.
  void SyncState();
  static constexpr absl::Duration kStateSyncInterval = absl::Seconds(1);
  // After RestoreState returned true: finishes what the previous scheduler
  // was doing when it died: a worker's join, a server's join (its share of
  // the ranges) or drain (on threads of their own), and saving the model
  // when every worker was done.
  // Blocks; call from a thread of its own.
  void ResumeAfterRestore();

  // The job report (proto/report.proto): always status ("ok" | "failed" |
  // "running"), error and phase; a failed job lists no model files.
  // Written to report_path as JSON (ReportJson, common/job_report.h) when
  // the job ends, whichever way.
  proto::JobReport Report() const;
  // Report() as the report file's JSON text.
  std::string ReportJson() const;

  // Elasticity (issue 9, docs/fault_tolerance.md). Moves every key range
  // off server req.server(): a range it owns goes to its first live backup
  // (which holds a synchronous copy; a range without one first gets a copy
  // on the live server owning the fewest ranges), a range it backs up gets
  // another backup; then the server is marked NODE_LEFT in a new view and
  // told (heartbeat: shutdown + left) to exit. Blocks until done.
  // INVALID_ARGUMENT for an unknown server, FAILED_PRECONDITION unless the
  // job is running and the server is alive with another live server left,
  // ABORTED when a range could not be moved (the server then stays).
  absl::StatusOr<proto::DrainResponse> Drain(const proto::DrainRequest& req);
  // Whether the servers' membership is at rest: no server being drained or
  // taking its share after a join, no chain member still receiving its
  // copy, and every range's chain whole (its owner and `replicas` backups,
  // all alive). For tests that change the cluster one step at a time.
  bool MembershipSettled() const;
  // The fewest live members holding a complete copy (not still receiving
  // it) over every range's chain: with 1, some range would be lost if its
  // owner died now; with 1 + replicas, every chain is whole and synced.
  // 0 when some range has none (or there are no ranges).
  int FewestSyncedMembers() const;

  // Checkpoints (issue 9; server/checkpoint.h). Takes checkpoint <id>, the
  // next id above every ckpt-<id> folder in the checkpoint dir: each server
  // writes its files into <checkpoint dir>/ckpt-<id> (each call retried as
  // saves are, until save_deadline), then the MANIFEST is written (the
  // checkpoint is complete from then on) and complete checkpoints beyond
  // fault_tolerance.checkpoints_kept are deleted. One at a time: a second
  // call waits for the first. FAILED_PRECONDITION unless the job is
  // running, or when it stopped running meanwhile (abandoned); otherwise
  // the first error, naming the server or file, with its code (a server
  // unreachable until save_deadline: UNAVAILABLE). No MANIFEST is written
  // for a failed checkpoint. A failed checkpoint does not fail the job;
  // the report's checkpoint_error records the last one.
  absl::StatusOr<proto::CheckpointResponse> Checkpoint();
  // Takes a checkpoint when fault_tolerance.checkpoint_interval_s > 0 and
  // that long passed on the injected clock since the cluster became ready
  // or the last interval checkpoint started. Blocks while it runs: call it
  // periodically from a thread of its own, not from a clock timer.
  void MaybeCheckpoint();
  // Early stopping (issue 12): when the validation log loss reached a new
  // best since the last call, tells every live server to keep a copy of
  // its model (ServerControlRequest.keep_model_copy); the job's save then
  // writes that copy if the job stopped early. Call it periodically, as
  // MaybeCheckpoint, from a thread that may block on RPCs.
  void MaybeKeepModelCopy();
  // The job's progress line (FormatProgress: the current epoch's share of
  // work units done, the job's, and ETAs at the rate units were done since
  // the first call that saw the job running), once every
  // training.progress_interval_s on the injected clock while the job
  // runs; nullopt otherwise. Call periodically.
  std::optional<std::string> MaybeProgress();

 private:
  struct Node {
    proto::NodeInfo info;
    absl::Time last_seen;  // last heartbeat, or when it was told the view
    std::string dead_why;  // a worker declared dead: why (its heartbeats')
    // A worker: when a server last reported it closed a data-plane
    // connection (HeartbeatRequest.workers_gone), and which server.
    absl::Time gone_at = absl::InfinitePast();
    int gone_server = -1;
    // Its sessions with the scheduler now open, and when the last one
    // closed (OpenSession / CloseSession).
    int sessions = 0;
    absl::Time session_closed_at = absl::InfinitePast();
    // Answered a heartbeat with `shutdown` (EndSeenByAll); opened a session
    // at least once.
    bool told_shutdown = false;
    bool had_session = false;
    // Its last session closed since it was last heard from, and none is
    // open: its process is likely gone.
    bool SessionLost() const {
      return sessions == 0 && session_closed_at > last_seen;
    }
  };
  struct WorkerResult {
    proto::WorkerDoneRequest done;
  };

  void BuildViewLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Reassign of the current view over the servers `live` at epoch + 1,
  // with the members still copying and the servers being drained.
  absl::StatusOr<proto::RoutingTable> ReassignLocked(
      const std::vector<bool>& live) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Probes server `id` (a thread of its own); fails it over when it does
  // not answer.
  void Probe(int id, std::string address);
  // Starts Probe(id) on a thread of its own, logging "`what`: probing it",
  // unless `id` is being probed already.
  void StartProbeLocked(int id, const std::string& what)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Probes server `id`, which FailoverServers waits for (irreplaceable_),
  // every heartbeat period until it is heard from again, fails, or is
  // found gone (a refused connection: failed over at once). One thread per
  // such server (probing_), however long the wait.
  void WatchIrreplaceable(int id, std::string address);
  // For a server that answered its probe: what its accusers' reports mean.
  // `server_why` non-empty: it is to be failed over all the same (reported
  // silent for heartbeat_timeout_ms, within the last 3 x SuspectAfter(), by
  // two nodes or by the only live worker; or for twice that by one primary
  // alone, whose backup it is; see GetView). `worker` >= 0: one
  // worker alone has heard nothing from it for twice that, while the other
  // live workers name it not at all: that worker is the one cut off, and
  // is dropped (work units on) for `worker_why`. Takes mu_.
  // `status`: the probe's answer. Its replication_waiting_ms: a primary
  // waiting that long on a backup is silent to its workers because of the
  // backup (not failed over on their word).
  struct Unreachable {
    std::string server_why;
    int worker = -1;
    std::string worker_why;
  };
  Unreachable UnreachableFrom(int id, const proto::ServerStatus& status);
  // Starts silence_epoch_since_ when the view's epoch is new to it.
  void NoteViewForSilenceLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // OK when the server at `address` answers a status call (two tries of
  // fault_tolerance.probe_timeout_ms; an error answer counts), else the
  // last UNAVAILABLE/DEADLINE_EXCEEDED. When it answered its status and
  // `status` is given, sets it to that status. Without mu_.
  absl::Status ProbeServer(const std::string& address,
                           proto::ServerStatus* status = nullptr);
  // ---- elasticity (issue 9)
  // Range -> its new chain (owner, then backups), planned from the current
  // routing under mu_.
  using MovePlan = std::map<int, std::vector<int>>;
  struct MoveResult {
    int moved = 0;               // ranges given their new chain
    std::vector<int> not_moved;  // planned ranges left as they were
    int64_t epoch = 0;           // the view that moved them
  };
  // The paper's two-stage move, make-before-break. Stage 1: a view in
  // which each member of a range's new chain that is not in its chain yet
  // (a new owner, a new backup) is one more backup; the primary copies the
  // range to it in the background while it keeps serving, and from then on
  // replicates every input to it synchronously. When every new member holds
  // a synced copy (its primary's status says so), stage 2: a view with the
  // new chains, so a range never has fewer complete replicas than before. The old owner
  // fails what it had not yet replicated with STALE_EPOCH, and the
  // workers resend it to the new owner (dedup by seq). Takes
  // membership_mu_, and view_change_mu_ for each view.
  absl::StatusOr<MoveResult> MoveRanges(
      const std::function<MovePlan(const proto::RoutingTable&)>& plan,
      const std::string& what);
  // A server that joined the running job takes an even share of the
  // ranges (a thread of its own).
  void Rebalance(int joiner);
  // A worker that joined the running job (issue 9; a thread of its own):
  // tells the servers (each adds it to its ranges at the range's frontier
  // and answers with that clock), then fixes its start clock at the
  // highest of them and publishes it. `units`: work units it was dealt.
  void JoinWorker(int id, int units, absl::Time since);
  // Per range of the current view: its live chain members holding a
  // complete copy (not in copying_).
  std::vector<int> SyncedMembersLocked() const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // Ranges owned per server in `t` (index: server id).
  std::vector<int> OwnedCountsLocked(const proto::RoutingTable& t) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_);
  bool AliveServerLocked(int id) const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // Chain members of a range still waiting for their copy (issue 9): a
  // failover never promotes one. Records the members `after` adds to each
  // range's chain (and forgets those it drops); they are forgotten too once
  // their primary's status or their own heartbeat says they hold the copy.
  void NoteChainsLocked(const proto::RoutingTable& before,
                        const proto::RoutingTable& after)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The report's "membership" entries.
  void MembershipReportLocked(proto::JobReport* report) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // The report's "failovers" entries.
  void FailoverReportLocked(proto::JobReport* report) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_);
  proto::JobReport ReportLocked() const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  std::string ReportJsonLocked() const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  Node* FindLocked(proto::Role role, int id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Sends `view` to every server, each retried until view_deadline; the
  // first server that cannot be told fails the job. With replication, a
  // server not told within a second that does not answer a probe either is
  // skipped and failed over instead (issue 9: a second server dying during
  // a failover or a range move). Called without mu_.
  // `replies`, when given, gets the answer of every server told.
  absl::Status BroadcastView(
      const proto::ClusterView& view,
      std::vector<proto::ServerControlResponse>* replies = nullptr);
  // Calls `call(attempt_deadline)` until it succeeds, fails with a code
  // that a retry cannot fix, or `deadline` passes (backoff on the clock).
  // `gone_server` >= 0: that server's; an UNAVAILABLE is not retried once
  // its session with the scheduler closed after its last heartbeat and
  // none is open (its process is likely gone: the caller probes it).
  absl::StatusOr<proto::ServerControlResponse> ControlWithRetry(
      const std::string& address, const proto::ServerControlRequest& req,
      absl::Time deadline, int gone_server = -1);
  // Saves the model on every server and ends the job (without mu_).
  void Finalize();
  // ---- work units and worker failure (issue 9)
  // Marks `ids` NODE_DEAD, hands their units back, and tells the servers
  // (a new view); fails the job when no worker is left. `why`: for the log
  // and for the dropped worker's heartbeats. Without mu_.
  void DropDeadWorkers(const std::vector<int>& ids, const std::string& why);
  // Whether every worker that is not dead has reported WorkerDone; sets
  // finalizing_ (the caller then calls Finalize) the first time it is.
  bool StartFinalizingLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The lowest last-reported clock of the live workers other than `worker`
  // that are still training (NODE_ALIVE); -1 when there is none.
  int64_t OthersMinClockLocked(int worker) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // Whether the job has a test set to evaluate.
  bool HasTestSet() const;
  // Scheduler restart: saves the state (scheduler/state_file.h) when
  // options.state_path is set and the cluster is ready; a
  // failure is logged (the job goes on, without a restartable scheduler).
  void SaveStateLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Ends the job with `status` (done when OK, failed otherwise), writes the
  // report; the first call wins. Called without mu_.
  void Conclude(absl::Status status);
  // Server `old` (declared dead) joined again as S[`now`]: its failover
  // record says so (the job report's `rejoined_as`).
  void NoteRejoinLocked(int old, int now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A server's first push acknowledged under `epoch` at `unix_ms` (from a
  // heartbeat or its save_and_exit answer): the recovery time of the
  // failovers up to that epoch that have none yet, or an earlier one.
  void NoteFirstAckLocked(int64_t epoch, int64_t unix_ms)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const SchedulerOptions options_;
  const std::string config_yaml_;
  const absl::Time start_;

  // Held across a whole range move (MoveRanges: a join's rebalance, a
  // drain), so moves do not interleave. Taken before view_change_mu_.
  absl::Mutex membership_mu_;
  // Held across a whole view change (SetConsistency), so servers are told
  // epochs in order. Taken before mu_, never while holding it.
  absl::Mutex view_change_mu_;

  mutable absl::Mutex mu_;
  std::vector<Node> servers_ ABSL_GUARDED_BY(mu_);
  std::vector<Node> workers_ ABSL_GUARDED_BY(mu_);
  JobPhase phase_ ABSL_GUARDED_BY(mu_) = JobPhase::kRegistering;
  JobPhase failed_in_ ABSL_GUARDED_BY(mu_) = JobPhase::kRegistering;
  bool ready_ ABSL_GUARDED_BY(mu_) = false;
  absl::Time ready_time_ ABSL_GUARDED_BY(mu_);
  proto::ClusterView view_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, std::set<int>> barriers_ ABSL_GUARDED_BY(mu_);
  std::map<int, proto::WorkerDoneRequest> done_ ABSL_GUARDED_BY(mu_);
  std::vector<proto::ServerControlResponse> models_ ABSL_GUARDED_BY(mu_);
  bool finalizing_ ABSL_GUARDED_BY(mu_) = false;
  // Work units (issue 9), for every model (the mlp workers read their units
  // as field rows). Made by the constructor: never null.
  std::unique_ptr<WorkQueue> work_ ABSL_GUARDED_BY(mu_);
  int evaluator_ ABSL_GUARDED_BY(mu_) = -1;  // told to evaluate; -1: none
  std::vector<int> dead_workers_ ABSL_GUARDED_BY(mu_);  // in order of death
  bool concluding_ ABSL_GUARDED_BY(mu_) = false;  // Conclude() has begun
  bool ended_ ABSL_GUARDED_BY(mu_) = false;       // ... and the report is out
  // The last Status call, and whether one was answered with the end.
  absl::Time last_status_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  bool end_status_served_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status end_status_ ABSL_GUARDED_BY(mu_);
  absl::Time end_time_ ABSL_GUARDED_BY(mu_);

  // Replication and failover (issue 9).
  int replicas_ ABSL_GUARDED_BY(mu_) = 0;
  proto::RoutingTable ring_ ABSL_GUARDED_BY(mu_);  // the first view's
  struct Failover {
    int server = -1;
    int64_t epoch = 0;           // the view that failed it over
    int64_t last_seen_ms = 0;    // its last heartbeat (Unix ms)
    int64_t detected_ms = 0;     // declared dead
    int64_t first_ack_ms = 0;    // first push acked under `epoch`; 0: none yet
    std::string why;
    int rejoined_as = -1;  // the same process joined again as this server
  };
  std::vector<Failover> failovers_ ABSL_GUARDED_BY(mu_);
  std::set<int> probing_ ABSL_GUARDED_BY(mu_);
  // Servers that look dead but whose failover would lose data, and since
  // when they are waited for (FailoverServers).
  std::map<int, absl::Time> irreplaceable_ ABSL_GUARDED_BY(mu_);
  // Who named a server as a suspect and reported it silent (a partial
  // network partition: the scheduler reaches it, they do not): by node
  // ("W[0]"), when it last named it and how long it had then heard nothing
  // from it. See UnreachableFrom.
  struct Accusation {
    struct Report {
      absl::Time when;
      absl::Duration silent;
      proto::Role role;
      int id;
    };
    std::map<std::string, Report> by;
    bool warned = false;  // logged that one node alone names it
  };
  std::map<int, Accusation> accused_ ABSL_GUARDED_BY(mu_);
  // The view epoch UnreachableFrom last saw, and since when (about when it
  // was published: GetView and UnreachableFrom look at every naming).
  int64_t silence_epoch_ ABSL_GUARDED_BY(mu_) = -1;
  absl::Time silence_epoch_since_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  // Every live node went silent at once (CheckHeartbeats): none is
  // declared dead until one is heard from again.
  bool isolated_ ABSL_GUARDED_BY(mu_) = false;
  // When a live node's heartbeat last arrived (any node's).
  absl::Time last_heartbeat_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  // No node's heartbeat deadline runs from before this time: set when a
  // restarted scheduler starts listening (NoteListening) and when
  // CheckHeartbeats waited long for mu_ (heartbeats waited too). Nodes'
  // last_seen stay what they were (failover records time from them).
  absl::Time deadline_floor_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  // Probes and rebalances (joined by the destructor).
  std::vector<std::thread> probes_ ABSL_GUARDED_BY(mu_);
  // Elasticity (issue 9): joins and drains, for the report.
  struct MembershipChange {
    std::string event;  // "joined", "drained"
    int server = -1;    // the node's id (a worker's when `worker`)
    bool worker = false;
    int64_t start_clock = 0;  // a joined worker's first clock
    int64_t epoch = 0;  // the view that completed it
    int ranges = 0;     // ranges moved to (joined) or off (drained) it;
                        // a joined worker: the work units it was dealt
    double seconds = 0;
    std::string error;  // why it did not complete; empty: it did
  };
  std::vector<MembershipChange> membership_ ABSL_GUARDED_BY(mu_);
  // (range, server) -> the view epoch that added the server to the range's
  // chain, while it has no complete copy (NoteChainsLocked).
  std::map<std::pair<int, int>, int64_t> copying_ ABSL_GUARDED_BY(mu_);
  // Server moves in progress (state file: a restarted scheduler finishes
  // them): servers being drained, joiners taking their share.
  std::set<int> draining_ ABSL_GUARDED_BY(mu_);
  std::set<int> rebalancing_ ABSL_GUARDED_BY(mu_);
  bool closing_ ABSL_GUARDED_BY(mu_) = false;
  int restarts_ ABSL_GUARDED_BY(mu_) = 0;  // scheduler restarts so far
  // Work units done before the checkpoint this job restored (issue 9).
  int64_t resumed_units_ ABSL_GUARDED_BY(mu_) = 0;
  bool state_error_logged_ ABSL_GUARDED_BY(mu_) = false;
  // The state file, opened by the first save (null without state_path).
  std::unique_ptr<StateFile> state_file_ ABSL_GUARDED_BY(mu_);
  // A save not fsynced yet (SaveStateLocked leaves it to SyncState).
  bool state_unsynced_ ABSL_GUARDED_BY(mu_) = false;

  // Checkpoints (issue 9). checkpoint_mu_ is held across one checkpoint,
  // taken before mu_, never while holding it.
  struct CheckpointRecord {
    proto::CheckpointResponse resp;
    double seconds = 0;  // since the cluster became ready
  };
  // The report's restored_from, resumed_units, checkpoints and
  // checkpoint_error.
  void CheckpointReportLocked(proto::JobReport* report) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // ControlWithRetry for a checkpoint command, given up once the job is no
  // longer running (FAILED_PRECONDITION) instead of at `deadline` only.
  absl::StatusOr<proto::ServerControlResponse> CheckpointCall(
      const std::string& address, const proto::ServerControlRequest& req,
      absl::Time deadline);
  absl::Mutex checkpoint_mu_;
  int64_t next_checkpoint_id_ ABSL_GUARDED_BY(mu_) = 0;  // 0: not scanned
  // MaybeProgress: the first sample while running, and the last line's time.
  std::optional<std::pair<absl::Time, int64_t>> progress_base_
      ABSL_GUARDED_BY(mu_);
  // The report's "progress" curve: a point per progress line (at most
  // kMaxProgressPoints; past that every other one is dropped and points
  // are taken half as often).
  struct ProgressPoint {
    double seconds = 0;  // since the cluster became ready
    int64_t examples = 0;
    double train_loss = 0;  // mean over the examples since the last point
    int epoch = 0;          // 0-based, the lowest epoch not done
  };
  // Issue 12: the validation split's evaluations at each epoch start (worker
  // heartbeats; at most one per epoch), and early stopping by them.
  struct ValidationPoint {
    int epoch = 0;  // evaluated after this many epochs
    double auc = 0, logloss = 0;
    int64_t rows = 0;
    double seconds = 0;  // since the cluster became ready
  };
  std::vector<ValidationPoint> validation_points_ ABSL_GUARDED_BY(mu_);
  int validation_best_ ABSL_GUARDED_BY(mu_) = -1;  // its index; -1: none
  // Epochs trained when early stopping ended the job's data; 0: it did not.
  int stopped_early_after_ ABSL_GUARDED_BY(mu_) = 0;
  // With early stopping, the servers keep a copy of the model at each new
  // best (MaybeKeepModelCopy): the epoch wanted (0: none), the epoch of
  // the copy every live server kept (0: none), and the epoch of the copy
  // saved in <model_dir>/best (0: none).
  int copy_wanted_ ABSL_GUARDED_BY(mu_) = 0;
  int copy_kept_ ABSL_GUARDED_BY(mu_) = 0;
  int best_model_epoch_ ABSL_GUARDED_BY(mu_) = 0;
  void NoteValidationLocked(const proto::HeartbeatRequest& req)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The report's validation_* keys (none without a validation split).
  void ValidationReportLocked(const proto::WorkerDoneRequest* eval,
                              proto::JobReport* report) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_);
  static constexpr size_t kMaxProgressPoints = 2048;
  std::vector<ProgressPoint> progress_points_ ABSL_GUARDED_BY(mu_);
  int progress_stride_ ABSL_GUARDED_BY(mu_) = 1;
  int64_t progress_lines_ ABSL_GUARDED_BY(mu_) = 0;
  std::pair<int64_t, double> progress_last_ ABSL_GUARDED_BY(mu_);  // sums
  void ProgressReportLocked(proto::JobReport* report) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // One point of the curve: the loss of the examples since the previous
  // point, every progress_stride_-th call (or `last`: training ended).
  void AddProgressPointLocked(absl::Time now, int epoch, bool last = false)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Time last_progress_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  absl::Time last_interval_checkpoint_ ABSL_GUARDED_BY(mu_) =
      absl::InfinitePast();
  std::vector<CheckpointRecord> checkpoints_ ABSL_GUARDED_BY(mu_);
  std::string checkpoint_error_ ABSL_GUARDED_BY(mu_);
};

// Checkpoints (issue 9): the checkpoint a job starts from, by its config:
// fault_tolerance.restore_from (verified), or with fault_tolerance.resume
// the newest complete checkpoint in the checkpoint dir (verified; none
// there: "" and a warning), else "". NOT_FOUND when restore_from is not a
// checkpoint, DATA_LOSS naming the file when a file of it is corrupt.
absl::StatusOr<std::string> ResolveRestore(const JobConfig& config);

// Parses the consistency section into its wire form.
proto::ConsistencyConfig ToProto(const ConsistencyConfig& c);

}  // namespace ps
