// httplib routes of the OpenAI-compatible server: auth, error bodies, plain and SSE responses,
// Prometheus metrics (see server.h).
#include "server/server.h"

#include <httplib.h>

#include <algorithm>
#include <atomic>
#include <charconv>
#include <ctime>
#include <map>
#include <nlohmann/json.hpp>

#include "server/http_guard.h"
#include "server/openai.h"
#include "server/slots.h"

namespace turbokv::server {

using nlohmann::json;

namespace {

ConnectionLimits connection_limits(const ServerOptions& o) {
  ConnectionLimits l;
  l.request_timeout = std::chrono::milliseconds(static_cast<int64_t>(o.request_timeout_s * 1000));
  l.workers = o.http_threads;
  l.max_queued = o.max_queued_connections;
  // The body limit plus room for the request line and headers.
  l.max_request_bytes = o.max_body_bytes + (size_t(64) << 10);
  return l;
}

}  // namespace

struct Server::Impl {
  Impl(Engine& e, ServerOptions o)
      : engine(e),
        options(std::move(o)),
        slots(e, options.slots > 0 ? options.slots : e.options().max_sequences,
              options.slot_save_path),
        http(connection_limits(options)),
        created(std::time(nullptr)) {}

  Engine& engine;
  ServerOptions options;
  SlotTable slots;
  GuardedHttpServer http;
  int64_t created;
  std::atomic<int64_t> next_id{1};
  std::atomic<int64_t> http_requests{0}, http_errors{0};

