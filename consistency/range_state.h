// The consistency bookkeeping of ONE key range (docs/fault_tolerance.md):
// the exactly-once window of push segments per worker, the segments
// received and announced per clock, the clocks each worker completed on
// this range, and in BSP the buffered segments of clocks not yet applied.
// Everything that has to move with a range when it is replicated, migrated
// or checkpointed, and nothing else: no table, no lock, no RPC.
//
// A deterministic state machine: its inputs are Accept, Applied, Announce,
// Finish and SetDead; a replica fed the same inputs in the same order ends
// in the same state (Snapshot()/FromSnapshot() copy it exactly).
//
// Protocol it implements (per worker w, on this range):
//  * every push segment carries (w, seq, clock); seqs are unique per
//    (w, range). Accept() admits a segment once: a seq seen before is a
//    duplicate and changes nothing.
//  * an admitted segment counts as received for its clock once its data
//    is in the table: in ASP/SSP when the caller reports Applied(), in BSP
//    at once (the data is buffered here).
//  * Announce(w, c, segments, examples, settled) says how many segments w
//    sent to this range with clock c. Clock c of w is completed here when
//    every earlier clock is and `segments` of clock c were received.
//  * the range's vector-clock entry of w is its completed clocks (ASP/SSP);
//    in BSP, clocks applied: clock c is applied (all workers' buffered
//    segments summed in worker-id order) once every live worker completed
//    it. A dead or finished worker no longer holds anyone back.
//
// Not thread-safe: the owner serialises calls (the server's lock).
#pragma once

#include <cstddef>
#include <cstdint>
#include <iterator>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/btree_set.h"
#include "absl/container/inlined_vector.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "proto/ps.pb.h"

namespace ps {

// clock -> value, for the few clocks a worker has in flight on a range (one
// or two, tau + 1 at most in SSP): a sorted inline vector with the map
// operations RangeState uses. A segment's Accept and Applied each touch one
// of these, and so does every announcement; a std::map allocated and freed a
// node each time.
template <typename V>
class ClockMap {
 public:
  using value_type = std::pair<int64_t, V>;
  using iterator = typename absl::InlinedVector<value_type, 4>::iterator;
  using const_iterator =
      typename absl::InlinedVector<value_type, 4>::const_iterator;

  // The value of `clock`, inserted as V() when absent.
  V& operator[](int64_t clock) {
    iterator it = LowerBound(clock);
    if (it == v_.end() || it->first != clock) it = v_.insert(it, {clock, V()});
    return it->second;
  }
  iterator find(int64_t clock) {
    iterator it = LowerBound(clock);
    return it != v_.end() && it->first == clock ? it : v_.end();
  }
  // Inserts (clock, value) unless the clock is there; true when inserted.
  bool emplace(int64_t clock, V value) {
    iterator it = LowerBound(clock);
    if (it != v_.end() && it->first == clock) return false;
    v_.insert(it, {clock, std::move(value)});
    return true;
  }
  void erase(iterator it) { v_.erase(it); }
  bool empty() const { return v_.empty(); }
  iterator begin() { return v_.begin(); }
  iterator end() { return v_.end(); }
  const_iterator begin() const { return v_.begin(); }
  const_iterator end() const { return v_.end(); }

 private:
  iterator LowerBound(int64_t clock) {
    // Clocks in flight are few: a linear scan from the back (new clocks
    // come last) beats a binary search.
    iterator it = v_.end();
    while (it != v_.begin() && std::prev(it)->first >= clock) --it;
    return it;
  }

