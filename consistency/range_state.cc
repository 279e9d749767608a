#include "consistency/range_state.h"

#include <algorithm>
#include <iterator>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "transport/errors.h"

namespace ps {

RangeState::RangeState(int num_workers, bool bsp, RangeLimits limits)
    : bsp_(bsp), limits_(limits), workers_(num_workers) {}

absl::StatusOr<RangeState> RangeState::Create(int num_workers, bool bsp,
                                              RangeLimits limits) {
  if (num_workers < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("range state needs >= 1 worker, got ", num_workers));
  }
  return RangeState(num_workers, bsp, limits);
}

absl::Status RangeState::CheckWorker(int worker) const {
  if (worker < 0 || worker >= num_workers()) {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown worker id ", worker));
  }
  return absl::OkStatus();
}

absl::Status RangeState::DeadWorker(int worker) {
  return absl::FailedPreconditionError(absl::StrCat(
      "worker ", worker, " was declared dead: its work went to the others, "
      "and this range takes nothing new from it"));
}

absl::Status RangeState::AppliedWithout(int worker, int64_t clock) const {
  // Only a finished worker falls behind the clocks applied (a live one
  // holds them back, a joiner starts at them, a dead one is refused): its
  // data for such a clock would be buffered and never applied.
  return absl::FailedPreconditionError(absl::StrCat(
      "clock ", clock, " of worker ", worker, " was applied on this range "
      "without it (", bsp_applied_, " clocks applied; the worker finished "
      "after clock ", workers_[worker].final_clock, ")"));
}

absl::Status RangeState::CheckAhead(int worker, int64_t clock) const {
  const int64_t completed = workers_[worker].completed;
  if (clock > completed && clock - completed > limits_.max_clock_ahead) {
    return ErrorWithReason(
        absl::StatusCode::kOutOfRange, proto::REASON_CLOCK_TOO_FAR,
        absl::StrCat("clock ", clock, " of worker ", worker, " is more than ",
                     limits_.max_clock_ahead, " clocks ahead of the ",
                     completed, " it completed here"));
  }
  return absl::OkStatus();
}

absl::Status RangeState::Accept(int worker, uint64_t seq, int64_t clock,
                                BufferedSegment* segment, bool* duplicate,
                                RangeActions* actions) {
  *duplicate = false;
  if (absl::Status s = CheckWorker(worker); !s.ok()) return s;
  if (clock < 0) return absl::InvalidArgumentError("negative clock");
  if (seq == 0) return absl::InvalidArgumentError("push seq 0");
  Worker& w = workers_[worker];
  if (seq <= w.watermark || w.above.contains(seq)) {
    *duplicate = true;  // a replay: admitted once already
    return absl::OkStatus();
  }
  if (w.dead && !follower_) return DeadWorker(worker);
  if (clock < w.completed) {
    return absl::FailedPreconditionError(
        absl::StrCat("push for clock ", clock, " after worker ", worker,
                     " completed it"));
  }
  if (bsp_ && clock < bsp_applied_) return AppliedWithout(worker, clock);
  if (absl::Status s = CheckAhead(worker, clock); !s.ok()) return s;
  if (w.above.size() >= limits_.max_unsettled_seqs &&
      seq != w.watermark + 1) {
    return ErrorWithReason(
        absl::StatusCode::kResourceExhausted, proto::REASON_TOO_MANY_PENDING,
        absl::StrCat("worker ", worker, " has ", w.above.size(),
                     " unsettled push seqs"));
  }
  if (seq == w.watermark + 1) {
    ++w.watermark;  // in order, the usual case: no set insertion
  } else {
    w.above.insert(seq);
  }
  while (!w.above.empty() && *w.above.begin() == w.watermark + 1) {
    w.above.erase(w.above.begin());
    ++w.watermark;
  }
  w.max_seq = std::max(w.max_seq, seq);
  ++w.admitted_total;
  if (bsp_) {
    segment->worker = worker;
    segment->seq = seq;
    PendingBsp(clock).segments.push_back(std::move(*segment));
    ++w.received[clock];
    ++w.applied_total;
    Advance(worker, actions);
  } else {
    ++w.unapplied[clock];
  }
  return absl::OkStatus();
}

