// The prefix cache and sessions on the shipped model: greedy tokens with the prefix cache on
// equal those with it off, for every KV scheme and for requests that share a prefix and
// diverge in the middle of a block, one after the other and batched together; a saved session
// loaded by another engine goes on with exactly the tokens one uninterrupted run produces; bad
// session files are refused with the error that names the problem.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <iterator>

#include "core/error.h"
#include "turbokv/engine.h"

namespace turbokv {
namespace {

namespace fs = std::filesystem;

std::string model_dir() {
  return std::string(TURBOKV_SOURCE_DIR) + "/models/tinycode-llama";
}

EngineOptions engine_options(bool prefix_cache) {
  EngineOptions o;
  o.prefill_chunk = 32;
  o.max_sequences = 4;
  o.max_batch_tokens = 64;
  o.prefix_cache_block = 16;
  o.prefix_cache_bytes = prefix_cache ? int64_t(64) << 20 : 0;
  return o;
}

std::vector<int32_t> greedy(Engine& engine, const std::vector<int32_t>& prompt,
                            const std::optional<KVOptions>& kv, int max_tokens = 12) {
  GenerateOptions o;
  o.max_tokens = max_tokens;
  o.ignore_eos = true;
  o.kv = kv;
  return engine.generate(prompt, o).tokens;
}

KVOptions kv_bits(double bits, const std::string& scheme = "uniform") {
  KVOptions o;
  o.kv_bits = bits;
  o.kv_quant_scheme = scheme;
  return o;
}

// A shared prefix of real code and three endings: two diverge inside the same block.
struct Prompts {
  std::vector<int32_t> prefix, a, b, c;
};

Prompts prompts(const Engine& engine) {
  Prompts p;
  p.prefix = engine.encode(
      "import os\nimport sys\n\n\nclass Config:\n    \"\"\"Settings read from a file of "
      "key=value lines.\"\"\"\n\n    def __init__(self, path, defaults=None):\n        "
      "self.path = path\n        self.values = dict(defaults or {})\n        self.loaded = "
      "False\n\n    def exists(self):\n        return os.path.exists(self.path)\n\n    def "
      "load(self):\n        with open(self.path) as f:\n            for line in f:\n          "
      "      line = line.strip()\n                if not line or line.startswith('#'):\n      "
      "              continue\n                key, value = line.split('=', 1)\n");
  auto ending = [&](const std::string& text) {
    auto tokens = p.prefix;
    const auto more = engine.encode(text, /*add_special_tokens=*/false);
    tokens.insert(tokens.end(), more.begin(), more.end());
    return tokens;
  };
  p.a = ending(
      "                self.values[key.strip()] = value.strip()\n\n    def get(self, key):\n");
  p.b = ending("                self.values[key.strip()] = int(value)\n\n    def save(self):\n");
  p.c = ending("        return self\n\n\ndef main():\n    config = Config(sys.argv[1])\n");
  return p;
}

TEST(PrefixCacheGolden, GreedyTokensWithThePrefixCacheOnEqualThoseWithItOff) {
  auto on = Engine::load(model_dir(), engine_options(true));
  auto off = Engine::load(model_dir(), engine_options(false));
  const Prompts p = prompts(*on);
  ASSERT_GT(p.prefix.size(), 96u);  // three chunks, six blocks
  KVOptions split = kv_bits(3.5, "turboquant");
  split.kv_key_bits = 3.5;  // split-codec keys: a state ranked on the first chunk
  KVOptions staged = kv_bits(3.5, "turboquant");
  staged.quantized_kv_start = 40;  // dense, then converted inside the prefix
  const std::pair<const char*, std::optional<KVOptions>> settings[] = {
      {"dense", KVOptions{}},
      {"turboquant 3.5", kv_bits(3.5)},
      {"uniform 4", kv_bits(4)},
      {"split keys", split},
      {"quantized_kv_start 40", staged}};
  for (const auto& [name, kv] : settings) {
    const auto hits_before = on->metrics().prefix_cache_hit_tokens;
    for (const auto* prompt : {&p.a, &p.b, &p.c, &p.a}) {
      EXPECT_EQ(greedy(*on, *prompt, kv), greedy(*off, *prompt, kv)) << name;
    }
    EXPECT_GT(on->metrics().prefix_cache_hit_tokens, hits_before) << name;
  }
  EXPECT_EQ(off->metrics().prefix_cache_hits, 0);
}

TEST(PrefixCacheGolden, APromptThatGoesOnFromAnAnswerReusesTheAnswersBlocks) {
  auto on = Engine::load(model_dir(), engine_options(true));
  auto off = Engine::load(model_dir(), engine_options(false));
  const Prompts p = prompts(*on);
  for (const auto& kv : {std::optional<KVOptions>(KVOptions{}), std::optional(kv_bits(3.5))}) {
    const auto answer = greedy(*on, p.c, kv, 48);  // its generated blocks are cached too
    auto next = p.c;
    next.insert(next.end(), answer.begin(), answer.end());
    next.push_back(p.a.back());
    const auto hits_before = on->metrics().prefix_cache_hit_tokens;
    EXPECT_EQ(greedy(*on, next, kv), greedy(*off, next, kv));
    EXPECT_GT(on->metrics().prefix_cache_hit_tokens - hits_before, int64_t(p.c.size()));
  }
}

TEST(PrefixCacheGolden, BatchedRequestsSharingAPrefixEqualTheSameRequestsAlone) {
  auto on = Engine::load(model_dir(), engine_options(true));
  auto off = Engine::load(model_dir(), engine_options(false));
  const Prompts p = prompts(*on);
  const std::vector<int32_t> prompts_in_order[] = {p.a, p.b, p.c, p.b, p.a, p.c};
  for (const auto& kv : {std::optional<KVOptions>(KVOptions{}), std::optional(kv_bits(3.5))}) {
    greedy(*on, p.a, kv);  // the prefix is cached before the batch arrives
    GenerateOptions o;
    o.max_tokens = 12;
    o.ignore_eos = true;
    o.kv = kv;
    std::vector<std::unique_ptr<GenerationStream>> streams;
    for (const auto& prompt : prompts_in_order) streams.push_back(on->submit(prompt, o));
    for (size_t i = 0; i < streams.size(); ++i) {
      std::vector<int32_t> got;
      GenerationChunk chunk;
      while (streams[i]->next(&chunk)) {
        if (chunk.token >= 0) got.push_back(chunk.token);
      }
      EXPECT_EQ(got, greedy(*off, prompts_in_order[i], kv)) << "request " << i;
    }
  }
  EXPECT_GE(on->metrics().prefix_cache_hits, 6);
}

std::string temp_path(const std::string& name) {
  return ::testing::TempDir() + "/" + name;
}

std::vector<uint8_t> read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(in), {});
}

