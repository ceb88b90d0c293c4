// Encoding throughput on one core: the tokenizer with its per-piece BPE cache against the
// same tokenizer with the cache off (plain BPE per piece), both measured here, plus the ratio.
// Usage: tokenizer_bench [TEXT_FILE] [MODEL_DIR] [REPEATS]
//   defaults: ../shared/fixtures/tinycode-eval.txt, models/tinycode-llama, 3
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <string>

#include "core/text_file.h"
#include "tokenizer/hf_tokenizer.h"

namespace {

// CPU time of this thread: the machine may be shared, and "one core" means the seconds this
// core spent, not the wall clock while other processes ran.
double thread_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

struct Timing {
  double cpu, wall;
};

Timing measure(const turbokv::HfTokenizer& tokenizer, const std::string& text, size_t& tokens) {
  const double cpu_start = thread_cpu_seconds();
  const auto wall_start = std::chrono::steady_clock::now();
  tokens = tokenizer.encode(text, false).size();
  const std::chrono::duration<double> wall = std::chrono::steady_clock::now() - wall_start;
  return {thread_cpu_seconds() - cpu_start, wall.count()};
}

Timing best_of(const turbokv::HfTokenizer& tokenizer, const std::string& text, int repeats,
               size_t& tokens) {
  Timing best{1e30, 1e30};
  for (int r = 0; r < repeats; ++r) {
    const Timing t = measure(tokenizer, text, tokens);
    best = {std::min(best.cpu, t.cpu), std::min(best.wall, t.wall)};
  }
  return best;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string repo = TURBOKV_SOURCE_DIR;
  const std::string path = argc > 1 ? argv[1] : repo + "/../shared/fixtures/tinycode-eval.txt";
  const std::string model = argc > 2 ? argv[2] : repo + "/models/tinycode-llama";
  const int repeats = argc > 3 ? std::max(1, std::atoi(argv[3])) : 3;
  try {
    const std::string text = turbokv::read_file(path);
    auto tokenizer = turbokv::HfTokenizer::load(model + "/tokenizer.json");
    const double mb = static_cast<double>(text.size()) / 1e6;

    size_t cached_tokens = 0, plain_tokens = 0;
    tokenizer->set_cache_enabled(false);
    const Timing plain = best_of(*tokenizer, text, repeats, plain_tokens);
    tokenizer->set_cache_enabled(true);
    const Timing cold = measure(*tokenizer, text, cached_tokens);  // cache starts empty
    const Timing warm = best_of(*tokenizer, text, repeats, cached_tokens);
    std::printf("file %s: %.2f MB, %zu tokens (%s)\n", path.c_str(), mb, cached_tokens,
                cached_tokens == plain_tokens ? "both paths agree" : "PATHS DISAGREE");
    auto row = [&](const char* name, const Timing& t) {
      std::printf("%-22s: cpu %6.3f s = %6.2f MB/s   (wall %6.3f s = %6.2f MB/s)\n", name, t.cpu,
                  mb / t.cpu, t.wall, mb / t.wall);
    };
    row("plain BPE (no cache)", plain);
    row("cache, first pass", cold);
    row("cache, warm", warm);
    std::printf("speedup over plain BPE (cpu): first pass %.2fx, warm %.2fx  [best of %d]\n",
                plain.cpu / cold.cpu, plain.cpu / warm.cpu, repeats);
    return cached_tokens == plain_tokens ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tokenizer_bench: %s\n", e.what());
    return 1;
  }
}
