// turbokv: one binary, subcommands registered by the cmd_*.cc files next to this one.
#include <charconv>
#include <cstdio>
#include <cstring>
#include <exception>
#include <map>
#include <string>

#include "cli/command.h"
#include "core/error.h"
#include "kv/kv_resolve.h"

namespace turbokv::cli {
namespace {

struct Entry {
  std::string summary;
  CommandFn fn;
};

std::map<std::string, Entry>& registry() {
  static std::map<std::string, Entry> commands;
  return commands;
}

void print_usage(FILE* out) {
  std::fprintf(out, "usage: turbokv <command> [options]\n\ncommands:\n");
  for (const auto& [name, entry] : registry()) {
    std::fprintf(out, "  %-12s %s\n", name.c_str(), entry.summary.c_str());
  }
  std::fprintf(out, "\n'turbokv <command> --help' shows a command's options.\n");
}

}  // namespace

CommandRegistrar::CommandRegistrar(const char* name, const char* summary, CommandFn fn) {
  registry()[name] = Entry{summary, fn};
}

int parse(CLI::App& app, int argc, char** argv) {
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::fprintf(stderr, "turbokv %s: %s\n", app.get_name().c_str(), e.what());
    return 2;
  }
  return -1;
}

CLI::Validator integer_in(int64_t lo, int64_t hi) {
  return CLI::Validator(
      [lo, hi](std::string& text) -> std::string {
        int64_t v = 0;
        const char* end = text.data() + text.size();
        const auto [ptr, ec] = std::from_chars(text.data(), end, v);
        if (ec != std::errc() || ptr != end || v < lo || v > hi) {
          return str_cat("'", text, "' is not an integer in [", lo, ", ", hi, "]");
        }
        return "";
      },
      str_cat("INT in [", lo, ", ", hi, "]"));
}

CLI::Validator unsigned_integer() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        uint64_t v = 0;
        const char* end = text.data() + text.size();
        const auto [ptr, ec] = std::from_chars(text.data(), end, v);
        if (ec != std::errc() || ptr != end) {
          return str_cat("'", text, "' is not an integer in [0, 18446744073709551615]");
        }
        return "";
      },
      "UINT64");
}

std::string default_model_dir() {
  return TURBOKV_DEFAULT_MODEL_DIR;
}

void KVFlags::add_to(CLI::App& app) {
  app.add_option("--kv-bits", kv_bits,
                 "KV cache bits: TurboQuant multiples of 0.5 in [1,8]; uniform integers 2..8");
  app.add_option("--kv-quant-scheme", kv_quant_scheme, "uniform (default) or turboquant");
  app.add_option("--kv-key-bits", kv_key_bits, "override key bits (TurboQuant)");
  app.add_option("--kv-value-bits", kv_value_bits, "override value bits (TurboQuant)");
  app.add_option("--kv-group-size", kv_group_size, "uniform scheme group size (32, 64, 128)")
      ->check(integer_in(1, INT32_MAX));
  app.add_option("--quantized-kv-start", quantized_kv_start,
                 "keep a layer's cache dense until it holds this many tokens")
      ->check(integer_in(0, INT64_MAX));
  app.add_option("--kv-seed", kv_seed, "seed of the TurboQuant rotations")
      ->check(unsigned_integer());
  app.add_flag("--no-norm-correction", no_norm_correction,
               "TurboQuant: store the plain norm instead of n/||c||");
  app.add_flag(
      "--kv-unbiased-norm", kv_unbiased_norm,
      "TurboQuant: store the norm as n/<y,c> (unbiased inner products) instead of n/||c||");
  app.add_flag("--quantize-last-layer", quantize_last_layer,
               "also quantize the last layer (kept dense by default)");
  app.add_option("--kv-centering", kv_centering,
                 "TurboQuant: subtract per-head means before coding: none, keys, values, both")
      ->check(CLI::IsMember({"none", "keys", "values", "both"}));
  app.add_option("--kv-sink-tokens", kv_sink_tokens,
                 "TurboQuant: keep the first N positions of a sequence in fp16")
      ->check(integer_in(0, 65536));
  app.add_option("--kv-recent-tokens", kv_recent_tokens,
                 "TurboQuant: each query reads its last N positions (itself included) in fp16")
      ->check(integer_in(0, 1024));
  app.add_option("--kv-allocation", kv_allocation,
                 "TurboQuant: split of a fractional --kv-bits per layer: none (keys floor, "
                 "values ceil), keys (keys ceil after layer 0), auto (measured, perplexity only)")
      ->check(CLI::IsMember({"none", "keys", "auto"}));
  app.add_option("--kv-budget", kv_budget,
                 "TurboQuant with --kv-allocation auto: bits per element to spend");
  app.add_option("--kv-layer-bits", kv_layer_bits,
                 "per-layer bits, e.g. '0:4/5,-1:dense' (LAYER:K/V, LAYER:BITS or LAYER:dense; "
                 "negative LAYER counts from the end)");
  app.add_flag("--kv-hadamard", kv_hadamard,
               "uniform scheme: rotate keys and values by a random Hadamard transform first");
}

