// `turbokv perplexity`: perplexity of a model on a text file (docs/design.md, "Contracts"), and
// with a KV scheme the quality of the quantized cache against the dense one on the same tokens in
// one run.
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "cli/command.h"
#include "core/error.h"
#include "core/text_file.h"
#include "core/threads.h"
#include "backend/backend.h"
#include "eval/perplexity.h"
#include "kv/kv_resolve.h"
#include "tokenizer/tokenizer.h"

namespace turbokv::cli {
namespace {

int perplexity_main(int argc, char** argv) {
  CLI::App app(
      "perplexity of a model on a text file; with a KV scheme also ppl_dense, "
      "kld_mean and top1_agreement against the dense cache",
      "perplexity");
  std::string model_dir = default_model_dir(), file;
  PerplexityOptions options;
  int threads = 0;
  bool json = false;
  KVFlags kv;
  app.add_option("--model", model_dir, "model directory (default: the shipped model)");
  app.add_option("--file", file, "text file, tokenized whole")->required();
  app.add_option("--context", options.context, "tokens per chunk (C)")
      ->capture_default_str()
      ->check(integer_in(1, INT32_MAX));
  app.add_option("--max-chunks", options.max_chunks, "score only the first N chunks (0: all)")
      ->check(integer_in(0, INT64_MAX));
  app.add_option("--threads", threads, "worker threads (0: all cores)")->check(integer_in(0, 1024));
  app.add_flag("--json", json, "print one JSON object");
  kv.add_to(app);
  DeviceFlags device;
  device.add_to(app);
  if (const int rc = parse(app, argc, argv); rc >= 0) return rc;

  options.kv = resolve_kv_options(kv.options());
  check_device(device.options());
  if (threads < 0) throw InvalidArgument(str_cat("--threads ", threads, " must be >= 0"));
  set_num_threads(threads);
  const std::string text = read_file(file);
  LoadedModel loaded = load_model(model_dir, device.options());
  const Model* model = loaded.model.get();
  options.make_caches = loaded.make_caches;
  const std::vector<int32_t> tokens = Tokenizer::from_model_dir(model_dir)->encode(text, true);

  const bool tty = isatty(STDERR_FILENO) != 0;
  const auto start = std::chrono::steady_clock::now();
  const PerplexityResult r = run_perplexity(
      *model, tokens, options, [&](int64_t done, int64_t total, const PerplexityStats& s) {
        if (tty)
          std::fprintf(stderr, "\rchunk %lld/%lld  ppl %.4f", (long long)done, (long long)total,
                       s.ppl());
      });
  if (tty) std::fprintf(stderr, "\n");
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();

  const PerplexityStats& s = r.stats;
  if (json) {
    nlohmann::json out = {{"ppl", s.ppl()},           {"tokens", s.tokens},
                          {"chunks", r.chunks},       {"context", options.context},
                          {"kv_scheme", r.kv_scheme}, {"seconds", seconds},
                          {"device", loaded.device}};
    if (r.quantized) {
      out["ppl_dense"] = s.dense_ppl();
      out["kld_mean"] = s.kld_mean();
      out["top1_agreement"] = s.top1_agreement();
      out["kv_bits_effective"] = r.kv_bits_effective;
    }
    std::printf("%s\n", out.dump().c_str());
    return 0;
  }
  std::printf("tokens %lld in %lld chunks of %d, %.1f s\n", (long long)s.tokens,
              (long long)r.chunks, options.context, seconds);
  if (!r.quantized) {
    std::printf("ppl %.4f\n", s.ppl());
    return 0;
  }
  std::printf("kv %s, %.3f effective bits per element on quantized layers\n", r.kv_scheme.c_str(),
              r.kv_bits_effective);
  std::printf("ppl %.4f  ppl_dense %.4f  (%+.2f%%)\n", s.ppl(), s.dense_ppl(),
              100.0 * (s.ppl() / s.dense_ppl() - 1));
  std::printf("kld_mean %.5f  top1_agreement %.4f\n", s.kld_mean(), s.top1_agreement());
  return 0;
}

}  // namespace

TURBOKV_COMMAND("perplexity", "perplexity on a text file (and KV-cache quality vs dense)",
                perplexity_main);

}  // namespace turbokv::cli
