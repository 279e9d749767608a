// Micro-benchmark of Table::Push / Table::Pull: ftrl, dim 1, 1M random keys
// by default, sent as sorted batches split into per-range runs the way the
// server receives them.
//
//   store_bench [num_keys=1000000] [batch=10000] [threads=1] [dense=0]
//
// Keys are FeatureKey(0 .. num_keys-1). dense=1 stores them in the dense-id
// layout (TableSpec::dense_ids = num_keys) instead of the hash maps.
//
// Prints the rates of: pushes creating the keys, pushes to existing keys,
// key-cached pushes (by slots, no hash lookup), pulls, and pushes to
// existing keys with the ranges' delta journals on and, after each batch,
// every range's delta taken and written to a backup table (replication by
// slot as a primary and its backup do it, without the network: the table
// side of a replica's cost; one thread).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <thread>
#include <vector>

#include "common/bytes.h"
#include "common/hash.h"
#include "common/process.h"
#include "server/table.h"

namespace {

constexpr int kRangeBits = 4;  // 16 ranges: range = key >> 60
constexpr int kRanges = 1 << kRangeBits;

double Seconds(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() -
                                       start)
      .count();
}

// Runs fn(batch, range, keys_span, offset) for every per-range run of every
// batch owned by thread `t` of `threads`.
template <typename Fn>
void ForEachRun(const std::vector<std::vector<uint64_t>>& batches, int t,
                int threads, Fn&& fn) {
  for (size_t b = t; b < batches.size(); b += threads) {
    const std::vector<uint64_t>& keys = batches[b];
    size_t i = 0;
    while (i < keys.size()) {
      int r = static_cast<int>(keys[i] >> (64 - kRangeBits));
      size_t j = i + 1;
      while (j < keys.size() &&
             static_cast<int>(keys[j] >> (64 - kRangeBits)) == r) {
        ++j;
      }
      fn(b, r, absl::MakeConstSpan(keys.data() + i, j - i), i);
      i = j;
    }
  }
}

template <typename Fn>
double Timed(int threads, Fn&& fn) {
  auto start = std::chrono::steady_clock::now();
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) pool.emplace_back(fn, t);
  for (auto& th : pool) th.join();
  return Seconds(start);
}

}  // namespace

