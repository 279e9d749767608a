#include "server/table.h"

#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>
#include <numeric>
#include <type_traits>
#include <vector>
#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "absl/base/internal/raw_logging.h"
#include "absl/strings/str_cat.h"
#include "common/cpu_features.h"
#include "common/hash.h"
#include "common/hash_avx2.h"
#include "common/radix_sort.h"
#include "common/status_macros.h"

namespace ps {
namespace {

constexpr char kMagic[4] = {'P', 'S', 'T', 'B'};
constexpr uint32_t kFormatVersion = 1;
// magic, version, table id, dim, count.
constexpr size_t kHeaderBytes = 4 + 4 + 4 + 4 + 8;
// Target chunk size in floats (64 KiB): big enough that allocation is rare,
// small enough that a table with many near-empty ranges stays small.
constexpr size_t kChunkTargetFloats = 16384;
// Push/Pull prefetch the hash-map probe of the key this many positions ahead,
// overlapping the cache misses of a large table's random lookups; each loop
// first starts the loads of its first kPrefetchDistance keys (a push's run of
// a range in the LR job is a few dozen keys, most of which would otherwise
// be before the first prefetched one). 16 against 8 before, with that
// warm-up (server/store_bench, 2M keys, interleaved): pushes to stored keys
// and pulls 15-25 % faster in batches of 100k, pulls 15 % in batches of 10k,
// pushes in batches of 1k (runs of ~60 keys) as fast; 32 lost at 1k.
constexpr size_t kPrefetchDistance = 16;
// A transparent huge page on x86-64 (the dense-id index's alignment).
constexpr size_t kHugePage = size_t{2} << 20;
// Dense-id indices up to this size are collapsed into huge pages at
// creation (Table::Create).
constexpr size_t kCollapseIndexUpTo = size_t{256} << 20;
// <sys/mman.h> of glibc 2.36 lacks it (Linux 6.1's uapi value).
constexpr int kMadvCollapse = 25;

absl::Status ErrnoError(int err, const std::string& what,
                        const std::string& path) {
  return absl::ErrnoToStatus(err, absl::StrCat(what, " ", path));
}

// A FILE* that closes itself; Close() reports the error of the final flush.
class File {
 public:
  File() = default;
  File(const File&) = delete;
  File& operator=(const File&) = delete;
  ~File() {
    if (f_ != nullptr) std::fclose(f_);
  }

  absl::Status Open(const std::string& path, const char* mode) {
    path_ = path;
    f_ = std::fopen(path.c_str(), mode);
    if (f_ == nullptr) return ErrnoError(errno, "cannot open", path);
    // A large buffer of our own: records are read and written a few bytes
    // at a time. (glibc's setvbuf ignores the size it is given without a
    // buffer and keeps the block size, 4 KiB: a 60 MB model took 15,000
    // write calls.)
    buffer_ = std::make_unique_for_overwrite<char[]>(kBufferBytes);
    std::setvbuf(f_, buffer_.get(), _IOFBF, kBufferBytes);
    return absl::OkStatus();
  }
  absl::Status Write(const void* data, size_t n) {
    if (n != 0 && std::fwrite(data, 1, n, f_) != n) {
      return ErrnoError(errno, "cannot write", path_);
    }
    return absl::OkStatus();
  }
  // Reads exactly n bytes; DATA_LOSS at end of file.
  absl::Status Read(void* data, size_t n) {
    if (n != 0 && std::fread(data, 1, n, f_) != n) {
      if (std::ferror(f_)) return ErrnoError(errno, "cannot read", path_);
      return absl::DataLossError(
          absl::StrCat("table file ", path_, ": truncated"));
    }
    return absl::OkStatus();
  }
  absl::StatusOr<int64_t> Size() {
    if (std::fseek(f_, 0, SEEK_END) != 0) {
      return ErrnoError(errno, "cannot seek", path_);
    }
    long size = std::ftell(f_);
    if (size < 0 || std::fseek(f_, 0, SEEK_SET) != 0) {
      return ErrnoError(errno, "cannot seek", path_);
    }
    return static_cast<int64_t>(size);
  }
  absl::Status Close() {
    FILE* f = f_;
    f_ = nullptr;
    if (std::fclose(f) != 0) return ErrnoError(errno, "cannot write", path_);
    return absl::OkStatus();
  }

 private:
  static constexpr size_t kBufferBytes = size_t{1} << 20;
  FILE* f_ = nullptr;
  std::unique_ptr<char[]> buffer_;  // f_'s, freed after it is closed
  std::string path_;
};

// Writes a file through `write_body` into path + ".tmp", then renames it
// over `path`. On failure the temporary file is removed.
template <typename WriteBody>
absl::Status WriteAtomically(const std::string& path, WriteBody write_body) {
  const std::string tmp = path + ".tmp";
  absl::Status status = [&]() -> absl::Status {
    File file;
    PS_RETURN_IF_ERROR(file.Open(tmp, "wb"));
    PS_RETURN_IF_ERROR(write_body(file));
    return file.Close();
  }();
  if (status.ok() && std::rename(tmp.c_str(), path.c_str()) != 0) {
    status = ErrnoError(errno, "cannot rename into", path);
  }
  if (!status.ok()) std::remove(tmp.c_str());
  return status;
}

bool AllZero(const float* v, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    if (v[i] != 0.0f) return false;
  }
  return true;
}

}  // namespace

// ---------------------------------------------------------------------------
// Table

absl::StatusOr<std::unique_ptr<Table>> Table::Create(const TableSpec& spec,
                                                     int num_ranges) {
  if (spec.dim < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("table ", spec.id, ": dim must be >= 1, got ", spec.dim));
  }
  if (num_ranges < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "table ", spec.id, ": num_ranges must be >= 1, got ", num_ranges));
  }
  if (!std::isfinite(spec.init_scale) || spec.init_scale < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("table ", spec.id, ": init_scale must be >= 0, got ",
                     spec.init_scale));
  }
  PS_ASSIGN_OR_RETURN(std::unique_ptr<Optimizer> optimizer,
                      Optimizer::Create(spec.optimizer));
  if (optimizer->kind() == OptimizerKind::kFtrl && spec.init_scale != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "table ", spec.id,
        ": init_scale must be 0 with ftrl (its weights start at 0)"));
  }
  if (spec.dense_ids > kMaxDenseIds) {
    return absl::InvalidArgumentError(
        absl::StrCat("table ", spec.id, ": dense_ids must be at most ",
                     kMaxDenseIds, ", got ", spec.dense_ids));
  }
  DenseIndex dense_index;
  if (spec.dense_ids != 0) {
    // Anonymous pages are zero and cost nothing until an id on them is
    // used (an allocator's calloc may zero them by hand instead).
    // An index past a huge page is put on huge pages: random ids in a
    // table of 4 KiB pages missed the TLB on nearly every lookup, and its
    // page walk stalled the prefetch (35 % of a 100k-key push's samples).
    // Not by MADV_HUGEPAGE: that advice enrolls the process with
    // khugepaged, which runs at nice 19 and scans the process's memory
    // under its memory-map lock; on a machine busy with other work it was
    // preempted holding that lock for seconds, every thread that mapped or
    // unmapped memory waited, and a live server stopped answering and was
    // failed over (issue 9, docs/fault_tolerance.md "Stop 59"). An index
    // of up to kCollapseIndexUpTo is collapsed into huge pages here, by
    // this thread (MADV_COLLAPSE, Linux 6.1: it needs a page in each huge
    // page's range, hence one write per huge page): all of it resident at
    // once, no khugepaged. A larger one, or a kernel without
    // MADV_COLLAPSE, stays on 4 KiB pages faulted in as ids are used.
    // The mapping is over-sized by one huge page to align the index.
    const size_t bytes = spec.dense_ids * sizeof(uint64_t);
    const bool huge = bytes >= kHugePage && bytes <= kCollapseIndexUpTo;
    const size_t mapped = huge ? bytes + kHugePage : bytes;
    void* p = mmap(nullptr, mapped, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "table ", spec.id, ": cannot map the dense-id index of ",
          spec.dense_ids, " ids (", bytes, " bytes): ", std::strerror(errno)));
    }
    uintptr_t start = reinterpret_cast<uintptr_t>(p);
    if (huge) {
      start = (start + kHugePage - 1) & ~uintptr_t{kHugePage - 1};
      for (size_t off = 0; off < bytes; off += kHugePage) {
        reinterpret_cast<volatile uint64_t*>(start + off)[0] = 0;
      }
      // Best effort: without it (an older kernel, no free huge page) the
      // index works on 4 KiB pages.
      madvise(reinterpret_cast<void*>(start), bytes, kMadvCollapse);
    }
    dense_index = DenseIndex(reinterpret_cast<uint64_t*>(start),
                             Unmapper(p, mapped));
  }
  return std::unique_ptr<Table>(new Table(
      spec, num_ranges, std::move(optimizer), std::move(dense_index)));
}

void Table::Unmapper::operator()(uint64_t*) const { munmap(base, bytes); }

namespace {
int ChunkShift(size_t stride) {
  size_t slots = std::max<size_t>(1, kChunkTargetFloats / stride);
  return std::bit_width(slots) - 1;  // floor(log2(slots))
}
}  // namespace

namespace {
// Range generations are unique in the process (not only per table), so that
// slots resolved against one table never pass for another's.
std::atomic<uint64_t> next_generation{1};
}  // namespace

Table::Table(const TableSpec& spec, int num_ranges,
             std::unique_ptr<Optimizer> optimizer, DenseIndex dense_index)
    : spec_(spec),
      num_ranges_(num_ranges),
      optimizer_(std::move(optimizer)),
      stride_(static_cast<size_t>(spec.dim) *
              (1 + optimizer_->state_floats())),
      chunk_shift_(ChunkShift(stride_)),
      chunk_mask_((uint32_t{1} << chunk_shift_) - 1),
      init_seed_(Mix64(static_cast<uint64_t>(spec.id) ^ 0x7ab1e5eedULL)),
      partitions_(new Partition[num_ranges]),
      dense_index_(std::move(dense_index)) {
  for (int r = 0; r < num_ranges; ++r) {
    absl::MutexLock l(&partitions_[r].mu);
    partitions_[r].generation = next_generation.fetch_add(1);
  }
}

Table::~Table() = default;

Table::Partition& Table::partition(int range) const {
  ABSL_RAW_CHECK(range >= 0 && range < num_ranges_,
                 "Table: range index out of bounds");
  return partitions_[range];
}

float* Table::SlotData(const Partition& p, uint32_t slot) const {
  return p.chunks[slot >> chunk_shift_].get() +
         static_cast<size_t>(slot & chunk_mask_) * stride_;
}

uint32_t Table::NewSlot(Partition& p) {
  uint32_t slot = p.num_slots++;
  ABSL_RAW_CHECK(p.num_slots != 0, "Table: more than 2^32 keys in a range");
  if ((slot >> chunk_shift_) >= p.chunks.size()) {
    // Uninitialised: every slot is initialised when it is handed out.
    p.chunks.emplace_back(new float[(size_t{chunk_mask_} + 1) * stride_]);
  }
  return slot;
}

uint64_t* Table::DenseEntry(uint64_t key) const {
  if (dense_index_ == nullptr) return nullptr;
  const uint64_t id = FeatureOf(key);
  return id < spec_.dense_ids ? &dense_index_[id] : nullptr;
}

namespace {
constexpr uint64_t DenseValue(int range, uint32_t slot) {
  return (static_cast<uint64_t>(range) << 32) | (uint64_t{slot} + 1);
}
uint64_t LoadEntry(uint64_t* e) {
  return std::atomic_ref<uint64_t>(*e).load(std::memory_order_relaxed);
}
void StoreEntry(uint64_t* e, uint64_t v) {
  std::atomic_ref<uint64_t>(*e).store(v, std::memory_order_relaxed);
}
}  // namespace

uint32_t Table::FindSlot(int range, const Partition& p, uint64_t key) const {
  if (uint64_t* e = DenseEntry(key); e != nullptr) {
    const uint64_t v = LoadEntry(e);
    if (v != 0 && static_cast<int>(v >> 32) == range) {
      return static_cast<uint32_t>(v) - 1;
    }
    // Not stored, or stored by another range: this range's copy, if any,
    // is in its map (see DenseEntry).
  }
  return p.slots.Find(key, kNoSlot);
}

uint32_t Table::FindOrNewSlot(int range, Partition& p, uint64_t key,
                              bool* inserted) {
  if (uint64_t* e = DenseEntry(key); e != nullptr) {
    const uint64_t v = LoadEntry(e);
    if (v != 0 && static_cast<int>(v >> 32) == range) {
      *inserted = false;
      return static_cast<uint32_t>(v) - 1;
    }
    if (v == 0 && !p.slots.Contains(key)) {
      const uint32_t slot = NewSlot(p);
      p.layout_digest = NextDigest(p.layout_digest, key);
      StoreEntry(e, DenseValue(range, slot));
      p.dense_keys.push_back(key);
      *inserted = true;
      return slot;
    }
    // Another range holds the entry, or this range stored the key in its
    // map while it did: the map, as without the index.
  }
  auto [slot, is_new] = p.slots.TryEmplace(key);
  if (is_new) {
    *slot = NewSlot(p);
    p.layout_digest = NextDigest(p.layout_digest, key);
  }
  *inserted = is_new;
  return *slot;
}

inline void Table::PrefetchKey(const Partition& p, uint64_t key) const {
  if (uint64_t* e = DenseEntry(key); e != nullptr) {
    __builtin_prefetch(e);
  } else {
    p.slots.Prefetch(key);
  }
}

template <typename Fn>
void Table::ForEachKey(const Partition& p, Fn&& fn) const {
  p.slots.ForEach(fn);
  for (uint64_t key : p.dense_keys) {
    // Entries of this partition's dense keys name it.
    fn(key, static_cast<uint32_t>(LoadEntry(DenseEntry(key))) - 1);
  }
}

void Table::InitialValue(uint64_t key, float* w) const {
  const size_t dim = static_cast<size_t>(spec_.dim);
  if (spec_.init_scale == 0) {
    std::fill(w, w + dim, 0.0f);
    return;
  }
  const uint64_t h = Mix64(key ^ init_seed_);
  const float s = spec_.init_scale;
  for (size_t j = 0; j < dim; ++j) {
    // 24 random bits -> u in [0, 1), exactly representable.
    float u = static_cast<float>(Mix64(h + j) >> 40) * 0x1.0p-24f;
    w[j] = s * (2.0f * u - 1.0f);
  }
}

