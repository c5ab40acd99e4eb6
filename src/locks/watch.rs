//! The single writer of the lock index for one kind: list (paged), then watch, forever.
//! Invariant: the index is `Live` only once a watch from the list's resourceVersion was answered;
//! any error makes it `Stale` at once, and every retry lists again before it watches. Retries back
//! off, to at most 30 s while lists fail; a repeated error is logged once.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use futures::{StreamExt, TryStreamExt};
use kube::api::{Api, DynamicObject, ListParams, WatchEvent, WatchParams};
use tracing::{debug, info, warn};

use super::index::{LockIndex, WatchState};
use super::liveness::Silence;
use super::parse;
use super::{LockKey, LockKind, LockRef};
use crate::metrics::{KindLabels, LockLabels, ModeLabels, SourceMetrics};
use crate::retry::{self, Backoff, LastError};

/// Objects per LIST page (client-go's default).
const PAGE_SIZE: u32 = 500;
/// The server ends each watch after this long; it is then resumed.
const WATCH_TIMEOUT_SECS: u32 = 290;
/// Longest silence before a watch stream is taken for dead and resumed: bookmarks come about
/// every minute (docs/design/lock-source.md).
const IDLE_LIMIT: Duration = Duration::from_secs(75);
/// The longest wait before trying again once the API server answered: the index is never older
/// than one retry. Only an unanswered list backs off further, to [`retry::MAX_WAIT`].
const LISTED_RETRY: Duration = Duration::from_secs(1);

/// The list-and-watch of one lock kind, the index's single writer.
pub(super) struct KindWatch {
    pub api: Api<DynamicObject>,
    pub kind: LockKind,
    pub index: Arc<LockIndex>,
    pub metrics: SourceMetrics,
    pub silence: Silence,
}

struct Failure {
    message: String,
    /// The API server answered (an error status): it is up.
    answered: bool,
}

impl Failure {
    fn from_kube(error: &kube::Error) -> Failure {
        Failure {
            // With its causes: `client error (Connect)` alone does not say "connection refused".
            message: retry::error_chain(error),
            answered: matches!(error, kube::Error::Api(_)),
        }
    }
}

impl KindWatch {
    pub fn api(client: kube::Client, kind: LockKind) -> Api<DynamicObject> {
        let resource = kind.api_resource();
        Api::all_with(client, &resource)
    }

