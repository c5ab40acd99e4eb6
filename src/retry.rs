//! Retry delays and the logging rule of every retry loop. Invariant: a loop retries within a
//! second for [`GRACE`], then backs off to [`MAX_WAIT`] (backon's jittered exponential behind
//! kube-runtime's resettable [`Backoff`]); a watcher's backoff is reset only once its stream has
//! been healthy for [`HEALTHY_FOR`], since kube-runtime resets it on every event, `Init` included.

use std::time::Duration;

use tokio::time::Instant;

use kube::runtime::watcher::ExponentialBackoff;

/// The longest wait between two tries, jitter included.
pub const MAX_WAIT: Duration = Duration::from_secs(30);
/// Watch delays within [`GRACE`]: at most a second with jitter.
const WATCH_MIN: Duration = Duration::from_millis(50);
const WATCH_MAX: Duration = Duration::from_millis(500);
const SLOW_MIN: Duration = Duration::from_secs(1);
pub(crate) const SLOW_MAX: Duration = Duration::from_secs(15);
/// The liveness probe's cap past [`GRACE`]: it wakes every other loop, so it stays within seconds.
const PROBE_MAX: Duration = Duration::from_millis(2500);
/// How long a loop keeps retrying fast (a restart on a loaded host can take 20 s).
pub const GRACE: Duration = Duration::from_secs(30);
/// The longest wait before retrying a failed write.
pub const MAX_WRITE_WAIT: Duration = MAX_WAIT;
/// How long a watch must have run without an error before its backoff starts over.
pub const HEALTHY_FOR: Duration = Duration::from_secs(1);

pub use kube::runtime::utils::Backoff;

fn exponential(min: Duration, max: Duration) -> ExponentialBackoff {
    ExponentialBackoff::from(
        backon::ExponentialBuilder::default()
            .with_min_delay(min)
            .with_max_delay(max)
            .with_factor(2.0)
            .with_jitter()
            .without_max_times(),
    )
}

/// The retry delays of a watch loop that resets them itself (after [`HEALTHY_FOR`]).
pub fn watch() -> Patient<ExponentialBackoff> {
    Patient {
        fast: exponential(WATCH_MIN, WATCH_MAX),
        slow: exponential(SLOW_MIN, SLOW_MAX),
        failing_since: None,
    }
}

/// The delays of a probe sent every `period`: `period` for [`GRACE`], then up to `PROBE_MAX`.
pub fn probe(period: Duration) -> Patient<ExponentialBackoff> {
    Patient {
        fast: ExponentialBackoff::from(
            backon::ExponentialBuilder::default()
                .with_min_delay(period)
                .with_max_delay(period)
                .with_factor(1.0)
                .without_max_times(),
        ),
        slow: exponential(SLOW_MIN, PROBE_MAX),
        failing_since: None,
    }
}

/// Delays that are `fast` for [`GRACE`] after the first failure, then slow; a reset starts over.
pub struct Patient<B> {
    fast: B,
    slow: ExponentialBackoff,
    failing_since: Option<Instant>,
}

impl<B: Backoff> Iterator for Patient<B> {
    type Item = Duration;

    fn next(&mut self) -> Option<Duration> {
        let since = *self.failing_since.get_or_insert_with(Instant::now);
        if since.elapsed() < GRACE {
            self.fast.next()
        } else {
            self.slow.next()
        }
    }
}

impl<B: Backoff> Backoff for Patient<B> {
    fn reset(&mut self) {
        self.failing_since = None;
        self.fast.reset();
        self.slow.reset();
    }
}

/// The retry delays of a kube-runtime watcher (`.backoff(retry::watcher())`).
pub fn watcher() -> Steady<Patient<ExponentialBackoff>> {
    Steady {
        backoff: watch(),
        healthy_since: None,
    }
}

/// A backoff whose `reset` takes effect only if no failure came within [`HEALTHY_FOR`] of it.
pub struct Steady<B> {
    backoff: B,
    healthy_since: Option<Instant>,
}

impl<B: Backoff> Iterator for Steady<B> {
    type Item = Duration;

