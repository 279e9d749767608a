#include "consistency/range_state.h"

#include <cstdint>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "google/protobuf/util/message_differencer.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "transport/errors.h"

namespace ps {
namespace {

using absl::StatusCode;

RangeState Make(int workers, bool bsp, RangeLimits limits = {}) {
  absl::StatusOr<RangeState> s = RangeState::Create(workers, bsp, limits);
  EXPECT_TRUE(s.ok()) << s.status();
  return *std::move(s);
}

BufferedSegment Seg(const std::string& tag) {
  return BufferedSegment{0, tag, tag};
}

// Accepts and (ASP/SSP) applies one segment; returns whether it was new.
bool Push(RangeState* st, int worker, uint64_t seq, int64_t clock,
          RangeActions* a, const std::string& tag = "k") {
  BufferedSegment seg = Seg(tag);
  bool dup = true;
  EXPECT_TRUE(st->Accept(worker, seq, clock, &seg, &dup, a).ok());
  if (!dup && !st->bsp()) EXPECT_TRUE(st->Applied(worker, clock, a).ok());
  EXPECT_TRUE(st->CheckInvariants().ok()) << st->CheckInvariants();
  return !dup;
}

void Announce(RangeState* st, int worker, int64_t clock, int64_t segments,
              int64_t examples, RangeActions* a, uint64_t settled = 0) {
  ASSERT_TRUE(
      st->Announce(worker, clock, segments, examples, settled, a).ok());
  ASSERT_TRUE(st->CheckInvariants().ok()) << st->CheckInvariants();
}

TEST(RangeStateTest, CreateNeedsAWorker) {
  EXPECT_EQ(RangeState::Create(0, false).status().code(),
            StatusCode::kInvalidArgument);
}

TEST(RangeStateTest, AspClockCompletesWhenAnnouncedSegmentsAreApplied) {
  RangeState st = Make(2, false);
  RangeActions a;
  Announce(&st, 0, 0, 2, 10, &a);
  EXPECT_EQ(st.Entry(0), 0);
  EXPECT_TRUE(Push(&st, 0, 1, 0, &a));
  EXPECT_EQ(st.Entry(0), 0);  // one of two
  EXPECT_TRUE(Push(&st, 0, 2, 0, &a));
  EXPECT_EQ(st.Entry(0), 1);
  ASSERT_EQ(a.advanced.size(), 1u);
  EXPECT_EQ(a.advanced[0], std::make_pair(0, int64_t{1}));
  EXPECT_EQ(st.Entry(1), 0);
}

TEST(RangeStateTest, ReplayedSeqIsADuplicateAndChangesNothing) {
  RangeState st = Make(1, false);
  RangeActions a;
  EXPECT_TRUE(Push(&st, 0, 1, 0, &a));
  EXPECT_FALSE(Push(&st, 0, 1, 0, &a));
  Announce(&st, 0, 0, 1, 1, &a);
  EXPECT_EQ(st.Entry(0), 1);
  // After the clock completed, the same seq is still a duplicate, not an
  // error about the completed clock.
  BufferedSegment seg = Seg("k");
  bool dup = false;
  EXPECT_TRUE(st.Accept(0, 1, 0, &seg, &dup, &a).ok());
  EXPECT_TRUE(dup);
}

// "No entry ahead of its data": an admitted segment whose apply has not
// finished holds its clock back, and a snapshot is refused meanwhile.
TEST(RangeStateTest, AdmittedButUnappliedSegmentHoldsTheClock) {
  RangeState st = Make(1, false);
  RangeActions a;
  BufferedSegment seg = Seg("k");
  bool dup = true;
  ASSERT_TRUE(st.Accept(0, 1, 0, &seg, &dup, &a).ok());
  ASSERT_FALSE(dup);
  Announce(&st, 0, 0, 1, 1, &a);
  EXPECT_EQ(st.Entry(0), 0);
  EXPECT_EQ(st.Snapshot().status().code(), StatusCode::kFailedPrecondition);
  ASSERT_TRUE(st.Applied(0, 0, &a).ok());
  EXPECT_EQ(st.Entry(0), 1);
  EXPECT_TRUE(st.Snapshot().ok());
  // A second Applied for the same clock is a caller bug, refused.
  EXPECT_EQ(st.Applied(0, 0, &a).code(), StatusCode::kFailedPrecondition);
  EXPECT_TRUE(st.CheckInvariants().ok());
}

// A segment whose values the table refused is withdrawn: its seq is
// admitted again (not a duplicate), whether the watermark had passed it or
// not, the seqs admitted after it stay duplicates, and the clock waits for
// the segments applied only.
TEST(RangeStateTest, WithdrawnSegmentIsAsIfNeverAdmitted) {
  RangeState st = Make(1, false);
  RangeActions a;
  BufferedSegment seg = Seg("k");
  bool dup = true;
  ASSERT_TRUE(st.Accept(0, 1, 0, &seg, &dup, &a).ok());  // watermark 1
  ASSERT_TRUE(st.Accept(0, 3, 0, &seg, &dup, &a).ok());  // above: 3
  ASSERT_TRUE(st.Accept(0, 2, 0, &seg, &dup, &a).ok());  // watermark 3
  ASSERT_TRUE(st.Withdraw(0, 2, 0).ok());
  EXPECT_TRUE(st.CheckInvariants().ok()) << st.CheckInvariants();
  ASSERT_TRUE(st.Withdraw(0, 3, 0).ok());
  EXPECT_TRUE(st.CheckInvariants().ok()) << st.CheckInvariants();
  // Each once: a second withdraw, or one of a seq never admitted, or of a
  // clock with nothing awaiting, is a caller bug.
  EXPECT_EQ(st.Withdraw(0, 3, 0).code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(st.Withdraw(0, 9, 0).code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(st.Withdraw(0, 1, 5).code(), StatusCode::kFailedPrecondition);
  for (uint64_t seq : {uint64_t{3}, uint64_t{2}}) {
    ASSERT_TRUE(st.Accept(0, seq, 0, &seg, &dup, &a).ok());
    EXPECT_FALSE(dup) << "seq " << seq;
  }
  ASSERT_TRUE(st.Accept(0, 1, 0, &seg, &dup, &a).ok());
  EXPECT_TRUE(dup);
  ASSERT_TRUE(st.Withdraw(0, 3, 0).ok());
  for (int i = 0; i < 2; ++i) ASSERT_TRUE(st.Applied(0, 0, &a).ok());
  EXPECT_TRUE(st.CheckInvariants().ok()) << st.CheckInvariants();
  Announce(&st, 0, 0, 3, 3, &a);
  EXPECT_EQ(st.Entry(0), 0);  // seq 3's segment is not in
  EXPECT_TRUE(Push(&st, 0, 3, 0, &a));
  EXPECT_EQ(st.Entry(0), 1);
  EXPECT_TRUE(st.Snapshot().ok());
}

// A worker that announces fewer segments than it sent (buggy or hostile)
// completes its clock early; the late data is applied but breaks nothing.
TEST(RangeStateTest, UnderAnnouncedClockKeepsTheInvariants) {
  RangeState st = Make(1, false);
  RangeActions a;
  BufferedSegment seg = Seg("k");
  bool dup = true;
  ASSERT_TRUE(st.Accept(0, 1, 0, &seg, &dup, &a).ok());
  Announce(&st, 0, 0, 0, 1, &a);
  EXPECT_EQ(st.Entry(0), 1);
  ASSERT_TRUE(st.Applied(0, 0, &a).ok());
  EXPECT_TRUE(st.CheckInvariants().ok()) << st.CheckInvariants();
  EXPECT_TRUE(st.Snapshot().ok());
}

TEST(RangeStateTest, BadInputIsRefusedWithoutChange) {
  RangeLimits limits;
  limits.max_clock_ahead = 5;
  limits.max_unsettled_seqs = 2;
  RangeState st = Make(1, false, limits);
  RangeActions a;
  BufferedSegment seg = Seg("k");
  bool dup;
  EXPECT_EQ(st.Accept(1, 1, 0, &seg, &dup, &a).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(st.Accept(0, 0, 0, &seg, &dup, &a).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(st.Accept(0, 1, -1, &seg, &dup, &a).code(),
            StatusCode::kInvalidArgument);
  absl::Status far = st.Accept(0, 1, 6, &seg, &dup, &a);
  EXPECT_EQ(far.code(), StatusCode::kOutOfRange);
  EXPECT_EQ(ReasonOf(far), proto::REASON_CLOCK_TOO_FAR);
  EXPECT_EQ(st.Announce(0, 6, 0, 1, 0, &a).code(), StatusCode::kOutOfRange);
  EXPECT_EQ(st.Announce(0, 0, -1, 1, 0, &a).code(),
            StatusCode::kInvalidArgument);
  // Two seqs above a gap fill the window; a third that does not extend the
  // watermark is refused, the one that does is taken.
  EXPECT_TRUE(Push(&st, 0, 3, 0, &a));
  EXPECT_TRUE(Push(&st, 0, 4, 0, &a));
  absl::Status full = st.Accept(0, 5, 0, &seg, &dup, &a);
  EXPECT_EQ(full.code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(ReasonOf(full), proto::REASON_TOO_MANY_PENDING);
  EXPECT_TRUE(Push(&st, 0, 1, 0, &a));
  EXPECT_TRUE(st.CheckInvariants().ok());
  // A push for a clock already completed here.
  Announce(&st, 0, 0, 3, 1, &a);
  EXPECT_EQ(st.Entry(0), 1);
  EXPECT_EQ(st.Accept(0, 9, 0, &seg, &dup, &a).code(),
            StatusCode::kFailedPrecondition);
}

// Regression of issue 8's "settled_seq = 2^64-1 made every later push a
// replay", kept for the per-range window.
TEST(RangeStateTest, SettledIsClampedToTheSeqsReceived) {
  RangeState st = Make(1, false);
  RangeActions a;
  EXPECT_TRUE(Push(&st, 0, 1, 0, &a));
  Announce(&st, 0, 0, 1, 1, &a, /*settled=*/UINT64_MAX);
  EXPECT_TRUE(Push(&st, 0, 2, 1, &a));  // new, not a "replay"
  // Settling forgets the window below it but keeps what is above.
  EXPECT_TRUE(Push(&st, 0, 5, 1, &a));
  Announce(&st, 0, 1, 2, 1, &a, /*settled=*/2);
  EXPECT_FALSE(Push(&st, 0, 5, 2, &a));
  EXPECT_FALSE(Push(&st, 0, 2, 2, &a));
  EXPECT_TRUE(Push(&st, 0, 3, 2, &a));
}

// Many segments per clock (more than the insertion sort takes): still in
// worker-id order, then arrival order, whatever order the workers' segments
// interleave in.
TEST(RangeStateTest, BspOrdersManySegmentsByWorkerThenArrival) {
  RangeState st = Make(3, true);
  RangeActions a;
  uint64_t seq[3] = {0, 0, 0};
  std::vector<std::string> want[3];
  for (int i = 0; i < 45; ++i) {
    const int w = (i * 7 + i / 5) % 3;  // an irregular interleaving
    const std::string tag = absl::StrCat("w", w, "-", seq[w]);
    ASSERT_TRUE(Push(&st, w, ++seq[w], 0, &a, tag));
    want[w].push_back(tag);
  }
  // A copy made now (a range move's) buffers them in the same order.
  absl::StatusOr<proto::RangeStateSnapshot> snap = st.Snapshot();
  ASSERT_TRUE(snap.ok()) << snap.status();
  absl::StatusOr<RangeState> copy = RangeState::FromSnapshot(*snap);
  ASSERT_TRUE(copy.ok()) << copy.status();
  std::vector<std::string> all;
  for (int w = 0; w < 3; ++w) {
    all.insert(all.end(), want[w].begin(), want[w].end());
  }
  for (RangeState* s : {&st, &*copy}) {
    RangeActions b;
    for (int w = 0; w < 3; ++w) {
      Announce(s, w, 0, static_cast<int64_t>(seq[w]), 10, &b);
    }
    ASSERT_EQ(b.apply.size(), 1u);
    std::vector<std::string> got;
    for (const BufferedSegment& seg : b.apply[0].segments) {
      got.push_back(seg.keys);
    }
    EXPECT_EQ(got, all);
  }
}

TEST(RangeStateTest, BspAppliesAClockOnceEveryLiveWorkerCompletedIt) {
  RangeState st = Make(3, true);
  RangeActions a;
  EXPECT_TRUE(Push(&st, 2, 1, 0, &a, "w2"));
  EXPECT_TRUE(Push(&st, 0, 1, 0, &a, "w0a"));
  EXPECT_TRUE(Push(&st, 0, 2, 0, &a, "w0b"));
  Announce(&st, 0, 0, 2, 10, &a);
  Announce(&st, 2, 0, 1, 30, &a);
  EXPECT_TRUE(a.apply.empty());  // worker 1 has not completed clock 0
  EXPECT_EQ(st.Entry(0), 0);
  Announce(&st, 1, 0, 0, 20, &a);
  ASSERT_EQ(a.apply.size(), 1u);
  EXPECT_EQ(a.apply[0].clock, 0);
  EXPECT_EQ(a.apply[0].examples, 60);
  ASSERT_EQ(a.apply[0].segments.size(), 3u);
  // Worker-id order, then arrival order: a deterministic sum.
  EXPECT_EQ(a.apply[0].segments[0].keys, "w0a");
  EXPECT_EQ(a.apply[0].segments[1].keys, "w0b");
  EXPECT_EQ(a.apply[0].segments[2].keys, "w2");
  for (int w = 0; w < 3; ++w) EXPECT_EQ(st.Entry(w), 1);
  EXPECT_EQ(st.BspApplied(), 1);
}

TEST(RangeStateTest, BspDeadOrFinishedWorkerNoLongerHoldsClocksBack) {
  RangeState st = Make(3, true);
  RangeActions a;
  EXPECT_TRUE(Push(&st, 0, 1, 0, &a));
  Announce(&st, 0, 0, 1, 1, &a);
  Announce(&st, 1, 0, 0, 1, &a);
  ASSERT_TRUE(st.Finish(1, 1, &a).ok());
  EXPECT_EQ(a.finished, std::vector<int>{1});
  EXPECT_TRUE(a.apply.empty());  // worker 2 is live and behind
  ASSERT_TRUE(st.SetDead(2, &a).ok());
  ASSERT_EQ(a.apply.size(), 1u);
  EXPECT_TRUE(st.Dead(2));
  EXPECT_TRUE(st.SetDead(2, &a).ok());  // idempotent
  EXPECT_TRUE(st.CheckInvariants().ok());
  // Only worker 0 is live now: its next clock applies at once.
  Announce(&st, 0, 1, 0, 1, &a);
  EXPECT_EQ(a.apply.size(), 2u);
  EXPECT_EQ(st.Entry(0), 2);
}

// A finish is resent with its final clock (a lost answer): idempotent.
// Another final clock is refused and changes nothing: it left a worker
// finished at clock 0 of 48 (the server fuzz target, 2026-12-03).
TEST(RangeStateTest, FinishAgainOnlyWithTheSameFinalClock) {
  for (const bool bsp : {false, true}) {
    SCOPED_TRACE(bsp ? "bsp" : "asp");
    RangeState st = Make(2, bsp);
    RangeActions a;
    ASSERT_TRUE(st.Finish(1, 0, &a).ok());
    EXPECT_TRUE(st.Finished(1));
    EXPECT_TRUE(st.Finish(1, 0, &a).ok());
    const absl::Status later = st.Finish(1, 48, &a);
    EXPECT_EQ(later.code(), absl::StatusCode::kFailedPrecondition) << later;
    EXPECT_TRUE(st.Finished(1));
    EXPECT_TRUE(st.CheckInvariants().ok()) << st.CheckInvariants();
    // Announced and not reached yet: lowered is refused too.
    ASSERT_TRUE(st.Finish(0, 5, &a).ok());
    EXPECT_FALSE(st.Finished(0));
    EXPECT_EQ(st.Finish(0, 1, &a).code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_FALSE(st.Finished(0));
    EXPECT_TRUE(st.CheckInvariants().ok()) << st.CheckInvariants();
  }
}

// Found by fuzz_server (stop 66): in BSP a finished worker no longer holds
// the range's clocks back, so the others can apply clocks it has not
// completed. Data or an announcement it sent for such a clock afterwards
// was buffered under the clocks applied, never to be applied (a push
// acknowledged and lost, and a broken invariant); it is refused.
TEST(RangeStateTest, BspClockAppliedWithoutAFinishedWorkerRefusesItsData) {
  RangeState st = Make(2, /*bsp=*/true);
  RangeActions a;
  EXPECT_TRUE(Push(&st, 0, 1, 0, &a));
  Announce(&st, 0, 0, 1, 4, &a);
  EXPECT_TRUE(Push(&st, 1, 1, 0, &a));
  Announce(&st, 1, 0, 1, 4, &a);
  ASSERT_TRUE(st.Finish(1, 1, &a).ok());  // done after clock 0
  EXPECT_TRUE(Push(&st, 0, 2, 1, &a));
  Announce(&st, 0, 1, 1, 4, &a);  // clock 1 applies without worker 1
  ASSERT_TRUE(st.CheckInvariants().ok()) << st.CheckInvariants();
  BufferedSegment seg = Seg("late");
  bool dup = true;
  const absl::Status push = st.Accept(1, 2, 1, &seg, &dup, &a);
  EXPECT_EQ(push.code(), StatusCode::kFailedPrecondition) << push;
  EXPECT_NE(push.message().find("applied on this range without it"),
            std::string::npos)
      << push;
  EXPECT_EQ(st.Announce(1, 1, 0, 0, 0, &a).code(),
            StatusCode::kFailedPrecondition);
  EXPECT_TRUE(st.CheckInvariants().ok()) << st.CheckInvariants();
  // A replay of what it sent before is still answered as one.
  seg = Seg("k");
  ASSERT_TRUE(st.Accept(1, 1, 0, &seg, &dup, &a).ok());
  EXPECT_TRUE(dup);
  // The live worker goes on.
  EXPECT_TRUE(Push(&st, 0, 3, 2, &a));
  Announce(&st, 0, 2, 1, 4, &a);
  EXPECT_TRUE(st.CheckInvariants().ok()) << st.CheckInvariants();
}

// Issue 9: a worker declared dead had its work handed to the others; if it
// was only hung or cut off, what it sends afterwards (a zombie) must not
// count twice. Its new segments and announcements are refused; a replay of
// a segment admitted before the death is still answered as one; a
// follower takes whatever its primary admitted, in the primary's order.
TEST(RangeStateTest, DeadWorkerIsRefusedExceptReplaysAndOnFollowers) {
  for (const bool bsp : {false, true}) {
    SCOPED_TRACE(bsp ? "bsp" : "asp");
    RangeState st = Make(2, bsp);
    RangeActions a;
    EXPECT_TRUE(Push(&st, 1, 1, 0, &a));
    ASSERT_TRUE(st.SetDead(1, &a).ok());
    BufferedSegment seg = Seg("z");
    bool dup = false;
    absl::Status s = st.Accept(1, 2, 0, &seg, &dup, &a);
    EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition) << s;
    EXPECT_NE(s.message().find("declared dead"), std::string::npos) << s;
    EXPECT_EQ(st.Announce(1, 0, 2, 10, 0, &a).code(),
              StatusCode::kFailedPrecondition);
    seg = Seg("k");
    ASSERT_TRUE(st.Accept(1, 1, 0, &seg, &dup, &a).ok());  // a replay
    EXPECT_TRUE(dup);
    EXPECT_TRUE(st.CheckInvariants().ok()) << st.CheckInvariants();
    // The live worker is unaffected.
    EXPECT_TRUE(Push(&st, 0, 1, 0, &a));

    RangeState follower = Make(2, bsp);
    RangeActions none;
    follower.SetFollower(true, &none);
    ASSERT_TRUE(follower.SetDead(1, &none).ok());
    EXPECT_TRUE(Push(&follower, 1, 1, 0, &none));
  }
}

// Issue 9: a worker joining a running BSP job holds back the clock the
// range is at (not one already applied), from its start clock on takes
// part like any other, and the clocks before its start count as done.
TEST(RangeStateTest, BspJoinedWorkerHoldsTheFrontierUntilItStarts) {
  RangeState st = Make(2, true);
  RangeActions a;
  for (int w = 0; w < 2; ++w) Announce(&st, w, 0, 0, 1, &a);
  Announce(&st, 0, 1, 0, 1, &a);  // worker 0 is one clock ahead
  EXPECT_EQ(st.BspApplied(), 1);
  EXPECT_EQ(st.Frontier(), 1);
  ASSERT_TRUE(st.Join(2, -1, &a).ok());
  ASSERT_EQ(st.num_workers(), 3);
  EXPECT_EQ(st.Completed(2), 1);
  EXPECT_EQ(st.Entry(2), 1);
  EXPECT_TRUE(st.CheckInvariants().ok()) << st.CheckInvariants();
  a = RangeActions();
  Announce(&st, 1, 1, 0, 1, &a);
  EXPECT_TRUE(a.apply.empty());  // the joiner holds clock 1
  // It starts at clock 3: clocks 1 and 2 are done for it without data.
  ASSERT_TRUE(st.Join(2, 3, &a).ok());
  ASSERT_EQ(a.apply.size(), 1u);
  EXPECT_EQ(a.apply[0].clock, 1);
  EXPECT_EQ(st.Completed(2), 3);
  EXPECT_TRUE(st.Join(2, 3, &a).ok());  // idempotent
  EXPECT_TRUE(st.Join(2, 2, &a).ok());  // never lowered
  EXPECT_EQ(st.Completed(2), 3);
  EXPECT_TRUE(Push(&st, 2, 1, 3, &a, "w2"));
  Announce(&st, 2, 3, 1, 5, &a);
  for (int w = 0; w < 2; ++w) Announce(&st, w, 2, 0, 1, &a);
  Announce(&st, 0, 3, 0, 1, &a);
  a = RangeActions();
  Announce(&st, 1, 3, 0, 1, &a);
  ASSERT_EQ(a.apply.size(), 1u);  // clock 2 went with worker 1's clock 2
  EXPECT_EQ(a.apply[0].clock, 3);
  ASSERT_EQ(a.apply[0].segments.size(), 1u);
  EXPECT_EQ(a.apply[0].segments[0].keys, "w2");
  EXPECT_EQ(a.apply[0].examples, 7);
  EXPECT_TRUE(st.CheckInvariants().ok()) << st.CheckInvariants();
}

TEST(RangeStateTest, JoinIsRefusedOutOfOrderOrBelowDataSent) {
  RangeState st = Make(1, false);
  RangeActions a;
  EXPECT_EQ(st.Join(2, 0, &a).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(st.Join(-1, 0, &a).code(), StatusCode::kInvalidArgument);
  Announce(&st, 0, 0, 0, 1, &a);
  Announce(&st, 0, 1, 0, 1, &a);
  ASSERT_TRUE(st.Join(1, -1, &a).ok());  // ASP: at the live workers' lowest
  EXPECT_EQ(st.Entry(1), 2);
  Announce(&st, 1, 4, 1, 1, &a);  // announced clock 4 early
  EXPECT_EQ(st.Join(1, 5, &a).code(), StatusCode::kFailedPrecondition);
  ASSERT_TRUE(st.Join(1, 4, &a).ok());
  EXPECT_EQ(st.Entry(1), 4);  // clock 4 still needs its segment
  EXPECT_TRUE(Push(&st, 1, 1, 4, &a));
  EXPECT_EQ(st.Entry(1), 5);
  // A copy of the grown range is the same range.
  absl::StatusOr<proto::RangeStateSnapshot> snap = st.Snapshot();
  ASSERT_TRUE(snap.ok()) << snap.status();
  absl::StatusOr<RangeState> copy = RangeState::FromSnapshot(*snap);
  ASSERT_TRUE(copy.ok()) << copy.status();
  EXPECT_EQ(copy->num_workers(), 2);
  EXPECT_EQ(copy->Entry(1), 5);
}

// A replica fed the same inputs, or restored from a snapshot midway and fed
// the rest, ends in the same state as the primary; the snapshot keeps the
// exactly-once window, so a resend to the new copy is a duplicate.
TEST(RangeStateTest, SnapshotCopyContinuesExactlyLikeTheOriginal) {
  for (bool bsp : {false, true}) {
    SCOPED_TRACE(bsp ? "bsp" : "asp");
    std::mt19937_64 rng(7);
    RangeState primary = Make(3, bsp);
    RangeState replica = Make(3, bsp);
    std::vector<uint64_t> next_seq(3, 1);
    std::vector<int64_t> clock(3, 0), sent(3, 0);
    std::vector<std::vector<std::pair<uint64_t, int64_t>>> history(3);
    std::optional<RangeState> restored;
    for (int step = 0; step < 600; ++step) {
      const int w = static_cast<int>(rng() % 3);
      RangeActions ap, ar, ax;
      const uint64_t roll = rng() % 10;
      auto feed = [&](RangeState* st, RangeActions* a, auto&& fn) { fn(st, a); };
      auto all = [&](auto&& fn) {
        feed(&primary, &ap, fn);
        feed(&replica, &ar, fn);
        if (restored) feed(&*restored, &ax, fn);
      };
      if (roll < 6) {
        const uint64_t seq = next_seq[w]++;
        history[w].emplace_back(seq, clock[w]);
        ++sent[w];
        const std::string tag = std::to_string(w) + "/" + std::to_string(seq);
        all([&](RangeState* st, RangeActions* a) {
          EXPECT_TRUE(Push(st, w, seq, clock[w], a, tag));
        });
      } else if (roll < 8 && !history[w].empty()) {
        // A resend of something already admitted.
        const std::pair<uint64_t, int64_t> pick =
            history[w][rng() % history[w].size()];
        const uint64_t seq = pick.first;
        const int64_t c = pick.second;
        all([&](RangeState* st, RangeActions* a) {
          BufferedSegment seg = Seg("dup");
          bool dup = false;
          EXPECT_TRUE(st->Accept(w, seq, c, &seg, &dup, a).ok());
          EXPECT_TRUE(dup);
        });
      } else {
        const uint64_t settled = next_seq[w] - 1;
        all([&](RangeState* st, RangeActions* a) {
          Announce(st, w, clock[w], sent[w], 5, a, settled);
        });
        ++clock[w];
        sent[w] = 0;
      }
      EXPECT_EQ(ap.advanced, ar.advanced);
      ASSERT_EQ(ap.apply.size(), ar.apply.size());
      if (restored) {
        EXPECT_EQ(ap.advanced, ax.advanced);
        ASSERT_EQ(ap.apply.size(), ax.apply.size());
        for (size_t i = 0; i < ap.apply.size(); ++i) {
          ASSERT_EQ(ap.apply[i].segments.size(),
                    ax.apply[i].segments.size());
          for (size_t j = 0; j < ap.apply[i].segments.size(); ++j) {
            EXPECT_EQ(ap.apply[i].segments[j].keys,
                      ax.apply[i].segments[j].keys);
          }
        }
      }
      if (step == 300) {
        absl::StatusOr<proto::RangeStateSnapshot> snap = primary.Snapshot();
        ASSERT_TRUE(snap.ok()) << snap.status();
        absl::StatusOr<RangeState> copy = RangeState::FromSnapshot(*snap);
        ASSERT_TRUE(copy.ok()) << copy.status();
        restored.emplace(*std::move(copy));
      }
    }
    for (int w = 0; w < 3; ++w) {
      EXPECT_EQ(primary.Entry(w), replica.Entry(w));
      EXPECT_EQ(primary.Entry(w), restored->Entry(w));
      EXPECT_GT(primary.Completed(w), 0);
    }
    auto a = primary.Snapshot(), b = restored->Snapshot();
    ASSERT_TRUE(a.ok() && b.ok());
    EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(*a, *b));
  }
}

// Replication after aggregation: a BSP follower never applies a clock by
// itself; the primary's apply (segment ids + announcements) brings it to
// the primary's state, and a promotion applies what is complete by then.
TEST(RangeStateTest, BspFollowerAppliesOnlyWhatItsPrimaryApplied) {
  RangeState primary = Make(2, true);
  RangeState follower = Make(2, true);
  RangeActions none;
  follower.SetFollower(true, &none);
  RangeActions a;
  EXPECT_TRUE(Push(&primary, 0, 1, 0, &a, "a"));
  EXPECT_TRUE(Push(&primary, 1, 1, 0, &a, "b"));
  EXPECT_TRUE(Push(&primary, 1, 2, 0, &a, "c"));
  Announce(&primary, 1, 0, 2, 20, &a, /*settled=*/1);
  Announce(&primary, 0, 0, 1, 10, &a);
  ASSERT_EQ(a.apply.size(), 1u);
  const RangeActions::Apply& p = a.apply[0];
  ASSERT_EQ(p.segments.size(), 3u);
  EXPECT_EQ(p.segments[1].worker, 1);
  EXPECT_EQ(p.segments[2].seq, 2u);
  ASSERT_EQ(p.announces.size(), 2u);  // in the order they completed it
  EXPECT_EQ(p.announces[0].worker, 1);
  EXPECT_EQ(p.announces[0].settled, 1u);
  std::vector<int32_t> workers;
  std::vector<uint64_t> seqs;
  for (const BufferedSegment& seg : p.segments) {
    workers.push_back(seg.worker);
    seqs.push_back(seg.seq);
  }
  // Out of order, or announcements missing: refused.
  RangeActions f;
  EXPECT_EQ(follower.ApplyReplicated(1, workers, seqs, p.announces, &f).code(),
            StatusCode::kFailedPrecondition);
  RangeState partial = Make(2, true);
  partial.SetFollower(true, &none);
  EXPECT_EQ(partial
                .ApplyReplicated(0, workers, seqs,
                                 absl::MakeConstSpan(p.announces).first(1), &f)
                .code(),
            StatusCode::kFailedPrecondition);
  // In order: applied once, with the primary's example count.
  f = RangeActions();
  ASSERT_TRUE(follower.ApplyReplicated(0, workers, seqs, p.announces, &f).ok());
  ASSERT_EQ(f.apply.size(), 1u);
  EXPECT_EQ(f.apply[0].examples, 30);
  EXPECT_EQ(follower.BspApplied(), 1);
  EXPECT_TRUE(follower.CheckInvariants().ok()) << follower.CheckInvariants();
  ASSERT_EQ(primary.Snapshot()->SerializeAsString(),
            follower.Snapshot()->SerializeAsString());

  // Clock 1 completes on the follower through a death; it waits for the
  // primary, and a promotion applies it.
  EXPECT_TRUE(Push(&follower, 0, 2, 1, &f, "d"));
  Announce(&follower, 0, 1, 1, 10, &f);
  RangeActions dead;
  ASSERT_TRUE(follower.SetDead(1, &dead).ok());
  EXPECT_TRUE(dead.apply.empty());
  EXPECT_EQ(follower.BspApplied(), 1);
  RangeActions promoted;
  follower.SetFollower(false, &promoted);
  ASSERT_EQ(promoted.apply.size(), 1u);
  EXPECT_EQ(promoted.apply[0].clock, 1);
  EXPECT_EQ(promoted.apply[0].segments.size(), 1u);
  EXPECT_EQ(follower.BspApplied(), 2);
}

// A copy taken mid-clock carries the buffered segments' seqs and the
// announcements already consumed, so a copy promoted later replicates the
// clock as its source would have.
TEST(RangeStateTest, BspSnapshotKeepsSeqsAndConsumedAnnouncements) {
  RangeState st = Make(2, true);
  RangeActions a;
  EXPECT_TRUE(Push(&st, 0, 5, 0, &a, "a"));
  Announce(&st, 0, 0, 1, 10, &a, /*settled=*/4);
  absl::StatusOr<proto::RangeStateSnapshot> snap = st.Snapshot();
  ASSERT_TRUE(snap.ok());
  absl::StatusOr<RangeState> copy = RangeState::FromSnapshot(*snap);
  ASSERT_TRUE(copy.ok()) << copy.status();
  EXPECT_TRUE(Push(&*copy, 1, 1, 0, &a, "b"));
  a = RangeActions();
  Announce(&*copy, 1, 0, 1, 20, &a);
  ASSERT_EQ(a.apply.size(), 1u);
  ASSERT_EQ(a.apply[0].segments.size(), 2u);
  EXPECT_EQ(a.apply[0].segments[0].seq, 5u);
  EXPECT_EQ(a.apply[0].segments[0].worker, 0);
  ASSERT_EQ(a.apply[0].announces.size(), 2u);
  EXPECT_EQ(a.apply[0].announces[0].settled, 4u);
  EXPECT_EQ(a.apply[0].examples, 30);
}

TEST(RangeStateTest, InconsistentSnapshotIsRefused) {
  RangeState st = Make(2, true);
  RangeActions a;
  EXPECT_TRUE(Push(&st, 0, 1, 0, &a));
  EXPECT_TRUE(Push(&st, 0, 3, 0, &a));
  absl::StatusOr<proto::RangeStateSnapshot> good = st.Snapshot();
  ASSERT_TRUE(good.ok());
  ASSERT_TRUE(RangeState::FromSnapshot(*good).ok());

  proto::RangeStateSnapshot bad = *good;
  bad.clear_workers();
  EXPECT_EQ(RangeState::FromSnapshot(bad).status().code(),
            StatusCode::kInvalidArgument);
  bad = *good;
  bad.mutable_workers(0)->add_above(2);  // not ascending after 3
  EXPECT_EQ(RangeState::FromSnapshot(bad).status().code(),
            StatusCode::kInvalidArgument);
  bad = *good;
  bad.mutable_workers(0)->set_admitted_total(7);  // pushes lost or doubled
  EXPECT_EQ(RangeState::FromSnapshot(bad).status().code(),
            StatusCode::kInvalidArgument);
  bad = *good;
  bad.mutable_pending_bsp(0)->mutable_segments(0)->set_worker(9);
  EXPECT_EQ(RangeState::FromSnapshot(bad).status().code(),
            StatusCode::kInvalidArgument);
  bad = *good;
  {
    // Received counts out of clock order (Snapshot writes them ascending).
    auto* later = bad.mutable_workers(0)->add_received();
    later->set_clock(5);
    later->set_count(1);
    auto* earlier = bad.mutable_workers(0)->add_received();
    earlier->set_clock(3);
    earlier->set_count(1);
  }
  absl::Status unordered = RangeState::FromSnapshot(bad).status();
  EXPECT_EQ(unordered.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(unordered.message()),
              ::testing::HasSubstr("bad received count"));
  bad = *good;
  bad.set_bsp_applied(5);  // ahead of every live worker
  EXPECT_EQ(RangeState::FromSnapshot(bad).status().code(),
            StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace ps
