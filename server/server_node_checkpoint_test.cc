// ServerNode's part of checkpoints (issue 9): Checkpoint() writes what a
// restarted job with another number of servers loads in Configure().
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/bytes.h"
#include "common/clock.h"
#include "common/routing.h"
#include "gtest/gtest.h"
#include "server/checkpoint.h"
#include "server/server_node.h"

namespace ps {
namespace {

constexpr int kVnodes = 8;

// `servers` servers, one worker, ASP, one adagrad table of dim 2 (state: one
// accumulator per element).
proto::ClusterView MakeView(int servers, const std::string& restore_from) {
  proto::ClusterView v;
  v.set_epoch(1);
  std::vector<int> ids;
  for (int i = 0; i < servers; ++i) ids.push_back(i);
  *v.mutable_routing() = BuildHashRing(ids, kVnodes, 1);
  for (int i = 0; i < servers; ++i) {
    proto::NodeInfo* s = v.mutable_routing()->add_servers();
    s->set_id(i);
    s->set_role(proto::ROLE_SERVER);
    s->set_state(proto::NODE_ALIVE);
  }
  proto::NodeInfo* w = v.add_workers();
  w->set_id(0);
  w->set_role(proto::ROLE_WORKER);
  w->set_state(proto::NODE_ALIVE);
  v.mutable_consistency()->set_mode(proto::MODE_ASP);
  v.mutable_consistency()->set_tau(-1);
  proto::TableConfig* t = v.add_tables();
  t->set_id(0);
  t->set_dim(2);
  t->mutable_optimizer()->set_name("adagrad");
  t->mutable_optimizer()->set_learning_rate(0.5f);
  t->mutable_optimizer()->set_initial_accumulator(0.1f);
  v.set_restore_from(restore_from);
  return v;
}

class ServerNodeCheckpointTest : public ::testing::Test {
 protected:
  ServerNodeCheckpointTest()
      : root_(absl::StrCat(::testing::TempDir(), "/node_ckpt_", ::getpid())) {
    std::filesystem::remove_all(root_);
  }
  ~ServerNodeCheckpointTest() override { std::filesystem::remove_all(root_); }

  std::vector<std::unique_ptr<ServerNode>> Cluster(int servers,
                                                   const std::string& from,
                                                   absl::Status* status) {
    std::vector<std::unique_ptr<ServerNode>> nodes;
    for (int s = 0; s < servers; ++s) {
      nodes.push_back(std::make_unique<ServerNode>(&clock_));
      absl::Status st = nodes.back()->Configure(s, MakeView(servers, from));
      if (!st.ok() && status->ok()) *status = st;
    }
    return nodes;
  }

  // Pushes a gradient to each of `keys` through the owning node.
  void PushAll(std::vector<std::unique_ptr<ServerNode>>& nodes, int servers,
               const std::vector<uint64_t>& keys, float g) {
    auto routing = Routing::FromProto(MakeView(servers, "").routing());
    ASSERT_TRUE(routing.ok());
    std::map<int, std::vector<uint64_t>> by_server;
    for (uint64_t k : keys) by_server[routing->ServerOf(k)].push_back(k);
    for (auto& [s, ks] : by_server) {
      proto::PushRequest r;
      r.set_worker_id(0);
      r.set_seq(++seq_[{servers, s}]);
      r.set_clock(0);
      r.set_epoch(1);
      r.set_table(0);
      PackTo<uint64_t>(r.mutable_keys(), ks);
      std::vector<float> vals;
      for (uint64_t k : ks) {  // a function of the key, not of the slicing
        vals.push_back(g + 0.01f * static_cast<float>(k % 7));
        vals.push_back(g - 0.02f * static_cast<float>(k % 5));
      }
      PackTo<float>(r.mutable_vals(), vals);
      r.set_num_examples(1);
      proto::PushResponse resp;
      absl::Status got = absl::UnknownError("not called");
      nodes[s]->Push(r, &resp, [&](const absl::Status& st) { got = st; });
      ASSERT_TRUE(got.ok()) << got;
    }
  }

  static std::map<uint64_t, std::vector<float>> Entries(
      const std::vector<std::unique_ptr<ServerNode>>& nodes) {
    std::map<uint64_t, std::vector<float>> out;
    std::vector<uint64_t> keys;
    std::vector<float> entries;
    for (const auto& n : nodes) {
      const Table* t = n->table(0);
      for (int r = 0; r < t->num_ranges(); ++r) {
        t->ExportRange(r, &keys, &entries);
        for (size_t i = 0; i < keys.size(); ++i) {
          out[keys[i]].assign(entries.begin() + i * t->entry_floats(),
                              entries.begin() + (i + 1) * t->entry_floats());
        }
      }
    }
    return out;
  }

