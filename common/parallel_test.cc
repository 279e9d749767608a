#include "common/parallel.h"

#include <atomic>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace ps {
namespace {

TEST(ParallelRunnerTest, RunsEveryPartOnceAndReturnsAfterAll) {
  ParallelRunner runner(3);
  EXPECT_EQ(runner.parallelism(), 3);
  for (int parts : {0, 1, 2, 3, 7, 64}) {
    std::vector<std::atomic<int>> calls(parts);
    runner.Run(parts, [&](int i) { calls[i].fetch_add(1); });
    for (int i = 0; i < parts; ++i) EXPECT_EQ(calls[i].load(), 1) << i;
  }
}

TEST(ParallelRunnerTest, WithoutHelpersRunsOnTheCaller) {
  ParallelRunner runner(1);
  const std::thread::id caller = std::this_thread::get_id();
  int n = 0;
  runner.Run(5, [&](int) {
    EXPECT_EQ(std::this_thread::get_id(), caller);
    ++n;
  });
  EXPECT_EQ(n, 5);
}

TEST(ParallelRunnerTest, ManyCallersAtOnce) {
  ParallelRunner runner(2);
  std::atomic<long> sum{0};
  std::vector<std::thread> callers;
  for (int c = 0; c < 4; ++c) {
    callers.emplace_back([&] {
      for (int round = 0; round < 200; ++round) {
        runner.Run(4, [&](int i) { sum.fetch_add(i + 1); });
      }
    });
  }
  for (std::thread& t : callers) t.join();
  EXPECT_EQ(sum.load(), 4L * 200 * (1 + 2 + 3 + 4));
}

TEST(ParallelRunnerTest, ForEachBalancedCallsEachOnceSmallOnesInOrder) {
  ParallelRunner runner(3);
  // Below twice the minimum: the caller, in order.
  const std::thread::id caller = std::this_thread::get_id();
  std::vector<size_t> order;
  runner.ForEachBalanced(
      5, 100, [](size_t) { return size_t{10}; },
      [&](size_t i) {
        EXPECT_EQ(std::this_thread::get_id(), caller);
        order.push_back(i);
      });
  EXPECT_EQ(order, (std::vector<size_t>{0, 1, 2, 3, 4}));
  // Large: split, each index exactly once.
  std::vector<std::atomic<int>> calls(64);
  runner.ForEachBalanced(
      calls.size(), 100, [](size_t) { return size_t{50}; },
      [&](size_t i) { calls[i].fetch_add(1); });
  for (size_t i = 0; i < calls.size(); ++i) EXPECT_EQ(calls[i].load(), 1) << i;
}

TEST(BalancedPartsTest, SplitsByTotalSize) {
  // Below twice the minimum: one part.
  EXPECT_EQ(BalancedParts({10, 10, 10}, 4, 20), (std::vector<size_t>{0, 3}));
  EXPECT_EQ(BalancedParts({}, 4, 1), (std::vector<size_t>{0, 0}));
  // Eight equal items, four parts of two.
  EXPECT_EQ(BalancedParts(std::vector<size_t>(8, 5), 4, 1),
            (std::vector<size_t>{0, 2, 4, 6, 8}));
  // The minimum part size caps the count: 40 / 15 = 2 parts.
  EXPECT_EQ(BalancedParts(std::vector<size_t>(8, 5), 4, 15),
            (std::vector<size_t>{0, 4, 8}));
  // Never more parts than items; a large item makes uneven parts.
  EXPECT_EQ(BalancedParts({100, 1}, 4, 1), (std::vector<size_t>{0, 1, 2}));
  EXPECT_EQ(BalancedParts({1, 1, 100}, 2, 1), (std::vector<size_t>{0, 3}));
}

}  // namespace
}  // namespace ps
