// The `turbokv` Python module, mirroring mlx-vlm's API:
//   model, processor = turbokv.load(path=None, kv_bits=3.5, kv_quant_scheme="turboquant")
//   text = turbokv.generate(model, processor, prompt, kv_bits=3.5, max_tokens=200)
//   for chunk in turbokv.stream_generate(model, processor, prompt): print(chunk.text, end="")
// KV options given to load() are the defaults; the same options given to generate() override
// them for that call. InvalidArgument -> ValueError, other errors -> RuntimeError; an argument
// of the wrong type is a TypeError and one out of range a ValueError, both naming it.
// Generation runs with the GIL released; Ctrl-C (KeyboardInterrupt) cancels a blocking call.
//
// Prompt caches (mlx-lm's make_prompt_cache / save_prompt_cache / load_prompt_cache): a
// session of the engine that generate(..., prompt_cache=cache) runs on and leaves its KV in,
// so the next call whose prompt starts with cache.tokens prefills only the rest:
//   cache = turbokv.make_cache(model)
//   turbokv.generate(model, processor, prompt, prompt_cache=cache)
//   turbokv.save_cache("chat.tkv", cache, {"title": "demo"})
//   cache, meta = turbokv.load_cache(model, "chat.tkv", return_metadata=True)
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <chrono>
#include <mutex>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "kv/kv_resolve.h"
#include "turbokv/engine.h"

namespace py = pybind11;

namespace turbokv::python {
namespace {

struct PyModel {
  std::shared_ptr<Engine> engine;
};

// A prompt cache: an engine session and the engine it belongs to.
struct PromptCache {
  std::shared_ptr<Engine> engine;
  std::shared_ptr<Session> session;
};

struct Processor {
  std::shared_ptr<Engine> engine;

