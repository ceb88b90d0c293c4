// `turbokv compare-logits`: a model's logits and greedy continuation against a reference file
// (safetensors with input_ids, fp32 logits [n, vocab] and the generated tokens): prints the
// largest logit difference (absolute and relative to the largest reference logit), the mean
// KL divergence of the reference distribution to ours over the positions, and how many greedy
// tokens agree; the logits once from one prefill of the prompt (matrix-matrix kernels) and
// once token by token (the decode kernels, int8 activations on quantized weights unless f32
// ones are asked for). f32 KV cache, so only the weights and kernels differ from the reference.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "cli/command.h"
#include "core/error.h"
#include "core/safetensors.h"
#include "core/threads.h"
#include "kernels/cpu/qweights.h"
#include "kv/cache_policy.h"
#include "model/model.h"

namespace turbokv::cli {
namespace {

int32_t argmax(const float* v, int n) {
  return int32_t(std::max_element(v, v + n) - v);
}

// KL(p_ref || p) of one position, from logits.
double kl_divergence(const float* ref, const float* ours, int n) {
  auto log_softmax = [n](const float* x, std::vector<double>& out) {
    const double mx = *std::max_element(x, x + n);
    double sum = 0;
    for (int i = 0; i < n; ++i) sum += std::exp(double(x[i]) - mx);
    const double lse = mx + std::log(sum);
    out.resize(size_t(n));
    for (int i = 0; i < n; ++i) out[size_t(i)] = double(x[i]) - lse;
  };
  std::vector<double> lp, lq;
  log_softmax(ref, lp);
  log_softmax(ours, lq);
  double kl = 0;
  for (int i = 0; i < n; ++i) kl += std::exp(lp[size_t(i)]) * (lp[size_t(i)] - lq[size_t(i)]);
  return kl;
}

int compare_logits_main(int argc, char** argv) {
  CLI::App app("a model's logits and greedy tokens against a reference safetensors file",
               "compare-logits");
  std::string model_dir = default_model_dir(), reference;
  int threads = 2;
  bool json = false;
  app.add_option("--model", model_dir, "model directory or .gguf file");
  app.add_option("--reference", reference,
                 "safetensors with input_ids, logits [n, vocab] and generated")
      ->required();
  app.add_option("--threads", threads, "worker threads")->capture_default_str();
  app.add_flag("--json", json, "print one JSON object");
  if (const int rc = parse(app, argc, argv); rc >= 0) return rc;
  if (threads < 0) throw InvalidArgument(str_cat("--threads ", threads, " must be >= 0"));
  set_num_threads(threads);

  std::unique_ptr<Model> model = Model::load(model_dir);
  const SafetensorsFile ref = SafetensorsFile::open(reference);
  const std::vector<int64_t> ids64 = SafetensorsFile::to_i64(ref.at("input_ids"));
  const std::vector<float> want = SafetensorsFile::to_f32(ref.at("logits"));
  const std::vector<int64_t> generated = SafetensorsFile::to_i64(ref.at("generated"));
  const std::vector<int32_t> ids(ids64.begin(), ids64.end());
  const int V = model->info().vocab_size, n = int(ids.size());
  if (n == 0 || want.size() != size_t(n) * size_t(V)) {
    throw FormatError(str_cat(reference, ": logits hold ", want.size(), " values, expected ", n,
                              " x ", V, " (input_ids x the model's vocabulary)"));
  }
  LayerCaches caches = make_layer_caches(model->layer_specs(), ResolvedKV{}, KVDType::kF32);
  std::vector<float> logits(size_t(n) * size_t(V));  // [n, V]
  Model::Chunk chunk{ids.data(), n, &caches, logits.data(), true};
  model->forward({&chunk, 1});
  double max_diff = 0, max_ref = 0, kl_sum = 0;
  for (size_t i = 0; i < logits.size(); ++i) {
    max_diff = std::max(max_diff, double(std::abs(logits[i] - want[i])));
    max_ref = std::max(max_ref, double(std::abs(want[i])));
  }
  for (int t = 0; t < n; ++t) {
    kl_sum += kl_divergence(want.data() + size_t(t) * V, logits.data() + size_t(t) * V, V);
  }
  // The same positions one token per forward: every product through the decode kernels.
  LayerCaches step_caches = make_layer_caches(model->layer_specs(), ResolvedKV{}, KVDType::kF32);
  double step_max_diff = 0, step_kl_sum = 0;
  std::vector<float> row(static_cast<size_t>(V));
  for (int t = 0; t < n; ++t) {
    Model::Chunk step{&ids[size_t(t)], 1, &step_caches, row.data(), false};
    model->forward({&step, 1});
    const float* w = want.data() + size_t(t) * V;
    for (int v = 0; v < V; ++v)
      step_max_diff = std::max(step_max_diff, double(std::abs(row[v] - w[v])));
    step_kl_sum += kl_divergence(w, row.data(), V);
  }
  std::vector<int64_t> greedy;
  std::vector<float> last(static_cast<size_t>(V));
  int32_t next = argmax(logits.data() + size_t(n - 1) * V, V);
  for (size_t i = 0; i < generated.size(); ++i) {
    greedy.push_back(next);
    if (i + 1 == generated.size()) break;
    Model::Chunk step{&next, 1, &caches, last.data(), false};
    model->forward({&step, 1});
    next = argmax(last.data(), V);
  }
  size_t agree = 0;
  while (agree < greedy.size() && greedy[agree] == generated[agree]) ++agree;
  const double rel = max_ref > 0 ? max_diff / max_ref : max_diff;
  const char* mode = int8_activations_enabled() ? "int8" : "f32";
  if (json) {
    const nlohmann::json out = {
        {"model", model_dir},
        {"reference", reference},
        {"activations", mode},
        {"positions", n},
        {"max_abs_diff", max_diff},
        {"max_rel_diff", rel},
        {"kl_mean", kl_sum / n},
        {"decode_max_rel_diff", max_ref > 0 ? step_max_diff / max_ref : step_max_diff},
        {"decode_kl_mean", step_kl_sum / n},
        {"greedy_agree", agree},
        {"greedy_total", generated.size()}};
    std::printf("%s\n", out.dump().c_str());
  } else {
    std::printf(
        "%s vs %s (%s activations on quantized weights)\n"
        "prefill: positions %d  max |diff| %.3g  relative %.3g  mean KL %.3g\n"
        "decode:  positions %d  max |diff| %.3g  relative %.3g  mean KL %.3g\n"
        "greedy %zu/%zu agree\n",
        model_dir.c_str(), reference.c_str(), mode, n, max_diff, rel, kl_sum / n, n, step_max_diff,
        max_ref > 0 ? step_max_diff / max_ref : step_max_diff, step_kl_sum / n, agree,
        generated.size());
  }
  return 0;
}

}  // namespace

TURBOKV_COMMAND("compare-logits", "logits and greedy tokens against a reference file",
                compare_logits_main);

}  // namespace turbokv::cli