absl::Status RangeState::Applied(int worker, int64_t clock,
                                 RangeActions* actions) {
  if (absl::Status s = CheckWorker(worker); !s.ok()) return s;
  Worker& w = workers_[worker];
  auto it = w.unapplied.find(clock);
  if (bsp_ || it == w.unapplied.end()) {
    return absl::FailedPreconditionError(
        absl::StrCat("no admitted segment of worker ", worker, " clock ",
                     clock, " awaits its apply"));
  }
  if (--it->second == 0) w.unapplied.erase(it);
  ++w.applied_total;
  // A worker that announced fewer segments than it sent has had the clock
  // completed already; the extra data is in, but counts for nothing.
  if (clock < w.completed) return absl::OkStatus();
  ++w.received[clock];
  Advance(worker, actions);
  return absl::OkStatus();
}

absl::Status RangeState::Withdraw(int worker, uint64_t seq, int64_t clock) {
  if (absl::Status s = CheckWorker(worker); !s.ok()) return s;
  Worker& w = workers_[worker];
  auto it = w.unapplied.find(clock);
  const bool admitted =
      seq != 0 && (seq <= w.watermark || w.above.contains(seq));
  if (bsp_ || it == w.unapplied.end() || !admitted) {
    return absl::FailedPreconditionError(
        absl::StrCat("no admitted segment of worker ", worker, " seq ", seq,
                     " clock ", clock, " awaits its apply"));
  }
  if (--it->second == 0) w.unapplied.erase(it);
  --w.admitted_total;
  if (seq > w.watermark) {
    w.above.erase(seq);
  } else if (w.watermark - seq <= limits_.max_unsettled_seqs) {
    // The seqs the watermark passed after this one stay seen, above it.
    for (uint64_t later = seq + 1; later <= w.watermark; ++later) {
      w.above.insert(later);
    }
    w.watermark = seq - 1;
  }
  // Else the worker settled seqs past it meanwhile (it said they all had
  // their answers, this one included): it stays seen, as the worker will
  // not send it again, rather than a set of every seq in between.
  return absl::OkStatus();
}

absl::Status RangeState::Announce(int worker, int64_t clock, int64_t segments,
                                  int64_t examples, uint64_t settled,
                                  RangeActions* actions) {
  if (absl::Status s = CheckWorker(worker); !s.ok()) return s;
  if (clock < 0 || segments < 0 || examples < 0) {
    return absl::InvalidArgumentError("negative clock, segments or examples");
  }
  if (absl::Status s = CheckAhead(worker, clock); !s.ok()) return s;
  Settle(worker, settled).IgnoreError();  // id checked above
  Worker& w = workers_[worker];
  if (clock < w.completed) return absl::OkStatus();  // a replay
  if (w.dead && !follower_) return DeadWorker(worker);
  if (bsp_ && clock < bsp_applied_) return AppliedWithout(worker, clock);
  w.announced[clock] = BspAnnouncement{worker, segments, examples, settled};
  Advance(worker, actions);
  return absl::OkStatus();
}

absl::Status RangeState::Settle(int worker, uint64_t settled) {
  if (absl::Status s = CheckWorker(worker); !s.ok()) return s;
  Worker& w = workers_[worker];
  // Only seqs received here can be settled: a larger value would make
  // every later segment look like a replay.
  settled = std::min(settled, w.max_seq);
  if (settled > w.watermark) {
    w.above.erase(w.above.begin(), w.above.upper_bound(settled));
    w.watermark = settled;
    while (!w.above.empty() && *w.above.begin() == w.watermark + 1) {
      w.above.erase(w.above.begin());
      ++w.watermark;
    }
  }
  return absl::OkStatus();
}

absl::Status RangeState::CanFinish(int worker, int64_t final_clock) const {
  if (absl::Status s = CheckWorker(worker); !s.ok()) return s;
  if (final_clock < 0) {
    return absl::InvalidArgumentError("negative final clock");
  }
  const int64_t before = workers_[worker].final_clock;
  if (before >= 0 && before != final_clock) {
    // A resent finish names the same clock. Another one would leave a
    // worker finished short of its final clock, or unfinish it.
    return absl::FailedPreconditionError(
        absl::StrCat("worker ", worker, " already finishes after clock ",
                     before, ", not ", final_clock));
  }
  return absl::OkStatus();
}

absl::Status RangeState::Finish(int worker, int64_t final_clock,
                                RangeActions* actions) {
  PS_RETURN_IF_ERROR(CanFinish(worker, final_clock));
  workers_[worker].final_clock = final_clock;
  Advance(worker, actions);
  return absl::OkStatus();
}