namespace {
// A pulled value: one load and store for the dim-1 tables of sparse models
// (a memcpy call per key cost 6 % of a key-cached pull's samples). A
// memcpy of constant size, which compiles to one move: `dst` may be
// misaligned (a reply buffer at any offset), which a float store may not.
inline void CopyValue(float* dst, const float* src, size_t dim) {
  if (dim == 1) {
    std::memcpy(dst, src, sizeof(float));
  } else {
    std::memcpy(dst, src, dim * sizeof(float));
  }
}

// A row of `floats` floats (a key's value and optimizer state): a memcpy
// of constant size for the rows of dim-1 tables (1 to 4 floats: sgd to
// adam), which compiles to a move or two, instead of a call per row (the
// replication paths copy one row per key).
inline void CopyRow(void* dst, const void* src, size_t floats) {
  switch (floats) {
    case 1:
      std::memcpy(dst, src, 1 * sizeof(float));
      return;
    case 2:
      std::memcpy(dst, src, 2 * sizeof(float));
      return;
    case 3:
      std::memcpy(dst, src, 3 * sizeof(float));
      return;
    case 4:
      std::memcpy(dst, src, 4 * sizeof(float));
      return;
    default:
      std::memcpy(dst, src, floats * sizeof(float));
  }
}

// Where a call records slots when its caller does not want them.
uint32_t* Scratch(size_t n) {
  thread_local std::vector<uint32_t> scratch;
  if (scratch.size() < n) scratch.resize(n);
  return scratch.data();
}
}  // namespace

template <typename Rule>
uint32_t Table::SlotOrNew(int range, Partition& p, const Rule& rule,
                          uint64_t key, bool journal) {
  bool inserted = false;
  const uint32_t slot = FindOrNewSlot(range, p, key, &inserted);
  if (inserted) {
    if (journal) {
      p.journal.new_keys.append(reinterpret_cast<const char*>(&key),
                                sizeof(key));
    }
    const size_t dim = static_cast<size_t>(spec_.dim);
    float* data = SlotData(p, slot);
    rule.Init(data, data + dim, dim);
    if (spec_.init_scale != 0) InitialValue(key, data);
  }
  return slot;
}

template <typename Rule>
void Table::SlotsOrNew(int range, Partition& p, const Rule& rule,
                       absl::Span<const uint64_t> keys, const uint32_t* slots,
                       uint32_t* out, bool journal) {
  const size_t n = keys.size();
  if (out != slots) std::memcpy(out, slots, n * sizeof(uint32_t));
  // Branch-free first (it runs in vector registers): a push to stored keys,
  // the common one, has no absent key, and a branch per key was 3 % of a
  // 100k-key push's samples.
  uint32_t any_absent = 0;
  for (size_t i = 0; i < n; ++i) {
    any_absent |= static_cast<uint32_t>(slots[i] == kNoSlot);
  }
  if (any_absent == 0) return;
  thread_local std::vector<uint32_t> absent;
  absent.clear();
  for (size_t i = 0; i < n; ++i) {
    if (slots[i] == kNoSlot) absent.push_back(static_cast<uint32_t>(i));
  }
  // A new key's index entry is a miss (7 % of a replicated LR job's server
  // samples when not loaded ahead).
  const size_t m = absent.size();
  for (size_t j = 0; j < std::min(m, kPrefetchDistance); ++j) {
    PrefetchKey(p, keys[absent[j]]);
  }
  for (size_t j = 0; j < m; ++j) {
    if (j + kPrefetchDistance < m) {
      PrefetchKey(p, keys[absent[j + kPrefetchDistance]]);
    }
    out[absent[j]] = SlotOrNew(range, p, rule, keys[absent[j]], journal);
  }
}

