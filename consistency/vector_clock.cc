#include "consistency/vector_clock.h"

#include <algorithm>
#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace ps {

VectorClock::VectorClock(int num_workers)
    : entries_(static_cast<size_t>(std::max(num_workers, 0)), 0) {}

int64_t VectorClock::Get(int worker) const {
  if (worker < 0 || worker >= num_workers()) return 0;
  return entries_[worker];
}

void VectorClock::Advance(int worker, int64_t value) {
  if (worker < 0 || worker >= num_workers()) return;
  entries_[worker] = std::max(entries_[worker], value);
}

int64_t VectorClock::MinOver(const std::vector<bool>& live) const {
  int64_t min = std::numeric_limits<int64_t>::max();
  const size_t n = std::min(live.size(), entries_.size());
  for (size_t w = 0; w < n; ++w) {
    if (live[w]) min = std::min(min, entries_[w]);
  }
  return min;
}

std::string VectorClock::DebugString() const {
  return absl::StrCat("[", absl::StrJoin(entries_, ", "), "]");
}

}  // namespace ps
