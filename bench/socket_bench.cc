// socket_bench: how fast one stream moves bytes between two processes on
// this host, over loopback TCP and over an abstract Unix-domain socket (the
// data plane's two transports, transport/data_plane.h). A child writes
// blocks of --block bytes for --seconds; the parent reads them; it prints
// Gbit/s and the CPU seconds per GB of both processes.
//
//   socket_bench [--block 4194304] [--seconds 3] [--sndbuf 0]
//
// A tool, not a test (docs/benchmarks-history.md, "The same-host socket").
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace {

double CpuSeconds(int who) {
  rusage u{};
  getrusage(who, &u);
  return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec) / 1e6;
}

// Writes `block`-byte blocks to `fd` for `seconds`, then exits.
[[noreturn]] void Write(int fd, size_t block, double seconds) {
  std::vector<char> buf(block, 2);
  const auto t0 = std::chrono::steady_clock::now();
  while (std::chrono::duration<double>(std::chrono::steady_clock::now() - t0)
             .count() < seconds) {
    for (size_t off = 0; off < block;) {
      const ssize_t w = send(fd, buf.data() + off, block - off, MSG_NOSIGNAL);
      if (w <= 0) _exit(1);
      off += static_cast<size_t>(w);
    }
  }
  close(fd);
  _exit(0);
}

// One run: listens, forks a writer that connects, reads until it closes.
bool Run(bool local, size_t block, double seconds, int sndbuf) {
  sockaddr_storage addr{};
  socklen_t len = 0;
  int lfd = -1;
  if (local) {
    auto* a = reinterpret_cast<sockaddr_un*>(&addr);
    a->sun_family = AF_UNIX;
    const std::string name = "ps-socket-bench-" + std::to_string(getpid());
    std::memcpy(a->sun_path + 1, name.data(), name.size());  // abstract
    len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 +
                                 name.size());
    lfd = socket(AF_UNIX, SOCK_STREAM, 0);
  } else {
    auto* a = reinterpret_cast<sockaddr_in*>(&addr);
    a->sin_family = AF_INET;
    a->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    len = sizeof(sockaddr_in);
    lfd = socket(AF_INET, SOCK_STREAM, 0);
  }
  if (lfd < 0 || bind(lfd, reinterpret_cast<sockaddr*>(&addr), len) != 0 ||
      listen(lfd, 1) != 0 ||
      getsockname(lfd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    std::perror("listen");
    return false;
  }
  const double cpu0 = CpuSeconds(RUSAGE_SELF) + CpuSeconds(RUSAGE_CHILDREN);
  const pid_t child = fork();
  if (child == 0) {
    const int fd = socket(addr.ss_family, SOCK_STREAM, 0);
    const int one = 1;
    if (!local) setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    if (sndbuf > 0) {
      setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &sndbuf, sizeof(sndbuf));
    }
    if (connect(fd, reinterpret_cast<sockaddr*>(&addr), len) != 0) _exit(1);
    Write(fd, block, seconds);
  }
  const int fd = accept(lfd, nullptr, nullptr);
  std::vector<char> buf(block);
  size_t total = 0;
  const auto t0 = std::chrono::steady_clock::now();
  for (;;) {
    const ssize_t r = recv(fd, buf.data(), buf.size(), 0);
    if (r <= 0) break;
    total += static_cast<size_t>(r);
  }
  const double wall =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0)
          .count();
  int status = 0;
  waitpid(child, &status, 0);
  close(fd);
  close(lfd);
  const double cpu =
      CpuSeconds(RUSAGE_SELF) + CpuSeconds(RUSAGE_CHILDREN) - cpu0;
  std::printf("%-5s block %8zu: %6.1f Gbit/s, %.3f CPU s/GB\n",
              local ? "unix" : "tcp", block,
              static_cast<double>(total) * 8 / wall / 1e9,
              cpu / (static_cast<double>(total) / 1e9));
  return WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

}  // namespace

int main(int argc, char** argv) {
  size_t block = size_t{4} << 20;
  double seconds = 3;
  int sndbuf = 0;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--block") {
      block = std::strtoull(argv[i + 1], nullptr, 10);
    } else if (flag == "--seconds") {
      seconds = std::atof(argv[i + 1]);
    } else if (flag == "--sndbuf") {
      sndbuf = std::atoi(argv[i + 1]);
    } else {
      std::fprintf(stderr, "unknown flag %s\n", argv[i]);
      return 2;
    }
  }
  if (block == 0 || seconds <= 0) {
    std::fprintf(stderr, "--block and --seconds must be positive\n");
    return 2;
  }
  const bool ok = Run(false, block, seconds, sndbuf) &&
                  Run(true, block, seconds, sndbuf);
  return ok ? 0 : 1;
}
