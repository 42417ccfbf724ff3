#!/usr/bin/env bash
# Sets up dependencies (scripts/setup.sh) and builds everything into build/ with two jobs.
set -euo pipefail
repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo_root"
bash scripts/setup.sh
jobs="${ONNXOPT_BUILD_JOBS:-2}"
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE="${CMAKE_BUILD_TYPE:-RelWithDebInfo}" >/dev/null
cmake --build build -j "$jobs"
