// `turbokv perplexity`: perplexity of a model on a text file (docs/design.md, "Contracts"), and
// with a KV scheme the quality of the quantized cache against the dense one on the same tokens in
// one run.
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

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

// One line of a --sweep file: its text (the label) and the KV settings its flags resolve to.
struct SweepSetting {
  std::string label;
  ResolvedKV kv;
};

// Lines of KV flags ("--kv-bits 3.5 --kv-centering keys"); blank lines and '#' comments skipped.
std::vector<SweepSetting> read_sweep(const std::string& path) {
  std::vector<SweepSetting> settings;
  std::istringstream lines(read_file(path));
  int number = 0;
  for (std::string line; std::getline(lines, line);) {
    ++number;
    const size_t hash = line.find('#');
    if (hash != std::string::npos) line.resize(hash);
    const size_t begin = line.find_first_not_of(" \t\r");
    if (begin == std::string::npos) continue;
    const size_t end = line.find_last_not_of(" \t\r");
    line = line.substr(begin, end - begin + 1);
    CLI::App app("one KV setting", "sweep");
    KVFlags flags;
    flags.add_to(app);
    try {
      app.parse(line, false);
    } catch (const CLI::ParseError& e) {
      throw InvalidArgument(
          str_cat("--sweep ", path, " line ", number, " '", line, "': ", e.what()));
    }
    ResolvedKV kv;
    try {
      kv = resolve_kv_options(flags.options());
    } catch (const InvalidArgument& e) {
      throw InvalidArgument(
          str_cat("--sweep ", path, " line ", number, " '", line, "': ", e.what()), e.param());
    }
    if (kv.scheme == KVScheme::kDense) {
      throw InvalidArgument(str_cat("--sweep ", path, " line ", number, " '", line,
                                    "' is dense; every setting needs --kv-bits (the dense pass "
                                    "runs anyway)"));
    }
    settings.push_back({line, kv});
  }
  if (settings.empty()) {
    throw InvalidArgument(
        str_cat("--sweep ", path, " has no settings (one line of KV flags each)"));
  }
  return settings;
}

nlohmann::json sweep_row(const SweepSetting& setting, const PerplexityResult& r) {
  const PerplexityStats& s = r.stats;
  return {{"setting", setting.label},
          {"kv_scheme", r.kv_scheme},
          {"kv_bits_effective", r.kv_bits_effective},
          {"kv_bits_quantized_layers", r.kv_bits_quantized_layers},
          {"ppl", s.ppl()},
          {"ppl_dense", s.dense_ppl()},
          {"dppl_pct", 100.0 * (s.ppl() / s.dense_ppl() - 1)},
          {"kld_mean", s.kld_mean()},
          {"top1_agreement", s.top1_agreement()},
          {"kv_layer_bits", r.kv_layer_bits}};
}

void write_text(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
  if (!out.flush()) throw IoError(str_cat("cannot write '", path, "'"));
}

// CSV: a header, then one row per setting; the setting is quoted (it may hold commas).
std::string sweep_csv(const nlohmann::json& rows) {
  std::string csv =
      "setting,kv_scheme,kv_bits_effective,kv_bits_quantized_layers,ppl,ppl_dense,dppl_pct,"
      "kld_mean,top1_agreement,kv_layer_bits\n";
  const auto quoted = [](const std::string& text) {
    std::string q = "\"";
    for (char c : text) q += c == '"' ? std::string("\"\"") : std::string(1, c);
    return q + "\"";
  };
  for (const nlohmann::json& row : rows) {
    csv += str_cat(quoted(row["setting"]), ",", std::string(row["kv_scheme"]), ",",
                   double(row["kv_bits_effective"]), ",", double(row["kv_bits_quantized_layers"]),
                   ",", double(row["ppl"]), ",", double(row["ppl_dense"]), ",",
                   double(row["dppl_pct"]), ",", double(row["kld_mean"]), ",",
                   double(row["top1_agreement"]), ",", quoted(row["kv_layer_bits"]), "\n");
  }
  return csv;
}

