// Decode matrix-vector products on quantized weights, one thread: the AVX2 and the AVX-512 VNNI
// integer kernels on the same weights and activations, timed interleaved in one run, with the
// bf16 AVX2 product of the same shape as the baseline. Per kernel the minimum and the median
// thread-CPU time over the rounds (the minimum is the steadiest figure on a shared machine),
// and the ratios of the minimums. Shapes: tinycode-llama's gate/up [1408, 512], down
// [512, 1408] and lm_head [8192, 512], and a ~1B model's gate/up [5632, 2048].
//   ./build/bench/model/bench_qmatmul [rounds]
#include <time.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "core/cpu.h"
#include "core/half.h"
#include "kernels/cpu/matmul_avx2.h"
#include "kernels/cpu/qmatmul_avx2.h"
#include "kernels/cpu/qmatmul_avx512.h"

namespace turbokv {
namespace {

double thread_seconds() {
  timespec t;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return double(t.tv_sec) + 1e-9 * double(t.tv_nsec);
}

struct Timing {
  std::vector<double> us;
  double min() const { return *std::min_element(us.begin(), us.end()); }
  double median() {
    std::sort(us.begin(), us.end());
    return us[us.size() / 2];
  }
};

// Repeats fn until at least 200 us of CPU time, returns us per call.
double time_once(const std::function<void()>& fn) {
  int reps = 0;
  const double start = thread_seconds();
  double now = start;
  do {
    fn();
    ++reps;
    now = thread_seconds();
  } while (now - start < 200e-6);
  return (now - start) * 1e6 / reps;
}

std::vector<float> random_normal(size_t n, uint32_t seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = normal(gen);
  return v;
}

void put_u16(std::vector<uint8_t>& b, size_t at, uint16_t v) {
  b[at] = uint8_t(v);
  b[at + 1] = uint8_t(v >> 8);
}

// A [rows, cols] matrix of the format with random codes and scales in 0.001..0.02 (MLX:
// groups of 64, bf16 scales and biases).
struct QuantWeights {
  std::vector<uint8_t> data, scales, biases;
  WeightMatrix w;
  QuantWeights(WeightFormat format, int bits, int64_t rows, int64_t cols) {
    std::mt19937 gen(3);
    std::uniform_real_distribution<float> scale(0.001f, 0.02f);
    w = WeightMatrix{DType::BF16, nullptr, rows, cols};
    w.format = format;
    if (format == WeightFormat::kAffine) w.affine = AffineParams{nullptr, nullptr, DType::BF16, bits, 64};
    data.resize(size_t(rows * w.row_bytes()));
    for (uint8_t& v : data) v = uint8_t(gen());
    if (format == WeightFormat::kAffine) {
      const int64_t groups = rows * cols / 64;
      scales.resize(size_t(2 * groups));
      biases.resize(size_t(2 * groups));
      for (int64_t g = 0; g < groups; ++g) {
        put_u16(scales, size_t(2 * g), f32_to_bf16(scale(gen)));
        put_u16(biases, size_t(2 * g), f32_to_bf16(-4 * scale(gen)));
      }
      w.affine.scales = scales.data();
      w.affine.biases = biases.data();
    } else {
      const BlockGeometry g = block_geometry(format);
      for (size_t at = 0; at < data.size(); at += size_t(g.bytes)) {
        if (format == WeightFormat::kQ6_K) {
          put_u16(data, at + 208, f32_to_f16(scale(gen)));
        } else {
          put_u16(data, at, f32_to_f16(scale(gen)));
          if (format == WeightFormat::kQ4_K) put_u16(data, at + 2, f32_to_f16(scale(gen)));
        }
      }
    }
    w.data = data.data();
  }
};

struct Format {
  const char* name;
  WeightFormat format;
  int bits;
};

}  // namespace
}  // namespace turbokv

