// libFuzzer target: SafetensorsFile::open on arbitrary bytes, then every small tensor read as
// f32 / i64. Only turbokv errors may come out.
//
// TURBOKV_FUZZ_WRITE_SEEDS=DIR: writes seed inputs (small files of every dtype) to DIR and exits.
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "core/error.h"
#include "core/safetensors.h"
#include "fuzz_util.h"

namespace {

// A file of the given tensors: {name: (dtype, shape)}, data bytes 0, 1, 2, ...
std::string safetensors_file(const std::vector<std::tuple<std::string, std::string,
                                                          std::vector<int64_t>, size_t>>& tensors,
                             bool metadata) {
  nlohmann::json header = nlohmann::json::object();
  if (metadata) header["__metadata__"] = {{"format", "pt"}};
  size_t offset = 0;
  for (const auto& [name, dtype, shape, bytes] : tensors) {
    header[name] = {{"dtype", dtype}, {"shape", shape}, {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  const std::string text = header.dump();
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = char((text.size() >> (8 * i)) & 0xff);
  out += text;
  for (size_t i = 0; i < offset; ++i) out += char(i * 37 % 251);
  return out;
}

void write_seeds(const std::string& dir) {
  std::filesystem::create_directories(dir);
  const std::pair<const char*, std::string> files[] = {
      {"f32-f16-metadata", safetensors_file({{"w", "F32", {2, 3}, 24}, {"b", "F16", {3}, 6}}, true)},
      {"i64-bf16", safetensors_file({{"ids", "I64", {4}, 32}, {"x", "BF16", {2, 2}, 8}}, false)},
      {"i32-scalar-u8",
       safetensors_file({{"i", "I32", {1, 2}, 8}, {"scalar", "F32", {}, 4}, {"u", "U8", {5}, 5}},
                        true)},
      {"no-tensors", safetensors_file({}, true)},
  };
  for (const auto& [name, f] : files) {
    turbokv::fuzz::write_file(dir + "/" + name, reinterpret_cast<const uint8_t*>(f.data()),
                              f.size());
  }
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  if (const char* dir = std::getenv("TURBOKV_FUZZ_WRITE_SEEDS")) {
    write_seeds(dir);
    std::exit(0);
  }
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string path = turbokv::fuzz::temp_path("model.safetensors");
  turbokv::fuzz::write_file(path, data, size);
  try {
    const auto file = turbokv::SafetensorsFile::open(path);
    for (const turbokv::TensorView& t : file.tensors()) {
      if (t.numel() > 4096) continue;
      try {
        turbokv::SafetensorsFile::to_f32(t);
      } catch (const turbokv::Error&) {
      }
      try {
        turbokv::SafetensorsFile::to_i64(t);
      } catch (const turbokv::Error&) {
      }
    }
  } catch (const turbokv::Error&) {
  }
  return 0;
}
