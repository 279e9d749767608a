// The logic of one parameter server, free of any RPC framework: the gRPC
// service (server_service.h) and the in-process transport both call it.
//
// A server holds the key ranges the routing table gives it, one Table per
// configured table, and a ConsistencyController with a vector clock per
// range. Push semantics depend on the consistency mode:
//   BSP      the pushes of one clock are buffered and, once every live
//            worker has completed that clock, summed in worker-id order and
//            applied once (deterministic; equals SGD on the combined batch);
//   SSP/ASP  each push is applied on arrival.
// Gradients are sums over examples; they are divided by the number of
// examples behind them (the whole clock's in BSP, the push's otherwise).
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <list>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/container/inlined_vector.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "common/parallel.h"
#include "common/routing.h"
#include "consistency/controller.h"
#include "consistency/range_state.h"
#include "proto/ps.pb.h"
#include "server/key_cache.h"
#include "server/table.h"
#include "transport/transport.h"

namespace ps {

// Bounds on what one (possibly hostile or buggy) worker can make a server
// hold. The defaults leave wide margins over what a correct worker needs.
struct ServerLimits {
  // Pulls of one worker waiting for consistency at once; beyond it a pull
  // gets RESOURCE_EXHAUSTED + REASON_TOO_MANY_PENDING.
  int max_pending_pulls_per_worker = kDefaultMaxPendingPullsPerWorker;
  // How far a push, pull or clock may be ahead of the clocks that worker
  // has completed on this server (a correct worker is one or two ahead);
  // beyond it OUT_OF_RANGE + REASON_CLOCK_TOO_FAR.
  int64_t max_clock_ahead = 1000;
  // A pull's wait_ms is clamped to this.
  int64_t max_wait_ms = 3600 * 1000;
  // Push seqs above a worker's settled watermark the server remembers; a
  // worker that never settles gets RESOURCE_EXHAUSTED +
  // REASON_TOO_MANY_PENDING beyond it.
  size_t max_unsettled_seqs = 1 << 16;
  // Key lists kept for key caching (server/key_cache.h), all workers
  // together, bytes; 0 turns key caching off on this server.
  size_t key_cache_bytes = size_t{256} << 20;
  // A push with encoded or compressed values (issue 10) may decode to at
  // most this many bytes of float32 values (what an uncompressed request
  // of the largest message could carry); beyond it INVALID_ARGUMENT.
  size_t max_decoded_value_bytes = size_t{64} << 20;
};

class ServerNode {
 public:
  using Done = std::function<void(const absl::Status&)>;

  // `clock` must outlive the node. A large push or pull is applied on up to
  // `apply_parallelism` threads at once, split by key range (common/
  // parallel.h; 1: on the handler's thread only).
  explicit ServerNode(Clock* clock = Clock::Real(),
                      ServerLimits limits = ServerLimits(),
                      int apply_parallelism = 1);
  ~ServerNode();

  ServerNode(const ServerNode&) = delete;
  ServerNode& operator=(const ServerNode&) = delete;

  // Installs the cluster view. The first call creates the tables and the
  // consistency state; a later call with a newer epoch replaces routing and
  // consistency settings (ranges must keep their owners for now: moving
  // ranges between servers is the recovery issue's work). Errors:
  // INVALID_ARGUMENT for a malformed view. Workers the view adds (joined
  // the running job, issue 9) are added to every range this server owns,
  // at the range's frontier while `joining` (`join_clocks`, when given,
  // gets per joining worker the highest such clock), raised to their
  // `start_clock` once it is set.
  absl::Status Configure(
      int server_id, const proto::ClusterView& view,
      google::protobuf::Map<int32_t, int64_t>* join_clocks = nullptr);

