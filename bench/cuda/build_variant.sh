#!/usr/bin/env bash
# Builds the benchmark library again with extra nvcc flags for the TurboQuant attention kernel
# (an experiment macro), reusing everything else from an existing build, so that variants can be
# timed against the shipped kernel in one process (attention_bench.py --variant NAME=LIB).
# usage: bench/cuda/build_variant.sh BUILD_DIR OUT.so "-DTKV_SOMETHING=1 ..."
set -euo pipefail
build=$(realpath "$1")
out=$(realpath -m "$2")
flags=$3
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cd "$build"
ninja bench/cuda/libturbokv_cuda_bench.so > /dev/null
commands=$(ninja -t commands bench/cuda/libturbokv_cuda_bench.so)
cp src/kernels/cuda/libturbokv_cuda.a "$tmp/libturbokv_cuda.a"
# The kernels (one file per bit pair) and the host planner, each with the same command minus
# the depfile plus the flags, replace their objects in a copy of the library.
sources=$(cd "$(dirname "$build")/src/kernels/cuda" && ls attention/tq_attention_k*.cu)
for source in $sources attention/launch.cc; do
  compile=$(grep -F -- "-c $(dirname "$build")/src/kernels/cuda/$source" <<< "$commands")
  compile=$(sed -E 's/ -MD -MT [^ ]+ -MF [^ ]+//; s/ -o [^ ]+//' <<< "$compile")
  object=$(basename "$source").o
  eval "$compile $flags -o $tmp/$object"
  (cd "$tmp" && ar r libturbokv_cuda.a "$object")
done
link=$(grep -F -- "-o bench/cuda/libturbokv_cuda_bench.so" <<< "$commands")
link=${link//src\/kernels\/cuda\/libturbokv_cuda.a/$tmp/libturbokv_cuda.a}
link=${link//-o bench\/cuda\/libturbokv_cuda_bench.so/-o $out}
mkdir -p "$(dirname "$out")"
eval "$link"
echo "built $out ($flags)"
