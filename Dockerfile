# onnxopt-server images: a build stage with the project's own set-up script, slim Debian 12 runtimes,
# non-root user. Two targets:
#   CPU (the default):                 docker build -t onnxopt:0.1.0 .
#   CUDA (the Helm chart's GPU pool):  docker build --target cuda -t onnxopt:0.1.0-cuda .
# Run: docker run -p 50051:50051 -p 9464:9464 onnxopt:0.1.0   (the CUDA image: add --gpus all; it needs an
# NVIDIA driver for CUDA 13, 580 or newer, on the host)
FROM debian:12 AS build
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends ca-certificates nodejs npm openssl \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY scripts/setup.sh scripts/setup.sh
RUN bash scripts/setup.sh --no-test-deps
COPY . .
RUN cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DONNXOPT_BUILD_TESTS=OFF \
 && cmake --build build -j"$(nproc)" \
 && cmake --install build --prefix /opt/onnxopt

# ONNX Runtime's CUDA execution provider for the same release (shared/design.md), for the cuda target
# only. The linked core library is the same in both images: it runs on CPU-only machines too.
FROM build AS cuda-provider
RUN bash scripts/setup.sh --gpu --no-test-deps

FROM debian:12-slim AS runtime
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
      libgrpc++1.51 libprotobuf32 libabsl20220623 libonnx1 libprometheus-cpp-core1.0 libprometheus-cpp-pull1.0 \
      libsqlite3-0 libpq5 libjemalloc2 libssl3 ca-certificates \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --system --uid 10001 --user-group --home-dir /var/lib/onnxopt --create-home onnxopt
# bin/: onnxopt-server, onnxopt-worker and the onnxopt CLI (the Helm chart's probes run "onnxopt health"
# under TLS); lib/: libonnxruntime.so.1, found through the binaries' RPATH.
COPY --from=build /opt/onnxopt /opt/onnxopt
# On PATH for whoever runs the image with a command of their own (the Kubeflow component runs "onnxopt").
ENV PATH=/opt/onnxopt/bin:$PATH
USER 10001:10001
# The server's working directory is its own data folder, never "/": nothing a job does can resolve a
# relative path against the root file system (each job's worker also runs in its own job folder).
WORKDIR /var/lib/onnxopt
VOLUME /var/lib/onnxopt
EXPOSE 50051 9464
ENTRYPOINT ["/opt/onnxopt/bin/onnxopt-server", "--listen=0.0.0.0:50051", "--metrics-listen=0.0.0.0:9464", \
            "--data-dir=/var/lib/onnxopt"]

# The CUDA variant: the runtime above plus the CUDA provider beside libonnxruntime.so.1 (ONNX Runtime loads
# providers from its own folder) and the CUDA 13 libraries it needs (cudart, cuBLAS/cuBLASLt, cuRAND, and
# cuDNN 9 for convolutions) from NVIDIA's Debian 12 repository. libcuda.so.1 comes from the host's driver,
# mounted by the NVIDIA container runtime.
FROM runtime AS cuda
USER root
ADD https://developer.download.nvidia.com/compute/cuda/repos/debian12/x86_64/cuda-keyring_1.1-1_all.deb /tmp/cuda-keyring.deb
RUN dpkg -i /tmp/cuda-keyring.deb && rm /tmp/cuda-keyring.deb \
 && apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
      cuda-cudart-13-0 libcublas-13-0 libcurand-13-0 libcudnn9-cuda-13 \
 && rm -rf /var/lib/apt/lists/*
COPY --from=cuda-provider /src/.deps/onnxruntime-gpu/package/Plugins/Linux/x64/libonnxruntime_providers_cuda.so \
     /src/.deps/onnxruntime-gpu/package/Plugins/Linux/x64/libonnxruntime_providers_shared.so /opt/onnxopt/lib/
ENV LD_LIBRARY_PATH=/usr/local/cuda-13.0/targets/x86_64-linux/lib \
    NVIDIA_DRIVER_CAPABILITIES=compute,utility
USER 10001:10001

# The default target (docker build without --target): the CPU image.
FROM runtime