    fn next(&mut self) -> Option<Duration> {
        if self
            .healthy_since
            .take()
            .is_some_and(|since| since.elapsed() >= HEALTHY_FOR)
        {
            self.backoff.reset();
        }
        self.backoff.next()
    }
}

impl<B: Backoff> Backoff for Steady<B> {
    fn reset(&mut self) {
        self.healthy_since.get_or_insert_with(Instant::now);
    }
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

/// The wait after a write's `attempt`th failure (from 1), for loops counting per object.
pub fn write_delay(first: Duration, attempt: u32) -> Duration {
    let nth = attempt.saturating_sub(1) as usize;
    write(first).nth(nth).unwrap_or(MAX_WRITE_WAIT)
}

/// Whether the API server refused the request (403, 404): a hint about RBAC helps.
pub fn is_refusal(error: &kube::Error) -> bool {
    matches!(error, kube::Error::Api(status) if status.code == 403 || status.code == 404)
}

/// [`is_refusal`] for an error of kube-runtime's watcher.
pub fn watcher_refusal(error: &kube::runtime::watcher::Error) -> bool {
    use kube::runtime::watcher::Error;
    match error {
        Error::InitialListFailed(e) | Error::WatchStartFailed(e) | Error::WatchFailed(e) => {
            is_refusal(e)
        }
        Error::WatchError(status) => status.code == 403 || status.code == 404,
        Error::NoResourceVersion => false,
    }
}

/// The errors of a retry loop since its last success: each is logged once at warn, its repeats
/// at debug, even when two errors take turns.
#[derive(Debug, Default)]
pub struct LastError(Vec<String>);

const REMEMBERED: usize = 8;

impl LastError {
    /// Records `error`; true when it was not seen since the last success (log it).
    pub fn is_new(&mut self, error: &str) -> bool {
        if self.0.iter().any(|seen| seen == error) {
            return false;
        }
        if self.0.len() == REMEMBERED {
            self.0.remove(0);
        }
        self.0.push(error.to_owned());
        true
    }

