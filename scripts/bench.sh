#!/usr/bin/env bash
# Benchmarks (they print figures; they are not tests): per-pass latency ratios in ONNX Runtime on the
# PyTorch fixtures, the transformer preset on every exported family (and how repeatable a job's
# reported figures are), the Hugging Face exports against ONNX Runtime's and onnxscript's optimizers,
# optimizer throughput on generated graphs of 25k-200k nodes, int8/fp16/int4 against float32, the
# soak test, padding removal on the CPU, and peak memory and time on large generated decoders.
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
echo
./build/tests/onnxopt-padding-benchmark --budget=40
echo
# Replicas on one PostgreSQL (a throwaway postgresql-15 cluster): throughput and recovery after SIGKILL.
./build/tests/onnxopt-replicas-benchmark
echo
# Peak memory on a 1 GB decoder and time from 25k to 200k nodes; its models are generated with
# Debian's python3-torch and python3-onnx (not installed by setup.sh: only this benchmark needs them).
if /usr/bin/python3 -c "import torch, onnx" 2>/dev/null; then
  /usr/bin/python3 tests/bench/large_model_benchmark.py
else
  echo "large_model_benchmark.py skipped: apt-get install python3-torch python3-onnx to generate its models"
fi
