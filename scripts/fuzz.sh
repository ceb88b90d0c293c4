#!/usr/bin/env bash
# Runs one libFuzzer target of tests/fuzz for SECONDS (or each in turn with "all"):
#   scripts/fuzz.sh TARGET SECONDS [libFuzzer flags...]
# Targets: fuzz_safetensors fuzz_model_config fuzz_tokenizer fuzz_chat_template
#          fuzz_openai_request fuzz_kv_cache_file.
# Builds the targets with clang, ASan and UBSan in build-fuzz. The run starts from the seeds in
# tests/fuzz/corpus/TARGET (plus, for some targets, files of tests/fixtures) copied into
# build-fuzz/corpus/TARGET, where new inputs accumulate; crashes, leaks and hangs are written to
# build-fuzz/artifacts/TARGET/ and fail the run. The last lines report executions and coverage.
# Run them one or two at a time: each uses a full core.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ $# -lt 2 ]; then
  sed -n 2,11p "$0" | sed 's/^# \{0,1\}//' >&2
  exit 2
fi
target=$1 seconds=$2
shift 2
all=(fuzz_safetensors fuzz_model_config fuzz_tokenizer fuzz_chat_template fuzz_openai_request
     fuzz_kv_cache_file)
if [ "$target" = all ]; then
  for t in "${all[@]}"; do "$0" "$t" "$seconds" "$@"; done
  exit 0
fi
case " ${all[*]} " in
  *" $target "*) ;;
  *) echo "fuzz.sh: unknown target '$target' (one of: ${all[*]}, all)" >&2; exit 2 ;;
esac
[[ "$seconds" =~ ^[0-9]+$ ]] || { echo "fuzz.sh: SECONDS must be an integer" >&2; exit 2; }

if [ ! -f build-fuzz/build.ninja ]; then
  launcher=()
  command -v ccache >/dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
  # -O1 and line tables only: quicker to build, and assertions stay on.
  cmake -S . -B build-fuzz -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -gline-tables-only" \
    -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ "${launcher[@]}" -DTURBOKV_FUZZ=ON \
    -DTURBOKV_TESTS=OFF -DTURBOKV_BENCH=OFF -DTURBOKV_PYTHON=OFF -DTURBOKV_CUDA=OFF >/dev/null
fi
cmake --build build-fuzz -j "$(nproc)" --target "$target"

corpus=build-fuzz/corpus/$target artifacts=build-fuzz/artifacts/$target
mkdir -p "$corpus" "$artifacts"
cp tests/fuzz/corpus/"$target"/* "$corpus"/ 2>/dev/null || true
dict=tests/fuzz/json.dict max_len=16384
case $target in
  fuzz_safetensors)
    max_len=65536
    for f in tests/fixtures/hf-tiny/*/reference.safetensors; do
      cp "$f" "$corpus/fixture-$(basename "$(dirname "$f")").safetensors"
    done ;;
  fuzz_model_config)
    for f in tests/fixtures/hf-tiny/*/config.json; do
      cp "$f" "$corpus/fixture-$(basename "$(dirname "$f")").json"
    done ;;
  fuzz_tokenizer)
    max_len=65536
    cp tests/fixtures/padded-vocab/tokenizer.json "$corpus/fixture-byte-level.json" ;;
  fuzz_chat_template)
    dict=tests/fuzz/jinja.dict max_len=8192
    python3 - "$corpus" <<'EOF'
import json, sys
fixture = json.load(open("tests/fixtures/chat-templates.json"))
for name, source in fixture["templates"].items():
    open(f"{sys.argv[1]}/fixture-{name}.jinja", "w").write(source)
EOF
    ;;
  fuzz_kv_cache_file)
    dict="" max_len=65536 ;;
esac

log=build-fuzz/$target.log
# -timeout is wall-clock time: generous, so that a niced run on a busy machine is not stopped for
# waiting its turn (the readers bound their own work).
flags=(-max_total_time="$seconds" -max_len="$max_len" -timeout=60 -rss_limit_mb=2048
       -print_final_stats=1 -artifact_prefix="$artifacts/")
[ -n "$dict" ] && flags+=(-dict="$dict")
status=0 start=$SECONDS
build-fuzz/tests/fuzz/"$target" "${flags[@]}" "$@" "$corpus" 2>&1 | tee "$log" | grep -E "^#[0-9]+ +(INITED|DONE|pulse)|ERROR|SUMMARY" || true
grep -q "^Done [0-9]* runs" "$log" || status=1
if [ -n "$(ls -A "$artifacts")" ]; then
  echo "fuzz.sh: $target left inputs in $artifacts:" >&2
  ls "$artifacts" >&2
  status=1
fi
echo "$target: $(grep -Eo 'stat::number_of_executed_units: [0-9]+' "$log" | awk '{print $2}') runs in" \
     "$((SECONDS - start)) s, $(grep -Eo 'cov: [0-9]+ ft: [0-9]+' "$log" | tail -1)," \
     "corpus $(ls "$corpus" | wc -l) files"
exit $status
