# syntax=docker/dockerfile:1
# Controller image: a static (musl) ttdrv-controller on distroless, non-root.
#
#   docker build -t ghcr.io/tenstorrent/tt-k8s-driver-manager-rs/controller:<tag> .
#
# The build context is the repository root. Only the workspace's manifests and
# sources are copied (target/ stays out): a new workspace member must be added
# to the COPY lines below.
ARG RUST_VERSION=1.89

FROM rust:${RUST_VERSION}-bookworm AS build
# musl-tools: musl-gcc for the C parts of dependencies (ring).
# hadolint ignore=DL3008
RUN apt-get update \
 && apt-get install -y --no-install-recommends musl-tools \
 && rm -rf /var/lib/apt/lists/* \
 && rustup target add x86_64-unknown-linux-musl
WORKDIR /src
COPY Cargo.toml Cargo.lock ./
COPY api api
COPY core core
COPY src src
COPY agent agent
COPY testkit testkit
COPY plugin plugin
COPY bench bench
COPY vfio vfio
COPY flasher flasher
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked --bin ttdrv-controller --target x86_64-unknown-linux-musl \
 && install -D -m 0755 target/x86_64-unknown-linux-musl/release/ttdrv-controller /out/ttdrv-controller

# distroless/static: CA certificates, /etc/passwd with nonroot (65532), no shell.
FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/ttdrv-controller /usr/local/bin/ttdrv-controller
USER 65532:65532
EXPOSE 8080
ENTRYPOINT ["/usr/local/bin/ttdrv-controller"]
