#!/usr/bin/env bash
# The README's first command: set up, build, start onnxopt-server on its embedded defaults, optimize
# the bundled example model (a small BERT-like encoder exported from PyTorch) through it with the CLI,
# print where the optimized model and its report are, then stop the server gracefully (SIGTERM).
set -euo pipefail
repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo_root"
bash scripts/build.sh

server_log="$repo_root/out/onnxopt-server.log"
mkdir -p out
./build/server/onnxopt-server >"$server_log" 2>&1 &
server_pid=$!
trap 'kill -TERM "$server_pid" 2>/dev/null; wait "$server_pid" 2>/dev/null || true' EXIT

# Wait until the server answers (the default address is 127.0.0.1:50051).
for _ in $(seq 1 100); do
  ./build/client/onnxopt info >/dev/null 2>&1 && break
  if ! kill -0 "$server_pid" 2>/dev/null; then
    echo "quickstart: onnxopt-server exited; its log:" >&2
    cat "$server_log" >&2
    exit 1
  fi
  sleep 0.1
done
./build/client/onnxopt info

model="tests/fixtures/bert_tiny.onnx"
echo
echo "quickstart: optimizing $model through the server"
./build/client/onnxopt submit "$model" -o out/bert_tiny.optimized.onnx
job=$(./build/client/onnxopt list --page-size 1 | awk 'NR==1 {print $1}')
echo
./build/client/onnxopt report "$job"
./build/client/onnxopt report "$job" --html out/bert_tiny.report.html >/dev/null
echo
echo "optimized model: $repo_root/out/bert_tiny.optimized.onnx"
echo "report (JSON):   $repo_root/out/bert_tiny.optimized.onnx.report.json"
echo "report (HTML):   $repo_root/out/bert_tiny.report.html"
echo "server log:      $server_log"
