// AVX2 + FMA + F16C matmul pieces: dot products of activation rows with weight rows widened
// from f32/f16/bf16 eight lanes at a time (decode), and weight-row widening for the sgemm path.
#include "kernels/cpu/matmul_avx2.h"

#include <immintrin.h>

#include <algorithm>
#include <cstring>

#include "core/half.h"

namespace turbokv::avx2 {
namespace {

template <DType D>
inline __m256 load8(const uint8_t* row, int64_t k) {
  if constexpr (D == DType::F32) {
    return _mm256_loadu_ps(reinterpret_cast<const float*>(row) + k);
  } else {
    const __m128i h = _mm_loadu_si128(
        reinterpret_cast<const __m128i*>(reinterpret_cast<const uint16_t*>(row) + k));
    if constexpr (D == DType::F16) {
      return _mm256_cvtph_ps(h);
    } else {
      return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
    }
  }
}

template <DType D>
inline float load1(const uint8_t* row, int64_t k) {
  if constexpr (D == DType::F32) {
    return reinterpret_cast<const float*>(row)[k];
  } else if constexpr (D == DType::F16) {
    return f16_to_f32(reinterpret_cast<const uint16_t*>(row)[k]);
  } else {
    return bf16_to_f32(reinterpret_cast<const uint16_t*>(row)[k]);
  }
}

inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_hadd_ps(s, s);
  s = _mm_hadd_ps(s, s);
  return _mm_cvtss_f32(s);
}

// out[g * ldo] = <x[g, :], wrow> for g in [0, G): one pass over the weight row serves G
// activation rows; U independent accumulators per row hide the FMA latency.
template <DType D, int G>
inline void dot_group(const float* x, int64_t cols, const uint8_t* wrow, float* out, int64_t ldo) {
  constexpr int U = G == 1 ? 4 : 2;
  __m256 acc[G][U];
  for (int g = 0; g < G; ++g) {
    for (int u = 0; u < U; ++u) acc[g][u] = _mm256_setzero_ps();
  }
  int64_t k = 0;
  for (; k + 8 * U <= cols; k += 8 * U) {
    for (int u = 0; u < U; ++u) {
      const __m256 w = load8<D>(wrow, k + 8 * u);
      for (int g = 0; g < G; ++g) {
        acc[g][u] = _mm256_fmadd_ps(w, _mm256_loadu_ps(x + g * cols + k + 8 * u), acc[g][u]);
      }
    }
  }
  for (; k + 8 <= cols; k += 8) {
    const __m256 w = load8<D>(wrow, k);
    for (int g = 0; g < G; ++g) {
      acc[g][0] = _mm256_fmadd_ps(w, _mm256_loadu_ps(x + g * cols + k), acc[g][0]);
    }
  }
  for (int g = 0; g < G; ++g) {
    for (int u = 1; u < U; ++u) acc[g][0] = _mm256_add_ps(acc[g][0], acc[g][u]);
    float sum = hsum(acc[g][0]);
    for (int64_t t = k; t < cols; ++t) sum += load1<D>(wrow, t) * x[g * cols + t];
    out[g * ldo] = sum;
  }
}

template <DType D>
void matmul_rows_typed(const float* x, int64_t m, const WeightMatrix& w, int64_t row_begin,
                       int64_t row_end, float* y) {
  const int64_t row_bytes = w.cols * int64_t(dtype_size(D));
  for (int64_t n = row_begin; n < row_end; ++n) {
    const uint8_t* wrow = w.data + n * row_bytes;
    int64_t i = 0;
    for (; i + 4 <= m; i += 4)
      dot_group<D, 4>(x + i * w.cols, w.cols, wrow, y + i * w.rows + n, w.rows);
    switch (m - i) {
      case 3:
        dot_group<D, 3>(x + i * w.cols, w.cols, wrow, y + i * w.rows + n, w.rows);
        break;
      case 2:
        dot_group<D, 2>(x + i * w.cols, w.cols, wrow, y + i * w.rows + n, w.rows);
        break;
      case 1:
        dot_group<D, 1>(x + i * w.cols, w.cols, wrow, y + i * w.rows + n, w.rows);
        break;
      default:
        break;
    }
  }
}

template <DType D>
void widen_rows_typed(const WeightMatrix& w, int64_t begin, int64_t count, float* out) {
  const uint8_t* src = w.data + begin * w.cols * int64_t(dtype_size(D));
  const int64_t n = count * w.cols;
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(out + i, load8<D>(src, i));
  for (; i < n; ++i) out[i] = load1<D>(src, i);
}

}  // namespace

void matmul_rows(const float* x, int64_t m, const WeightMatrix& w, int64_t row_begin,
                 int64_t row_end, float* y) {
  switch (w.dtype) {
    case DType::F32:
      return matmul_rows_typed<DType::F32>(x, m, w, row_begin, row_end, y);
    case DType::F16:
      return matmul_rows_typed<DType::F16>(x, m, w, row_begin, row_end, y);
    default:
      return matmul_rows_typed<DType::BF16>(x, m, w, row_begin, row_end, y);
  }
}

void widen_rows(const WeightMatrix& w, int64_t begin, int64_t count, float* out) {
  switch (w.dtype) {
    case DType::F32:
      std::memcpy(out, w.data + begin * w.cols * 4, size_t(count * w.cols) * 4);
      return;
    case DType::F16:
      return widen_rows_typed<DType::F16>(w, begin, count, out);
    default:
      return widen_rows_typed<DType::BF16>(w, begin, count, out);
  }
}

}  // namespace turbokv::avx2