  // Data plane. `done` runs exactly once, possibly on the caller's thread
  // before the call returns; `resp` must stay valid until then. Remote input
  // is validated: a malformed request gets INVALID_ARGUMENT, a request for a
  // server that is not configured yet UNAVAILABLE, a routing epoch newer
  // than the server's UNAVAILABLE (reason VIEW_BEHIND: resend later), an
  // older epoch or a key this server does not own FAILED_PRECONDITION
  // (reason STALE_EPOCH).
  // Limits (ServerLimits): a clock more than max_clock_ahead beyond the
  // worker's completed clocks here is OUT_OF_RANGE + REASON_CLOCK_TOO_FAR;
  // a push with a NaN or infinite value is INVALID_ARGUMENT +
  // REASON_NON_FINITE (counted in Status().non_finite_pushes), with nothing
  // of it applied and its seq not taken (a dense push of one range is
  // checked by its update's own pass, which puts the rows back; a resend
  // of it meanwhile is ABORTED, to be resent once it is answered); too many
  // waiting pulls or unsettled push seqs of one worker RESOURCE_EXHAUSTED +
  // REASON_TOO_MANY_PENDING.
  // Key caching (server/key_cache.h): a request with key_list and keys
  // keeps them under that name; one with key_list and no keys uses them
  // (FAILED_PRECONDITION + REASON_KEYS_NOT_CACHED when not kept, or
  // evicted: resend with the keys; INVALID_ARGUMENT when num_keys or the
  // table differs from the kept list's).
  // Compression (issue 10): values in value_encoding f16 / int8 and/or
  // compressed with vals_codec are decoded to float32 before anything else
  // (backups get them decoded); a size that does not match the keys, a
  // corrupt payload or one decoding beyond max_decoded_value_bytes is
  // INVALID_ARGUMENT.
  void Push(const proto::PushRequest& req, proto::PushResponse* resp,
            Done done) {
    Push(req, req.keys(), req.vals(), resp, std::move(done));
  }
  // The same with the keys and values given apart from `req` (whose own
  // are then ignored): the gRPC service reads them where they were received
  // (transport/wire_fields.h). `keys` must be 8-byte aligned and `vals`
  // 4-byte; both are read only before Push returns.
  void Push(const proto::PushRequest& req, absl::string_view keys,
            absl::string_view vals, proto::PushResponse* resp, Done done);
  // A pull waits at most min(wait_ms or the default, max_wait_ms,
  // `max_wait`) for consistency (`max_wait`: what is left of the caller's
  // own deadline, so an abandoned call's wait expires with it).
  // `values`, when given, provides the buffer of `floats` floats the
  // values are written to instead of resp->vals (the gRPC service hands an
  // uninitialised slice that is sent as is); called at most once, before
  // `done`.
  using ValueBuffer = std::function<float*(size_t floats)>;
  void Pull(const proto::PullRequest& req, proto::PullResponse* resp,
            Done done, absl::Duration max_wait = absl::InfiniteDuration(),
            ValueBuffer values = nullptr) {
    Pull(req, req.keys(), resp, std::move(done), max_wait, std::move(values));
  }
  // The same with the keys given apart from `req` (its own are ignored):
  // 8-byte aligned, and kept valid until `done` runs, as `req` is.
  void Pull(const proto::PullRequest& req, absl::string_view keys,
            proto::PullResponse* resp, Done done, absl::Duration max_wait,
            ValueBuffer values);
  // settled_seq is clamped to the highest push seq received from that
  // worker, so it can never make later pushes look like replays.
  // Replication: a push, clock or finish is answered once its effect is on
  // every backup of the ranges it touched (a duplicate: once everything
  // logged before it is).
  void ClockTick(const proto::ClockRequest& req, Done done);
  // INVALID_ARGUMENT for a negative final clock.
  void Finish(const proto::FinishRequest& req, Done done);
  // Blocking forms (tests, tools).
  absl::Status ClockTick(const proto::ClockRequest& req);
  absl::Status Finish(const proto::FinishRequest& req);

  // Replication (issue 9, docs/fault_tolerance.md). How this server reaches
  // the others (addresses from the view); call before the first Configure.
  // Must outlive the node. Without it the node replicates nothing.
  void SetPeers(ClientFactory* peers);
  // Called (on a timer thread) with a backup this server could not reach,
  // and how long its oldest batch out has waited, so the scheduler probes
  // it (failover); may block briefly. Set before the first Configure.
  void SetSuspectHandler(
      std::function<void(int server, absl::Duration silent)> suspect);
  // Issue 9: a backup that hangs answers no replication batch, and this
  // primary's pushes wait on it; the replication deadline (10 s) and the
  // heartbeat timeout are slow to tell. Names to the suspect handler (which
  // asks the scheduler to probe it) every backup that has left a batch
  // unanswered for `after`, at most once per `after` per backup. Returns
  // the backups named. The server runner calls it on every heartbeat.
  std::vector<int> SuspectSilentBackups(absl::Duration after);
  // Group commit (fault_tolerance.replication_linger_ms): entries for a
  // backup wait up to `linger` after the first of them was queued, so that
  // the pushes arriving meanwhile travel in one batch (one round trip to
  // the backup instead of one each); a queue of kLingerFlushBytes or more
  // goes at once (1 MiB: a batch that large already spreads its round
  // trip's wake-ups over a millisecond or more of work; at 64 KiB every
  // push of the LR job, 12k keys a server, went alone, so the linger never
  // gathered anything). A replicated push's answer waits for its batch, so this
  // is what it may add to a push's latency. 0 (the default here): each
  // batch goes as soon as the stream is idle. Applied in every mode.
  void SetReplicationLinger(absl::Duration linger);
  static constexpr size_t kLingerFlushBytes = 1 << 20;
  // Every mode (fault_tolerance.replicate_deltas, the default here; BSP
  // since stop 63): the backups get deltas, the result of a linger's
  // inputs (each row they changed, read from the table, and the range's
  // consistency state) instead of each push and clock to replay; a push is
  // acknowledged once a delta covering it is on every backup. false: the
  // per-input log (BSP: replication after aggregation). Set
  // before the first Configure (changing it later leaves inputs logged one
  // way and not sent the other).
  void SetReplicationDeltas(bool deltas);
  // A backup's side: applies a primary's entries in its log order. Errors:
  // UNAVAILABLE + VIEW_BEHIND when the request's epoch is newer than this
  // server's; FAILED_PRECONDITION + STALE_EPOCH when the sender does not
  // own an entry's range here; UNAVAILABLE while a range awaits its copy;
  // INVALID_ARGUMENT for a malformed entry; DATA_LOSS for a gap in a
  // range's log. Entries before the failing one stay applied (a resend
  // skips them). `vals`: the values the request's rows name by offset
  // (RangeCopy.Rows.vals_offset: a batch through the data plane's shared
  // memory, read in place, once each); rows that name bytes outside them
  // are INVALID_ARGUMENT.
  absl::Status Replicate(const proto::ReplicateRequest& req,
                         absl::Span<const char> vals = {});
  // The newest epoch under which this server acknowledged a push and when
  // it first did (Unix ms); (0, 0) before any.
  std::pair<int64_t, int64_t> FirstAck() const;
  // Fills a server heartbeat: role, id, FirstAck, the installed view's
  // epoch and the ranges this server backs up in it without a complete copy
  // (the scheduler promotes none of those).
  void FillHeartbeat(proto::HeartbeatRequest* req) const;
  // Worker failure (issue 9): `worker` closed a data-plane connection to
  // this server (DataHandler::PeerClosed). TakeWorkersGone moves the
  // workers noted since its last call into a heartbeat's workers_gone.
  void NoteWorkerGone(int32_t worker);
  void TakeWorkersGone(proto::HeartbeatRequest* req);

