//! `kubectl lock RESOURCE/NAME -- COMMAND`: a lock held while a command runs. Invariant: the lock
//! is removed when the command ends, whatever the way; after a SIGKILL its lease makes it lapse.

use std::io;
use std::os::unix::process::ExitStatusExt;
use std::process::ExitStatus;
use std::time::Duration;

use backon::{ExponentialBuilder, Retryable};
use k8s_openapi::jiff::Timestamp;
use kube::api::{DeleteParams, Patch, PatchParams, Preconditions};
use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
use signal_hook::iterator::SignalsInfo;
use signal_hook::iterator::exfiltrator::WithOrigin;
use signal_hook::low_level::siginfo::{Cause, Origin};
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

use super::cli::{ConnectionArgs, LockArgs};
use super::error::{detail, status_code};
use super::lease::{self, Clock, Notice, Renew, RenewError};
use super::lock::{self, Created, Held};
use super::{PluginError, Report};

// Exit statuses, as the help text lists them.
const NOT_REMOVED: u8 = 122;
const ALREADY_LOCKED: u8 = 123;
const NOT_IN_FORCE: u8 = 124;
const NOT_TAKEN: u8 = 125;
const CANNOT_EXECUTE: u8 = 126;
const NOT_FOUND: u8 = 127;

pub(super) async fn run(
    connection: &ConnectionArgs,
    args: &LockArgs,
) -> Result<Report, PluginError> {
    let lease_length = args.lease.unwrap_or(lease::DEFAULT_LEASE);
    let mut signals = signals().map_err(|e| PluginError::NotRun {
        code: NOT_TAKEN,
        error: format!("cannot run the signal handlers: {e}"),
    })?;
    let clock = Clock::start();
    let first_expiry = Instant::now() + lease_length;
    let (created_tx, created_rx) = watch::channel(None::<Created>);
    let name =
        || (created_tx.borrow().as_ref()).map_or("the lock".to_owned(), |c| c.key.to_string());
    let lease = lease::keep(lease_length, clock, first_expiry, created_rx, |notice| {
        eprintln!("{}", tell(&notice, &name(), lease_length))
    });
    tokio::pin!(lease);
    let mut lost = false;

    let held = Held {
        lease: lease_length,
        expires_at: clock.wall(first_expiry),
        created: &created_tx,
    };
    let take = lock::take(connection, args, Some(held));
    tokio::pin!(take);
    let taken = loop {
        tokio::select! {
            taken = &mut take => break Ok(taken),
            Some(origin) = signals.recv() => break Err(origin.signal),
            _ = lease.as_mut(), if !lost => lost = true,
        }
    };
    let created = created_tx.borrow().clone();
    let (program, program_args) = (args.command.split_first()).expect("run only with a COMMAND");
    let command = format!("'{}'", program.to_string_lossy());
    let started = match taken {
        Ok(Ok(report)) => {
            // stdout is the command's: what kubectl lock says goes to stderr.
            eprint!("{}", report.stdout);
            for note in &report.notes {
                eprintln!("note: {note}");
            }
            // With the terminal, environment and process group of this process.
            let spawned = tokio::process::Command::new(program)
                .args(program_args)
                .spawn();
            spawned.map_err(|e| match e.kind() {
                io::ErrorKind::NotFound => (NOT_FOUND, format!("cannot run {command}: {e}")),
                _ => (CANNOT_EXECUTE, format!("cannot run {command}: {e}")),
            })
        }
        Ok(Err(PluginError::AlreadyLocked(e))) => Err((ALREADY_LOCKED, e)),
        Ok(Err(PluginError::NotInForce(e))) => Err((NOT_IN_FORCE, e)),
        Ok(Err(e)) => Err((NOT_TAKEN, e.to_string())),
        Err(signal) => Err((
            signal_status(signal),
            format!("interrupted by {}", signal_name(signal)),
        )),
    };
    let mut child = match started {
        Ok(child) => child,
        Err((code, error)) => {
            remove_or_tell(created.as_ref()).await;
            return Err(PluginError::NotRun { code, error });
        }
    };
    let status = loop {
        tokio::select! {
            status = child.wait() => break status,
            Some(origin) = signals.recv() => {
                // Not one the kernel sent (a key at the terminal, a hangup): the command's
                // process group received it too.
                if let (Some(pid), false) = (child.id(), matches!(origin.cause, Cause::Kernel)) {
                    pass_on(pid, origin.signal);
                }
            }
            _ = lease.as_mut(), if !lost => lost = true,
        }
    };
    let code = match status {
        Ok(status) => exit_status(status),
        Err(e) => {
            eprintln!("error: cannot wait for {command}: {e}");
            1
        }
    };
    let removed = remove_or_tell(created.as_ref()).await;
    Ok(Report {
        stdout: String::new(),
        notes: vec![],
        exit_code: match (removed, code) {
            (false, 0) => NOT_REMOVED,
            _ => code,
        },
    })
}

/// The command's code, or 128+N for signal N.
fn exit_status(status: ExitStatus) -> u8 {
    match (status.code(), status.signal()) {
        (Some(code), _) => (code & 0xff) as u8,
        (None, Some(signal)) => signal_status(signal),
        (None, None) => 1,
    }
}

fn signal_status(signal: i32) -> u8 {
    u8::try_from(128 + signal).unwrap_or(255)
}

