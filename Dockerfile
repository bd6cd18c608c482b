# The Trireme image for a machine with a registry: the release binaries built in the official
# Rust image, copied onto Debian's slim image with a non-root user. Build it from the checkout:
#
#     docker build -t trireme:local .
#
# Without a registry, `docker/build-local.sh` builds the same image (same name, same layout,
# same user) from binaries built on the host. docker-compose.yml uses either unchanged.

# The toolchain the code is built and tested with (rust-version in Cargo.toml is the minimum).
ARG RUST_VERSION=1.95
ARG DEBIAN_RELEASE=trixie

FROM rust:${RUST_VERSION}-slim-${DEBIAN_RELEASE} AS build
WORKDIR /src
COPY . .
# Protobuf is compiled by protox (no system protoc) and no dependency links a C library beyond
# glibc; the node's allocator, jemalloc, is built from source and linked statically, which needs
# make beside the image's cc.
RUN apt-get update \
 && apt-get install -y --no-install-recommends make \
 && rm -rf /var/lib/apt/lists/*
RUN cargo build --release --locked -p trireme-node -p trireme-client --bins \
 && install -D -m 0755 target/release/trireme-node /out/trireme-node \
 && install -D -m 0755 target/release/trireme /out/trireme

# The runtime is the same Debian release as the build image, so its glibc is the one linked.
FROM debian:${DEBIAN_RELEASE}-slim
# A fixed numeric uid/gid (10001), the same in the scratch image of docker/build-local.sh, so a
# named volume created by one image is writable by the other.
RUN groupadd --system --gid 10001 trireme \
 && useradd --system --uid 10001 --gid 10001 --home-dir /var/lib/trireme --no-create-home \
        --shell /usr/sbin/nologin trireme \
 && install -d -o 10001 -g 10001 -m 0750 /var/lib/trireme /etc/trireme/certs
COPY --from=build /out/trireme-node /out/trireme /usr/local/bin/
USER 10001:10001
ENV TRIREME_DATA_DIR=/var/lib/trireme \
    TRIREME_LISTEN=0.0.0.0:7100 \
    TRIREME_SQS_LISTEN=0.0.0.0:9324 \
    TRIREME_PEER_LISTEN=0.0.0.0:7200 \
    TRIREME_METRICS_LISTEN=0.0.0.0:9100
VOLUME ["/var/lib/trireme"]
# gRPC, SQS-compatible HTTP, the members' internal replica service, and /metrics, /health and
# /ready.
EXPOSE 7100 9324 7200 9100
# Healthy when the node is ready: storage open and, in a cluster, joined with a quorum of
# members reachable (`trireme-node probe` needs no shell, which the scratch image lacks).
HEALTHCHECK --interval=5s --timeout=5s --start-period=10s --retries=3 \
    CMD ["/usr/local/bin/trireme-node", "probe", "http://127.0.0.1:9100/ready"]
ENTRYPOINT ["/usr/local/bin/trireme-node"]
