// ps_launch: runs a whole parameter-server job on this machine. See
// LaunchUsage() in launcher.cc for the flags.
//
// Flags are parsed by ParseLaunchArgs rather than absl flags: --set is
// repeatable and its order (interleaved with --servers etc.) matters.
#include <csignal>
#include <cstdio>
#include <string>
#include <vector>

#include "deploy/launcher.h"
#include "deploy/tune.h"

namespace {

std::atomic<int> g_stop_signal{0};
static_assert(std::atomic<int>::is_always_lock_free);

extern "C" void OnStopSignal(int sig) { g_stop_signal.store(sig); }

}  // namespace

int main(int argc, char** argv) {
  absl::StatusOr<ps::LaunchOptions> options =
      ps::ParseLaunchArgs(std::vector<std::string>(argv + 1, argv + argc));
  if (!options.ok()) {
    std::fprintf(stderr, "ps_launch: %s\n\n%s",
                 std::string(options.status().message()).c_str(),
                 ps::LaunchUsage().c_str());
    return ps::kExitUsage;
  }
  if (options->help) {
    std::fputs(ps::LaunchUsage().c_str(), stdout);
    return 0;
  }
  auto print = [](absl::string_view line) {
    std::fwrite(line.data(), 1, line.size(), stdout);
    std::fputc('\n', stdout);
    std::fflush(stdout);
  };
  if (options->check) {  // validate only, start nothing
    return ps::Launcher(*std::move(options), print).Check();
  }
  if (options->bin_dir.empty()) options->bin_dir = ps::SelfExeDir();

  struct sigaction sa = {};
  sa.sa_handler = OnStopSignal;
  sa.sa_flags = SA_RESTART;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGHUP, &sa, nullptr);
  // A closed stdout (| head) must not kill the launcher before it has
  // stopped its children; children get SIGPIPE back to default.
  std::signal(SIGPIPE, SIG_IGN);

  if (options->tune) return ps::RunTune(*options, print, &g_stop_signal);
  ps::Launcher launcher(*std::move(options), print);
  return launcher.Run(&g_stop_signal);
}