  // Control plane. INVALID_ARGUMENT for a mode that is unset or not one of
  // the ConsistencyMode values.
  absl::Status SetConsistency(const proto::ConsistencyConfig& c);
  // Writes this server's shard of every table under `dir` (empty: the
  // view's model_dir) as table-<t>.server-<s>.bin and .txt. Fills paths and
  // counts. All or nothing: each file is written and fsynced under a
  // temporary name, and renamed into place only once all are complete; on
  // any error no file of this save is left (temporaries removed) and the
  // error names the file and why, with the errno's code (ENOSPC:
  // RESOURCE_EXHAUSTED; UNAVAILABLE when `dir` cannot be created).
  // With `kept_copy` (issue 12, early stopping): writes the copy
  // KeepModelCopy kept, when it covers exactly the ranges this server owns
  // now (resp->saved_kept_copy() says so), else the live model.
  absl::Status SaveModel(const std::string& dir,
                         proto::ServerControlResponse* resp,
                         bool kept_copy = false);
  // Keeps a copy of every table's values over the ranges this server owns
  // now (not the optimizer state), replacing the previous copy.
  void KeepModelCopy();
  // Writes that copy as SaveModel(<view's model_dir>/best, ..., true) does,
  // setting only resp->saved_kept_copy(): false (and OK, nothing written)
  // when no copy covers the ranges this server owns now.
  absl::Status SaveKeptCopy(proto::ServerControlResponse* resp);
  proto::ServerStatus Status() const;
  // The invariants of every range's consistency state
  // (RangeState::CheckInvariants), annotated with the range; tests run it
  // after every step.
  absl::Status CheckInvariants() const;
  // For a failing test's message: per range this server owns or backs up,
  // its role, replication log position and consistency state.
  std::string DebugRanges() const;

  // Expires consistency waits past their deadline, and warns (at most
  // every kStuckAnswerWarning) of an answer that has waited for its
  // replication that long, with what it waits for; call periodically.
  void Tick();
  static constexpr absl::Duration kStuckAnswerWarning = absl::Seconds(30);
  // Fails every waiting pull, and every answer waiting for replication,
  // with `status` (shutdown; a test's "kill").
  void CancelAll(const absl::Status& status);

  // Tests and tools. nullptr when no such table.
  const Table* table(int id) const;
  // The workers' named key lists (metrics: hits, misses, size).
  const KeyCache& key_cache() const { return key_cache_; }
  // The ranges this server owns in its current view, ascending.
  std::vector<int> OwnedRanges() const;
  int id() const;
  int64_t epoch() const;
  // Tests: `fn` runs on a push's applying thread just before its admitted
  // segments are applied (after admission, outside the node's lock), e.g.
  // to send a resend meanwhile. Set before any push; null: none.
  void SetBeforeApplyForTest(std::function<void()> fn) {
    before_apply_for_test_ = std::move(fn);
  }

  // Checkpoints (issue 9; server/checkpoint.h, defined in
  // server_node_checkpoint.cc). Writes this server's keys of every table,
  // values and optimizer state, each range copied under its partition lock,
  // to cmd.dir (created if missing) as table-<t>.server-<s>.ckpt, each
  // fsynced and renamed into place, then fsyncs the folder. Fills
  // resp->checkpoint_files and worker_clocks (the clocks completed here
  // when it began). UNAVAILABLE before the first Configure or when the
  // folder cannot be created; INVALID_ARGUMENT for an empty dir; errors
  // naming the file with the errno's code otherwise (RESOURCE_EXHAUSTED for
  // a full disk; no file of this call is left then).
  absl::Status Checkpoint(const proto::CheckpointCommand& cmd,
                          proto::ServerControlResponse* resp);

