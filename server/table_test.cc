#include "server/table.h"

#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <limits>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "common/bytes.h"
#include "common/hash.h"
#include "common/parallel.h"
#include "gtest/gtest.h"

namespace ps {
namespace {

// sgd with lr 1 and no regularisation: w = -sum(scale * g).
TableSpec PlainSgd(int dim = 1) {
  TableSpec spec;
  spec.id = 7;
  spec.dim = dim;
  spec.optimizer.name = "sgd";
  spec.optimizer.learning_rate = 1.0;
  spec.optimizer.l1 = 0;
  spec.optimizer.l2 = 0;
  return spec;
}

std::unique_ptr<Table> MakeTable(const TableSpec& spec, int num_ranges) {
  auto t = Table::Create(spec, num_ranges);
  EXPECT_TRUE(t.ok()) << t.status();
  return std::move(t).value();
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string TempPath(const std::string& name) {
  return testing::TempDir() + "/store_test_" + name;
}

TEST(TableTest, CreateRejectsBadSpecs) {
  TableSpec spec = PlainSgd();
  spec.dim = 0;
  EXPECT_EQ(Table::Create(spec, 1).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Table::Create(PlainSgd(), 0).status().code(),
            absl::StatusCode::kInvalidArgument);
  spec = PlainSgd();
  spec.init_scale = -1;
  EXPECT_EQ(Table::Create(spec, 1).status().code(),
            absl::StatusCode::kInvalidArgument);
  spec = PlainSgd();
  spec.optimizer.name = "ftrl";
  spec.init_scale = 0.1f;
  EXPECT_EQ(Table::Create(spec, 1).status().code(),
            absl::StatusCode::kInvalidArgument);
  spec = PlainSgd();
  spec.dense_ids = Table::kMaxDenseIds + 1;
  EXPECT_EQ(Table::Create(spec, 1).status().code(),
            absl::StatusCode::kInvalidArgument);
  spec.optimizer.name = "nope";
  auto t = Table::Create(spec, 1);
  ASSERT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(t.status().message().find("optimizer.name"), std::string::npos);
}

TEST(TableTest, PullOfUnknownKeyReturnsZerosWithoutInserting) {
  auto table = MakeTable(PlainSgd(2), 2);
  const uint64_t keys[] = {5, 9};
  float out[4] = {1, 1, 1, 1};
  table->Pull(1, keys, out);
  for (float v : out) EXPECT_EQ(v, 0.0f);
  EXPECT_EQ(table->size(), 0u);
  EXPECT_TRUE(table->Snapshot().empty());
}

TEST(TableTest, RandomInitIsDeterministicAndUsedOnPush) {
  TableSpec spec = PlainSgd(4);
  spec.init_scale = 0.5f;
  auto a = MakeTable(spec, 1);
  auto b = MakeTable(spec, 3);
  const uint64_t keys[] = {1, 2, 1ull << 63};
  std::vector<float> va(12), vb(12);
  a->Pull(0, keys, va.data());
  b->Pull(2, keys, vb.data());
  EXPECT_EQ(va, vb);  // depends on (table id, key, element), not the range
  for (float v : va) {
    EXPECT_GE(v, -0.5f);
    EXPECT_LT(v, 0.5f);
  }
  EXPECT_NE(va[0], va[1]);  // elements differ
  EXPECT_NE(va[0], va[4]);  // keys differ
  EXPECT_EQ(a->size(), 0u);

  // A zero gradient leaves the initial value in place once inserted.
  std::vector<float> zero(12, 0.0f), after(12);
  a->Push(0, keys, zero.data(), 1.0f);
  EXPECT_EQ(a->size(), 3u);
  a->Pull(0, keys, after.data());
  EXPECT_EQ(after, va);

  spec.id = 8;  // another table draws other values
  auto c = MakeTable(spec, 1);
  std::vector<float> vc(12);
  c->Pull(0, keys, vc.data());
  EXPECT_NE(vc, va);
}

TEST(TableTest, PushCreatesKeysWithDimGreaterThanOne) {
  auto table = MakeTable(PlainSgd(3), 2);
  const uint64_t keys[] = {10, 20};
  const float g[] = {1, 2, 3, 4, 5, 6};
  table->Push(0, keys, g, 0.5f);
  EXPECT_EQ(table->size(), 2u);
  float out[6];
  table->Pull(0, keys, out);
  const float expected[] = {-0.5f, -1, -1.5f, -2, -2.5f, -3};
  for (int i = 0; i < 6; ++i) EXPECT_EQ(out[i], expected[i]) << i;

  // Update one existing key and create one more in the same push.
  const uint64_t keys2[] = {20, 30};
  const float g2[] = {1, 1, 1, 2, 2, 2};
  table->Push(0, keys2, g2, 1.0f);
  EXPECT_EQ(table->size(), 3u);
  auto snap = table->Snapshot();
  ASSERT_EQ(snap.size(), 3u);
  EXPECT_EQ(snap[1].first, 20u);
  EXPECT_EQ(snap[1].second, (std::vector<float>{-3, -3.5f, -4}));
  EXPECT_EQ(snap[2].second, (std::vector<float>{-2, -2, -2}));
}

TEST(TableTest, RepeatedKeyInOnePushAppliesEachOccurrence) {
  auto table = MakeTable(PlainSgd(), 1);
  const uint64_t keys[] = {4, 4};
  const float g[] = {1, 2};
  table->Push(0, keys, g, 1.0f);
  EXPECT_EQ(table->size(), 1u);
  float out;
  table->Pull(0, absl::MakeConstSpan(keys, 1), &out);
  EXPECT_EQ(out, -3.0f);
}

// A dim-1 FTRL table updates 16 keys side by side (vector registers) unless
// one repeats among them: the result must be the scalar rule's, bit for bit,
// applied key by key in request order, by keys and by cached slots alike.
TEST(TableTest, DimOneFtrlEqualsTheScalarRuleBitForBit) {
  TableSpec spec;
  spec.dim = 1;
  spec.optimizer.name = "ftrl";
  spec.optimizer.alpha = 0.1;
  spec.optimizer.beta = 1.0;
  spec.optimizer.l1 = 3.0;
  spec.optimizer.l2 = 0.01;
  auto table = MakeTable(spec, 1);
  // The scalar rule, one element per call.
  auto rule_or = Optimizer::Create(spec.optimizer);
  ASSERT_TRUE(rule_or.ok()) << rule_or.status();
  const Optimizer& rule = **rule_or;

  // 1000 keys drawn from 300, so that keys repeat within a block of 8 and
  // across blocks; then one block that is a single key 8 times.
  std::vector<uint64_t> keys;
  uint64_t x = 12345;
  auto next = [&x] {
    x = x * 6364136223846793005ULL + 1442695040888963407ULL;
    return x >> 33;
  };
  for (int i = 0; i < 1000; ++i) keys.push_back(next() % 300);
  for (int i = 0; i < 8; ++i) keys.push_back(1000);
  keys.push_back(1001);  // a tail shorter than a block
  std::map<uint64_t, std::array<float, 3>> expected;  // [w, z, n]
  uint32_t slots[1009];
  uint64_t generation = 0;
  for (int round = 0; round < 6; ++round) {
    std::vector<float> grads(keys.size());
    for (float& g : grads) {
      g = static_cast<float>(static_cast<int64_t>(next() % 2001) - 1000) /
          250.0f;
    }
    grads[3] = 0.0f;
    const float scale = round % 2 == 0 ? 0.5f : 1.0f;
    if (round < 3) {
      table->Push(0, keys, grads.data(), scale, slots, &generation);
    } else {
      ASSERT_TRUE(table->PushSlots(0, generation, keys, slots, grads.data(),
                                   scale));
    }
    for (size_t i = 0; i < keys.size(); ++i) {
      auto& e = expected.try_emplace(keys[i], std::array<float, 3>{})
                    .first->second;
      rule.Apply(&e[0], &e[1], &grads[i], scale, 1);
    }
  }
  // Strictly ascending keys (as routing sends them): no repeat check.
  std::vector<uint64_t> ascending;
  for (uint64_t k = 0; k < 300; k += 1 + k % 3) ascending.push_back(k);
  for (int round = 0; round < 2; ++round) {
    std::vector<float> grads(ascending.size());
    for (float& g : grads) {
      g = static_cast<float>(static_cast<int64_t>(next() % 2001) - 1000) /
          250.0f;
    }
    table->Push(0, ascending, grads.data(), 1.0f);
    for (size_t i = 0; i < ascending.size(); ++i) {
      rule.Apply(&expected[ascending[i]][0], &expected[ascending[i]][1],
                 &grads[i], 1.0f, 1);
    }
  }
  std::vector<uint64_t> got_keys;
  std::vector<float> got;
  table->ExportRange(0, &got_keys, &got);
  ASSERT_EQ(got_keys.size(), expected.size());
  ASSERT_EQ(table->entry_floats(), 3u);
  int nonzero = 0;
  for (size_t i = 0; i < got_keys.size(); ++i) {
    const auto& e = expected.at(got_keys[i]);
    for (int j = 0; j < 3; ++j) {
      EXPECT_EQ(std::memcmp(&got[3 * i + j], &e[j], sizeof(float)), 0)
          << "key " << got_keys[i] << " float " << j << ": " << got[3 * i + j]
          << " vs " << e[j];
    }
    nonzero += e[0] != 0.0f;
  }
  // Both sides of the l1 test were taken.
  EXPECT_GT(nonzero, 10);
  EXPECT_LT(nonzero, static_cast<int>(expected.size()));
}

TEST(TableTest, ManyKeysSpanSeveralChunks) {
  // More keys than one storage chunk holds (16384 slots for dim 1 sgd).
  auto table = MakeTable(PlainSgd(), 1);
  std::vector<uint64_t> keys(40000);
  std::vector<float> g(keys.size());
  for (size_t i = 0; i < keys.size(); ++i) {
    keys[i] = i * 3;
    g[i] = static_cast<float>(i % 1000);
  }
  table->Push(0, keys, g.data(), 1.0f);
  table->Push(0, keys, g.data(), 1.0f);
  std::vector<float> out(keys.size());
  table->Pull(0, keys, out.data());
  for (size_t i = 0; i < keys.size(); ++i) {
    ASSERT_EQ(out[i], -2.0f * g[i]) << i;
  }
  EXPECT_EQ(table->size(), keys.size());
  EXPECT_EQ(table->nonzeros(), keys.size() - keys.size() / 1000);
}

TEST(TableTest, ConcurrentPushesSumCorrectly) {
  constexpr int kThreads = 4;
  constexpr int kRanges = 4;
  constexpr int kKeysPerRange = 500;
  constexpr int kRounds = 50;
  auto table = MakeTable(PlainSgd(2), kRanges);
  // Range r holds keys r*1000 .. r*1000+499. Each thread pushes gradient
  // (t+1, -(t+1)) to every key of every range, visiting ranges in a rotated
  // order so threads both run in parallel and contend on the same range.
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&table, t] {
      std::vector<uint64_t> keys(kKeysPerRange);
      std::vector<float> g(2 * kKeysPerRange);
      for (int i = 0; i < kKeysPerRange; ++i) {
        g[2 * i] = static_cast<float>(t + 1);
        g[2 * i + 1] = -static_cast<float>(t + 1);
      }
      for (int round = 0; round < kRounds; ++round) {
        for (int k = 0; k < kRanges; ++k) {
          int r = (t + k) % kRanges;
          for (int i = 0; i < kKeysPerRange; ++i) keys[i] = r * 1000 + i;
          table->Push(r, keys, g.data(), 1.0f);
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  // sum over threads of (t+1) = 10, times kRounds; small integers add
  // exactly in any order.
  const float expected = -10.0f * kRounds;
  auto snap = table->Snapshot();
  ASSERT_EQ(snap.size(), static_cast<size_t>(kRanges * kKeysPerRange));
  for (const auto& [key, v] : snap) {
    ASSERT_EQ(v[0], expected) << key;
    ASSERT_EQ(v[1], -expected) << key;
  }
}

// The dense-id layout (TableSpec::dense_ids) changes where a key's slot is
// found, never what is stored: the same calls give the same bits, files and
// enumerations as the hash maps, for dense ids, ids past the bound and keys
// that are no feature's key in namespace 0.
class DenseIdTest : public testing::TestWithParam<const char*> {};

TEST_P(DenseIdTest, StoresAsTheHashMaps) {
  constexpr int kRanges = 8;
  constexpr uint64_t kDenseIds = 1000;
  TableSpec spec;
  spec.id = 3;
  spec.dim = std::string(GetParam()) == "ftrl" ? 1 : 3;
  spec.optimizer.name = GetParam();
  spec.optimizer.learning_rate = 0.1;
  if (spec.optimizer.name != "ftrl") spec.init_scale = 0.05f;
  auto hashed = MakeTable(spec, kRanges);
  spec.dense_ids = kDenseIds;
  auto dense = MakeTable(spec, kRanges);
  auto range_of = [](uint64_t key) { return static_cast<int>(key >> 61); };
  const size_t dim = static_cast<size_t>(spec.dim);

  // Requests as a server gets them: per range, ascending. Ids 0..1499
  // (1000 and up are past the bound), the bound's neighbours, and keys of
  // another namespace.
  uint64_t state = 42;
  auto next = [&state] { return state = Mix64(state); };
  auto request = [&](size_t n) {
    std::vector<uint64_t> keys;
    for (size_t i = 0; i < n; ++i) {
      const uint64_t r = next() % 10;
      if (r < 6) {
        keys.push_back(FeatureKey(next() % 1500));
      } else if (r < 8) {
        keys.push_back(FeatureKey(kDenseIds - 1 + next() % 2));
      } else {
        keys.push_back(FeatureKey(next() % 50, 7));
      }
    }
    std::sort(keys.begin(), keys.end());
    keys.erase(std::unique(keys.begin(), keys.end()), keys.end());
    return keys;
  };
  auto by_range = [&](const std::vector<uint64_t>& keys, auto fn) {
    size_t i = 0;
    while (i < keys.size()) {
      size_t j = i;
      while (j < keys.size() && range_of(keys[j]) == range_of(keys[i])) ++j;
      fn(range_of(keys[i]), absl::MakeConstSpan(keys.data() + i, j - i), i);
      i = j;
    }
  };
  auto expect_same = [&](const std::string& when) {
    SCOPED_TRACE(when);
    EXPECT_EQ(dense->size(), hashed->size());
    EXPECT_EQ(dense->nonzeros(), hashed->nonzeros());
    EXPECT_EQ(dense->Snapshot(), hashed->Snapshot());
    for (int r = 0; r < kRanges; ++r) {
      std::vector<uint64_t> dk, hk;
      std::vector<float> de, he;
      dense->ExportRange(r, &dk, &de);
      hashed->ExportRange(r, &hk, &he);
      EXPECT_EQ(dk, hk) << "range " << r;
      EXPECT_EQ(de, he) << "range " << r;
    }
    // Per instance and process: ctest runs the instances side by side.
    const std::string tag = absl::StrCat(GetParam(), "_", ::getpid());
    const std::string dp = TempPath(absl::StrCat("dense_", tag, ".bin"));
    const std::string hp = TempPath(absl::StrCat("hashed_", tag, ".bin"));
    ASSERT_TRUE(dense->SaveBinary(dp, nullptr).ok());
    ASSERT_TRUE(hashed->SaveBinary(hp, nullptr).ok());
    EXPECT_EQ(ReadFile(dp), ReadFile(hp));
    std::remove(dp.c_str());
    std::remove(hp.c_str());
  };

  for (int round = 0; round < 6; ++round) {
    const std::vector<uint64_t> keys = request(300);
    std::vector<float> grads(keys.size() * dim);
    for (float& g : grads) g = static_cast<float>(next() % 2001) / 1000 - 1;
    // Pulls first (keys not stored yet read as their initial values), with
    // the slots a key-cached pull records; then pushes by key or by those
    // slots.
    std::vector<float> dout(grads.size()), hout(grads.size());
    std::vector<uint32_t> dslots(keys.size()), hslots(keys.size());
    std::vector<uint64_t> dgen(kRanges), hgen(kRanges);
    by_range(keys, [&](int r, absl::Span<const uint64_t> k, size_t off) {
      dense->Pull(r, k, dout.data() + off * dim, dslots.data() + off, &dgen[r]);
      hashed->Pull(r, k, hout.data() + off * dim, hslots.data() + off,
                   &hgen[r]);
    });
    EXPECT_EQ(dout, hout) << "round " << round;
    EXPECT_EQ(dslots, hslots) << "round " << round;  // same creation order
    by_range(keys, [&](int r, absl::Span<const uint64_t> k, size_t off) {
      if (round % 2 == 0) {
        EXPECT_TRUE(dense->PushSlots(r, dgen[r], k, dslots.data() + off,
                                     grads.data() + off * dim, 0.5f));
        EXPECT_TRUE(hashed->PushSlots(r, hgen[r], k, hslots.data() + off,
                                      grads.data() + off * dim, 0.5f));
      } else {
        dense->Push(r, k, grads.data() + off * dim, 0.5f);
        hashed->Push(r, k, grads.data() + off * dim, 0.5f);
      }
    });
    by_range(keys, [&](int r, absl::Span<const uint64_t> k, size_t off) {
      EXPECT_TRUE(dense->PullSlots(r, dgen[r], k, dslots.data() + off,
                                   dout.data() + off * dim));
      EXPECT_TRUE(hashed->PullSlots(r, hgen[r], k, hslots.data() + off,
                                    hout.data() + off * dim));
    });
    EXPECT_EQ(dout, hout) << "round " << round;
    expect_same("round " + std::to_string(round));
  }
  // A range replaced by a copy (a replica's ClearRange + ImportRange): the
  // old slots are void, the dense index forgets the range's ids and takes
  // them again.
  for (int r = 0; r < kRanges; r += 3) {
    std::vector<uint64_t> keys;
    std::vector<float> entries;
    hashed->ExportRange(r, &keys, &entries);
    uint64_t generation = 0;
    std::vector<float> out(keys.size() * dim);
    dense->Pull(r, keys, out.data(), nullptr, &generation);
    dense->ClearRange(r);
    hashed->ClearRange(r);
    EXPECT_FALSE(dense->PullSlots(r, generation, keys, nullptr, out.data()));
    expect_same("cleared range " + std::to_string(r));
    // Import all but the first key: that one must read as not stored.
    if (keys.empty()) continue;
    const size_t stride = entries.size() / keys.size();
    auto rest = absl::MakeConstSpan(keys).subspan(1);
    dense->ImportRange(r, rest, entries.data() + stride);
    hashed->ImportRange(r, rest, entries.data() + stride);
    expect_same("imported range " + std::to_string(r));
  }
}

INSTANTIATE_TEST_SUITE_P(Optimizers, DenseIdTest,
                         testing::Values("ftrl", "sgd", "adam"));

// Against Pull's precondition, a key used with two ranges is stored in each,
// as with the hash maps (never one range's slot read in another's storage).
// Every dense-id lookup loop this CPU runs gives the portable loop's slots:
// entries of the range, of other ranges and empty, ids past the bound, keys
// of another namespace, every batch length around the loops' steps.
TEST(TableTest, DenseIdLookupLoopsAgree) {
  using table_internal::FtrlIsa;
  constexpr uint64_t kLimit = 5000;
  constexpr int kRange = 3;
  std::mt19937_64 rng(17);
  std::vector<uint64_t> index(kLimit);
  for (uint64_t& e : index) {
    switch (rng() % 3) {
      case 0:
        e = 0;
        break;  // no slot
      case 1:
        e = (uint64_t{kRange} << 32) | (1 + rng() % 100000);
        break;
      default:
        e = (uint64_t{1 + rng() % 7} << 32) | (1 + rng() % 100000);
    }
  }
  for (size_t n : {0, 1, 3, 4, 5, 55, 56, 57, 60, 64, 65, 1000, 4099}) {
    std::vector<uint64_t> keys(n);
    for (uint64_t& k : keys) {
      switch (rng() % 4) {
        case 0:
          k = FeatureKey(kLimit + rng() % 100);
          break;  // past it
        case 1:
          k = FeatureKey(rng() % kLimit, 9);
          break;  // namespace 9
        default:
          k = FeatureKey(rng() % kLimit);
      }
    }
    std::vector<uint32_t> want(n + 1, 7);
    ASSERT_TRUE(table_internal::DenseSlotsWith(FtrlIsa::kPortable, index.data(),
                                               kLimit, kRange, keys.data(), n,
                                               want.data()));
    for (FtrlIsa isa : {FtrlIsa::kAvx2, FtrlIsa::kAvx512}) {
      std::vector<uint32_t> got(n + 1, 7);
      if (!table_internal::DenseSlotsWith(isa, index.data(), kLimit, kRange,
                                          keys.data(), n, got.data())) {
        continue;  // not on this CPU
      }
      EXPECT_EQ(got, want) << "n " << n << " isa " << static_cast<int>(isa);
    }
    // The portable loop itself, key by key.
    for (size_t i = 0; i < n; ++i) {
      const uint64_t id = FeatureOf(keys[i]);
      const uint64_t e = id < kLimit ? index[id] : 0;
      const uint32_t slot = e != 0 && (e >> 32) == kRange
                                ? static_cast<uint32_t>(e) - 1
                                : Table::kNoSlot;
      ASSERT_EQ(want[i], slot) << i;
    }
    EXPECT_EQ(want[n], 7u) << "wrote past the end";
  }
}

TEST(TableTest, DenseIdUsedWithTwoRangesIsStoredPerRange) {
  for (uint64_t dense_ids : {uint64_t{0}, uint64_t{100}}) {
    SCOPED_TRACE(dense_ids);
    TableSpec spec = PlainSgd();
    spec.dense_ids = dense_ids;
    auto table = MakeTable(spec, 2);
    const uint64_t key[] = {FeatureKey(5)};
    const float one[] = {1}, two[] = {2};
    table->Push(0, key, one, 1.0f);
    table->Push(1, key, two, 1.0f);
    table->Push(1, key, two, 1.0f);
    EXPECT_EQ(table->size(), 2u);
    float out = 0;
    table->Pull(0, key, &out);
    EXPECT_EQ(out, -1.0f);
    table->Pull(1, key, &out);
    EXPECT_EQ(out, -4.0f);
    table->ClearRange(0);
    table->Pull(1, key, &out);
    EXPECT_EQ(out, -4.0f);
    table->Pull(0, key, &out);
    EXPECT_EQ(out, 0.0f);
    table->Push(0, key, one, 1.0f);
    table->Pull(0, key, &out);
    EXPECT_EQ(out, -1.0f);
    EXPECT_EQ(table->size(), 2u);
  }
}

TEST(TableTest, SaveAndLoadBinaryRoundTrip) {
  TableSpec spec = PlainSgd(2);
  spec.optimizer.name = "adagrad";
  auto table = MakeTable(spec, 3);
  const uint64_t k0[] = {300, 100};
  const uint64_t k2[] = {~0ull, 200};
  const float g[] = {1, -2, 3, 0.25f};
  table->Push(0, k0, g, 1.0f);
  table->Push(2, k2, g, 0.5f);

  const std::string path = TempPath("roundtrip.bin");
  size_t written = 0;
  ASSERT_TRUE(table->SaveBinary(path, &written).ok());
  EXPECT_EQ(written, 4u);
  auto file = Table::ReadBinaryFile(path);
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ(file->table_id, 7);
  EXPECT_EQ(file->dim, 2);
  EXPECT_EQ(file->records, table->Snapshot());
  auto loaded = Table::LoadBinary(path);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  ASSERT_EQ(loaded->size(), 4u);
  EXPECT_EQ((*loaded)[0].first, 100u);
  EXPECT_EQ((*loaded)[3].first, ~0ull);
  // Header (24 bytes) + 4 records of 8 + 2*4 bytes.
  EXPECT_EQ(ReadFile(path).size(), 24u + 4 * 16);
  EXPECT_EQ(ReadFile(path).substr(0, 4), "PSTB");
  std::remove(path.c_str());
}

TEST(TableTest, EqualContentsGiveByteIdenticalFiles) {
  // Same model, built with different partitioning and push order.
  auto a = MakeTable(PlainSgd(3), 1);
  auto b = MakeTable(PlainSgd(3), 5);
  std::vector<uint64_t> keys;
  std::vector<float> g;
  for (uint64_t k = 0; k < 100; ++k) {
    keys.push_back(k * 7919);
    for (int j = 0; j < 3; ++j) g.push_back(static_cast<float>(k + j) / 8);
  }
  a->Push(0, keys, g.data(), 1.0f);
  for (int i = 99; i >= 0; --i) {  // reverse order, spread over ranges
    b->Push(i % 5, absl::MakeConstSpan(&keys[i], 1), &g[3 * i], 1.0f);
  }
  const std::string pa = TempPath("a.bin"), pb = TempPath("b.bin");
  ASSERT_TRUE(a->SaveBinary(pa, nullptr).ok());
  ASSERT_TRUE(b->SaveBinary(pb, nullptr).ok());
  EXPECT_EQ(ReadFile(pa), ReadFile(pb));
  const std::string ta = TempPath("a.txt"), tb = TempPath("b.txt");
  ASSERT_TRUE(a->SaveText(ta, nullptr).ok());
  ASSERT_TRUE(b->SaveText(tb, nullptr).ok());
  EXPECT_EQ(ReadFile(ta), ReadFile(tb));
  for (const auto& p : {pa, pb, ta, tb}) std::remove(p.c_str());
}

// Gather (Snapshot, CopyValues, the saves) and ExportRange sort keys by a
// radix sort of their 64 bits: random keys over many ranges, some at the
// extremes, some of them dense ids, come back ascending with their own
// values.
TEST(TableTest, SnapshotAndExportSortRandomKeysWithTheirValues) {
  for (uint64_t dense_ids : {uint64_t{0}, uint64_t{1000}}) {
    SCOPED_TRACE(dense_ids);
    TableSpec spec = PlainSgd(3);
    spec.dense_ids = dense_ids;
    constexpr int kRanges = 13;
    auto table = MakeTable(spec, kRanges);
    std::mt19937_64 rng(7);
    std::vector<std::vector<uint64_t>> by_range(kRanges);
    absl::flat_hash_map<uint64_t, float> first;  // key -> its first value
    for (int i = 0; i < 5000; ++i) {
      uint64_t k = rng();
      if (i % 50 == 0) k = i % 100 == 0 ? ~uint64_t{0} - i : uint64_t(i);
      if (i % 7 == 0) k = rng() % 1000;  // a dense id when there are any
      if (!first.emplace(k, static_cast<float>(i)).second) continue;
      by_range[i % kRanges].push_back(k);
    }
    for (int r = 0; r < kRanges; ++r) {
      std::vector<float> g;
      for (uint64_t k : by_range[r]) {
        for (int j = 0; j < 3; ++j) g.push_back(first[k] + j);
      }
      table->Push(r, by_range[r], g.data(), 1.0f);
    }
    const auto snap = table->Snapshot();
    ASSERT_EQ(snap.size(), first.size());
    for (size_t i = 0; i < snap.size(); ++i) {
      if (i > 0) ASSERT_LT(snap[i - 1].first, snap[i].first) << i;
      const float v = first[snap[i].first];
      // SGD at rate 1 from 0: the weight is minus the gradient.
      ASSERT_EQ(snap[i].second, (std::vector<float>{-v, -v - 1, -v - 2})) << i;
    }
    for (int r = 0; r < kRanges; ++r) {
      std::vector<uint64_t> keys;
      std::vector<float> entries;
      table->ExportRange(r, &keys, &entries);
      std::vector<uint64_t> want = by_range[r];
      std::sort(want.begin(), want.end());
      ASSERT_EQ(keys, want) << r;
      ASSERT_EQ(entries.size() % keys.size(), 0u);
      const size_t stride = entries.size() / keys.size();
      for (size_t i = 0; i < keys.size(); ++i) {
        ASSERT_EQ(entries[i * stride], -first[keys[i]]) << r << " " << i;
      }
    }
  }
}

TEST(TableTest, SaveTextWritesOnlyNonZeros) {
  TableSpec spec = PlainSgd(2);
  spec.optimizer.learning_rate = 0.5;
  spec.optimizer.l1 = 1.0;  // shrinks |w| by 0.5 per step
  auto table = MakeTable(spec, 2);
  const uint64_t keys[] = {12, 3, 40};
  // key 12: w = (-1, -0.2), shrunk by 0.5 -> (-0.5, 0)
  // key 3:  w = (-0.25, 0.25) -> (0, 0): all zero, not written
  // key 40: w = (-2, 3) -> (-1.5, 2.5)
  const float g[] = {2, 0.4f, 0.5f, -0.5f, 4, -6};
  table->Push(1, keys, g, 1.0f);
  EXPECT_EQ(table->size(), 3u);
  EXPECT_EQ(table->nonzeros(), 2u);
  const std::string path = TempPath("model.txt");
  size_t nnz = 0;
  ASSERT_TRUE(table->SaveText(path, &nnz).ok());
  EXPECT_EQ(nnz, 2u);
  EXPECT_EQ(ReadFile(path), "12\t-0.5 0\n40\t-1.5 2.5\n");
  std::remove(path.c_str());
}

TEST(TableTest, FileErrorsNameThePathAndCarryCodes) {
  auto table = MakeTable(PlainSgd(), 1);
  const std::string bad_dir = TempPath("no_such_dir") + "/x.bin";
  absl::Status s = table->SaveBinary(bad_dir, nullptr);
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound) << s;
  EXPECT_NE(s.message().find(bad_dir), std::string::npos) << s;
  s = table->SaveText(bad_dir, nullptr);
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound) << s;

  auto missing = Table::LoadBinary(TempPath("missing.bin"));
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find("missing.bin"), std::string::npos);

  const std::string garbage = TempPath("garbage.bin");
  {
    std::ofstream out(garbage, std::ios::binary);
    out << "this is not a table file at all";
  }
  EXPECT_EQ(Table::LoadBinary(garbage).status().code(),
            absl::StatusCode::kInvalidArgument);

  // A valid file cut short by one byte.
  const uint64_t keys[] = {1, 2};
  const float g[] = {1, 2};
  table->Push(0, keys, g, 1.0f);
  const std::string good = TempPath("good.bin");
  ASSERT_TRUE(table->SaveBinary(good, nullptr).ok());
  std::string bytes = ReadFile(good);
  {
    std::ofstream out(garbage, std::ios::binary | std::ios::trunc);
    out.write(bytes.data(), bytes.size() - 1);
  }
  auto truncated = Table::LoadBinary(garbage);
  EXPECT_EQ(truncated.status().code(), absl::StatusCode::kDataLoss)
      << truncated.status();
  // Another version.
  bytes[4] = 9;
  {
    std::ofstream out(garbage, std::ios::binary | std::ios::trunc);
    out.write(bytes.data(), bytes.size());
  }
  EXPECT_EQ(Table::LoadBinary(garbage).status().code(),
            absl::StatusCode::kUnimplemented);
  std::remove(garbage.c_str());
  std::remove(good.c_str());
}

TEST(GradAccumulatorTest, EqualsApplyingTheSummedGradient) {
  TableSpec spec = PlainSgd(2);
  spec.optimizer.name = "adagrad";
  spec.optimizer.l1 = 0.01;
  spec.optimizer.l2 = 0.1;
  auto via_acc = MakeTable(spec, 2);
  auto direct = MakeTable(spec, 2);

  // Three workers' pushes for one clock (range 0 and 1), overlapping keys,
  // in unsorted order within a worker.
  const std::vector<uint64_t> w0_r0 = {5, 1}, w1_r0 = {1, 9}, w2_r1 = {50};
  const std::vector<float> g0 = {0.1f, 0.2f, 0.3f, 0.4f};
  const std::vector<float> g1 = {1.5f, -0.7f, 0.9f, 0.01f};
  const std::vector<float> g2 = {-3.0f, 2.0f};
  const std::vector<uint64_t> w0_r1 = {50};
  const std::vector<float> g3 = {0.125f, 0.0625f};

  GradAccumulator acc(2, 2);
  acc.Add(0, w0_r0, g0.data());
  acc.Add(1, w0_r1, g3.data());
  acc.Add(0, w1_r0, g1.data());
  acc.Add(1, w2_r1, g2.data());
  EXPECT_EQ(acc.pending_keys(), 4u);
  acc.ApplyTo(via_acc.get(), 1.0f / 3);
  EXPECT_EQ(acc.pending_keys(), 0u);

  // The same sums, in the same per-key order, pushed directly.
  const uint64_t r0_keys[] = {1, 5, 9};
  const float r0_sums[] = {0.3f + 1.5f, 0.4f + -0.7f, 0.1f, 0.2f,
                           0.9f, 0.01f};
  const uint64_t r1_keys[] = {50};
  const float r1_sums[] = {0.125f + -3.0f, 0.0625f + 2.0f};
  direct->Push(0, r0_keys, r0_sums, 1.0f / 3);
  direct->Push(1, r1_keys, r1_sums, 1.0f / 3);
  EXPECT_EQ(via_acc->Snapshot(), direct->Snapshot());

  // A second clock reuses the cleared accumulator.
  acc.Add(0, w1_r0, g1.data());
  acc.ApplyTo(via_acc.get(), 1.0f);
  direct->Push(0, {1, 9}, g1.data(), 1.0f);
  EXPECT_EQ(via_acc->Snapshot(), direct->Snapshot());
}

TEST(GradAccumulatorTest, ResultIndependentOfKeyArrivalOrder) {
  // Pushes whose keys arrive in different orders (but with the same
  // per-key order of contributions) give bit-identical tables.
  TableSpec spec = PlainSgd();
  spec.optimizer.name = "ftrl";
  auto a = MakeTable(spec, 1);
  auto b = MakeTable(spec, 1);
  GradAccumulator acc_a(1, 1), acc_b(1, 1);
  const float ga[] = {0.1f, 0.7f, -0.3f};
  const float gb[] = {0.2f, -0.9f};
  acc_a.Add(0, {1, 2, 3}, ga);
  acc_a.Add(0, {3, 1}, gb);
  const float ga_rev[] = {-0.3f, 0.7f, 0.1f};
  const float gb_rev[] = {-0.9f, 0.2f};
  acc_b.Add(0, {3, 2, 1}, ga_rev);
  acc_b.Add(0, {1, 3}, gb_rev);
  acc_a.ApplyTo(a.get(), 0.5f);
  acc_b.ApplyTo(b.get(), 0.5f);
  EXPECT_EQ(a->Snapshot(), b->Snapshot());
  EXPECT_EQ(a->size(), 3u);
}

// One accumulator reused clock after clock (as ServerNode::ApplyBsp keeps
// one per table): each ApplyTo pushes only what was summed since the last,
// the ranges in ascending order whatever order they were summed in.
TEST(GradAccumulatorTest, ReusedAfterApplyPushesOnlyTheNewSums) {
  TableSpec spec = PlainSgd();
  auto t = MakeTable(spec, 4);
  GradAccumulator acc(1, 4);
  const float g[] = {1.0f, 2.0f};
  acc.Add(3, {30, 31}, g);
  acc.Add(1, {10}, g);
  std::string keys, sums;
  acc.ApplyTo(t.get(), 1.0f, &keys, &sums);
  const std::vector<uint64_t> first = {10, 30, 31};
  EXPECT_EQ(keys, std::string(reinterpret_cast<const char*>(first.data()),
                              first.size() * sizeof(uint64_t)));
  EXPECT_EQ(sums.size(), 3 * sizeof(float));
  EXPECT_EQ(acc.pending_keys(), 0u);
  keys.clear();
  sums.clear();
  acc.Add(2, {20}, g + 1);
  acc.ApplyTo(t.get(), 1.0f, &keys, &sums);
  const uint64_t second = 20;
  EXPECT_EQ(keys, std::string(reinterpret_cast<const char*>(&second),
                              sizeof(second)));
  ASSERT_EQ(sums.size(), sizeof(float));
  float sum;
  std::memcpy(&sum, sums.data(), sizeof(sum));
  EXPECT_EQ(sum, 2.0f);
  acc.ApplyTo(t.get(), 1.0f, &keys, &sums);  // nothing new: nothing pushed
  EXPECT_EQ(keys.size(), sizeof(second));
}

// The delta journal (replication by slot): a backup that takes every delta
// from the primary's journal, in order, holds the primary's partition byte
// for byte, whichever push path made the rows (by keys, by cached slots
// with keys the pull did not find, keys repeated within a push and across
// the pushes of one delta, new keys) and whichever apply loop updated them
// (FTRL's lanes at dim 1, a long SGD row, Adam's per-row rule).
struct JournalCase {
  const char* name;
  int dim;
  const char* optimizer;
  uint64_t dense_ids;
};

class JournalTest : public testing::TestWithParam<JournalCase> {};

TEST_P(JournalTest, DeltasFromTheJournalRebuildThePrimaryByteForByte) {
  const JournalCase& c = GetParam();
  TableSpec spec;
  spec.id = 3;
  spec.dim = c.dim;
  spec.optimizer.name = c.optimizer;
  spec.init_scale = std::string(c.optimizer) == "ftrl" ? 0 : 0.01;
  spec.dense_ids = c.dense_ids;
  constexpr int kRanges = 3;
  auto primary = MakeTable(spec, kRanges);
  auto backup = MakeTable(spec, kRanges);
  std::vector<uint32_t> synced(kRanges, 0);
  std::vector<uint64_t> generation(kRanges);
  for (int r = 0; r < kRanges; ++r) {
    primary->StartJournal(r);
    generation[r] = primary->Layout(r).generation;
  }
  uint64_t x = 99;
  auto next = [&x] {
    x = x * 6364136223846793005ULL + 1442695040888963407ULL;
    return x >> 33;
  };
  const size_t dim = static_cast<size_t>(c.dim);
  size_t rows_sent = 0;
  int by_bits = 0, by_list = 0;  // deltas naming their rows each way
  for (int round = 0; round < 40; ++round) {
    const int r = static_cast<int>(next() % kRanges);
    // Keys from a pool of 400 (new ones early, repeats later), ascending
    // but for every fifth push, which repeats keys within itself. The last
    // pushes have one key each: deltas of a few rows among many name them
    // by a list, the others mostly by a bitmap.
    const size_t n = round >= 32 ? 1 : 1 + next() % 120;
    std::vector<uint64_t> keys(n);
    for (auto& k : keys) k = FeatureKey(next() % (40 + 10 * round));
    if (round % 5 != 0) {
      std::sort(keys.begin(), keys.end());
      keys.erase(std::unique(keys.begin(), keys.end()), keys.end());
    }
    std::vector<float> grads(keys.size() * dim);
    for (auto& g : grads) g = static_cast<float>(next() % 200) / 100.0f - 1.0f;
    const KeyOrder order =
        round % 5 != 0 ? KeyOrder::kAscending : KeyOrder::kAny;
    bool journaled = false;
    if (round % 3 == 1) {
      // By slots a pull found (kNoSlot for keys not stored yet).
      std::vector<uint32_t> slots(keys.size());
      std::vector<float> out(keys.size() * dim);
      uint64_t gen = 0;
      primary->Pull(r, keys, out.data(), slots.data(), &gen);
      ASSERT_TRUE(primary->PushSlots(r, gen, keys, slots.data(), grads.data(),
                                     0.5f, order, nullptr, &journaled));
    } else {
      primary->Push(r, keys, grads.data(), 0.5f, nullptr, nullptr, order,
                    &journaled);
    }
    EXPECT_TRUE(journaled);
    if (round % 4 != 3) continue;  // several pushes in one delta
    for (int d = 0; d < kRanges; ++d) {
      Table::DeltaRows delta;
      ASSERT_TRUE(primary->TakeJournal(d, generation[d], synced[d], &delta));
      EXPECT_EQ(delta.base_slots, synced[d]);
      EXPECT_EQ(delta.num_slots, primary->Layout(d).slots);
      const auto slots = ViewAs<uint32_t>(delta.slots);
      const auto new_keys = ViewAs<uint64_t>(delta.new_keys);
      EXPECT_TRUE(slots.empty() || delta.slot_bits.empty());
      by_bits += delta.slot_bits.empty() ? 0 : 1;
      by_list += slots.empty() ? 0 : 1;
      EXPECT_EQ(new_keys.size(), delta.num_slots - delta.base_slots);
      EXPECT_EQ(delta.entries.size(),
                delta.rows() * backup->entry_floats() * sizeof(float));
      // Each row once.
      std::vector<uint32_t> sorted(slots.begin(), slots.end());
      std::sort(sorted.begin(), sorted.end());
      EXPECT_EQ(std::adjacent_find(sorted.begin(), sorted.end()),
                sorted.end());
      ASSERT_TRUE(backup
                      ->CheckDelta(d, slots, ViewAs<uint64_t>(delta.slot_bits),
                                   delta.base_slots, backup->Layout(d).digest)
                      .ok());
      backup->ImportDelta(d, slots, ViewAs<uint64_t>(delta.slot_bits), new_keys,
                          reinterpret_cast<const float*>(delta.entries.data()));
      EXPECT_EQ(backup->Layout(d).digest, delta.digest);
      synced[d] = delta.num_slots;
      rows_sent += delta.rows();
    }
  }
  EXPECT_GT(rows_sent, 0u);
  EXPECT_GT(by_bits, 0);
  EXPECT_GT(by_list, 0);
  for (int r = 0; r < kRanges; ++r) {
    std::vector<uint64_t> pk, bk;
    std::vector<float> pe, be;
    Table::DeltaRows rest;
    ASSERT_TRUE(primary->TakeJournal(r, generation[r], synced[r], &rest));
    backup->ImportDelta(r, ViewAs<uint32_t>(rest.slots),
                        ViewAs<uint64_t>(rest.slot_bits),
                        ViewAs<uint64_t>(rest.new_keys),
                        reinterpret_cast<const float*>(rest.entries.data()));
    primary->ExportRange(r, &pk, &pe);
    backup->ExportRange(r, &bk, &be);
    EXPECT_EQ(pk, bk) << "range " << r;
    ASSERT_EQ(pe.size(), be.size());
    EXPECT_EQ(std::memcmp(pe.data(), be.data(), pe.size() * sizeof(float)), 0)
        << "range " << r;
  }
}

INSTANTIATE_TEST_SUITE_P(
    Rules, JournalTest,
    testing::Values(JournalCase{"FtrlDim1", 1, "ftrl", 0},
                    JournalCase{"FtrlDim1DenseIds", 1, "ftrl", 4096},
                    JournalCase{"AdamDim3", 3, "adam", 0},
                    JournalCase{"SgdLongRows", 300, "sgd", 0}),
    [](const testing::TestParamInfo<JournalCase>& info) {
      return info.param.name;
    });

TEST(TableTest, JournalIsTakenOnlyWhereItCoversThePushes) {
  auto table = MakeTable(PlainSgd(), 2);
  const std::vector<uint64_t> keys = {1, 2, 3};
  const std::vector<float> grads = {1, 1, 1};
  Table::DeltaRows delta;
  const uint64_t gen = table->Layout(0).generation;
  // Off: nothing recorded, nothing to take.
  bool journaled = true;
  table->Push(0, keys, grads.data(), 1.0f, nullptr, nullptr, KeyOrder::kAny,
              &journaled);
  EXPECT_FALSE(journaled);
  EXPECT_FALSE(table->TakeJournal(0, gen, 0, &delta));
  // On at 3 slots: a take from another base, or after the range was
  // cleared or written otherwise than by a push, is refused.
  table->StartJournal(0);
  EXPECT_FALSE(table->TakeJournal(0, gen, 0, &delta));
  ASSERT_TRUE(table->TakeJournal(0, gen, 3, &delta));
  EXPECT_EQ(delta.rows(), 0u);
  table->Push(0, {4}, grads.data(), 1.0f, nullptr, nullptr, KeyOrder::kAny,
              &journaled);
  EXPECT_TRUE(journaled);
  ASSERT_TRUE(table->TakeJournal(0, gen, 3, &delta));
  EXPECT_EQ(delta.rows(), 1u);
  EXPECT_EQ(delta.new_keys.size(), sizeof(uint64_t));
  EXPECT_EQ(delta.num_slots, 4u);
  const std::vector<float> entry = {-2};
  table->ImportRange(0, {9}, entry.data());
  EXPECT_FALSE(table->TakeJournal(0, gen, 4, &delta));
  table->StartJournal(0);
  table->ClearRange(0);
  EXPECT_FALSE(
      table->TakeJournal(0, table->Layout(0).generation, 0, &delta));
  // The other range never had one.
  EXPECT_FALSE(table->TakeJournal(1, table->Layout(1).generation, 0, &delta));
  // A push not asked to record stops it.
  const uint64_t gen1 = table->Layout(1).generation;
  table->StartJournal(1);
  table->Push(1, {5}, grads.data(), 1.0f);
  EXPECT_FALSE(table->TakeJournal(1, gen1, 0, &delta));
}

// A journal's size is its partition's however long no delta is taken: one
// row of a dense table pushed again and again stays one row of the delta,
// as it is after the last push, and the journal stays on.
TEST(TableTest, JournalOfOneRowPushedAgainAndAgainIsOneRow) {
  constexpr int kDim = 1000;
  constexpr int kPushes = 5000;  // 20 MB of rows, had each been recorded
  auto table = MakeTable(PlainSgd(kDim), 1);
  const std::vector<float> grads(kDim, 1.0f);
  const uint64_t gen = table->Layout(0).generation;
  table->StartJournal(0);
  bool journaled = false;
  table->Push(0, {42}, grads.data(), 1.0f, nullptr, nullptr, KeyOrder::kAny,
              &journaled);
  ASSERT_TRUE(journaled);
  Table::DeltaRows delta;
  ASSERT_TRUE(table->TakeJournal(0, gen, 0, &delta));
  EXPECT_EQ(delta.rows(), 1u) << "the new key's row";
  EXPECT_EQ(delta.slots.size(), 0u);
  EXPECT_EQ(delta.new_keys.size(), sizeof(uint64_t));
  for (int i = 0; i < kPushes; ++i) {
    table->Push(0, {42}, grads.data(), 1.0f, nullptr, nullptr, KeyOrder::kAny,
                &journaled);
    ASSERT_TRUE(journaled) << i;
  }
  ASSERT_TRUE(table->TakeJournal(0, gen, 1, &delta));
  EXPECT_EQ(delta.rows(), 1u) << "one row, as it is now";
  ASSERT_EQ(delta.slots.size(), sizeof(uint32_t));
  EXPECT_EQ(ViewAs<uint32_t>(delta.slots)[0], 0u);
  EXPECT_EQ(delta.new_keys.size(), 0u);
  ASSERT_EQ(delta.entries.size(), kDim * sizeof(float));
  std::vector<float> value(kDim);
  table->Pull(0, {42}, value.data());
  EXPECT_EQ(value[0], -static_cast<float>(kPushes + 1)) << "every push applied";
  EXPECT_EQ(std::memcmp(delta.entries.data(), value.data(),
                        kDim * sizeof(float)),
            0);
  // Nothing pushed since: an empty delta.
  ASSERT_TRUE(table->TakeJournal(0, gen, 1, &delta));
  EXPECT_EQ(delta.rows(), 0u);
}

// The marked rows come in slot order whatever the pushes' order, and a
// bit marked at slot 64 * k + 63 (a word's last) or past the base is
// neither lost nor sent twice.
TEST(TableTest, JournalTakesMarkedRowsInSlotOrder) {
  auto table = MakeTable(PlainSgd(), 1);
  std::vector<uint64_t> keys(200);
  for (size_t i = 0; i < keys.size(); ++i) keys[i] = 1000 + i;
  std::vector<float> grads(keys.size(), 1.0f);
  table->Push(0, keys, grads.data(), 1.0f);  // slots 0 .. 199
  const uint64_t gen = table->Layout(0).generation;
  table->StartJournal(0);
  const std::vector<uint64_t> touched = {1190, 1063, 1000, 1127, 1064, 1128};
  const std::vector<uint64_t> made = {7, 5};  // slots 200, 201
  bool journaled = false;
  for (uint64_t k : touched) {
    table->Push(0, {k}, grads.data(), 1.0f, nullptr, nullptr, KeyOrder::kAny,
                &journaled);
    ASSERT_TRUE(journaled);
  }
  table->Push(0, made, grads.data(), 1.0f, nullptr, nullptr, KeyOrder::kAny,
              &journaled);
  table->Push(0, {1063}, grads.data(), 1.0f, nullptr, nullptr, KeyOrder::kAny,
              &journaled);
  Table::DeltaRows delta;
  ASSERT_TRUE(table->TakeJournal(0, gen, 200, &delta));
  const auto slots = ViewAs<uint32_t>(delta.slots);
  EXPECT_EQ(std::vector<uint32_t>(slots.begin(), slots.end()),
            (std::vector<uint32_t>{0, 63, 64, 127, 128, 190}));
  EXPECT_EQ(delta.num_slots, 202u);
  const auto new_keys = ViewAs<uint64_t>(delta.new_keys);
  EXPECT_EQ(std::vector<uint64_t>(new_keys.begin(), new_keys.end()),
            (std::vector<uint64_t>{7, 5}))
      << "in the order they were made";
  const auto entries = ViewAs<float>(delta.entries);
  ASSERT_EQ(entries.size(), 8u);
  EXPECT_EQ(entries[1], -3.0f) << "slot 63 (key 1063): pushed thrice";
  EXPECT_EQ(entries[0], -2.0f);
}

// The journal marks exactly the slots pushed, whatever their runs: runs of
// every length around MarkJournal's first 4 slots and 8-slot steps, broken
// anywhere in a step, at word boundaries and not.
TEST(TableTest, JournalMarksRunsOfEveryLength) {
  auto table = MakeTable(PlainSgd(), 1);
  constexpr size_t kSlots = 3000;
  std::vector<uint64_t> all(kSlots);
  for (size_t i = 0; i < kSlots; ++i) all[i] = 100000 + i;
  std::vector<float> grads(kSlots, 1.0f);
  table->Push(0, all, grads.data(), 1.0f);  // key 100000 + s at slot s
  const uint64_t gen = table->Layout(0).generation;
  std::mt19937_64 rng(23);
  for (int trial = 0; trial < 20; ++trial) {
    SCOPED_TRACE(trial);
    table->StartJournal(0);
    std::vector<uint32_t> want;
    std::vector<uint64_t> keys;
    for (uint32_t slot = static_cast<uint32_t>(rng() % 70); slot < kSlots;) {
      const size_t lens[] = {1, 2, 3, 4, 5, 8, 11, 12, 13, 19, 20, 21, 64, 70};
      const uint32_t len = static_cast<uint32_t>(lens[rng() % 14]);
      for (uint32_t j = 0; j < len && slot + j < kSlots; ++j) {
        want.push_back(slot + j);
        keys.push_back(100000 + slot + j);
      }
      slot += len + 1 + static_cast<uint32_t>(rng() % 3);
    }
    bool journaled = false;
    table->Push(0, keys, grads.data(), 1.0f, nullptr, nullptr,
                KeyOrder::kAscending, &journaled);
    ASSERT_TRUE(journaled);
    Table::DeltaRows delta;
    ASSERT_TRUE(table->TakeJournal(0, gen, kSlots, &delta));
    std::vector<uint32_t> got;
    if (!delta.slot_bits.empty()) {
      const auto words = ViewAs<uint64_t>(delta.slot_bits);
      for (size_t w = 0; w < words.size(); ++w) {
        for (uint64_t b = words[w]; b != 0; b &= b - 1) {
          got.push_back(static_cast<uint32_t>(w * 64 + __builtin_ctzll(b)));
        }
      }
    } else {
      const auto slots = ViewAs<uint32_t>(delta.slots);
      got.assign(slots.begin(), slots.end());
    }
    EXPECT_EQ(got, want);
  }
}

// Rows by slot go in runs of consecutive slots within a chunk; a delta in
// any order is written row by row as given (a repeated slot: its last row),
// and runs stop at a chunk's end (rows of dim 300: 32 slots a chunk).
TEST(TableTest, DeltaRowsGoInRunsWithinChunks) {
  constexpr int kDim = 300;
  auto primary = MakeTable(PlainSgd(kDim), 1);
  auto backup = MakeTable(PlainSgd(kDim), 1);
  std::vector<uint64_t> keys(100);
  for (size_t i = 0; i < keys.size(); ++i) keys[i] = 500 + i;
  std::vector<float> grads(keys.size() * kDim);
  for (size_t i = 0; i < grads.size(); ++i) grads[i] = static_cast<float>(i);
  primary->Push(0, keys, grads.data(), 1.0f);
  std::vector<float> zeros(keys.size() * kDim, 0.0f);
  backup->ImportRange(0, keys, zeros.data());
  const uint64_t gen = primary->Layout(0).generation;
  primary->StartJournal(0);
  // Slots 10 .. 80 (across the chunks at 32 and 64), and 95.
  std::vector<uint64_t> some(keys.begin() + 10, keys.begin() + 81);
  some.push_back(keys[95]);
  bool journaled = false;
  primary->Push(0, some, grads.data(), 0.5f, nullptr, nullptr,
                KeyOrder::kAscending, &journaled);
  ASSERT_TRUE(journaled);
  Table::DeltaRows delta;
  ASSERT_TRUE(primary->TakeJournal(0, gen, 100, &delta));
  ASSERT_EQ(delta.rows(), some.size());
  // 72 rows of 100 slots: named by a bitmap.
  EXPECT_TRUE(delta.slots.empty());
  EXPECT_EQ(delta.slot_bits.size(), 2 * sizeof(uint64_t));
  backup->ImportDelta(0, ViewAs<uint32_t>(delta.slots),
                      ViewAs<uint64_t>(delta.slot_bits), {},
                      reinterpret_cast<const float*>(delta.entries.data()));
  std::vector<float> want(keys.size() * kDim), got(keys.size() * kDim);
  primary->Pull(0, some, want.data());
  backup->Pull(0, some, got.data());
  EXPECT_EQ(want, got);
  backup->Pull(0, {keys[9], keys[81]}, got.data());
  EXPECT_EQ(got[0], 0.0f) << "untouched rows stay";
  EXPECT_EQ(got[kDim], 0.0f);
  // Out of order, a slot twice: as given, row after row.
  const std::vector<uint32_t> slots = {2, 3, 4, 7, 6, 7, 31, 32};
  std::vector<float> rows(slots.size() * kDim);
  for (size_t i = 0; i < slots.size(); ++i) {
    std::fill(rows.begin() + i * kDim, rows.begin() + (i + 1) * kDim,
              static_cast<float>(i + 1));
  }
  backup->ImportDelta(0, slots, {}, {}, rows.data());
  const std::vector<float> expect = {1, 2, 3, 5, 6, 7, 8};  // slots 2 3 4 6 7 31 32
  std::vector<uint64_t> at = {keys[2], keys[3], keys[4], keys[6],
                              keys[7], keys[31], keys[32]};
  backup->Pull(0, at, got.data());
  for (size_t i = 0; i < at.size(); ++i) {
    EXPECT_EQ(got[i * kDim], expect[i]) << "slot of key " << at[i];
    EXPECT_EQ(got[i * kDim + kDim - 1], expect[i]);
  }
}

// A key list pushed again finds the slots its first push made, in key
// order: consecutive, so the lanes load and store whole vectors
// (FtrlLanesConsecutive). Groups that cross a chunk's end, and groups of
// slots out of order, take the general lanes. All bit for bit the scalar
// rule's, a non-finite update left out as everywhere.
TEST(TableTest, DimOneFtrlOnConsecutiveSlotsEqualsTheScalarRule) {
  TableSpec spec;
  spec.dim = 1;
  spec.optimizer.name = "ftrl";
  spec.optimizer.alpha = 0.1;
  spec.optimizer.beta = 1.0;
  spec.optimizer.l1 = 0.5;
  spec.optimizer.l2 = 0.01;
  auto table = MakeTable(spec, 1);
  auto rule_or = Optimizer::Create(spec.optimizer);
  ASSERT_TRUE(rule_or.ok()) << rule_or.status();
  const Optimizer& rule = **rule_or;
  std::map<uint64_t, std::array<float, 3>> expected;  // [w, z, n]
  // by_slots 0: by keys; 1: by slots; 2: by slots vouched complete and
  // consecutive.
  auto push = [&](const std::vector<uint64_t>& keys,
                  const std::vector<float>& grads, uint32_t* slots,
                  uint64_t* generation, int by_slots) {
    if (by_slots != 0) {
      ASSERT_TRUE(table->PushSlots(0, *generation, keys, slots, grads.data(),
                                   0.5f, KeyOrder::kAscending, nullptr, nullptr,
                                   by_slots == 2, nullptr, by_slots == 2));
    } else {
      table->Push(0, keys, grads.data(), 0.5f, slots, generation,
                  KeyOrder::kAscending);
    }
    for (size_t i = 0; i < keys.size(); ++i) {
      auto& e = expected[keys[i]];
      rule.Apply(&e[0], &e[1], &grads[i], 0.5f, 1);
    }
  };
  uint64_t x = 777;
  auto grads_for = [&x](size_t n) {
    std::vector<float> g(n);
    for (float& v : g) {
      x = x * 6364136223846793005ULL + 1442695040888963407ULL;
      v = static_cast<float>(static_cast<int64_t>((x >> 33) % 2001) - 1000) /
          250.0f;
    }
    return g;
  };
  // Slot 0 first, so that the list's groups of 16 (slots 1-16, 17-32, ...)
  // do not start at a chunk's start: 4096 slots a chunk at dim 1 (16384
  // floats), so one group holds slots 4081-4096 and crosses the end.
  const std::vector<uint64_t> first = {1};
  std::vector<uint32_t> first_slot(1);
  uint64_t gen = 0;
  push(first, grads_for(1), first_slot.data(), &gen, 0);
  std::vector<uint64_t> keys;
  for (uint64_t k = 10; k < 10 + 3 * 4200; k += 3) keys.push_back(k);
  std::vector<uint32_t> slots(keys.size());
  push(keys, grads_for(keys.size()), slots.data(), &gen, 0);
  for (size_t i = 0; i < slots.size(); ++i) {
    ASSERT_EQ(slots[i], i + 1) << "the list's slots are not consecutive";
  }
  // Rounds by keys, by slots, and by slots vouched consecutive (each
  // chunk's run in one call: slots 1-4095, a chunk's end short of a group,
  // then 4096-4200).
  for (int round = 0; round < 6; ++round) {
    std::vector<float> g = grads_for(keys.size());
    if (round == 2) g[40] = g[4090] = 1e20f;  // g^2 = inf: left out
    if (round == 5) g[4094] = 1e20f;          // in a run's last keys
    push(keys, g, slots.data(), &gen, round % 3);
  }
  // Vouched consecutive but not (the list's last 300 keys, slots 3901-4200):
  // would run past the slots, so taken slot by slot.
  {
    std::vector<uint64_t> tail(keys.end() - 300, keys.end());
    std::vector<uint32_t> tail_slots(slots.end() - 300, slots.end());
    std::reverse(tail.begin(), tail.end());
    std::reverse(tail_slots.begin(), tail_slots.end());
    push(tail, grads_for(tail.size()), tail_slots.data(), &gen, 2);
  }
  // Every other key of the list: slots 1, 3, 5, ... (not consecutive), and
  // the list with new keys among it (new slots at the end).
  std::vector<uint64_t> odd;
  for (size_t i = 0; i < keys.size(); i += 2) odd.push_back(keys[i]);
  push(odd, grads_for(odd.size()), nullptr, nullptr, 0);
  std::vector<uint64_t> mixed = keys;
  for (uint64_t k = 11; k < 11 + 3 * 100; k += 3) mixed.push_back(k);
  std::sort(mixed.begin(), mixed.end());
  push(mixed, grads_for(mixed.size()), nullptr, nullptr, 0);
  EXPECT_EQ(table->non_finite_updates(), 3u);

  std::vector<uint64_t> got_keys;
  std::vector<float> got;
  table->ExportRange(0, &got_keys, &got);
  ASSERT_EQ(got_keys.size(), expected.size());
  for (size_t i = 0; i < got_keys.size(); ++i) {
    const auto& e = expected.at(got_keys[i]);
    for (int j = 0; j < 3; ++j) {
      ASSERT_EQ(std::memcmp(&got[3 * i + j], &e[j], sizeof(float)), 0)
          << "key " << got_keys[i] << " float " << j << ": " << got[3 * i + j]
          << " vs " << e[j];
    }
  }
}

// A long row's update split over a runner's threads by columns (Push's and
// PushSlots' `rows`) must store what one pass stores, value and state, bit
// for bit, whatever the rule: a row whose length is no multiple of a part's,
// a key repeated in the call, and elements whose update is not finite (left
// as they were, and counted alike).
TEST(TableTest, LongRowsSplitOverThreadsEqualOnePass) {
  ParallelRunner runner(3);
  const int dim = static_cast<int>(Table::kParallelRowFloats) * 2 + 37;
  for (const char* name : {"sgd", "adagrad", "ftrl", "adam"}) {
    SCOPED_TRACE(name);
    TableSpec spec;
    spec.dim = dim;
    spec.optimizer.name = name;
    spec.optimizer.learning_rate = 0.5;
    spec.optimizer.alpha = 0.1;
    spec.optimizer.beta = 1.0;
    spec.optimizer.l1 = 0.001;
    spec.optimizer.l2 = 0.01;
    auto one = MakeTable(spec, 2);
    auto split = MakeTable(spec, 2);
    const std::vector<uint64_t> keys = {3, 9, 9};  // 9 twice, in order
    uint64_t x = 99;
    auto next = [&x] {
      x = x * 6364136223846793005ULL + 1442695040888963407ULL;
      return x >> 33;
    };
    uint32_t slots_one[3], slots_split[3];
    uint64_t gen_one = 0, gen_split = 0;
    const int range = 1;
    for (int round = 0; round < 4; ++round) {
      std::vector<float> grads(keys.size() * static_cast<size_t>(dim));
      for (float& g : grads) {
        g = static_cast<float>(static_cast<int64_t>(next() % 2001) - 1000) /
            100.0f;
      }
      // Updates that are not finite, in different parts of the rows.
      grads[5] = 3e38f;
      grads[static_cast<size_t>(dim) + 70000] = -3e38f;
      grads[grads.size() - 1] = 3e38f;
      if (round < 2) {
        one->Push(range, keys, grads.data(), 2.0f, slots_one, &gen_one);
        split->Push(range, keys, grads.data(), 2.0f, slots_split, &gen_split,
                    KeyOrder::kAny, nullptr, &runner);
      } else {
        ASSERT_TRUE(one->PushSlots(range, gen_one, keys, slots_one,
                                   grads.data(), 2.0f));
        ASSERT_TRUE(split->PushSlots(range, gen_split, keys, slots_split,
                                     grads.data(), 2.0f, KeyOrder::kAny,
                                     nullptr, nullptr, false, &runner));
      }
      // The values after each round (the state shows in the next round's).
      std::vector<float> a(2 * static_cast<size_t>(dim));
      std::vector<float> b(a.size());
      one->Pull(range, {3, 9}, a.data());
      split->Pull(range, {3, 9}, b.data());
      ASSERT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0)
          << "round " << round;
    }
    EXPECT_GT(one->non_finite_updates(), 0u);
    EXPECT_EQ(split->non_finite_updates(), one->non_finite_updates());
  }
}

// A push checked for non-finite gradients (Push's and PushSlots'
// `non_finite`) updates bit for bit as one not checked, non-finite results
// counted alike; one with a NaN or infinity anywhere, a key repeated in it
// included, leaves every row bit for bit as it was. SGD on long rows is
// checked within the update's pass where the CPU has AVX2 or AVX-512 (rows
// of odd lengths, so that the kept old values start off their vector
// boundary; split over threads or not); the other rules (and every rule on
// other CPUs) by a pass before it.
TEST(TableTest, CheckedPushesEqualUncheckedOnesAndRefuseWhole) {
  ParallelRunner runner(3);
  struct Case {
    const char* optimizer;
    float l1;
    int dim;
  };
  const int split_dim = static_cast<int>(Table::kParallelRowFloats) * 2 + 37;
  for (const Case c :
       {Case{"sgd", 0.0f, 300}, Case{"sgd", 0.001f, 300},
        Case{"sgd", 0.0f, split_dim}, Case{"sgd", 0.001f, split_dim},
        // Old values over 16 MiB: freed after each push.
        Case{"sgd", 0.0f, (1 << 20) * 3 / 2 + 5}, Case{"adagrad", 0.001f, 300},
        Case{"ftrl", 0.001f, 5}, Case{"sgd", 0.0f, 3}}) {
    SCOPED_TRACE(absl::StrCat(c.optimizer, " l1 ", c.l1, " dim ", c.dim));
    TableSpec spec;
    spec.dim = c.dim;
    spec.optimizer.name = c.optimizer;
    spec.optimizer.learning_rate = 0.5;
    spec.optimizer.alpha = 0.1;
    spec.optimizer.beta = 1.0;
    spec.optimizer.l1 = c.l1;
    spec.optimizer.l2 = 0.01;
    auto plain = MakeTable(spec, 2);
    auto checked = MakeTable(spec, 2);
    const bool sgd_long = std::string(c.optimizer) == "sgd" &&
                          static_cast<size_t>(c.dim) >= Table::kLongRowFloats;
    if (!sgd_long) EXPECT_FALSE(checked->ChecksFiniteWhileApplying());
    ParallelRunner* rows = c.dim == split_dim ? &runner : nullptr;
    const std::vector<uint64_t> keys = {3, 9, 9};  // 9 twice, in order
    const size_t dim = static_cast<size_t>(c.dim);
    uint64_t x = 7;
    auto next = [&x] {
      x = x * 6364136223846793005ULL + 1442695040888963407ULL;
      return x >> 33;
    };
    uint32_t slots_plain[3], slots_checked[3];
    uint64_t gen_plain = 0, gen_checked = 0;
    const int range = 1;
    auto values = [&](Table* t) {
      std::vector<float> v(2 * dim);
      t->Pull(range, {3, 9}, v.data());
      return v;
    };
    auto push = [&](Table* t, const std::vector<float>& g, bool* non_finite,
                    int round) {
      uint32_t* slots = t == plain.get() ? slots_plain : slots_checked;
      uint64_t* gen = t == plain.get() ? &gen_plain : &gen_checked;
      if (round % 2 == 0) {
        t->Push(range, keys, g.data(), 2.0f, slots, gen, KeyOrder::kAny,
                nullptr, rows, non_finite);
      } else {
        ASSERT_TRUE(t->PushSlots(range, *gen, keys, slots, g.data(), 2.0f,
                                 KeyOrder::kAny, nullptr, nullptr, false, rows,
                                 false, non_finite));
      }
    };
    for (int round = 0; round < 4; ++round) {
      SCOPED_TRACE(absl::StrCat("round ", round));
      std::vector<float> grads(keys.size() * dim);
      for (float& g : grads) {
        g = static_cast<float>(static_cast<int64_t>(next() % 2001) - 1000) /
            100.0f;
      }
      // Finite gradients whose updates are not (counted, left as they were).
      grads[1] = 3e38f;
      grads[grads.size() - 1] = -3e38f;
      push(plain.get(), grads, nullptr, round);
      bool non_finite = true;
      push(checked.get(), grads, &non_finite, round);
      EXPECT_FALSE(non_finite);
      const std::vector<float> before = values(checked.get());
      ASSERT_EQ(std::memcmp(values(plain.get()).data(), before.data(),
                            before.size() * sizeof(float)),
                0);
      ASSERT_EQ(checked->non_finite_updates(), plain->non_finite_updates());
      // A bad value first, last, at a row's start and in its middle.
      for (size_t at :
           {size_t{0}, grads.size() - 1, dim, dim + dim / 2, 2 * dim + 1}) {
        if (at >= grads.size()) continue;
        std::vector<float> bad = grads;
        bad[at] = at % 2 == 0 ? std::numeric_limits<float>::quiet_NaN()
                              : -std::numeric_limits<float>::infinity();
        non_finite = false;
        push(checked.get(), bad, &non_finite, round);
        EXPECT_TRUE(non_finite) << "at " << at;
        ASSERT_EQ(std::memcmp(values(checked.get()).data(), before.data(),
                              before.size() * sizeof(float)),
                  0)
            << "at " << at;
        ASSERT_EQ(checked->non_finite_updates(), plain->non_finite_updates());
      }
    }
    EXPECT_GT(plain->non_finite_updates(), 0u);
  }
}

// Every implementation of the 16-lane FTRL update this CPU runs (the
// portable loop, AVX2, AVX-512), bit for bit FtrlRule::Apply entry by
// entry: both signs of z about l1, z of 0, new entries, and lanes whose
// result is not finite (a gradient of 1e20 squares to infinity, a NaN
// gradient, an infinite accumulator), which stay as they were; on one
// group of 16 entries and on runs of up to 4 groups (ApplyAt's runs of
// consecutive slots).
// Floats uniform in [lo, hi) from a seeded LCG: the kernel tests' inputs,
// the same on every run.
struct Uniform {
  uint64_t x;
  float operator()(float lo, float hi) {
    x = x * 6364136223846793005ULL + 1442695040888963407ULL;
    return lo + (hi - lo) * static_cast<float>(x >> 40) /
                    static_cast<float>(uint64_t{1} << 24);
  }
};

// Every implementation of the checked SGD update of a long row this CPU
// runs (portable, AVX2, AVX-512), bit for bit SgdRule::Apply element by
// element, with and without l1, on lengths and starts that leave elements
// before and after the vectors: the old values kept, the elements whose
// update is not finite counted and left, and a NaN or infinity anywhere
// reported, never past the row.
TEST(TableTest, SgdRowKeepingEqualsTheRuleBitForBit) {
  using table_internal::FtrlIsa;
  Uniform uniform{5};
  int ran = 0;
  for (FtrlIsa isa : {FtrlIsa::kPortable, FtrlIsa::kAvx2, FtrlIsa::kAvx512}) {
    if (!table_internal::CpuRunsFtrl(isa)) continue;
    ++ran;
    for (int trial = 0; trial < 400; ++trial) {
      SCOPED_TRACE(
          absl::StrCat("isa ", static_cast<int>(isa), " trial ", trial));
      optimizer_internal::SgdRule rule;
      rule.lr = 0.25f;
      rule.l1 = trial % 2 == 0 ? 0.0f : 0.3f;
      rule.l2 = trial % 3 == 0 ? 0.0f : 0.01f;
      const size_t n = static_cast<size_t>(trial) % 83;
      const size_t shift = static_cast<size_t>(trial / 83) % 16;  // old's start
      std::vector<float> w(n), g(n), old(n + 16 + 1, 9.0f);
      for (size_t i = 0; i < n; ++i) {
        w[i] = uniform(-2, 2);
        g[i] = uniform(-3, 3);
      }
      if (n > 3) {
        g[trial % n] = 3e38f;  // an update not finite
        w[(trial + 1) % n] = 0.0f;
        w[(trial + 2) % n] = rule.lr * rule.l1;  // at the threshold
      }
      const bool poisoned = n > 0 && trial % 4 == 1;
      if (poisoned) {
        g[(trial * 7) % n] = trial % 8 == 1
                                 ? std::numeric_limits<float>::quiet_NaN()
                                 : std::numeric_limits<float>::infinity();
      }
      std::vector<float> want = w;
      const size_t want_kept =
          rule.Apply(want.data(), nullptr, g.data(), 1.5f, n);
      std::vector<float> got = w;
      bool finite = true;
      const size_t kept = table_internal::SgdRowKeepingWith(
          isa, rule, got.data(), g.data(), 1.5f, n, old.data() + shift,
          &finite);
      ASSERT_EQ(kept, want_kept);
      ASSERT_EQ(finite, !poisoned);
      if (n > 0) {  // (memcmp of an empty vector's null data is undefined)
        ASSERT_EQ(std::memcmp(got.data(), want.data(), n * sizeof(float)), 0);
        ASSERT_EQ(std::memcmp(old.data() + shift, w.data(), n * sizeof(float)),
                  0);
      }
      ASSERT_EQ(old[shift + n], 9.0f);  // nothing past the row
    }
  }
  EXPECT_GE(ran, 1);
}

TEST(TableTest, FtrlKernelsEqualTheRuleBitForBit) {
  using table_internal::FtrlIsa;
  optimizer_internal::FtrlRule rule;
  rule.alpha = 0.1f;
  rule.beta = 1.0f;
  rule.l1 = 0.5f;
  rule.l2 = 0.01f;
  rule.inv_alpha = 1.0f / rule.alpha;
  constexpr size_t kLanes = table_internal::kFtrlGroup;
  constexpr size_t kMaxGroups = 4;
  Uniform uniform{99};
  int ran = 0;
  for (FtrlIsa isa : {FtrlIsa::kPortable, FtrlIsa::kAvx2, FtrlIsa::kAvx512}) {
    if (!table_internal::CpuRunsFtrl(isa)) continue;
    ++ran;
    size_t kept_total = 0;
    for (int trial = 0; trial < 500; ++trial) {
      const size_t groups = 1 + static_cast<size_t>(trial / 3) % kMaxGroups;
      const size_t lanes = kLanes * groups;
      std::array<float, 3 * kLanes * kMaxGroups> entries;
      std::array<float, kLanes * kMaxGroups> g;
      entries.fill(7.0f);  // past the run: must stay as it is
      for (size_t k = 0; k < lanes; ++k) {
        const bool fresh = trial % 5 == 0 && k % 3 == 0;
        entries[3 * k] = fresh ? 0.0f : uniform(-2, 2);
        entries[3 * k + 1] = fresh ? 0.0f : uniform(-1.5f, 1.5f);
        entries[3 * k + 2] = fresh ? 0.0f : uniform(0, 4);
        g[k] = uniform(-4, 4);
      }
      if (trial % 7 == 1) g[trial % lanes] = 1e20f;
      if (trial % 11 == 2) {
        g[(trial + 5) % lanes] = std::numeric_limits<float>::quiet_NaN();
      }
      if (trial % 13 == 3) {
        entries[3 * ((trial + 9) % lanes) + 2] =
            std::numeric_limits<float>::infinity();
      }
      const float scale = trial % 2 == 0 ? 0.5f : 1.0f;
      std::array<float, 3 * kLanes* kMaxGroups> want = entries;
      size_t want_kept = 0;
      for (size_t k = 0; k < lanes; ++k) {
        want_kept +=
            rule.Apply(&want[3 * k], &want[3 * k + 1], &g[k], scale, 1);
      }
      const size_t kept = table_internal::FtrlConsecutiveWith(
          isa, rule, entries.data(), g.data(), scale, groups);
      ASSERT_EQ(kept, want_kept) << "isa " << static_cast<int>(isa)
                                 << " trial " << trial;
      kept_total += kept;
      for (size_t i = 0; i < entries.size(); ++i) {
        ASSERT_EQ(std::memcmp(&entries[i], &want[i], sizeof(float)), 0)
            << "isa " << static_cast<int>(isa) << " trial " << trial
            << " groups " << groups << " float " << i << ": " << entries[i]
            << " vs " << want[i];
      }
    }
    EXPECT_GT(kept_total, 100u);  // the non-finite lanes were tested
  }
  EXPECT_GE(ran, 1);
}

// ForEachBitRun against the bits one by one: runs within a word, across
// words, through whole words, at both ends, none at all.
TEST(TableTest, ForEachBitRunGivesEveryMaximalRun) {
  uint64_t x = 5;
  auto next = [&x] {
    x = x * 6364136223846793005ULL + 1442695040888963407ULL;
    return x;
  };
  for (int trial = 0; trial < 300; ++trial) {
    const size_t n = trial % 7;
    std::vector<uint64_t> words(n);
    for (uint64_t& w : words) {
      switch (next() % 5) {
        case 0: w = 0; break;
        case 1: w = ~uint64_t{0}; break;
        case 2: w = next() & next(); break;  // sparse
        case 3: w = next() | next(); break;  // dense
        default: w = ~uint64_t{0} << (next() % 64); break;  // a top run
      }
    }
    std::vector<std::pair<uint64_t, uint64_t>> want;
    for (uint64_t b = 0; b < n * 64; ++b) {
      if (((words[b / 64] >> (b % 64)) & 1) == 0) continue;
      if (!want.empty() && want.back().second == b) {
        ++want.back().second;
      } else {
        want.emplace_back(b, b + 1);
      }
    }
    std::vector<std::pair<uint64_t, uint64_t>> got;
    ForEachBitRun(words.data(), n, [&](uint64_t first, uint64_t end) {
      got.emplace_back(first, end);
    });
    ASSERT_EQ(got, want) << "trial " << trial;
  }
}

// A delta whose bitmap names a slot at or past base_slots is refused.
TEST(TableTest, CheckDeltaRefusesBitsPastBaseSlots) {
  auto table = MakeTable(PlainSgd(), 1);
  std::vector<uint64_t> keys(70);
  for (size_t i = 0; i < keys.size(); ++i) keys[i] = 100 + i;
  std::vector<float> g(keys.size(), 1.0f);
  table->Push(0, keys, g.data(), 1.0f);
  const uint64_t digest = table->Layout(0).digest;
  const std::vector<uint64_t> ok = {~uint64_t{0}, (uint64_t{1} << 6) - 1};
  EXPECT_TRUE(table->CheckDelta(0, {}, ok, 70, digest).ok());
  const std::vector<uint64_t> at_base = {0, uint64_t{1} << 6};
  EXPECT_EQ(table->CheckDelta(0, {}, at_base, 70, digest).code(),
            absl::StatusCode::kDataLoss);
  const std::vector<uint64_t> word_past = {0, 0, 1};
  EXPECT_EQ(table->CheckDelta(0, {}, word_past, 70, digest).code(),
            absl::StatusCode::kDataLoss);
}

// SGD rows lie end to end (no state): ApplyAt updates a run of consecutive
// slots with one Apply over its floats. The same bits as the rule key by key,
// for runs that cross a chunk's end, keys that are not consecutive, a key
// repeated in a push, l1 on and off, and updates left out as not finite.
TEST(TableTest, SgdOnConsecutiveSlotsEqualsTheRuleKeyByKey) {
  for (int dim : {1, 3}) {
    for (float l1 : {0.0f, 0.05f}) {
      SCOPED_TRACE(absl::StrCat("dim ", dim, " l1 ", l1));
      TableSpec spec = PlainSgd(dim);
      spec.optimizer.l1 = l1;
      spec.optimizer.l2 = 0.01;
      auto table = MakeTable(spec, 1);
      auto rule_or = Optimizer::Create(spec.optimizer);
      ASSERT_TRUE(rule_or.ok()) << rule_or.status();
      const Optimizer& rule = **rule_or;
      std::map<uint64_t, std::vector<float>> expected;
      const size_t d = static_cast<size_t>(dim);
      auto push = [&](const std::vector<uint64_t>& keys,
                      const std::vector<float>& grads, KeyOrder order) {
        table->Push(0, keys, grads.data(), 0.5f, nullptr, nullptr, order);
        for (size_t i = 0; i < keys.size(); ++i) {
          auto& e = expected[keys[i]];
          e.resize(d, 0.0f);
          rule.Apply(e.data(), nullptr, &grads[i * d], 0.5f, d);
        }
      };
      uint64_t x = 99;
      auto grads_for = [&x, d](size_t n) {
        std::vector<float> g(n * d);
        for (float& v : g) {
          x = x * 6364136223846793005ULL + 1442695040888963407ULL;
          v = static_cast<float>(static_cast<int64_t>((x >> 33) % 2001) -
                                 1000) /
              250.0f;
        }
        return g;
      };
      // Slot 0 first, then a list made in order (slots 1, 2, ...) long
      // enough to cross a chunk's end.
      push({1}, grads_for(1), KeyOrder::kAscending);
      std::vector<uint64_t> keys;
      for (uint64_t k = 10; k < 10 + 3 * 20000; k += 3) keys.push_back(k);
      push(keys, grads_for(keys.size()), KeyOrder::kAscending);
      for (int round = 0; round < 3; ++round) {
        std::vector<float> g = grads_for(keys.size());
        if (round == 1) {  // not finite: left out
          g[40 * d] = g[4090 * d] = std::numeric_limits<float>::infinity();
        }
        push(keys, g, KeyOrder::kAscending);
      }
      // By the list's slots (1, 2, ...), vouched complete and consecutive:
      // the runs by chunks, no slot read but the first.
      {
        std::vector<uint32_t> slots(keys.size());
        uint64_t gen = 0;
        table->Pull(0, keys, std::vector<float>(keys.size() * d).data(),
                    slots.data(), &gen);
        for (size_t i = 0; i < slots.size(); ++i) {
          ASSERT_EQ(slots[i], i + 1) << "the list's slots are not consecutive";
        }
        const std::vector<float> g = grads_for(keys.size());
        ASSERT_TRUE(table->PushSlots(0, gen, keys, slots.data(), g.data(), 0.5f,
                                     KeyOrder::kAscending, nullptr, nullptr,
                                     true, nullptr, true));
        for (size_t i = 0; i < keys.size(); ++i) {
          rule.Apply(expected[keys[i]].data(), nullptr, &g[i * d], 0.5f, d);
        }
      }
      std::vector<uint64_t> odd;
      for (size_t i = 0; i < keys.size(); i += 2) odd.push_back(keys[i]);
      push(odd, grads_for(odd.size()), KeyOrder::kAscending);
      // A key twice (not ascending): updated twice, in order.
      std::vector<uint64_t> again = {keys[5], keys[6], keys[6], keys[7]};
      push(again, grads_for(again.size()), KeyOrder::kAny);
      EXPECT_EQ(table->non_finite_updates(), 2u);
      std::vector<uint64_t> got_keys;
      std::vector<float> got;
      table->ExportRange(0, &got_keys, &got);
      ASSERT_EQ(got_keys.size(), expected.size());
      for (size_t i = 0; i < got_keys.size(); ++i) {
        const std::vector<float>& e = expected.at(got_keys[i]);
        ASSERT_EQ(std::memcmp(&got[i * d], e.data(), d * sizeof(float)), 0)
            << "key " << got_keys[i] << ": " << got[i * d] << " vs " << e[0];
      }
    }
  }
}

// Elements whose update would not be finite keep what they had, in the
// FTRL lanes (16 keys at a time) as in the rule one key at a time, and in
// SGD's long rows; the table counts them (optimizer.h).
TEST(TableTest, UpdatesThatWouldNotBeFiniteAreLeftOutAndCounted) {
  TableSpec spec;
  spec.dim = 1;
  spec.optimizer.name = "ftrl";
  spec.optimizer.alpha = 0.1;
  spec.optimizer.beta = 1.0;
  spec.optimizer.l1 = 0.01;
  auto table = MakeTable(spec, 1);
  auto rule_or = Optimizer::Create(spec.optimizer);
  ASSERT_TRUE(rule_or.ok());
  const Optimizer& rule = **rule_or;
  std::vector<uint64_t> keys;
  for (uint64_t k = 1; k <= 40; ++k) keys.push_back(k);  // lanes and a tail
  std::vector<float> ones(keys.size(), 1.0f);
  table->Push(0, keys, ones.data(), 1.0f, nullptr, nullptr,
              KeyOrder::kAscending);
  std::vector<std::array<float, 3>> expected(keys.size());
  for (auto& e : expected) rule.Apply(&e[0], &e[1], &ones[0], 1.0f, 1);
  std::vector<float> grads(keys.size(), -0.25f);
  for (size_t i : {0, 7, 15, 16, 33, 39}) grads[i] = 1e20f;  // g^2 = inf
  table->Push(0, keys, grads.data(), 1.0f, nullptr, nullptr,
              KeyOrder::kAscending);
  size_t left = 0;
  for (size_t i = 0; i < keys.size(); ++i) {
    left += rule.Apply(&expected[i][0], &expected[i][1], &grads[i], 1.0f, 1);
  }
  EXPECT_EQ(left, 6u);
  EXPECT_EQ(table->non_finite_updates(), 6u);
  std::vector<uint64_t> got_keys;
  std::vector<float> got;
  table->ExportRange(0, &got_keys, &got);
  ASSERT_EQ(got_keys, keys);
  for (size_t i = 0; i < keys.size(); ++i) {
    for (int j = 0; j < 3; ++j) {
      EXPECT_EQ(std::memcmp(&got[3 * i + j], &expected[i][j], sizeof(float)),
                0)
          << "key " << keys[i] << " float " << j;
      EXPECT_TRUE(std::isfinite(got[3 * i + j]));
    }
  }

  // SGD over a long row (lr 1): two elements of the row overflow.
  auto rows = MakeTable(PlainSgd(300), 1);
  const uint64_t key = 5;
  std::vector<float> g(300, 1.0f);
  rows->Push(0, absl::MakeConstSpan(&key, 1), g.data(), 1.0f);  // w = -1
  g[123] = -3e38f;
  g[200] = 3e38f;
  rows->Push(0, absl::MakeConstSpan(&key, 1), g.data(), 2.0f);
  EXPECT_EQ(rows->non_finite_updates(), 2u);
  std::vector<float> w(300);
  rows->Pull(0, absl::MakeConstSpan(&key, 1), w.data());
  for (size_t j = 0; j < w.size(); ++j) {
    EXPECT_EQ(w[j], j == 123 || j == 200 ? -1.0f : -3.0f) << j;
  }
}

}  // namespace
}  // namespace ps
