#include "worker/work_source.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "transport/errors.h"

namespace ps {

WorkSource::WorkSource(WorkSourceOptions options, SchedulerClient* scheduler,
                       KVWorker* kv, Opener open)
    : options_(options), scheduler_(scheduler), kv_(kv),
      open_(std::move(open)) {}

WorkSource::WorkSource(WorkSourceOptions options, SchedulerClient* scheduler,
                       KVWorker* kv, FieldOpener open)
    : options_(options), scheduler_(scheduler), kv_(kv),
      open_fields_(std::move(open)) {}

WorkSource::~WorkSource() = default;

template <typename Reader, typename Block, typename Open>
absl::StatusOr<WorkSource::Got> WorkSource::NextFrom(
    std::unique_ptr<Reader>* reader, const Open& open, size_t max_rows,
    Block* out, int64_t* unit) {
  for (;;) {
    if (*reader != nullptr) {
      Held& h = held_[current_];
      PS_ASSIGN_OR_RETURN(size_t n, (*reader)->Next(max_rows, out));
      if (n > 0) {
        ++h.batches_read;
        h.rows += static_cast<int64_t>(n);
        *unit = current_;
        return Got::kRows;
      }
      h.exhausted = true;
      h.stats = (*reader)->stats();
      h.path = (*reader)->path();
      reader->reset();
      current_ = -1;
    }
    if (done_) return Got::kDone;
    PS_ASSIGN_OR_RETURN(proto::GetWorkResponse resp, Ask());
    switch (resp.state()) {
      case proto::WORK_UNIT: {
        const proto::WorkUnit& u = resp.unit();
        PS_ASSIGN_OR_RETURN(*reader, open(u));
        current_ = u.id();
        Held& h = held_[u.id()];
        h.epoch = u.epoch();
        epoch_ = u.epoch();
        PS_LOG_DEBUG("work unit {} (epoch {}, part {} of {})", u.id(),
                     u.epoch(), u.data().part(), u.data().num_parts());
        continue;
      }
      case proto::WORK_WAIT:
        return Got::kWait;
      case proto::WORK_DONE:
        done_ = true;
        evaluate_ = resp.evaluate();
        return Got::kDone;
      default:
        return absl::InvalidArgumentError(
            absl::StrCat("GetWork: unknown state ", resp.state()));
    }
  }
}

absl::StatusOr<WorkSource::Got> WorkSource::Next(size_t max_rows,
                                                 RowBlock* out,
                                                 int64_t* unit) {
  if (!open_) {
    return absl::FailedPreconditionError("a field-row work source read as rows");
  }
  return NextFrom(&reader_, open_, max_rows, out, unit);
}

absl::StatusOr<WorkSource::Got> WorkSource::Next(size_t max_rows,
                                                 FieldBlock* out,
                                                 int64_t* unit) {
  if (!open_fields_) {
    return absl::FailedPreconditionError("a row work source read as fields");
  }
  return NextFrom(&field_reader_, open_fields_, max_rows, out, unit);
}

void WorkSource::Pushed(int64_t unit, int64_t ts) {
  auto it = held_.find(unit);
  if (it == held_.end()) return;
  ++it->second.batches_pushed;
  it->second.clock_ts.push_back(ts);
}

absl::StatusOr<proto::GetWorkResponse> WorkSource::Ask() {
  proto::GetWorkRequest req;
  req.set_worker_id(options_.worker_id);
  req.set_clock(kv_->clock());
  std::vector<int64_t> reported;
  for (auto& [id, h] : held_) {
    if (!h.exhausted || h.batches_pushed < h.batches_read) {
      req.add_holding(id);
      continue;
    }
    // Done only once every push made from its rows was acknowledged. Not
    // acknowledged yet: held, and reported by a later ask, so the next unit
    // comes without waiting for the pushes' round trips (and their
    // replication); after a WORK_WAIT answer, when this worker's unreported
    // units may be all that is left, it waits for them instead.
    if (!wait_for_acks_ &&
        !std::all_of(h.clock_ts.begin(), h.clock_ts.end(),
                     [&](int64_t ts) { return kv_->Done(ts); })) {
      req.add_holding(id);
      continue;
    }
    for (int64_t ts : h.clock_ts) {
      PS_RETURN_IF_ERROR(kv_->Wait(ts, absl::Now() + options_.ack_timeout));
    }
    h.clock_ts.clear();
    proto::FinishedUnit* f = req.add_finished();
    f->set_id(id);
    f->set_examples(h.rows);
    f->set_skipped(h.stats.skipped);
    reported.push_back(id);
  }
  const absl::Time give_up = absl::Now() + options_.retry_for;
  absl::Duration backoff = absl::Milliseconds(50);
  absl::StatusOr<proto::GetWorkResponse> resp;
  for (;;) {
    resp = scheduler_->GetWork(req, absl::Now() + options_.rpc_timeout);
    const absl::StatusCode code = resp.status().code();
    const bool retryable = (code == absl::StatusCode::kUnavailable ||
                            code == absl::StatusCode::kDeadlineExceeded) &&
                           ReasonOf(resp.status()) != proto::REASON_JOB_FAILED;
    if (resp.ok() || !retryable || absl::Now() + backoff >= give_up) break;
    PS_LOG_WARN("GetWork failed, retrying in {}: {}",
                absl::FormatDuration(backoff), resp.status().ToString());
    absl::SleepFor(backoff);
    backoff = std::min(backoff * 2, absl::Seconds(2));
  }
  if (!resp.ok()) return resp.status();
  wait_for_acks_ = resp->state() == proto::WORK_WAIT;
  others_min_clock_ = resp->others_min_clock();
  for (int64_t id : reported) {
    const Held& h = held_[id];
    ++units_finished_;
    if (h.epoch == 0 && !h.path.empty()) {
      // One pass: the epoch-0 units. The first bad line is the earliest in
      // the file among them.
      skipped_.set_path(h.path);
      skipped_.set_skipped(skipped_.skipped() + h.stats.skipped);
      if (h.stats.first_bad_byte >= 0 &&
          (!have_bad_ ||
           h.stats.first_bad_byte < skipped_.first_bad_byte())) {
        have_bad_ = true;
        skipped_.set_first_bad_byte(h.stats.first_bad_byte);
        skipped_.set_first_bad_line(h.stats.first_bad_line);
      }
    }
    held_.erase(id);
  }
  return resp;
}

}  // namespace ps