  void install_routes();
  // The connection's request has been read: it no longer counts as a slow reader.
  void mark_handling() {
    if (Connection* c = current_connection()) {
      http.registry().set_phase(c, Connection::Phase::kHandling);
    }
  }
  // The response ends the connection (a body left unread would be read as the next request).
  static void close_after_response(httplib::Response& res) {
    res.set_header("Connection", "close");
    if (Connection* c = current_connection()) c->close_after_response = true;
  }
  // The body, read through `reader` up to max_body_bytes whatever the transfer encoding.
  std::string read_body(const httplib::Request& req, const httplib::ContentReader& reader);
  // A POST route whose handler gets the body read by read_body.
  template <typename Fn>
  void post(const std::string& pattern, Fn fn);
  json model_json() const;
  void completion(const std::string& body, httplib::Response& res, bool chat);
  void slot_action(const httplib::Request& req, const std::string& body, httplib::Response& res);
  std::string metrics_text() const;
};

namespace {

// Text the server sends never fails to serialize: invalid UTF-8 becomes U+FFFD.
std::string dump(const json& j) {
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

void send_error(httplib::Response& res, int status, const std::string& message,
                const std::string& type, const std::optional<std::string>& param = std::nullopt,
                const std::optional<std::string>& code = std::nullopt) {
  res.status = status;
  res.set_content(dump(error_body(message, type, param, code)), "application/json");
}

// Runs fn, turning every exception into an OpenAI error response.
template <typename Fn>
void answer_errors(httplib::Response& res, Fn fn) {
  try {
    fn();
  } catch (const std::exception&) {
    const ErrorReply r = error_reply(std::current_exception());
    send_error(res, r.status, r.message, r.type, r.param, r.code);
  }
}

// The logprobs of a response's tokens, in OpenAI's shape: chat {"content": [{token, logprob,
// bytes, top_logprobs}]} or legacy completions {tokens, token_logprobs, top_logprobs,
// text_offset}. Streams take() the entries gathered since their last event.
// Characters (code points) of UTF-8 text.
int64_t utf8_length(const std::string& s) {
  return std::count_if(s.begin(), s.end(), [](char c) { return (c & 0xC0) != 0x80; });
}

class LogprobsJson {
 public:
  LogprobsJson(const Engine& engine, bool chat, int64_t text_offset)
      : engine_(&engine), chat_(chat), offset_(text_offset) {
    clear();
  }

  void add(const GenerationChunk& c) {
    const std::string text = token_text(c.token);
    if (chat_) {
      json top = json::array();
      for (const TokenLogprob& t : c.top_logprobs)
        top.push_back(entry(token_text(t.token), t.logprob));
      json e = entry(text, c.logprob);
      e["top_logprobs"] = std::move(top);
      out_["content"].push_back(std::move(e));
    } else {
      json top = json::object();
      for (const TokenLogprob& t : c.top_logprobs) top[token_text(t.token)] = t.logprob;
      out_["tokens"].push_back(text);
      out_["token_logprobs"].push_back(c.logprob);
      out_["top_logprobs"].push_back(std::move(top));
      out_["text_offset"].push_back(offset_);
      offset_ += utf8_length(text);
    }
    ++count_;
  }
  bool empty() const { return count_ == 0; }
  json take() {
    json out = std::move(out_);
    clear();
    return out;
  }

 private:
  static json entry(const std::string& text, float logprob) {
    return {{"token", text},
            {"logprob", logprob},
            {"bytes", std::vector<int>(text.begin(), text.end())}};
  }
  std::string token_text(int32_t id) const {
    const int32_t ids[] = {id};
    return engine_->decode(ids);
  }
  void clear() {
    count_ = 0;
    out_ = chat_ ? json{{"content", json::array()}, {"refusal", nullptr}}
                 : json{{"tokens", json::array()},
                        {"token_logprobs", json::array()},
                        {"top_logprobs", json::array()},
                        {"text_offset", json::array()}};
  }

  const Engine* engine_;
  bool chat_;
  int64_t offset_;
  size_t count_ = 0;
  json out_;
};

std::string sse(const json& event) {
  return "data: " + dump(event) + "\n\n";
}

}  // namespace

std::string Server::Impl::read_body(const httplib::Request& req,
                                    const httplib::ContentReader& reader) {
  const auto too_large_error = [this] {
    return ApiError(413,
                    str_cat("the request body exceeds the limit of ", options.max_body_bytes,
                            " bytes"),
                    "invalid_request_error", std::nullopt, "request_too_large");
  };
  // A declared length over the limit is refused before anything is read.
  if (req.has_header("Content-Length")) {
    const std::string declared = req.get_header_value("Content-Length");
    uint64_t n = 0;
    const auto [end, ec] = std::from_chars(declared.data(), declared.data() + declared.size(), n);
    if (ec == std::errc::result_out_of_range || (ec == std::errc() && n > options.max_body_bytes)) {
      throw too_large_error();
    }
  }
  std::string body;
  bool too_large = false;
  const bool complete = reader([&](const char* data, size_t n) {
    if (body.size() + n > options.max_body_bytes) {
      too_large = true;
      return false;  // stop reading: the rest is never buffered
    }
    body.append(data, n);
    return true;
  });
  if (too_large) throw too_large_error();
  if (!complete) {
    throw ApiError(400, "the request body could not be read (cut short or too slow)",
                   "invalid_request_error", std::nullopt, "incomplete_body");
  }
  mark_handling();
  return body;
}

template <typename Fn>
void Server::Impl::post(const std::string& pattern, Fn fn) {
  http.Post(pattern, [this, fn](const httplib::Request& req, httplib::Response& res,
                                const httplib::ContentReader& reader) {
    answer_errors(res, [&] {
      try {
        fn(req, read_body(req, reader), res);
      } catch (const ApiError& e) {
        // A body left unread (too large, cut short) ends the connection.
        if (e.status == 413 || e.code == "incomplete_body") close_after_response(res);
        throw;
      }
    });
  });
}

json Server::Impl::model_json() const {
  return {{"id", options.model_id},
          {"object", "model"},
          {"created", created},
          {"owned_by", "turbokv"},
          {"context_length", engine.summary().context_length}};
}

void Server::Impl::install_routes() {
  http.set_payload_max_length(options.max_body_bytes);

  http.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
    ++http_requests;
    if (req.method != "POST") mark_handling();  // POST bodies are read by the handlers
    const bool protected_path = req.path.rfind("/v1/", 0) == 0 || req.path == "/metrics";
    if (options.api_key.empty() || !protected_path ||
        req.get_header_value("Authorization") == "Bearer " + options.api_key) {
      return httplib::Server::HandlerResponse::Unhandled;
    }
    send_error(res, 401, "Incorrect or missing API key: send 'Authorization: Bearer <key>'",
               "invalid_request_error", std::nullopt, "invalid_api_key");
    if (req.has_header("Content-Length") || req.has_header("Transfer-Encoding")) {
      close_after_response(res);  // its body is left unread
    }
    return httplib::Server::HandlerResponse::Handled;
  });
  // Statuses set by httplib itself (404 no route, 413 body too large, ...) get an error body.
  http.set_error_handler([this](const httplib::Request& req, httplib::Response& res) {
    ++http_errors;
    if (!res.body.empty()) return;
    if (res.status == 404) {
      send_error(res, 404, str_cat("unknown endpoint ", req.method, " ", req.path),
                 "invalid_request_error", std::nullopt, "not_found");
    } else if (res.status == 413) {
      send_error(
          res, 413,
          str_cat("the request body exceeds the limit of ", options.max_body_bytes, " bytes"),
          "invalid_request_error", std::nullopt, "request_too_large");
    } else {
      send_error(res, res.status, str_cat("HTTP error ", res.status),
                 res.status >= 500 ? "server_error" : "invalid_request_error");
    }
  });
  http.set_exception_handler(
      [](const httplib::Request&, httplib::Response& res, std::exception_ptr) {
        send_error(res, 500, "internal error", "server_error");
      });

