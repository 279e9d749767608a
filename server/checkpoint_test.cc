#include "server/checkpoint.h"

#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace ps {
namespace {

constexpr int kVnodes = 8;

std::string FreshDir(const std::string& name) {
  const std::string dir = absl::StrCat(::testing::TempDir(), "/ckpt_", name,
                                       "_", ::getpid());
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

// Adam keeps 3 state floats per element (m, v, step), and a non-zero
// init_scale makes the initial values differ from the optimizer's zeros.
TableSpec AdamSpec(int dim = 3) {
  TableSpec spec;
  spec.id = 0;
  spec.dim = dim;
  spec.optimizer.name = "adam";
  spec.optimizer.learning_rate = 0.05;
  spec.init_scale = 0.1f;
  return spec;
}

Routing Ring(int servers) {
  std::vector<int> ids;
  for (int s = 0; s < servers; ++s) ids.push_back(s);
  auto r = Routing::FromProto(BuildHashRing(ids, kVnodes, 1));
  EXPECT_TRUE(r.ok()) << r.status();
  return *r;
}

// One table per server of `routing`, as a job's servers hold them.
struct Shards {
  std::vector<std::vector<std::unique_ptr<Table>>> tables;  // [server][0]
};

Shards MakeShards(const Routing& routing, int servers,
                  const TableSpec& spec = AdamSpec()) {
  Shards out;
  out.tables.resize(servers);
  for (int s = 0; s < servers; ++s) {
    auto t = Table::Create(spec, routing.num_ranges());
    EXPECT_TRUE(t.ok()) << t.status();
    out.tables[s].push_back(std::move(*t));
  }
  return out;
}

// Pushes `rounds` random gradients to keys 0..num_keys-1, each to the table
// of the server that owns it.
void Train(const Routing& routing, Shards* shards, int num_keys, int rounds,
           uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> g(-1, 1);
  const int dim = shards->tables[0][0]->dim();
  for (int round = 0; round < rounds; ++round) {
    for (uint64_t k = 0; k < static_cast<uint64_t>(num_keys); ++k) {
      if (rng() % 3 == 0) continue;  // keys see different step counts
      const uint64_t key = k * 0x9e3779b97f4a7c15ULL;  // spread on the ring
      std::vector<float> grad(dim);
      for (float& x : grad) x = g(rng);
      const int range = routing.RangeOf(key);
      shards->tables[routing.OwnerOfRange(range)][0]->Push(range, {&key, 1},
                                                           grad.data(), 1.0f);
    }
  }
}

// Every key's entry (value + state) over all servers' tables.
std::map<uint64_t, std::vector<float>> Entries(const Shards& shards) {
  std::map<uint64_t, std::vector<float>> out;
  std::vector<uint64_t> keys;
  std::vector<float> entries;
  for (const auto& server : shards.tables) {
    const Table& t = *server[0];
    for (int r = 0; r < t.num_ranges(); ++r) {
      t.ExportRange(r, &keys, &entries);
      for (size_t i = 0; i < keys.size(); ++i) {
        EXPECT_EQ(out.count(keys[i]), 0u) << "key on two servers";
        out[keys[i]].assign(entries.begin() + i * t.entry_floats(),
                            entries.begin() + (i + 1) * t.entry_floats());
      }
    }
  }
  return out;
}

// Writes checkpoint `id` of all servers' tables under checkpoint_dir, as
// servers and scheduler do in a job; returns its folder.
std::string WriteCheckpoint(const std::string& checkpoint_dir, int64_t id,
                            const Routing& routing, const Shards& shards) {
  const std::string dir =
      absl::StrCat(checkpoint_dir, "/", CheckpointFolderName(id));
  std::filesystem::create_directories(dir);
  proto::CheckpointManifest m;
  m.set_checkpoint_id(id);
  m.set_num_servers(static_cast<int>(shards.tables.size()));
  for (size_t s = 0; s < shards.tables.size(); ++s) {
    proto::CheckpointHeader h;
    h.set_checkpoint_id(id);
    h.set_server_id(static_cast<int>(s));
    h.set_num_ranges(routing.num_ranges());
    h.add_worker_clocks(7);
    const std::vector<int> ranges = routing.RangesOf(static_cast<int>(s));
    EXPECT_TRUE(WriteCheckpointFile(dir, *shards.tables[s][0], ranges, h,
                                    m.add_files())
                    .ok());
  }
  EXPECT_TRUE(SyncDir(dir).ok());
  EXPECT_TRUE(WriteManifest(dir, m).ok());
  return dir;
}

void ExpectDataLossNaming(const absl::Status& s, const std::string& file) {
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  EXPECT_NE(s.message().find(file), std::string::npos)
      << s << "\nshould name " << file;
}

TEST(CheckpointTest, RoundTripKeepsValuesAndOptimizerStateExactly) {
  const std::string root = FreshDir("roundtrip");
  const Routing two = Ring(2);
  Shards before = MakeShards(two, 2);
  Train(two, &before, 500, 4, 1);
  const std::string dir = WriteCheckpoint(root, 1, two, before);

  auto file = ReadCheckpointFile(dir + "/" + CheckpointFileName(0, 1));
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ(file->header.format_version(), kCheckpointFormatVersion);
  EXPECT_EQ(file->header.server_id(), 1);
  EXPECT_EQ(file->header.dim(), 3);
  EXPECT_EQ(file->header.state_floats(), 3);
  EXPECT_EQ(file->header.optimizer().name(), "adam");
  EXPECT_EQ(file->header.worker_clocks_size(), 1);
  EXPECT_NE(file->header.consistency().find("per-range consistent"),
            std::string::npos);

  Shards after = MakeShards(two, 2);
  for (int s = 0; s < 2; ++s) {
    RestoreStats st;
    ASSERT_TRUE(RestoreCheckpoint(dir, s, two, after.tables[s], &st).ok());
    EXPECT_EQ(st.files, 2);
  }
  const auto want = Entries(before);
  EXPECT_GT(want.size(), 300u);
  EXPECT_EQ(Entries(after), want);  // bit-exact floats, values and state

  // Training continues exactly: the same pushes give the same bits.
  Train(two, &before, 500, 2, 2);
  Train(two, &after, 500, 2, 2);
  EXPECT_EQ(Entries(after), Entries(before));
  std::filesystem::remove_all(root);
}

TEST(CheckpointTest, TwoServersWroteThreeServersRead) {
  const std::string root = FreshDir("two_to_three");
  const Routing two = Ring(2);
  Shards before = MakeShards(two, 2);
  Train(two, &before, 600, 3, 3);
  const std::string dir = WriteCheckpoint(root, 4, two, before);

  const Routing three = Ring(3);
  Shards after = MakeShards(three, 3);
  int64_t loaded = 0;
  for (int s = 0; s < 3; ++s) {
    RestoreStats st;
    ASSERT_TRUE(RestoreCheckpoint(dir, s, three, after.tables[s], &st).ok());
    EXPECT_EQ(st.files, 2);  // every server reads every file
    loaded += st.keys_loaded;
    EXPECT_GT(st.keys_loaded, 0) << "S[" << s << "] got no key";
  }
  const auto want = Entries(before);
  EXPECT_EQ(loaded, static_cast<int64_t>(want.size()));
  EXPECT_EQ(Entries(after), want);
  // And each key sits with its new owner.
  std::vector<uint64_t> keys;
  std::vector<float> entries;
  for (int s = 0; s < 3; ++s) {
    for (int r = 0; r < three.num_ranges(); ++r) {
      after.tables[s][0]->ExportRange(r, &keys, &entries);
      if (!keys.empty()) EXPECT_EQ(three.OwnerOfRange(r), s);
    }
  }
  std::filesystem::remove_all(root);
}

TEST(CheckpointTest, FlippedByteIsDataLossNamingTheFile) {
  const std::string root = FreshDir("flip");
  const Routing two = Ring(2);
  Shards shards = MakeShards(two, 2);
  Train(two, &shards, 200, 2, 5);
  const std::string dir = WriteCheckpoint(root, 1, two, shards);
  const std::string name = CheckpointFileName(0, 0);
  const std::string path = dir + "/" + name;
  const auto size = std::filesystem::file_size(path);
  // The magic, the header, a key, a float, the checksum itself.
  for (uint64_t at : {uint64_t{1}, uint64_t{20}, size / 2, size - 10,
                      size - 1}) {
    SCOPED_TRACE(absl::StrCat("byte ", at, " of ", size));
    std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(static_cast<std::streamoff>(at));
    char c = 0;
    f.get(c);
    f.seekp(static_cast<std::streamoff>(at));
    f.put(static_cast<char>(c ^ 0x10));
    f.close();
    ExpectDataLossNaming(ReadCheckpointFile(path).status(), path);
    ExpectDataLossNaming(VerifyCheckpoint(dir, nullptr), name);
    Shards fresh = MakeShards(two, 2);
    ExpectDataLossNaming(
        RestoreCheckpoint(dir, 0, two, fresh.tables[0], nullptr), name);
    f.open(path, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(at));
    f.put(c);  // restore it for the next position
    f.close();
    EXPECT_TRUE(VerifyCheckpoint(dir, nullptr).ok());
  }
  std::filesystem::remove_all(root);
}

TEST(CheckpointTest, TruncatedIsDataLoss) {
  const std::string root = FreshDir("truncated");
  const Routing two = Ring(2);
  Shards shards = MakeShards(two, 2);
  Train(two, &shards, 200, 1, 6);
  const std::string dir = WriteCheckpoint(root, 1, two, shards);
  const std::string path = dir + "/" + CheckpointFileName(0, 1);
  const auto size = std::filesystem::file_size(path);
  for (uint64_t len : {size - 1, size - 4, size / 2, uint64_t{13},
                       uint64_t{3}, uint64_t{0}}) {
    SCOPED_TRACE(absl::StrCat("truncated to ", len));
    std::filesystem::resize_file(path, len);
    ExpectDataLossNaming(ReadCheckpointFile(path).status(), path);
    ExpectDataLossNaming(VerifyCheckpoint(dir, nullptr), path);
  }
  // A listed file that is gone is lost data too.
  std::filesystem::remove(path);
  ExpectDataLossNaming(VerifyCheckpoint(dir, nullptr), path);
  std::filesystem::remove_all(root);
}

TEST(CheckpointTest, MissingManifestIsNotACheckpoint) {
  const std::string root = FreshDir("manifest");
  const Routing two = Ring(2);
  Shards shards = MakeShards(two, 2);
  Train(two, &shards, 50, 1, 7);
  WriteCheckpoint(root, 1, two, shards);
  const std::string dir2 = WriteCheckpoint(root, 2, two, shards);
  ASSERT_TRUE(std::filesystem::remove(dir2 + "/" + kCheckpointManifestName));

  EXPECT_EQ(ReadManifest(dir2).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(VerifyCheckpoint(dir2, nullptr).code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(ListCheckpoints(root), std::vector<int64_t>{1});
  EXPECT_EQ(MaxCheckpointId(root), 2);
  auto latest = FindLatestCheckpoint(root);
  ASSERT_TRUE(latest.ok()) << latest.status();
  EXPECT_EQ(*latest, root + "/ckpt-1");
  EXPECT_EQ(FindLatestCheckpoint(root + "/none").status().code(),
            absl::StatusCode::kNotFound);

  // A manifest that does not parse is lost data.
  std::ofstream(root + "/ckpt-1/" + kCheckpointManifestName) << "files {{{";
  ExpectDataLossNaming(ReadManifest(root + "/ckpt-1").status(), "MANIFEST");
  std::filesystem::remove_all(root);
}

TEST(CheckpointTest, MismatchingTableIsRefused) {
  const std::string root = FreshDir("mismatch");
  const Routing two = Ring(2);
  Shards shards = MakeShards(two, 2);
  Train(two, &shards, 50, 1, 8);
  const std::string dir = WriteCheckpoint(root, 1, two, shards);
  TableSpec other = AdamSpec(/*dim=*/4);
  Shards wrong_dim = MakeShards(two, 2, other);
  ExpectDataLossNaming(
      RestoreCheckpoint(dir, 0, two, wrong_dim.tables[0], nullptr),
      CheckpointFileName(0, 0));
  other = AdamSpec();
  other.optimizer.name = "adagrad";
  other.optimizer.initial_accumulator = 0.1;
  Shards wrong_rule = MakeShards(two, 2, other);
  ExpectDataLossNaming(
      RestoreCheckpoint(dir, 1, two, wrong_rule.tables[1], nullptr),
      ".ckpt");
  std::filesystem::remove_all(root);
}

TEST(CheckpointTest, PruneKeepsTheNewestComplete) {
  const std::string root = FreshDir("prune");
  const Routing two = Ring(2);
  Shards shards = MakeShards(two, 2);
  for (int64_t id = 1; id <= 4; ++id) WriteCheckpoint(root, id, two, shards);
  std::filesystem::create_directories(root + "/ckpt-5");  // in progress
  ASSERT_TRUE(PruneCheckpoints(root, 2).ok());
  EXPECT_EQ(ListCheckpoints(root), (std::vector<int64_t>{3, 4}));
  EXPECT_TRUE(std::filesystem::exists(root + "/ckpt-5"));
  EXPECT_FALSE(std::filesystem::exists(root + "/ckpt-2"));
  std::filesystem::remove_all(root);
}

}  // namespace
}  // namespace ps
