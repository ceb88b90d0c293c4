// A process-wide worker pool for data-parallel loops (matmuls, batch quantize, split-K
// attention). The calling thread takes part. A parallel_for issued from inside a worker,
// or while another thread holds the pool, runs inline on the caller: no deadlock, no
// oversubscription.
#pragma once

#include <cstdint>
#include <functional>

namespace turbokv {

// Number of threads parallel_for uses (caller included). Defaults to the hardware count.
int num_threads();
// n <= 0 selects the hardware count. Throws InvalidArgument for n > 1024.
void set_num_threads(int n);

// Splits [0, n) into contiguous ranges of at least `grain` items and calls fn(begin, end)
// for each, spread over the pool. Returns when all ranges are done.
void parallel_for(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn);

// Calls fn(task) for task in [0, n_tasks), each task on one thread.
void parallel_tasks(int n_tasks, const std::function<void(int)>& fn);

}  // namespace turbokv
