//! kube-object-lock: a validating admission webhook that locks Kubernetes objects.
//!
//! An object is locked while a `Lock` with the same name exists in its namespace (a
//! `ClusterLock` for cluster-scoped objects); UPDATE and DELETE of a locked object are refused.
//!
//! The crate is split so that each part can be tested alone: [`admission::decide`] decides
//! without I/O, and the rest of [`admission`] reads what it needs (locks, labels) through the
//! traits [`locks::LockSource`] and [`admission::labels::LabelReader`]; [`locks`] knows where
//! locks come from; [`server`] speaks TLS and knows nothing of locks; [`http`] routes reviews
//! and asks the lock source only whether it is ready (`/readyz`); [`app`] wires them together
//! for the binary.
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
pub mod fieldpath;
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

pub use retry::error_chain;