  absl::InlinedVector<value_type, 4> v_;
};
using ClockCounts = ClockMap<int64_t>;

struct RangeLimits {
  // How far a segment's or announcement's clock may be ahead of the clocks
  // its worker completed here; beyond it OUT_OF_RANGE + CLOCK_TOO_FAR.
  int64_t max_clock_ahead = 1000;
  // Seqs above a worker's settled watermark remembered at once; beyond it a
  // segment that does not extend the watermark is RESOURCE_EXHAUSTED +
  // TOO_MANY_PENDING.
  size_t max_unsettled_seqs = 1 << 16;
};

// One buffered BSP segment: the keys (uint64, ascending) and gradient sums
// (float, keys * dim) of one table. `worker` and `seq` are set by Accept.
struct BufferedSegment {
  int table = 0;
  std::string keys;
  std::string vals;
  int worker = -1;
  uint64_t seq = 0;
};

// A worker's announcement of one clock on a range: `segments` sent with
// it, over `examples` examples; `settled` as given to Announce.
struct BspAnnouncement {
  int worker = 0;
  int64_t segments = 0;
  int64_t examples = 0;
  uint64_t settled = 0;
};

// What the caller must do after an input.
struct RangeActions {
  // (worker, new vector-clock entry) on this range, in order.
  // Inline: one advance per call is the common case (no allocation).
  absl::InlinedVector<std::pair<int, int64_t>, 2> advanced;
  // Workers that completed their final clock here.
  std::vector<int> finished;
  // BSP: clocks to apply now, in clock order. `segments` are in worker-id
  // order then arrival order; `examples` is the clock's total over workers;
  // `announces` the announcements that completed the clock here, in the
  // order they did (replication after aggregation sends them along).
  struct Apply {
    int64_t clock = 0;
    int64_t examples = 0;
    std::vector<BufferedSegment> segments;
    std::vector<BspAnnouncement> announces;
  };
  // Inline: a step applies at most one clock on a range as a rule.
  absl::InlinedVector<Apply, 1> apply;

  bool empty() const {
    return advanced.empty() && finished.empty() && apply.empty();
  }
};

class RangeState {
 public:
  // `num_workers` >= 1 (INVALID_ARGUMENT otherwise, from Create).
  static absl::StatusOr<RangeState> Create(int num_workers, bool bsp,
                                           RangeLimits limits = {});
  // Restores a state written by Snapshot(). INVALID_ARGUMENT when the
  // snapshot is inconsistent (counts negative, windows overlapping the
  // watermark, ...): a corrupt or hostile copy is refused, never adopted.
  static absl::StatusOr<RangeState> FromSnapshot(
      const proto::RangeStateSnapshot& snap, RangeLimits limits = {});
  // FAILED_PRECONDITION while an admitted segment awaits Applied(): its
  // seq is in the window but its data not in the table, so a copy would
  // drop its resend.
  absl::StatusOr<proto::RangeStateSnapshot> Snapshot() const;

  int num_workers() const { return static_cast<int>(workers_.size()); }
  bool bsp() const { return bsp_; }

  // Replication after aggregation (BSP): a backup's copy of the range
  // follows its primary's applies instead of applying complete clocks
  // itself, so it never sums a clock whose data it does not hold (the
  // primary sends each applied clock once, with its sum:
  // ApplyReplicated). Not part of the snapshot: a role, not state.
  // Turning it off (a promotion) applies every clock complete by then.
  void SetFollower(bool follower, RangeActions* actions);
  bool follower() const { return follower_; }
  // On a follower, the primary's apply of BSP clock `clock`: admits the
  // segments (worker, seq) it consumed (duplicates, e.g. from a copy, are
  // skipped) and the announcements that completed it, then applies the
  // clock (actions->apply gets it, whose buffered segments the caller
  // ignores: the primary's sum replaces them). Errors (the replica has
  // diverged; state may be partly changed, the caller asks for a copy):
  // FAILED_PRECONDITION when not a BSP follower or `clock` is not the next
  // clock to apply, or when the clock is not complete here after them; the
  // errors of Accept and Announce.
  absl::Status ApplyReplicated(int64_t clock,
                               absl::Span<const int32_t> seg_workers,
                               absl::Span<const uint64_t> seg_seqs,
                               absl::Span<const BspAnnouncement> announces,
                               RangeActions* actions);

