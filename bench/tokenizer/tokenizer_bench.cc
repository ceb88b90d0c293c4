// Encoding throughput on one core: the tokenizer with its per-piece BPE cache against the
// same tokenizer with the cache off (plain BPE per piece), both measured here, plus the ratio.
// Usage: tokenizer_bench [TEXT_FILE] [MODEL_DIR] [REPEATS]
//   defaults: ../shared/fixtures/tinycode-eval.txt, models/tinycode-llama, 3
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>

#include "core/error.h"
#include "tokenizer/hf_tokenizer.h"

namespace {

double seconds(const turbokv::HfTokenizer& tokenizer, const std::string& text, size_t& tokens) {
  const auto start = std::chrono::steady_clock::now();
  tokens = tokenizer.encode(text, false).size();
  const std::chrono::duration<double> took = std::chrono::steady_clock::now() - start;
  return took.count();
}

double best_seconds(const turbokv::HfTokenizer& tokenizer, const std::string& text, int repeats,
                    size_t& tokens) {
  double best = 1e30;
  for (int r = 0; r < repeats; ++r) best = std::min(best, seconds(tokenizer, text, tokens));
  return best;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string repo = TURBOKV_SOURCE_DIR;
  const std::string path = argc > 1 ? argv[1] : repo + "/../shared/fixtures/tinycode-eval.txt";
  const std::string model = argc > 2 ? argv[2] : repo + "/models/tinycode-llama";
  const int repeats = argc > 3 ? std::max(1, std::atoi(argv[3])) : 3;
  try {
    std::ifstream in(path, std::ios::binary);
    if (!in) throw turbokv::IoError("cannot open '" + path + "'");
    std::stringstream buffer;
    buffer << in.rdbuf();
    const std::string text = buffer.str();
    auto tokenizer = turbokv::HfTokenizer::load(model + "/tokenizer.json");
    const double mb = static_cast<double>(text.size()) / 1e6;

    size_t cached_tokens = 0, plain_tokens = 0;
    tokenizer->set_cache_enabled(false);
    const double plain = best_seconds(*tokenizer, text, repeats, plain_tokens);
    tokenizer->set_cache_enabled(true);
    const double cold = seconds(*tokenizer, text, cached_tokens);  // cache starts empty
    const double cached = best_seconds(*tokenizer, text, repeats, cached_tokens);
    std::printf("file %s: %.2f MB, %zu tokens (%s)\n", path.c_str(), mb, cached_tokens,
                cached_tokens == plain_tokens ? "both paths agree" : "PATHS DISAGREE");
    std::printf("plain BPE (no cache)  : %7.3f s  %6.2f MB/s  (best of %d)\n", plain, mb / plain,
                repeats);
    std::printf("cache, first pass     : %7.3f s  %6.2f MB/s\n", cold, mb / cold);
    std::printf("cache, warm           : %7.3f s  %6.2f MB/s  (best of %d)\n", cached, mb / cached,
                repeats);
    std::printf("speedup over plain BPE: first pass %.2fx, warm %.2fx\n", plain / cold,
                plain / cached);
    return cached_tokens == plain_tokens ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tokenizer_bench: %s\n", e.what());
    return 1;
  }
}
