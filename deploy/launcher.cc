#include "deploy/launcher.h"

#include <fcntl.h>
#include <linux/close_range.h>
#include <poll.h>
#include <sys/prctl.h>
#include <sys/random.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <optional>
#include <sstream>
#include <random>
#include <thread>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "absl/strings/match.h"
#include "common/job_report.h"
#include "common/net.h"
#include "transport/grpc_transport.h"
#include "common/security.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "transport/errors.h"
#include "common/status_macros.h"

extern char** environ;

namespace ps {
namespace {

// A port for a child to listen on, held by this process from the pick on
// (ReservePortBelowEphemeral): a port that was only free when picked could
// be picked again before its process bound it, by this launcher (CI once
// gave W[0]'s metrics endpoint the scheduler's port) or by another
// launcher running beside it (a concurrent test's, once: S[2] could not
// listen on its metrics port).
absl::StatusOr<int> PickUnusedPort(const std::string& host) {
  return ReservePortBelowEphemeral(host);
}

constexpr size_t kMaxLineBytes = 64 * 1024;
constexpr absl::Duration kPollInterval = absl::Milliseconds(10);
constexpr absl::Duration kDrainTimeout = absl::Seconds(1);
// After SIGKILL a process leaves within milliseconds unless stuck in the
// kernel; this bounds the wait for such a one.
constexpr absl::Duration kReapAfterKillTimeout = absl::Seconds(5);

std::string ErrnoMessage(const char* what) {
  return absl::StrCat(what, ": ", strerror(errno));
}

void CloseFd(int* fd) {
  if (*fd >= 0) close(*fd);
  *fd = -1;
}

// The key of a "KEY=VALUE" environment entry, '=' included.
absl::string_view EnvKey(absl::string_view entry) {
  auto eq = entry.find('=');
  return eq == absl::string_view::npos ? entry : entry.substr(0, eq + 1);
}

}  // namespace

std::string ChildExit::Describe() const {
  if (signaled) {
    const char* desc = strsignal(code);
    return absl::StrFormat("%s killed by signal %d (%s)", name, code,
                           desc ? desc : "unknown");
  }
  return absl::StrFormat("%s exited with status %d", name, code);
}

// ---------------------------------------------------------------------------
// ProcessGroup

struct ProcessGroup::Stream {
  std::string name;
  pid_t pid;
  int fd;
  std::string buffer;  // bytes after the last '\n'
};

ProcessGroup::ProcessGroup(LineSink sink) : sink_(std::move(sink)) {
  int fds[2];
  if (pipe2(fds, O_CLOEXEC | O_NONBLOCK) == 0) {
    wake_read_fd_ = fds[0];
    wake_write_fd_ = fds[1];
  }
  // Without a wake pipe the pump still works: it polls with a timeout.
  pump_ = std::thread([this] { PumpLoop(); });
}

ProcessGroup::~ProcessGroup() {
  if (running() > 0) TerminateAll(absl::Seconds(3));
  {
    absl::MutexLock lock(&mu_);
    auto drained = [this] {
      mu_.AssertHeld();
      return open_streams_.empty() && new_streams_.empty();
    };
    mu_.AwaitWithTimeout(absl::Condition(&drained), kDrainTimeout);
    stopping_ = true;
  }
  Wake();
  pump_.join();
  CloseFd(&wake_read_fd_);
  CloseFd(&wake_write_fd_);
}

void ProcessGroup::Wake() {
  if (wake_write_fd_ < 0) return;
  char c = 1;
  // A full pipe already guarantees a wake-up; the result does not matter.
  [[maybe_unused]] ssize_t n = write(wake_write_fd_, &c, 1);
}

absl::StatusOr<pid_t> ProcessGroup::Start(const ChildSpec& spec) {
  if (spec.argv.empty() || spec.argv[0].empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("child ", spec.name, ": empty argv"));
  }
  // Everything the child needs is built before fork: between fork and exec
  // only async-signal-safe calls are allowed (other threads may hold locks).
  std::vector<std::string> env;
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
    absl::string_view entry(*e);
    bool replaced = false;
    for (const auto& extra : spec.env) {
      if (EnvKey(extra) == EnvKey(entry)) replaced = true;
    }
    if (!replaced) env.emplace_back(entry);
  }
  env.insert(env.end(), spec.env.begin(), spec.env.end());
  std::vector<char*> argv_ptrs;
  for (const auto& a : spec.argv) argv_ptrs.push_back(const_cast<char*>(a.c_str()));
  argv_ptrs.push_back(nullptr);
  std::vector<char*> env_ptrs;
  for (const auto& e : env) env_ptrs.push_back(const_cast<char*>(e.c_str()));
  env_ptrs.push_back(nullptr);

  // All O_CLOEXEC so that no other child inherits them (a leaked write end
  // would keep a stream from ever reaching EOF).
  int out[2] = {-1, -1}, err[2] = {-1, -1}, exec_err[2] = {-1, -1};
  int devnull = open("/dev/null", O_RDONLY | O_CLOEXEC);
  auto close_all = [&] {
    for (int* fd : {&out[0], &out[1], &err[0], &err[1], &exec_err[0],
                    &exec_err[1], &devnull}) {
      CloseFd(fd);
    }
  };
  if (devnull < 0 || pipe2(out, O_CLOEXEC) != 0 || pipe2(err, O_CLOEXEC) != 0 ||
      pipe2(exec_err, O_CLOEXEC) != 0) {
    absl::Status status = absl::InternalError(
        ErrnoMessage(absl::StrCat("child ", spec.name, ": pipe").c_str()));
    close_all();
    return status;
  }

  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid < 0) {
    absl::Status status = absl::ResourceExhaustedError(
        ErrnoMessage(absl::StrCat("child ", spec.name, ": fork").c_str()));
    close_all();
    return status;
  }
  if (pid == 0) {
    // Child. Own process group: the launcher can kill it and anything it
    // starts at once, and a terminal's Ctrl-C reaches only the launcher.
    setpgid(0, 0);
    // Die with the launcher, even if it is SIGKILLed...
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    // ...including when it died before the line above ran.
    if (getppid() != parent) _exit(127);
    dup2(devnull, STDIN_FILENO);
    dup2(out[1], STDOUT_FILENO);
    dup2(err[1], STDERR_FILENO);
    // Ignored signals and the signal mask survive exec; start clean.
    struct sigaction dfl;
    memset(&dfl, 0, sizeof(dfl));
    dfl.sa_handler = SIG_DFL;
    for (int sig = 1; sig < 32; ++sig) sigaction(sig, &dfl, nullptr);
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    // Descriptors the launcher's process opened without O_CLOEXEC are not
    // the child's business. Best effort (needs Linux >= 5.11).
    close_range(3, ~0U, CLOSE_RANGE_CLOEXEC);
    execve(argv_ptrs[0], argv_ptrs.data(), env_ptrs.data());
    int code = errno;
    [[maybe_unused]] ssize_t n = write(exec_err[1], &code, sizeof(code));
    _exit(127);
  }

  // Parent. Also set the group here so it is in place before Start returns,
  // whichever of the two runs first (EACCES after exec is fine: the child
  // did it itself).
  setpgid(pid, pid);
  CloseFd(&out[1]);
  CloseFd(&err[1]);
  CloseFd(&exec_err[1]);
  CloseFd(&devnull);
  int exec_errno = 0;
  ssize_t n;
  do {
    n = read(exec_err[0], &exec_errno, sizeof(exec_errno));
  } while (n < 0 && errno == EINTR);
  CloseFd(&exec_err[0]);
  if (n == sizeof(exec_errno)) {
    int status;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    close_all();
    std::string message = absl::StrCat("child ", spec.name, ": cannot execute ",
                                       spec.argv[0], ": ", strerror(exec_errno));
    if (exec_errno == ENOENT) return absl::NotFoundError(message);
    if (exec_errno == EACCES) return absl::PermissionDeniedError(message);
    return absl::InternalError(message);
  }

  children_.push_back(Child{spec.name, pid, true});
  {
    absl::MutexLock lock(&mu_);
    new_streams_.push_back(
        std::make_unique<Stream>(Stream{spec.name, pid, out[0], {}}));
    new_streams_.push_back(
        std::make_unique<Stream>(Stream{spec.name, pid, err[0], {}}));
    open_streams_.emplace_back(pid, 2);
  }
  Wake();
  return pid;
}

