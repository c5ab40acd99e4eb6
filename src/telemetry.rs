//! Logging: tracing-subscriber to stderr, as text or JSON.
//!
//! Under systemd, stderr goes to the journal, which adds its own timestamps; JSON is for log
//! shippers. `RUST_LOG` overrides the configured level so an operator can turn on debug for
//! one run without editing the config file.

use tracing_subscriber::EnvFilter;

use crate::settings::LogFormat;

/// Why logging could not start.
#[derive(Debug, thiserror::Error)]
#[error("invalid log filter {filter:?}: {message}")]
pub struct TelemetryError {
    filter: String,
    message: String,
}

/// Installs the global subscriber. Call once, first thing.
pub fn init(level: &str, format: LogFormat) -> Result<(), TelemetryError> {
    let filter = match std::env::var("RUST_LOG") {
        Ok(from_env) if !from_env.is_empty() => from_env,
        _ => level.to_owned(),
    };
    let env_filter = EnvFilter::builder()
        .parse(&filter)
        .map_err(|e| TelemetryError {
            filter: filter.clone(),
            message: e.to_string(),
        })?;
    let builder = tracing_subscriber::fmt()
        .with_env_filter(env_filter)
        .with_writer(std::io::stderr);
    let result = match format {
        LogFormat::Text => builder.with_ansi(false).try_init(),
        LogFormat::Json => builder.json().flatten_event(true).try_init(),
    };
    // A second init (tests) keeps the first subscriber; that is fine.
    let _ = result;
    Ok(())
}
