// A stand-in for ps_scheduler/ps_server/ps_worker in launcher tests.
//
// Flags (in any order; unknown ones such as --config/--port/--scheduler are
// ignored, --id is remembered):
//   --print TEXT        a line on stdout (repeatable)
//   --stderr TEXT       a line on stderr (repeatable)
//   --partial TEXT      TEXT on stdout without a newline, just before exiting
//   --print-pid         "pid=<pid>" on stdout
//   --print-ready       the scheduler's "cluster ready: ..." line (chaos)
//   --print-env NAME    "NAME=<value>" on stdout
//   --echo-args         "args: <argv joined by spaces>" on stdout
//   --spawn-grandchild  forks a process that sleeps forever; "grandchild=<pid>"
//   --ignore-sigterm    SIGTERM is ignored (set up before anything is printed)
//   --sleep-ms M        sleeps M ms after printing
//   --kill-self SIG     raises SIG at the end
//   --exit-code N       exit status (default 0)
// More flags come from the environment, so a test driving the real launcher
// can steer one node: FAKE_NODE_FLAGS_<program name> and then
// FAKE_NODE_FLAGS_<program name>_<id> (_new for a node started without
// --id), split on spaces (e.g. FAKE_NODE_FLAGS_ps_worker_1="--exit-code 3").
#include <fstream>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace {

void Line(FILE* f, const std::string& text) {
  std::fputs(text.c_str(), f);
  std::fputc('\n', f);
  std::fflush(f);
}

void AppendEnvFlags(const std::string& var, std::vector<std::string>* args) {
  const char* v = std::getenv(var.c_str());
  if (v == nullptr) return;
  std::istringstream in(v);
  std::string word;
  while (in >> word) args->push_back(word);
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  std::string program = argv[0];
  program = program.substr(program.rfind('/') + 1);
  std::string id;
  for (size_t i = 0; i + 1 < args.size(); ++i) {
    if (args[i] == "--id") id = args[i + 1];
  }
  AppendEnvFlags("FAKE_NODE_FLAGS_" + program, &args);
  // A node started without --id (a --restart replacement): _new.
  AppendEnvFlags("FAKE_NODE_FLAGS_" + program + "_" + (id.empty() ? "new" : id),
                 &args);

  for (const auto& a : args) {
    if (a == "--ignore-sigterm") signal(SIGTERM, SIG_IGN);
  }
  int exit_code = 0, sleep_ms = 0, kill_self = 0;
  std::string partial;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    const bool has_value = i + 1 < args.size();
    if (a == "--print" && has_value) {
      Line(stdout, args[++i]);
    } else if (a == "--stderr" && has_value) {
      Line(stderr, args[++i]);
    } else if (a == "--partial" && has_value) {
      partial = args[++i];
    } else if (a == "--print-ready") {
      Line(stdout, "[info] cluster ready: fake");
    } else if (a == "--print-pid") {
      Line(stdout, "pid=" + std::to_string(getpid()));
    } else if (a == "--print-env" && has_value) {
      const char* v = std::getenv(args[i + 1].c_str());
      Line(stdout, args[i + 1] + "=" + (v ? v : "<unset>"));
      ++i;
    } else if (a == "--echo-args") {
      std::string line = "args:";
      for (int j = 1; j < argc; ++j) line += std::string(" ") + argv[j];
      Line(stdout, line);
    } else if (a == "--spawn-grandchild") {
      pid_t pid = fork();
      if (pid == 0) {
        for (;;) pause();
      }
      Line(stdout, "grandchild=" + std::to_string(pid));
    } else if (a == "--sleep-ms" && has_value) {
      sleep_ms = std::atoi(args[++i].c_str());
    } else if (a == "--kill-self" && has_value) {
      kill_self = std::atoi(args[++i].c_str());
    } else if (a == "--write-failed-report" && has_value) {
      // A scheduler's report of a failed job, to the --report path.
      std::string path;
      for (int j = 1; j + 1 < argc; ++j) {
        if (std::string(argv[j]) == "--report") path = argv[j + 1];
      }
      std::ofstream(path) << "{\n  \"status\": \"failed\",\n  \"error\": \""
                          << args[++i] << "\",\n  \"phase\": \"failed\"\n}\n";
    } else if (a == "--exit-code" && has_value) {
      exit_code = std::atoi(args[++i].c_str());
    }
  }
  if (sleep_ms > 0) {
    std::this_thread::sleep_for(std::chrono::milliseconds(sleep_ms));
  }
  if (!partial.empty()) {
    std::fputs(partial.c_str(), stdout);
    std::fflush(stdout);
  }
  if (kill_self != 0) raise(kill_self);
  return exit_code;
}
