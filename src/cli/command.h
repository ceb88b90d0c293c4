// Subcommand registry of the `turbokv` binary. Each subcommand lives in its own cmd_*.cc,
// registers itself with TURBOKV_COMMAND, parses its own flags with CLI11 and returns an exit
// code. main() maps exceptions: InvalidArgument -> exit 2, other turbokv errors -> exit 1.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <string>

#include "backend/backend.h"
#include "turbokv/kv_options.h"

namespace turbokv::cli {

using CommandFn = int (*)(int argc, char** argv);

struct CommandRegistrar {
  CommandRegistrar(const char* name, const char* summary, CommandFn fn);
};

#define TURBOKV_COMMAND(name, summary, fn) \
  static ::turbokv::cli::CommandRegistrar turbokv_command_registrar_##fn(name, summary, fn)

// Parses argv with app. Returns -1 when the command should go on, else the exit code to
// return (0 after --help, 2 for a usage error, with the message on stderr).
int parse(CLI::App& app, int argc, char** argv);

// Validators for integer flags: the value must be a decimal integer in [lo, hi]. CLI11 alone
// would read "010" as octal, wrap "-5" into a huge unsigned value and saturate past 64 bits.
CLI::Validator integer_in(int64_t lo, int64_t hi);
CLI::Validator unsigned_integer();  // [0, 2^64 - 1], e.g. seeds

// The model every command uses when --model is not given (the repo's shipped model).
std::string default_model_dir();

// Flags shared by generate, chat, server, perplexity and codec: --kv-bits, --kv-quant-scheme,
// --kv-key-bits, --kv-value-bits, --kv-group-size, --quantized-kv-start, --kv-seed.
struct KVFlags {
  std::string kv_bits, kv_key_bits, kv_value_bits;
  std::string kv_quant_scheme = "uniform";
  int kv_group_size = 64;
  int64_t quantized_kv_start = 0;
  uint64_t kv_seed = 0;
  bool no_norm_correction = false;
  bool kv_unbiased_norm = false;
  bool quantize_last_layer = false;
  std::string kv_centering, kv_allocation, kv_layer_bits;
  int kv_sink_tokens = -1;    // -1: the default
  int kv_recent_tokens = -1;  // -1: the default
  double kv_budget = 0;       // 0: the default
  bool kv_hadamard = false;

  void add_to(CLI::App& app);
  // Throws InvalidArgument for a malformed or disallowed value.
  KVOptions options() const;
};

// --device and --kv-cache-gb (generate, chat, server, perplexity, bench).
struct DeviceFlags {
  std::string device = "cpu";
  double kv_cache_gb = 0;
  bool batch_invariant = false;

  void add_to(CLI::App& app);
  DeviceOptions options() const { return DeviceOptions{device, kv_cache_gb, batch_invariant}; }
};

}  // namespace turbokv::cli
