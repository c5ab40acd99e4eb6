//! The lease of a lock held while a command runs: `spec.expiresAt` is kept one lease ahead,
//! renewed every third of it. Time is tokio's ([`Clock`] derives wall times), so tests pause it.

use std::time::Duration;

use k8s_openapi::jiff::{SignedDuration, Timestamp};
use tokio::sync::watch;
use tokio::time::Instant;

pub const DEFAULT_LEASE: Duration = Duration::from_secs(60);
pub const MIN_LEASE: Duration = Duration::from_secs(3);

#[derive(Clone, Copy, Debug)]
pub struct Clock {
    wall: Timestamp,
    at: Instant,
}

impl Clock {
    pub fn start() -> Clock {
        Clock {
            wall: Timestamp::now(),
            at: Instant::now(),
        }
    }

    /// Rounded up to the second, as `expiresAt` is written.
    pub fn wall(&self, instant: Instant) -> Timestamp {
        let offset = SignedDuration::try_from(instant.saturating_duration_since(self.at))
            .unwrap_or(SignedDuration::MAX);
        let at = self.wall.saturating_add(offset).unwrap_or(Timestamp::MAX);
        let second = at.as_second() + i64::from(at.subsec_nanosecond() > 0);
        Timestamp::from_second(second).unwrap_or(Timestamp::MAX)
    }
}

/// `Lost`: the lock is gone or was replaced; `Failed`: this try only.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RenewError {
    Lost(String),
    Failed(String),
}

pub trait Renew {
    fn renew(
        &mut self,
        expires_at: Timestamp,
    ) -> impl std::future::Future<Output = Result<(), RenewError>>;
}

/// What the lease has to say, for stderr.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Notice {
    Failing { left: Duration, why: String },
    Lapsed { why: String },
    Recovered,
    Lost(String),
}

fn retry(lease: Duration) -> Duration {
    (lease / 12).clamp(Duration::from_millis(250), Duration::from_secs(5))
}

/// Keeps the lease of the lock `created` announces, first written to expire at `expires`.
/// Returns only when the lock is lost: drop it to stop.
pub async fn keep<R: Renew + Clone>(
    lease: Duration,
    clock: Clock,
    mut expires: Instant,
    mut created: watch::Receiver<Option<R>>,
    mut notify: impl FnMut(Notice),
) -> String {
    let renewer = created.wait_for(Option::is_some).await.ok();
    let Some(mut renewer) = renewer.and_then(|r| r.clone()) else {
        // The sender is gone without a lock: nothing to renew, ever.
        return std::future::pending().await;
    };
    let period = lease / 3;
    let mut next = expires - lease + period;
    // Told Failing or Lapsed since the last success.
    let mut troubled = false;
    let mut lapsed = false;
    loop {
        tokio::time::sleep_until(next).await;
        let now = Instant::now();
        let until = now + lease;
        match renewer.renew(clock.wall(until)).await {
            Ok(()) => {
                expires = until;
                next = now + period;
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
                } else if left < period {
                    // About to run out: at least one more renewal failed before.
                    notify(Notice::Failing { left, why });
                    troubled = true;
                }
                next = now + retry(lease);
            }
        }
    }
}

#[cfg(test)]
mod tests;
