// `turbokv bench memory` (cmd_bench_memory.cc): the KV memory of one sequence of N tokens,
// dense fp16 vs the chosen KV flags, per layer kind. Needs only the model's config.json.
#pragma once

#include <CLI/CLI.hpp>
#include <string>

#include "cli/command.h"

namespace turbokv::cli {

struct MemoryBenchFlags {
  std::string model_dir = default_model_dir();
  int64_t context = 131072;
  bool json = false;
  KVFlags kv;  // the chosen scheme (dense when no --kv-bits)
};

CLI::App* add_memory_bench(CLI::App& bench, MemoryBenchFlags& flags);
int run_memory_bench(const MemoryBenchFlags& flags);

}  // namespace turbokv::cli
