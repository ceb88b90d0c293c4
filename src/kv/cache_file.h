// Save/load of one sequence's KV caches (all layers) to a versioned binary file.
//
// Layout (little-endian):
//   "TKVCACHE" (8 bytes) | version u32 (= 1) | payload_bytes u64 | payload | crc32 u32
//   payload: model tag (u32 length + bytes) | n_layers u32 | one record per layer
//   record: the cache's save(): type ("dense", "rotating", "turboquant", "uniform", "staged"),
//           kv_heads, head_dim, its configuration (dtype, window, bits, seed, norm
//           correction, group size, split channel orders) and token count, then its rows.
// The CRC-32 covers everything before it.
#pragma once

#include <string>

#include "kv/kv_cache.h"

namespace turbokv {

constexpr uint32_t kCacheFileVersion = 1;

// Writes caches to path (replacing it). model_tag names the model the caches belong to
// (e.g. its directory name); "" records none. Throws IoError when the file cannot be written.
void save_layer_caches(const LayerCaches& caches, const std::string& path,
                       const std::string& model_tag = "");

// Loads a file written by save_layer_caches into caches made by make_layer_caches for the
// same model and KV options. Throws
//   IoError        the file cannot be read;
//   FormatError    not a cache file, unknown version, truncated, checksum mismatch, malformed;
//   InvalidArgument the file is from another model or configuration (layer count, model tag,
//                  cache type, heads, dims, bits, seed, ... named in the message).
// On error the caches' contents are unspecified (make new ones).
void load_layer_caches(LayerCaches& caches, const std::string& path,
                       const std::string& model_tag = "");

// CRC-32 (IEEE 802.3, reflected, polynomial 0xEDB88320) of data.
uint32_t crc32(const uint8_t* data, size_t n);

}  // namespace turbokv
