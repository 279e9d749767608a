// Unit tests of KeyCache (bounded, least recently used first) and of the
// Table calls key caching relies on (slots, generations).
#include "server/key_cache.h"

#include <cstdint>
#include <memory>
#include <vector>

#include "gtest/gtest.h"
#include "server/table.h"

namespace ps {
namespace {

std::shared_ptr<const KeyList> ListOf(size_t n) {
  auto l = std::make_shared<KeyList>();
  l->keys.resize(n);
  for (size_t i = 0; i < n; ++i) l->keys[i] = i + 1;
  l->runs.push_back(RangeRun{0, 0, n});
  return l;
}

TEST(KeyCacheTest, FindsWhatWasPutPerWorker) {
  KeyCache cache(1 << 20);
  auto l = ListOf(10);
  cache.Put(0, 7, l);
  EXPECT_EQ(cache.Find(0, 7), l);
  EXPECT_EQ(cache.Find(1, 7), nullptr) << "another worker's list 7";
  EXPECT_EQ(cache.Find(0, 8), nullptr);
  EXPECT_EQ(cache.hits(), 1);
  EXPECT_EQ(cache.misses(), 2);
  EXPECT_EQ(cache.bytes(), l->bytes());
}

TEST(KeyCacheTest, EvictsLeastRecentlyUsedBeyondTheBudget) {
  const size_t one = ListOf(100)->bytes();
  KeyCache cache(3 * one);
  for (uint64_t id = 1; id <= 3; ++id) cache.Put(0, id, ListOf(100));
  ASSERT_NE(cache.Find(0, 1), nullptr);  // 1 is now the most recent
  cache.Put(0, 4, ListOf(100));          // evicts 2, the least recent
  EXPECT_NE(cache.Find(0, 1), nullptr);
  EXPECT_EQ(cache.Find(0, 2), nullptr);
  EXPECT_NE(cache.Find(0, 3), nullptr);
  EXPECT_NE(cache.Find(0, 4), nullptr);
  EXPECT_LE(cache.bytes(), 3 * one);
  EXPECT_EQ(cache.lists(), 3u);
}

TEST(KeyCacheTest, ReplacingAListKeepsTheAccountExact) {
  KeyCache cache(1 << 20);
  cache.Put(0, 1, ListOf(10));
  auto bigger = ListOf(50);
  cache.Put(0, 1, bigger);
  EXPECT_EQ(cache.Find(0, 1), bigger);
  EXPECT_EQ(cache.bytes(), bigger->bytes());
  EXPECT_EQ(cache.lists(), 1u);
}

TEST(KeyCacheTest, ListLargerThanTheBudgetIsNotKept) {
  KeyCache cache(ListOf(10)->bytes());
  cache.Put(0, 1, ListOf(10));
  cache.Put(0, 2, ListOf(1000));
  EXPECT_EQ(cache.Find(0, 2), nullptr);
  EXPECT_NE(cache.Find(0, 1), nullptr) << "not evicted for nothing";
  KeyCache off(0);
  off.Put(0, 1, ListOf(1));
  EXPECT_EQ(off.Find(0, 1), nullptr);
  cache.Clear();
  EXPECT_EQ(cache.lists(), 0u);
  EXPECT_EQ(cache.bytes(), 0u);
}

// A worker names only its `window` most recent lists to a server: the
// server keeps no more of that worker's lists, whatever the budget, and
// leaves other workers' lists alone.
TEST(KeyCacheTest, KeepsAtMostTheWorkersWindowOfItsLists) {
  KeyCache cache(size_t{1} << 30);
  for (uint64_t id = 1; id <= 3; ++id) cache.Put(1, id, ListOf(10), 3);
  for (uint64_t id = 1; id <= 5; ++id) cache.Put(0, id, ListOf(10), 3);
  EXPECT_EQ(cache.lists_of(0), 3u);
  EXPECT_EQ(cache.lists_of(1), 3u) << "worker 0's window evicted worker 1's";
  EXPECT_EQ(cache.Find(0, 1), nullptr);
  EXPECT_EQ(cache.Find(0, 2), nullptr);
  for (uint64_t id = 3; id <= 5; ++id) EXPECT_NE(cache.Find(0, id), nullptr);
  for (uint64_t id = 1; id <= 3; ++id) EXPECT_NE(cache.Find(1, id), nullptr);
  // Least recently used first out: 3 was used (Find above) after 4 and 5
  // were put, but 4 and 5 were found after it.
  ASSERT_NE(cache.Find(0, 3), nullptr);  // 3 is now worker 0's most recent
  cache.Put(0, 6, ListOf(10), 3);        // evicts 4
  EXPECT_EQ(cache.Find(0, 4), nullptr);
  EXPECT_NE(cache.Find(0, 3), nullptr);
  EXPECT_NE(cache.Find(0, 5), nullptr);
  EXPECT_NE(cache.Find(0, 6), nullptr);
  // Replacing a list does not count it twice; a window of 1 keeps one.
  cache.Put(0, 6, ListOf(20), 3);
  EXPECT_EQ(cache.lists_of(0), 3u);
  cache.Put(0, 7, ListOf(10), 1);
  EXPECT_EQ(cache.lists_of(0), 1u);
  EXPECT_NE(cache.Find(0, 7), nullptr);
  EXPECT_EQ(cache.lists(), 4u);
  EXPECT_EQ(cache.bytes(), 3 * ListOf(10)->bytes() + ListOf(10)->bytes());
  // Without a window only the budget bounds a worker's lists.
  for (uint64_t id = 10; id < 20; ++id) cache.Put(2, id, ListOf(1));
  EXPECT_EQ(cache.lists_of(2), 10u);
  cache.Clear();
  EXPECT_EQ(cache.lists_of(0), 0u);
}

std::unique_ptr<Table> SgdTable() {
  TableSpec spec;
  spec.dim = 2;
  spec.optimizer.name = "sgd";
  spec.optimizer.learning_rate = 1.0f;
  auto t = Table::Create(spec, 2);
  EXPECT_TRUE(t.ok()) << t.status();
  return std::move(*t);
}

TEST(TableSlotsTest, SlotsGiveTheSameResultsAsKeys) {
  std::unique_ptr<Table> t = SgdTable();
  std::unique_ptr<Table> by_keys = SgdTable();  // the reference
  const std::vector<uint64_t> keys = {3, 5, 9};
  const std::vector<float> g = {1, 2, 3, 4, 5, 6};
  std::vector<uint32_t> slots(3, 0);
  uint64_t gen = 0;
  std::vector<float> out(6), want(6);
  t->Pull(0, keys, out.data(), slots.data(), &gen);
  EXPECT_EQ(slots, std::vector<uint32_t>(3, Table::kNoSlot));
  // Keys the pull did not find go by key: created, in key order.
  ASSERT_TRUE(t->PushSlots(0, gen, keys, slots.data(), g.data(), 1.0f));
  by_keys->Push(0, keys, g.data(), 1.0f);
  EXPECT_EQ(t->size(), 3u);
  t->Push(0, keys, g.data(), 1.0f, slots.data(), &gen);
  by_keys->Push(0, keys, g.data(), 1.0f);
  for (uint32_t s : slots) EXPECT_NE(s, Table::kNoSlot);
  ASSERT_TRUE(t->PushSlots(0, gen, keys, slots.data(), g.data(), 0.5f));
  by_keys->Push(0, keys, g.data(), 0.5f);
  // Every slot known (a complete cached list): the same, without the
  // bounds check.
  std::vector<uint32_t> copied(3, 12345);
  ASSERT_TRUE(t->PushSlots(0, gen, keys, slots.data(), g.data(), 0.25f,
                           KeyOrder::kAscending, copied.data(), nullptr,
                           /*complete=*/true));
  by_keys->Push(0, keys, g.data(), 0.25f);
  EXPECT_EQ(copied, slots);
  ASSERT_TRUE(t->PullSlots(0, gen, keys, slots.data(), out.data()));
  by_keys->Pull(0, keys, want.data());
  EXPECT_EQ(out, want);
  EXPECT_NE(out, std::vector<float>(6, 0.0f));
  // A kNoSlot key stored since reads its stored value.
  std::vector<uint32_t> old(3, Table::kNoSlot);
  ASSERT_TRUE(t->PullSlots(0, gen, keys, old.data(), out.data()));
  EXPECT_EQ(out, want);
}

TEST(TableSlotsTest, PushSlotsWithMissingKeysMatchesPushByKeys) {
  std::unique_ptr<Table> t = SgdTable();
  std::unique_ptr<Table> by_keys = SgdTable();
  const std::vector<uint64_t> stored = {4, 8};
  const std::vector<float> g2 = {1, 1, 2, 2};
  t->Push(0, stored, g2.data(), 1.0f);
  by_keys->Push(0, stored, g2.data(), 1.0f);
  // A pull of 2, 4, 6, 8 finds 4 and 8; then 6 is stored by another push.
  const std::vector<uint64_t> keys = {2, 4, 6, 8};
  std::vector<uint32_t> slots(4);
  uint64_t gen = 0;
  std::vector<float> out(8), want(8);
  t->Pull(0, keys, out.data(), slots.data(), &gen);
  EXPECT_EQ(slots[0], Table::kNoSlot);
  EXPECT_EQ(slots[2], Table::kNoSlot);
  const std::vector<uint64_t> six = {6};
  t->Push(0, six, g2.data(), 1.0f);
  by_keys->Push(0, six, g2.data(), 1.0f);
  const std::vector<float> g = {1, 2, 3, 4, 5, 6, 7, 8};
  std::vector<uint32_t> resolved(4, 12345);
  ASSERT_TRUE(t->PushSlots(0, gen, keys, slots.data(), g.data(), 0.25f,
                           KeyOrder::kAny, resolved.data()));
  by_keys->Push(0, keys, g.data(), 0.25f);
  EXPECT_EQ(t->size(), 4u) << "6 found, not stored twice; 2 created";
  t->Pull(0, keys, out.data());
  by_keys->Pull(0, keys, want.data());
  EXPECT_EQ(out, want);
  // `resolved`: the given slots as they were, and where 2 and 6 are now.
  std::vector<uint32_t> now(4);
  uint64_t now_gen = 0;
  t->Pull(0, keys, out.data(), now.data(), &now_gen);
  EXPECT_EQ(now_gen, gen);
  EXPECT_EQ(resolved, now);
  EXPECT_EQ(resolved[1], slots[1]);
  EXPECT_EQ(resolved[3], slots[3]);
  // With every slot given, `resolved` is a copy of them.
  std::vector<uint32_t> again(4, 12345);
  ASSERT_TRUE(t->PushSlots(0, gen, keys, now.data(), g.data(), 0.5f,
                           KeyOrder::kAny, again.data()));
  by_keys->Push(0, keys, g.data(), 0.5f);
  EXPECT_EQ(again, now);
  t->Pull(0, keys, out.data());
  by_keys->Pull(0, keys, want.data());
  EXPECT_EQ(out, want);
  // A slot beyond the range's: refused, nothing applied (2 is not
  // created again, the values do not move).
  std::vector<uint32_t> bad = slots;
  bad[1] = 1000;
  bad[0] = Table::kNoSlot;
  EXPECT_FALSE(t->PushSlots(0, gen, keys, bad.data(), g.data(), 1.0f));
  t->Pull(0, keys, out.data());
  EXPECT_EQ(out, want);
  EXPECT_EQ(t->size(), 4u);
}

TEST(TableSlotsTest, ClearedRangeRefusesOldSlots) {
  std::unique_ptr<Table> t = SgdTable();
  std::unique_ptr<Table> other = SgdTable();
  const std::vector<uint64_t> keys = {3};
  const std::vector<float> g = {1, 1};
  std::vector<uint32_t> slots(1);
  uint64_t gen = 0;
  t->Push(0, keys, g.data(), 1.0f, slots.data(), &gen);
  std::vector<float> out(2);
  EXPECT_FALSE(other->PullSlots(0, gen, keys, slots.data(), out.data()))
      << "another table's slots";
  t->ClearRange(0);
  EXPECT_FALSE(t->PushSlots(0, gen, keys, slots.data(), g.data(), 1.0f));
  EXPECT_FALSE(t->PushSlots(0, gen, keys, slots.data(), g.data(), 1.0f,
                            KeyOrder::kAny, nullptr, nullptr,
                            /*complete=*/true));
  EXPECT_FALSE(t->PullSlots(0, gen, keys, slots.data(), out.data()));
  EXPECT_EQ(t->size(), 0u) << "nothing applied through stale slots";
}

}  // namespace
}  // namespace ps
