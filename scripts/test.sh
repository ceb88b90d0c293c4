#!/usr/bin/env bash
# Builds (through setup.sh) and runs the whole test suite: C++ unit and golden tests, the
# Python module's pytest suite and the HTTP server tests, all registered with ctest.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
cd build
ctest --output-on-failure -j "$(nproc)" "$@"
