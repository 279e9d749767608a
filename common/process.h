// Process-wide settings of the production binaries (ps_server, ps_worker,
// ps_scheduler), set first thing in main().
#pragma once

namespace ps {

// Debian 12's Abseil is built without NDEBUG, so every absl::Mutex runs its
// deadlock detector: each acquisition while another lock is held records an
// edge in a process-wide graph under a global lock, and each Mutex's
// destruction removes its node (GraphCycles in a profile: 3-4% of all CPU
// of a replicated a9a job). The binaries turn it off; the tests keep it,
// which is where a lock-order inversion is caught (with clang's
// -Wthread-safety and TSan).
void UseReleaseMutexes();

}  // namespace ps
