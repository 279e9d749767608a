// Scheduler restart (issue 9, docs/fault_tolerance.md): the scheduler's
// state file (scheduler/state_file.h). Saved after every change that
// matters once the job runs; a scheduler started again with the same config
// and state file takes the job over, and the servers and workers (which
// ride out a short outage: heartbeats and GetWork are retried) go on with
// it.
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "scheduler/scheduler.h"

namespace ps {

void SchedulerCore::SaveStateLocked() {
  if (options_.state_path.empty() || !ready_) return;
  proto::SchedulerState st;
  st.set_version(1);
  st.set_config_yaml(config_yaml_);
  st.set_phase(JobPhaseName(phase_));
  *st.mutable_view() = view_;
  *st.mutable_ring() = ring_;
  st.set_replicas(replicas_);
  for (const Node& n : servers_) *st.add_servers() = n.info;
  for (const Node& n : workers_) *st.add_workers() = n.info;
  work_->SaveTo(st.mutable_work());
  for (const auto& [id, d] : done_) *st.add_done() = d;
  st.mutable_dead_workers()->Add(dead_workers_.begin(), dead_workers_.end());
  st.set_evaluator(evaluator_);
  st.set_ready_unix_ms(absl::ToUnixMillis(ready_time_));
  st.set_next_checkpoint_id(next_checkpoint_id_);
  st.set_restarts(restarts_);
  for (const Failover& f : failovers_) {
    proto::SchedulerState::FailoverRecord* o = st.add_failovers();
    o->set_server(f.server);
    o->set_epoch(f.epoch);
    o->set_last_seen_ms(f.last_seen_ms);
    o->set_detected_ms(f.detected_ms);
    o->set_first_ack_ms(f.first_ack_ms);
    o->set_why(f.why);
    if (f.rejoined_as >= 0) o->set_rejoined_as(f.rejoined_as);
  }
  for (const MembershipChange& m : membership_) {
    proto::SchedulerState::MembershipRecord* o = st.add_membership();
    o->set_event(m.event);
    o->set_server(m.server);
    o->set_epoch(m.epoch);
    o->set_ranges(m.ranges);
    o->set_seconds(m.seconds);
    o->set_error(m.error);
    o->set_worker(m.worker);
    o->set_start_clock(m.start_clock);
  }
  for (const auto& [key, epoch] : copying_) {
    proto::SchedulerState::CopyingRecord* o = st.add_copying();
    o->set_range(key.first);
    o->set_server(key.second);
    o->set_epoch(epoch);
  }
  st.mutable_draining()->Add(draining_.begin(), draining_.end());
  st.mutable_rebalancing()->Add(rebalancing_.begin(), rebalancing_.end());
  // Every change is saved (a pwrite into the file's older slot), so a
  // scheduler that is killed and restarted finds the last state. While the
  // job runs, the fsync is left to SyncState (at most one per
  // kStateSyncInterval, outside mu_): a GetWork saves, and an fsync per unit
  // cost more CPU (a VM's disk exits) than the rest of the scheduler; and
  // an fsync under mu_ made heartbeats wait on the disk, which on a busy
  // one took seconds (a worker was declared dead by the check that got mu_
  // first). What this risks is only a crash of the machine's kernel, which
  // can lose that interval's changes (units handed out again). The other
  // phases' few saves are synced here.
  const bool sync = phase_ != JobPhase::kRunning;
  if (state_file_ == nullptr) {
    state_file_ = std::make_unique<StateFile>(options_.state_path);
  }
  absl::Status s = state_file_->Write(st.SerializeAsString(), sync);
  state_unsynced_ = !sync;
  if (!s.ok() && !state_error_logged_) {
    state_error_logged_ = true;
    PS_LOG_ERROR("scheduler state file: {} (a restarted scheduler could not "
                 "take this job over)",
                 s.ToString());
  }
}

void SchedulerCore::NoteListening() {
  absl::MutexLock l(&mu_);
  deadline_floor_ = std::max(deadline_floor_,
                             options_.clock->Now() + kReconnectGrace);
}

void SchedulerCore::SyncState() {
  int fd = -1;
  {
    absl::MutexLock l(&mu_);
    if (!state_unsynced_ || state_file_ == nullptr) return;
    state_unsynced_ = false;
    fd = state_file_->DupForSync();
  }
  if (fd < 0) return;
  if (::fdatasync(fd) != 0) {
    PS_LOG_WARN("scheduler state file {}: cannot fsync: {}",
                options_.state_path, std::strerror(errno));
  }
  ::close(fd);
}

absl::StatusOr<bool> SchedulerCore::RestoreState() {
  const std::string& path = options_.state_path;
  if (path.empty()) return false;
  absl::StatusOr<std::string> bytes = StateFile::Read(path);
  if (absl::IsNotFound(bytes.status())) return false;
  if (!bytes.ok()) return bytes.status();
  proto::SchedulerState st;
  if (!st.ParseFromString(*bytes) || st.version() != 1) {
    return absl::DataLossError(absl::StrCat(
        "scheduler state ", path, " is malformed (not a version 1 state)"));
  }
  if (st.phase() != JobPhaseName(JobPhase::kRunning) &&
      st.phase() != JobPhaseName(JobPhase::kFinishing)) {
    // A job that ended (or never ran): nothing to take over; this one starts
    // afresh and overwrites the file once it runs.
    PS_LOG_INFO("scheduler state {} is of a job that is {}: starting afresh",
                path, st.phase());
    return false;
  }
  if (st.config_yaml() != config_yaml_) {
    return absl::FailedPreconditionError(absl::StrCat(
        "scheduler state ", path, " belongs to a running job with another "
        "config; remove it to start this job afresh"));
  }
  absl::MutexLock l(&mu_);
  const absl::Time now = options_.clock->Now();
  std::vector<Node> servers(st.servers_size()), workers(st.workers_size());
  for (int i = 0; i < st.servers_size(); ++i) {
    servers[i].info = st.servers(i);
    servers[i].last_seen = now;  // the deadline starts now
  }
  for (int i = 0; i < st.workers_size(); ++i) {
    workers[i].info = st.workers(i);
    workers[i].last_seen = now;
  }
  if (absl::Status s = work_->RestoreFrom(st.work()); !s.ok()) {
    return absl::DataLossError(
        absl::StrCat("scheduler state ", path, ": ", s.message()));
  }
  servers_ = std::move(servers);
  workers_ = std::move(workers);
  view_ = st.view();
  ring_ = st.ring();
  replicas_ = st.replicas();
  done_.clear();
  for (const proto::WorkerDoneRequest& d : st.done()) done_[d.worker_id()] = d;
  dead_workers_.assign(st.dead_workers().begin(), st.dead_workers().end());
  evaluator_ = st.evaluator();
  ready_ = true;
  ready_time_ = absl::FromUnixMillis(st.ready_unix_ms());
  next_checkpoint_id_ = st.next_checkpoint_id();
  restarts_ = st.restarts() + 1;
  failovers_.clear();
  for (const proto::SchedulerState::FailoverRecord& o : st.failovers()) {
    Failover f;
    f.server = o.server();
    f.epoch = o.epoch();
    f.last_seen_ms = o.last_seen_ms();
    f.detected_ms = o.detected_ms();
    f.first_ack_ms = o.first_ack_ms();
    f.why = o.why();
    if (o.has_rejoined_as()) f.rejoined_as = o.rejoined_as();
    failovers_.push_back(std::move(f));
  }
  draining_ = std::set<int>(st.draining().begin(), st.draining().end());
  rebalancing_ =
      std::set<int>(st.rebalancing().begin(), st.rebalancing().end());
  copying_.clear();
  for (const proto::SchedulerState::CopyingRecord& o : st.copying()) {
    copying_[{o.range(), o.server()}] = o.epoch();
  }
  membership_.clear();
  for (const proto::SchedulerState::MembershipRecord& o : st.membership()) {
    MembershipChange m;
    m.event = o.event();
    m.server = o.server();
    m.epoch = o.epoch();
    m.ranges = o.ranges();
    m.seconds = o.seconds();
    m.error = o.error();
    m.worker = o.worker();
    m.start_clock = o.start_clock();
    membership_.push_back(std::move(m));
  }
  phase_ = JobPhase::kRunning;  // ResumeAfterRestore finishes a finalize
  finalizing_ = false;
  PS_LOG_WARN("took over the running job from {} (restart {}): view epoch "
              "{}, {} servers, {} workers, {} workers done",
              path, restarts_, view_.epoch(), servers_.size(), workers_.size(),
              done_.size());
  SaveStateLocked();
  return true;
}

void SchedulerCore::ResumeAfterRestore() {
  {
    absl::MutexLock l(&mu_);
    // A worker whose join the previous scheduler had not finished: its
    // start clock is fixed now (the servers answer again, idempotently).
    for (const Node& w : workers_) {
      if (w.info.joining() && w.info.state() == proto::NODE_ALIVE) {
        probes_.emplace_back(&SchedulerCore::JoinWorker, this, w.info.id(), 0,
                             options_.clock->Now());
      }
    }
    // Server moves the previous scheduler had not finished: planned again
    // from the current view (a stage-1 view's new members are already in
    // their chains; those holding their copy count as synced).
    for (int s : rebalancing_) {
      if (!AliveServerLocked(s)) continue;
      PS_LOG_INFO("S[{}] joined before the restart: moving its share of the "
                  "ranges to it",
                  s);
      probes_.emplace_back(&SchedulerCore::Rebalance, this, s);
    }
    for (int s : draining_) {
      if (!AliveServerLocked(s)) continue;
      PS_LOG_INFO("S[{}] was being drained before the restart: draining it",
                  s);
      probes_.emplace_back([this, s] {
        proto::DrainRequest d;
        d.set_server(s);
        absl::StatusOr<proto::DrainResponse> r = Drain(d);
        if (!r.ok()) {
          PS_LOG_WARN("resumed drain of S[{}]: {}", s, r.status().ToString());
        }
      });
    }
    // The previous scheduler may have died while the model was being saved
    // (every worker done): save it again (each save overwrites its files).
    if (!StartFinalizingLocked()) return;
    SaveStateLocked();
  }
  Finalize();
}

}  // namespace ps
