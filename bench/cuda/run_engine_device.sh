#!/usr/bin/env bash
# The CUDA engine on a machine with an NVIDIA GPU, from the repo root: the GPU test suites,
# compute-sanitizer memcheck over them, perplexity on the GPU next to the CPU for each KV
# setting, and a generate smoke test. Logs go to OUT_DIR. Every step has a time limit.
# usage: bench/cuda/run_engine_device.sh BIN_DIR OUT_DIR [EVAL_TEXT]
#   BIN_DIR: turbokv, cuda_tests, cuda_engine_tests (cmake --build build --target turbokv
#            cuda_tests cuda_engine_tests); EVAL_TEXT: a text file for perplexity (optional)
set -uo pipefail
bin=$(realpath "$1")
out=$(realpath "$2")
text=${3:-}
status=0
step() { echo "== $*"; }

nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee "$out/gpu.txt"
step "libraries"
for b in "$bin"/turbokv "$bin"/cuda_tests "$bin"/cuda_engine_tests; do
  ldd "$b" | grep -E "not found|cublas|cudart" || true
done

step "cuda_tests"
timeout 300 "$bin/cuda_tests" > "$out/cuda_tests.log" 2>&1 || status=1
grep -E "^\[  (PASSED|FAILED)|FAILED  \]|error" "$out/cuda_tests.log" | head -40
step "cuda_engine_tests"
timeout 400 "$bin/cuda_engine_tests" > "$out/cuda_engine_tests.log" 2>&1 || status=1
grep -E "^\[  (PASSED|FAILED)|FAILED  \]|largest logit|Failure|error" "$out/cuda_engine_tests.log" \
  | head -60

step "compute-sanitizer memcheck"
for t in cuda_tests cuda_engine_tests; do
  timeout 600 compute-sanitizer --tool memcheck --error-exitcode 3 "$bin/$t" \
    > "$out/memcheck_$t.log" 2>&1 || status=1
  grep -E "ERROR SUMMARY|^\[  (PASSED|FAILED)" "$out/memcheck_$t.log" | tail -3
done

if [ -n "$text" ]; then
  step "perplexity: GPU vs CPU (4 x 1024 tokens)"
  for kv in "--kv-bits 2.5" "--kv-bits 3" "--kv-bits 3.5" "--kv-bits 4 --kv-quant-scheme turboquant" \
            "--kv-bits 4" "--kv-bits 3.5 --kv-allocation none --kv-centering both --kv-sink-tokens 4" \
            "--kv-bits 2.5 --kv-centering values --kv-sink-tokens 1" "--kv-bits 4 --kv-hadamard"; do
    for device in cuda cpu; do
      printf '%-45s %-5s ' "$kv" "$device"
      # shellcheck disable=SC2086
      timeout 300 "$bin/turbokv" perplexity --file "$text" --context 1024 --max-chunks 4 \
        --device $device $kv --json 2>> "$out/perplexity.err" | tee -a "$out/perplexity.jsonl" \
        || { echo "failed"; status=1; }
    done
  done
fi

step "generate"
timeout 120 "$bin/turbokv" generate --device cuda --prompt "def fibonacci(n):" --max-tokens 64 \
  --kv-bits 3.5 --json > "$out/generate.json" 2>&1 || status=1
cat "$out/generate.json"
timeout 120 "$bin/turbokv" generate --device cpu --prompt "def fibonacci(n):" --max-tokens 64 \
  --kv-bits 3.5 --json > "$out/generate_cpu.json" 2>&1 || status=1
echo "exit status $status"
exit $status
