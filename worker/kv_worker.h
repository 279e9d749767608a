// KVWorker: the worker-side client of the parameter servers, in the spirit
// of ps-lite's KVWorker. Push and Pull slice the request by the routing
// table, send the slices to their servers in parallel and return a
// timestamp at once; Wait(ts, deadline) blocks until that operation is done.
//
// Guarantees:
//  * A push is cut by key range into segments, each with (worker id, range,
//    seq), seq contiguous per (worker, range); the segments of one server
//    travel in one request. A request that failed in transit is resent with
//    the same segments, and after a view change its segments are regrouped
//    by their ranges' new owners, still with the same seqs: the server (any
//    server that holds the range's state) applies each exactly once.
//  * Retries are decided by status code and typed reason (transport.h),
//    never by message text:
//      FAILED_PRECONDITION + STALE_EPOCH: fetch the newer view from the
//        scheduler, re-slice the keys and resend them;
//      UNAVAILABLE (VIEW_BEHIND included), DEADLINE_EXCEEDED, ABORTED: resend
//        the same request after backoff;
//      DEADLINE_EXCEEDED + CONSISTENCY_TIMEOUT on a pull: final.
//    An operation has ONE retry budget (max_attempts and retry_timeout from
//    its start) shared by all its slices, re-slices included. When it runs
//    out, the operation fails with the last error (its code and reason)
//    annotated "push to S[i]: gave up after N attempts".
//  * Once a permanent error is recorded (the sticky error), no operation
//    is retried any more and every later Wait, Clock and Finish returns it.
//  * Clock() ends the current clock: every server is told at once, per
//    range it owns, how many segments the clock sent there, so a range
//    advances the worker's vector-clock entry only after applying them
//    (the announcement may arrive before the segments). The clock's
//    timestamp completes when the announcement and every push of the
//    clock were acknowledged. PushAndClock ends it with its push: each
//    server's share of the announcement rides on that server's push
//    request, so an iteration costs one round trip per server, not two.
//  * Once Wait(ts) has returned, with any status, no reply writes into the
//    output of pull `ts` any more: the caller may free it at once.
//  * After the destructor returns, no transport or timer callback touches
//    the worker: queued retries are cancelled, callbacks running are waited
//    for and later replies are dropped.
//
// Time: every timer (retry backoff) and request deadline comes from the
// injected Clock (KVWorkerOptions::clock). Wait and Finish deadlines are
// real time (they bound how long the calling thread blocks).
//
// Thread-safety: all methods may be called from any thread; a training
// loop normally drives one KVWorker from one thread.
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <list>
#include <map>
#include <set>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/clock.h"
#include "common/metrics.h"
#include "common/routing.h"
#include "models/model.h"
#include "transport/transport.h"
#include "proto/ps.pb.h"
#include "worker/push_filter.h"

namespace ps {

struct KVWorkerOptions {
  int worker_id = 0;
  // Per request, the consistency wait on the server included.
  absl::Duration request_timeout = absl::Seconds(300);
  // How long the server may hold a pull for consistency.
  absl::Duration pull_wait = absl::Seconds(240);
  // The retry budget of one operation, shared by all its slices and
  // re-slices: at most this many resends of one slice chain, and none
  // scheduled later than retry_timeout after the operation started.
  // max_attempts is the budget that normally runs out first (backoff grows
  // from 20 ms to 1 s); retry_timeout also covers slow answers (a pull may
  // be held up to pull_wait before it fails and is resent).
  int max_attempts = 60;
  absl::Duration retry_timeout = absl::Seconds(300);
  // Failover (issue 9): a push or clock a server has left unanswered this
  // long makes SuspectSilentServers name that server to the scheduler as a
  // suspect, which probes it (fault_tolerance.suspect_after_ms). Zero: off.
  absl::Duration suspect_after = absl::ZeroDuration();
  // Backpressure: a push (or clock end) waits while the oldest clock with a
  // push not yet acknowledged is this many clocks behind the current one.
  // Unacknowledged pushes are resent after a failover, and a server takes
  // none more than ServerLimits::max_clock_ahead (1000) clocks ahead of
  // what that worker completed there: a worker whose pushes wait on a
  // stalled replication (its primary still answers pulls) ran 1000 clocks
  // ahead in seconds, and its resends were refused. 0: unbounded.
  int max_unacked_clocks = 256;
  // Timers and request deadlines. Must outlive the worker.
  Clock* clock = Clock::Real();
  // Key caching (the paper's section 4.2, server/key_cache.h): per server,
  // the key lists most recently sent there that the server keeps; a request
  // with one of them sends its name instead of its keys. 0: off (every
  // request carries its keys).
  int key_lists_per_server = 16;
  // Metrics (issue 11; may be null, must outlive the worker): every push and
  // pull once it is done, its latency from the call to its last slice's
  // answer (retries included), its bytes the keys and values asked for
  // (before key caching); `wait_ns` counts the nanoseconds callers spent
  // blocked in Wait (the training thread's waiting on the network).
  PushPullMetrics* metrics = nullptr;
  Counter* wait_ns = nullptr;
  // Filters and compression of pushes (issue 10, worker/push_filter.h):
  // off by default.
  PushFilterOptions filters;
};

// A key list that pushes and pulls name again and again (the paper's key
// caching, section 4.2, on the worker's side): each server's part of it is
// cut and compared with the lists sent there once per routing, so a push or
// pull by a KeySet neither copies its keys nor compares them with the lists
// the servers keep (with 100k keys, that compare was a tenth of a
// key-cached push's CPU). The keys are copied once, here; immutable after.
// Thread-safe, and usable with any worker, though it keeps one routing's
// cut: used by workers of different views in turn, it is cut anew each
// time.
class KeySet {
 public:
  explicit KeySet(absl::Span<const uint64_t> keys)
      : keys_(keys.begin(), keys.end()) {}
  KeySet(const KeySet&) = delete;
  KeySet& operator=(const KeySet&) = delete;

