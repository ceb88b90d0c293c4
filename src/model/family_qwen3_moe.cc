// Qwen3-MoE: qwen3 attention (q/k norm) with a sparse MLP. A router (mlp.gate) scores the
// experts; each token runs its top_k experts (softmax over all experts, then top_k,
// renormalized when norm_topk_prob) and sums their outputs by those weights. Layers listed in
// mlp_only_layers, or off the decoder_sparse_step grid, keep a dense MLP.
#include <algorithm>
#include <cmath>
#include <numeric>

#include "core/error.h"
#include "model/config_json.h"
#include "model/decoder.h"
#include "model/families.h"

namespace turbokv {

using config_json::get_bool;
using config_json::get_int;

void configure_qwen3_moe(const nlohmann::json& j, const std::string& path, ModelConfig& c) {
  configure_qwen3(j, path, c);
  std::optional<int64_t> experts = get_int(j, "num_experts", path, 0, config_json::kIntMax);
  if (!experts) experts = get_int(j, "num_local_experts", path, 0, config_json::kIntMax);
  c.num_experts = int(experts.value_or(0));
  c.num_experts_per_token =
      int(get_int(j, "num_experts_per_tok", path, 0, config_json::kIntMax).value_or(0));
  c.moe_intermediate_size =
      int(get_int(j, "moe_intermediate_size", path, 0, config_json::kIntMax).value_or(0));
  c.norm_topk_prob = get_bool(j, "norm_topk_prob", path).value_or(false);
  if (c.num_experts <= 0) return;
  if (c.num_experts_per_token <= 0 || c.num_experts_per_token > c.num_experts ||
      c.moe_intermediate_size <= 0) {
    throw FormatError(str_cat(path, ": num_experts_per_tok ", c.num_experts_per_token,
                              " must be in 1..", c.num_experts, " and moe_intermediate_size ",
                              c.moe_intermediate_size, " > 0"));
  }
  const int64_t step = std::max<int64_t>(
      1, get_int(j, "decoder_sparse_step", path, 0, config_json::kIntMax).value_or(1));
  std::vector<int64_t> dense_layers;
  if (auto it = j.find("mlp_only_layers"); it != j.end() && it->is_array()) {
    for (const auto& v : *it) {
      if (!v.is_number_integer()) {
        throw FormatError(
            str_cat(path, ": mlp_only_layers must hold layer indices, got ", it->dump()));
      }
      dense_layers.push_back(v.get<int64_t>());
    }
  }
  c.moe_layer.assign(size_t(c.num_layers), false);
  for (int l = 0; l < c.num_layers; ++l) {
    const bool dense = std::find(dense_layers.begin(), dense_layers.end(), l) != dense_layers.end();
    c.moe_layer[size_t(l)] = !dense && (l + 1) % step == 0;
  }
}

void moe_route(const MoeWeights& w, float* p, int* experts, float* weights) {
  if (w.routing == MoeRouting::kSigmoidGroupedTopK) {
    moe_route_sigmoid_grouped(w, p, experts, weights);
    return;
  }
  const int n_experts = int(w.experts.size());
  const float max = *std::max_element(p, p + n_experts);
  double sum = 0;
  for (int e = 0; e < n_experts; ++e) sum += (p[e] = std::exp(p[e] - max));
  for (int e = 0; e < n_experts; ++e) p[e] = float(p[e] / sum);
  std::vector<int> order(static_cast<size_t>(n_experts));
  std::iota(order.begin(), order.end(), 0);
  std::partial_sort(order.begin(), order.begin() + w.top_k, order.end(),
                    [&](int a, int b) { return p[a] > p[b] || (p[a] == p[b] && a < b); });
  float top_sum = 0;
  for (int i = 0; i < w.top_k; ++i) top_sum += p[order[size_t(i)]];
  for (int i = 0; i < w.top_k; ++i) {
    const int e = order[size_t(i)];
    experts[i] = e;
    weights[i] = w.norm_topk_prob ? p[e] / top_sum : p[e];
  }
}

void moe_forward(const MoeWeights& w, Activation act, const float* x, int64_t n, int64_t hidden,
                 float* out) {
  const int n_experts = int(w.experts.size());
  std::vector<float> probs(size_t(n * n_experts));  // [n, experts]
  matmul(x, n, w.router, nullptr, probs.data());
  // Per expert: the tokens routed to it and their weights.
  std::vector<std::vector<int64_t>> routed(static_cast<size_t>(n_experts));
  std::vector<std::vector<float>> routed_weight(static_cast<size_t>(n_experts));
  std::vector<int> chosen(static_cast<size_t>(w.top_k));
  std::vector<float> chosen_weight(static_cast<size_t>(w.top_k));
  for (int64_t t = 0; t < n; ++t) {
    moe_route(w, probs.data() + t * n_experts, chosen.data(), chosen_weight.data());
    for (int i = 0; i < w.top_k; ++i) {
      routed[size_t(chosen[size_t(i)])].push_back(t);
      routed_weight[size_t(chosen[size_t(i)])].push_back(chosen_weight[size_t(i)]);
    }
  }
  std::fill(out, out + n * hidden, 0.0f);
  for (int e = 0; e < n_experts; ++e) {
    const std::vector<int64_t>& tokens = routed[size_t(e)];
    if (tokens.empty()) continue;
    const int64_t m = int64_t(tokens.size());
    std::vector<float> xe(size_t(m * hidden)), ye(size_t(m * hidden));  // [m, H]
    for (int64_t i = 0; i < m; ++i) {
      std::copy_n(x + tokens[size_t(i)] * hidden, hidden, xe.data() + i * hidden);
    }
    mlp_forward(w.experts[size_t(e)], act, xe.data(), m, ye.data());
    for (int64_t i = 0; i < m; ++i) {
      float* o = out + tokens[size_t(i)] * hidden;
      const float weight = routed_weight[size_t(e)][size_t(i)];
      for (int64_t h = 0; h < hidden; ++h) o[h] += ye[size_t(i * hidden + h)] * weight;
    }
  }
  if (w.shared_expert) {
    std::vector<float> shared(size_t(n * hidden));  // [n, H]
    mlp_forward(*w.shared_expert, act, x, n, shared.data());
    if (w.shared_gate.data != nullptr) {
      std::vector<float> gate(static_cast<size_t>(n));  // [n, 1]
      matmul(x, n, w.shared_gate, nullptr, gate.data());
      for (int64_t t = 0; t < n; ++t) {
        const float s = 1.0f / (1.0f + std::exp(-gate[size_t(t)]));
        for (int64_t h = 0; h < hidden; ++h) shared[size_t(t * hidden + h)] *= s;
      }
    }
    for (size_t i = 0; i < shared.size(); ++i) out[i] += shared[i];
  }
}

}  // namespace turbokv
