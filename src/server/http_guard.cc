// Connection loop, socket stream, worker pool and watchdog of the HTTP server (http_guard.h).
#include "server/http_guard.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>

namespace turbokv::server {

using Clock = std::chrono::steady_clock;

namespace {

thread_local Connection* t_connection = nullptr;
thread_local bool t_refuse = false;  // the pool is full: answer 503 and close

// poll() on one fd for `events`, retrying on EINTR; the remaining time is recomputed so that
// signals do not extend the wait. Returns the revents, 0 on timeout, -1 on error.
int poll_fd(int fd, short events, std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  for (;;) {
    pollfd p{fd, events, 0};
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    const int r = ::poll(&p, 1, static_cast<int>(std::max<int64_t>(0, left)));
    if (r > 0) return p.revents;
    if (r == 0) return 0;
    if (errno != EINTR) return -1;
  }
}

void address_of(int fd, bool peer, std::string& ip, int& port) {
  sockaddr_storage addr{};
  socklen_t len = sizeof(addr);
  const int r = peer ? ::getpeername(fd, reinterpret_cast<sockaddr*>(&addr), &len)
                     : ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  ip.clear();
  port = -1;
  if (r != 0) return;
  char text[INET6_ADDRSTRLEN] = {};
  if (addr.ss_family == AF_INET) {
    const auto* a = reinterpret_cast<const sockaddr_in*>(&addr);
    ::inet_ntop(AF_INET, &a->sin_addr, text, sizeof(text));
    port = ntohs(a->sin_port);
  } else if (addr.ss_family == AF_INET6) {
    const auto* a = reinterpret_cast<const sockaddr_in6*>(&addr);
    ::inet_ntop(AF_INET6, &a->sin6_addr, text, sizeof(text));
    port = ntohs(a->sin6_port);
  }
  ip = text;
}

// The socket as httplib reads and writes it: buffered reads that fail once the request's
// deadline passes or it has sent more than its byte cap, writes that fail when the client has
// not accepted data for the write timeout.
class GuardedStream : public httplib::Stream {
 public:
  GuardedStream(int fd, const ConnectionLimits& limits) : fd_(fd), limits_(limits) {}

  void begin_request() {
    deadline_ = Clock::now() + limits_.request_timeout;
    request_bytes_ = 0;
  }
  bool has_buffered() const { return pos_ < end_; }
  // The request ran past its deadline or its byte cap: whatever httplib answered, the
  // connection must not serve another request.
  bool overran() const { return overran_; }

  bool is_readable() const override { return has_buffered() || wait(POLLIN, time_left()) > 0; }
  bool is_writable() const override {
    const int r = wait(POLLOUT, limits_.write_timeout);
    return r > 0 && (r & (POLLERR | POLLHUP)) == 0;
  }

  ssize_t read(char* ptr, size_t size) override {
    if (!has_buffered()) {
      if (request_bytes_ >= limits_.max_request_bytes) {
        overran_ = true;
        return -1;
      }
      const int r = wait(POLLIN, time_left());
      if (r <= 0) {  // deadline passed (or poll failed)
        overran_ = true;
        return -1;
      }
      ssize_t n;
      do {
        n = ::recv(fd_, buffer_, sizeof(buffer_), 0);
      } while (n < 0 && errno == EINTR);
      if (n <= 0) return n;
      pos_ = 0;
      end_ = static_cast<size_t>(n);
      request_bytes_ += static_cast<size_t>(n);
    }
    const size_t n = std::min(size, end_ - pos_);
    std::memcpy(ptr, buffer_ + pos_, n);
    pos_ += n;
    return static_cast<ssize_t>(n);
  }

  ssize_t write(const char* ptr, size_t size) override {
    if (wait(POLLOUT, limits_.write_timeout) <= 0) return -1;
    ssize_t n;
    do {
      n = ::send(fd_, ptr, size, MSG_NOSIGNAL);
    } while (n < 0 && errno == EINTR);
    return n;
  }

  void get_remote_ip_and_port(std::string& ip, int& port) const override {
    address_of(fd_, /*peer=*/true, ip, port);
  }
  void get_local_ip_and_port(std::string& ip, int& port) const override {
    address_of(fd_, /*peer=*/false, ip, port);
  }
  socket_t socket() const override { return fd_; }

 private:
  std::chrono::milliseconds time_left() const {
    return std::max(
        std::chrono::milliseconds(0),
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline_ - Clock::now()));
  }
  int wait(short events, std::chrono::milliseconds timeout) const {
    return poll_fd(fd_, events, timeout);
  }

