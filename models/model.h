// What a model is to the one training loop (worker/trainer.h) both models
// train with (issue 12's split of worker/ into data, models and the
// client):
//   ParamClient  the parameter servers, as the model pulls and pushes them
//                (KVWorker implements it; tests use an in-memory store);
//   BatchSource  where the loop's minibatches come from (the scheduler's
//                work units: WorkSource; a reader's epochs: EpochSource);
//   Model        one model's work per minibatch: read, pull, gradient,
//                push. Logistic regression: models/logistic.h; wide & deep:
//                models/wide_deep.h.
// The loop owns everything about when: prefetching, pipelining, idle steps,
// SSP catch-up, progress lines, the test curve and validation threads.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "data/data.h"
#include "proto/ps.pb.h"

namespace ps {

// The parameter servers as a worker sees them. Timestamps are the client's:
// wait on each once.
class ParamClient {
 public:
  virtual ~ParamClient() = default;
  // Values of ascending, unique `keys` of `table` into *out (resized to
  // keys.size() * dim), which must stay untouched until Wait(ts). Answered
  // when the consistency model allows a pull at `at_clock` (-1: the
  // client's current clock; a prefetch for the next clock passes clock()+1).
  virtual int64_t Pull(int table, absl::Span<const uint64_t> keys,
                       std::vector<float>* out, int64_t at_clock = -1) = 0;
  // Gradient sums over `num_examples` examples for ascending, unique keys.
  virtual int64_t Push(int table, absl::Span<const uint64_t> keys,
                       absl::Span<const float> vals, int num_examples) = 0;
  // Push, then Clock (a client may send both in one round trip).
  virtual int64_t PushAndClock(int table, absl::Span<const uint64_t> keys,
                               absl::Span<const float> vals, int num_examples) {
    Push(table, keys, vals, num_examples);
    return Clock(num_examples);
  }
  // Blocks until operation `ts` is done or `deadline`; its error if any.
  virtual absl::Status Wait(int64_t ts, absl::Time deadline) = 0;
  // Ends the current clock. Returns a timestamp.
  virtual int64_t Clock(int num_examples) = 0;
  // Clocks completed so far (= the clock of the next pull).
  virtual int64_t clock() const = 0;
  // The highest of the other workers' lowest completed clock that the
  // servers reported with pull answers (PullResponse.others_min_clock);
  // -1 when unknown. Thread-safe.
  virtual int64_t others_min_clock() const { return -1; }
  // SSP catch-up: runs `fired` once (on another thread) when every other
  // worker still training has completed `others_at` clocks on the range of
  // `key`, or after at most about `max_wait`; others_min_clock() is then
  // fresh. False (and `fired` never runs) where the client cannot watch
  // (see KVWorker::WatchOthers).
  virtual bool WatchOthers(int table, uint64_t key, int64_t others_at,
                           absl::Duration max_wait,
                           std::function<void(absl::Status)> fired) {
    return false;
  }
};

// Minibatches for the loop: rows of one unit at a time, and what the loop
// must say about each. Not thread-safe: the loop drives it.
class BatchSource {
 public:
  virtual ~BatchSource() = default;
  enum class Got {
    kRows,  // rows appended
    kWait,  // no rows free now, others still in progress: keep step with
            // the clocks (an idle step), then ask again
    kDone,  // nothing more to train
  };
  // Appends up to max_rows rows of ONE unit to *out and sets *unit to its
  // id. A source serves one kind of row (a model reads the kind it trains
  // on); the other Next is FAILED_PRECONDITION.
  virtual absl::StatusOr<Got> Next(size_t max_rows, RowBlock* out,
                                   int64_t* unit) = 0;
  virtual absl::StatusOr<Got> Next(size_t max_rows, FieldBlock* out,
                                   int64_t* unit) = 0;
  // The rows handed out for `unit` so far are pushed, and clock operation
  // `ts` of the client covers them. Once per minibatch.
  virtual void Pushed(int64_t unit, int64_t ts) = 0;
  // The epoch of the rows being read.
  virtual int epoch() const = 0;
  // The lowest clock of the other workers still training; -1: unknown.
  virtual int64_t others_min_clock() const { return -1; }
  // Malformed lines skipped in one pass over this worker's data.
  virtual proto::SkippedLines skipped() const = 0;
};

// One model's work per minibatch. The loop keeps up to kSlots minibatches
// in flight (the next one is read and pulled while this one's gradient is
// computed), so each call names a slot; a slot's calls come in the order
// Read, Pull, WaitPull, Submit, Collect, PushAndClock. Not thread-safe.
class Model {
 public:
  static constexpr int kSlots = 2;
  virtual ~Model() = default;
  // For logs: "logistic regression", "mlp".
  virtual std::string name() const = 0;
  // Reads the next minibatch (up to max_rows rows of one unit) of `source`
  // into `slot`, setting *unit and *rows when it returns kRows.
  virtual absl::StatusOr<BatchSource::Got> Read(BatchSource* source,
                                                size_t max_rows, int slot,
                                                int64_t* unit,
                                                size_t* rows) = 0;
  // Sends the pulls of the slot's minibatch at clock `at_clock`
  // (ParamClient::Pull).
  virtual void Pull(int slot, int64_t at_clock) = 0;
  // Waits for them.
  virtual absl::Status WaitPull(int slot, absl::Time deadline) = 0;
  // Starts the gradient of the slot's minibatch at the pulled values
  // (`clock`: the client's clock, for anything seeded per step).
  virtual absl::Status Submit(int slot, int64_t clock) = 0;
  // Waits for it; *loss: the minibatch's summed log loss.
  virtual absl::Status Collect(int slot, double* loss) = 0;
  // Pushes the gradient over `rows` examples, the last push ending the
  // clock; returns the clock's timestamp.
  virtual int64_t PushAndClock(int slot, int rows) = 0;
  // Whether Submit returns before the gradient is computed (a device's
  // streams): then the loop reads the next minibatch in between.
  virtual bool pipelined() const { return false; }
  // A table and key an idle step pulls (any existing key).
  virtual std::pair<int, uint64_t> idle_key() const = 0;
  // Bytes of keys and values (as uint64 and float32) the model's own
  // filters kept out of its pushes so far (the KKT filter, issue 10).
  virtual int64_t filtered_push_bytes() const { return 0; }
};

}  // namespace ps
