// The HTTP server's defences against clients that hold its workers: every connection runs its
// own keep-alive loop over a socket stream with a deadline for each whole request (headers and
// body), a write timeout, and a cap on the bytes a request may send; a bounded worker pool
// evicts the slowest reader when a new connection waits for a worker and refuses connections
// (503) once its queue is full; a watchdog cancels the generation of a client that hung up.
#pragma once

#include <httplib.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <list>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

namespace turbokv::server {

struct ConnectionLimits {
  std::chrono::milliseconds request_timeout{10000};    // headers + body of one request
  std::chrono::milliseconds keep_alive_timeout{5000};  // idle wait for the next request
  std::chrono::milliseconds write_timeout{10000};      // a client that stops reading
  size_t max_request_bytes = size_t(2) << 20;          // headers + body of one request
  int max_requests_per_connection = 100;
  int workers = 64;      // connections served at once
  int max_queued = 256;  // accepted connections waiting for a worker; more get 503
  // Under pressure (a connection waits for a worker), a connection idle or reading its
  // request for longer than this is closed to free its worker.
  std::chrono::milliseconds eviction_grace{1000};
  // The listen socket's backlog is workers + max_queued (capped by the kernel's somaxconn):
  // a burst of that many connects completes its handshakes before the acceptor takes them.
  int listen_backlog() const { return workers + max_queued; }
};

// One accepted connection, as the registry sees it.
struct Connection {
  enum class Phase { kIdle, kReading, kHandling };
  int fd = -1;
  Phase phase = Phase::kIdle;
  std::chrono::steady_clock::time_point since;  // when the phase began
  std::function<void()> on_hangup;              // while handling: called once if the peer leaves
  bool closed_by_guard = false;
  bool close_after_response = false;  // e.g. its request body was left unread
};

// Every open connection, for eviction, hang-up detection and shutdown. Thread-safe.
class ConnectionRegistry {
 public:
  void add(Connection* c);
  void remove(Connection* c);
  void set_phase(Connection* c, Connection::Phase phase);
  // The callback runs on the watchdog thread (keep it short: e.g. GenerationStream::cancel).
  void set_hangup_handler(Connection* c, std::function<void()> on_hangup);
  // Closes the connection that has been idle or reading the longest, if longer than grace.
  // Returns whether one was closed.
  bool evict_slowest_reader(std::chrono::milliseconds grace);
  // Calls on_hangup of handling connections whose peer closed or reset the connection.
  void check_hangups();
  // Shuts every connection down (server stop): blocked reads and writes return at once.
  void shutdown_all();
  size_t size() const;

 private:
  mutable std::mutex mu_;
  std::list<Connection*> connections_;
};

// The connection the calling worker thread is serving (null outside a worker).
Connection* current_connection();

// httplib::Server with the connection loop, the worker pool and the watchdog described above.
class GuardedHttpServer : public httplib::Server {
 public:
  explicit GuardedHttpServer(const ConnectionLimits& limits);
  ~GuardedHttpServer() override;

  // Binds host:port (port 0: any free port) with the listen backlog of the limits; returns the
  // port, or -1 where the address cannot be bound.
  int bind_listener(const std::string& host, int port);
  // Starts the watchdog thread; call before listen_after_bind().
  void start_watchdog();
  // Stops listening, shuts every connection down and stops the watchdog.
  void stop_all();
  ConnectionRegistry& registry() { return registry_; }
  const ConnectionLimits& limits() const { return limits_; }

 private:
  bool process_and_close_socket(socket_t sock) override;

  ConnectionLimits limits_;
  ConnectionRegistry registry_;
  std::atomic<size_t> backlog_{0};  // connections queued for a worker
  int listen_fd_ = -1;              // the socket httplib binds (from its socket options hook)
  std::atomic<bool> stopping_{false};
  std::mutex watchdog_mu_;
  std::condition_variable watchdog_cv_;
  std::thread watchdog_;
};

}  // namespace turbokv::server