  // Admits push segment (worker, seq, clock). OK with *duplicate = true: a
  // replay, nothing changed. OK with *duplicate = false: new; in ASP/SSP
  // the caller applies it and then calls Applied(); in BSP it is buffered
  // (`segment` moved from) and may complete clocks (actions filled).
  // Errors, state unchanged: INVALID_ARGUMENT (worker id, negative clock,
  // seq 0), FAILED_PRECONDITION (the clock was already completed here, or
  // the worker was declared dead and this range is no follower: a zombie's
  // work went to the others; a follower takes what its primary admitted;
  // BSP: the range applied the clock already, without the worker, which
  // had finished), OUT_OF_RANGE + CLOCK_TOO_FAR, RESOURCE_EXHAUSTED +
  // TOO_MANY_PENDING.
  absl::Status Accept(int worker, uint64_t seq, int64_t clock,
                      BufferedSegment* segment, bool* duplicate,
                      RangeActions* actions);
  // ASP/SSP: the data of an admitted segment of (worker, clock) is in the
  // table. FAILED_PRECONDITION when no admitted segment of that clock is
  // waiting for it (a caller bug; nothing changes).
  absl::Status Applied(int worker, int64_t clock, RangeActions* actions);
  // ASP/SSP: an admitted segment of (worker, seq, clock) whose data the
  // table refused (its values not finite: nothing of it applied) is taken
  // back: as if never admitted, so that the same seq is admitted again and
  // a resend of the refused one is refused again, never answered as a
  // duplicate. FAILED_PRECONDITION when no such segment awaits its apply.
  absl::Status Withdraw(int worker, uint64_t seq, int64_t clock);
  // Worker `worker` sent `segments` segments to this range with clock
  // `clock`, whose minibatch had `examples` examples; every seq <= `settled`
  // it sent here has had its final answer (clamped to the highest seq
  // received, so it can never make a later segment look like a replay).
  // An announcement for a completed clock is a replay (OK, no change).
  // INVALID_ARGUMENT for a bad id or negative numbers; OUT_OF_RANGE +
  // CLOCK_TOO_FAR; FAILED_PRECONDITION for a new one from a dead worker,
  // or in BSP for a clock the range applied without the worker (as for
  // Accept).
  absl::Status Announce(int worker, int64_t clock, int64_t segments,
                        int64_t examples, uint64_t settled,
                        RangeActions* actions);
  // Every seq <= `settled` that `worker` sent here has had its final answer
  // (clamped as for Announce): the window below it is forgotten.
  // INVALID_ARGUMENT for a bad id.
  absl::Status Settle(int worker, uint64_t settled);
  // The worker has finished after `final_clock` clocks. Idempotent with
  // the same final clock; FAILED_PRECONDITION (CanFinish) with another one
  // than the worker named before, which changes nothing.
  absl::Status Finish(int worker, int64_t final_clock, RangeActions* actions);
  // Whether Finish(worker, final_clock) would succeed.
  absl::Status CanFinish(int worker, int64_t final_clock) const;
  // The worker is gone: it no longer holds back BSP clocks. Idempotent.
  absl::Status SetDead(int worker, RangeActions* actions);
  // A worker joined the running job (issue 9). With worker ==
  // num_workers() it is added, live, with `clock` clocks completed, or with
  // Frontier() clocks when `clock` < 0 (in BSP never fewer than the clocks
  // applied). With a known worker its completed clocks are raised to
  // `clock` (its start): the clocks before it are done without data.
  // Idempotent. INVALID_ARGUMENT for an id above num_workers();
  // FAILED_PRECONDITION when the worker already sent segments or
  // announcements below `clock`.
  absl::Status Join(int worker, int64_t clock, RangeActions* actions);
  // The clock a worker added now starts at: the lowest completed clocks of
  // the live workers (none live: the highest of all), so a joiner holds
  // back nothing already allowed.
  int64_t Frontier() const;

