#include "worker/kv_worker.h"

#include <algorithm>
#include <cstring>
#include <new>

#include "absl/container/inlined_vector.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/bytes.h"
#include "common/logging.h"
#include "common/value_codec.h"

namespace ps {
namespace {

// ZPush: a server's share of borrowed values goes as they lie when its
// pieces average at least this many bytes; smaller ones are copied.
constexpr size_t kMinBorrowedPiece = 16 * 1024;

absl::Duration Backoff(int attempt) {
  return absl::Milliseconds(std::min(1000, 20 * (1 << std::min(attempt, 6))));
}

// The same request may be sent again (after backoff): the peer was not
// reached, did not answer in time, or has not installed the request's
// epoch yet. A pull's consistency wait that expired on the server is final.
bool Resendable(const absl::Status& s) {
  const proto::ErrorReason reason = ReasonOf(s);
  if (reason == proto::REASON_VIEW_BEHIND) return true;
  if (reason == proto::REASON_CONSISTENCY_TIMEOUT) return false;
  return s.code() == absl::StatusCode::kUnavailable ||
         s.code() == absl::StatusCode::kDeadlineExceeded ||
         s.code() == absl::StatusCode::kAborted;
}

// The server could not be reached or did not answer (as opposed to
// answering "not yet"): it may be dead. The worker has it probed
// (failover, issue 9) and regroups by the newest view.
bool Unreachable(const absl::Status& s) {
  const proto::ErrorReason reason = ReasonOf(s);
  if (reason == proto::REASON_VIEW_BEHIND ||
      reason == proto::REASON_CONSISTENCY_TIMEOUT) {
    return false;
  }
  return s.code() == absl::StatusCode::kUnavailable ||
         s.code() == absl::StatusCode::kDeadlineExceeded;
}

// The server stopped serving the call as it shut down: a drained server
// leaving the job cancels its calls in flight (a worker paused through the
// drain still had a pull there, and exited on its CANCELLED: chaos mix seed
// 711). The op is regrouped by the newest view, as for a stale epoch,
// without naming the server a suspect (it may have left on purpose).
bool ServerStopped(const absl::Status& s) {
  return s.code() == absl::StatusCode::kCancelled;
}

// Appends announcement i of `all` (one per range) to `to`, the request of
// the range's owner, whose header is set from `all` when it is still empty.
void AppendAnnouncement(const proto::ClockRequest& all, int i, int64_t epoch,
                        proto::ClockRequest* to) {
  if (to->range_ids_size() == 0) {
    to->set_worker_id(all.worker_id());
    to->set_clock(all.clock());
    to->set_epoch(epoch);
    to->set_num_examples(all.num_examples());
  }
  to->add_range_ids(all.range_ids(i));
  to->add_range_segments(all.range_segments(i));
  to->add_range_settled_seqs(all.range_settled_seqs(i));
}

}  // namespace

template <typename F>
auto KVWorker::Guarded(F fn) {
  return [life = life_, fn = std::move(fn)](auto&&... args) mutable {
    {
      absl::MutexLock l(&life->mu);
      if (!life->alive) return;  // the worker is gone: drop the reply
      ++life->running;
    }
    fn(std::forward<decltype(args)>(args)...);
    absl::MutexLock l(&life->mu);
    --life->running;
  };
}

template <typename Resp, typename... Extra, typename F>
std::function<void(const absl::Status&, Resp*, Extra...)> KVWorker::Tracked(
    int server, F fn, bool watched) {
  struct Call final : InFlightCall {
    explicit Call(F f) : fn(std::move(f)) {}
    void Fail(const absl::Status& why) override {
      Resp empty;
      fn(why, &empty, Extra{}...);
    }
    F fn;
  };
  auto call = std::make_shared<Call>(std::move(fn));
  call->watched = watched;
  if (options_.suspect_after > absl::ZeroDuration()) {
    call->sent = clock_->Now();
  }
  absl::Status dead_why;
  {
    absl::MutexLock l(&life_->mu);
    if (!life_->dead.contains(server)) {
      life_->calls[server].insert(call);
    } else if (life_->alive) {
      // Routed before the failover, sent after FailCallsTo's sweep: it
      // fails now (the transport's answer, if any, is dropped).
      call->fired = true;
      dead_why = life_->dead_why;
      ++life_->running;
    }
  }
  if (!dead_why.ok()) {
    call->Fail(dead_why);
    absl::MutexLock l(&life_->mu);
    --life_->running;
  }
  // The answer's time only where SuspectSilentServers reads it.
  ps::Clock* const answer_clock =
      options_.suspect_after > absl::ZeroDuration() ? clock_ : nullptr;
  return [life = life_, server, call, answer_clock](
             const absl::Status& s, Resp* resp, Extra... extra) {
    {
      absl::MutexLock l(&life->mu);
      if (call->fired) return;  // failed already: its server was failed over
      call->fired = true;
      auto it = life->calls.find(server);
      if (it != life->calls.end()) it->second.erase(call);
      if (!life->alive) return;  // the worker is gone: drop the reply
      if (answer_clock != nullptr &&
          s.code() != absl::StatusCode::kUnavailable &&
          s.code() != absl::StatusCode::kDeadlineExceeded) {
        life->heard[server] = answer_clock->Now();
      }
      ++life->running;
    }
    call->fn(s, resp, extra...);
    absl::MutexLock l(&life->mu);
    --life->running;
  };
}

std::vector<int> KVWorker::PingSilentServers(absl::Duration timeout) {
  std::vector<int> answered;
  const absl::Duration after = options_.suspect_after / 2;
  if (after <= absl::ZeroDuration()) return answered;
  const absl::Time now = clock_->Now();
  // (server, since when its oldest push or clock waits), in id order.
  std::vector<std::pair<int, absl::Time>> silent;
  {
    absl::MutexLock l(&life_->mu);
    if (!life_->alive) return answered;
    for (const auto& [server, calls] : life_->calls) {
      const Silence silence = SilenceLocked(server, calls);
      if (silence.any_since <= now - after) {
        silent.emplace_back(server, silence.waiting);
      }
    }
  }
  std::sort(silent.begin(), silent.end());
  for (const auto& [server, waiting] : silent) {
    std::shared_ptr<ServerClient> client;
    {
      absl::MutexLock l(&mu_);
      if (closing_ || !fence_.ok()) return answered;
      if (server < static_cast<int>(servers_.size())) client = servers_[server];
    }
    if (client == nullptr) continue;
    const absl::Status st = client->GetStatus(clock_->Now() + timeout).status();
    const absl::Time at = clock_->Now();
    if (st.code() == absl::StatusCode::kUnavailable ||
        st.code() == absl::StatusCode::kDeadlineExceeded) {
      absl::MutexLock l(&life_->mu);
      life_->unreached[server] = at;  // silent it stays
      continue;
    }
    bool tell = false;
    {
      absl::MutexLock l(&life_->mu);
      absl::Time& heard = life_->heard[server];
      heard = std::max(heard, at);
      // Named it would have been, without the ask (once per suspect_after).
      tell = at - waiting >= options_.suspect_after &&
             life_->pinged.Due(server, at, options_.suspect_after);
    }
    if (tell) {
      PS_LOG_INFO("S[{}] has left a push or clock unanswered for {} but "
                  "answers its status: it is waiting (on a straggler's "
                  "clock?), not cut off; not named a suspect",
                  server, absl::FormatDuration(at - waiting));
    }
    answered.push_back(server);
  }
  return answered;
}

KVWorker::Silence KVWorker::SilenceLocked(
    int server,
    const absl::flat_hash_set<std::shared_ptr<InFlightCall>>& calls) const {
  // Silent since the oldest push or clock still waiting on it, or since its
  // last answer of any kind, whichever is later: on a lossy network some
  // calls wait out their retries while others are answered, and the server
  // is reachable (the scheduler fails over a server that answers it when
  // workers report it silent long enough).
  Silence out;
  absl::Time oldest = absl::InfiniteFuture();
  for (const auto& c : calls) {
    oldest = std::min(oldest, c->sent);
    if (c->watched) out.waiting = std::min(out.waiting, c->sent);
  }
  out.since = out.waiting;
  out.any_since = oldest;
  if (auto heard = life_->heard.find(server); heard != life_->heard.end()) {
    out.since = std::max(out.since, heard->second);
    out.any_since = std::max(out.any_since, heard->second);
  }
  return out;
}

std::vector<int> KVWorker::SuspectSilentServers() {
  std::vector<int> suspects;
  const absl::Duration after = options_.suspect_after;
  if (after <= absl::ZeroDuration()) return suspects;
  const absl::Time now = clock_->Now();
  // (server, how long it has answered nothing), in id order.
  std::vector<std::pair<int, absl::Duration>> silent;
  {
    absl::MutexLock l(&life_->mu);
    if (!life_->alive) return suspects;
    for (const auto& [server, calls] : life_->calls) {
      const Silence silence = SilenceLocked(server, calls);
      // Its last status ask since the oldest call of any kind (a pull too)
      // went unanswered: that pull's answer may be lost as well, so the
      // silence counts from it (any_since is never after since).
      auto it = life_->unreached.find(server);
      const absl::Time since =
          it != life_->unreached.end() && it->second >= silence.any_since
              ? silence.any_since
              : silence.since;
      if (now - since >= after && life_->suspected.Due(server, now, after)) {
        silent.emplace_back(server, now - since);
      }
    }
  }
  std::sort(silent.begin(), silent.end());
  for (const auto& [server, silence] : silent) {
    PS_LOG_INFO("S[{}] has answered nothing for {}: asking the scheduler to "
                "probe it",
                server, absl::FormatDuration(silence));
    RefreshView(server, -1, silence);
    suspects.push_back(server);
  }
  return suspects;
}

void KVWorker::FailCallsTo(const std::vector<int>& servers,
                           const absl::Status& why) {
  std::vector<std::shared_ptr<InFlightCall>> calls;
  {
    absl::MutexLock l(&life_->mu);
    if (!life_->alive) return;
    life_->dead_why = why;
    for (int server : servers) {
      life_->dead.insert(server);
      auto it = life_->calls.find(server);
      if (it == life_->calls.end()) continue;
      for (const auto& c : it->second) {
        c->fired = true;
        calls.push_back(c);
      }
      life_->calls.erase(it);
    }
    life_->running += static_cast<int>(calls.size());
  }
  if (!calls.empty() && IsStaleEpoch(why)) {
    PS_LOG_WARN("{} call(s) in flight to failed-over server(s) {} go to the "
                "new owners",
                calls.size(), absl::StrJoin(servers, ", "));
  }
  for (const auto& c : calls) {
    c->Fail(why);
    absl::MutexLock l(&life_->mu);
    --life_->running;
  }
}

KVWorker::KVWorker(KVWorkerOptions options, const proto::ClusterView& view,
                   ClientFactory* clients, SchedulerClient* scheduler)
    : options_(options),
      clock_(options.clock != nullptr ? options.clock : ps::Clock::Real()),
      clients_(clients),
      scheduler_(scheduler),
      life_(std::make_shared<Life>()),
      filter_(options.filters.keeps_residuals() ||
                      options.filters.encoding != proto::VALUES_F32 ||
                      options.filters.codec != proto::CODEC_NONE
                  ? std::make_unique<PushFilter>(options.filters)
                  : nullptr) {
  absl::MutexLock l(&mu_);
  InstallView(view);
  // A worker that joined the running job (issue 9) starts at the clock the
  // scheduler fixed for it: the servers count the clocks before it as done.
  const int id = options_.worker_id;
  if (id >= 0 && id < view.workers_size() && view.workers(id).id() == id) {
    clock_count_ = std::max<int64_t>(0, view.workers(id).start_clock());
  }
}

KVWorker::~KVWorker() {
  std::set<ps::Clock::TimerId> timers;
  {
    absl::MutexLock l(&mu_);
    closing_ = true;  // no new retries from here on
    timers.swap(timers_);
  }
  for (ps::Clock::TimerId id : timers) clock_->Cancel(id);
  // Replies still in flight are dropped from now on; wait for the
  // callbacks already running.
  Life* life = life_.get();
  absl::MutexLock l(&life->mu);
  life->alive = false;
  auto idle = [life]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(life->mu) {
    return life->running == 0;
  };
  life->mu.Await(absl::Condition(&idle));
}

void KVWorker::InstallView(const proto::ClusterView& view) {
  auto routing = Routing::FromProto(view.routing());
  if (!routing.ok()) {
    PS_LOG_ERROR("ignoring malformed view: {}", routing.status().ToString());
    return;
  }
  // Ranges keep their boundaries for the whole job (only owners change):
  // the worker's per-range seqs and counts depend on it.
  std::vector<uint64_t> begins(view.routing().range_begin().begin(),
                               view.routing().range_begin().end());
  if (range_begins_.empty()) {
    range_begins_ = std::move(begins);
  } else if (begins != range_begins_) {
    PS_LOG_ERROR("view epoch {} changes the key ranges; ignored",
                 view.epoch());
    if (sticky_.ok()) {
      sticky_ = absl::InternalError(absl::StrCat(
          "view epoch ", view.epoch(), " changes the key ranges of the job"));
    }
    return;
  }
  routing_ = std::make_shared<const Routing>(std::move(*routing));
  servers_.clear();
  for (const proto::NodeInfo& s : view.routing().servers()) {
    servers_.push_back(clients_->Server(s.address()));
  }
  dims_.clear();
  for (const proto::TableConfig& t : view.tables()) dims_.push_back(t.dim());
  view_ = view;
}

int64_t KVWorker::epoch() const {
  absl::MutexLock l(&mu_);
  return view_.epoch();
}

int KVWorker::dim(int table) const {
  absl::MutexLock l(&mu_);
  return table >= 0 && table < static_cast<int>(dims_.size()) ? dims_[table]
                                                              : 0;
}

int64_t KVWorker::clock() const {
  absl::MutexLock l(&mu_);
  return clock_count_;
}

int64_t KVWorker::NewOp(int pending) {
  int64_t ts = next_ts_++;
  Op& op = ops_[ts];
  op.pending = pending;
  op.retry_deadline = clock_->Now() + options_.retry_timeout;
  return ts;
}

void KVWorker::PartDone(int64_t ts, const absl::Status& s, int64_t held_us) {
  std::function<void()> fn;
  std::function<void(absl::Status)> watch_fn;
  absl::Status watch_status;
  int kind = -1, table = 0;
  uint64_t bytes = 0;
  int64_t start_ns = 0;
  bool ok = true;
  {
    absl::MutexLock l(&mu_);
    auto it = ops_.find(ts);
    if (it == ops_.end()) return;
    Op& op = it->second;
    op.held_us = std::max(op.held_us, held_us);
    if (!s.ok()) {
      if (op.status.ok()) op.status = s;
      if (sticky_.ok() && !op.watch) sticky_ = s;
    }
    if (--op.pending > 0) return;
    if (!op.watch) held_us_total_.fetch_add(op.held_us);
    if (op.wait_start_ns > 0 && op.held_us > 0) {
      held_waited_us_.fetch_add(std::min<int64_t>(
          op.held_us, (MonotonicNanos() - op.wait_start_ns) / 1000));
    }
    fn = std::move(op.on_done);
    if (op.watch) {
      watch_fn = std::move(op.on_watch);
      watch_status = op.status;
    }
    kind = op.kind;
    table = op.table;
    bytes = op.bytes;
    start_ns = op.start_ns;
    ok = op.status.ok();
    // Failures stay for Wait, unless Wait already gave the op up.
    if (op.status.ok() || op.abandoned) ops_.erase(it);
  }
  if (kind >= 0) {
    options_.metrics->Record(static_cast<PushPullMetrics::Kind>(kind), table,
                             bytes, MonotonicNanos() - start_ns, ok);
  }
  if (fn) fn();
  if (watch_fn) watch_fn(std::move(watch_status));
}

void KVWorker::Abandon(int64_t ts) {
  auto it = ops_.find(ts);
  if (it == ops_.end()) return;
  it->second.abandoned = true;
  if (it->second.target != nullptr) {
    absl::MutexLock l(&it->second.target->mu);
    it->second.target->out = nullptr;
    it->second.target->in_place = nullptr;
  }
}

bool KVWorker::Done(int64_t ts) const {
  absl::MutexLock l(&mu_);
  if (!sticky_.ok()) return true;
  auto it = ops_.find(ts);
  return it == ops_.end() || it->second.pending <= 0;
}

absl::Status KVWorker::Wait(int64_t ts, absl::Time deadline) {
  absl::MutexLock l(&mu_);
  if (ts < 0 || ts >= next_ts_) {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown timestamp ", ts));
  }
  // BSP with replicas: a push of a clock not ended cannot complete.
  const bool bsp_replicated =
      view_.consistency().mode() == proto::MODE_BSP && routing_->replicas() > 0;
  if (auto op = bsp_replicated ? ops_.find(ts) : ops_.end();
      op != ops_.end() && op->second.push_clock >= 0 && op->second.pending > 0) {
    auto c = clocks_.find(op->second.push_clock);
    if (c != clocks_.end() && !c->second.ended) {
      return absl::FailedPreconditionError(absl::StrCat(
          "push ", ts, " of clock ", op->second.push_clock,
          " cannot be acknowledged before its clock ends (BSP with replicas: "
          "a clock's pushes are replicated as one sum once every worker "
          "ended it); call Clock or PushAndClock before waiting for it"));
    }
  }
  auto done = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (!sticky_.ok()) return true;
    auto it = ops_.find(ts);
    return it == ops_.end() || it->second.pending <= 0;
  };
  const int64_t t0 = MonotonicNanos();
  if (auto op = ops_.find(ts); op != ops_.end() && op->second.pending > 0 &&
                               op->second.wait_start_ns == 0) {
    op->second.wait_start_ns = t0;
  }
  const bool in_time = mu_.AwaitWithDeadline(absl::Condition(&done), deadline);
  if (options_.wait_ns != nullptr) {
    options_.wait_ns->Add(static_cast<uint64_t>(MonotonicNanos() - t0));
  }
  auto it = ops_.find(ts);
  if (it == ops_.end()) return sticky_;  // done and fine
  if (it->second.pending <= 0) {
    absl::Status s = it->second.status;
    ops_.erase(it);
    return s.ok() ? sticky_ : s;
  }
  // Not done (an earlier failure, or the deadline): the caller gives the
  // operation up, so its late replies must not touch the caller's memory.
  Abandon(ts);
  if (!in_time) {
    return absl::DeadlineExceededError(
        absl::StrCat("operation ", ts, " not done by the deadline"));
  }
  return sticky_;
}

