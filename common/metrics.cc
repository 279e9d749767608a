#include "common/metrics.h"

#include <dirent.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "common/logging.h"

namespace ps {

double Counter::ScaleUnits(uint64_t n, double unit) {
  const double v = static_cast<double>(n);
  if (unit > 0 && unit < 1) {
    const double inverse = std::round(1 / unit);
    if (std::fabs(inverse * unit - 1) < 1e-12) return v / inverse;
  }
  return v * unit;
}

// ---- Histogram

Histogram::Histogram(std::vector<double> bounds, double unit) : unit_(unit) {
  bounds.erase(std::remove_if(bounds.begin(), bounds.end(),
                              [](double b) { return !std::isfinite(b); }),
               bounds.end());
  std::sort(bounds.begin(), bounds.end());
  bounds.erase(std::unique(bounds.begin(), bounds.end()), bounds.end());
  bounds_ = std::move(bounds);
  raw_bounds_.reserve(bounds_.size());
  for (double b : bounds_) {
    const double raw = std::floor(b / unit_);
    raw_bounds_.push_back(raw <= 0 ? 0
                          : raw >= 1.8e19
                              ? UINT64_MAX
                              : static_cast<uint64_t>(raw));
  }
  counts_ = std::make_unique<std::atomic<uint64_t>[]>(bounds_.size() + 1);
  for (size_t i = 0; i <= bounds_.size(); ++i) counts_[i].store(0);
}

void Histogram::Observe(uint64_t v) {
  // The first bucket whose bound is >= v (le: "less than or equal").
  size_t i = 0;
  const size_t n = raw_bounds_.size();
  while (i < n && v > raw_bounds_[i]) ++i;
  counts_[i].fetch_add(1, std::memory_order_relaxed);
  sum_.fetch_add(v, std::memory_order_relaxed);
}

Histogram::Snapshot Histogram::Take() const {
  Snapshot s;
  s.bounds = bounds_;
  s.counts.resize(bounds_.size() + 1);
  for (size_t i = 0; i <= bounds_.size(); ++i) {
    s.counts[i] = counts_[i].load(std::memory_order_relaxed);
    s.count += s.counts[i];
  }
  s.sum = Counter::ScaleUnits(sum_.load(std::memory_order_relaxed), unit_);
  return s;
}

std::vector<double> Histogram::LatencyBounds() {
  return {0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025,
          0.05,   0.1,     0.25,   0.5,   1,      2.5,   5,    10,
          30,     60};
}

std::vector<double> Histogram::SizeBounds() {
  std::vector<double> b;
  for (double v = 256; v <= 64.0 * 1024 * 1024; v *= 4) b.push_back(v);
  return b;
}

// ---- ExpositionWriter

std::string ExpositionWriter::SanitizeName(std::string_view name, bool label) {
  std::string out;
  out.reserve(name.size() + 1);
  if (name.empty() || (name[0] >= '0' && name[0] <= '9')) out.push_back('_');
  for (char c : name) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
                    (c >= '0' && c <= '9') || c == '_' ||
                    (!label && c == ':');
    out.push_back(ok ? c : '_');
  }
  return out;
}

std::string ExpositionWriter::EscapeLabelValue(std::string_view v) {
  std::string out;
  out.reserve(v.size());
  for (char c : v) {
    switch (c) {
      case '\\':
        out += "\\\\";
        break;
      case '"':
        out += "\\\"";
        break;
      case '\n':
        out += "\\n";
        break;
      default:
        out.push_back(c);
    }
  }
  return out;
}

std::string ExpositionWriter::EscapeHelp(std::string_view v) {
  std::string out;
  out.reserve(v.size());
  for (char c : v) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out.push_back(c);
    }
  }
  return out;
}

std::string ExpositionWriter::FormatValue(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  if (v == std::floor(v) && std::fabs(v) < 9007199254740992.0) {
    return absl::StrCat(static_cast<int64_t>(v));
  }
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof(buf), v);  // shortest round trip
  return std::string(buf, r.ptr);
}

