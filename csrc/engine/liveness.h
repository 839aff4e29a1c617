// Whether a process that cannot see another's pid still exists, asked of that process's kernel.
// Each member listens on a TCP port of its own: a connection the kernel refuses or resets means the
// process that held the port is gone; one it accepts means the process exists, even stopped (the
// kernel completes the handshake for it); no answer means the host or its link is silent, which
// proves nothing.
#pragma once

#include <chrono>
#include <string>
#include <vector>

namespace ringreduce {

enum class Liveness { Exists, Gone, Silent };

// How long a probe waits for a host's kernel to answer: a round trip is well under a millisecond
// on a LAN (a few on the emulated hosts' 2 Gbit/s links), so a host that has not answered in half
// a second is silent, and the pulse thread is held up for at most this.
constexpr std::chrono::milliseconds kProbeWait{500};

// A listening port on every address of this network namespace, held for the owner's life.
class LivenessPort {
 public:
  LivenessPort();
  ~LivenessPort();
  LivenessPort(const LivenessPort&) = delete;
  LivenessPort& operator=(const LivenessPort&) = delete;

  int port() const { return port_; }
  // Closes the connections probes have left waiting (a stopped process accumulates them).
  void drain();

 private:
  int fd_ = -1;
  int port_ = 0;
};

// Which processes share this one's loopback address: one kernel (its boot id) and one network
// namespace. A peer there is probed on 127.0.0.1; elsewhere on the address it reaches the group by.
std::string own_network();

// Probes every "<address> <port>" at once ("" counts as Silent), waiting at most `wait` in all.
std::vector<Liveness> probe(const std::vector<std::string>& endpoints, std::chrono::milliseconds wait);

}  // namespace ringreduce