namespace {

// Keys of a dim-1 FTRL table updated side by side (FtrlLanes).
constexpr size_t kFtrlLanes = 16;

// FtrlRule::Step for the dim-1 entries e[k] = [w, z, n], k < kFtrlLanes,
// with gradients scale * g[k]; no entry twice. The square roots and the
// division bound a dim-1 FTRL push (the update was half of a key-cached
// push's samples, most of them waiting on the divider one key at a time), so
// the lanes are loops the compiler runs in vector registers, in the widest
// ones the CPU has (the clones). The same bits as Step on each entry in
// turn: IEEE arithmetic per lane, and no contraction into fused
// multiply-adds (-ffp-contract=off for this file), whichever clone runs.
// Not cloned under ThreadSanitizer: the clones' resolver runs while the
// dynamic loader relocates, before the TSan runtime is set up, and the
// instrumented resolver crashed every TSan test binary at start-up.
#if defined(__SANITIZE_THREAD__)
#define PS_CLONES
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define PS_CLONES
#endif
#endif
#ifndef PS_CLONES
#define PS_CLONES \
  __attribute__((target_clones("avx512f", "avx2", "default")))
#endif
// The body of FtrlLanes; entry(k) is the address of lane k's entry.
template <typename Entry>
__attribute__((always_inline)) inline size_t FtrlLanesOf(
    const optimizer_internal::FtrlRule& rule, Entry entry, const float* g,
    float scale) {
  float w[kFtrlLanes], z[kFtrlLanes], acc[kFtrlLanes], gi[kFtrlLanes];
  float w0[kFtrlLanes], z0[kFtrlLanes], acc0[kFtrlLanes];
  for (size_t k = 0; k < kFtrlLanes; ++k) {
    const float* e = entry(k);
    w0[k] = w[k] = e[0];
    z0[k] = z[k] = e[1];
    acc0[k] = acc[k] = e[2];
    gi[k] = scale * g[k];
  }
  for (size_t k = 0; k < kFtrlLanes; ++k) {
    w[k] = rule.Step(gi[k], w[k], z[k], acc[k]);
  }
  // An element whose new weight or state is not finite keeps what it had
  // (optimizer.h). Rare: one test of all the lanes, then lane by lane.
  uint32_t finite = 1;
  for (size_t k = 0; k < kFtrlLanes; ++k) {
    finite &= optimizer_internal::Finite(w[k]) &
              optimizer_internal::Finite(z[k]) &
              optimizer_internal::Finite(acc[k]);
  }
  size_t kept = 0;
  if (__builtin_expect(finite == 0, 0)) {
    for (size_t k = 0; k < kFtrlLanes; ++k) {
      if (optimizer_internal::Finite(w[k]) & optimizer_internal::Finite(z[k]) &
          optimizer_internal::Finite(acc[k])) {
        continue;
      }
      w[k] = w0[k];
      z[k] = z0[k];
      acc[k] = acc0[k];
      ++kept;
    }
  }
  for (size_t k = 0; k < kFtrlLanes; ++k) {
    float* e = entry(k);
    e[0] = w[k];
    e[1] = z[k];
    e[2] = acc[k];
  }
  return kept;
}

PS_CLONES size_t FtrlLanes(
    const optimizer_internal::FtrlRule& rule, float* const* e,
    const float* g, float scale) {
  return FtrlLanesOf(
      rule, [e](size_t k) { return e[k]; }, g, scale);
}

// A dim-1 FTRL entry's floats: w, z, n.
constexpr size_t kFtrlEntryFloats =
    1 + optimizer_internal::FtrlRule::kStateFloats;

// FtrlLanes on kFtrlLanes consecutive slots, whose entries are one array
// from `first` on: loaded and stored as whole vectors, shuffled in
// registers, instead of a load and a store per float (a key list pushed
// again, as a key-cached push is, has the slots its first push made: in
// key order, so consecutive).
PS_CLONES size_t FtrlLanesConsecutive(
    const optimizer_internal::FtrlRule& rule, float* first, const float* g,
    float scale) {
  return FtrlLanesOf(
      rule, [first](size_t k) { return first + kFtrlEntryFloats * k; }, g,
      scale);
}

#if defined(__x86_64__)
// FtrlLanesConsecutive in AVX-512, written out: the same operations in the
// same order (so the same bits as FtrlRule::Step, lane by lane), with the
// finiteness test as three compares into a mask and the left-out lanes as
// blends. Compiled, the portable loop tested finiteness by reducing a
// vector of flags through a dozen dependent shuffles after the division,
// which held up every group's stores.
struct ConsecutiveIndices {
  // Loads: field f of lane k is float 3k + f of the three vectors a0 a1 a2;
  // first a0:a1 (lo), then that and a2 (hi).
  alignas(64) int32_t lo[3][16];
  alignas(64) int32_t hi[3][16];
  // Stores: float 16j + p is field f of lane k; w:z by wz, then n by
  // n_at under n_mask.
  alignas(64) int32_t wz[3][16];
  alignas(64) int32_t n_at[3][16];
  uint16_t n_mask[3];
};
constexpr ConsecutiveIndices MakeConsecutiveIndices() {
  ConsecutiveIndices x{};
  for (int f = 0; f < 3; ++f) {
    for (int k = 0; k < 16; ++k) {
      const int i = 3 * k + f;
      x.lo[f][k] = i < 32 ? i : 0;
      x.hi[f][k] = i < 32 ? k : 16 + (i - 32);
    }
  }
  for (int j = 0; j < 3; ++j) {
    x.n_mask[j] = 0;
    for (int q = 0; q < 16; ++q) {
      const int i = 16 * j + q, k = i / 3, f = i % 3;
      x.wz[j][q] = f == 0 ? k : f == 1 ? 16 + k : 0;
      x.n_at[j][q] = f == 2 ? k : 0;
      if (f == 2) x.n_mask[j] |= static_cast<uint16_t>(1u << q);
    }
  }
  return x;
}
constexpr ConsecutiveIndices kConsecutive = MakeConsecutiveIndices();

__attribute__((target("avx512f"))) size_t FtrlLanesConsecutiveAvx512(
    const optimizer_internal::FtrlRule& rule, float* first, const float* g,
    float scale, size_t groups) {
  static_assert(kFtrlLanes == 16 && kFtrlEntryFloats == 3);
  const __m512 inv_alpha = _mm512_set1_ps(rule.inv_alpha);
  const __m512 l1 = _mm512_set1_ps(rule.l1);
  const __m512 vscale = _mm512_set1_ps(scale);
  const __m512 beta = _mm512_set1_ps(rule.beta);
  const __m512 l2 = _mm512_set1_ps(rule.l2);
  const __m512 sign = _mm512_castsi512_ps(_mm512_set1_epi32(INT32_MIN));
  const __m512i exponent = _mm512_set1_epi32(0x7f800000);
  size_t kept = 0;
  for (size_t group = 0; group < groups; ++group) {
    float* const e = first + kFtrlEntryFloats * kFtrlLanes * group;
    const __m512 a[3] = {_mm512_loadu_ps(e), _mm512_loadu_ps(e + 16),
                         _mm512_loadu_ps(e + 32)};
    __m512 field[3];
    for (int f = 0; f < 3; ++f) {
      const __m512 lo = _mm512_permutex2var_ps(
          a[0], _mm512_load_si512(kConsecutive.lo[f]), a[1]);
      field[f] = _mm512_permutex2var_ps(
          lo, _mm512_load_si512(kConsecutive.hi[f]), a[2]);
    }
    const __m512 w = field[0], z = field[1], acc = field[2];
    // FtrlRule::Step.
    const __m512 gi =
        _mm512_mul_ps(vscale, _mm512_loadu_ps(g + kFtrlLanes * group));
    const __m512 acc_new = _mm512_add_ps(acc, _mm512_mul_ps(gi, gi));
    const __m512 sqrt_new = _mm512_sqrt_ps(acc_new);
    const __m512 sigma =
        _mm512_mul_ps(_mm512_sub_ps(sqrt_new, _mm512_sqrt_ps(acc)), inv_alpha);
    const __m512 z_new =
        _mm512_add_ps(z, _mm512_sub_ps(gi, _mm512_mul_ps(sigma, w)));
    const __mmask16 negative =
        _mm512_cmp_ps_mask(z_new, _mm512_setzero_ps(), _CMP_LT_OQ);
    const __m512 signed_l1 = _mm512_mask_blend_ps(
        negative, l1,
        _mm512_castsi512_ps(_mm512_xor_si512(_mm512_castps_si512(l1),
                                             _mm512_castps_si512(sign))));
    const __m512 numerator = _mm512_castsi512_ps(
        _mm512_xor_si512(_mm512_castps_si512(_mm512_sub_ps(z_new, signed_l1)),
                         _mm512_castps_si512(sign)));
    const __m512 denominator = _mm512_add_ps(
        _mm512_mul_ps(_mm512_add_ps(beta, sqrt_new), inv_alpha), l2);
    const __m512 abs_z = _mm512_castsi512_ps(_mm512_andnot_si512(
        _mm512_castps_si512(sign), _mm512_castps_si512(z_new)));
    const __mmask16 over = _mm512_cmp_ps_mask(abs_z, l1, _CMP_GT_OQ);
    const __m512 w_new =
        _mm512_maskz_div_ps(over, numerator, denominator);  // else +0
    // Finite (optimizer.h): the exponent bits not all set, in all three.
    const __mmask16 ok =
        _mm512_cmpneq_epi32_mask(
            _mm512_and_si512(_mm512_castps_si512(w_new), exponent), exponent) &
        _mm512_cmpneq_epi32_mask(
            _mm512_and_si512(_mm512_castps_si512(z_new), exponent), exponent) &
        _mm512_cmpneq_epi32_mask(
            _mm512_and_si512(_mm512_castps_si512(acc_new), exponent), exponent);
    const __m512 out[3] = {_mm512_mask_blend_ps(ok, w, w_new),
                           _mm512_mask_blend_ps(ok, z, z_new),
                           _mm512_mask_blend_ps(ok, acc, acc_new)};
    for (int j = 0; j < 3; ++j) {
      const __m512 wz = _mm512_permutex2var_ps(
          out[0], _mm512_load_si512(kConsecutive.wz[j]), out[1]);
      _mm512_storeu_ps(e + 16 * j,
                       _mm512_mask_permutexvar_ps(
                           wz, kConsecutive.n_mask[j],
                           _mm512_load_si512(kConsecutive.n_at[j]), out[2]));
    }
    kept += kFtrlLanes - static_cast<size_t>(__builtin_popcount(ok));
  }
  return kept;
}

// FtrlLanesConsecutive in AVX2, for CPUs without AVX-512: the AVX-512
// version's operations 8 lanes a vector, two vectors a group (the same
// bits as FtrlRule::Step, lane by lane). Each vector's 8 entries (24
// floats: w z n, w z n, ...) are split into w, z and n by two blends and
// a permute each, and joined back the same way. The compiler's clone of
// the portable loop spent 53 % of a key-cached push's samples on an AMD
// EPYC of the first Zen (no AVX-512), gathering the fields float by float
// and testing finiteness through a chain of shuffles.
// Float k of vectors a0 a1 a2 (24 floats) is field k % 3 of entry k / 3.
// Blend<A1, A2>(a0, a1, a2): a1's floats at the positions A1, a2's at A2,
// a0's elsewhere. Field f's floats, blended by kBlends[f], are entries'
// fields in a fixed order, put in entry order by to_lanes; joined back,
// from_lanes (the inverse permutes) put each field at the positions of the
// same blend.
template <int kA1, int kA2>
__attribute__((target("avx2"), always_inline)) inline __m256 Blend(
    __m256 a0, __m256 a1, __m256 a2) {
  return _mm256_blend_ps(_mm256_blend_ps(a0, a1, kA1), a2, kA2);
}
struct Avx2Permutes {
  alignas(32) int32_t to_lanes[3][8];
  alignas(32) int32_t from_lanes[3][8];
};
constexpr Avx2Permutes kAvx2Permutes = {
    {{0, 3, 6, 1, 4, 7, 2, 5}, {1, 4, 7, 2, 5, 0, 3, 6},
     {2, 5, 0, 3, 6, 1, 4, 7}},
    {{0, 3, 6, 1, 4, 7, 2, 5}, {5, 0, 3, 6, 1, 4, 7, 2},
     {2, 5, 0, 3, 6, 1, 4, 7}},
};
__attribute__((target("avx2"), always_inline)) inline __m256i NonFinite(
    __m256 x) {
  const __m256i exponent = _mm256_set1_epi32(0x7f800000);
  return _mm256_cmpeq_epi32(
      _mm256_and_si256(_mm256_castps_si256(x), exponent), exponent);
}
__attribute__((target("avx2"), always_inline)) inline __m256 Permute(
    __m256 x, const int32_t* index) {
  return _mm256_permutevar8x32_ps(
      x, _mm256_load_si256(reinterpret_cast<const __m256i*>(index)));
}

__attribute__((target("avx2"))) size_t FtrlLanesConsecutiveAvx2(
    const optimizer_internal::FtrlRule& rule, float* first, const float* g,
    float scale, size_t groups) {
  static_assert(kFtrlLanes == 16 && kFtrlEntryFloats == 3);
  const __m256 inv_alpha = _mm256_set1_ps(rule.inv_alpha);
  const __m256 l1 = _mm256_set1_ps(rule.l1);
  const __m256 beta = _mm256_set1_ps(rule.beta);
  const __m256 l2 = _mm256_set1_ps(rule.l2);
  const __m256 vscale = _mm256_set1_ps(scale);
  const __m256 sign = _mm256_castsi256_ps(_mm256_set1_epi32(INT32_MIN));
  const auto& pm = kAvx2Permutes;
  size_t kept = 0;
  for (size_t h = 0; h < 2 * groups; ++h) {
    float* const e = first + 24 * h;
    const __m256 a0 = _mm256_loadu_ps(e);
    const __m256 a1 = _mm256_loadu_ps(e + 8);
    const __m256 a2 = _mm256_loadu_ps(e + 16);
    const __m256 w = Permute(Blend<0x92, 0x24>(a0, a1, a2), pm.to_lanes[0]);
    const __m256 z = Permute(Blend<0x24, 0x49>(a0, a1, a2), pm.to_lanes[1]);
    const __m256 acc =
        Permute(Blend<0x49, 0x92>(a0, a1, a2), pm.to_lanes[2]);
    // FtrlRule::Step.
    const __m256 gi = _mm256_mul_ps(vscale, _mm256_loadu_ps(g + 8 * h));
    const __m256 acc_new = _mm256_add_ps(acc, _mm256_mul_ps(gi, gi));
    const __m256 sqrt_new = _mm256_sqrt_ps(acc_new);
    const __m256 sigma = _mm256_mul_ps(
        _mm256_sub_ps(sqrt_new, _mm256_sqrt_ps(acc)), inv_alpha);
    const __m256 z_new =
        _mm256_add_ps(z, _mm256_sub_ps(gi, _mm256_mul_ps(sigma, w)));
    const __m256 negative =
        _mm256_cmp_ps(z_new, _mm256_setzero_ps(), _CMP_LT_OQ);
    const __m256 signed_l1 =
        _mm256_blendv_ps(l1, _mm256_xor_ps(l1, sign), negative);
    const __m256 numerator =
        _mm256_xor_ps(_mm256_sub_ps(z_new, signed_l1), sign);
    const __m256 denominator = _mm256_add_ps(
        _mm256_mul_ps(_mm256_add_ps(beta, sqrt_new), inv_alpha), l2);
    const __m256 over =
        _mm256_cmp_ps(_mm256_andnot_ps(sign, z_new), l1, _CMP_GT_OQ);
    const __m256 w_new =
        _mm256_and_ps(over, _mm256_div_ps(numerator, denominator));  // or +0
    // Finite (optimizer.h): the exponent bits not all set, in all three.
    const __m256 bad = _mm256_castsi256_ps(_mm256_or_si256(
        NonFinite(w_new),
        _mm256_or_si256(NonFinite(z_new), NonFinite(acc_new))));
    kept += static_cast<size_t>(__builtin_popcount(
        static_cast<unsigned>(_mm256_movemask_ps(bad))));
    const __m256 w_out =
        Permute(_mm256_blendv_ps(w_new, w, bad), pm.from_lanes[0]);
    const __m256 z_out =
        Permute(_mm256_blendv_ps(z_new, z, bad), pm.from_lanes[1]);
    const __m256 acc_out =
        Permute(_mm256_blendv_ps(acc_new, acc, bad), pm.from_lanes[2]);
    // Vector q takes z and n where field 1's and 2's blends took them from
    // vector q, w elsewhere.
    _mm256_storeu_ps(e, Blend<0x92, 0x24>(w_out, z_out, acc_out));
    _mm256_storeu_ps(e + 8, Blend<0x24, 0x49>(w_out, z_out, acc_out));
    _mm256_storeu_ps(e + 16, Blend<0x49, 0x92>(w_out, z_out, acc_out));
  }
  return kept;
}

const bool kHaveAvx512 = CpuHasAvx512F();
const bool kHaveAvx2 = CpuHasAvx2();
const bool kHaveAvx512Dq = CpuHasAvx512Dq();

// The dense-id lookup of 8 keys ahead: ids[i % kDenseRing ...] =
// FeatureOf(keys[i + j]) for j < 8 (lanes past n hold garbage, never read).
constexpr size_t kDenseRing = 64;
__attribute__((target("avx512f,avx512dq"), always_inline)) inline void
DenseIds8(const uint64_t* keys, size_t i, size_t n, __m512i field,
          uint64_t* ids) {
  const size_t left = n - i;
  const __mmask8 valid =
      left >= 8 ? __mmask8{0xff} : static_cast<__mmask8>((1u << left) - 1);
  __m512i x = _mm512_maskz_loadu_epi64(valid, keys + i);
  // UnMix64 (common/hash.h), lane by lane.
  x = _mm512_ternarylogic_epi64(x, _mm512_srli_epi64(x, 31),
                                _mm512_srli_epi64(x, 62), 0x96);  // a^b^c
  x = _mm512_mullo_epi64(x, _mm512_set1_epi64(0x319642b2d24d8ec3LL));
  x = _mm512_ternarylogic_epi64(x, _mm512_srli_epi64(x, 27),
                                _mm512_srli_epi64(x, 54), 0x96);
  x = _mm512_mullo_epi64(x, _mm512_set1_epi64(
                                static_cast<int64_t>(0x96de1b173f119089ULL)));
  x = _mm512_ternarylogic_epi64(x, _mm512_srli_epi64(x, 30),
                                _mm512_srli_epi64(x, 60), 0x96);
  x = _mm512_sub_epi64(x, _mm512_set1_epi64(0x9e3779b97f4a7c15LL));
  _mm512_store_si512(ids + i % kDenseRing, _mm512_xor_si512(x, field));
}

// slots[i] = the slot the dense-id index gives keys[i] in `range`, or
// kNoSlot where the key is no dense id or its entry does not name the
// range (the caller then asks the range's map), i < n: 8 keys a step (ids
// computed and entries loaded 32 keys ahead, the entries gathered). The
// scalar loop (FindSlot per key) was 44 % of a dense-id push's samples.
__attribute__((target("avx512f,avx512dq"))) void DenseSlotsAvx512(
    const uint64_t* index, uint64_t limit, int range, const uint64_t* keys,
    size_t n, uint32_t* slots) {
  constexpr size_t kAhead = 32;
  static_assert(kAhead % 8 == 0 && kAhead + 8 <= kDenseRing);
  alignas(64) uint64_t ids[kDenseRing];
  const __m512i field =
      _mm512_set1_epi64(static_cast<int64_t>(Mix64(0x51ed27a3ULL)));
  const __m512i vlimit = _mm512_set1_epi64(static_cast<int64_t>(limit));
  const __m512i vrange = _mm512_set1_epi64(range);
  const __m512i none = _mm512_set1_epi64(Table::kNoSlot);
  const __m512i one = _mm512_set1_epi64(1);
  auto prefetch = [&](size_t from) {  // ids[from, min(from + 8, n))
    for (size_t j = from; j < std::min(from + 8, n); ++j) {
      const uint64_t id = ids[j % kDenseRing];
      if (id < limit) __builtin_prefetch(index + id);
    }
  };
  for (size_t i = 0; i < std::min(n, kAhead); i += 8) {
    DenseIds8(keys, i, n, field, ids);
    prefetch(i);
  }
  for (size_t i = 0; i < n; i += 8) {
    if (i + kAhead < n) {
      DenseIds8(keys, i + kAhead, n, field, ids);
      prefetch(i + kAhead);
    }
    const size_t left = n - i;
    const __mmask8 valid =
        left >= 8 ? __mmask8{0xff} : static_cast<__mmask8>((1u << left) - 1);
    const __m512i id = _mm512_load_si512(ids + i % kDenseRing);
    const __mmask8 dense = _mm512_mask_cmplt_epu64_mask(valid, id, vlimit);
    const __m512i v = _mm512_mask_i64gather_epi64(_mm512_setzero_si512(),
                                                  dense, id, index, 8);
    // Entry (range << 32) | (slot + 1): 0 names no range.
    const __mmask8 hit = _mm512_mask_cmpeq_epi64_mask(
        _mm512_mask_cmpneq_epi64_mask(dense, v, _mm512_setzero_si512()),
        _mm512_srli_epi64(v, 32), vrange);
    const __m512i slot =
        _mm512_mask_sub_epi64(none, hit, v, one);  // low 32 bits: the slot
    _mm512_mask_cvtepi64_storeu_epi32(slots + i, valid, slot);
  }
}
// DenseSlotsAvx512 on a CPU with AVX2 but not AVX-512: 4 feature ids
// computed at once, each entry loaded 56 keys ahead and read as the
// portable loop reads it (AVX2's gather is no faster than the loads).
// AMD EPYC Zen 3 (2 vCPUs, family 25 model 1), store_bench 1000000 100000 1
// 1, 6 interleaved pairs: push to stored keys 121-163 -> 157-180 M keys/s
// (faster in every pair), pull 116-155 -> 147-164; batches of 1k, 3 pairs:
// push 75-102 -> 96-113, pull 98-122 -> 114-132.
__attribute__((target("avx2"))) void DenseSlotsAvx2(const uint64_t* index,
                                                    uint64_t limit, int range,
                                                    const uint64_t* keys,
                                                    size_t n, uint32_t* slots) {
  constexpr size_t kAhead = 56;
  static_assert(kAhead % 4 == 0 && kAhead + 4 <= kDenseRing);
  alignas(32) uint64_t ids[kDenseRing];
  const uint64_t field_scalar = Mix64(0x51ed27a3ULL);
  const __m256i field = _mm256_set1_epi64x(static_cast<int64_t>(field_scalar));
  // ids of keys[i, min(i + 4, n)), i a multiple of 4, each prefetched.
  auto ids4 = [&](size_t i) __attribute__((target("avx2"))) {
    if (n - i >= 4) {
      const __m256i x =
          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(keys + i));
      _mm256_store_si256(reinterpret_cast<__m256i*>(ids + i % kDenseRing),
                         _mm256_xor_si256(hash_avx2::UnMix64x4(x), field));
    } else {
      for (size_t j = i; j < n; ++j) {
        ids[j % kDenseRing] = UnMix64(keys[j]) ^ field_scalar;
      }
    }
    for (size_t j = i; j < std::min(i + 4, n); ++j) {
      const uint64_t id = ids[j % kDenseRing];
      if (id < limit) __builtin_prefetch(index + id);
    }
  };
  for (size_t i = 0; i < std::min(n, kAhead); i += 4) ids4(i);
  for (size_t i = 0; i < n; ++i) {
    if (const size_t ahead = i + kAhead; ahead < n && ahead % 4 == 0) {
      ids4(ahead);
    }
    const uint64_t id = ids[i % kDenseRing];
    // Entry (range << 32) | (slot + 1): 0 names no range.
    const uint64_t v =
        id < limit ? LoadEntry(const_cast<uint64_t*>(index + id)) : 0;
    slots[i] = v != 0 && static_cast<int>(v >> 32) == range
                   ? static_cast<uint32_t>(v) - 1
                   : Table::kNoSlot;
  }
}
#endif