  http.Get("/health", [](const httplib::Request&, httplib::Response& res) {
    res.set_content(R"({"status":"ok"})", "application/json");
  });
  http.Get("/v1/models", [this](const httplib::Request&, httplib::Response& res) {
    res.set_content(dump(json({{"object", "list"}, {"data", json::array({model_json()})}})),
                    "application/json");
  });
  http.Get(R"(/v1/models/(.+))", [this](const httplib::Request& req, httplib::Response& res) {
    const std::string id = req.matches[1];
    if (id != options.model_id) {
      send_error(res, 404,
                 str_cat("the model '", id, "' does not exist; this server serves '",
                         options.model_id, "'"),
                 "invalid_request_error", "model", "model_not_found");
      return;
    }
    res.set_content(dump(model_json()), "application/json");
  });
  http.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
    res.set_content(metrics_text(), "text/plain; version=0.0.4");
  });
  post("/v1/chat/completions", [this](const httplib::Request&, const std::string& body,
                                      httplib::Response& res) { completion(body, res, true); });
  post("/v1/completions", [this](const httplib::Request&, const std::string& body,
                                 httplib::Response& res) { completion(body, res, false); });
  http.Get("/v1/slots", [this](const httplib::Request&, httplib::Response& res) {
    answer_errors(res, [&] { res.set_content(dump(slots.list()), "application/json"); });
  });
  post(R"(/v1/slots/(\d+))",
       [this](const httplib::Request& req, const std::string& body, httplib::Response& res) {
         slot_action(req, body, res);
       });
}

void Server::Impl::slot_action(const httplib::Request& req, const std::string& text,
                               httplib::Response& res) {
  const std::string digits = req.matches[1];
  if (digits.size() > 9) {
    throw ApiError(400, str_cat("slot ", digits, " does not exist"), "invalid_request_error",
                   "id_slot", "invalid_value");
  }
  const int64_t id = std::stoll(digits);
  const std::string action = req.get_param_value("action");
  if (action == "erase") {
    res.set_content(dump(slots.erase(id)), "application/json");
    return;
  }
  if (action != "save" && action != "restore") {
    throw ApiError(400, str_cat("action '", action, "' is unknown; allowed: save, restore, erase"),
                   "invalid_request_error", "action", "invalid_value");
  }
  const json body = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (body.is_discarded() || !body.is_object() || !body.contains("filename") ||
      !body["filename"].is_string()) {
    throw ApiError(400, "the body must be a JSON object with a string 'filename'",
                   "invalid_request_error", "filename", "invalid_value");
  }
  const std::string filename = body["filename"].get<std::string>();
  const json out = action == "save" ? slots.save(id, filename) : slots.restore(id, filename);
  res.set_content(dump(out), "application/json");
}

