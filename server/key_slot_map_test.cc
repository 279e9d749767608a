#include "server/key_slot_map.h"

#include <cstdint>
#include <map>
#include <random>
#include <vector>

#include "common/hash.h"
#include "gtest/gtest.h"

namespace ps {
namespace {

constexpr uint32_t kNone = 0xffffffffu;

TEST(KeySlotMapTest, EmptyMapFindsNothing) {
  KeySlotMap m;
  EXPECT_TRUE(m.empty());
  EXPECT_EQ(m.Find(0, kNone), kNone);
  EXPECT_FALSE(m.Contains(42));
  m.Prefetch(7);  // no storage yet: must not touch memory
  int n = 0;
  m.ForEach([&](uint64_t, uint32_t) { ++n; });
  EXPECT_EQ(n, 0);
}

TEST(KeySlotMapTest, AgreesWithStdMapThroughGrowth) {
  // Keys of every shape a client may send: 0, all ones, small, dense,
  // random, and repeats.
  std::mt19937_64 rng(7);
  std::vector<uint64_t> keys = {0, ~uint64_t{0}, 1, 2, 3};
  for (uint64_t k = 100; k < 5000; ++k) keys.push_back(k);
  for (int i = 0; i < 20000; ++i) keys.push_back(rng());
  for (int i = 0; i < 3000; ++i) keys.push_back(keys[rng() % keys.size()]);
  KeySlotMap m;
  std::map<uint64_t, uint32_t> want;
  uint32_t next = 0;
  for (uint64_t k : keys) {
    auto [slot, added] = m.TryEmplace(k);
    const bool want_added = want.emplace(k, next).second;
    ASSERT_EQ(added, want_added) << k;
    if (added) {
      EXPECT_EQ(*slot, 0u);
      *slot = next++;
    } else {
      EXPECT_EQ(*slot, want[k]) << k;
    }
  }
  EXPECT_EQ(m.size(), want.size());
  for (const auto& [k, s] : want) {
    m.Prefetch(k);
    ASSERT_EQ(m.Find(k, kNone), s) << k;
    ASSERT_TRUE(m.Contains(k));
  }
  for (int i = 0; i < 1000; ++i) {
    const uint64_t k = rng();
    if (!want.contains(k)) EXPECT_EQ(m.Find(k, kNone), kNone);
  }
  std::map<uint64_t, uint32_t> seen;
  m.ForEach([&](uint64_t k, uint32_t s) {
    EXPECT_TRUE(seen.emplace(k, s).second) << "twice: " << k;
  });
  EXPECT_EQ(seen, want);
}

TEST(KeySlotMapTest, ClearRemovesEveryKeyAndTheMapIsReusable) {
  KeySlotMap m;
  for (uint64_t k = 0; k < 1000; ++k) *m.TryEmplace(k).first = 7;
  m.Clear();
  EXPECT_TRUE(m.empty());
  EXPECT_FALSE(m.Contains(5));
  auto [slot, added] = m.TryEmplace(5);
  EXPECT_TRUE(added);
  *slot = 9;
  EXPECT_EQ(m.Find(5, kNone), 9u);
  EXPECT_EQ(m.size(), 1u);
}

TEST(KeySlotMapTest, ChosenKeysDoNotPileUp) {
  // Keys that share their low 40 bits, and keys that an unseeded splitmix64
  // (Mix64, whose inverse is public: UnMix64) sends to one home entry of
  // any table up to 2^32 entries. The seed spreads both: probes stay short.
  for (int shape = 0; shape < 2; ++shape) {
    KeySlotMap m;
    auto key = [shape](uint64_t i) {
      return shape == 0 ? i << 40 : UnMix64(i << 32);
    };
    for (uint64_t i = 0; i < 100000; ++i) *m.TryEmplace(key(i)).first = i;
    for (uint64_t i = 0; i < 100000; ++i) {
      ASSERT_EQ(m.Find(key(i), kNone), i) << shape;
    }
    // Random homes at load <= 5/8 displace the worst of 100k keys by tens
    // of entries; colliding homes would by tens of thousands.
    EXPECT_LT(m.LongestProbe(), 100u) << shape;
  }
}

TEST(KeySlotMapTest, FindManyAgreesWithFindKeyByKey) {
  // Batches of every length around FindMany's 16 keys ahead, of stored
  // keys (many displaced from their home line at a 5/8 load), absent keys
  // and repeats, with key 0 stored and not (an empty entry's key is 0).
  std::mt19937_64 rng(11);
  for (int with_zero = 0; with_zero < 2; ++with_zero) {
    KeySlotMap m;
    std::vector<uint64_t> stored;
    if (with_zero != 0) stored.push_back(0);
    for (int i = 0; i < 3000; ++i) stored.push_back(rng());
    for (uint32_t i = 0; i < stored.size(); ++i) {
      *m.TryEmplace(stored[i]).first = i;
    }
    ASSERT_GT(m.LongestProbe(), 4u);  // some keys live past their home line
    // Key 0 not stored is not found, though empty entries hold key 0.
    if (with_zero == 0) {
      EXPECT_EQ(m.Find(0, kNone), kNone);
      EXPECT_FALSE(m.Contains(0));
    }
    for (size_t n : {0, 1, 15, 16, 17, 31, 32, 33, 1000, 5000}) {
      std::vector<uint64_t> keys(n);
      for (uint64_t& k : keys) {
        switch (rng() % 4) {
          case 0: k = rng(); break;     // absent (nearly surely)
          case 1: k = 0; break;         // stored or not
          default: k = stored[rng() % stored.size()];
        }
      }
      // FindMany (AVX-512 or AVX2 where the CPU has it) and the portable
      // loop.
      for (int portable = 0; portable < 2; ++portable) {
        std::vector<uint32_t> got(n + 1, 12345);
        if (portable != 0) {
          m.FindManyPortable(keys.data(), n, got.data(), kNone);
        } else {
          m.FindMany(keys.data(), n, got.data(), kNone);
        }
        for (size_t i = 0; i < n; ++i) {
          ASSERT_EQ(got[i], m.Find(keys[i], kNone))
              << n << " " << i << " portable " << portable;
        }
        EXPECT_EQ(got[n], 12345u) << "wrote past the end";
      }
    }
  }
  KeySlotMap empty;
  const uint64_t keys[2] = {0, 9};
  uint32_t got[2] = {1, 2};
  empty.FindMany(keys, 2, got, kNone);
  EXPECT_EQ(got[0], kNone);
  EXPECT_EQ(got[1], kNone);
  got[0] = got[1] = 1;
  empty.FindManyPortable(keys, 2, got, kNone);
  EXPECT_EQ(got[0], kNone);
  EXPECT_EQ(got[1], kNone);
  if (KeySlotMap::Avx2FindMany()) {
    GTEST_LOG_(INFO) << "no AVX-512 here: FindMany ran the AVX2 loop";
  } else if (!KeySlotMap::VectorFindMany()) {
    GTEST_LOG_(INFO) << "no AVX-512 or AVX2 here: FindMany ran the portable "
                        "loop";
  }
}

TEST(KeySlotMapTest, AStoredKeyNeverGrowsTheMap) {
  KeySlotMap m;
  // 10 keys fill 16 entries to the 5/8 limit: the 11th key grows it.
  for (uint64_t k = 0; k < 10; ++k) *m.TryEmplace(k).first = 1;
  uint32_t* slot = m.TryEmplace(3).first;
  // A lookup at the limit keeps references valid (no reallocation).
  EXPECT_EQ(m.TryEmplace(3).first, slot);
  EXPECT_FALSE(m.TryEmplace(3).second);
}

}  // namespace
}  // namespace ps