  std::vector<int32_t> encode(const std::string& text, bool add_special_tokens) const {
    return engine->encode(text, add_special_tokens);
  }
  std::string decode(const std::vector<int32_t>& ids) const { return engine->decode(ids); }
  std::string apply_chat_template(const py::list& messages) const;
};

// One streamed piece, named like mlx-vlm's GenerationResult.
struct GenerationResponse {
  std::string text;
  int32_t token = -1;
  int64_t prompt_tokens = 0, generation_tokens = 0;
  double prompt_tps = 0, generation_tps = 0;
  size_t kv_bytes = 0, kv_bytes_dense = 0;
  std::string kv_scheme, finish_reason;
  double kv_key_bits = 16, kv_value_bits = 16;
  int64_t cached_tokens = 0;  // tokens held in the KV cache (prompt + generated - 1 at the end)
  int64_t prompt_cached_tokens = 0;  // prompt tokens reused from a prompt cache or prefix cache
};

GenerationResponse response_of(const GenerationChunk& c) {
  GenerationResponse r;
  r.text = c.text;
  r.token = c.token;
  r.prompt_tokens = c.stats.prompt_tokens;
  r.generation_tokens = c.stats.generated_tokens;
  r.prompt_tps = c.stats.prompt_tps;
  r.generation_tps = c.stats.generation_tps;
  r.kv_bytes = c.stats.kv_bytes;
  r.kv_bytes_dense = c.stats.kv_bytes_dense;
  r.kv_scheme = kv_scheme_name(c.stats.kv.scheme);
  r.kv_key_bits = c.stats.kv.key_bits;
  r.kv_value_bits = c.stats.kv.value_bits;
  r.cached_tokens = c.stats.cached_tokens;
  r.prompt_cached_tokens = c.stats.prompt_cached_tokens;
  if (c.done) r.finish_reason = finish_reason_name(c.finish_reason);
  return r;
}

// How long a blocking call waits on the engine between checks for Ctrl-C.
constexpr std::chrono::milliseconds kSignalPoll{50};

std::string type_name(const py::handle& value) {
  return py::str(py::type::handle_of(value).attr("__name__")).cast<std::string>();
}

// An int argument in [lo, hi]: TypeError for another type (bool included), ValueError out of
// range, both naming the argument.
int64_t int_arg(const py::handle& value, const char* name, int64_t lo, int64_t hi) {
  if (py::isinstance<py::bool_>(value) || !py::isinstance<py::int_>(value)) {
    throw py::type_error(str_cat(name, " must be an int, got ", type_name(value)));
  }
  int overflow = 0;
  const long long v = PyLong_AsLongLongAndOverflow(value.ptr(), &overflow);
  if (overflow != 0 || v < lo || v > hi) {
    throw py::value_error(str_cat(name, "=", py::str(value).cast<std::string>(),
                                  " is out of range [", lo, ", ", hi, "]"));
  }
  return v;
}

uint64_t seed_arg(const py::handle& value, const char* name) {
  if (py::isinstance<py::bool_>(value) || !py::isinstance<py::int_>(value)) {
    throw py::type_error(str_cat(name, " must be an int, got ", type_name(value)));
  }
  const unsigned long long v = PyLong_AsUnsignedLongLong(value.ptr());
  if (PyErr_Occurred()) {
    PyErr_Clear();
    throw py::value_error(
        str_cat(name, "=", py::str(value).cast<std::string>(), " is out of range [0, 2**64 - 1]"));
  }
  return v;
}

double float_arg(const py::handle& value, const char* name) {
  if (py::isinstance<py::bool_>(value) ||
      !(py::isinstance<py::int_>(value) || py::isinstance<py::float_>(value))) {
    throw py::type_error(str_cat(name, " must be a number, got ", type_name(value)));
  }
  return value.cast<double>();
}

bool bool_arg(const py::handle& value, const char* name) {
  if (!py::isinstance<py::bool_>(value)) {
    throw py::type_error(str_cat(name, " must be True or False, got ", type_name(value)));
  }
  return value.cast<bool>();
}

std::string str_arg(const py::handle& value, const char* name) {
  if (!py::isinstance<py::str>(value)) {
    throw py::type_error(str_cat(name, " must be a str, got ", type_name(value)));
  }
  return value.cast<std::string>();
}

// kv_bits and friends: a number, a numeric string, or None (not given).
std::optional<double> bits_arg(const py::object& value, const char* name) {
  if (value.is_none()) return std::nullopt;
  if (py::isinstance<py::str>(value)) return parse_kv_bits(value.cast<std::string>(), name);
  return float_arg(value, name);
}

// Applies the KV keyword arguments that were given (not None) on top of base.
KVOptions kv_options(KVOptions kv, const py::kwargs& kw) {
  auto get = [&](const char* name) -> py::object {
    return kw.contains(name) ? py::object(kw[name]) : py::object(py::none());
  };
  if (auto b = bits_arg(get("kv_bits"), "kv_bits")) kv.kv_bits = b;
  if (auto b = bits_arg(get("kv_key_bits"), "kv_key_bits")) kv.kv_key_bits = b;
  if (auto b = bits_arg(get("kv_value_bits"), "kv_value_bits")) kv.kv_value_bits = b;
  if (auto s = get("kv_quant_scheme"); !s.is_none()) {
    kv.kv_quant_scheme = str_arg(s, "kv_quant_scheme");
  }
  if (auto g = get("kv_group_size"); !g.is_none()) {
    kv.kv_group_size = static_cast<int>(int_arg(g, "kv_group_size", 1, INT32_MAX));
  }
  if (auto s = get("quantized_kv_start"); !s.is_none()) {
    kv.quantized_kv_start = int_arg(s, "quantized_kv_start", 0, INT64_MAX);
  }
  if (auto s = get("kv_seed"); !s.is_none()) kv.seed = seed_arg(s, "kv_seed");
  // The TurboQuant levers (the CLI's --kv-* flags under the HTTP fields' names).
  if (auto b = get("kv_norm_correction"); !b.is_none()) {
    kv.norm_correction = bool_arg(b, "kv_norm_correction");
  }
  if (auto b = get("kv_unbiased_norm"); !b.is_none()) {
    kv.kv_unbiased_norm = bool_arg(b, "kv_unbiased_norm");
  }
  if (auto b = get("kv_quantize_last_layer"); !b.is_none()) {
    kv.last_layer_dense = !bool_arg(b, "kv_quantize_last_layer");
  }
  if (auto s = get("kv_centering"); !s.is_none()) kv.kv_centering = str_arg(s, "kv_centering");
  if (auto n = get("kv_sink_tokens"); !n.is_none()) {
    kv.kv_sink_tokens = static_cast<int>(int_arg(n, "kv_sink_tokens", 0, 65536));
  }
  if (auto n = get("kv_recent_tokens"); !n.is_none()) {
    kv.kv_recent_tokens = static_cast<int>(int_arg(n, "kv_recent_tokens", 0, 1024));
  }
  if (auto s = get("kv_allocation"); !s.is_none()) {
    kv.kv_allocation = str_arg(s, "kv_allocation");
  }
  if (auto b = get("kv_budget"); !b.is_none()) kv.kv_budget = float_arg(b, "kv_budget");
  if (auto s = get("kv_layer_bits"); !s.is_none()) {
    kv.kv_layer_bits = str_arg(s, "kv_layer_bits");
  }
  if (auto b = get("kv_hadamard"); !b.is_none()) kv.kv_hadamard = bool_arg(b, "kv_hadamard");
  // A lever given for a dense cache would do nothing: refused, not ignored.
  if (resolve_kv_options(kv).scheme == KVScheme::kDense) {
    for (const char* name : kv_lever_names()) {
      if (!get(name).is_none()) {
        throw py::value_error(str_cat(
            name, " applies to a quantized KV cache; the cache here is dense (set kv_bits)"));
      }
    }
  }
  return kv;  // the engine resolves it again once per load or request
}

const char* const kGenerateArgs[] = {
    "max_tokens",       "temperature",       "top_p", "top_k", "min_p",      "repetition_penalty",
    "presence_penalty", "frequency_penalty", "seed",  "stop",  "ignore_eos", "prompt_cache"};

void check_kwargs(const py::kwargs& kw, bool generation) {
  for (const auto& [key, value] : kw) {
    const std::string name = key.cast<std::string>();
    const auto kv_args = kv_field_names();
    bool known = std::find(kv_args.begin(), kv_args.end(), name) != kv_args.end();
    if (!generation) {
      known = known || name == "device" || name == "kv_cache_gb" || name == "batch_invariant";
    }
    if (generation) {
      known = known || std::find(std::begin(kGenerateArgs), std::end(kGenerateArgs), name) !=
                           std::end(kGenerateArgs);
    }
    if (!known) throw py::type_error(str_cat("unexpected keyword argument '", name, "'"));
  }
}

GenerateOptions generate_options(const Engine& engine, const py::kwargs& kw) {
  check_kwargs(kw, /*generation=*/true);
  GenerateOptions o;
  auto arg = [&](const char* name) { return kw.contains(name) && !kw[name].is_none(); };
  if (arg("max_tokens")) {
    o.max_tokens = static_cast<int>(int_arg(kw["max_tokens"], "max_tokens", 1, INT32_MAX));
  }
  SamplingOptions& s = o.sampling;
  if (arg("temperature")) s.temperature = float_arg(kw["temperature"], "temperature");
  if (arg("top_p")) s.top_p = float_arg(kw["top_p"], "top_p");
  if (arg("top_k")) s.top_k = static_cast<int>(int_arg(kw["top_k"], "top_k", 0, INT32_MAX));
  if (arg("min_p")) s.min_p = float_arg(kw["min_p"], "min_p");
  if (arg("repetition_penalty")) {
    s.repetition_penalty = float_arg(kw["repetition_penalty"], "repetition_penalty");
  }
  if (arg("presence_penalty")) {
    s.presence_penalty = float_arg(kw["presence_penalty"], "presence_penalty");
  }
  if (arg("frequency_penalty")) {
    s.frequency_penalty = float_arg(kw["frequency_penalty"], "frequency_penalty");
  }
  if (arg("seed")) s.seed = seed_arg(kw["seed"], "seed");
  if (arg("stop")) {
    const py::object stop = kw["stop"];
    if (py::isinstance<py::str>(stop)) {
      o.stop = {stop.cast<std::string>()};
    } else if (py::isinstance<py::list>(stop) || py::isinstance<py::tuple>(stop)) {
      for (const auto& item : stop) o.stop.push_back(str_arg(item, "stop items"));
    } else {
      throw py::type_error(str_cat("stop must be a str or a list of str, got ", type_name(stop)));
    }
  }
  if (arg("ignore_eos")) o.ignore_eos = bool_arg(kw["ignore_eos"], "ignore_eos");
  const auto kv_args = kv_field_names();
  const bool kv_given =
      std::any_of(kv_args.begin(), kv_args.end(), [&](const char* name) { return arg(name); });
  if (arg("prompt_cache")) {
    if (!py::isinstance<PromptCache>(kw["prompt_cache"])) {
      throw py::type_error("prompt_cache must be a PromptCache (turbokv.make_cache, load_cache)");
    }
    const auto& cache = kw["prompt_cache"].cast<const PromptCache&>();
    if (cache.engine != nullptr && cache.engine.get() != &engine) {
      throw InvalidArgument("prompt_cache was made for another model");
    }
    o.session = cache.session;
  }
  // A prompt cache keeps its own KV settings unless the call names some.
  if (!o.session || kv_given) o.kv = kv_options(engine.options().kv, kw);
  return o;
}

// metadata dict[str, str] <-> the session's metadata text (a JSON object).
std::string metadata_text(const py::object& metadata) {
  if (metadata.is_none()) return "";
  if (!py::isinstance<py::dict>(metadata)) {
    throw py::type_error(str_cat("metadata must be a dict of str, got ", type_name(metadata)));
  }
  nlohmann::json j = nlohmann::json::object();
  for (const auto& [key, value] : py::reinterpret_borrow<py::dict>(metadata)) {
    j[str_arg(key, "metadata keys")] = str_arg(value, "metadata values");
  }
  return j.dump();
}

py::dict metadata_dict(const std::string& text) {
  py::dict out;
  const auto j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return out;
  for (const auto& [key, value] : j.items()) {
    if (value.is_string()) out[py::str(key)] = value.get<std::string>();
  }
  return out;
}

std::vector<int32_t> prompt_tokens(const Engine& engine, const py::object& prompt) {
  if (py::isinstance<py::str>(prompt)) return engine.encode(prompt.cast<std::string>());
  if (!py::isinstance<py::list>(prompt) && !py::isinstance<py::tuple>(prompt)) {
    throw py::type_error(
        str_cat("prompt must be a str or a list of token ids, got ", type_name(prompt)));
  }
  std::vector<int32_t> ids;
  for (const auto& item : prompt) {
    ids.push_back(static_cast<int32_t>(int_arg(item, "prompt token ids", 0, INT32_MAX)));
  }
  return ids;
}

// Waits for the stream's next chunk with the GIL released, checking for Ctrl-C after each chunk
// and every kSignalPoll while none comes (chunks may come faster than that for the whole
// request): an interrupt cancels the request and raises KeyboardInterrupt here.
bool next_interruptible(GenerationStream& stream, GenerationChunk* chunk) {
  for (;;) {
    StreamWait r;
    {
      py::gil_scoped_release release;
      r = stream.next_for(chunk, kSignalPoll);
    }
    if (PyErr_CheckSignals() != 0) {
      stream.cancel();
      throw py::error_already_set();
    }
    if (r != StreamWait::kTimeout) return r == StreamWait::kChunk;
  }
}

// Iterator over a running request; dropping it cancels the request. Several threads may
// consume one iterator: each chunk goes to one of them, and all see StopIteration at the end.
class StreamIterator {
 public:
  StreamIterator(std::shared_ptr<Engine> engine, std::unique_ptr<GenerationStream> stream)
      : engine_(std::move(engine)),
        stream_(std::move(stream)),
        mu_(std::make_shared<std::mutex>()) {}

