//! kube-object-lock: a validating admission webhook that locks Kubernetes objects: an object
//! is locked while a `Lock` of the same name exists in its namespace (a `ClusterLock` for
//! cluster-scoped objects). [`admission::decide`] decides without I/O; [`server`] and [`http`]
//! serve the routes; [`app`] wires them to a lock source ([`locks`]) for the binary.
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
pub mod retry;
pub mod server;
pub mod settings;
pub mod status;
pub mod systemd;
pub mod telemetry;
pub mod tls;

pub use retry::error_chain;

/// `builder`'s runtime, or why it cannot start. tokio panics, rather than fails, when it cannot
/// make the descriptors of its signal driver (too many open files): that panic is the failure.
pub fn runtime(mut builder: tokio::runtime::Builder) -> Result<tokio::runtime::Runtime, String> {
    let hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {}));
    let built = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || {
        builder.enable_all().build()
    }));
    std::panic::set_hook(hook);
    let why = match built {
        Ok(Ok(runtime)) => return Ok(runtime),
        Ok(Err(e)) => e.to_string(),
        Err(panic) => (panic.downcast_ref::<String>().cloned())
            .or_else(|| panic.downcast_ref::<&str>().map(|s| (*s).to_owned()))
            .unwrap_or_else(|| "it panicked".to_owned()),
    };
    Err(format!("cannot start the async runtime: {why}"))
}
