// Host reduction loops for every dtype and op.
#pragma once

#include <cstdint>
#include <memory>

#include "core/reducer.h"
#include "cpu/loops.h"

namespace ringreduce {

// Throws std::invalid_argument for AVG on an integer dtype (torch refuses it too).
std::unique_ptr<Reducer> make_cpu_reducer(DType dtype, ReduceOp op, int world);

// The fastest loops this CPU has for `compression` (not None).
const LinkCodec& link_codec(Compression compression);

// The reducer of a ring that carries float32 values compressed: the ring runs on `wire`, a buffer of
// 16-bit values, and a reduction into wire[i] takes the arriving partial sum, widens it, adds this
// rank's own float32 value exact[i] and rounds once. So each hop rounds a partial sum once, and a
// rank's own contribution is never rounded on its own before it is added. SUM and AVG only.
class LinkReducer final : public Reducer {
 public:
  LinkReducer(Compression compression, ReduceOp op, int world, const std::uint16_t* wire, const float* exact);
  void reduce(void* dst, const void* src, std::size_t count, bool last) const override;
  void reduce_copy(void* dst, const void* src, void* copy, std::size_t count, bool last) const override;

 private:
  const LinkCodec& codec_;
  bool divides_;  // AVG: the last reduction divides by the world size
  int world_;
  const std::uint16_t* wire_;
  const float* exact_;
};

}  // namespace ringreduce
