#!/usr/bin/env bash
# Benchmarks (they print figures; they are not tests): per-pass latency ratios in ONNX Runtime on the
# PyTorch fixtures, the transformer preset on every exported family (and how repeatable a job's
# reported figures are), the Hugging Face exports against ONNX Runtime's and onnxscript's optimizers,
# and optimizer throughput on generated graphs of 25k-200k nodes.
set -euo pipefail
repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo_root"
bash scripts/build.sh
./build/tests/onnxopt-pass-benchmark "$@"
echo
./build/tests/onnxopt-transformer-benchmark
echo
./build/tests/onnxopt-transformer-benchmark --hf --threads=2
echo
./build/tests/onnxopt-transformer-benchmark --repeat=5 --fixture=bert_opset14 --sequence=128 --budget=20
echo
./build/tests/onnxopt-throughput-benchmark
echo
./build/tests/onnxopt-precision-benchmark --samples=100 --budget=20
echo
./build/tests/onnxopt-soak --models=1000 --kill-rounds=3
