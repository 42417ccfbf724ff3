#!/usr/bin/env bash
# The README's test command: set up, build, run every test (unit and end to end) with ctest.
set -euo pipefail
repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo_root"
bash scripts/build.sh
cd build
ctest --output-on-failure -j "${ONNXOPT_TEST_JOBS:-2}" "$@"
