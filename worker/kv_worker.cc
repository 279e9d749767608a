#include "worker/kv_worker.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/bytes.h"
#include "common/logging.h"

namespace ps {
namespace {
constexpr int kMaxAttempts = 60;

absl::Duration Backoff(int attempt) {
  return absl::Milliseconds(std::min(1000, 20 * (1 << std::min(attempt, 6))));
}

}  // namespace

KVWorker::KVWorker(KVWorkerOptions options, const proto::ClusterView& view,
                   ClientFactory* clients, SchedulerClient* scheduler)
    : options_(options), clients_(clients), scheduler_(scheduler) {
  {
    absl::MutexLock l(&mu_);
    InstallView(view);
  }
  retry_thread_ = std::thread([this] { RetryLoop(); });
}

KVWorker::~KVWorker() {
  {
    // Let callbacks still in flight land before the members go away.
    absl::MutexLock l(&mu_);
    auto idle = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
      for (const auto& [ts, op] : ops_) {
        if (op.pending > 0) return false;
      }
      return true;
    };
    mu_.AwaitWithTimeout(absl::Condition(&idle), absl::Seconds(10));
  }
  {
    absl::MutexLock l(&retry_mu_);
    stopping_ = true;
  }
  retry_thread_.join();
}

void KVWorker::InstallView(const proto::ClusterView& view) {
  auto routing = Routing::FromProto(view.routing());
  if (!routing.ok()) {
    PS_LOG_ERROR("ignoring malformed view: {}", routing.status().ToString());
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
  return clock_;
}

int64_t KVWorker::NewOp(int pending) {
  int64_t ts = next_ts_++;
  ops_[ts].pending = pending;
  return ts;
}

void KVWorker::PartDone(int64_t ts, const absl::Status& s) {
  std::function<void()> fn;
  {
    absl::MutexLock l(&mu_);
    auto it = ops_.find(ts);
    if (it == ops_.end()) return;
    Op& op = it->second;
    if (!s.ok()) {
      if (op.status.ok()) op.status = s;
      if (sticky_.ok()) sticky_ = s;
    }
    if (--op.pending > 0) return;
    fn = std::move(op.on_done);
    if (op.status.ok()) ops_.erase(it);  // failures stay for Wait
  }
  if (fn) fn();
}

absl::Status KVWorker::Wait(int64_t ts, absl::Time deadline) {
  absl::MutexLock l(&mu_);
  auto done = [&]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
    if (!sticky_.ok()) return true;
    auto it = ops_.find(ts);
    return it == ops_.end() || it->second.pending <= 0;
  };
  if (!mu_.AwaitWithDeadline(absl::Condition(&done), deadline)) {
    return absl::DeadlineExceededError(
        absl::StrCat("operation ", ts, " not done by the deadline"));
  }
  auto it = ops_.find(ts);
  if (it != ops_.end() && it->second.pending <= 0) {
    absl::Status s = it->second.status;
    ops_.erase(it);
    if (!s.ok()) return s;
  }
  if (ts >= next_ts_) return absl::InvalidArgumentError("unknown timestamp");
  return sticky_;
}

bool KVWorker::Retriable(const absl::Status& s) const {
  return s.code() == absl::StatusCode::kUnavailable ||
         s.code() == absl::StatusCode::kDeadlineExceeded ||
         s.code() == absl::StatusCode::kAborted;
}

// ------------------------------------------------------------------- push

int64_t KVWorker::Push(int table, absl::Span<const uint64_t> keys,
                       absl::Span<const float> vals, int num_examples) {
  int64_t ts, clock;
  absl::Status bad;
  {
    absl::MutexLock l(&mu_);
    ts = NewOp(1);  // a guard part, released below
    clock = clock_;
    ++clocks_[clock].pending_pushes;
    ops_[ts].on_done = [this, clock] {
      bool send = false;
      {
        absl::MutexLock l(&mu_);
        ClockState& c = clocks_[clock];
        send = --c.pending_pushes == 0 && c.ended;
      }
      if (send) SendClock(clock);
    };
    if (table < 0 || table >= static_cast<int>(dims_.size()) ||
        vals.size() != keys.size() * dims_[table]) {
      bad = absl::InvalidArgumentError(absl::StrCat(
          "push: table ", table, " with ", keys.size(), " keys and ",
          vals.size(), " values"));
    }
  }
  if (!bad.ok()) {
    PartDone(ts, bad);
    return ts;
  }
  StartPush(ts, table, clock, keys, vals.data(), num_examples);
  PartDone(ts, absl::OkStatus());
  return ts;
}