absl::Status RangeState::SetDead(int worker, RangeActions* actions) {
  if (absl::Status s = CheckWorker(worker); !s.ok()) return s;
  if (workers_[worker].dead) return absl::OkStatus();
  workers_[worker].dead = true;
  if (bsp_) ApplyCompleteBspClocks(actions);
  return absl::OkStatus();
}

int64_t RangeState::Frontier() const {
  int64_t live_min = -1;
  int64_t all_max = bsp_applied_;
  for (const Worker& w : workers_) {
    all_max = std::max(all_max, w.completed);
    if (w.dead || w.finished) continue;
    if (live_min < 0 || w.completed < live_min) live_min = w.completed;
  }
  return live_min >= 0 ? live_min : all_max;
}

absl::Status RangeState::Join(int worker, int64_t clock,
                              RangeActions* actions) {
  if (worker < 0 || worker > num_workers()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "worker ", worker, " cannot join a range of ", num_workers()));
  }
  if (worker == num_workers()) {
    int64_t start = clock >= 0 ? clock : Frontier();
    // In BSP a joiner never starts below the clocks applied: its segments
    // for such a clock would be buffered for nothing.
    if (bsp_) start = std::max(start, bsp_applied_);
    Worker w;
    w.completed = start;
    workers_.push_back(std::move(w));
    const int64_t entry = Entry(worker);
    if (entry > 0) actions->advanced.emplace_back(worker, entry);
    return absl::OkStatus();
  }
  Worker& w = workers_[worker];
  if (clock <= w.completed) return absl::OkStatus();
  if ((!w.received.empty() && w.received.begin()->first < clock) ||
      (!w.announced.empty() && w.announced.begin()->first < clock) ||
      (!w.unapplied.empty() && w.unapplied.begin()->first < clock)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "worker ", worker, " cannot start at clock ", clock,
        ": it already sent data for an earlier clock"));
  }
  w.completed = clock;
  if (!bsp_) actions->advanced.emplace_back(worker, w.completed);
  Advance(worker, actions);
  return absl::OkStatus();
}

void RangeState::Advance(int worker, RangeActions* actions) {
  Worker& w = workers_[worker];
  for (;;) {
    auto a = w.announced.find(w.completed);
    if (a == w.announced.end()) break;
    auto r = w.received.find(w.completed);
    const int64_t got = r == w.received.end() ? 0 : r->second;
    if (got < a->second.segments) break;
    if (bsp_) {
      BspClock& bc = PendingBsp(w.completed);
      bc.examples += a->second.examples;
      bc.announces.push_back(a->second);
    }
    w.announced_completed += a->second.segments;
    w.received_completed += got;
    if (r != w.received.end()) w.received.erase(r);
    w.announced.erase(a);
    ++w.completed;
    if (!bsp_) actions->advanced.emplace_back(worker, w.completed);
  }
  if (!w.finished && w.final_clock >= 0 && w.completed >= w.final_clock) {
    w.finished = true;
    actions->finished.push_back(worker);
  }
  if (bsp_) ApplyCompleteBspClocks(actions);
}

void RangeState::ApplyCompleteBspClocks(RangeActions* actions) {
  // A follower applies only what its primary sends (ApplyReplicated).
  if (follower_) return;
  while (ApplyNextBspClock(actions)) {
  }
}

bool RangeState::ApplyNextBspClock(RangeActions* actions) {
  const int64_t c = bsp_applied_;
  bool any = false;
  for (const Worker& w : workers_) {
    if (w.completed > c) {
      any = true;
    } else if (!w.finished && !w.dead) {
      return false;  // a live worker has not completed clock c here
    }
  }
  if (!any) return false;
  RangeActions::Apply apply;
  apply.clock = c;
  // Clocks below c are applied and gone (CheckInvariants), so c is the
  // first as a rule; looked up all the same.
  auto it = std::lower_bound(pending_bsp_.begin(), pending_bsp_.end(), c,
                             ClockBefore);
  if (it != pending_bsp_.end() && it->first == c) {
    BspClock& bc = it->second;
    apply.examples = bc.examples;
    apply.announces = std::move(bc.announces);
    apply.segments = std::move(bc.segments);
    // Worker-id order, then arrival order: a deterministic sum. A clock has
    // a few segments on a range as a rule: those go by an insertion sort
    // (stable, without std::stable_sort's buffer).
    std::vector<BufferedSegment>& segs = apply.segments;
    if (segs.size() > 32) {
      std::stable_sort(segs.begin(), segs.end(), WorkerBefore);
    } else {
      for (size_t i = 1; i < segs.size(); ++i) {
        for (size_t j = i; j > 0 && WorkerBefore(segs[j], segs[j - 1]); --j) {
          std::swap(segs[j - 1], segs[j]);
        }
      }
    }
    pending_bsp_.erase(it);
  }
  actions->apply.push_back(std::move(apply));
  ++bsp_applied_;
  for (int w = 0; w < num_workers(); ++w) {
    if (workers_[w].completed > c) actions->advanced.emplace_back(w, c + 1);
  }
  return true;
}

