// Unit tests of KVWorker: a FakeClientFactory whose servers hold every call
// until the test answers it, and a FakeClock whose timers (retry backoff)
// run only when the test advances it. Everything runs on the test thread,
// so each test decides exactly when and with what status each reply
// arrives.
#include "worker/kv_worker.h"

#include <algorithm>
#include <cstdint>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/time/clock.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "common/bytes.h"
#include "common/clock.h"
#include "common/routing.h"
#include "common/value_codec.h"
#include "gtest/gtest.h"
#include "proto/ps.pb.h"
#include "transport/errors.h"
#include "transport/fake_transport.h"

namespace ps {
namespace {

// One range's announcement in a ClockRequest (its packed arrays).
struct Ann {
  int r;
  int64_t seg;
  uint64_t settled;
  int range() const { return r; }
  int64_t segments() const { return seg; }
  uint64_t settled_seq() const { return settled; }
  bool operator==(const Ann& o) const {
    return r == o.r && seg == o.seg && settled == o.settled;
  }
};

std::vector<Ann> Anns(const proto::ClockRequest& c) {
  std::vector<Ann> out;
  for (int i = 0; i < c.range_ids_size(); ++i) {
    out.push_back(Ann{c.range_ids(i), c.range_segments(i),
                      c.range_settled_seqs(i)});
  }
  return out;
}

using absl::StatusCode;

constexpr int kVnodes = 8;
constexpr int kDim = 2;

std::string Address(int server) {
  return "inproc:server:" + std::to_string(server);
}

// A view with `servers` servers on a hash ring and one table of dim kDim.
proto::ClusterView MakeView(int servers, int64_t epoch = 1) {
  proto::ClusterView v;
  v.set_epoch(epoch);
  std::vector<int> ids;
  for (int i = 0; i < servers; ++i) ids.push_back(i);
  *v.mutable_routing() = BuildHashRing(ids, kVnodes, epoch);
  for (int i = 0; i < servers; ++i) {
    proto::NodeInfo* s = v.mutable_routing()->add_servers();
    s->set_id(i);
    s->set_role(proto::ROLE_SERVER);
    s->set_address(Address(i));
    s->set_state(proto::NODE_ALIVE);
  }
  proto::NodeInfo* w = v.add_workers();
  w->set_id(0);
  w->set_role(proto::ROLE_WORKER);
  w->set_state(proto::NODE_ALIVE);
  v.mutable_consistency()->set_mode(proto::MODE_BSP);
  proto::TableConfig* t = v.add_tables();
  t->set_id(0);
  t->set_name("weights");
  t->set_dim(kDim);
  return v;
}

// `v` at `epoch` with every range owned by server `owner` (a failover: the
// ranges keep their boundaries, only their owners change).
proto::ClusterView MovedTo(proto::ClusterView v, int owner, int64_t epoch) {
  v.set_epoch(epoch);
  v.mutable_routing()->set_epoch(epoch);
  for (int& s : *v.mutable_routing()->mutable_range_server()) s = owner;
  return v;
}

// n keys spread over the whole key space (the ring hashes ranges of it).
std::vector<uint64_t> Iota(uint64_t n) {
  std::vector<uint64_t> k(n);
  for (uint64_t i = 0; i < n; ++i) k[i] = i * (UINT64_MAX / n) + 1;
  return k;
}

// The value a fake server holds for component j of key k.
float KeyValue(uint64_t k, int j) {
  return static_cast<float>(k >> 54) + static_cast<float>(j) / 10.f;
}

// The keys of `keys` that `view` routes to `server`, in order.
std::vector<uint64_t> KeysOf(const proto::ClusterView& view, int server,
                             const std::vector<uint64_t>& keys) {
  absl::StatusOr<Routing> r = Routing::FromProto(view.routing());
  EXPECT_TRUE(r.ok());
  std::vector<uint64_t> out;
  for (const KeySlice& ks : r->Slice(keys)) {
    if (ks.server != server) continue;
    for (const auto& [first, last] : ks.spans) {
      for (size_t i = first; i < last; ++i) out.push_back(keys[i]);
    }
  }
  return out;
}

std::vector<uint64_t> ReqKeys(const std::string& bytes) {
  absl::Span<const uint64_t> s = ViewAs<uint64_t>(bytes);
  return std::vector<uint64_t>(s.begin(), s.end());
}

// A pull answer for `req`: value of key k, component j = k + j / 10.
proto::PullResponse Answer(const proto::PullRequest& req) {
  std::vector<float> v;
  for (uint64_t k : ReqKeys(req.keys())) {
    for (int j = 0; j < kDim; ++j) v.push_back(KeyValue(k, j));
  }
  proto::PullResponse resp;
  PackTo<float>(resp.mutable_vals(), v);
  return resp;
}

absl::Status Unavailable() { return absl::UnavailableError("connection lost"); }
absl::Status StaleEpoch() {
  return ErrorWithReason(StatusCode::kFailedPrecondition,
                         proto::REASON_STALE_EPOCH, "stale epoch");
}
absl::Status ViewBehind() {
  return ErrorWithReason(StatusCode::kUnavailable, proto::REASON_VIEW_BEHIND,
                         "server has not installed epoch 2 yet");
}
absl::Status ConsistencyTimeout() {
  return ErrorWithReason(StatusCode::kDeadlineExceeded,
                         proto::REASON_CONSISTENCY_TIMEOUT,
                         "waited 240 s for W[3]");
}

absl::Time Soon() { return absl::Now() + absl::Seconds(10); }

class KVWorkerTest : public ::testing::Test {
 protected:
  void Make(int servers, KVWorkerOptions o = KVWorkerOptions()) {
    view_ = MakeView(servers);
    factory_.scheduler()->set_view(view_);
    o.clock = &clock_;
    worker_ = std::make_unique<KVWorker>(o, view_, &factory_,
                                         factory_.scheduler());
  }
  FakeServerClient* S(int i) { return factory_.server(Address(i)); }

  // Pushes keys with one value per (key, dim).
  int64_t Push(const std::vector<uint64_t>& keys, int examples = 1) {
    std::vector<float> vals(keys.size() * kDim, 0.5f);
    return worker_->Push(0, keys, vals, examples);
  }

  // A pull of 64 keys across servers 0 and 1, both slices held.
  struct HeldPulls {
    int64_t ts;
    std::optional<HeldPull> at0, at1;
  };
  HeldPulls PullHeldAtBoth(std::vector<float>* out) {
    HeldPulls h;
    h.ts = worker_->Pull(0, Iota(64), out);
    h.at0 = S(0)->NextPull();
    h.at1 = S(1)->NextPull();
    return h;
  }

  // The scheduler answers GetView with `view` and records the suspects each
  // call names (NamedSuspects).
  void RecordSuspects(proto::ClusterView view) {
    factory_.scheduler()->set_get_view_handler(
        [this, view = std::move(view)](const proto::GetViewRequest& req)
            -> absl::StatusOr<proto::GetViewResponse> {
          absl::MutexLock l(&named_mu_);
          for (int s : req.suspect_servers()) named_.push_back(s);
          proto::GetViewResponse r;
          r.set_ready(true);
          *r.mutable_view() = view;
          return r;
        });
  }
  std::vector<int> NamedSuspects() {
    absl::MutexLock l(&named_mu_);
    return named_;
  }
  // S[0]'s next pull is S[1]'s part of `keys` at epoch 2 (regrouped after
  // the view MovedTo(view_, 0, 2)); answered.
  void AnswerRegroupedPull(const std::vector<uint64_t>& keys) {
    std::optional<HeldPull> again = S(0)->NextPull();
    ASSERT_TRUE(again.has_value());
    EXPECT_EQ(again->req->epoch(), 2);
    EXPECT_EQ(ReqKeys(again->req->keys()), KeysOf(view_, 1, keys));
    again->Reply(absl::OkStatus(), Answer(*again->req));
  }

