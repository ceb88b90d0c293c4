// `turbokv bench prefix` (cmd_bench_prefix.cc): time to first token of a request whose long
// prefix is not cached yet against one whose prefix the prefix cache holds, and the bytes the
// cache holds for that prefix, dense KV and a quantized KV in the same run.
#pragma once

#include <CLI/CLI.hpp>
#include <string>

#include "cli/command.h"

namespace turbokv::cli {

struct PrefixBenchFlags {
  std::string model_dir = default_model_dir();
  std::string text_file;  // "": pseudo-random token ids
  int prefix_tokens = 3000;
  int question_tokens = 16;
  int threads = 2;
  int repeats = 3;
  bool json = false;
  KVFlags kv;  // the quantized side (default --kv-bits 3.5)
};

// Adds the `prefix` subcommand to `bench` with its flags bound to flags.
CLI::App* add_prefix_bench(CLI::App& bench, PrefixBenchFlags& flags);
int run_prefix_bench(const PrefixBenchFlags& flags);

}  // namespace turbokv::cli
