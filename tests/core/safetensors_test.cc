// The safetensors reader against files written by HF (the shipped fixtures) and against
// broken files: every defect must be a FormatError/IoError that names the file or tensor.
#include "core/safetensors.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <string>

#include "core/error.h"
#include "core/text_file.h"

namespace turbokv {
namespace {

const std::string kReference = std::string(TURBOKV_SOURCE_DIR) +
                               "/tests/fixtures/tinycode-llama-reference.safetensors";

std::string write_temp(const std::string& name, const std::string& bytes) {
  const std::string path = ::testing::TempDir() + name;
  std::ofstream(path, std::ios::binary) << bytes;
  return path;
}

std::string make_file(const std::string& header, const std::string& data) {
  std::string out(8, '\0');
  uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) out[i] = char((n >> (8 * i)) & 0xff);
  return out + header + data;
}

TEST(Safetensors, ReadsHfReference) {
  auto st = SafetensorsFile::open(kReference);
  const TensorView& logits = st.at("logits");
  EXPECT_EQ(logits.dtype, DType::F32);
  EXPECT_EQ(logits.shape_string(), "[64, 8192]");
  auto ids = SafetensorsFile::to_i64(st.at("input_ids"));
  ASSERT_EQ(ids.size(), 64u);
  EXPECT_GE(ids[0], 0);
  EXPECT_EQ(SafetensorsFile::to_i64(st.at("generated")).size(), 32u);
  EXPECT_EQ(st.find("nope"), nullptr);
  EXPECT_THROW(st.at("nope"), FormatError);
}

void expect_format_error(const std::string& bytes, const std::string& needle) {
  const std::string path = write_temp("bad.safetensors", bytes);
  try {
    SafetensorsFile::open(path);
    FAIL() << "no error for " << needle;
  } catch (const FormatError& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
  }
}

TEST(Safetensors, RejectsBrokenFiles) {
  const std::string good = read_file(kReference);
  expect_format_error(good.substr(0, 5), "shorter than");
  expect_format_error(good.substr(0, 100), "header length");
  expect_format_error(good.substr(0, good.size() - 10), "outside the data section");
  expect_format_error(make_file("{not json", ""), "not valid JSON");
  expect_format_error(make_file(R"({"a":{"dtype":"F7","shape":[1],"data_offsets":[0,4]}})",
                                std::string(4, '\0')),
                      "unsupported dtype");
  expect_format_error(make_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,4]}})",
                                std::string(4, '\0')),
                      "needs 8");
  expect_format_error(make_file(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                                R"("b":{"dtype":"F32","shape":[1],"data_offsets":[2,6]}})",
                                std::string(8, '\0')),
                      "overlap");
  expect_format_error(make_file(R"({"a":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})",
                                std::string(4, '\0')),
                      "invalid shape");
  // A shape entry nested 100000 deep is refused before anything walks it.
  const std::string deep = std::string(100000, '[') + "1" + std::string(100000, ']');
  expect_format_error(
      make_file(R"({"a":{"dtype":"F32","shape":[)" + deep + R"(],"data_offsets":[0,4]}})",
                std::string(4, '\0')),
      "deeper than 256");
}

TEST(Safetensors, MissingFileIsIoError) {
  EXPECT_THROW(SafetensorsFile::open("/nonexistent/x.safetensors"), IoError);
}

}  // namespace
}  // namespace turbokv
