#include "common/process.h"

#include <pthread.h>
#include <signal.h>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstdlib>
#include <ctime>

#include "absl/synchronization/mutex.h"

namespace ps {
namespace {

sigset_t SignalSet(const std::vector<int>& signals) {
  sigset_t set;
  sigemptyset(&set);
  for (int s : signals) sigaddset(&set, s);
  return set;
}

}  // namespace

void UseReleaseMutexes() {
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
}

void BlockSignals(const std::vector<int>& signals) {
  const sigset_t set = SignalSet(signals);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
}

int WaitForSignal(const std::vector<int>& signals, absl::Duration timeout) {
  const sigset_t set = SignalSet(signals);
  const timespec ts = absl::ToTimespec(std::max(timeout, absl::ZeroDuration()));
  for (;;) {
    const int sig = sigtimedwait(&set, nullptr, &ts);
    if (sig > 0) return sig;
    if (errno != EINTR) return 0;  // EAGAIN: the timeout
  }
}

void DieBySignal(int sig) {
  std::signal(sig, SIG_DFL);
  const sigset_t set = SignalSet({sig});
  pthread_sigmask(SIG_UNBLOCK, &set, nullptr);
  std::raise(sig);  // to this thread, which no longer blocks it
  std::abort();  // not reached: the default action of the signals used
}

}  // namespace ps