 private:
  // Replication: (range, entry index) pairs an answer waits for; an index
  // below 0 is a BSP clock not applied yet, -(clock + 1) (NeedClockLocked).
  using Needs = std::vector<std::pair<int, int64_t>>;
  // Older clients' clocks (ClockRequest without per-range entries): the
  // per-server count of push requests is turned into per-range segment
  // counts once all of those requests have arrived.
  struct LegacyClock {
    int64_t announced = -1;  // push requests announced; -1: not yet
    int64_t examples = 0;
    int64_t admitted = 0;  // push requests admitted so far
    std::map<int, int64_t> per_range;  // range -> segments admitted
  };
  struct WorkerState {
    std::map<int64_t, LegacyClock> legacy;  // by clock
    bool finished = false;  // finished on every range this server owns
    bool dead = false;
  };
  // What a data-plane request may use once admitted; valid without mu_
  // (tables and routing tables are never freed while the node lives).
  struct Admitted {
    Table* table = nullptr;
    std::shared_ptr<const Routing> routing;
    int id = -1;
    bool bsp = false;
  };
  // What a request gets before Configure: UNAVAILABLE, reason VIEW_BEHIND
  // (it has installed no view yet), so that the sender resends it after a
  // backoff and does not take the server for unreachable. A server
  // registers, and may be sent requests, a little before it configured
  // itself with the scheduler's answer; a worker that named it a suspect
  // for that had the scheduler probe a live server at every start-up.
  static absl::Status NotConfigured();
  // The cheap checks every data-plane request needs, under mu_.
  absl::Status Admit(int worker_id, int64_t epoch, int table,
                     Admitted* a) const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // Whether every float of `vals` is finite (no NaN, no infinity). A large
  // push's are checked in parts on the apply threads: the check is the
  // values' first read, memory-bound (a dense 4 MiB push's one thread spent
  // a fifth of the samples there while the machine was 30 % idle).
  bool ValuesFinite(absl::string_view vals);
  // The O(keys) checks, without mu_: ascending, unique, owned by this
  // server. Appends the runs of keys per range, in key order, when `runs`
  // is not null.
  static absl::Status CheckKeys(absl::string_view keys, const Admitted& a,
                                std::vector<RangeRun>* runs);
  // The keys of a push or pull: its own (checked as CheckKeys does) or the
  // cached list it names (server/key_cache.h; only ownership is checked).
  struct RequestKeys {
    int table = 0;  // the request's table, which a kept list records
    absl::Span<const uint64_t> keys;
    std::vector<RangeRun> runs;
    std::shared_ptr<const KeyList> cached;  // the list named, if cached
    uint64_t keep = 0;  // the request's keys are to be kept as this list
    // The most lists the worker names to this server (key_lists; 0: any).
    uint32_t window = 0;
    // The list with the slots resolved by keys this time (made by
    // Resolving), to keep once the request succeeded.
    std::shared_ptr<KeyList> resolved;
  };
  // OK when this server still owns every range of `rk`, a request admitted
  // under `admitted` (at once when that is the current view); else
  // STALE_EPOCH naming a range that moved away, or lost_.
  absl::Status StillOwnedLocked(const RequestKeys& rk,
                                const std::shared_ptr<const Routing>& admitted)
      const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  absl::Status ResolveKeys(int worker, int table, uint64_t key_list,
                           uint32_t num_keys, absl::string_view keys,
                           const Admitted& a, RequestKeys* out);
  // Where run `run` of `rk` records the slots it resolves by keys (its
  // slots and its generation in rk->resolved, made on first use), or
  // nulls when nothing is to be kept.
  static std::pair<uint32_t*, uint64_t*> Resolving(RequestKeys* rk,
                                                   int table, size_t run);
  // Keeps rk.resolved for `worker`, when made.
  void KeepResolved(int worker, RequestKeys* rk);
  // Per range: the range's consistency actions to carry out.
  using RangeActionList = std::vector<std::pair<int, RangeActions>>;
  // Adds a range's actions to `list` unless there are none: most pushes
  // complete nothing, and an entry each was a move of a RangeActions per
  // segment (on a backup, per replicated segment too).
  static void AddActions(RangeActionList* list, int range, RangeActions* a) {
    if (!a->empty()) list->emplace_back(range, std::move(*a));
  }
  // Applies the BSP clocks in `actions` to the tables (mu_ held: BSP
  // applies are rare and must not interleave with a view change). On the
  // owner of a replicated range, each applied clock is also queued for the
  // backups (bsp_out_; replication after aggregation), or with deltas the
  // rows the sums change are noted for the range's next delta: every
  // locked step
  // that may apply clocks ends with FlushBspClocksLocked, after logging
  // its own entries, so a backup gets the input that completed a clock
  // before the clock.
  void ApplyBsp(int range, RangeActions* actions)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Logs the clocks ApplyBsp queued: one log index per (range, clock), one
  // entry per backup with every block it follows; waits for those clocks
  // now wait for those indexes. Answers that waited for a clock applied on
  // an owned range that has no backup any more (they were made while it
  // had one) are answered now: no acknowledgement is coming for them.
  void FlushBspClocksLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // FlushBspClocksLocked's logging, with bsp_out_ not empty.
  void LogBspClocksLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A need for the replicated apply of BSP clock `clock` of a range: it is
  // resolved to the log index that sent the clock's sum to the backups
  // when that is logged (FlushBspClocksLocked; ResolveClockNeedsLocked).
  static int64_t ClockNeed(int64_t clock) { return -(clock + 1); }
  // Tick's warning of the oldest answer waiting for its replication.
  void WarnOfStuckAnswerLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Logs (rate-limited) value elements the tables left unchanged because
  // their update was not finite (Table::non_finite_updates).
  void WarnOfNonFiniteUpdatesLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Turns the clock needs of clocks applied (and flushed) by now into the
  // range's current index, which covers them. Call after the flush.
  void ResolveClockNeedsLocked(Needs* needs) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // Legacy clocks of `worker` whose push requests all arrived: announces
  // their per-range counts.
  void AnnounceLegacy(int worker, RangeActionList* out, Needs* needs)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Marks `worker` finished once it finished on every owned range.
  void NoteFinished(int worker, const RangeActionList& actions,
                    std::vector<int>* finished)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Tells the consistency controller, outside mu_ (it runs callbacks).
  void Publish(const RangeActionList& actions,
               const std::vector<int>& finished);