  int fd_;
  const ConnectionLimits& limits_;
  Clock::time_point deadline_;
  size_t request_bytes_ = 0;
  bool overran_ = false;
  char buffer_[16384];
  size_t pos_ = 0, end_ = 0;
};

// Fixed workers over a bounded queue. A connection that finds no idle worker makes the pool
// evict the slowest reader; one that finds the queue full is answered 503 at once.
class GuardedPool : public httplib::TaskQueue {
 public:
  GuardedPool(const ConnectionLimits& limits, ConnectionRegistry& registry,
              std::atomic<size_t>& backlog)
      : limits_(limits), registry_(registry), backlog_(backlog) {
    for (int i = 0; i < limits.workers; ++i) workers_.emplace_back([this] { work(); });
  }
  ~GuardedPool() override { shutdown(); }

  void enqueue(std::function<void()> fn) override {
    bool no_idle_worker = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (jobs_.size() >= static_cast<size_t>(limits_.max_queued)) {
        t_refuse = true;  // runs the connection here: it answers 503 and closes
      } else {
        jobs_.push_back(std::move(fn));
        backlog_ = jobs_.size();
        no_idle_worker = idle_ < jobs_.size();
      }
    }
    if (t_refuse) {
      fn();
      t_refuse = false;
      return;
    }
    cv_.notify_one();
    if (no_idle_worker) registry_.evict_slowest_reader(limits_.eviction_grace);
  }

  void shutdown() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stopped_) return;
      stopped_ = true;
    }
    cv_.notify_all();
    for (auto& t : workers_) t.join();
  }

 private:
  void work() {
    for (;;) {
      std::function<void()> fn;
      {
        std::unique_lock<std::mutex> lock(mu_);
        ++idle_;
        cv_.wait(lock, [&] { return stopped_ || !jobs_.empty(); });
        --idle_;
        if (jobs_.empty()) return;  // stopped and drained
        fn = std::move(jobs_.front());
        jobs_.pop_front();
        backlog_ = jobs_.size();
      }
      fn();
    }
  }

  const ConnectionLimits& limits_;
  ConnectionRegistry& registry_;
  std::atomic<size_t>& backlog_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> jobs_;
  size_t idle_ = 0;
  bool stopped_ = false;
  std::vector<std::thread> workers_;
};

// A response sent before the client finished its request (413 on a body too large): closing
// with unread input would reset the connection and could discard the response in flight, so
// the rest of the request is read and dropped first, for a bounded time and size.
void linger(int fd) {
  ::shutdown(fd, SHUT_WR);
  const auto deadline = Clock::now() + std::chrono::seconds(2);
  char buffer[16384];
  size_t dropped = 0;
  while (dropped < (size_t(8) << 20) && Clock::now() < deadline) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    if (poll_fd(fd, POLLIN, left) <= 0) break;
    const ssize_t n = ::recv(fd, buffer, sizeof(buffer), 0);
    if (n <= 0) break;
    dropped += static_cast<size_t>(n);
  }
}

void refuse(int fd) {
  static const std::string body =
      R"({"error":{"message":"the server has too many connections; retry later",)"
      R"("type":"server_busy","param":null,"code":"too_many_connections"}})";
  const std::string response =
      "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json"
      "\r\nConnection: close\r\nContent-Length: " +
      std::to_string(body.size()) + "\r\n\r\n" + body;
  [[maybe_unused]] const ssize_t n =
      ::send(fd, response.data(), response.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
}

}  // namespace

Connection* current_connection() {
  return t_connection;
}

void ConnectionRegistry::add(Connection* c) {
  std::lock_guard<std::mutex> lock(mu_);
  connections_.push_back(c);
}

void ConnectionRegistry::remove(Connection* c) {
  std::lock_guard<std::mutex> lock(mu_);
  connections_.remove(c);
}

void ConnectionRegistry::set_phase(Connection* c, Connection::Phase phase) {
  std::lock_guard<std::mutex> lock(mu_);
  c->phase = phase;
  c->since = Clock::now();
}

void ConnectionRegistry::set_hangup_handler(Connection* c, std::function<void()> on_hangup) {
  std::lock_guard<std::mutex> lock(mu_);
  c->on_hangup = std::move(on_hangup);
}

bool ConnectionRegistry::evict_slowest_reader(std::chrono::milliseconds grace) {
  std::lock_guard<std::mutex> lock(mu_);
  const auto now = Clock::now();
  Connection* slowest = nullptr;
  for (Connection* c : connections_) {
    if (c->phase == Connection::Phase::kHandling || c->closed_by_guard) continue;
    if (now - c->since < grace) continue;
    // Idle connections go first: they cost the client nothing to reopen.
    const bool better =
        slowest == nullptr ||
        (c->phase == Connection::Phase::kIdle) > (slowest->phase == Connection::Phase::kIdle) ||
        ((c->phase == Connection::Phase::kIdle) == (slowest->phase == Connection::Phase::kIdle) &&
         c->since < slowest->since);
    if (better) slowest = c;
  }
  if (slowest == nullptr) return false;
  slowest->closed_by_guard = true;
  ::shutdown(slowest->fd, SHUT_RDWR);  // the worker's poll/recv returns; it closes the socket
  return true;
}