  FakeClock clock_;
  FakeClientFactory factory_;
  proto::ClusterView view_;
  absl::Mutex named_mu_;
  std::vector<int> named_ ABSL_GUARDED_BY(named_mu_);
  std::unique_ptr<KVWorker> worker_;  // last: destroyed first
};

// --------------------------------------------------------------- pushes

TEST_F(KVWorkerTest, PushSegmentsByRangeWithContiguousSeqPerRange) {
  Make(2);
  const std::vector<uint64_t> keys = Iota(64);
  const int64_t a = Push(keys);
  const int64_t b = Push(keys);
  absl::StatusOr<Routing> routing = Routing::FromProto(view_.routing());
  ASSERT_TRUE(routing.ok());
  for (int s = 0; s < 2; ++s) {
    ASSERT_EQ(S(s)->held_pushes(), 2u) << "S[" << s << "]";
    for (uint64_t seq = 1; seq <= 2; ++seq) {
      std::optional<HeldPush> p = S(s)->NextPush();
      EXPECT_EQ(p->req->worker_id(), 0);
      EXPECT_EQ(p->req->epoch(), 1);
      EXPECT_EQ(p->req->clock(), 0);
      const std::vector<uint64_t> sent = ReqKeys(p->req->keys());
      EXPECT_EQ(sent, KeysOf(view_, s, keys));
      EXPECT_EQ(p->req->vals().size(), sent.size() * kDim * sizeof(float));
      // One segment per range run of the keys, each the range's next seq.
      size_t at = 0;
      for (const proto::PushSegment& seg : p->req->segments()) {
        EXPECT_EQ(seg.seq(), seq);
        EXPECT_EQ(routing->OwnerOfRange(seg.range()), s);
        ASSERT_GT(seg.num_keys(), 0u);
        for (size_t i = at; i < at + seg.num_keys(); ++i) {
          EXPECT_EQ(routing->RangeOf(sent[i]), seg.range());
        }
        at += seg.num_keys();
      }
      EXPECT_EQ(at, sent.size());
      p->Reply(absl::OkStatus());
    }
  }
  EXPECT_TRUE(worker_->Wait(a, Soon()).ok());
  EXPECT_TRUE(worker_->Wait(b, Soon()).ok());
}

// Issue 10: int8 values with a scale per segment, compressed with zstd
// where that helps; the bytes sent and what they were are counted.
TEST_F(KVWorkerTest, EncodedPushCarriesAScalePerSegmentAndIsCompressed) {
  KVWorkerOptions o;
  o.filters.encoding = proto::VALUES_INT8;
  o.filters.codec = proto::CODEC_ZSTD;
  Make(2, o);
  const std::vector<uint64_t> keys = Iota(512);
  std::vector<float> vals(keys.size() * kDim, 0.0f);
  for (size_t i = 0; i < vals.size(); i += 5) vals[i] = 0.01f * (i % 13);
  const int64_t ts = worker_->Push(0, keys, vals, 1);
  int64_t sent = 0;
  for (int s = 0; s < 2; ++s) {
    std::optional<HeldPush> p = S(s)->NextPush();
    ASSERT_TRUE(p.has_value());
    const proto::PushRequest& r = *p->req;
    EXPECT_EQ(r.value_encoding(), proto::VALUES_INT8);
    ASSERT_EQ(r.vals_codec(), proto::CODEC_ZSTD);
    const std::vector<uint64_t> sent_keys = ReqKeys(r.keys());
    ASSERT_EQ(r.vals_raw_bytes(), sent_keys.size() * kDim);
    EXPECT_LT(r.vals().size(), r.vals_raw_bytes());
    std::string raw;
    ASSERT_TRUE(
        Decompress(r.vals_codec(), r.vals(), r.vals_raw_bytes(), &raw).ok());
    // Each segment decodes with its own scale to within half a step.
    size_t at = 0;
    for (const proto::PushSegment& seg : r.segments()) {
      const size_t n = seg.num_keys() * kDim;
      std::vector<float> got(n);
      ASSERT_TRUE(DecodeValues(proto::VALUES_INT8, raw.data() + at, n,
                               seg.scale(), got.data())
                      .ok());
      for (size_t j = 0; j < n; ++j) {
        const size_t key = std::find(keys.begin(), keys.end(),
                                     sent_keys[(at + j) / kDim]) -
                           keys.begin();
        EXPECT_NEAR(got[j], vals[key * kDim + (at + j) % kDim],
                    seg.scale() / 2 + 1e-7);
      }
      at += n;
    }
    EXPECT_EQ(at, raw.size());
    sent += static_cast<int64_t>(r.keys().size() + r.vals().size());
    p->Reply(absl::OkStatus());
  }
  EXPECT_TRUE(worker_->Wait(ts, Soon()).ok());
  EXPECT_EQ(worker_->push_bytes(), sent);
  EXPECT_EQ(worker_->push_raw_bytes(),
            static_cast<int64_t>(keys.size() * (8 + kDim * 4)));
}

// A compressed push re-sliced after a failover goes to the new owner with
// the same segments (scales included), decompressed.
TEST_F(KVWorkerTest, CompressedPushIsReslicedDecompressed) {
  KVWorkerOptions o;
  o.filters.encoding = proto::VALUES_F16;
  o.filters.codec = proto::CODEC_LZ4;
  Make(2, o);
  const std::vector<uint64_t> keys = Iota(256);
  std::vector<float> vals(keys.size() * kDim, 0.0f);
  for (size_t i = 0; i < vals.size(); i += 7) vals[i] = 0.5f;
  const int64_t ts = worker_->Push(0, keys, vals, 1);
  factory_.scheduler()->set_view(MovedTo(view_, 0, 2));
  S(0)->NextPush()->Reply(absl::OkStatus());
  std::optional<HeldPush> stale = S(1)->NextPush();
  ASSERT_EQ(stale->req->vals_codec(), proto::CODEC_LZ4);
  stale->Reply(StaleEpoch());
  clock_.Advance(absl::Milliseconds(20));
  std::optional<HeldPush> p = S(0)->NextPush();
  ASSERT_TRUE(p.has_value());
  EXPECT_EQ(p->req->vals_codec(), proto::CODEC_NONE);
  EXPECT_EQ(p->req->value_encoding(), proto::VALUES_F16);
  std::string raw;
  ASSERT_TRUE(Decompress(proto::CODEC_LZ4, stale->req->vals(),
                         stale->req->vals_raw_bytes(), &raw)
                  .ok());
  EXPECT_EQ(p->req->vals(), raw);
  ASSERT_EQ(p->req->segments_size(), stale->req->segments_size());
  for (int i = 0; i < p->req->segments_size(); ++i) {
    EXPECT_EQ(p->req->segments(i).SerializeAsString(),
              stale->req->segments(i).SerializeAsString());
  }
  p->Reply(absl::OkStatus());
  EXPECT_TRUE(worker_->Wait(ts, Soon()).ok());
}

// Issue 9: a server that hangs (stopped, or cut off with its connections
// open) answers nothing and breaks no connection. Once a heartbeat reply
// says the scheduler has a newer view, the worker fetches it, and the calls
// still waiting on the server the view marks dead go to the ranges' new
// owner at once (same segments and seqs) instead of at their deadline; the
// hung server's answers that come later are dropped.
TEST_F(KVWorkerTest, CallsToAFailedOverServerGoToTheNewOwnerAtOnce) {
  Make(2);
  const std::vector<uint64_t> keys = Iota(64);
  const int64_t push = Push(keys);
  std::vector<float> out;
  const int64_t pull = worker_->Pull(0, keys, &out);
  S(0)->NextPush()->Reply(absl::OkStatus());
  std::optional<HeldPull> p0 = S(0)->NextPull();
  p0->Reply(absl::OkStatus(), Answer(*p0->req));
  std::optional<HeldPush> hung_push = S(1)->NextPush();
  std::optional<HeldPull> hung_pull = S(1)->NextPull();
  ASSERT_TRUE(hung_push.has_value() && hung_pull.has_value());

  // The same epoch changes nothing and asks the scheduler nothing.
  const int64_t calls = factory_.scheduler()->get_view_calls();
  worker_->OnSchedulerEpoch(1);
  EXPECT_EQ(factory_.scheduler()->get_view_calls(), calls);
  EXPECT_FALSE(worker_->Done(push));

  proto::ClusterView failed_over = MovedTo(view_, 0, 2);
  failed_over.mutable_routing()->mutable_servers(1)->set_state(
      proto::NODE_DEAD);
  factory_.scheduler()->set_view(failed_over);
  worker_->OnSchedulerEpoch(2);
  EXPECT_EQ(worker_->epoch(), 2);
  clock_.Advance(absl::Milliseconds(20));  // the retry's backoff
  std::optional<HeldPush> resent = S(0)->NextPush();
  ASSERT_TRUE(resent.has_value());
  ASSERT_EQ(resent->req->segments_size(), hung_push->req->segments_size());
  for (int i = 0; i < resent->req->segments_size(); ++i) {
    EXPECT_EQ(resent->req->segments(i).range(),
              hung_push->req->segments(i).range());
    EXPECT_EQ(resent->req->segments(i).seq(),
              hung_push->req->segments(i).seq());
  }
  EXPECT_EQ(ReqKeys(resent->req->keys()), ReqKeys(hung_push->req->keys()));
  resent->Reply(absl::OkStatus());
  std::optional<HeldPull> repulled = S(0)->NextPull();
  ASSERT_TRUE(repulled.has_value());
  repulled->Reply(absl::OkStatus(), Answer(*repulled->req));
  EXPECT_TRUE(worker_->Wait(push, Soon()).ok());
  ASSERT_TRUE(worker_->Wait(pull, Soon()).ok());
  ASSERT_EQ(out.size(), keys.size() * kDim);
  for (size_t i = 0; i < keys.size(); ++i) {
    EXPECT_EQ(out[i * kDim], KeyValue(keys[i], 0)) << i;
  }

  // The hung server wakes: its answers are dropped (a failure would make
  // the next operation fail with a sticky error; a value would land in
  // `out`).
  proto::PullResponse wrong;
  PackTo<float>(wrong.mutable_vals(),
                std::vector<float>(ReqKeys(hung_pull->req->keys()).size() *
                                       kDim,
                                   -7.f));
  hung_pull->Reply(absl::OkStatus(), wrong);
  hung_push->Reply(absl::InternalError("the zombie's late answer"));
  for (size_t i = 0; i < keys.size(); ++i) {
    EXPECT_EQ(out[i * kDim], KeyValue(keys[i], 0)) << i;
  }
  const int64_t next = Push(keys);
  EXPECT_EQ(S(1)->held_pushes(), 0u);
  S(0)->NextPush()->Reply(absl::OkStatus());
  EXPECT_TRUE(worker_->Wait(next, Soon()).ok());
}

// Issue 9: a worker the scheduler declared dead (hung past the heartbeat
// timeout, or cut off from a server the others reach) had its work handed
// to the others. Told so by a view that marks it dead, it fences itself:
// what is in flight fails at once with why, and so does every later
// operation, without a call sent (the servers refuse it anyway).
TEST_F(KVWorkerTest, WorkerDeclaredDeadFencesItself) {
  Make(2);
  const std::vector<uint64_t> keys = Iota(64);
  const int64_t push = Push(keys);
  std::optional<HeldPush> held0 = S(0)->NextPush();
  std::optional<HeldPush> held1 = S(1)->NextPush();
  ASSERT_TRUE(held0.has_value() && held1.has_value());
  proto::ClusterView dead = view_;
  dead.set_epoch(2);
  dead.mutable_routing()->set_epoch(2);
  dead.mutable_workers(0)->set_state(proto::NODE_DEAD);
  factory_.scheduler()->set_view(dead);
  worker_->OnSchedulerEpoch(2);
  absl::Status s = worker_->Wait(push, Soon());
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition) << s;
  EXPECT_NE(s.message().find("W[0] was declared dead at view epoch 2"),
            std::string::npos)
      << s;
  held0->Reply(absl::OkStatus());  // late answers change nothing
  held1->Reply(absl::OkStatus());
  const int64_t next = Push(keys);
  EXPECT_EQ(worker_->Wait(next, Soon()).code(),
            StatusCode::kFailedPrecondition);
  EXPECT_EQ(S(0)->held_pushes(), 0u);
  EXPECT_EQ(S(1)->held_pushes(), 0u);
}

// Issue 9: a push a server leaves unanswered for options.suspect_after makes
// the worker name that server to the scheduler (which probes it), at most
// once per suspect_after; a held pull does not (consistency may hold one).
TEST_F(KVWorkerTest, AnUnansweredPushMakesItsServerASuspect) {
  KVWorkerOptions o;
  o.suspect_after = absl::Seconds(2);
  Make(2, o);
  RecordSuspects(view_);
  const std::vector<uint64_t> keys = Iota(64);
  std::vector<float> out;
  auto [pull, pull0, pull1] = PullHeldAtBoth(&out);
  ASSERT_TRUE(pull0.has_value() && pull1.has_value());
  clock_.Advance(absl::Seconds(3));
  EXPECT_TRUE(worker_->SuspectSilentServers().empty());

  const int64_t push = Push(keys);
  S(0)->NextPush()->Reply(absl::OkStatus());
  std::optional<HeldPush> silent = S(1)->NextPush();
  ASSERT_TRUE(silent.has_value());
  clock_.Advance(absl::Seconds(1));
  EXPECT_TRUE(worker_->SuspectSilentServers().empty());
  clock_.Advance(absl::Seconds(1));
  EXPECT_EQ(worker_->SuspectSilentServers(), std::vector<int>{1});
  EXPECT_EQ(NamedSuspects(), std::vector<int>{1});
  EXPECT_TRUE(worker_->SuspectSilentServers().empty());  // named just now
  clock_.Advance(absl::Seconds(2));
  EXPECT_EQ(worker_->SuspectSilentServers(), std::vector<int>{1});
  EXPECT_EQ(NamedSuspects(), (std::vector<int>{1, 1}));

  // Answered, it is no suspect any more.
  silent->Reply(absl::OkStatus());
  pull0->Reply(absl::OkStatus(), Answer(*pull0->req));
  pull1->Reply(absl::OkStatus(), Answer(*pull1->req));
  EXPECT_TRUE(worker_->Wait(push, Soon()).ok());
  EXPECT_TRUE(worker_->Wait(pull, Soon()).ok());
  clock_.Advance(absl::Seconds(5));
  EXPECT_TRUE(worker_->SuspectSilentServers().empty());
}

// Issue 9: a worker does not run more than max_unacked_clocks clocks ahead
// of its oldest unacknowledged push. What is not acknowledged is resent
// after a failover, and a server refuses what is too far ahead of the
// clocks that worker completed there: a worker whose primary answered its
// pulls while its replication stalled ran 1000 clocks ahead in seconds,
// and its resends failed the job. The push that would go past the bound
// waits until the oldest one is answered.
TEST_F(KVWorkerTest, PushWaitsWhileTooManyClocksAreUnacknowledged) {
  KVWorkerOptions o;
  o.max_unacked_clocks = 3;
  Make(1, o);
  const std::vector<uint64_t> keys = Iota(8);
  const std::vector<float> vals(keys.size() * kDim, 0.5f);
  std::vector<int64_t> ts;
  for (int c = 0; c < 3; ++c) {
    ts.push_back(worker_->PushAndClock(0, keys, vals, 1));
  }
  std::optional<HeldPush> first = S(0)->NextPush();
  ASSERT_TRUE(first.has_value());
  absl::Notification pushed;
  std::thread fourth([&] {
    ts.push_back(worker_->PushAndClock(0, keys, vals, 1));
    pushed.Notify();
  });
  EXPECT_FALSE(pushed.WaitForNotificationWithTimeout(absl::Milliseconds(200)));
  first->Reply(absl::OkStatus());
  EXPECT_TRUE(pushed.WaitForNotificationWithTimeout(absl::Seconds(10)));
  fourth.join();
  while (std::optional<HeldPush> p = S(0)->NextPush()) {
    p->Reply(absl::OkStatus());
  }
  while (std::optional<HeldClock> c = S(0)->NextClock()) {
    c->Reply(absl::OkStatus());
  }
  for (int64_t t : ts) EXPECT_TRUE(worker_->Wait(t, Soon()).ok());
}

// Issue 9: a server that answers nothing for half of suspect_after is asked
// for its status; answering, it counts as heard from, so that one slow to
// answer (in BSP, waiting on a straggler's part of the clock) is never
// named a suspect. One that cannot be reached stays silent and is named.
TEST_F(KVWorkerTest, ASilentServerThatAnswersItsPingIsNoSuspect) {
  KVWorkerOptions o;
  o.suspect_after = absl::Seconds(2);
  Make(2, o);
  const std::vector<uint64_t> keys = Iota(64);
  const int64_t push = Push(keys);
  S(0)->NextPush()->Reply(absl::OkStatus());
  std::optional<HeldPush> held = S(1)->NextPush();
  ASSERT_TRUE(held.has_value());
  clock_.Advance(absl::Milliseconds(900));
  EXPECT_TRUE(worker_->PingSilentServers(absl::Seconds(1)).empty());
  EXPECT_EQ(S(1)->status_calls(), 0);  // not silent long enough yet
  for (int i = 0; i < 4; ++i) {
    clock_.Advance(absl::Milliseconds(500));
    worker_->PingSilentServers(absl::Seconds(1));
    EXPECT_TRUE(worker_->SuspectSilentServers().empty()) << i;
  }
  EXPECT_GE(S(1)->status_calls(), 2);
  EXPECT_EQ(S(0)->status_calls(), 0);  // it answered

  // Unreachable now: its pings fail, and it is named.
  S(1)->set_status_error(absl::UnavailableError("cut off"));
  std::vector<int> named;
  for (int i = 0; i < 6 && named.empty(); ++i) {
    clock_.Advance(absl::Milliseconds(500));
    EXPECT_TRUE(worker_->PingSilentServers(absl::Seconds(1)).empty());
    named = worker_->SuspectSilentServers();
  }
  EXPECT_EQ(named, std::vector<int>{1});
  held->Reply(absl::OkStatus());
  EXPECT_TRUE(worker_->Wait(push, Soon()).ok());
}

// Issue 9: a pull alone never makes a server silent (in BSP it waits on
// the clock), but one that waits on a server its status asks no longer
// reach is named: a pull's answer lost in a cut left its worker waiting,
// and in BSP the whole job with it, for as long as the cut lasted.
TEST_F(KVWorkerTest, APullWaitingOnAnUnreachableServerNamesIt) {
  KVWorkerOptions o;
  o.suspect_after = absl::Seconds(2);
  Make(2, o);
  std::vector<float> out;
  auto [pull, pull0, pull1] = PullHeldAtBoth(&out);
  ASSERT_TRUE(pull0.has_value() && pull1.has_value());
  pull0->Reply(absl::OkStatus(), Answer(*pull0->req));
  // Held, and reachable: asked, never named.
  for (int i = 0; i < 8; ++i) {
    clock_.Advance(absl::Milliseconds(500));
    worker_->PingSilentServers(absl::Seconds(1));
    EXPECT_TRUE(worker_->SuspectSilentServers().empty()) << i;
  }
  EXPECT_GE(S(1)->status_calls(), 2);
  EXPECT_EQ(S(0)->status_calls(), 0);  // nothing waits on it

  // Unreachable now: named once its silence reaches suspect_after.
  S(1)->set_status_error(absl::UnavailableError("cut off"));
  std::vector<int> named;
  int asks = 0;
  for (; asks < 8 && named.empty(); ++asks) {
    clock_.Advance(absl::Milliseconds(500));
    EXPECT_TRUE(worker_->PingSilentServers(absl::Seconds(1)).empty());
    named = worker_->SuspectSilentServers();
  }
  EXPECT_EQ(named, std::vector<int>{1});
  EXPECT_GE(asks, 3);  // not before 2 s of silence
  // Reached again: no suspect any more.
  S(1)->set_status_error(absl::OkStatus());
  clock_.Advance(absl::Seconds(2));
  EXPECT_EQ(worker_->PingSilentServers(absl::Seconds(1)), std::vector<int>{1});
  EXPECT_TRUE(worker_->SuspectSilentServers().empty());
  pull1->Reply(absl::OkStatus(), Answer(*pull1->req));
  EXPECT_TRUE(worker_->Wait(pull, Soon()).ok());
}

// The significance filter: only rows with an element above the threshold
// leave; a clock still rides on the push (or goes alone when none does).
TEST_F(KVWorkerTest, SignificanceFilterSendsOnlyLargeRows) {
  KVWorkerOptions o;
  o.filters.significant_threshold = 1.0;
  Make(1, o);
  const std::vector<uint64_t> keys = {1, 2, 3};
  const std::vector<float> vals = {0.1f, 0.2f, 3.0f, 0.0f, -0.5f, 0.5f};
  const int64_t ts = worker_->Push(0, keys, vals, 1);
  std::optional<HeldPush> p = S(0)->NextPush();
  ASSERT_TRUE(p.has_value());
  EXPECT_EQ(ReqKeys(p->req->keys()), std::vector<uint64_t>({2}));
  EXPECT_EQ(p->req->value_encoding(), proto::VALUES_F32);
  p->Reply(absl::OkStatus());
  EXPECT_TRUE(worker_->Wait(ts, Soon()).ok());
  // Nothing significant: no push at all, the clock goes alone.
  const std::vector<float> small(6, 0.01f);
  const int64_t c = worker_->PushAndClock(0, keys, small, 1);
  EXPECT_EQ(S(0)->held_pushes(), 0u);
  std::optional<HeldClock> clock = S(0)->NextClock();
  ASSERT_TRUE(clock.has_value());
  clock->Reply(absl::OkStatus());
  EXPECT_TRUE(worker_->Wait(c, Soon()).ok());
  EXPECT_EQ(worker_->push_raw_bytes(), 2 * 3 * (8 + kDim * 4));
  EXPECT_EQ(worker_->push_bytes(), 8 + kDim * 4);
}

// Issue 10: ZPush sends the caller's array without copying it, holds it
// until the push is done, and never reads it after.
TEST_F(KVWorkerTest, ZPushSendsTheCallersValuesAndLetsGoOfThemWhenDone) {
  Make(1);
  const std::vector<uint64_t> keys = Iota(4096);  // 32 KiB of values
  auto vals = std::make_shared<std::vector<float>>(keys.size() * kDim);
  for (size_t i = 0; i < vals->size(); ++i) (*vals)[i] = 0.25f * i;
  const std::string want(reinterpret_cast<const char*>(vals->data()),
                         vals->size() * sizeof(float));
  std::weak_ptr<std::vector<float>> alive = vals;
  const int64_t ts = worker_->ZPush(0, keys, *vals, vals, 1);
  vals.reset();
  EXPECT_EQ(S(0)->borrowed_pushes_received(), 1);
  std::optional<HeldPush> p = S(0)->NextPush();
  ASSERT_TRUE(p.has_value());
  EXPECT_EQ(ReqKeys(p->req->keys()), keys);
  EXPECT_EQ(p->req->vals(), want);
  EXPECT_FALSE(alive.expired()) << "held while the push is unanswered";
  p->Reply(absl::OkStatus());
  EXPECT_TRUE(worker_->Wait(ts, Soon()).ok());
  EXPECT_TRUE(alive.expired()) << "let go of once the push is done";
}

// NewPushBuffer where the transport has no shared memory (this fake):
// ordinary 64-byte-aligned memory, pushed by ZPush as any, and freed once
// the push is done and the caller lets go of it.
TEST_F(KVWorkerTest, PushBufferWithoutSharedMemoryIsOrdinaryMemory) {
  Make(1);
  const std::vector<uint64_t> keys = Iota(4096);
  KVWorker::PushBuffer b = worker_->NewPushBuffer(keys.size() * kDim);
  EXPECT_FALSE(b.shared);
  ASSERT_EQ(b.vals.size(), keys.size() * kDim);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(b.vals.data()) % 64, 0u);
  for (size_t i = 0; i < b.vals.size(); ++i) b.vals[i] = 0.5f * i;
  const std::string want(reinterpret_cast<const char*>(b.vals.data()),
                         b.vals.size() * sizeof(float));
  std::weak_ptr<const void> alive = b.owner;
  const int64_t ts = worker_->ZPush(0, keys, b.vals, b.owner, 1);
  b = KVWorker::PushBuffer{};
  EXPECT_EQ(S(0)->borrowed_pushes_received(), 1);
  std::optional<HeldPush> p = S(0)->NextPush();
  ASSERT_TRUE(p.has_value());
  EXPECT_EQ(p->req->vals(), want);
  EXPECT_FALSE(alive.expired());
  p->Reply(absl::OkStatus());
  EXPECT_TRUE(worker_->Wait(ts, Soon()).ok());
  EXPECT_TRUE(alive.expired());
  EXPECT_TRUE(worker_->NewPushBuffer(0).vals.empty());
}

