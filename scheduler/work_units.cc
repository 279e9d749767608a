#include "scheduler/work_units.h"

#include <sys/stat.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <iterator>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "common/permutation.h"

namespace ps {

namespace {

// The average line length over the first 64 KiB of `path` (whole lines
// only); 100 when that holds no line break.
int64_t AverageLineBytes(const std::string& path) {
  int64_t line_bytes = 100;
  std::ifstream in(path, std::ios::binary);
  std::string head(64 << 10, '\0');
  in.read(head.data(), static_cast<std::streamsize>(head.size()));
  head.resize(static_cast<size_t>(std::max<std::streamsize>(0, in.gcount())));
  const int64_t lines = std::count(head.begin(), head.end(), '\n');
  if (lines > 0) {
    const size_t last = head.rfind('\n');
    line_bytes = std::max<int64_t>(1, static_cast<int64_t>(last + 1) / lines);
  }
  return line_bytes;
}

}  // namespace

int64_t EstimateTrainRows(const JobConfig& config) {
  const DataConfig& d = config.data;
  if (d.format == "synthetic") return d.synthetic.train_rows;
  struct stat st;
  if (::stat(d.train.c_str(), &st) != 0) return -1;
  return static_cast<int64_t>(st.st_size) / AverageLineBytes(d.train);
}

double EstimateFeatureScale(const JobConfig& config) {
  const DataConfig& d = config.data;
  if (d.format != "libsvm") return 1.0;
  std::ifstream in(d.train, std::ios::binary);
  if (!in) return -1;
  std::string head(64 << 10, '\0');
  in.read(head.data(), static_cast<std::streamsize>(head.size()));
  head.resize(static_cast<size_t>(std::max<std::streamsize>(0, in.gcount())));
  head.resize(head.rfind('\n') == std::string::npos ? 0
                                                     : head.rfind('\n') + 1);
  double sum = 0;
  int64_t n = 0;
  for (absl::string_view line : absl::StrSplit(head, '\n')) {
    line = line.substr(0, std::min(line.size(), line.find('#')));
    bool label = true;
    for (absl::string_view tok :
         absl::StrSplit(line, absl::ByAnyChar(" \t\r"), absl::SkipEmpty())) {
      if (label) {  // the label comes first
        label = false;
        continue;
      }
      const size_t colon = tok.find(':');
      double v = 0;
      if (colon == absl::string_view::npos || tok.substr(0, colon) == "qid" ||
          !absl::SimpleAtod(tok.substr(colon + 1), &v) || !std::isfinite(v)) {
        continue;  // malformed: the reader reports it
      }
      sum += std::abs(v);
      ++n;
    }
  }
  if (n == 0 || sum <= 0) return -1;
  return sum / static_cast<double>(n);
}

namespace {

// A WorkQueueState's units: packed (unit_worker, unit_done: this build) or
// one Unit message each (state files and checkpoints of older builds).
// -1 when the packed arrays differ in length.
int64_t UnitCount(const proto::WorkQueueState& s) {
  if (s.units_size() > 0) return s.units_size();
  if (s.unit_done_size() != s.unit_worker_size()) return -1;
  return s.unit_worker_size();
}
int UnitWorker(const proto::WorkQueueState& s, int i) {
  return s.units_size() > 0 ? s.units(i).worker() : s.unit_worker(i);
}
bool UnitDone(const proto::WorkQueueState& s, int i) {
  return s.units_size() > 0 ? s.units(i).done() : s.unit_done(i);
}

}  // namespace

std::vector<proto::DataShard> PlanWorkUnits(const JobConfig& config) {
  const DataConfig& d = config.data;
  // `auto` is resolved by the scheduler before the config is shown to
  // anyone; a plan made of an unresolved config resolves it the same way.
  const int64_t rows_per_unit = std::max<int64_t>(
      1, config.fault_tolerance.work_unit_rows == kAutoWorkUnitRows
             ? AutoWorkUnitRows(config, EstimateTrainRows(config))
             : config.fault_tolerance.work_unit_rows);
  std::vector<proto::DataShard> units;
  if (d.format == "synthetic") {
    const int64_t rows = d.synthetic.train_rows;
    // A multiple of the worker count of equal units (as for files below).
    const int64_t workers = std::max(1, config.cluster.num_workers);
    int64_t count =
        std::max<int64_t>(1, (rows + rows_per_unit - 1) / rows_per_unit);
    count = (count + workers - 1) / workers * workers;
    const int64_t per_unit = std::max<int64_t>(1, (rows + count - 1) / count);
    for (int64_t b = 0; b < rows || units.empty(); b += per_unit) {
      proto::DataShard s;
      s.set_row_begin(b);
      s.set_row_end(std::min(rows, b + per_unit));
      s.set_seed_begin(d.synthetic.seed);
      s.set_seed_end(d.synthetic.seed);
      units.push_back(std::move(s));
    }
  } else {
    struct stat st;
    if (::stat(d.train.c_str(), &st) != 0) {
      // The workers cut the parts by their own copy's size.
      const int parts = 8 * std::max(1, config.cluster.num_workers);
      for (int p = 0; p < parts; ++p) {
        proto::DataShard s;
        s.set_path(d.train);
        s.set_begin_byte(-1);
        s.set_end_byte(-1);
        s.set_part(p);
        s.set_num_parts(parts);
        units.push_back(std::move(s));
      }
    } else {
      const int64_t size = st.st_size;
      const int64_t line_bytes = AverageLineBytes(d.train);
      // A multiple of the worker count of units of (about) equal size, so
      // each worker's queue holds the same share of the file: BSP does not
      // steal, and a worker with less data idles through the others'.
      const int64_t estimate =
          std::max<int64_t>(1, line_bytes * rows_per_unit);
      const int64_t workers = std::max(1, config.cluster.num_workers);
      int64_t count = std::max<int64_t>(1, (size + estimate - 1) / estimate);
      count = (count + workers - 1) / workers * workers;
      const int64_t unit_bytes =
          std::max<int64_t>(1, (size + count - 1) / count);
      for (int64_t b = 0; b < size || units.empty(); b += unit_bytes) {
        proto::DataShard s;
        s.set_path(d.train);
        s.set_begin_byte(b);
        s.set_end_byte(b + unit_bytes >= size ? -1 : b + unit_bytes);
        units.push_back(std::move(s));
      }
    }
  }
  const int n = static_cast<int>(units.size());
  for (int i = 0; i < n; ++i) {
    if (units[i].num_parts() == 0) {
      units[i].set_part(i);
      units[i].set_num_parts(n);
    }
  }
  return units;
}

int PreferredWorker(int64_t index, int64_t units, int workers) {
  if (units <= 0 || workers <= 1) return 0;
  return static_cast<int>(index * workers / units);
}

WorkQueue::WorkQueue(std::vector<proto::DataShard> units, int epochs,
                     int workers, bool steal,
                     std::optional<uint64_t> shuffle_seed)
    : plan_(std::move(units)),
      epochs_(std::max(1, epochs)),
      steal_(steal),
      shuffle_seed_(shuffle_seed) {
  state_.resize(plan_.size() * epochs_);
  examples_.assign(epochs_, 0);
  own_.resize(std::max(1, workers));
  const int64_t n = units_per_epoch();
  for (int64_t id = 0; id < static_cast<int64_t>(state_.size()); ++id) {
    own_[PreferredWorker(id % n, n, static_cast<int>(own_.size()))].insert(
        id);
  }
}

int64_t WorkQueue::PlanIndex(int64_t id) const {
  const int64_t n = units_per_epoch();
  if (!shuffle_seed_.has_value()) return id % n;
  // O(1) memory whatever the plan's size (one small object per call).
  const SeededPermutation order(
      ShuffleKey(*shuffle_seed_, ShufflePurpose::kUnitOrder, id / n, 0),
      static_cast<uint64_t>(n));
  return static_cast<int64_t>(order.At(static_cast<uint64_t>(id % n)));
}

proto::WorkUnit WorkQueue::Make(int64_t id) const {
  proto::WorkUnit u;
  u.set_id(id);
  u.set_epoch(static_cast<int>(id / units_per_epoch()));
  *u.mutable_data() = plan_[PlanIndex(id)];
  return u;
}

std::optional<proto::WorkUnit> WorkQueue::Take(int worker) {
  int64_t id = -1;
  if (!pool_.empty()) {
    id = *pool_.begin();
    pool_.erase(pool_.begin());
  } else if (worker >= 0 && worker < static_cast<int>(own_.size()) &&
             !own_[worker].empty()) {
    id = *own_[worker].begin();
    own_[worker].erase(own_[worker].begin());
  } else if (steal_) {
    std::set<int64_t>* longest = nullptr;
    for (std::set<int64_t>& q : own_) {
      if (!q.empty() && (longest == nullptr || q.size() > longest->size())) {
        longest = &q;
      }
    }
    if (longest == nullptr) return std::nullopt;
    id = *longest->rbegin();
    longest->erase(std::prev(longest->end()));
  } else {
    return std::nullopt;
  }
  state_[id].worker = worker;
  assigned_[worker].insert(id);
  return Make(id);
}

std::vector<proto::WorkUnit> WorkQueue::Lost(
    int worker, const std::set<int64_t>& holding) const {
  std::vector<proto::WorkUnit> lost;
  auto it = assigned_.find(worker);
  if (it == assigned_.end()) return lost;
  for (int64_t id : it->second) {
    if (!holding.contains(id)) lost.push_back(Make(id));
  }
  return lost;
}

absl::Status WorkQueue::Finish(int worker, const proto::FinishedUnit& u) {
  if (u.id() < 0 || u.id() >= static_cast<int64_t>(state_.size())) {
    return absl::InvalidArgumentError(
        absl::StrCat("W[", worker, "] finished unknown work unit ", u.id()));
  }
  if (u.examples() < 0 || u.skipped() < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "W[", worker, "] reported negative counts for work unit ", u.id()));
  }
  Unit& unit = state_[u.id()];
  if (unit.worker != worker) {
    return absl::FailedPreconditionError(absl::StrCat(
        "work unit ", u.id(), " is not assigned to W[", worker, "]"));
  }
  if (unit.done) return absl::OkStatus();  // a resent report
  unit.done = true;
  ++done_;
  assigned_[worker].erase(u.id());
  ++finished_by_[worker];
  const int epoch = static_cast<int>(u.id() / units_per_epoch());
  examples_[epoch] += u.examples();
  if (epoch == 0) skipped_ += u.skipped();
  return absl::OkStatus();
}

