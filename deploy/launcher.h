// ps_launch: starts a whole cluster (scheduler, S servers, W workers) as
// separate processes on one machine and supervises them.
//
// Two layers, both usable from tests:
//   * ProcessGroup: starts child programs (fork/exec, no shell), pumps their
//     stdout/stderr line by line to a sink, reaps them with deadlines and
//     kills them (SIGTERM, then SIGKILL).
//   * Launcher: the job logic on top (config, port, run dir, job.yaml, the
//     children's command lines, failure propagation, exit codes).
// launch_main.cc only turns argv into LaunchOptions and calls Launcher::Run.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/config.h"

namespace ps {

// Process exit codes of ps_launch (besides a child's own code, or 128+signal
// when a child is killed by a signal).
inline constexpr int kExitOk = 0;
inline constexpr int kExitSetupError = 1;  // run dir, job.yaml, fork/exec
inline constexpr int kExitUsage = 2;       // bad flag, bad config field
inline constexpr int kExitTimeout = 124;   // --timeout_s exceeded

// One child program. argv[0] must be a path (it is exec'd as is, no PATH
// search). `env` entries ("KEY=VALUE") are added to, or replace, the
// launcher's own environment.
struct ChildSpec {
  std::string name;  // prefix for its output lines and messages: "W[1]"
  std::vector<std::string> argv;
  std::vector<std::string> env;
};

// How a child ended.
struct ChildExit {
  std::string name;
  pid_t pid = -1;
  bool signaled = false;  // true: killed by signal `code`
  int code = 0;           // exit status, or the signal number

  bool ok() const { return !signaled && code == 0; }
  // The shell convention: the exit status, or 128 + signal.
  int ShellCode() const { return signaled ? 128 + code : code; }
  // "W[1] exited with status 3", "S[0] killed by signal 9 (Killed)".
  std::string Describe() const;
};

// Starts and supervises a set of child processes.
//
// Each child runs in its own process group (killing it kills whatever it
// started), has stdin on /dev/null, and gets PR_SET_PDEATHSIG(SIGKILL) so it
// dies if the thread that started it dies (e.g. the launcher is SIGKILLed).
// Call Start from a thread that outlives the children (the main thread).
//
// Every whole line a child writes to stdout or stderr is passed to the sink
// as (child name, line without '\n'); a final unterminated line is passed at
// EOF, and a line longer than 64 KiB is passed in pieces. The sink is called
// from a single internal thread, never while an internal lock is held.
//
// Not thread-safe: one thread calls Start/WaitNext/TerminateAll.
class ProcessGroup {
 public:
  using LineSink =
      std::function<void(const std::string& name, absl::string_view line)>;

  explicit ProcessGroup(LineSink sink);
  // Terminates children still running (grace 3 s), waits (bounded) for
  // their output to drain, and stops the output thread.
  ~ProcessGroup();

  ProcessGroup(const ProcessGroup&) = delete;
  ProcessGroup& operator=(const ProcessGroup&) = delete;

  // Starts one child. Returns its pid, or an error when pipes/fork fail or
  // the program cannot be exec'd (e.g. NOT_FOUND for a missing binary).
  absl::StatusOr<pid_t> Start(const ChildSpec& spec);

  enum class Event {
    kChildExited,  // `exit` holds which child and how
    kAllExited,    // no child is running (any more)
    kDeadline,     // `deadline` passed first
    kStopped,      // *stop became non-zero; `stop_signal` holds its value
  };
  struct WaitResult {
    Event event;
    ChildExit exit;
    int stop_signal = 0;
  };
  // Waits for the next child to exit (reaping it, and giving its output up
  // to 1 s to drain so its last lines come before anything said about its
  // exit), for `deadline`, or for `*stop` (may be null) to become non-zero;
  // exits are reported first, then stop, then the deadline. Polls every
  // 10 ms. `stop` may be written from a signal handler.
  WaitResult WaitNext(absl::Time deadline,
                      const std::atomic<int>* stop = nullptr);

