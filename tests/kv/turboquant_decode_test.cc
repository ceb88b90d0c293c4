// Attention on TurboQuant codes against a double-precision reference over the dequantized
// cache: the decode kernel (one query, codebook lookups in registers; AVX2 and AVX-512) and
// the tile path it falls back to (split codecs, > 4 bits, prefill, scalar), on the shared
// random cases and on real post-RoPE q/k/v of the shipped model. The stated accuracy is
// kRowTolerance on the relative L2 error of every output row, the same for every path.
// Results must not depend on the thread count.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "attention_harness.h"
#include "core/safetensors.h"
#include "core/threads.h"
#include "kv/turboquant_kv_cache.h"

namespace turbokv {
namespace {

using testing::AttentionCase;

constexpr double kRowTolerance = 1e-4;

// Every configuration the decode kernel takes (one MSE segment of 1..4 bits per tensor), with
// and without norm correction, then two it does not take (split keys, 5 bits).
const TurboQuantKVConfig kConfigs[] = {
    {3, 4, 0, true}, {4, 4, 1, true},  {2, 3, 2, true},   {1, 2, 3, true}, {2, 2, 4, true},
    {4, 3, 5, true}, {3, 4, 6, false}, {3.5, 4, 7, true}, {5, 4, 8, true},
};

std::string config_name(const TurboQuantKVConfig& c) {
  return "K" + std::to_string(c.key_bits).substr(0, 3) + " V" +
         std::to_string(c.value_bits).substr(0, 3) + (c.norm_correction ? "" : " no-nc");
}

// The dequantized cache as an f32 view of its first n tokens.
DenseKVView first_tokens(DenseKVView view, int64_t n) {
  view.n_tokens = n;
  return view;
}
TurboQuantKVView first_tokens(TurboQuantKVView view, int64_t n) {
  view.n_tokens = n;
  return view;
}

TEST(TurboQuantDecode, EveryIsaWithinRowToleranceOfDoubleReference) {
  double worst[std::size(testing::kAllIsas)] = {};
  uint32_t seed = 900;
  size_t next_config = 0;
  for (const AttentionCase& c : testing::attention_cases()) {
    if (c.n_q != 1 || c.head_dim % 8 != 0) continue;
    const auto in = testing::make_inputs(c, seed++);
    // Three configurations per case, cycling through all of them over the cases.
    for (int k = 0; k < 3; ++k) {
      const TurboQuantKVConfig& config = kConfigs[next_config++ % std::size(kConfigs)];
      TurboQuantKVCache cache(c.kv_heads, c.head_dim, config);
      cache.append(in.k.data(), in.v.data(), static_cast<int>(c.n_tokens()));
      const DenseKVCache dequantized = cache.to_dense();
      const AttentionQueries queries{in.q.data(), c.n_q, c.n_past};
      const auto expected =
          testing::attention_reference_f64(dequantized.view(), queries, c.params());
      for (AttentionIsa isa : testing::kAllIsas) {
        auto got = testing::output_buffer(c);
        attention_turboquant(cache.view(), queries, c.params(), got.data(), isa);
        const double err = testing::max_row_relative_error(expected, got, c.head_dim);
        worst[int(isa)] = std::max(worst[int(isa)], err);
        EXPECT_LE(err, kRowTolerance)
            << config_name(config) << " " << attention_isa_name(isa) << ", " << c.name();
      }
    }
  }
  std::printf("worst row error vs double reference:");
  for (AttentionIsa isa : testing::kAllIsas) {
    std::printf(" %s %.2e", attention_isa_name(isa), worst[int(isa)]);
  }
  std::printf("\n");
}

// q [n_heads, n, d] as stored in the fixture -> [n, n_heads, d] as the kernels take it.
std::vector<float> query_major(const TensorView& t) {
  const std::vector<float> x = SafetensorsFile::to_f32(t);
  const int64_t heads = t.shape[0], n = t.shape[1], d = t.shape[2];
  std::vector<float> out(x.size());
  for (int64_t h = 0; h < heads; ++h) {
    for (int64_t i = 0; i < n; ++i) {
      std::copy_n(&x[(h * n + i) * d], d, &out[(i * heads + h) * d]);
    }
  }
  return out;
}

TEST(TurboQuantDecode, RealQkvWithinRowToleranceOfDoubleReference) {
  const auto file = SafetensorsFile::open(std::string(TURBOKV_SOURCE_DIR) +
                                          "/tests/fixtures/tinycode-llama-qkv-slice.safetensors");
  const int64_t q_first = std::stoll(file.metadata().at("q_first_pos"));
  double worst = 0;
  for (int layer : {1, 4}) {
    const std::string prefix = "layer" + std::to_string(layer) + ".";
    const TensorView& kt = file.at(prefix + "k");
    const int kv_heads = int(kt.shape[0]), tokens = int(kt.shape[1]), d = int(kt.shape[2]);
    const std::vector<float> k = query_major(kt), v = query_major(file.at(prefix + "v"));
    const std::vector<float> q = query_major(file.at(prefix + "q"));
    const int n_heads = int(file.at(prefix + "q").shape[0]);
    const int n_q = tokens - int(q_first);
    const AttentionParams params{n_heads, 1.0f / std::sqrt(float(d)), 0, 0};
    {
      for (const TurboQuantKVConfig& config : kConfigs) {
        TurboQuantKVCache cache(kv_heads, d, config);
        // A prefill of 512 tokens (fixes the split channel orders), then the rest.
        const size_t row = size_t(kv_heads) * d;
        cache.append(k.data(), v.data(), 512);
        cache.append(k.data() + 512 * row, v.data() + 512 * row, tokens - 512);
        const DenseKVCache dequantized = cache.to_dense();
        const std::string name = config_name(config) + " layer " + std::to_string(layer) + " ";
        // Decode at three positions (past the 512-key split), then the whole chunk at once.
        for (int i : {0, 11, n_q - 1}) {
          const int64_t pos = q_first + i;
          const AttentionQueries query{q.data() + size_t(i) * n_heads * d, 1, pos};
          const auto expected = testing::attention_reference_f64(
              first_tokens(dequantized.view(), pos + 1), query, params);
          for (AttentionIsa isa : testing::kAllIsas) {
            std::vector<float> got(size_t(n_heads) * d);
            attention_turboquant(first_tokens(cache.view(), pos + 1), query, params, got.data(),
                                 isa);
            const double err = testing::max_row_relative_error(expected, got, d);
            worst = std::max(worst, err);
            EXPECT_LE(err, kRowTolerance)
                << name << attention_isa_name(isa) << " decode at " << pos;
          }
        }
        const AttentionQueries chunk{q.data(), n_q, q_first};
        const auto expected = testing::attention_reference_f64(dequantized.view(), chunk, params);
        for (AttentionIsa isa : testing::kAllIsas) {
          std::vector<float> got(size_t(n_q) * n_heads * d);
          attention_turboquant(cache.view(), chunk, params, got.data(), isa);
          EXPECT_LE(testing::max_row_relative_error(expected, got, d), kRowTolerance)
              << name << attention_isa_name(isa) << " chunk of " << n_q;
        }
      }
    }
  }
  std::printf("real q/k/v: worst decode row error vs double reference %.2e\n", worst);
}

TEST(TurboQuantDecode, ResultsDoNotDependOnThreadCount) {
  const AttentionCase c{128, 2, 4, 3000, 1};  // 6 key splits per KV head
  const auto in = testing::make_inputs(c, 31);
  const int threads_before = num_threads();
  for (const TurboQuantKVConfig& config : {kConfigs[0], kConfigs[7]}) {
    TurboQuantKVCache cache(c.kv_heads, c.head_dim, config);
    cache.append(in.k.data(), in.v.data(), static_cast<int>(c.n_tokens()));
    const AttentionQueries queries{in.q.data(), c.n_q, c.n_past};
    for (AttentionIsa isa : testing::kAllIsas) {
      std::vector<std::vector<float>> outs;
      for (int threads : {1, 2, 3}) {
        set_num_threads(threads);
        auto& out = outs.emplace_back(testing::output_buffer(c));
        attention_turboquant(cache.view(), queries, c.params(), out.data(), isa);
      }
      for (size_t i = 1; i < outs.size(); ++i) {
        EXPECT_EQ(std::memcmp(outs[0].data(), outs[i].data(), outs[0].size() * sizeof(float)), 0)
            << config_name(config) << " " << attention_isa_name(isa);
      }
    }
  }
  set_num_threads(threads_before);
}

}  // namespace
}  // namespace turbokv