RangeState::BspClock& RangeState::PendingBsp(int64_t clock) {
  auto it = std::lower_bound(pending_bsp_.begin(), pending_bsp_.end(), clock,
                             ClockBefore);
  if (it != pending_bsp_.end() && it->first == clock) return it->second;
  it = pending_bsp_.emplace(it, clock, BspClock{});
  it->second.segments.reserve(workers_.size());
  it->second.announces.reserve(workers_.size());
  return it->second;
}

void RangeState::SetFollower(bool follower, RangeActions* actions) {
  if (follower_ == follower) return;
  follower_ = follower;
  if (!follower_ && bsp_) ApplyCompleteBspClocks(actions);
}

absl::Status RangeState::ApplyReplicated(
    int64_t clock, absl::Span<const int32_t> seg_workers,
    absl::Span<const uint64_t> seg_seqs,
    absl::Span<const BspAnnouncement> announces, RangeActions* actions) {
  if (!bsp_ || !follower_) {
    return absl::FailedPreconditionError(
        "a replicated BSP clock for a range that is not a BSP follower");
  }
  if (clock != bsp_applied_) {
    return absl::FailedPreconditionError(
        absl::StrCat("replicated BSP clock ", clock, " where clock ",
                     bsp_applied_, " is the next to apply"));
  }
  if (seg_workers.size() != seg_seqs.size()) {
    return absl::InvalidArgumentError("segment workers and seqs differ");
  }
  for (size_t i = 0; i < seg_workers.size(); ++i) {
    BufferedSegment placeholder;  // the data comes summed
    bool duplicate = false;
    PS_RETURN_IF_ERROR(Accept(seg_workers[i], seg_seqs[i], clock,
                              &placeholder, &duplicate, actions));
  }
  for (const BspAnnouncement& a : announces) {
    PS_RETURN_IF_ERROR(Announce(a.worker, clock, a.segments, a.examples,
                                a.settled, actions));
  }
  if (!ApplyNextBspClock(actions)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "replicated BSP clock ", clock, " is not complete here"));
  }
  return absl::OkStatus();
}

int64_t RangeState::Entry(int worker) const {
  if (worker < 0 || worker >= num_workers()) return 0;
  const int64_t completed = workers_[worker].completed;
  return bsp_ ? std::min(completed, bsp_applied_) : completed;
}

int64_t RangeState::Completed(int worker) const {
  if (worker < 0 || worker >= num_workers()) return 0;
  return workers_[worker].completed;
}

bool RangeState::Finished(int worker) const {
  return worker >= 0 && worker < num_workers() && workers_[worker].finished;
}

bool RangeState::Dead(int worker) const {
  return worker >= 0 && worker < num_workers() && workers_[worker].dead;
}

