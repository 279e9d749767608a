#include "common/routing.h"

#include <algorithm>
#include <limits>
#include <map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/hash.h"

namespace ps {

proto::RoutingTable BuildHashRing(const std::vector<int>& server_ids,
                                  int vnodes, int64_t epoch, int replicas) {
  // point -> owner; ties (astronomically unlikely) go to the lower id.
  std::map<uint64_t, int> points;
  for (int s : server_ids) {
    for (int v = 0; v < vnodes; ++v) {
      uint64_t p = Mix64(Mix64(static_cast<uint64_t>(s) + 0x7f4a7c15ULL) ^
                         static_cast<uint64_t>(v));
      points.emplace(p, s);
    }
  }
  proto::RoutingTable t;
  t.set_epoch(epoch);
  if (points.empty()) return t;
  // A key belongs to the first point at or after it, wrapping around.
  const int first_owner = points.begin()->second;
  t.add_range_begin(0);
  t.add_range_server(first_owner);
  auto it = points.begin();
  for (++it; it != points.end(); ++it) {
    uint64_t begin = std::prev(it)->first + 1;
    t.add_range_begin(begin);
    t.add_range_server(it->second);
  }
  uint64_t last = points.rbegin()->first;
  if (last != std::numeric_limits<uint64_t>::max()) {
    t.add_range_begin(last + 1);
    t.add_range_server(first_owner);
  }
  if (replicas > 0) {
    t.set_replicas(replicas);
    for (int r = 0; r < t.range_server_size(); ++r) {
      std::vector<int> pref = PreferenceList(t, r);
      for (int i = 0; i < replicas; ++i) {
        t.add_range_backup(i + 1 < static_cast<int>(pref.size()) ? pref[i + 1]
                                                                 : -1);
      }
    }
  }
  return t;
}

std::vector<int> PreferenceList(const proto::RoutingTable& ring, int range) {
  std::vector<int> out;
  const int n = ring.range_server_size();
  for (int i = 0; i < n; ++i) {
    const int s = ring.range_server((range + i) % n);
    if (std::find(out.begin(), out.end(), s) == out.end()) out.push_back(s);
  }
  return out;
}

absl::StatusOr<proto::RoutingTable> Reassign(
    const proto::RoutingTable& ring, const proto::RoutingTable& current,
    const std::vector<bool>& live, int replicas, int64_t epoch,
    const std::function<bool(int range, int server)>& incomplete,
    const std::function<bool(int server)>& leaving) {
  auto is_live = [&](int s) {
    return s >= 0 && s < static_cast<int>(live.size()) && live[s];
  };
  auto is_leaving = [&](int s) { return leaving != nullptr && leaving(s); };
  proto::RoutingTable out = current;
  out.set_epoch(epoch);
  out.set_replicas(replicas);
  out.clear_range_backup();
  const int old_k = current.replicas();
  // Chain memberships per live server, as assigned so far (the current
  // view's, then this one's): a range whose preference list has no live
  // server left to add (the ring's servers dead or drained, the live ones
  // joined later) takes the live server in the fewest chains.
  std::vector<int> members(live.size(), 0);
  for (int r = 0; r < current.range_server_size(); ++r) {
    if (is_live(current.range_server(r))) ++members[current.range_server(r)];
    for (int i = 0; i < old_k; ++i) {
      const int b = current.range_backup(r * old_k + i);
      if (is_live(b)) ++members[b];
    }
  }
  for (int r = 0; r < current.range_server_size(); ++r) {
    // The live members of the range's chain, in order, those with a
    // complete copy first.
    std::vector<int> whole, copying;
    auto add = [&](int s) {
      if (!is_live(s) ||
          std::find(whole.begin(), whole.end(), s) != whole.end() ||
          std::find(copying.begin(), copying.end(), s) != copying.end()) {
        return;
      }
      (incomplete != nullptr && incomplete(r, s) ? copying : whole)
          .push_back(s);
    };
    add(current.range_server(r));
    for (int i = 0; i < old_k; ++i) add(current.range_backup(r * old_k + i));
    if (whole.empty()) {
      std::string why = absl::StrCat("range ", r, ": its owner S[",
                                     current.range_server(r), "] and every ",
                                     "backup with a complete copy are dead");
      if (!copying.empty()) {
        absl::StrAppend(&why, " (S[", absl::StrJoin(copying, "], S["),
                        "] had not received a copy yet: two failures "
                        "within one copy's time; raise "
                        "fault_tolerance.replicas)");
      }
      return absl::DataLossError(why);
    }
    std::vector<int> chain = std::move(whole);
    chain.insert(chain.end(), copying.begin(), copying.end());
    const size_t kept = chain.size();
    if (r < ring.range_server_size()) {
      for (int s : PreferenceList(ring, r)) {
        if (static_cast<int>(chain.size()) > replicas) break;
        if (is_live(s) && !is_leaving(s) &&
            std::find(chain.begin(), chain.end(), s) == chain.end()) {
          chain.push_back(s);
        }
      }
    }
    while (static_cast<int>(chain.size()) <= replicas) {
      int best = -1;
      for (int s = 0; s < static_cast<int>(live.size()); ++s) {
        if (!is_live(s) ||
            std::find(chain.begin(), chain.end(), s) != chain.end()) {
          continue;
        }
        // A server being drained only as the last resort.
        if (best < 0 ||
            std::make_pair(is_leaving(s), members[s]) <
                std::make_pair(is_leaving(best), members[best])) {
          best = s;
        }
      }
      if (best < 0) break;  // fewer live servers than 1 + replicas
      chain.push_back(best);
    }
    for (size_t i = kept; i < chain.size(); ++i) ++members[chain[i]];
    out.set_range_server(r, chain[0]);
    for (int i = 0; i < replicas; ++i) {
      out.add_range_backup(i + 1 < static_cast<int>(chain.size()) ? chain[i + 1]
                                                                 : -1);
    }
  }
  return out;
}

bool Routing::IsBackupOf(int range, int server) const {
  for (int i = 0; i < replicas(); ++i) {
    if (BackupOfRange(range, i) == server) return true;
  }
  return false;
}

absl::StatusOr<Routing> Routing::FromProto(const proto::RoutingTable& table) {
  if (table.range_begin_size() == 0 ||
      table.range_begin_size() != table.range_server_size()) {
    return absl::InvalidArgumentError("routing table: empty or ragged ranges");
  }
  if (table.range_begin(0) != 0) {
    return absl::InvalidArgumentError("routing table: range_begin[0] != 0");
  }
  Routing r;
  r.table_ = table;
  r.begins_.assign(table.range_begin().begin(), table.range_begin().end());
  r.owners_.assign(table.range_server().begin(), table.range_server().end());
  for (size_t i = 1; i < r.begins_.size(); ++i) {
    if (r.begins_[i] <= r.begins_[i - 1]) {
      return absl::InvalidArgumentError(
          absl::StrCat("routing table: range_begin not ascending at ", i));
    }
  }
  for (int o : r.owners_) {
    if (o < 0 || (table.servers_size() > 0 && o >= table.servers_size())) {
      return absl::InvalidArgumentError(
          absl::StrCat("routing table: bad owner id ", o));
    }
  }
  if (table.replicas() < 0 ||
      static_cast<size_t>(table.range_backup_size()) !=
          r.begins_.size() * static_cast<size_t>(table.replicas())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "routing table: ", table.range_backup_size(), " backups for ",
        r.begins_.size(), " ranges x ", table.replicas(), " replicas"));
  }
  for (int b : table.range_backup()) {
    if (b < -1 || (table.servers_size() > 0 && b >= table.servers_size())) {
      return absl::InvalidArgumentError(
          absl::StrCat("routing table: bad backup id ", b));
    }
  }
  return r;
}