void ProcessGroup::PumpLoop() {
  std::vector<std::unique_ptr<Stream>> streams;
  std::vector<pollfd> fds;
  char buf[16384];
  // Called without mu_ held; the sink is only ever called from here.
  auto emit_lines = [this](Stream* s, bool eof) {
    size_t start = 0;
    for (;;) {
      size_t nl = s->buffer.find('\n', start);
      if (nl == std::string::npos) break;
      sink_(s->name, absl::string_view(s->buffer).substr(start, nl - start));
      start = nl + 1;
    }
    s->buffer.erase(0, start);
    if (s->buffer.size() >= kMaxLineBytes || (eof && !s->buffer.empty())) {
      sink_(s->name, s->buffer);
      s->buffer.clear();
    }
  };
  for (;;) {
    {
      absl::MutexLock lock(&mu_);
      if (stopping_) break;
      for (auto& s : new_streams_) streams.push_back(std::move(s));
      new_streams_.clear();
    }
    fds.clear();
    fds.push_back(pollfd{wake_read_fd_, POLLIN, 0});
    for (const auto& s : streams) fds.push_back(pollfd{s->fd, POLLIN, 0});
    // The timeout only matters if the wake pipe could not be created.
    int ready = poll(fds.data(), fds.size(), 100);
    if (ready <= 0) continue;
    if (fds[0].revents != 0) {
      while (wake_read_fd_ >= 0 && read(wake_read_fd_, buf, sizeof(buf)) > 0) {
      }
    }
    std::vector<std::unique_ptr<Stream>> closed;
    for (size_t i = 1; i < fds.size(); ++i) {
      if (fds[i].revents == 0) continue;
      Stream* s = streams[i - 1].get();
      ssize_t n = read(s->fd, buf, sizeof(buf));
      if (n > 0) {
        s->buffer.append(buf, n);
        emit_lines(s, false);
      } else if (n == 0 || (errno != EINTR && errno != EAGAIN)) {
        emit_lines(s, true);
        CloseFd(&s->fd);
      }
    }
    for (auto it = streams.begin(); it != streams.end();) {
      if ((*it)->fd >= 0) {
        ++it;
        continue;
      }
      const pid_t key = (*it)->pid;
      it = streams.erase(it);
      absl::MutexLock lock(&mu_);
      for (auto o = open_streams_.begin(); o != open_streams_.end(); ++o) {
        if (o->first == key && --o->second == 0) {
          open_streams_.erase(o);
          break;
        }
      }
    }
  }
  // Stopping: whatever is still open belongs to a process that outlived
  // the drain timeout (e.g. a grandchild holding the pipe).
  for (auto& s : streams) {
    emit_lines(s.get(), true);
    CloseFd(&s->fd);
  }
  absl::MutexLock lock(&mu_);
  for (auto& s : new_streams_) CloseFd(&s->fd);
  new_streams_.clear();
  open_streams_.clear();
}

void ProcessGroup::AwaitOutputDrained(pid_t pid, absl::Time deadline) {
  absl::MutexLock lock(&mu_);
  auto drained = [this, pid] {
    mu_.AssertHeld();
    for (const auto& o : open_streams_) {
      if (o.first == pid) return false;
    }
    return true;
  };
  mu_.AwaitWithDeadline(absl::Condition(&drained), deadline);
}

bool ProcessGroup::TryReap(Child* child, ChildExit* exit) {
  int status = 0;
  pid_t r;
  do {
    r = waitpid(child->pid, &status, WNOHANG);
  } while (r < 0 && errno == EINTR);
  if (r == 0) return false;
  child->running = false;
  exit->name = child->name;
  exit->pid = child->pid;
  if (r < 0) {
    // ECHILD: someone else reaped it (SIGCHLD ignored?); the status is lost.
    exit->signaled = false;
    exit->code = 255;
  } else if (WIFSIGNALED(status)) {
    exit->signaled = true;
    exit->code = WTERMSIG(status);
  } else {
    exit->signaled = false;
    exit->code = WEXITSTATUS(status);
  }
  return true;
}

ProcessGroup::WaitResult ProcessGroup::WaitNext(absl::Time deadline,
                                                const std::atomic<int>* stop) {
  for (;;) {
    bool any_running = false;
    for (auto& child : children_) {
      if (!child.running) continue;
      any_running = true;
      ChildExit exit;
      if (TryReap(&child, &exit)) {
        AwaitOutputDrained(exit.pid,
                           absl::Now() + kDrainTimeout);
        return WaitResult{Event::kChildExited, std::move(exit), 0};
      }
    }
    if (!any_running) return WaitResult{Event::kAllExited, {}, 0};
    if (stop != nullptr) {
      int sig = stop->load();
      if (sig != 0) return WaitResult{Event::kStopped, {}, sig};
    }
    absl::Time now = absl::Now();
    if (now >= deadline) return WaitResult{Event::kDeadline, {}, 0};
    absl::SleepFor(std::min(kPollInterval, deadline - now));
  }
}

std::vector<ChildExit> ProcessGroup::TerminateAll(absl::Duration grace) {
  std::vector<ChildExit> exits;
  std::vector<pid_t> signalled;
  auto signal_child = [](pid_t pid, int sig) {
    // The group first (grandchildren too); the pid alone if the group is
    // gone (the child moved itself elsewhere).
    if (kill(-pid, sig) != 0) kill(pid, sig);
  };
  for (const auto& child : children_) {
    if (!child.running) continue;
    signal_child(child.pid, SIGTERM);
    signalled.push_back(child.pid);
  }
  auto reap_until = [&](absl::Time deadline) {
    for (;;) {
      bool any_running = false;
      for (auto& child : children_) {
        if (!child.running) continue;
        ChildExit exit;
        if (TryReap(&child, &exit)) {
          exits.push_back(std::move(exit));
        } else {
          any_running = true;
        }
      }
      absl::Time now = absl::Now();
      if (!any_running || now >= deadline) return;
      absl::SleepFor(std::min(kPollInterval, deadline - now));
    }
  };
  reap_until(absl::Now() + grace);
  // SIGKILL every group we signalled, also those whose leader has exited:
  // it may have left processes behind in its group.
  for (pid_t pid : signalled) {
    bool leader_running = false;
    for (const auto& child : children_) {
      if (child.pid == pid && child.running) leader_running = true;
    }
    if (kill(-pid, SIGKILL) != 0 && leader_running) kill(pid, SIGKILL);
  }
  reap_until(absl::Now() + kReapAfterKillTimeout);
  absl::Time drain_deadline = absl::Now() + kDrainTimeout;
  for (const auto& exit : exits) {
    AwaitOutputDrained(exit.pid, drain_deadline);
  }
  return exits;
}

absl::StatusOr<pid_t> ProcessGroup::Signal(const std::string& name, int sig) {
  for (const auto& child : children_) {
    if (!child.running || child.name != name) continue;
    if (kill(-child.pid, sig) != 0 && kill(child.pid, sig) != 0) {
      return absl::ErrnoToStatus(errno, absl::StrCat("cannot signal ", name));
    }
    return child.pid;
  }
  return absl::NotFoundError(absl::StrCat(name, " is not running"));
}

std::vector<std::string> ProcessGroup::RunningNames() const {
  std::vector<std::string> names;
  for (const auto& child : children_) {
    if (child.running) names.push_back(child.name);
  }
  return names;
}

size_t ProcessGroup::running() const {
  size_t n = 0;
  for (const auto& child : children_) n += child.running ? 1 : 0;
  return n;
}

// ---------------------------------------------------------------------------
// Flags and config

std::string LaunchUsage() {
  return R"(usage: ps_launch --config FILE [options]
Starts a parameter-server job on this machine: one scheduler, S servers and
W workers, each a separate process; their output is printed prefixed with
H, S[i], W[i].
  --config FILE        job config (YAML); required
  --set SECTION.FIELD=VALUE
                       override one config field; repeatable, applied in order
  --servers N          same as --set cluster.num_servers=N
  --workers N          same as --set cluster.num_workers=N
  --mode bsp|ssp|asp   same as --set consistency.mode=...
  --tau T              same as --set consistency.tau=T
  --report PATH        passed to ps_scheduler (--report PATH)
  --bin-dir DIR        where ps_scheduler, ps_server, ps_worker are
                       (default: the directory of ps_launch)
  --run-dir DIR        where job.yaml goes (default: runs/<time>-<pid>)
  --timeout_s SECONDS  stop everything and exit 124 after this long (0: never)
  --plot FILE          after the job, draw its training and test loss over
                       time into FILE (PNG; needs python3-matplotlib)
  --tune[=TRIALS]      first search the optimizer's step size and
                       regularisation on a validation split (the config's
                       data.validation_fraction, else 0.1): a grid of 9
                       jobs, or TRIALS seeded random ones; print the table,
                       write the best config to --tune-out (default
                       RUN_DIR/tuned.yaml), then train with it
  --tune-out FILE      where --tune writes the best config
  --tune-folds N       score each --tune setting on N validation splits
                       (training.seed, +1, ...; default 2, at most 5): the
                       mean validation log loss picks the best
  --check[=resources]  only check the config and flags (every field, the
                       --kill/--drain targets) and exit 0, or 2 with the
                       error, starting nothing; =resources also checks that
                       the data files can be read and model_dir written (on
                       this machine; it creates model_dir)
  --kill ROLE[ID]@SECONDS
                       chaos: SIGKILL that process SECONDS after the cluster
                       is ready; ROLE S (server), W (worker) or H (scheduler),
                       e.g. S1@10, W0@2.5, H@5; repeatable. The launcher
                       does not stop the job for a process it killed: the
                       cluster decides. Instead of SECONDS, eEPOCHS (S1@e2,
                       W0@e0.5) is when that many epochs of work units are
                       done (the scheduler's progress, polled every 20 ms):
                       the same point of the job on any machine; --pause,
                       --drain, --add-server and --add-worker take it too
  --pause ROLE[ID]@SECONDS:FOR_S
                       chaos: SIGSTOP that process SECONDS after the cluster
                       is ready and SIGCONT it FOR_S seconds later: a node
                       that hangs instead of dying (a server stopped past
                       cluster.heartbeat_timeout_ms is failed over, and the
                       job goes on without waiting for it); repeatable
  --restart[=DELAY_S]  chaos: start a replacement of the same role DELAY_S
                       (default 1) after each --kill (the replacement joins
                       the running job as a new server or worker)
  --add-server SECONDS start one more server SECONDS after the cluster is
                       ready; it joins the running job and takes an even
                       share of the key ranges; repeatable
  --add-worker SECONDS start one more worker SECONDS after the cluster is
                       ready; it joins the running job at the clock the
                       servers are at and takes an even share of the work
                       units left (not for mlp jobs); repeatable
  --drain S<ID>@SECONDS
                       drain that server SECONDS after the cluster is ready
                       (as ps_status --drain ID): its ranges move to the
                       others and it exits 0; repeatable
Exit status: 0 when every process exits 0; 2 for a bad flag or config field;
a failing process's status (128+signal if killed); 124 on timeout; 130/143
on SIGINT/SIGTERM.
)";
}

