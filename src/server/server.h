// OpenAI-compatible HTTP server over an Engine: GET /health, GET /v1/models,
// POST /v1/chat/completions and /v1/completions (SSE streaming), GET /metrics (Prometheus text).
// Concurrent requests are batched by the engine's scheduler; each request may override the KV
// options (kv_bits, kv_quant_scheme, ...). Errors use OpenAI's error body.
//
// Slots (llama.cpp's server API, server/slots.h): a request with "id_slot": N runs on slot N's
// session and reuses the KV of its common prefix with the slot's last request. GET /v1/slots
// lists them; POST /v1/slots/{id}?action=save|restore with {"filename": NAME} writes or reads
// the slot's cache file NAME in the --slot-save-path directory, action=erase clears the slot.
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include "turbokv/engine.h"

namespace turbokv::server {

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 8080;                  // 0 picks a free port (see Server::bind)
  std::string api_key;              // non-empty: /v1/* and /metrics need "Bearer <key>"
  size_t max_body_bytes = 1 << 20;  // larger bodies get 413
  int max_tokens = 4096;            // largest max_tokens a request may ask for
  std::string model_id = "tinycode-llama";
  int http_threads = 64;       // connections served at once (streams hold one each)
  int slots = 0;               // sessions for id_slot; 0: EngineOptions::max_sequences
  std::string slot_save_path;  // directory of slot files; "": save/restore off
  int max_queued_connections = 256;  // waiting for an HTTP thread; more get 503
  double request_timeout_s = 10;     // a client's time to send one whole request
};

class Server {
 public:
  Server(Engine& engine, ServerOptions options);
  ~Server();

  // Binds the socket; returns the port (useful with port 0). Throws IoError when it cannot.
  int bind();
  // Serves until stop(); call after bind().
  void listen();
  void stop();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace turbokv::server