bool KVWorker::MayRetry(int64_t ts, int attempt, absl::Duration backoff) {
  absl::MutexLock l(&mu_);
  if (closing_ || !sticky_.ok() || attempt >= options_.max_attempts) {
    return false;
  }
  auto it = ops_.find(ts);
  if (it == ops_.end() || it->second.abandoned) return false;
  return clock_->Now() + backoff <= it->second.retry_deadline;
}

absl::Status KVWorker::GaveUp(const absl::Status& s, const char* what,
                              int server, int attempt) const {
  if (Resendable(s) || IsStaleEpoch(s)) {
    {
      // Not retried because an earlier operation failed: that failure is
      // the one to report.
      absl::MutexLock l(&mu_);
      if (!sticky_.ok()) return sticky_;
    }
    return Annotate(s, absl::StrCat(what, " S[", server, "]: gave up after ",
                                    attempt + 1, " attempts"));
  }
  return Annotate(s, absl::StrCat(what, " S[", server, "]"));
}

// ------------------------------------------------------------------- push

int64_t KVWorker::Push(int table, absl::Span<const uint64_t> keys,
                       absl::Span<const float> vals, int num_examples) {
  return PushImpl(table, keys, vals, nullptr, num_examples, false);
}

int64_t KVWorker::PushAndClock(int table, absl::Span<const uint64_t> keys,
                               absl::Span<const float> vals,
                               int num_examples) {
  return PushImpl(table, keys, vals, nullptr, num_examples, true);
}