absl::Status RangeState::CheckInvariants() const {
  auto fail = [](int worker, auto&&... what) {
    return absl::InternalError(
        absl::StrCat("range state, worker ", worker, ": ", what...));
  };
  int64_t min_live_completed = -1;
  for (int i = 0; i < num_workers(); ++i) {
    const Worker& w = workers_[i];
    if (w.watermark > w.max_seq) {
      return fail(i, "watermark ", w.watermark, " above the highest seq ",
                  w.max_seq);
    }
    if (!w.above.empty() &&
        (*w.above.begin() <= w.watermark + 1 || *w.above.rbegin() > w.max_seq)) {
      return fail(i, "seqs above the watermark out of (", w.watermark + 1,
                  ", ", w.max_seq, "]");
    }
    // Every admitted segment is applied (or buffered) or awaits Applied():
    // nothing applied twice, nothing lost.
    int64_t unapplied = 0;
    for (const auto& [c, n] : w.unapplied) {
      if (n <= 0) {
        return fail(i, "unapplied count ", n, " for clock ", c);
      }
      unapplied += n;
    }
    if (w.admitted_total != w.applied_total + unapplied) {
      return fail(i, w.admitted_total, " segments admitted but ",
                  w.applied_total, " applied and ", unapplied, " awaiting");
    }
    for (const auto& [c, n] : w.received) {
      if (n <= 0 || c < w.completed) {
        return fail(i, "received count ", n, " for clock ", c);
      }
    }
    for (const auto& [c, a] : w.announced) {
      if (c < w.completed || a.segments < 0 || a.examples < 0) {
        return fail(i, "announcement for clock ", c);
      }
    }
    // No entry ahead of its data: a completed clock had at least the
    // segments announced for it applied.
    if (w.received_completed < w.announced_completed) {
      return fail(i, "completed clocks announced ", w.announced_completed,
                  " segments but only ", w.received_completed, " arrived");
    }
    if (w.finished && w.completed < w.final_clock) {
      return fail(i, "finished at ", w.completed, " of ", w.final_clock,
                  " clocks");
    }
    if (!w.dead && !w.finished &&
        (min_live_completed < 0 || w.completed < min_live_completed)) {
      min_live_completed = w.completed;
    }
  }
  if (bsp_) {
    if (min_live_completed >= 0 && bsp_applied_ > min_live_completed) {
      return absl::InternalError(absl::StrCat(
          "range state: bsp applied ", bsp_applied_,
          " clocks but a live worker completed only ", min_live_completed));
    }
    if (!pending_bsp_.empty() && pending_bsp_.front().first < bsp_applied_) {
      return absl::InternalError(absl::StrCat(
          "range state: buffered clock ", pending_bsp_.front().first,
          " below the ", bsp_applied_, " applied"));
    }
    for (size_t i = 1; i < pending_bsp_.size(); ++i) {
      if (pending_bsp_[i - 1].first >= pending_bsp_[i].first) {
        return absl::InternalError(absl::StrCat(
            "range state: buffered clock ", pending_bsp_[i].first,
            " out of order after ", pending_bsp_[i - 1].first));
      }
    }
  } else if (!pending_bsp_.empty() || bsp_applied_ != 0) {
    return absl::InternalError("range state: bsp buffers outside bsp");
  }
  return absl::OkStatus();
}

absl::StatusOr<proto::RangeStateSnapshot> RangeState::Snapshot() const {
  proto::RangeStateSnapshot snap;
  snap.set_bsp(bsp_);
  snap.set_bsp_applied(bsp_applied_);
  for (int i = 0; i < num_workers(); ++i) {
    const Worker& w = workers_[i];
    if (!w.unapplied.empty()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "worker ", i, " has admitted segments awaiting their apply"));
    }
    proto::RangeStateSnapshot::WorkerState* ws = snap.add_workers();
    ws->set_watermark(w.watermark);
    for (uint64_t s : w.above) ws->add_above(s);
    ws->set_max_seq(w.max_seq);
    for (const auto& [c, n] : w.received) {
      auto* e = ws->add_received();
      e->set_clock(c);
      e->set_count(n);
    }
    for (const auto& [c, a] : w.announced) {
      auto* e = ws->add_announced();
      e->set_clock(c);
      e->set_count(a.segments);
      e->set_examples(a.examples);
      e->set_settled(a.settled);
    }
    ws->set_completed(w.completed);
    ws->set_final_clock(w.final_clock);
    ws->set_finished(w.finished);
    ws->set_dead(w.dead);
    ws->set_admitted_total(w.admitted_total);
    ws->set_applied_total(w.applied_total);
    ws->set_announced_completed(w.announced_completed);
    ws->set_received_completed(w.received_completed);
  }
  for (const auto& [c, bc] : pending_bsp_) {
    auto* pc = snap.add_pending_bsp();
    pc->set_clock(c);
    pc->set_examples(bc.examples);
    // In worker-id order, then arrival order (as the apply sums them).
    std::vector<const BufferedSegment*> segs;
    segs.reserve(bc.segments.size());
    for (const BufferedSegment& seg : bc.segments) segs.push_back(&seg);
    std::stable_sort(segs.begin(), segs.end(),
                     [](const BufferedSegment* a, const BufferedSegment* b) {
                       return WorkerBefore(*a, *b);
                     });
    for (const BufferedSegment* seg : segs) {
      auto* ps = pc->add_segments();
      ps->set_worker(seg->worker);
      ps->set_table(seg->table);
      ps->set_keys(seg->keys);
      ps->set_vals(seg->vals);
      ps->set_seq(seg->seq);
    }
    for (const BspAnnouncement& a : bc.announces) {
      auto* pa = pc->add_announces();
      pa->set_worker(a.worker);
      pa->set_segments(a.segments);
      pa->set_examples(a.examples);
      pa->set_settled(a.settled);
    }
  }
  return snap;
}

