#include "common/process.h"

#include "absl/synchronization/mutex.h"

namespace ps {

void UseReleaseMutexes() {
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
}

}  // namespace ps
