#include "core/threads.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <vector>

#include "core/error.h"

namespace turbokv {
namespace {

thread_local bool t_inside_pool = false;

class Pool {
 public:
  ~Pool() { resize(0); }

  int threads() {
    std::lock_guard<std::mutex> lock(config_mu_);
    return n_threads_;
  }

  void resize(int n) {
    std::lock_guard<std::mutex> run_lock(run_mu_);
    std::lock_guard<std::mutex> lock(config_mu_);
    {
      std::lock_guard<std::mutex> l(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    for (auto& w : workers_) w.join();
    workers_.clear();
    stop_ = false;
    n_threads_ = std::max(n, 1);
    for (int i = 1; i < n_threads_ && n > 0; ++i) workers_.emplace_back([this] { worker(); });
  }

  // Runs fn(task) for every task; the caller participates.
  void run(int n_tasks, const std::function<void(int)>& fn) {
    std::unique_lock<std::mutex> run_lock(run_mu_, std::try_to_lock);
    if (t_inside_pool || !run_lock.owns_lock() || workers_.empty() || n_tasks <= 1) {
      for (int t = 0; t < n_tasks; ++t) fn(t);
      return;
    }
    {
      std::lock_guard<std::mutex> l(mu_);
      job_ = &fn;
      n_tasks_ = n_tasks;
      next_task_.store(0);
      pending_ = n_tasks;
      ++generation_;
    }
    cv_.notify_all();
    t_inside_pool = true;
    drain(fn);
    t_inside_pool = false;
    std::unique_lock<std::mutex> l(mu_);
    done_cv_.wait(l, [this] { return pending_ == 0 && active_ == 0; });
    job_ = nullptr;
  }

 private:
  void drain(const std::function<void(int)>& fn) {
    int done = 0;
    for (int t; (t = next_task_.fetch_add(1)) < n_tasks_;) {
      fn(t);
      ++done;
    }
    if (done > 0) {
      std::lock_guard<std::mutex> l(mu_);
      pending_ -= done;
      if (pending_ == 0) done_cv_.notify_all();
    }
  }

  void worker() {
    t_inside_pool = true;
    uint64_t seen = 0;
    for (;;) {
      const std::function<void(int)>* job;
      {
        std::unique_lock<std::mutex> l(mu_);
        cv_.wait(l, [&] { return stop_ || (generation_ != seen && job_ != nullptr); });
        if (stop_) return;
        seen = generation_;
        job = job_;
        ++active_;
      }
      drain(*job);
      std::lock_guard<std::mutex> l(mu_);
      if (--active_ == 0) done_cv_.notify_all();
    }
  }

  std::mutex run_mu_;     // one parallel region at a time
  std::mutex config_mu_;  // guards n_threads_
  std::mutex mu_;
  std::condition_variable cv_, done_cv_;
  std::vector<std::thread> workers_;
  const std::function<void(int)>* job_ = nullptr;
  int n_tasks_ = 0;
  std::atomic<int> next_task_{0};
  int pending_ = 0;
  int active_ = 0;  // workers inside the current job; run() returns only at zero
  uint64_t generation_ = 0;
  bool stop_ = false;
  int n_threads_ = 1;
};

int hardware_threads() { return std::max(1, int(std::thread::hardware_concurrency())); }

Pool& pool() {
  static Pool* p = [] {
    auto* created = new Pool();  // leaked on purpose: workers may outlive static destructors
    created->resize(hardware_threads());
    return created;
  }();
  return *p;
}

}  // namespace

int num_threads() { return pool().threads(); }

void set_num_threads(int n) {
  if (n > 1024) throw InvalidArgument(str_cat("threads ", n, " is out of range (1..1024)"));
  pool().resize(n <= 0 ? hardware_threads() : n);
}

void parallel_tasks(int n_tasks, const std::function<void(int)>& fn) {
  if (n_tasks <= 0) return;
  pool().run(n_tasks, fn);
}

void parallel_for(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn) {
  if (n <= 0) return;
  grain = std::max<int64_t>(grain, 1);
  const int64_t max_tasks = (n + grain - 1) / grain;
  const int n_tasks = int(std::min<int64_t>(max_tasks, num_threads()));
  if (n_tasks <= 1) {
    fn(0, n);
    return;
  }
  parallel_tasks(n_tasks, [&](int t) {
    const int64_t begin = n * t / n_tasks, end = n * (t + 1) / n_tasks;
    if (begin < end) fn(begin, end);
  });
}

}  // namespace turbokv
