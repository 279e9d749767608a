// Checkpoints of the servers' tables (issue 9): values AND optimizer state,
// so that a job restarted from one continues exactly where it stood, with
// any number of servers.
//
// On disk, a checkpoint is a folder <checkpoint_dir>/ckpt-<id> with
//   table-<t>.server-<s>.ckpt   one per (server, table), written by server s;
//   MANIFEST                    written by the scheduler last, once every
//                               server's files are complete (text format of
//                               proto::CheckpointManifest).
// A folder without MANIFEST is not a checkpoint (an interrupted one).
//
// A .ckpt file, all integers little-endian (host layout):
//   "PSCK", u32 format version (1), u32 header length H,
//   H bytes: proto::CheckpointHeader (binary),
//   header.keys x u64 keys, ascending,
//   header.keys x entry: dim value floats, then dim * state_floats optimizer
//                        state floats (f32, Optimizer's layout),
//   u32 crc32 (zlib) of every byte before it.
// Files are written under a temporary name, fsynced and renamed into place;
// the folder is fsynced after the renames.
//
// Consistency: each key range is copied under its partition lock, so every
// range in a file is a state that range really had (per-range consistent),
// but ranges (and servers) are copied at slightly different moments while
// training runs; BSP pushes buffered for a clock not yet applied are not in
// it. The header's `consistency` field says so and worker_clocks records the
// clocks completed when the copy began.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/routing.h"
#include "proto/ps.pb.h"
#include "server/table.h"

namespace ps {

inline constexpr uint32_t kCheckpointFormatVersion = 1;
inline constexpr char kCheckpointManifestName[] = "MANIFEST";

// "ckpt-<id>".
std::string CheckpointFolderName(int64_t id);
// "table-<t>.server-<s>.ckpt".
std::string CheckpointFileName(int table_id, int server_id);

// Writes the entries of `ranges` of `table` (each range read under its
// partition lock) to dir/CheckpointFileName(table id, header.server_id()),
// under a temporary name, fsynced, then renamed; the caller fsyncs the
// folder (SyncDir). `header` gives checkpoint id, server id, worker clocks
// and num_ranges; the table fields, keys, version and consistency are
// filled here. Sets *info. Errors name the file, codes from errno
// (RESOURCE_EXHAUSTED for a full disk, NOT_FOUND for a missing folder...);
// on error no file (temporary or final) of this call is left.
absl::Status WriteCheckpointFile(const std::string& dir, const Table& table,
                                 absl::Span<const int> ranges,
                                 proto::CheckpointHeader header,
                                 proto::CheckpointFileInfo* info);

// fsyncs a folder (after renames into it). Errors from errno, naming it.
absl::Status SyncDir(const std::string& dir);

struct CheckpointFileContents {
  proto::CheckpointHeader header;
  std::vector<uint64_t> keys;   // ascending
  std::vector<float> entries;   // keys.size() * entry floats
  uint32_t crc32 = 0;
  int64_t bytes = 0;
};

// Reads and verifies one .ckpt file. Codes from errno when it cannot be
// opened (NOT_FOUND, PERMISSION_DENIED); DATA_LOSS, naming the file, when
// it is truncated, has trailing bytes, another magic or format version, a
// header that does not parse or is out of range, keys not ascending, or a
// checksum that does not match. Never returns a partial result.
absl::StatusOr<CheckpointFileContents> ReadCheckpointFile(
    const std::string& path);

// Writes dir/MANIFEST atomically (temporary name, fsync, rename, folder
// fsync). Errors as for WriteCheckpointFile.
absl::Status WriteManifest(const std::string& dir,
                           const proto::CheckpointManifest& manifest);
// NOT_FOUND ("not a checkpoint") when dir has no MANIFEST; DATA_LOSS naming
// it when it does not parse or lists a file name with a '/'.
absl::StatusOr<proto::CheckpointManifest> ReadManifest(const std::string& dir);

// The ids of the complete checkpoints (ckpt-<id> folders with a MANIFEST)
// under checkpoint_dir, ascending; empty when there are none or the folder
// does not exist.
std::vector<int64_t> ListCheckpoints(const std::string& checkpoint_dir);
// The highest ckpt-<id> id under checkpoint_dir, complete or not; 0 when
// none. New checkpoints take ids above it.
int64_t MaxCheckpointId(const std::string& checkpoint_dir);
// The folder of the newest complete checkpoint; NOT_FOUND when none.
absl::StatusOr<std::string> FindLatestCheckpoint(
    const std::string& checkpoint_dir);
// Deletes every checkpoint folder (complete or not) older than the newest
// `keep` complete ones. A complete checkpoint's MANIFEST goes first, so an
// interrupted deletion leaves no half checkpoint that looks complete.
// Returns the first error (naming the path); keeps going past errors.
absl::Status PruneCheckpoints(const std::string& checkpoint_dir, int keep);

// Reads every file the manifest of `dir` lists and checks it against the
// manifest (size, checksum, ids) and itself: OK when all can be loaded;
// NOT_FOUND when dir is not a checkpoint; DATA_LOSS naming the file
// otherwise. Sets *keys (may be null) to the keys over all files.
absl::Status VerifyCheckpoint(const std::string& dir, int64_t* keys);

struct RestoreStats {
  int files = 0;
  int64_t keys_read = 0;    // entries in the files read
  int64_t keys_loaded = 0;  // those routed to this server
};

// Loads into `tables` (index = table id, created for `routing`'s ranges)
// the entries of every key that `routing` gives to server `server_id`,
// from ALL files of the checkpoint in `dir`, whichever server wrote them.
// Errors: NOT_FOUND when dir is not a checkpoint; DATA_LOSS naming the file
// for a corrupt file or one that does not match the manifest or its table
// (unknown table, other dim, optimizer or state size). Each file is
// verified whole before any of its keys is loaded, but on an error the
// files before it are loaded: the caller discards the tables. Logs the
// files and key counts loaded.
absl::Status RestoreCheckpoint(const std::string& dir, int server_id,
                               const Routing& routing,
                               const std::vector<std::unique_ptr<Table>>& tables,
                               RestoreStats* stats);

}  // namespace ps