void KVWorker::StartPush(int64_t ts, int table, int64_t clock,
                         absl::Span<const uint64_t> keys, const float* vals,
                         int num_examples) {
  std::shared_ptr<const Routing> routing;
  int dim;
  int64_t epoch;
  {
    absl::MutexLock l(&mu_);
    routing = routing_;
    dim = dims_[table];
    epoch = view_.epoch();
  }
  std::vector<KeySlice> slices = routing->Slice(keys);
  std::vector<std::shared_ptr<PushSlice>> out;
  out.reserve(slices.size());
  for (const KeySlice& ks : slices) {
    auto p = std::make_shared<PushSlice>();
    p->ts = ts;
    p->server = ks.server;
    proto::PushRequest& r = p->req;
    r.set_worker_id(options_.worker_id);
    r.set_clock(clock);
    r.set_epoch(epoch);
    r.set_table(table);
    r.set_num_examples(num_examples);
    std::string* k = r.mutable_keys();
    std::string* v = r.mutable_vals();
    k->resize(ks.count * sizeof(uint64_t));
    v->resize(ks.count * dim * sizeof(float));
    size_t at = 0;
    for (const auto& [first, last] : ks.spans) {
      const size_t n = last - first;
      std::memcpy(k->data() + at * sizeof(uint64_t), keys.data() + first,
                  n * sizeof(uint64_t));
      std::memcpy(v->data() + at * dim * sizeof(float), vals + first * dim,
                  n * dim * sizeof(float));
      at += n;
    }
    out.push_back(std::move(p));
  }
  {
    absl::MutexLock l(&mu_);
    for (auto& p : out) {
      const uint64_t seq = ++next_seq_[p->server];
      p->req.set_seq(seq);
      inflight_[p->server].insert(seq);
      ++clocks_[clock].pushes_per_server[p->server];
      ++ops_[ts].pending;
    }
  }
  for (auto& p : out) SendPush(p, 0);
}

void KVWorker::SendPush(std::shared_ptr<PushSlice> slice, int attempt) {
  std::shared_ptr<ServerClient> client;
  {
    absl::MutexLock l(&mu_);
    client = servers_.at(slice->server);
  }
  // The request is shared with the transport; `slice` keeps it alive.
  std::shared_ptr<const proto::PushRequest> req(slice, &slice->req);
  client->Push(
      req, absl::Now() + options_.request_timeout,
      [this, slice, attempt](const absl::Status& s, proto::PushResponse*) {
        if (s.ok()) {
          {
            absl::MutexLock l(&mu_);
            inflight_[slice->server].erase(slice->req.seq());
          }
          PartDone(slice->ts, s);
          return;
        }
        if (IsStaleEpoch(s) && attempt < kMaxAttempts) {
          // Not applied: drop its seq and count, re-slice with a newer view.
          Later(Backoff(attempt), [this, slice, attempt] {
            RefreshView();
            const proto::PushRequest& r = slice->req;
            {
              absl::MutexLock l(&mu_);
              inflight_[slice->server].erase(r.seq());
              --clocks_[r.clock()].pushes_per_server[slice->server];
            }
            StartPush(slice->ts, r.table(), r.clock(),
                      ViewAs<uint64_t>(r.keys()),
                      reinterpret_cast<const float*>(r.vals().data()),
                      r.num_examples());
            PartDone(slice->ts, absl::OkStatus());
          });
          return;
        }
        if (Retriable(s) && attempt < kMaxAttempts) {
          Later(Backoff(attempt),
                [this, slice, attempt] { SendPush(slice, attempt + 1); });
          return;
        }
        {
          absl::MutexLock l(&mu_);
          inflight_[slice->server].erase(slice->req.seq());
        }
        PartDone(slice->ts,
                 Annotate(s, absl::StrCat("push to S[", slice->server, "]")));
      });
}

// ------------------------------------------------------------------- pull

int64_t KVWorker::Pull(int table, absl::Span<const uint64_t> keys,
                       std::vector<float>* out, int64_t at_clock) {
  int64_t ts, clock;
  int dim = 0;
  {
    absl::MutexLock l(&mu_);
    ts = NewOp(1);
    clock = at_clock >= 0 ? at_clock : clock_;
    if (table >= 0 && table < static_cast<int>(dims_.size())) {
      dim = dims_[table];
    }
  }
  if (dim == 0) {
    PartDone(ts, absl::InvalidArgumentError(
                     absl::StrCat("pull: unknown table ", table)));
    return ts;
  }
  out->resize(keys.size() * dim);
  StartPull(ts, table, clock, keys, {}, out);
  PartDone(ts, absl::OkStatus());
  return ts;
}

