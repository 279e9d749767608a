// ps_status: prints a running cluster as a table, changes its consistency
// model, takes a checkpoint or drains a server while it runs.
//   ps_status --scheduler host:port
//   ps_status --scheduler host:port --set_mode ssp --set_tau 8
//   ps_status --scheduler host:port --checkpoint
//   ps_status --scheduler host:port --drain 1
//   ps_status --scheduler host:port --watch 2    (refreshes until the job ends)
// The cluster token comes from --token_file, else $PS_AUTH_TOKEN, else the
// newest runs/*/token under the current directory (ps_launch writes one per
// run). TLS settings come from the PS_TLS_* variables (SecurityFromEnv).
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <optional>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_join.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "transport/grpc_transport.h"

#include <filesystem>
#include <fstream>
#include <sstream>

ABSL_FLAG(std::string, scheduler, "127.0.0.1:7000", "scheduler host:port");
ABSL_FLAG(std::string, set_mode, "",
          "change the consistency mode of the running job (ssp|asp; bsp "
          "cannot be switched to or from)");
ABSL_FLAG(int64_t, set_tau, -2, "change tau of the running job (-1: inf)");
ABSL_FLAG(bool, checkpoint, false,
          "take a checkpoint of the running job now and print where it is");
ABSL_FLAG(int64_t, checkpoint_timeout_s, 600,
          "--checkpoint: how long to wait for it");
ABSL_FLAG(int, drain, -1,
          "move every key range off server N (its backups take over), then "
          "let it leave the running job; waits until done (issue 9). A "
          "server is added by starting one more ps_server with --scheduler");
ABSL_FLAG(int64_t, drain_timeout_s, 300, "--drain: how long to wait");
ABSL_FLAG(bool, force, false,
          "--drain: drain even when the servers left would be too few to "
          "keep every key range's 1 + fault_tolerance.replicas copies");
ABSL_FLAG(double, watch, 0,
          "refresh the table every this many seconds (0: print it once); in "
          "place on a terminal, frame after frame otherwise; ends with the "
          "job: exit 0 when it succeeded, 1 when it failed, 2 when the "
          "scheduler could not be reached");
ABSL_FLAG(int, count, 0, "--watch: stop after this many frames (0: no limit)");
ABSL_FLAG(std::string, token_file, "",
          "file holding the cluster token (default: $PS_AUTH_TOKEN, else the "
          "newest runs/*/token)");

