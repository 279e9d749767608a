// Key-range routing: consistent hashing of the 64-bit key space with virtual
// nodes, and slicing of sorted key arrays by owner server.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <utility>
#include <functional>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "proto/ps.pb.h"

namespace ps {

// Builds the routing table for `server_ids`, each placed on the ring at
// `vnodes` points. A server's points depend only on its id, so adding a
// server moves only keys that then belong to the new server.
// With `replicas` > 0 each range also gets that many backups: the next
// distinct servers clockwise on the ring after its owner (the paper's
// placement), fewer when there are not enough servers.
proto::RoutingTable BuildHashRing(const std::vector<int>& server_ids,
                                  int vnodes, int64_t epoch, int replicas = 0);

// Replication (issue 9). The servers that may hold range `range` of `ring`
// (a table from BuildHashRing), in preference order: the distinct owners
// of the ranges from `range` on, clockwise, wrapping.
std::vector<int> PreferenceList(const proto::RoutingTable& ring, int range);

// The owners and backups after servers died or joined: for each range,
// the owner is the first live server of its current chain (owner, then
// backups, in `current`) that holds a complete copy of the range, so a
// backup that holds the range's data is promoted; `incomplete(range,
// server)` names the chain members still waiting for their copy (they stay
// backups and get a copy from the new owner). The backups are the live ones
// left of the current chain, then the next live servers of the range's
// preference list in `ring`, then (servers that joined later are in no
// preference list) the live servers in the fewest chains, up to
// `replicas`. `leaving(server)` names live servers being drained: they stay
// in the chains they are in, and are added to one only when no other live
// server is left to add (a drain that finds its server added back fails).
// Keeps boundaries and servers of `current`; sets `epoch`. DATA_LOSS naming
// the range when no live member of its chain holds a complete copy.
absl::StatusOr<proto::RoutingTable> Reassign(
    const proto::RoutingTable& ring, const proto::RoutingTable& current,
    const std::vector<bool>& live, int replicas, int64_t epoch,
    const std::function<bool(int range, int server)>& incomplete = nullptr,
    const std::function<bool(int server)>& leaving = nullptr);

// The keys of one destination server inside a sorted key array: index spans
// [first, second) into that array, in ascending order.
struct KeySlice {
  int server = -1;
  std::vector<std::pair<size_t, size_t>> spans;
  size_t count = 0;
};

// Immutable view of a routing table. Thread-compatible (const methods are
// safe to call concurrently).
class Routing {
 public:
  Routing() = default;

  // Fails with INVALID_ARGUMENT when the table is malformed (empty, begin[0]
  // != 0, unsorted begins, owner ids out of range).
  static absl::StatusOr<Routing> FromProto(const proto::RoutingTable& table);

  int64_t epoch() const { return table_.epoch(); }
  int num_ranges() const { return static_cast<int>(begins_.size()); }
  int num_servers() const { return table_.servers_size(); }
  const proto::RoutingTable& proto() const { return table_; }

  // Index of the range holding `key`.
  int RangeOf(uint64_t key) const;
  int ServerOf(uint64_t key) const { return owners_[RangeOf(key)]; }
  int OwnerOfRange(int range) const { return owners_[range]; }
  // Replication: backups per range (0: none) and range `range`'s backup
  // `i` (-1: none left).
  int replicas() const { return table_.replicas(); }
  int BackupOfRange(int range, int i) const {
    return table_.range_backup(range * table_.replicas() + i);
  }
  // Whether `server` holds a backup of `range`.
  bool IsBackupOf(int range, int server) const;
  uint64_t RangeBegin(int range) const { return begins_[range]; }
  // Inclusive last key of `range`.
  uint64_t RangeLast(int range) const;
  // Ranges owned by `server`, ascending.
  std::vector<int> RangesOf(int server) const;

  // Splits ascending `keys` by owner. Returns one slice per server that owns
  // at least one key, ordered by server id. O(keys + ranges).
  std::vector<KeySlice> Slice(absl::Span<const uint64_t> keys) const;

  // For ascending `keys`, calls fn(range, first, last) for each maximal run
  // of keys in one range. A run's end is found by galloping, then bisection:
  // O(log) of the run's length, so a large request (runs of thousands of
  // keys) is not read key by key (that scan was 5 % of a key-cached push's
  // samples, in the worker).
  template <typename Fn>
  void ForEachRangeRun(absl::Span<const uint64_t> keys, Fn&& fn) const {
    const size_t n = keys.size();
    size_t i = 0;
    while (i < n) {
      const int r = RangeOf(keys[i]);
      const uint64_t last = RangeLast(r);
      // keys[lo - 1] <= last; the run ends in [lo, hi] (keys[hi] > last, or
      // hi == n).
      size_t lo = i + 1, hi = i + 1, step = 1;
      while (hi < n && keys[hi] <= last) {
        lo = hi + 1;
        hi = lo + step - 1;
        step *= 2;
      }
      hi = std::min(hi, n);
      const size_t j = static_cast<size_t>(
          std::upper_bound(keys.begin() + lo, keys.begin() + hi, last) -
          keys.begin());
      fn(r, i, j);
      i = j;
    }
  }

 private:
  proto::RoutingTable table_;
  std::vector<uint64_t> begins_;
  std::vector<int> owners_;
};

}  // namespace ps