KVWorker::PushBuffer KVWorker::NewPushBuffer(size_t floats) {
  PushBuffer b;
  if (floats > 0) {
    if (std::shared_ptr<char> m =
            clients_->SharedMemory(floats * sizeof(float));
        m != nullptr) {
      b.vals = absl::Span<float>(reinterpret_cast<float*>(m.get()), floats);
      b.owner = std::move(m);
      b.shared = true;
      return b;
    }
  }
  // 64-byte aligned, as the shared memory is (pages).
  struct Aligned {
    explicit Aligned(size_t n)
        : p(static_cast<float*>(::operator new[](
              std::max<size_t>(n, 1) * sizeof(float), std::align_val_t{64}))) {}
    Aligned(const Aligned&) = delete;
    Aligned& operator=(const Aligned&) = delete;
    ~Aligned() { ::operator delete[](p, std::align_val_t{64}); }
    float* const p;
  };
  auto a = std::make_shared<Aligned>(floats);
  b.vals = absl::Span<float>(a->p, floats);
  b.owner = std::move(a);
  return b;
}

int64_t KVWorker::ZPush(int table, absl::Span<const uint64_t> keys,
                        absl::Span<const float> vals,
                        std::shared_ptr<const void> owner, int num_examples) {
  return PushImpl(table, keys, vals, owner, num_examples, false);
}

int64_t KVWorker::ZPushAndClock(int table, absl::Span<const uint64_t> keys,
                                absl::Span<const float> vals,
                                std::shared_ptr<const void> owner,
                                int num_examples) {
  return PushImpl(table, keys, vals, owner, num_examples, true);
}

int64_t KVWorker::ZPush(int table, const KeySet& keys,
                        absl::Span<const float> vals,
                        std::shared_ptr<const void> owner, int num_examples) {
  return PushImpl(table, keys.keys(), vals, owner, num_examples, false, &keys);
}

int64_t KVWorker::ZPushAndClock(int table, const KeySet& keys,
                                absl::Span<const float> vals,
                                std::shared_ptr<const void> owner,
                                int num_examples) {
  return PushImpl(table, keys.keys(), vals, owner, num_examples, true, &keys);
}

int64_t KVWorker::PushImpl(int table, absl::Span<const uint64_t> keys,
                           absl::Span<const float> vals,
                           const std::shared_ptr<const void>& owner,
                           int num_examples, bool end_clock,
                           const KeySet* set) {
  absl::MutexLock order(&order_mu_);
  int64_t ts, clock, clock_ts = -1;
  absl::Status bad = BeginPush(table, keys, vals, end_clock,
                               end_clock ? num_examples : 0, &ts, &clock,
                               end_clock ? &clock_ts : nullptr);
  if (!bad.ok()) {
    PartDone(ts, bad);
    if (!end_clock) return ts;
    SendClock(clock);  // no push to ride on: the clock travels alone
    return clock_ts;
  }
  FilterAndStart(ts, table, clock, keys, vals, num_examples, clock_ts, owner,
                 set);
  PartDone(ts, absl::OkStatus());
  return end_clock ? clock_ts : ts;
}

void KVWorker::FilterAndStart(int64_t ts, int table, int64_t clock,
                              absl::Span<const uint64_t> keys,
                              absl::Span<const float> vals, int num_examples,
                              int64_t clock_ts,
                              const std::shared_ptr<const void>& owner,
                              const KeySet* set) {
  push_raw_bytes_.fetch_add(static_cast<int64_t>(
      keys.size() * sizeof(uint64_t) + vals.size() * sizeof(float)));
  if (filter_ == nullptr || !filter_->options().keeps_residuals()) {
    StartPush(ts, table, clock, keys, vals.data(), num_examples, 0, clock_ts,
              nullptr, owner, set);
    return;
  }
  std::vector<uint64_t> k;
  std::vector<float> v;
  std::vector<uint32_t> slots;
  filter_->Filter(table, dim(table), keys, vals.data(), &k, &v, &slots);
  StartPush(ts, table, clock, k, v.data(), num_examples, 0, clock_ts,
            slots.data());
}

absl::Status KVWorker::BeginPush(int table, absl::Span<const uint64_t> keys,
                                 absl::Span<const float> vals, bool end_clock,
                                 int clock_examples, int64_t* ts,
                                 int64_t* clock, int64_t* clock_ts) {
  absl::MutexLock l(&mu_);
  if (options_.max_unacked_clocks > 0) {
    // Backpressure (see KVWorkerOptions::max_unacked_clocks).
    auto room = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return clocks_.empty() || !sticky_.ok() || closing_ ||
             clocks_.begin()->first + options_.max_unacked_clocks >
                 clock_count_;
    };
    if (!room()) {
      const int64_t t0 = options_.wait_ns != nullptr ? MonotonicNanos() : 0;
      mu_.Await(absl::Condition(&room));
      if (options_.wait_ns != nullptr) {
        options_.wait_ns->Add(static_cast<uint64_t>(MonotonicNanos() - t0));
      }
    }
  }
  *ts = NewOp(1);  // a guard part, released by the caller
  if (options_.metrics != nullptr) {
    Op& op = ops_[*ts];
    op.kind = PushPullMetrics::kPush;
    op.table = table;
    op.bytes = keys.size() * sizeof(uint64_t) + vals.size() * sizeof(float);
    op.start_ns = MonotonicNanos();
  }
  *clock = clock_count_;
  ops_[*ts].push_clock = *clock;
  ++clocks_[*clock].pending_pushes;
  ops_[*ts].on_done = [this, clock = *clock] {
    // Once the clock has ended, each of its pushes holds a part of the
    // clock's op (see Clock).
    int64_t ended_ts = -1;
    {
      absl::MutexLock l(&mu_);
      auto it = clocks_.find(clock);
      if (it == clocks_.end()) return;
      ClockState& c = it->second;
      --c.pending_pushes;
      if (c.ended) ended_ts = c.ts;
      if (c.pending_pushes == 0 && c.sent) clocks_.erase(it);
    }
    if (ended_ts >= 0) PartDone(ended_ts, absl::OkStatus());
  };
  if (end_clock) *clock_ts = EndClockLocked(clock_examples);
  if (table < 0 || table >= static_cast<int>(dims_.size()) ||
      vals.size() != keys.size() * dims_[table]) {
    return absl::InvalidArgumentError(
        absl::StrCat("push: table ", table, " with ", keys.size(),
                     " keys and ", vals.size(), " values"));
  }
  return absl::OkStatus();
}

