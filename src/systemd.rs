//! Talking to systemd (`Type=notify`): READY once serving, STATUS lines, STOPPING on shutdown,
//! and watchdog pings while the runtime runs.
//!
//! READY is sent as soon as the listener serves, never after the API server answers: the
//! webhook answers from LISTs while its watch syncs, and a unit stuck in "activating" because
//! the API server is slow would only delay the control plane. Outside systemd (no
//! `NOTIFY_SOCKET`) every call is a no-op.

use std::time::Duration;

use sd_notify::NotifyState;
use tracing::{debug, warn};

use crate::http::HealthCheck;

/// READY=1 with a status line.
pub fn ready(status: &str) {
    send(&[NotifyState::Ready, NotifyState::Status(status)]);
}

/// STOPPING=1.
pub fn stopping() {
    send(&[
        NotifyState::Stopping,
        NotifyState::Status("draining connections"),
    ]);
}

/// Pings the watchdog at half its period; returns at once when the unit has no `WatchdogSec=`.
///
/// The pings prove the runtime is alive, nothing more. A failing `health` check (a certificate
/// rotation that keeps failing) is reported in STATUS= but does not stop the pings: the running
/// process still serves its last good certificate, while a restart would refuse the bad files
/// and crash-loop, failing every write under `failurePolicy: Fail`.
pub async fn watchdog(health: HealthCheck) {
    let Some(period) = sd_notify::watchdog_enabled() else {
        return;
    };
    let mut ticker = tokio::time::interval((period / 2).max(Duration::from_millis(100)));
    let mut failing = false;
    loop {
        ticker.tick().await;
        match health() {
            Ok(()) if failing => {
                send(&[NotifyState::Status("healthy again")]);
                failing = false;
            }
            Ok(()) => {}
            Err(why) if !failing => {
                warn!(%why, "unhealthy");
                send(&[NotifyState::Status(&format!("unhealthy: {why}"))]);
                failing = true;
            }
            Err(_) => {}
        }
        send(&[NotifyState::Watchdog]);
    }
}

fn send(states: &[NotifyState<'_>]) {
    if let Err(e) = sd_notify::notify(states) {
        debug!(error = %e, "cannot notify systemd");
    }
}
