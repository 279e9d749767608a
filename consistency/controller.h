// The consistency controller: decides when a pull may be answered under
// bounded staleness, per key range.
//
// A worker's clock entry is the number of clocks (iterations) it has
// COMPLETED. A pull issued by a worker at clock c (its number of completed
// clocks) may be answered once, on every range it touches, every live worker's
// entry is >= c - tau. tau = 0 is BSP, tau = kInfiniteTau (-1) is ASP (never
// wait), anything else is SSP. A worker that is finished (done with all its
// work) or dead no longer blocks anyone.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/clock.h"
#include "consistency/vector_clock.h"

namespace ps {

// tau meaning "no bound" (ASP). Any negative tau is treated the same way.
inline constexpr int64_t kInfiniteTau = -1;

// Waiting pulls one worker may have queued at once. A worker keeps a few per
// server (one per table and prefetched clock); the bound only stops a
// hostile or buggy peer from growing the queue without limit.
inline constexpr int kDefaultMaxPendingPullsPerWorker = 256;

// Thread-safe. Callbacks passed to WaitPull never run while the controller's
// lock is held, so a callback may call back into the controller.
class ConsistencyController {
 public:
  // `clock` is not owned and must outlive the controller (it is read only by
  // WaitPull and ExpireWaits). Negative counts are treated as 0. At most
  // `max_pending_per_worker` waits of one worker are queued at a time.
  ConsistencyController(
      int num_workers, int num_ranges, int64_t tau, Clock* clock,
      int max_pending_per_worker = kDefaultMaxPendingPullsPerWorker);
  ConsistencyController(const ConsistencyController&) = delete;
  ConsistencyController& operator=(const ConsistencyController&) = delete;
  // Pending waits are dropped without being called; call CancelAll first to
  // tell their owners.
  ~ConsistencyController() = default;

  int num_workers() const { return num_workers_.load(); }
  int num_ranges() const { return num_ranges_; }

  // A worker joined the running job (issue 9): adds it as worker
  // num_workers(), live, with entry entries[r] on range r (0 where not
  // given), and returns its id. Entries below the other workers' keep
  // waiting pulls waiting; nothing is released.
  int AddWorker(absl::Span<const int64_t> entries);

  // Changes the staleness bound. Waits that become servable are run with
  // OkStatus() on the calling thread after the lock is dropped.
  void SetTau(int64_t tau);
  int64_t tau() const;

  // `worker` has completed clock `completed_clock` on `ranges` (empty = all
  // ranges): its entry there becomes max(entry, completed_clock + 1). Waits
  // that became servable run on the calling thread, lock not held.
  // Ids out of range are ignored (callers validate remote input first).
  void AdvanceClock(int worker, int64_t completed_clock,
                    absl::Span<const int> ranges);

  // `worker` is done with all its work and stops blocking others. Releases
  // waits like AdvanceClock. Ignores an id out of range.
  void SetWorkerFinished(int worker);
  // `worker` was declared dead; same effect as finished, recorded apart for
  // status. Ignores an id out of range.
  void SetWorkerDead(int worker);
  // False once the worker is finished or dead (or the id is out of range).
  bool IsLive(int worker) const;
  bool IsFinished(int worker) const;
  bool IsDead(int worker) const;

  // True when a pull at `clock` touching `ranges` (empty = all ranges) may be
  // answered now. False when a range id is out of range.
  bool CanServe(int64_t clock, absl::Span<const int> ranges) const;

  // Asks to answer a pull by `worker` at `clock` touching `ranges` (empty =
  // all ranges). `ready` is called exactly once, never under the lock:
  //  - servable now: ready(OkStatus()) runs on this thread before WaitPull
  //    returns, and WaitPull returns true;
  //  - a worker or range id out of range: ready(INVALID_ARGUMENT) runs on
  //    this thread, and WaitPull returns true;
  //  - not servable and the worker already has max_pending_per_worker waits
  //    queued: ready(RESOURCE_EXHAUSTED, REASON_TOO_MANY_PENDING) runs on
  //    this thread, and WaitPull returns true;
  //  - otherwise the wait is queued and WaitPull returns false. It later runs
  //    with OkStatus() on whichever thread made it servable, with
  //    DEADLINE_EXCEEDED from ExpireWaits() once Now() >= deadline (the
  //    message names the lagging worker, its clock and the range), or with
  //    CancelAll's status.
  bool WaitPull(int worker, int64_t clock, std::vector<int> ranges,
                absl::Time deadline, std::function<void(absl::Status)> ready);

