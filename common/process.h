// Process-wide settings of the production binaries (ps_server, ps_worker,
// ps_scheduler), set first thing in main().
#pragma once

#include <vector>

#include "absl/time/time.h"

namespace ps {

// Debian 12's Abseil is built without NDEBUG, so every absl::Mutex runs its
// deadlock detector: each acquisition while another lock is held records an
// edge in a process-wide graph under a global lock, and each Mutex's
// destruction removes its node (GraphCycles in a profile: 3-4% of all CPU
// of a replicated a9a job). The binaries turn it off; the tests keep it,
// which is where a lock-order inversion is caught (with clang's
// -Wthread-safety and TSan).
void UseReleaseMutexes();

// Blocks `signals` in the calling thread and in every thread it starts
// afterwards, so that they stay pending until WaitForSignal takes them.
// Call first thing in main(), before any thread exists (gRPC starts some).
void BlockSignals(const std::vector<int>& signals);

// Waits up to `timeout` for one of `signals` (blocked with BlockSignals) and
// returns it; 0 when none arrived in time. Any thread may call.
int WaitForSignal(const std::vector<int>& signals, absl::Duration timeout);

// Ends the process by `sig` with its default action (as if it had never
// been blocked): the exit status says "killed by sig". Does not return.
[[noreturn]] void DieBySignal(int sig);

}  // namespace ps