void KVWorker::StartPush(int64_t ts, int table, int64_t clock,
                         absl::Span<const uint64_t> keys, const float* vals,
                         int num_examples, int attempt, int64_t clock_ts,
                         const uint32_t* slots,
                         const std::shared_ptr<const void>& owner,
                         const KeySet* set) {
  std::shared_ptr<const Routing> routing;
  int dim;
  int64_t epoch;
  {
    absl::MutexLock l(&mu_);
    routing = routing_;
    dim = dims_[table];
    epoch = view_.epoch();
  }
  using Run = KeySet::Run;
  // Runs of keys per range, grouped by owner; in key order per owner (a
  // KeySet's found once per routing).
  std::map<int, std::vector<Run>> by_server;
  if (set != nullptr) {
    for (const Run& run : *set->RunsFor(routing)) {
      by_server[routing->OwnerOfRange(run.range)].push_back(run);
    }
  } else {
    routing->ForEachRangeRun(keys, [&](int range, size_t first, size_t last) {
      by_server[routing->OwnerOfRange(range)].push_back(
          Run{range, first, last});
    });
  }
  std::vector<std::shared_ptr<PushSlice>> out;
  out.reserve(by_server.size());
  for (const auto& [server, runs] : by_server) {
    auto p = std::make_shared<PushSlice>();
    p->ts = ts;
    p->server = server;
    proto::PushRequest& r = p->req;
    r.set_worker_id(options_.worker_id);
    r.set_clock(clock);
    r.set_epoch(epoch);
    r.set_table(table);
    r.set_num_examples(num_examples);
    size_t count = 0;
    std::vector<std::pair<size_t, size_t>> spans;  // runs, adjacent joined
    for (const Run& run : runs) {
      count += run.last - run.first;
      if (!spans.empty() && spans.back().second == run.first) {
        spans.back().second = run.last;
      } else {
        spans.emplace_back(run.first, run.last);
      }
    }
    const size_t pieces = spans.size();
    p->keys = SliceSet(set, routing, server, table, keys, spans, count);
    std::string* v = r.mutable_vals();
    // Appended, not resized then overwritten: libstdc++ zero-fills on
    // resize (a memset as costly as the copy).
    const proto::ValueEncoding encoding =
        filter_ != nullptr ? filter_->options().encoding : proto::VALUES_F32;
    const bool codec = filter_ != nullptr &&
                       filter_->options().codec != proto::CODEC_NONE;
    // Borrowed values go as they lie, unless they lie in pieces too small
    // to be worth a slice each (a run per range on a many-range ring).
    const bool borrow =
        owner != nullptr && encoding == proto::VALUES_F32 && !codec &&
        count * dim * sizeof(float) >= kMinBorrowedPiece * pieces;
    if (borrow) p->borrowed.owner = owner;
    if (!borrow) v->reserve(count * dim * EncodedValueBytes(encoding));
    for (const Run& run : runs) {
      const size_t n = run.last - run.first;
      proto::PushSegment* seg = r.add_segments();
      if (borrow) {
        const char* at = reinterpret_cast<const char*>(vals + run.first * dim);
        const size_t len = n * dim * sizeof(float);
        std::vector<absl::Span<const char>>& got = p->borrowed.pieces;
        if (!got.empty() && got.back().data() + got.back().size() == at) {
          got.back() = absl::Span<const char>(got.back().data(),
                                              got.back().size() + len);
        } else {
          got.emplace_back(at, len);
        }
      } else if (encoding == proto::VALUES_F32) {
        v->append(reinterpret_cast<const char*>(vals + run.first * dim),
                  n * dim * sizeof(float));
      } else {
        const float scale =
            filter_->Encode(table, dim, slots == nullptr ? nullptr : slots + run.first,
                            n, vals + run.first * dim, v);
        if (encoding == proto::VALUES_INT8) seg->set_scale(scale);
      }
      seg->set_range(run.range);
      seg->set_num_keys(static_cast<uint32_t>(n));
    }
    r.set_value_encoding(encoding);
    if (codec) {
      std::string packed;
      if (Compress(filter_->options().codec, *v, &packed)) {
        r.set_vals_raw_bytes(v->size());
        r.set_vals_codec(filter_->options().codec);
        v->swap(packed);
      }
    }
    out.push_back(std::move(p));
  }
  // The clock ending with this push (PushAndClock): each server's share of
  // the announcement rides on its slice; servers without one get their
  // own Clock request.
  std::vector<std::pair<int, std::shared_ptr<proto::ClockRequest>>> alone;
  std::vector<std::shared_ptr<ServerClient>> servers;
  {
    absl::MutexLock l(&mu_);
    ClockState& cs = clocks_[clock];
    for (auto& p : out) {
      for (proto::PushSegment& seg : *p->req.mutable_segments()) {
        seg.set_seq(SentLocked(seg.range()));
        if (static_cast<size_t>(seg.range()) >= cs.segments_per_range.size()) {
          cs.segments_per_range.resize(seg.range() + 1);
        }
        ++cs.segments_per_range[seg.range()];
      }
      ++ops_[ts].pending;
    }
    if (clock_ts >= 0) {
      const proto::ClockRequest all = AnnouncementLocked(clock, cs);
      // Per server: the request its share goes in (a push's end_clock, or
      // its own clock request).
      // (Owners are >= 0, but only bounded by the view's server list when
      // it has one.)
      std::vector<proto::ClockRequest*> to(routing->num_servers(), nullptr);
      auto slot = [&to](int server) -> proto::ClockRequest*& {
        if (static_cast<size_t>(server) >= to.size()) to.resize(server + 1);
        return to[server];
      };
      for (auto& p : out) {
        p->clock_ts = clock_ts;
        slot(p->server) = p->req.mutable_end_clock();
      }
      std::map<int, std::shared_ptr<proto::ClockRequest>> by_server;
      for (int i = 0; i < all.range_ids_size(); ++i) {
        const int owner = routing->OwnerOfRange(all.range_ids(i));
        proto::ClockRequest*& r = slot(owner);
        if (r == nullptr) {
          auto own = std::make_shared<proto::ClockRequest>();
          r = own.get();
          by_server.emplace(owner, std::move(own));
        }
        AppendAnnouncement(all, i, epoch, r);
      }
      for (auto& [server, r] : by_server) alone.emplace_back(server, r);
      ops_[clock_ts].pending += static_cast<int>(alone.size());
      cs.sent = true;  // the pushes above keep cs alive
      servers = servers_;
    }
  }
  for (auto& p : out) SendPush(p, attempt);
  if (clock_ts < 0) return;
  for (auto& [server, r] : alone) {
    if (server < 0 || server >= static_cast<int>(servers.size())) {
      PartDone(clock_ts,
               absl::InternalError("server not in the current view"));
      continue;
    }
    SendClockTo(r, servers[server], clock_ts, server, 0);
  }
  PartDone(clock_ts, absl::OkStatus());  // the guard part of EndClockLocked
}

void KVWorker::ResendSegments(const PushSlice& old, int attempt) {
  std::shared_ptr<const Routing> routing;
  int64_t epoch;
  {
    absl::MutexLock l(&mu_);
    routing = routing_;
    epoch = view_.epoch();
  }
  const proto::PushRequest& o = old.req;
  // Compressed values are cut by segment once decompressed (they were
  // compressed here, so this cannot fail but on a bug); the new requests
  // go uncompressed. Borrowed ones are copied: a resend is rare.
  std::string unpacked;
  const std::string* vals = &o.vals();
  if (!old.borrowed.pieces.empty()) {
    old.borrowed.AppendTo(&unpacked);
    vals = &unpacked;
  } else if (o.vals_codec() != proto::CODEC_NONE) {
    absl::Status st =
        Decompress(o.vals_codec(), o.vals(), o.vals_raw_bytes(), &unpacked);
    ABSL_RAW_CHECK(st.ok(), "a push's own values do not decompress");
    vals = &unpacked;
  }
  const std::string& old_keys = *old.keys;
  const size_t dim_bytes =
      old_keys.empty() ? 0 : vals->size() / (old_keys.size() / 8);
  std::map<int, std::shared_ptr<PushSlice>> by_server;
  // Per new owner, the spans of the old request's keys it gets, and how
  // many.
  std::map<int, std::pair<std::vector<std::pair<size_t, size_t>>, size_t>>
      spans_by_server;
  size_t at = 0;  // key index in the old request
  for (const proto::PushSegment& seg : o.segments()) {
    const int server = routing->OwnerOfRange(seg.range());
    std::shared_ptr<PushSlice>& p = by_server[server];
    if (p == nullptr) {
      p = std::make_shared<PushSlice>();
      p->ts = old.ts;
      p->server = server;
      p->req.set_worker_id(o.worker_id());
      p->req.set_clock(o.clock());
      p->req.set_epoch(epoch);
      p->req.set_table(o.table());
      p->req.set_num_examples(o.num_examples());
      p->req.set_value_encoding(o.value_encoding());
    }
    auto& [spans, count] = spans_by_server[server];
    spans.emplace_back(at, at + seg.num_keys());
    count += seg.num_keys();
    p->req.mutable_vals()->append(*vals, at * dim_bytes,
                                  seg.num_keys() * dim_bytes);
    *p->req.add_segments() = seg;  // the same (range, seq)
    at += seg.num_keys();
  }
  {
    absl::MutexLock l(&mu_);
    ops_[old.ts].pending += static_cast<int>(by_server.size());
  }
  for (auto& [server, p] : by_server) {
    // The same list as before when the owner is (a resend keeps its name).
    const auto& [spans, count] = spans_by_server[server];
    p->keys = SliceKeys(server, o.table(), ViewAs<uint64_t>(old_keys), spans,
                        count);
    SendPush(p, attempt);
  }
}