  // Sends SIGTERM to the process group of every running child, waits up to
  // `grace` for them to exit, then SIGKILLs the groups that were signalled
  // and reaps the children. Returns how they ended (killed ones included).
  std::vector<ChildExit> TerminateAll(absl::Duration grace);

  // Chaos (issue 9): sends `sig` to the running child named `name` (its
  // process group, so whatever it started goes too). Returns its pid;
  // NOT_FOUND when no child of that name is running.
  absl::StatusOr<pid_t> Signal(const std::string& name, int sig);

  // Names of the children that have not been reaped yet.
  std::vector<std::string> RunningNames() const;
  size_t running() const;

 private:
  struct Child {
    std::string name;
    pid_t pid;
    bool running = true;
  };
  struct Stream;  // one pipe end being read by the pump thread

  // Reaps one child without blocking; true when it was reaped.
  bool TryReap(Child* child, ChildExit* exit);
  // Waits until both of `pid`'s streams are at EOF, or `deadline`.
  void AwaitOutputDrained(pid_t pid, absl::Time deadline);
  void PumpLoop();
  void Wake();

  // Constant after construction.
  const LineSink sink_;
  int wake_read_fd_ = -1;
  int wake_write_fd_ = -1;

  // Touched only by the thread that calls Start/WaitNext/TerminateAll.
  std::vector<Child> children_;

  mutable absl::Mutex mu_;
  // Streams registered by Start, not yet taken over by the pump thread.
  std::vector<std::unique_ptr<Stream>> new_streams_ ABSL_GUARDED_BY(mu_);
  // Per child pid, how many of its streams are not at EOF yet (entries go
  // when that reaches 0).
  std::vector<std::pair<pid_t, int>> open_streams_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;

  std::thread pump_;  // last: started after everything above exists
};

// Chaos (issue 9): `--kill S1@10` SIGKILLs server 1 ten seconds after the
// cluster is ready; `--kill S1@e2` once two epochs' worth of work units are
// done (the scheduler's progress, polled), which, unlike a time, falls at
// the same point of the job however fast the machine trains. role: 'S'
// server, 'W' worker, 'H' scheduler (id 0); in Chaos also 'A' (add a
// server), 'J' (add a worker) and 'D' (drain server id).
struct ChaosKill {
  char role = 'S';
  int id = 0;
  double after_s = 0;
  // --pause: SIGSTOP instead of SIGKILL, and SIGCONT this many seconds
  // later (0: a kill).
  double pause_s = 0;
  // >= 0: due when the job has done this many epochs of work (after_s is
  // then unused); -1: due after_s seconds after the cluster is ready.
  double after_epochs = -1;

