#include "cuda/event_completion.h"

namespace ringreduce {
namespace cuda {

void EventCompletion::attach() { queue_.api().attach_thread(queue_.device()); }

std::shared_ptr<void> EventCompletion::mark() { return queue_.events().record(queue_.lane_stream(0)); }

bool EventCompletion::reached(const std::shared_ptr<void>& marker) {
  Failure why = nullptr;
  const EventState state = queue_.api().query(static_cast<Event>(marker.get()), &why);
  if (state == EventState::Failed) device_error_ = why;
  return state == EventState::Done;
}

std::optional<AbortNotice> EventCompletion::failure() {
  if (device_error_ == nullptr) return std::nullopt;
  return AbortNotice{AbortNotice::Kind::Failure, detail::concat("ringreduce: ", who_, ": the GPU reported ", device_error_,
                                                                " while running a collective")};
}

}  // namespace cuda
}  // namespace ringreduce
