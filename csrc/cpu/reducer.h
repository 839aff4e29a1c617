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

// The reducer of a ring that carries `count` float32 values compressed: the ring runs on `wire`,
// their compressed copy (elements of the codec's), and a reduction into the wire takes the arriving
// partial sums, widens them, adds this rank's own float32 values at the same place in `exact` and
// rounds once. So each hop rounds a partial sum once, and a rank's own contribution is never
// rounded on its own before it is added. SUM and AVG only. With a `residual` (SUM only), each
// reduction also adds what its rounding dropped there (keep_rounding_error).
class LinkReducer final : public Reducer {
 public:
  LinkReducer(Compression compression, ReduceOp op, int world, const void* wire, const float* exact, std::size_t count,
              float* residual = nullptr);
  std::size_t element_size() const override { return codec_.element_bytes; }
  void reduce(void* dst, const void* src, std::size_t count, bool last) const override;
  void reduce_copy(void* dst, const void* src, void* copy, std::size_t count, bool last) const override;

 private:
  const LinkCodec& codec_;
  bool divides_;  // AVG: the last reduction divides by the world size
  int world_;
  const unsigned char* wire_;
  const float* exact_;
  std::size_t count_;
  float* residual_;  // null: errors dropped
};

// residual[i] += (exact[i] + arriving[i] widened) - wire[i] widened for i < count values: what
// rounding that sum into `wire` lost (`arriving` null: exact alone was rounded). Error feedback
// keeps it, to add it to the next step's values.
void keep_rounding_error(const LinkCodec& codec, float* residual, const float* exact, const void* arriving,
                         const void* wire, std::size_t count);

}  // namespace ringreduce
