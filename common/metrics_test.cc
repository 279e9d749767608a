// The text exposition format (what Prometheus parses) and the metrics
// endpoint over loopback.
#include "common/metrics.h"

#include <cmath>
#include <limits>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/config.h"
#include "common/health.h"
#include "common/metrics_http.h"
#include "gtest/gtest.h"
#include "httplib.h"

namespace ps {
namespace {

TEST(ExpositionWriterTest, CounterAndGaugeWithHelpAndType) {
  ExpositionWriter w;
  w.AddCounter("ps_pushes_total", "Pushes.", {{"table", "0"}}, 3);
  w.AddGauge("ps_keys", "Keys stored.", {}, 12.5);
  EXPECT_EQ(w.Take(),
            "# HELP ps_pushes_total Pushes.\n"
            "# TYPE ps_pushes_total counter\n"
            "ps_pushes_total{table=\"0\"} 3\n"
            "# HELP ps_keys Keys stored.\n"
            "# TYPE ps_keys gauge\n"
            "ps_keys 12.5\n");
  EXPECT_EQ(w.Take(), "");  // empty again
}

TEST(ExpositionWriterTest, SamplesOfOneFamilyStayTogether) {
  ExpositionWriter w;
  w.AddCounter("a_total", "A.", {{"x", "1"}}, 1);
  w.AddGauge("b", "B.", {}, 2);
  w.AddCounter("a_total", "ignored: first help wins", {{"x", "2"}}, 4);
  EXPECT_EQ(w.Take(),
            "# HELP a_total A.\n"
            "# TYPE a_total counter\n"
            "a_total{x=\"1\"} 1\n"
            "a_total{x=\"2\"} 4\n"
            "# HELP b B.\n"
            "# TYPE b gauge\n"
            "b 2\n");
}

TEST(ExpositionWriterTest, EscapesLabelValuesAndHelp) {
  ExpositionWriter w;
  w.AddGauge("g", "line one\nback\\slash \"quotes\" stay", 
             {{"path", "C:\\dir \"x\"\nnext"}, {"bad-name", "v"}}, 1);
  EXPECT_EQ(w.Take(),
            "# HELP g line one\\nback\\\\slash \"quotes\" stay\n"
            "# TYPE g gauge\n"
            "g{path=\"C:\\\\dir \\\"x\\\"\\nnext\",bad_name=\"v\"} 1\n");
}

TEST(ExpositionWriterTest, NamesAreMadeValid) {
  EXPECT_EQ(ExpositionWriter::SanitizeName("ps.server-push", false),
            "ps_server_push");
  EXPECT_EQ(ExpositionWriter::SanitizeName("job:rate", false), "job:rate");
  EXPECT_EQ(ExpositionWriter::SanitizeName("job:rate", true), "job_rate");
  EXPECT_EQ(ExpositionWriter::SanitizeName("9lives", false), "_9lives");
  EXPECT_EQ(ExpositionWriter::SanitizeName("", true), "_");
}

TEST(ExpositionWriterTest, Values) {
  EXPECT_EQ(ExpositionWriter::FormatValue(0), "0");
  EXPECT_EQ(ExpositionWriter::FormatValue(-7), "-7");
  EXPECT_EQ(ExpositionWriter::FormatValue(1e15), "1000000000000000");
  EXPECT_EQ(ExpositionWriter::FormatValue(0.1), "0.1");
  EXPECT_EQ(ExpositionWriter::FormatValue(2.5e-7), "2.5e-07");
  EXPECT_EQ(ExpositionWriter::FormatValue(1e300), "1e+300");
  EXPECT_EQ(ExpositionWriter::FormatValue(
                std::numeric_limits<double>::quiet_NaN()),
            "NaN");
  EXPECT_EQ(ExpositionWriter::FormatValue(
                std::numeric_limits<double>::infinity()),
            "+Inf");
  EXPECT_EQ(ExpositionWriter::FormatValue(
                -std::numeric_limits<double>::infinity()),
            "-Inf");
  // Round trip of a value with many digits.
  const double v = 0.1 + 0.2;
  EXPECT_EQ(std::stod(ExpositionWriter::FormatValue(v)), v);
}

TEST(HistogramTest, BucketsAreCumulativeWithSumAndCount) {
  // Nanoseconds observed, seconds exposed.
  Histogram h({0.001, 0.01, 0.1}, 1e-9);
  h.Observe(500'000);       // 0.5 ms  -> le 0.001
  h.Observe(1'000'000);     // 1 ms    -> le 0.001 (bounds are inclusive)
  h.Observe(20'000'000);    // 20 ms   -> le 0.1
  h.Observe(3'000'000'000); // 3 s     -> +Inf
  ExpositionWriter w;
  w.AddHistogram("lat_seconds", "Latency.", {{"table", "1"}}, h.Take());
  EXPECT_EQ(w.Take(),
            "# HELP lat_seconds Latency.\n"
            "# TYPE lat_seconds histogram\n"
            "lat_seconds_bucket{table=\"1\",le=\"0.001\"} 2\n"
            "lat_seconds_bucket{table=\"1\",le=\"0.01\"} 2\n"
            "lat_seconds_bucket{table=\"1\",le=\"0.1\"} 3\n"
            "lat_seconds_bucket{table=\"1\",le=\"+Inf\"} 4\n"
            "lat_seconds_sum{table=\"1\"} 3.0215\n"
            "lat_seconds_count{table=\"1\"} 4\n");
}

TEST(HistogramTest, BoundsAreSortedAndCleaned) {
  Histogram h({10, 1, 10, std::numeric_limits<double>::infinity(),
               std::numeric_limits<double>::quiet_NaN()});
  h.Observe(5);
  Histogram::Snapshot s = h.Take();
  EXPECT_EQ(s.bounds, (std::vector<double>{1, 10}));
  EXPECT_EQ(s.counts, (std::vector<uint64_t>{0, 1, 0}));
  EXPECT_EQ(s.count, 1u);
  EXPECT_EQ(s.sum, 5);
}

TEST(HistogramTest, ConcurrentObservationsAreAllCounted) {
  Histogram h(Histogram::SizeBounds());
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&h, t] {
      for (int i = 0; i < 10000; ++i) h.Observe(static_cast<uint64_t>(i * t));
    });
  }
  for (auto& t : threads) t.join();
  Histogram::Snapshot s = h.Take();
  EXPECT_EQ(s.count, 40000u);
  uint64_t sum = 0;
  for (uint64_t t = 0; t < 4; ++t) sum += t * 9999 * 10000 / 2;
  EXPECT_EQ(s.sum, static_cast<double>(sum));
}

TEST(MetricsRegistryTest, SameNameAndLabelsIsTheSameMetric) {
  MetricsRegistry r;
  Counter* a = r.GetCounter("reqs_total", "Requests.", {{"table", "0"}});
  Counter* b = r.GetCounter("reqs_total", "Requests.", {{"table", "0"}});
  Counter* c = r.GetCounter("reqs_total", "Requests.", {{"table", "1"}});
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
  a->Add(2);
  c->Add();
  Counter* secs = r.GetCounter("wait_seconds_total", "Waiting.", {}, 1e-9);
  secs->Add(1'500'000'000);
  r.GetGauge("clock", "Clock.")->Set(7);
  r.GetHistogram("lat_seconds", "Latency.", {}, {1}, 1e-9)->Observe(10);
  // A name reused with another type is not exposed twice.
  r.GetGauge("reqs_total", "wrong type")->Set(99);
  EXPECT_EQ(r.Scrape(),
            "# HELP reqs_total Requests.\n"
            "# TYPE reqs_total counter\n"
            "reqs_total{table=\"0\"} 2\n"
            "reqs_total{table=\"1\"} 1\n"
            "# HELP wait_seconds_total Waiting.\n"
            "# TYPE wait_seconds_total counter\n"
            "wait_seconds_total 1.5\n"
            "# HELP clock Clock.\n"
            "# TYPE clock gauge\n"
            "clock 7\n"
            "# HELP lat_seconds Latency.\n"
            "# TYPE lat_seconds histogram\n"
            "lat_seconds_bucket{le=\"1\"} 1\n"
            "lat_seconds_bucket{le=\"+Inf\"} 1\n"
            "lat_seconds_sum 1e-08\n"
            "lat_seconds_count 1\n");
}

TEST(MetricsRegistryTest, CollectorsRunAtScrapeUntilRemoved) {
  MetricsRegistry r;
  int calls = 0;
  const int id = r.AddCollector([&calls](ExpositionWriter* w) {
    ++calls;
    w->AddGauge("keys", "Keys.", {{"table", "0"}}, 42);
  });
  EXPECT_EQ(r.Scrape(),
            "# HELP keys Keys.\n# TYPE keys gauge\nkeys{table=\"0\"} 42\n");
  r.RemoveCollector(id);
  EXPECT_EQ(r.Scrape(), "");
  EXPECT_EQ(calls, 1);
}

TEST(ProcessMetricsTest, ResidentMemoryAndCpu) {
  EXPECT_GT(ProcessRssBytes(), 1 << 20);
  ExpositionWriter w;
  WriteProcessMetrics(&w);
  const std::string text = w.Take();
  for (const char* name :
       {"\nprocess_resident_memory_bytes ", "\nprocess_cpu_seconds_total ",
        "\nprocess_start_time_seconds ", "\nprocess_open_fds ",
        "\nprocess_threads "}) {
    EXPECT_NE(text.find(name), std::string::npos) << name << " in\n" << text;
  }
}

TEST(ResolveMetricsPortTest, FlagThenEnvThenConfig) {
  unsetenv("PS_METRICS_PORT");
  EXPECT_EQ(*ResolveMetricsPort(-1, 9100), 9100);
  EXPECT_EQ(*ResolveMetricsPort(-1), -1);
  EXPECT_EQ(*ResolveMetricsPort(0, 9100), 0);
  setenv("PS_METRICS_PORT", "9200", 1);
  EXPECT_EQ(*ResolveMetricsPort(-1, 9100), 9200);
  EXPECT_EQ(*ResolveMetricsPort(9300, 9100), 9300);
  setenv("PS_METRICS_PORT", "http", 1);
  absl::StatusOr<int> bad = ResolveMetricsPort(-1, 9100);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("PS_METRICS_PORT"), std::string::npos);
  setenv("PS_METRICS_PORT", "70000", 1);
  EXPECT_FALSE(ResolveMetricsPort(-1, 9100).ok());
  EXPECT_FALSE(ResolveMetricsPort(70000).ok());
  unsetenv("PS_METRICS_PORT");
}

TEST(ObservabilityConfigTest, MetricsPortIsCheckedAndNamed) {
  absl::StatusOr<JobConfig> c =
      ParseJobConfig("observability:\n  metrics_port: 9100\n");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->observability.metrics_port, 9100);
  EXPECT_EQ(JobConfig().observability.metrics_port, 0);  // off by default
  for (const char* bad : {"observability:\n  metrics_port: 70000\n",
                          "observability:\n  metrics_port: -1\n",
                          "observability:\n  metrics_port: http\n",
                          "observability:\n  metrics_prot: 1\n"}) {
    absl::StatusOr<JobConfig> b = ParseJobConfig(bad);
    EXPECT_EQ(b.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(b.status().message().find("observability.metrics_"),
              std::string::npos)
        << b.status();
  }
  JobConfig o;
  EXPECT_TRUE(ApplyOverride(&o, "observability.metrics_port=9200").ok());
  EXPECT_EQ(o.observability.metrics_port, 9200);
  // It round-trips through the YAML the scheduler hands the nodes.
  absl::StatusOr<JobConfig> back = ParseJobConfig(ToYaml(o));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->observability.metrics_port, 9200);
}