void KeySet::CutFor(const std::shared_ptr<const Routing>& routing) const {
  if (cut_.routing == routing) return;
  cut_ = Cut();
  cut_.routing = routing;
}

std::shared_ptr<const std::vector<KeySet::Run>> KeySet::RunsFor(
    const std::shared_ptr<const Routing>& routing) const {
  {
    absl::MutexLock l(&mu_);
    if (cut_.routing == routing && cut_.runs != nullptr) return cut_.runs;
  }
  auto runs = std::make_shared<std::vector<Run>>();
  routing->ForEachRangeRun(keys_, [&](int range, size_t first, size_t last) {
    runs->push_back(Run{range, first, last});
  });
  absl::MutexLock l(&mu_);
  CutFor(routing);
  cut_.runs = runs;
  return runs;
}

std::shared_ptr<const std::vector<KeySlice>> KeySet::SlicesFor(
    const std::shared_ptr<const Routing>& routing) const {
  {
    absl::MutexLock l(&mu_);
    if (cut_.routing == routing && cut_.slices != nullptr) return cut_.slices;
  }
  auto slices = std::make_shared<const std::vector<KeySlice>>(
      routing->Slice(keys_));
  absl::MutexLock l(&mu_);
  CutFor(routing);
  cut_.slices = slices;
  return slices;
}

std::shared_ptr<const std::string> KVWorker::SliceSet(
    const KeySet* set, const std::shared_ptr<const Routing>& routing,
    int server, int table, absl::Span<const uint64_t> keys,
    absl::Span<const std::pair<size_t, size_t>> spans, size_t count) {
  if (set == nullptr) return SliceKeys(server, table, keys, spans, count);
  {
    absl::MutexLock l(&set->mu_);
    if (set->cut_.routing == routing) {
      for (const auto& [s, k] : set->cut_.by_server) {
        if (s == server) return k;
      }
    }
  }
  // Cut outside the set's lock (SliceKeys takes mu_, and reads the keys).
  std::shared_ptr<const std::string> k =
      SliceKeys(server, table, keys, spans, count);
  absl::MutexLock l(&set->mu_);
  set->CutFor(routing);
  set->cut_.by_server.emplace_back(server, k);
  return k;
}

std::shared_ptr<const std::string> KVWorker::SliceKeys(
    int server, int table, absl::Span<const uint64_t> keys,
    absl::Span<const std::pair<size_t, size_t>> spans, size_t count) {
  const size_t bytes = count * sizeof(uint64_t);
  if (options_.key_lists_per_server > 0 && count > 0) {
    // The lists of this size, taken under the lock; compared outside it (a
    // list of 100k keys is 800 KB to read, and mu_ is every op's lock). One
    // evicted meanwhile is still a correct match: AttachKeys then sends it
    // under a new name.
    absl::InlinedVector<std::shared_ptr<const std::string>, 8> candidates;
    {
      absl::MutexLock l(&mu_);
      auto found = lists_.find(server);
      if (found != lists_.end()) {
        for (const SentList& e : found->second) {
          if (e.table == table && e.keys->size() == bytes) {
            candidates.push_back(e.keys);
          }
        }
      }
    }
    for (const std::shared_ptr<const std::string>& list : candidates) {
      size_t at = 0;
      bool equal = true;
      for (const auto& [first, last] : spans) {
        const size_t len = (last - first) * sizeof(uint64_t);
        if (std::memcmp(list->data() + at, keys.data() + first, len) != 0) {
          equal = false;
          break;
        }
        at += len;
      }
      if (equal) return list;
    }
  }
  auto k = std::make_shared<std::string>();
  k->reserve(bytes);  // appended: no zero-fill
  for (const auto& [first, last] : spans) {
    k->append(reinterpret_cast<const char*>(keys.data() + first),
              (last - first) * sizeof(uint64_t));
  }
  return k;
}

template <typename Req>
bool KVWorker::AttachKeys(int server,
                          const std::shared_ptr<const std::string>& keys,
                          Req* req, bool borrow) {
  req->clear_key_list();
  req->clear_num_keys();
  req->clear_key_lists();
  req->clear_keys();
  if (options_.key_lists_per_server <= 0 || keys->empty()) {
    if (!borrow) req->set_keys(*keys);
    return !keys->empty();
  }
  absl::MutexLock l(&mu_);
  std::list<SentList>& sent = lists_[server];
  // SliceKeys compared the keys with these lists and, when one was equal,
  // gave the request that list's string: found by pointer. Keys it did not
  // find (or a resend's regrouped keys) go under a new name.
  auto it = std::find_if(sent.begin(), sent.end(), [&](const SentList& e) {
    return e.table == req->table() && e.keys == keys;
  });
  if (it == sent.end()) {
    sent.push_front(SentList{next_list_id_++, req->table(), keys, false});
    while (static_cast<int>(sent.size()) > options_.key_lists_per_server) {
      sent.pop_back();
    }
    it = sent.begin();
  } else {
    sent.splice(sent.begin(), sent, it);
  }
  req->set_key_list(it->id);
  req->set_key_lists(static_cast<uint32_t>(options_.key_lists_per_server));
  if (it->kept) {
    req->set_num_keys(static_cast<uint32_t>(keys->size() / sizeof(uint64_t)));
    return false;
  }
  if (!borrow) req->set_keys(*keys);  // the server keeps it under the name
  return true;
}

void KVWorker::ListKept(int server, uint64_t id) {
  if (id == 0) return;
  absl::MutexLock l(&mu_);
  for (SentList& e : lists_[server]) {
    if (e.id == id) e.kept = true;
  }
}

void KVWorker::ListLost(int server, uint64_t id) {
  absl::MutexLock l(&mu_);
  for (SentList& e : lists_[server]) {
    if (e.id == id) e.kept = false;
  }
}

void KVWorker::SendPush(std::shared_ptr<PushSlice> slice, int attempt) {
  std::shared_ptr<ServerClient> client;
  absl::Status fenced;
  {
    absl::MutexLock l(&mu_);
    fenced = fence_;
    if (slice->server < static_cast<int>(servers_.size())) {
      client = servers_[slice->server];
    }
  }
  if (!fenced.ok()) {
    OnPushReply(slice, attempt, fenced);
    return;
  }
  if (client == nullptr) {
    OnPushReply(slice, attempt,
                absl::InternalError("server not in the current view"));
    return;
  }
  // The keys go borrowed from slice->keys, which no send changes.
  slice->keys_sent =
      AttachKeys(slice->server, slice->keys, &slice->req, /*borrow=*/true);
  push_bytes_.fetch_add(static_cast<int64_t>(
      (slice->keys_sent ? slice->keys->size() : 0) + slice->req.vals().size() +
      slice->borrowed.size()));
  // The request is shared with the transport; `slice` keeps it alive.
  std::shared_ptr<const proto::PushRequest> req(slice, &slice->req);
  auto done = Tracked<proto::PushResponse>(
      slice->server,
      [this, slice, attempt](const absl::Status& s, proto::PushResponse*) {
        OnPushReply(slice, attempt, s);
      },
      /*watched=*/true);
  const absl::Time deadline = clock_->Now() + options_.request_timeout;
  if (slice->borrowed.pieces.empty() && !slice->keys_sent) {
    client->Push(std::move(req), deadline, std::move(done));
  } else {
    BorrowedValues borrowed = slice->borrowed;
    if (slice->keys_sent) {
      borrowed.keys = absl::Span<const char>(*slice->keys);
      borrowed.keys_owner = slice->keys;
    }
    client->PushBorrowed(std::move(req), std::move(borrowed), deadline,
                         std::move(done));
  }
}