bool ClusterHandlesWorkerDeath(const JobConfig& config,
                               const std::string& child_name) {
  // Every model but mlp trains on dynamic work units (issue 9); with
  // replication the scheduler fails a dead server's ranges over.
  if (absl::StartsWith(child_name, "S[")) {
    return config.fault_tolerance.EffectiveReplicas(
               config.cluster.num_servers) > 0;
  }
  return absl::StartsWith(child_name, "W[") && config.training.model != "mlp";
}

std::optional<std::string> FailedJobError(const std::string& report_path) {
  absl::StatusOr<proto::JobReport> report = ReadJobReport(report_path);
  if (!report.ok() || report->status() != "failed") return std::nullopt;
  if (report->error().empty()) return std::string("(no error in the report)");
  return report->error();
}

// The nodes the job's report says the cluster declared dead: the servers
// ("S[1]") it failed over, the workers ("W[0]") whose work units it handed
// to the others (they hung, say, or were cut off). However those processes
// end later, they were handled. Empty when there is no report yet.
absl::flat_hash_set<std::string> DeclaredDeadInReport(
    const std::string& report_path) {
  absl::flat_hash_set<std::string> dead;
  absl::StatusOr<proto::JobReport> report = ReadJobReport(report_path);
  if (!report.ok()) return dead;
  // A server that joined again after its failover (the same process under
  // a new id: rejoined_as) is dead only if its last id was failed over too.
  absl::flat_hash_map<std::string, std::string> rejoined;
  absl::flat_hash_set<std::string> failed;
  for (const auto& f : report->failovers()) {
    failed.insert(f.node());
    if (!f.rejoined_as().empty()) rejoined[f.node()] = f.rejoined_as();
  }
  for (const auto& f : report->failovers()) {
    std::string last = f.node();
    for (size_t hops = 0; hops <= rejoined.size(); ++hops) {
      auto it = rejoined.find(last);
      if (it == rejoined.end()) break;
      last = it->second;
    }
    if (failed.contains(last) && !rejoined.contains(last)) {
      dead.insert(f.node());
    }
  }
  for (int w : report->dead_workers()) dead.insert(absl::StrCat("W[", w, "]"));
  return dead;
}

absl::StatusOr<LaunchOptions> ParseLaunchArgs(
    const std::vector<std::string>& args) {
  LaunchOptions options;
  for (size_t i = 0; i < args.size(); ++i) {
    std::string flag = args[i];
    if (flag == "-h" || flag == "--help") {
      options.help = true;
      continue;
    }
    if (!absl::StartsWith(flag, "--")) {
      return absl::InvalidArgumentError(
          absl::StrCat("unexpected argument '", flag, "'"));
    }
    std::string value;
    bool has_value = false;
    if (auto eq = flag.find('='); eq != std::string::npos) {
      value = flag.substr(eq + 1);
      flag = flag.substr(0, eq);
      has_value = true;
    }
    // --check takes its value only as --check=resources.
    if (flag == "--check") {
      options.check = true;
      if (has_value) {
        if (value != "resources") {
          return absl::InvalidArgumentError(absl::StrCat(
              "flag --check takes no value or =resources, got '", value, "'"));
        }
        options.check_resources = true;
      }
      continue;
    }
    // Issue 12: --tune takes its value only as --tune=TRIALS.
    if (flag == "--tune") {
      options.tune = true;
      if (has_value && (!absl::SimpleAtoi(value, &options.tune_trials) ||
                        options.tune_trials < 1 ||
                        options.tune_trials > 1000)) {
        return absl::InvalidArgumentError(absl::StrCat(
            "flag --tune takes no value or =TRIALS in [1, 1000], got '",
            value, "'"));
      }
      continue;
    }
    // Chaos (issue 9): --restart takes its value only as --restart=DELAY_S.
    if (flag == "--restart") {
      options.restart = true;
      if (has_value && (!absl::SimpleAtod(value, &options.restart_delay_s) ||
                        !(options.restart_delay_s >= 0) ||
                        options.restart_delay_s > 86400)) {
        return absl::InvalidArgumentError(absl::StrCat(
            "flag --restart wants a delay in seconds >= 0, got '", value,
            "'"));
      }
      continue;
    }
    static const char* const kValueFlags[] = {
        "--config", "--set",     "--report",  "--servers",  "--workers",
        "--mode",   "--tau",     "--bin-dir", "--run-dir", "--timeout_s",
        "--kill", "--pause", "--drain", "--add-server", "--add-worker", "--plot",
        "--tune-out", "--tune-folds"};
    bool known = false;
    for (const char* f : kValueFlags) known = known || flag == f;
    if (!known) {
      return absl::InvalidArgumentError(absl::StrCat("unknown flag ", flag));
    }
    if (!has_value) {
      if (i + 1 >= args.size()) {
        return absl::InvalidArgumentError(
            absl::StrCat("flag ", flag, " needs a value"));
      }
      value = args[++i];
    }
    if (flag == "--config") {
      options.config_path = value;
    } else if (flag == "--set") {
      if (value.find('=') == std::string::npos) {
        return absl::InvalidArgumentError(absl::StrCat(
            "flag --set wants section.field=value, got '", value, "'"));
      }
      options.overrides.push_back(value);
    } else if (flag == "--servers") {
      options.overrides.push_back("cluster.num_servers=" + value);
    } else if (flag == "--workers") {
      options.overrides.push_back("cluster.num_workers=" + value);
    } else if (flag == "--mode") {
      options.overrides.push_back("consistency.mode=" + value);
    } else if (flag == "--tau") {
      options.overrides.push_back("consistency.tau=" + value);
    } else if (flag == "--report") {
      options.report_path = value;
    } else if (flag == "--plot") {
      if (value.empty()) {
        return absl::InvalidArgumentError("flag --plot wants a file name");
      }
      options.plot_path = value;
    } else if (flag == "--tune-out") {
      if (value.empty()) {
        return absl::InvalidArgumentError("flag --tune-out wants a file name");
      }
      options.tune_out = value;
    } else if (flag == "--tune-folds") {
      if (!absl::SimpleAtoi(value, &options.tune_folds) ||
          options.tune_folds < 1 || options.tune_folds > 5) {
        return absl::InvalidArgumentError(absl::StrCat(
            "flag --tune-folds wants a number in [1, 5], got '", value, "'"));
      }
    } else if (flag == "--bin-dir") {
      options.bin_dir = value;
    } else if (flag == "--run-dir") {
      options.run_dir = value;
    } else if (flag == "--kill") {
      PS_ASSIGN_OR_RETURN(ChaosKill k, ParseKillSpec(value));
      options.kills.push_back(k);
    } else if (flag == "--pause") {
      const size_t colon = value.rfind(':');
      double for_s = 0;
      if (colon == std::string::npos ||
          !absl::SimpleAtod(value.substr(colon + 1), &for_s) ||
          !(for_s > 0) || for_s > 86400) {
        return absl::InvalidArgumentError(absl::StrCat(
            "flag --pause wants ROLE[ID]@SECONDS:FOR_SECONDS (S1@10:5: stop "
            "server 1 ten seconds after the cluster is ready, for five "
            "seconds; S1@e2:5 once two epochs of work are done; FOR_SECONDS "
            "in (0, 86400]), got '",
            value, "'"));
      }
      PS_ASSIGN_OR_RETURN(ChaosKill k,
                          ParseKillSpec(value.substr(0, colon), "--pause"));
      k.pause_s = for_s;
      options.pauses.push_back(k);
    } else if (flag == "--drain") {
      PS_ASSIGN_OR_RETURN(ChaosKill k, ParseKillSpec(value, "--drain"));
      if (k.role != 'S') {
        return absl::InvalidArgumentError(absl::StrCat(
            "flag --drain wants a server, S<ID>@SECONDS or S<ID>@eEPOCHS, "
            "got '", value, "'"));
      }
      options.drains.push_back(k);
    } else if (flag == "--add-server") {
      PS_ASSIGN_OR_RETURN(ChaosKill k,
                          ParseChaosWhen(value, 'A', "--add-server"));
      options.add_servers.push_back(k);
    } else if (flag == "--add-worker") {
      PS_ASSIGN_OR_RETURN(ChaosKill k,
                          ParseChaosWhen(value, 'J', "--add-worker"));
      options.add_workers.push_back(k);
    } else if (flag == "--timeout_s") {
      if (!absl::SimpleAtod(value, &options.timeout_s) ||
          !(options.timeout_s >= 0)) {
        return absl::InvalidArgumentError(absl::StrCat(
            "flag --timeout_s wants seconds >= 0, got '", value, "'"));
      }
    }
  }
  if (options.config_path.empty() && !options.help) {
    return absl::InvalidArgumentError("flag --config is required");
  }
  return options;
}