// DenseSlotsAvx512 without vector instructions (what other CPUs run): each
// key's feature id computed once and its index entry loaded 64 keys ahead.
// Per key, FindSlot after a PrefetchKey 16 ahead computed every id twice
// and waited on the entries. On an AMD EPYC of the first Zen (no AVX-512),
// store_bench 1000000 100000 1 1, 4 interleaved pairs: push to stored keys
// 60-66 -> 82-88 M keys/s, pull 69-76 -> 99-111; batches of 1k, 3 pairs:
// 47-48 -> 58-63, 63-64 -> 78-88.
void DenseSlotsPortable(const uint64_t* index, uint64_t limit, int range,
                        const uint64_t* keys, size_t n, uint32_t* slots) {
  constexpr size_t kAhead = 64;
  static_assert(std::has_single_bit(kAhead));
  uint64_t ids[kAhead];
  for (size_t i = 0; i < std::min(n, kAhead); ++i) {
    ids[i] = FeatureOf(keys[i]);
    if (ids[i] < limit) __builtin_prefetch(index + ids[i]);
  }
  for (size_t i = 0; i < n; ++i) {
    const uint64_t id = ids[i % kAhead];
    if (i + kAhead < n) {
      const uint64_t later = FeatureOf(keys[i + kAhead]);
      ids[i % kAhead] = later;
      if (later < limit) __builtin_prefetch(index + later);
    }
    // Entry (range << 32) | (slot + 1): 0 names no range.
    const uint64_t v = id < limit ? LoadEntry(
                                        const_cast<uint64_t*>(index + id))
                                  : 0;
    slots[i] = v != 0 && static_cast<int>(v >> 32) == range
                   ? static_cast<uint32_t>(v) - 1
                   : Table::kNoSlot;
  }
}

// FtrlLanesConsecutive by `isa` (which the CPU must run).
using table_internal::FtrlIsa;
// `groups` groups of kFtrlLanes consecutive slots, one after the other.
size_t FtrlLanesConsecutiveOn(FtrlIsa isa,
                              const optimizer_internal::FtrlRule& rule,
                              float* first, const float* g, float scale,
                              size_t groups) {
#if defined(__x86_64__)
  if (isa == FtrlIsa::kAvx512) {
    return FtrlLanesConsecutiveAvx512(rule, first, g, scale, groups);
  }
  if (isa == FtrlIsa::kAvx2) {
    return FtrlLanesConsecutiveAvx2(rule, first, g, scale, groups);
  }
#endif
  size_t kept = 0;
  for (size_t j = 0; j < groups; ++j) {
    kept +=
        FtrlLanesConsecutive(rule, first + kFtrlEntryFloats * kFtrlLanes * j,
                             g + kFtrlLanes * j, scale);
  }
  return kept;
}

// The widest FtrlLanesConsecutive the CPU runs.
#if defined(__x86_64__)
const FtrlIsa kBestFtrl = kHaveAvx512 ? FtrlIsa::kAvx512
                          : kHaveAvx2 ? FtrlIsa::kAvx2
                                      : FtrlIsa::kPortable;
#else
constexpr FtrlIsa kBestFtrl = FtrlIsa::kPortable;
#endif

// Out of line: inlined, the dispatch cost the random slots' loop in
// ApplyAt 10 %.
__attribute__((noinline)) size_t FtrlLanesConsecutiveBest(
    const optimizer_internal::FtrlRule& rule, float* first, const float* g,
    float scale, size_t groups) {
  return FtrlLanesConsecutiveOn(kBestFtrl, rule, first, g, scale, groups);
}

// SGD over one long row (a dense table's key: a row of dim floats), in the
// widest vector registers the CPU has, as FtrlLanes; the same bits as
// SgdRule::Apply inlined.
constexpr size_t kLongRow = Table::kLongRowFloats;
PS_CLONES size_t SgdRow(const optimizer_internal::SgdRule& rule, float* w,
                        const float* g, float scale, size_t n) {
  return rule.Apply(w, nullptr, g, scale, n);
}

// SgdRow for a push checked as it is applied (Table::Push's `non_finite`):
// also copies each element's value before the update to old[0 .. n), and
// clears *finite where a gradient is NaN or infinite (the element then
// left as it was, as SgdRule::Apply leaves a non-finite result). One pass:
// a check of its own before the update read a 4 MiB dense push's
// gradients a second time, from the worker's core's cache, which cost as
// much as the update (30 % of the push's samples against SgdRow's 38 %).
// The vector versions stream `old` (written once, and read only to put a
// refused push back). Elements one at a time (by SgdRule::Apply, the same
// bits) until old is on a vector boundary and after the last whole
// vector; in between, the rule's arithmetic lane by lane in the order it
// is written (no fused multiply-add).
size_t SgdKeepingOneByOne(const optimizer_internal::SgdRule& rule, float* w,
                          const float* g, float scale, float* old, size_t first,
                          size_t last, bool* bad) {
  size_t kept = 0;
  for (size_t i = first; i < last; ++i) {
    old[i] = w[i];
    *bad |= optimizer_internal::Finite(g[i]) == 0;
    kept += rule.Apply(w + i, nullptr, g + i, scale, 1);
  }
  return kept;
}

size_t SgdRowKeepingPortable(const optimizer_internal::SgdRule& rule, float* w,
                             const float* g, float scale, size_t n, float* old,
                             bool* finite) {
  bool bad = false;
  const size_t kept = SgdKeepingOneByOne(rule, w, g, scale, old, 0, n, &bad);
  if (bad) *finite = false;
  return kept;
}

// Elements before old + result are on a `bytes` boundary (at most n).
size_t ToBoundary(const float* old, size_t n, size_t bytes) {
  return std::min(n,
                  ((bytes - reinterpret_cast<uintptr_t>(old) % bytes) % bytes) /
                      sizeof(float));
}

#if defined(__x86_64__)
__attribute__((target("avx512f"))) size_t SgdRowKeepingAvx512(
    const optimizer_internal::SgdRule& rule, float* w, const float* g,
    float scale, size_t n, float* old, bool* finite) {
  bool bad = false;
  size_t i = ToBoundary(old, n, 64);
  size_t kept = SgdKeepingOneByOne(rule, w, g, scale, old, 0, i, &bad);
  const __m512i exp = _mm512_set1_epi32(0x7f800000);
  const __m512 lr = _mm512_set1_ps(rule.lr);
  const __m512 l2 = _mm512_set1_ps(rule.l2);
  const __m512 sc = _mm512_set1_ps(scale);
  const float t = rule.lr * rule.l1;
  const __m512 tv = _mm512_set1_ps(t);
  const __m512 neg_tv = _mm512_set1_ps(-t);
  const bool l1 = rule.l1 > 0;
  __mmask16 bad_lanes = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512 gv = _mm512_loadu_ps(g + i);
    const __m512 wv = _mm512_loadu_ps(w + i);
    bad_lanes |= _mm512_cmpeq_epi32_mask(
        _mm512_and_si512(_mm512_castps_si512(gv), exp), exp);
    _mm512_stream_ps(old + i, wv);
    // w - lr * (scale * g + l2 * w), each operation rounded on its own.
    const __m512 wi = _mm512_sub_ps(
        wv, _mm512_mul_ps(lr, _mm512_add_ps(_mm512_mul_ps(sc, gv),
                                            _mm512_mul_ps(l2, wv))));
    __m512 out = wi;
    if (l1) {
      // wi > t ? wi - t : (wi < -t ? wi + t : 0)
      out = _mm512_mask_mov_ps(
          _mm512_mask_mov_ps(_mm512_setzero_ps(),
                             _mm512_cmp_ps_mask(wi, neg_tv, _CMP_LT_OQ),
                             _mm512_add_ps(wi, tv)),
          _mm512_cmp_ps_mask(wi, tv, _CMP_GT_OQ), _mm512_sub_ps(wi, tv));
    }
    const __mmask16 not_finite = _mm512_cmpeq_epi32_mask(
        _mm512_and_si512(_mm512_castps_si512(wi), exp), exp);
    kept += static_cast<size_t>(__builtin_popcount(not_finite));
    _mm512_storeu_ps(w + i, _mm512_mask_mov_ps(out, not_finite, wv));
  }
  _mm_sfence();  // the streamed values seen by whoever puts them back
  kept += SgdKeepingOneByOne(rule, w, g, scale, old, i, n, &bad);
  if (bad || bad_lanes != 0) *finite = false;
  return kept;
}

// SgdRowKeepingAvx512 in 8 lanes.
__attribute__((target("avx2"))) size_t SgdRowKeepingAvx2(
    const optimizer_internal::SgdRule& rule, float* w, const float* g,
    float scale, size_t n, float* old, bool* finite) {
  bool bad = false;
  size_t i = ToBoundary(old, n, 32);
  size_t kept = SgdKeepingOneByOne(rule, w, g, scale, old, 0, i, &bad);
  const __m256i exp = _mm256_set1_epi32(0x7f800000);
  const __m256 lr = _mm256_set1_ps(rule.lr);
  const __m256 l2 = _mm256_set1_ps(rule.l2);
  const __m256 sc = _mm256_set1_ps(scale);
  const float t = rule.lr * rule.l1;
  const __m256 tv = _mm256_set1_ps(t);
  const __m256 neg_tv = _mm256_set1_ps(-t);
  const bool l1 = rule.l1 > 0;
  __m256i bad_lanes = _mm256_setzero_si256();
  for (; i + 8 <= n; i += 8) {
    const __m256 gv = _mm256_loadu_ps(g + i);
    const __m256 wv = _mm256_loadu_ps(w + i);
    bad_lanes = _mm256_or_si256(
        bad_lanes, _mm256_cmpeq_epi32(
                       _mm256_and_si256(_mm256_castps_si256(gv), exp), exp));
    _mm256_stream_ps(old + i, wv);
    const __m256 wi = _mm256_sub_ps(
        wv, _mm256_mul_ps(lr, _mm256_add_ps(_mm256_mul_ps(sc, gv),
                                            _mm256_mul_ps(l2, wv))));
    __m256 out = wi;
    if (l1) {
      out = _mm256_blendv_ps(
          _mm256_blendv_ps(_mm256_setzero_ps(), _mm256_add_ps(wi, tv),
                           _mm256_cmp_ps(wi, neg_tv, _CMP_LT_OQ)),
          _mm256_sub_ps(wi, tv), _mm256_cmp_ps(wi, tv, _CMP_GT_OQ));
    }
    const __m256 not_finite = _mm256_castsi256_ps(_mm256_cmpeq_epi32(
        _mm256_and_si256(_mm256_castps_si256(wi), exp), exp));
    kept += static_cast<size_t>(__builtin_popcount(
        static_cast<unsigned>(_mm256_movemask_ps(not_finite))));
    _mm256_storeu_ps(w + i, _mm256_blendv_ps(out, wv, not_finite));
  }
  _mm_sfence();
  kept += SgdKeepingOneByOne(rule, w, g, scale, old, i, n, &bad);
  if (bad || !_mm256_testz_si256(bad_lanes, bad_lanes)) *finite = false;
  return kept;
}
#endif

size_t SgdRowKeepingOn(FtrlIsa isa, const optimizer_internal::SgdRule& rule,
                       float* w, const float* g, float scale, size_t n,
                       float* old, bool* finite) {
#if defined(__x86_64__)
  if (isa == FtrlIsa::kAvx512) {
    return SgdRowKeepingAvx512(rule, w, g, scale, n, old, finite);
  }
  if (isa == FtrlIsa::kAvx2) {
    return SgdRowKeepingAvx2(rule, w, g, scale, n, old, finite);
  }
#endif
  return SgdRowKeepingPortable(rule, w, g, scale, n, old, finite);
}

// The widest SgdRowKeeping the CPU runs (Table::ChecksFiniteWhileApplying
// only where it is a vector one).
#if defined(__x86_64__)
const FtrlIsa kBestSgdKeeping = kHaveAvx512 ? FtrlIsa::kAvx512
                                : kHaveAvx2 ? FtrlIsa::kAvx2
                                            : FtrlIsa::kPortable;
#else
constexpr FtrlIsa kBestSgdKeeping = FtrlIsa::kPortable;
#endif

size_t SgdRowKeeping(const optimizer_internal::SgdRule& rule, float* w,
                     const float* g, float scale, size_t n, float* old,
                     bool* finite) {
  return SgdRowKeepingOn(kBestSgdKeeping, rule, w, g, scale, n, old, finite);
}

// The update of columns [first, last) of one row of dim floats at `data`
// (value, then the state's kStateFloats floats per element).
template <typename Rule>
size_t UpdateColumns(const Rule& rule, float* data, size_t dim,
                     const float* g, float scale, size_t first, size_t last) {
  if constexpr (std::is_same_v<Rule, optimizer_internal::SgdRule>) {
    return SgdRow(rule, data + first, g + first, scale, last - first);
  } else {
    return rule.Apply(data + first, data + dim + Rule::kStateFloats * first,
                      g + first, scale, last - first);
  }
}

// Floats per part of a row split over a runner: at least 256 KiB of
// gradient (a helper's wake-up, tens of microseconds on a VM, is then a
// small share of its part), parts whole cache lines.
constexpr size_t kRowPartFloats = size_t{1} << 16;

// The runner to split each row of a push over: `rows` when the rows are
// long and it has helpers; else none (decided once per push, not per key).
ParallelRunner* RowRunner(ParallelRunner* rows, size_t dim) {
  return rows != nullptr && rows->parallelism() >= 2 &&
                 dim >= Table::kParallelRowFloats
             ? rows
             : nullptr;
}

// One long row's update in parts of its columns on `rows` (the same bits
// as one pass: elements are independent).
// update(first, last) for the parts [first, last) of a row of dim floats,
// on `rows`; returns the sum of what they return.
template <typename Update>
size_t InParts(size_t dim, ParallelRunner& rows, const Update& update) {
  const size_t parts = std::min(
      dim / kRowPartFloats, 4 * static_cast<size_t>(rows.parallelism()));
  std::atomic<size_t> kept{0};
  rows.Run(static_cast<int>(parts), [&](int j) {
    // Boundaries on 16 floats: no cache line written by two parts.
    const auto bound = [&](size_t k) {
      return k == parts ? dim : (dim * k / parts) & ~size_t{15};
    };
    const size_t part = static_cast<size_t>(j);
    kept.fetch_add(update(bound(part), bound(part + 1)),
                   std::memory_order_relaxed);
  });
  return kept.load(std::memory_order_relaxed);
}

template <typename Rule>
size_t UpdateRowInParts(const Rule& rule, float* data, size_t dim,
                        const float* g, float scale, ParallelRunner& rows) {
  return InParts(dim, rows, [&](size_t first, size_t last) {
    return UpdateColumns(rule, data, dim, g, scale, first, last);
  });
}

// The values a checked push's rows had before it (Table::Push's
// `non_finite`), on the thread that called Push (a part on a helper writes
// the caller's). Kept for the thread's next push up to kKeptOldFloats (a
// 16 MiB push); a larger one's is freed after it (Release), so that a
// server's threads do not each hold the largest push they ever saw.
class OldValues {
 public:
  static constexpr size_t kKeptOldFloats = size_t{4} << 20;
  explicit OldValues(size_t n) : buffer_(Buffer()) {
    if (buffer_.size < n) {
      buffer_.data.reset(new float[n]);  // uninitialised: written first
      buffer_.size = n;
    }
  }
  ~OldValues() {
    if (buffer_.size > kKeptOldFloats) buffer_ = {};
  }
  OldValues(const OldValues&) = delete;
  OldValues& operator=(const OldValues&) = delete;
  float* data() const { return buffer_.data.get(); }

