#include "common/net.h"

#include <fstream>

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

}  // namespace
}  // namespace ps
