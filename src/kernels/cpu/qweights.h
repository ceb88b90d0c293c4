// Quantized weight formats as they are stored in checkpoint files, kept as they are in memory
// (usually memory-mapped) and read by the matmul kernels; the same bytes can be uploaded to a
// GPU unchanged. Every row of a matrix is an independent run of blocks (GGUF) or groups
// (MLX affine) along the input dimension, so a row's bytes start at row * row_bytes.
//
// GGUF block formats (llama.cpp's ggml layouts, little-endian, f16 = IEEE half):
//   Q8_0 : 32 values, 34 bytes  { f16 d; int8 q[32] }                   w = d·q
//   Q4_0 : 32 values, 18 bytes  { f16 d; u8 qs[16] }                    w = d·(q − 8);
//          value j < 16 is the low nibble of qs[j], value j + 16 its high nibble
//   Q5_0 : 32 values, 22 bytes  { f16 d; u32 qh; u8 qs[16] }            w = d·(q − 16);
//          the nibbles as in Q4_0, bit j of qh is bit 4 of value j
//   Q4_K : 256 values, 144 bytes { f16 d, dmin; u8 scales[12]; u8 qs[128] }
//          8 sub-blocks of 32 with 6-bit scale sc and min m: w = d·sc·q − dmin·m; each 32
//          bytes of qs hold 64 values: low nibbles the first 32, high nibbles the next 32
//   Q6_K : 256 values, 210 bytes { u8 ql[128]; u8 qh[64]; int8 scales[16]; f16 d }
//          16 sub-blocks of 16 with int8 scale sc: w = d·sc·(q − 32), q 6 bits (4 in ql, 2 in qh)
// MLX affine (mlx.nn.QuantizedLinear): codes as uint32 words, `bits` bits per value packed
// LSB-first (value j of a word sits at bits [j·bits, (j+1)·bits)); per group of group_size
// consecutive inputs a scale s and a bias b (f16 or bf16 tensors [rows, cols / group_size]):
//   w = s·q + b
#pragma once

#include <cstdint>
#include <vector>

#include "core/safetensors.h"

namespace turbokv {

enum class WeightFormat : uint8_t { kDense, kQ8_0, kQ4_0, kQ5_0, kQ4_K, kQ6_K, kAffine };

const char* weight_format_name(WeightFormat format);

// The block geometry of a GGUF format (kDense and kAffine have none: 0, 0).
struct BlockGeometry {
  int elems = 0;  // values per block
  int bytes = 0;  // bytes per block
};
BlockGeometry block_geometry(WeightFormat format);

// MLX affine parameters of a WeightMatrix in format kAffine.
struct AffineParams {
  const uint8_t* scales = nullptr;  // [rows, cols / group_size] of scale_dtype
  const uint8_t* biases = nullptr;  // [rows, cols / group_size] of scale_dtype
  DType scale_dtype = DType::BF16;  // F16 or BF16
  int bits = 0;                     // 2, 3, 4, 5, 6 or 8
  int group_size = 0;               // 32, 64 or 128
};

struct WeightMatrix;

// Reference dequantization of rows [begin, begin + count) of any format: out [count, cols].
// Plain scalar code written from the layouts above; the fast kernels are tested against it.
void dequantize_rows_ref(const WeightMatrix& w, int64_t begin, int64_t count, float* out);

// Activations quantized to int8 for the integer dot products (llama.cpp's Q8_0 scheme): per
// block of 32 values d = max|x| / 127, q = round(x / d). For MLX 4-bit weights the values of
// each 32-window are stored evens first, then odds ([x0, x2, .., x30, x1, x3, .., x31]), which
// is the order the low and high nibbles of 16 packed bytes unpack to.
struct ActivationBlocks {
  int64_t m = 0, cols = 0;
  bool nibble_order = false;
  std::vector<int8_t> q;    // [m, cols]
  std::vector<float> d;     // [m, cols / 32]
  std::vector<float> dsum;  // [m, cols / 32] d · Σ q of the block
  // Per 4 consecutive stored values (one int32 lane of a dot-product instruction), for the
  // AVX-512 VNNI kernels: Σ q of the 4 and the block's d.
  std::vector<int32_t> sum4;  // [m, cols / 4]
  std::vector<float> d4;      // [m, cols / 4]
};
// Whether w's integer kernel reads activations in nibble order (MLX 4-bit).
bool uses_nibble_order(const WeightMatrix& w);
// Quantizes x [m, cols] (cols a multiple of 32).
ActivationBlocks quantize_activations(const float* x, int64_t m, int64_t cols, bool nibble_order);

// Reference of the integer path: y[i, n] = Σ_k dequant(w)[n, k] · d_b(k) · q[i, k] in double,
// n in [row_begin, row_end) (y rows are w.rows long).
void qmatmul_rows_ref(const ActivationBlocks& x, const WeightMatrix& w, int64_t row_begin,
                      int64_t row_end, float* y);

// True when the decode path multiplies quantized weights with int8 activations (the default
// with AVX2); false when TURBOKV_F32_ACTIVATIONS=1 or TURBOKV_FORCE_SCALAR=1 is set, or the
// CPU has no AVX2: then weight rows are dequantized and multiplied in f32.
bool int8_activations_enabled();
// TURBOKV_F32_ACTIVATIONS set (and not "0"): the reference mode, every product of quantized
// weights on fp32 activations (read once from the environment; the GPU kernels honour it too).
bool f32_reference_mode();

}  // namespace turbokv