void KVWorker::OnPushReply(std::shared_ptr<PushSlice> slice, int attempt,
                           const absl::Status& s) {
  auto settle = [&] {
    absl::MutexLock l(&mu_);
    for (const proto::PushSegment& seg : slice->req.segments()) {
      AnsweredLocked(seg.range(), seg.seq());
    }
  };
  if (s.ok()) {
    if (slice->keys_sent) {
      ListKept(slice->server, slice->req.key_list());
    }
    settle();
    PartDone(slice->ts, s);
    return;
  }
  if (IsKeysNotCached(s) && MayRetry(slice->ts, attempt, absl::ZeroDuration())) {
    // Evicted or never kept (a restarted or promoted server): with keys.
    ListLost(slice->server, slice->req.key_list());
    SendPush(slice, attempt + 1);
    return;
  }
  const absl::Duration backoff = Backoff(attempt);
  if ((IsStaleEpoch(s) || Unreachable(s) || ServerStopped(s)) &&
      MayRetry(slice->ts, attempt, backoff)) {
    // Regroup the same segments (same seqs) by their ranges' owners in a
    // newer view (after a failover: the promoted backups, which hold the
    // ranges' exactly-once state). The new requests continue this one's
    // attempt count.
    const int suspect = Unreachable(s) ? slice->server : -1;
    const bool queued = Later(backoff, [this, slice, attempt, suspect] {
      RefreshView(suspect, slice->req.epoch());
      ResendSegments(*slice, attempt + 1);
      // A clock that rode on it goes to its ranges' owners on its own.
      if (slice->req.has_end_clock()) {
        SendClockRanges(slice->req.end_clock(), slice->clock_ts, attempt + 1);
      }
      PartDone(slice->ts, absl::OkStatus());
    });
    if (queued) return;
  }
  if (Resendable(s) && MayRetry(slice->ts, attempt, backoff)) {
    // Maybe applied (a lost reply): the same seqs make the server skip it.
    if (Later(backoff,
              [this, slice, attempt] { SendPush(slice, attempt + 1); })) {
      return;
    }
  }
  settle();
  PartDone(slice->ts, GaveUp(s, "push to", slice->server, attempt));
}

// ------------------------------------------------------------------- pull

int64_t KVWorker::Pull(int table, absl::Span<const uint64_t> keys,
                       std::vector<float>* out, int64_t at_clock) {
  return PullImpl(table, keys, out, at_clock, nullptr);
}

int64_t KVWorker::Pull(int table, const KeySet& keys, std::vector<float>* out,
                       int64_t at_clock) {
  return PullImpl(table, keys.keys(), out, at_clock, &keys);
}

int64_t KVWorker::PullInPlace(int table, absl::Span<const uint64_t> keys,
                              PulledValues* out, int64_t at_clock) {
  return PullImpl(table, keys, nullptr, at_clock, nullptr, out);
}

bool KVWorker::WatchOthers(int table, uint64_t key, int64_t others_at,
                           absl::Duration max_wait,
                           std::function<void(absl::Status)> fired) {
  int64_t ts, clock;
  auto target = std::make_shared<PullTarget>();
  target->others_at = std::max<int64_t>(others_at, 1);
  target->watch_wait = std::max(max_wait, absl::Milliseconds(1));
  {
    absl::MutexLock l(&mu_);
    if (table < 0 || table >= static_cast<int>(dims_.size()) ||
        dims_[table] == 0) {
      return false;
    }
    ts = NewOp(1);
    clock = clock_count_;
    Op& op = ops_[ts];
    op.watch = true;
    op.abandoned = true;  // nobody waits: erased however it ends
    op.on_watch = std::move(fired);
    op.target = target;  // `out` stays null: the values are dropped
  }
  const uint64_t keys[1] = {key};
  StartPull(ts, table, clock, absl::MakeConstSpan(keys), {}, std::move(target),
            0, nullptr);
  PartDone(ts, absl::OkStatus());
  return true;
}

void KVWorker::PulledValues::CopyTo(float* out, int dim) const {
  for (const Piece& p : pieces) {
    std::memcpy(out + p.first * static_cast<size_t>(dim), p.vals.data(),
                p.vals.size() * sizeof(float));
  }
}

int64_t KVWorker::PullImpl(int table, absl::Span<const uint64_t> keys,
                           std::vector<float>* out, int64_t at_clock,
                           const KeySet* set, PulledValues* in_place) {
  int64_t ts, clock;
  int dim = 0;
  std::shared_ptr<PullTarget> target;
  {
    absl::MutexLock l(&mu_);
    ts = NewOp(1);
    clock = at_clock >= 0 ? at_clock : clock_count_;
    if (table >= 0 && table < static_cast<int>(dims_.size())) {
      dim = dims_[table];
    }
    if (options_.metrics != nullptr) {
      Op& op = ops_[ts];
      op.kind = PushPullMetrics::kPull;
      op.table = table;
      op.bytes = keys.size() * (sizeof(uint64_t) + sizeof(float) * dim);
      op.start_ns = MonotonicNanos();
    }
    if (dim != 0) {
      target = std::make_shared<PullTarget>();
      target->kept = in_place != nullptr;
      absl::MutexLock t(&target->mu);
      target->out = out;
      target->in_place = in_place;
      ops_[ts].target = target;
    }
  }
  if (dim == 0) {
    PartDone(ts, absl::InvalidArgumentError(
                     absl::StrCat("pull: unknown table ", table)));
    return ts;
  }
  if (in_place != nullptr) {
    in_place->pieces.clear();
  } else {
    out->resize(keys.size() * dim);
  }
  StartPull(ts, table, clock, keys, {}, std::move(target), 0, set);
  PartDone(ts, absl::OkStatus());
  return ts;
}

void KVWorker::StartPull(int64_t ts, int table, int64_t clock,
                         absl::Span<const uint64_t> keys,
                         const std::vector<size_t>& pos,
                         std::shared_ptr<PullTarget> target, int attempt,
                         const KeySet* set) {
  std::shared_ptr<const Routing> routing;
  int dim;
  int64_t epoch;
  {
    absl::MutexLock l(&mu_);
    routing = routing_;
    dim = dims_[table];
    epoch = view_.epoch();
  }
  // A KeySet's slices are found once per routing.
  std::shared_ptr<const std::vector<KeySlice>> set_slices;
  std::vector<KeySlice> own;
  if (set != nullptr) {
    set_slices = set->SlicesFor(routing);
  } else {
    own = routing->Slice(keys);
  }
  const std::vector<KeySlice>& slices = set != nullptr ? *set_slices : own;
  std::vector<std::shared_ptr<PullSlice>> todo;
  for (const KeySlice& ks : slices) {
    auto p = std::make_shared<PullSlice>();
    p->ts = ts;
    p->server = ks.server;
    p->dim = dim;
    p->target = target;
    proto::PullRequest& r = p->req;
    r.set_worker_id(options_.worker_id);
    r.set_clock(clock);
    r.set_epoch(epoch);
    r.set_table(table);
    r.set_others_at(target->others_at);  // 0 (not sent) but for a watch
    r.set_wait_ms(absl::ToInt64Milliseconds(
        target->others_at > 0 ? target->watch_wait : options_.pull_wait));
    p->keys = SliceSet(set, routing, ks.server, table, keys, ks.spans,
                       ks.count);
    for (const auto& [first, last] : ks.spans) {
      if (pos.empty()) {
        p->spans_first.push_back(first);
        p->spans_last.push_back(last);
      } else {
        for (size_t i = first; i < last; ++i) {
          if (!p->spans_last.empty() && p->spans_last.back() == pos[i]) {
            ++p->spans_last.back();
          } else {
            p->spans_first.push_back(pos[i]);
            p->spans_last.push_back(pos[i] + 1);
          }
        }
      }
    }
    todo.push_back(std::move(p));
  }
  {
    absl::MutexLock l(&mu_);
    ops_[ts].pending += static_cast<int>(todo.size());
  }
  for (auto& p : todo) SendPull(p, attempt);
}

