// algorithm="auto": the all-reduce algorithm for a call, chosen by its bytes, world size and
// transport from a table. `python -m ringreduce.tune` measures the table on the user's machine;
// ringreduce/tuning.py loads it (or the shipped defaults) and hands it over here.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/header.h"

namespace ringreduce {

// One line of the table: all-reduces on `transport` of at most `up_to_bytes` run `algorithm`.
// The lines of one transport and world size are read in ascending `up_to_bytes`.
struct AutoRule {
  std::string transport;
  int world = 0;  // the world size the line was measured at
  std::uint64_t up_to_bytes = 0;
  Algorithm algorithm = Algorithm::Ring;
};

// Replaces the table; `source` says where it came from (a file, or the shipped defaults).
void set_auto_table(std::vector<AutoRule> rules, std::string source);

// Hears a sentence the first time each line of the table is chosen (RINGREDUCE_DEBUG=INFO); null
// turns it off. A plain function, never a closure: the logger lives in a global, which is destroyed
// after the Python interpreter, so it must hold nothing of Python's.
using AutoLogger = void (*)(const std::string& sentence);
void set_auto_logger(AutoLogger logger);

// The algorithm for `bytes` on `transport` with `world` ranks. The lines measured at the largest
// world size not above `world` apply (the smallest measured, when all are above it); the first
// line that covers `bytes` wins, and ring where none does. One-shot is for host memory only: on a
// device it gives way to ring.
Algorithm choose_algorithm(const std::string& transport, int world, std::uint64_t bytes, bool host_memory);

}  // namespace ringreduce
