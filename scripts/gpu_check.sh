#!/usr/bin/env bash
# The GPU check (issue 31), for a machine with an NVIDIA GPU: runs `ctest -L gpu`, then optimizes the
# Hugging Face fixtures and BERT-base- and GPT-2-size exports made here (hidden 768, 12 layers, 12
# heads) with `onnxopt optimize --device cuda` at batch 1, sequence 128, and prints one table: nodes,
# parity and the bound that judged it, device-resident time, time with host copies, time as a CUDA
# graph, speedup. Elsewhere it says why it skipped and exits 0.
#
# A GPU machine may reach no package registry, so ONNX Runtime's CUDA provider is looked for beside
# the core library (scripts/setup.sh --gpu puts it there) or in $ONNXOPT_CUDA_PROVIDER_DIR (a folder
# with libonnxruntime_providers_cuda.so and libonnxruntime_providers_shared.so), and CUDA 13's
# libraries in $ONNXOPT_CUDA_LIB_DIRS (colon-separated) or the python wheels' site-packages/nvidia/*/lib.
#
# Usage: scripts/gpu_check.sh [--no-ctest] [--models a.onnx,b.onnx] [--no-export]
#   ONNXOPT_BUILD_DIR  the build folder (default build/)
#   ONNXOPT_GPU_OUT    where exports, results and the table go (default a temporary folder)
set -euo pipefail
repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build_dir="${ONNXOPT_BUILD_DIR:-$repo_root/build}"
run_ctest=1 export_models=1 models=""
for arg in "$@"; do
  case "$arg" in
    --no-ctest) run_ctest=0 ;;
    --no-export) export_models=0 ;;
    --models=*) models="${arg#--models=}" ;;
    *) echo "gpu_check: unknown argument '$arg'" >&2; exit 2 ;;
  esac
done

if [ ! -e /proc/driver/nvidia/version ] && ! command -v nvidia-smi >/dev/null 2>&1; then
  echo "gpu_check: skipped: no NVIDIA driver on this machine (/proc/driver/nvidia/version, nvidia-smi)"
  exit 0
fi
cli="$build_dir/client/onnxopt"
[ -x "$cli" ] || { echo "gpu_check: $cli is missing: build first (scripts/build.sh)" >&2; exit 1; }

# The core library's folder, from the build's cache.
core_dir="$(sed -n 's/^ONNXOPT_ORT_CORE_DIR:PATH=//p' "$build_dir/CMakeCache.txt" 2>/dev/null || true)"
core_dir="${core_dir:-$repo_root/.deps/onnxruntime-core/package/bin/napi-v6/linux/x64}"
if [ ! -e "$core_dir/libonnxruntime_providers_cuda.so" ]; then
  provider_dir="${ONNXOPT_CUDA_PROVIDER_DIR:-}"
  if [ -z "$provider_dir" ] || [ ! -e "$provider_dir/libonnxruntime_providers_cuda.so" ]; then
    echo "gpu_check: ONNX Runtime's CUDA provider is neither beside $core_dir/libonnxruntime.so.1 nor in" \
         "\$ONNXOPT_CUDA_PROVIDER_DIR: run scripts/setup.sh --gpu, or copy it there" >&2
    exit 1
  fi
  # ONNX Runtime loads provider libraries from the folder of libonnxruntime.so.1.
  for library in "$provider_dir"/libonnxruntime_providers_*.so; do ln -sf "$library" "$core_dir/$(basename "$library")"; done
fi

# CUDA 13's libraries: named folders, else the python wheels'.
cuda_dirs="${ONNXOPT_CUDA_LIB_DIRS:-}"
if [ -z "$cuda_dirs" ] && command -v python3 >/dev/null 2>&1; then
  cuda_dirs="$(python3 - <<'PY' 2>/dev/null || true
import glob, os, site
paths = site.getsitepackages() + [site.getusersitepackages()]
print(":".join(sorted(d for p in paths for d in glob.glob(os.path.join(p, "nvidia", "*", "lib")) if os.path.isdir(d))))
PY
)"
fi
[ -n "$cuda_dirs" ] && export LD_LIBRARY_PATH="$cuda_dirs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null || true

out="${ONNXOPT_GPU_OUT:-$(mktemp -d /tmp/onnxopt-gpu-check.XXXXXX)}"
mkdir -p "$out"
status=0
if [ "$run_ctest" = 1 ]; then
  echo "=== ctest -L gpu"
  (cd "$build_dir" && ctest -L gpu --output-on-failure) || status=1
fi

# The models: the shipped Hugging Face fixtures, then BERT-base and GPT-2 (124M) sizes exported here
# (torch, transformers and onnx in this machine's python: random weights, both exporters).
list=()
if [ -n "$models" ]; then
  IFS=, read -r -a list <<<"$models"
else
  for name in bert_torchscript bert_dynamo gpt2_torchscript gpt2_dynamo roberta_cls_torchscript llama_torchscript; do
    list+=("$repo_root/tests/fixtures/hf/$name.onnx")
  done
  if [ "$export_models" = 1 ]; then
    echo "=== exporting BERT-base and GPT-2 sizes (hidden 768, 12 layers, 12 heads)"
    if H=768 HEADS=12 LAYERS=12 FF=3072 VOCAB=30522 \
        python3 "$repo_root/tests/fixtures/hf/export_hf.py" "$out/base" bert,gpt2 >"$out/export.log" 2>&1; then
      for name in bert_torchscript bert_dynamo gpt2_torchscript gpt2_dynamo; do
        [ -e "$out/base/$name.onnx" ] && list+=("$out/base/$name.onnx")
      done
    else
      echo "gpu_check: the export failed (see $out/export.log): fixtures only"
      status=1
    fi
  fi
fi

echo "=== onnxopt optimize --device cuda --dim batch=1 --dim sequence=128"
reports=()
for model in "${list[@]}"; do
  [ -e "$model" ] || { echo "gpu_check: $model is missing"; status=1; continue; }
  tag="$(basename "$(dirname "$model")")_$(basename "$model" .onnx)"
  if "$cli" optimize "$model" -o "$out/$tag.opt.onnx" --device cuda --dim batch=1 --dim sequence=128 --json \
      >"$out/$tag.report.json" 2>"$out/$tag.log"; then
    reports+=("$out/$tag.report.json")
  else
    echo "gpu_check: $tag failed (exit $?): $(tail -n 3 "$out/$tag.log" | tr '\n' ' ')"
    status=1
  fi
done
[ "${#reports[@]}" -gt 0 ] && python3 "$repo_root/scripts/gpu_table.py" "${reports[@]}" | tee "$out/table.txt"
echo "gpu_check: reports, logs and table in $out"
exit "$status"
