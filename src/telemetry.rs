//! Logging: to the journal under systemd (levels become priorities, fields journal fields), else
//! to stderr as text or JSON. Invariant: `RUST_LOG` overrides `log.level`.

use std::os::unix::fs::MetadataExt;

use tracing_journald::{Priority, PriorityMappings};
use tracing_subscriber::EnvFilter;
use tracing_subscriber::prelude::*;

use crate::settings::{LogFormat, LogSettings, LogTarget};

#[derive(Debug, thiserror::Error)]
pub enum TelemetryError {
    #[error("invalid log filter {filter:?}: {message}")]
    Filter { filter: String, message: String },
    #[error(
        "log.target is \"journald\" but the journal cannot be reached ({0}); use \"auto\" or \"stderr\""
    )]
    Journald(std::io::Error),
}

/// Where events go, decided once at start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sink {
    Journald,
    Stderr,
}

/// Picks the sink: `auto` means the journal exactly when `journal_stream` (`JOURNAL_STREAM`,
/// `DEVICE:INODE`) names `stderr`; a child whose stderr was redirected inherits only the variable.
pub fn choose(target: LogTarget, journal_stream: Option<&str>, stderr: Option<(u64, u64)>) -> Sink {
    match target {
        LogTarget::Journald => Sink::Journald,
        LogTarget::Stderr => Sink::Stderr,
        LogTarget::Auto => {
            let named = journal_stream.and_then(|value| {
                let (dev, ino) = value.split_once(':')?;
                Some((dev.trim().parse().ok()?, ino.trim().parse().ok()?))
            });
            match (named, stderr) {
                (Some(named), Some(actual)) if named == actual => Sink::Journald,
                _ => Sink::Stderr,
            }
        }
    }
}

/// Whether stderr is the journal (systemd's `JOURNAL_STREAM` names it), so that a line written
/// there may start with a `<N>` priority prefix.
pub fn stderr_is_journal() -> bool {
    let journal_stream = std::env::var("JOURNAL_STREAM").ok();
    choose(
        LogTarget::Auto,
        journal_stream.as_deref(),
        stderr_identity(),
    ) == Sink::Journald
}

/// Device and inode of this process's stderr, as `JOURNAL_STREAM` would name them.
fn stderr_identity() -> Option<(u64, u64)> {
    use std::os::fd::AsFd;
    let fd = std::io::stderr().as_fd().try_clone_to_owned().ok()?;
    let meta = std::fs::File::from(fd).metadata().ok()?;
    Some((meta.dev(), meta.ino()))
}

/// The journal layer: a tracing level is the syslog priority of the same name (the crate's
/// default would log `info` as notice and `debug` as info).
fn journald_layer() -> std::io::Result<tracing_journald::Layer> {
    Ok(
        tracing_journald::layer()?.with_priority_mappings(PriorityMappings {
            error: Priority::Error,
            warn: Priority::Warning,
            info: Priority::Informational,
            debug: Priority::Debug,
            trace: Priority::Debug,
        }),
    )
}

/// kube's own line per failed request or watch, beside the webhook's own line about the same
/// failure: several a second while an API server restarts. Off unless the filter names the crate.
const QUIET: [(&str, &str); 2] = [
    ("kube_client", "kube_client::client::builder=off"),
    ("kube_runtime", "kube_runtime::watcher=off"),
];

fn with_quiet_kube(filter: &str) -> String {
    if filter.trim().is_empty() {
        return filter.to_owned();
    }
    let mut filter = filter.to_owned();
    for (krate, directive) in QUIET {
        if !filter.contains(krate) {
            filter.push(',');
            filter.push_str(directive);
        }
    }
    filter
}

