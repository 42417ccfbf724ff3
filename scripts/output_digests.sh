#!/usr/bin/env bash
# Prints the SHA-256 of the model `onnxopt optimize` makes of every fixture (tests/fixtures and, where it
# is there, ../shared/fixtures/hf), one line each, with validation and the benchmark skipped. Two runs
# diffed show which outputs a change altered: a refactoring should alter none.
#   scripts/output_digests.sh [ONNXOPT_BINARY] > digests.txt
# Each fixture runs under the default preset (auto); PRESETS="auto transformer" runs several.
set -euo pipefail
repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
binary="${1:-$repo_root/build/client/onnxopt}"
presets="${PRESETS:-auto}"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

models=()
while IFS= read -r model; do models+=("$model"); done < <(
  { find "$repo_root/tests/fixtures" -name '*.onnx';
    [ -d "$repo_root/../shared/fixtures/hf" ] && find "$repo_root/../shared/fixtures/hf" -name '*.onnx'; } |
    grep -v -e '\.ortopt\.onnx$' -e '\.osopt\.onnx$' | sort)

for preset in $presets; do
  printf '{"preset": "%s", "validation": {"skip": true}, "benchmark": {"skip": true}}\n' "$preset" >"$work/config.json"
  for model in "${models[@]}"; do
    name="${model#"$repo_root/"}"
    out="$work/out.onnx"
    rm -f "$out" "$out.data"
    if "$binary" optimize "$model" -o "$out" --config "$work/config.json" >"$work/log" 2>&1; then
      files=("$out")
      [ -f "$out.data" ] && files+=("$out.data")
      digest="$(cat "${files[@]}" | sha256sum | cut -c1-16)"
    else
      digest="failed:$(tail -1 "$work/log" | tr -d '\n' | cut -c1-80)"
    fi
    printf '%-10s %-70s %s\n' "$preset" "$name" "$digest"
  done
done