  absl::Span<const uint64_t> keys() const { return keys_; }

 private:
  friend class KVWorker;
  // A run of keys [first, last) in one range.
  struct Run {
    int range;
    size_t first, last;
  };
  // The keys each server gets under `routing` (held, so that a routing
  // freed and another made at its address is never taken for it), and the
  // keys' runs by range and slices by server (each made on first use).
  struct Cut {
    std::shared_ptr<const Routing> routing;
    std::vector<std::pair<int, std::shared_ptr<const std::string>>> by_server;
    std::shared_ptr<const std::vector<Run>> runs;
    std::shared_ptr<const std::vector<KeySlice>> slices;
  };
  // The runs (pushes) or slices (pulls) of the keys under `routing`.
  std::shared_ptr<const std::vector<Run>> RunsFor(
      const std::shared_ptr<const Routing>& routing) const;
  std::shared_ptr<const std::vector<KeySlice>> SlicesFor(
      const std::shared_ptr<const Routing>& routing) const;
  // Resets cut_ to `routing` when it was made for another.
  void CutFor(const std::shared_ptr<const Routing>& routing) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  const std::vector<uint64_t> keys_;
  mutable absl::Mutex mu_;
  mutable Cut cut_ ABSL_GUARDED_BY(mu_);
};

class KVWorker final : public ParamClient {
 public:
  // `clients`, `scheduler` and `options.clock` must outlive the worker.
  // `view` must be a ready cluster view; the worker's clock starts at its
  // NodeInfo's start_clock (0 unless it joined a running job).
  KVWorker(KVWorkerOptions options, const proto::ClusterView& view,
           ClientFactory* clients, SchedulerClient* scheduler);
  ~KVWorker();

  KVWorker(const KVWorker&) = delete;
  KVWorker& operator=(const KVWorker&) = delete;

  // Pushes `vals` (keys.size() * dim floats: gradient sums over
  // `num_examples` examples) for ascending, unique `keys`. Copies its
  // inputs. Returns the timestamp to wait on.
  int64_t Push(int table, absl::Span<const uint64_t> keys,
               absl::Span<const float> vals, int num_examples) override;

  // Push, then Clock(num_examples), in one round trip per server: each
  // server's share of the clock's announcement rides on its push request
  // (servers the push does not reach get their own). Returns the clock's
  // timestamp, which completes when the push and the announcement were
  // acknowledged (as Clock's does). The end of a training iteration.
  int64_t PushAndClock(int table, absl::Span<const uint64_t> keys,
                       absl::Span<const float> vals,
                       int num_examples) override;

  // Push and PushAndClock without copying the values (as ps-lite's ZPush):
  // `vals` must stay unchanged while `owner` lives, and the worker and its
  // transport keep a copy of `owner` until they no longer read them (the
  // op's last send, resends included, is done). The keys are copied. With
  // filters or a value encoding, which rewrite the values, they are copied
  // as Push does.
  int64_t ZPush(int table, absl::Span<const uint64_t> keys,
                absl::Span<const float> vals, std::shared_ptr<const void> owner,
                int num_examples);
  int64_t ZPushAndClock(int table, absl::Span<const uint64_t> keys,
                        absl::Span<const float> vals,
                        std::shared_ptr<const void> owner, int num_examples);
  // ZPush and ZPushAndClock of a KeySet's keys (vals: keys.size() * dim
  // floats). `keys` need only live for the call. With filters that drop
  // keys (the significantly-modified filter), as ZPush of keys.keys().
  int64_t ZPush(int table, const KeySet& keys, absl::Span<const float> vals,
                std::shared_ptr<const void> owner, int num_examples);
  int64_t ZPushAndClock(int table, const KeySet& keys,
                        absl::Span<const float> vals,
                        std::shared_ptr<const void> owner, int num_examples);