    pub fn clear(&mut self) {
        self.0.clear();
    }
}

/// An error and its causes on one line, each said once (a message that already prints its
/// source does not get it twice).
pub fn error_chain(error: &(dyn std::error::Error + 'static)) -> String {
    let mut line = error.to_string();
    let mut cause = error.source();
    while let Some(next) = cause {
        let text = next.to_string();
        if !text.is_empty() && !line.contains(&text) {
            line.push_str(": ");
            line.push_str(&text);
        }
        cause = next.source();
    }
    line
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("cannot read locks directory /x: {0}")]
    struct Dir(#[source] std::io::Error);

    #[test]
    fn each_cause_is_said_once() {
        let io = || std::io::Error::from(std::io::ErrorKind::NotFound);
        let inner = anyhow::Error::new(Dir(io())).context("cannot start the webhook");
        assert_eq!(
            error_chain(inner.as_ref()),
            format!(
                "cannot start the webhook: cannot read locks directory /x: {}",
                io()
            )
        );
    }

    #[tokio::test(start_paused = true)]
    async fn watch_retries_stay_under_a_second_for_the_grace_then_grow_to_half_a_minute() {
        for _ in 0..20 {
            let mut backoff = watch();
            let mut waited = Duration::ZERO;
            let mut fast = Vec::new();
            while waited < GRACE {
                let wait = backoff.next().expect("forever");
                fast.push(wait);
                tokio::time::advance(wait).await;
                waited += wait;
            }
            assert!(fast[0] < Duration::from_millis(101), "{fast:?}");
            assert!(
                fast.iter().all(|w| *w <= Duration::from_secs(1)),
                "{fast:?}"
            );
            let slow: Vec<Duration> = (&mut backoff).take(12).collect();
            assert!(slow.iter().all(|w| *w <= MAX_WAIT), "{slow:?}");
            // Past the cap, jitter still spreads the tries out; a minute sees at most 4 tries.
            assert!(slow[5..].iter().all(|w| *w >= SLOW_MAX), "{slow:?}");
            backoff.reset();
            assert!(backoff.next().expect("forever") < Duration::from_millis(101));
        }
    }

    /// The probe notices a returning API server within seconds however long it was away, and
    /// still tries at most 20 times a minute once past the grace.
    #[tokio::test(start_paused = true)]
    async fn the_probe_backs_off_to_seconds_not_half_a_minute() {
        let period = Duration::from_millis(500);
        let mut backoff = probe(period);
        let mut waited = Duration::ZERO;
        while waited < GRACE {
            let wait = backoff.next().expect("forever");
            assert_eq!(wait, period);
            tokio::time::advance(wait).await;
            waited += wait;
        }
        let slow: Vec<Duration> = (&mut backoff).take(30).collect();
        assert!(slow.iter().all(|w| *w <= 2 * PROBE_MAX), "{slow:?}");
        assert!(
            slow[3..].iter().all(|w| *w >= Duration::from_secs(2)),
            "{slow:?}"
        );
        assert!(slow.iter().all(|w| *w < SLOW_MAX), "{slow:?}");
    }

    /// kube-runtime's watcher resets the backoff on its `Init` event, which comes right before
    /// each re-list: that reset must not start the delays over, or a refused list is retried
    /// every 50 ms forever.
    #[tokio::test(start_paused = true)]
    async fn a_reset_right_before_a_failure_does_not_start_the_delays_over() {
        let mut backoff = watcher();
        let first = backoff.next().expect("forever");
        for _ in 0..10 {
            backoff.reset(); // Init
            let wait = backoff.next().expect("forever"); // the list that follows fails
            tokio::time::advance(wait).await;
        }
        backoff.reset();
        let later = backoff.next().expect("forever");
        assert!(later >= WATCH_MAX, "{first:?} then {later:?}");
        // A stream healthy for a while does start over.
        backoff.reset();
        tokio::time::advance(HEALTHY_FOR).await;
        let after_health = backoff.next().expect("forever");
        assert!(
            after_health < Duration::from_millis(101),
            "{after_health:?}"
        );
    }

    /// The integration the policy is for: kube-runtime's watcher, backed off with [`watcher`],
    /// against an address that accepts and closes every connection (an API server that is not
    /// up). Its `Init` before each re-list must not reset the delays: in 3 s, 50 ms doubling is
    /// 6 tries (a dozen connections with the client's own retries), where a reset each time
    /// would be about 60.
    #[tokio::test]
    async fn a_watcher_against_a_server_that_is_down_backs_off() {
        use futures::StreamExt;
        use kube::runtime::{WatchStreamExt, watcher as kw};
        use std::sync::atomic::{AtomicUsize, Ordering};

        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let url = format!("http://{}", listener.local_addr().expect("addr"));
        let accepts = std::sync::Arc::new(AtomicUsize::new(0));
        let counted = accepts.clone();
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                counted.fetch_add(1, Ordering::Relaxed);
                drop(stream);
            }
        });
        let client =
            kube::Client::try_from(kube::Config::new(url.parse().expect("url"))).expect("client");
        let api: kube::Api<k8s_openapi::api::core::v1::ConfigMap> = kube::Api::all(client);
        let mut events = kw::watcher(api, kw::Config::default())
            .backoff(watcher())
            .boxed();
        let (mut errors, mut inits) = (0, 0);
        let _ = tokio::time::timeout(Duration::from_secs(3), async {
            while let Some(event) = events.next().await {
                match event {
                    Ok(kw::Event::Init) => inits += 1,
                    Ok(_) => {}
                    Err(_) => errors += 1,
                }
            }
        })
        .await;
        let accepts = accepts.load(Ordering::Relaxed);
        assert!(
            errors >= 2 && inits >= 2,
            "{errors} errors, {inits} re-lists"
        );
        assert!(
            accepts <= 20,
            "{accepts} connections in 3 s ({errors} errors)"
        );
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
        assert!(
            !last.is_new("403"),
            "two errors taking turns are each logged once"
        );
        assert!(!last.is_new("connection refused"));
        last.clear();
        assert!(last.is_new("403"), "after a success");
    }
}