  // "S[1]", "W[0]", "H": the child's name in ps_launch's output.
  std::string Target() const;
  // When it is due as written on the command line: "10", "2.5", "e2".
  std::string When() const;
  bool operator==(const ChaosKill&) const = default;
};
// Parses "S1@10", "W0@2.5", "H@5" (also "H0@5"), and "S1@e2" (after two
// epochs of work). INVALID_ARGUMENT naming the flag (--kill) for anything
// else.
absl::StatusOr<ChaosKill> ParseKillSpec(absl::string_view spec,
                                        absl::string_view flag = "--kill");
// Parses the time of --add-server/--add-worker: "SECONDS" or "eEPOCHS"
// into a ChaosKill of `role` ('A' or 'J').
absl::StatusOr<ChaosKill> ParseChaosWhen(absl::string_view when, char role,
                                         absl::string_view flag);

// What ps_launch was asked to do; see launch_main.cc for the flags.
struct LaunchOptions {
  std::string config_path;             // --config (required)
  std::vector<std::string> overrides;  // "section.field=value", in order
  // --report, passed to the scheduler; empty: <run_dir>/report.json.
  std::string report_path;
  std::string bin_dir;    // where ps_scheduler/ps_server/ps_worker live
  std::string run_dir;    // empty: runs/<timestamp>-<pid>
  double timeout_s = 0;   // 0: no timeout
  bool help = false;      // -h/--help was given
  // Chaos (issue 9): --kill (repeatable) and --restart[=DELAY_S]: after a
  // kill, a replacement of the same role starts restart_delay_s later.
  std::vector<ChaosKill> kills;
  // --pause ROLE[ID]@SECONDS:FOR_S (repeatable): SIGSTOP that process, and
  // SIGCONT it FOR_S seconds later: a node that hangs (a long GC or VM
  // pause, a partition that leaves its connections open) rather than dies.
  std::vector<ChaosKill> pauses;
  bool restart = false;
  double restart_delay_s = 1;
  // Elasticity (issue 9): --add-server SECONDS starts one more server (a new
  // node, "S+1", ...) that long after the cluster is ready; --drain S1@10
  // drains server 1 then (the Drain RPC, like ps_status --drain 1).
  // Either also at eEPOCHS (see ChaosKill); role 'A'.
  std::vector<ChaosKill> add_servers;
  // --add-worker SECONDS: one more worker ("W+1", ...) joins likewise;
  // role 'J'.
  std::vector<ChaosKill> add_workers;
  std::vector<ChaosKill> drains;  // role 'S'
  // --check: validate the config and flags (CheckLaunch) and exit, starting
  // nothing; --check=resources also checks the data files and model_dir.
  bool check = false;
  bool check_resources = false;
  // --plot FILE (issue 11): after the job, the report's loss curves drawn
  // into FILE (PNG) by plot_report.py (next to ps_launch) with matplotlib.
  std::string plot_path;
  // --tune[=TRIALS] (issue 12; deploy/tune.h): search the optimizer's step
  // size and regularisation on a validation split, write the best config
  // to --tune-out (default RUN_DIR/tuned.yaml), then train with it.
  // tune_trials 0: the default grid; N > 0: N seeded random trials.
  // --tune-folds N: each setting is scored on N validation splits (seeds).
  bool tune = false;
  int tune_trials = 0;
  int tune_folds = 2;
  std::string tune_out;

  // Not flags; tests shorten them.
  absl::Duration kill_grace = absl::Seconds(3);  // SIGTERM -> SIGKILL
  // Once the scheduler has exited 0, how long the others may take to exit.
  absl::Duration shutdown_grace = absl::Seconds(30);
};

// --plot: a Python that imports matplotlib ($PS_PYTHON, else python3 on
// PATH, else /usr/bin/python3, Debian's) and plot_report.py in `bin_dir`;
// FAILED_PRECONDITION saying what to install otherwise.
struct Plotter {
  std::string python;
  std::string script;
};
absl::StatusOr<Plotter> FindPlotter(const std::string& bin_dir);
// Runs `plotter` on `report_path` into `png`; the error names the exit
// status (the script prints why to stderr).
absl::Status PlotReport(const Plotter& plotter, const std::string& report_path,
                        const std::string& png);

// The scheduler's verdict: the "error" of the JSON report at `report_path`
// (proto/report.proto) when its "status" is "failed"; nullopt when the file
// is missing, is not a report, or the job did not fail.
std::optional<std::string> FailedJobError(const std::string& report_path);

// Issue 9: whether the death of child `child_name` ("W[1]") is left to the
// cluster (the scheduler drops the worker and hands its work units to the
// others) instead of stopping the job: true for workers of every model that
// trains on work units (all but mlp).
bool ClusterHandlesWorkerDeath(const JobConfig& config,
                               const std::string& child_name);

// Parses ps_launch's arguments (argv without the program name). Flags take
// "--flag value" or "--flag=value". --servers/--workers/--mode/--tau become
// overrides (cluster.num_servers, cluster.num_workers, consistency.mode,
// consistency.tau) in the order given, interleaved with --set. Unknown or
// malformed flags: INVALID_ARGUMENT naming the flag.
absl::StatusOr<LaunchOptions> ParseLaunchArgs(
    const std::vector<std::string>& args);

// The usage text printed for --help and after a flag error.
std::string LaunchUsage();

// Loads options.config_path, applies options.overrides in order and
// validates (LoadJobConfigWithOverrides: relative paths of the file resolve
// against its folder, those of overrides against the current directory).
// Errors (INVALID_ARGUMENT/NOT_FOUND/PERMISSION_DENIED) name the file or
// field.
absl::StatusOr<JobConfig> ResolveJobConfig(const LaunchOptions& options);

// Everything ps_launch checks before it starts a process, starting none:
// the config (ResolveJobConfig), cluster.scheduler as host:port, and the
// --kill/--drain targets against the job's servers and workers; with
// `check_resources` also CheckJobResources (data files exist and can be
// read, output.model_dir can be written: it is created). Returns the
// resolved config; errors name the file, field or flag (INVALID_ARGUMENT,
// or the codes of ResolveJobConfig and CheckJobResources).
absl::StatusOr<JobConfig> CheckLaunch(const LaunchOptions& options,
                                      bool check_resources);

// A 128-bit random token as 32 lowercase hex characters.
std::string RandomHexToken();

// The directory holding the running executable ("" when unknown).
std::string SelfExeDir();

// Runs one job. Usable once.
class Launcher {
 public:
  // `out` receives every line ps_launch prints (children's lines with their
  // prefix, "H ", "S[0] ", "W[1] ", and the launcher's own, "ps_launch: ").
  // It is called from more than one thread, but never concurrently.
  using Output = std::function<void(absl::string_view line)>;
  Launcher(LaunchOptions options, Output out);

