// `turbokv codec`: codec quality numbers. Synthetic mode (--dim, --bits, --mode): distortion
// and inner-product statistics on random unit vectors. --qkv-dump mode: attention fidelity of
// the KV scheme given by the kv flags on real post-RoPE q/k/v tensors. JSON keys: docs/design.md,
// "Contracts".
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "cli/command.h"
#include "core/error.h"
#include "core/safetensors.h"
#include "eval/codec_eval.h"
#include "kv/kv_resolve.h"

namespace turbokv::cli {
namespace {

std::vector<double> parse_bits_list(const std::string& text) {
  std::vector<double> bits;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) bits.push_back(parse_kv_bits(item, "--bits"));
  if (bits.empty()) throw InvalidArgument(str_cat("--bits '", text, "' lists no bit widths"));
  return bits;
}

int run_synthetic(int dim, const std::string& bits_text, const std::string& mode, int64_t samples,
                  uint64_t seed, bool json) {
  const std::vector<double> bits_list = parse_bits_list(bits_text);
  for (double bits : bits_list) eval::check_codec_mode_bits(mode, bits);
  if (samples < 1) throw InvalidArgument(str_cat("--samples ", samples, " is invalid: need >= 1"));
  nlohmann::json results = nlohmann::json::array();
  if (!json) {
    std::printf("codec %s, d=%d, %lld random unit vectors, 4 Gaussian queries each\n", mode.c_str(),
                dim, static_cast<long long>(samples));
    std::printf("%6s %10s %12s %10s %14s\n", "bits", "mse", "mse(normcor)", "ip_bias",
                "ip_var_times_d");
  }
  for (double bits : bits_list) {
    if (isatty(2)) std::fprintf(stderr, "bits %g...\r", bits);
    const eval::CodecStats s = eval::measure_codec(dim, bits, mode, samples, 4, seed);
    nlohmann::json entry = {{"bits", s.bits},
                            {"mode", s.mode},
                            {"mse", s.mse},
                            {"ip_bias", s.ip_bias},
                            {"ip_var_times_d", s.ip_var_times_d}};
    if (mode == "mse") entry["mse_norm_corrected"] = s.mse_norm_corrected;
    results.push_back(entry);
    if (!json) {
      char corrected[32] = "-";
      if (mode == "mse") std::snprintf(corrected, sizeof(corrected), "%.5f", s.mse_norm_corrected);
      std::printf("%6g %10.5f %12s %10.5f %14.5f\n", bits, s.mse, corrected, s.ip_bias,
                  s.ip_var_times_d);
    }
  }
  if (json) {
    const nlohmann::json out = {{"dim", dim}, {"samples", samples}, {"results", results}};
    std::printf("%s\n", out.dump().c_str());
  }
  return 0;
}

int run_qkv_dump(const std::string& path, const KVOptions& options, bool json) {
  const ResolvedKV kv = resolve_kv_options(options);
  if (kv.scheme == KVScheme::kDense) {
    throw InvalidArgument("--qkv-dump needs a quantized KV scheme: give --kv-bits (e.g. 3.5)");
  }
  const SafetensorsFile file = SafetensorsFile::open(path);
  nlohmann::json layers = nlohmann::json::array();
  double cosine_sum = 0;
  int n_layers = 0;
  if (!json) {
    std::printf("%s: %s keys %g bits, values %g bits\n", path.c_str(), kv_scheme_name(kv.scheme),
                kv.key_bits, kv.value_bits);
    std::printf("%6s %12s %12s\n", "layer", "attn_cosine", "attn_rel_l2");
  }
  for (int layer = 0;; ++layer) {
    const std::string prefix = str_cat("layer", layer, ".");
    if (file.find(prefix + "q") == nullptr) break;
    const TensorView& qt = file.at(prefix + "q");
    const TensorView& kt = file.at(prefix + "k");
    const TensorView& vt = file.at(prefix + "v");
    if (qt.shape.size() != 3 || kt.shape != vt.shape || kt.shape.size() != 3 ||
        qt.shape[1] != kt.shape[1] || qt.shape[2] != kt.shape[2]) {
      throw FormatError(str_cat(path, ": layer ", layer, " shapes q ", qt.shape_string(), " k ",
                                kt.shape_string(), " v ", vt.shape_string(),
                                " are not [heads, tokens, dim] with matching tokens and dim"));
    }
    if (isatty(2)) std::fprintf(stderr, "layer %d...\r", layer);
    const std::vector<float> q = SafetensorsFile::to_f32(qt);
    const std::vector<float> k = SafetensorsFile::to_f32(kt);
    const std::vector<float> v = SafetensorsFile::to_f32(vt);
    eval::LayerFidelity f =
        eval::attention_fidelity(q.data(), k.data(), v.data(), int(qt.shape[0]), int(kt.shape[0]),
                                 int(kt.shape[1]), int(kt.shape[2]), kv);
    f.layer = layer;
    layers.push_back(
        {{"layer", layer}, {"attn_cosine", f.attn_cosine}, {"attn_rel_l2", f.attn_rel_l2}});
    cosine_sum += f.attn_cosine;
    ++n_layers;
    if (!json) std::printf("%6d %12.5f %12.5f\n", layer, f.attn_cosine, f.attn_rel_l2);
  }
  if (n_layers == 0) throw FormatError(str_cat(path, ": no layer0.q tensor (not a q/k/v dump)"));
  const double mean = cosine_sum / n_layers;
  if (json) {
    const nlohmann::json out = {{"kv_scheme", kv_scheme_name(kv.scheme)},
                                {"key_bits", kv.key_bits},
                                {"value_bits", kv.value_bits},
                                {"layers", layers},
                                {"attn_cosine_mean", mean}};
    std::printf("%s\n", out.dump().c_str());
  } else {
    std::printf("attn_cosine_mean %.5f\n", mean);
  }
  return 0;
}

int codec_main(int argc, char** argv) {
  CLI::App app{
      "Codec quality: distortion on random vectors, or attention fidelity on a q/k/v "
      "dump",
      "codec"};
  int dim = 0;
  std::string bits, mode = "mse", qkv_dump;
  int64_t samples = 10000;
  bool json = false;
  KVFlags kv;
  app.add_option("--dim", dim, "vector dimension (synthetic mode)")->check(integer_in(0, 1 << 20));
  app.add_option("--bits", bits, "comma-separated bit widths, e.g. 1,2,3,4 or 3.5");
  app.add_option("--mode", mode, "mse (default) or prod");
  app.add_option("--samples", samples, "random unit vectors per bit width")
      ->check(integer_in(1, int64_t(1) << 40));
  app.add_option("--qkv-dump", qkv_dump,
                 "safetensors with layer{i}.q/.k/.v [heads, tokens, dim]: attention fidelity");
  app.add_flag("--json", json, "print one JSON object");
  kv.add_to(app);
  if (const int rc = parse(app, argc, argv); rc >= 0) return rc;
  if (!qkv_dump.empty()) return run_qkv_dump(qkv_dump, kv.options(), json);
  if (dim <= 0) throw InvalidArgument(str_cat("--dim ", dim, " is invalid: give a dimension >= 2"));
  if (bits.empty()) throw InvalidArgument("--bits is required (e.g. --bits 1,2,3,4)");
  return run_synthetic(dim, bits, mode, samples, kv.kv_seed, json);
}

}  // namespace

TURBOKV_COMMAND("codec", "codec distortion / attention fidelity numbers", codec_main);

}  // namespace turbokv::cli