TEST(MetricsHttpServerTest, ServesMetricsAndHealthOverLoopback) {
  MetricsRegistry r;
  r.GetCounter("ps_test_total", "Test.")->Add(5);
  NodeHealth health;
  MetricsHttpServer http(&r, &health);
  absl::StatusOr<int> port = http.Start("127.0.0.1", 0);
  ASSERT_TRUE(port.ok()) << port.status();
  ASSERT_GT(*port, 0);
  httplib::Client c("127.0.0.1", *port);
  auto m = c.Get("/metrics");
  ASSERT_TRUE(m);
  EXPECT_EQ(m->status, 200);
  EXPECT_EQ(m->get_header_value("Content-Type"),
            "text/plain; version=0.0.4; charset=utf-8");
  EXPECT_NE(m->body.find("\nps_test_total 5\n"), std::string::npos) << m->body;

  auto h = c.Get("/healthz");
  ASSERT_TRUE(h);
  EXPECT_EQ(h->status, 503);
  EXPECT_EQ(h->body, "starting: not registered yet\n");
  health.Set(Serving::kServing, "registered");
  h = c.Get("/healthz");
  ASSERT_TRUE(h);
  EXPECT_EQ(h->status, 200);
  EXPECT_EQ(h->body, "serving\n");
  health.Set(Serving::kStopping, "job over");
  h = c.Get("/healthz");
  ASSERT_TRUE(h);
  EXPECT_EQ(h->status, 503);
  auto l = c.Get("/livez");
  ASSERT_TRUE(l);
  EXPECT_EQ(l->status, 200);
  auto nf = c.Get("/nothing");
  ASSERT_TRUE(nf);
  EXPECT_EQ(nf->status, 404);
  auto post = c.Post("/metrics", std::string(100000, 'x'), "text/plain");
  if (post) EXPECT_NE(post->status, 200);

  // The port is taken now: a second endpoint on it fails, naming it.
  MetricsHttpServer other(&r, nullptr);
  absl::StatusOr<int> again = other.Start("127.0.0.1", *port);
  EXPECT_EQ(again.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(again.status().message().find(absl::StrCat(":", *port)),
            std::string::npos);

  http.Stop();
  http.Stop();  // idempotent
  httplib::Client after("127.0.0.1", *port);
  after.set_connection_timeout(1);
  EXPECT_FALSE(after.Get("/metrics"));
}

TEST(MetricsHttpServerTest, StopRightAfterStart) {
  MetricsRegistry r;
  for (int i = 0; i < 5; ++i) {
    MetricsHttpServer http(&r, nullptr);
    ASSERT_TRUE(http.Start("127.0.0.1", 0).ok());
  }  // the destructor stops it
}

TEST(MetricsHttpServerTest, GarbageRequestDoesNotStopIt) {
  MetricsRegistry r;
  r.GetGauge("g", "G.")->Set(1);
  MetricsHttpServer http(&r, nullptr);
  absl::StatusOr<int> port = http.Start("127.0.0.1", 0);
  ASSERT_TRUE(port.ok());
  httplib::Client c("127.0.0.1", *port);
  // Malformed paths and headers.
  for (const char* path : {"/metrics?%%%", "/%00", "//..//metrics"}) {
    auto res = c.Get(path);
    (void)res;
  }
  httplib::Headers huge{{"X-Big", std::string(1 << 16, 'a')}};
  (void)c.Get("/metrics", huge);
  auto m = c.Get("/metrics");
  ASSERT_TRUE(m);
  EXPECT_EQ(m->status, 200);
}

}  // namespace
}  // namespace ps
