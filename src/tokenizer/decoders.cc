// tokenizer.json decoders: ByteLevel, Replace, ByteFallback, Fuse, Strip, Metaspace, Sequence.
// Each maps the token strings to new token strings (decode_chain); the tokenizer joins them.
#include "core/error.h"
#include "core/utf8.h"
#include "tokenizer/pipeline.h"

namespace turbokv {
namespace {

constexpr char kReplacementChar[] = "\xEF\xBF\xBD";

class SequenceDecoder final : public Decoder {
 public:
  explicit SequenceDecoder(std::vector<std::unique_ptr<Decoder>> steps)
      : steps_(std::move(steps)) {}
  std::vector<std::string> decode_chain(std::vector<std::string> tokens) const override {
    for (const auto& step : steps_) tokens = step->decode_chain(std::move(tokens));
    return tokens;
  }

 private:
  std::vector<std::unique_ptr<Decoder>> steps_;
};

// Maps every byte-alphabet character back to its byte; a token with a character outside the
// alphabet contributes its own UTF-8 bytes. The result is one lossily decoded string.
class ByteLevelDecoder final : public Decoder {
 public:
  std::vector<std::string> decode_chain(std::vector<std::string> tokens) const override {
    std::string bytes;
    for (const std::string& token : tokens) {
      const size_t mark = bytes.size();
      bool all_mapped = true;
      for (size_t pos = 0; pos < token.size();) {
        const int b = utf8::unicode_to_byte(utf8::next(token, pos));
        if (b < 0) {
          all_mapped = false;
          break;
        }
        bytes += static_cast<char>(b);
      }
      if (!all_mapped) {
        bytes.resize(mark);
        bytes += token;
      }
    }
    return {utf8_lossy(bytes)};
  }
};

class ReplaceDecoder final : public Decoder {
 public:
  ReplaceDecoder(Regex pattern, std::string content)
      : pattern_(std::move(pattern)), content_(std::move(content)) {}
  std::vector<std::string> decode_chain(std::vector<std::string> tokens) const override {
    for (std::string& token : tokens) token = pattern_.replace_all(token, content_);
    return tokens;
  }

 private:
  Regex pattern_;
  std::string content_;
};

// Runs of <0xXX> tokens become the UTF-8 text they spell, or one U+FFFD per byte token when
// the run is not valid UTF-8.
class ByteFallbackDecoder final : public Decoder {
 public:
  std::vector<std::string> decode_chain(std::vector<std::string> tokens) const override {
    std::vector<std::string> out;
    std::string run;
    size_t run_tokens = 0;
    auto flush = [&] {
      if (run_tokens == 0) return;
      if (utf8::find_invalid(run) == std::string::npos) {
        out.push_back(run);
      } else {
        for (size_t i = 0; i < run_tokens; ++i) out.emplace_back(kReplacementChar);
      }
      run.clear();
      run_tokens = 0;
    };
    for (std::string& token : tokens) {
      int byte = -1;
      if (token.size() == 6 && token.compare(0, 3, "<0x") == 0 && token[5] == '>') {
        byte = parse_hex(token[3], token[4]);
      }
      if (byte >= 0) {
        run += static_cast<char>(byte);
        ++run_tokens;
      } else {
        flush();
        out.push_back(std::move(token));
      }
    }
    flush();
    return out;
  }

 private:
  static int hex_digit(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
  }
  static int parse_hex(char hi, char lo) {
    const int h = hex_digit(hi), l = hex_digit(lo);
    return h < 0 || l < 0 ? -1 : h * 16 + l;
  }
};

class FuseDecoder final : public Decoder {
 public:
  std::vector<std::string> decode_chain(std::vector<std::string> tokens) const override {
    std::string joined;
    for (const std::string& token : tokens) joined += token;
    return {joined};
  }
};

// Removes up to `start` leading and `stop` trailing copies of one character from each token.
class StripDecoder final : public Decoder {
 public:
  StripDecoder(std::string content, size_t start, size_t stop)
      : content_(std::move(content)), start_(start), stop_(stop) {}
  std::vector<std::string> decode_chain(std::vector<std::string> tokens) const override {
    for (std::string& token : tokens) {
      size_t begin = 0, end = token.size();
      for (size_t i = 0;
           i < start_ && token.compare(begin, content_.size(), content_) == 0 && begin < end; ++i) {
        begin += content_.size();
      }
      for (size_t i = 0; i < stop_ && end >= begin + content_.size() &&
                         token.compare(end - content_.size(), content_.size(), content_) == 0;
           ++i) {
        end -= content_.size();
      }
      token = token.substr(begin, end - begin);
    }
    return tokens;
  }

 private:
  std::string content_;
  size_t start_, stop_;
};

class MetaspaceDecoder final : public Decoder {
 public:
  MetaspaceDecoder(std::string replacement, bool strip_first)
      : replacement_(std::move(replacement)), strip_first_(strip_first) {}
  std::vector<std::string> decode_chain(std::vector<std::string> tokens) const override {
    for (size_t i = 0; i < tokens.size(); ++i) {
      std::string out;
      const std::string& token = tokens[i];
      for (size_t pos = 0; pos < token.size();) {
        if (token.compare(pos, replacement_.size(), replacement_) == 0) {
          out += ' ';
          pos += replacement_.size();
        } else {
          out += token[pos++];
        }
      }
      if (i == 0 && strip_first_ && !out.empty() && out[0] == ' ') out.erase(0, 1);
      tokens[i] = std::move(out);
    }
    return tokens;
  }

 private:
  std::string replacement_;
  bool strip_first_;
};

}  // namespace

std::unique_ptr<Decoder> make_decoder(const json& j, const std::string& where) {
  if (j.is_null()) return nullptr;
  const std::string type = json_string(j, "type", where);
  if (type == "Sequence") {
    return std::make_unique<SequenceDecoder>(json_sequence(j, "decoders", where, make_decoder));
  }
  if (type == "ByteLevel") return std::make_unique<ByteLevelDecoder>();
  if (type == "Replace") {
    return std::make_unique<ReplaceDecoder>(
        make_pattern(json_member(j, "pattern", where), where + ".pattern"),
        json_string(j, "content", where));
  }
  if (type == "ByteFallback") return std::make_unique<ByteFallbackDecoder>();
  if (type == "Fuse") return std::make_unique<FuseDecoder>();
  if (type == "Strip") {
    const int64_t start = json_int_or(j, "start", 0, where);
    const int64_t stop = json_int_or(j, "stop", 0, where);
    if (start < 0 || stop < 0) {
      throw FormatError(str_cat("tokenizer.json: ", where, ": start/stop must be >= 0"));
    }
    return std::make_unique<StripDecoder>(json_string(j, "content", where),
                                          static_cast<size_t>(start), static_cast<size_t>(stop));
  }
  if (type == "Metaspace") {
    bool strip_first = json_bool_or(j, "add_prefix_space", true, where);
    const std::string scheme = json_string_or(j, "prepend_scheme", "", where);
    if (!scheme.empty()) strip_first = scheme != "never";
    return std::make_unique<MetaspaceDecoder>(json_string_or(j, "replacement", "\u2581", where),
                                              strip_first);
  }
  throw Unsupported(str_cat("tokenizer.json: ", where, ": decoder type '", type,
                            "' is not supported (supported: Sequence, ByteLevel, Replace, "
                            "ByteFallback, Fuse, Strip, Metaspace)"));
}

}  // namespace turbokv
