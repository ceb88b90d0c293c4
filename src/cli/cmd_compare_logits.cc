// `turbokv compare-logits`: a model's logits and greedy continuation against a reference file
// (safetensors with input_ids, fp32 logits [n, vocab] and the generated tokens): prints the
// largest logit difference (absolute and relative to the largest reference logit), the mean
// KL divergence of the reference distribution to ours over the positions, and how many greedy
// tokens agree; the logits once from one prefill of the prompt (matrix-matrix kernels) and
// once token by token (the decode kernels, int8 activations on quantized weights unless f32
// ones are asked for). f32 KV cache, so only the weights and kernels differ from the reference.
// --device cuda runs the GPU forward (f32 KV cache). Its default path rounds activations:
// to bf16 for cuBLAS (prefill, dense weights), to int8 for the MLX 4-bit decode products;
// TURBOKV_F32_ACTIVATIONS=1 keeps every activation in fp32 there too.
// The last line says pass or fail: the largest relative logit difference of both passes within
// --tolerance where activations stay fp32, the mean KL within --kl-tolerance for a pass that
// rounds them; and every greedy token equal. A failure exits with status 1.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "backend/backend.h"
#include "cli/command.h"
#include "core/error.h"
#include "core/safetensors.h"
#include "core/threads.h"
#include "kernels/cpu/qweights.h"
#include "kv/cache_policy.h"
#include "model/model.h"

#ifdef TURBOKV_HAVE_CUDA
#include "model/cuda/cuda_decoder.h"
#endif

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

// Whether the decode pass runs a product on int8 activations: on the CPU every quantized
// product does unless the reference mode is on; on the GPU the MLX 4-bit ones (qmatmul.h).
bool decode_uses_int8(const LoadedModel& loaded) {
  if (loaded.device == "cpu") return int8_activations_enabled();
#ifdef TURBOKV_HAVE_CUDA
  return dynamic_cast<const cuda::CudaDecoderModel&>(*loaded.model).decode_uses_int8();
#endif
  return false;
}

// Whether the GPU forward rounds activations (its default path, see the top of the file).
bool gpu_rounds_activations(const LoadedModel& loaded) {
#ifdef TURBOKV_HAVE_CUDA
  if (loaded.device == "cuda") return !cuda::CudaDecoderModel::f32_activations();
#endif
  (void)loaded;
  return false;
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
  double tolerance = 1e-3, kl_tolerance = 1e-3;
  app.add_option("--tolerance", tolerance,
                 "largest relative logit difference that passes (f32 activations)")
      ->capture_default_str();
  app.add_option("--kl-tolerance", kl_tolerance,
                 "largest mean KL of the decode pass that passes on int8 activations")
      ->capture_default_str();
  DeviceFlags device;
  device.add_to(app);
  if (const int rc = parse(app, argc, argv); rc >= 0) return rc;
  if (threads < 0) throw InvalidArgument(str_cat("--threads ", threads, " must be >= 0"));
  if (!(tolerance >= 0) || !(kl_tolerance >= 0)) {
    throw InvalidArgument(str_cat("--tolerance ", tolerance, " and --kl-tolerance ", kl_tolerance,
                                  " must be >= 0"));
  }
  set_num_threads(threads);

  LoadedModel loaded = load_model(model_dir, device.options());
  const Model* model = loaded.model.get();
  // f32 dense caches on either device.
  auto f32_caches = [&] {
#ifdef TURBOKV_HAVE_CUDA
    if (loaded.device == "cuda") {
      return dynamic_cast<const cuda::CudaDecoderModel&>(*model).make_caches(
          ResolvedKV{}, cuda::DenseElem::kF32);
    }
#endif
    return make_layer_caches(model->layer_specs(), ResolvedKV{}, KVDType::kF32);
  };
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
  LayerCaches caches = f32_caches();
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
  LayerCaches step_caches = f32_caches();
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
  const bool int8 = decode_uses_int8(loaded);
  const bool gpu_rounds = gpu_rounds_activations(loaded);
  const char* mode = gpu_rounds ? (int8 ? "bf16 cuBLAS, int8 MLX 4-bit decode" : "bf16 cuBLAS")
                     : int8     ? "int8"
                                : "f32";
  const double step_rel = max_ref > 0 ? step_max_diff / max_ref : step_max_diff;
  const bool greedy_ok = agree == generated.size();
  const bool prefill_ok = gpu_rounds ? kl_sum / n <= kl_tolerance : rel <= tolerance;
  const bool decode_ok =
      int8 || gpu_rounds ? step_kl_sum / n <= kl_tolerance : step_rel <= tolerance;
  const bool pass = greedy_ok && prefill_ok && decode_ok;
  if (json) {
    const nlohmann::json out = {
        {"model", model_dir},
        {"device", loaded.device},
        {"reference", reference},
        {"activations", mode},
        {"positions", n},
        {"max_abs_diff", max_diff},
        {"max_rel_diff", rel},
        {"kl_mean", kl_sum / n},
        {"decode_max_rel_diff", step_rel},
        {"decode_kl_mean", step_kl_sum / n},
        {"greedy_agree", agree},
        {"greedy_total", generated.size()},
        {"pass", pass}};
    std::printf("%s\n", out.dump().c_str());
  } else {
    std::printf(
        "%s vs %s (%s, %s activations)\n"
        "prefill: positions %d  max |diff| %.3g  relative %.3g  mean KL %.3g\n"
        "decode:  positions %d  max |diff| %.3g  relative %.3g  mean KL %.3g\n"
        "greedy %zu/%zu agree\n",
        model_dir.c_str(), reference.c_str(), loaded.device.c_str(), mode, n, max_diff, rel,
        kl_sum / n, n, step_max_diff, step_rel, step_kl_sum / n, agree, generated.size());
    const bool step_kl = int8 || gpu_rounds;
    std::printf("%s: prefill %s %.3g %s %.3g, decode %s %.3g %s %.3g, greedy %zu/%zu\n",
                pass ? "PASS" : "FAIL", gpu_rounds ? "mean KL" : "relative",
                gpu_rounds ? kl_sum / n : rel, prefill_ok ? "<=" : ">",
                gpu_rounds ? kl_tolerance : tolerance, step_kl ? "mean KL" : "relative",
                step_kl ? step_kl_sum / n : step_rel, decode_ok ? "<=" : ">",
                step_kl ? kl_tolerance : tolerance, agree, generated.size());
  }
  return pass ? 0 : 1;
}

}  // namespace

TURBOKV_COMMAND("compare-logits", "logits and greedy tokens against a reference file",
                compare_logits_main);

}  // namespace turbokv::cli
