// Continuous batching with a fake model: batched results equal solo results, prefill is chunked,
// limits hold, every stop condition works, and a failing request does not stop the engine.
#include "engine/scheduler.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <mutex>
#include <string>
#include <thread>

#include "core/error.h"
#include "fakes.h"

namespace turbokv {
namespace {

using testing::FakeModel;
using testing::FakeTokenizer;

// What greedy decoding of the fake model must give, computed without the scheduler.
std::vector<int32_t> expected_tokens(std::vector<int32_t> history, int max_tokens) {
  std::vector<int32_t> out;
  while (static_cast<int>(out.size()) < max_tokens) {
    const int32_t t = testing::fake_next_token(history);
    if (t == testing::kFakeEos) break;
    out.push_back(t);
    history.push_back(t);
  }
  return out;
}

// The same with ignore_eos: n tokens, EOS ids included.
std::vector<int32_t> expected_ignoring_eos(std::vector<int32_t> history, int n) {
  std::vector<int32_t> out;
  for (int i = 0; i < n; ++i) {
    out.push_back(testing::fake_next_token(history));
    history.push_back(out.back());
  }
  return out;
}

struct Harness {
  explicit Harness(EngineOptions o = {}, int64_t context = 4096)
      : model(context),
        scheduler(model, tokenizer, {testing::kFakeEos}, o, testing::make_token_caches) {}
  FakeModel model;
  FakeTokenizer tokenizer;
  Scheduler scheduler;
};

GenerationResult drain(GenerationStream& stream, std::vector<GenerationChunk>* all = nullptr) {
  GenerationResult r;
  GenerationChunk c;
  while (stream.next(&c)) {
    r.text += c.text;
    if (c.token >= 0) r.tokens.push_back(c.token);
    if (c.done) {
      r.finish_reason = c.finish_reason;
      r.stats = c.stats;
    }
    if (all) all->push_back(c);
  }
  return r;
}

KVOptions kv(double bits, std::string scheme = "uniform") {
  KVOptions o;
  o.kv_bits = bits;
  o.kv_quant_scheme = std::move(scheme);
  return o;
}

GenerateOptions max_tokens(int n) {
  GenerateOptions o;
  o.max_tokens = n;
  return o;
}

TEST(Scheduler, SingleRequestGivesTheGreedyTokensAndText) {
  Harness h;
  h.scheduler.start();
  const std::vector<int32_t> prompt = {1, 2, 3};
  auto r = drain(*h.scheduler.submit(prompt, max_tokens(40)));
  const auto want = expected_tokens(prompt, 40);
  EXPECT_EQ(r.tokens, want);
  EXPECT_EQ(r.text, h.tokenizer.decode(want, true));
  EXPECT_EQ(r.stats.prompt_tokens, 3);
  EXPECT_EQ(r.stats.generated_tokens, static_cast<int64_t>(want.size()));
  // The last sampled token is never fed back; an EOS is not counted.
  const int64_t fed = r.finish_reason == FinishReason::kLength ? 3 + 40 - 1 : 3 + want.size();
  EXPECT_EQ(r.stats.cached_tokens, fed);
  EXPECT_EQ(r.stats.kv_bytes, static_cast<size_t>(fed) * 2 * 4 * 2 * 2);  // TokenCache nbytes
  EXPECT_EQ(r.stats.kv_bytes_dense, static_cast<size_t>(fed) * 2 /*layers*/ * 4 * 2 * 2);
}

TEST(Scheduler, BatchedRequestsEqualSoloRequests) {
  EngineOptions o;
  o.max_sequences = 4;
  o.prefill_chunk = 3;
  Harness h(o);
  std::vector<std::vector<int32_t>> prompts = {
      {1}, {2, 3, 4, 5, 6, 7, 8}, {9, 9, 9, 9}, {3, 1, 4, 1, 5, 9, 2, 6}, {5, 5}, {7, 1, 7}};
  std::vector<std::unique_ptr<GenerationStream>> streams;
  for (const auto& p : prompts) streams.push_back(h.scheduler.submit(p, max_tokens(30)));
  h.scheduler.start();  // everything is queued: the first steps batch them
  for (size_t i = 0; i < prompts.size(); ++i) {
    EXPECT_EQ(drain(*streams[i]).tokens, expected_tokens(prompts[i], 30)) << "request " << i;
  }
  size_t widest = 0;
  for (const auto& call : h.model.calls()) {
    widest = std::max(widest, call.size());
    for (int n : call) EXPECT_LE(n, 3);  // prefill_chunk
  }
  EXPECT_EQ(widest, 4u);  // max_sequences: never more, and batching did happen
}

TEST(Scheduler, LongPromptIsPrefilledInChunksWithProgress) {
  EngineOptions o;
  o.prefill_chunk = 4;
  Harness h(o);
  h.scheduler.start();
  std::vector<GenerationChunk> chunks;
  auto r = drain(*h.scheduler.submit({1, 2, 3, 4, 5, 6, 7, 8, 9, 1}, max_tokens(2)), &chunks);
  ASSERT_GE(h.model.calls().size(), 3u);
  EXPECT_EQ(h.model.calls()[0], std::vector<int>{4});
  EXPECT_EQ(h.model.calls()[1], std::vector<int>{4});
  EXPECT_EQ(h.model.calls()[2], std::vector<int>{2});
  EXPECT_EQ(chunks[0].prompt_processed, 4);
  EXPECT_EQ(chunks[0].token, -1);
  EXPECT_EQ(chunks[1].prompt_processed, 8);
  EXPECT_EQ(r.tokens, expected_tokens({1, 2, 3, 4, 5, 6, 7, 8, 9, 1}, 2));
}

TEST(Scheduler, DecodeTokensComeFirstAndPrefillFitsTheBudget) {
  EngineOptions o;
  o.max_sequences = 2;
  o.max_batch_tokens = 5;
  o.prefill_chunk = 100;
  Harness h(o);
  auto a = h.scheduler.submit({1}, max_tokens(6));
  auto b = h.scheduler.submit(std::vector<int32_t>(12, 2), max_tokens(2));
  h.scheduler.start();
  drain(*a);
  drain(*b);
  const auto calls = h.model.calls();
  EXPECT_EQ(calls[0], (std::vector<int>{1, 4}));  // a's prompt, b's first 4 tokens
  EXPECT_EQ(calls[1], (std::vector<int>{1, 4}));  // a decodes, b prefills within the budget
  for (const auto& call : calls) {
    int total = 0;
    for (int n : call) total += n;
    EXPECT_LE(total, 5);
  }
}

TEST(Scheduler, EosStopsWithoutEmittingIt) {
  // Find a prompt whose greedy continuation hits EOS before 50 tokens.
  std::vector<int32_t> prompt;
  for (int32_t a = 1; a < 15 && prompt.empty(); ++a) {
    for (int32_t b = 1; b < 15 && prompt.empty(); ++b) {
      if (expected_tokens({a, b}, 50).size() < 50) prompt = {a, b};
    }
  }
  ASSERT_FALSE(prompt.empty());
  Harness h;
  h.scheduler.start();
  auto r = drain(*h.scheduler.submit(prompt, max_tokens(50)));
  EXPECT_EQ(r.finish_reason, FinishReason::kStop);
  EXPECT_EQ(r.tokens, expected_tokens(prompt, 50));

  GenerateOptions ignore = max_tokens(50);
  ignore.ignore_eos = true;
  auto all = drain(*h.scheduler.submit(prompt, ignore));
  EXPECT_EQ(all.finish_reason, FinishReason::kLength);
  EXPECT_EQ(all.tokens.size(), 50u);
}

TEST(Scheduler, StopStringCutsTheTextAndStreamsNoPartOfIt) {
  Harness h;
  h.scheduler.start();
  const std::vector<int32_t> prompt = {4, 2};
  const auto want = expected_tokens(prompt, 60);
  const std::string full = h.tokenizer.decode(want, true);
  ASSERT_GE(full.size(), 6u);
  const std::string stop = full.substr(3, 2);  // some two characters of the output
  GenerateOptions o = max_tokens(60);
  o.stop = {stop};
  std::vector<GenerationChunk> chunks;
  auto r = drain(*h.scheduler.submit(prompt, o), &chunks);
  EXPECT_EQ(r.finish_reason, FinishReason::kStop);
  EXPECT_EQ(r.text, full.substr(0, full.find(stop)));
}

TEST(Scheduler, ContextLimitEndsWithLength) {
  Harness h({}, /*context=*/12);
  h.scheduler.start();
  GenerateOptions o = max_tokens(100);
  o.ignore_eos = true;
  auto r = drain(*h.scheduler.submit(std::vector<int32_t>(10, 3), o));
  EXPECT_EQ(r.finish_reason, FinishReason::kLength);
  EXPECT_EQ(r.stats.cached_tokens, 12);
  EXPECT_EQ(r.stats.generated_tokens, 3);
}

TEST(Scheduler, TeacherForcingFeedsTheForcedTokensAndReportsTheSampledOnes) {
  Harness h;
  h.scheduler.start();
  GenerateOptions o = max_tokens(6);
  o.ignore_eos = true;
  o.forced_tokens = {5, 6, 7, 8, 9, 1};
  auto r = drain(*h.scheduler.submit({2, 3}, o));
  std::vector<int32_t> history = {2, 3}, want;
  for (int32_t forced : o.forced_tokens) {
    want.push_back(testing::fake_next_token(history));
    history.push_back(forced);
  }
  EXPECT_EQ(r.tokens, want);
}

TEST(Scheduler, BadRequestsAreInvalidArguments) {
  Harness h({}, /*context=*/12);
  EXPECT_THROW(h.scheduler.submit({}, max_tokens(4)), InvalidArgument);
  EXPECT_THROW(h.scheduler.submit(std::vector<int32_t>(13, 1), max_tokens(4)), InvalidArgument);
  EXPECT_THROW(h.scheduler.submit({1, 99}, max_tokens(4)), InvalidArgument);
  EXPECT_THROW(h.scheduler.submit({1}, max_tokens(0)), InvalidArgument);
  GenerateOptions forced = max_tokens(4);
  forced.forced_tokens = {1, -1};
  EXPECT_THROW(h.scheduler.submit({1}, forced), InvalidArgument);
  GenerateOptions hot = max_tokens(4);
  hot.sampling.temperature = -1;
  EXPECT_THROW(h.scheduler.submit({1}, hot), InvalidArgument);
  for (double bits : {0.3, 2.25, 9.0}) {
    GenerateOptions o = max_tokens(4);
    o.kv = kv(bits);
    EXPECT_THROW(h.scheduler.submit({1}, o), InvalidArgument) << bits;
  }
  GenerateOptions foo = max_tokens(4);
  foo.kv = kv(4, "foo");
  EXPECT_THROW(h.scheduler.submit({1}, foo), InvalidArgument);
}

TEST(Scheduler, PerRequestKVOptionsAreResolved) {
  Harness h;
  h.scheduler.start();
  GenerateOptions o = max_tokens(2);
  o.kv = kv(3.5);
  auto tq = drain(*h.scheduler.submit({1}, o)).stats.kv;
  EXPECT_EQ(tq.scheme, KVScheme::kTurboQuant);
  EXPECT_EQ(tq.key_bits, 3);
  EXPECT_EQ(tq.value_bits, 4);
  auto dense = drain(*h.scheduler.submit({1}, max_tokens(2))).stats.kv;
  EXPECT_EQ(dense.scheme, KVScheme::kDense);
}

TEST(Scheduler, FullQueueIsOverloaded) {
  EngineOptions o;
  o.max_waiting = 2;
  Harness h(o);
  auto a = h.scheduler.submit({1}, max_tokens(2));
  auto b = h.scheduler.submit({1}, max_tokens(2));
  EXPECT_THROW(h.scheduler.submit({1}, max_tokens(2)), Overloaded);
}

// A KV pool of 1000 bytes where a sequence takes 100 bytes per token: requests are admitted
// only with a promise, wait in the queue for one, and one that can never fit fails.
// promisable > 0: promises may total only that much (the device pool keeps chunks back).
struct FakePool {
  std::mutex mu;
  size_t capacity = 1000, promisable = 0, token_bytes = 100, reserved = 0, most = 0;
  KVAdmission admission() {
    KVAdmission a;
    a.bytes_for = [this](const ResolvedKV&, int64_t tokens) {
      return size_t(tokens) * token_bytes;
    };
    a.reserve = [this](size_t bytes) {
      std::lock_guard<std::mutex> lock(mu);
      if (reserved + bytes > (promisable > 0 ? promisable : capacity)) return false;
      reserved += bytes;
      most = std::max(most, reserved);
      return true;
    };
    a.release = [this](size_t bytes) {
      std::lock_guard<std::mutex> lock(mu);
      reserved -= bytes;
    };
    a.use = [this] {
      std::lock_guard<std::mutex> lock(mu);
      KVPoolUse u;
      u.capacity_bytes = capacity;
      u.promisable_bytes = promisable;
      u.reserved_bytes = reserved;
      return u;
    };
    return a;
  }
};

// The InvalidArgument message of a request the pool can never hold ("" and a failure if it
// ran instead).
std::string refusal(GenerationStream& stream) {
  GenerationChunk c;
  try {
    while (stream.next(&c)) {
    }
  } catch (const InvalidArgument& e) {
    return e.what();
  }
  ADD_FAILURE() << "a request larger than the pool's promises ran";
  return "";
}

TEST(Scheduler, KVPoolAdmitsByPromisedBytesAndQueuesTheRest) {
  FakePool pool;
  FakeModel model(4096);
  FakeTokenizer tokenizer;
  Scheduler scheduler(model, tokenizer, {testing::kFakeEos}, EngineOptions{},
                      testing::make_token_caches, pool.admission());
  // 1 + 5 tokens each: 600 bytes, so the second waits until the first gives its promise back.
  GenerateOptions o = max_tokens(5);
  o.ignore_eos = true;
  auto a = scheduler.submit({1}, o);
  auto b = scheduler.submit({2}, o);
  scheduler.start();
  EXPECT_EQ(drain(*a).tokens, expected_ignoring_eos({1}, 5));
  EXPECT_EQ(drain(*b).tokens, expected_ignoring_eos({2}, 5));
  EXPECT_LE(pool.most, pool.capacity);
  EXPECT_EQ(pool.most, 600u);
  const EngineMetrics m = scheduler.metrics();
  EXPECT_EQ(m.kv_pool_waits, 1);
  EXPECT_EQ(m.kv_pool.capacity_bytes, 1000u);
  EXPECT_EQ(pool.reserved, 0u);  // every promise given back
  // 1 + 20 tokens = 2100 bytes: never fits, fails with a clear error; the engine goes on.
  const std::string what = refusal(*scheduler.submit({1}, max_tokens(20)));
  EXPECT_NE(what.find("does not fit the KV pool"), std::string::npos) << what;
  EXPECT_EQ(drain(*scheduler.submit({3}, o)).tokens, expected_ignoring_eos({3}, 5));
  EXPECT_EQ(pool.reserved, 0u);
}

// A pool that promises less than its size (the device pool keeps chunks back for blocks of
// other sizes): a request between the two is refused with both figures, not as if it fit.
TEST(Scheduler, KVPoolRefusalNamesWhatThePoolCanPromise) {
  constexpr size_t kMiB = size_t(1) << 20;
  FakePool pool;
  pool.capacity = 192 * kMiB;
  pool.promisable = 64 * kMiB;
  pool.token_bytes = kMiB;
  FakeModel model(4096);
  FakeTokenizer tokenizer;
  Scheduler scheduler(model, tokenizer, {testing::kFakeEos}, EngineOptions{},
                      testing::make_token_caches, pool.admission());
  scheduler.start();
  // 1 + 67 tokens: 68 MiB, under the 192 MiB pool but over the 64 MiB it can promise.
  const std::string what = refusal(*scheduler.submit({1}, max_tokens(67)));
  EXPECT_NE(what.find("68 MiB) does not fit the KV pool of 192 MiB"), std::string::npos) << what;
  EXPECT_NE(what.find("64 MiB can be promised"), std::string::npos) << what;
  // 1 + 63 tokens = 64 MiB fits the promise and runs.
  GenerateOptions o = max_tokens(63);
  o.ignore_eos = true;
  EXPECT_EQ(drain(*scheduler.submit({2}, o)).tokens, expected_ignoring_eos({2}, 63));
  EXPECT_EQ(scheduler.metrics().kv_pool.promisable_bytes, 64 * kMiB);
  EXPECT_EQ(pool.reserved, 0u);
}

TEST(Scheduler, FailingRequestReportsItsErrorAndTheEngineKeepsServing) {
  Harness h;
  h.scheduler.start();
  auto bad = h.scheduler.submit({1, testing::kPoisonToken}, max_tokens(4));
  GenerationChunk c;
  EXPECT_THROW(while (bad->next(&c)){}, Error);
  auto r = drain(*h.scheduler.submit({1, 2}, max_tokens(5)));
  EXPECT_EQ(r.tokens, expected_tokens({1, 2}, 5));
  EXPECT_EQ(h.scheduler.metrics().requests_failed, 1);
}

TEST(Scheduler, PaddedVocabIdsAreNeverSampled) {
  // The model scores 24 ids, the tokenizer has 16; the padded ones get the highest logits.
  FakeModel model(4096, testing::kFakeVocab + 8);
  FakeTokenizer tokenizer;
  Scheduler scheduler(model, tokenizer, {testing::kFakeEos}, {}, testing::make_token_caches);
  scheduler.start();
  auto greedy = drain(*scheduler.submit({1, 2}, max_tokens(20)));
  EXPECT_EQ(greedy.tokens, expected_tokens({1, 2}, 20));
  GenerateOptions o = max_tokens(200);
  o.ignore_eos = true;
  o.sampling.temperature = 2.0;  // flat: every finite logit gets sampled now and then
  for (uint64_t seed = 0; seed < 5; ++seed) {
    o.sampling.seed = seed;
    auto r = drain(*scheduler.submit({3}, o));
    ASSERT_EQ(r.tokens.size(), 200u);
    for (int32_t t : r.tokens) ASSERT_LT(t, testing::kFakeVocab);
  }
  EXPECT_EQ(scheduler.metrics().requests_failed, 0);
}

// Decoding one id fails (a tokenizer that cannot turn it into text).
class FailingDecodeTokenizer : public FakeTokenizer {
 public:
  explicit FailingDecodeTokenizer(int32_t bad) : bad_(bad) {}
  std::string decode(std::span<const int32_t> ids, bool skip_special) const override {
    for (int32_t id : ids) {
      if (id == bad_) throw InvalidArgument("fake tokenizer: cannot decode this id");
    }
    return FakeTokenizer::decode(ids, skip_special);
  }