std::string ChaosKill::Target() const {
  if (role == 'H') return "H";
  return absl::StrCat(std::string(1, role), "[", id, "]");
}

std::string ChaosKill::When() const {
  if (after_epochs >= 0) return absl::StrCat("e", after_epochs);
  return absl::StrCat(after_s);
}

namespace {

// "10", "2.5" (seconds after the cluster is ready) or "e2", "e0.5" (epochs
// of work done) into k; false for anything else.
bool ParseWhen(absl::string_view when, ChaosKill* k) {
  if (absl::ConsumePrefix(&when, "e")) {
    double e = 0;
    if (!absl::SimpleAtod(when, &e) || !(e >= 0) || e > 1e6) return false;
    k->after_epochs = e;
    k->after_s = 0;
    return true;
  }
  double t = 0;
  if (!absl::SimpleAtod(when, &t) || !(t >= 0) || t > 86400 * 30) {
    return false;
  }
  k->after_s = t;
  k->after_epochs = -1;
  return true;
}

}  // namespace

absl::StatusOr<ChaosKill> ParseChaosWhen(absl::string_view when, char role,
                                         absl::string_view flag) {
  ChaosKill k;
  k.role = role;
  if (!ParseWhen(when, &k)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "flag ", flag, " wants seconds >= 0 after the cluster is ready, or "
        "eEPOCHS (e2: once two epochs of work are done), got '", when, "'"));
  }
  return k;
}

absl::StatusOr<ChaosKill> ParseKillSpec(absl::string_view spec,
                                        absl::string_view flag) {
  auto bad = [&]() {
    return absl::InvalidArgumentError(absl::StrCat(
        "flag ", flag, " wants ROLE[ID]@SECONDS or ROLE[ID]@eEPOCHS with ROLE "
        "S, W or H (S1@10, W0@2.5, H@5; S1@e2: once two epochs of work are "
        "done), got '",
        spec, "'"));
  };
  const size_t at = spec.find('@');
  if (spec.empty() || at == absl::string_view::npos) return bad();
  ChaosKill k;
  k.role = spec[0];
  if (k.role != 'S' && k.role != 'W' && k.role != 'H') return bad();
  const absl::string_view id = spec.substr(1, at - 1);
  if (id.empty()) {
    if (k.role != 'H') return bad();
  } else if (!absl::SimpleAtoi(id, &k.id) || k.id < 0 ||
             (k.role == 'H' && k.id != 0)) {
    return bad();
  }
  if (!ParseWhen(spec.substr(at + 1), &k)) return bad();
  return k;
}

absl::StatusOr<JobConfig> ResolveJobConfig(const LaunchOptions& options) {
  return LoadJobConfigWithOverrides(options.config_path, options.overrides);
}

absl::StatusOr<JobConfig> CheckLaunch(const LaunchOptions& options,
                                      bool check_resources) {
  PS_ASSIGN_OR_RETURN(JobConfig config, ResolveJobConfig(options));
  std::string host;
  int port = 0;
  if (absl::Status s = SplitHostPort(config.cluster.scheduler, &host, &port);
      !s.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("config field cluster.scheduler: ", s.message()));
  }
  // Chaos (issue 9): every --kill and --drain names a process of this job.
  for (const ChaosKill& k : options.drains) {
    const int n = config.cluster.num_servers +
                  static_cast<int>(options.add_servers.size());
    if (k.id >= n) {
      return absl::InvalidArgumentError(absl::StrCat(
          "flag --drain ", k.Target(), "@", k.When(), ": the job has ", n,
          " servers"));
    }
  }
  std::vector<ChaosKill> targets = options.kills;
  targets.insert(targets.end(), options.pauses.begin(), options.pauses.end());
  for (const ChaosKill& k : targets) {
    const int n = k.role == 'S'   ? config.cluster.num_servers
                  : k.role == 'W' ? config.cluster.num_workers
                                  : 1;
    if (k.id >= n) {
      return absl::InvalidArgumentError(
          absl::StrCat(k.pause_s > 0 ? "flag --pause " : "flag --kill ",
                       k.Target(), "@", k.When(),
                       ": the job has ", n,
                       k.role == 'S' ? " servers" : " workers"));
    }
  }
  // Data files and model_dir (the scheduler checks again: it may be started
  // without the launcher).
  if (check_resources) PS_RETURN_IF_ERROR(CheckJobResources(config));
  return config;
}

std::string RandomHexToken() {
  unsigned char bytes[16];
  size_t got = 0;
  while (got < sizeof(bytes)) {
    ssize_t n = getrandom(bytes + got, sizeof(bytes) - got, 0);
    if (n <= 0) break;
    got += n;
  }
  if (got < sizeof(bytes)) {  // no getrandom: fall back
    std::random_device rd;
    for (auto& b : bytes) b = static_cast<unsigned char>(rd());
  }
  std::string hex;
  for (unsigned char b : bytes) absl::StrAppend(&hex, absl::Hex(b, absl::kZeroPad2));
  return hex;
}

namespace {

// Runs argv (argv[0] looked up in PATH) and waits; its stdout and stderr
// go to /dev/null with `quiet`, else to ours. The raw wait status, or -1
// when it could not be started.
int RunAndWait(const std::vector<std::string>& argv, bool quiet) {
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  const pid_t pid = fork();
  if (pid < 0) return -1;
  if (pid == 0) {
    if (quiet) {
      const int null = open("/dev/null", O_WRONLY);
      if (null >= 0) {
        dup2(null, 1);
        dup2(null, 2);
      }
    }
    execvp(args[0], args.data());
    _exit(127);
  }
  int status = 0;
  while (waitpid(pid, &status, 0) < 0) {
    if (errno != EINTR) return -1;
  }
  return status;
}

}  // namespace

absl::StatusOr<Plotter> FindPlotter(const std::string& bin_dir) {
  Plotter p;
  p.script = (std::filesystem::path(bin_dir) / "plot_report.py").string();
  if (access(p.script.c_str(), R_OK) != 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "--plot: cannot read ", p.script, " (", strerror(errno),
        "); it is built next to ps_launch"));
  }
  std::vector<std::string> pythons;
  if (const char* env = getenv("PS_PYTHON"); env != nullptr && *env) {
    pythons.push_back(env);
  }
  pythons.push_back("python3");
  pythons.push_back("/usr/bin/python3");
  for (const std::string& python : pythons) {
    const int status =
        RunAndWait({python, "-c", "import matplotlib"}, /*quiet=*/true);
    if (WIFEXITED(status) && WEXITSTATUS(status) == 0) {
      p.python = python;
      return p;
    }
  }
  return absl::FailedPreconditionError(absl::StrCat(
      "--plot needs matplotlib and none of ", absl::StrJoin(pythons, ", "),
      " imports it: apt-get install python3-matplotlib (or set PS_PYTHON)"));
}

absl::Status PlotReport(const Plotter& plotter, const std::string& report_path,
                        const std::string& png) {
  const int status =
      RunAndWait({plotter.python, plotter.script, report_path, png},
                 /*quiet=*/false);
  if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return absl::OkStatus();
  return absl::InternalError(absl::StrCat(
      "--plot: ", plotter.script, " ",
      status < 0 ? std::string("could not be started")
      : WIFEXITED(status)
          ? absl::StrCat("exited ", WEXITSTATUS(status))
          : absl::StrCat("was killed by signal ", WTERMSIG(status)),
      "; ", png, " not written"));
}

std::string SelfExeDir() {
  std::error_code ec;
  auto exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (ec) return "";
  return exe.parent_path().string();
}

// ---------------------------------------------------------------------------
// Launcher

namespace {

absl::Status WriteFilePrivate(const std::string& path,
                                const std::string& text) {
  // 0600: the file may hold cluster.auth_token.
  int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) return absl::InternalError(ErrnoMessage(path.c_str()));
  size_t done = 0;
  while (done < text.size()) {
    ssize_t n = write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      absl::Status status = absl::InternalError(ErrnoMessage(path.c_str()));
      close(fd);
      return status;
    }
    done += n;
  }
  if (close(fd) != 0) return absl::InternalError(ErrnoMessage(path.c_str()));
  return absl::OkStatus();
}

const char* SignalName(int sig) {
  switch (sig) {
    case SIGINT: return "SIGINT";
    case SIGTERM: return "SIGTERM";
    case SIGHUP: return "SIGHUP";
    default: return "signal";
  }
}

