// Checkpoints (issue 9) in a whole in-process job (LocalCluster): the
// scheduler's checkpoint through the in-process transport, and a job of 3
// servers resuming what a trained job of 2 servers checkpointed.
#include <unistd.h>

#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "gtest/gtest.h"
#include "server/checkpoint.h"
#include "tests/inproc_cluster.h"

namespace ps {
namespace {

// A small synthetic BSP job; adagrad keeps one state float per weight.
JobConfig Job(int servers, const std::string& checkpoint_dir) {
  JobConfig c;
  c.cluster.num_servers = servers;
  c.cluster.num_workers = 2;
  c.cluster.virtual_nodes = 16;
  c.consistency.mode = Mode::kBsp;
  c.consistency.pull_timeout_ms = 60000;
  c.optimizer.name = "adagrad";
  c.optimizer.learning_rate = 0.1;
  c.optimizer.initial_accumulator = 0.1;
  c.data.format = "synthetic";
  c.data.synthetic.train_rows = 10000;
  c.data.synthetic.test_rows = 2000;
  c.data.synthetic.features = 5000;
  c.data.synthetic.seed = 3;
  c.training.minibatch = 250;
  c.training.epochs = 1;
  c.training.progress_interval_s = 1000;
  c.fault_tolerance.checkpoint_dir = checkpoint_dir;
  return c;
}

// key -> value and optimizer state, over every server of the cluster.
std::map<uint64_t, std::vector<float>> Entries(const LocalCluster& c) {
  std::map<uint64_t, std::vector<float>> out;
  std::vector<uint64_t> keys;
  std::vector<float> entries;
  for (int s = 0; s < c.num_servers(); ++s) {
    const Table* t = c.server(s)->table(0);
    // Owned ranges only: with replication a backup holds copies too.
    for (int r : c.server(s)->OwnedRanges()) {
      t->ExportRange(r, &keys, &entries);
      for (size_t i = 0; i < keys.size(); ++i) {
        EXPECT_EQ(out.count(keys[i]), 0u) << "key on two servers";
        out[keys[i]].assign(entries.begin() + i * t->entry_floats(),
                            entries.begin() + (i + 1) * t->entry_floats());
      }
    }
  }
  return out;
}

TEST(CheckpointClusterTest, TwoServersCheckpointThreeServersResumeAndTrain) {
  InitLogging("T", "warn");
  const std::string dir =
      absl::StrCat(::testing::TempDir(), "/ckpt_cluster_", ::getpid());
  std::filesystem::remove_all(dir);

  LocalClusterOptions ao;
  ao.config = Job(2, dir);
  LocalCluster a(ao);
  ASSERT_TRUE(a.Start().ok());
  // The scheduler's checkpoint, through the in-process Control path (the
  // tables are still empty here).
  absl::StatusOr<proto::CheckpointResponse> first = a.scheduler()->Checkpoint();
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(first->checkpoint_id(), 1);
  EXPECT_EQ(first->keys(), 0);
  ASSERT_TRUE(a.Run().ok());
  // Once the job is done, a checkpoint is refused ...
  EXPECT_EQ(a.scheduler()->Checkpoint().status().code(),
            absl::StatusCode::kFailedPrecondition);
  // ... so the trained state goes into checkpoint 2 server by server, with
  // the manifest the scheduler would write.
  const std::string ckpt2 = dir + "/ckpt-2";
  proto::CheckpointManifest m;
  m.set_checkpoint_id(2);
  m.set_num_servers(2);
  for (int s = 0; s < 2; ++s) {
    proto::CheckpointCommand cmd;
    cmd.set_dir(ckpt2);
    cmd.set_checkpoint_id(2);
    proto::ServerControlResponse resp;
    ASSERT_TRUE(a.server(s)->Checkpoint(cmd, &resp).ok());
    for (const auto& f : resp.checkpoint_files()) *m.add_files() = f;
  }
  ASSERT_TRUE(WriteManifest(ckpt2, m).ok());
  const auto trained = Entries(a);
  ASSERT_GT(trained.size(), 1000u);

  LocalClusterOptions bo;
  bo.config = Job(3, dir);
  bo.config.fault_tolerance.resume = true;  // the newest: ckpt-2
  LocalCluster b(bo);
  ASSERT_TRUE(b.Start().ok());
  EXPECT_EQ(b.view().restore_from(), ckpt2);
  EXPECT_EQ(Entries(b), trained);  // every key, value and accumulator
  for (int s = 0; s < 3; ++s) EXPECT_GT(b.server(s)->Status().keys(), 0);
  // And training goes on from there.
  ASSERT_TRUE(b.Run().ok());
  absl::StatusOr<double> auc = JsonNumber(b.ReportJson(), "test_auc");
  ASSERT_TRUE(auc.ok()) << b.ReportJson();
  absl::StatusOr<double> auc_a = JsonNumber(a.ReportJson(), "test_auc");
  ASSERT_TRUE(auc_a.ok());
  std::printf("test AUC after 1 epoch %.4f, after resuming for 1 more %.4f\n",
              *auc_a, *auc);
  EXPECT_GE(*auc, *auc_a - 0.005);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace ps
