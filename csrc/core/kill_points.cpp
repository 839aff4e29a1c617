#include "core/kill_points.h"

#include <signal.h>
#include <unistd.h>

#include <atomic>

namespace ringreduce {

namespace {
std::atomic<int> armed{static_cast<int>(KillPoint::None)};
std::atomic<int> passes_left{0};
}  // namespace

void arm_kill_point(KillPoint point, int skip) {
  passes_left.store(skip);
  armed.store(static_cast<int>(point));
}

void reach_kill_point(KillPoint point) {
  if (armed.load(std::memory_order_relaxed) != static_cast<int>(point)) return;
  if (passes_left.fetch_sub(1) > 0) return;
  ::kill(::getpid(), SIGKILL);
}

}  // namespace ringreduce