ExpositionWriter::FamilyText* ExpositionWriter::Find(std::string_view name) {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &families_[it->second];
}

void ExpositionWriter::Family(std::string_view name, std::string_view help,
                              std::string_view type) {
  const std::string n = SanitizeName(name, false);
  if (Find(n) != nullptr) return;
  index_.emplace(n, families_.size());
  std::string header = "# HELP " + n + " " + EscapeHelp(help) + "\n# TYPE " +
                       n + " ";
  header.append(type.data(), type.size());
  header += "\n";
  families_.push_back(FamilyText{std::move(header), ""});
}

void ExpositionWriter::Sample(std::string_view family, std::string_view suffix,
                              const MetricLabels& labels, double value) {
  const std::string n = SanitizeName(family, false);
  FamilyText* f = Find(n);
  if (f == nullptr) {
    Family(n, "", "untyped");
    f = Find(n);
  }
  std::string& out = f->samples;
  out += n;
  if (!suffix.empty()) out += SanitizeName(suffix, false);
  if (!labels.empty()) {
    out.push_back('{');
    bool first = true;
    for (const auto& [k, v] : labels) {
      if (!first) out.push_back(',');
      first = false;
      absl::StrAppend(&out, SanitizeName(k, true), "=\"", EscapeLabelValue(v),
                      "\"");
    }
    out.push_back('}');
  }
  absl::StrAppend(&out, " ", FormatValue(value), "\n");
}

void ExpositionWriter::AddCounter(std::string_view name, std::string_view help,
                                  const MetricLabels& labels, double value) {
  Family(name, help, "counter");
  Sample(name, "", labels, value);
}

void ExpositionWriter::AddGauge(std::string_view name, std::string_view help,
                                const MetricLabels& labels, double value) {
  Family(name, help, "gauge");
  Sample(name, "", labels, value);
}

void ExpositionWriter::AddHistogram(std::string_view name,
                                    std::string_view help,
                                    const MetricLabels& labels,
                                    const Histogram::Snapshot& h) {
  Family(name, help, "histogram");
  MetricLabels with_le = labels;
  with_le.emplace_back("le", "");
  uint64_t cumulative = 0;
  for (size_t i = 0; i < h.counts.size(); ++i) {
    cumulative += h.counts[i];
    with_le.back().second =
        i < h.bounds.size() ? FormatValue(h.bounds[i]) : "+Inf";
    Sample(name, "_bucket", with_le, static_cast<double>(cumulative));
  }
  Sample(name, "_sum", labels, h.sum);
  Sample(name, "_count", labels, static_cast<double>(h.count));
}

std::string ExpositionWriter::Take() {
  std::string out;
  for (FamilyText& f : families_) {
    absl::StrAppend(&out, f.header, f.samples);
  }
  families_.clear();
  index_.clear();
  return out;
}

// ---- MetricsRegistry

MetricsRegistry::Child* MetricsRegistry::GetChild(const std::string& name,
                                                  const std::string& help,
                                                  Type type,
                                                  const MetricLabels& labels,
                                                  bool* created) {
  *created = false;
  Family* family = nullptr;
  for (auto& [n, f] : families_) {
    if (n == name) family = &f;
  }
  if (family == nullptr) {
    families_.emplace_back(name, Family{help, type, {}});
    family = &families_.back().second;
  }
  if (family->type != type) {
    PS_LOG_ERROR("metric {} asked for with another type; not exposed", name);
    orphans_.push_back(std::make_unique<Child>());
    orphans_.back()->labels = labels;
    *created = true;
    return orphans_.back().get();
  }
  for (auto& c : family->children) {
    if (c->labels == labels) return c.get();
  }
  family->children.push_back(std::make_unique<Child>());
  family->children.back()->labels = labels;
  *created = true;
  return family->children.back().get();
}