void ConnectionRegistry::check_hangups() {
  std::lock_guard<std::mutex> lock(mu_);
  for (Connection* c : connections_) {
    if (c->phase != Connection::Phase::kHandling || !c->on_hangup) continue;
    pollfd p{c->fd, POLLRDHUP, 0};
    if (::poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR)) != 0) {
      auto fn = std::move(c->on_hangup);
      c->on_hangup = nullptr;
      fn();
    }
  }
}

void ConnectionRegistry::shutdown_all() {
  std::lock_guard<std::mutex> lock(mu_);
  for (Connection* c : connections_) {
    if (c->on_hangup) {
      auto fn = std::move(c->on_hangup);
      c->on_hangup = nullptr;
      fn();
    }
    c->closed_by_guard = true;
    ::shutdown(c->fd, SHUT_RDWR);
  }
}

size_t ConnectionRegistry::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return connections_.size();
}

GuardedHttpServer::GuardedHttpServer(const ConnectionLimits& limits) : limits_(limits) {
  new_task_queue = [this] { return new GuardedPool(limits_, registry_, backlog_); };
  // httplib's own options (address reuse), and the fd, so that bind_listener can widen the
  // backlog of 5 that httplib's listen() uses.
  set_socket_options([this](socket_t sock) {
    httplib::default_socket_options(sock);
    listen_fd_ = sock;
  });
  // What httplib advertises in Keep-Alive headers; the loop below enforces it.
  set_keep_alive_max_count(static_cast<size_t>(limits_.max_requests_per_connection));
  set_keep_alive_timeout(std::max<time_t>(
      1, std::chrono::duration_cast<std::chrono::seconds>(limits_.keep_alive_timeout).count()));
}

GuardedHttpServer::~GuardedHttpServer() {
  stop_all();
}

int GuardedHttpServer::bind_listener(const std::string& host, int port) {
  listen_fd_ = -1;
  const int bound = port == 0 ? bind_to_any_port(host) : (bind_to_port(host, port) ? port : -1);
  if (bound <= 0) return -1;
  // Listening again on a listening socket only changes its backlog (where the kernel refused,
  // the socket would keep httplib's).
  if (listen_fd_ >= 0) ::listen(listen_fd_, limits_.listen_backlog());
  return bound;
}

void GuardedHttpServer::start_watchdog() {
  watchdog_ = std::thread([this] {
    std::unique_lock<std::mutex> lock(watchdog_mu_);
    while (!stopping_) {
      watchdog_cv_.wait_for(lock, std::chrono::milliseconds(100));
      if (stopping_) break;
      registry_.check_hangups();
      if (backlog_ > 0) registry_.evict_slowest_reader(limits_.eviction_grace);
    }
  });
}

void GuardedHttpServer::stop_all() {
  {
    std::lock_guard<std::mutex> lock(watchdog_mu_);
    stopping_ = true;
  }
  watchdog_cv_.notify_all();
  if (is_running()) stop();
  registry_.shutdown_all();
  if (watchdog_.joinable()) watchdog_.join();
}

bool GuardedHttpServer::process_and_close_socket(socket_t sock) {
  if (t_refuse || stopping_) {
    refuse(sock);
    ::shutdown(sock, SHUT_RDWR);
    ::close(sock);
    return false;
  }
  Connection conn;
  conn.fd = sock;
  conn.since = Clock::now();
  registry_.add(&conn);
  t_connection = &conn;
  GuardedStream stream(sock, limits_);
  bool ok = false;
  for (int served = 0; served < limits_.max_requests_per_connection && is_running(); ++served) {
    registry_.set_phase(&conn, Connection::Phase::kIdle);
    if (!stream.has_buffered()) {
      const int r = poll_fd(sock, POLLIN, limits_.keep_alive_timeout);
      if (r <= 0 || (r & (POLLERR | POLLNVAL)) != 0) break;  // idle too long, or gone
    }
    registry_.set_phase(&conn, Connection::Phase::kReading);
    stream.begin_request();
    bool connection_closed = false;
    const bool last = served + 1 == limits_.max_requests_per_connection;
    ok = process_request(stream, last, connection_closed, {});
    registry_.set_hangup_handler(&conn, nullptr);
    if (!ok || connection_closed || stream.overran() || conn.closed_by_guard ||
        conn.close_after_response) {
      break;
    }
  }
  t_connection = nullptr;
  registry_.remove(&conn);
  if (conn.close_after_response && !conn.closed_by_guard) linger(sock);
  ::shutdown(sock, SHUT_RDWR);
  ::close(sock);
  return ok;
}

}  // namespace turbokv::server