void KVWorker::SendPull(std::shared_ptr<PullSlice> slice, int attempt) {
  std::shared_ptr<ServerClient> client;
  absl::Status fenced;
  {
    absl::MutexLock l(&mu_);
    fenced = fence_;
    if (slice->server < static_cast<int>(servers_.size())) {
      client = servers_[slice->server];
    }
  }
  if (!fenced.ok()) {
    OnPullReply(slice, attempt, fenced, nullptr, {});
    return;
  }
  if (client == nullptr) {
    OnPullReply(slice, attempt,
                absl::InternalError("server not in the current view"),
                nullptr, {});
    return;
  }
  AttachKeys(slice->server, slice->keys, &slice->req);
  std::shared_ptr<const proto::PullRequest> req(slice, &slice->req);
  if (slice->target->kept) {
    client->PullKept(
        req, clock_->Now() + options_.request_timeout,
        Tracked<proto::PullResponse, absl::Span<const char>,
                std::shared_ptr<const void>>(
            slice->server,
            [this, slice, attempt](
                const absl::Status& s, proto::PullResponse* resp,
                absl::Span<const char> vals, std::shared_ptr<const void> keep) {
              OnPullReply(slice, attempt, s, resp, vals, std::move(keep));
            }));
    return;
  }
  client->PullValues(
      req, clock_->Now() + options_.request_timeout,
      Tracked<proto::PullResponse, absl::Span<const char>>(
          slice->server,
          [this, slice, attempt](const absl::Status& s,
                                 proto::PullResponse* resp,
                                 absl::Span<const char> vals) {
            OnPullReply(slice, attempt, s, resp, vals);
          }));
}

void KVWorker::OnPullReply(std::shared_ptr<PullSlice> slice, int attempt,
                           const absl::Status& s, proto::PullResponse* resp,
                           absl::Span<const char> vals,
                           std::shared_ptr<const void> keep) {
  if (s.ok()) {
    if (!slice->req.keys().empty()) {
      ListKept(slice->server, slice->req.key_list());
    }
    const size_t n = slice->keys->size() / sizeof(uint64_t);
    const int dim = slice->dim;
    if (vals.size() != n * dim * sizeof(float)) {
      PartDone(slice->ts,
               absl::InternalError(absl::StrCat(
                   "pull from S[", slice->server, "]: ", vals.size(),
                   " value bytes for ", n, " keys")));
      return;
    }
    const char* v = vals.data();  // may be unaligned: copied bytewise
    if (slice->target->kept && n > 0) {
      if (keep == nullptr ||
          reinterpret_cast<uintptr_t>(v) % alignof(float) != 0) {
        // Not kept by the transport, or not where floats can be read.
        auto copy = std::make_shared<std::vector<float>>(vals.size() / 4);
        std::memcpy(copy->data(), v, vals.size());
        v = reinterpret_cast<const char*>(copy->data());
        keep = std::move(copy);
      }
      // Under the target's lock: Wait clears `in_place` before it returns.
      absl::MutexLock l(&slice->target->mu);
      if (PulledValues* out = slice->target->in_place; out != nullptr) {
        const float* f = reinterpret_cast<const float*>(v);
        size_t at = 0;
        for (size_t i = 0; i < slice->spans_first.size(); ++i) {
          const size_t first = slice->spans_first[i];
          const size_t len = (slice->spans_last[i] - first) * dim;
          PulledValues::Piece piece{first, absl::MakeConstSpan(f + at, len),
                                    keep};
          at += len;
          // In key order (slices answer in any order).
          auto pos =
              std::upper_bound(out->pieces.begin(), out->pieces.end(), first,
                               [](size_t k, const PulledValues::Piece& p) {
                                 return k < p.first;
                               });
          out->pieces.insert(pos, std::move(piece));
        }
      }
    }
    if (!slice->target->kept) {
      // Under the target's lock: Wait clears `out` before it returns.
      absl::MutexLock l(&slice->target->mu);
      std::vector<float>* out = slice->target->out;
      if (out != nullptr) {
        size_t at = 0;
        for (size_t i = 0; i < slice->spans_first.size(); ++i) {
          const size_t f = slice->spans_first[i], l = slice->spans_last[i];
          std::memcpy(out->data() + f * dim, v + at * dim * sizeof(float),
                      (l - f) * dim * sizeof(float));
          at += l - f;
        }
      }
    }
    for (int64_t seen = others_min_clock_.load(std::memory_order_relaxed);
         resp->others_min_clock() > seen &&
         !others_min_clock_.compare_exchange_weak(
             seen, resp->others_min_clock(), std::memory_order_relaxed);) {
    }
    PartDone(slice->ts, s, resp->held_us());
    return;
  }
  if (IsKeysNotCached(s) && MayRetry(slice->ts, attempt, absl::ZeroDuration())) {
    ListLost(slice->server, slice->req.key_list());
    SendPull(slice, attempt + 1);
    return;
  }
  const absl::Duration backoff = Backoff(attempt);
  if ((IsStaleEpoch(s) || Unreachable(s) || ServerStopped(s)) &&
      MayRetry(slice->ts, attempt, backoff)) {
    const int suspect = Unreachable(s) ? slice->server : -1;
    const bool queued = Later(backoff, [this, slice, attempt, suspect] {
      RefreshView(suspect, slice->req.epoch());
      std::vector<size_t> pos;
      for (size_t i = 0; i < slice->spans_first.size(); ++i) {
        for (size_t p = slice->spans_first[i]; p < slice->spans_last[i]; ++p) {
          pos.push_back(p);
        }
      }
      StartPull(slice->ts, slice->req.table(), slice->req.clock(),
                ViewAs<uint64_t>(*slice->keys), pos, slice->target,
                attempt + 1);
      PartDone(slice->ts, absl::OkStatus());
    });
    if (queued) return;
  }
  if (Resendable(s) && MayRetry(slice->ts, attempt, backoff)) {
    if (Later(backoff,
              [this, slice, attempt] { SendPull(slice, attempt + 1); })) {
      return;
    }
  }
  PartDone(slice->ts, GaveUp(s, "pull from", slice->server, attempt));
}

// ------------------------------------------------------------------ clock

int64_t KVWorker::Clock(int num_examples) {
  absl::MutexLock order(&order_mu_);
  int64_t c, ts;
  {
    absl::MutexLock l(&mu_);
    c = clock_count_;
    ts = EndClockLocked(num_examples);
  }
  // At once, not after the pushes' acknowledgements (with replication, a
  // round trip to the backups later): the announcement counts the segments
  // each range must receive before the clock completes there, so it may
  // arrive before them.
  SendClock(c);
  return ts;
}

int64_t KVWorker::EndClockLocked(int num_examples) {
  const int64_t c = clock_count_++;
  ClockState& cs = clocks_[c];
  cs.ended = true;
  cs.examples = num_examples;
  // One part released once the announcement is sent, one by each push still
  // unacknowledged: the clock's op completes when the servers have the
  // announcement and every push of the clock was acknowledged (work units
  // wait on it).
  cs.ts = NewOp(1 + cs.pending_pushes);
  return cs.ts;
}

proto::ClockRequest KVWorker::AnnouncementLocked(int64_t clock,
                                                 const ClockState& cs) {
  proto::ClockRequest all;
  all.set_worker_id(options_.worker_id);
  all.set_clock(clock);
  all.set_num_examples(cs.examples);
  // Every range, so each one completes the clock (most with 0 segments).
  const int n = routing_->num_ranges();
  all.mutable_range_ids()->Reserve(n);
  all.mutable_range_segments()->Reserve(n);
  all.mutable_range_settled_seqs()->Reserve(n);
  for (int r = 0; r < n; ++r) {
    all.add_range_ids(r);
    all.add_range_segments(static_cast<size_t>(r) < cs.segments_per_range.size()
                               ? cs.segments_per_range[r]
                               : 0);
    all.add_range_settled_seqs(static_cast<size_t>(r) < seqs_.size()
                                   ? seqs_[r].settled
                                   : 0);
  }
  return all;
}

uint64_t KVWorker::SentLocked(int range) {
  if (static_cast<size_t>(range) >= seqs_.size()) seqs_.resize(range + 1);
  RangeSeqs& rs = seqs_[range];
  rs.open.push_back(false);
  return ++rs.next;
}

void KVWorker::AnsweredLocked(int range, uint64_t seq) {
  if (static_cast<size_t>(range) >= seqs_.size()) return;
  RangeSeqs& rs = seqs_[range];
  if (seq <= rs.settled || seq > rs.next) return;  // answered before
  rs.open[seq - rs.settled - 1] = true;
  while (!rs.open.empty() && rs.open.front()) {
    rs.open.pop_front();
    ++rs.settled;
  }
}

void KVWorker::SendClock(int64_t clock) {
  proto::ClockRequest all;
  int64_t ts;
  {
    absl::MutexLock l(&mu_);
    auto it = clocks_.find(clock);
    if (it == clocks_.end()) return;
    ClockState& cs = it->second;
    ts = cs.ts;
    all = AnnouncementLocked(clock, cs);
    cs.sent = true;
    if (cs.pending_pushes == 0) clocks_.erase(it);
  }
  SendClockRanges(all, ts, 0);
  PartDone(ts, absl::OkStatus());
}

