// `turbokv bench e2e` (cmd_bench_e2e.cc): whole-model prefill and decode tokens/s, dense KV
// cache vs a quantized one, measured in one run. cmd_bench.cc mounts it next to `attention`.
#pragma once

#include <CLI/CLI.hpp>
#include <string>
#include <vector>

#include "cli/command.h"

namespace turbokv::cli {

struct E2EBenchFlags {
  std::string model_dir = default_model_dir();
  int prompt_tokens = 512;
  int gen_tokens = 128;
  int threads = 2;
  int repeats = 5;
  bool json = false;
  KVFlags kv;  // the quantized side (default --kv-bits 3.5)
  // Other checkpoints (e.g. quantized weights) measured against model_dir in the same run,
  // all with the quantized KV cache: tokens/s, the ratio to model_dir, and the weight bytes
  // each decoded token reads next to the machine's measured read bandwidth.
  std::vector<std::string> compare_models;
  // --device cuda: decode at these cache depths with this many sequences (the prompt is not
  // prefilled: caches are filled to the depth), dense vs the KV flags vs uniform 4.
  DeviceFlags device;
  std::string depths = "4096,32768";
  int batch = 1;
};

// Adds the `e2e` subcommand to `bench` with its flags bound to flags.
CLI::App* add_e2e_bench(CLI::App& bench, E2EBenchFlags& flags);
int run_e2e_bench(const E2EBenchFlags& flags);

}  // namespace turbokv::cli
