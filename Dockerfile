# syntax=docker/dockerfile:1
# Image of the price-alert pipeline: `alert-pipeline` (the entrypoint), the other two stages
# (`alert-sink`, `alert-deliver`: `docker run --entrypoint alert-sink ...`), the tools people run
# beside them (`alert-rules`, `dlq-replay`, `alert-verify`, `txn-demo`) and the demo's helpers
# (`tick-gen`, `test-subscriber`). docker-compose.yml and deploy/k8s/ run them from this one image;
# tests/deploy.rs checks that every binary they name is copied in here.
# Built by `docker compose build` (see docker-compose.yml) or `docker build -t price-alerts .`.

# ---- build ----
# rust:1-bookworm carries what rdkafka's bundled librdkafka needs to build: a C toolchain, make,
# pkg-config, and the OpenSSL, zlib and libcurl headers (buildpack-deps has libcurl4-openssl-dev).
FROM rust:1-bookworm AS build
WORKDIR /src
COPY Cargo.toml Cargo.lock ./
COPY src ./src
# The benchmark crate is a member of the workspace: cargo needs its manifest to resolve the
# workspace, though only the processor's binaries are built.
COPY bench/Cargo.toml ./bench/Cargo.toml
COPY bench/src ./bench/src
# The cache mounts keep the crate registry and compiled dependencies between builds; the binaries
# are copied out of the cached target folder, which is not part of the image layer.
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked -p price-alerts --bins \
    && mkdir -p /out \
    && cp target/release/alert-pipeline target/release/alert-sink target/release/alert-deliver \
          target/release/alert-rules target/release/dlq-replay target/release/alert-verify \
          target/release/txn-demo target/release/tick-gen target/release/test-subscriber /out/

# ---- runtime ----
FROM debian:bookworm-slim
# libcurl4: librdkafka fetches OAUTHBEARER/OIDC tokens with it.
RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates libssl3 libcurl4 \
    && rm -rf /var/lib/apt/lists/*
COPY --from=build /out/ /usr/local/bin/
# Not root: the pipeline needs no privileges. /var/lib/price-alerts is the one directory it may
# write (the compose project's tick-gen writes its rules file there): a named volume mounted on it
# starts with its owner, the user below.
RUN useradd --system --uid 10001 --no-create-home alerts \
    && mkdir -p /var/lib/price-alerts && chown alerts:alerts /var/lib/price-alerts
USER alerts
ENTRYPOINT ["alert-pipeline"]
