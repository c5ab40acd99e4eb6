//! Retry delays and the logging rule of every retry loop, in one place.
//!
//! Two shapes of retry exist here: a watch on Locks (or on the webhook configuration) that must
//! come back within a second of the API server being ready again, and a write that may back off
//! to half a minute. Both are backon's exponential backoff behind kube-runtime's resettable
//! [`Backoff`] wrapper, so a loop resets it on success and takes `next()` on failure.

use std::time::Duration;

use kube::runtime::watcher::ExponentialBackoff;

/// The longest wait between two tries of a watch, jitter included.
pub const MAX_WAIT: Duration = Duration::from_secs(1);
/// Watch delays: from 50 ms, doubling, capped at 500 ms before jitter; the jitter adds up to as
/// much again, so no wait is longer than [`MAX_WAIT`].
const WATCH_MIN: Duration = Duration::from_millis(50);
pub(crate) const WATCH_MAX: Duration = Duration::from_millis(500);
/// The longest wait before retrying a failed write.
pub const MAX_WRITE_WAIT: Duration = Duration::from_secs(30);

pub use kube::runtime::utils::Backoff;

/// The retry delays of every watch: at most [`MAX_WAIT`], jitter included, so that a restarted
/// API server is watched again within a second of being ready, not after kube-runtime's default
/// of up to 30 s.
pub fn watch() -> ExponentialBackoff {
    ExponentialBackoff::from(
        backon::ExponentialBuilder::default()
            .with_min_delay(WATCH_MIN)
            .with_max_delay(WATCH_MAX)
            .with_factor(2.0)
            .with_jitter()
            .without_max_times(),
    )
}

/// The retry delays of a write: from `first`, doubling, at most [`MAX_WRITE_WAIT`].
pub fn write(first: Duration) -> ExponentialBackoff {
    ExponentialBackoff::from(
        backon::ExponentialBuilder::default()
            .with_min_delay(first)
            .with_max_delay(MAX_WRITE_WAIT)
            .with_factor(2.0)
            .without_max_times(),
    )
}

/// The wait before try number `attempt` + 1 of a write that failed `attempt` times (from 1):
/// for loops that keep a count per object rather than a backoff.
pub fn write_delay(first: Duration, attempt: u32) -> Duration {
    let nth = attempt.saturating_sub(1) as usize;
    write(first).nth(nth).unwrap_or(MAX_WRITE_WAIT)
}

/// The last error of a retry loop, so that a failure repeated on every retry is logged once
/// (at warn), and its repeats at debug; a different error, or the same one after a success,
/// counts as new again.
#[derive(Debug, Default)]
pub struct LastError(Option<String>);

impl LastError {
    /// Records `error`; true when it differs from the one before (log it).
    pub fn is_new(&mut self, error: &str) -> bool {
        if self.0.as_deref() == Some(error) {
            return false;
        }
        self.0 = Some(error.to_owned());
        true
    }

    /// The loop succeeded: the next error is new, whatever it is.
    pub fn clear(&mut self) {
        self.0 = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_watch_retry_waits_longer_than_a_second_jitter_included() {
        for _ in 0..20 {
            let waits: Vec<Duration> = watch().take(40).collect();
            assert_eq!(waits.len(), 40, "retries forever");
            assert!(waits[0] < Duration::from_millis(101), "{waits:?}");
            assert!(waits.iter().all(|w| *w <= MAX_WAIT), "{waits:?}");
            // Past the cap, jitter still spreads the tries out.
            assert!(waits[10..].iter().all(|w| *w >= WATCH_MAX), "{waits:?}");
        }
    }

    #[test]
    fn write_retries_double_to_half_a_minute_and_start_over_after_a_reset() {
        let mut backoff = write(Duration::from_millis(250));
        let waits: Vec<Duration> = (&mut backoff).take(9).collect();
        let ms: Vec<u128> = waits.iter().map(Duration::as_millis).collect();
        assert_eq!(ms, [250, 500, 1000, 2000, 4000, 8000, 16000, 30000, 30000]);
        backoff.reset();
        assert_eq!(backoff.next(), Some(Duration::from_millis(250)));
    }

    #[test]
    fn write_delay_by_attempt() {
        let second = Duration::from_secs(1);
        let secs: Vec<u64> = (1..=7)
            .map(|attempt| write_delay(second, attempt).as_secs())
            .collect();
        assert_eq!(secs, [1, 2, 4, 8, 16, 30, 30]);
    }

    #[test]
    fn an_error_repeated_on_every_retry_is_new_once() {
        let mut last = LastError::default();
        assert!(last.is_new("403"));
        assert!(!last.is_new("403"));
        assert!(last.is_new("connection refused"));
        assert!(last.is_new("403"), "a different error came between");
        last.clear();
        assert!(last.is_new("403"), "after a success");
    }
}
