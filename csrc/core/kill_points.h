// Test-only deaths at named points of an algorithm, so that tests can land a crash where the
// survivors disagree about one call: one of them finished it, another did not. Disarmed, a point
// costs one relaxed atomic load.
#pragma once

namespace ringreduce {

enum class KillPoint : int {
  None = 0,
  // In a ring all-reduce, once this rank has passed its fully reduced chunk on to the next rank and
  // before it takes any of the all-gather: the rank after it cannot finish, the one two after can.
  RingAllGather = 1,
};

// Arms `point`: this process SIGKILLs itself the (skip + 1)-th time it reaches it from now on.
void arm_kill_point(KillPoint point, int skip);

// Where an algorithm reaches `point`.
void reach_kill_point(KillPoint point);

}  // namespace ringreduce
