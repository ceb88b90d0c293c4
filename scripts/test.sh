#!/usr/bin/env bash
# Builds (through setup.sh) and runs the whole test suite: C++ unit and golden tests, the
# Python module's pytest suite and the HTTP server tests, all registered with ctest. Then builds
# the C++ tests again in build-asan with AddressSanitizer and UndefinedBehaviorSanitizer and runs
# them there (ctest label "cxx": every GoogleTest suite and the fuzz corpus replays); any
# sanitizer report fails the run.
#   scripts/test.sh [ctest args...]
# Arguments go to the ctest of ./build. With arguments the sanitizer run is skipped, unless
# TURBOKV_TEST_SANITIZE=1; TURBOKV_TEST_SANITIZE=0 skips it always.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh

sanitize=${TURBOKV_TEST_SANITIZE:-}
if [ -z "$sanitize" ]; then
  sanitize=1
  [ $# -gt 0 ] && sanitize=0
fi

(cd build && ctest --output-on-failure -j "$(nproc)" "$@")

[ "$sanitize" = 1 ] || exit 0
echo "test.sh: C++ tests under ASan and UBSan (build-asan)"
if [ ! -f build-asan/build.ninja ]; then
  launcher=()
  command -v ccache >/dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache
                                           -DCMAKE_C_COMPILER_LAUNCHER=ccache)
  # -O1: quicker to build and run than -O2 under the sanitizers; assertions stay on.
  cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g1" -DTURBOKV_SANITIZE=ON "${launcher[@]}" \
    -DTURBOKV_CUDA=OFF -DTURBOKV_PYTHON=OFF -DTURBOKV_BENCH=OFF >/dev/null
fi
# Test discovery runs the test executables at build time: they see the same options.
export ASAN_OPTIONS=halt_on_error=1:detect_leaks=1:exitcode=86:strict_string_checks=1:check_initialization_order=1
export UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1:exitcode=87
export LSAN_OPTIONS=exitcode=88
cmake --build build-asan -j "$(nproc)" --target turbokv_cxx_tests
cd build-asan
ctest -L cxx --output-on-failure -j "$(nproc)"