  // The bodies of ClockTick and Finish: what their answers wait for in
  // `needs`.
  absl::Status ClockTickImpl(const proto::ClockRequest& req, Needs* needs);
  absl::Status FinishImpl(const proto::FinishRequest& req, Needs* needs);
  // Answers `s` once `needs` are on every backup.
  void AnswerWhenCommitted(const absl::Status& s, Needs needs, Done done);

  // ---- replication (server_node_replication.cc)
  // Per range: its log. On the primary `index` counts the entries assigned
  // (the state is the effect of entries 1..index); on a backup the entries
  // applied.
  struct RangeLog {
    int64_t index = 0;
    bool awaiting_copy = false;     // backup: entries refused until a copy
    // Holds the range's whole state as of the last entry it applied: an
    // owner, a backup since the job's start, or one that applied a copy
    // (and held the range ever since). A backup awaiting a new primary's
    // copy may still be complete (it followed the old primary).
    bool complete = false;
    std::map<int, int64_t> acked;   // primary: backup -> last entry applied
    std::vector<int> copy_to;       // primary: backups that need a copy
    // Primary, ASP/SSP (deltas): the index of the last delta made; inputs
    // after it are not on their way to any backup yet (`dirty`), and
    // dirty_rows[table] the rows their pushes changed.
    int64_t shipped = 0;
    bool dirty = false;
    struct DirtyRows {
      std::vector<uint64_t> keys;  // in push order, with repeats
      // Where the pushes found them (kNoSlot: by key), when `by_slot`: all
      // at `generation` of the range's partition.
      std::vector<uint32_t> slots;
      uint64_t generation = 0;
      bool by_slot = true;
      void Clear() {
        keys.clear();
        slots.clear();
        by_slot = true;
      }
    };
    std::vector<DirtyRows> dirty_rows;
    // Clean: nothing left for a delta (shipped, moved away, or covered by
    // a copy).
    void ClearDirty() {
      dirty = false;
      for (DirtyRows& d : dirty_rows) d.Clear();
    }
    // Primary, deltas by slot (Table::TakeJournal): every backup of the
    // range has this server's layout of table t's partition up to
    // synced_slots[t] slots (digest synced_digests[t]), at
    // synced_generations[t] (the partition's generation here), and the
    // partition's journal records its pushes from there. Set at the job's
    // start, when every replica is empty; off for good
    // (EndBySlotLocked) once a backup is sent a copy (it then has the
    // copy's layout) or a partition changes under it.
    bool by_slot = false;
    std::vector<uint32_t> synced_slots;
    std::vector<uint64_t> synced_generations;
    std::vector<uint64_t> synced_digests;  // Table::PartitionLayout::digest
  };
  // Entries on their way to one backup, in the order they were logged.
  struct Stream {
    std::deque<proto::ReplicaEntry> queue;
    size_t queued_bytes = 0;  // ReplicaEntryBytes of the queue
    absl::Time first_queued;  // when the queue last went from empty
    bool sending = false;
    bool timer_armed = false;  // a linger timer will look at the stream
    uint64_t generation = 0;  // a new stream object for the same backup
    // When the batch attempt now out was sent; InfiniteFuture when none is
    // (SuspectSilentBackups).
    absl::Time awaiting_since = absl::InfiniteFuture();
    // Since when the backup has answered none of the batches sent to it
    // (their attempts time out and are sent again; awaiting_since starts
    // again with each); InfiniteFuture when it answered the last one.
    absl::Time unanswered_since = absl::InfiniteFuture();
  };
  // `fire` gets OK when the needs are met, CANCELLED at shutdown.
  using Fire = std::function<void(const absl::Status&)>;
  struct AckWait {
    Needs needs;
    Fire fire;
    // What `fire` gets once the needs are met (when they cannot be: why),
    // and the epoch to NoteAck then (a push's), or -1. Here rather than in
    // a closure around `fire`: that closure was one more allocation per
    // replicated answer, made on the request's thread and freed on the
    // batch answer's.
    absl::Status answer;
    int64_t ack_epoch = -1;
    absl::Time since;  // when it started waiting
  };
  // Lets transport and timer callbacks reach the node only while it lives.
  struct Life {
    absl::Mutex mu;
    bool alive ABSL_GUARDED_BY(mu) = true;
    int running ABSL_GUARDED_BY(mu) = 0;
  };
  // Whether `range` has a backup in the current view.
  bool HasBackups(int range) const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // Assigns the next index of owned range `range`'s log; records it as a
  // need when `needs` is not null.
  int64_t AssignIndexLocked(int range, Needs* needs)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The backups of `range` that get its entries now (not one awaiting its
  // copy, which will include them). Inline: asked once per push segment.
  using Targets = absl::InlinedVector<int, 4>;
  Targets FeedTargetsLocked(int range) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_);
  void EnqueueLocked(int backup, proto::ReplicaEntry e)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Appends `e` to `backup`'s stream (EnqueueLocked without counting it
  // as a replicated entry: range copies).
  void QueueLocked(int backup, proto::ReplicaEntry e)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The linger in effect (fault_tolerance.replication_linger_ms).
  absl::Duration LingerLocked() const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // Sets st->queued_bytes from its queue (after entries were pruned).
  void RecountLocked(Stream* st) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Replication by deltas (issue 9): an input of a replicated range gets
  // its log index as before, but travels to the backups as its effect, in
  // the range's next RangeDelta, made when the linger is over
  // (ShipDirtyLocked) from the range's state and the rows its pushes (in
  // BSP: its applied clocks' sums) changed, instead of as an entry the
  // backup replays. In BSP the state carries the buffered clocks, so a
  // pushed segment is acknowledged once a delta holding it (buffered or
  // applied) is on every backup. Every mode since stop 63; before, BSP
  // sent one entry per applied clock (replication after aggregation),
  // which replicate_deltas = false still does.
  bool DeltasLocked() const ABSL_SHARED_LOCKS_REQUIRED(mu_) {
    return replicate_deltas_;
  }
  // Marks owned range `range` as having inputs no delta carries yet.
  void MarkDirtyLocked(int range) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The same for the keys of `table` in `range` a push changed, with the
  // slots it found them at (`slots`, may be null) at `generation`.
  void AddDirtyKeysLocked(int range, int table,
                          absl::Span<const uint64_t> keys,
                          const uint32_t* slots, uint64_t generation)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Counts `rows` rows of `table` a push changed towards the linger's byte
  // bound (AddDirtyKeysLocked's, and a push's rows its range's journal
  // recorded).
  void CountDirtyRowsLocked(int table, size_t rows)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Ends replication by slot of owned range `range` (its backups have or
  // will have a copy's layout, or it moved): by keys from now on; stops its
  // tables' journals.
  void EndBySlotLocked(int range) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether the dirty ranges' linger is over (arms a timer that kicks
  // when it will be, if not).
  bool DirtyDueLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Makes a delta of every dirty range that is quiet (no push awaiting its
  // apply: the rows and the state agree) and whose backups' streams are
  // idle (a busy stream's ranges keep gathering, so that one delta covers
  // more pushes), and queues it for the range's backups.
  void ShipDirtyLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // What ShipRangeLocked did with a dirty range.
  enum class Shipped {
    kDelta,     // queued its delta for every target
    kNotQuiet,  // nothing: a push to it awaits its apply
    kRecopy,    // its journal fell short: the targets await a copy instead
  };
  // Makes owned dirty range `r`'s delta (its state, and the rows its pushes
  // changed since the last one) and queues it for each of `to` (appended to
  // `fed`, when not null, where not there yet); the range is clean after
  // kDelta and kRecopy.
  Shipped ShipRangeLocked(int r, const Targets& to, Targets* fed)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A copy's or delta's consistency state from primary `from` for range
  // `r`: INVALID_ARGUMENT when malformed or another job's, UNAVAILABLE +
  // VIEW_BEHIND when it has workers this server's view does not.
  absl::StatusOr<RangeState> PeerStateLocked(
      const proto::RangeStateSnapshot& snap, int r, int from,
      absl::string_view what) const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // A backup's side of a delta.
  absl::Status ApplyDeltaLocked(int from, const proto::ReplicaEntry& e,
                                absl::Span<const char> vals,
                                RangeActionList* actions)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The new segments of one push request, logged: one entry per backup
  // with the segments of the ranges it backs up.
  struct LoggedSegment {
    int range;
    size_t first, last;  // key indices in the request
    uint64_t seq;
    int64_t index;
  };
  // Sub-messages of answered batches, cleared and kept for reuse (spares_).
  void RecycleLocked(proto::ReplicateRequest* req)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A cleared spare from `spares` (one of spares_'s, under mu_), or a new
  // message: the caller owns it.
  template <typename M>
  static M* TakeSpare(std::vector<std::unique_ptr<M>>* spares) {
    if (spares->empty()) return new M;
    M* m = spares->back().release();
    spares->pop_back();
    return m;
  }
  // `vals`: the request's values as float32 (decoded).
  void LogPushLocked(const proto::PushRequest& req,
                     absl::Span<const uint64_t> keys, const float* vals,
                     int dim, const std::vector<LoggedSegment>& segs)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Drops from `e` what `backup` no longer needs (ranges it stopped
  // backing up, or will get a copy of; a copy of a range this server no
  // longer owns, or that `backup` no longer backs up); false when nothing
  // is left.
  bool PruneForLocked(int backup, proto::ReplicaEntry* e) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // Whether `from` may send entries of `range` here (it owns it, this
  // server backs it up); the error to answer otherwise.
  absl::Status CheckSenderLocked(int from, int64_t epoch, int range) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // Logs input `e` of owned range `range`: assigns the next index and
  // queues it for each backup (not for one that still awaits its copy,
  // which will cover it); records what an answer must wait for.
  void LogEntry(int range, proto::ReplicaEntry e, Needs* needs)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The range's current index as a need (a duplicate waits for it).
  void NeedCurrent(int range, Needs* needs) ABSL_SHARED_LOCKS_REQUIRED(mu_);
  bool CommittedLocked(const Needs& needs) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // Runs `fire` once every need is on every backup (at once when so now),
  // as RunWait does.
  void WhenCommitted(Needs needs, Fire fire, absl::Status answer,
                     int64_t ack_epoch);
  // Fires `w` after its needs were met (`why` OK) or cannot be (`why`).
  void RunWait(AckWait& w, const absl::Status& why);
  // A need on a range this server no longer owns (moved away, issue 9):
  // its answer can never be known to be on the range's new replicas, so
  // the request fails with STALE_EPOCH and the worker resends it to the new
  // owner, whose dedup drops it if it did arrive there.
  bool LostLocked(const Needs& needs) const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  absl::Status MovedAwayLocked() const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // Waits whose needs are met now (OK) or lost (STALE_EPOCH), removed from
  // ack_waits_, with the status to fire each with.
  std::vector<std::pair<AckWait, absl::Status>> TakeReadyLocked()
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // TakeReadyLocked, the waits then answered by a timer, outside mu_ (for
  // callers that hold it).
  void AnswerReadyLaterLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Workers that joined the running job (issue 9), from Configure: adds
  // them to the owned ranges (logged for the backups) and to the
  // consistency controller; raises them to their start clock.
  void JoinWorkersLocked(const proto::ClusterView& view,
                         google::protobuf::Map<int32_t, int64_t>* join_clocks,
                         RangeActionList* actions)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The highest clock the owned ranges hold `worker` at (a joining worker's
  // answer to the scheduler).
  int64_t JoinClockLocked(int worker) const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // Replication state for a new view (from Configure): new backups get a
  // copy, a promoted range copies to all its backups, a range this server
  // newly backs up awaits its copy.
  void ReconfigureReplicationLocked(const Routing* old_routing)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Takes the copies due (a range with a segment awaiting its apply is
  // retried a little later). Without mu_.
  void TakeCopies();
  // Sends the next batch of every idle stream whose linger is over (arms
  // a timer for the others). Without mu_.
  void Kick();
  // Whether `backup`'s stream `st` should send its next batch now. An idle
  // stream whose entries wait out their linger gets a timer (one at a
  // time) that kicks it when the linger ends.
  bool DueLocked(int backup, Stream* st) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Sends `backup`'s next batch if it is due; arms its timer if not.
  void KickOne(int backup);
  void SendBatch(int backup);
  void SendReplicate(int backup, uint64_t generation,
                     std::shared_ptr<proto::ReplicateRequest> req, int attempt);
  void OnBatchReply(int backup, uint64_t generation,
                    std::shared_ptr<proto::ReplicateRequest> req,
                    const absl::Status& s, int attempt);
  // Whether entry `index` of `range`, sent by `from`, is the next one to
  // apply here: true; false for a resend (applied already); UNAVAILABLE
  // while the range awaits its copy; DATA_LOSS for a gap.
  absl::StatusOr<bool> IsNextEntryLocked(int from, int range,
                                         int64_t index) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // Applies a replicated push's segments on a backup (mu_ held).
  absl::Status ApplyPushLocked(int from, const proto::ReplicaPush& p,
                               RangeActionList* actions)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status ApplyAnnouncesLocked(int from, const proto::ReplicaAnnounces& an,
                                    RangeActionList* actions)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Applies the primary's BSP clocks on a backup (mu_ held).
  absl::Status ApplyBspClocksLocked(int from, const proto::ReplicaBspClocks& bc,
                                    RangeActionList* actions)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Applies one entry on a backup (mu_ held).
  absl::Status ApplyEntryLocked(int from, const proto::ReplicaEntry& e,
                                absl::Span<const char> vals,
                                RangeActionList* actions)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Runs `fn` after `delay` on the clock's timer thread while the node lives.
  void Later(absl::Duration delay, std::function<void()> fn);
  // Notes a push acknowledged under `epoch`.
  void NoteAck(int64_t epoch);

  // Constant after construction.
  Clock* const clock_;
  const ServerLimits limits_;
  ParallelRunner apply_runner_;
  KeyCache key_cache_;  // thread-safe
  std::function<void()> before_apply_for_test_;  // SetBeforeApplyForTest

  mutable absl::Mutex mu_;
  int id_ ABSL_GUARDED_BY(mu_) = -1;
  int64_t epoch_ ABSL_GUARDED_BY(mu_) = 0;
  std::string model_dir_ ABSL_GUARDED_BY(mu_);
  proto::ConsistencyMode mode_ ABSL_GUARDED_BY(mu_) = proto::MODE_SSP;
  std::shared_ptr<const Routing> routing_ ABSL_GUARDED_BY(mu_);
  std::vector<std::unique_ptr<Table>> tables_ ABSL_GUARDED_BY(mu_);
  std::unique_ptr<ConsistencyController> consistency_;  // set once
  std::vector<WorkerState> workers_ ABSL_GUARDED_BY(mu_);
  // One per range of the routing table (ranges never change in a job);
  // only the owned ones receive input.
  std::vector<RangeState> ranges_ ABSL_GUARDED_BY(mu_);
  // The ranges routing_ gives this server, ascending (set with routing_).
  std::vector<int> owned_ ABSL_GUARDED_BY(mu_);
  // KeepModelCopy's copy, per table, and the ranges it covers.
  std::vector<Table::ValueCopy> kept_copy_ ABSL_GUARDED_BY(mu_);
  std::vector<int> kept_owned_ ABSL_GUARDED_BY(mu_);
  int64_t pushes_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t pulls_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t non_finite_pushes_ ABSL_GUARDED_BY(mu_) = 0;
  // Pushes admitted and not yet applied (range, worker, seq; not BSP,
  // whose segments are copied at admission): a resend of one meanwhile is
  // told to come back (ABORTED) rather than answered as a duplicate. The
  // table may yet refuse the original (values it checks as it applies
  // them), and an acknowledged push is one applied: a worker whose push
  // values lie in shared memory it lent (KVWorker::NewPushBuffer) writes
  // them again once the push is answered, while the original's apply may
  // still read them (Push).
  absl::flat_hash_set<std::tuple<int, int, uint64_t>> applying_
      ABSL_GUARDED_BY(mu_);
  int64_t default_wait_ms_ ABSL_GUARDED_BY(mu_) = 120000;

  // Replication (issue 9).
  ClientFactory* peers_ ABSL_GUARDED_BY(mu_) = nullptr;
  std::function<void(int, absl::Duration)> suspect_ ABSL_GUARDED_BY(mu_);
  std::vector<RangeLog> logs_ ABSL_GUARDED_BY(mu_);
  std::map<int, Stream> streams_ ABSL_GUARDED_BY(mu_);
  // Deltas (ASP/SSP): the ranges marked dirty, when the first of them was
  // (their linger runs from it), about how many bytes their deltas will
  // carry, and whether a timer will kick when the linger ends.
  std::vector<int> dirty_ranges_ ABSL_GUARDED_BY(mu_);
  absl::Time dirty_since_ ABSL_GUARDED_BY(mu_);
  size_t dirty_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  // ShipRangeLocked's rows by key, reused from one delta to the next.
  std::vector<uint64_t> delta_keys_ ABSL_GUARDED_BY(mu_);
  std::vector<float> delta_entries_ ABSL_GUARDED_BY(mu_);
  bool dirty_timer_armed_ ABSL_GUARDED_BY(mu_) = false;
  // SuspectSilentBackups: names each backup at most once per interval.
  IntervalPerId suspected_ ABSL_GUARDED_BY(mu_);
  absl::Duration replication_linger_ ABSL_GUARDED_BY(mu_);
  bool replicate_deltas_ ABSL_GUARDED_BY(mu_) = true;
  int64_t replica_entries_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t replica_rows_by_slot_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t replica_rows_by_key_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t replica_batches_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t next_generation_ ABSL_GUARDED_BY(mu_) = 0;
  std::list<AckWait> ack_waits_ ABSL_GUARDED_BY(mu_);  // oldest first
  absl::Time stuck_warned_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  // WarnOfNonFiniteUpdatesLocked: when it last looked and warned, and per
  // table the count it warned of.
  absl::Time non_finite_checked_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  absl::Time non_finite_warned_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  std::map<int, uint64_t> non_finite_seen_ ABSL_GUARDED_BY(mu_);
  // BSP clocks applied on owned replicated ranges, not logged yet (their
  // indexes are set by FlushBspClocksLocked). Cleared, not freed: its
  // arrays keep their capacity from step to step.
  proto::ReplicaBspClocks bsp_out_ ABSL_GUARDED_BY(mu_);
  // ApplyBsp by deltas: the keys of a clock's sums (scratch, kept).
  std::string delta_sum_keys_ ABSL_GUARDED_BY(mu_);
  // A BSP clock was applied on an owned range without backups since the
  // last FlushBspClocksLocked: answers waiting for it (made while the
  // range still had a backup, which failed since) may be due.
  bool bsp_applied_unreplicated_ ABSL_GUARDED_BY(mu_) = false;
  // A push's and a clock's replica entries are built on the request's
  // thread and were freed on the thread of their batch's answer: every one
  // went through the allocator's central cache both ways (tcmalloc 3-4x its
  // unreplicated share of a replicated server's samples). Their cleared
  // sub-messages come back here instead, with their arrays' and strings'
  // capacity; bounded in number and in the size of what each keeps.
  struct Spares {
    std::vector<std::unique_ptr<proto::ReplicaPush>> pushes;
    std::vector<std::unique_ptr<proto::ReplicaAnnounces>> announces;
    std::vector<std::unique_ptr<proto::ReplicaEntry>> entries;  // cleared
  };
  Spares spares_ ABSL_GUARDED_BY(mu_);
  // ApplyBsp's sums, per table (emptied by every ApplyTo).
  std::vector<std::unique_ptr<GradAccumulator>> bsp_sums_ ABSL_GUARDED_BY(mu_);
  // Set by CancelAll: later waits fail at once with it.
  absl::Status closed_ ABSL_GUARDED_BY(mu_);
  // DATA_LOSS once this server was made the owner of a range it held no
  // complete copy of (a failover the scheduler should never publish): every
  // push and pull is refused with it, so the job fails naming the range
  // instead of training on a silently emptied one.
  absl::Status lost_ ABSL_GUARDED_BY(mu_);
  bool copy_retry_queued_ ABSL_GUARDED_BY(mu_) = false;
  mutable absl::Mutex ack_mu_;
  int64_t first_ack_epoch_ ABSL_GUARDED_BY(ack_mu_) = 0;
  int64_t first_ack_ms_ ABSL_GUARDED_BY(ack_mu_) = 0;
  std::atomic<int64_t> first_ack_seen_{0};  // first_ack_epoch_, lock-free
  const std::shared_ptr<Life> life_ = std::make_shared<Life>();

  // Workers that closed a data-plane connection since the last heartbeat
  // (NoteWorkerGone).
  absl::Mutex gone_mu_;
  std::vector<int32_t> workers_gone_ ABSL_GUARDED_BY(gone_mu_);
};

}  // namespace ps