int64_t WorkQueue::StopAfter(int epochs) {
  const int64_t first = static_cast<int64_t>(std::max(epochs, 0)) *
                        units_per_epoch();
  int64_t dropped = 0;
  auto drop = [&](std::set<int64_t>* q) {
    for (auto it = q->lower_bound(first); it != q->end();) {
      Unit& unit = state_[*it];
      unit.done = true;
      ++done_;
      ++dropped;
      it = q->erase(it);
    }
  };
  drop(&pool_);
  for (std::set<int64_t>& q : own_) drop(&q);
  return dropped;
}

int WorkQueue::Release(int worker) {
  if (worker >= 0 && worker < static_cast<int>(own_.size())) {
    pool_.insert(own_[worker].begin(), own_[worker].end());
    own_[worker].clear();
  }
  auto it = assigned_.find(worker);
  if (it == assigned_.end()) return 0;
  const int n = static_cast<int>(it->second.size());
  for (int64_t id : it->second) {
    state_[id].worker = -1;
    pool_.insert(id);
  }
  assigned_.erase(it);
  return n;
}

absl::StatusOr<int64_t> WorkQueue::ResumeFrom(
    const proto::WorkQueueState& s) {
  const int64_t n = static_cast<int64_t>(state_.size());
  if (UnitCount(s) != n ||
      s.epoch_examples_size() != static_cast<int>(examples_.size())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the checkpoint's data position has ", UnitCount(s), " units in ",
        s.epoch_examples_size(), " epochs; this job plans ", n, " in ",
        examples_.size()));
  }
  for (int64_t e : s.epoch_examples()) {
    if (e < 0) return absl::InvalidArgumentError("negative example count");
  }
  const int workers = static_cast<int>(own_.size());
  const int64_t per_epoch = units_per_epoch();
  std::vector<Unit> state(n);
  std::vector<std::set<int64_t>> own(workers);
  int64_t done = 0;
  for (int64_t id = 0; id < n; ++id) {
    const int i = static_cast<int>(id);
    if (UnitDone(s, i)) {
      state[id].worker = UnitWorker(s, i);
      state[id].done = true;
      ++done;
    } else {
      own[PreferredWorker(id % per_epoch, per_epoch, workers)].insert(id);
    }
  }
  state_ = std::move(state);
  own_ = std::move(own);
  pool_.clear();
  assigned_.clear();
  finished_by_.clear();  // per worker: this job's units only
  examples_.assign(s.epoch_examples().begin(), s.epoch_examples().end());
  skipped_ = s.skipped();
  done_ = done;
  return done;
}