// A server's share in many small pieces is copied, as Push does.
TEST_F(KVWorkerTest, ZPushOfSmallPiecesCopiesThem) {
  Make(2);
  const std::vector<uint64_t> keys = Iota(64);
  auto vals = std::make_shared<std::vector<float>>(keys.size() * kDim, 0.5f);
  const int64_t ts = worker_->ZPush(0, keys, *vals, vals, 1);
  for (int s = 0; s < 2; ++s) {
    EXPECT_EQ(S(s)->borrowed_pushes_received(), 0) << "S[" << s << "]";
    std::optional<HeldPush> p = S(s)->NextPush();
    ASSERT_TRUE(p.has_value());
    EXPECT_EQ(p->req->vals().size(),
              KeysOf(view_, s, keys).size() * kDim * sizeof(float));
    p->Reply(absl::OkStatus());
  }
  EXPECT_TRUE(worker_->Wait(ts, Soon()).ok());
}

// A borrowed push answered STALE_EPOCH is resliced from the caller's array:
// each key keeps its own values.
TEST_F(KVWorkerTest, ZPushStaleEpochReslicesTheBorrowedValues) {
  Make(2);
  const std::vector<uint64_t> keys = Iota(40000);  // pieces of ~20 KiB
  auto vals = std::make_shared<std::vector<float>>(keys.size() * kDim);
  for (size_t i = 0; i < vals->size(); ++i) (*vals)[i] = 0.5f * i;
  std::weak_ptr<std::vector<float>> alive = vals;
  const int64_t ts = worker_->ZPushAndClock(0, keys, *vals, vals, 1);
  EXPECT_EQ(S(0)->borrowed_pushes_received(), 1);
  EXPECT_EQ(S(1)->borrowed_pushes_received(), 1);
  factory_.scheduler()->set_view(MovedTo(view_, 0, 2));
  S(0)->NextPush()->Reply(absl::OkStatus());
  std::optional<HeldPush> stale = S(1)->NextPush();
  ASSERT_TRUE(stale.has_value());
  stale->Reply(StaleEpoch());
  clock_.Advance(absl::Milliseconds(20));
  std::optional<HeldPush> p = S(0)->NextPush();
  ASSERT_TRUE(p.has_value());
  EXPECT_EQ(p->req->epoch(), 2);
  const std::vector<uint64_t> moved = ReqKeys(p->req->keys());
  ASSERT_EQ(moved, KeysOf(view_, 1, keys));
  ASSERT_EQ(p->req->vals().size(), moved.size() * kDim * sizeof(float));
  absl::Span<const float> got = ViewAs<float>(p->req->vals());
  for (size_t i = 0; i < moved.size(); ++i) {
    const size_t at =
        std::lower_bound(keys.begin(), keys.end(), moved[i]) - keys.begin();
    for (int j = 0; j < kDim; ++j) {
      ASSERT_EQ(got[i * kDim + j], (*vals)[at * kDim + j]) << "key " << i;
    }
  }
  vals.reset();
  p->Reply(absl::OkStatus());
  // The clock's announcements, answered; then the op is done.
  for (int s = 0; s < 2; ++s) {
    while (std::optional<HeldClock> c = S(s)->NextClock()) {
      c->Reply(absl::OkStatus());
    }
  }
  EXPECT_TRUE(worker_->Wait(ts, Soon()).ok());
  EXPECT_TRUE(alive.expired());
}

