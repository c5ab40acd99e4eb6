# kube-object-lock container image: the same binary as the systemd service.
# Build: docker build -t kube-object-lock .   (or: docker compose build, see docker-compose.yml)
# Run:   mount a directory with config.toml, tls.crt, tls.key (and kubeconfig, client-ca.crt) at
#        /etc/kube-object-lock, read-only.

FROM rust:1-slim-bookworm AS build
WORKDIR /src
# The whole crate (see .dockerignore); --locked builds exactly what Cargo.lock pins.
COPY . .
RUN cargo build --release --locked \
 && install -D -m 0755 target/release/kube-object-lock /out/kube-object-lock

FROM debian:bookworm-slim
# Not root: a fixed UID/GID that mounted files can be owned by (docker-compose.yml may override
# it with the UID of whoever owns the mounted files).
RUN groupadd --system --gid 10001 kube-object-lock \
 && useradd --system --uid 10001 --gid 10001 --no-create-home --home-dir /nonexistent \
      --shell /usr/sbin/nologin kube-object-lock
COPY --from=build /out/kube-object-lock /usr/local/bin/kube-object-lock
USER 10001:10001
EXPOSE 8443
# SIGTERM: in-flight reviews finish within server.shutdown_grace (20s), then exit 0.
STOPSIGNAL SIGTERM
ENTRYPOINT ["/usr/local/bin/kube-object-lock"]
CMD ["serve", "--config", "/etc/kube-object-lock/config.toml"]