void write_bytes(const std::string& path, const std::vector<uint8_t>& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()), std::streamsize(bytes.size()));
}

TEST(SessionGolden, ALoadedSessionGoesOnWithTheTokensOfOneUninterruptedRun) {
  for (const KVOptions& kv : {KVOptions{}, kv_bits(3.5), kv_bits(4)}) {
    const std::string path = temp_path("session.tkv");
    std::vector<int32_t> prompt;
    std::vector<int32_t> first;
    {
      auto engine = Engine::load(model_dir(), engine_options(false));
      prompt = prompts(*engine).c;
      auto session = engine->new_session(kv);
      GenerateOptions o;
      o.max_tokens = 10;
      o.ignore_eos = true;
      o.session = session;
      first = engine->generate(prompt, o).tokens;
      EXPECT_EQ(session->tokens().size(), prompt.size() + first.size());
      EXPECT_EQ(session->cached_tokens(), int64_t(prompt.size() + first.size()) - 1);
      engine->save_session(*session, path);
    }
    auto engine = Engine::load(model_dir(), engine_options(false));
    auto session = engine->load_session(path, kv);
    GenerateOptions o;
    o.max_tokens = 10;
    o.ignore_eos = true;
    o.session = session;
    const auto result = engine->generate(session->tokens(), o);
    EXPECT_EQ(result.stats.prompt_cached_tokens, int64_t(prompt.size() + first.size()) - 1);
    std::vector<int32_t> resumed = first;
    resumed.insert(resumed.end(), result.tokens.begin(), result.tokens.end());
    EXPECT_EQ(resumed, greedy(*engine, prompt, kv, 20)) << kv.kv_bits.value_or(16);
  }
}

