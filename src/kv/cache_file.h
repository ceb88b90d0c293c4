// Cache files: one sequence's KV caches (all layers) with what a saved session needs to go on
// exactly where it stopped: the model it belongs to, the KV settings, the token history.
//
// Layout (little-endian):
//   "TKVCACHE" (8 bytes) | version u32 (= 4) | payload_bytes u64 | payload | crc32 u32
//   payload:
//     model tag (u32 length + bytes) | model fingerprint u64
//     KV settings: scheme u8 | key_bits f64 | value_bits f64 | group_size i32 |
//                  quantized_kv_start i64 | seed u64 | norm mode u8 (0 plain, 1 norm correction,
//                  2 unbiased) | last_layer_dense u8 |
//                  center_keys u8 | center_values u8 | sink_tokens i32 | allocation u8 |
//                  budget_bits f64 | hadamard u8 | recent_tokens i32 | n u32 | n x (layer i32 |
//                  dense u8 | key_bits f64 | value_bits f64)
//     tokens: count u64 | i32 ids (prompt and generated tokens, in order)
//     metadata (u32 length + bytes: free-form text of the front end, e.g. chat messages as JSON)
//     n_layers u32 | one record per layer: KVCache::save() (the cache's state, its token count
//     and rows; kv_cache.h)
// The CRC-32 covers everything before it. Files are written to a temporary name and renamed,
// so a reader never sees half a file. Version 1 files (no model fingerprint, settings or
// tokens) and version 2 files (no TurboQuant centering, sinks or per-layer bits) are refused
// with a message saying so; version 3 files (no recent_tokens) load with recent_tokens 0.
#pragma once

#include <string>
#include <vector>

#include "core/mapped_file.h"
#include "kv/kv_cache.h"

namespace turbokv {

constexpr uint32_t kCacheFileVersion = 4;

// What a cache file records besides the caches.
struct CacheFileInfo {
  std::string model_tag;           // a name for messages (e.g. the model directory's name)
  uint64_t model_fingerprint = 0;  // identity of the model's configuration and weights
  ResolvedKV kv;                   // the KV settings the caches were made with
  std::vector<int32_t> tokens;     // the token history; the caches hold its first tokens
  std::string metadata;            // free-form text of the front end
};

// Writes info and caches to path (replacing it). Throws IoError when the file cannot be
// written, Unsupported when a cache type cannot be saved.
void save_cache_file(const std::string& path, const CacheFileInfo& info, const LayerCaches& caches);

// An opened, verified cache file: construction maps it, checks magic, version, size and
// checksum and reads the info; load_caches() reads the layer records. Throws
//   IoError        the file cannot be read;
//   FormatError    not a cache file, another version, truncated, checksum mismatch, malformed.
class CacheFileReader {
 public:
  explicit CacheFileReader(const std::string& path);

  const CacheFileInfo& info() const { return info_; }
  // Loads the records into caches made by make_layer_caches for the same model and info().kv.
  // InvalidArgument when they do not fit (layer count, cache type, heads, dims, bits, seed, ...
  // named in the message); FormatError for malformed records or when the caches hold more
  // tokens than the history. On error the caches' contents are unspecified (make new ones).
  void load_caches(LayerCaches& caches);

 private:
  std::string path_;
  MappedFile file_;
  CacheFileInfo info_;
  size_t caches_offset_ = 0;  // where the layer count starts in the payload
  size_t payload_bytes_ = 0;
};

// "turboquant K3/V4, seed 0, norm correction, last layer dense" and the like: the KV settings
// in messages.
std::string describe_kv(const ResolvedKV& kv);

// CRC-32 (IEEE 802.3, reflected, polynomial 0xEDB88320) of data.
uint32_t crc32(const uint8_t* data, size_t n);

}  // namespace turbokv
