#!/usr/bin/env bash
# The README's test command: set up, build, run every test (unit and end to end) with ctest.
set -euo pipefail
repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo_root"
bash scripts/build.sh
# ctest starts the tests it knows to be long first, from the times of earlier runs. A fresh build has
# none and would run in declaration order, the 1.5-minute 2 GiB tests last and alone: seed the times measured
# on a 2-core machine (tests/ctest_costs.txt, ctest's own format); ctest keeps them up to date after.
costs=build/Testing/Temporary/CTestCostData.txt
if [ ! -f "$costs" ]; then
  mkdir -p "$(dirname "$costs")"
  cp tests/ctest_costs.txt "$costs"
fi
cd build
ctest --output-on-failure -j "${ONNXOPT_TEST_JOBS:-2}" "$@"