void Server::Impl::completion(const std::string& text, httplib::Response& res, bool chat) {
  const json body = parse_request_body(text);
  const RequestLimits limits{options.max_tokens};
  ApiRequest r = chat ? parse_chat_request(body, limits, engine.options().kv)
                      : parse_completion_request(body, limits, engine.options().kv);
  if (r.slot) {
    r.options.session = slots.acquire_for_request(*r.slot);
    if (!r.kv_given) r.options.kv.reset();  // the slot's own settings
  }
  std::vector<int32_t> tokens;
  if (chat) {
    tokens = engine.encode(engine.apply_chat_template(r.messages), /*add_special_tokens=*/false);
    r.options.stop_token_ids = engine.chat_stop_token_ids();
  } else {
    tokens = engine.encode(r.prompt, /*add_special_tokens=*/true);
  }
  const int64_t context = engine.summary().context_length;
  if (context > 0 && static_cast<int64_t>(tokens.size()) > context) {
    throw ApiError(400,
                   str_cat("the prompt has ", tokens.size(), " tokens, more than the context of ",
                           context, " tokens"),
                   "invalid_request_error", chat ? "messages" : "prompt",
                   "context_length_exceeded");
  }
  const std::string id = str_cat(chat ? "chatcmpl-" : "cmpl-", next_id++);
  const json base = {{"id", id},
                     {"object", chat ? "chat.completion.chunk" : "text_completion"},
                     {"created", static_cast<int64_t>(std::time(nullptr))},
                     {"model", options.model_id}};
  // One choice: a chat delta or a completion text.
  auto choice = [chat](const std::string& text, FinishReason reason, bool with_role,
                       json logprobs = nullptr) {
    json c = {{"index", 0}, {"logprobs", std::move(logprobs)}, {"finish_reason", nullptr}};
    if (reason != FinishReason::kNone) c["finish_reason"] = finish_reason_name(reason);
    if (chat) {
      c["delta"] = json::object();
      if (with_role) c["delta"]["role"] = "assistant";
      if (!text.empty() || with_role) c["delta"]["content"] = text;
    } else {
      c["text"] = text;
    }
    return c;
  };

  Connection* const connection = current_connection();
  if (!r.stream) {
    // A client that hangs up cancels its request (the watchdog notices within 0.1 s).
    const std::shared_ptr<GenerationStream> stream = engine.submit(std::move(tokens), r.options);
    if (connection) http.registry().set_hangup_handler(connection, [stream] { stream->cancel(); });
    GenerationResult result;
    GenerationChunk chunk;
    LogprobsJson logprobs(engine, chat, chat ? 0 : utf8_length(r.prompt));
    while (stream->next(&chunk)) {
      result.text += chunk.text;
      if (chunk.token >= 0) result.tokens.push_back(chunk.token);
      if (chunk.token >= 0 && r.options.logprobs) logprobs.add(chunk);
      if (chunk.done) {
        result.finish_reason = chunk.finish_reason;
        result.stats = chunk.stats;
      }
    }
    if (connection) http.registry().set_hangup_handler(connection, nullptr);
    json out = base;
    json c = {{"index", 0},
              {"logprobs", r.options.logprobs ? logprobs.take() : json()},
              {"finish_reason", finish_reason_name(result.finish_reason)}};
    if (chat) {
      out["object"] = "chat.completion";
      c["message"] = {{"role", "assistant"}, {"content", result.text}};
    } else {
      c["text"] = result.text;
    }
    out["choices"] = json::array({c});
    out["usage"] = usage_json(result.stats);
    res.set_content(dump(out), "application/json");
    return;
  }

  std::shared_ptr<GenerationStream> stream = engine.submit(std::move(tokens), r.options);
  if (connection) http.registry().set_hangup_handler(connection, [stream] { stream->cancel(); });
  struct State {
    bool role_sent = false;
    bool finished = false;
    LogprobsJson logprobs;
  };
  auto state = std::make_shared<State>(
      State{false, false, LogprobsJson(engine, chat, chat ? 0 : utf8_length(r.prompt))});
  const bool want_logprobs = r.options.logprobs;
  const bool include_usage = r.include_usage;
  res.set_header("Cache-Control", "no-cache");
  res.set_chunked_content_provider(
      "text/event-stream",
      [=](size_t, httplib::DataSink& sink) {
        auto write = [&sink](const std::string& s) { return sink.write(s.data(), s.size()); };
        auto event = [&](const json& choices) {
          json e = base;
          e["choices"] = choices;
          return sse(e);
        };
        if (chat && !state->role_sent) {
          state->role_sent = true;
          return write(event(json::array({choice("", FinishReason::kNone, true)})));
        }
        GenerationChunk c;
        std::string out;
        try {
          do {
            stream->next(&c);
            if (c.token >= 0 && want_logprobs) state->logprobs.add(c);
          } while (c.text.empty() && !c.done);
        } catch (const std::exception&) {
          // The status (200) is sent: the error goes in an event, typed as a reply would be.
          state->finished = true;
          const ErrorReply r = error_reply(std::current_exception());
          write(sse(error_body(r.message, r.type, r.param, r.code)));
          write("data: [DONE]\n\n");
          sink.done();
          return true;
        }
        // The logprobs of the tokens since the last event go with the next event.
        auto logprobs = [&]() -> json {
          return want_logprobs && !state->logprobs.empty() ? state->logprobs.take() : json();
        };
        if (!c.text.empty()) {
          out += event(json::array({choice(c.text, FinishReason::kNone, false, logprobs())}));
        }
        if (c.done) {
          state->finished = true;
          out += event(json::array({choice("", c.finish_reason, false, logprobs())}));
          if (include_usage) {
            json u = base;
            u["choices"] = json::array();
            u["usage"] = usage_json(c.stats);
            out += sse(u);
          }
          out += "data: [DONE]\n\n";
        }
        if (!write(out)) return false;
        if (c.done) sink.done();
        return true;
      },
      [stream, state](bool) {
        if (!state->finished) stream->cancel();
      });
}