// Chaos (issue 9): the --kill/--restart schedule of one Run. Times count
// from the scheduler's "cluster ready" line. Used by the supervising thread
// only, except OnLine (the output thread), which takes mu_.
class Chaos {
 public:
  using SayFn = std::function<void(absl::string_view)>;
  // `probe_ready` asks the scheduler whether the cluster is ready (its log
  // line may be filtered out by output.log_level); polled while a kill
  // waits for readiness. Each kill and restart is also appended to
  // `record_path` as one JSON object per line (for recovery-time tooling).
  // `drain` drains a server (the scheduler's Drain RPC; blocks): run on a
  // thread of its own per --drain, joined by the destructor.
  using DrainFn = std::function<absl::StatusOr<proto::DrainResponse>(int)>;
  // `probe_epochs` asks the scheduler how many epochs of work are done
  // (nullopt when it did not answer); polled every kEpochPoll while an
  // eEPOCHS event is pending.
  using EpochsFn = std::function<std::optional<double>()>;
  Chaos(const LaunchOptions& o, SayFn say, std::function<bool()> probe_ready,
        std::string record_path, DrainFn drain, EpochsFn probe_epochs)
      : record_path_(std::move(record_path)),
        restart_(o.restart),
        restart_delay_(absl::Seconds(o.restart_delay_s)),
        say_(std::move(say)),
        probe_ready_(std::move(probe_ready)),
        drain_(std::move(drain)),
        probe_epochs_(std::move(probe_epochs)) {
    for (const ChaosKill& k : o.kills) pending_.push_back(k);
    for (const ChaosKill& k : o.pauses) pending_.push_back(k);
    // Elasticity (issue 9): adds and drains on the same schedule, told
    // apart by role ('A': add a server; 'J': add a worker; 'D': drain
    // server id).
    for (const ChaosKill& k : o.add_servers) pending_.push_back(k);
    for (const ChaosKill& k : o.add_workers) pending_.push_back(k);
    for (ChaosKill d : o.drains) {
      d.role = 'D';
      pending_.push_back(d);
    }
    // Timed events by time, then progress events by epochs: RunDue fires
    // whatever is due in this order.
    std::stable_sort(pending_.begin(), pending_.end(),
                     [](const ChaosKill& a, const ChaosKill& b) {
                       const bool ea = a.after_epochs >= 0;
                       const bool eb = b.after_epochs >= 0;
                       if (ea != eb) return eb;
                       return ea ? a.after_epochs < b.after_epochs
                                 : a.after_s < b.after_s;
                     });
  }
  // Whatever never came due (the job ended first) is said, not dropped
  // silently: a chaos run whose fault never happened tested nothing.
  ~Chaos() {
    ending_.Notify();  // refused drains stop waiting for a join
    for (std::thread& t : drains_) t.join();
    for (const ChaosKill& k : pending_) {
      say_(absl::StrCat("chaos: ", Flag(k), " never came due (the job ended "
                        "first); nothing done"));
    }
  }

  bool active() const {
    return !pending_.empty() || !restarts_.empty() || !resumes_.empty();
  }

  // Sees every output line; the scheduler's "cluster ready" starts the clock.
  void OnLine(const std::string& name, absl::string_view line) {
    if (name != "H" || !absl::StrContains(line, "cluster ready:")) return;
    absl::MutexLock l(&mu_);
    if (ready_ == absl::InfiniteFuture()) ready_ = absl::Now();
  }

  // When the next kill or restart is due; while the cluster is not ready
  // yet, a short poll. InfiniteFuture when nothing is left to do.
  absl::Time NextDue() {
    if (!active()) return absl::InfiniteFuture();
    const absl::Time ready = Ready();
    if (ready == absl::InfiniteFuture()) return absl::Now() + kReadyPoll;
    absl::Time next = absl::InfiniteFuture();
    for (const ChaosKill& k : pending_) {
      next = std::min(next, k.after_epochs >= 0
                                ? absl::Now() + kEpochPoll
                                : ready + absl::Seconds(k.after_s));
    }
    for (const auto& r : restarts_) next = std::min(next, r.when);
    for (const auto& r : resumes_) next = std::min(next, r.second);
    return next;
  }

  // Kills and restarts whatever is due now.
  void RunDue(ProcessGroup* group, const std::vector<ChildSpec>& specs) {
    absl::Time ready = Ready();
    if (ready == absl::InfiniteFuture()) {
      if (!probe_ready_ || !probe_ready_()) return;
      absl::MutexLock l(&mu_);
      if (ready_ == absl::InfiniteFuture()) ready_ = absl::Now();
      ready = ready_;
    }
    const absl::Time now = absl::Now();
    // Progress, asked at most once a call and only when an eEPOCHS event
    // waits for it.
    std::optional<double> epochs;
    for (const ChaosKill& k : pending_) {
      if (k.after_epochs >= 0 && probe_epochs_) {
        epochs = probe_epochs_();
        break;
      }
    }
    for (size_t i = 0; i < pending_.size();) {
      const ChaosKill k = pending_[i];
      const bool due = k.after_epochs >= 0
                           ? epochs.has_value() && *epochs >= k.after_epochs
                           : ready + absl::Seconds(k.after_s) <= now;
      if (!due) {
        ++i;
        continue;
      }
      // A kill whose target this launcher already killed (two --kill of
      // one process due together, or the second before the replacement is
      // up): it waits for the replacement, so that the restart happens once
      // and the second kill takes the new process; without --restart it
      // does nothing.
      bool killed_before = false;
      if (k.role != 'A' && k.role != 'J' && k.role != 'D' && k.pause_s <= 0) {
        std::string name = k.Target();
        if (auto it = latest_.find(name); it != latest_.end()) {
          name = it->second;
        }
        absl::StatusOr<pid_t> pid = group->Signal(name, 0);
        killed_before = pid.ok() && killed_.count(*pid) > 0;
        bool restart_pending = false;
        for (const Restart& r : restarts_) {
          restart_pending = restart_pending || r.spec.name == k.Target();
        }
        if ((killed_before || !pid.ok()) && restart_pending) {
          ++i;
          continue;
        }
      }
      pending_.erase(pending_.begin() + i);
      if (k.after_epochs >= 0) {
        say_(absl::StrFormat("chaos: %.2f epochs of work done: %s is due",
                             *epochs, Flag(k)));
      }
      if (k.role == 'A' || k.role == 'J') {
        AddNode(k.role == 'A' ? 'S' : 'W', group, specs, ready, now);
        continue;
      }
      if (k.role == 'D') {
        StartDrain(k, ready, now);
        continue;
      }
      const std::string target = k.Target();
      // The newest incarnation: after a restart, kill the replacement.
      std::string name = target;
      if (auto it = latest_.find(target); it != latest_.end()) name = it->second;
      if (k.pause_s > 0) {
        Pause(group, k, name, ready, now);
        continue;
      }
      absl::StatusOr<pid_t> pid =
          killed_before ? absl::StatusOr<pid_t>(absl::FailedPreconditionError(
                              absl::StrCat(name, " was killed already")))
                        : group->Signal(name, SIGKILL);
      const double at = absl::ToDoubleSeconds(now - ready);
      if (!pid.ok()) {
        say_(absl::StrFormat("chaos: %s: %s; nothing killed", Flag(k),
                             pid.status().message()));
        continue;
      }
      killed_.insert(*pid);
      say_(absl::StrFormat(
          "chaos: killed %s (pid %d) with SIGKILL at %.3f s after the "
          "cluster was ready (%s), unix ms %d",
          name, *pid, at, Flag(k), absl::ToUnixMillis(now)));
      Record(absl::StrFormat(
          "{\"event\": \"kill\", \"node\": \"%s\", \"pid\": %d, "
          "\"unix_ms\": %d, \"after_ready_s\": %.3f}",
          name, *pid, absl::ToUnixMillis(now), at));
      if (restart_) {
        const ChildSpec* spec = nullptr;
        for (const auto& sp : specs) {
          if (sp.name == target) spec = &sp;
        }
        if (spec != nullptr) restarts_.push_back({*spec, now + restart_delay_});
      }
    }
    for (size_t i = 0; i < resumes_.size();) {
      if (resumes_[i].second > now) {
        ++i;
        continue;
      }
      const std::string name = resumes_[i].first;
      resumes_.erase(resumes_.begin() + i);
      absl::StatusOr<pid_t> pid = group->Signal(name, SIGCONT);
      say_(pid.ok()
               ? absl::StrFormat("chaos: resumed %s (pid %d) with SIGCONT at "
                                 "%.3f s after the cluster was ready",
                                 name, *pid,
                                 absl::ToDoubleSeconds(now - ready))
               : absl::StrCat("chaos: cannot resume ", name, ": ",
                              pid.status().message()));
      if (pid.ok()) {
        Record(absl::StrFormat(
            "{\"event\": \"resume\", \"node\": \"%s\", \"pid\": %d, "
            "\"unix_ms\": %d, \"after_ready_s\": %.3f}",
            name, *pid, absl::ToUnixMillis(now),
            absl::ToDoubleSeconds(now - ready)));
      }
    }
    for (size_t i = 0; i < restarts_.size();) {
      if (restarts_[i].when > now) {
        ++i;
        continue;
      }
      ChildSpec spec = restarts_[i].spec;
      restarts_.erase(restarts_.begin() + i);
      const std::string target = spec.name;
      const int n = ++incarnations_[target];
      if (target != "H") {
        // A new node, not the dead one back: no requested id.
        spec.name = absl::StrCat(target, "+", n);
        for (size_t a = 0; a + 1 < spec.argv.size(); ++a) {
          if (spec.argv[a] == "--id") spec.argv.erase(spec.argv.begin() + a,
                                                      spec.argv.begin() + a + 2);
        }
      }
      absl::StatusOr<pid_t> pid = group->Start(spec);
      if (!pid.ok()) {
        say_(absl::StrCat("chaos: cannot restart ", target, ": ",
                          pid.status().message()));
        continue;
      }
      latest_[target] = spec.name;
      say_(absl::StrFormat(
          "chaos: restarted %s as %s (pid %d) at %.3f s after the cluster "
          "was ready",
          target, spec.name, *pid, absl::ToDoubleSeconds(now - ready)));
      Record(absl::StrFormat(
          "{\"event\": \"restart\", \"node\": \"%s\", \"as\": "
          "\"%s\", \"pid\": %d, \"unix_ms\": %d, \"after_ready_s\": "
          "%.3f}",
          target, spec.name, *pid, absl::ToUnixMillis(now),
          absl::ToDoubleSeconds(now - ready)));
    }
  }

