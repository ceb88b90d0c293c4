// `turbokv server`: the OpenAI-compatible HTTP server. Prints "listening on http://HOST:PORT"
// on stdout once the socket is bound (--port 0 picks a free port); SIGINT/SIGTERM stop it.
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <filesystem>
#include <thread>

#include "cli/engine_flags.h"
#include "server/server.h"

namespace turbokv::cli {
namespace {

// SIGINT/SIGTERM write a byte here (any thread may take the signal); a waiter thread reads it
// and stops the server outside the signal handler.
int g_stop_pipe[2] = {-1, -1};

void on_stop_signal(int) {
  const char byte = 1;
  [[maybe_unused]] ssize_t n = write(g_stop_pipe[1], &byte, 1);
}

int run_server(int argc, char** argv) {
  CLI::App app("Serve the model over an OpenAI-compatible HTTP API", "server");
  EngineFlags engine_flags;
  server::ServerOptions options;
  EngineOptions engine_options;
  engine_flags.add_to(app);
  app.add_option("--host", options.host, "address to listen on");
  app.add_option("--port", options.port, "port (0: pick a free one)")->check(integer_in(0, 65535));
  app.add_option("--api-key", options.api_key, "require 'Authorization: Bearer KEY'");
  app.add_option("--model-id", options.model_id, "model name reported by /v1/models");
  app.add_option("--max-sequences", engine_options.max_sequences,
                 "sequences decoded together (more requests wait)")
      ->check(integer_in(1, 4096));
  app.add_option("--max-waiting", engine_options.max_waiting,
                 "queued requests beyond which new ones get 429")
      ->check(integer_in(0, 1 << 20));
  app.add_option("--max-tokens-limit", options.max_tokens,
                 "largest max_tokens a request may ask for (also the default)")
      ->check(integer_in(1, INT32_MAX));
  app.add_option("--max-body-bytes", options.max_body_bytes, "larger request bodies get 413")
      ->check(integer_in(1, int64_t(1) << 40));
  app.add_option("--http-threads", options.http_threads, "connections served at once")
      ->check(integer_in(1, 4096));
  app.add_option("--slots", options.slots,
                 "sessions requests can pick with id_slot (default: --max-sequences)")
      ->check(integer_in(0, 1024));
  app.add_option("--slot-save-path", options.slot_save_path,
                 "directory of the slot files of POST /v1/slots/{id}?action=save|restore "
                 "(default: save/restore off)");
  app.add_option("--max-queued-connections", options.max_queued_connections,
                 "connections waiting for an HTTP thread; more get 503")
      ->check(integer_in(1, 1 << 20));
  app.add_option("--request-timeout", options.request_timeout_s,
                 "seconds a client has to send a whole request (headers and body)")
      ->check(CLI::Range(0.001, 86400.0));
  if (int rc = parse(app, argc, argv); rc >= 0) return rc;
  if (!options.slot_save_path.empty()) {
    std::error_code error;
    std::filesystem::create_directories(options.slot_save_path, error);
    if (!std::filesystem::is_directory(options.slot_save_path, error)) {
      throw IoError(
          str_cat("--slot-save-path '", options.slot_save_path, "' is not a usable directory"));
    }
  }
  // Every sequence decodes one token per step and prefill still gets a full chunk.
  engine_options.max_batch_tokens = std::max(
      engine_options.max_batch_tokens, engine_options.max_sequences + engine_options.prefill_chunk);

  auto engine = engine_flags.load(engine_options);
  server::Server server(*engine, options);
  const int port = server.bind();
  std::printf("turbokv server listening on http://%s:%d\n", options.host.c_str(), port);
  std::fflush(stdout);
  if (pipe(g_stop_pipe) != 0) throw IoError("cannot create the signal pipe");
  struct sigaction action = {};
  action.sa_handler = on_stop_signal;
  sigaction(SIGINT, &action, nullptr);
  sigaction(SIGTERM, &action, nullptr);
  std::thread waiter([&] {
    char byte = 0;
    while (read(g_stop_pipe[0], &byte, 1) < 0 && errno == EINTR) {
    }
    server.stop();
  });
  server.listen();
  on_stop_signal(0);  // stopped some other way: release the waiter
  waiter.join();
  return 0;
}

}  // namespace

TURBOKV_COMMAND("server", "OpenAI-compatible HTTP server", run_server);

}  // namespace turbokv::cli