int main(int argc, char** argv) {
  const size_t num_keys = argc > 1 ? std::strtoull(argv[1], nullptr, 10)
                                   : 1000000;
  const size_t batch = argc > 2 ? std::strtoull(argv[2], nullptr, 10) : 10000;
  const int threads = argc > 3 ? std::atoi(argv[3]) : 1;
  const bool dense = argc > 4 && std::atoi(argv[4]) != 0;
  ps::UseReleaseMutexes();  // as ps_server runs
  if (num_keys == 0 || batch == 0 || threads < 1) {
    std::fprintf(stderr,
                 "usage: store_bench [num_keys] [batch] [threads] [dense]\n");
    return 2;
  }

  ps::TableSpec spec;
  spec.dim = 1;
  spec.optimizer.name = "ftrl";
  spec.optimizer.l1 = 0.01;  // small enough that most weights are non-zero
  if (dense) spec.dense_ids = num_keys;
  std::unique_ptr<ps::Table> table_ptr;
  std::unique_ptr<ps::Table> backup_ptr;
  auto new_table = [&]() -> bool {
    auto table_or = ps::Table::Create(spec, kRanges);
    auto backup_or = ps::Table::Create(spec, kRanges);
    if (!table_or.ok() || !backup_or.ok()) {
      std::fprintf(stderr, "%s\n", table_or.status().ToString().c_str());
      return false;
    }
    table_ptr = std::move(table_or).value();
    backup_ptr = std::move(backup_or).value();
    return true;
  };

  // Distinct random keys, in sorted batches.
  std::vector<std::vector<uint64_t>> batches;
  for (size_t start = 0; start < num_keys; start += batch) {
    size_t n = std::min(batch, num_keys - start);
    std::vector<uint64_t> keys(n);
    for (size_t i = 0; i < n; ++i) keys[i] = ps::FeatureKey(start + i);
    std::sort(keys.begin(), keys.end());
    batches.push_back(std::move(keys));
  }
  std::vector<float> grads(batch);
  for (size_t i = 0; i < batch; ++i) {
    grads[i] = static_cast<float>(ps::Mix64(i) % 2000) / 1000.0f - 1.0f;
  }

  using Keys = absl::Span<const uint64_t>;
  auto push = [&](int t) {
    ForEachRun(batches, t, threads,
               [&](size_t, int r, Keys keys, size_t offset) {
                 table_ptr->Push(r, keys, grads.data() + offset, 0.5f,
                                 nullptr, nullptr, ps::KeyOrder::kAscending);
               });
  };
  // The updates and pulls pass over every key `passes` times, so that a
  // small table's figure is not a few milliseconds of timer noise.
  const int passes =
      static_cast<int>(std::max<size_t>(1, size_t{20000000} / num_keys));
  auto update = [&](int t) {
    for (int i = 0; i < passes; ++i) push(t);
  };
  // Key-cached pushes (Table::PushSlots, as a server applies a worker's
  // cached key list): the slots and generations one Push records.
  std::vector<std::vector<uint32_t>> slots(batches.size());
  std::vector<std::vector<uint64_t>> generations(batches.size());
  auto record = [&](int t) {
    for (size_t b = t; b < batches.size(); b += threads) {
      slots[b].resize(batches[b].size());
      generations[b].resize(kRanges);
    }
    ForEachRun(batches, t, threads,
               [&](size_t b, int r, Keys keys, size_t offset) {
                 table_ptr->Push(r, keys, grads.data() + offset, 0.5f,
                                 slots[b].data() + offset,
                                 &generations[b][r],
                                 ps::KeyOrder::kAscending);
               });
  };
  auto cached = [&](int t) {
    for (int i = 0; i < passes; ++i) {
      ForEachRun(batches, t, threads,
                 [&](size_t b, int r, Keys keys, size_t offset) {
                   table_ptr->PushSlots(r, generations[b][r], keys,
                                        slots[b].data() + offset,
                                        grads.data() + offset, 0.5f,
                                        ps::KeyOrder::kAscending);
                 });
    }
  };
  auto pull = [&](int t) {
    std::vector<float> out(batch);
    for (int i = 0; i < passes; ++i) {
      ForEachRun(batches, t, threads,
                 [&](size_t, int r, Keys keys, size_t offset) {
                   table_ptr->Pull(r, keys, out.data() + offset);
                 });
    }
  };

  // Replication by slot: the primary's journals start on the empty table,
  // so the first deltas give the backup the primary's layout.
  std::vector<uint64_t> gens(kRanges);
  std::vector<uint32_t> synced(kRanges, 0);
  size_t delta_rows = 0;
  bool delta_failed = false;
  auto start_journals = [&] {
    for (int r = 0; r < kRanges; ++r) {
      table_ptr->StartJournal(r);
      gens[r] = table_ptr->Layout(r).generation;
      synced[r] = 0;
    }
  };
  auto ship = [&] {
    ps::Table::DeltaRows delta;
    for (int r = 0; r < kRanges; ++r) {
      if (!table_ptr->TakeJournal(r, gens[r], synced[r], &delta) ||
          !backup_ptr
               ->CheckDelta(r, ps::ViewAs<uint32_t>(delta.slots),
                            ps::ViewAs<uint64_t>(delta.slot_bits),
                            delta.base_slots, backup_ptr->Layout(r).digest)
               .ok()) {
        delta_failed = true;
        return;
      }
      backup_ptr->ImportDelta(
          r, ps::ViewAs<uint32_t>(delta.slots),
          ps::ViewAs<uint64_t>(delta.slot_bits),
          ps::ViewAs<uint64_t>(delta.new_keys),
          reinterpret_cast<const float*>(delta.entries.data()));
      synced[r] = delta.num_slots;
      delta_rows += delta.rows();
    }
  };
  auto replicated = [&](int) {
    bool journaled = false;
    for (int i = 0; i < passes; ++i) {
      for (size_t b = 0; b < batches.size(); ++b) {
        const std::vector<uint64_t>& keys = batches[b];
        for (size_t at = 0; at < keys.size();) {
          const int r = static_cast<int>(keys[at] >> (64 - kRangeBits));
          size_t end = at + 1;
          while (end < keys.size() &&
                 static_cast<int>(keys[end] >> (64 - kRangeBits)) == r) {
            ++end;
          }
          table_ptr->Push(r, absl::MakeConstSpan(keys.data() + at, end - at),
                          grads.data() + at, 0.5f, nullptr, nullptr,
                          ps::KeyOrder::kAscending, &journaled);
          at = end;
        }
        ship();
      }
    }
  };

  const double n = static_cast<double>(num_keys);
  std::printf("store_bench: ftrl dim 1, %zu feature keys%s, batches of %zu, "
              "%d ranges, %d thread(s)\n",
              num_keys, dense ? " (dense-id layout)" : " (hash maps)", batch,
              kRanges, threads);
  // Best of kReps runs (the machine is shared), a fresh table each time.
  constexpr int kReps = 3;
  double t_insert = 1e30, t_update = 1e30, t_cached = 1e30, t_pull = 1e30;
  double t_replicated = 1e30;
  for (int rep = 0; rep < kReps; ++rep) {
    if (!new_table()) return 1;
    t_insert = std::min(t_insert, Timed(threads, push));
    t_update = std::min(t_update, Timed(threads, update) / passes);
    Timed(threads, record);
    t_cached = std::min(t_cached, Timed(threads, cached) / passes);
    t_pull = std::min(t_pull, Timed(threads, pull) / passes);
    if (threads == 1) {  // journals on the empty table, then the keys made
      if (!new_table()) return 1;
      start_journals();
      bool journaled = false;
      ForEachRun(batches, 0, 1, [&](size_t, int r, Keys keys, size_t offset) {
        table_ptr->Push(r, keys, grads.data() + offset, 0.5f, nullptr,
                        nullptr, ps::KeyOrder::kAscending, &journaled);
      });
      ship();
      t_replicated = std::min(t_replicated, Timed(1, replicated) / passes);
    }
  }
  std::printf("  push (creating keys): %8.2f Mkeys/s  (%.3f s)\n",
              n / t_insert / 1e6, t_insert);
  std::printf("  push (existing keys): %8.2f Mkeys/s  (%.4f s a pass)\n",
              n / t_update / 1e6, t_update);
  std::printf("  push (key cached):    %8.2f Mkeys/s  (%.4f s a pass)\n",
              n / t_cached / 1e6, t_cached);
  std::printf("  pull:                 %8.2f Mkeys/s  (%.4f s a pass)\n",
              n / t_pull / 1e6, t_pull);
  if (threads == 1) {
    if (delta_failed) {
      std::fprintf(stderr, "store_bench: a delta was refused\n");
      return 1;
    }
    std::printf("  push + delta to a backup: %8.2f Mkeys/s  (%.4f s a pass, "
                "%.2fx the push; %zu rows sent)\n",
                n / t_replicated / 1e6, t_replicated, t_replicated / t_update,
                delta_rows);
  }
  std::printf("  table: %zu keys, %zu non-zero (best of %d runs)\n",
              table_ptr->size(), table_ptr->nonzeros(), kReps);
  return 0;
}
