//! kube-object-lock: a validating admission webhook that locks Kubernetes objects.
//!
//! An object is locked while a `Lock` with the same name exists in its namespace (a
//! `ClusterLock` for cluster-scoped objects); UPDATE and DELETE of a locked object are refused.
//!
//! The crate is split so that each part can be tested alone: [`admission`] decides without
//! I/O, [`locks`] knows where locks come from, [`http`] and [`server`] speak HTTPS and know
//! nothing of locks, and [`app`] wires them together for the binary.
#![forbid(unsafe_code)]

/// `--version` of both binaries: the crate version and the commit built from (build.rs).
pub const VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (commit ",
    env!("KUBE_OBJECT_LOCK_COMMIT"),
    ")"
);

pub mod admission;
pub mod api;
pub mod app;
pub mod cli;
pub mod events;
pub mod http;
pub mod kubeconfig;
pub mod locks;
pub mod metrics;
pub mod plugin;
pub mod registration;
pub mod reporting;
pub mod retry;
pub mod server;
pub mod settings;
pub mod status;
pub mod systemd;
pub mod telemetry;
pub mod tls;

/// An error and its causes on one line, each said once: a cause whose text the message already
/// holds (a `thiserror` message that prints its `#[source]`) is not repeated, so the line reads
/// `cannot read locks directory /x: No such file or directory (os error 2)`, not that twice.
pub fn error_chain(error: &(dyn std::error::Error + 'static)) -> String {
    let mut line = error.to_string();
    let mut cause = error.source();
    while let Some(next) = cause {
        let text = next.to_string();
        if !text.is_empty() && !line.contains(&text) {
            line.push_str(": ");
            line.push_str(&text);
        }
        cause = next.source();
    }
    line
}

#[cfg(test)]
mod tests {
    #[derive(Debug, thiserror::Error)]
    #[error("cannot read locks directory /x: {0}")]
    struct Dir(#[source] std::io::Error);

    #[test]
    fn each_cause_is_said_once() {
        let io = || std::io::Error::from(std::io::ErrorKind::NotFound);
        let inner = anyhow::Error::new(Dir(io())).context("cannot start the webhook");
        assert_eq!(
            super::error_chain(inner.as_ref()),
            format!(
                "cannot start the webhook: cannot read locks directory /x: {}",
                io()
            )
        );
    }
}
