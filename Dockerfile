# onnxopt-server image: build stage with the project's own set-up script, slim Debian 12 runtime,
# non-root user. Build: docker build -t onnxopt .   Run: docker run -p 50051:50051 -p 9464:9464 onnxopt
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

FROM debian:12-slim
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
      libgrpc++1.51 libprotobuf32 libabsl20220623 libonnx1 libprometheus-cpp-core1.0 libprometheus-cpp-pull1.0 \
      libsqlite3-0 libpq5 libjemalloc2 libssl3 ca-certificates \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --system --uid 10001 --user-group --home-dir /var/lib/onnxopt --create-home onnxopt
COPY --from=build /opt/onnxopt /opt/onnxopt
USER 10001:10001
# The server's working directory is its own data folder, never "/": nothing a job does can resolve a
# relative path against the root file system (each job's worker also runs in its own job folder).
WORKDIR /var/lib/onnxopt
VOLUME /var/lib/onnxopt
EXPOSE 50051 9464
ENTRYPOINT ["/opt/onnxopt/bin/onnxopt-server", "--listen=0.0.0.0:50051", "--metrics_listen=0.0.0.0:9464", \
            "--data_dir=/var/lib/onnxopt"]