  // Memory for a ZPush's values (issue 10): `floats` floats, 64-byte
  // aligned, that the data plane hands a same-host server where they lie,
  // without copying them (its shared memory, transport/shared_arena.h;
  // `shared`), or, where it cannot (no shared memory, or none left),
  // ordinary memory, pushed as ZPush pushes any. Write the values there and
  // pass `owner` to ZPush; rewrite them once the push is done (Wait). A
  // slice to a server on another host is sent from it as from any memory.
  // The shared memory is cluster.shared_memory_mb for this process's
  // connections, request slots included: buffers kept for long take room
  // from large requests (which then go through the sockets).
  struct PushBuffer {
    absl::Span<float> vals;
    std::shared_ptr<const void> owner;
    bool shared = false;
  };
  PushBuffer NewPushBuffer(size_t floats);

  // Fetches the values of ascending, unique `keys` into *out (resized to
  // keys.size() * dim). *out must stay alive and untouched until Wait(ts)
  // returns; after that no reply writes into it (even when Wait failed). The servers answer when the consistency model allows a pull at
  // `at_clock` (default: this worker's current clock). A prefetch for the
  // next clock passes clock() + 1: it then waits as that clock's pull would.
  int64_t Pull(int table, absl::Span<const uint64_t> keys,
               std::vector<float>* out, int64_t at_clock = -1) override;
  // A pull's values where they arrived (PullInPlace), in key order: piece
  // i holds the values of keys.size() / dim keys from key pieces[i].first
  // on, valid while `keep` (or a copy of it) lives.
  struct PulledValues {
    struct Piece {
      size_t first = 0;
      absl::Span<const float> vals;
      std::shared_ptr<const void> keep;
    };
    std::vector<Piece> pieces;
    // Copies every piece to its place in `out` (the pull's keys * dim
    // floats).
    void CopyTo(float* out, int dim) const;
  };
  // Pull without the copy into a vector (issue 10): *out gets the values
  // where the transport received them, in pieces (a piece per server and
  // run of keys: one for a pull from one server), kept as long as *out
  // holds them. From a same-host server with shared memory, that is the
  // arena slot the server wrote them into: a 4 MiB pull's copy into the
  // caller's vector was 45 % of the worker's CPU. *out is cleared by the
  // call, must stay alive until Wait(ts) returns, and is complete only when
  // that returned OK; after that no reply changes it.
  int64_t PullInPlace(int table, absl::Span<const uint64_t> keys,
                      PulledValues* out, int64_t at_clock = -1);

  // Pull of a KeySet's keys (ascending and unique, as Pull's); `keys` need
  // only live for the call.
  int64_t Pull(int table, const KeySet& keys, std::vector<float>* out,
               int64_t at_clock = -1);

  // SSP catch-up (issue 9): a pull of `key` that the servers hold until
  // every other worker still training has completed `others_at` clocks on
  // its range (PullRequest.others_at), or for at most `max_wait`; then
  // `fired` runs once, on a transport thread and never under this worker's
  // lock, with OK (others_min_clock() updated with where the others were)
  // or the pull's error after its retries. Nothing waits for it: its values
  // are dropped, Finish does not wait for it, its failure is not the
  // sticky error, and its hold counts neither in consistency_wait_seconds
  // nor in the metrics. Returns false (and never runs `fired`) for an
  // unknown table.
  bool WatchOthers(int table, uint64_t key, int64_t others_at,
                   absl::Duration max_wait,
                   std::function<void(absl::Status)> fired) override;

  // Blocks until operation `ts` is done, at most until `deadline` (real
  // time). Returns OK when it succeeded; its own error; the sticky error
  // (some operation failed: returns at once, without waiting for `ts`);
  // DEADLINE_EXCEEDED when `ts` is not done by the deadline;
  // INVALID_ARGUMENT for a timestamp never handed out. In BSP with
  // replicas a push is acknowledged once its clock's sum is on the backups
  // (replication after aggregation), so it cannot complete before its
  // clock ends: waiting for one of the current clock returns
  // FAILED_PRECONDITION at once (the push goes on; end the clock first). Whatever it returns,
  // operation `ts` is given up by the caller: a pull's output is no longer
  // written. Wait once per timestamp.
  absl::Status Wait(int64_t ts, absl::Time deadline) override;

