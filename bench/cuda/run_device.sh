#!/usr/bin/env bash
# Runs on a machine with an NVIDIA GPU, from the repo root: the CUDA tests,
# compute-sanitizer memcheck on the test binary, the attention benchmark, per-block timelines
# of single calls, and an ncu profile of the TurboQuant kernel at batch 1, 128k. Logs go to
# OUT_DIR; the benchmark table also to bench/results/<date>-<gpu>-attention.txt. Every step
# has a time limit, so a hung kernel costs minutes, not the whole run.
# usage: bench/cuda/run_device.sh BIN_DIR OUT_DIR    (BIN_DIR: cuda_tests and
#        libturbokv_cuda_bench.so, built with `cmake --build build --target cuda_tests
#        turbokv_cuda_bench`)
set -uo pipefail
bin=$(realpath "$1")
out=$(realpath "$2")
status=0
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,clocks.mem --format=csv \
  | tee "$out/gpu.txt"

echo "== cuda_tests"
timeout 120 "$bin/cuda_tests" > "$out/tests.log" 2>&1 || status=1
tail -4 "$out/tests.log"

echo "== compute-sanitizer memcheck"
timeout 180 compute-sanitizer --tool memcheck --error-exitcode 3 "$bin/cuda_tests" \
  > "$out/memcheck.log" 2>&1 || status=1
grep -E "ERROR SUMMARY|PASSED|FAILED" "$out/memcheck.log" | tail -4

echo "== benchmark"
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | tr 'A-Z ' 'a-z-' | sed 's/nvidia-//')
result="bench/results/$(date -u +%Y-%m-%d)-$gpu-attention.txt"
PYTHONUNBUFFERED=1 timeout 300 python3 bench/cuda/attention_bench.py \
  --lib "$bin/libturbokv_cuda_bench.so" ${BENCH_CASES:+--cases "$BENCH_CASES"} \
  | tee "$out/bench.txt" || status=1
cp "$out/bench.txt" "$out/$(basename "$result")"

echo "== timeline (where one call's time goes, batch 1)"
PYTHONUNBUFFERED=1 timeout 120 python3 bench/cuda/attention_bench.py \
  --lib "$bin/libturbokv_cuda_bench.so" --timeline --cases 1:4096,1:131072,1:524288 \
  | tee "$out/timeline.txt" || status=1

if [ -z "${SKIP_NCU:-}" ]; then
  echo "== ncu (first launch of the TurboQuant kernel, batch:context ${NCU_CASE:=1:131072})"
  stalls=long_scoreboard,short_scoreboard,mio_throttle,lg_throttle,wait,barrier,math_pipe_throttle,no_instruction
  metrics=sm__inst_executed.sum,sm__pipe_alu_cycles_active.avg.pct_of_peak_sustained_active
  metrics=$metrics,sm__mio_inst_issued.avg.pct_of_peak_sustained_active
  metrics=$metrics,sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active
  metrics=$metrics,sm__pipe_fma_cycles_active.avg.pct_of_peak_sustained_active
  for s in ${stalls//,/ }; do
    metrics=$metrics,smsp__warp_issue_stalled_${s}_per_warp_active.pct
  done
  metrics=$metrics,sm__cycles_active.avg,sm__cycles_active.max,gpc__cycles_elapsed.max
  timeout 180 ncu --clock-control none -k regex:tq_attention_kernel -c 1 \
    --section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy \
    --section ComputeWorkloadAnalysis --section WarpStateStats --metrics "$metrics" \
    python3 bench/cuda/attention_bench.py --lib "$bin/libturbokv_cuda_bench.so" \
    --cases "$NCU_CASE" > "$out/ncu.txt" 2>&1 || true
  grep -E "Duration|DRAM Throughput|Compute \(SM\)|Issue Slots|Achieved Active Warps|Registers|stalled|pipe_|mio_inst|inst_executed|cycles_active|cycles_elapsed" \
    "$out/ncu.txt" | head -40
fi
exit $status
