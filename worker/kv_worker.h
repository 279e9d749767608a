// KVWorker: the worker-side client of the parameter servers, in the spirit
// of ps-lite's KVWorker. Push and Pull slice the request by the routing
// table, send the slices to their servers in parallel and return a
// timestamp at once; Wait(ts, deadline) blocks until that operation is done.
//
// Guarantees:
//  * Each slice of a push carries (worker id, seq) with seq contiguous per
//    server; a slice that failed in transit is resent with the same seq, so
//    the server applies it exactly once.
//  * A slice answered "stale-epoch" makes the worker fetch the newer view
//    from the scheduler, re-slice the keys and resend them.
//  * Clock() ends the current clock: once all of its pushes are
//    acknowledged, every server is told (with how many pushes it got), so a
//    server advances the worker's vector-clock entry only after applying
//    them.
//  * The first permanent error is sticky: every later Wait, Clock and
//    Finish returns it.
//
// Thread-safety: all methods may be called from any thread; a training
// loop normally drives one KVWorker from one thread.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <set>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/routing.h"
#include "transport/transport.h"
#include "proto/ps.pb.h"

namespace ps {

struct KVWorkerOptions {
  int worker_id = 0;
  // Per request, the consistency wait on the server included.
  absl::Duration request_timeout = absl::Seconds(300);
  // How long the server may hold a pull for consistency.
  absl::Duration pull_wait = absl::Seconds(240);
};

class KVWorker {
 public:
  // `clients` and `scheduler` must outlive the worker. `view` must be a
  // ready cluster view.
  KVWorker(KVWorkerOptions options, const proto::ClusterView& view,
           ClientFactory* clients, SchedulerClient* scheduler);
  ~KVWorker();

  KVWorker(const KVWorker&) = delete;
  KVWorker& operator=(const KVWorker&) = delete;

  // Pushes `vals` (keys.size() * dim floats: gradient sums over
  // `num_examples` examples) for ascending, unique `keys`. Copies its
  // inputs. Returns the timestamp to wait on.
  int64_t Push(int table, absl::Span<const uint64_t> keys,
               absl::Span<const float> vals, int num_examples);

  // Fetches the values of ascending, unique `keys` into *out (resized to
  // keys.size() * dim). *out must stay alive and untouched until Wait(ts)
  // returns. The servers answer when the consistency model allows a pull at
  // `at_clock` (default: this worker's current clock). A prefetch for the
  // next clock passes clock() + 1: it then waits as that clock's pull would.
  int64_t Pull(int table, absl::Span<const uint64_t> keys,
               std::vector<float>* out, int64_t at_clock = -1);

  // Blocks until operation `ts` is done: its status, the sticky error, or
  // DEADLINE_EXCEEDED.
  absl::Status Wait(int64_t ts, absl::Time deadline);

  // Ends the current clock (see above). Returns a timestamp.
  int64_t Clock(int num_examples);
  // Clocks completed so far (= the clock of the next pull).
  int64_t clock() const;

  // Waits for every outstanding operation, then tells every server this
  // worker has finished after clock() clocks.
  absl::Status Finish(absl::Time deadline);

  int64_t epoch() const;
  int dim(int table) const;

 private:
  struct Op {
    int pending = 0;
    absl::Status status;
    std::function<void()> on_done;  // runs once, outside mu_
  };
  struct ClockState {
    int pending_pushes = 0;
    bool ended = false;
    int examples = 0;
    int64_t ts = -1;
    std::map<int, int64_t> pushes_per_server;
  };
  struct PushSlice {
    int64_t ts;
    int server;
    proto::PushRequest req;
  };
  struct PullSlice {
    int64_t ts;
    int server;
    int dim;
    std::vector<size_t> spans_first;  // key index ranges in the caller's
    std::vector<size_t> spans_last;   // array, in request order
    std::vector<float>* out;
    proto::PullRequest req;
  };

  int64_t NewOp(int pending) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Marks one part of op `ts` done with `s`; runs on_done when finished.
  void PartDone(int64_t ts, const absl::Status& s);
  void SendPush(std::shared_ptr<PushSlice> slice, int attempt);
  void SendPull(std::shared_ptr<PullSlice> slice, int attempt);
  void SendClock(int64_t clock);
  // Slices and sends a push for `ts`; adds one part per slice to the op.
  void StartPush(int64_t ts, int table, int64_t clock,
                 absl::Span<const uint64_t> keys, const float* vals,
                 int num_examples);
  // Slices and sends a pull for `ts`; `pos[i]` is where key i's values go
  // in *out (in units of keys); empty = identity.
  void StartPull(int64_t ts, int table, int64_t clock,
                 absl::Span<const uint64_t> keys,
                 const std::vector<size_t>& pos, std::vector<float>* out);
  // Fetches a view newer than the current one, if the scheduler has it.
  void RefreshView();
  void InstallView(const proto::ClusterView& view)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Runs `fn` on the retry thread after `delay`.
  void Later(absl::Duration delay, std::function<void()> fn);
  void RetryLoop();
  bool Retriable(const absl::Status& s) const;

  const KVWorkerOptions options_;
  ClientFactory* const clients_;
  SchedulerClient* const scheduler_;

  mutable absl::Mutex mu_;
  std::shared_ptr<const Routing> routing_ ABSL_GUARDED_BY(mu_);
  proto::ClusterView view_ ABSL_GUARDED_BY(mu_);
  std::vector<std::shared_ptr<ServerClient>> servers_ ABSL_GUARDED_BY(mu_);
  std::vector<int> dims_ ABSL_GUARDED_BY(mu_);
  std::map<int, uint64_t> next_seq_ ABSL_GUARDED_BY(mu_);  // per server
  // Per server, push seqs sent and not yet finally answered.
  std::map<int, std::set<uint64_t>> inflight_ ABSL_GUARDED_BY(mu_);
  std::map<int64_t, Op> ops_ ABSL_GUARDED_BY(mu_);
  std::map<int64_t, ClockState> clocks_ ABSL_GUARDED_BY(mu_);
  int64_t next_ts_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t clock_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Status sticky_ ABSL_GUARDED_BY(mu_);

  absl::Mutex retry_mu_;
  std::multimap<absl::Time, std::function<void()>> retries_
      ABSL_GUARDED_BY(retry_mu_);
  bool stopping_ ABSL_GUARDED_BY(retry_mu_) = false;
  std::thread retry_thread_;
};

}  // namespace ps
