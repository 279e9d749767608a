// A vector clock over the workers of a job: entry w is the number of clocks
// (iterations) worker w has completed. Entries only move forward.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace ps {

// Not thread-safe; the owner (ConsistencyController) guards it.
class VectorClock {
 public:
  // All `num_workers` entries start at 0. A negative count is treated as 0.
  explicit VectorClock(int num_workers);

  int num_workers() const { return static_cast<int>(entries_.size()); }

  // Entry of `worker`; 0 for an id out of range.
  int64_t Get(int worker) const;

  // Adds a worker (id num_workers()) with entry `value` (issue 9).
  void AddWorker(int64_t value) { entries_.push_back(value); }

  // entry = max(entry, value). Ignores an id out of range.
  void Advance(int worker, int64_t value);

  // Minimum entry over the workers w with w < live.size() && live[w];
  // INT64_MAX when there are none. Does not allocate.
  int64_t MinOver(const std::vector<bool>& live) const;

  // E.g. "[3, 5, 5, 4]".
  std::string DebugString() const;

 private:
  std::vector<int64_t> entries_;
};

}  // namespace ps