int WorkQueue::AddWorker() {
  const size_t k = own_.size();
  std::set<int64_t> mine;
  for (std::set<int64_t>& q : own_) {
    size_t i = 0;
    for (auto it = q.begin(); it != q.end();) {
      if (i++ % (k + 1) == k) {
        mine.insert(*it);
        it = q.erase(it);
      } else {
        ++it;
      }
    }
  }
  const int got = static_cast<int>(mine.size());
  own_.push_back(std::move(mine));
  return got;
}

void WorkQueue::SaveTo(proto::WorkQueueState* s) const {
  s->Clear();
  const int n = static_cast<int>(state_.size());
  s->mutable_unit_worker()->Resize(n, -1);
  s->mutable_unit_done()->Resize(n, false);
  int32_t* worker = s->mutable_unit_worker()->mutable_data();
  bool* done = s->mutable_unit_done()->mutable_data();
  for (int i = 0; i < n; ++i) {
    worker[i] = state_[i].worker;
    done[i] = state_[i].done;
  }
  for (const std::set<int64_t>& q : own_) {
    s->add_own()->mutable_ids()->Add(q.begin(), q.end());
  }
  s->mutable_pool()->Add(pool_.begin(), pool_.end());
  s->mutable_epoch_examples()->Add(examples_.begin(), examples_.end());
  s->set_skipped(skipped_);
}