Counter* MetricsRegistry::GetCounter(const std::string& name,
                                     const std::string& help,
                                     const MetricLabels& labels, double unit) {
  absl::MutexLock l(&mu_);
  bool created;
  Child* c = GetChild(name, help, Type::kCounter, labels, &created);
  if (created) c->counter = std::make_unique<Counter>(unit);
  return c->counter.get();
}

Gauge* MetricsRegistry::GetGauge(const std::string& name,
                                 const std::string& help,
                                 const MetricLabels& labels) {
  absl::MutexLock l(&mu_);
  bool created;
  Child* c = GetChild(name, help, Type::kGauge, labels, &created);
  if (created) c->gauge = std::make_unique<Gauge>();
  return c->gauge.get();
}

Histogram* MetricsRegistry::GetHistogram(const std::string& name,
                                         const std::string& help,
                                         const MetricLabels& labels,
                                         std::vector<double> bounds,
                                         double unit) {
  absl::MutexLock l(&mu_);
  bool created;
  Child* c = GetChild(name, help, Type::kHistogram, labels, &created);
  if (created) c->histogram = std::make_unique<Histogram>(std::move(bounds), unit);
  return c->histogram.get();
}

int MetricsRegistry::AddCollector(Collector c) {
  absl::MutexLock l(&collectors_mu_);
  const int id = next_collector_++;
  collectors_.emplace(id, std::move(c));
  return id;
}

void MetricsRegistry::RemoveCollector(int id) {
  absl::MutexLock l(&collectors_mu_);  // waits for a scrape running it
  collectors_.erase(id);
}

std::string MetricsRegistry::Scrape() const {
  ExpositionWriter w;
  {
    absl::MutexLock l(&mu_);
    for (const auto& [name, f] : families_) {
      const char* type = f.type == Type::kCounter ? "counter"
                         : f.type == Type::kGauge ? "gauge"
                                                  : "histogram";
      w.Family(name, f.help, type);
      for (const auto& c : f.children) {
        switch (f.type) {
          case Type::kCounter:
            w.Sample(name, "", c->labels, c->counter->value());
            break;
          case Type::kGauge:
            w.Sample(name, "", c->labels, c->gauge->value());
            break;
          case Type::kHistogram:
            w.AddHistogram(name, f.help, c->labels, c->histogram->Take());
            break;
        }
      }
    }
  }
  {
    absl::MutexLock l(&collectors_mu_);
    for (const auto& [id, c] : collectors_) c(&w);
  }
  return w.Take();
}

// ---- PushPullMetrics

int64_t MonotonicNanos() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

PushPullMetrics::PushPullMetrics(MetricsRegistry* registry, std::string prefix,
                                 std::string push_latency_help,
                                 std::string pull_latency_help)
    : registry_(registry),
      prefix_(std::move(prefix)),
      latency_help_{std::move(push_latency_help),
                    std::move(pull_latency_help)} {}

const PushPullMetrics::Op& PushPullMetrics::Get(Kind kind, int table) {
  const int slot =
      table >= 0 && table < kLabeledTables ? table : kLabeledTables;
  std::atomic<const Op*>& p = ops_[kind][slot];
  if (const Op* op = p.load(std::memory_order_acquire)) return *op;
  absl::MutexLock l(&mu_);  // the first request of this table only
  if (const Op* op = p.load(std::memory_order_acquire)) return *op;
  const std::string what = kind == kPush ? "push" : "pull";
  const std::string base = absl::StrCat(prefix_, "_", what);
  const MetricLabels labels = {
      {"table", slot == kLabeledTables ? "other" : absl::StrCat(slot)}};
  auto op = std::make_unique<Op>();
  op->requests = registry_->GetCounter(
      base + "_requests_total", absl::StrCat(what, " requests, by table"),
      labels);
  op->errors = registry_->GetCounter(
      base + "_errors_total",
      absl::StrCat(what, " requests that failed, by table"), labels);
  op->bytes = registry_->GetCounter(
      base + "_bytes_total",
      absl::StrCat("bytes of keys and values of ", what, " requests"),
      labels);
  op->latency = registry_->GetHistogram(base + "_latency_seconds",
                                        latency_help_[kind], labels,
                                        Histogram::LatencyBounds(), 1e-9);
  op->size = registry_->GetHistogram(
      base + "_size_bytes",
      absl::StrCat("bytes of keys and values per ", what, " request"), labels,
      Histogram::SizeBounds());
  const Op* raw = op.get();
  owned_.push_back(std::move(op));
  p.store(raw, std::memory_order_release);
  return *raw;
}