  // Whether Wait(ts) would return at once: operation `ts` is done (or was
  // waited for already), or some operation failed (the sticky error).
  // Does not wait and does not give `ts` up. Thread-safe.
  bool Done(int64_t ts) const;

  // Ends the current clock (see above). Returns a timestamp.
  int64_t Clock(int num_examples) override;
  // Clocks completed so far (= the clock of the next pull).
  int64_t clock() const override;
  int64_t others_min_clock() const override {
    return others_min_clock_.load(std::memory_order_relaxed);
  }
  // Seconds the servers held this worker's pulls for the consistency bound
  // so far (per pull, its longest-held slice): the part of the waiting that
  // BSP/SSP cost, apart from transfer and queueing. Thread-safe.
  double consistency_wait_seconds() const {
    return static_cast<double>(held_us_total_.load()) * 1e-6;
  }
  // Of the time callers spent in Wait, the part the servers held the
  // awaited pulls for the consistency bound: per pull, the lesser of its
  // hold and the time a Wait waited for it. A prefetched pull held while
  // the caller computed, and answered before it waited, counts nothing
  // here (it does above). Thread-safe.
  double held_wait_seconds() const {
    return static_cast<double>(held_waited_us_.load()) * 1e-6;
  }

  // Push traffic so far (issue 10): bytes of keys and values the push
  // requests carried (after filters, encoding and compression; every
  // attempt), and what the pushes' inputs were as uint64 keys and float32
  // values. Thread-safe.
  int64_t push_bytes() const { return push_bytes_.load(); }
  int64_t push_raw_bytes() const { return push_raw_bytes_.load(); }

  // Waits for every outstanding operation, then tells every server this
  // worker has finished after clock() clocks (retrying UNAVAILABLE with
  // backoff until `deadline`). Returns the sticky error at once when there
  // is one; DEADLINE_EXCEEDED when operations are still outstanding at the
  // deadline; otherwise the first server's Finish error, annotated with it.
  absl::Status Finish(absl::Time deadline);

  int64_t epoch() const;
  int dim(int table) const;

  // The scheduler's view epoch as a heartbeat reply gave it (issue 9): when
  // newer than the worker's, fetches that view. Calls still waiting on a
  // server the new view marks dead (failed over) then fail at once with a
  // stale-epoch error and go to the ranges' new owners: a server that hangs
  // (stopped, or cut off with its connections open) breaks no connection,
  // and its calls would otherwise wait for their deadline. Thread-safe.
  void OnSchedulerEpoch(int64_t epoch);

  // Issue 9: the scheduler declared this worker dead (its heartbeats
  // refused with `why`, or a view that marks it NODE_DEAD: it hung past the
  // heartbeat timeout, or was cut off from a server the others reach). Its
  // work units went to the others and the servers take nothing new from
  // it: every operation in flight and every later one fails with `why`
  // (the sticky error), so the trainer stops instead of retrying into the
  // void. Thread-safe; idempotent.
  void Fence(const absl::Status& why);

  // Issue 9: a server that hangs answers nothing, and its heartbeats stop
  // only as fast as cluster.heartbeat_timeout_ms can tell. Names to the
  // scheduler (which probes it: a status RPC of probe_timeout_ms, twice)
  // every server that has left a push or clock unanswered for
  // options.suspect_after and answered nothing else meanwhile (a lossy
  // network leaves calls waiting on retries from a server that answers
  // others), at most once per suspect_after per server. A server that
  // answers the probe is not failed over, unless nodes go on naming it
  // (SchedulerCore::GetView: a partition between it and them). A pull
  // alone does not make a server silent (consistency may hold it), but a
  // server that has answered nothing for suspect_after while a call of any
  // kind waits on it, and whose last status ask (PingSilentServers) since
  // found it unreachable, is named too: a pull's answer lost in a cut
  // leaves its worker waiting, and in BSP every other worker with it.
  // Returns the servers named. Thread-safe; blocks while the scheduler
  // answers each naming: the worker runner calls it after
  // PingSilentServers, every heartbeat interval, on a thread of its own.
  std::vector<int> SuspectSilentServers();