int main(int argc, char** argv) {
  using namespace turbokv;
  const int rounds = argc > 1 ? std::max(1, std::atoi(argv[1])) : 30;
  if (!cpu_has_avx2()) {
    std::printf("no AVX2: nothing to compare\n");
    return 0;
  }
  const bool vnni = avx512::qmatmul_vnni_available();
  std::printf("1 thread, m = 1, %d rounds; us per product: min (median); ratios of minimums%s\n",
              rounds, vnni ? "" : " (no AVX-512 VNNI on this CPU: AVX2 only)");
  std::printf("%-10s %-12s %18s %18s %18s %9s %9s\n", "format", "shape", "bf16 avx2", "avx2 int8",
              "avx512 vnni", "vnni/avx2", "vnni/bf16");
  const Format formats[] = {{"Q4_0", WeightFormat::kQ4_0, 0}, {"Q4_K", WeightFormat::kQ4_K, 0},
                            {"Q6_K", WeightFormat::kQ6_K, 0}, {"Q5_0", WeightFormat::kQ5_0, 0},
                            {"Q8_0", WeightFormat::kQ8_0, 0}, {"MLX 4-bit", WeightFormat::kAffine, 4},
                            {"MLX 8-bit", WeightFormat::kAffine, 8}};
  const int64_t shapes[][2] = {{1408, 512}, {512, 1408}, {8192, 512}, {5632, 2048}};
  for (const auto& shape : shapes) {
    const int64_t rows = shape[0], cols = shape[1];
    std::vector<uint16_t> dense(size_t(rows * cols));
    const std::vector<float> values = random_normal(dense.size(), 5);
    for (size_t i = 0; i < dense.size(); ++i) dense[i] = f32_to_bf16(0.02f * values[i]);
    const WeightMatrix bf16{DType::BF16, reinterpret_cast<const uint8_t*>(dense.data()), rows,
                            cols};
    const std::vector<float> x = random_normal(size_t(cols), 9);
    std::vector<float> y(static_cast<size_t>(rows));
    for (const Format& f : formats) {
      if (cols % 256 != 0 && (f.format == WeightFormat::kQ4_K || f.format == WeightFormat::kQ6_K)) {
        continue;
      }
      const QuantWeights r(f.format, f.bits, rows, cols);
      const ActivationBlocks xq = quantize_activations(x.data(), 1, cols, uses_nibble_order(r.w));
      Timing t_bf16, t_avx2, t_vnni;
      for (int round = 0; round < rounds; ++round) {
        t_bf16.us.push_back(
            time_once([&] { avx2::matmul_rows(x.data(), 1, bf16, 0, rows, y.data()); }));
        t_avx2.us.push_back(time_once([&] { avx2::qmatmul_rows(xq, r.w, 0, rows, y.data()); }));
        if (vnni) {
          t_vnni.us.push_back(
              time_once([&] { avx512::qmatmul_rows(xq, r.w, 0, rows, y.data()); }));
        }
      }
      char shape_name[32], a[32], b[32], c[32];
      std::snprintf(shape_name, sizeof shape_name, "%lldx%lld", (long long)rows, (long long)cols);
      std::snprintf(a, sizeof a, "%.1f (%.1f)", t_bf16.min(), t_bf16.median());
      std::snprintf(b, sizeof b, "%.1f (%.1f)", t_avx2.min(), t_avx2.median());
      if (vnni) {
        std::snprintf(c, sizeof c, "%.1f (%.1f)", t_vnni.min(), t_vnni.median());
        std::printf("%-10s %-12s %18s %18s %18s %8.2fx %8.2fx\n", f.name, shape_name, a, b, c,
                    t_avx2.min() / t_vnni.min(), t_bf16.min() / t_vnni.min());
      } else {
        std::printf("%-10s %-12s %18s %18s %18s %9s %8.2fx\n", f.name, shape_name, a, b, "-", "-",
                    t_bf16.min() / t_avx2.min());
      }
    }
  }
  return 0;
}