  // True for the exit of a process it killed.
  bool Killed(const ChildExit& exit) const {
    return killed_.count(exit.pid) > 0;
  }

 private:
  // --pause: SIGSTOP now, SIGCONT k.pause_s later.
  void Pause(ProcessGroup* group, const ChaosKill& k, const std::string& name,
             absl::Time ready, absl::Time now) {
    absl::StatusOr<pid_t> pid = group->Signal(name, SIGSTOP);
    const double at = absl::ToDoubleSeconds(now - ready);
    if (!pid.ok()) {
      say_(absl::StrFormat("chaos: %s: %s; nothing paused", Flag(k),
                           pid.status().message()));
      return;
    }
    say_(absl::StrFormat(
        "chaos: paused %s (pid %d) with SIGSTOP at %.3f s after the cluster "
        "was ready, for %g s (%s), unix ms %d",
        name, *pid, at, k.pause_s, Flag(k), absl::ToUnixMillis(now)));
    Record(absl::StrFormat(
        "{\"event\": \"pause\", \"node\": \"%s\", \"pid\": %d, "
        "\"unix_ms\": %d, \"after_ready_s\": %.3f, \"for_s\": %g}",
        name, *pid, absl::ToUnixMillis(now), at, k.pause_s));
    resumes_.emplace_back(name, now + absl::Seconds(k.pause_s));
  }
  // --add-server / --add-worker: S[0]'s (W[0]'s) command line without
  // its id, as "S+<n>" ("W+<n>").
  void AddNode(char role, ProcessGroup* group,
               const std::vector<ChildSpec>& specs, absl::Time ready,
               absl::Time now) {
    const ChildSpec* base = nullptr;
    const std::string first = absl::StrCat(std::string(1, role), "[0]");
    for (const auto& sp : specs) {
      if (sp.name == first) base = &sp;
    }
    if (base == nullptr) return;
    ChildSpec spec = *base;
    spec.name = absl::StrCat(std::string(1, role), "+", ++added_[role]);
    for (size_t a = 0; a + 1 < spec.argv.size(); ++a) {
      if (spec.argv[a] == "--id") {
        spec.argv.erase(spec.argv.begin() + a, spec.argv.begin() + a + 2);
      }
    }
    // A metrics port of its own (issue 11), not S[0]'s.
    for (size_t a = 0; a + 1 < spec.argv.size(); ++a) {
      if (spec.argv[a] == "--metrics_port") {
        absl::StatusOr<int> p = PickUnusedPort("127.0.0.1");
        spec.argv[a + 1] = absl::StrCat(p.ok() ? *p : 0);
        if (p.ok()) {
          say_(absl::StrCat("metrics ", spec.name, " http://127.0.0.1:", *p,
                            "/metrics"));
        }
      }
    }
    absl::StatusOr<pid_t> pid = group->Start(spec);
    const double at = absl::ToDoubleSeconds(now - ready);
    if (!pid.ok()) {
      say_(absl::StrCat(role == 'S' ? "--add-server" : "--add-worker",
                        ": cannot start ", spec.name, ": ",
                        pid.status().message()));
      return;
    }
    say_(absl::StrFormat("added %s %s (pid %d) at %.3f s after the "
                         "cluster was ready",
                         role == 'S' ? "server" : "worker", spec.name, *pid,
                         at));
    Record(absl::StrFormat(
        "{\"event\": \"add\", \"node\": \"%s\", \"pid\": %d, "
        "\"unix_ms\": %d, \"after_ready_s\": %.3f}",
        spec.name, *pid, absl::ToUnixMillis(now), at));
  }
  // --drain: the Drain RPC on a thread (it returns once the ranges moved).
  void StartDrain(const ChaosKill& k, absl::Time ready, absl::Time now) {
    const double at = absl::ToDoubleSeconds(now - ready);
    say_(absl::StrFormat("draining S[%d] at %.3f s after the cluster was ready",
                         k.id, at));
    Record(absl::StrFormat(
        "{\"event\": \"drain\", \"node\": \"S[%d]\", \"unix_ms\": %d, "
        "\"after_ready_s\": %.3f}",
        k.id, absl::ToUnixMillis(now), at));
    drains_.emplace_back([this, id = k.id] {
      absl::StatusOr<proto::DrainResponse> r = drain_(id);
      // Refused because too few servers would be left (another was killed
      // or drained at the same moment): tried again for a while, as a
      // server this launcher added or restarted may be about to join.
      const absl::Time until = absl::Now() + kDrainRetryFor;
      bool said = false;
      while (!r.ok() && ReasonOf(r.status()) == proto::REASON_TOO_FEW_SERVERS &&
             absl::Now() < until &&
             !ending_.WaitForNotificationWithTimeout(kDrainRetryEvery)) {
        if (!said) {
          say_(absl::StrFormat(
              "drain S[%d] refused for now (%s); trying again for up to %s",
              id, r.status().message(),
              absl::FormatDuration(kDrainRetryFor)));
          said = true;
        }
        r = drain_(id);
      }
      if (r.ok()) {
        say_(absl::StrFormat(
            "S[%d] drained: %d key range(s) moved off it in %.3f s (view "
            "epoch %d); it leaves the job",
            id, r->ranges_moved(), r->seconds(), r->epoch()));
      } else {
        say_(absl::StrFormat("drain S[%d] failed: %s", id,
                             r.status().ToString()));
      }
    });
  }
  struct Restart {
    ChildSpec spec;
    absl::Time when;
  };
  // The event as its flag: "--kill S[1]@e2", "--pause W[1]@1:600",
  // "--add-server 0.2", "--drain S[1]@0.6".
  static std::string Flag(const ChaosKill& k) {
    switch (k.role) {
      case 'A': return absl::StrCat("--add-server ", k.When());
      case 'J': return absl::StrCat("--add-worker ", k.When());
      case 'D': return absl::StrCat("--drain S[", k.id, "]@", k.When());
      default: break;
    }
    if (k.pause_s > 0) {
      return absl::StrCat("--pause ", k.Target(), "@", k.When(), ":",
                          k.pause_s);
    }
    return absl::StrCat("--kill ", k.Target(), "@", k.When());
  }
  absl::Time Ready() {
    absl::MutexLock l(&mu_);
    return ready_;
  }
  void Record(const std::string& json) {
    std::ofstream out(record_path_, std::ios::app);
    out << json << "\n";
    if (!out) say_(absl::StrCat("chaos: cannot append to ", record_path_));
  }

  static constexpr absl::Duration kReadyPoll = absl::Milliseconds(100);
  static constexpr absl::Duration kEpochPoll = absl::Milliseconds(20);
  const std::string record_path_;
  const bool restart_;
  const absl::Duration restart_delay_;
  const SayFn say_;
  const std::function<bool()> probe_ready_;
  const DrainFn drain_;
  const EpochsFn probe_epochs_;
  std::vector<std::thread> drains_;
  std::map<char, int> added_;  // per role letter
  std::vector<ChaosKill> pending_;  // in the constructor's order
  std::vector<Restart> restarts_;
  // --pause: the processes stopped, with when to resume each.
  std::vector<std::pair<std::string, absl::Time>> resumes_;
  std::set<pid_t> killed_;
  std::map<std::string, int> incarnations_;
  std::map<std::string, std::string> latest_;  // target -> newest name
  absl::Mutex mu_;
  absl::Time ready_ ABSL_GUARDED_BY(mu_) = absl::InfiniteFuture();
  // Refused drains (REASON_TOO_FEW_SERVERS) are tried again this long.
  static constexpr absl::Duration kDrainRetryFor = absl::Seconds(10);
  static constexpr absl::Duration kDrainRetryEvery = absl::Milliseconds(200);
  absl::Notification ending_;  // the destructor began
};

}  // namespace

