#include "consistency/vector_clock.h"

#include <cstdint>
#include <limits>
#include <vector>

#include "gtest/gtest.h"

namespace ps {
namespace {

TEST(VectorClockTest, StartsAtZero) {
  VectorClock vc(3);
  EXPECT_EQ(vc.num_workers(), 3);
  for (int w = 0; w < 3; ++w) EXPECT_EQ(vc.Get(w), 0);
  EXPECT_EQ(vc.DebugString(), "[0, 0, 0]");
}

TEST(VectorClockTest, AdvanceTakesTheMax) {
  VectorClock vc(2);
  vc.Advance(0, 5);
  vc.Advance(0, 3);  // never moves backwards
  vc.Advance(1, 2);
  EXPECT_EQ(vc.Get(0), 5);
  EXPECT_EQ(vc.Get(1), 2);
  EXPECT_EQ(vc.DebugString(), "[5, 2]");
}

TEST(VectorClockTest, OutOfRangeIdsAreIgnored) {
  VectorClock vc(2);
  vc.Advance(-1, 7);
  vc.Advance(2, 7);
  EXPECT_EQ(vc.Get(-1), 0);
  EXPECT_EQ(vc.Get(2), 0);
  EXPECT_EQ(vc.DebugString(), "[0, 0]");
}

TEST(VectorClockTest, MinOverLiveWorkers) {
  VectorClock vc(4);
  vc.Advance(0, 1);
  vc.Advance(1, 4);
  vc.Advance(2, 3);
  vc.Advance(3, 9);
  EXPECT_EQ(vc.MinOver({true, true, true, true}), 1);
  EXPECT_EQ(vc.MinOver({false, true, true, true}), 3);
  EXPECT_EQ(vc.MinOver({false, true, false, true}), 4);
  EXPECT_EQ(vc.MinOver({false, false, false, false}),
            std::numeric_limits<int64_t>::max());
  // A shorter mask treats the rest as not live.
  EXPECT_EQ(vc.MinOver({false, true}), 4);
}

}  // namespace
}  // namespace ps