  // Checkpoint `id` of every node, with its manifest (the scheduler's part).
  std::string Checkpoint(std::vector<std::unique_ptr<ServerNode>>& nodes,
                         int64_t id) {
    const std::string dir = absl::StrCat(root_, "/", CheckpointFolderName(id));
    proto::CheckpointManifest m;
    m.set_checkpoint_id(id);
    m.set_num_servers(static_cast<int>(nodes.size()));
    for (auto& n : nodes) {
      proto::CheckpointCommand cmd;
      cmd.set_dir(dir);
      cmd.set_checkpoint_id(id);
      proto::ServerControlResponse resp;
      absl::Status s = n->Checkpoint(cmd, &resp);
      EXPECT_TRUE(s.ok()) << s;
      EXPECT_EQ(resp.checkpoint_files_size(), 1);
      for (const auto& f : resp.checkpoint_files()) *m.add_files() = f;
    }
    EXPECT_TRUE(WriteManifest(dir, m).ok());
    return dir;
  }

  FakeClock clock_;
  const std::string root_;
  std::map<std::pair<int, int>, uint64_t> seq_;
};

std::vector<uint64_t> SomeKeys() {
  std::vector<uint64_t> keys;
  for (uint64_t k = 1; k <= 400; ++k) keys.push_back(k * 0x9e3779b97f4a7c15ULL);
  std::sort(keys.begin(), keys.end());
  return keys;
}

TEST_F(ServerNodeCheckpointTest, TwoWroteThreeRestoreEveryEntry) {
  absl::Status st;
  auto two = Cluster(2, "", &st);
  ASSERT_TRUE(st.ok()) << st;
  const std::vector<uint64_t> keys = SomeKeys();
  PushAll(two, 2, keys, 0.5f);
  PushAll(two, 2, std::vector<uint64_t>(keys.begin(), keys.begin() + 100),
          -0.25f);
  const std::string dir = Checkpoint(two, 1);

  auto three = Cluster(3, dir, &st);
  ASSERT_TRUE(st.ok()) << st;
  const auto want = Entries(two);
  ASSERT_EQ(want.size(), keys.size());
  EXPECT_EQ(Entries(three), want);  // values and adagrad accumulators
  for (const auto& n : three) EXPECT_GT(n->Status().keys(), 0);

  // Training continues from the state: the same push gives the same bits.
  PushAll(two, 2, keys, 0.125f);
  PushAll(three, 3, keys, 0.125f);
  EXPECT_EQ(Entries(three), Entries(two));
}

TEST_F(ServerNodeCheckpointTest, CorruptCheckpointIsRefusedNotLoaded) {
  absl::Status st;
  auto two = Cluster(2, "", &st);
  ASSERT_TRUE(st.ok()) << st;
  PushAll(two, 2, SomeKeys(), 1.0f);
  const std::string dir = Checkpoint(two, 1);
  const std::string file = dir + "/" + CheckpointFileName(0, 1);
  {
    std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(100);
    f.put('\x7f');
  }
  ServerNode node(&clock_);
  absl::Status s = node.Configure(0, MakeView(3, dir));
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  EXPECT_NE(s.message().find(file), std::string::npos) << s;
  // Not configured: requests are refused, nothing half-loaded is served.
  EXPECT_EQ(node.table(0), nullptr);
  proto::PullRequest pull;
  pull.set_epoch(1);
  proto::PullResponse resp;
  absl::Status got;
  node.Pull(pull, &resp, [&](const absl::Status& x) { got = x; });
  EXPECT_EQ(got.code(), absl::StatusCode::kUnavailable) << got;
}

TEST_F(ServerNodeCheckpointTest, CheckpointBeforeConfigureIsUnavailable) {
  ServerNode node(&clock_);
  proto::CheckpointCommand cmd;
  cmd.set_dir(root_ + "/x");
  proto::ServerControlResponse resp;
  EXPECT_EQ(node.Checkpoint(cmd, &resp).code(),
            absl::StatusCode::kUnavailable);
  cmd.clear_dir();
  EXPECT_EQ(node.Checkpoint(cmd, &resp).code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace ps