  // Issue 9: a server can be reachable and still answer nothing for long:
  // in BSP a push or clock is answered once its clock's sum is complete,
  // so the workers ahead of a straggler hear nothing from any server until
  // it catches up. Asks every server silent (as SuspectSilentServers counts
  // it, or with only a pull waiting on it) for half of
  // options.suspect_after for its status, waiting at most `timeout`; one
  // that answers counts as heard from, so a worker names only servers it
  // cannot reach (before, two workers waiting on a straggler had every
  // server failed over); one that does not is noted unreached. Blocks: the
  // worker runner calls it every heartbeat on a thread of its own. Returns
  // the servers that answered.
  std::vector<int> PingSilentServers(absl::Duration timeout);

 private:
  // Where a pull's values go; shared by its slices. Wait clears `out`, so a
  // reply that arrives later writes nothing.
  struct PullTarget {
    absl::Mutex mu;
    std::vector<float>* out ABSL_GUARDED_BY(mu) = nullptr;
    // PullInPlace's (then out is null); Wait clears it as `out`.
    PulledValues* in_place ABSL_GUARDED_BY(mu) = nullptr;
    bool kept = false;  // PullInPlace: constant once shared
    // WatchOthers: PullRequest.others_at and wait_ms (constant once shared).
    int64_t others_at = 0;
    absl::Duration watch_wait;
  };
  struct Op {
    int pending = 0;
    absl::Status status;
    std::function<void()> on_done;  // runs once, outside mu_
    // WatchOthers: runs once, outside mu_, with the op's status. A watch's
    // failure is not sticky, Finish does not wait for it, and its hold is
    // not counted as a pull's.
    std::function<void(absl::Status)> on_watch;
    bool watch = false;
    absl::Time retry_deadline;      // no retry scheduled after it
    bool abandoned = false;         // Wait returned before it was done
    std::shared_ptr<PullTarget> target;  // pulls only
    int64_t held_us = 0;  // pulls: the longest a server held a slice
    // When a Wait began waiting for it while it was still pending (0: none
    // did): the part of a hold a caller waited through (held_waited_us_).
    int64_t wait_start_ns = 0;
    int64_t push_clock = -1;  // pushes: the clock they belong to
    // Metrics (issue 11): kind (-1: not recorded), when it began.
    int kind = -1;
    int table = 0;
    uint64_t bytes = 0;
    int64_t start_ns = 0;
  };
  struct ClockState {
    int pending_pushes = 0;
    bool ended = false;
    bool sent = false;  // SendClock ran; erased once no push is pending
    int examples = 0;
    int64_t ts = -1;
    std::vector<int64_t> segments_per_range;  // by range, grown on use
  };
  // A range's push segment seqs: the last one sent (`next`), and the
  // answers of those after `settled` (every seq <= settled had its final
  // answer), in seq order: `open[i]` is seq settled + 1 + i.
  struct RangeSeqs {
    uint64_t next = 0;
    uint64_t settled = 0;
    std::deque<bool> open;
  };
  struct PushSlice {
    int64_t ts;
    int server;
    int64_t clock_ts = -1;  // the op of req.end_clock, when it has one
    // uint64[]; sent borrowed (req.keys stays empty) unless the server
    // keeps the list. Shared with the sent list it equals, if any
    // (SliceKeys).
    std::shared_ptr<const std::string> keys;
    // Whether the last send carried the keys (SendPush).
    bool keys_sent = false;
    proto::PushRequest req;
    // The values, when borrowed from the caller (ZPush): req.vals is empty.
    BorrowedValues borrowed;
  };
  struct PullSlice {
    int64_t ts;
    int server;
    int dim;
    std::vector<size_t> spans_first;  // key index ranges in the caller's
    std::vector<size_t> spans_last;   // array, in request order
    std::shared_ptr<PullTarget> target;
    std::shared_ptr<const std::string> keys;  // as PushSlice's
    proto::PullRequest req;
  };
  // A key list sent to a server under a name (key caching).
  struct SentList {
    uint64_t id;
    int table;
    std::shared_ptr<const std::string> keys;  // shared with the slices
    bool kept = false;  // a request carrying it succeeded: the server has it
  };
  // Lets transport and timer callbacks reach the worker only while it
  // lives: the destructor clears `alive` and waits until `running` is 0.
  // A call in flight to a server; its reply runs once (Tracked).
  struct InFlightCall {
    virtual ~InFlightCall() = default;
    // Runs the reply with `why` and an empty response.
    virtual void Fail(const absl::Status& why) = 0;
    bool fired = false;  // guarded by Life::mu
    // A push or clock (answered without waiting on consistency): counts
    // for SuspectSilentServers from `sent` on. Constant once registered.
    bool watched = false;
    // When it was sent (set only with options.suspect_after).
    absl::Time sent;
  };
  struct Life {
    absl::Mutex mu;
    bool alive ABSL_GUARDED_BY(mu) = true;
    int running ABSL_GUARDED_BY(mu) = 0;
    // By server id: the calls sent there and not answered yet.
    absl::flat_hash_map<int, absl::flat_hash_set<std::shared_ptr<InFlightCall>>>
        calls ABSL_GUARDED_BY(mu);
    // Servers whose calls FailCallsTo failed, and why: a call to one of
    // them made later (routed by the view before the failover, sent after
    // the sweep) fails at once too.
    absl::flat_hash_set<int> dead ABSL_GUARDED_BY(mu);
    absl::Status dead_why ABSL_GUARDED_BY(mu);
    // SuspectSilentServers: names each server at most once per interval.
    IntervalPerId suspected ABSL_GUARDED_BY(mu);
    // PingSilentServers: logs each server it spared at most as often.
    IntervalPerId pinged ABSL_GUARDED_BY(mu);
    // By server id: when it last answered a call of any kind (an error
    // from it counts; a transport's UNAVAILABLE or DEADLINE_EXCEEDED does
    // not). A server that answers something is reachable, however many of
    // its calls a lossy network leaves waiting on their retries.
    absl::flat_hash_map<int, absl::Time> heard ABSL_GUARDED_BY(mu);
    // By server id: when a status ask (PingSilentServers) last failed to
    // reach it.
    absl::flat_hash_map<int, absl::Time> unreached ABSL_GUARDED_BY(mu);
  };