TEST(SessionGolden, BadSessionFilesAreRefusedNamingTheProblem) {
  auto engine = Engine::load(model_dir(), engine_options(false));
  const std::string path = temp_path("good-session.tkv");
  auto session = engine->new_session(kv_bits(3.5));
  GenerateOptions o;
  o.max_tokens = 4;
  o.session = session;
  engine->generate(prompts(*engine).a, o);
  engine->save_session(*session, path);
  const auto good = read_bytes(path);
  auto expect = [&](const std::vector<uint8_t>& bytes, auto error, const char* needle,
                    std::optional<KVOptions> kv = std::nullopt) {
    const std::string bad = temp_path("bad-session.tkv");
    write_bytes(bad, bytes);
    try {
      engine->load_session(bad, kv);
      ADD_FAILURE() << "no error for " << needle;
    } catch (const decltype(error)& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  for (size_t at : {size_t(30), good.size() / 3, good.size() - 6}) {
    auto flipped = good;
    flipped[at] ^= 0x04;
    expect(flipped, FormatError(""), "corrupted");
  }
  expect(std::vector<uint8_t>(good.begin(), good.begin() + long(good.size() / 2)), FormatError(""),
         "truncated");
  expect(good, InvalidArgument(""), "KV settings", kv_bits(4));
  expect(good, InvalidArgument(""), "KV settings", KVOptions{});
  EXPECT_NO_THROW(engine->load_session(path, kv_bits(3.5)));

  // The same weights with another configuration are another model.
  const fs::path other = temp_path("other-model");
  fs::remove_all(other);
  fs::create_directories(other);
  for (const auto& entry : fs::directory_iterator(model_dir())) {
    if (entry.path().filename() != "config.json") {
      fs::create_symlink(entry.path(), other / entry.path().filename());
    }
  }
  std::string config(
      std::istreambuf_iterator<char>(std::ifstream(model_dir() + "/config.json").rdbuf()), {});
  config.replace(config.find("\"rms_norm_eps\": 1e-05"), 21, "\"rms_norm_eps\": 2e-05");
  std::ofstream(other / "config.json") << config;
  auto other_engine = Engine::load(other.string(), engine_options(false));
  try {
    other_engine->load_session(path);
    ADD_FAILURE() << "no error for another model";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("another model"), std::string::npos) << e.what();
  }
}

TEST(SessionGolden, ABusySessionCannotRunASecondRequestOrBeSaved) {
  auto engine = Engine::load(model_dir(), engine_options(false));
  auto session = engine->new_session();
  GenerateOptions o;
  o.max_tokens = 200;
  o.ignore_eos = true;
  o.session = session;
  auto stream = engine->submit(prompts(*engine).a, o);
  EXPECT_TRUE(session->busy());
  EXPECT_THROW(engine->submit(prompts(*engine).b, o), InvalidArgument);
  EXPECT_THROW(engine->save_session(*session, temp_path("busy.tkv")), InvalidArgument);
  EXPECT_THROW(session->clear(), InvalidArgument);
  stream->cancel();
  GenerationChunk chunk;
  while (stream->next(&chunk)) {
  }
  EXPECT_FALSE(session->busy());
  EXPECT_NO_THROW(engine->save_session(*session, temp_path("idle.tkv")));
}

}  // namespace
}  // namespace turbokv
