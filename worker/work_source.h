// The worker's side of dynamic work units (issue 9; scheduler/work_units.h):
// asks the scheduler for the next unit when the current one is read, opens
// its reader and streams its rows, and reports a unit finished only once
// every push made from its rows was acknowledged (the clock operations the
// trainer declared with Pushed(); until then the unit is reported as held,
// and the ask does not wait for them unless no unit was free last time).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "data/data.h"
#include "models/model.h"
#include "proto/ps.pb.h"
#include "transport/transport.h"
#include "worker/kv_worker.h"

namespace ps {

struct WorkSourceOptions {
  int worker_id = 0;
  // A GetWork that fails with UNAVAILABLE or DEADLINE_EXCEEDED (not
  // JOB_FAILED) is resent with backoff (it is idempotent) until this long
  // after the first attempt; each attempt bounded by rpc_timeout.
  absl::Duration retry_for = absl::Seconds(120);
  absl::Duration rpc_timeout = absl::Seconds(30);
  // How long to wait for a finished unit's pushes to be acknowledged.
  absl::Duration ack_timeout = absl::Seconds(600);
};

// Not thread-safe: the training loop drives it.
class WorkSource final : public BatchSource {
 public:
  // Opens the reader of a unit (its data, and its epoch for the order the
  // rows are read in: data.shuffle).
  using Opener = std::function<absl::StatusOr<std::unique_ptr<RowReader>>(
      const proto::WorkUnit&)>;
  // The mlp model's units are read as field rows (Next with a FieldBlock).
  using FieldOpener =
      std::function<absl::StatusOr<std::unique_ptr<FieldReader>>(
          const proto::WorkUnit&)>;
  // `scheduler` and `kv` must outlive it.
  WorkSource(WorkSourceOptions options, SchedulerClient* scheduler,
             KVWorker* kv, Opener open);
  WorkSource(WorkSourceOptions options, SchedulerClient* scheduler,
             KVWorker* kv, FieldOpener open);
  ~WorkSource();

  // Got::kWait: no unit free now, others still in progress; kDone: every
  // unit of the job is done.
  // Appends up to max_rows rows of ONE unit to *out (a unit's last batch
  // may be short) and sets *unit to its id. Asks the scheduler (reporting
  // the finished units; after a kWait answer this blocks until the read
  // units' pushes are acknowledged) when the current unit is exhausted. Errors: the reader's,
  // the scheduler's (after retries), a finished unit's push failure.
  absl::StatusOr<Got> Next(size_t max_rows, RowBlock* out,
                           int64_t* unit) override;
  // The same for a source built with a FieldOpener (the other Next is
  // FAILED_PRECONDITION on each kind of source).
  absl::StatusOr<Got> Next(size_t max_rows, FieldBlock* out,
                           int64_t* unit) override;
  // The rows Next handed out for `unit` so far are pushed, and clock
  // operation `ts` of the KVWorker covers them. Call once per batch.
  void Pushed(int64_t unit, int64_t ts) override;

  // After kDone: whether the scheduler chose this worker to evaluate.
  bool evaluate() const { return evaluate_; }
  // The epoch of the unit being read (for logs).
  int epoch() const override { return epoch_; }
  int64_t units_finished() const { return units_finished_; }
  // The lowest clock of the other workers still training, as of the last
  // GetWork answer; -1 when unknown.
  int64_t others_min_clock() const override { return others_min_clock_; }
  // Malformed lines skipped in the epoch-0 units this worker finished (one
  // pass over its part of the data); path "" when none was read.
  proto::SkippedLines skipped() const override { return skipped_; }

 private:
  struct Held {
    int epoch = 0;
    int64_t batches_read = 0;
    int64_t batches_pushed = 0;
    int64_t rows = 0;
    bool exhausted = false;
    std::vector<int64_t> clock_ts;  // to wait on before reporting
    ReadStats stats;
    std::string path;
  };
  // Reports the finished units and gets the answer (retried).
  absl::StatusOr<proto::GetWorkResponse> Ask();
  // Next for either kind of reader.
  template <typename Reader, typename Block, typename Open>
  absl::StatusOr<Got> NextFrom(std::unique_ptr<Reader>* reader,
                               const Open& open, size_t max_rows, Block* out,
                               int64_t* unit);

  const WorkSourceOptions options_;
  SchedulerClient* const scheduler_;
  KVWorker* const kv_;
  const Opener open_;             // one of the two is set
  const FieldOpener open_fields_;
  std::map<int64_t, Held> held_;  // units assigned to this worker
  std::unique_ptr<RowReader> reader_;
  std::unique_ptr<FieldReader> field_reader_;
  int64_t current_ = -1;
  bool done_ = false;
  bool evaluate_ = false;
  int epoch_ = 0;
  int64_t units_finished_ = 0;
  int64_t others_min_clock_ = -1;
  // The last answer was WORK_WAIT: the next ask waits for the read units'
  // pushes to be acknowledged and reports them.
  bool wait_for_acks_ = false;
  proto::SkippedLines skipped_;
  bool have_bad_ = false;  // skipped_ names a first bad line
};

}  // namespace ps
