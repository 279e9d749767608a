// Prometheus metrics: counters, gauges and histograms cheap enough for the
// data path (one relaxed atomic add per update, no lock, no allocation), a
// registry that owns them, and the writer of Prometheus's text exposition
// format (version 0.0.4) a scrape returns. The HTTP endpoint that serves it
// is common/metrics_http.h; docs/observability.md lists the metrics.
//
// Debian 12 packages no Prometheus client library for C++ (prometheus-cpp),
// hence this small one: it writes the format, it does not parse it.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace ps {

// name="value" pairs, in the order they are written.
using MetricLabels = std::vector<std::pair<std::string, std::string>>;

// A value that only goes up. Add() takes integral units (requests, bytes,
// nanoseconds); the exposed value is count * unit (1e-9 for seconds counted
// in nanoseconds). Thread-safe, lock-free.
class Counter {
 public:
  explicit Counter(double unit = 1) : unit_(unit) {}
  void Add(uint64_t n = 1) { v_.fetch_add(n, std::memory_order_relaxed); }
  uint64_t raw() const { return v_.load(std::memory_order_relaxed); }
  double value() const { return ScaleUnits(raw(), unit_); }

  // n * unit, rounded once (n / 1e9 rather than n * 1e-9 for a unit of
  // 1e-9, so that 1500000000 ns reads 1.5).
  static double ScaleUnits(uint64_t n, double unit);

 private:
  const double unit_;
  std::atomic<uint64_t> v_{0};
};

// A value that goes up and down. Thread-safe, lock-free.
class Gauge {
 public:
  void Set(double v) { v_.store(v, std::memory_order_relaxed); }
  void Add(double d) { v_.fetch_add(d, std::memory_order_relaxed); }
  double value() const { return v_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> v_{0};
};

// Observations counted into buckets with fixed upper bounds. Observe()
// takes integral units like Counter::Add (nanoseconds, bytes); `bounds` are
// in exposed units (seconds, bytes) and must be ascending (they are sorted
// and de-duplicated, non-finite ones dropped); the +Inf bucket is implicit.
// Thread-safe, lock-free: a short search over the bounds and two atomic
// adds per observation.
class Histogram {
 public:
  Histogram(std::vector<double> bounds, double unit = 1);

  void Observe(uint64_t v);

  struct Snapshot {
    std::vector<double> bounds;     // exposed units
    std::vector<uint64_t> counts;   // per bucket, not cumulative; +Inf last
    double sum = 0;                 // exposed units
    uint64_t count = 0;
  };
  // Counts may be read while others observe: a snapshot is not atomic as
  // a whole, but each bucket's count is, and `count` is their sum (so the
  // +Inf bucket always equals _count).
  Snapshot Take() const;

  // Latency buckets, seconds: 100 us to 60 s.
  static std::vector<double> LatencyBounds();
  // Message size buckets, bytes: 256 B to 64 MiB, by 4x.
  static std::vector<double> SizeBounds();

 private:
  const double unit_;
  std::vector<double> bounds_;          // constant after construction
  std::vector<uint64_t> raw_bounds_;    // bounds_ in units, rounded down
  std::unique_ptr<std::atomic<uint64_t>[]> counts_;  // bounds_.size() + 1
  std::atomic<uint64_t> sum_{0};
};

// Writes the text exposition format. Samples of one family are grouped
// under its # HELP and # TYPE lines whatever order they come in, families
// in the order they first appear; a family given twice keeps its first
// help and type. Metric and label names are made valid (a character
// outside [a-zA-Z0-9_:] becomes '_', a leading digit gets a '_' before it);
// label values are escaped (\\, \", \n) and HELP text too (\\, \n). Values:
// integers as integers, others in the shortest form that reads back the
// same double, NaN, +Inf, -Inf.
class ExpositionWriter {
 public:
  // type: "counter", "gauge", "histogram" (or "untyped").
  void Family(std::string_view name, std::string_view help,
              std::string_view type);
  // A sample of family `family`: `family` + `suffix` ("_bucket", "_sum"...).
  void Sample(std::string_view family, std::string_view suffix,
              const MetricLabels& labels, double value);
  // Shorthands: declare the family (if new) and write one sample.
  void AddCounter(std::string_view name, std::string_view help,
                  const MetricLabels& labels, double value);
  void AddGauge(std::string_view name, std::string_view help,
                const MetricLabels& labels, double value);
  // Every _bucket (cumulative, le="+Inf" last), _sum and _count of `h`.
  void AddHistogram(std::string_view name, std::string_view help,
                    const MetricLabels& labels, const Histogram::Snapshot& h);

  // The whole text; the writer is empty again afterwards.
  std::string Take();

  // Exposed for tests.
  static std::string SanitizeName(std::string_view name, bool label);
  static std::string EscapeLabelValue(std::string_view v);
  static std::string EscapeHelp(std::string_view v);
  static std::string FormatValue(double v);

 private:
  struct FamilyText {
    std::string header;
    std::string samples;
  };
  FamilyText* Find(std::string_view name);

