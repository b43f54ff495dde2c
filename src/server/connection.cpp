#include "server/connection.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>

#include <cstdlib>
#include <filesystem>
#include <system_error>

namespace klein {

namespace {

// The address as text and the port of a socket name; false for non-IP sockets.
bool endpoint(const sockaddr_storage& a, std::string& address, int& port) {
  char text[INET6_ADDRSTRLEN] = {};
  if (a.ss_family == AF_INET) {
    const auto& v4 = reinterpret_cast<const sockaddr_in&>(a);
    if (!::inet_ntop(AF_INET, &v4.sin_addr, text, sizeof text)) return false;
    port = ntohs(v4.sin_port);
  } else if (a.ss_family == AF_INET6) {
    const auto& v6 = reinterpret_cast<const sockaddr_in6&>(a);
    if (!::inet_ntop(AF_INET6, &v6.sin6_addr, text, sizeof text)) return false;
    port = ntohs(v6.sin6_port);
  } else {
    return false;
  }
  address = text;
  return true;
}

bool has_endpoints(int fd, const std::string& local_addr, int local_port,
                   const std::string& remote_addr, int remote_port) {
  sockaddr_storage a = {};
  socklen_t size = sizeof a;
  std::string address;
  int port = 0;
  if (::getpeername(fd, reinterpret_cast<sockaddr*>(&a), &size) != 0 ||
      !endpoint(a, address, port) || port != remote_port || address != remote_addr)
    return false;
  size = sizeof a;
  return ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &size) == 0 &&
         endpoint(a, address, port) && port == local_port && address == local_addr;
}

}  // namespace

ClientConnection::ClientConnection(const std::string& local_addr, int local_port,
                                   const std::string& remote_addr, int remote_port) {
  std::error_code error;
  for (const auto& entry : std::filesystem::directory_iterator("/proc/self/fd", error)) {
    const int fd = std::atoi(entry.path().filename().c_str());
    if (fd > 2 && has_endpoints(fd, local_addr, local_port, remote_addr, remote_port)) {
      fd_ = fd;
      return;
    }
  }
}

bool ClientConnection::gone() const {
  if (fd_ < 0) return false;
  pollfd p = {fd_, POLLIN | POLLRDHUP, 0};
  if (::poll(&p, 1, 0) != 1) return false;
  if (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL)) return true;
  // Readable: more bytes of a pipelined request, or the end of the stream.
  char byte;
  return ::recv(fd_, &byte, 1, MSG_PEEK | MSG_DONTWAIT) == 0;
}

}  // namespace klein