void PushPullMetrics::Record(Kind kind, int table, uint64_t bytes,
                             int64_t latency_ns, bool ok) {
  const Op& op = Get(kind, table);
  op.requests->Add();
  if (!ok) op.errors->Add();
  op.bytes->Add(bytes);
  op.size->Observe(bytes);
  if (latency_ns >= 0) op.latency->Observe(static_cast<uint64_t>(latency_ns));
}

// ---- Process metrics

int64_t ProcessRssBytes() {
  std::ifstream in("/proc/self/statm");
  int64_t size = 0, resident = 0;
  if (!(in >> size >> resident)) return -1;
  return resident * sysconf(_SC_PAGESIZE);
}

void WriteProcessMetrics(ExpositionWriter* w) {
  const int64_t page = sysconf(_SC_PAGESIZE);
  {
    std::ifstream in("/proc/self/statm");
    int64_t size = 0, resident = 0;
    if (in >> size >> resident) {
      w->AddGauge("process_resident_memory_bytes",
                  "Resident memory size in bytes.", {},
                  static_cast<double>(resident * page));
      w->AddGauge("process_virtual_memory_bytes",
                  "Virtual memory size in bytes.", {},
                  static_cast<double>(size * page));
    }
  }
  {
    // Fields after the command name (which may hold spaces and parens).
    std::ifstream in("/proc/self/stat");
    std::string stat((std::istreambuf_iterator<char>(in)),
                     std::istreambuf_iterator<char>());
    const size_t close = stat.rfind(')');
    if (close != std::string::npos) {
      std::istringstream fields(stat.substr(close + 2));
      std::vector<std::string> f;
      for (std::string x; fields >> x;) f.push_back(x);
      // f[0] is field 3 (state): utime 14, stime 15, num_threads 20,
      // starttime 22.
      const double ticks = static_cast<double>(sysconf(_SC_CLK_TCK));
      if (f.size() > 19 && ticks > 0) {
        const double cpu =
            (std::strtod(f[11].c_str(), nullptr) +
             std::strtod(f[12].c_str(), nullptr)) / ticks;
        w->AddCounter("process_cpu_seconds_total",
                      "Total user and system CPU time spent in seconds.", {},
                      cpu);
        w->AddGauge("process_threads", "Number of OS threads in the process.",
                    {}, std::strtod(f[17].c_str(), nullptr));
        std::ifstream up("/proc/stat");
        std::string key;
        double btime = -1;
        while (up >> key) {
          if (key == "btime") {
            up >> btime;
            break;
          }
        }
        if (btime >= 0) {
          w->AddGauge("process_start_time_seconds",
                      "Start time of the process since unix epoch in seconds.",
                      {}, btime + std::strtod(f[19].c_str(), nullptr) / ticks);
        }
      }
    }
  }
  if (DIR* d = opendir("/proc/self/fd")) {
    int n = 0;
    while (struct dirent* e = readdir(d)) {
      if (e->d_name[0] != '.') ++n;
    }
    closedir(d);
    w->AddGauge("process_open_fds", "Number of open file descriptors.", {},
                n - 1);  // the one opendir holds
  }
}

}  // namespace ps