  // `fn` wrapped so that it does nothing once the worker is being
  // destroyed, and the destructor waits while it runs.
  template <typename F>
  auto Guarded(F fn);
  // A transport callback for a call to server `server`, Guarded, that runs
  // once: on the transport's answer, or earlier, failed by
  // FailCallsTo(server) when the view marks that server dead; the answer
  // that comes after that is dropped.
  // `watched`: a push or clock, for SuspectSilentServers. `Extra`: the
  // callback's arguments after the response (a pull's values), given
  // value-initialised when the call is failed here.
  template <typename Resp, typename... Extra, typename F>
  std::function<void(const absl::Status&, Resp*, Extra...)> Tracked(
      int server, F fn, bool watched = false);
  // For `server`, whose calls in flight are `calls`: since when its oldest
  // push or clock has waited (`waiting`), and since when it has answered
  // nothing (`since`: that, or its last answer if later). InfiniteFuture
  // both when no push or clock waits on it. `any_since`: as `since`,
  // counting pulls too.
  struct Silence {
    absl::Time waiting = absl::InfiniteFuture();
    absl::Time since = absl::InfiniteFuture();
    absl::Time any_since = absl::InfiniteFuture();
  };
  Silence SilenceLocked(
      int server,
      const absl::flat_hash_set<std::shared_ptr<InFlightCall>>& calls) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(life_->mu);
  // Fails every call in flight to these servers with `why` (stale epoch).
  void FailCallsTo(const std::vector<int>& servers, const absl::Status& why);