  // Vector-clock entry of `worker` on this range (0 for a bad id).
  int64_t Entry(int worker) const;
  // Clocks `worker` completed here (0 for a bad id).
  int64_t Completed(int worker) const;
  bool Finished(int worker) const;
  bool Dead(int worker) const;
  // BSP: clocks applied on this range.
  int64_t BspApplied() const { return bsp_applied_; }

  // The invariants (tests run them after every step): no entry ahead of the
  // data applied for it; no seq admitted twice; every admitted segment
  // either applied, buffered or awaiting Applied(); BSP applies clocks in
  // order and only complete ones; counts never negative. Returns the first
  // violation as INTERNAL with what it found.
  absl::Status CheckInvariants() const;

 private:
  struct Worker {
    uint64_t watermark = 0;            // every seq <= it was seen
    absl::btree_set<uint64_t> above;   // seen seqs > watermark
    uint64_t max_seq = 0;
    ClockCounts received;   // clock -> segments with data in
    ClockCounts unapplied;  // clock -> admitted, not applied
    // clock -> the announcement (its worker field unused)
    ClockMap<BspAnnouncement> announced;
    int64_t completed = 0;
    int64_t final_clock = -1;
    bool finished = false;
    bool dead = false;
    // For CheckInvariants: segments admitted / applied (or buffered) over
    // the range's life, and segments announced for completed clocks.
    int64_t admitted_total = 0;
    int64_t applied_total = 0;
    int64_t announced_completed = 0;
    int64_t received_completed = 0;
  };
  // A buffered BSP clock. Segments in arrival order (the apply orders them
  // by worker, stably); both vectors are reserved for one entry per worker
  // when the clock is first buffered, so a clock costs two allocations.
  // Was a std::map of workers to vectors, in a std::map of clocks: about
  // ten allocations per range and clock, on the primary and each backup.
  struct BspClock {
    std::vector<BufferedSegment> segments;
    int64_t examples = 0;
    std::vector<BspAnnouncement> announces;  // in the order consumed
  };

  RangeState(int num_workers, bool bsp, RangeLimits limits);
  absl::Status CheckWorker(int worker) const;
  absl::Status CheckAhead(int worker, int64_t clock) const;
  static absl::Status DeadWorker(int worker);
  // BSP: FAILED_PRECONDITION for data or an announcement of `worker` for a
  // clock this range applied already (without it: it had finished).
  absl::Status AppliedWithout(int worker, int64_t clock) const;
  // Completes every clock of `worker` that has all its segments; then, in
  // BSP, applies every clock all live workers completed.
  void Advance(int worker, RangeActions* actions);
  void ApplyCompleteBspClocks(RangeActions* actions);
  // Whether BSP clock bsp_applied_ is complete (every live worker completed
  // it, some worker did); applies it when so.
  bool ApplyNextBspClock(RangeActions* actions);
  // The buffered clock `clock`, added (in clock order) when absent.
  BspClock& PendingBsp(int64_t clock);
  static bool ClockBefore(const std::pair<int64_t, BspClock>& p, int64_t c) {
    return p.first < c;
  }
  // A clock's segments are applied (and snapshotted) in worker-id order,
  // then arrival order: sorted stably by this.
  static bool WorkerBefore(const BufferedSegment& a, const BufferedSegment& b) {
    return a.worker < b.worker;
  }

  bool bsp_;
  RangeLimits limits_;
  std::vector<Worker> workers_;
  // Ascending by clock: the clocks after bsp_applied_ with data in, a few
  // at a time (at most max_clock_ahead); a vector keeps its capacity.
  std::vector<std::pair<int64_t, BspClock>> pending_bsp_;
  int64_t bsp_applied_ = 0;
  bool follower_ = false;
};

}  // namespace ps
