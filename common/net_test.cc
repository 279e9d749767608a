#include "common/net.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <fstream>
#include <set>

#include "gtest/gtest.h"

namespace ps {
namespace {

// Regression (CI: a worker's metrics port, picked by ps_launch from the
// ephemeral range, was taken by an outgoing connection before the worker
// bound it): launcher ports come from below that range.
TEST(Net, PickedPortsAreBelowTheEphemeralRange) {
  int lo = 0, hi = 0;
  std::ifstream range("/proc/sys/net/ipv4/ip_local_port_range");
  if (!(range >> lo >> hi) || lo < 2048) {
    GTEST_SKIP() << "/proc/sys/net/ipv4/ip_local_port_range unreadable or "
                    "starting below 2048: no ephemeral range to stay below";
  }
  for (int i = 0; i < 20; ++i) {
    absl::StatusOr<int> port = PickPortBelowEphemeral();
    ASSERT_TRUE(port.ok()) << port.status();
    EXPECT_GE(*port, lo / 2);
    EXPECT_LT(*port, lo);
  }
}

// A socket on 127.0.0.1:port, bound with SO_REUSEADDR or not, listening
// if asked; -1 when bind or listen fails.
int Bind(int port, bool reuse, bool listen_too) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return -1;
  const int yes = 1;
  if (reuse) setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  inet_pton(AF_INET, "127.0.0.1", &addr.sin_addr);
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      (listen_too && listen(fd, 4) != 0)) {
    close(fd);
    return -1;
  }
  return fd;
}

// A held port (a launcher's pick for a child) is never picked again, here
// or by another process, and a plain bind fails on it; the node it is for
// (SO_REUSEADDR, as gRPC and the metrics endpoint bind) listens on it and
// takes its connections; a second listener then fails, as without the
// hold.
TEST(Net, ReservedPortIsHeldForTheNodeItIsFor) {
  std::set<int> held;
  for (int i = 0; i < 8; ++i) {
    absl::StatusOr<int> port = ReservePortBelowEphemeral();
    ASSERT_TRUE(port.ok()) << port.status();
    EXPECT_TRUE(held.insert(*port).second) << *port << " held twice";
  }
  const int port = *held.begin();
  EXPECT_EQ(Bind(port, /*reuse=*/false, /*listen_too=*/false), -1);
  for (int i = 0; i < 64; ++i) {
    absl::StatusOr<int> picked = PickPortBelowEphemeral();
    ASSERT_TRUE(picked.ok()) << picked.status();
    EXPECT_EQ(held.count(*picked), 0u) << *picked << " picked while held";
  }
  const int node = Bind(port, /*reuse=*/true, /*listen_too=*/true);
  ASSERT_GE(node, 0) << "the node could not listen on its held port";
  const int client = Bind(0, false, false);
  ASSERT_GE(client, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  inet_pton(AF_INET, "127.0.0.1", &addr.sin_addr);
  ASSERT_EQ(connect(client, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)),
            0);
  const int accepted = accept(node, nullptr, nullptr);
  EXPECT_GE(accepted, 0) << "the connection did not reach the node";
  EXPECT_EQ(Bind(port, /*reuse=*/true, /*listen_too=*/true), -1)
      << "a second listener shared the node's port";
  if (accepted >= 0) close(accepted);
  close(client);
  close(node);
}

}  // namespace
}  // namespace ps