 private:
  struct Floats {
    std::unique_ptr<float[]> data;
    size_t size = 0;
  };
  static Floats& Buffer() {
    thread_local Floats floats;
    return floats;
  }
  Floats& buffer_;
};

// SgdRowKeeping of one row, split as UpdateRowInParts splits it.
size_t SgdRowKeepingInParts(const optimizer_internal::SgdRule& rule,
                            float* data, size_t dim, const float* g,
                            float scale, float* old, bool* finite,
                            ParallelRunner& rows) {
  std::atomic<bool> all{true};
  const size_t kept = InParts(dim, rows, [&](size_t first, size_t last) {
    bool part = true;
    const size_t k = SgdRowKeeping(rule, data + first, g + first, scale,
                                   last - first, old + first, &part);
    if (!part) all.store(false, std::memory_order_relaxed);
    return k;
  });
  if (!all.load(std::memory_order_relaxed)) *finite = false;
  return kept;
}

// Whether keys are strictly ascending (so none repeats), as routing sends
// them.
bool StrictlyAscending(absl::Span<const uint64_t> keys) {
  for (size_t i = 1; i < keys.size(); ++i) {
    if (keys[i - 1] >= keys[i]) return false;
  }
  return true;
}

// Whether slots[0 .. kFtrlLanes) holds a slot twice.
bool AnyRepeated(const uint32_t* slots) {
  for (size_t a = 1; a < kFtrlLanes; ++a) {
    for (size_t b = 0; b < a; ++b) {
      if (slots[a] == slots[b]) return true;
    }
  }
  return false;
}

}  // namespace

namespace table_internal {

bool AllFinite(absl::string_view vals) {
  // Exponent bits all ones: NaN or infinity. Integer compare, no FP traps;
  // four lanes at a time (GCC/Clang vector extension: SSE2 on x86-64),
  // since a push's values are all read here before any is applied.
  using V = uint32_t __attribute__((vector_size(16)));
  constexpr uint32_t kExp = 0x7f800000u;
  const size_t n = vals.size() / sizeof(uint32_t);
  const char* p = vals.data();
  const V exp = {kExp, kExp, kExp, kExp};
  V bad = {0, 0, 0, 0};
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    V a, b, c, d;
    std::memcpy(&a, p + i * 4, sizeof(V));
    std::memcpy(&b, p + i * 4 + 16, sizeof(V));
    std::memcpy(&c, p + i * 4 + 32, sizeof(V));
    std::memcpy(&d, p + i * 4 + 48, sizeof(V));
    bad |= ((a & exp) == exp) | ((b & exp) == exp) | ((c & exp) == exp) |
           ((d & exp) == exp);
  }
  uint32_t any = bad[0] | bad[1] | bad[2] | bad[3];
  for (; i < n; ++i) {
    uint32_t bits;
    std::memcpy(&bits, p + i * sizeof(bits), sizeof(bits));
    any |= static_cast<uint32_t>((bits & kExp) == kExp);
  }
  return any == 0;
}

bool CpuRunsFtrl(FtrlIsa isa) {
  switch (isa) {
    case FtrlIsa::kPortable:
      return true;
#if defined(__x86_64__)
    case FtrlIsa::kAvx2:
      return kHaveAvx2;
    case FtrlIsa::kAvx512:
      return kHaveAvx512;
#endif
    default:
      return false;
  }
}

bool DenseSlotsWith(FtrlIsa isa, const uint64_t* index, uint64_t limit,
                    int range, const uint64_t* keys, size_t n,
                    uint32_t* slots) {
  switch (isa) {
    case FtrlIsa::kPortable:
      DenseSlotsPortable(index, limit, range, keys, n, slots);
      return true;
#if defined(__x86_64__)
    case FtrlIsa::kAvx2:
      if (!kHaveAvx2) return false;
      DenseSlotsAvx2(index, limit, range, keys, n, slots);
      return true;
    case FtrlIsa::kAvx512:
      if (!kHaveAvx512Dq) return false;
      DenseSlotsAvx512(index, limit, range, keys, n, slots);
      return true;
#endif
    default:
      return false;
  }
}

size_t FtrlConsecutiveWith(FtrlIsa isa,
                           const optimizer_internal::FtrlRule& rule,
                           float* first, const float* g, float scale,
                           size_t groups) {
  static_assert(kFtrlGroup == kFtrlLanes);
  ABSL_RAW_CHECK(CpuRunsFtrl(isa), "FtrlConsecutiveWith: not on this CPU");
  return FtrlLanesConsecutiveOn(isa, rule, first, g, scale, groups);
}

size_t SgdRowKeepingWith(FtrlIsa isa, const optimizer_internal::SgdRule& rule,
                         float* w, const float* g, float scale, size_t n,
                         float* old, bool* finite) {
  ABSL_RAW_CHECK(CpuRunsFtrl(isa), "SgdRowKeepingWith: not on this CPU");
  return SgdRowKeepingOn(isa, rule, w, g, scale, n, old, finite);
}

}  // namespace table_internal

// Out of line: the apply loops compile as they did before the journal
// (inlined here, the marks cost the plain push about 5 % in store_bench).
__attribute__((noinline)) void Table::MarkJournal(Partition& p,
                                                  const uint32_t* slots,
                                                  size_t n) {
  uint64_t* const dirty = p.journal.dirty.data();
  // By runs of consecutive slots (a request's, made in its order, mostly
  // are): a run's bits set a word at a time. Slot by slot, each or into
  // memory waited on the one before (65 % of this function's samples sat
  // on it), and with the bits gathered per word, the per-slot work still
  // made it 5 to 6 % of a replicated push's samples.
  size_t k = 0;
  while (k < n) {
    const uint64_t first = slots[k];
    size_t e = k + 1;
    // A run past its first 4 slots is checked 16 slots a step, their
    // differences from the run's or-ed (no branch or carried compare per
    // slot): slot by slot, finding the runs of a 100k-key push was 4 % of a
    // replicated push's CPU on a Zen 3 EPYC. Scattered slots end their runs
    // in the first 4, one by one, as before.
    while (e < n && e < k + 4 && slots[e] == slots[e - 1] + 1) ++e;
    if (e == k + 4) {
      // 16 slots a step in 4-lane vectors (SSE2 on x86-64, no dispatch).
      using V = uint32_t __attribute__((vector_size(16)));
      const V iota = {0, 1, 2, 3};
      while (e + 16 <= n) {
        const uint32_t base = static_cast<uint32_t>(first + (e - k));
        V off = {0, 0, 0, 0};
#pragma GCC unroll 4
        for (uint32_t j = 0; j < 16; j += 4) {
          V v;
          std::memcpy(&v, slots + e + j, sizeof(V));
          off |= v ^ (iota + (base + j));
        }
        uint64_t halves[2];
        std::memcpy(halves, &off, sizeof(halves));
        if ((halves[0] | halves[1]) != 0) break;
        e += 16;
      }
      while (e < n && slots[e] == slots[e - 1] + 1) ++e;
    }
    const uint64_t end = first + (e - k);
    k = e;
    if (end == first + 1) {
      dirty[first / 64] |= uint64_t{1} << (first % 64);
      continue;
    }
    for (uint64_t b = first; b < end;) {
      const uint64_t word_end = std::min(end, (b | 63) + 1);
      const uint64_t len = word_end - b;
      const uint64_t bits =
          (len == 64 ? ~uint64_t{0} : (uint64_t{1} << len) - 1) << (b % 64);
      dirty[b / 64] |= bits;
      b = word_end;
    }
  }
}

template <typename Rule>
void Table::ApplyAt(Partition& p, const Rule& rule,
                    absl::Span<const uint64_t> keys, const uint32_t* slots,
                    const float* grads, float scale, KeyOrder order,
                    ParallelRunner* rows, bool consecutive, bool* non_finite) {
  const size_t n = keys.size();
  const size_t dim = static_cast<size_t>(spec_.dim);
  ParallelRunner* const split = RowRunner(rows, dim);
  if (non_finite != nullptr) {
    *non_finite = false;
    if (!ChecksFiniteWhileApplying()) {
      if (!table_internal::AllFinite(absl::string_view(
              reinterpret_cast<const char*>(grads), n * dim * sizeof(float)))) {
        *non_finite = true;
        return;
      }
      non_finite = nullptr;  // checked
    }
  }
  // With `consecutive`, the slots from keys[i] to the end of its chunk.
  auto chunk_run = [&](size_t i) {
    return std::min(n - i,
                    SlotsToChunkEnd(slots[0] + static_cast<uint32_t>(i)));
  };
  size_t i = 0;
  size_t kept = 0;  // elements left as they were (optimizer.h)
  if constexpr (std::is_same_v<Rule, optimizer_internal::FtrlRule>) {
    // Consecutive slots of a dim-1 table: each chunk's run in one call (and
    // the run's last keys, short of a group, by the rule).
    if (dim == 1 && consecutive) {
      while (i < n) {
        const size_t len = chunk_run(i);
        const size_t groups = len / kFtrlLanes;
        float* const data = SlotData(p, slots[0] + static_cast<uint32_t>(i));
        if (groups > 0) {
          kept +=
              FtrlLanesConsecutiveBest(rule, data, grads + i, scale, groups);
        }
        for (size_t k = kFtrlLanes * groups; k < len; ++k) {
          float* const e = data + kFtrlEntryFloats * k;
          kept += rule.Apply(e, e + 1, grads + i + k, scale, 1);
        }
        i += len;
      }
      p.non_finite_updates += kept;
      return;
    }
  }
  for (size_t k = 0; k < std::min(n, kPrefetchDistance); ++k) {
    __builtin_prefetch(SlotData(p, slots[k]));
  }
  if constexpr (std::is_same_v<Rule, optimizer_internal::FtrlRule>) {
    // A dim-1 table (sparse LR, the common FTRL case): kFtrlLanes keys at a
    // time, unless a key repeats among them (then one by one below, in
    // order, as a repeated key must be).
    if (dim == 1) {
      const bool distinct =
          order == KeyOrder::kAscending || StrictlyAscending(keys);
      // Each entry's address is computed once, a group ahead: prefetched
      // then, used now. Computed twice (for the prefetch, then for the
      // update), the addresses took a fifth of a key-cached push's table
      // time (a 20000-key run: 3.45 -> 2.57 ns a key once). A group of
      // consecutive slots in one chunk needs no addresses but its first.
      static_assert(kFtrlEntryFloats * kFtrlLanes <= 64);
      auto consecutive = [&](size_t at) {
        const uint32_t first = slots[at];
        // Rejects a group of random slots at once.
        if (slots[at + kFtrlLanes - 1] != first + (kFtrlLanes - 1)) {
          return false;
        }
        if (uint64_t{first & chunk_mask_} + (kFtrlLanes - 1) >
            uint64_t{chunk_mask_}) {
          return false;
        }
        uint32_t off = 0;
        for (size_t k = 1; k < kFtrlLanes - 1; ++k) {
          off |= slots[at + k] ^ (first + static_cast<uint32_t>(k));
        }
        return off == 0;
      };
      // The whole groups of consecutive slots from `at` on, in the first
      // one's chunk (at least one: look_ahead found it). Tested a group at
      // a time in vector registers; slot by slot, the test of each slot
      // against the one before took as long as the update.
      auto consecutive_groups = [&](size_t at) {
        const uint32_t first = slots[at];
        const size_t limit =
            std::min(n - at, SlotsToChunkEnd(first)) / kFtrlLanes;
        size_t g = 1;
        for (; g < limit; ++g) {
          const uint32_t* group = slots + at + kFtrlLanes * g;
          const uint32_t base = first + static_cast<uint32_t>(kFtrlLanes * g);
#if defined(__x86_64__)
          // SSE2 (every x86-64): GCC left the portable loop scalar.
          __m128i want = _mm_add_epi32(_mm_set1_epi32(static_cast<int>(base)),
                                       _mm_setr_epi32(0, 1, 2, 3));
          __m128i off = _mm_setzero_si128();
          for (size_t k = 0; k < kFtrlLanes; k += 4) {
            off = _mm_or_si128(
                off,
                _mm_xor_si128(_mm_loadu_si128(
                                  reinterpret_cast<const __m128i*>(group + k)),
                              want));
            want = _mm_add_epi32(want, _mm_set1_epi32(4));
          }
          if (_mm_movemask_epi8(_mm_cmpeq_epi32(off, _mm_setzero_si128())) !=
              0xffff) {
            break;
          }
#else
          uint32_t off = 0;
          for (size_t k = 0; k < kFtrlLanes; ++k) {
            off |= group[k] ^ (base + static_cast<uint32_t>(k));
          }
          if (off != 0) break;
#endif
        }
        return g;
      };
      float* ring[2][kFtrlLanes];
      float** e = ring[0];
      float** ahead = ring[1];
      bool run_ahead = false;  // the next group's slots are consecutive
      // SlotData, on the chunks read here under the lock (a call in the
      // lambda would need the lock asserted there, at a cost per group).
      const std::unique_ptr<float[]>* const chunks = p.chunks.data();
      auto address = [&](uint32_t slot) {
        return chunks[slot >> chunk_shift_].get() +
               static_cast<size_t>(slot & chunk_mask_) * stride_;
      };
      auto look_ahead = [&](size_t at) {
        const size_t m = std::min(n - at, kFtrlLanes);
        run_ahead = m == kFtrlLanes && consecutive(at);
        if (run_ahead) {
          const float* first = address(slots[at]);
          for (size_t f = 0; f < kFtrlEntryFloats * kFtrlLanes; f += 16) {
            __builtin_prefetch(first + f);
          }
          __builtin_prefetch(first + kFtrlEntryFloats * kFtrlLanes - 1);
          return;
        }
        for (size_t k = 0; k < m; ++k) {
          ahead[k] = address(slots[at + k]);
          __builtin_prefetch(ahead[k]);
        }
      };
      if (n >= kFtrlLanes) look_ahead(0);
      while (i + kFtrlLanes <= n) {
        std::swap(e, ahead);
        if (run_ahead) {
          // The whole run of consecutive slots from here (to its chunk's
          // end) in one call: a loop over its groups with the rule's
          // constants in registers, no look-ahead per group. A group per
          // call, the calls and the look-ahead and test around each cost a
          // fifth of a key-cached push's table time (store_bench 200000
          // 100000: 440-467 -> 560-576 M keys/s).
          const size_t groups = consecutive_groups(i);
          kept += FtrlLanesConsecutiveBest(rule, SlotData(p, slots[i]),
                                           grads + i, scale, groups);
          i += kFtrlLanes * groups;
          if (i + kFtrlLanes <= n) look_ahead(i);
          continue;
        }
        if (i + kFtrlLanes < n) look_ahead(i + kFtrlLanes);
        if (!distinct && AnyRepeated(slots + i)) {
          for (size_t k = 0; k < kFtrlLanes; ++k) {
            kept += rule.Apply(e[k], e[k] + 1, grads + i + k, scale, 1);
          }
        } else {
          kept += FtrlLanes(rule, e, grads + i, scale);
        }
        i += kFtrlLanes;
      }
    }
  }
  if constexpr (std::is_same_v<Rule, optimizer_internal::SgdRule>) {
    if (non_finite != nullptr) {  // ChecksFiniteWhileApplying(): long rows
      const OldValues kept_aside(n * dim);
      float* const old = kept_aside.data();
      bool finite = true;
      for (; i < n; ++i) {
        float* data = SlotData(p, slots[i]);
        const float* g = grads + i * dim;
        float* const before = old + i * dim;
        kept += split != nullptr
                    ? SgdRowKeepingInParts(rule, data, dim, g, scale, before,
                                           &finite, *split)
                    : SgdRowKeeping(rule, data, g, scale, dim, before, &finite);
      }
      if (!finite) {
        // Back as they were, the last row first: a key the push repeats
        // ends as it began.
        for (size_t k = n; k-- > 0;) {
          std::memcpy(SlotData(p, slots[k]), old + k * dim,
                      dim * sizeof(float));
        }
        *non_finite = true;
        return;
      }
      p.non_finite_updates += kept;
      return;
    }
    if (dim >= kLongRow) {
      for (; i < n; ++i) {
        float* data = SlotData(p, slots[i]);
        const float* g = grads + i * dim;
        kept += split != nullptr
                    ? UpdateRowInParts(rule, data, dim, g, scale, *split)
                    : SgdRow(rule, data, g, scale, dim);
      }
      p.non_finite_updates += kept;
      return;
    }
    // Rows without state lie end to end: a run of consecutive slots is one
    // array of floats, updated by one Apply (which vectorises; the same
    // arithmetic per element as row by row). Key by key, a dim-1 SGD push
    // was 28 % of a 2S2W sparse push's samples.
    static_assert(optimizer_internal::SgdRule::kStateFloats == 0);
    while (i < n) {
      if (consecutive) {
        const size_t len = chunk_run(i);
        kept += rule.Apply(SlotData(p, slots[0] + static_cast<uint32_t>(i)),
                           nullptr, grads + i * dim, scale, len * dim);
        i += len;
        continue;
      }
      const size_t end = RunEnd(slots, i, n);
      if (end == i + 1 && i + kPrefetchDistance < n) {
        __builtin_prefetch(SlotData(p, slots[i + kPrefetchDistance]));
      }
      kept += rule.Apply(SlotData(p, slots[i]), nullptr, grads + i * dim,
                         scale, (end - i) * dim);
      i = end;
    }
    p.non_finite_updates += kept;
    return;
  }
  // at[j % kPrefetchDistance]: the address of slot j, for the keys j in
  // [i, i + kPrefetchDistance), each computed once (as the lanes' ring).
  static_assert(std::has_single_bit(kPrefetchDistance));
  float* at[kPrefetchDistance];
  for (size_t j = i; j < std::min(n, i + kPrefetchDistance); ++j) {
    at[j % kPrefetchDistance] = SlotData(p, slots[j]);
  }
  for (; i < n; ++i) {
    float* const data = at[i % kPrefetchDistance];
    if (i + kPrefetchDistance < n) {
      float* const later = SlotData(p, slots[i + kPrefetchDistance]);
      __builtin_prefetch(later);
      at[i % kPrefetchDistance] = later;
    }
    const float* g = grads + i * dim;
    kept += split != nullptr
                ? UpdateRowInParts(rule, data, dim, g, scale, *split)
                : rule.Apply(data, data + dim, g, scale, dim);
  }
  p.non_finite_updates += kept;
}