/// Installs the global subscriber. Call once, first thing. Returns where events go.
pub fn init(log: &LogSettings) -> Result<Sink, TelemetryError> {
    let filter = match std::env::var("RUST_LOG") {
        Ok(from_env) if !from_env.is_empty() => from_env,
        _ => log.level.clone(),
    };
    let env_filter = EnvFilter::builder()
        .parse(with_quiet_kube(&filter))
        .map_err(|e| TelemetryError::Filter {
            filter: filter.clone(),
            message: e.to_string(),
        })?;
    let journal_stream = std::env::var("JOURNAL_STREAM").ok();
    let sink = choose(log.target, journal_stream.as_deref(), stderr_identity());
    let registry = tracing_subscriber::registry().with(env_filter);
    let mut fallback = None;
    if sink == Sink::Journald {
        match journald_layer() {
            // A second init (tests) keeps the first subscriber; that is fine.
            Ok(layer) => {
                let _ = registry.with(layer).try_init();
                return Ok(Sink::Journald);
            }
            Err(e) if log.target == LogTarget::Journald => return Err(TelemetryError::Journald(e)),
            Err(e) => fallback = Some(e),
        }
    }
    let stderr = tracing_subscriber::fmt::layer().with_writer(std::io::stderr);
    let _ = match log.format {
        LogFormat::Text => registry.with(stderr.with_ansi(false)).try_init(),
        LogFormat::Json => registry.with(stderr.json().flatten_event(true)).try_init(),
    };
    if let Some(e) = fallback {
        tracing::warn!(error = %e, "stderr is the journal but its socket cannot be used; logging lines to stderr");
    }
    Ok(Sink::Stderr)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn auto_picks_the_journal_only_when_stderr_is_the_named_stream() {
        let auto = LogTarget::Auto;
        assert_eq!(
            choose(auto, Some("8:1234"), Some((8, 1234))),
            Sink::Journald
        );
        // Inherited by a process whose stderr goes elsewhere.
        assert_eq!(choose(auto, Some("8:1234"), Some((8, 99))), Sink::Stderr);
        assert_eq!(choose(auto, Some("9:1234"), Some((8, 1234))), Sink::Stderr);
        assert_eq!(choose(auto, None, Some((8, 1234))), Sink::Stderr);
        assert_eq!(choose(auto, Some("garbage"), Some((8, 1234))), Sink::Stderr);
        assert_eq!(choose(auto, Some(""), None), Sink::Stderr);
        assert_eq!(choose(auto, Some("8:1234"), None), Sink::Stderr);
    }

    #[test]
    fn kubes_own_failure_lines_are_off_unless_asked_for() {
        use std::sync::{Arc, Mutex};
        use tracing_subscriber::layer::{Context, Layer, SubscriberExt};

        #[derive(Clone, Default)]
        struct Targets(Arc<Mutex<Vec<String>>>);
        impl<S: tracing::Subscriber> Layer<S> for Targets {
            fn on_event(&self, event: &tracing::Event<'_>, _: Context<'_, S>) {
                self.0
                    .lock()
                    .unwrap()
                    .push(event.metadata().target().to_owned());
            }
        }
        let seen = |filter: &str| {
            let targets = Targets::default();
            let subscriber = tracing_subscriber::registry()
                .with(EnvFilter::builder().parse(with_quiet_kube(filter)).unwrap())
                .with(targets.clone());
            tracing::subscriber::with_default(subscriber, || {
                tracing::error!(target: "kube_client::client::builder", "failed with error");
                tracing::error!(target: "kube_client::api", "other");
                tracing::warn!(target: "kube_runtime::watcher", "watch list error with 403");
                tracing::warn!(target: "kube_object_lock::locks", "lock index stale");
            });
            targets.0.lock().unwrap().clone()
        };
        assert_eq!(
            seen("info"),
            ["kube_client::api", "kube_object_lock::locks"]
        );
        assert_eq!(
            seen("info,kube_client=error"),
            [
                "kube_client::client::builder",
                "kube_client::api",
                "kube_object_lock::locks"
            ]
        );
        assert_eq!(
            seen("info,kube_runtime=warn"),
            [
                "kube_client::api",
                "kube_runtime::watcher",
                "kube_object_lock::locks"
            ]
        );
    }

    #[test]
    fn an_explicit_target_wins() {
        assert_eq!(choose(LogTarget::Journald, None, None), Sink::Journald);
        assert_eq!(
            choose(LogTarget::Stderr, Some("8:1234"), Some((8, 1234))),
            Sink::Stderr
        );
    }

    #[test]
    fn stderr_identity_is_the_device_and_inode_of_fd_2() {
        let (dev, ino) = stderr_identity().expect("stderr is open under the test harness");
        let meta = std::fs::metadata("/proc/self/fd/2").expect("fd 2");
        assert_eq!((dev, ino), (meta.dev(), meta.ino()));
    }
}
