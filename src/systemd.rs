//! Talking to systemd (`Type=notify`): READY, STATUS, STOPPING, watchdog pings, and the socket
//! handed over by `kube-object-lock.socket`. Invariant: READY is sent once the listener serves,
//! never waiting for the API server; outside systemd every call is a no-op.

use std::net::{SocketAddr, TcpListener};
use std::sync::Mutex;
use std::time::Duration;

use sd_notify::NotifyState;
use tracing::debug;

/// The STATUS= line `systemctl status` shows: what is served, then the current problem if any
/// (a failed certificate reload), so the line never claims all is well while it is not.
#[derive(Debug, Default)]
pub struct Status {
    line: Mutex<StatusLine>,
}

#[derive(Debug, Default)]
struct StatusLine {
    serving: String,
    problem: Option<String>,
    sent: Option<String>,
}

impl StatusLine {
    fn render(&self) -> String {
        match &self.problem {
            None => self.serving.clone(),
            Some(problem) if self.serving.is_empty() => problem.clone(),
            Some(problem) => format!("{}; {problem}", self.serving),
        }
    }
}

impl Status {
    /// READY=1 with `serving` (what the service does) as the status line.
    pub fn ready(&self, serving: &str) {
        let mut line = self.line.lock().unwrap_or_else(|e| e.into_inner());
        line.serving = serving.to_owned();
        let text = line.render();
        send(&[NotifyState::Ready, NotifyState::Status(&text)]);
        line.sent = Some(text);
    }

    /// Sets or clears the problem; a changed line is sent at once.
    pub fn problem(&self, problem: Option<String>) {
        let mut line = self.line.lock().unwrap_or_else(|e| e.into_inner());
        line.problem = problem;
        let text = line.render();
        if line.sent.as_deref() != Some(text.as_str()) {
            send(&[NotifyState::Status(&text)]);
            line.sent = Some(text);
        }
    }

    pub fn line(&self) -> String {
        self.line.lock().unwrap_or_else(|e| e.into_inner()).render()
    }
}

/// The listening socket systemd passed, taken by [`take_passed_listener`].
static PASSED: Mutex<Option<TcpListener>> = Mutex::new(None);

/// Why the socket systemd passed cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum PassedSocketError {
    #[error("the socket systemd passed (LISTEN_FDS) is not a listening TCP socket")]
    NotTcp(#[source] std::io::Error),
    #[error(
        "server.listen is {want}, but the socket systemd passed listens on {got}: make ListenStream= in kube-object-lock.socket and server.listen the same"
    )]
    Elsewhere { want: SocketAddr, got: SocketAddr },
    #[error("the socket systemd passed cannot be used")]
    Io(#[source] std::io::Error),
}

/// Takes the listening socket systemd passed (`LISTEN_FDS`, for this process's `LISTEN_PID`),
/// keeping it for [`passed_listener`]. Call it before any other thread starts: it unsets
/// `LISTEN_FDS` and `LISTEN_PID` so that no child inherits them, and changing the environment
/// is sound only while the process has one thread.
pub fn take_passed_listener() -> Result<(), PassedSocketError> {
    let listener = listenfd::ListenFd::from_env()
        .take_tcp_listener(0)
        .map_err(PassedSocketError::NotTcp)?;
    *PASSED.lock().unwrap_or_else(|e| e.into_inner()) = listener;
    Ok(())
}

/// The socket taken by [`take_passed_listener`], once, checked to listen on `want`
/// (`server.listen`) and made non-blocking; `None` when systemd passed none.
pub fn passed_listener(want: SocketAddr) -> Result<Option<TcpListener>, PassedSocketError> {
    let Some(listener) = PASSED.lock().unwrap_or_else(|e| e.into_inner()).take() else {
        return Ok(None);
    };
    let got = listener.local_addr().map_err(PassedSocketError::Io)?;
    if got != want {
        return Err(PassedSocketError::Elsewhere { want, got });
    }
    listener
        .set_nonblocking(true)
        .map_err(PassedSocketError::Io)?;
    Ok(Some(listener))
}

pub fn stopping() {
    send(&[
        NotifyState::Stopping,
        NotifyState::Status("draining connections"),
    ]);
}

/// Pings the watchdog at half its period; returns at once when the unit has no `WatchdogSec=`.
/// The pings prove only that the runtime is alive (docs/design/serving.md).
pub async fn watchdog() {
    let Some(period) = sd_notify::watchdog_enabled() else {
        return;
    };
    let mut ticker = tokio::time::interval((period / 2).max(Duration::from_millis(100)));
    loop {
        ticker.tick().await;
        send(&[NotifyState::Watchdog]);
    }
}

fn send(states: &[NotifyState<'_>]) {
    if let Err(e) = sd_notify::notify(states) {
        debug!(error = %e, "cannot notify systemd");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_line_carries_the_problem_until_it_is_cleared() {
        let status = Status::default();
        status.ready("serving on 127.0.0.1:8443");
        assert_eq!(status.line(), "serving on 127.0.0.1:8443");
        status.problem(Some("certificate reload failed".to_owned()));
        assert_eq!(
            status.line(),
            "serving on 127.0.0.1:8443; certificate reload failed"
        );
        status.problem(None);
        assert_eq!(status.line(), "serving on 127.0.0.1:8443");
    }

    #[test]
    fn a_problem_before_ready_is_kept() {
        let status = Status::default();
        status.problem(Some("certificate reload failed".to_owned()));
        assert_eq!(status.line(), "certificate reload failed");
        status.ready("serving");
        assert_eq!(status.line(), "serving; certificate reload failed");
    }
}