// Pull and Push make two passes: every key's slot first (the hash map
// prefetched ahead), then the values (each slot's floats prefetched
// ahead), so the cache misses of both overlap instead of the value's miss
// waiting on the map's, key after key.
void Table::Pull(int range, absl::Span<const uint64_t> keys, float* out,
                 uint32_t* slots, uint64_t* generation) const {
  const Partition& p = partition(range);
  const size_t dim = static_cast<size_t>(spec_.dim);
  const size_t n = keys.size();
  uint32_t* s = slots != nullptr ? slots : Scratch(n);
  absl::ReaderMutexLock l(&p.mu);
  if (generation != nullptr) *generation = p.generation;
  LookUpSlots(range, p, keys, nullptr, s);
  for (size_t i = 0; i < std::min(n, kPrefetchDistance); ++i) {
    if (s[i] != kNoSlot) __builtin_prefetch(SlotData(p, s[i]));
  }
  for (size_t i = 0; i < n; ++i) {
    if (i + kPrefetchDistance < n && s[i + kPrefetchDistance] != kNoSlot) {
      __builtin_prefetch(SlotData(p, s[i + kPrefetchDistance]));
    }
    float* dst = out + i * dim;
    if (s[i] == kNoSlot) {
      InitialValue(keys[i], dst);
    } else {
      CopyValue(dst, SlotData(p, s[i]), dim);
    }
  }
}

void Table::Push(int range, absl::Span<const uint64_t> keys, const float* grads,
                 float scale, uint32_t* slots, uint64_t* generation,
                 KeyOrder order, bool* journal, ParallelRunner* rows,
                 bool* non_finite) {
  Partition& p = partition(range);
  const size_t n = keys.size();
  uint32_t* s = slots != nullptr ? slots : Scratch(n);
  absl::MutexLock l(&p.mu);
  if (generation != nullptr) *generation = p.generation;
  const bool record = JournalTakes(p, n, journal);
  // One switch on the rule for the whole batch; Rule::Apply inlines here.
  optimizer_->Visit([&](const auto& rule) {
    p.mu.AssertHeld();  // tells the analysis the lambda runs under the lock
    // The stored keys' slots in one pass, then the others made.
    LookUpSlots(range, p, keys, nullptr, s);
    SlotsOrNew(range, p, rule, keys, s, s, record);
    // A key repeated in the call is updated once per occurrence, in order.
    ApplyAt(p, rule, keys, s, grads, scale, order, rows, false, non_finite);
    if (record) MarkJournal(p, s, keys.size());
  });
}

bool Table::PullSlots(int range, uint64_t generation,
                      absl::Span<const uint64_t> keys, const uint32_t* slots,
                      float* out) const {
  const Partition& p = partition(range);
  const size_t dim = static_cast<size_t>(spec_.dim);
  absl::ReaderMutexLock l(&p.mu);
  if (p.generation != generation) return false;
  for (size_t i = 0; i < std::min(keys.size(), kPrefetchDistance); ++i) {
    if (slots[i] != kNoSlot) __builtin_prefetch(SlotData(p, slots[i]));
  }
  for (size_t i = 0; i < keys.size(); ++i) {
    if (i + kPrefetchDistance < keys.size() &&
        slots[i + kPrefetchDistance] != kNoSlot) {
      __builtin_prefetch(SlotData(p, slots[i + kPrefetchDistance]));
    }
    float* dst = out + i * dim;
    if (slots[i] != kNoSlot) {
      CopyValue(dst, SlotData(p, slots[i]), dim);
      continue;
    }
    // Stored since it was resolved?
    const uint32_t slot = FindSlot(range, p, keys[i]);
    if (slot == kNoSlot) {
      InitialValue(keys[i], dst);
    } else {
      CopyValue(dst, SlotData(p, slot), dim);
    }
  }
  return true;
}

bool Table::PushSlots(int range, uint64_t generation,
                      absl::Span<const uint64_t> keys, const uint32_t* slots,
                      const float* grads, float scale, KeyOrder order,
                      uint32_t* resolved, bool* journal, bool complete,
                      ParallelRunner* rows, bool consecutive,
                      bool* non_finite) {
  Partition& p = partition(range);
  const size_t n = keys.size();
  if (journal != nullptr) *journal = false;
  absl::MutexLock l(&p.mu);
  if (p.generation != generation) return false;
  // Branch-free, so that it runs in vector registers (with an early return
  // it went key by key: 5 % of a key-cached push's samples).
  // slot + 1 wraps kNoSlot to 0, and is above num_slots for a slot out of
  // bounds.
  static_assert(kNoSlot == UINT32_MAX);
  uint32_t missing_keys = 0;
  uint32_t out_of_bounds = 0;
  const uint32_t num_slots = p.num_slots;
  // A complete list of this generation needs no check (5-7 % of a
  // key-cached push's samples).
  for (size_t i = 0; i < (complete ? 0 : n); ++i) {
    const uint32_t next = slots[i] + 1u;
    missing_keys |= static_cast<uint32_t>(next == 0);
    out_of_bounds |= static_cast<uint32_t>(next > num_slots);
  }
  if (out_of_bounds != 0) return false;
  const bool missing = missing_keys != 0;
  // Vouched for (complete and consecutive), but never past the slots.
  const bool run = complete && consecutive && n > 0 &&
                   uint64_t{slots[0]} + n <= uint64_t{num_slots};
  const bool record = JournalTakes(p, n, journal);
  optimizer_->Visit([&](const auto& rule) {
    p.mu.AssertHeld();
    const uint32_t* s = slots;
    if (missing) {
      // The keys the pull did not find, by key (created here, or stored
      // since).
      uint32_t* out = resolved != nullptr ? resolved : Scratch(n);
      SlotsOrNew(range, p, rule, keys, slots, out, record);
      s = out;
    } else if (resolved != nullptr) {
      std::memcpy(resolved, slots, n * sizeof(uint32_t));
    }
    ApplyAt(p, rule, keys, s, grads, scale, order, rows, run && !missing,
            non_finite);
    if (record) MarkJournal(p, s, keys.size());
  });
  return true;
}

bool Table::ChecksFiniteWhileApplying() const {
  return kBestSgdKeeping != FtrlIsa::kPortable &&
         optimizer_->kind() == OptimizerKind::kSgd &&
         static_cast<size_t>(spec_.dim) >= kLongRowFloats;
}

uint64_t Table::non_finite_updates() const {
  uint64_t n = 0;
  for (int r = 0; r < num_ranges_; ++r) {
    absl::ReaderMutexLock l(&partitions_[r].mu);
    n += partitions_[r].non_finite_updates;
  }
  return n;
}

size_t Table::size() const {
  size_t n = 0;
  for (int r = 0; r < num_ranges_; ++r) {
    absl::ReaderMutexLock l(&partitions_[r].mu);
    n += KeyCount(partitions_[r]);
  }
  return n;
}

size_t Table::nonzeros() const {
  const size_t dim = static_cast<size_t>(spec_.dim);
  size_t n = 0;
  for (int r = 0; r < num_ranges_; ++r) {
    const Partition& p = partitions_[r];
    absl::ReaderMutexLock l(&p.mu);
    for (uint32_t s = 0; s < p.num_slots; ++s) {
      if (!AllZero(SlotData(p, s), dim)) ++n;
    }
  }
  return n;
}

namespace {
// The permutation that sorts `keys` ascending, ties in their order, with
// `keys` sorted in place: a radix sort of the keys with their positions, a
// few linear passes (a digit all keys share, as the high ones of dense ids,
// is skipped), where std::sort of positions compared through the keys
// missed the cache on most comparisons (in the saves of the scale.yaml
// job's 2.5M keys a server, perf's samples of the sort fell from 204 to
// 127).
std::vector<uint32_t> SortWithOrder(std::vector<uint64_t>* keys) {
  std::vector<uint32_t> order(keys->size());
  std::iota(order.begin(), order.end(), uint32_t{0});
  std::vector<uint64_t> key_tmp;
  std::vector<uint32_t> order_tmp;
  RadixSortWithPayload(keys, &order, &key_tmp, &order_tmp);
  return order;
}
}  // namespace

void Table::Gather(bool nonzero_only, const std::vector<int>* ranges,
                   std::vector<uint64_t>* keys,
                   std::vector<float>* values) const {
  const size_t dim = static_cast<size_t>(spec_.dim);
  std::vector<int> all;
  if (ranges == nullptr) {
    for (int r = 0; r < num_ranges_; ++r) all.push_back(r);
    ranges = &all;
  }
  // Room for every range's keys at once: reserving range by range grew
  // (and copied) the vectors once per range.
  size_t expected = 0;
  for (int r : *ranges) {
    if (r < 0 || r >= num_ranges_) continue;
    const Partition& p = partitions_[r];
    absl::ReaderMutexLock l(&p.mu);
    expected += KeyCount(p);
  }
  std::vector<uint64_t> raw_keys;
  std::vector<float> raw_values;
  raw_keys.reserve(expected);
  raw_values.reserve(expected * dim);
  for (int r : *ranges) {
    if (r < 0 || r >= num_ranges_) continue;
    const Partition& p = partitions_[r];
    absl::ReaderMutexLock l(&p.mu);
    ForEachKey(p, [&](uint64_t key, uint32_t slot) {
      p.mu.AssertReaderHeld();
      const float* v = SlotData(p, slot);
      if (nonzero_only && AllZero(v, dim)) return;
      raw_keys.push_back(key);
      raw_values.insert(raw_values.end(), v, v + dim);
    });
  }
  // Ties (a key wrongly used with two ranges) break by gather position, so
  // the output stays deterministic.
  const size_t n = raw_keys.size();
  auto take_values = [&](const auto& order) {
    values->resize(n * dim);
    for (size_t i = 0; i < n; ++i) {
      std::memcpy(values->data() + i * dim,
                  raw_values.data() + size_t{order[i]} * dim,
                  dim * sizeof(float));
    }
  };
  if (n <= std::numeric_limits<uint32_t>::max()) {
    take_values(SortWithOrder(&raw_keys));
  } else {  // more keys than a 32-bit position can name
    std::vector<size_t> order(n);
    std::iota(order.begin(), order.end(), size_t{0});
    std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
      return raw_keys[a] < raw_keys[b];
    });
    take_values(order);
    std::sort(raw_keys.begin(), raw_keys.end());
  }
  *keys = std::move(raw_keys);
}

