#include "common/parallel.h"

#include <algorithm>
#include <numeric>

#include "absl/synchronization/blocking_counter.h"

namespace ps {

struct ParallelRunner::Call {
  Call(absl::FunctionRef<void(int)> f, int parts) : fn(f), pending(parts) {}
  absl::FunctionRef<void(int)> fn;
  absl::BlockingCounter pending;  // parts queued, not yet returned
};

ParallelRunner::ParallelRunner(int parallelism) {
  for (int i = 1; i < parallelism; ++i) {
    helpers_.emplace_back([this] { HelperLoop(); });
  }
}

ParallelRunner::~ParallelRunner() {
  {
    absl::MutexLock l(&mu_);
    stopping_ = true;
  }
  for (std::thread& t : helpers_) t.join();
}

int ParallelRunner::DefaultParallelism() {
  const unsigned cores = std::thread::hardware_concurrency();
  return static_cast<int>(std::clamp(cores, 1u, 4u));
}

void ParallelRunner::RunTask(const Task& task) {
  task.call->fn(task.part);
  task.call->pending.DecrementCount();
}

void ParallelRunner::HelperLoop() {
  for (;;) {
    Task task;
    {
      absl::MutexLock l(&mu_);
      mu_.Await(absl::Condition(
          +[](ParallelRunner* r) ABSL_EXCLUSIVE_LOCKS_REQUIRED(r->mu_) {
            return r->stopping_ || !r->queue_.empty();
          },
          this));
      if (queue_.empty()) return;  // stopping, nothing left
      task = queue_.front();
      queue_.pop_front();
    }
    RunTask(task);
  }
}

void ParallelRunner::Run(int parts, absl::FunctionRef<void(int)> fn) {
  if (parts <= 0) return;
  if (parts == 1 || helpers_.empty()) {
    for (int i = 0; i < parts; ++i) fn(i);
    return;
  }
  Call call(fn, parts - 1);
  {
    absl::MutexLock l(&mu_);
    for (int i = 1; i < parts; ++i) queue_.push_back(Task{&call, i});
  }
  fn(0);
  // Take back the parts of this call no helper has started.
  for (;;) {
    Task task{nullptr, 0};
    {
      absl::MutexLock l(&mu_);
      auto it = std::find_if(queue_.begin(), queue_.end(),
                             [&](const Task& t) { return t.call == &call; });
      if (it == queue_.end()) break;
      task = *it;
      queue_.erase(it);
    }
    RunTask(task);
  }
  call.pending.Wait();
}

namespace {
constexpr int kPartsPerThread = 4;
}  // namespace

void ParallelRunner::ForEachBalanced(size_t n, size_t min_part_size,
                                     absl::FunctionRef<size_t(size_t)> size,
                                     absl::FunctionRef<void(size_t)> fn) {
  size_t total = 0;
  for (size_t i = 0; i < n; ++i) total += size(i);
  if (helpers_.empty() || total < 2 * min_part_size) {
    for (size_t i = 0; i < n; ++i) fn(i);
    return;
  }
  std::vector<size_t> sizes(n);
  for (size_t i = 0; i < n; ++i) sizes[i] = size(i);
  const std::vector<size_t> parts =
      BalancedParts(sizes, parallelism() * kPartsPerThread, min_part_size);
  Run(static_cast<int>(parts.size()) - 1, [&](int part) {
    for (size_t i = parts[part]; i < parts[part + 1]; ++i) fn(i);
  });
}

std::vector<size_t> BalancedParts(const std::vector<size_t>& sizes,
                                  int max_parts, size_t min_part_size) {
  const size_t n = sizes.size();
  const size_t total = std::accumulate(sizes.begin(), sizes.end(), size_t{0});
  size_t parts = min_part_size == 0 ? n : total / min_part_size;
  parts = std::min({parts, static_cast<size_t>(std::max(max_parts, 1)), n});
  std::vector<size_t> cuts{0};
  size_t acc = 0;
  size_t k = 1;  // cuts made so far + 1
  for (size_t i = 0; i + 1 < n && k < parts; ++i) {
    acc += sizes[i];
    if (acc * parts >= total * k) {
      cuts.push_back(i + 1);
      ++k;
    }
  }
  cuts.push_back(n);
  return cuts;
}

}  // namespace ps
