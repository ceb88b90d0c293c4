#include "kv/cache_file.h"

#include <array>
#include <bit>
#include <cstring>
#include <fstream>

#include "core/error.h"
#include "core/mapped_file.h"
#include "kv/byte_io.h"

namespace turbokv {
namespace {

static_assert(std::endian::native == std::endian::little, "cache files are little-endian");

constexpr char kMagic[8] = {'T', 'K', 'V', 'C', 'A', 'C', 'H', 'E'};
constexpr size_t kHeaderBytes = sizeof(kMagic) + sizeof(uint32_t) + sizeof(uint64_t);

std::array<uint32_t, 256> make_crc_table() {
  std::array<uint32_t, 256> table{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
    table[i] = c;
  }
  return table;
}

}  // namespace

uint32_t crc32(const uint8_t* data, size_t n) {
  static const std::array<uint32_t, 256> table = make_crc_table();
  uint32_t c = 0xFFFFFFFFu;
  for (size_t i = 0; i < n; ++i) c = table[(c ^ data[i]) & 0xFFu] ^ (c >> 8);
  return c ^ 0xFFFFFFFFu;
}

void save_layer_caches(const LayerCaches& caches, const std::string& path,
                       const std::string& model_tag) {
  ByteWriter payload;
  payload.string(model_tag);
  payload.put<uint32_t>(static_cast<uint32_t>(caches.size()));
  for (const auto& cache : caches) cache->save(payload);

  ByteWriter file;
  file.bytes(kMagic, sizeof(kMagic));
  file.put<uint32_t>(kCacheFileVersion);
  file.put<uint64_t>(payload.buffer().size());
  file.bytes(payload.buffer().data(), payload.buffer().size());
  file.put<uint32_t>(crc32(file.buffer().data(), file.buffer().size()));

  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(file.buffer().data()),
            static_cast<std::streamsize>(file.buffer().size()));
  out.close();
  if (!out) throw IoError(str_cat("cannot write the cache file '", path, "'"));
}

void load_layer_caches(LayerCaches& caches, const std::string& path, const std::string& model_tag) {
  const MappedFile file(path);
  const uint8_t* data = file.data();
  if (file.size() < sizeof(kMagic) || std::memcmp(data, kMagic, sizeof(kMagic)) != 0) {
    throw FormatError(str_cat("'", path, "' is not a turbokv cache file (", file.size(),
                              " bytes, no TKVCACHE header)"));
  }
  if (file.size() < kHeaderBytes + sizeof(uint32_t)) {
    throw FormatError(
        str_cat("'", path, "' is truncated: ", file.size(), " bytes, shorter than ", "the header"));
  }
  ByteReader header(data + sizeof(kMagic), kHeaderBytes - sizeof(kMagic));
  const uint32_t version = header.get<uint32_t>("version");
  if (version != kCacheFileVersion) {
    throw FormatError(str_cat("'", path, "' has cache file version ", version,
                              "; this build reads version ", kCacheFileVersion));
  }
  const uint64_t payload_bytes = header.get<uint64_t>("payload size");
  const uint64_t expected_size = kHeaderBytes + payload_bytes + sizeof(uint32_t);
  if (payload_bytes > file.size() || file.size() != expected_size) {
    throw FormatError(str_cat("'", path, "' is truncated or has trailing bytes: the header says ",
                              expected_size, " bytes, the file has ", file.size()));
  }
  uint32_t stored_crc;
  std::memcpy(&stored_crc, data + file.size() - sizeof(uint32_t), sizeof(stored_crc));
  const uint32_t actual_crc = crc32(data, file.size() - sizeof(uint32_t));
  if (stored_crc != actual_crc) {
    throw FormatError(str_cat("'", path, "' is corrupted: checksum ", actual_crc,
                              " does not match the stored ", stored_crc));
  }

  ByteReader in(data + kHeaderBytes, payload_bytes);
  const std::string file_tag = in.string("model tag", 4096);
  if (!model_tag.empty() && !file_tag.empty() && file_tag != model_tag) {
    throw InvalidArgument(str_cat("cache file '", path, "' belongs to model '", file_tag,
                                  "', not '", model_tag, "'"));
  }
  const uint32_t layers = in.get<uint32_t>("layer count");
  if (layers != caches.size()) {
    throw InvalidArgument(
        str_cat("cache file '", path, "' has ", layers, " layers, this model has ", caches.size()));
  }
  for (size_t i = 0; i < caches.size(); ++i) {
    try {
      caches[i]->load(in);
    } catch (const InvalidArgument& e) {
      throw InvalidArgument(str_cat("cache file '", path,
                                    "' does not match this model/configuration: layer ", i, ": ",
                                    e.what()));
    } catch (const FormatError& e) {
      throw FormatError(str_cat("'", path, "' layer ", i, ": ", e.what()));
    }
  }
  if (in.remaining() != 0) {
    throw FormatError(str_cat("'", path, "' has ", in.remaining(), " unread payload bytes"));
  }
}

}  // namespace turbokv