namespace {

// Issue 11: gives every child a free metrics port (--metrics_port), prints
// "metrics <node> http://<host>:<port>/metrics" for each and writes the
// targets for Prometheus's file_sd_configs to <run_dir>/metrics_targets.json
// ({"targets": ["host:port"], "labels": {"node": ..., "role": ...}} each).
absl::Status AssignMetricsPorts(const std::string& connect_host,
                                const std::string& bind_host,
                                const std::string& run_dir,
                                std::vector<ChildSpec>* specs,
                                const std::function<void(absl::string_view)>& say) {
  // The children listen on bind_host; a wildcard is reached on loopback.
  const std::string pick_host =
      bind_host.empty() || bind_host == "0.0.0.0" ? "127.0.0.1" : bind_host;
  std::string json = "[";
  for (ChildSpec& spec : *specs) {
    absl::StatusOr<int> port = PickUnusedPort(pick_host);
    if (!port.ok()) {
      return absl::UnavailableError(absl::StrCat(
          "cannot pick a metrics port for ", spec.name, ": ",
          port.status().message()));
    }
    spec.argv.push_back("--metrics_port");
    spec.argv.push_back(absl::StrCat(*port));
    const std::string host =
        spec.name == "H" ? connect_host : pick_host;
    say(absl::StrCat("metrics ", spec.name, " http://", host, ":", *port,
                     "/metrics"));
    const char* role = spec.name == "H"       ? "scheduler"
                       : spec.name[0] == 'S' ? "server"
                                             : "worker";
    absl::StrAppend(&json, json.size() > 1 ? ",\n " : "", "{\"targets\": [\"",
                    host, ":", *port, "\"], \"labels\": {\"node\": \"",
                    spec.name, "\", \"role\": \"", role, "\"}}");
  }
  json += "]\n";
  const std::string path =
      (std::filesystem::path(run_dir) / "metrics_targets.json").string();
  std::ofstream out(path, std::ios::trunc);
  out << json;
  if (!out.flush()) return absl::InternalError("cannot write " + path);
  return absl::OkStatus();
}

}  // namespace

Launcher::Launcher(LaunchOptions options, Output out)
    : options_(std::move(options)), out_(std::move(out)) {}

void Launcher::Emit(absl::string_view line) {
  // The lock only serialises whole lines; `out_` is the output itself.
  absl::MutexLock lock(&out_mu_);
  out_(line);
}

void Launcher::Say(absl::string_view line) {
  Emit(absl::StrCat("ps_launch: ", line));
}

int Launcher::Check() {
  absl::StatusOr<JobConfig> config =
      CheckLaunch(options_, options_.check_resources);
  if (!config.ok()) {
    Say(config.status().message());
    return kExitUsage;
  }
  const int64_t tau = config->EffectiveTau();
  Say(absl::StrFormat(
      "config ok: %s: mode=%s tau=%s servers=%d workers=%d data=%s model=%s%s",
      options_.config_path, ModeName(config->consistency.mode),
      tau < 0 ? std::string("inf") : absl::StrCat(tau),
      config->cluster.num_servers, config->cluster.num_workers,
      config->data.format, config->training.model,
      options_.check_resources
          ? ""
          : " (data files and model_dir not checked: --check=resources)"));
  return kExitOk;
}