  std::vector<FamilyText> families_;
  std::map<std::string, size_t, std::less<>> index_;
};

// Owns metrics by (name, labels) and renders them all for a scrape, with
// what the collectors add. Getting a metric takes a lock (do it once, keep
// the pointer: it stays valid as long as the registry); updating one does
// not. Thread-safe.
class MetricsRegistry {
 public:
  MetricsRegistry() = default;
  MetricsRegistry(const MetricsRegistry&) = delete;
  MetricsRegistry& operator=(const MetricsRegistry&) = delete;

  // The metric of `name` with exactly `labels`, created on first use.
  // `help`, `unit` and `bounds` of the first call are kept. A name already
  // used with another type gets a separate metric of its own that is not
  // exposed (a programming error, logged once).
  Counter* GetCounter(const std::string& name, const std::string& help,
                      const MetricLabels& labels = {}, double unit = 1);
  Gauge* GetGauge(const std::string& name, const std::string& help,
                  const MetricLabels& labels = {});
  Histogram* GetHistogram(const std::string& name, const std::string& help,
                          const MetricLabels& labels,
                          std::vector<double> bounds, double unit = 1);

  // A collector writes values computed at scrape time (a table's size, the
  // process's memory) into the writer. It runs on the scraping thread,
  // under the registry's collector lock: it must not call back into the
  // registry. Returns an id for RemoveCollector, which waits for a scrape
  // that is running it to finish: after it returns the collector is never
  // called again, so what it captured may go.
  using Collector = std::function<void(ExpositionWriter*)>;
  int AddCollector(Collector c);
  void RemoveCollector(int id);

  // The text exposition of everything.
  std::string Scrape() const;

 private:
  enum class Type { kCounter, kGauge, kHistogram };
  struct Child {
    MetricLabels labels;
    std::unique_ptr<Counter> counter;
    std::unique_ptr<Gauge> gauge;
    std::unique_ptr<Histogram> histogram;
  };
  struct Family {
    std::string help;
    Type type;
    std::vector<std::unique_ptr<Child>> children;
  };
  Child* GetChild(const std::string& name, const std::string& help, Type type,
                  const MetricLabels& labels, bool* created)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  mutable absl::Mutex mu_;
  std::vector<std::pair<std::string, Family>> families_ ABSL_GUARDED_BY(mu_);
  // Metrics asked for under a name of another type: kept, not exposed.
  std::vector<std::unique_ptr<Child>> orphans_ ABSL_GUARDED_BY(mu_);
  // Collectors run under their own lock, so that they may take time
  // without blocking GetCounter (they must not call the registry).
  mutable absl::Mutex collectors_mu_;
  std::map<int, Collector> collectors_ ABSL_GUARDED_BY(collectors_mu_);
  int next_collector_ ABSL_GUARDED_BY(collectors_mu_) = 1;
};

// The data path's metrics of one side (a server's handlers, a worker's
// KVWorker), by table: <prefix>_{push,pull}_requests_total,
// _errors_total, _bytes_total (counters), _latency_seconds and
// _size_bytes (histograms), all labelled {table="<id>"}. Tables 0..63 get
// their own label, any other id (a malformed request's) table="other", so
// a peer cannot grow the label set. Record() is lock-free and allocates
// nothing once a table's metrics exist (the first request of a table
// creates them). Thread-safe.
class PushPullMetrics {
 public:
  enum Kind { kPush = 0, kPull = 1 };
  static constexpr int kLabeledTables = 64;

  // `prefix`: "ps_server" or "ps_worker". `latency_help`: what the latency
  // histograms measure on this side. `registry` must outlive this.
  PushPullMetrics(MetricsRegistry* registry, std::string prefix,
                  std::string push_latency_help, std::string pull_latency_help);

  // One request of `kind` on `table`: `bytes` of keys and values,
  // `latency_ns` (< 0: not measured), failed or not.
  void Record(Kind kind, int table, uint64_t bytes, int64_t latency_ns,
              bool ok);
  // The errors counter of (kind, table), for a caller that learns the
  // outcome later than the rest (Record with ok = true, then Add() here).
  Counter* Errors(Kind kind, int table) { return Get(kind, table).errors; }

 private:
  struct Op {
    Counter* requests;
    Counter* errors;
    Counter* bytes;
    Histogram* latency;
    Histogram* size;
  };
  const Op& Get(Kind kind, int table);

  MetricsRegistry* const registry_;
  const std::string prefix_;
  const std::string latency_help_[2];
  // Published once per (kind, table); never freed while this lives.
  std::atomic<const Op*> ops_[2][kLabeledTables + 1] = {};
  absl::Mutex mu_;
  std::vector<std::unique_ptr<Op>> owned_ ABSL_GUARDED_BY(mu_);
};

// Nanoseconds on a monotonic clock (latency measurements).
int64_t MonotonicNanos();

// Writes the process's own metrics in the names Prometheus's client
// libraries use: process_resident_memory_bytes, process_virtual_memory_bytes
// (/proc/self/statm), process_cpu_seconds_total, process_start_time_seconds
// (/proc/self/stat), process_open_fds, process_threads. A value that cannot
// be read is left out.
void WriteProcessMetrics(ExpositionWriter* w);

// Resident set size of this process in bytes, from /proc/self/statm; -1
// when it cannot be read.
int64_t ProcessRssBytes();

}  // namespace ps
