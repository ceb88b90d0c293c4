#include "core/threads.h"

#include <gtest/gtest.h>

#include <atomic>
#include <thread>
#include <vector>

namespace turbokv {
namespace {

TEST(Threads, ParallelForCoversEveryIndexOnce) {
  for (int threads : {1, 2, 3}) {
    set_num_threads(threads);
    for (int64_t n : {0, 1, 7, 1000, 100003}) {
      std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
      parallel_for(n, 16, [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i) hits[size_t(i)]++;
      });
      for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[size_t(i)].load(), 1) << n << " " << i;
    }
  }
  set_num_threads(0);
}

TEST(Threads, NestedAndConcurrentCallsDoNotDeadlock) {
  set_num_threads(2);
  std::atomic<int64_t> total{0};
  auto work = [&] {
    for (int rep = 0; rep < 200; ++rep) {
      parallel_for(64, 1, [&](int64_t b, int64_t e) {
        parallel_for(e - b, 1, [&](int64_t b2, int64_t e2) { total += e2 - b2; });
      });
    }
  };
  std::thread a(work), b(work);
  a.join();
  b.join();
  EXPECT_EQ(total.load(), 2 * 200 * 64);
  set_num_threads(0);
}

}  // namespace
}  // namespace turbokv
