#ifndef PS_COMMON_PARALLEL_H_
#define PS_COMMON_PARALLEL_H_

#include <cstddef>
#include <deque>
#include <functional>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/function_ref.h"
#include "absl/synchronization/mutex.h"

namespace ps {

// Runs the parts of one call on a fixed set of helper threads and the
// calling thread together: a server applies a large push or answers a large
// pull across its key ranges this way (issue 10). The caller takes part 0
// and, once done, any part no helper has started yet, so a call never waits
// behind another caller's work and never needs a free helper to finish.
// Thread-safe: many callers may Run at once.
class ParallelRunner {
 public:
  // `parallelism` threads in all, the caller's included (helpers:
  // parallelism - 1); below 2 every part runs on the caller.
  explicit ParallelRunner(int parallelism);
  ~ParallelRunner();

  ParallelRunner(const ParallelRunner&) = delete;
  ParallelRunner& operator=(const ParallelRunner&) = delete;

  int parallelism() const { return static_cast<int>(helpers_.size()) + 1; }

  // Calls fn(0), ..., fn(parts - 1), each once, possibly at the same time on
  // different threads; returns when every call has returned. `fn` must not
  // call Run on this runner.
  void Run(int parts, absl::FunctionRef<void(int)> fn);

  // Calls fn(0), ..., fn(n - 1), split into contiguous groups of about equal
  // total size(i) (BalancedParts; up to 4 per thread, each at least
  // min_part_size) run as the parts of one Run; on the caller alone, in
  // order, and without allocating when the total is below twice
  // min_part_size or there are no helpers (the common, small case).
  // Several groups per thread: a helper woken late (tens of microseconds
  // on a VM) finds fewer left instead of the caller waiting for its one
  // half (issue 10: a key-cached 100k-key push on 2 vCPUs was a fifth idle).
  void ForEachBalanced(size_t n, size_t min_part_size,
                       absl::FunctionRef<size_t(size_t)> size,
                       absl::FunctionRef<void(size_t)> fn);

  // The parallelism to use when none is configured: the machine's cores,
  // at most 4 (a push's apply stops scaling before memory bandwidth does).
  static int DefaultParallelism();

 private:
  struct Call;
  struct Task {
    Call* call;
    int part;
  };

  void HelperLoop();
  static void RunTask(const Task& task);

  absl::Mutex mu_;
  std::deque<Task> queue_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> helpers_;
};

// Splits items of the given sizes, in order, into contiguous groups of about
// equal total size: at most `max_parts` groups and at most
// total / min_part_size of them (one when the total is below twice it);
// returns each group's first index, then sizes.size(). A group ends where
// the running total first reaches its share, so an item larger than a share
// makes fewer, uneven groups.
std::vector<size_t> BalancedParts(const std::vector<size_t>& sizes,
                                  int max_parts, size_t min_part_size);

}  // namespace ps

#endif  // PS_COMMON_PARALLEL_H_