TEST_F(KVWorkerTest, PushWithWrongValueCountIsInvalidArgument) {
  Make(1);
  std::vector<uint64_t> keys = {1, 2};
  std::vector<float> vals(3);
  const int64_t ts = worker_->Push(0, keys, vals, 1);
  EXPECT_EQ(worker_->Wait(ts, Soon()).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(S(0)->pushes_received(), 0);
}

TEST_F(KVWorkerTest, LostPushReplyIsResentWithTheSameSeq) {
  Make(1);
  const int64_t ts = Push({1, 2, 3});
  std::optional<HeldPush> first = S(0)->NextPush();
  first->Reply(Unavailable());  // maybe applied: the same seq must come back
  EXPECT_EQ(S(0)->held_pushes(), 0u);  // only after backoff
  clock_.Advance(absl::Milliseconds(20));
  std::optional<HeldPush> again = S(0)->NextPush();
  ASSERT_TRUE(again.has_value());
  EXPECT_EQ(again->req->SerializeAsString(), first->req->SerializeAsString());
  EXPECT_EQ(again->req->segments(0).seq(), 1u);
  again->Reply(absl::OkStatus());
  EXPECT_TRUE(worker_->Wait(ts, Soon()).ok());
}

TEST_F(KVWorkerTest, StaleEpochReslicesWithTheRefreshedView) {
  Make(2);
  const std::vector<uint64_t> keys = Iota(64);
  const int64_t ts = Push(keys);
  // The scheduler now has epoch 2 with every range on S[0].
  proto::ClusterView v2 = MovedTo(view_, 0, 2);
  factory_.scheduler()->set_view(v2);
  S(0)->NextPush()->Reply(absl::OkStatus());
  std::optional<HeldPush> stale = S(1)->NextPush();
  stale->Reply(StaleEpoch());
  clock_.Advance(absl::Milliseconds(20));
  EXPECT_EQ(factory_.scheduler()->get_view_calls(), 1);
  EXPECT_EQ(worker_->epoch(), 2);
  std::optional<HeldPush> p = S(0)->NextPush();
  ASSERT_TRUE(p.has_value());
  EXPECT_EQ(p->req->epoch(), 2);
  // The same segments, (range, seq) unchanged, now sent to their owner.
  ASSERT_EQ(p->req->segments_size(), stale->req->segments_size());
  for (int i = 0; i < p->req->segments_size(); ++i) {
    EXPECT_EQ(p->req->segments(i).SerializeAsString(),
              stale->req->segments(i).SerializeAsString());
  }
  EXPECT_EQ(ReqKeys(p->req->keys()), KeysOf(view_, 1, keys));
  EXPECT_EQ(p->req->vals(), stale->req->vals());
  EXPECT_EQ(S(1)->held_pushes(), 0u);
  p->Reply(absl::OkStatus());
  EXPECT_TRUE(worker_->Wait(ts, Soon()).ok());
}

TEST_F(KVWorkerTest, ViewBehindResendsTheSameRequestWithoutReslicing) {
  Make(1);
  const int64_t ts = Push({4, 5});
  std::optional<HeldPush> first = S(0)->NextPush();
  first->Reply(ViewBehind());
  clock_.Advance(absl::Milliseconds(20));
  std::optional<HeldPush> again = S(0)->NextPush();
  ASSERT_TRUE(again.has_value());
  // The same request (the fake copies it: the keys go borrowed).
  EXPECT_EQ(again->req->SerializeAsString(), first->req->SerializeAsString());
  EXPECT_EQ(factory_.scheduler()->get_view_calls(), 0);
  again->Reply(absl::OkStatus());
  EXPECT_TRUE(worker_->Wait(ts, Soon()).ok());
}

// Issue 8 item 4: "re-slicing restarts the attempt count" -- a server that
// never catches up made workers resend every 20 ms forever.
TEST_F(KVWorkerTest, ReslicingRestartsTheAttemptCount) {
  KVWorkerOptions o;
  o.max_attempts = 5;
  Make(1, o);
  const int64_t ts = Push({1, 2});
  int sent = 0;
  while (std::optional<HeldPush> p = S(0)->NextPush()) {
    ++sent;
    p->Reply(StaleEpoch());  // the scheduler never has anything newer
    clock_.Advance(absl::Seconds(2));
  }
  EXPECT_EQ(sent, 6);  // the first send and max_attempts re-slices
  absl::Status s = worker_->Wait(ts, Soon());
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(ReasonOf(s), proto::REASON_STALE_EPOCH);
  EXPECT_TRUE(absl::StrContains(s.message(), "S[0]")) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "gave up after 6 attempts")) << s;
  EXPECT_EQ(clock_.pending_timers(), 0u);
}

TEST_F(KVWorkerTest, RetryBudgetIsOneDeadlinePerOperation) {
  KVWorkerOptions o;
  o.max_attempts = 1000000;
  o.retry_timeout = absl::Seconds(5);
  Make(1, o);
  const absl::Time start = clock_.Now();
  const int64_t ts = Push({1});
  while (std::optional<HeldPush> p = S(0)->NextPush()) {
    p->Reply(ViewBehind());
    clock_.Advance(absl::Seconds(1));
  }
  absl::Status s = worker_->Wait(ts, Soon());
  EXPECT_EQ(s.code(), StatusCode::kUnavailable);
  EXPECT_EQ(ReasonOf(s), proto::REASON_VIEW_BEHIND);
  EXPECT_TRUE(absl::StrContains(s.message(), "push to S[0]: gave up")) << s;
  EXPECT_LE(clock_.Now() - start, absl::Seconds(6));
}

TEST_F(KVWorkerTest, InvalidArgumentIsNotRetried) {
  Make(1);
  const int64_t ts = Push({1});
  S(0)->NextPush()->Reply(absl::InvalidArgumentError("bad keys"));
  clock_.Advance(absl::Seconds(10));
  EXPECT_EQ(S(0)->pushes_received(), 1);
  absl::Status s = worker_->Wait(ts, Soon());
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(s.message(), "push to S[0]")) << s;
}

// --------------------------------------------------------------- pulls