    fn label(&self) -> &'static str {
        self.kind.as_str()
    }

    pub async fn run(mut self) {
        let mut backoff = retry::watch();
        self.publish_mode(WatchState::NotSynced);
        let mut unparseable: HashSet<LockKey> = HashSet::new();
        // The resourceVersion to resume from, and until when the index was known complete.
        let mut resume: Option<(String, Instant)> = None;
        let mut errors = LastError::default();
        loop {
            let (version, known_at) = match resume.take() {
                Some((version, known_at)) if known_at.elapsed() <= self.index.stale_after() => {
                    (version, known_at)
                }
                _ => match self.list(&mut unparseable).await {
                    Ok(version) => (version, Instant::now()),
                    Err(failure) => {
                        self.failed("list", &failure, &mut errors);
                        let mut wait = backoff.next().unwrap_or(retry::MAX_WAIT);
                        if failure.answered {
                            // Up, but refusing (RBAC not synced yet after a restart).
                            wait = wait.min(LISTED_RETRY);
                        }
                        self.silence.back_off(wait).await;
                        continue;
                    }
                },
            };
            let stream = match self.start_watch(&version, known_at).await {
                Ok(stream) => stream,
                Err(failure) => {
                    // Listed again on the next try: see the module docs. The list was
                    // answered, so the API server is up: at most a second, as the index is
                    // never older than one retry (an identity that may list but not watch).
                    self.failed("watch", &failure, &mut errors);
                    self.silence
                        .back_off(backoff.next().unwrap_or(retry::MAX_WAIT).min(LISTED_RETRY))
                        .await;
                    continue;
                }
            };
            // The watch may have come back after the bound: its catch-up would then serve old
            // state for a moment. List again instead.
            if known_at.elapsed() > self.index.stale_after() {
                continue;
            }
            self.transition(WatchState::Live, None);
            errors.clear();
            let opened = Instant::now();
            let (version, ended) = self.follow(stream, version, &mut unparseable).await;
            match ended {
                None => {
                    // A clean end: resume at once (the index stays trusted for the bound).
                    self.transition(
                        WatchState::Reconnecting,
                        Some("watch ended; resuming".into()),
                    );
                    resume = Some((version, Instant::now()));
                    if opened.elapsed() >= retry::HEALTHY_FOR {
                        backoff.reset();
                    } else {
                        let wait = backoff.next().unwrap_or(retry::MAX_WAIT).min(LISTED_RETRY);
                        tokio::select! {
                            () = tokio::time::sleep(wait) => {}
                            reason = self.silence.reported() => {
                                self.transition(WatchState::Stale, Some(reason));
                            }
                        }
                    }
                }
                Some(failure) => {
                    self.failed("watch", &failure, &mut errors);
                    if opened.elapsed() >= retry::HEALTHY_FOR {
                        backoff.reset();
                    }
                    self.silence
                        .back_off(backoff.next().unwrap_or(retry::MAX_WAIT).min(LISTED_RETRY))
                        .await;
                }
            }
        }
    }

    /// Lists every lock of the kind (paged) into the index; returns its resourceVersion.
    async fn list(&self, unparseable: &mut HashSet<LockKey>) -> Result<String, Failure> {
        let mut locks: Vec<LockRef> = Vec::new();
        let mut params = ListParams::default().limit(PAGE_SIZE);
        let version = loop {
            let page = self
                .api
                .list(&params)
                .await
                .map_err(|e| Failure::from_kube(&e))?;
            locks.extend(
                page.items
                    .iter()
                    .filter_map(|object| parse::lock_ref(self.kind, object)),
            );
            match page.metadata.continue_.filter(|c| !c.is_empty()) {
                Some(token) => params = params.continue_token(&token),
                None => break page.metadata.resource_version.unwrap_or_default(),
            }
        };
        if version.is_empty() {
            return Err(Failure {
                message: "the list carries no resourceVersion".into(),
                answered: true,
            });
        }
        let broken: HashSet<LockKey> = locks
            .iter()
            .filter(|l| l.problem.is_some())
            .map(LockRef::key)
            .collect();
        for gone in unparseable.difference(&broken) {
            self.forget_unparseable(gone);
        }
        for lock in locks.iter().filter(|l| l.problem.is_some()) {
            if !unparseable.contains(&lock.key()) {
                self.report_unparseable(lock);
            }
        }
        *unparseable = broken;
        let count = locks.len();
        let first = self.index.health(self.kind).state == WatchState::NotSynced;
        self.index.reset(self.kind, locks);
        if first {
            info!(kind = self.label(), locks = count, "lock index listed");
        } else {
            self.metrics
                .watch_restarts
                .get_or_create(&KindLabels { kind: self.label() })
                .inc();
            info!(
                kind = self.label(),
                locks = count,
                "lock index listed again"
            );
        }
        Ok(version)
    }

    /// Starts a watch; marks the index stale if that takes longer than the bound allows, or if
    /// the liveness probe fails meanwhile.
    async fn start_watch(
        &mut self,
        version: &str,
        known_at: Instant,
    ) -> Result<futures::stream::BoxStream<'static, kube::Result<WatchEvent<DynamicObject>>>, Failure>
    {
        let params = WatchParams::default().timeout(WATCH_TIMEOUT_SECS);
        let started = self.api.watch(&params, version);
        tokio::pin!(started);
        let deadline = tokio::time::Instant::from_std(known_at + self.index.stale_after());
        // Trusted until now (live or reconnecting): mark it stale when the bound passes, even if
        // it already has (the sleep then ends at once).
        let trusted = matches!(
            self.index.health(self.kind).state,
            WatchState::Live | WatchState::Reconnecting
        );
        let result = if trusted {
            tokio::select! {
                result = &mut started => result,
                () = tokio::time::sleep_until(deadline) => {
                    self.transition(WatchState::Stale, Some("the watch did not come back within kube.stale_after".into()));
                    started.await
                }
                reason = self.silence.reported() => {
                    self.transition(WatchState::Stale, Some(reason));
                    started.await
                }
            }
        } else {
            started.await
        };
        let stream = result.map_err(|e| Failure::from_kube(&e))?;
        // Answered: the API server spoke after any silence reported so far.
        self.silence.heard();
        Ok(stream.boxed())
    }

    /// Applies events until the stream ends (`None`) or fails; returns the last resourceVersion.
    async fn follow(
        &mut self,
        mut stream: futures::stream::BoxStream<'static, kube::Result<WatchEvent<DynamicObject>>>,
        mut version: String,
        unparseable: &mut HashSet<LockKey>,
    ) -> (String, Option<Failure>) {
        let idle = IDLE_LIMIT;
        let label = KindLabels { kind: self.label() };
        loop {
            let next = tokio::select! {
                next = tokio::time::timeout(idle, stream.try_next()) => next,
                message = self.silence.reported() => {
                    return (version, Some(Failure { message, answered: false }));
                }
            };
            let event = match next {
                Err(_) | Ok(Ok(None)) => return (version, None),
                Ok(Err(error)) => return (version, Some(Failure::from_kube(&error))),
                Ok(Ok(Some(event))) => event,
            };
            self.metrics.watch_events.get_or_create(&label).inc();
            match event {
                WatchEvent::Added(object) | WatchEvent::Modified(object) => {
                    if let Some(v) = object.metadata.resource_version.clone() {
                        version = v;
                    }
                    let Some(lock) = parse::lock_ref(self.kind, &object) else {
                        continue;
                    };
                    let key = lock.key();
                    if lock.problem.is_some() {
                        if unparseable.insert(key) {
                            self.report_unparseable(&lock);
                        }
                    } else if unparseable.remove(&key) {
                        self.forget_unparseable(&key);
                    }
                    debug!(kind = self.label(), lock = %lock, "lock applied");
                    self.index.apply(self.kind, lock);
                }
                WatchEvent::Deleted(object) => {
                    if let Some(v) = object.metadata.resource_version.clone() {
                        version = v;
                    }
                    let key = LockKey {
                        namespace: object.metadata.namespace.clone(),
                        name: object.metadata.name.clone().unwrap_or_default(),
                    };
                    if unparseable.remove(&key) {
                        self.forget_unparseable(&key);
                    }
                    debug!(kind = self.label(), lock = %key, "lock deleted");
                    self.index
                        .delete(self.kind, key.index_namespace(), &key.name);
                }
                WatchEvent::Bookmark(bookmark) => version = bookmark.metadata.resource_version,
                WatchEvent::Error(status) => {
                    let failure = Failure {
                        message: format!("{} ({}): {}", status.code, status.reason, status.message),
                        answered: true,
                    };
                    return (version, Some(failure));
                }
            }
        }
    }

    fn failed(&self, what: &str, failure: &Failure, errors: &mut LastError) {
        self.metrics
            .watch_restarts
            .get_or_create(&KindLabels { kind: self.label() })
            .inc();
        let reason = format!("{what} failed: {}", failure.message);
        // A failure that repeats (an identity that may not watch, an API server that is down)
        // is logged once, not per retry.
        if errors.is_new(&reason) {
            warn!(kind = self.label(), error = %failure.message, "lock {what} failed; retrying with backoff");
        } else {
            debug!(kind = self.label(), error = %failure.message, "lock {what} failed again; retrying");
        }
        self.transition(WatchState::Stale, Some(reason));
    }

    /// Sets the state; logs and publishes the mode when lookups change source.
    fn transition(&self, state: WatchState, reason: Option<String>) {
        let Some(previous) = self.index.set_state(self.kind, state, reason.clone()) else {
            return;
        };
        let was_watch = matches!(previous.state, WatchState::Live | WatchState::Reconnecting);
        let is_watch = matches!(state, WatchState::Live | WatchState::Reconnecting);
        if was_watch == is_watch {
            return;
        }
        self.publish_mode(state);
        let stale_after = self.index.stale_after();
        if is_watch {
            info!(
                kind = self.label(),
                "lock index live: lookups answered from the watch"
            );
        } else {
            warn!(
                kind = self.label(),
                reason = reason.as_deref().unwrap_or("-"),
                ?stale_after,
                "lock index stale: lookups LIST the API server until the watch is back"
            );
        }
    }

    fn publish_mode(&self, state: WatchState) {
        let watch = matches!(state, WatchState::Live | WatchState::Reconnecting);
        for (mode, on) in [("watch", watch), ("fallback", !watch)] {
            self.metrics
                .mode
                .get_or_create(&ModeLabels {
                    kind: self.label(),
                    mode,
                })
                .set(i64::from(on));
        }
        let now = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX));
        self.metrics
            .mode_since
            .get_or_create(&KindLabels { kind: self.label() })
            .set(now);
    }

    fn report_unparseable(&self, lock: &LockRef) {
        warn!(
            lock = %lock,
            problem = lock.problem.as_deref().unwrap_or("-"),
            "lock spec cannot be read; it fails closed on its name until fixed"
        );
        self.metrics
            .unparseable_locks
            .get_or_create(&LockLabels {
                kind: self.label(),
                namespace: lock.namespace.clone().unwrap_or_default(),
                name: lock.name.clone(),
            })
            .set(1);
    }

    fn forget_unparseable(&self, key: &LockKey) {
        self.metrics.unparseable_locks.remove(&LockLabels {
            kind: self.label(),
            namespace: key.index_namespace().to_owned(),
            name: key.name.clone(),
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_silent_watch_is_dropped_after_the_idle_limit() {
        let config = kube::Config::new("http://127.0.0.1:9".parse().expect("url"));
        let client = kube::Client::try_from(config).expect("client");
        let mut watch = KindWatch {
            api: KindWatch::api(client, LockKind::Lock),
            kind: LockKind::Lock,
            index: Arc::new(LockIndex::new(Duration::from_secs(3))),
            metrics: SourceMetrics::default(),
            silence: Silence::never(),
        };
        let started = tokio::time::Instant::now();
        let silent = futures::stream::pending().boxed();
        let (version, ended) = watch.follow(silent, "42".into(), &mut HashSet::new()).await;
        assert_eq!(version, "42");
        assert!(ended.is_none(), "a clean end: resumed at once");
        let waited = started.elapsed();
        assert!(
            waited >= IDLE_LIMIT && waited < IDLE_LIMIT + Duration::from_secs(1),
            "{waited:?}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_probe_failure_ends_a_silent_watch_long_before_the_idle_limit() {
        let config = kube::Config::new("http://127.0.0.1:9".parse().expect("url"));
        let client = kube::Client::try_from(config).expect("client");
        let (report, silence) = Silence::manual();
        let mut watch = KindWatch {
            api: KindWatch::api(client, LockKind::Lock),
            kind: LockKind::Lock,
            index: Arc::new(LockIndex::new(Duration::from_secs(3))),
            metrics: SourceMetrics::default(),
            silence,
        };
        let started = tokio::time::Instant::now();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_secs(2)).await;
            report.send_replace("liveness probe: no answer".into());
            // Kept until the end, so that the handle does not take a dropped probe for quiet.
            std::future::pending::<()>().await;
        });
        let silent = futures::stream::pending().boxed();
        let (version, ended) = watch.follow(silent, "42".into(), &mut HashSet::new()).await;
        assert_eq!(version, "42");
        let failure = ended.expect("a failure: listed again");
        assert_eq!(failure.message, "liveness probe: no answer");
        assert!(started.elapsed() < IDLE_LIMIT, "{:?}", started.elapsed());
    }
}