  GenerationResponse next() {
    std::unique_lock<std::mutex> lock(*mu_, std::defer_lock);
    {
      py::gil_scoped_release release;  // never wait for the lock holding the GIL
      lock.lock();
    }
    if (finished_) throw py::stop_iteration();
    GenerationChunk chunk;
    bool more = false;
    do {
      more = next_interruptible(*stream_, &chunk);
    } while (more && chunk.token < 0 && !chunk.done);  // skip prefill progress
    if (!more) {
      finished_ = true;
      throw py::stop_iteration();
    }
    return response_of(chunk);
  }

 private:
  std::shared_ptr<Engine> engine_;  // outlives the stream
  std::unique_ptr<GenerationStream> stream_;
  std::shared_ptr<std::mutex> mu_;  // pybind11 copies may move the iterator: keep one mutex
  bool finished_ = false;
};

}  // namespace

std::string Processor::apply_chat_template(const py::list& messages) const {
  std::vector<ChatMessage> m;
  for (size_t i = 0; i < messages.size(); ++i) {
    const py::handle item = messages[i];
    const std::string name = str_cat("messages[", i, "]");
    if (!py::isinstance<py::dict>(item)) {
      throw py::type_error(
          str_cat(name, " must be a dict with 'role' and 'content', got ", type_name(item)));
    }
    const auto d = py::reinterpret_borrow<py::dict>(item);
    for (const char* key : {"role", "content"}) {
      if (!d.contains(key)) throw py::value_error(str_cat(name, " has no '", key, "'"));
    }
    m.push_back({str_arg(d["role"], (name + "['role']").c_str()),
                 str_arg(d["content"], (name + "['content']").c_str())});
  }
  return engine->apply_chat_template(m);
}

PYBIND11_MODULE(turbokv, m) {
  m.doc() = "turbokv: LLM inference with TurboQuant KV-cache compression";
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const InvalidArgument& e) {
      PyErr_SetString(PyExc_ValueError, e.what());
    } catch (const Error& e) {
      PyErr_SetString(PyExc_RuntimeError, e.what());
    }
  });

  py::class_<PyModel>(m, "Model")
      .def_property_readonly("model_dir",
                             [](const PyModel& s) { return s.engine->summary().model_dir; })
      .def_property_readonly("model_type",
                             [](const PyModel& s) { return s.engine->summary().model_type; })
      .def_property_readonly("num_layers",
                             [](const PyModel& s) { return s.engine->summary().num_layers; })
      .def_property_readonly("context_length",
                             [](const PyModel& s) { return s.engine->summary().context_length; })
      .def_property_readonly("device", [](const PyModel& s) { return s.engine->summary().device; })
      .def_property_readonly("kv_scheme", [](const PyModel& s) {
        return kv_scheme_name(s.engine->default_kv().scheme);
      });

  py::class_<Processor>(m, "Processor")
      .def("encode", &Processor::encode, py::arg("text"), py::arg("add_special_tokens") = true)
      .def("decode", &Processor::decode, py::arg("ids"))
      .def("apply_chat_template", &Processor::apply_chat_template, py::arg("messages"),
           "Renders [{'role': ..., 'content': ...}] with the model's chat template");

  py::class_<GenerationResponse>(m, "GenerationResponse")
      .def_readonly("text", &GenerationResponse::text)
      .def_readonly("token", &GenerationResponse::token)
      .def_readonly("prompt_tokens", &GenerationResponse::prompt_tokens)
      .def_readonly("generation_tokens", &GenerationResponse::generation_tokens)
      .def_readonly("prompt_tps", &GenerationResponse::prompt_tps)
      .def_readonly("generation_tps", &GenerationResponse::generation_tps)
      .def_readonly("kv_bytes", &GenerationResponse::kv_bytes)
      .def_readonly("kv_bytes_dense", &GenerationResponse::kv_bytes_dense)
      .def_readonly("kv_scheme", &GenerationResponse::kv_scheme)
      .def_readonly("kv_key_bits", &GenerationResponse::kv_key_bits)
      .def_readonly("kv_value_bits", &GenerationResponse::kv_value_bits)
      .def_readonly("cached_tokens", &GenerationResponse::cached_tokens)
      .def_readonly("prompt_cached_tokens", &GenerationResponse::prompt_cached_tokens)
      .def_readonly("finish_reason", &GenerationResponse::finish_reason);

  py::class_<PromptCache>(m, "PromptCache")
      .def_property_readonly("tokens", [](const PromptCache& c) { return c.session->tokens(); })
      .def_property_readonly("cached_tokens",
                             [](const PromptCache& c) { return c.session->cached_tokens(); })
      .def_property_readonly("kv_bytes", [](const PromptCache& c) { return c.session->kv_bytes(); })
      .def_property_readonly("kv_bytes_dense",
                             [](const PromptCache& c) { return c.session->kv_bytes_dense(); })
      .def_property_readonly(
          "kv_scheme", [](const PromptCache& c) { return kv_scheme_name(c.session->kv().scheme); })
      .def("clear", [](PromptCache& c) { c.session->clear(); })
      .def("__len__", [](const PromptCache& c) { return c.session->tokens().size(); });

  py::class_<StreamIterator>(m, "StreamIterator")
      .def("__iter__", [](StreamIterator& it) -> StreamIterator& { return it; })
      .def("__next__", &StreamIterator::next);

  m.def(
      "load",
      [](const py::object& path, const py::kwargs& kw) {
        check_kwargs(kw, /*generation=*/false);
        EngineOptions options;
        options.kv = kv_options(KVOptions{}, kw);
        if (kw.contains("device") && !kw["device"].is_none()) {
          options.device = str_arg(kw["device"], "device");
        }
        if (kw.contains("kv_cache_gb") && !kw["kv_cache_gb"].is_none()) {
          options.kv_cache_gb = float_arg(kw["kv_cache_gb"], "kv_cache_gb");
        }
        if (kw.contains("batch_invariant") && !kw["batch_invariant"].is_none()) {
          options.batch_invariant = bool_arg(kw["batch_invariant"], "batch_invariant");
        }
        std::string dir = TURBOKV_DEFAULT_MODEL_DIR;
        if (!path.is_none()) {  // a str or an os.PathLike
          const py::object fspath = py::module_::import("os").attr("fspath");
          if (!py::isinstance<py::str>(path) && !py::hasattr(path, "__fspath__")) {
            throw py::type_error(
                str_cat("path must be a str or os.PathLike, got ", type_name(path)));
          }
          dir = str_arg(fspath(path), "path");
        }

        std::shared_ptr<Engine> engine;
        {
          py::gil_scoped_release release;
          engine = Engine::load(dir, options);
        }
        return py::make_tuple(PyModel{engine}, Processor{engine});
      },
      py::arg("path") = py::none(),
      "load(path=None, device='cpu', kv_cache_gb=0, batch_invariant=False, **kv_options) -> "
      "(model, processor); path defaults to the shipped model, device 'cuda' runs it on the GPU "
      "(batch_invariant: a request's greedy text does not depend on what is batched with it)");

  m.def(
      "make_cache",
      [](const PyModel& model, const py::kwargs& kw) {
        check_kwargs(kw, /*generation=*/false);
        return PromptCache{model.engine,
                           model.engine->new_session(kv_options(model.engine->options().kv, kw))};
      },
      py::arg("model"),
      "make_cache(model, **kv_options) -> PromptCache: an empty prompt cache for "
      "generate(..., prompt_cache=cache)");

  m.def(
      "save_cache",
      [](const std::string& path, PromptCache& cache, const py::object& metadata) {
        if (!metadata.is_none()) cache.session->set_metadata(metadata_text(metadata));
        py::gil_scoped_release release;
        cache.engine->save_session(*cache.session, path);
      },
      py::arg("path"), py::arg("cache"), py::arg("metadata") = py::none(),
      "save_cache(path, cache, metadata=None): writes the cache's KV, tokens and metadata "
      "(dict of str) to a CRC-checked file that records the model and KV settings");

  m.def(
      "load_cache",
      [](const PyModel& model, const std::string& path, bool return_metadata,
         const py::kwargs& kw) -> py::object {
        check_kwargs(kw, /*generation=*/false);
        std::optional<KVOptions> kv;
        if (kw.size() > 0) kv = kv_options(model.engine->options().kv, kw);
        std::shared_ptr<Session> session;
        {
          py::gil_scoped_release release;
          session = model.engine->load_session(path, kv);
        }
        PromptCache cache{model.engine, session};
        if (!return_metadata) return py::cast(cache);
        return py::make_tuple(cache, metadata_dict(session->metadata()));
      },
      py::arg("model"), py::arg("path"), py::arg("return_metadata") = false,
      "load_cache(model, path, return_metadata=False, **kv_options) -> PromptCache (or "
      "(PromptCache, metadata)); ValueError for a file of another model or other KV settings, "
      "RuntimeError for a corrupted or truncated one");

  m.def(
      "generate",
      [](const PyModel& model, const Processor&, const py::object& prompt, const py::kwargs& kw) {
        const auto options = generate_options(*model.engine, kw);
        auto stream = model.engine->submit(prompt_tokens(*model.engine, prompt), options);
        std::string text;
        GenerationChunk chunk;
        while (next_interruptible(*stream, &chunk)) text += chunk.text;
        return text;
      },
      py::arg("model"), py::arg("processor"), py::arg("prompt"),
      "generate(model, processor, prompt, max_tokens=256, temperature=0.0, top_p=1.0, top_k=0, "
      "min_p=0.0, repetition_penalty=1.0, seed=0, stop=None, kv_bits=None, prompt_cache=None, "
      "...) -> str");

  m.def(
      "stream_generate",
      [](const PyModel& model, const Processor&, const py::object& prompt, const py::kwargs& kw) {
        const auto options = generate_options(*model.engine, kw);
        auto stream = model.engine->submit(prompt_tokens(*model.engine, prompt), options);
        return StreamIterator(model.engine, std::move(stream));
      },
      py::arg("model"), py::arg("processor"), py::arg("prompt"),
      "stream_generate(...) -> iterator of GenerationResponse (.text, .token, stats)");
}

}  // namespace turbokv::python
