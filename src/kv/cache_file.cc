// Cache files (kv/cache_file.h): header, payload and CRC; the layer records are the caches' own
// save()/load().
#include "kv/cache_file.h"

#include <unistd.h>

#include <array>
#include <bit>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>

#include "core/error.h"
#include "kv/byte_io.h"
#include "kv/kv_resolve.h"

namespace turbokv {
namespace {

static_assert(std::endian::native == std::endian::little, "cache files are little-endian");

constexpr char kMagic[8] = {'T', 'K', 'V', 'C', 'A', 'C', 'H', 'E'};
constexpr size_t kHeaderBytes = sizeof(kMagic) + sizeof(uint32_t) + sizeof(uint64_t);
constexpr size_t kMaxMetadataBytes = size_t(64) << 20;

std::array<uint32_t, 256> make_crc_table() {
  std::array<uint32_t, 256> table{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
    table[i] = c;
  }
  return table;
}

void write_kv(ByteWriter& out, const ResolvedKV& kv) {
  out.put<uint8_t>(static_cast<uint8_t>(kv.scheme));
  out.put<double>(kv.key_bits);
  out.put<double>(kv.value_bits);
  out.put<int32_t>(kv.group_size);
  out.put<int64_t>(kv.quantized_kv_start);
  out.put<uint64_t>(kv.seed);
  out.put<uint8_t>(kv.unbiased_norm ? 2 : (kv.norm_correction ? 1 : 0));
  out.put<uint8_t>(kv.last_layer_dense ? 1 : 0);
  out.put<uint8_t>(kv.center_keys ? 1 : 0);
  out.put<uint8_t>(kv.center_values ? 1 : 0);
  out.put<int32_t>(kv.sink_tokens);
  out.put<uint8_t>(static_cast<uint8_t>(kv.allocation));
  out.put<double>(kv.budget_bits);
  out.put<uint8_t>(kv.hadamard ? 1 : 0);
  out.put<int32_t>(kv.recent_tokens);
  out.put<uint32_t>(static_cast<uint32_t>(kv.layer_bits.size()));
  for (const LayerKVBits& bits : kv.layer_bits) {
    out.put<int32_t>(bits.layer);
    out.put<uint8_t>(bits.dense ? 1 : 0);
    out.put<double>(bits.key_bits);
    out.put<double>(bits.value_bits);
  }
}

// version: the file's (3 has no recent_tokens: 0).
ResolvedKV read_kv(ByteReader& in, uint32_t version) {
  ResolvedKV kv;
  const uint8_t scheme = in.get<uint8_t>("KV scheme");
  if (scheme > static_cast<uint8_t>(KVScheme::kTurboQuant)) {
    throw FormatError(str_cat("cache file: unknown KV scheme ", int(scheme)));
  }
  kv.scheme = static_cast<KVScheme>(scheme);
  kv.key_bits = in.get<double>("key bits");
  kv.value_bits = in.get<double>("value bits");
  kv.group_size = in.get<int32_t>("group size");
  kv.quantized_kv_start = in.get<int64_t>("quantized_kv_start");
  kv.seed = in.get<uint64_t>("seed");
  const uint8_t norm_mode = in.get<uint8_t>("norm mode");
  if (norm_mode > 2) throw FormatError(str_cat("cache file: unknown norm mode ", int(norm_mode)));
  kv.norm_correction = norm_mode != 0;
  kv.unbiased_norm = norm_mode == 2;
  kv.last_layer_dense = in.get<uint8_t>("last layer dense") != 0;
  kv.center_keys = in.get<uint8_t>("key centering") != 0;
  kv.center_values = in.get<uint8_t>("value centering") != 0;
  kv.sink_tokens = in.get<int32_t>("sink tokens");
  const uint8_t allocation = in.get<uint8_t>("KV allocation");
  if (allocation > static_cast<uint8_t>(KVAllocation::kAuto)) {
    throw FormatError(str_cat("cache file: unknown KV allocation ", int(allocation)));
  }
  kv.allocation = static_cast<KVAllocation>(allocation);
  kv.budget_bits = in.get<double>("KV budget");
  kv.hadamard = in.get<uint8_t>("hadamard") != 0;
  if (version >= 4) kv.recent_tokens = in.get<int32_t>("recent tokens");
  const uint32_t n_layer_bits = in.get<uint32_t>("per-layer bits count");
  if (n_layer_bits > 4096) {
    throw FormatError(
        str_cat("cache file: ", n_layer_bits, " per-layer bit overrides (at most 4096)"));
  }
  for (uint32_t i = 0; i < n_layer_bits; ++i) {
    LayerKVBits bits;
    bits.layer = in.get<int32_t>("per-layer bits layer");
    bits.dense = in.get<uint8_t>("per-layer bits dense") != 0;
    bits.key_bits = in.get<double>("per-layer key bits");
    bits.value_bits = in.get<double>("per-layer value bits");
    if (!(bits.key_bits >= 0 && bits.key_bits <= 64) ||
        !(bits.value_bits >= 0 && bits.value_bits <= 64)) {
      throw FormatError("cache file: malformed per-layer bits");
    }
    kv.layer_bits.push_back(bits);
  }
  // Ranges wide enough for every setting a cache can hold, narrow enough that no later
  // conversion to int overflows; the cache records' own checks give the precise rules.
  const auto bits_ok = [](double b) { return b >= 0 && b <= 64; };
  if (kv.sink_tokens < 0 || kv.sink_tokens > 65536 || kv.recent_tokens < 0 ||
      kv.recent_tokens > 1024 || !bits_ok(kv.budget_bits) || !bits_ok(kv.key_bits) ||
      !bits_ok(kv.value_bits) || kv.group_size < 0 || kv.group_size > 65536 ||
      kv.quantized_kv_start < 0) {
    throw FormatError("cache file: malformed KV settings");
  }
  return kv;
}

}  // namespace

uint32_t crc32(const uint8_t* data, size_t n) {
  static const std::array<uint32_t, 256> table = make_crc_table();
  uint32_t c = 0xFFFFFFFFu;
  for (size_t i = 0; i < n; ++i) c = table[(c ^ data[i]) & 0xFFu] ^ (c >> 8);
  return c ^ 0xFFFFFFFFu;
}

std::string describe_kv(const ResolvedKV& kv) {
  std::string text = kv_scheme_name(kv.scheme);
  if (kv.scheme == KVScheme::kTurboQuant) {
    text += str_cat(" K", kv.key_bits, "/V", kv.value_bits, ", seed ", kv.seed,
                    kv.unbiased_norm     ? ", unbiased norms"
                    : kv.norm_correction ? ", norm correction"
                                         : ", no norm correction");
    if (kv.center_keys || kv.center_values) {
      text += kv.center_keys && kv.center_values ? ", centered keys and values"
              : kv.center_keys                   ? ", centered keys"
                                                 : ", centered values";
    }
    if (kv.sink_tokens > 0) text += str_cat(", ", kv.sink_tokens, " fp16 sink tokens");
    if (kv.recent_tokens > 0) text += str_cat(", ", kv.recent_tokens, " recent tokens in fp16");
    if (kv.allocation != KVAllocation::kNone) {
      text += str_cat(", allocation ", kv_allocation_name(kv.allocation));
    }
  } else if (kv.scheme == KVScheme::kUniform) {
    text += str_cat(" K", kv.key_bits, "/V", kv.value_bits, ", groups of ", kv.group_size);
    if (kv.hadamard) text += ", Hadamard rotation";
  }
  if (kv.scheme != KVScheme::kDense) {
    text += kv.last_layer_dense ? ", last layer dense" : ", last layer quantized";
    if (kv.quantized_kv_start > 0) text += str_cat(", quantized from ", kv.quantized_kv_start);
    if (!kv.layer_bits.empty()) text += str_cat(", layers ", layer_bits_text(kv.layer_bits));
  }
  return text;
}

void save_cache_file(const std::string& path, const CacheFileInfo& info,
                     const LayerCaches& caches) {
  ByteWriter payload;
  payload.string(info.model_tag);
  payload.put<uint64_t>(info.model_fingerprint);
  write_kv(payload, info.kv);
  payload.put<uint64_t>(info.tokens.size());
  payload.bytes(info.tokens.data(), info.tokens.size() * sizeof(int32_t));
  payload.string(info.metadata);
  payload.put<uint32_t>(static_cast<uint32_t>(caches.size()));
  for (const auto& cache : caches) cache->save(payload);

  ByteWriter file;
  file.reserve(kHeaderBytes + payload.buffer().size() + sizeof(uint32_t));
  file.bytes(kMagic, sizeof(kMagic));
  file.put<uint32_t>(kCacheFileVersion);
  file.put<uint64_t>(payload.buffer().size());
  file.bytes(payload.buffer().data(), payload.buffer().size());
  file.put<uint32_t>(crc32(file.buffer().data(), file.buffer().size()));

  const std::string temp = str_cat(path, ".tmp-", ::getpid());
  std::ofstream out(temp, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(file.buffer().data()),
            static_cast<std::streamsize>(file.buffer().size()));
  out.close();
  if (!out || std::rename(temp.c_str(), path.c_str()) != 0) {
    std::remove(temp.c_str());
    throw IoError(str_cat("cannot write the cache file '", path, "'"));
  }
}

CacheFileReader::CacheFileReader(const std::string& path) : path_(path), file_(path) {
  const uint8_t* data = file_.data();
  const size_t size = file_.size();
  if (size < sizeof(kMagic) || std::memcmp(data, kMagic, sizeof(kMagic)) != 0) {
    throw FormatError(
        str_cat("'", path, "' is not a turbokv cache file (", size, " bytes, no TKVCACHE header)"));
  }
  if (size < kHeaderBytes + sizeof(uint32_t)) {
    throw FormatError(
        str_cat("'", path, "' is truncated: ", size, " bytes, shorter than the header"));
  }
  ByteReader header(data + sizeof(kMagic), kHeaderBytes - sizeof(kMagic));
  const uint32_t version = header.get<uint32_t>("version");
  if (version == 2) {
    throw FormatError(str_cat("'", path,
                              "' is a version 2 cache file (TurboQuant caches without centering "
                              "means, sink tokens or per-layer bits); this build reads version ",
                              kCacheFileVersion, ": create the file again"));
  }
  if (version == 1) {
    throw FormatError(str_cat("'", path,
                              "' is a version 1 cache file (caches without the model identity, "
                              "KV settings and token history a session needs); this build reads "
                              "version ",
                              kCacheFileVersion, ": create the file again"));
  }
  if (version != kCacheFileVersion && version != 3) {
    throw FormatError(str_cat("'", path, "' has cache file version ", version,
                              "; this build reads version ", kCacheFileVersion));
  }
  const uint64_t payload_bytes = header.get<uint64_t>("payload size");
  const uint64_t expected_size = kHeaderBytes + payload_bytes + sizeof(uint32_t);
  if (payload_bytes > size || size != expected_size) {
    throw FormatError(str_cat("'", path, "' is truncated or has trailing bytes: the header says ",
                              expected_size, " bytes, the file has ", size));
  }
  uint32_t stored_crc;
  std::memcpy(&stored_crc, data + size - sizeof(uint32_t), sizeof(stored_crc));
  const uint32_t actual_crc = crc32(data, size - sizeof(uint32_t));
  if (stored_crc != actual_crc) {
    throw FormatError(str_cat("'", path, "' is corrupted: checksum ", actual_crc,
                              " does not match the stored ", stored_crc));
  }
  payload_bytes_ = payload_bytes;
  ByteReader in(data + kHeaderBytes, payload_bytes);
  try {
    info_.model_tag = in.string("model tag", 4096);
    info_.model_fingerprint = in.get<uint64_t>("model fingerprint");
    info_.kv = read_kv(in, version);
    const uint64_t n_tokens = in.get<uint64_t>("token count");
    if (n_tokens > uint64_t(kMaxFileTokens) || n_tokens * sizeof(int32_t) > in.remaining()) {
      throw FormatError(str_cat("cache file: token count ", n_tokens, " does not fit in the ",
                                in.remaining(), " bytes left"));
    }
    info_.tokens.resize(n_tokens);
    in.bytes(info_.tokens.data(), n_tokens * sizeof(int32_t), "tokens");
    info_.metadata = in.string("metadata", kMaxMetadataBytes);
  } catch (const FormatError& e) {
    throw FormatError(str_cat("'", path, "': ", e.what()));
  }
  caches_offset_ = in.position();
}

void CacheFileReader::load_caches(LayerCaches& caches) {
  ByteReader in(file_.data() + kHeaderBytes + caches_offset_, payload_bytes_ - caches_offset_);
  const uint32_t layers = in.get<uint32_t>("layer count");
  if (layers != caches.size()) {
    throw InvalidArgument(str_cat("cache file '", path_, "' has ", layers,
                                  " layers, this model has ", caches.size()));
  }
  for (size_t i = 0; i < caches.size(); ++i) {
    try {
      caches[i]->load(in);
    } catch (const InvalidArgument& e) {
      throw InvalidArgument(str_cat("cache file '", path_,
                                    "' does not match this model/configuration: layer ", i, ": ",
                                    e.what()));
    } catch (const FormatError& e) {
      throw FormatError(str_cat("'", path_, "' layer ", i, ": ", e.what()));
    }
    if (caches[i]->size() != caches[0]->size() ||
        caches[i]->size() > static_cast<int64_t>(info_.tokens.size())) {
      throw FormatError(str_cat("'", path_, "' layer ", i, " holds ", caches[i]->size(),
                                " tokens; layer 0 holds ", caches[0]->size(), " and the history ",
                                info_.tokens.size()));
    }
  }
  if (in.remaining() != 0) {
    throw FormatError(str_cat("'", path_, "' has ", in.remaining(), " unread payload bytes"));
  }
}

}  // namespace turbokv