void Table::ExportRange(int range, std::vector<uint64_t>* keys,
                        std::vector<float>* entries) const {
  const Partition& p = partition(range);
  // Copied under the lock in map order, sorted after it is released, so a
  // push to this range waits for a copy, never for a sort.
  std::vector<uint64_t> raw_keys;
  std::vector<float> raw;
  {
    absl::ReaderMutexLock l(&p.mu);
    raw_keys.reserve(KeyCount(p));
    raw.resize(KeyCount(p) * stride_);
    float* out = raw.data();
    ForEachKey(p, [&](uint64_t key, uint32_t slot) {
      p.mu.AssertReaderHeld();
      raw_keys.push_back(key);
      std::memcpy(out, SlotData(p, slot), stride_ * sizeof(float));
      out += stride_;
    });
  }
  // (A slot number is 32 bits: a range has fewer than 2^32 keys.)
  const std::vector<uint32_t> order = SortWithOrder(&raw_keys);
  entries->resize(order.size() * stride_);
  for (size_t i = 0; i < order.size(); ++i) {
    std::memcpy(entries->data() + i * stride_,
                raw.data() + static_cast<size_t>(order[i]) * stride_,
                stride_ * sizeof(float));
  }
  *keys = std::move(raw_keys);
}

void Table::LookUpSlots(int range, const Partition& p,
                        absl::Span<const uint64_t> keys, const uint32_t* known,
                        uint32_t* slots) const {
  const size_t n = keys.size();
  if (known != nullptr) {
    for (size_t i = 0; i < n; ++i) {
      if (i + kPrefetchDistance < n &&
          known[i + kPrefetchDistance] >= p.num_slots) {
        PrefetchKey(p, keys[i + kPrefetchDistance]);  // kNoSlot included
      }
      slots[i] = known[i] != kNoSlot && known[i] < p.num_slots
                     ? known[i]
                     : FindSlot(range, p, keys[i]);
    }
    return;
  }
  if (dense_index_ == nullptr) {
    p.slots.FindMany(keys.data(), n, slots, kNoSlot);
    return;
  }
#if defined(__x86_64__)
  if (kHaveAvx512Dq) {
    DenseSlotsAvx512(dense_index_.get(), spec_.dense_ids, range, keys.data(),
                     n, slots);
  } else if (kHaveAvx2) {
    DenseSlotsAvx2(dense_index_.get(), spec_.dense_ids, range, keys.data(), n,
                   slots);
  } else {
    DenseSlotsPortable(dense_index_.get(), spec_.dense_ids, range,
                       keys.data(), n, slots);
  }
#else
  DenseSlotsPortable(dense_index_.get(), spec_.dense_ids, range, keys.data(),
                     n, slots);
#endif
  if (p.slots.empty()) return;
  for (size_t i = 0; i < n; ++i) {  // not through the index: the map
    if (slots[i] == kNoSlot) slots[i] = p.slots.Find(keys[i], kNoSlot);
  }
}

namespace {
// Which slots a delta has out already: a bitmap kept by the thread, grown
// to the largest range it exported, all zero between calls (callers clear
// the words they set), so that a delta of a few rows costs the rows, not
// the size of their range.
std::vector<uint64_t>& SeenSlots(uint32_t num_slots) {
  thread_local std::vector<uint64_t> seen;
  if (seen.size() < (size_t{num_slots} + 63) / 64) {
    seen.resize((size_t{num_slots} + 63) / 64);
  }
  return seen;
}
}  // namespace

void Table::ExportKeys(int range, absl::Span<const uint64_t> keys,
                       const uint32_t* known, uint64_t generation,
                       std::vector<uint64_t>* out_keys,
                       std::vector<float>* entries) const {
  const Partition& p = partition(range);
  const size_t n = keys.size();
  uint32_t* slots = Scratch(n);
  out_keys->reserve(out_keys->size() + n);
  const size_t at = entries->size();
  entries->resize(at + n * stride_);
  float* out = entries->data() + at;
  absl::ReaderMutexLock l(&p.mu);
  // Two passes, each loading ahead what it will read: the keys' slots
  // (unless known), then their entries (random keys miss the cache).
  LookUpSlots(range, p, keys,
              generation == p.generation ? known : nullptr, slots);
  std::vector<uint64_t>& seen = SeenSlots(p.num_slots);
  for (size_t i = 0; i < std::min(n, kPrefetchDistance); ++i) {
    if (slots[i] != kNoSlot) __builtin_prefetch(SlotData(p, slots[i]));
  }
  for (size_t i = 0; i < n; ++i) {
    if (i + kPrefetchDistance < n && slots[i + kPrefetchDistance] != kNoSlot) {
      __builtin_prefetch(SlotData(p, slots[i + kPrefetchDistance]));
    }
    const uint32_t slot = slots[i];
    if (slot == kNoSlot) continue;
    uint64_t& word = seen[slot / 64];
    const uint64_t bit = uint64_t{1} << (slot % 64);
    if ((word & bit) != 0) continue;  // a repeat
    word |= bit;
    out_keys->push_back(keys[i]);
    CopyRow(out, SlotData(p, slot), stride_);
    out += stride_;
  }
  for (size_t i = 0; i < n; ++i) {
    if (slots[i] != kNoSlot) seen[slots[i] / 64] = 0;
  }
  entries->resize(static_cast<size_t>(out - entries->data()));
}

void Table::ImportRange(int range, absl::Span<const uint64_t> keys,
                        const float* entries) {
  Partition& p = partition(range);
  const size_t n = keys.size();
  uint32_t* slots = Scratch(n);
  absl::MutexLock l(&p.mu);
  p.journal = Journal{};  // slots made otherwise than by a push
  // As ExportKeys: the slots, then the entries, each loaded ahead.
  for (size_t i = 0; i < std::min(n, kPrefetchDistance); ++i) {
    PrefetchKey(p, keys[i]);
  }
  for (size_t i = 0; i < n; ++i) {
    if (i + kPrefetchDistance < n) PrefetchKey(p, keys[i + kPrefetchDistance]);
    bool inserted = false;
    slots[i] = FindOrNewSlot(range, p, keys[i], &inserted);
  }
  for (size_t i = 0; i < std::min(n, kPrefetchDistance); ++i) {
    __builtin_prefetch(SlotData(p, slots[i]));
  }
  for (size_t i = 0; i < n; ++i) {
    if (i + kPrefetchDistance < n) {
      __builtin_prefetch(SlotData(p, slots[i + kPrefetchDistance]));
    }
    CopyRow(SlotData(p, slots[i]), entries + i * stride_, stride_);
  }
}

void Table::ClearRange(int range) {
  Partition& p = partition(range);
  absl::MutexLock l(&p.mu);
  p.journal = Journal{};
  for (uint64_t key : p.dense_keys) StoreEntry(DenseEntry(key), 0);
  p.dense_keys.clear();
  p.slots.Clear();
  p.chunks.clear();
  p.layout_digest = 0;
  p.num_slots = 0;
  p.generation = next_generation.fetch_add(1);
}

Table::PartitionLayout Table::Layout(int range) const {
  const Partition& p = partition(range);
  absl::ReaderMutexLock l(&p.mu);
  return PartitionLayout{p.num_slots, p.generation, p.layout_digest};
}

void Table::AppendRun(const Partition& p, uint32_t first, uint32_t end,
                      std::string* out) const {
  const size_t row_bytes = stride_ * sizeof(float);
  while (first < end) {
    const uint32_t stop = static_cast<uint32_t>(
        std::min<uint64_t>(end, uint64_t{first | chunk_mask_} + 1));
    out->append(reinterpret_cast<const char*>(SlotData(p, first)),
                (stop - first) * row_bytes);
    first = stop;
  }
}

const float* Table::WriteRun(Partition& p, uint32_t first, uint32_t end,
                             const float* entries) {
  while (first < end) {
    const uint32_t stop = static_cast<uint32_t>(
        std::min<uint64_t>(end, uint64_t{first | chunk_mask_} + 1));
    std::memcpy(SlotData(p, first), entries,
                (stop - first) * stride_ * sizeof(float));
    entries += (stop - first) * stride_;
    first = stop;
  }
  return entries;
}

size_t Table::RunEnd(const uint32_t* slots, size_t i, size_t n) const {
  size_t j = i + 1;
  while (j < n && slots[j] == slots[j - 1] + 1 &&
         (slots[j] & chunk_mask_) != 0) {
    ++j;
  }
  return j;
}

bool Table::JournalTakes(Partition& p, size_t n, bool* journal) {
  Journal& j = p.journal;
  if (journal != nullptr) *journal = j.on;
  if (!j.on) return false;
  if (journal == nullptr) {
    // A push it would not record: it stops, and the range's backups get a
    // copy.
    j = Journal{};
    return false;
  }
  // A bit for every slot the push may update, made ones included. Slots
  // only grow while it is on, and the bitmap with them (by doubling).
  const size_t words = (size_t{p.num_slots} + n + 63) / 64;
  if (j.dirty.size() < words) {
    j.dirty.resize(std::max(words, 2 * j.dirty.size()));
  }
  return true;
}

void Table::StartJournal(int range) {
  Partition& p = partition(range);
  absl::MutexLock l(&p.mu);
  p.journal = Journal{};
  p.journal.on = true;
  p.journal.base = p.num_slots;
}

void Table::StopJournal(int range) {
  Partition& p = partition(range);
  absl::MutexLock l(&p.mu);
  p.journal = Journal{};
}

bool Table::TakeJournal(int range, uint64_t generation, uint32_t base_slots,
                        DeltaRows* out) {
  Partition& p = partition(range);
  const size_t row_bytes = stride_ * sizeof(float);
  absl::MutexLock l(&p.mu);
  Journal& j = p.journal;
  if (!j.on || p.generation != generation || j.base != base_slots) {
    return false;
  }
  const uint32_t num_slots = p.num_slots;
  const size_t fresh = num_slots - base_slots;
  // Every slot made since base_slots was made by a recorded push.
  if (j.new_keys.size() != fresh * sizeof(uint64_t)) return false;
  // The marked slots below base_slots, ascending (so the reads, and the
  // backup's writes, go forwards through the chunks), then the new ones.
  const size_t full_words = base_slots / 64;
  const uint64_t tail_mask =
      base_slots % 64 == 0 ? 0 : (uint64_t{1} << (base_slots % 64)) - 1;
  const size_t marked_words = std::min(full_words + 1, j.dirty.size());
  // Marks of new slots (all sent below, all cleared at the end) out of
  // the word base_slots falls in.
  if (full_words < j.dirty.size()) j.dirty[full_words] &= tail_mask;
  const uint64_t* const dirty = j.dirty.data();
  size_t kept = 0;
  for (size_t w = 0; w < marked_words; ++w) {
    kept += static_cast<size_t>(__builtin_popcountll(dirty[w]));
  }
  // Rows appended by runs, not written over the zeros of a resize (a
  // memset of the whole delta: 2 % of a replicated sparse push's samples),
  // but for a list's, which are written in place (mostly single rows: an
  // append per row would cost a call each).
  out->entries.clear();
  out->entries.reserve((kept + fresh) * row_bytes);
  // The marked slots as a bitmap when it is the smaller (DeltaRows), its
  // rows copied by runs of set bits; else as a list.
  size_t words = marked_words;
  while (words > 0 && dirty[words - 1] == 0) --words;
  out->slots.clear();
  out->slot_bits.clear();
  out->bit_rows = 0;
  if (kept > 0 && words * sizeof(uint64_t) < kept * sizeof(uint32_t)) {
    out->slot_bits.assign(reinterpret_cast<const char*>(dirty),
                          words * sizeof(uint64_t));
    out->bit_rows = kept;
    ForEachBitRun(dirty, words, [&](uint64_t first, uint64_t end) {
      p.mu.AssertHeld();
      AppendRun(p, static_cast<uint32_t>(first), static_cast<uint32_t>(end),
                &out->entries);
    });
    kept = 0;  // no list below
  }
  out->entries.resize(out->entries.size() + kept * row_bytes);
  char* entry_out =
      out->entries.data() + out->entries.size() - kept * row_bytes;
  out->slots.resize(kept * sizeof(uint32_t));
  uint32_t* const slots = Scratch(kept);
  size_t k = 0;
  for (size_t w = 0; w < marked_words && kept > 0; ++w) {
    for (uint64_t bits = dirty[w]; bits != 0; bits &= bits - 1) {
      slots[k++] = static_cast<uint32_t>(w * 64 + __builtin_ctzll(bits));
    }
  }
  if (kept > 0) std::memcpy(out->slots.data(), slots, kept * sizeof(uint32_t));
  // Rows of consecutive slots lie side by side in a chunk: one copy each
  // such run (a delta of a busy range is mostly runs).
  for (size_t i = 0; i < kept;) {
    const size_t end = RunEnd(slots, i, kept);
    if (end == i + 1 && i + kPrefetchDistance < kept) {
      __builtin_prefetch(SlotData(p, slots[i + kPrefetchDistance]));
    }
    if (end == i + 1) {
      CopyRow(entry_out, SlotData(p, slots[i]), stride_);
    } else {
      std::memcpy(entry_out, SlotData(p, slots[i]), (end - i) * row_bytes);
    }
    entry_out += (end - i) * row_bytes;
    i = end;
  }
  AppendRun(p, base_slots, num_slots, &out->entries);
  std::fill(j.dirty.begin(),
            j.dirty.begin() + std::min(j.dirty.size(),
                                       (size_t{num_slots} + 63) / 64),
            0);
  out->new_keys.swap(j.new_keys);
  j.new_keys.clear();
  j.base = num_slots;
  out->base_slots = base_slots;
  out->num_slots = num_slots;
  out->digest = p.layout_digest;
  return true;
}

