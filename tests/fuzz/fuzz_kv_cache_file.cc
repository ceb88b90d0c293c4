// libFuzzer target: the KV cache file reader. Input byte 0 picks the framing: even, the rest is a
// payload that gets a valid header and CRC (so mutations reach the records); odd, the rest is
// the whole file. Caches are made from the KV settings the file records, loaded, then attended.
//
// TURBOKV_FUZZ_WRITE_SEEDS=DIR: writes seed inputs (cache files of several KV settings) to DIR
// and exits.
#include <algorithm>
#include <cstring>
#include <filesystem>
#include <stdexcept>
#include <vector>

#include "core/error.h"
#include "core/rng.h"
#include "kernels/cpu/attention.h"
#include "kv/byte_io.h"
#include "kv/cache_file.h"
#include "kv/cache_policy.h"
#include "kv/kv_resolve.h"
#include "fuzz_util.h"

namespace {

using turbokv::LayerSpec;

// Two global layers and a sliding one, 2 KV heads of 64 dims.
const std::vector<LayerSpec> kSpecs = {{2, 64, 0}, {2, 64, 8}, {2, 64, 0}};
constexpr size_t kHeader = 8 + 4 + 8;  // magic, version, payload bytes

std::vector<uint8_t> read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(in), {});
}

void write_seeds(const std::string& dir) {
  std::filesystem::create_directories(dir);
  const char* settings[][3] = {{"dense", "", ""},
                               {"uniform4", "4", "uniform"},
                               {"turboquant3.5", "3.5", "turboquant"},
                               {"turboquant2", "2", "turboquant"},
                               {"uniform8", "8", "uniform"}};
  turbokv::Xoshiro256 rng(7);
  for (const auto& [name, bits, scheme] : settings) {
    turbokv::KVOptions o;
    if (*bits) o.kv_bits = std::atof(bits);
    if (*scheme) o.kv_quant_scheme = scheme;
    turbokv::CacheFileInfo info;
    info.model_tag = "fuzz";
    info.kv = turbokv::resolve_kv_options(o);
    turbokv::LayerCaches caches = turbokv::make_layer_caches(kSpecs, info.kv);
    const int tokens = 12;
    std::vector<float> k(size_t(tokens) * 2 * 64), v(k.size());  // [tokens, 2 heads, 64]
    for (float& x : k) x = float(rng.gaussian());
    for (float& x : v) x = float(rng.gaussian());
    for (auto& c : caches) c->append(k.data(), v.data(), tokens);
    for (int i = 0; i < tokens; ++i) info.tokens.push_back(i);
    const std::string path = turbokv::fuzz::temp_path("seed.tkv");
    turbokv::save_cache_file(path, info, caches);
    const std::vector<uint8_t> file = read_bytes(path);
    if (file.size() < kHeader + 4) throw std::runtime_error("cache file shorter than its header");
    // The framing byte, then the payload (no header, no CRC) or the whole file.
    std::vector<uint8_t> framed(file.size() - kHeader - 4 + 1, 0);
    std::copy(file.begin() + kHeader, file.end() - 4, framed.begin() + 1);
    std::vector<uint8_t> whole(file.size() + 1, 1);
    std::copy(file.begin(), file.end(), whole.begin() + 1);
    const std::string prefix = dir + "/" + name;
    turbokv::fuzz::write_file(prefix + "-payload", framed.data(), framed.size());
    turbokv::fuzz::write_file(prefix + "-file", whole.data(), whole.size());
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
  if (size < 1) return 0;
  static const std::string path = turbokv::fuzz::temp_path("cache.tkv");
  if (data[0] % 2 == 0) {  // frame the payload: magic, version, length, payload, CRC
    turbokv::ByteWriter file;
    file.bytes("TKVCACHE", 8);
    file.put<uint32_t>(turbokv::kCacheFileVersion);
    file.put<uint64_t>(size - 1);
    file.bytes(data + 1, size - 1);
    file.put<uint32_t>(turbokv::crc32(file.buffer().data(), file.buffer().size()));
    turbokv::fuzz::write_file(path, file.buffer().data(), file.buffer().size());
  } else {
    turbokv::fuzz::write_file(path, data + 1, size - 1);
  }
  try {
    turbokv::CacheFileReader reader(path);
    turbokv::LayerCaches caches = turbokv::make_layer_caches(kSpecs, reader.info().kv);
    reader.load_caches(caches);
    std::vector<float> q(4 * 64, 0.5f), out(q.size());
    for (size_t i = 0; i < caches.size(); ++i) {
      if (caches[i]->size() == 0) continue;
      turbokv::AttentionParams params;
      params.n_heads = 4;
      params.scale = 0.125f;
      params.sliding_window = kSpecs[i].sliding_window;
      caches[i]->attend(q.data(), 1, params, out.data());  // garbage rows: any value, no crash
    }
  } catch (const turbokv::Error&) {
  }
  return 0;
}