TEST_F(KVWorkerTest, PullAssemblesSlicesInKeyOrder) {
  Make(2);
  const std::vector<uint64_t> keys = Iota(16);
  std::vector<float> out;
  const int64_t ts = worker_->Pull(0, keys, &out);
  for (int s = 0; s < 2; ++s) {
    std::optional<HeldPull> p = S(s)->NextPull();
    ASSERT_TRUE(p.has_value());
    EXPECT_EQ(ReqKeys(p->req->keys()), KeysOf(view_, s, keys));
    p->Reply(absl::OkStatus(), Answer(*p->req));
  }
  ASSERT_TRUE(worker_->Wait(ts, Soon()).ok());
  ASSERT_EQ(out.size(), keys.size() * kDim);
  for (size_t i = 0; i < keys.size(); ++i) {
    EXPECT_FLOAT_EQ(out[i * kDim], KeyValue(keys[i], 0));
    EXPECT_FLOAT_EQ(out[i * kDim + 1], KeyValue(keys[i], 1));
  }
}

// PullInPlace: each server's slice's values stay where the transport left
// them (this fake: the response's string, moved out), as pieces in key
// order that CopyTo assembles as Pull does; a slice resent after a stale
// epoch adds its pieces once.
TEST_F(KVWorkerTest, PullInPlaceLeavesEachSliceWhereItArrived) {
  Make(2);
  const std::vector<uint64_t> keys = Iota(16);
  KVWorker::PulledValues got;
  got.pieces.push_back({});  // cleared by the call
  const int64_t ts = worker_->PullInPlace(0, keys, &got);
  EXPECT_TRUE(got.pieces.empty());
  factory_.scheduler()->set_view(MovedTo(view_, 0, 2));
  // S[1] answers first: the pieces still end in key order.
  S(1)->NextPull()->Reply(StaleEpoch());
  std::optional<HeldPull> p0 = S(0)->NextPull();
  p0->Reply(absl::OkStatus(), Answer(*p0->req));
  clock_.Advance(absl::Milliseconds(20));
  ASSERT_NO_FATAL_FAILURE(AnswerRegroupedPull(keys));
  ASSERT_TRUE(worker_->Wait(ts, Soon()).ok());
  ASSERT_FALSE(got.pieces.empty());
  size_t covered = 0;
  for (size_t i = 0; i < got.pieces.size(); ++i) {
    const KVWorker::PulledValues::Piece& p = got.pieces[i];
    if (i > 0) EXPECT_LT(got.pieces[i - 1].first, p.first);
    ASSERT_EQ(p.vals.size() % kDim, 0u);
    EXPECT_NE(p.keep, nullptr);
    for (size_t k = 0; k < p.vals.size() / kDim; ++k) {
      EXPECT_FLOAT_EQ(p.vals[k * kDim + 1], KeyValue(keys[p.first + k], 1));
    }
    covered += p.vals.size() / kDim;
  }
  EXPECT_EQ(covered, keys.size());
  std::vector<float> out(keys.size() * kDim, -1.0f);
  got.CopyTo(out.data(), kDim);
  for (size_t i = 0; i < keys.size(); ++i) {
    EXPECT_FLOAT_EQ(out[i * kDim], KeyValue(keys[i], 0));
    EXPECT_FLOAT_EQ(out[i * kDim + 1], KeyValue(keys[i], 1));
  }
}

// A PullInPlace that Wait gave up on gets nothing from a later answer.
TEST_F(KVWorkerTest, PullInPlaceGivenUpIsNotWrittenLater) {
  Make(1);
  const std::vector<uint64_t> keys = Iota(8);
  KVWorker::PulledValues got;
  const int64_t ts = worker_->PullInPlace(0, keys, &got);
  std::optional<HeldPull> p = S(0)->NextPull();
  ASSERT_TRUE(p.has_value());
  EXPECT_EQ(worker_->Wait(ts, absl::Now() + absl::Milliseconds(1)).code(),
            StatusCode::kDeadlineExceeded);
  p->Reply(absl::OkStatus(), Answer(*p->req));
  EXPECT_TRUE(got.pieces.empty());
}

// SSP catch-up: the highest others_min_clock the servers' pull answers
// carried, whichever server and whatever order they came in.
TEST_F(KVWorkerTest, OthersMinClockIsTheHighestAPullAnswerCarried) {
  Make(2);
  EXPECT_EQ(worker_->others_min_clock(), -1);
  // A pull of `keys` answered by S[0] and S[1] with these clocks.
  auto pull = [&](const std::vector<uint64_t>& keys, int64_t clock0,
                  int64_t clock1) {
    std::vector<float> out;
    const int64_t ts = worker_->Pull(0, keys, &out);
    for (int s = 0; s < 2; ++s) {
      std::optional<HeldPull> p = S(s)->NextPull();
      ASSERT_TRUE(p.has_value());
      proto::PullResponse r = Answer(*p->req);
      r.set_others_min_clock(s == 0 ? clock0 : clock1);
      p->Reply(absl::OkStatus(), r);
    }
    ASSERT_TRUE(worker_->Wait(ts, Soon()).ok());
  };
  pull(Iota(16), 7, 4);
  EXPECT_EQ(worker_->others_min_clock(), 7);
  pull(Iota(8), 6, 9);  // another list: sent with its keys
  EXPECT_EQ(worker_->others_min_clock(), 9);
}