void KVWorker::SendClockRanges(const proto::ClockRequest& all, int64_t ts,
                               int attempt) {
  std::vector<std::pair<int, std::shared_ptr<proto::ClockRequest>>> reqs;
  std::vector<std::shared_ptr<ServerClient>> servers;
  {
    absl::MutexLock l(&mu_);
    servers = servers_;
    std::map<int, std::shared_ptr<proto::ClockRequest>> by_server;
    for (int i = 0; i < all.range_ids_size(); ++i) {
      std::shared_ptr<proto::ClockRequest>& r =
          by_server[routing_->OwnerOfRange(all.range_ids(i))];
      if (r == nullptr) r = std::make_shared<proto::ClockRequest>();
      AppendAnnouncement(all, i, view_.epoch(), r.get());
    }
    for (auto& [s, r] : by_server) reqs.emplace_back(s, std::move(r));
    ops_[ts].pending += static_cast<int>(reqs.size());
  }
  for (auto& [s, r] : reqs) {
    if (s < 0 || s >= static_cast<int>(servers.size())) {
      PartDone(ts, absl::InternalError("server not in the current view"));
      continue;
    }
    SendClockTo(r, servers[s], ts, s, attempt);
  }
}

void KVWorker::SendClockTo(std::shared_ptr<const proto::ClockRequest> req,
                           std::shared_ptr<ServerClient> client, int64_t ts,
                           int server, int attempt) {
  absl::Status fenced;
  {
    absl::MutexLock l(&mu_);
    fenced = fence_;
  }
  if (!fenced.ok()) {
    PartDone(ts, fenced);
    return;
  }
  client->Clock(
      req, clock_->Now() + options_.request_timeout,
      Tracked<proto::ClockResponse>(server, [this, req, client, ts, server,
                                             attempt](const absl::Status& st,
                                                      proto::ClockResponse*) {
        if (st.ok()) {
          PartDone(ts, st);
          return;
        }
        const absl::Duration backoff = Backoff(attempt);
        if ((IsStaleEpoch(st) || Unreachable(st) || ServerStopped(st)) &&
            MayRetry(ts, attempt, backoff) &&
            Later(backoff, [this, req, ts, attempt, server,
                            suspect = Unreachable(st)] {
              // Its ranges moved: announce them to their new owners.
              RefreshView(suspect ? server : -1, req->epoch());
              SendClockRanges(*req, ts, attempt + 1);
              PartDone(ts, absl::OkStatus());
            })) {
          return;
        }
        if (Resendable(st) && MayRetry(ts, attempt, backoff) &&
            Later(backoff, [this, req, client, ts, server, attempt] {
              SendClockTo(req, client, ts, server, attempt + 1);
            })) {
          return;
        }
        PartDone(ts, GaveUp(st, "clock to", server, attempt));
      }, /*watched=*/true));
}

absl::Status KVWorker::Finish(absl::Time deadline) {
  int64_t final_clock;
  {
    absl::MutexLock l(&mu_);
    auto idle = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      if (!sticky_.ok()) return true;
      if (!clocks_.empty()) {
        for (const auto& [c, cs] : clocks_) {
          if (cs.pending_pushes > 0 || cs.ended) return false;
        }
      }
      for (const auto& [ts, op] : ops_) {
        if (op.pending > 0 && !op.watch) return false;
      }
      return true;
    };
    if (!mu_.AwaitWithDeadline(absl::Condition(&idle), deadline)) {
      return absl::DeadlineExceededError(
          "finish: operations still outstanding at the deadline");
    }
    if (!sticky_.ok()) return sticky_;
    final_clock = clock_count_;
  }
  // A pass tells every server that owns ranges in the current view. A
  // server answers STALE_EPOCH when a range moved off it before its backups
  // had the finish (elasticity, issue 9): the pass is redone under the
  // newer view (a finish is idempotent per range).
  for (int pass = 0;; ++pass) {
    bool stale = false;
    int64_t epoch;
    size_t num_servers;
    {
      absl::MutexLock l(&mu_);
      epoch = view_.epoch();
      num_servers = servers_.size();
    }
    for (size_t s = 0; s < num_servers && !stale; ++s) {
      proto::FinishRequest req;
      req.set_worker_id(options_.worker_id);
      req.set_final_clock(final_clock);
      absl::Status st;
      for (int attempt = 0; attempt <= options_.max_attempts; ++attempt) {
        std::shared_ptr<ServerClient> client;
        {
          // A server failed over or drained (issue 9), or one that owns no
          // range, has nothing to finish.
          absl::MutexLock l(&mu_);
          const auto& infos = view_.routing().servers();
          if (s >= servers_.size() ||
              (static_cast<int>(s) < infos.size() &&
               infos[static_cast<int>(s)].state() != proto::NODE_ALIVE) ||
              routing_->RangesOf(static_cast<int>(s)).empty()) {
            st = absl::OkStatus();
            break;
          }
          client = servers_[s];
        }
        st = client->Finish(req, clock_->Now() + absl::Seconds(30));
        if (IsStaleEpoch(st)) {
          stale = true;
          st = absl::OkStatus();
          break;
        }
        if (st.ok() || !Resendable(st) || absl::Now() > deadline) break;
        if (Unreachable(st)) RefreshView(static_cast<int>(s));
        clock_->SleepFor(Backoff(attempt));
      }
      if (!st.ok()) return Annotate(st, absl::StrCat("finish at S[", s, "]"));
    }
    if (!stale) break;
    if (pass >= options_.max_attempts || absl::Now() > deadline) {
      return absl::DeadlineExceededError(
          "finish: ranges kept moving between servers");
    }
    RefreshView(-1, epoch);
    clock_->SleepFor(Backoff(pass));
  }
  return absl::OkStatus();
}

// ------------------------------------------------------------ view, retry

void KVWorker::RefreshView(int suspect, int64_t sent_epoch,
                           absl::Duration silent) {
  int64_t known;
  {
    absl::MutexLock l(&mu_);
    known = view_.epoch();
    if (sent_epoch >= 0 && known > sent_epoch) return;
  }
  proto::GetViewRequest req;
  req.set_known_epoch(known);
  req.set_wait_ms(200);
  req.set_role(proto::ROLE_WORKER);
  req.set_id(options_.worker_id);
  if (suspect >= 0) {
    req.add_suspect_servers(suspect);
    req.add_suspect_silent_ms(absl::ToInt64Milliseconds(silent));
  }
  auto resp = scheduler_->GetView(req, clock_->Now() + absl::Seconds(5));
  if (!resp.ok() || !resp->ready()) return;
  for (const proto::NodeInfo& w : resp->view().workers()) {
    if (w.id() == options_.worker_id && w.state() == proto::NODE_DEAD) {
      Fence(absl::FailedPreconditionError(absl::StrCat(
          "W[", w.id(), "] was declared dead at view epoch ",
          resp->view().epoch(),
          ": its work went to the other workers, and the servers take "
          "nothing more from it")));
      return;
    }
  }
  std::vector<int> dead;
  {
    absl::MutexLock l(&mu_);
    if (resp->view().epoch() <= view_.epoch()) return;
    PS_LOG_INFO("routing view epoch {} -> {}", view_.epoch(),
                resp->view().epoch());
    InstallView(resp->view());
    for (const proto::NodeInfo& n : view_.routing().servers()) {
      if (n.state() == proto::NODE_DEAD) dead.push_back(n.id());
    }
  }
  // Calls still waiting on a failed-over server (one that hangs answers
  // none of them) go to the ranges' new owners, as a stale epoch's would.
  if (!dead.empty()) {
    FailCallsTo(dead, ErrorWithReason(
                          absl::StatusCode::kFailedPrecondition,
                          proto::REASON_STALE_EPOCH,
                          absl::StrCat("stale-epoch: the server was failed "
                                       "over at view epoch ",
                                       resp->view().epoch())));
  }
}

void KVWorker::Fence(const absl::Status& why) {
  std::vector<int> servers;
  {
    absl::MutexLock l(&mu_);
    if (!fence_.ok()) return;
    fence_ = why;
    if (sticky_.ok()) sticky_ = why;
    for (int i = 0; i < static_cast<int>(servers_.size()); ++i) {
      servers.push_back(i);
    }
  }
  PS_LOG_ERROR("{}", std::string(why.message()));
  FailCallsTo(servers, why);
}

void KVWorker::OnSchedulerEpoch(int64_t epoch) {
  {
    absl::MutexLock l(&mu_);
    if (epoch <= view_.epoch() || closing_) return;
  }
  RefreshView();
}

bool KVWorker::Later(absl::Duration delay, std::function<void()> fn) {
  absl::MutexLock l(&mu_);
  if (closing_) return false;
  auto id = std::make_shared<ps::Clock::TimerId>(0);
  // mu_ is held until *id is set and recorded; the timer takes mu_ first.
  *id = clock_->RunAfter(delay, Guarded([this, id, fn = std::move(fn)] {
    {
      absl::MutexLock l(&mu_);
      timers_.erase(*id);
    }
    fn();
  }));
  timers_.insert(*id);
  return true;
}

}  // namespace ps