  int64_t NewOp(int pending) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Marks one part of op `ts` done with `s`; runs on_done when finished.
  // `held_us`: a pull slice's PullResponse.held_us (the op keeps the
  // longest).
  void PartDone(int64_t ts, const absl::Status& s, int64_t held_us = 0);
  // Whether a part of op `ts` that failed with attempt `attempt` may be
  // retried after `backoff`: budget left, no sticky error, not closing.
  bool MayRetry(int64_t ts, int attempt, absl::Duration backoff);
  // The final status of a part that failed with `s` and will not be
  // retried: the sticky error when there is one (that is why), else `s`
  // annotated with the server (and the attempts, when it was retriable).
  absl::Status GaveUp(const absl::Status& s, const char* what, int server,
                      int attempt) const;
  // Key caching: sets req's keys from `keys`, or only its key_list and
  // num_keys when `server` keeps that list; names new lists. Returns
  // whether the keys go with the request. With `borrow`, req's keys stay
  // empty: the caller sends `keys` borrowed (a push: no copy of its keys
  // into the request).
  template <typename Req>
  bool AttachKeys(int server, const std::shared_ptr<const std::string>& keys,
                  Req* req, bool borrow = false);
  // The keys of a request to `server`: keys[first, last) for each of
  // `spans`, in order (`count` in all). With key caching, the string of a
  // list sent to `server` for `table` before, when equal (the spans are
  // compared in place: a repeated list is not copied, and AttachKeys then
  // finds it by pointer); else a new string.
  std::shared_ptr<const std::string> SliceKeys(
      int server, int table, absl::Span<const uint64_t> keys,
      absl::Span<const std::pair<size_t, size_t>> spans, size_t count);
  // SliceKeys of `set`'s keys (`keys` is set->keys()): the cut made for
  // `routing` before, if any; else SliceKeys, kept in the set. Without a
  // set, SliceKeys.
  std::shared_ptr<const std::string> SliceSet(
      const KeySet* set, const std::shared_ptr<const Routing>& routing,
      int server, int table, absl::Span<const uint64_t> keys,
      absl::Span<const std::pair<size_t, size_t>> spans, size_t count);
  // A request that carried its keys under key_list `id` succeeded: the
  // server keeps them. Or it answered KEYS_NOT_CACHED: it does not.
  void ListKept(int server, uint64_t id);
  void ListLost(int server, uint64_t id);
  void SendPush(std::shared_ptr<PushSlice> slice, int attempt);
  void OnPushReply(std::shared_ptr<PushSlice> slice, int attempt,
                   const absl::Status& s);
  void SendPull(std::shared_ptr<PullSlice> slice, int attempt);
  // `vals`: the answer's values (ServerClient::PullValues).
  // `keep`: what keeps `vals` valid (PullInPlace's slices).
  void OnPullReply(std::shared_ptr<PullSlice> slice, int attempt,
                   const absl::Status& s, proto::PullResponse* resp,
                   absl::Span<const char> vals,
                   std::shared_ptr<const void> keep = nullptr);
  // Push's first step: a new op (*ts, with a guard part for the caller to
  // release) counted as a push of the current clock (*clock), which
  // end_clock also ends (*clock_ts, see EndClockLocked). INVALID_ARGUMENT
  // for a bad table or value count.
  absl::Status BeginPush(int table, absl::Span<const uint64_t> keys,
                         absl::Span<const float> vals, bool end_clock,
                         int clock_examples, int64_t* ts, int64_t* clock,
                         int64_t* clock_ts);
  // Ends the current clock; returns its op, whose guard part the caller
  // releases once the announcement is sent.
  int64_t EndClockLocked(int num_examples) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The next seq of `range`, marked sent; and the final answer of one.
  uint64_t SentLocked(int range) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void AnsweredLocked(int range, uint64_t seq)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The announcement of ended clock `clock`: every range, its segment
  // count and settled seq.
  proto::ClockRequest AnnouncementLocked(int64_t clock, const ClockState& cs)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void SendClock(int64_t clock);
  // Sends the per-range announcements `req` to their owners in the current
  // view (one request per owner), as parts of op `ts`.
  void SendClockRanges(const proto::ClockRequest& req, int64_t ts,
                       int attempt);
  void SendClockTo(std::shared_ptr<const proto::ClockRequest> req,
                   std::shared_ptr<ServerClient> client, int64_t ts,
                   int server, int attempt);
  // Sends the segments of `slices` (one request each) after regrouping
  // them by the current owners of their ranges; adds parts to op `ts`.
  void ResendSegments(const PushSlice& old, int attempt);
  // Slices and sends a push for `ts`; adds one part per slice to the op.
  // New slices start at `attempt` (the op's budget carries over).
  // clock_ts >= 0: `clock` has ended (op clock_ts) with this push, whose
  // slices carry its announcement (PushAndClock). `slots`: the keys'
  // residual slots (PushFilter::Filter), null when none are kept.
  // `owner`: non-null when `vals` are borrowed (ZPush). `set`: non-null
  // when `keys` are its keys (SliceSet).
  void StartPush(int64_t ts, int table, int64_t clock,
                 absl::Span<const uint64_t> keys, const float* vals,
                 int num_examples, int attempt, int64_t clock_ts = -1,
                 const uint32_t* slots = nullptr,
                 const std::shared_ptr<const void>& owner = nullptr,
                 const KeySet* set = nullptr);
  // Push, PushAndClock and their ZPush forms (`owner` non-null), of a
  // KeySet's keys when `set` is not null (keys is then set->keys()).
  int64_t PushImpl(int table, absl::Span<const uint64_t> keys,
                   absl::Span<const float> vals,
                   const std::shared_ptr<const void>& owner, int num_examples,
                   bool end_clock, const KeySet* set = nullptr);
  // Push and PushAndClock after BeginPush: filters (when configured), then
  // StartPush.
  void FilterAndStart(int64_t ts, int table, int64_t clock,
                      absl::Span<const uint64_t> keys,
                      absl::Span<const float> vals, int num_examples,
                      int64_t clock_ts,
                      const std::shared_ptr<const void>& owner,
                      const KeySet* set);
  // Both Pulls (`set`: as PushImpl's).
  // Into *out, or, when it is null, into *in_place.
  int64_t PullImpl(int table, absl::Span<const uint64_t> keys,
                   std::vector<float>* out, int64_t at_clock, const KeySet* set,
                   PulledValues* in_place = nullptr);
  // Slices and sends a pull for `ts`; `pos[i]` is where key i's values go
  // in the output (in units of keys); empty = identity.
  void StartPull(int64_t ts, int table, int64_t clock,
                 absl::Span<const uint64_t> keys,
                 const std::vector<size_t>& pos,
                 std::shared_ptr<PullTarget> target, int attempt,
                 const KeySet* set = nullptr);
  // Fetches a view newer than the current one, if the scheduler has it
  // (waiting up to 200 ms for one). `suspect` >= 0: a server this worker
  // could not reach, which the scheduler probes (failover, issue 9).
  // `sent_epoch` >= 0: the epoch of the request that failed; when a newer
  // view is installed already (another request's retry fetched it), returns
  // at once: waiting for one newer still held every retry after the first
  // for the whole 200 ms. `silent`: how long nothing at all came from
  // `suspect` (SuspectSilentServers; zero: not known).
  void RefreshView(int suspect = -1, int64_t sent_epoch = -1,
                   absl::Duration silent = absl::ZeroDuration());
  void InstallView(const proto::ClusterView& view)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Runs `fn` on the clock's timer thread after `delay`, unless the worker
  // is closing (then returns false and never runs it).
  bool Later(absl::Duration delay, std::function<void()> fn);
  // Detaches op `ts` from its caller (Wait returned).
  void Abandon(int64_t ts) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Constant after construction.
  const KVWorkerOptions options_;
  ps::Clock* const clock_;  // "Clock" alone names the method
  ClientFactory* const clients_;
  SchedulerClient* const scheduler_;
  const std::shared_ptr<Life> life_;
  // Null without filters or encodings (PushFilterOptions). Thread-safe.
  const std::unique_ptr<PushFilter> filter_;