// The holds a caller waited through: a pull answered before Wait counts
// nothing however long it was held (a prefetch held while the trainer
// computed); one waited for counts the lesser of its hold and the wait.
TEST_F(KVWorkerTest, HeldWaitCountsOnlyTheHoldsACallerWaitedFor) {
  Make(1);
  // `held_us` on the answer of a pull of `keys`, given `delay` after Wait
  // began (or before it, when `before`).
  auto pull = [&](const std::vector<uint64_t>& keys, int64_t held_us,
                  absl::Duration delay, bool before) {
    std::vector<float> out;
    const int64_t ts = worker_->Pull(0, keys, &out);
    std::optional<HeldPull> p = S(0)->NextPull();
    ASSERT_TRUE(p.has_value());
    proto::PullResponse r = Answer(*p->req);
    r.set_held_us(held_us);
    if (before) {
      p->Reply(absl::OkStatus(), r);
      ASSERT_TRUE(worker_->Wait(ts, Soon()).ok());
      return;
    }
    std::thread answer([&] {
      absl::SleepFor(delay);
      p->Reply(absl::OkStatus(), r);
    });
    const absl::Status s = worker_->Wait(ts, Soon());
    answer.join();
    ASSERT_TRUE(s.ok()) << s;
  };
  pull(Iota(8), 1'000'000, absl::ZeroDuration(), /*before=*/true);
  EXPECT_EQ(worker_->held_wait_seconds(), 0.0);
  EXPECT_DOUBLE_EQ(worker_->consistency_wait_seconds(), 1.0);
  // Held 5 s by the answer's word, waited for about 30 ms: the wait.
  pull(Iota(16), 5'000'000, absl::Milliseconds(30), /*before=*/false);
  const double waited = worker_->held_wait_seconds();
  EXPECT_GE(waited, 0.029);
  EXPECT_LT(waited, 1.0);
  // Held 10 ms, waited for 50 ms or more: the hold.
  pull(Iota(24), 10'000, absl::Milliseconds(50), /*before=*/false);
  EXPECT_NEAR(worker_->held_wait_seconds() - waited, 0.010, 1e-9);
  EXPECT_DOUBLE_EQ(worker_->consistency_wait_seconds(), 6.01);
}

// Key caching: a key list goes to a server once under a name; once the
// server has answered that request, later requests name it instead.
TEST_F(KVWorkerTest, KeyListIsSentOnceThenNamed) {
  Make(1);
  const std::vector<uint64_t> keys = {3, 5, 8};
  std::vector<float> out;
  const int64_t pull = worker_->Pull(0, keys, &out);
  std::optional<HeldPull> first = S(0)->NextPull();
  ASSERT_TRUE(first.has_value());
  EXPECT_EQ(ReqKeys(first->req->keys()), keys);
  const uint64_t id = first->req->key_list();
  EXPECT_NE(id, 0u);
  // It tells the server how many of its lists are worth keeping.
  EXPECT_EQ(first->req->key_lists(),
            static_cast<uint32_t>(KVWorkerOptions().key_lists_per_server));
  // Sent again before the answer: still with its keys.
  const int64_t push = Push(keys);
  std::optional<HeldPush> p = S(0)->NextPush();
  EXPECT_EQ(ReqKeys(p->req->keys()), keys);
  EXPECT_EQ(p->req->key_list(), id);
  first->Reply(absl::OkStatus(), Answer(*first->req));
  p->Reply(absl::OkStatus());
  ASSERT_TRUE(worker_->Wait(pull, Soon()).ok());
  ASSERT_TRUE(worker_->Wait(push, Soon()).ok());
  // Kept: named, without keys.
  const int64_t push2 = Push(keys);
  std::optional<HeldPush> named = S(0)->NextPush();
  EXPECT_TRUE(named->req->keys().empty());
  EXPECT_EQ(named->req->key_list(), id);
  EXPECT_EQ(named->req->num_keys(), 3u);
  EXPECT_EQ(named->req->vals().size(), 3 * kDim * sizeof(float));
  named->Reply(absl::OkStatus());
  ASSERT_TRUE(worker_->Wait(push2, Soon()).ok());
  // Another list gets another name.
  const int64_t push3 = Push({3, 5});
  std::optional<HeldPush> other = S(0)->NextPush();
  EXPECT_EQ(ReqKeys(other->req->keys()), (std::vector<uint64_t>{3, 5}));
  EXPECT_NE(other->req->key_list(), id);
  other->Reply(absl::OkStatus());
  ASSERT_TRUE(worker_->Wait(push3, Soon()).ok());
}

// A server that lost the list (evicted, restarted, promoted) says so; the
// worker resends at once with the keys, then names the list again.
TEST_F(KVWorkerTest, KeysNotCachedIsResentWithTheKeys) {
  Make(1);
  const std::vector<uint64_t> keys = {3, 5, 8};
  const int64_t a = Push(keys);
  S(0)->NextPush()->Reply(absl::OkStatus());
  ASSERT_TRUE(worker_->Wait(a, Soon()).ok());
  std::vector<float> out;
  const int64_t pull = worker_->Pull(0, keys, &out);
  std::optional<HeldPull> named = S(0)->NextPull();
  ASSERT_TRUE(named->req->keys().empty());
  named->Reply(ErrorWithReason(StatusCode::kFailedPrecondition,
                               proto::REASON_KEYS_NOT_CACHED, "evicted"));
  std::optional<HeldPull> again = S(0)->NextPull();  // no backoff
  ASSERT_TRUE(again.has_value());
  EXPECT_EQ(ReqKeys(again->req->keys()), keys);
  again->Reply(absl::OkStatus(), Answer(*again->req));
  ASSERT_TRUE(worker_->Wait(pull, Soon()).ok());
  EXPECT_FLOAT_EQ(out[2 * kDim + 1], KeyValue(8, 1));
  const int64_t b = Push(keys);
  std::optional<HeldPush> p = S(0)->NextPush();
  EXPECT_TRUE(p->req->keys().empty()) << "kept again";
  p->Reply(absl::OkStatus());
  ASSERT_TRUE(worker_->Wait(b, Soon()).ok());
}

// A KeySet's pushes and pulls: each server's part cut once per routing and
// named once the server keeps it, like a repeated key list; cut again for a
// new routing (a pull first, then a push).
TEST_F(KVWorkerTest, KeySetIsCutPerRoutingAndNamedLikeAKeyList) {
  Make(2);
  const std::vector<uint64_t> keys = Iota(64);
  const KeySet set(keys);
  auto vals = std::make_shared<std::vector<float>>(keys.size() * kDim, 0.5f);
  uint64_t ids[2] = {0, 0};
  for (int round = 0; round < 2; ++round) {
    const int64_t ts = worker_->ZPush(0, set, *vals, vals, 1);
    for (int s = 0; s < 2; ++s) {
      std::optional<HeldPush> p = S(s)->NextPush();
      ASSERT_TRUE(p.has_value());
      if (round == 0) {
        EXPECT_EQ(ReqKeys(p->req->keys()), KeysOf(view_, s, keys));
        ids[s] = p->req->key_list();
        EXPECT_NE(ids[s], 0u);
      } else {
        EXPECT_TRUE(p->req->keys().empty()) << "named";
        EXPECT_EQ(p->req->key_list(), ids[s]);
        EXPECT_EQ(p->req->num_keys(), KeysOf(view_, s, keys).size());
      }
      p->Reply(absl::OkStatus());
    }
    ASSERT_TRUE(worker_->Wait(ts, Soon()).ok());
  }
  // A pull of the same set names the same lists; the values land in order.
  std::vector<float> out;
  const int64_t pull = worker_->Pull(0, set, &out);
  for (int s = 0; s < 2; ++s) {
    std::optional<HeldPull> p = S(s)->NextPull();
    ASSERT_TRUE(p.has_value());
    EXPECT_TRUE(p->req->keys().empty());
    EXPECT_EQ(p->req->key_list(), ids[s]);
    proto::PullRequest named = *p->req;
    const std::vector<uint64_t> mine = KeysOf(view_, s, keys);
    named.set_keys(mine.data(), mine.size() * sizeof(uint64_t));
    p->Reply(absl::OkStatus(), Answer(named));
  }
  ASSERT_TRUE(worker_->Wait(pull, Soon()).ok());
  ASSERT_EQ(out.size(), keys.size() * kDim);
  for (size_t i = 0; i < keys.size(); ++i) {
    ASSERT_FLOAT_EQ(out[i * kDim + 1], KeyValue(keys[i], 1)) << i;
  }
  // Every range moves to S[0] (epoch 2): the next push of the set is cut
  // for the new routing, all its keys to S[0] under a new name.
  factory_.scheduler()->set_view(MovedTo(view_, 0, 2));
  const int64_t stale = worker_->ZPush(0, set, *vals, vals, 1);
  S(0)->NextPush()->Reply(absl::OkStatus());
  S(1)->NextPush()->Reply(StaleEpoch());
  clock_.Advance(absl::Milliseconds(20));
  S(0)->NextPush()->Reply(absl::OkStatus());  // the resend
  ASSERT_TRUE(worker_->Wait(stale, Soon()).ok());
  ASSERT_EQ(worker_->epoch(), 2);
  // Its pull: one slice, all its keys to S[0] under a new name.
  const int64_t moved_pull = worker_->Pull(0, set, &out);
  std::optional<HeldPull> q = S(0)->NextPull();
  ASSERT_TRUE(q.has_value());
  EXPECT_EQ(ReqKeys(q->req->keys()), keys);
  EXPECT_NE(q->req->key_list(), ids[0]);
  EXPECT_EQ(S(1)->held_pulls(), 0u);
  q->Reply(absl::OkStatus(), Answer(*q->req));
  ASSERT_TRUE(worker_->Wait(moved_pull, Soon()).ok());
  EXPECT_FLOAT_EQ(out[63 * kDim + 1], KeyValue(keys[63], 1));
  // Then its push names that list there.
  const int64_t moved = worker_->ZPush(0, set, *vals, vals, 1);
  std::optional<HeldPush> p = S(0)->NextPush();
  ASSERT_TRUE(p.has_value());
  EXPECT_TRUE(p->req->keys().empty());
  EXPECT_EQ(p->req->key_list(), q->req->key_list());
  EXPECT_EQ(p->req->num_keys(), keys.size());
  EXPECT_EQ(S(1)->held_pushes(), 0u);
  p->Reply(absl::OkStatus());
  ASSERT_TRUE(worker_->Wait(moved, Soon()).ok());
}

TEST_F(KVWorkerTest, KeyCachingOffSendsKeysAlways) {
  KVWorkerOptions o;
  o.key_lists_per_server = 0;
  Make(1, o);
  for (int i = 0; i < 2; ++i) {
    const int64_t ts = Push({3, 5});
    std::optional<HeldPush> p = S(0)->NextPush();
    EXPECT_EQ(ReqKeys(p->req->keys()), (std::vector<uint64_t>{3, 5}));
    EXPECT_EQ(p->req->key_list(), 0u);
    EXPECT_EQ(p->req->key_lists(), 0u);
    p->Reply(absl::OkStatus());
    ASSERT_TRUE(worker_->Wait(ts, Soon()).ok());
  }
}

TEST_F(KVWorkerTest, PullWithWrongValueCountIsInternal) {
  Make(1);
  std::vector<float> out;
  const int64_t ts = worker_->Pull(0, {1, 2}, &out);
  S(0)->NextPull()->Reply(absl::OkStatus(), proto::PullResponse());
  EXPECT_EQ(worker_->Wait(ts, Soon()).code(), StatusCode::kInternal);
}

TEST_F(KVWorkerTest, ConsistencyTimeoutIsFinal) {
  Make(1);
  std::vector<float> out;
  const int64_t ts = worker_->Pull(0, {1}, &out);
  S(0)->NextPull()->Reply(ConsistencyTimeout());
  clock_.Advance(absl::Seconds(10));
  EXPECT_EQ(S(0)->pulls_received(), 1);
  absl::Status s = worker_->Wait(ts, Soon());
  EXPECT_EQ(s.code(), StatusCode::kDeadlineExceeded);
  EXPECT_EQ(ReasonOf(s), proto::REASON_CONSISTENCY_TIMEOUT);
  EXPECT_TRUE(absl::StrContains(s.message(), "pull from S[0]")) << s;
}

TEST_F(KVWorkerTest, PullStaleEpochReslicesIntoTheSameOutput) {
  Make(2);
  const std::vector<uint64_t> keys = Iota(16);
  std::vector<float> out;
  const int64_t ts = worker_->Pull(0, keys, &out);
  factory_.scheduler()->set_view(MovedTo(view_, 0, 2));
  std::optional<HeldPull> p0 = S(0)->NextPull();
  p0->Reply(absl::OkStatus(), Answer(*p0->req));
  S(1)->NextPull()->Reply(StaleEpoch());
  clock_.Advance(absl::Milliseconds(20));
  ASSERT_NO_FATAL_FAILURE(AnswerRegroupedPull(keys));
  ASSERT_TRUE(worker_->Wait(ts, Soon()).ok());
  for (size_t i = 0; i < keys.size(); ++i) {
    EXPECT_FLOAT_EQ(out[i * kDim], KeyValue(keys[i], 0));
  }
}

// A drained server leaving the job cancels the calls it still has (chaos
// mix seed 711: a worker paused through the drain exited on its pull's
// CANCELLED): the pull and the push are regrouped by the newest view, as
// for a stale epoch, and the server is not named a suspect.
TEST_F(KVWorkerTest, CancelledByALeavingServerRegroupsByTheNewView) {
  Make(2);
  RecordSuspects(MovedTo(view_, 0, 2));
  const std::vector<uint64_t> keys = Iota(16);
  std::vector<float> out;
  const int64_t pull = worker_->Pull(0, keys, &out);
  std::vector<float> vals(keys.size() * kDim, 0.25f);
  const int64_t push = worker_->Push(0, keys, vals, 1);
  std::optional<HeldPull> p0 = S(0)->NextPull();
  ASSERT_TRUE(p0.has_value());
  p0->Reply(absl::OkStatus(), Answer(*p0->req));
  S(0)->NextPush()->Reply(absl::OkStatus());
  S(1)->NextPull()->Reply(absl::CancelledError(""));
  S(1)->NextPush()->Reply(absl::CancelledError(""));
  clock_.Advance(absl::Milliseconds(20));
  ASSERT_NO_FATAL_FAILURE(AnswerRegroupedPull(keys));
  std::optional<HeldPush> pushed = S(0)->NextPush();
  ASSERT_TRUE(pushed.has_value());
  EXPECT_EQ(pushed->req->epoch(), 2);
  EXPECT_EQ(ReqKeys(pushed->req->keys()), KeysOf(view_, 1, keys));
  pushed->Reply(absl::OkStatus());
  ASSERT_TRUE(worker_->Wait(pull, Soon()).ok());
  ASSERT_TRUE(worker_->Wait(push, Soon()).ok());
  for (size_t i = 0; i < keys.size(); ++i) {
    EXPECT_FLOAT_EQ(out[i * kDim], KeyValue(keys[i], 0));
  }
  EXPECT_TRUE(NamedSuspects().empty());
}

// ------------------------------------------------- sticky error, bug 1

TEST_F(KVWorkerTest, StickyErrorFailsLaterWaitsAndFinish) {
  Make(1);
  const int64_t bad = Push({1});
  S(0)->NextPush()->Reply(absl::InvalidArgumentError("bad keys"));
  const int64_t later = Push({2});
  S(0)->NextPush()->Reply(absl::OkStatus());
  EXPECT_EQ(worker_->Wait(later, Soon()).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(worker_->Wait(bad, Soon()).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(worker_->Finish(Soon()).code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(S(0)->finish_requests().empty());
}

TEST_F(KVWorkerTest, NoRetryAfterStickyError) {
  Make(1);
  const int64_t bad = Push({1});
  const int64_t other = Push({2});
  S(0)->NextPush()->Reply(absl::InvalidArgumentError("bad keys"));
  S(0)->NextPush()->Reply(Unavailable());
  clock_.Advance(absl::Seconds(10));
  EXPECT_EQ(S(0)->pushes_received(), 2);  // the job failed: no resend
  EXPECT_EQ(worker_->Wait(other, Soon()).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(worker_->Wait(bad, Soon()).code(), StatusCode::kInvalidArgument);
}

TEST_F(KVWorkerTest, WaitForUnknownTimestampIsInvalidArgument) {
  Make(1);
  EXPECT_EQ(worker_->Wait(7, Soon()).code(), StatusCode::kInvalidArgument);
}

TEST_F(KVWorkerTest, WaitPastItsDeadlineIsDeadlineExceeded) {
  Make(1);
  std::vector<float> out;
  const int64_t ts = worker_->Pull(0, {1}, &out);
  EXPECT_EQ(worker_->Wait(ts, absl::Now()).code(),
            StatusCode::kDeadlineExceeded);
}

// Issue 8 bug 1: "Workers segfault at the end of a job with pulls in
// flight" -- Wait returned on an earlier failure and the caller freed the
// output while the pull's reply still copied into it.
TEST_F(KVWorkerTest, WorkersSegfaultAtEndOfJobWithPullsInFlight) {
  Make(2);
  const std::vector<uint64_t> keys = Iota(16);
  const int64_t bad = Push({1});
  auto out = std::make_unique<std::vector<float>>();
  const int64_t pull = worker_->Pull(0, keys, out.get());
  S(0)->NextPush()->Reply(absl::InvalidArgumentError("bad keys"));
  ASSERT_EQ(worker_->Wait(pull, Soon()).code(), StatusCode::kInvalidArgument);
  out.reset();  // really freed: ASan reports any later write
  for (int s = 0; s < 2; ++s) {
    while (std::optional<HeldPull> p = S(s)->NextPull()) {
      p->Reply(absl::OkStatus(), Answer(*p->req));
    }
  }
  EXPECT_EQ(worker_->Wait(bad, Soon()).code(), StatusCode::kInvalidArgument);
}

TEST_F(KVWorkerTest, WorkersSegfaultAtEndOfJobWithPullsInFlight_NoWrite) {
  Make(1);
  const int64_t bad = Push({1});
  std::vector<float> out;
  const int64_t pull = worker_->Pull(0, {1, 2}, &out);
  S(0)->NextPush()->Reply(absl::InvalidArgumentError("bad keys"));
  ASSERT_EQ(worker_->Wait(pull, Soon()).code(), StatusCode::kInvalidArgument);
  out.assign(out.size(), -1.0f);  // the caller reuses its buffer
  std::optional<HeldPull> p = S(0)->NextPull();
  p->Reply(absl::OkStatus(), Answer(*p->req));
  for (float v : out) EXPECT_EQ(v, -1.0f);
  (void)worker_->Wait(bad, Soon());
}

TEST_F(KVWorkerTest, NoWriteAfterWaitTimedOut) {
  Make(1);
  std::vector<float> out;
  const int64_t pull = worker_->Pull(0, {1, 2}, &out);
  ASSERT_EQ(worker_->Wait(pull, absl::Now()).code(),
            StatusCode::kDeadlineExceeded);
  out.assign(out.size(), -1.0f);
  std::optional<HeldPull> p = S(0)->NextPull();
  p->Reply(absl::OkStatus(), Answer(*p->req));
  for (float v : out) EXPECT_EQ(v, -1.0f);
}

TEST_F(KVWorkerTest, RepliesAfterDestructionAreDropped) {
  Make(1);
  std::vector<float> out;
  worker_->Pull(0, {1, 2}, &out);
  const int64_t push = Push({3});
  S(0)->NextPush()->Reply(Unavailable());  // a retry is queued
  EXPECT_EQ(clock_.pending_timers(), 1u);
  std::optional<HeldPull> p = S(0)->NextPull();
  (void)push;
  worker_.reset();
  EXPECT_EQ(clock_.pending_timers(), 0u);  // the queued retry is cancelled
  out.assign(out.size(), -1.0f);
  p->Reply(absl::OkStatus(), Answer(*p->req));  // must not touch the worker
  for (float v : out) EXPECT_EQ(v, -1.0f);
  clock_.Advance(absl::Seconds(10));
  EXPECT_EQ(S(0)->pushes_received(), 1);
}

// ------------------------------------------------------- clock, finish

// The announcement goes out at once, before the pushes are answered (it
// counts the segments each range must see); the clock's timestamp
// completes only when the pushes were acknowledged too.
TEST_F(KVWorkerTest, ClockTellsEveryServerAtOnceAndCompletesAfterItsPushes) {
  Make(2);
  const std::vector<uint64_t> keys = Iota(64);
  const int64_t push = Push(keys, 8);
  const int64_t clk = worker_->Clock(8);
  EXPECT_EQ(worker_->clock(), 1);
  absl::StatusOr<Routing> routing = Routing::FromProto(view_.routing());
  ASSERT_TRUE(routing.ok());
  std::set<int> touched;
  for (uint64_t k : keys) touched.insert(routing->RangeOf(k));
  for (int s = 0; s < 2; ++s) {
    std::optional<HeldClock> c = S(s)->NextClock();  // pushes unanswered
    ASSERT_TRUE(c.has_value()) << "S[" << s << "]";
    EXPECT_EQ(c->req->clock(), 0);
    EXPECT_EQ(c->req->num_examples(), 8);
    // Every range the server owns, with the segments the clock sent there;
    // nothing is settled while seq 1 of a touched range is unanswered.
    std::vector<int> ranges;
    for (const Ann& a : Anns(*c->req)) {
      ranges.push_back(a.range());
      const bool hit = touched.count(a.range()) > 0;
      EXPECT_EQ(a.segments(), hit ? 1 : 0) << "range " << a.range();
      EXPECT_EQ(a.settled_seq(), 0u) << "range " << a.range();
    }
    EXPECT_EQ(ranges, routing->RangesOf(s));
    c->Reply(absl::OkStatus());
  }
  // Announced, but S[0]'s push is unanswered: the clock is not done.
  S(1)->NextPush()->Reply(absl::OkStatus());
  EXPECT_EQ(worker_->Wait(clk, absl::Now() + absl::Milliseconds(50)).code(),
            StatusCode::kDeadlineExceeded);
  S(0)->NextPush()->Reply(absl::OkStatus());
  EXPECT_TRUE(worker_->Wait(push, Soon()).ok());
  // The next clock: pushes answered before the announcement this time.
  const int64_t push2 = Push(keys, 8);
  const int64_t clk2 = worker_->Clock(8);
  S(0)->NextPush()->Reply(absl::OkStatus());
  S(1)->NextPush()->Reply(absl::OkStatus());
  for (int s = 0; s < 2; ++s) {
    std::optional<HeldClock> c = S(s)->NextClock();
    ASSERT_TRUE(c.has_value()) << "S[" << s << "]";
    EXPECT_EQ(c->req->clock(), 1);
    for (const Ann& a : Anns(*c->req)) {
      const bool hit = touched.count(a.range()) > 0;
      EXPECT_EQ(a.settled_seq(), hit ? 1u : 0u) << "range " << a.range();
    }
    c->Reply(absl::OkStatus());
  }
  EXPECT_TRUE(worker_->Wait(push2, Soon()).ok());
  EXPECT_TRUE(worker_->Wait(clk2, Soon()).ok());
}

// PushAndClock: a server the push reaches gets its announcement inside the
// push request; the others get a Clock request of their own.
TEST_F(KVWorkerTest, PushAndClockRidesOnThePushRequests) {
  Make(2);
  absl::StatusOr<Routing> routing = Routing::FromProto(view_.routing());
  ASSERT_TRUE(routing.ok());
  const std::vector<uint64_t> keys = KeysOf(view_, 0, Iota(64));
  std::set<int> touched;
  for (uint64_t k : keys) touched.insert(routing->RangeOf(k));
  std::vector<float> vals(keys.size() * kDim, 0.5f);
  const int64_t clk = worker_->PushAndClock(0, keys, vals, 8);
  EXPECT_EQ(worker_->clock(), 1);
  EXPECT_EQ(S(0)->held_clocks(), 0u) << "S[0]'s clock rides on its push";
  EXPECT_EQ(S(1)->held_pushes(), 0u);
  std::optional<HeldPush> p = S(0)->NextPush();
  ASSERT_TRUE(p.has_value());
  ASSERT_TRUE(p->req->has_end_clock());
  const proto::ClockRequest& c = p->req->end_clock();
  EXPECT_EQ(c.worker_id(), 0);
  EXPECT_EQ(c.clock(), 0);
  EXPECT_EQ(c.epoch(), 1);
  EXPECT_EQ(c.num_examples(), 8);
  std::vector<int> ranges;
  for (const Ann& a : Anns(c)) {
    ranges.push_back(a.range());
    EXPECT_EQ(a.segments(), touched.count(a.range()) > 0 ? 1 : 0);
    EXPECT_EQ(a.settled_seq(), 0u);
  }
  EXPECT_EQ(ranges, routing->RangesOf(0));
  std::optional<HeldClock> alone = S(1)->NextClock();
  ASSERT_TRUE(alone.has_value());
  EXPECT_EQ(alone->req->clock(), 0);
  ranges.clear();
  for (const Ann& a : Anns(*alone->req)) {
    ranges.push_back(a.range());
    EXPECT_EQ(a.segments(), 0);
  }
  EXPECT_EQ(ranges, routing->RangesOf(1));
  alone->Reply(absl::OkStatus());
  EXPECT_EQ(worker_->Wait(clk, absl::Now() + absl::Milliseconds(50)).code(),
            StatusCode::kDeadlineExceeded)
      << "the push carrying S[0]'s share is unanswered";
  p->Reply(absl::OkStatus());
  EXPECT_TRUE(worker_->Wait(clk, Soon()).ok());
}

// A push carrying its clock that meets a view change: the segments and the
// announcement both go to the ranges' new owner.
TEST_F(KVWorkerTest, RidingClockFollowsItsRangesToTheirNewOwner) {
  Make(2);
  const std::vector<uint64_t> keys = Iota(64);
  std::vector<float> vals(keys.size() * kDim, 0.5f);
  const int64_t clk = worker_->PushAndClock(0, keys, vals, 8);
  S(0)->NextPush()->Reply(absl::OkStatus());
  std::optional<HeldPush> stale = S(1)->NextPush();
  ASSERT_TRUE(stale.has_value());
  ASSERT_TRUE(stale->req->has_end_clock());
  factory_.scheduler()->set_view(MovedTo(view_, 0, 2));
  stale->Reply(StaleEpoch());
  clock_.Advance(absl::Milliseconds(20));
  std::optional<HeldPush> moved = S(0)->NextPush();
  ASSERT_TRUE(moved.has_value());
  EXPECT_FALSE(moved->req->has_end_clock());
  EXPECT_EQ(moved->req->epoch(), 2);
  std::optional<HeldClock> c = S(0)->NextClock();
  ASSERT_TRUE(c.has_value());
  EXPECT_EQ(c->req->epoch(), 2);
  const proto::ClockRequest& was = stale->req->end_clock();
  EXPECT_FALSE(Anns(was).empty());
  EXPECT_EQ(Anns(*c->req), Anns(was));
  c->Reply(absl::OkStatus());
  EXPECT_EQ(worker_->Wait(clk, absl::Now() + absl::Milliseconds(50)).code(),
            StatusCode::kDeadlineExceeded);
  moved->Reply(absl::OkStatus());
  EXPECT_TRUE(worker_->Wait(clk, Soon()).ok());
}

// A clock whose ranges moved (a failover) is announced to the new owner
// with the same per-range counts.
TEST_F(KVWorkerTest, ClockStaleEpochAnnouncesTheRangesToTheirNewOwner) {
  Make(2);
  const int64_t push = Push(Iota(64), 8);
  const int64_t clk = worker_->Clock(8);
  S(0)->NextPush()->Reply(absl::OkStatus());
  S(1)->NextPush()->Reply(absl::OkStatus());
  S(0)->NextClock()->Reply(absl::OkStatus());
  std::optional<HeldClock> stale = S(1)->NextClock();
  ASSERT_TRUE(stale.has_value());
  factory_.scheduler()->set_view(MovedTo(view_, 0, 2));
  stale->Reply(StaleEpoch());
  clock_.Advance(absl::Milliseconds(20));
  std::optional<HeldClock> moved = S(0)->NextClock();
  ASSERT_TRUE(moved.has_value());
  EXPECT_EQ(moved->req->epoch(), 2);
  EXPECT_EQ(moved->req->clock(), 0);
  EXPECT_FALSE(Anns(*stale->req).empty());
  EXPECT_EQ(Anns(*moved->req), Anns(*stale->req));
  moved->Reply(absl::OkStatus());
  EXPECT_TRUE(worker_->Wait(push, Soon()).ok());
  EXPECT_TRUE(worker_->Wait(clk, Soon()).ok());
}

// Ranges keep their boundaries for the whole job: a view that changes them
// is refused, and the worker fails rather than mis-count its segments.
TEST_F(KVWorkerTest, ViewThatChangesTheRangesIsAnError) {
  Make(2);
  const int64_t ts = Push(Iota(64));
  factory_.scheduler()->set_view(MakeView(1, 2));  // a new ring
  S(0)->NextPush()->Reply(absl::OkStatus());
  S(1)->NextPush()->Reply(StaleEpoch());
  clock_.Advance(absl::Milliseconds(20));
  EXPECT_EQ(worker_->epoch(), 1);
  EXPECT_EQ(worker_->Wait(ts, Soon()).code(), StatusCode::kInternal);
}

TEST_F(KVWorkerTest, ClockSettledSeqStopsBelowTheOldestUnansweredPush) {
  Make(1);
  Push({1});                        // seq 1, answered after the clocks
  const int64_t p2 = Push({2});     // seq 2
  S(0)->NextPush()->Reply(Unavailable());
  S(0)->NextPush()->Reply(absl::OkStatus());
  const int64_t c0 = worker_->Clock(1);  // announced with seq 1 unanswered
  const int64_t p3 = Push({3});     // seq 3, clock 1
  S(0)->NextPush()->Reply(absl::OkStatus());  // seq 3
  const int64_t c1 = worker_->Clock(1);
  // Keys 1, 2, 3 are in one range: seqs 1, 2, 3 of that range.
  absl::StatusOr<Routing> routing = Routing::FromProto(view_.routing());
  ASSERT_TRUE(routing.ok());
  const int range = routing->RangeOf(1);
  ASSERT_EQ(routing->RangeOf(3), range);
  auto entry = [&](const proto::ClockRequest& r) {
    for (const Ann& a : Anns(r)) {
      if (a.range() == range) return a;
    }
    ADD_FAILURE() << "no entry for range " << range;
    return Ann{};
  };
  for (int clock = 0; clock < 2; ++clock) {
    std::optional<HeldClock> c = S(0)->NextClock();
    ASSERT_TRUE(c.has_value());
    EXPECT_EQ(c->req->clock(), clock);
    EXPECT_EQ(entry(*c->req).segments(), clock == 0 ? 2 : 1);
    EXPECT_EQ(entry(*c->req).settled_seq(), 0u);  // seq 1 still unanswered
    c->Reply(absl::OkStatus());
  }
  clock_.Advance(absl::Milliseconds(20));  // seq 1 resent
  S(0)->NextPush()->Reply(absl::OkStatus());
  // A later clock settles everything answered.
  const int64_t c2 = worker_->Clock(0);
  std::optional<HeldClock> c = S(0)->NextClock();
  ASSERT_TRUE(c.has_value());
  EXPECT_EQ(c->req->clock(), 2);
  EXPECT_EQ(entry(*c->req).segments(), 0);
  EXPECT_EQ(entry(*c->req).settled_seq(), 3u);
  c->Reply(absl::OkStatus());
  EXPECT_TRUE(worker_->Wait(p2, Soon()).ok());
  EXPECT_TRUE(worker_->Wait(p3, Soon()).ok());
  EXPECT_TRUE(worker_->Wait(c0, Soon()).ok());
  EXPECT_TRUE(worker_->Wait(c1, Soon()).ok());
  EXPECT_TRUE(worker_->Wait(c2, Soon()).ok());
}

TEST_F(KVWorkerTest, LostClockIsResent) {
  Make(1);
  const int64_t clk = worker_->Clock(0);
  S(0)->NextClock()->Reply(Unavailable());
  clock_.Advance(absl::Milliseconds(20));
  std::optional<HeldClock> c = S(0)->NextClock();
  ASSERT_TRUE(c.has_value());
  c->Reply(absl::OkStatus());
  EXPECT_TRUE(worker_->Wait(clk, Soon()).ok());
}

TEST_F(KVWorkerTest, FinishTellsEveryServerTheFinalClock) {
  Make(2);
  worker_->Clock(0);
  worker_->Clock(0);
  for (int round = 0; round < 2; ++round) {
    for (int s = 0; s < 2; ++s) S(s)->NextClock()->Reply(absl::OkStatus());
  }
  ASSERT_TRUE(worker_->Finish(Soon()).ok());
  for (int s = 0; s < 2; ++s) {
    std::vector<proto::FinishRequest> f = S(s)->finish_requests();
    ASSERT_EQ(f.size(), 1u);
    EXPECT_EQ(f[0].final_clock(), 2);
    EXPECT_EQ(f[0].worker_id(), 0);
  }
}

TEST_F(KVWorkerTest, FinishRetriesUnavailable) {
  Make(1);
  int calls = 0;
  S(0)->set_finish_handler([&](const proto::FinishRequest&) {
    return ++calls < 3 ? Unavailable() : absl::OkStatus();
  });
  EXPECT_TRUE(worker_->Finish(Soon()).ok());
  EXPECT_EQ(calls, 3);
}

// SSP catch-up watch: a one-key pull with others_at and its own wait;
// `fired` runs with the answer (others_min_clock updated first) or the
// final error, which is not sticky; its hold is not a pull's hold, and
// Finish does not wait for one still outstanding.
TEST_F(KVWorkerTest, WatchOthersFiresOnItsAnswerAndNeverFailsTheWorker) {
  Make(1);
  std::vector<absl::Status> fired;
  std::vector<int64_t> floor_then;
  auto fire = [&](const absl::Status& s) {
    fired.push_back(s);
    floor_then.push_back(worker_->others_min_clock());
  };
  EXPECT_FALSE(worker_->WatchOthers(7, 4, 3, absl::Seconds(1), fire));
  worker_->Clock(0);
  S(0)->NextClock()->Reply(absl::OkStatus());
  ASSERT_TRUE(worker_->WatchOthers(0, 4, 3, absl::Milliseconds(1500), fire));
  std::optional<HeldPull> p = S(0)->NextPull();
  ASSERT_TRUE(p.has_value());
  EXPECT_EQ(p->req->others_at(), 3);
  EXPECT_EQ(p->req->wait_ms(), 1500);
  EXPECT_EQ(p->req->clock(), 1);
  EXPECT_TRUE(fired.empty());
  proto::PullResponse r = Answer(*p->req);
  r.set_others_min_clock(5);
  r.set_held_us(2000000);
  p->Reply(absl::OkStatus(), r);
  ASSERT_EQ(fired.size(), 1u);
  EXPECT_TRUE(fired[0].ok()) << fired[0];
  EXPECT_EQ(floor_then[0], 5);
  EXPECT_DOUBLE_EQ(worker_->consistency_wait_seconds(), 0.0);

  // A final error reaches the callback and nothing else.
  ASSERT_TRUE(worker_->WatchOthers(0, 4, 9, absl::Seconds(1), fire));
  p = S(0)->NextPull();
  ASSERT_TRUE(p.has_value());
  p->Reply(absl::InvalidArgumentError("no"), {});
  ASSERT_EQ(fired.size(), 2u);
  EXPECT_EQ(fired[1].code(), StatusCode::kInvalidArgument);
  std::vector<float> out;
  const int64_t ts = worker_->Pull(0, {5}, &out);  // a list sent with keys
  p = S(0)->NextPull();
  ASSERT_TRUE(p.has_value());
  p->Reply(absl::OkStatus(), Answer(*p->req));
  EXPECT_TRUE(worker_->Wait(ts, Soon()).ok());

  // Outstanding at the end: Finish goes on without it.
  ASSERT_TRUE(worker_->WatchOthers(0, 4, 9, absl::Seconds(1), fire));
  ASSERT_TRUE(S(0)->NextPull().has_value());
  EXPECT_TRUE(worker_->Finish(Soon()).ok());
  EXPECT_EQ(fired.size(), 2u);
}

TEST_F(KVWorkerTest, FinishWithOutstandingOperationsIsDeadlineExceeded) {
  Make(1);
  Push({1});
  EXPECT_EQ(worker_->Finish(absl::Now()).code(),
            StatusCode::kDeadlineExceeded);
}

}  // namespace
}  // namespace ps
