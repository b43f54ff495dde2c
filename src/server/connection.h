#pragma once
// Whether the client of a request is still there. cpp-httplib 0.11 (Debian 12) gives a
// handler the request's addresses but not its socket, so the socket is found among the
// process's descriptors by its two endpoints: the one whose local and peer addresses are the
// request's. While the handler runs, cpp-httplib keeps that socket open, so the descriptor
// stays the request's.
#include <string>

namespace klein {

class ClientConnection {
 public:
  // -1 (never "gone") when no socket of this process has these endpoints.
  ClientConnection(const std::string& local_addr, int local_port, const std::string& remote_addr,
                   int remote_port);
  // True once the peer has closed its end (or the connection failed). Costs one poll().
  bool gone() const;
  bool found() const { return fd_ >= 0; }

 private:
  int fd_ = -1;
};

}  // namespace klein
