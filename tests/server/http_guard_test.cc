// The HTTP server's listen socket, at the kernel level: a burst of connects arriving while the
// acceptor is busy must find room in the listen backlog (a full backlog drops the SYN, and the
// client waits a second or more, or sees a reset once SYN cookies are in play).
#include "server/http_guard.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <vector>

namespace turbokv::server {
namespace {

// Opens n non-blocking connections to 127.0.0.1:port and returns how many finished their
// handshake within `wait` (nothing accepts them).
int handshakes(int port, int n, std::chrono::milliseconds wait) {
  std::vector<int> fds;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  for (int i = 0; i < n; ++i) {
    const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
    if (fd < 0) break;
    ::connect(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr));
    fds.push_back(fd);
  }
  const auto deadline = std::chrono::steady_clock::now() + wait;
  int done = 0;
  for (const int fd : fds) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    pollfd p{fd, POLLOUT, 0};
    if (::poll(&p, 1, static_cast<int>(std::max<int64_t>(0, left.count()))) == 1) {
      int error = 0;
      socklen_t len = sizeof(error);
      ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &len);
      done += error == 0 ? 1 : 0;
    }
  }
  for (const int fd : fds) ::close(fd);
  return done;
}

TEST(GuardedHttpServer, ListenBacklogHoldsABurstOfConnects) {
  ConnectionLimits limits;
  limits.workers = 8;
  limits.max_queued = 56;
  GuardedHttpServer http(limits);
  const int port = http.bind_listener("127.0.0.1", 0);
  ASSERT_GT(port, 0);
  // Bound and listening, but not accepting: every handshake waits in the backlog.
  EXPECT_EQ(handshakes(port, limits.listen_backlog(), std::chrono::milliseconds(500)),
            limits.listen_backlog());
}

}  // namespace
}  // namespace turbokv::server