void DeviceFlags::add_to(CLI::App& app) {
  app.add_option("--device", device, "cpu (default) or cuda (the whole model on the GPU)");
  app.add_option("--kv-cache-gb", kv_cache_gb,
                 "cuda: GPU memory for the KV cache pool in GB (default: 90% of what is free)");
  app.add_flag("--batch-invariant", batch_invariant,
               "cuda: a request's greedy text does not depend on what is batched with it "
               "(slower at large decode batches)");
}

KVOptions KVFlags::options() const {
  KVOptions o;
  if (!kv_bits.empty()) o.kv_bits = parse_kv_bits(kv_bits, "kv_bits");
  if (!kv_key_bits.empty()) o.kv_key_bits = parse_kv_bits(kv_key_bits, "kv_key_bits");
  if (!kv_value_bits.empty()) o.kv_value_bits = parse_kv_bits(kv_value_bits, "kv_value_bits");
  o.kv_quant_scheme = kv_quant_scheme;
  o.kv_group_size = kv_group_size;
  o.quantized_kv_start = quantized_kv_start;
  o.seed = kv_seed;
  o.norm_correction = !no_norm_correction;
  o.kv_unbiased_norm = kv_unbiased_norm;
  o.last_layer_dense = !quantize_last_layer;
  if (!kv_centering.empty()) o.kv_centering = kv_centering;
  if (kv_sink_tokens >= 0) o.kv_sink_tokens = kv_sink_tokens;
  if (kv_recent_tokens >= 0) o.kv_recent_tokens = kv_recent_tokens;
  if (!kv_allocation.empty()) o.kv_allocation = kv_allocation;
  if (kv_budget != 0) o.kv_budget = kv_budget;
  o.kv_layer_bits = kv_layer_bits;
  o.kv_hadamard = kv_hadamard;
  return o;  // resolved (and validated) once by whoever runs it: an engine, perplexity, codec
}

}  // namespace turbokv::cli

int main(int argc, char** argv) {
  using namespace turbokv;
  auto& commands = cli::registry();
  if (argc < 2 || std::strcmp(argv[1], "--help") == 0 || std::strcmp(argv[1], "-h") == 0) {
    cli::print_usage(argc < 2 ? stderr : stdout);
    return argc < 2 ? 2 : 0;
  }
  auto it = commands.find(argv[1]);
  if (it == commands.end()) {
    std::fprintf(stderr, "turbokv: unknown command '%s'\n", argv[1]);
    cli::print_usage(stderr);
    return 2;
  }
  try {
    return it->second.fn(argc - 1, argv + 1);
  } catch (const InvalidArgument& e) {
    std::fprintf(stderr, "turbokv %s: error: %s\n", argv[1], e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "turbokv %s: error: %s\n", argv[1], e.what());
    return 1;
  }
}
