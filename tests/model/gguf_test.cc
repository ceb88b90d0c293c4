// GGUF models: the hf-tiny fixtures of each family written as GGUF the way llama.cpp's
// converter writes them (tensor names, metadata, q/k rows permuted for llama/mistral, gemma
// norms stored as 1 + w) must reproduce transformers' logits and greedy tokens; every broken
// file fails with a typed error naming the file and what is wrong; randomly mutated files end
// in clean errors only. With TURBOKV_SHARED_DIR naming the shared data folder, the
// llama.cpp-quantized tinycode files and the MLX checkpoints are checked against their
// references (logits from gguf-py / numpy).
#include "core/gguf.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>

#include "core/error.h"
#include "core/half.h"
#include "core/safetensors.h"
#include "core/text_file.h"
#include "model/model.h"
#include "test_util.h"
#include "tests/common/gguf_writer.h"

namespace turbokv {
namespace {

namespace fs = std::filesystem;
using testing::fixture;
using testing::GgufWriter;

std::vector<uint8_t> f32_bytes(const std::vector<float>& v) {
  std::vector<uint8_t> b(v.size() * 4);
  std::memcpy(b.data(), v.data(), b.size());
  return b;
}

// llama.cpp's converter permutation of q/k rows: original row i·hd/2 + j goes to 2j + i.
std::vector<float> permute_rows(const std::vector<float>& w, int64_t rows, int64_t cols,
                                int heads) {
  std::vector<float> out(w.size());
  const int64_t hd = rows / heads, half = hd / 2;
  for (int64_t h = 0; h < heads; ++h) {
    for (int64_t i = 0; i < 2; ++i) {
      for (int64_t j = 0; j < half; ++j) {
        std::copy_n(w.data() + (h * hd + i * half + j) * cols, cols,
                    out.data() + (h * hd + 2 * j + i) * cols);
      }
    }
  }
  return out;
}

// The GGUF name of a Hugging Face tensor, as llama.cpp's tensor map has it.
std::string gguf_name(const std::string& hf, bool gemma) {
  if (hf == "model.embed_tokens.weight") return "token_embd.weight";
  if (hf == "model.norm.weight") return "output_norm.weight";
  if (hf == "lm_head.weight") return "output.weight";
  const std::string layers = "model.layers.";
  if (hf.rfind(layers, 0) != 0) return "";
  const size_t dot = hf.find('.', layers.size());
  const std::string blk = "blk." + hf.substr(layers.size(), dot - layers.size()) + ".";
  const std::string rest = hf.substr(dot + 1);
  const std::pair<const char*, const char*> names[] = {
      {"self_attn.q_proj.", "attn_q."},
      {"self_attn.k_proj.", "attn_k."},
      {"self_attn.v_proj.", "attn_v."},
      {"self_attn.o_proj.", "attn_output."},
      {"self_attn.q_norm.", "attn_q_norm."},
      {"self_attn.k_norm.", "attn_k_norm."},
      {"mlp.gate_proj.", "ffn_gate."},
      {"mlp.up_proj.", "ffn_up."},
      {"mlp.down_proj.", "ffn_down."},
      {"input_layernorm.", "attn_norm."},
      {"post_attention_layernorm.", gemma ? "post_attention_norm." : "ffn_norm."},
      {"pre_feedforward_layernorm.", "ffn_norm."},
      {"post_feedforward_layernorm.", "post_ffw_norm."},
  };
  for (const auto& [from, to] : names) {
    if (rest.rfind(from, 0) == 0) return blk + to + rest.substr(std::strlen(from));
  }
  return "";
}

// hf-tiny/<family> as a GGUF file (F32 tensors) at path.
void convert_fixture(const std::string& family, const std::string& path) {
  const std::string dir = fixture("hf-tiny/" + family);
  const nlohmann::json c = read_json_file(dir + "/config.json");
  const bool gemma = family.rfind("gemma", 0) == 0;
  const std::string arch = family == "gemma3_text" ? "gemma3" : family;
  const bool permute = family == "llama" || family == "mistral";
  GgufWriter w;
  w.add_string("general.architecture", arch);
  const std::string p = arch + ".";
  w.add_u32(p + "embedding_length", c["hidden_size"]);
  w.add_u32(p + "block_count", c["num_hidden_layers"]);
  w.add_u32(p + "feed_forward_length", c["intermediate_size"]);
  w.add_u32(p + "attention.head_count", c["num_attention_heads"]);
  w.add_u32(p + "attention.head_count_kv", c["num_key_value_heads"]);
  w.add_u32(p + "attention.key_length", c["head_dim"]);
  w.add_u32(p + "context_length", c["max_position_embeddings"]);
  w.add_u32(p + "vocab_size", c["vocab_size"]);
  w.add_f32(p + "attention.layer_norm_rms_epsilon", c["rms_norm_eps"]);
  const nlohmann::json& rope = c["rope_parameters"];
  w.add_f32(p + "rope.freq_base", rope.contains("full_attention")
                                      ? rope["full_attention"]["rope_theta"].get<float>()
                                      : rope["rope_theta"].get<float>());
  if (c.contains("sliding_window") && c["sliding_window"].is_number()) {
    w.add_u32(p + "attention.sliding_window", c["sliding_window"]);
  }
  // transformers' SDPA path (the reference) skips attention soft-capping: leave it out.
  if (c.contains("final_logit_softcapping") && c["final_logit_softcapping"].is_number()) {
    w.add_f32(p + "final_logit_softcapping", c["final_logit_softcapping"]);
  }
  if (c.contains("bos_token_id") && c["bos_token_id"].is_number()) {
    w.add_u32("tokenizer.ggml.bos_token_id", c["bos_token_id"]);
  }
  const SafetensorsFile st = SafetensorsFile::open(dir + "/model.safetensors");
  const int heads = c["num_attention_heads"], kv_heads = c["num_key_value_heads"];
  for (const TensorView& t : st.tensors()) {
    const std::string name = gguf_name(t.name, gemma);
    ASSERT_FALSE(name.empty()) << t.name;
    std::vector<float> v = SafetensorsFile::to_f32(t);
    if (gemma && name.find("norm.weight") != std::string::npos) {
      for (float& x : v) x += 1.0f;
    }
    const int64_t rows = t.shape.size() == 2 ? t.shape[0] : int64_t(v.size());
    const int64_t cols = t.shape.size() == 2 ? t.shape[1] : 1;
    if (permute && name.find("attn_q.") != std::string::npos)
      v = permute_rows(v, rows, cols, heads);
    if (permute && name.find("attn_k.") != std::string::npos) {
      v = permute_rows(v, rows, cols, kv_heads);
    }
    std::vector<int64_t> ne(t.shape.rbegin(), t.shape.rend());
    w.add_tensor(name, 0, ne, f32_bytes(v));
  }
  w.write(path);
}

int32_t argmax(const float* v, int n) {
  return int32_t(std::max_element(v, v + n) - v);
}

struct GoldenResult {
  float max_rel = 0;
  std::vector<int64_t> greedy, want_greedy;
};

GoldenResult run_golden(const std::string& model_path, const std::string& reference) {
  std::unique_ptr<Model> model = Model::load(model_path);
  const SafetensorsFile ref = SafetensorsFile::open(reference);
  const std::vector<int64_t> ids64 = SafetensorsFile::to_i64(ref.at("input_ids"));
  const std::vector<float> want = SafetensorsFile::to_f32(ref.at("logits"));
  GoldenResult r;
  r.want_greedy = SafetensorsFile::to_i64(ref.at("generated"));
  const std::vector<int32_t> ids(ids64.begin(), ids64.end());
  const int V = model->info().vocab_size, n = int(ids.size());
  EXPECT_EQ(want.size(), size_t(n) * V);
  LayerCaches caches = testing::f32_caches(*model);
  std::vector<float> logits(size_t(n) * V);
  Model::Chunk chunk{ids.data(), n, &caches, logits.data(), true};
  model->forward({&chunk, 1});
  float max_diff = 0, max_ref = 1e-30f;
  for (size_t i = 0; i < logits.size() && i < want.size(); ++i) {
    max_diff = std::max(max_diff, std::abs(logits[i] - want[i]));
    max_ref = std::max(max_ref, std::abs(want[i]));
  }
  r.max_rel = max_diff / max_ref;
  std::vector<float> last(static_cast<size_t>(V));
  int32_t next = argmax(logits.data() + size_t(n - 1) * V, V);
  for (size_t i = 0; i < r.want_greedy.size(); ++i) {
    r.greedy.push_back(next);
    if (i + 1 == r.want_greedy.size()) break;
    Model::Chunk step{&next, 1, &caches, last.data(), false};
    model->forward({&step, 1});
    next = argmax(last.data(), V);
  }
  return r;
}

std::string temp_path(const std::string& name) {
  return (fs::temp_directory_path() / ("turbokv_gguf_" + std::to_string(::getpid()) + "_" + name))
      .string();
}

class GgufFamilies : public ::testing::TestWithParam<const char*> {};

TEST_P(GgufFamilies, ConvertedFixtureMatchesTransformers) {
  const std::string path = temp_path(std::string(GetParam()) + ".gguf");
  convert_fixture(GetParam(), path);
  const GoldenResult r =
      run_golden(path, fixture(std::string("hf-tiny/") + GetParam() + "/reference.safetensors"));
  fs::remove(path);
  EXPECT_LE(r.max_rel, 1e-4f) << GetParam();
  EXPECT_EQ(r.greedy, r.want_greedy) << GetParam();
}

INSTANTIATE_TEST_SUITE_P(Families, GgufFamilies,
                         ::testing::Values("llama", "mistral", "qwen2", "qwen3", "gemma2",
                                           "gemma3_text"));

// A valid file to break: hf-tiny llama as GGUF.
std::vector<uint8_t> valid_file_bytes() {
  const std::string path = temp_path("valid.gguf");
  convert_fixture("llama", path);
  const std::string text = read_file(path);
  fs::remove(path);
  return std::vector<uint8_t>(text.begin(), text.end());
}

void write_bytes(const std::string& path, const std::vector<uint8_t>& b) {
  std::ofstream(path, std::ios::binary)
      .write(reinterpret_cast<const char*>(b.data()), std::streamsize(b.size()));
}

// Offset of the first occurrence of s in b.
size_t find_bytes(const std::vector<uint8_t>& b, const std::string& s) {
  auto it = std::search(b.begin(), b.end(), s.begin(), s.end());
  EXPECT_NE(it, b.end()) << s;
  return size_t(it - b.begin());
}

template <typename E>
void expect_error(const std::vector<uint8_t>& bytes, const std::vector<std::string>& parts) {
  const std::string path = temp_path("broken.gguf");
  write_bytes(path, bytes);
  try {
    Model::load(path);
    ADD_FAILURE() << "no error; expected one naming " << parts.front();
  } catch (const E& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find(path), std::string::npos) << what;
    for (const std::string& part : parts) EXPECT_NE(what.find(part), std::string::npos) << what;
  }
  fs::remove(path);
}

// The tensor-info record of `name`: offset of its n_dims field.
size_t tensor_info(const std::vector<uint8_t>& b, const std::string& name) {
  return find_bytes(b, name) + name.size();
}

TEST(GgufErrors, EachBrokenFileNamesWhatIsWrong) {
  const std::vector<uint8_t> good = valid_file_bytes();
  {
    std::vector<uint8_t> b = good;
    b[0] = 'X';
    expect_error<FormatError>(b, {"not a GGUF file"});
  }
  {
    std::vector<uint8_t> b = good;
    b[4] = 7;
    expect_error<FormatError>(b, {"version 7"});
  }
  {  // The type id of the first matrix (after n_dims and two u64 dims).
    std::vector<uint8_t> b = good;
    const size_t at = tensor_info(b, "token_embd.weight") + 4 + 16;
    b[at] = 77;
    expect_error<FormatError>(b, {"token_embd.weight", "unknown tensor type id 77"});
  }
  {  // A type with no kernel: Q4_1 with matching size is not needed, the type check comes first.
    std::vector<uint8_t> b = good;
    const size_t at = tensor_info(b, "blk.0.attn_q.weight") + 4 + 16;
    b[at] = 3;  // Q4_1: 20 bytes per 32 values, so the data still fits
    expect_error<Unsupported>(b, {"blk.0.attn_q.weight", "Q4_1"});
  }
  {  // Offset not a multiple of the alignment.
    std::vector<uint8_t> b = good;
    const size_t at = tensor_info(b, "blk.0.attn_q.weight") + 4 + 16 + 4;
    b[at] += 4;
    expect_error<FormatError>(b, {"blk.0.attn_q.weight", "alignment"});
  }
  {  // Data cut short.
    std::vector<uint8_t> b = good;
    b.resize(b.size() - 100);
    expect_error<FormatError>(b, {"runs past the end of the file"});
  }
  {  // A string length past the end: the architecture value.
    std::vector<uint8_t> b = good;
    const size_t at = find_bytes(b, "general.architecture") + 20 + 4;
    b[at + 6] = 0x10;
    expect_error<FormatError>(b, {"metadata 'general.architecture'", "past the end"});
  }
  {  // A header count past the file.
    std::vector<uint8_t> b = good;
    b[8 + 6] = 0x10;  // tensor count
    expect_error<FormatError>(b, {"tensor count"});
  }
  {  // Wrong shape: the rows of token_embd changed (vocab 512 -> 256 after the dims).
    std::vector<uint8_t> b = good;
    const size_t at = tensor_info(b, "token_embd.weight") + 4 + 8;
    b[at] = 0;
    b[at + 1] = 1;
    expect_error<FormatError>(b, {"token_embd.weight", "expected [64, 512]"});
  }
}

TEST(GgufErrors, UnknownArchitectureIsUnsupported) {
  GgufWriter w;
  w.add_string("general.architecture", "mamba");
  const std::string path = temp_path("arch.gguf");
  w.write(path);
  try {
    Model::load(path);
    ADD_FAILURE() << "no error";
  } catch (const Unsupported& e) {
    EXPECT_NE(std::string(e.what()).find("'mamba'"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("qwen2"), std::string::npos) << e.what();
  }
  fs::remove(path);
}

// Random byte flips and cuts of a valid file: loading either succeeds or throws one of our
// error types; nothing else (the sanitizer-free stand-in for a fuzzer over the reader).
TEST(GgufErrors, MutatedFilesEndInCleanErrors) {
  const std::vector<uint8_t> good = valid_file_bytes();
  const size_t header = find_bytes(good, "output_norm.weight") + 64;  // well into tensor infos
  std::mt19937 gen(1234);
  const std::string path = temp_path("mutated.gguf");
  int errors = 0;
  for (int iter = 0; iter < 300; ++iter) {
    std::vector<uint8_t> b = good;
    const int flips = 1 + int(gen() % 4);
    for (int f = 0; f < flips; ++f) {
      const size_t at = gen() % std::min(header, b.size());
      b[at] = uint8_t(gen() % 4 == 0 ? 0xFF : gen());
    }
    if (gen() % 8 == 0) b.resize(gen() % b.size());
    write_bytes(path, b);
    try {
      Model::load(path);
    } catch (const Error&) {
      ++errors;
    }
  }
  fs::remove(path);
  EXPECT_GT(errors, 100);
}

// ../shared references: llama.cpp-quantized GGUF files (logits from gguf-py's dequantization)
// and MLX affine checkpoints (numpy forward on the dequantized weights).
std::string shared_case_name(
    const ::testing::TestParamInfo<std::pair<const char*, const char*>>& info) {
  static const char* const kNames[] = {"gguf_bf16",   "gguf_q8_0", "gguf_q4_0",
                                       "gguf_q4_k_m", "mlx4",      "mlx8"};
  return kNames[info.index];
}

class SharedQuantized : public ::testing::TestWithParam<std::pair<const char*, const char*>> {};

TEST_P(SharedQuantized, LogitsAndGreedyTokensMatchReference) {
  const char* shared_env = std::getenv("TURBOKV_SHARED_DIR");
  if (shared_env == nullptr) GTEST_SKIP() << "TURBOKV_SHARED_DIR (the shared data folder) not set";
  const std::string shared = shared_env;
  const std::string model = shared + "/" + GetParam().first;
  const std::string ref = shared + "/" + GetParam().second;
  if (!fs::exists(model) || !fs::exists(ref)) GTEST_SKIP() << model << " not present";
  const GoldenResult r = run_golden(model, ref);
  EXPECT_LE(r.max_rel, 1e-3f) << model;
  EXPECT_EQ(r.greedy, r.want_greedy) << model;
}

INSTANTIATE_TEST_SUITE_P(
    Files, SharedQuantized,
    ::testing::Values(
        std::pair{"models/tinycode-llama-gguf/tinycode-llama-bf16.gguf",
                  "models/tinycode-llama-gguf/tinycode-llama-bf16.reference.safetensors"},
        std::pair{"models/tinycode-llama-gguf/tinycode-llama-q8_0.gguf",
                  "models/tinycode-llama-gguf/tinycode-llama-q8_0.reference.safetensors"},
        std::pair{"models/tinycode-llama-gguf/tinycode-llama-q4_0.gguf",
                  "models/tinycode-llama-gguf/tinycode-llama-q4_0.reference.safetensors"},
        std::pair{"models/tinycode-llama-gguf/tinycode-llama-q4_k_m.gguf",
                  "models/tinycode-llama-gguf/tinycode-llama-q4_k_m.reference.safetensors"},
        std::pair{"models/tinycode-llama-mlx4", "models/tinycode-llama-mlx4/reference.safetensors"},
        std::pair{"models/tinycode-llama-mlx8",
                  "models/tinycode-llama-mlx8/reference.safetensors"}),
    shared_case_name);

}  // namespace
}  // namespace turbokv
