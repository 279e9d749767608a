#include "common/clock.h"

namespace ps {
namespace {
class RealClock : public Clock {
 public:
  absl::Time Now() const override { return absl::Now(); }
};
}  // namespace

Clock* Clock::Real() {
  static RealClock* clock = new RealClock();
  return clock;
}

}  // namespace ps
