#include "consistency/controller.h"

#include <algorithm>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "transport/errors.h"

namespace ps {

ConsistencyController::ConsistencyController(int num_workers, int num_ranges,
                                             int64_t tau, Clock* clock,
                                             int max_pending_per_worker)
    : num_workers_(std::max(num_workers, 0)),
      num_ranges_(std::max(num_ranges, 0)),
      clock_(clock),
      max_pending_per_worker_(std::max(max_pending_per_worker, 1)),
      tau_(tau),
      ranges_(num_ranges_, VectorClock(num_workers)),
      live_(std::max(num_workers, 0), true),
      finished_(std::max(num_workers, 0), false),
      dead_(std::max(num_workers, 0), false),
      pending_(std::max(num_workers, 0), 0) {}

int ConsistencyController::AddWorker(absl::Span<const int64_t> entries) {
  absl::MutexLock l(&mu_);
  const int id = num_workers_.load();
  for (int r = 0; r < num_ranges_; ++r) {
    ranges_[r].AddWorker(r < static_cast<int>(entries.size()) ? entries[r] : 0);
  }
  live_.push_back(true);
  finished_.push_back(false);
  dead_.push_back(false);
  pending_.push_back(0);
  num_workers_.store(id + 1);
  return id;
}

void ConsistencyController::SetTau(int64_t tau) {
  std::vector<Ready> ready;
  {
    absl::MutexLock l(&mu_);
    tau_ = tau;
    TakeServableLocked(&ready);
  }
  for (Ready& r : ready) r(absl::OkStatus());
}

int64_t ConsistencyController::tau() const {
  absl::MutexLock l(&mu_);
  return tau_;
}

void ConsistencyController::AdvanceClock(int worker, int64_t completed_clock,
                                         absl::Span<const int> ranges) {
  if (worker < 0 || worker >= num_workers_) return;
  // completed_clock + 1 without overflow.
  const int64_t value = completed_clock == std::numeric_limits<int64_t>::max()
                            ? completed_clock
                            : completed_clock + 1;
  std::vector<Ready> ready;
  {
    absl::MutexLock l(&mu_);
    if (ranges.empty()) {
      for (VectorClock& vc : ranges_) vc.Advance(worker, value);
    } else {
      for (int r : ranges) {
        if (r >= 0 && r < num_ranges_) ranges_[r].Advance(worker, value);
      }
    }
    TakeServableLocked(&ready);
  }
  for (Ready& r : ready) r(absl::OkStatus());
}

void ConsistencyController::MarkNotLive(int worker, bool dead) {
  if (worker < 0 || worker >= num_workers_) return;
  std::vector<Ready> ready;
  {
    absl::MutexLock l(&mu_);
    live_[worker] = false;
    (dead ? dead_ : finished_)[worker] = true;
    TakeServableLocked(&ready);
  }
  for (Ready& r : ready) r(absl::OkStatus());
}

void ConsistencyController::SetWorkerFinished(int worker) {
  MarkNotLive(worker, /*dead=*/false);
}

void ConsistencyController::SetWorkerDead(int worker) {
  MarkNotLive(worker, /*dead=*/true);
}

bool ConsistencyController::IsLive(int worker) const {
  if (worker < 0 || worker >= num_workers_) return false;
  absl::MutexLock l(&mu_);
  return live_[worker];
}

bool ConsistencyController::IsFinished(int worker) const {
  if (worker < 0 || worker >= num_workers_) return false;
  absl::MutexLock l(&mu_);
  return finished_[worker];
}

bool ConsistencyController::IsDead(int worker) const {
  if (worker < 0 || worker >= num_workers_) return false;
  absl::MutexLock l(&mu_);
  return dead_[worker];
}

bool ConsistencyController::ValidRanges(absl::Span<const int> ranges) const {
  for (int r : ranges) {
    if (r < 0 || r >= num_ranges_) return false;
  }
  return true;
}

bool ConsistencyController::CanServe(int64_t clock,
                                     absl::Span<const int> ranges) const {
  if (!ValidRanges(ranges)) return false;
  absl::MutexLock l(&mu_);
  return CanServeLocked(clock, ranges);
}

bool ConsistencyController::CanServeLocked(
    int64_t clock, absl::Span<const int> ranges) const {
  if (tau_ < 0) return true;  // ASP
  // clock - tau without underflow.
  const int64_t need = clock < std::numeric_limits<int64_t>::min() + tau_
                           ? std::numeric_limits<int64_t>::min()
                           : clock - tau_;
  if (ranges.empty()) {
    for (const VectorClock& vc : ranges_) {
      if (vc.MinOver(live_) < need) return false;
    }
    return true;
  }
  for (int r : ranges) {
    if (ranges_[r].MinOver(live_) < need) return false;
  }
  return true;
}

void ConsistencyController::TakeServableLocked(std::vector<Ready>* out) {
  // In-place compaction: keeps queue order, allocates nothing per check.
  size_t keep = 0;
  for (size_t i = 0; i < waits_.size(); ++i) {
    Wait& w = waits_[i];
    if (CanServeWaitLocked(w)) {
      out->push_back(std::move(w.ready));
      --pending_[w.worker];
    } else {
      if (keep != i) waits_[keep] = std::move(w);
      ++keep;
    }
  }
  waits_.erase(waits_.begin() + keep, waits_.end());
}

bool ConsistencyController::WaitPull(int worker, int64_t clock,
                                     std::vector<int> ranges,
                                     absl::Time deadline,
                                     std::function<void(absl::Status)> ready) {
  return Enqueue(Wait{worker, clock, std::move(ranges), absl::InfinitePast(),
                      deadline, std::move(ready)});
}

bool ConsistencyController::WaitOthers(
    int worker, int64_t others_at, std::vector<int> ranges, absl::Time deadline,
    std::function<void(absl::Status)> ready) {
  Wait w{worker,   others_at,       std::move(ranges), absl::InfinitePast(),
         deadline, std::move(ready)};
  w.others = true;
  return Enqueue(std::move(w));
}

bool ConsistencyController::Enqueue(Wait w) {
  if (w.worker < 0 || w.worker >= num_workers_) {
    w.ready(absl::InvalidArgumentError(absl::StrCat(
        "pull by worker ", w.worker, ": worker id out of range [0, ",
        num_workers_.load(), ")")));
    return true;
  }
  for (int r : w.ranges) {
    if (r < 0 || r >= num_ranges_) {
      w.ready(absl::InvalidArgumentError(
          absl::StrCat("pull by worker ", w.worker, " at clock ", w.clock,
                       ": range ", r, " out of range [0, ", num_ranges_, ")")));
      return true;
    }
  }
  bool full = false;
  {
    absl::MutexLock l(&mu_);
    if (!CanServeWaitLocked(w)) {
      if (pending_[w.worker] >= max_pending_per_worker_) {
        full = true;
      } else {
        ++pending_[w.worker];
        w.start = clock_->Now();
        waits_.push_back(std::move(w));
        return false;
      }
    }
  }
  if (full) {
    w.ready(ErrorWithReason(
        absl::StatusCode::kResourceExhausted, proto::REASON_TOO_MANY_PENDING,
        absl::StrCat("worker ", w.worker, " already has ",
                     max_pending_per_worker_, " pulls waiting")));
    return true;
  }
  w.ready(absl::OkStatus());
  return true;
}

int64_t ConsistencyController::OthersMin(int worker,
                                         absl::Span<const int> ranges) const {
  if (!ValidRanges(ranges)) return -1;
  absl::MutexLock l(&mu_);
  return OthersMinLocked(worker, ranges);
}

int64_t ConsistencyController::OthersMinLocked(
    int worker, absl::Span<const int> ranges) const {
  const int n = num_workers_.load();
  int64_t min = std::numeric_limits<int64_t>::max();
  const size_t count = ranges.empty() ? ranges_.size() : ranges.size();
  for (size_t i = 0; i < count; ++i) {
    const VectorClock& vc = ranges_[ranges.empty() ? i : ranges[i]];
    for (int x = 0; x < n; ++x) {
      if (x != worker && live_[x]) min = std::min(min, vc.Get(x));
    }
  }
  return min == std::numeric_limits<int64_t>::max() ? -1 : min;
}

bool ConsistencyController::CanServeWaitLocked(const Wait& w) const {
  if (!w.others) return CanServeLocked(w.clock, w.ranges);
  if (!live_[w.worker]) return true;  // the watcher stopped training
  // No other live worker: nobody to get ahead, the deadline answers it (a
  // release at once would have the last worker training ask again and again).
  const int64_t min = OthersMinLocked(w.worker, w.ranges);
  return min >= 0 && min >= w.clock;
}

std::string ConsistencyController::LagReasonLocked(const Wait& w,
                                                   absl::Time now) const {
  const int64_t need = w.clock - std::max<int64_t>(tau_, 0);
  // The live worker with the lowest entry below `need` over the touched
  // ranges; the first range where it has that entry.
  int lag_worker = -1;
  int lag_range = -1;
  int64_t lag_entry = std::numeric_limits<int64_t>::max();
  int lagging_pairs = 0;
  const size_t n = w.ranges.empty() ? ranges_.size() : w.ranges.size();
  for (size_t i = 0; i < n; ++i) {
    const int r = w.ranges.empty() ? static_cast<int>(i) : w.ranges[i];
    const VectorClock& vc = ranges_[r];
    for (int x = 0; x < num_workers_.load(); ++x) {
      if (!live_[x]) continue;
      const int64_t e = vc.Get(x);
      if (e >= need) continue;
      ++lagging_pairs;
      if (e < lag_entry) {
        lag_entry = e;
        lag_worker = x;
        lag_range = r;
      }
    }
  }
  std::string msg = absl::StrCat(
      "pull by worker ", w.worker, " at clock ", w.clock, " (tau ", tau_,
      ") waited ", absl::FormatDuration(now - w.start), ": ");
  if (lag_worker < 0) {
    absl::StrAppend(&msg, "no live worker lags (servable at expiry)");
  } else {
    absl::StrAppend(&msg, "worker ", lag_worker, " at clock ", lag_entry,
                    " on range ", lag_range);
    if (lagging_pairs > 1) {
      absl::StrAppend(&msg, " (", lagging_pairs - 1,
                      " more lagging worker-range pairs)");
    }
  }
  return msg;
}

int ConsistencyController::ExpireWaits() {
  std::vector<std::pair<Ready, absl::Status>> fire;
  {
    absl::MutexLock l(&mu_);
    const absl::Time now = clock_->Now();
    size_t keep = 0;
    for (size_t i = 0; i < waits_.size(); ++i) {
      Wait& w = waits_[i];
      if (now >= w.deadline) {
        --pending_[w.worker];
        // A watch's deadline is an answer, not a failure (WaitOthers).
        fire.emplace_back(
            std::move(w.ready),
            w.others ? absl::OkStatus()
                     : ErrorWithReason(absl::StatusCode::kDeadlineExceeded,
                                       proto::REASON_CONSISTENCY_TIMEOUT,
                                       LagReasonLocked(w, now)));
      } else {
        if (keep != i) waits_[keep] = std::move(w);
        ++keep;
      }
    }
    waits_.erase(waits_.begin() + keep, waits_.end());
  }
  for (auto& [ready, status] : fire) ready(std::move(status));
  return static_cast<int>(fire.size());
}

void ConsistencyController::CancelAll(absl::Status status) {
  if (status.ok()) status = absl::CancelledError("pull wait cancelled");
  std::vector<Wait> waits;
  {
    absl::MutexLock l(&mu_);
    waits.swap(waits_);
    std::fill(pending_.begin(), pending_.end(), 0);
  }
  for (Wait& w : waits) w.ready(status);
}

int ConsistencyController::CancelRanges(absl::Span<const int> ranges,
                                        absl::Status status) {
  if (ranges.empty()) return 0;
  if (status.ok()) status = absl::CancelledError("pull wait cancelled");
  std::vector<Ready> fire;
  {
    absl::MutexLock l(&mu_);
    size_t keep = 0;
    for (size_t i = 0; i < waits_.size(); ++i) {
      Wait& w = waits_[i];
      bool touches = w.ranges.empty();
      for (int r : w.ranges) {
        if (std::find(ranges.begin(), ranges.end(), r) != ranges.end()) {
          touches = true;
          break;
        }
      }
      if (touches) {
        --pending_[w.worker];
        fire.push_back(std::move(w.ready));
      } else {
        if (keep != i) waits_[keep] = std::move(w);
        ++keep;
      }
    }
    waits_.erase(waits_.begin() + keep, waits_.end());
  }
  for (Ready& r : fire) r(status);
  return static_cast<int>(fire.size());
}

size_t ConsistencyController::pending_waits() const {
  absl::MutexLock l(&mu_);
  return waits_.size();
}

int64_t ConsistencyController::Entry(int range, int worker) const {
  if (range < 0 || range >= num_ranges_) return 0;
  absl::MutexLock l(&mu_);
  return ranges_[range].Get(worker);
}

std::vector<int64_t> ConsistencyController::MinClockPerWorker() const {
  absl::MutexLock l(&mu_);
  std::vector<int64_t> out(num_workers_.load(), 0);
  if (ranges_.empty()) return out;
  for (int w = 0; w < static_cast<int>(out.size()); ++w) {
    int64_t m = std::numeric_limits<int64_t>::max();
    for (const VectorClock& vc : ranges_) m = std::min(m, vc.Get(w));
    out[w] = m;
  }
  return out;
}

std::string ConsistencyController::DebugString() const {
  absl::MutexLock l(&mu_);
  std::string out = absl::StrCat("tau=", tau_);
  for (int r = 0; r < num_ranges_; ++r) {
    absl::StrAppend(&out, " r", r, "=", ranges_[r].DebugString());
  }
  std::vector<int> finished, dead;
  for (int w = 0; w < num_workers_.load(); ++w) {
    if (finished_[w]) finished.push_back(w);
    if (dead_[w]) dead.push_back(w);
  }
  absl::StrAppend(&out, " finished={", absl::StrJoin(finished, ","),
                  "} dead={", absl::StrJoin(dead, ","), "} waits=",
                  waits_.size());
  return out;
}

}  // namespace ps
