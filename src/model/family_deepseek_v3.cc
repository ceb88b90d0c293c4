// DeepSeek-V3 (deepseek_v3): multi-head latent attention on every layer and a sparse MLP with
// shared experts from layer first_k_dense_replace on.
//  - MLA: q = q_b(norm(q_a(x))) (or q_proj without q_lora_rank), per head [nope | rope];
//    kv_a_proj_with_mqa(x) = [latent (kv_lora_rank) | k_rope (one head)]; the latent is
//    RMS-normalized and kept per token with the rotated k_rope; kv_b_proj expands it per head to
//    [k_nope | v]. Scale qk_head_dim^-1/2 (times mscale² under YaRN with mscale_all_dim).
//    rope_interleave: the rotary dims are stored as adjacent pairs.
//  - MoE: sigmoid router scores plus e_score_correction_bias choose n_group-limited top-k
//    experts; weights are the unbiased scores, normalized (norm_topk_prob) and scaled by
//    routed_scaling_factor; shared experts (moe_intermediate_size x n_shared_experts) run on
//    every token.
#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "core/error.h"
#include "model/config_json.h"
#include "model/decoder.h"
#include "model/families.h"

namespace turbokv {

using config_json::get_bool;
using config_json::get_int;
using config_json::get_number;
using config_json::require_int;

void configure_deepseek_v3(const nlohmann::json& j, const std::string& path, ModelConfig& c) {
  MlaConfig& m = c.mla;
  m.q_lora_rank = int(get_int(j, "q_lora_rank", path).value_or(0));
  m.kv_lora_rank = int(require_int(j, "kv_lora_rank", path));
  m.qk_nope_head_dim = int(require_int(j, "qk_nope_head_dim", path));
  m.qk_rope_head_dim = int(require_int(j, "qk_rope_head_dim", path));
  m.v_head_dim = int(require_int(j, "v_head_dim", path));
  m.rope_interleave = get_bool(j, "rope_interleave", path).value_or(true);
  if (m.q_lora_rank < 0 || m.kv_lora_rank <= 0 || m.qk_nope_head_dim <= 0 ||
      m.qk_rope_head_dim <= 0 || m.qk_rope_head_dim % 2 != 0 || m.v_head_dim <= 0) {
    throw FormatError(str_cat(path, ": MLA ranks q ", m.q_lora_rank, ", kv ", m.kv_lora_rank,
                              ", head dims nope ", m.qk_nope_head_dim, ", rope ",
                              m.qk_rope_head_dim, ", v ", m.v_head_dim,
                              " (positive; rope dim even)"));
  }
  c.layer_kind.assign(size_t(c.num_layers), LayerKind::kMla);
  c.qkv_bias = get_bool(j, "attention_bias", path).value_or(false);
  if (c.qkv_bias) {
    throw Unsupported(str_cat(path, ": deepseek_v3 with attention_bias is not supported"));
  }
  // The RoPE table is built for the rope part of a head.
  c.head_dim = m.qk_rope_head_dim;
  double scale = 1.0 / std::sqrt(double(m.qk_nope_head_dim + m.qk_rope_head_dim));
  if (c.rope.type == "yarn" && c.rope.mscale_all_dim && *c.rope.mscale_all_dim != 0 &&
      c.rope.factor > 1) {
    const double mscale = 0.1 * *c.rope.mscale_all_dim * std::log(c.rope.factor) + 1.0;
    scale *= mscale * mscale;
  }
  c.attention_scale = float(scale);

  c.num_experts = int(get_int(j, "n_routed_experts", path).value_or(0));
  if (c.num_experts <= 0) return;
  c.num_experts_per_token = int(require_int(j, "num_experts_per_tok", path));
  c.moe_intermediate_size = int(require_int(j, "moe_intermediate_size", path));
  c.norm_topk_prob = get_bool(j, "norm_topk_prob", path).value_or(true);
  c.moe_routing = MoeRouting::kSigmoidGroupedTopK;
  c.moe_groups = int(get_int(j, "n_group", path).value_or(1));
  c.moe_topk_groups = int(get_int(j, "topk_group", path).value_or(1));
  c.routed_scaling_factor = float(get_number(j, "routed_scaling_factor", path).value_or(1));
  c.shared_expert_intermediate =
      c.moe_intermediate_size * int(get_int(j, "n_shared_experts", path).value_or(0));
  if (c.num_experts_per_token <= 0 || c.num_experts_per_token > c.num_experts ||
      c.moe_intermediate_size <= 0 || c.moe_groups <= 0 || c.num_experts % c.moe_groups != 0 ||
      c.moe_topk_groups <= 0 || c.moe_topk_groups > c.moe_groups ||
      (c.moe_groups > 1 && c.num_experts / c.moe_groups < 2)) {
    throw FormatError(str_cat(path, ": MoE of ", c.num_experts, " experts in ", c.moe_groups,
                              " groups, top ", c.num_experts_per_token, " from ", c.moe_topk_groups,
                              " groups, intermediate ", c.moe_intermediate_size,
                              " is inconsistent"));
  }
  const int64_t first_moe = get_int(j, "first_k_dense_replace", path).value_or(0);
  c.moe_layer.assign(size_t(c.num_layers), false);
  for (int l = 0; l < c.num_layers; ++l) c.moe_layer[size_t(l)] = l >= first_moe;
}

void moe_route_sigmoid_grouped(const MoeWeights& w, const float* logits, int* experts,
                               float* weights) {
  const int n = int(w.experts.size()), per_group = n / w.groups;
  std::vector<float> score(static_cast<size_t>(n)), choice(static_cast<size_t>(n));
  for (int e = 0; e < n; ++e) {
    score[size_t(e)] = 1.0f / (1.0f + std::exp(-logits[e]));
    choice[size_t(e)] = score[size_t(e)] + w.score_bias[size_t(e)];
  }
  // Groups ranked by the sum of their two best biased scores; experts outside the topk_groups
  // best groups score 0 for the choice.
  if (w.groups > 1) {
    std::vector<float> group_score(static_cast<size_t>(w.groups));
    for (int g = 0; g < w.groups; ++g) {
      std::vector<float> s(choice.begin() + g * per_group, choice.begin() + (g + 1) * per_group);
      std::partial_sort(s.begin(), s.begin() + 2, s.end(), std::greater<float>());
      group_score[size_t(g)] = s[0] + s[1];
    }
    std::vector<int> groups(static_cast<size_t>(w.groups));
    std::iota(groups.begin(), groups.end(), 0);
    std::partial_sort(groups.begin(), groups.begin() + w.topk_groups, groups.end(),
                      [&](int a, int b) {
                        return group_score[size_t(a)] > group_score[size_t(b)] ||
                               (group_score[size_t(a)] == group_score[size_t(b)] && a < b);
                      });
    std::vector<bool> keep(static_cast<size_t>(w.groups), false);
    for (int i = 0; i < w.topk_groups; ++i) keep[size_t(groups[size_t(i)])] = true;
    for (int e = 0; e < n; ++e) {
      if (!keep[size_t(e / per_group)]) choice[size_t(e)] = 0.0f;
    }
  }
  std::vector<int> order(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), 0);
  std::partial_sort(order.begin(), order.begin() + w.top_k, order.end(), [&](int a, int b) {
    return choice[size_t(a)] > choice[size_t(b)] ||
           (choice[size_t(a)] == choice[size_t(b)] && a < b);
  });
  float sum = 0;
  for (int i = 0; i < w.top_k; ++i) sum += score[size_t(order[size_t(i)])];
  for (int i = 0; i < w.top_k; ++i) {
    experts[i] = order[size_t(i)];
    const float s = score[size_t(order[size_t(i)])];
    weights[i] = (w.norm_topk_prob ? s / (sum + 1e-20f) : s) * w.routed_scale;
  }
}

}  // namespace turbokv
