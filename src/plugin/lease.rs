//! The lease of a lock held while a command runs (`kubectl lock ... -- COMMAND`).
//!
//! The lock's `spec.expiresAt` is kept one lease ahead of now, renewed every third of the lease.
//! So if `kubectl lock` is killed (SIGKILL, the machine lost) and cannot remove the lock, the
//! lock lapses by itself within one lease, while a renewal that fails once or twice is retried
//! well before the lease runs out. The webhook enforces `expiresAt` as it does any expiry.
//!
//! Time is tokio's: the schedule runs on [`Instant`], and the wall-clock times written are
//! derived from it ([`Clock`]), so the whole schedule runs under a paused clock in tests.

use std::time::Duration;

use k8s_openapi::jiff::{SignedDuration, Timestamp};
use tokio::sync::watch;
use tokio::time::Instant;

/// The lease when `--lease` is not given.
pub const DEFAULT_LEASE: Duration = Duration::from_secs(60);
/// The shortest lease: a renewal every second.
pub const MIN_LEASE: Duration = Duration::from_secs(3);

/// Wall-clock time read from tokio's clock, anchored once.
#[derive(Clone, Copy, Debug)]
pub struct Clock {
    wall: Timestamp,
    at: Instant,
}

impl Clock {
    /// Anchors tokio's clock to the wall clock now.
    pub fn start() -> Clock {
        Clock {
            wall: Timestamp::now(),
            at: Instant::now(),
        }
    }

    /// The wall-clock time at `instant`, rounded up to the second (as `expiresAt` is written).
    pub fn wall(&self, instant: Instant) -> Timestamp {
        let offset = SignedDuration::try_from(instant.saturating_duration_since(self.at))
            .unwrap_or(SignedDuration::MAX);
        let at = self.wall.saturating_add(offset).unwrap_or(Timestamp::MAX);
        let second = at.as_second() + i64::from(at.subsec_nanosecond() > 0);
        Timestamp::from_second(second).unwrap_or(Timestamp::MAX)
    }
}

/// Why a renewal failed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RenewError {
    /// The lock is gone or was replaced: no renewal can succeed.
    Lost(String),
    /// This try failed; another may not.
    Failed(String),
}

/// Writes a lock's `expiresAt`.
pub trait Renew {
    /// Sets `expiresAt` of the lock to `expires_at`.
    fn renew(
        &mut self,
        expires_at: Timestamp,
    ) -> impl std::future::Future<Output = Result<(), RenewError>>;
}

/// What the lease has to say, for stderr.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Notice {
    /// A renewal failed and the lease runs out in `left` unless one succeeds.
    Failing {
        /// Time left on the lease.
        left: Duration,
        why: String,
    },
    /// The lease ran out: the lock no longer applies until a renewal succeeds.
    Lapsed { why: String },
    /// Renewed again after a [`Notice::Failing`] or [`Notice::Lapsed`].
    Recovered,
    /// The lock is gone: renewals stop.
    Lost(String),
}

/// The renewal schedule: every third of the lease, retried when it fails.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Schedule {
    /// How far ahead of now `expiresAt` is kept.
    pub lease: Duration,
}

impl Schedule {
    /// Time between two successful renewals.
    pub fn period(&self) -> Duration {
        self.lease / 3
    }

    /// Time between two tries after a failure: a twelfth of the lease, 250 ms to 5 s.
    pub fn retry(&self) -> Duration {
        (self.lease / 12).clamp(Duration::from_millis(250), Duration::from_secs(5))
    }

    /// Whether a failure with `left` on the lease is worth telling: the lease is about to run
    /// out (less than a renewal period left, so at least one more renewal failed before).
    pub fn warns(&self, left: Duration) -> bool {
        left < self.period()
    }
}

/// Keeps the lease of the lock that `created` announces, whose `expiresAt` was written as the
/// wall time of `expires` (the first lease, counted from before the lock was created). Returns
/// only when the lock is lost; until then renews it forever, so drop it to stop.
pub async fn keep<R: Renew + Clone>(
    schedule: Schedule,
    clock: Clock,
    expires: Instant,
    mut created: watch::Receiver<Option<R>>,
    mut notify: impl FnMut(Notice),
) -> String {
    let renewer = match created.wait_for(Option::is_some).await {
        Ok(renewer) => renewer.clone(),
        Err(_) => None,
    };
    let Some(mut renewer) = renewer else {
        // The sender is gone without a lock: nothing to renew, ever.
        return std::future::pending().await;
    };
    let mut expires = expires;
    let mut next = expires - schedule.lease + schedule.period();
    // Told Failing or Lapsed since the last success.
    let mut troubled = false;
    let mut lapsed = false;
    loop {
        tokio::time::sleep_until(next).await;
        let now = Instant::now();
        let until = now + schedule.lease;
        match renewer.renew(clock.wall(until)).await {
            Ok(()) => {
                expires = until;
                next = now + schedule.period();
                if std::mem::take(&mut troubled) {
                    notify(Notice::Recovered);
                }
                lapsed = false;
            }
            Err(RenewError::Lost(why)) => {
                notify(Notice::Lost(why.clone()));
                return why;
            }
            Err(RenewError::Failed(why)) => {
                let now = Instant::now();
                let left = expires.saturating_duration_since(now);
                if left.is_zero() {
                    if !std::mem::replace(&mut lapsed, true) {
                        notify(Notice::Lapsed { why });
                        troubled = true;
                    }
                } else if schedule.warns(left) {
                    notify(Notice::Failing { left, why });
                    troubled = true;
                }
                next = now + schedule.retry();
            }
        }
    }
}

#[cfg(test)]
mod tests;