namespace {

// The token the flags and environment name; empty when none is found.
std::string FindToken() {
  std::string path = absl::GetFlag(FLAGS_token_file);
  if (path.empty()) {
    if (const char* t = std::getenv("PS_AUTH_TOKEN"); t != nullptr && *t) {
      return t;
    }
    std::error_code ec;
    std::filesystem::file_time_type newest;
    for (const auto& e : std::filesystem::directory_iterator("runs", ec)) {
      const auto f = e.path() / "token";
      auto t = std::filesystem::last_write_time(f, ec);
      if (ec) continue;
      if (path.empty() || t > newest) {
        path = f.string();
        newest = t;
      }
    }
    if (path.empty()) return "";
  }
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  if (!in) {
    std::fprintf(stderr, "ps_status: cannot read token file %s\n",
                 path.c_str());
    return "";
  }
  return std::string(absl::StripAsciiWhitespace(ss.str()));
}

// The cluster table of `s`. With `prev` (the frame `seconds` before), each
// worker's examples/s since then, and the job's.
std::string StatusTable(const ps::proto::StatusResponse& s,
                        const ps::proto::StatusResponse* prev,
                        double seconds) {
  const auto& v = s.view();
  auto examples_per_s = [&](const ps::proto::NodeInfo& n) -> std::string {
    if (prev == nullptr || seconds <= 0) return "-";
    for (const auto& p : prev->nodes()) {
      if (p.role() == n.role() && p.id() == n.id()) {
        return absl::StrFormat(
            "%.0f", static_cast<double>(n.examples() - p.examples()) / seconds);
      }
    }
    return "-";
  };
  // The share of its time a worker spent waiting on pushes and pulls:
  // since `prev` when given, else since it began.
  auto wait_share = [&](const ps::proto::NodeInfo& n) -> std::string {
    double wait = n.wait_seconds(), compute = n.compute_seconds();
    if (prev != nullptr) {
      for (const auto& p : prev->nodes()) {
        if (p.role() == n.role() && p.id() == n.id()) {
          wait -= p.wait_seconds();
          compute -= p.compute_seconds();
        }
      }
    }
    if (wait + compute <= 0) return "-";
    return absl::StrFormat("%.0f%%", 100 * wait / (wait + compute));
  };
  int64_t examples = 0, keys = 0;
  for (const auto& n : s.nodes()) examples += n.examples();
  for (const auto& ss : s.servers()) keys += ss.keys();
  std::string out = absl::StrFormat(
      "phase %s, view epoch %lld, mode %s tau %lld, %d key ranges, %lld keys, "
      "%lld examples",
      s.phase(), static_cast<long long>(v.epoch()),
      ps::proto::ConsistencyMode_Name(v.consistency().mode()),
      static_cast<long long>(v.consistency().tau()),
      v.routing().range_begin_size(), static_cast<long long>(keys),
      static_cast<long long>(examples));
  if (prev != nullptr && seconds > 0) {
    int64_t before = 0;
    for (const auto& n : prev->nodes()) before += n.examples();
    absl::StrAppendFormat(&out, " (%.0f/s)",
                          static_cast<double>(examples - before) / seconds);
  }
  if (s.replicas() > 0) {
    // Whether one more failure could lose a range (issue 9).
    absl::StrAppendFormat(&out, "\nreplicas %d: ", s.replicas());
    if (s.ranges_degraded() == 0) {
      absl::StrAppend(&out, "every key range has all its copies");
    } else {
      absl::StrAppendFormat(&out,
                            "%d key range(s) with fewer than %d complete "
                            "copies (a copy under way, or too few live "
                            "servers)",
                            s.ranges_degraded(), 1 + s.replicas());
      if (s.ranges_single_copy() > 0) {
        absl::StrAppendFormat(&out,
                              ", %d with a single complete copy (a failure "
                              "of its server now would lose them)",
                              s.ranges_single_copy());
      }
    }
  }
  absl::StrAppendFormat(
      &out, "\n\n%-6s %-8s %-22s %-9s %8s %12s %10s %5s %10s %s\n", "node",
      "role", "address", "state", "clock", "examples", "examples/s", "wait",
      "hb_age_ms", "ranges/keys/clocks");
  for (const auto& n : s.nodes()) {
    const bool server = n.role() == ps::proto::ROLE_SERVER;
    std::string name = (server ? "S[" : "W[") + std::to_string(n.id()) + "]";
    std::string extra;
    if (server) {
      for (const auto& ss : s.servers()) {
        if (ss.id() != n.id()) continue;
        extra = std::to_string(ss.ranges()) + " ranges, " +
                std::to_string(ss.keys()) + " keys, worker clocks [" +
                absl::StrJoin(ss.worker_clocks(), ",") + "]";
      }
    }
    std::string state = ps::proto::NodeState_Name(n.state());
    if (state.rfind("NODE_", 0) == 0) state = state.substr(5);
    absl::StrAppendFormat(
        &out, "%-6s %-8s %-22s %-9s %8lld %12lld %10s %5s %10lld %s\n", name,
        server ? "server" : "worker",
        n.address().empty() ? "-" : n.address(), state,
        static_cast<long long>(n.clock()),
        static_cast<long long>(n.examples()),
        server ? "-" : examples_per_s(n), server ? "-" : wait_share(n),
        n.last_heartbeat_ms() > 0
            ? static_cast<long long>(s.now_ms() - n.last_heartbeat_ms())
            : -1LL,
        extra);
  }
  return out;
}

// --watch: a frame every `interval` until the job ends. The scheduler is
// asked at least every 200 ms; after the end it lingers until a client that
// asked within the last second has been answered with the end (at most 2
// heartbeats, 2 s: SchedulerCore::EndSeenByAll); frames are printed every
// `interval` and once more at the end. Exit 0 when the job succeeded, 1 when it
// failed, 2 when the scheduler could not be reached (the outcome unknown).
int Watch(ps::SchedulerClient* scheduler, double interval, int count) {
  const bool tty = ::isatty(STDOUT_FILENO) == 1;
  const absl::Duration every = absl::Seconds(interval);
  const absl::Duration poll = std::min(every, absl::Milliseconds(200));
  std::optional<ps::proto::StatusResponse> prev;  // the last frame printed
  absl::Time prev_at;
  absl::Time next_frame = absl::Now();
  int frames = 0;
  for (bool first = true;; first = false) {
    if (!first) absl::SleepFor(poll);
    auto s = scheduler->Status(ps::proto::StatusRequest(),
                               absl::Now() + absl::Seconds(5));
    const absl::Time at = absl::Now();
    if (!s.ok()) {
      std::fprintf(stderr, "ps_status: %s%s\n",
                   prev ? "lost the scheduler before the job ended: " : "",
                   s.status().ToString().c_str());
      return 2;
    }
    const bool ended = s->phase() == "done" || s->phase() == "failed";
    if (!ended && at < next_frame) continue;
    const std::string table = StatusTable(
        *s, prev ? &*prev : nullptr,
        prev ? absl::ToDoubleSeconds(at - prev_at) : 0);
    // In place on a terminal: home, clear, the table.
    std::fputs(tty ? "\033[H\033[2J" : (frames > 0 ? "\n" : ""), stdout);
    std::fputs(table.c_str(), stdout);
    std::fflush(stdout);
    if (ended) return s->phase() == "done" ? 0 : 1;
    if (++frames == count) return 0;
    prev = *std::move(s);
    prev_at = at;
    next_frame = at + every;
  }
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  ps::GrpcSecurity base;
  base.token = FindToken();
  auto security = ps::SecurityFromEnv(base);
  if (!security.ok()) {
    std::fprintf(stderr, "ps_status: %s\n",
                 security.status().ToString().c_str());
    return 2;
  }
  if (!absl::GetFlag(FLAGS_token_file).empty()) security->token = base.token;
  ps::GrpcClientFactory clients(ps::GrpcClientFactory::Options(*security, 1));
  auto scheduler = clients.Scheduler(absl::GetFlag(FLAGS_scheduler));
  if (absl::GetFlag(FLAGS_checkpoint)) {  // checkpoints (issue 9)
    auto r = scheduler->Checkpoint(
        ps::proto::CheckpointRequest(),
        absl::Now() + absl::Seconds(absl::GetFlag(FLAGS_checkpoint_timeout_s)));
    if (!r.ok()) {
      std::fprintf(stderr, "ps_status: checkpoint: %s\n",
                   r.status().ToString().c_str());
      return 1;
    }
    std::printf("checkpoint %lld complete: %s (%lld keys, clock %lld)\n",
                static_cast<long long>(r->checkpoint_id()), r->dir().c_str(),
                static_cast<long long>(r->keys()),
                static_cast<long long>(r->clock()));
    return 0;
  }
  if (const int drain = absl::GetFlag(FLAGS_drain); drain >= 0) {
    ps::proto::DrainRequest req;
    req.set_server(drain);
    req.set_force(absl::GetFlag(FLAGS_force));
    auto r = scheduler->Drain(
        req, absl::Now() + absl::Seconds(absl::GetFlag(FLAGS_drain_timeout_s)));
    if (!r.ok()) {
      std::fprintf(stderr, "ps_status: drain S[%d]: %s\n", drain,
                   r.status().ToString().c_str());
      return 1;
    }
    std::printf("S[%d] drained: %d key range(s) moved off it in %.3f s; it "
                "left the job at view epoch %lld\n",
                drain, r->ranges_moved(), r->seconds(),
                static_cast<long long>(r->epoch()));
    return 0;
  }
  const std::string mode = absl::GetFlag(FLAGS_set_mode);
  const int64_t tau = absl::GetFlag(FLAGS_set_tau);
  if (!mode.empty() || tau != -2) {
    auto cur = scheduler->Status(ps::proto::StatusRequest(),
                                 absl::Now() + absl::Seconds(5));
    if (!cur.ok()) {
      std::fprintf(stderr, "ps_status: %s\n", cur.status().ToString().c_str());
      return 1;
    }
    ps::proto::SetConsistencyRequest req;
    *req.mutable_consistency() = cur->view().consistency();
    if (!mode.empty()) {
      ps::proto::ConsistencyMode m = ps::proto::MODE_UNKNOWN;
      if (mode == "bsp") m = ps::proto::MODE_BSP;
      if (mode == "ssp") m = ps::proto::MODE_SSP;
      if (mode == "asp") m = ps::proto::MODE_ASP;
      if (m == ps::proto::MODE_UNKNOWN) {
        std::fprintf(stderr, "ps_status: --set_mode must be bsp, ssp or asp\n");
        return 2;
      }
      req.mutable_consistency()->set_mode(m);
    }
    if (tau != -2) req.mutable_consistency()->set_tau(tau);
    auto r = scheduler->SetConsistency(req, absl::Now() + absl::Seconds(10));
    if (!r.ok()) {
      std::fprintf(stderr, "ps_status: %s\n", r.status().ToString().c_str());
      return 1;
    }
    std::printf("consistency set: mode %s tau %lld\n",
                ps::proto::ConsistencyMode_Name(req.consistency().mode()).c_str(),
                static_cast<long long>(req.consistency().tau()));
    return 0;
  }
  if (const double every = absl::GetFlag(FLAGS_watch); every > 0) {
    return Watch(scheduler.get(), every, absl::GetFlag(FLAGS_count));
  }
  auto s = scheduler->Status(ps::proto::StatusRequest(),
                        absl::Now() + absl::Seconds(5));
  if (!s.ok()) {
    std::fprintf(stderr, "ps_status: %s\n", s.status().ToString().c_str());
    return 1;
  }
  std::fputs(StatusTable(*s, nullptr, 0).c_str(), stdout);
  return 0;
}

