// Broken model directories built in a temp dir: each failure is one typed error whose message
// names the file or tensor (unsupported architecture, missing config or shard, truncated
// safetensors, wrong dtype, wrong shape, missing tensor), and sharded loading works.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/safetensors.h"
#include "model/model.h"
#include "test_util.h"

namespace turbokv {
namespace {

namespace fs = std::filesystem;
using testing::fixture;

struct Tensor {
  std::string name, dtype;
  std::vector<int64_t> shape;
  std::vector<uint8_t> bytes;
};

void write_safetensors(const fs::path& path, const std::vector<Tensor>& tensors) {
  nlohmann::json header = nlohmann::json::object();
  size_t offset = 0;
  for (const Tensor& t : tensors) {
    header[t.name] = {{"dtype", t.dtype},
                      {"shape", t.shape},
                      {"data_offsets", {offset, offset + t.bytes.size()}}};
    offset += t.bytes.size();
  }
  const std::string text = header.dump();
  std::ofstream out(path, std::ios::binary);
  const uint64_t n = text.size();
  out.write(reinterpret_cast<const char*>(&n), 8);
  out.write(text.data(), std::streamsize(text.size()));
  for (const Tensor& t : tensors)
    out.write(reinterpret_cast<const char*>(t.bytes.data()), std::streamsize(t.bytes.size()));
}

// The hf-tiny llama tensors, as editable copies.
std::vector<Tensor> llama_tensors() {
  const SafetensorsFile f = SafetensorsFile::open(fixture("hf-tiny/llama/model.safetensors"));
  std::vector<Tensor> out;
  for (const TensorView& t : f.tensors()) {
    out.push_back(
        {t.name, dtype_name(t.dtype), t.shape, std::vector<uint8_t>(t.data, t.data + t.nbytes)});
  }
  return out;
}

class BrokenModel : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("turbokv_model_test_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    fs::copy_file(fixture("hf-tiny/llama/config.json"), dir_ / "config.json");
  }
  void TearDown() override { fs::remove_all(dir_); }

  // Loads dir_ and returns the message of the error of type E it must throw.
  template <typename E>
  std::string load_error() {
    try {
      Model::load(dir_.string());
    } catch (const E& e) {
      return e.what();
    } catch (const std::exception& e) {
      ADD_FAILURE() << "wrong error type: " << e.what();
      return "";
    }
    ADD_FAILURE() << "no error";
    return "";
  }

  Tensor& find(std::vector<Tensor>& tensors, const std::string& name) {
    for (Tensor& t : tensors) {
      if (t.name == name) return t;
    }
    throw std::runtime_error("no tensor " + name);
  }

  fs::path dir_;
};

TEST_F(BrokenModel, UnsupportedArchitecture) {
  nlohmann::json config = nlohmann::json::parse(std::ifstream(dir_ / "config.json"));
  config["model_type"] = "mamba";
  std::ofstream(dir_ / "config.json") << config.dump();
  const std::string msg = load_error<Unsupported>();
  EXPECT_NE(msg.find("'mamba'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("qwen3_moe"), std::string::npos) << msg;
}

TEST_F(BrokenModel, MissingConfigAndWeights) {
  std::string msg = load_error<IoError>();
  EXPECT_NE(msg.find("model.safetensors"), std::string::npos) << msg;
  fs::remove(dir_ / "config.json");
  msg = load_error<IoError>();
  EXPECT_NE(msg.find("config.json"), std::string::npos) << msg;
}

TEST_F(BrokenModel, ShardedLoadsAndAMissingShardIsNamed) {
  std::vector<Tensor> tensors = llama_tensors();
  const size_t half = tensors.size() / 2;
  write_safetensors(dir_ / "model-00001-of-00002.safetensors",
                    {tensors.begin(), tensors.begin() + long(half)});
  write_safetensors(dir_ / "model-00002-of-00002.safetensors",
                    {tensors.begin() + long(half), tensors.end()});
  nlohmann::json index = {{"metadata", nlohmann::json::object()},
                          {"weight_map", nlohmann::json::object()}};
  for (size_t i = 0; i < tensors.size(); ++i) {
    index["weight_map"][tensors[i].name] =
        i < half ? "model-00001-of-00002.safetensors" : "model-00002-of-00002.safetensors";
  }
  std::ofstream(dir_ / "model.safetensors.index.json") << index.dump();
  EXPECT_EQ(Model::load(dir_.string())->info().num_layers, 2);

  fs::remove(dir_ / "model-00002-of-00002.safetensors");
  const std::string msg = load_error<IoError>();
  EXPECT_NE(msg.find("model-00002-of-00002.safetensors"), std::string::npos) << msg;
}

TEST_F(BrokenModel, TruncatedSafetensors) {
  fs::copy_file(fixture("hf-tiny/llama/model.safetensors"), dir_ / "model.safetensors");
  fs::resize_file(dir_ / "model.safetensors", fs::file_size(dir_ / "model.safetensors") - 100);
  const std::string msg = load_error<FormatError>();
  EXPECT_NE(msg.find((dir_ / "model.safetensors").string()), std::string::npos) << msg;
}

TEST_F(BrokenModel, WrongDtypeNamesTheTensor) {
  std::vector<Tensor> tensors = llama_tensors();
  find(tensors, "model.norm.weight").dtype = "I32";
  write_safetensors(dir_ / "model.safetensors", tensors);
  const std::string msg = load_error<FormatError>();
  EXPECT_NE(msg.find("'model.norm.weight'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("I32"), std::string::npos) << msg;
}

TEST_F(BrokenModel, WrongShapeNamesTensorShapeAndExpected) {
  std::vector<Tensor> tensors = llama_tensors();
  find(tensors, "model.layers.1.self_attn.k_proj.weight").shape = {64, 32};
  write_safetensors(dir_ / "model.safetensors", tensors);
  const std::string msg = load_error<FormatError>();
  EXPECT_NE(msg.find("'model.layers.1.self_attn.k_proj.weight'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("[64, 32]"), std::string::npos) << msg;
  EXPECT_NE(msg.find("expected [32, 64]"), std::string::npos) << msg;
}

TEST_F(BrokenModel, MissingTensorIsNamed) {
  std::vector<Tensor> tensors = llama_tensors();
  std::erase_if(tensors, [](const Tensor& t) { return t.name == "lm_head.weight"; });
  write_safetensors(dir_ / "model.safetensors", tensors);
  const std::string msg = load_error<FormatError>();
  EXPECT_NE(msg.find("'lm_head.weight'"), std::string::npos) << msg;
}

}  // namespace
}  // namespace turbokv