  // The SSP catch-up's watch (PullRequest.others_at): like WaitPull, but
  // servable once every live worker other than `worker` has an entry of at
  // least `others_at` on every range of `ranges` (empty = all), or once
  // `worker` itself is finished or dead, whatever tau is (never while no
  // other worker is live: nobody can get ahead then). Its deadline is
  // an answer too: ExpireWaits runs it with OkStatus() (a watch only tells
  // when the others got ahead; it never fails for waiting).
  bool WaitOthers(int worker, int64_t others_at, std::vector<int> ranges,
                  absl::Time deadline, std::function<void(absl::Status)> ready);
  // The lowest entry of the live workers other than `worker` on `ranges`
  // (empty = all); -1 when there is none (or an id is out of range).
  int64_t OthersMin(int worker, absl::Span<const int> ranges) const;

  // Runs every queued wait whose deadline has passed (Now() >= deadline) with
  // DEADLINE_EXCEEDED (a WaitOthers with OkStatus()), on this thread.
  // Returns how many ran. The owner calls
  // this periodically (e.g. from its timer thread).
  int ExpireWaits();

  // Runs every queued wait with `status` (used at shutdown). An OK `status`
  // is replaced by CANCELLED: a cancelled pull must not look answered.
  void CancelAll(absl::Status status);
  // Runs every queued wait that touches one of `ranges` (a wait for all
  // ranges included) with `status` (not OK): the ranges moved to another
  // server (elasticity, issue 9). Returns how many ran.
  int CancelRanges(absl::Span<const int> ranges, absl::Status status);

  size_t pending_waits() const;

  // Entry of `worker` on `range`; 0 for ids out of range.
  int64_t Entry(int range, int worker) const;

  // Per worker: its minimum entry over all ranges (for status display).
  std::vector<int64_t> MinClockPerWorker() const;

  // One line per range, e.g. "tau=2 r0=[3, 5] r1=[3, 4] finished={} dead={1}".
  std::string DebugString() const;

 private:
  struct Wait {
    int worker;
    int64_t clock;
    std::vector<int> ranges;  // empty = all
    absl::Time start;
    absl::Time deadline;
    std::function<void(absl::Status)> ready;
    bool others = false;  // WaitOthers: `clock` is its others_at
  };
  using Ready = std::function<void(absl::Status)>;

  bool ValidRanges(absl::Span<const int> ranges) const;
  bool CanServeLocked(int64_t clock, absl::Span<const int> ranges) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  int64_t OthersMinLocked(int worker, absl::Span<const int> ranges) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool CanServeWaitLocked(const Wait& w) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // WaitPull and WaitOthers: queues `w` unless servable now.
  bool Enqueue(Wait w);
  // Moves servable waits' callbacks into `out` (queue order) and removes them.
  void TakeServableLocked(std::vector<Ready>* out)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::string LagReasonLocked(const Wait& w, absl::Time now) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void MarkNotLive(int worker, bool dead);

  // Only grows (AddWorker, under mu_, after the vectors grew): an id below
  // it indexes every per-worker vector.
  std::atomic<int> num_workers_;
  // Constant after construction.
  const int num_ranges_;
  Clock* const clock_;
  const int max_pending_per_worker_;

  mutable absl::Mutex mu_;
  int64_t tau_ ABSL_GUARDED_BY(mu_);
  std::vector<VectorClock> ranges_ ABSL_GUARDED_BY(mu_);  // one per range
  std::vector<bool> live_ ABSL_GUARDED_BY(mu_);
  std::vector<bool> finished_ ABSL_GUARDED_BY(mu_);
  std::vector<bool> dead_ ABSL_GUARDED_BY(mu_);
  std::vector<Wait> waits_ ABSL_GUARDED_BY(mu_);  // queue order
  std::vector<int> pending_ ABSL_GUARDED_BY(mu_);  // waits_ per worker
};

}  // namespace ps
