#include "common/net.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <random>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace ps {

absl::StatusOr<int> PickFreePort(const std::string& host) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return absl::InternalError(strerror(errno));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = 0;
  if (inet_pton(AF_INET, host.c_str(), &addr.sin_addr) != 1) {
    close(fd);
    return absl::InvalidArgumentError(absl::StrCat("not an IPv4 address: ", host));
  }
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    std::string err = strerror(errno);
    close(fd);
    return absl::UnavailableError(absl::StrCat("bind ", host, ": ", err));
  }
  socklen_t len = sizeof(addr);
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  int port = ntohs(addr.sin_port);
  close(fd);
  return port;
}

namespace {

// Whether `port` can be bound on `host` now (the socket is closed again).
bool CanBind(const std::string& host, int port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return false;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  bool ok = inet_pton(AF_INET, host.c_str(), &addr.sin_addr) == 1 &&
            bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
  close(fd);
  return ok;
}

}  // namespace

absl::StatusOr<int> PickPortBelowEphemeral(const std::string& host) {
  int lo = 32768;  // the kernel's default
  std::ifstream range("/proc/sys/net/ipv4/ip_local_port_range");
  int hi = 0;
  if (!(range >> lo >> hi)) lo = 32768;
  // Ports [lo / 2, lo): 16384-32767 with the default range.
  const int first = std::max(1024, lo / 2);
  if (lo < 2048 || first >= lo) return PickFreePort(host);
  std::random_device seed;
  std::mt19937 rng(seed());
  std::uniform_int_distribution<int> pick(first, lo - 1);
  for (int attempt = 0; attempt < 64; ++attempt) {
    const int port = pick(rng);
    if (CanBind(host, port)) return port;
  }
  return PickFreePort(host);
}

absl::StatusOr<int> ReservePortBelowEphemeral(const std::string& host) {
  for (int attempt = 0; attempt < 16; ++attempt) {
    PS_ASSIGN_OR_RETURN(const int port, PickPortBelowEphemeral(host));
    const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return absl::InternalError(strerror(errno));
    const int yes = 1;
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(port));
    if (setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes)) == 0 &&
        inet_pton(AF_INET, host.c_str(), &addr.sin_addr) == 1 &&
        bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0) {
      return port;  // fd kept open, on purpose, until this process exits
    }
    close(fd);  // taken between the pick and the hold: pick again
  }
  return absl::UnavailableError(
      absl::StrCat("bind ", host, ": 16 picked ports could not be held"));
}

absl::Status SplitHostPort(const std::string& address, std::string* host,
                           int* port) {
  auto colon = address.rfind(':');
  if (colon == std::string::npos || colon == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("address must be host:port, got '", address, "'"));
  }
  *host = address.substr(0, colon);
  if (!absl::SimpleAtoi(address.substr(colon + 1), port) || *port < 0 ||
      *port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("bad port in address '", address, "'"));
  }
  return absl::OkStatus();
}

}  // namespace ps