  // Resolves the config, picks the scheduler port, writes
  // RUN_DIR/job.yaml, starts the scheduler, the servers and the workers, and
  // supervises them until the job ends. Returns the exit code for ps_launch:
  // 0 when every child exited 0; kExitUsage for a config/flag problem,
  // including a failed CheckJobResources (missing or unreadable data file,
  // unwritable or full model_dir), found before anything is started;
  // kExitSetupError when the run dir, job.yaml or a child cannot be set up;
  // the first failing child's ShellCode(); kExitTimeout after --timeout_s;
  // 1 when the scheduler exited 0 but others were still running
  // options.shutdown_grace later, or when its report says the job failed;
  // The error printed is the first real one: the scheduler's (from its
  // report) when it had failed the job before a child failed, else the
  // first failing child's exit.
  // 128+signal when `*stop` (may be null; may be set from a signal handler)
  // becomes a signal number. Children are all gone when it returns.
  // Chaos (issue 9): options.kills are carried out counting from the
  // scheduler's "cluster ready" line, each printed with its time; the exit
  // of a process killed that way does not stop the job (the cluster
  // decides: today the scheduler fails the job; each kill and restart is
  // also a JSON line of RUN_DIR/chaos.jsonl), and with options.restart a
  // replacement is started (servers and workers without their id, as new
  // nodes named e.g. "S[1]+1"; the scheduler with its own arguments).
  int Run(const std::atomic<int>* stop = nullptr);

  // ps_launch --check: CheckLaunch (with the resources when
  // options.check_resources), then prints "ps_launch: config ok: ..." and
  // returns kExitOk, or prints the error and returns kExitUsage. Starts
  // nothing and writes nothing (but model_dir, with check_resources).
  int Check();

  // Valid after Run: the run directory and the scheduler's address.
  const std::string& run_dir() const { return run_dir_; }
  const std::string& scheduler_address() const { return scheduler_address_; }

 private:
  void Say(absl::string_view line);  // prints "ps_launch: <line>"
  void Emit(absl::string_view line);

  const LaunchOptions options_;
  absl::Mutex out_mu_;
  Output out_ ABSL_GUARDED_BY(out_mu_);
  std::string run_dir_;
  std::string scheduler_address_;
};

}  // namespace ps