fn signal_name(signal: i32) -> String {
    signal_hook::low_level::signal_name(signal)
        .map_or_else(|| format!("signal {signal}"), str::to_owned)
}

fn pass_on(pid: u32, signal: i32) {
    let pid = i32::try_from(pid)
        .ok()
        .and_then(rustix::process::Pid::from_raw);
    let signal = rustix::process::Signal::from_named_raw(signal);
    if let (Some(pid), Some(signal)) = (pid, signal) {
        // The command may have just ended: nothing to pass the signal to, which is fine.
        let _ = rustix::process::kill_process(pid, signal);
    }
}

fn tell(notice: &Notice, lock: &str, lease: Duration) -> String {
    match notice {
        Notice::Failing { left, why } => format!(
            "warning: cannot renew the lease of {lock} ({why}): it lapses in {} unless renewed",
            humantime::format_duration(Duration::from_secs(left.as_secs()))
        ),
        Notice::Lapsed { why } => format!(
            "warning: the lease of {lock} ran out ({why}): the object is not locked until a renewal succeeds"
        ),
        Notice::Recovered => format!("note: the lease of {lock} is renewed again"),
        Notice::Lost(why) => format!(
            "warning: {why}: the object is no longer locked while the command runs (lease {})",
            humantime::format_duration(lease)
        ),
    }
}

/// Deletes the lock this process created (its uid a precondition), or says on stderr how to do
/// it by hand; false when it is still there.
async fn remove_or_tell(created: Option<&Created>) -> bool {
    let Some(created) = created else {
        return true;
    };
    let uid = Some(created.uid.clone());
    let params = DeleteParams::default().preconditions(Preconditions {
        uid,
        ..Default::default()
    });
    // Gone (kubectl unlock), or replaced by another lock of that name: not ours to delete.
    let ours = |e: &kube::Error| !matches!(status_code(e), Some(404 | 409));
    let waits = ExponentialBuilder::default().with_min_delay(Duration::from_millis(500));
    let deleted = (|| created.api.delete(&created.key.name, &params))
        .retry(waits.with_factor(4.0).with_max_times(2))
        .sleep(tokio::time::sleep)
        .when(ours)
        .await;
    match deleted {
        Err(e) if ours(&e) => {
            let (key, command) = (&created.key, created.key.unlock_command());
            eprintln!(
                "error: cannot remove {key}: {}; remove it with: {command}",
                detail(&e)
            );
            false
        }
        _ => true,
    }
}

impl Renew for Created {
    /// With the uid as a precondition: a lock created again under the name is not renewed.
    async fn renew(&mut self, expires_at: Timestamp) -> Result<(), RenewError> {
        let patch = serde_json::json!({
            "metadata": { "uid": self.uid },
            "spec": { "expiresAt": expires_at.to_string() },
        });
        let params = PatchParams::default();
        match (self.api)
            .patch(&self.key.name, &params, &Patch::Merge(&patch))
            .await
        {
            Ok(_) => Ok(()),
            Err(e) => Err(match &e {
                kube::Error::Api(s) if s.code == 404 => {
                    RenewError::Lost(format!("{} was deleted", self.key))
                }
                // A lock created again under the name: the API server refuses the uid's change
                // (422 on 1.36; 409 from a storage precondition elsewhere).
                kube::Error::Api(s)
                    if s.code == 409 || s.code == 422 && s.message.contains("metadata.uid") =>
                {
                    RenewError::Lost(format!(
                        "{} was replaced by another lock of that name",
                        self.key
                    ))
                }
                _ => RenewError::Failed(detail(&e)),
            }),
        }
    }
}

/// SIGINT, SIGTERM and SIGHUP, with their origin, read on a thread of their own.
fn signals() -> io::Result<mpsc::UnboundedReceiver<Origin>> {
    let mut signals = SignalsInfo::<WithOrigin>::new([SIGINT, SIGTERM, SIGHUP])?;
    let (tx, rx) = mpsc::unbounded_channel();
    std::thread::Builder::new()
        .name("signals".to_owned())
        .spawn(move || signals.forever().try_for_each(|origin| tx.send(origin)))?;
    Ok(rx)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exit_statuses() {
        assert_eq!(exit_status(ExitStatus::from_raw(0)), 0);
        assert_eq!(exit_status(ExitStatus::from_raw(3 << 8)), 3);
        assert_eq!(exit_status(ExitStatus::from_raw(SIGTERM)), 143);
        assert_eq!(exit_status(ExitStatus::from_raw(9)), 137);
        assert_eq!(signal_name(SIGHUP), "SIGHUP");
    }

    #[test]
    fn lease_notices_name_the_lock() {
        let lease = Duration::from_secs(60);
        let failing = Notice::Failing {
            left: Duration::from_millis(15_400),
            why: "HTTP 500".into(),
        };
        assert_eq!(
            tell(&failing, "Lock prod/web", lease),
            "warning: cannot renew the lease of Lock prod/web (HTTP 500): it lapses in 15s unless renewed"
        );
        let lost = Notice::Lost("Lock prod/web was deleted".into());
        assert_eq!(
            tell(&lost, "Lock prod/web", lease),
            "warning: Lock prod/web was deleted: the object is no longer locked while the command runs (lease 1m)"
        );
    }
}