int perplexity_main(int argc, char** argv) {
  CLI::App app(
      "perplexity of a model on a text file; with a KV scheme also ppl_dense, "
      "kld_mean and top1_agreement against the dense cache",
      "perplexity");
  std::string model_dir = default_model_dir(), file;
  PerplexityOptions options;
  int threads = 0;
  bool json = false;
  std::string sweep, csv_path, json_path;
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
  app.add_option("--sweep", sweep,
                 "file of KV settings, one line of KV flags each (e.g. '--kv-bits 3.5 "
                 "--kv-centering keys'), all scored against one dense pass; prints a table");
  app.add_option("--csv", csv_path, "with --sweep: also write the table as CSV to this file");
  app.add_option("--json-out", json_path,
                 "with --sweep: also write the table as a JSON array to this file");
  kv.add_to(app);
  DeviceFlags device;
  device.add_to(app);
  if (const int rc = parse(app, argc, argv); rc >= 0) return rc;

  std::vector<SweepSetting> settings;
  if (!sweep.empty()) {
    if (!kv.kv_bits.empty() || !kv.kv_key_bits.empty() || !kv.kv_value_bits.empty()) {
      throw InvalidArgument(
          "--sweep takes its KV settings from the file; drop --kv-bits, "
          "--kv-key-bits and --kv-value-bits");
    }
    settings = read_sweep(sweep);
  } else if (!csv_path.empty() || !json_path.empty()) {
    throw InvalidArgument("--csv and --json-out write the table of a --sweep");
  } else {
    options.kv = resolve_kv_options(kv.options());
  }
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
  if (!settings.empty()) {
    std::vector<ResolvedKV> kvs;
    for (const SweepSetting& setting : settings) kvs.push_back(setting.kv);
    const std::vector<PerplexityResult> results = run_perplexity_sweep(
        *model, tokens, options, kvs,
        [&](int64_t done, int64_t total, const std::vector<PerplexityResult>&) {
          if (tty) std::fprintf(stderr, "\rchunk %lld/%lld", (long long)done, (long long)total);
        });
    if (tty) std::fprintf(stderr, "\n");
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    nlohmann::json rows = nlohmann::json::array();
    for (size_t i = 0; i < results.size(); ++i) rows.push_back(sweep_row(settings[i], results[i]));
    if (!csv_path.empty()) write_text(csv_path, sweep_csv(rows));
    if (!json_path.empty()) write_text(json_path, rows.dump(1) + "\n");
    if (json) {
      std::printf("%s\n", nlohmann::json{{"tokens", results.front().stats.tokens},
                                         {"chunks", results.front().chunks},
                                         {"context", options.context},
                                         {"seconds", seconds},
                                         {"settings", rows}}
                              .dump()
                              .c_str());
      return 0;
    }
    const PerplexityStats& first = results.front().stats;
    std::printf("tokens %lld in %lld chunks of %d, %.1f s, ppl_dense %.4f\n",
                (long long)first.tokens, (long long)results.front().chunks, options.context,
                seconds, first.dense_ppl());
    std::printf("%7s %7s %9s %8s %9s %7s  %s\n", "bits", "bits_q", "ppl", "dppl%", "kld_mean",
                "top1", "setting");
    for (const nlohmann::json& row : rows) {
      std::printf("%7.3f %7.3f %9.4f %+8.2f %9.5f %7.4f  %s\n", double(row["kv_bits_effective"]),
                  double(row["kv_bits_quantized_layers"]), double(row["ppl"]),
                  double(row["dppl_pct"]), double(row["kld_mean"]), double(row["top1_agreement"]),
                  std::string(row["setting"]).c_str());
    }
    return 0;
  }
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
      out["kv_bits_quantized_layers"] = r.kv_bits_quantized_layers;
      if (!r.kv_layer_bits.empty()) out["kv_layer_bits"] = r.kv_layer_bits;
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
  std::printf("kv %s, %.3f bits per element for the whole model, %.3f on quantized layers\n",
              r.kv_scheme.c_str(), r.kv_bits_effective, r.kv_bits_quantized_layers);
  if (!r.kv_layer_bits.empty()) std::printf("layer bits %s\n", r.kv_layer_bits.c_str());
  std::printf("ppl %.4f  ppl_dense %.4f  (%+.2f%%)\n", s.ppl(), s.dense_ppl(),
              100.0 * (s.ppl() / s.dense_ppl() - 1));
  std::printf("kld_mean %.5f  top1_agreement %.4f\n", s.kld_mean(), s.top1_agreement());
  return 0;
}

}  // namespace

TURBOKV_COMMAND("perplexity", "perplexity on a text file (and KV-cache quality vs dense)",
                perplexity_main);

}  // namespace turbokv::cli
