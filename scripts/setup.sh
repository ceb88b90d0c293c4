#!/usr/bin/env bash
# One-step setup on Debian 12: installs the Debian packages the build and tests need (skipping
# what is present), the npm packages of the server tests, then configures and builds into
# ./build. Safe to run again; it only does what is missing.
set -euo pipefail
cd "$(dirname "$0")/.."

packages=(cmake ninja-build g++ pkg-config git curl python3 python3-dev python3-pytest
          python3-numpy python3-matplotlib libgtest-dev libgmock-dev libbenchmark-dev
          nlohmann-json3-dev libcpp-httplib-dev libcli11-dev pybind11-dev libpcre2-dev
          libutf8proc-dev libopenblas-dev nodejs npm)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
# Node.js may come from elsewhere than Debian (nodejs/npm on PATH is enough).
if command -v node >/dev/null && command -v npm >/dev/null; then
  missing=("${missing[@]/nodejs}"); missing=("${missing[@]/npm}")
fi
read -r -a missing <<<"${missing[*]}"
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  sudo_cmd=""; [ "$(id -u)" -ne 0 ] && sudo_cmd="sudo"
  $sudo_cmd apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq "${missing[@]}" >/dev/null
fi

if [ -f tests/server/package.json ] && [ ! -d tests/server/node_modules/openai ]; then
  echo "setup: installing npm packages for the server tests"
  (cd tests/server && npm ci --no-audit --no-fund --loglevel=error)
fi

if [ ! -f build/build.ninja ]; then
  cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release
fi
cmake --build build -j "$(nproc)"