int Routing::RangeOf(uint64_t key) const {
  auto it = std::upper_bound(begins_.begin(), begins_.end(), key);
  return static_cast<int>(it - begins_.begin()) - 1;
}

uint64_t Routing::RangeLast(int range) const {
  if (range + 1 < static_cast<int>(begins_.size())) {
    return begins_[range + 1] - 1;
  }
  return std::numeric_limits<uint64_t>::max();
}

std::vector<int> Routing::RangesOf(int server) const {
  std::vector<int> out;
  for (int r = 0; r < num_ranges(); ++r) {
    if (owners_[r] == server) out.push_back(r);
  }
  return out;
}

std::vector<KeySlice> Routing::Slice(absl::Span<const uint64_t> keys) const {
  int max_server = 0;
  for (int o : owners_) max_server = std::max(max_server, o);
  std::vector<KeySlice> by_server(max_server + 1);
  ForEachRangeRun(keys, [&](int range, size_t first, size_t last) {
    KeySlice& s = by_server[owners_[range]];
    if (!s.spans.empty() && s.spans.back().second == first) {
      s.spans.back().second = last;
    } else {
      s.spans.emplace_back(first, last);
    }
    s.count += last - first;
  });
  std::vector<KeySlice> out;
  for (int s = 0; s <= max_server; ++s) {
    if (by_server[s].count == 0) continue;
    by_server[s].server = s;
    out.push_back(std::move(by_server[s]));
  }
  return out;
}

}  // namespace ps
