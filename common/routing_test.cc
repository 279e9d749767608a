#include "common/routing.h"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <random>
#include <tuple>
#include <vector>

#include "absl/status/status.h"
#include "common/hash.h"
#include "gtest/gtest.h"
#include "proto/ps.pb.h"

namespace ps {
namespace {

constexpr uint64_t kMax = std::numeric_limits<uint64_t>::max();

Routing MustRouting(const proto::RoutingTable& t) {
  absl::StatusOr<Routing> r = Routing::FromProto(t);
  EXPECT_TRUE(r.ok()) << r.status();
  return r.ok() ? *std::move(r) : Routing();
}

// begins/owners by hand; no server list, so owner ids are not bounded.
proto::RoutingTable Table(const std::vector<uint64_t>& begins,
                          const std::vector<int>& owners) {
  proto::RoutingTable t;
  t.set_epoch(3);
  for (uint64_t b : begins) t.add_range_begin(b);
  for (int o : owners) t.add_range_server(o);
  return t;
}

std::vector<int> Ids(int n) {
  std::vector<int> ids(n);
  for (int i = 0; i < n; ++i) ids[i] = i;
  return ids;
}

TEST(HashTest, UnMix64InvertsMix64) {
  std::mt19937_64 rng(7);
  for (uint64_t x : {uint64_t{0}, uint64_t{1}, kMax, uint64_t{0x9e3779b97f4a7c15}}) {
    EXPECT_EQ(UnMix64(Mix64(x)), x);
    EXPECT_EQ(Mix64(UnMix64(x)), x);
  }
  for (int i = 0; i < 10000; ++i) {
    const uint64_t x = rng();
    ASSERT_EQ(UnMix64(Mix64(x)), x) << x;
  }
  for (uint64_t field : {0, 3, 0xb1a5}) {
    for (uint64_t f : {uint64_t{0}, uint64_t{123}, uint64_t{1} << 40, kMax}) {
      EXPECT_EQ(FeatureOf(FeatureKey(f, field), field), f);
    }
  }
}

TEST(HashRingTest, WellFormedAndDeterministic) {
  const proto::RoutingTable t = BuildHashRing(Ids(4), 64, 9);
  EXPECT_EQ(t.epoch(), 9);
  ASSERT_GE(t.range_begin_size(), 4 * 64);
  EXPECT_EQ(t.range_begin(0), 0u);
  Routing r = MustRouting(t);
  EXPECT_EQ(r.epoch(), 9);
  for (int s = 0; s < 4; ++s) EXPECT_FALSE(r.RangesOf(s).empty());
  const proto::RoutingTable again = BuildHashRing(Ids(4), 64, 9);
  EXPECT_EQ(again.SerializeAsString(), t.SerializeAsString());
  // Order of server ids does not matter.
  const proto::RoutingTable shuffled = BuildHashRing({3, 1, 0, 2}, 64, 9);
  EXPECT_EQ(shuffled.SerializeAsString(), t.SerializeAsString());
  // No servers: an empty table, which FromProto rejects.
  EXPECT_FALSE(Routing::FromProto(BuildHashRing({}, 64, 1)).ok());
}

// Spec: 4 servers x 64 virtual nodes, max/mean keys per server <= 1.2 over
// 1M random keys.
TEST(HashRingTest, BalancedOverRandomKeys) {
  Routing r = MustRouting(BuildHashRing(Ids(4), 64, 1));
  std::mt19937_64 rng(20140806);
  constexpr int kKeys = 1000000;
  std::vector<int64_t> count(4, 0);
  for (int i = 0; i < kKeys; ++i) ++count[r.ServerOf(rng())];
  const double mean = kKeys / 4.0;
  const int64_t max = *std::max_element(count.begin(), count.end());
  EXPECT_LE(max / mean, 1.2) << "counts " << count[0] << " " << count[1]
                             << " " << count[2] << " " << count[3];
}

// Spec: adding a 5th server moves only keys that now belong to it.
TEST(HashRingTest, AddingAServerMovesKeysOnlyToIt) {
  Routing four = MustRouting(BuildHashRing(Ids(4), 64, 1));
  Routing five = MustRouting(BuildHashRing(Ids(5), 64, 2));
  std::mt19937_64 rng(7);
  constexpr int kKeys = 200000;
  int moved = 0;
  for (int i = 0; i < kKeys; ++i) {
    const uint64_t key = rng();
    const int before = four.ServerOf(key);
    const int after = five.ServerOf(key);
    if (before != after) {
      ++moved;
      ASSERT_EQ(after, 4) << "key " << key << " moved from " << before
                          << " to " << after;
    }
  }
  // The new server takes roughly a fifth of the keys.
  EXPECT_GT(moved, kKeys / 10);
  EXPECT_LT(moved, kKeys * 3 / 10);
  // Same the other way round: removing a server only moves its own keys.
  Routing without2 = MustRouting(BuildHashRing({0, 1, 3}, 64, 3));
  for (int i = 0; i < kKeys; ++i) {
    const uint64_t key = rng();
    if (four.ServerOf(key) != 2) {
      ASSERT_EQ(without2.ServerOf(key), four.ServerOf(key)) << key;
    }
  }
}

TEST(RoutingTest, FromProtoRejectsMalformedTables) {
  struct Case {
    proto::RoutingTable table;
    const char* why;
  };
  proto::RoutingTable ragged = Table({0, 10}, {0});
  proto::RoutingTable with_servers = Table({0, 10}, {0, 2});
  with_servers.add_servers();
  with_servers.add_servers();  // ids 0 and 1 only
  const Case cases[] = {
      {proto::RoutingTable(), "empty"},
      {ragged, "ragged"},
      {Table({5, 10}, {0, 1}), "begin[0] != 0"},
      {Table({0, 20, 10}, {0, 1, 2}), "unsorted"},
      {Table({0, 10, 10}, {0, 1, 2}), "duplicate begin"},
      {Table({0, 10}, {0, -1}), "negative owner"},
      {with_servers, "owner beyond the server list"},
  };
  for (const Case& c : cases) {
    absl::StatusOr<Routing> r = Routing::FromProto(c.table);
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << c.why;
  }
  with_servers.set_range_server(1, 1);
  EXPECT_TRUE(Routing::FromProto(with_servers).ok());
}

TEST(RoutingTest, RangeLookups) {
  Routing r = MustRouting(Table({0, 100, 200, 300}, {0, 1, 0, 2}));
  EXPECT_EQ(r.num_ranges(), 4);
  EXPECT_EQ(r.epoch(), 3);
  EXPECT_EQ(r.RangeOf(0), 0);
  EXPECT_EQ(r.RangeOf(99), 0);
  EXPECT_EQ(r.RangeOf(100), 1);
  EXPECT_EQ(r.RangeOf(299), 2);
  EXPECT_EQ(r.RangeOf(kMax), 3);
  EXPECT_EQ(r.RangeLast(0), 99u);
  EXPECT_EQ(r.RangeLast(3), kMax);
  EXPECT_EQ(r.ServerOf(150), 1);
  EXPECT_EQ(r.OwnerOfRange(3), 2);
  EXPECT_EQ(r.RangeBegin(2), 200u);
  EXPECT_EQ(r.RangesOf(0), (std::vector<int>{0, 2}));
  EXPECT_TRUE(r.RangesOf(7).empty());
}

using Span = std::pair<size_t, size_t>;

TEST(RoutingTest, SliceSmallTable) {
  Routing r = MustRouting(Table({0, 100, 200, 300}, {0, 1, 0, 2}));
  const std::vector<uint64_t> keys = {5, 50, 100, 150, 250, 300, kMax};
  std::vector<KeySlice> slices = r.Slice(keys);
  ASSERT_EQ(slices.size(), 3u);
  EXPECT_EQ(slices[0].server, 0);
  EXPECT_EQ(slices[0].spans, (std::vector<Span>{{0, 2}, {4, 5}}));
  EXPECT_EQ(slices[0].count, 3u);
  EXPECT_EQ(slices[1].server, 1);
  EXPECT_EQ(slices[1].spans, (std::vector<Span>{{2, 4}}));
  EXPECT_EQ(slices[2].server, 2);
  EXPECT_EQ(slices[2].spans, (std::vector<Span>{{5, 7}}));
  EXPECT_EQ(slices[2].count, 2u);

  // Neighbouring ranges of one owner merge into one span; servers without
  // keys get no slice.
  Routing merged = MustRouting(Table({0, 10, 20}, {1, 1, 3}));
  slices = merged.Slice(std::vector<uint64_t>{1, 11, 12});
  ASSERT_EQ(slices.size(), 1u);
  EXPECT_EQ(slices[0].server, 1);
  EXPECT_EQ(slices[0].spans, (std::vector<Span>{{0, 3}}));
  EXPECT_TRUE(merged.Slice({}).empty());
}

// Spec: Slice() on sorted keys returns spans covering each key exactly once
// with the right owner.
TEST(RoutingTest, SliceCoversEveryKeyOnceWithItsOwner) {
  Routing r = MustRouting(BuildHashRing(Ids(4), 64, 1));
  std::mt19937_64 rng(11);
  std::vector<uint64_t> keys;
  for (int i = 0; i < 50000; ++i) keys.push_back(rng());
  // Edges: the ends of the key space and both sides of every range boundary.
  keys.push_back(0);
  keys.push_back(kMax);
  for (int i = 1; i < r.num_ranges(); ++i) {
    keys.push_back(r.RangeBegin(i));
    keys.push_back(r.RangeBegin(i) - 1);
  }
  std::sort(keys.begin(), keys.end());
  keys.erase(std::unique(keys.begin(), keys.end()), keys.end());

  const std::vector<KeySlice> slices = r.Slice(keys);
  std::vector<int> covered(keys.size(), 0);
  int last_server = -1;
  for (const KeySlice& s : slices) {
    EXPECT_GT(s.server, last_server) << "slices ordered by server id";
    last_server = s.server;
    size_t count = 0;
    size_t prev_end = 0;
    for (const auto& [first, last] : s.spans) {
      ASSERT_LT(first, last);
      ASSERT_LE(last, keys.size());
      EXPECT_GE(first, prev_end) << "spans ascending, not overlapping";
      prev_end = last;
      count += last - first;
      for (size_t i = first; i < last; ++i) {
        ++covered[i];
        ASSERT_EQ(r.ServerOf(keys[i]), s.server) << "key " << keys[i];
      }
    }
    EXPECT_EQ(s.count, count);
  }
  for (size_t i = 0; i < keys.size(); ++i) {
    ASSERT_EQ(covered[i], 1) << "key index " << i;
  }
  EXPECT_EQ(slices.size(), 4u);
}

TEST(RoutingTest, ForEachRangeRun) {
  Routing r = MustRouting(Table({0, 100, 200, 300}, {0, 1, 0, 2}));
  const std::vector<uint64_t> keys = {0, 99, 100, 101, 299, 300, kMax};
  std::vector<std::tuple<int, size_t, size_t>> runs;
  r.ForEachRangeRun(keys, [&](int range, size_t first, size_t last) {
    runs.emplace_back(range, first, last);
  });
  EXPECT_EQ(runs, (std::vector<std::tuple<int, size_t, size_t>>{
                      {0, 0, 2}, {1, 2, 4}, {2, 4, 5}, {3, 5, 7}}));
  runs.clear();
  r.ForEachRangeRun(absl::Span<const uint64_t>(), [&](int range, size_t first,
                                                       size_t last) {
    runs.emplace_back(range, first, last);
  });
  EXPECT_TRUE(runs.empty());

  // Every run length about the galloping search's steps (1, 2, 4, ...):
  // a run of `len` keys in range 1, then one key in range 2.
  for (size_t len = 1; len <= 70; ++len) {
    std::vector<uint64_t> k;
    for (size_t i = 0; i < len; ++i) k.push_back(100 + i);
    k.push_back(250);
    runs.clear();
    r.ForEachRangeRun(k, [&](int range, size_t first, size_t last) {
      runs.emplace_back(range, first, last);
    });
    EXPECT_EQ(runs, (std::vector<std::tuple<int, size_t, size_t>>{
                        {1, 0, len}, {2, len, len + 1}}))
        << "len " << len;
  }

  // On a real ring: runs are maximal, in order, and tile the key array.
  Routing ring = MustRouting(BuildHashRing(Ids(3), 16, 1));
  std::mt19937_64 rng(5);
  std::vector<uint64_t> many(20000);
  for (uint64_t& k : many) k = rng();
  std::sort(many.begin(), many.end());
  size_t expect_first = 0;
  int prev_range = -1;
  ring.ForEachRangeRun(many, [&](int range, size_t first, size_t last) {
    EXPECT_EQ(first, expect_first);
    EXPECT_LT(first, last);
    EXPECT_GT(range, prev_range);
    for (size_t i = first; i < last; ++i) {
      ASSERT_EQ(ring.RangeOf(many[i]), range);
    }
    expect_first = last;
    prev_range = range;
  });
  EXPECT_EQ(expect_first, many.size());
}

// Servers that joined after the start are in no range's preference list (the
// ring is the job's first): once the ring's servers are dead or gone, a
// failover refills each chain from the live servers in the fewest chains,
// so every range keeps its backup and the refills spread over them.
TEST(ReassignTest, RefillsChainsFromServersThatJoinedLater) {
  const proto::RoutingTable ring = BuildHashRing(Ids(3), 16, 1);
  const int n = ring.range_server_size();
  proto::RoutingTable current = ring;
  current.set_replicas(1);
  current.clear_range_backup();
  // S[0] left, S[3] and S[4] joined; chains over S[1..4], S[1] in many.
  for (int r = 0; r < n; ++r) {
    const int owner = 1 + r % 4;
    current.set_range_server(r, owner);
    current.add_range_backup(owner == 1 ? 2 + r % 3 : 1);
  }
  const std::vector<bool> live = {false, false, true, true, true};  // S[1] died
  absl::StatusOr<proto::RoutingTable> t = Reassign(ring, current, live, 1, 9);
  ASSERT_TRUE(t.ok()) << t.status();
  std::vector<int> refills(5, 0);
  for (int r = 0; r < n; ++r) {
    const int owner = t->range_server(r);
    const int backup = t->range_backup(r);
    EXPECT_TRUE(live[owner]) << "range " << r;
    ASSERT_GE(backup, 0) << "range " << r << ": no backup";
    EXPECT_TRUE(live[backup]) << "range " << r;
    EXPECT_NE(owner, backup) << "range " << r;
    // A live member of the old chain stays in it, first.
    if (current.range_server(r) != 1) {
      EXPECT_EQ(owner, current.range_server(r)) << "range " << r;
    } else {
      EXPECT_EQ(owner, current.range_backup(r)) << "range " << r;
    }
    if (current.range_server(r) == 1 || current.range_backup(r) == 1) {
      ++refills[backup];  // the chain lost S[1]: its backup is new
    }
  }
  // Each live server got some of the refills.
  for (int s = 2; s <= 4; ++s) EXPECT_GT(refills[s], 0) << "S[" << s << "]";
}

// A server being drained (`leaving`) keeps the chains it is in but is not
// added to one while another live server can be: a failover during the
// drain would otherwise put it back into chains, and its drain fail. With
// no other server left to add, it is taken rather than leave a range
// without a backup.
TEST(ReassignTest, ServersBeingDrainedAreTheLastResort) {
  const proto::RoutingTable ring = BuildHashRing(Ids(4), 16, 1);
  const int n = ring.range_server_size();
  proto::RoutingTable current = ring;
  current.set_replicas(1);
  current.clear_range_backup();
  for (int r = 0; r < n; ++r) {
    current.set_range_server(r, r % 4);
    current.add_range_backup((r + 1) % 4);
  }
  // S[0] died; S[3] is being drained.
  auto leaving = [](int s) { return s == 3; };
  absl::StatusOr<proto::RoutingTable> t = Reassign(
      ring, current, {false, true, true, true}, 1, 9, nullptr, leaving);
  ASSERT_TRUE(t.ok()) << t.status();
  for (int r = 0; r < n; ++r) {
    const bool had_3 =
        current.range_server(r) == 3 || current.range_backup(r) == 3;
    const bool has_3 = t->range_server(r) == 3 || t->range_backup(r) == 3;
    EXPECT_EQ(has_3, had_3) << "range " << r;  // kept where it was, no more
    EXPECT_GE(t->range_backup(r), 0) << "range " << r << ": no backup";
  }
  // S[1] and S[3] live, S[3] leaving: the ranges S[0] shared with S[1]
  // have nobody else to take.
  t = Reassign(ring, current, {false, true, false, true}, 1, 10, nullptr,
               leaving);
  ASSERT_TRUE(t.ok()) << t.status();
  for (int r = 0; r < n; ++r) {
    EXPECT_GE(t->range_backup(r), 0) << "range " << r << ": no backup";
  }
}

}  // namespace
}  // namespace ps