  // Held by every push and clock from the moment it takes its clock until
  // its requests are sent, so that pushes and clocks from different threads
  // (the trainer's catch-up watch ends clocks beside the training loop's
  // pushes) reach each server in clock order, and a clock's announcement
  // counts every segment of the pushes stamped with it: a push that took
  // clock c but had not yet counted its segments when another thread
  // announced c, or an announcement of c + 1 sent before c's, left a
  // range's clock waiting for good.
  absl::Mutex order_mu_ ABSL_ACQUIRED_BEFORE(mu_);
  mutable absl::Mutex mu_;
  std::shared_ptr<const Routing> routing_ ABSL_GUARDED_BY(mu_);
  proto::ClusterView view_ ABSL_GUARDED_BY(mu_);
  std::vector<std::shared_ptr<ServerClient>> servers_ ABSL_GUARDED_BY(mu_);
  std::vector<int> dims_ ABSL_GUARDED_BY(mu_);
  // By range (grown on use): segment seqs sent and finally answered. The
  // settled seq a clock announces is the lowest unanswered one's predecessor.
  std::vector<RangeSeqs> seqs_ ABSL_GUARDED_BY(mu_);
  // Range boundaries of the first view: every later view must keep them.
  std::vector<uint64_t> range_begins_ ABSL_GUARDED_BY(mu_);
  std::map<int64_t, Op> ops_ ABSL_GUARDED_BY(mu_);
  std::map<int64_t, ClockState> clocks_ ABSL_GUARDED_BY(mu_);
  // Per server, the key lists sent there, most recent first (at most
  // options_.key_lists_per_server).
  std::map<int, std::list<SentList>> lists_ ABSL_GUARDED_BY(mu_);
  uint64_t next_list_id_ ABSL_GUARDED_BY(mu_) = 1;
  int64_t next_ts_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t clock_count_ ABSL_GUARDED_BY(mu_) = 0;
  std::atomic<int64_t> held_us_total_{0};
  std::atomic<int64_t> held_waited_us_{0};
  // The highest PullResponse.others_min_clock seen (-1: none yet).
  std::atomic<int64_t> others_min_clock_{-1};
  std::atomic<int64_t> push_bytes_{0};
  std::atomic<int64_t> push_raw_bytes_{0};
  absl::Status sticky_ ABSL_GUARDED_BY(mu_);
  // Fence(): set once, this worker was declared dead; nothing is sent.
  absl::Status fence_ ABSL_GUARDED_BY(mu_);
  bool closing_ ABSL_GUARDED_BY(mu_) = false;
  // Retry timers scheduled and not yet run (cancelled by the destructor).
  std::set<ps::Clock::TimerId> timers_ ABSL_GUARDED_BY(mu_);
};

}  // namespace ps