absl::Status Table::CheckDelta(int range, absl::Span<const uint32_t> slots,
                               absl::Span<const uint64_t> slot_bits,
                               uint32_t base_slots,
                               uint64_t base_digest) const {
  const Partition& p = partition(range);
  absl::ReaderMutexLock l(&p.mu);
  if (p.num_slots != base_slots || p.layout_digest != base_digest) {
    return absl::DataLossError(absl::StrCat(
        "table ", spec_.id, " range ", range, ": the delta builds on ",
        base_slots, " slots of the primary's layout, this replica has ",
        p.num_slots, p.layout_digest == base_digest ? "" : " of another"));
  }
  uint32_t past = 0;
  for (uint32_t slot : slots) past |= static_cast<uint32_t>(slot >= base_slots);
  // No bit at base_slots or past it: the bitmap's words past the one
  // base_slots falls in are zero, and that one's bits from it on.
  const size_t full_words = base_slots / 64;
  for (size_t w = full_words; w < slot_bits.size(); ++w) {
    const uint64_t below =
        w == full_words ? (uint64_t{1} << (base_slots % 64)) - 1 : 0;
    past |= static_cast<uint32_t>((slot_bits[w] & ~below) != 0);
  }
  if (past != 0) {
    return absl::DataLossError(absl::StrCat(
        "table ", spec_.id, " range ", range, ": a row's slot is past ",
        base_slots));
  }
  return absl::OkStatus();
}

void Table::ImportDelta(int range, absl::Span<const uint32_t> slots,
                        absl::Span<const uint64_t> slot_bits,
                        absl::Span<const uint64_t> new_keys,
                        const float* entries) {
  Partition& p = partition(range);
  absl::MutexLock l(&p.mu);
  if (!new_keys.empty()) p.journal = Journal{};  // slots not made by a push
  const size_t n = slots.size();
  const size_t row_bytes = stride_ * sizeof(float);
  ForEachBitRun(slot_bits.data(), slot_bits.size(),
                [&](uint64_t first, uint64_t end) {
                  p.mu.AssertHeld();
                  entries = WriteRun(p, static_cast<uint32_t>(first),
                                     static_cast<uint32_t>(end), entries);
                });
  for (size_t i = 0; i < std::min(n, kPrefetchDistance); ++i) {
    __builtin_prefetch(SlotData(p, slots[i]));
  }
  // By runs of consecutive slots, as TakeJournal sends them (any order is
  // taken: a row whose slot is not the last one's + 1 starts a run).
  for (size_t i = 0; i < n;) {
    const size_t end = RunEnd(slots.data(), i, n);
    if (end == i + 1 && i + kPrefetchDistance < n) {
      __builtin_prefetch(SlotData(p, slots[i + kPrefetchDistance]));
    }
    if (end == i + 1) {
      CopyRow(SlotData(p, slots[i]), entries + i * stride_, stride_);
    } else {
      std::memcpy(SlotData(p, slots[i]), entries + i * stride_,
                  (end - i) * row_bytes);
    }
    i = end;
  }
  entries += n * stride_;
  const size_t m = new_keys.size();
  for (size_t i = 0; i < std::min(m, kPrefetchDistance); ++i) {
    PrefetchKey(p, new_keys[i]);
  }
  for (size_t i = 0; i < m; ++i) {
    if (i + kPrefetchDistance < m) PrefetchKey(p, new_keys[i + kPrefetchDistance]);
    bool inserted = false;
    const uint32_t slot = FindOrNewSlot(range, p, new_keys[i], &inserted);
    CopyRow(SlotData(p, slot), entries + i * stride_, stride_);
  }
}

std::vector<std::pair<uint64_t, std::vector<float>>> Table::Snapshot(
    const std::vector<int>* ranges) const {
  const size_t dim = static_cast<size_t>(spec_.dim);
  std::vector<uint64_t> keys;
  std::vector<float> values;
  Gather(/*nonzero_only=*/false, ranges, &keys, &values);
  std::vector<std::pair<uint64_t, std::vector<float>>> out;
  out.reserve(keys.size());
  for (size_t i = 0; i < keys.size(); ++i) {
    out.emplace_back(keys[i], std::vector<float>(values.begin() + i * dim,
                                                 values.begin() + (i + 1) * dim));
  }
  return out;
}

Table::ValueCopy Table::CopyValues(const std::vector<int>* ranges) const {
  ValueCopy copy;
  Gather(/*nonzero_only=*/false, ranges, &copy.keys, &copy.values);
  return copy;
}

absl::Status Table::SaveBinary(const std::string& path, size_t* keys_written,
                               const std::vector<int>* ranges,
                               const ValueCopy* from) const {
  const size_t dim = static_cast<size_t>(spec_.dim);
  std::vector<uint64_t> gathered_keys;
  std::vector<float> gathered_values;
  if (from == nullptr) {
    Gather(/*nonzero_only=*/false, ranges, &gathered_keys, &gathered_values);
  }
  const std::vector<uint64_t>& keys =
      from != nullptr ? from->keys : gathered_keys;
  const std::vector<float>& values =
      from != nullptr ? from->values : gathered_values;
  PS_RETURN_IF_ERROR(WriteAtomically(path, [&](File& f) -> absl::Status {
    const uint32_t version = kFormatVersion;
    const int32_t table_id = spec_.id;
    const uint32_t dim32 = static_cast<uint32_t>(dim);
    const uint64_t count = keys.size();
    PS_RETURN_IF_ERROR(f.Write(kMagic, sizeof(kMagic)));
    PS_RETURN_IF_ERROR(f.Write(&version, sizeof(version)));
    PS_RETURN_IF_ERROR(f.Write(&table_id, sizeof(table_id)));
    PS_RETURN_IF_ERROR(f.Write(&dim32, sizeof(dim32)));
    PS_RETURN_IF_ERROR(f.Write(&count, sizeof(count)));
    for (size_t i = 0; i < keys.size(); ++i) {
      PS_RETURN_IF_ERROR(f.Write(&keys[i], sizeof(uint64_t)));
      PS_RETURN_IF_ERROR(f.Write(values.data() + i * dim, dim * sizeof(float)));
    }
    return absl::OkStatus();
  }));
  if (keys_written != nullptr) *keys_written = keys.size();
  return absl::OkStatus();
}

absl::Status Table::SaveText(const std::string& path, size_t* nonzeros_written,
                             const std::vector<int>* ranges,
                             const ValueCopy* from) const {
  const size_t dim = static_cast<size_t>(spec_.dim);
  std::vector<uint64_t> keys;
  std::vector<float> values;
  if (from == nullptr) {
    Gather(/*nonzero_only=*/true, ranges, &keys, &values);
  } else {
    for (size_t i = 0; i < from->keys.size(); ++i) {
      const float* v = from->values.data() + i * dim;
      if (std::all_of(v, v + dim, [](float x) { return x == 0.0f; })) continue;
      keys.push_back(from->keys[i]);
      values.insert(values.end(), v, v + dim);
    }
  }
  PS_RETURN_IF_ERROR(WriteAtomically(path, [&](File& f) -> absl::Status {
    // One line at a time in a reused buffer: no allocation per key.
    std::string line;
    char num[64];
    for (size_t i = 0; i < keys.size(); ++i) {
      line.clear();
      auto r = std::to_chars(num, num + sizeof(num), keys[i]);
      line.append(num, r.ptr);
      for (size_t j = 0; j < dim; ++j) {
        line.push_back(j == 0 ? '\t' : ' ');
        r = std::to_chars(num, num + sizeof(num), values[i * dim + j]);
        line.append(num, r.ptr);
      }
      line.push_back('\n');
      PS_RETURN_IF_ERROR(f.Write(line.data(), line.size()));
    }
    return absl::OkStatus();
  }));
  if (nonzeros_written != nullptr) *nonzeros_written = keys.size();
  return absl::OkStatus();
}

absl::StatusOr<TableFile> Table::ReadBinaryFile(const std::string& path) {
  File f;
  PS_RETURN_IF_ERROR(f.Open(path, "rb"));
  PS_ASSIGN_OR_RETURN(int64_t file_size, f.Size());
  if (file_size < static_cast<int64_t>(kHeaderBytes)) {
    if (file_size >= 4) {
      char magic[4];
      PS_RETURN_IF_ERROR(f.Read(magic, sizeof(magic)));
      if (std::memcmp(magic, kMagic, sizeof(kMagic)) != 0) {
        return absl::InvalidArgumentError(
            absl::StrCat(path, ": not a PSTB table file"));
      }
    }
    return absl::DataLossError(
        absl::StrCat("table file ", path, ": truncated header"));
  }
  char magic[4];
  uint32_t version = 0;
  int32_t table_id = 0;
  uint32_t dim = 0;
  uint64_t count = 0;
  PS_RETURN_IF_ERROR(f.Read(magic, sizeof(magic)));
  if (std::memcmp(magic, kMagic, sizeof(kMagic)) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": not a PSTB table file"));
  }
  PS_RETURN_IF_ERROR(f.Read(&version, sizeof(version)));
  if (version != kFormatVersion) {
    return absl::UnimplementedError(absl::StrCat(
        "table file ", path, ": format version ", version,
        " not supported (this build reads ", kFormatVersion, ")"));
  }
  PS_RETURN_IF_ERROR(f.Read(&table_id, sizeof(table_id)));
  PS_RETURN_IF_ERROR(f.Read(&dim, sizeof(dim)));
  PS_RETURN_IF_ERROR(f.Read(&count, sizeof(count)));
  if (dim < 1 || dim > (1u << 24)) {
    return absl::DataLossError(
        absl::StrCat("table file ", path, ": bad dim ", dim));
  }
  // Check the size before allocating, so a corrupt count cannot make us
  // reserve absurd amounts of memory.
  const uint64_t record_bytes = 8 + 4 * uint64_t{dim};
  const uint64_t body = static_cast<uint64_t>(file_size) - kHeaderBytes;
  if (count > body / record_bytes || body != count * record_bytes) {
    return absl::DataLossError(absl::StrCat(
        "table file ", path, ": header says ", count, " records of dim ", dim,
        " but the file has ", body, " bytes after the header"));
  }
  TableFile out;
  out.table_id = table_id;
  out.dim = static_cast<int>(dim);
  out.records.reserve(count);
  for (uint64_t i = 0; i < count; ++i) {
    uint64_t key;
    std::vector<float> v(dim);
    PS_RETURN_IF_ERROR(f.Read(&key, sizeof(key)));
    PS_RETURN_IF_ERROR(f.Read(v.data(), dim * sizeof(float)));
    if (!out.records.empty() && key <= out.records.back().first) {
      return absl::DataLossError(absl::StrCat(
          "table file ", path, ": keys not ascending at record ", i));
    }
    out.records.emplace_back(key, std::move(v));
  }
  return out;
}

absl::StatusOr<std::vector<std::pair<uint64_t, std::vector<float>>>>
Table::LoadBinary(const std::string& path) {
  PS_ASSIGN_OR_RETURN(TableFile file, ReadBinaryFile(path));
  return std::move(file.records);
}

// ---------------------------------------------------------------------------
// GradAccumulator

GradAccumulator::GradAccumulator(int dim, int num_ranges)
    : dim_(dim), num_ranges_(num_ranges), ranges_(std::max(num_ranges, 0)) {
  ABSL_RAW_CHECK(dim >= 1 && num_ranges >= 1,
                 "GradAccumulator: dim and num_ranges must be >= 1");
}

void GradAccumulator::Add(int range, absl::Span<const uint64_t> keys,
                          const float* grads) {
  ABSL_RAW_CHECK(range >= 0 && range < num_ranges_,
                 "GradAccumulator: range index out of bounds");
  const size_t dim = static_cast<size_t>(dim_);
  absl::MutexLock l(&mu_);
  RangeSums& rs = ranges_[range];
  if (rs.keys.empty() && !keys.empty()) touched_.push_back(range);
  for (size_t i = 0; i < keys.size(); ++i) {
    const float* g = grads + i * dim;
    auto [it, inserted] =
        rs.index.try_emplace(keys[i], static_cast<uint32_t>(rs.keys.size()));
    if (inserted) {
      // The first gradient is copied, not added to 0, so a single push is
      // passed through bit-exactly (0.0f + -0.0f would be +0.0f).
      rs.keys.push_back(keys[i]);
      rs.sums.insert(rs.sums.end(), g, g + dim);
    } else {
      float* sum = rs.sums.data() + static_cast<size_t>(it->second) * dim;
      for (size_t j = 0; j < dim; ++j) sum[j] += g[j];
    }
  }
}

void GradAccumulator::ApplyTo(Table* table, float scale,
                              std::string* keys_out, std::string* sums_out,
                              bool* journal) {
  ABSL_RAW_CHECK(table->dim() == dim_ && table->num_ranges() == num_ranges_,
                 "GradAccumulator: table dim or num_ranges differ");
  const size_t dim = static_cast<size_t>(dim_);
  absl::MutexLock l(&mu_);
  // Only the ranges summed into, ascending (a BSP clock sums one range of
  // many: scanning them all cost as much as the sums).
  std::sort(touched_.begin(), touched_.end());
  if (journal != nullptr) *journal = true;
  for (int r : touched_) {
    RangeSums& rs = ranges_[r];
    order_.resize(rs.keys.size());
    std::iota(order_.begin(), order_.end(), uint32_t{0});
    std::sort(order_.begin(), order_.end(), [&rs](uint32_t a, uint32_t b) {
      return rs.keys[a] < rs.keys[b];
    });
    sorted_keys_.resize(order_.size());
    sorted_sums_.resize(order_.size() * dim);
    for (size_t i = 0; i < order_.size(); ++i) {
      sorted_keys_[i] = rs.keys[order_[i]];
      std::memcpy(sorted_sums_.data() + i * dim,
                  rs.sums.data() + static_cast<size_t>(order_[i]) * dim,
                  dim * sizeof(float));
    }
    // Summed per key: unique, and sorted.
    bool recorded = false;
    table->Push(r, sorted_keys_, sorted_sums_.data(), scale, nullptr, nullptr,
                KeyOrder::kAscending, journal != nullptr ? &recorded : nullptr);
    if (journal != nullptr && !recorded) *journal = false;
    if (keys_out != nullptr) {
      keys_out->append(reinterpret_cast<const char*>(sorted_keys_.data()),
                       sorted_keys_.size() * sizeof(uint64_t));
    }
    if (sums_out != nullptr) {
      sums_out->append(reinterpret_cast<const char*>(sorted_sums_.data()),
                       sorted_sums_.size() * sizeof(float));
    }
    rs.index.clear();
    rs.keys.clear();
    rs.sums.clear();
  }
  touched_.clear();
}

size_t GradAccumulator::pending_keys() const {
  absl::MutexLock l(&mu_);
  size_t n = 0;
  for (const RangeSums& rs : ranges_) n += rs.keys.size();
  return n;
}

}  // namespace ps