int Launcher::Run(const std::atomic<int>* stop) {
  const absl::Time start = absl::Now();

  // 1. The job config, the flags, the data files and model_dir, before
  // any process starts.
  absl::StatusOr<JobConfig> resolved =
      CheckLaunch(options_, /*check_resources=*/true);
  if (!resolved.ok()) {
    Say(resolved.status().message());
    return kExitUsage;
  }
  JobConfig config = *std::move(resolved);

  // 2. The scheduler's address.
  std::string host;
  int port = 0;
  if (absl::Status s = SplitHostPort(config.cluster.scheduler, &host, &port);
      !s.ok()) {
    Say(absl::StrCat("config field cluster.scheduler: ", s.message()));
    return kExitUsage;
  }
  if (port == 0) {
    absl::StatusOr<int> picked = PickUnusedPort(host);
    if (!picked.ok()) {
      Say(absl::StrCat("config field cluster.scheduler: cannot pick a port: ",
                       picked.status().message()));
      return kExitUsage;
    }
    port = *picked;
  }
  config.cluster.scheduler = absl::StrCat(host, ":", port);
  // Where the others connect: a wildcard listen address is reached locally.
  const std::string connect_host =
      (host == "0.0.0.0" || host.empty()) ? "127.0.0.1" : host;
  scheduler_address_ = absl::StrCat(connect_host, ":", port);

  // 3. The binaries, checked before anything is started.
  const std::string bin_dir =
      options_.bin_dir.empty() ? SelfExeDir() : options_.bin_dir;
  auto bin = [&](const char* name) {
    return (std::filesystem::path(bin_dir) / name).string();
  };
  std::vector<std::string> needed = {bin("ps_scheduler")};
  if (config.cluster.num_servers > 0) needed.push_back(bin("ps_server"));
  if (config.cluster.num_workers > 0) needed.push_back(bin("ps_worker"));
  for (const auto& path : needed) {
    if (access(path.c_str(), X_OK) != 0) {
      Say(absl::StrCat("cannot execute ", path, " (", strerror(errno),
                       "); point --bin-dir at the directory holding it"));
      return kExitUsage;
    }
  }
  // --plot: what draws it, found before the job rather than after.
  std::optional<Plotter> plotter;
  if (!options_.plot_path.empty()) {
    absl::StatusOr<Plotter> p = FindPlotter(
        options_.bin_dir.empty() ? SelfExeDir() : options_.bin_dir);
    if (!p.ok()) {
      Say(p.status().message());
      return kExitUsage;
    }
    plotter = *std::move(p);
  }

  // 4. The run directory and the resolved config.
  run_dir_ = options_.run_dir;
  if (run_dir_.empty()) {
    run_dir_ = absl::StrCat(
        "runs/", absl::FormatTime("%Y%m%d-%H%M%S", start, absl::LocalTimeZone()),
        "-", getpid());
  }
  std::error_code ec;
  std::filesystem::create_directories(run_dir_, ec);
  if (ec) {
    Say(absl::StrCat("cannot create run dir ", run_dir_, ": ", ec.message()));
    return kExitSetupError;
  }
  const std::string job_yaml =
      std::filesystem::absolute(std::filesystem::path(run_dir_) / "job.yaml")
          .string();
  if (absl::Status s = WriteFilePrivate(job_yaml, ToYaml(config)); !s.ok()) {
    Say(absl::StrCat("cannot write ", s.message()));
    return kExitSetupError;
  }

  const int64_t tau = config.EffectiveTau();
  Say(absl::StrFormat(
      "mode=%s tau=%s servers=%d workers=%d scheduler=%s run_dir=%s",
      ModeName(config.consistency.mode),
      tau < 0 ? std::string("inf") : absl::StrCat(tau),
      config.cluster.num_servers, config.cluster.num_workers,
      scheduler_address_, run_dir_));

  // 5. The children.
  const std::string token = config.cluster.auth_token.empty()
                                ? RandomHexToken()
                                : config.cluster.auth_token;
  // Authentication is on by default: the token (generated unless the config
  // has one) goes to the children in PS_AUTH_TOKEN, with the TLS files and
  // the message limit, and into <run_dir>/token (0600) for ps_status.
  GrpcSecurity security = SecurityFromConfig(config);
  security.token = token;
  std::vector<std::string> env = SecurityEnv(security);
  env.push_back("PS_BIND_HOST=" + config.cluster.bind_host);
  const std::string token_file =
      (std::filesystem::path(run_dir_) / "token").string();
  if (absl::Status s = WriteFilePrivate(token_file, token + "\n"); !s.ok()) {
    Say(absl::StrCat("cannot write ", s.message()));
    return kExitSetupError;
  }
  Say(absl::StrCat("auth token in ", token_file, " (ps_status --scheduler ",
                   scheduler_address_, " --token_file ", token_file, ")"));
  std::vector<ChildSpec> specs;
  const std::string report_path =
      options_.report_path.empty()
          ? (std::filesystem::path(run_dir_) / "report.json").string()
          : options_.report_path;
  {
    ChildSpec h{"H", {bin("ps_scheduler"), "--config", job_yaml, "--port",
                      absl::StrCat(port)}, env};
    // Always a report: it is the scheduler's verdict on how the job ended
    // (its run dir's report.json when --report is not given). A stale one
    // would be taken for this job's verdict.
    std::filesystem::remove(report_path, ec);
    h.argv.push_back("--report");
    h.argv.push_back(report_path);
    // Scheduler restart (issue 9): a --restart of H takes the job over
    // from this file; one left by an earlier job in this run dir is not
    // this job's.
    const std::string state =
        (std::filesystem::path(run_dir_) / "scheduler.state").string();
    std::filesystem::remove(state, ec);
    h.argv.push_back("--state_file");
    h.argv.push_back(state);
    specs.push_back(std::move(h));
  }
  for (int i = 0; i < config.cluster.num_servers; ++i) {
    specs.push_back(ChildSpec{absl::StrCat("S[", i, "]"),
                              {bin("ps_server"), "--scheduler",
                               scheduler_address_, "--id", absl::StrCat(i)},
                              env});
  }
  for (int i = 0; i < config.cluster.num_workers; ++i) {
    specs.push_back(ChildSpec{absl::StrCat("W[", i, "]"),
                              {bin("ps_worker"), "--scheduler",
                               scheduler_address_, "--id", absl::StrCat(i)},
                              env});
  }
  // Metrics (issue 11): a free port for every process, on the host its
  // gRPC binds to, printed one line per node and written as a Prometheus
  // file_sd target list (<run_dir>/metrics_targets.json).
  if (absl::Status s = AssignMetricsPorts(
          connect_host, config.cluster.bind_host, run_dir_, &specs,
          [this](absl::string_view l) { Say(l); });
      !s.ok()) {
    Say(s.message());
    return kExitSetupError;
  }

  int code = kExitOk;
  std::vector<std::string> dead_workers;  // issue 9: workers that died
  {
    // Chaos (issue 9): readiness from the scheduler's log line, or by
    // asking it (Status: phase past registering); eEPOCHS events by asking
    // it for its progress (one channel: the scheduler listens by then).
    // Replaced after a failed call: a channel that lost the scheduler (a
    // --kill H) backs off its reconnects for seconds, and the eEPOCHS events
    // after a scheduler restart then never came due.
    auto progress_clients = std::make_unique<GrpcClientFactory>(
        GrpcClientFactory::Options(security, 1));
    Chaos chaos(
        options_, [this](absl::string_view l) { Say(l); },
        [&]() {
          // A channel per probe: one whose first calls were refused (the
          // scheduler not listening yet) kept failing them for the whole
          // job, so a --kill at warn log level never happened.
          GrpcClientFactory probe_clients(
              GrpcClientFactory::Options(security, 1));
          auto st = probe_clients.Scheduler(scheduler_address_)
                        ->Status(proto::StatusRequest(),
                                 absl::Now() + absl::Milliseconds(200));
          return st.ok() && st->phase() != "registering";
        },
        (std::filesystem::path(run_dir_) / "chaos.jsonl").string(),
        [&](int id) -> absl::StatusOr<proto::DrainResponse> {
          GrpcClientFactory drain_clients(
              GrpcClientFactory::Options(security, 1));
          proto::DrainRequest req;
          req.set_server(id);
          return drain_clients.Scheduler(scheduler_address_)
              ->Drain(req, absl::Now() + absl::Seconds(300));
        },
        [&]() -> std::optional<double> {
          proto::StatusRequest req;
          req.set_brief(true);
          if (progress_clients == nullptr) {
            progress_clients = std::make_unique<GrpcClientFactory>(
                GrpcClientFactory::Options(security, 1));
          }
          auto st = progress_clients->Scheduler(scheduler_address_)
                        ->Status(req, absl::Now() + absl::Milliseconds(200));
          if (!st.ok()) {
            progress_clients.reset();
            return std::nullopt;
          }
          return st->epochs_done();
        });
    ProcessGroup group(
        [this, &chaos](const std::string& name, absl::string_view line) {
          chaos.OnLine(name, line);
          Emit(absl::StrCat(name, " ", line));
        });
    auto finish = [&](int c) {
      group.TerminateAll(options_.kill_grace);
      code = c;
    };
    bool done = false;
    for (const auto& spec : specs) {
      absl::StatusOr<pid_t> pid = group.Start(spec);
      if (!pid.ok()) {
        Say(absl::StrCat("cannot start ", spec.name, ": ",
                         pid.status().message(), "; stopping the others"));
        finish(kExitSetupError);
        done = true;
        break;
      }
    }

    // 6. Supervision.
    const absl::Time timeout_deadline =
        options_.timeout_s > 0 ? start + absl::Seconds(options_.timeout_s)
                               : absl::InfiniteFuture();
    absl::Time shutdown_deadline = absl::InfiniteFuture();
    while (!done) {
      const absl::Time deadline = std::min(timeout_deadline, shutdown_deadline);
      ProcessGroup::WaitResult r =
          group.WaitNext(std::min(deadline, chaos.NextDue()), stop);
      switch (r.event) {
        case ProcessGroup::Event::kChildExited:
          if (chaos.Killed(r.exit)) {
            // Chaos (issue 9): killed on purpose; the cluster decides.
            Say(absl::StrCat(r.exit.Describe(), " (killed by --kill)"));
            if (ClusterHandlesWorkerDeath(config, r.exit.name)) {
              dead_workers.push_back(r.exit.name);
            }
            break;
          }
          if (!r.exit.ok() && r.exit.name != "H" &&
              absl::StrContains(r.exit.name, "+")) {
            // A --restart replacement or --add-server/--add-worker node
            // that could not join (only while the job runs; a worker not
            // into an mlp job) leaves the job as it was; its own error is
            // printed above.
            Say(absl::StrCat(r.exit.Describe(),
                             " (a node started mid-run that did not join); "
                             "the job goes on without it"));
            break;
          }
          if (!r.exit.ok() && !FailedJobError(report_path).has_value() &&
              DeclaredDeadInReport(report_path).contains(r.exit.name)) {
            // Issue 9: a node that hung past the heartbeat timeout was
            // declared dead (a server failed over, a worker's units handed
            // on); woken after the job (or its scheduler) ended, it finds
            // no one to talk to. The job's outcome stands.
            Say(absl::StrCat(r.exit.Describe(),
                             " (it had been declared dead: the job went on "
                             "without it)"));
            break;
          }
          // Issue 9: a dead worker is the cluster's to handle (the
          // scheduler hands its work units to the others) unless the job
          // already failed.
          // A server is the cluster's to handle (failover) when it was
          // killed by a signal (a crash, the OOM killer); one that exits
          // with a status stops on an error of its own, printed above.
          if (!r.exit.ok() && ClusterHandlesWorkerDeath(config, r.exit.name) &&
              (r.exit.signaled || !absl::StartsWith(r.exit.name, "S[")) &&
              !FailedJobError(report_path).has_value()) {
            dead_workers.push_back(r.exit.name);
            Say(absl::StrCat(
                r.exit.Describe(),
                absl::StartsWith(r.exit.name, "S[")
                    ? "; the job goes on without it (the scheduler fails "
                      "its key ranges over to their backups)"
                    : "; the job goes on without it (the scheduler hands its "
                      "work units to the other workers)"));
            break;
          }
          if (!r.exit.ok()) {
            // The first real error: when the scheduler had already failed
            // the job (its report is written before anyone is told), this
            // exit is a consequence (e.g. a crash on the way out) and the
            // scheduler's error is the one to print.
            if (std::optional<std::string> e = FailedJobError(report_path)) {
              Say(absl::StrCat("job failed: ", *e));
              Say(absl::StrCat("after that, ", r.exit.Describe(),
                               "; stopping the others"));
            } else {
              Say(absl::StrCat(r.exit.Describe(), "; stopping the others"));
            }
            finish(r.exit.ShellCode());
            done = true;
          } else if (r.exit.name == "H" && group.running() > 0) {
            // A node declared dead that still runs (hung, or stopped by
            // --pause) is no part of the job any more: not waited for.
            const absl::flat_hash_set<std::string> declared_dead =
                DeclaredDeadInReport(report_path);
            for (const std::string& name : group.RunningNames()) {
              if (declared_dead.contains(name) &&
                  group.Signal(name, SIGKILL).ok()) {
                Say(absl::StrCat(name, " had been declared dead and still "
                                       "runs after the job; killed it"));
              }
            }
            shutdown_deadline = absl::Now() + options_.shutdown_grace;
          }
          break;
        case ProcessGroup::Event::kAllExited:
          done = true;
          break;
        case ProcessGroup::Event::kStopped:
          Say(absl::StrCat("received ", SignalName(r.stop_signal), " (",
                           r.stop_signal, "); stopping all processes"));
          finish(128 + r.stop_signal);
          done = true;
          break;
        case ProcessGroup::Event::kDeadline:
          if (absl::Now() < deadline) {  // chaos (issue 9): a kill or restart
            chaos.RunDue(&group, specs);
            break;
          }
          if (absl::Now() >= timeout_deadline) {
            Say(absl::StrFormat("timeout of %g s exceeded; stopping %s",
                                options_.timeout_s,
                                absl::StrJoin(group.RunningNames(), ", ")));
            finish(kExitTimeout);
          } else {
            Say(absl::StrCat(
                "the scheduler finished but ",
                absl::StrJoin(group.RunningNames(), ", "),
                " still running after ",
                absl::FormatDuration(options_.shutdown_grace),
                "; stopping them"));
            finish(1);
          }
          done = true;
          break;
      }
    }
  }  // ~ProcessGroup: output drained, pump thread stopped.

  if (code == kExitOk) {
    if (std::optional<std::string> e = FailedJobError(report_path)) {
      // Cannot happen with the real binaries (they exit non-zero on a
      // failed job), but never call a failed job a success.
      Say(absl::StrCat("job failed: ", *e));
      code = 1;
    }
  }
  // --plot: whatever the outcome, as long as the scheduler wrote a report
  // (a failed job's curve shows where it stood). A plot that cannot be
  // drawn fails a successful run.
  if (plotter && std::filesystem::exists(report_path)) {
    if (absl::Status s = PlotReport(*plotter, report_path, options_.plot_path);
        s.ok()) {
      Say(absl::StrCat("loss curves drawn in ", options_.plot_path));
    } else {
      Say(s.message());
      if (code == kExitOk) code = 1;
    }
  }
  if (!dead_workers.empty()) {
    Say(absl::StrCat("nodes that died during the job: ",
                     absl::StrJoin(dead_workers, ", "), "; the job ",
                     code == kExitOk ? "ended ok without them" : "failed"));
  }
  Say(absl::StrFormat("finished in %.1f s, exit status %d",
                      absl::ToDoubleSeconds(absl::Now() - start), code));
  return code;
}

}  // namespace ps
