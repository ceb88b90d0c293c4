// The tokenizer stored in a GGUF file's metadata, rebuilt as the tokenizer.json pipeline the
// same model has on the Hugging Face side, then run by HfTokenizer:
//   tokenizer.ggml.model = gpt2  : byte-level BPE from tokens + merges; the pre-tokenizer split
//                                  regex chosen by tokenizer.ggml.pre (llama.cpp's names:
//                                  qwen2, llama-bpe / llama3, default / gpt-2, ...)
//   tokenizer.ggml.model = llama : SentencePiece-style BPE with byte fallback; merges derived
//                                  from the token scores (a merge ranks by the score of the
//                                  token it makes), "▁" for spaces, a "▁" prefix unless
//                                  tokenizer.ggml.add_space_prefix is false
// Control tokens (token_type 3) and user-defined ones (4) become added tokens (special and
// not); bos/eos/unk/pad ids, add_bos_token and tokenizer.chat_template set the config.
#pragma once

#include <memory>
#include <nlohmann/json.hpp>

#include "core/gguf.h"
#include "tokenizer/tokenizer.h"

namespace turbokv {

// Throws FormatError naming the file and key for missing or inconsistent metadata, Unsupported
// naming an unknown tokenizer model or pre-tokenizer (and the supported ones).
std::unique_ptr<Tokenizer> gguf_tokenizer(const GgufFile& file);
// The tokenizer.json equivalent (for tests and inspection).
nlohmann::json gguf_tokenizer_json(const GgufFile& file);

}  // namespace turbokv
