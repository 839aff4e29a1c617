#include "engine/liveness.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>
#include <stdexcept>

#include "core/common.h"

namespace ringreduce {
namespace {

// "<address> <port>" as a numeric socket address; null when it does not parse.
struct addrinfo* resolve(const std::string& address, const std::string& port) {
  struct addrinfo hints {};
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICHOST | AI_NUMERICSERV;
  struct addrinfo* found = nullptr;
  return ::getaddrinfo(address.c_str(), port.c_str(), &hints, &found) == 0 ? found : nullptr;
}

// What a finished connect's error says about the process behind the port.
Liveness verdict(int error) {
  if (error == 0) return Liveness::Exists;
  return error == ECONNREFUSED || error == ECONNRESET ? Liveness::Gone : Liveness::Silent;
}

}  // namespace

LivenessPort::LivenessPort() {
  // Dual-stack where IPv6 exists (IPv4 peers arrive as mapped addresses), else IPv4 only.
  fd_ = ::socket(AF_INET6, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  struct sockaddr_storage any {};
  socklen_t length = 0;
  if (fd_ >= 0) {
    const int off = 0;
    ::setsockopt(fd_, IPPROTO_IPV6, IPV6_V6ONLY, &off, sizeof(off));
    auto* six = reinterpret_cast<struct sockaddr_in6*>(&any);
    six->sin6_family = AF_INET6;
    six->sin6_addr = in6addr_any;
    length = sizeof(*six);
  } else {
    fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    auto* four = reinterpret_cast<struct sockaddr_in*>(&any);
    four->sin_family = AF_INET;
    four->sin_addr.s_addr = htonl(INADDR_ANY);
    length = sizeof(*four);
  }
  struct sockaddr_storage bound {};
  socklen_t bound_length = sizeof(bound);
  if (fd_ < 0 || ::bind(fd_, reinterpret_cast<struct sockaddr*>(&any), length) != 0 || ::listen(fd_, SOMAXCONN) != 0 ||
      ::getsockname(fd_, reinterpret_cast<struct sockaddr*>(&bound), &bound_length) != 0) {
    const int error = errno;
    if (fd_ >= 0) ::close(fd_);
    throw std::runtime_error(detail::concat("ringreduce: cannot listen on a TCP port for liveness probes: ",
                                            std::strerror(error)));
  }
  port_ = ntohs(bound.ss_family == AF_INET6 ? reinterpret_cast<struct sockaddr_in6*>(&bound)->sin6_port
                                            : reinterpret_cast<struct sockaddr_in*>(&bound)->sin_port);
}

LivenessPort::~LivenessPort() {
  if (fd_ >= 0) ::close(fd_);
}

void LivenessPort::drain() {
  if (fd_ < 0) return;
  for (int waiting; (waiting = ::accept4(fd_, nullptr, nullptr, SOCK_CLOEXEC)) >= 0;) ::close(waiting);
}

std::string own_network() {
  std::ifstream boot("/proc/sys/kernel/random/boot_id");
  std::string boot_id;
  std::getline(boot, boot_id);
  struct stat info {};
  if (boot_id.empty() || ::stat("/proc/self/ns/net", &info) != 0) return "";  // unknown: shares with nobody
  return detail::concat(boot_id, "/", static_cast<std::uint64_t>(info.st_ino));
}

std::vector<Liveness> probe(const std::vector<std::string>& endpoints, std::chrono::milliseconds wait) {
  std::vector<Liveness> found(endpoints.size(), Liveness::Silent);
  std::vector<struct pollfd> pending;
  std::vector<std::size_t> pending_index;
  for (std::size_t i = 0; i < endpoints.size(); ++i) {
    std::istringstream parts(endpoints[i]);
    std::string address, port;
    if (!(parts >> address >> port)) continue;
    struct addrinfo* where = resolve(address, port);
    if (where == nullptr) continue;
    const int fd = ::socket(where->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    const int connected = fd < 0 ? -1 : ::connect(fd, where->ai_addr, where->ai_addrlen);
    const int error = connected == 0 ? 0 : errno;
    ::freeaddrinfo(where);
    if (fd >= 0 && connected != 0 && error == EINPROGRESS) {
      pending.push_back({fd, POLLOUT, 0});
      pending_index.push_back(i);
      continue;
    }
    if (fd >= 0) {
      found[i] = verdict(error);
      ::close(fd);
    }
  }
  const auto deadline = std::chrono::steady_clock::now() + wait;
  std::size_t open = pending.size();
  while (open > 0) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) break;
    if (::poll(pending.data(), pending.size(), static_cast<int>(left.count())) < 0) {
      if (errno == EINTR) continue;
      break;
    }
    for (std::size_t k = 0; k < pending.size(); ++k) {
      if (pending[k].fd < 0 || pending[k].revents == 0) continue;
      int error = 0;
      socklen_t length = sizeof(error);
      ::getsockopt(pending[k].fd, SOL_SOCKET, SO_ERROR, &error, &length);
      found[pending_index[k]] = verdict(error);
      ::close(pending[k].fd);
      pending[k].fd = -1;  // poll skips negative descriptors
      --open;
    }
  }
  for (const struct pollfd& still : pending) {
    if (still.fd >= 0) ::close(still.fd);
  }
  return found;
}

}  // namespace ringreduce