void KVWorker::StartPull(int64_t ts, int table, int64_t clock,
                         absl::Span<const uint64_t> keys,
                         const std::vector<size_t>& pos,
                         std::vector<float>* out) {
  std::shared_ptr<const Routing> routing;
  int dim;
  int64_t epoch;
  {
    absl::MutexLock l(&mu_);
    routing = routing_;
    dim = dims_[table];
    epoch = view_.epoch();
  }
  std::vector<KeySlice> slices = routing->Slice(keys);
  std::vector<std::shared_ptr<PullSlice>> todo;
  for (const KeySlice& ks : slices) {
    auto p = std::make_shared<PullSlice>();
    p->ts = ts;
    p->server = ks.server;
    p->dim = dim;
    p->out = out;
    proto::PullRequest& r = p->req;
    r.set_worker_id(options_.worker_id);
    r.set_clock(clock);
    r.set_epoch(epoch);
    r.set_table(table);
    r.set_wait_ms(absl::ToInt64Milliseconds(options_.pull_wait));
    std::string* k = r.mutable_keys();
    k->resize(ks.count * sizeof(uint64_t));
    size_t at = 0;
    for (const auto& [first, last] : ks.spans) {
      std::memcpy(k->data() + at * sizeof(uint64_t), keys.data() + first,
                  (last - first) * sizeof(uint64_t));
      at += last - first;
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
  for (auto& p : todo) SendPull(p, 0);
}

void KVWorker::SendPull(std::shared_ptr<PullSlice> slice, int attempt) {
  std::shared_ptr<ServerClient> client;
  {
    absl::MutexLock l(&mu_);
    client = servers_.at(slice->server);
  }
  std::shared_ptr<const proto::PullRequest> req(slice, &slice->req);
  client->Pull(
      req, absl::Now() + options_.request_timeout,
      [this, slice, attempt](const absl::Status& s, proto::PullResponse* resp) {
        if (s.ok()) {
          const size_t n = slice->req.keys().size() / sizeof(uint64_t);
          const int dim = slice->dim;
          if (resp->vals().size() != n * dim * sizeof(float)) {
            PartDone(slice->ts,
                     absl::InternalError(absl::StrCat(
                         "pull from S[", slice->server, "]: ",
                         resp->vals().size(), " value bytes for ", n,
                         " keys")));
            return;
          }
          const float* v = reinterpret_cast<const float*>(resp->vals().data());
          float* out = slice->out->data();
          size_t at = 0;
          for (size_t i = 0; i < slice->spans_first.size(); ++i) {
            const size_t f = slice->spans_first[i], l = slice->spans_last[i];
            std::memcpy(out + f * dim, v + at * dim,
                        (l - f) * dim * sizeof(float));
            at += l - f;
          }
          PartDone(slice->ts, s);
          return;
        }
        if (IsStaleEpoch(s) && attempt < kMaxAttempts) {
          Later(Backoff(attempt), [this, slice] {
            RefreshView();
            std::vector<size_t> pos;
            for (size_t i = 0; i < slice->spans_first.size(); ++i) {
              for (size_t p = slice->spans_first[i]; p < slice->spans_last[i];
                   ++p) {
                pos.push_back(p);
              }
            }
            StartPull(slice->ts, slice->req.table(), slice->req.clock(),
                      ViewAs<uint64_t>(slice->req.keys()), pos, slice->out);
            PartDone(slice->ts, absl::OkStatus());
          });
          return;
        }
        // A consistency wait that expired on the server is final: its
        // message says which worker is behind.
        const bool server_wait_expired =
            ReasonOf(s) == proto::REASON_CONSISTENCY_TIMEOUT;
        if (Retriable(s) && !server_wait_expired && attempt < kMaxAttempts) {
          Later(Backoff(attempt),
                [this, slice, attempt] { SendPull(slice, attempt + 1); });
          return;
        }
        PartDone(slice->ts,
                 Annotate(s, absl::StrCat("pull from S[", slice->server, "]")));
      });
}

// ------------------------------------------------------------------ clock

int64_t KVWorker::Clock(int num_examples) {
  int64_t c, ts;
  bool send;
  {
    absl::MutexLock l(&mu_);
    c = clock_++;
    ClockState& cs = clocks_[c];
    cs.ended = true;
    cs.examples = num_examples;
    ts = NewOp(1);  // released by SendClock
    cs.ts = ts;
    send = cs.pending_pushes == 0;
  }
  if (send) SendClock(c);
  return ts;
}

void KVWorker::SendClock(int64_t clock) {
  std::vector<std::pair<int, std::shared_ptr<const proto::ClockRequest>>> reqs;
  std::vector<std::shared_ptr<ServerClient>> servers;
  int64_t ts;
  {
    absl::MutexLock l(&mu_);
    auto it = clocks_.find(clock);
    if (it == clocks_.end()) return;
    ClockState& cs = it->second;
    ts = cs.ts;
    servers = servers_;
    for (int s = 0; s < static_cast<int>(servers_.size()); ++s) {
      auto r = std::make_shared<proto::ClockRequest>();
      r->set_worker_id(options_.worker_id);
      r->set_clock(clock);
      r->set_epoch(view_.epoch());
      r->set_pushes(cs.pushes_per_server[s]);
      r->set_num_examples(cs.examples);
      const auto& in = inflight_[s];
      r->set_settled_seq(in.empty() ? next_seq_[s] : *in.begin() - 1);
      reqs.emplace_back(s, std::move(r));
    }
    ops_[ts].pending += static_cast<int>(reqs.size());
    clocks_.erase(it);
  }
  for (auto& entry : reqs) {
    // Not a structured binding: clang 14 cannot capture one in a lambda.
    const int s = entry.first;
    const auto& r = entry.second;
    auto send = std::make_shared<std::function<void(int)>>();
    std::weak_ptr<std::function<void(int)>> weak = send;
    std::shared_ptr<ServerClient> client = servers[s];
    *send = [this, client, r, ts, s, weak](int attempt) {
      auto self = weak.lock();
      client->Clock(
          r, absl::Now() + options_.request_timeout,
          [this, ts, s, attempt, self](const absl::Status& st,
                                       proto::ClockResponse*) {
            if (!st.ok() && Retriable(st) && attempt < kMaxAttempts) {
              Later(Backoff(attempt), [self, attempt] { (*self)(attempt + 1); });
              return;
            }
            PartDone(ts, st.ok() ? st
                                 : Annotate(st, absl::StrCat("clock to S[", s,
                                                             "]")));
          });
    };
    (*send)(0);
  }
  PartDone(ts, absl::OkStatus());
}

absl::Status KVWorker::Finish(absl::Time deadline) {
  int64_t final_clock;
  std::vector<std::shared_ptr<ServerClient>> servers;
  {
    absl::MutexLock l(&mu_);
    auto idle = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
      if (!clocks_.empty()) {
        for (const auto& [c, cs] : clocks_) {
          if (cs.pending_pushes > 0 || cs.ended) return false;
        }
      }
      for (const auto& [ts, op] : ops_) {
        if (op.pending > 0) return false;
      }
      return true;
    };
    if (!mu_.AwaitWithDeadline(absl::Condition(&idle), deadline)) {
      return absl::DeadlineExceededError(
          "finish: operations still outstanding at the deadline");
    }
    if (!sticky_.ok()) return sticky_;
    final_clock = clock_;
    servers = servers_;
  }
  for (size_t s = 0; s < servers.size(); ++s) {
    proto::FinishRequest req;
    req.set_worker_id(options_.worker_id);
    req.set_final_clock(final_clock);
    absl::Status st;
    for (int attempt = 0; attempt < kMaxAttempts; ++attempt) {
      st = servers[s]->Finish(req, std::min(deadline, absl::Now() +
                                                          absl::Seconds(30)));
      if (st.ok() || !Retriable(st) || absl::Now() > deadline) break;
      absl::SleepFor(Backoff(attempt));
    }
    if (!st.ok()) return Annotate(st, absl::StrCat("finish at S[", s, "]"));
  }
  return absl::OkStatus();
}

// ------------------------------------------------------------ view, retry

void KVWorker::RefreshView() {
  int64_t known;
  {
    absl::MutexLock l(&mu_);
    known = view_.epoch();
  }
  proto::GetViewRequest req;
  req.set_known_epoch(known);
  req.set_wait_ms(200);
  auto resp = scheduler_->GetView(req, absl::Now() + absl::Seconds(5));
  if (!resp.ok() || !resp->ready()) return;
  absl::MutexLock l(&mu_);
  if (resp->view().epoch() > view_.epoch()) {
    PS_LOG_INFO("routing view epoch {} -> {}", view_.epoch(),
                resp->view().epoch());
    InstallView(resp->view());
  }
}

void KVWorker::Later(absl::Duration delay, std::function<void()> fn) {
  absl::MutexLock l(&retry_mu_);
  retries_.emplace(absl::Now() + delay, std::move(fn));
}

void KVWorker::RetryLoop() {
  for (;;) {
    std::function<void()> fn;
    {
      absl::MutexLock l(&retry_mu_);
      auto ready = [this]() ABSL_SHARED_LOCKS_REQUIRED(retry_mu_) {
        return stopping_ ||
               (!retries_.empty() && retries_.begin()->first <= absl::Now());
      };
      absl::Time next = retries_.empty() ? absl::Now() + absl::Milliseconds(50)
                                         : retries_.begin()->first;
      retry_mu_.AwaitWithDeadline(absl::Condition(&ready),
                                  std::min(next, absl::Now() +
                                                     absl::Milliseconds(50)));
      if (stopping_) return;
      if (retries_.empty() || retries_.begin()->first > absl::Now()) continue;
      fn = std::move(retries_.begin()->second);
      retries_.erase(retries_.begin());
    }
    fn();
  }
}

}  // namespace ps
