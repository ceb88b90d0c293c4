// Fast matmul (see matmul.h): AVX2 dot products for few activation rows, OpenBLAS sgemm on
// widened weight panels for many. Both split the output features (of all products of a
// matmul_many) over the thread pool.
#include "kernels/cpu/matmul.h"

#include <cblas.h>

#include <algorithm>
#include <mutex>
#include <vector>

#include "core/cpu.h"
#include "core/threads.h"
#include "kernels/cpu/matmul_avx2.h"
#include "kernels/cpu/qmatmul_avx2.h"
#include "kernels/cpu/qmatmul_avx512.h"

extern "C" void openblas_set_num_threads(int num_threads);

namespace turbokv {
namespace {

// At this many activation rows and above, one widened weight panel feeds an sgemm; below, the
// weights are streamed once through AVX2 dot products (decode is bound by reading weights).
constexpr int64_t kGemmMinRows = 8;
// Weight rows widened per sgemm call: the f32 panel stays within a few MB of cache per thread.
constexpr int64_t kPanelRows = 128;

// Our pool provides the parallelism; OpenBLAS must not start threads of its own inside it.
void make_openblas_single_threaded() {
  static std::once_flag once;
  std::call_once(once, [] { openblas_set_num_threads(1); });
}

// Output features [begin, end) of one product through sgemm on widened weight panels.
void gemm_rows(const float* x, int64_t m, const WeightMatrix& w, int64_t begin, int64_t end,
               float* y) {
  thread_local std::vector<float> panel;  // [kPanelRows, w.cols]
  for (int64_t p = begin; p < end; p += kPanelRows) {
    const int64_t rows = std::min(kPanelRows, end - p);
    const float* wp;
    if (w.format == WeightFormat::kDense && w.dtype == DType::F32) {
      wp = reinterpret_cast<const float*>(w.data) + p * w.cols;
    } else {
      panel.resize(size_t(rows * w.cols));
      widen_rows(w, p, rows, panel.data());
      wp = panel.data();
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, int(m), int(rows), int(w.cols), 1.0f, x,
                int(w.cols), wp, int(w.cols), 0.0f, y + p, int(w.rows));
  }
}

// Output features [begin, end) of a quantized product with f32 activations and few rows:
// weight rows dequantized panel by panel, then the f32 dot products.
void dequantized_rows(const float* x, int64_t m, const WeightMatrix& w, int64_t begin, int64_t end,
                      float* y) {
  thread_local std::vector<float> panel, out;  // [kPanelRows, w.cols], [m, kPanelRows]
  for (int64_t p = begin; p < end; p += kPanelRows) {
    const int64_t rows = std::min(kPanelRows, end - p);
    panel.resize(size_t(rows * w.cols));
    out.resize(size_t(m * rows));
    widen_rows(w, p, rows, panel.data());
    const WeightMatrix f32{DType::F32, reinterpret_cast<const uint8_t*>(panel.data()), rows,
                           w.cols};
    avx2::matmul_rows(x, m, f32, 0, rows, out.data());
    for (int64_t i = 0; i < m; ++i) {
      std::copy_n(out.data() + i * rows, rows, y + i * w.rows + p);
    }
  }
}

// Output features [begin, end) of one product, bias included. xq: the product's activations
// as int8 blocks (quantized weights decoding with int8 activations), else null.
void product_rows(const MatmulJob& job, const ActivationBlocks* xq, int64_t m, int64_t begin,
                  int64_t end) {
  const WeightMatrix& w = job.w;
  if (xq != nullptr) {
    // Q8_0 stays on AVX2: its VNNI kernel is no faster (bench_qmatmul), the others are.
    if (avx512::qmatmul_vnni_available() && avx512::qmatmul_supported(w) &&
        w.format != WeightFormat::kQ8_0) {
      avx512::qmatmul_rows(*xq, w, begin, end, job.y);
    } else if (cpu_has_avx2() && avx2::qmatmul_supported(w)) {
      avx2::qmatmul_rows(*xq, w, begin, end, job.y);
    } else {
      qmatmul_rows_ref(*xq, w, begin, end, job.y);
    }
  } else if (cpu_has_avx2() && m < kGemmMinRows) {
    if (w.format == WeightFormat::kDense) {
      avx2::matmul_rows(job.x, m, w, begin, end, job.y);
    } else {
      dequantized_rows(job.x, m, w, begin, end, job.y);
    }
  } else {
    gemm_rows(job.x, m, w, begin, end, job.y);
  }
  if (job.bias != nullptr) {
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t n = begin; n < end; ++n) job.y[i * w.rows + n] += job.bias[n];
    }
  }
}

}  // namespace

void matmul_many(int64_t m, std::span<const MatmulJob> jobs) {
  int64_t total_rows = 0;
  for (const MatmulJob& job : jobs) {
    check_weight_dtype(job.w);
    total_rows += job.w.rows;
  }
  if (m <= 0 || total_rows <= 0) return;
  make_openblas_single_threaded();
  // Decoding on quantized weights: each distinct activation input quantized once.
  std::vector<ActivationBlocks> quantized;
  std::vector<const ActivationBlocks*> job_xq(jobs.size(), nullptr);
  if (m < kGemmMinRows && int8_activations_enabled()) {
    quantized.reserve(jobs.size());
    for (size_t j = 0; j < jobs.size(); ++j) {
      const WeightMatrix& w = jobs[j].w;
      if (w.format == WeightFormat::kDense) continue;
      const bool nibbles = uses_nibble_order(w);
      for (size_t i = 0; i < j && job_xq[j] == nullptr; ++i) {
        if (job_xq[i] != nullptr && jobs[i].x == jobs[j].x && job_xq[i]->nibble_order == nibbles &&
            jobs[i].w.cols == w.cols) {
          job_xq[j] = job_xq[i];
        }
      }
      if (job_xq[j] == nullptr) {
        quantized.push_back(quantize_activations(jobs[j].x, m, w.cols, nibbles));
        job_xq[j] = &quantized.back();
      }
    }
  }
  // The output features of all jobs, end to end, split over the threads.
  parallel_for(total_rows, 16, [&](int64_t begin, int64_t end) {
    int64_t offset = 0;
    for (size_t j = 0; j < jobs.size(); ++j) {
      const MatmulJob& job = jobs[j];
      const int64_t first = std::max(begin, offset), last = std::min(end, offset + job.w.rows);
      if (first < last) product_rows(job, job_xq[j], m, first - offset, last - offset);
      offset += job.w.rows;
    }
  });
}

void matmul(const float* x, int64_t m, const WeightMatrix& w, const float* bias, float* y) {
  const MatmulJob job{x, w, bias, y};
  matmul_many(m, {&job, 1});
}

void widen_rows(const WeightMatrix& w, int64_t begin, int64_t count, float* out) {
  check_weight_dtype(w);
  if (w.format != WeightFormat::kDense) {
    dequantize_rows_ref(w, begin, count, out);
  } else if (cpu_has_avx2()) {
    avx2::widen_rows(w, begin, count, out);
  } else {
    widen_rows_ref(w, begin, count, out);
  }
}

void gather_rows(const WeightMatrix& w, const int32_t* rows, int64_t n, float scale, float* out) {
  check_gather_rows(w, rows, n);
  for (int64_t i = 0; i < n; ++i) {
    float* row = out + i * w.cols;
    widen_rows(w, rows[i], 1, row);
    if (scale != 1.0f) {
      for (int64_t k = 0; k < w.cols; ++k) row[k] *= scale;
    }
  }
}

}  // namespace turbokv
