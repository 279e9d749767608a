// Elasticity (issue 9, docs/fault_tolerance.md): servers joining a running
// job and servers drained out of it, both by moving key ranges with the
// paper's two-stage copy (SchedulerCore::MoveRanges).
#include <algorithm>
#include <set>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/logging.h"
#include "common/routing.h"
#include "common/status_macros.h"
#include "scheduler/scheduler.h"
#include "transport/errors.h"

namespace ps {
namespace {

constexpr absl::Duration kSyncPoll = absl::Milliseconds(20);
// Moves one drain tries before it gives up (each after the previous one
// left ranges behind because a member of their new chain died).
constexpr int kDrainRounds = 3;

// Range `r`'s chain in `t`: its owner, then its backups (none of them -1).
std::vector<int> ChainOf(const proto::RoutingTable& t, int r) {
  std::vector<int> c{t.range_server(r)};
  for (int i = 0; i < t.replicas(); ++i) {
    const int b = t.range_backup(r * t.replicas() + i);
    if (b >= 0 && std::find(c.begin(), c.end(), b) == c.end()) c.push_back(b);
  }
  return c;
}

// Gives every range of `t` its chain: chains[r][0] owns it, the next
// `replicas` members back it up (-1 where there are fewer; more are cut).
void SetChains(proto::RoutingTable* t,
               const std::vector<std::vector<int>>& chains, int replicas) {
  t->clear_range_backup();
  t->set_replicas(replicas);
  for (size_t r = 0; r < chains.size(); ++r) {
    t->set_range_server(static_cast<int>(r), chains[r][0]);
    for (int i = 0; i < replicas; ++i) {
      const size_t at = static_cast<size_t>(i) + 1;
      t->add_range_backup(at < chains[r].size() ? chains[r][at] : -1);
    }
  }
}

bool Contains(const std::vector<int>& v, int x) {
  return std::find(v.begin(), v.end(), x) != v.end();
}

}  // namespace

bool SchedulerCore::AliveServerLocked(int id) const {
  return id >= 0 && id < static_cast<int>(servers_.size()) &&
         servers_[id].info.state() == proto::NODE_ALIVE;
}

void SchedulerCore::NoteChainsLocked(const proto::RoutingTable& before,
                                     const proto::RoutingTable& after) {
  for (int r = 0; r < after.range_server_size(); ++r) {
    const std::vector<int> now = ChainOf(after, r);
    const std::vector<int> was = r < before.range_server_size()
                                     ? ChainOf(before, r)
                                     : std::vector<int>{};
    for (int s : now) {
      if (!Contains(was, s)) copying_[{r, s}] = after.epoch();
    }
  }
  for (auto it = copying_.begin(); it != copying_.end();) {
    const auto [r, s] = it->first;
    if (r >= after.range_server_size() || !Contains(ChainOf(after, r), s)) {
      it = copying_.erase(it);
    } else {
      ++it;
    }
  }
}

bool SchedulerCore::MembershipSettled() const {
  absl::MutexLock l(&mu_);
  if (!draining_.empty() || !rebalancing_.empty() || !copying_.empty()) {
    return false;
  }
  const proto::RoutingTable& t = view_.routing();
  for (int r = 0; r < t.range_server_size(); ++r) {
    const std::vector<int> chain = ChainOf(t, r);
    if (static_cast<int>(chain.size()) != 1 + replicas_) return false;
    for (int s : chain) {
      if (!AliveServerLocked(s)) return false;
    }
  }
  return true;
}

std::vector<int> SchedulerCore::SyncedMembersLocked() const {
  const proto::RoutingTable& t = view_.routing();
  std::vector<int> synced(static_cast<size_t>(t.range_server_size()), 0);
  for (int r = 0; r < t.range_server_size(); ++r) {
    for (int s : ChainOf(t, r)) {
      if (AliveServerLocked(s) && !copying_.contains({r, s})) ++synced[r];
    }
  }
  return synced;
}

int SchedulerCore::FewestSyncedMembers() const {
  absl::MutexLock l(&mu_);
  const std::vector<int> synced = SyncedMembersLocked();
  return synced.empty() ? 0 : *std::min_element(synced.begin(), synced.end());
}

std::vector<int> SchedulerCore::OwnedCountsLocked(
    const proto::RoutingTable& t) const {
  std::vector<int> n(servers_.size(), 0);
  for (int s : t.range_server()) {
    if (s >= 0 && s < static_cast<int>(n.size())) ++n[s];
  }
  return n;
}

absl::StatusOr<SchedulerCore::MoveResult> SchedulerCore::MoveRanges(
    const std::function<MovePlan(const proto::RoutingTable&)>& plan_fn,
    const std::string& what) {
  absl::MutexLock moving(&membership_mu_);
  Clock* clock = options_.clock;
  MovePlan plan;
  // Stage 1: each member of a range's new chain that is not in its chain
  // yet becomes one more backup; its primary copies the range to it.
  std::set<std::pair<int, int>> pending;  // (range, new member)
  {
    absl::MutexLock change(&view_change_mu_);
    proto::ClusterView view;
    {
      absl::MutexLock l(&mu_);
      if (phase_ != JobPhase::kRunning || finalizing_ || concluding_ ||
          closing_) {
        return absl::FailedPreconditionError(absl::StrCat(
            what, ": the job is ", JobPhaseName(phase_),
            finalizing_ ? " (saving the model)" : ""));
      }
      const proto::RoutingTable& cur = view_.routing();
      plan = plan_fn(cur);
      const int num_ranges = cur.range_server_size();
      std::vector<std::vector<int>> chains(num_ranges);
      for (int r = 0; r < num_ranges; ++r) chains[r] = ChainOf(cur, r);
      int width = replicas_;
      bool grown = false;
      for (const auto& [r, target] : plan) {
        for (int s : target) {
          if (Contains(chains[r], s)) {
            // Already a member; one still receiving its copy must finish
            // before the range relies on it.
            if (copying_.contains({r, s})) pending.insert({r, s});
            continue;
          }
          chains[r].push_back(s);
          pending.insert({r, s});
          grown = true;
        }
        width = std::max(width, static_cast<int>(chains[r].size()) - 1);
      }
      if (grown) {
        view_.set_epoch(view_.epoch() + 1);
        proto::RoutingTable* t = view_.mutable_routing();
        const proto::RoutingTable before = *t;
        SetChains(t, chains, width);
        t->set_epoch(view_.epoch());
        NoteChainsLocked(before, *t);
        view = view_;
        SaveStateLocked();
      }
    }
    if (view.epoch() > 0) {
      PS_LOG_INFO("{}: view epoch {} copies {} range(s) to their new members",
                  what, view.epoch(), pending.size());
      PS_RETURN_IF_ERROR(BroadcastView(view));
    }
  }
  // Wait until every new member holds a synced copy, as its range's current
  // primary reports.
  const absl::Time deadline = clock->Now() + options_.view_deadline;
  while (!pending.empty()) {
    std::map<std::string, std::vector<int>> by_owner;  // address -> ranges
    {
      absl::MutexLock l(&mu_);
      if (concluding_ || closing_) {
        return absl::AbortedError(absl::StrCat(
            what, concluding_ ? ": the job ended" : ": the scheduler closes"));
      }
      for (const auto& [r, s] : pending) {
        const int owner = view_.routing().range_server(r);
        if (!AliveServerLocked(owner) || owner == s) {
          continue;  // failed over meanwhile (checked below)
        }
        by_owner[servers_[owner].info.address()].push_back(r);
      }
    }
    for (const auto& [address, ranges] : by_owner) {
      auto st = options_.clients->Server(address)->GetStatus(
          clock->Now() + absl::Seconds(2));
      if (!st.ok()) continue;
      absl::MutexLock l(&mu_);
      for (const proto::ServerStatus::Replica& rep : st->synced()) {
        if (pending.erase({rep.range(), rep.server()}) > 0) {
          copying_.erase({rep.range(), rep.server()});
        }
      }
    }
    {
      // Done: a member whose heartbeat said it holds the copy, or that a
      // failover made the owner (it promotes only whole copies). Given up:
      // one a failover dropped from the chain (stage 2 leaves its range).
      absl::MutexLock l(&mu_);
      for (auto it = pending.begin(); it != pending.end();) {
        const auto [r, s] = *it;
        if (!Contains(ChainOf(view_.routing(), r), s) ||
            !copying_.contains({r, s})) {
          it = pending.erase(it);
        } else {
          ++it;
        }
      }
    }
    if (pending.empty() || clock->Now() >= deadline) break;
    clock->SleepUntil(clock->Now() + kSyncPoll);
  }
  // Stage 2: the new chains, for what is still possible under the current
  // view (a failover may have changed it meanwhile).
  MoveResult result;
  proto::ClusterView view;
  {
    absl::MutexLock change(&view_change_mu_);
    {
      absl::MutexLock l(&mu_);
      if (concluding_ || closing_) {
        return absl::AbortedError(absl::StrCat(
            what, concluding_ ? ": the job ended" : ": the scheduler closes"));
      }
      const proto::RoutingTable& cur = view_.routing();
      const int num_ranges = cur.range_server_size();
      std::vector<std::vector<int>> chains(num_ranges);
      for (int r = 0; r < num_ranges; ++r) chains[r] = ChainOf(cur, r);
      for (const auto& [r, target] : plan) {
        bool ok = !target.empty();
        // Every member must be alive and still hold a complete copy (a
        // failover in between may have dropped one from the chain: its
        // copy is gone).
        for (int s : target) {
          ok = ok && AliveServerLocked(s) && Contains(chains[r], s) &&
               !copying_.contains({r, s});
        }
        if (!ok) {
          result.not_moved.push_back(r);
          continue;
        }
        chains[r] = target;
        ++result.moved;
      }
      view_.set_epoch(view_.epoch() + 1);
      proto::RoutingTable* t = view_.mutable_routing();
      const proto::RoutingTable before = *t;
      SetChains(t, chains, replicas_);
      t->set_epoch(view_.epoch());
      NoteChainsLocked(before, *t);
      for (proto::NodeInfo& si : *t->mutable_servers()) {
        if (si.id() >= 0 && si.id() < static_cast<int>(servers_.size())) {
          si.set_state(servers_[si.id()].info.state());
        }
      }
      view = view_;
      result.epoch = view_.epoch();
      SaveStateLocked();
    }
    PS_RETURN_IF_ERROR(BroadcastView(view));
  }
  PS_LOG_INFO("{}: view epoch {} moved {} range(s){}", what, result.epoch,
              result.moved,
              result.not_moved.empty()
                  ? std::string()
                  : absl::StrCat("; not moved (no synced copy in ",
                                 absl::FormatDuration(options_.view_deadline),
                                 "): ", absl::StrJoin(result.not_moved, ",")));
  return result;
}

void SchedulerCore::Rebalance(int joiner) {
  const absl::Time t0 = options_.clock->Now();
  const int replicas = [&] {
    absl::MutexLock l(&mu_);
    return replicas_;
  }();
  // The joiner takes ranges, one at a time from the server owning the most,
  // until it owns its even share (floor(ranges / live servers)). Its new
  // chain: the joiner, then the old chain (the old owner first).
  auto plan = [&](const proto::RoutingTable& cur)
                  ABSL_SHARED_LOCKS_REQUIRED(mu_) {
    MovePlan p;
    std::vector<int> owned = OwnedCountsLocked(cur);
    int live = 0;
    for (size_t s = 0; s < servers_.size(); ++s) {
      live += AliveServerLocked(static_cast<int>(s)) ? 1 : 0;
    }
    if (!AliveServerLocked(joiner) || live == 0) return p;
    const int share = cur.range_server_size() / live;
    std::vector<std::vector<int>> ranges_of(servers_.size());
    for (int r = 0; r < cur.range_server_size(); ++r) {
      const int s = cur.range_server(r);
      if (s >= 0 && s < static_cast<int>(ranges_of.size())) {
        ranges_of[s].push_back(r);
      }
    }
    while (owned[joiner] < share) {
      int from = -1;
      for (size_t s = 0; s < servers_.size(); ++s) {
        if (static_cast<int>(s) == joiner || ranges_of[s].empty()) continue;
        if (from < 0 || owned[s] > owned[from]) from = static_cast<int>(s);
      }
      if (from < 0 || owned[from] <= owned[joiner] + 1) break;
      const int r = ranges_of[from].back();
      ranges_of[from].pop_back();
      --owned[from];
      ++owned[joiner];
      std::vector<int> chain{joiner};
      for (int s : ChainOf(cur, r)) {
        if (s != joiner && static_cast<int>(chain.size()) < 1 + replicas) {
          chain.push_back(s);
        }
      }
      p[r] = std::move(chain);
    }
    return p;
  };
  absl::StatusOr<MoveResult> res =
      MoveRanges(plan, absl::StrCat("S[", joiner, "] joins"));
  absl::MutexLock l(&mu_);
  rebalancing_.erase(joiner);
  MembershipChange m;
  m.event = "joined";
  m.server = joiner;
  m.seconds = absl::ToDoubleSeconds(options_.clock->Now() - t0);
  if (res.ok()) {
    m.epoch = res->epoch;
    m.ranges = res->moved;
    if (!res->not_moved.empty()) {
      m.error = absl::StrCat(res->not_moved.size(),
                             " range(s) not moved: no synced copy in time");
    }
  } else {
    m.error = std::string(res.status().message());
    PS_LOG_WARN("S[{}] joined but took no ranges: {}", joiner,
                res.status().ToString());
  }
  membership_.push_back(std::move(m));
  SaveStateLocked();
}

void SchedulerCore::JoinWorker(int id, int units, absl::Time since) {
  absl::MutexLock change(&view_change_mu_);
  proto::ClusterView view;
  {
    absl::MutexLock l(&mu_);
    if (concluding_ || id < 0 || id >= static_cast<int>(workers_.size()) ||
        !workers_[id].info.joining()) {
      return;
    }
    view = view_;  // has W[id] joining (a later view does too)
  }
  // Stage 1: every server adds W[id] to the ranges it owns at the range's
  // frontier (the lowest clock of the live workers there), which W[id] now
  // holds back, and answers with the highest of them.
  std::vector<proto::ServerControlResponse> replies;
  if (!BroadcastView(view, &replies).ok()) return;  // the job failed
  int64_t start = 0;
  for (const proto::ServerControlResponse& r : replies) {
    auto it = r.join_clocks().find(id);
    if (it != r.join_clocks().end()) start = std::max(start, it->second);
  }
  // Stage 2: W[id] starts at that clock; the servers count the clocks
  // before it as done on every range.
  {
    absl::MutexLock l(&mu_);
    if (concluding_) return;
    Node& n = workers_[id];
    if (!n.info.joining()) return;
    n.info.set_joining(false);
    n.info.set_start_clock(start);
    n.info.set_clock(std::max(n.info.clock(), start));
    view_.set_epoch(view_.epoch() + 1);
    view_.mutable_routing()->set_epoch(view_.epoch());
    for (proto::NodeInfo& wi : *view_.mutable_workers()) {
      if (wi.id() != id) continue;
      wi.set_joining(false);
      wi.set_start_clock(start);
      wi.set_clock(n.info.clock());
    }
    MembershipChange m;
    m.event = "joined";
    m.server = id;
    m.worker = true;
    m.epoch = view_.epoch();
    m.ranges = units;
    m.start_clock = start;
    m.seconds = absl::ToDoubleSeconds(options_.clock->Now() - since);
    membership_.push_back(std::move(m));
    view = view_;
    SaveStateLocked();
  }
  PS_LOG_INFO("W[{}] starts at clock {}: view epoch {}", id, start,
              view.epoch());
  BroadcastView(view).IgnoreError();  // a failure ends the job, naming why
}

absl::StatusOr<proto::DrainResponse> SchedulerCore::Drain(
    const proto::DrainRequest& req) {
  const absl::Time t0 = options_.clock->Now();
  const int x = req.server();
  int replicas;
  {
    absl::MutexLock l(&mu_);
    if (x < 0 || x >= static_cast<int>(servers_.size())) {
      return absl::InvalidArgumentError(
          absl::StrCat("drain: no server S[", x, "]"));
    }
    if (phase_ != JobPhase::kRunning || finalizing_) {
      return absl::FailedPreconditionError(absl::StrCat(
          "drain: the job is ", JobPhaseName(phase_),
          finalizing_ ? " (saving the model)" : ""));
    }
    if (!AliveServerLocked(x)) {
      return absl::FailedPreconditionError(absl::StrCat(
          "drain: S[", x, "] is ", proto::NodeState_Name(
                                       servers_[x].info.state())));
    }
    int others = 0;
    for (size_t s = 0; s < servers_.size(); ++s) {
      if (static_cast<int>(s) != x && AliveServerLocked(static_cast<int>(s))) {
        ++others;
      }
    }
    if (others == 0) {
      return absl::FailedPreconditionError(absl::StrCat(
          "drain: S[", x, "] is the only live server"));
    }
    // A drain is the graceful way out: unless forced, it does not leave
    // the ranges with fewer copies than the job was configured to keep.
    // Servers being drained too are not counted as staying.
    int staying = 0;
    for (size_t s = 0; s < servers_.size(); ++s) {
      const int id = static_cast<int>(s);
      if (id != x && AliveServerLocked(id) && draining_.count(id) == 0) {
        ++staying;
      }
    }
    if (replicas_ > 0 && staying < 1 + replicas_ && !req.force()) {
      return ErrorWithReason(
          absl::StatusCode::kFailedPrecondition,
          proto::REASON_TOO_FEW_SERVERS,
          absl::StrCat(
          "drain: S[", x, "] would leave ", staying,
          " live server(s) not being drained, fewer than the ", 1 + replicas_,
          " that hold every key range's 1 + fault_tolerance.replicas copies; "
          "add a server first, or force the drain (ps_status --drain ", x,
          " --force) to run with fewer copies"));
    }
    replicas = replicas_;
    if (draining_.insert(x).second) SaveStateLocked();
  }
  // However the drain ends, it is no longer in progress.
  absl::Cleanup done = [&] {
    absl::MutexLock l(&mu_);
    if (draining_.erase(x) > 0) SaveStateLocked();
  };
  // Every range whose chain holds x: the chain without it (its first backup
  // takes over what it owned; a range without one goes to the live server
  // owning the fewest), refilled to 1 + replicas from the ring's preference
  // order, then any live server.
  auto plan = [&](const proto::RoutingTable& cur)
                  ABSL_SHARED_LOCKS_REQUIRED(mu_) {
    MovePlan p;
    std::vector<int> owned = OwnedCountsLocked(cur);
    for (int r = 0; r < cur.range_server_size(); ++r) {
      std::vector<int> chain = ChainOf(cur, r);
      if (!Contains(chain, x)) continue;
      std::vector<int> c;
      for (int s : chain) {
        if (s != x && AliveServerLocked(s)) c.push_back(s);
      }
      // Servers being drained too are taken only as the last resort: one
      // added back to a chain fails its own drain.
      auto leaving = [&](int s) ABSL_SHARED_LOCKS_REQUIRED(mu_) {
        return draining_.contains(s);
      };
      if (c.empty()) {
        int best = -1;
        for (size_t s = 0; s < servers_.size(); ++s) {
          const int id = static_cast<int>(s);
          if (id == x || !AliveServerLocked(id)) continue;
          if (best < 0 || std::make_pair(leaving(id), owned[id]) <
                              std::make_pair(leaving(best), owned[best])) {
            best = id;
          }
        }
        c.push_back(best);
        ++owned[best];
      }
      std::vector<int> candidates = PreferenceList(ring_, r);
      for (size_t s = 0; s < servers_.size(); ++s) {
        candidates.push_back(static_cast<int>(s));
      }
      for (const bool last_resort : {false, true}) {
        for (int s : candidates) {
          if (static_cast<int>(c.size()) >= 1 + replicas) break;
          if (s != x && AliveServerLocked(s) && leaving(s) == last_resort &&
              !Contains(c, s)) {
            c.push_back(s);
          }
        }
      }
      p[r] = std::move(c);
    }
    return p;
  };
  PS_ASSIGN_OR_RETURN(MoveResult res,
                      MoveRanges(plan, absl::StrCat("draining S[", x, "]")));
  // A server that died during the move (one the plan copied to) left some
  // ranges where they were: plan again from the view the failover made.
  for (int round = 1; round < kDrainRounds && !res.not_moved.empty();
       ++round) {
    PS_LOG_WARN("draining S[{}]: {} range(s) not moved (a member died "
                "meanwhile?); planning again from the current view",
                x, res.not_moved.size());
    PS_ASSIGN_OR_RETURN(
        MoveResult again,
        MoveRanges(plan, absl::StrCat("draining S[", x, "] (round ",
                                      round + 1, ")")));
    again.moved += res.moved;
    res = std::move(again);
  }
  absl::Status failed;
  proto::ClusterView view;
  {
    absl::MutexLock change(&view_change_mu_);
    {
      absl::MutexLock l(&mu_);
      std::vector<int> held;  // ranges whose chain holds x now
      for (int r = 0; r < view_.routing().range_server_size(); ++r) {
        if (Contains(ChainOf(view_.routing(), r), x)) held.push_back(r);
      }
      MembershipChange m;
      m.event = "drained";
      m.server = x;
      m.ranges = res.moved;
      m.seconds = absl::ToDoubleSeconds(options_.clock->Now() - t0);
      if (!res.not_moved.empty()) {
        failed = absl::AbortedError(absl::StrCat(
            "drain: S[", x, "] still holds range(s) ",
            absl::StrJoin(res.not_moved, ","),
            " (no synced copy on their new owner in time); it stays"));
        m.error = std::string(failed.message());
      } else if (!held.empty()) {
        failed = absl::AbortedError(absl::StrCat(
            "drain: S[", x, "] was added back to range(s) ",
            absl::StrJoin(held, ","),
            " by a change made meanwhile (no other live server to take "
            "them); it stays"));
        m.error = std::string(failed.message());
      } else if (AliveServerLocked(x)) {
        servers_[x].info.set_state(proto::NODE_LEFT);
        view_.set_epoch(view_.epoch() + 1);
        view_.mutable_routing()->set_epoch(view_.epoch());
        view_.mutable_routing()->mutable_servers(x)->set_state(
            proto::NODE_LEFT);
        view = view_;
        m.epoch = view_.epoch();
      } else {
        failed = absl::AbortedError(
            absl::StrCat("drain: S[", x, "] died while being drained"));
        m.error = std::string(failed.message());
      }
      membership_.push_back(std::move(m));
      SaveStateLocked();
    }
    if (!failed.ok()) return failed;
    PS_RETURN_IF_ERROR(BroadcastView(view));
  }
  PS_LOG_INFO("S[{}] drained: {} range(s) moved off it in {}; view epoch {}",
              x, res.moved, absl::FormatDuration(options_.clock->Now() - t0),
              view.epoch());
  proto::DrainResponse resp;
  resp.set_epoch(view.epoch());
  resp.set_ranges_moved(res.moved);
  resp.set_seconds(absl::ToDoubleSeconds(options_.clock->Now() - t0));
  return resp;
}

}  // namespace ps