std::string Server::Impl::metrics_text() const {
  const EngineMetrics m = engine.metrics();
  std::string out;
  auto metric = [&out](const char* name, const char* type, const char* help, double value) {
    out += str_cat("# HELP ", name, " ", help, "\n# TYPE ", name, " ", type, "\n", name, " ", value,
                   "\n");
  };
  metric("turbokv_http_requests_total", "counter", "HTTP requests received", http_requests);
  metric("turbokv_http_errors_total", "counter", "HTTP responses with status >= 400", http_errors);
  metric("turbokv_requests_total", "counter", "generation requests accepted", m.requests_total);
  metric("turbokv_requests_failed_total", "counter", "generation requests that failed",
         m.requests_failed);
  metric("turbokv_prompt_tokens_total", "counter", "prompt tokens accepted", m.prompt_tokens_total);
  metric("turbokv_generated_tokens_total", "counter", "tokens generated", m.generated_tokens_total);
  metric("turbokv_active_sequences", "gauge", "sequences in the batch", m.active_sequences);
  metric("turbokv_waiting_requests", "gauge", "requests queued for a batch slot",
         m.waiting_requests);
  metric("turbokv_kv_bytes", "gauge", "KV cache bytes of the active sequences",
         static_cast<double>(m.kv_bytes));
  metric("turbokv_kv_bytes_dense", "gauge", "fp16 size of the same KV cache",
         static_cast<double>(m.kv_bytes_dense));
  metric("turbokv_state_bytes", "gauge",
         "recurrent-state bytes of the active sequences (linear attention, not in kv_bytes)",
         static_cast<double>(m.state_bytes));
  metric("turbokv_kv_pool_capacity_bytes", "gauge",
         "the device KV pool's size (0: the device has no pool, the CPU)",
         static_cast<double>(m.kv_pool.capacity_bytes));
  metric("turbokv_kv_pool_used_bytes", "gauge",
         "device KV pool bytes in blocks handed out (sequences, sessions, prefix cache)",
         static_cast<double>(m.kv_pool.used_bytes));
  metric("turbokv_kv_pool_reserved_bytes", "gauge",
         "device KV pool bytes promised to admitted requests", static_cast<double>(m.kv_pool.reserved_bytes));
  metric("turbokv_kv_pool_promisable_bytes", "gauge",
         "the most that promises to requests may total (the pool keeps the rest for blocks of "
         "other sizes)",
         static_cast<double>(m.kv_pool.promisable_bytes));
  metric("turbokv_kv_pool_blocks", "gauge", "device KV pool blocks handed out",
         static_cast<double>(m.kv_pool.blocks));
  metric("turbokv_kv_pool_waits_total", "counter",
         "requests that waited in the queue for the KV pool to promise their bytes",
         m.kv_pool_waits);
  metric("turbokv_forward_passes_total", "counter", "batched forward passes", m.forward_passes);
  metric("turbokv_prefix_cache_lookups_total", "counter",
         "requests that looked for a cached prompt prefix", m.prefix_cache_lookups);
  metric("turbokv_prefix_cache_hits_total", "counter", "requests that restored a cached prefix",
         m.prefix_cache_hits);
  metric("turbokv_prefix_cache_hit_tokens_total", "counter",
         "prompt tokens restored from the prefix cache instead of prefilled",
         m.prefix_cache_hit_tokens);
  metric("turbokv_prefix_cache_evictions_total", "counter", "prefix cache blocks evicted",
         m.prefix_cache_evictions);
  metric("turbokv_prefix_cache_blocks", "gauge", "prefix cache blocks held", m.prefix_cache_blocks);
  metric("turbokv_prefix_cache_tokens", "gauge", "tokens held by the prefix cache",
         m.prefix_cache_tokens);
  metric("turbokv_prefix_cache_bytes", "gauge", "memory held by the prefix cache",
         static_cast<double>(m.prefix_cache_bytes));
  metric("turbokv_prefix_cache_bytes_dense", "gauge", "fp16 size of the K/V the prefix cache holds",
         static_cast<double>(m.prefix_cache_bytes_dense));
  metric("turbokv_prefix_cache_capacity_bytes", "gauge", "the prefix cache's memory budget",
         static_cast<double>(m.prefix_cache_capacity_bytes));
  metric("turbokv_session_reused_tokens_total", "counter",
         "prompt tokens reused from slot sessions instead of prefilled", m.session_reused_tokens);
  // The default request's cache policy: layers per (layer kind, cache type).
  std::map<std::pair<std::string, std::string>, int> layers;
  for (const LayerCacheInfo& l : engine.cache_layers(engine.default_kv())) {
    ++layers[{l.kind, l.cache}];
  }
  out +=
      "# HELP turbokv_kv_policy_layers layers per layer kind and the cache type the default "
      "KV policy gives them\n# TYPE turbokv_kv_policy_layers gauge\n";
  for (const auto& [key, n] : layers) {
    out += str_cat("turbokv_kv_policy_layers{kind=\"", key.first, "\",cache=\"", key.second, "\"} ",
                   n, "\n");
  }
  return out;
}

Server::Server(Engine& engine, ServerOptions options)
    : impl_(std::make_unique<Impl>(engine, std::move(options))) {
  impl_->install_routes();
}

Server::~Server() {
  stop();
}

int Server::bind() {
  const auto& o = impl_->options;
  const int port = impl_->http.bind_listener(o.host, o.port);
  if (port <= 0) {
    if (o.port == 0) throw IoError(str_cat("cannot bind a port on ", o.host));
    throw IoError(str_cat("cannot bind ", o.host, ":", o.port, " (in use or not permitted)"));
  }
  return port;
}

void Server::listen() {
  impl_->http.start_watchdog();
  impl_->http.listen_after_bind();
}

void Server::stop() {
  impl_->http.stop_all();  // in-flight generations are cancelled
}

}  // namespace turbokv::server