 private:
  int32_t bad_;
};

TEST(Scheduler, ADecoderFailureEndsOnlyThatRequest) {
  // A prompt whose greedy output has some token, and one whose output never does.
  const std::vector<int32_t> hit = {1};
  const int32_t bad = expected_tokens(hit, 30).at(0);
  std::vector<int32_t> miss;
  for (int32_t p = 2; p < testing::kFakeVocab - 1 && miss.empty(); ++p) {
    const auto want = expected_tokens({p}, 30);
    if (std::find(want.begin(), want.end(), bad) == want.end()) miss = {p};
  }
  ASSERT_FALSE(miss.empty());
  FakeModel model;
  FailingDecodeTokenizer tokenizer(bad);
  Scheduler scheduler(model, tokenizer, {testing::kFakeEos}, {}, testing::make_token_caches);
  scheduler.start();
  auto failing = scheduler.submit(hit, max_tokens(30));
  auto fine = scheduler.submit(miss, max_tokens(30));
  GenerationChunk c;
  EXPECT_THROW(while (failing->next(&c)){}, InvalidArgument);
  EXPECT_EQ(drain(*fine).tokens, expected_tokens(miss, 30));
  EXPECT_EQ(drain(*scheduler.submit(miss, max_tokens(30))).tokens, expected_tokens(miss, 30));
  EXPECT_EQ(scheduler.metrics().requests_failed, 1);
}

TEST(Scheduler, CancelEndsTheRequest) {
  Harness h;
  GenerateOptions o = max_tokens(1000);
  o.ignore_eos = true;
  auto s = h.scheduler.submit({1}, o);
  s->cancel();
  h.scheduler.start();
  auto r = drain(*s);
  EXPECT_EQ(r.finish_reason, FinishReason::kCancelled);
  EXPECT_TRUE(r.tokens.empty());
}

// Polls until pred holds (true) or 10 s pass (false).
template <typename Pred>
bool eventually(Pred pred) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!pred()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return true;
}

TEST(Scheduler, MetricsReturnToIdleWhenTheLastSequencesAreCancelled) {
  Harness h({}, /*context=*/1 << 20);
  h.model.set_delay(std::chrono::milliseconds(1));
  h.scheduler.start();
  GenerateOptions o = max_tokens(100000);
  o.ignore_eos = true;
  auto a = h.scheduler.submit({1, 2}, o);
  auto b = h.scheduler.submit({3}, o);
  ASSERT_TRUE(eventually([&] {
    const auto m = h.scheduler.metrics();
    return m.active_sequences == 2 && m.kv_bytes > 0;
  }));
  a->cancel();
  b->cancel();
  EXPECT_EQ(drain(*a).finish_reason, FinishReason::kCancelled);
  EXPECT_EQ(drain(*b).finish_reason, FinishReason::kCancelled);
  // No other request comes: the gauges must still fall back to idle.
  EXPECT_TRUE(eventually([&] {
    const auto m = h.scheduler.metrics();
    return m.active_sequences == 0 && m.kv_bytes == 0 && m.kv_bytes_dense == 0 &&
           m.waiting_requests == 0;
  })) << "active_sequences "
      << h.scheduler.metrics().active_sequences << ", kv_bytes " << h.scheduler.metrics().kv_bytes;
}

TEST(Scheduler, MetricsCountRequestsAndTokens) {
  Harness h;
  h.scheduler.start();
  GenerateOptions o = max_tokens(7);
  o.ignore_eos = true;
  drain(*h.scheduler.submit({1, 2, 3}, o));
  drain(*h.scheduler.submit({4}, o));
  const auto m = h.scheduler.metrics();
  EXPECT_EQ(m.requests_total, 2);
  EXPECT_EQ(m.prompt_tokens_total, 4);
  EXPECT_EQ(m.generated_tokens_total, 14);
}

TEST(Scheduler, PromptChunksAreAlignedAndWaitRatherThanBeCutByTheBudget) {
  EngineOptions o;
  o.max_sequences = 2;
  o.max_batch_tokens = 6;
  o.prefill_chunk = 4;
  Harness h(o);
  EXPECT_EQ(h.scheduler.prefill_chunk(), 4);
  const std::vector<int32_t> a(10, 2), b(9, 3);
  auto sa = h.scheduler.submit(a, max_tokens(3));
  auto sb = h.scheduler.submit(b, max_tokens(3));
  h.scheduler.start();
  EXPECT_EQ(drain(*sa).tokens, expected_tokens(a, 3));
  EXPECT_EQ(drain(*sb).tokens, expected_tokens(b, 3));
  const auto calls = h.model.calls();
  EXPECT_EQ(calls[0], std::vector<int>{4});  // b's 4 do not fit beside a's: b waits
  EXPECT_EQ(calls[1], std::vector<int>{4});
  EXPECT_EQ(calls[2], (std::vector<int>{2, 4}));
  // A chunk never exceeds max_batch_tokens - max_sequences + 1.
  EngineOptions tight;
  tight.max_sequences = 4;
  tight.max_batch_tokens = 6;
  tight.prefill_chunk = 100;
  EXPECT_EQ(Harness(tight).scheduler.prefill_chunk(), 3);
}

EngineOptions prefix_options() {
  EngineOptions o;
  o.prefix_cache_block = 16;
  o.prefix_cache_bytes = 1 << 20;
  o.prefill_chunk = 8;
  return o;
}

std::vector<int32_t> counting(int n, int32_t start = 1) {
  std::vector<int32_t> tokens;
  for (int i = 0; i < n; ++i) tokens.push_back(1 + (start + i) % 14);
  return tokens;
}

// Blocks the prefix cache keeps live in the device pool: they hold promises like running
// requests (so admitted requests always find their blocks), and give way, oldest first, to a
// request that fits once they are gone.
TEST(Scheduler, PrefixCacheBlocksHoldPoolPromisesAndGiveWayToRequests) {
  FakePool pool;
  pool.capacity = 4500;
  FakeModel model(4096);
  FakeTokenizer tokenizer;
  EngineOptions o;
  o.prefix_cache_block = 16;
  o.prefix_cache_bytes = 1 << 20;
  o.prefill_chunk = 8;
  Scheduler scheduler(model, tokenizer, {testing::kFakeEos}, o, testing::make_token_caches,
                      pool.admission());
  scheduler.start();
  GenerateOptions g = max_tokens(5);
  g.ignore_eos = true;
  const auto a = counting(40);  // 45 tokens: 4500 bytes
  EXPECT_EQ(drain(*scheduler.submit(a, g)).tokens, expected_ignoring_eos(a, 5));
  const EngineMetrics held = scheduler.metrics();
  ASSERT_GT(held.prefix_cache_blocks, 0);
  {
    std::lock_guard<std::mutex> lock(pool.mu);
    EXPECT_GT(pool.reserved, 0u) << "stored blocks promised to the pool";
    EXPECT_LE(pool.reserved, size_t(held.prefix_cache_bytes));
  }
  // The whole pool: only once the stored blocks are evicted.
  const auto b = counting(40, 5);
  EXPECT_EQ(drain(*scheduler.submit(b, g)).tokens, expected_ignoring_eos(b, 5));
  const EngineMetrics after = scheduler.metrics();
  EXPECT_GT(after.prefix_cache_evictions, held.prefix_cache_evictions);
  EXPECT_LE(pool.most, pool.capacity);
  EXPECT_EQ(after.requests_failed, 0);
}

TEST(Scheduler, APrefixCacheHitSkipsThePrefillOfItsBlocksAndChangesNoToken) {
  Harness h(prefix_options());
  h.scheduler.start();
  const auto a = counting(40);
  EXPECT_EQ(drain(*h.scheduler.submit(a, max_tokens(5))).tokens, expected_tokens(a, 5));
  auto b = a;
  b.resize(37);
  b.push_back(14);  // diverges in the third block: two blocks are shared
  const size_t calls_before = h.model.calls().size();
  const auto r = drain(*h.scheduler.submit(b, max_tokens(5)));
  EXPECT_EQ(r.tokens, expected_tokens(b, 5));
  EXPECT_EQ(r.stats.prompt_cached_tokens, 32);
  const auto calls = h.model.calls();
  EXPECT_EQ(calls[calls_before], std::vector<int>{6});  // tokens 32..37 only
  const auto m = h.scheduler.metrics();
  EXPECT_EQ(m.prefix_cache_lookups, 2);
  EXPECT_EQ(m.prefix_cache_hits, 1);
  EXPECT_EQ(m.prefix_cache_hit_tokens, 32);
  EXPECT_GT(m.prefix_cache_bytes, 0u);
  EXPECT_EQ(m.prefix_cache_bytes_dense, size_t(m.prefix_cache_tokens) * 2 * 4 * 2 * 2);
}

TEST(Scheduler, ASessionReusesItsCommonPrefixAndKeepsTheHistory) {
  Harness h;
  h.scheduler.start();
  auto session = h.scheduler.new_session(ResolvedKV{});
  GenerateOptions o = max_tokens(5);
  o.ignore_eos = true;
  o.session = session;
  const std::vector<int32_t> prompt = {1, 2, 3, 4};
  const auto first = drain(*h.scheduler.submit(prompt, o));
  auto history = prompt;
  history.insert(history.end(), first.tokens.begin(), first.tokens.end());
  EXPECT_EQ(session->tokens(), history);
  EXPECT_EQ(session->cached_tokens(), int64_t(history.size()) - 1);
  EXPECT_FALSE(session->busy());

  auto next = history;
  next.push_back(7);  // the next turn: the whole history, then more
  const auto second = drain(*h.scheduler.submit(next, o));
  EXPECT_EQ(second.stats.prompt_cached_tokens, int64_t(history.size()) - 1);
  EXPECT_EQ(second.tokens, expected_ignoring_eos(next, 5));

  const std::vector<int32_t> other = {1, 2, 9, 9, 9};  // shares two tokens: trimmed to them
  const auto third = drain(*h.scheduler.submit(other, o));
  EXPECT_EQ(third.stats.prompt_cached_tokens, 2);
  EXPECT_EQ(third.tokens, expected_ignoring_eos(other, 5));
  EXPECT_EQ(h.scheduler.metrics().session_reused_tokens, int64_t(history.size()) - 1 + 2);
}

TEST(Scheduler, ASessionServesOneRequestAtATimeAndAFailureClearsIt) {
  Harness h;
  auto session = h.scheduler.new_session(ResolvedKV{});
  GenerateOptions o = max_tokens(3);
  o.session = session;
  auto first = h.scheduler.submit({1, 2}, o);
  EXPECT_THROW(h.scheduler.submit({1, 2}, o), InvalidArgument);
  GenerateOptions other_kv = o;
  other_kv.kv = kv(4);
  h.scheduler.start();
  drain(*first);
  EXPECT_THROW(h.scheduler.submit({1, 2}, other_kv), InvalidArgument);  // the session's settings
  EXPECT_FALSE(session->tokens().empty());
  auto bad = h.scheduler.submit({1, testing::kPoisonToken}, o);
  GenerationChunk c;
  EXPECT_THROW(while (bad->next(&c)){}, Error);
  EXPECT_TRUE(session->tokens().empty());
  EXPECT_FALSE(session->busy());
  Harness other;
  GenerateOptions foreign = max_tokens(3);
  foreign.session = other.scheduler.new_session(ResolvedKV{});
  EXPECT_THROW(h.scheduler.submit({1}, foreign), InvalidArgument);
}

// The fp16 K/V equivalent counts the layers that store K/V: not recurrent states (their bytes
// are state_bytes) and not KV-shared layers (their owner holds the tokens once).
TEST(DenseKVBytes, CountsOnlyLayersThatStoreTokens) {
  std::vector<LayerSpec> specs(4);
  specs[0].kind = LayerStateKind::kRecurrent;
  specs[0].recurrent = RecurrentShape{8, 3, 2, 4, 4};
  specs[1] = LayerSpec{2, 16, 0};
  specs[2] = LayerSpec{1, 48, 0, LayerStateKind::kLatent};
  specs[3] = LayerSpec{2, 16, 0, LayerStateKind::kShared, 1};
  EXPECT_EQ(dense_kv_bytes(specs, 10), size_t(10) * (2 * 16 + 48) * 2 * 2);
}

}  // namespace
}  // namespace turbokv
