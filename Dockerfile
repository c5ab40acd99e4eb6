# kube-object-lock container image: the same binary as the systemd service.
# Build: docker build -t kube-object-lock .   (or: docker compose build, see docker-compose.yml)
# Run:   mount a directory with config.toml, tls.crt, tls.key (and kubeconfig, client-ca.crt) at
#        /etc/kube-object-lock, read-only.
#
# Hosts that cannot pull the base images name local ones (e.g. a `docker import`ed debootstrap of
# Debian 12): --build-arg RUST_IMAGE=... --build-arg BASE_IMAGE=...
# Hosts where nothing can be compiled in a container (no Rust image, no crates.io) package a
# binary built on the host instead, glibc 2.36 (Debian 12) or older, with the stage "prebuilt":
#   cp target/release/kube-object-lock prebuilt/ && docker build --target prebuilt -t kube-object-lock .
# That stage compiles nothing and needs only BASE_IMAGE.

ARG RUST_IMAGE=rust:1-slim-bookworm
ARG BASE_IMAGE=debian:bookworm-slim

# The runtime image without its binary; both ways of getting the binary below start from it.
FROM ${BASE_IMAGE} AS runtime
# Not root: a fixed UID/GID that mounted files can be owned by (docker-compose.yml may override
# it with the UID of whoever owns the mounted files).
RUN groupadd --system --gid 10001 kube-object-lock \
 && useradd --system --uid 10001 --gid 10001 --no-create-home --home-dir /nonexistent \
      --shell /usr/sbin/nologin kube-object-lock
USER 10001:10001
EXPOSE 8443
# SIGTERM: in-flight reviews finish within server.shutdown_grace (20s), then exit 0.
STOPSIGNAL SIGTERM
ENTRYPOINT ["/usr/local/bin/kube-object-lock"]
CMD ["serve", "--config", "/etc/kube-object-lock/config.toml"]

# The binary from prebuilt/ (see prebuilt/README.md). The directory always exists, so that the
# classic builder, which builds every stage before the target, still builds the default image.
FROM runtime AS prebuilt
COPY prebuilt/ /usr/local/bin/

FROM ${RUST_IMAGE} AS build
WORKDIR /src
# The whole crate (see .dockerignore); --locked builds exactly what Cargo.lock pins.
COPY . .
RUN cargo build --release --locked \
 && install -D -m 0755 target/release/kube-object-lock /out/kube-object-lock

# The default image: compiled in the build stage.
FROM runtime
COPY --from=build /out/kube-object-lock /usr/local/bin/kube-object-lock