absl::StatusOr<RangeState> RangeState::FromSnapshot(
    const proto::RangeStateSnapshot& snap, RangeLimits limits) {
  if (snap.workers_size() < 1) {
    return absl::InvalidArgumentError("range snapshot has no workers");
  }
  RangeState st(snap.workers_size(), snap.bsp(), limits);
  auto bad = [](auto&&... what) {
    return absl::InvalidArgumentError(
        absl::StrCat("range snapshot: ", what...));
  };
  if (snap.bsp_applied() < 0) return bad("negative bsp_applied");
  st.bsp_applied_ = snap.bsp_applied();
  for (int i = 0; i < snap.workers_size(); ++i) {
    const auto& ws = snap.workers(i);
    Worker& w = st.workers_[i];
    w.watermark = ws.watermark();
    uint64_t prev = w.watermark;
    for (uint64_t s : ws.above()) {
      if (s <= prev) return bad("worker ", i, ": seqs not ascending");
      w.above.insert(s);
      prev = s;
    }
    w.max_seq = ws.max_seq();
    if (ws.completed() < 0) return bad("worker ", i, ": negative completed");
    w.completed = ws.completed();
    for (const auto& e : ws.received()) {
      // Ascending, as Snapshot writes them: each is appended (a shuffled
      // list would cost a sorted insertion each).
      if (e.count() <= 0 || e.clock() < w.completed ||
          (!w.received.empty() &&
           e.clock() <= std::prev(w.received.end())->first) ||
          !w.received.emplace(e.clock(), e.count())) {
        return bad("worker ", i, ": bad received count");
      }
    }
    for (const auto& e : ws.announced()) {
      if (e.count() < 0 || e.examples() < 0 || e.clock() < w.completed ||
          !w.announced.emplace(e.clock(),
                               BspAnnouncement{i, e.count(), e.examples(),
                                               e.settled()})) {
        return bad("worker ", i, ": bad announcement");
      }
    }
    w.final_clock = ws.final_clock();
    w.finished = ws.finished();
    w.dead = ws.dead();
    w.admitted_total = ws.admitted_total();
    w.applied_total = ws.applied_total();
    w.announced_completed = ws.announced_completed();
    w.received_completed = ws.received_completed();
  }
  int64_t prev_clock = -1;
  for (const auto& pc : snap.pending_bsp()) {
    if (!snap.bsp() || pc.clock() <= prev_clock || pc.examples() < 0) {
      return bad("bad buffered clock ", pc.clock());
    }
    prev_clock = pc.clock();
    BspClock& bc = st.PendingBsp(pc.clock());
    bc.examples = pc.examples();
    for (const auto& seg : pc.segments()) {
      if (seg.worker() < 0 || seg.worker() >= snap.workers_size()) {
        return bad("buffered segment of unknown worker ", seg.worker());
      }
      bc.segments.push_back(BufferedSegment{
          seg.table(), seg.keys(), seg.vals(), seg.worker(), seg.seq()});
    }
    for (const auto& a : pc.announces()) {
      if (a.worker() < 0 || a.worker() >= snap.workers_size() ||
          a.segments() < 0 || a.examples() < 0) {
        return bad("bad announcement of buffered clock ", pc.clock());
      }
      bc.announces.push_back(BspAnnouncement{a.worker(), a.segments(),
                                             a.examples(), a.settled()});
    }
  }
  if (absl::Status s = st.CheckInvariants(); !s.ok()) {
    return bad(s.message());
  }
  return st;
}

}  // namespace ps