absl::Status WorkQueue::RestoreFrom(const proto::WorkQueueState& s) {
  const int64_t n = static_cast<int64_t>(state_.size());
  const int64_t units = UnitCount(s);
  if (units != n || s.own_size() < static_cast<int>(own_.size()) ||
      s.epoch_examples_size() != static_cast<int>(examples_.size())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "work-unit state of ", units, " units, ", s.own_size(),
        " queues, ", s.epoch_examples_size(), " epochs does not fit this job (",
        n, ", ", own_.size(), ", ", examples_.size(), ")"));
  }
  auto id_ok = [n](int64_t id) { return id >= 0 && id < n; };
  std::vector<Unit> state(n);
  std::map<int, std::set<int64_t>> assigned;
  std::map<int, int64_t> finished_by;
  int64_t done = 0;
  for (int64_t id = 0; id < n; ++id) {
    const int i = static_cast<int>(id);
    const int worker = UnitWorker(s, i);
    const bool is_done = UnitDone(s, i);
    state[id].worker = worker;
    state[id].done = is_done;
    if (is_done) {
      ++done;
      ++finished_by[worker];
    } else if (worker >= 0) {
      assigned[worker].insert(id);
    }
  }
  std::vector<std::set<int64_t>> own(s.own_size());  // joiners' too
  for (int w = 0; w < s.own_size(); ++w) {
    for (int64_t id : s.own(w).ids()) {
      if (!id_ok(id)) return absl::InvalidArgumentError("unit id out of range");
      own[w].insert(id);
    }
  }
  std::set<int64_t> pool;
  for (int64_t id : s.pool()) {
    if (!id_ok(id)) return absl::InvalidArgumentError("unit id out of range");
    pool.insert(id);
  }
  state_ = std::move(state);
  own_ = std::move(own);
  pool_ = std::move(pool);
  assigned_ = std::move(assigned);
  finished_by_ = std::move(finished_by);
  examples_.assign(s.epoch_examples().begin(), s.epoch_examples().end());
  skipped_ = s.skipped();
  done_ = done;
  return absl::OkStatus();
}

int64_t WorkQueue::done_in_epoch(int epoch) const {
  if (epoch < 0 || epoch >= epochs_) return 0;
  const int64_t n = units_per_epoch();
  int64_t done = 0;
  for (int64_t id = epoch * n; id < (epoch + 1) * n; ++id) {
    done += state_[id].done ? 1 : 0;
  }
  return done;
}

JobProgress WorkQueue::Progress() const {
  JobProgress p;
  p.epochs = epochs_;
  p.units_per_epoch = units_per_epoch();
  p.done = done_;
  p.total = static_cast<int64_t>(state_.size());
  p.epoch = epochs_ - 1;
  p.epoch_done = done_in_epoch(p.epoch);
  for (int e = 0; e < epochs_; ++e) {
    const int64_t d = done_in_epoch(e);
    if (d < p.units_per_epoch) {
      p.epoch = e;
      p.epoch_done = d;
      break;
    }
  }
  return p;
}

namespace {

// 7s, 1m05s, 2h03m.
std::string ShortDuration(double seconds) {
  const int64_t s = static_cast<int64_t>(std::ceil(std::max(0.0, seconds)));
  if (s < 60) return absl::StrCat(s, "s");
  if (s < 3600) return absl::StrFormat("%dm%02ds", s / 60, s % 60);
  return absl::StrFormat("%dh%02dm", s / 3600, s / 60 % 60);
}

}  // namespace

std::string FormatProgress(const JobProgress& p, double units_per_s) {
  const auto percent = [](int64_t a, int64_t b) {
    return b > 0 ? static_cast<int>(100 * a / b) : 0;
  };
  std::string out = absl::StrFormat(
      "epoch %d/%d %d%% (%d/%d units), job %d%%", p.epoch + 1, p.epochs,
      percent(p.epoch_done, p.units_per_epoch), p.epoch_done,
      p.units_per_epoch, percent(p.done, p.total));
  if (units_per_s <= 0) return absl::StrCat(out, ", ETA unknown");
  return absl::StrCat(
      out, ", ETA epoch ",
      ShortDuration((p.units_per_epoch - p.epoch_done) / units_per_s),
      ", job ", ShortDuration((p.total - p.done) / units_per_s));
}

int64_t WorkQueue::finished_by(int worker) const {
  auto it = finished_by_.find(worker);
  return it == finished_by_.end() ? 0 : it->second;
}

}  // namespace ps
