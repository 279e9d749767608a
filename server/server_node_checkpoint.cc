// ServerNode::Checkpoint (issue 9): the node's part of a checkpoint. The
// file format and the copy of each range live in server/checkpoint.cc.
#include <filesystem>
#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "server/checkpoint.h"
#include "server/server_node.h"

namespace ps {

absl::Status ServerNode::Checkpoint(const proto::CheckpointCommand& cmd,
                                    proto::ServerControlResponse* resp) {
  if (cmd.dir().empty()) {
    return absl::InvalidArgumentError("checkpoint: empty dir");
  }
  // What the copy needs, taken under mu_; the copy itself runs without it
  // (tables and routings are never freed while the node lives), so data
  // requests go on meanwhile, blocked only per range while it is copied.
  int id;
  std::shared_ptr<const Routing> routing;
  std::vector<const Table*> tables;
  {
    absl::MutexLock l(&mu_);
    if (routing_ == nullptr) {
      return absl::UnavailableError("checkpoint: server not configured yet");
    }
    id = id_;
    routing = routing_;
    for (const auto& t : tables_) tables.push_back(t.get());
  }
  const proto::ServerStatus status = Status();
  std::error_code ec;
  std::filesystem::create_directories(cmd.dir(), ec);
  if (ec) {
    return absl::UnavailableError(absl::StrCat(
        "cannot create checkpoint dir ", cmd.dir(), ": ", ec.message()));
  }
  const std::vector<int> ranges = routing->RangesOf(id);
  proto::CheckpointHeader header;
  header.set_checkpoint_id(cmd.checkpoint_id());
  header.set_server_id(id);
  header.set_num_ranges(routing->num_ranges());
  *header.mutable_worker_clocks() = status.worker_clocks();
  std::vector<proto::CheckpointFileInfo> files;
  absl::Status s;
  for (const Table* t : tables) {
    proto::CheckpointFileInfo info;
    s = WriteCheckpointFile(cmd.dir(), *t, ranges, header, &info);
    if (!s.ok()) break;
    files.push_back(info);
  }
  if (s.ok()) s = SyncDir(cmd.dir());
  if (!s.ok()) {
    for (const auto& f : files) {
      std::filesystem::remove(std::filesystem::path(cmd.dir()) / f.name(), ec);
    }
    return absl::Status(s.code(),
                        absl::StrCat("S[", id, "] checkpoint ",
                                     cmd.checkpoint_id(), " failed: ",
                                     s.message()));
  }
  int64_t keys = 0;
  for (const auto& f : files) {
    keys += f.keys();
    *resp->add_checkpoint_files() = f;
  }
  *resp->mutable_worker_clocks() = status.worker_clocks();
  resp->set_keys(keys);
  PS_LOG_INFO("S[{}] checkpoint {}: {} keys in {} files under {}", id,
              cmd.checkpoint_id(), keys, files.size(), cmd.dir());
  return absl::OkStatus();
}

}  // namespace ps
