// Codec throughput at d = 128, b = 3 and 4, 1 and 2 threads: quantize (norm, rotation,
// nearest centroid, pack), score (rotated query against packed codes; also two query heads
// per pass, per query) and accumulate (weighted sum of coded vectors), each beside an
// AVX2+FMA fp32 dot-product loop over the same vectors, measured in the same run.
// GB/s are of fp32 input (n · d · 4 bytes), so the columns compare work per vector.
// Usage: bench_codec [--vectors N] [--reps R]
#include <immintrin.h>
#include <time.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "core/cpu.h"
#include "core/rng.h"
#include "core/threads.h"
#include "quant/codec_mse.h"

using namespace turbokv;
using namespace turbokv::quant;

namespace {

double cpu_seconds() {
  timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
}

// Best of reps: wall-clock seconds, and CPU seconds of all threads (the per-core cost, less
// disturbed than wall time when other processes share the cores).
struct Timing {
  double wall = 1e30, cpu = 1e30;
};

template <typename Fn>
Timing best_of(int reps, Fn&& fn) {
  Timing best;
  for (int r = 0; r < reps; ++r) {
    const auto start = std::chrono::steady_clock::now();
    const double cpu_start = cpu_seconds();
    fn();
    best.cpu = std::min(best.cpu, cpu_seconds() - cpu_start);
    best.wall = std::min(
        best.wall, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  return best;
}

// The fp32 baseline: scores[t] = <q, x_t>, 4 FMA accumulators, d a multiple of 32.
void fp32_dots(const float* q, const float* x, int64_t n, int d, float* scores) {
  parallel_for(n, 1024, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const float* row = x + t * d;
      __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
      for (int i = 0; i < d; i += 32) {
        a0 = _mm256_fmadd_ps(_mm256_loadu_ps(q + i), _mm256_loadu_ps(row + i), a0);
        a1 = _mm256_fmadd_ps(_mm256_loadu_ps(q + i + 8), _mm256_loadu_ps(row + i + 8), a1);
        a2 = _mm256_fmadd_ps(_mm256_loadu_ps(q + i + 16), _mm256_loadu_ps(row + i + 16), a2);
        a3 = _mm256_fmadd_ps(_mm256_loadu_ps(q + i + 24), _mm256_loadu_ps(row + i + 24), a3);
      }
      const __m256 s = _mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3));
      __m128 h = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
      h = _mm_add_ps(h, _mm_movehl_ps(h, h));
      h = _mm_add_ss(h, _mm_shuffle_ps(h, h, 1));
      scores[t] = _mm_cvtss_f32(h);
    }
  });
}

}  // namespace

int main(int argc, char** argv) {
  int64_t n = 1 << 17;
  int reps = 5;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (std::strcmp(argv[i], "--vectors") == 0) n = std::atoll(argv[i + 1]);
    if (std::strcmp(argv[i], "--reps") == 0) reps = std::atoi(argv[i + 1]);
  }
  if (!cpu_has_avx2()) {
    std::fprintf(stderr, "bench_codec needs AVX2 for its fp32 baseline\n");
    return 1;
  }
  const int d = 128;
  std::vector<float> x(size_t(n) * d), q(d), scores(n);  // x [n, d]
  std::vector<float> scores_pair(2 * size_t(n));         // per chunk of rows: [2, chunk] scores
  Xoshiro256 rng(1);
  for (auto& v : x) v = float(rng.gaussian());
  for (auto& v : q) v = float(rng.gaussian());
  const double gb = double(n) * d * 4 / 1e9;
  std::printf("d=%d, %lld vectors (%.0f MB fp32), best of %d runs, %s\n", d,
              static_cast<long long>(n), gb * 1e3, reps,
              best_isa() == Isa::kAvx2 ? "AVX2" : "scalar");
  std::printf(
      "wall: Mvec/s and GB/s of fp32 input; per core: GB/s per CPU-second of all threads\n");
  std::printf("%4s %7s %-10s %10s %10s %14s %16s\n", "bits", "threads", "op", "Mvec/s", "GB/s",
              "GB/s per core", "fp32 dot time /");
  for (int bits : {3, 4}) {
    const MseCodec codec({d, bits, 0, RotationRole::kKey, true});
    std::vector<uint8_t> codes(size_t(n) * codec.code_bytes());  // [n, code_bytes]
    std::vector<uint16_t> norms(n);                              // [n]
    for (int threads : {1, 2}) {
      set_num_threads(threads);
      const Timing quantize =
          best_of(reps, [&] { codec.quantize_batch(x.data(), n, codes.data(), norms.data()); });
      const Timing score = best_of(reps, [&] {
        std::vector<float> rq(d);
        codec.rotate_query(q.data(), rq.data());
        parallel_for(n, 1024, [&](int64_t begin, int64_t end) {
          codec.score(rq.data(), codes.data() + begin * codec.code_bytes(), norms.data() + begin,
                      end - begin, scores.data() + begin);
        });
      });
      // Two query heads per KV head (GQA) in one pass; timing per query (halved below).
      Timing score_gqa2 = best_of(reps, [&] {
        std::vector<float> rq(2 * d);  // [2, d]
        codec.rotate_query(q.data(), rq.data());
        codec.rotate_query(q.data(), rq.data() + d);
        parallel_for(n, 1024, [&](int64_t begin, int64_t end) {
          codec.score_multi(rq.data(), 2, codes.data() + begin * codec.code_bytes(),
                            norms.data() + begin, end - begin, scores_pair.data() + 2 * begin);
        });
      });
      score_gqa2.wall /= 2;
      score_gqa2.cpu /= 2;
      // Σ_t w_t · vector t (attention's value side), split over threads, partial sums merged.
      const Timing accumulate = best_of(reps, [&] {
        std::vector<float> partial(size_t(threads) * d, 0.0f);  // [threads, d]
        parallel_tasks(threads, [&](int task) {
          const int64_t begin = n * task / threads, end = n * (task + 1) / threads;
          codec.accumulate(scores.data() + begin, codes.data() + begin * codec.code_bytes(),
                           norms.data() + begin, end - begin, partial.data() + size_t(task) * d);
        });
      });
      const Timing dot = best_of(reps, [&] { fp32_dots(q.data(), x.data(), n, d, scores.data()); });
      auto row = [&](const char* op, const Timing& t) {
        std::printf("%4d %7d %-10s %10.2f %10.2f %14.2f %9.2f wall\n", bits, threads, op,
                    n / t.wall / 1e6, gb / t.wall, gb / t.cpu, dot.wall / t.wall);
      };
      row("quantize", quantize);
      row("score", score);
      row("score-gqa2", score_gqa2);
      row("accumulate", accumulate);
      row("fp32-dot", dot);
    }
  }
  return 0;
}
