//! The status writer: one task per instance that keeps this instance's part of every lock's
//! status in line with the lock view ([`super::view`]), with server-side apply under the
//! instance's own field manager, only when the result changes.

use std::collections::{BTreeSet, HashMap};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Patch, PatchParams};
use tokio::sync::watch;
use tokio::time::Instant;
use tracing::{debug, info, warn};

use super::enforcement::{Applied, Coverage, Desired, desired, needs_write};
use super::{FIELD_MANAGER_PREFIX, LockSnapshot, NamespaceLabels};
use crate::api::LockKey;
use crate::locks::LockRef;
use crate::locks::index::{self, Change, Sets};
use crate::metrics::{EnforcementMetrics, OutcomeLabels};
use crate::registration::Registered;
use crate::retry::{self, LastError};

const CONCURRENT_WRITES: usize = 8;
/// Writes started by one pass at most, so that a first start with thousands of Locks does not
/// keep a new Lock waiting.
const WRITES_PER_PASS: usize = 64;
/// Then doubling ([`retry::write_delay`]).
const FIRST_RETRY: Duration = Duration::from_secs(1);

/// What the status writer remembers of one lock, dropped when the lock goes.
#[derive(Default)]
struct Book {
    applied: Option<Applied>,
    /// When a failed write is tried again, and how many failed in a row.
    retry: Option<(Instant, u32)>,
    /// When `expiresAt` passes (just after), if still to come.
    expires: Option<Instant>,
}

/// Keeps this instance's part of every lock's status in line with `snapshots` until `stop`
/// completes, then withdraws it (as when the source is unhealthy) and returns. `registered`:
/// what the configuration this instance keeps names; `namespaces`: the labels its
/// `namespaceSelector` selects by; `None` without one.
pub async fn run(
    client: kube::Client,
    instance: String,
    mut snapshots: watch::Receiver<LockSnapshot>,
    mut registered: Option<watch::Receiver<Registered>>,
    mut namespaces: Option<watch::Receiver<NamespaceLabels>>,
    metrics: EnforcementMetrics,
    stop: impl Future<Output = ()>,
) {
    let keeps_registration = registered.is_some();
    let (mut confirmed, mut labels) = (Registered::default(), NamespaceLabels::default());
    let mut stop = std::pin::pin!(stop);
    let (mut stopping, mut due, mut every_lock) = (false, false, true);
    let manager = format!("{FIELD_MANAGER_PREFIX}{instance}");
    let mut books: HashMap<LockKey, Book> = HashMap::new();
    let mut was_healthy = None;
    let mut errors = LastError::default();
    // A pass looks only at the locks in `todo`: changed since the last pass, or due (retry,
    // expiry), or all of them (registration, health, stopping).
    let mut todo: BTreeSet<LockKey> = BTreeSet::new();
    let mut seen = Sets::new();
    loop {
        let mut snapshot = snapshots.borrow_and_update().clone();
        // Copied only when one changed (`every_lock`), which is rare: O(locks).
        if every_lock {
            if let Some(registered) = &mut registered {
                confirmed = registered.borrow_and_update().clone();
            }
            if let Some(namespaces) = &mut namespaces {
                labels = namespaces.borrow_and_update().clone();
            }
        }
        snapshot.healthy &= !stopping;
        if was_healthy != Some(snapshot.healthy) {
            info!(%instance, healthy = snapshot.healthy, locks = snapshot.locks().count(),
                "lock status: {}", if snapshot.healthy { "marking locks enforced" } else { "lock source unhealthy; withdrawing this instance from lock status" });
            was_healthy = Some(snapshot.healthy);
            every_lock = true;
        }
        let (now, clock) = (Timestamp::now(), Instant::now());
        for change in index::diff(&seen, &snapshot.sets) {
            match change {
                Change::Put(lock, old) if old != Some(lock) => {
                    todo.insert(lock.key());
                }
                Change::Put(..) => {}
                Change::Gone(lock) => {
                    books.remove(&lock.key());
                    todo.remove(&lock.key());
                }
            }
        }
        seen = snapshot.sets.clone();
        if std::mem::take(&mut every_lock) {
            todo.extend(snapshot.locks().map(LockRef::key));
        }
        if std::mem::take(&mut due) {
            let due = books.iter().filter(|(_, book)| {
                book.retry.is_some_and(|(at, _)| at <= clock)
                    || book.expires.is_some_and(|at| at <= clock)
            });
            todo.extend(due.map(|(key, _)| key.clone()));
        }
        let registration = keeps_registration.then_some(&confirmed);
        let mut writes = Vec::new();
        while writes.len() < WRITES_PER_PASS
            && let Some(key) = todo.pop_first()
        {
            let Some(lock) = snapshot.get(&key) else {
                continue;
            };
            let book = books.entry(key).or_default();
            if let Some(write) = &mut book.applied
                && lock.meta.resource_version == write.version
            {
                write.echoed = true;
            }
            // Not due yet: the retry's wake-up brings it back.
            if book.retry.is_some_and(|(at, _)| at > clock) {
                continue;
            }
            book.expires = (lock.spec.expires_at.as_ref())
                .filter(|at| at.0 > now)
                .map(|at| {
                    clock + at.0.duration_since(now).unsigned_abs() + Duration::from_millis(1)
                });
            let coverage = Coverage::of(registration, &labels, lock);
            let want = desired(lock, snapshot.healthy, &coverage, &instance, now);
            if needs_write(lock, &want, &instance, book.applied.as_ref()) {
                writes.push(write(&client, &manager, lock.clone(), want));
            } else {
                // What failed is no longer wanted (a withdrawal, healthy again): a retry left
                // due would wake every pass at once.
                book.retry = None;
            }
        }
        let results: Vec<_> = futures::stream::iter(writes)
            .buffer_unordered(CONCURRENT_WRITES)
            .collect()
            .await;
        // One line per pass, not per lock: a missing permission fails every lock at once.
        let (mut failed, mut first) = (0usize, None);
        for (lock, want, result) in results {
            let outcome = match &result {
                Ok(_) => "success",
                Err(kube::Error::Api(s)) if s.code == 403 => "forbidden",
                Err(kube::Error::Api(s)) if s.code == 404 => "not_found",
                Err(kube::Error::Api(s)) if s.code == 409 => "conflict",
                Err(_) => "error",
            };
            (metrics
                .status_writes
                .get_or_create(&OutcomeLabels { outcome }))
            .inc();
            let book = books.entry(lock.key()).or_default();
            match result {
                Ok(version) => {
                    errors.clear();
                    debug!(lock = %lock.key(), enforced = want.entry.is_some(), count = want.count, "lock status written");
                    book.retry = None;
                    book.applied = Some(Applied::new(want, version));
                }
                // Deleted meanwhile: the watch will drop it.
                Err(kube::Error::Api(s)) if s.code == 404 => {}
                Err(error) => {
                    let attempts = book.retry.map_or(1, |(_, attempts)| attempts + 1);
                    let delay = retry::write_delay(FIRST_RETRY, attempts);
                    book.retry = Some((Instant::now() + delay, attempts));
                    failed += 1;
                    first.get_or_insert_with(|| {
                        let chain = retry::error_chain(&error);
                        (
                            format!("{}: {chain}", lock.key()),
                            chain,
                            retry::is_refusal(&error),
                        )
                    });
                }
            }
        }
        // Once per distinct error until a write succeeds; its repeats at debug.
        if let Some((first, error, refused)) = first {
            if !errors.is_new(&error) {
                debug!(failed, %first, "cannot write lock status, again");
            } else if refused {
                warn!(failed, %first,
                    "cannot write lock status (the webhook's identity needs patch on locks/status and clusterlocks/status); retrying with backoff");
            } else {
                warn!(failed, %first, "cannot write lock status; retrying with backoff");
            }
        }
        if !todo.is_empty() {
            continue;
        }
        if stopping {
            return;
        }
        // An expiry passed behind a pending retry is taken up at the retry.
        let wake = (books.values())
            .flat_map(|b| {
                (b.expires.filter(|at| *at > clock))
                    .into_iter()
                    .chain(b.retry.map(|r| r.0))
            })
            .min();
        tokio::select! {
            next = snapshots.changed() => if next.is_err() { return },
            alive = changed(&mut registered) => if alive {
                every_lock = true;
            } else {
                // The configuration keeper stopped: what it last confirmed stays true.
                registered = None;
            },
            alive = changed(&mut namespaces) => if alive {
                every_lock = true;
            } else {
                // The namespace watch stopped: the labels it last showed stay true.
                namespaces = None;
            },
            () = tokio::time::sleep_until(wake.unwrap_or(clock)), if wake.is_some() => due = true,
            () = &mut stop => {
                info!(%instance, "stopping: withdrawing this instance from lock status");
                stopping = true;
                every_lock = true;
                books.values_mut().for_each(|book| book.retry = None);
            }
        }
    }
}

/// `true` when the channel publishes, `false` when its sender is gone; never without a channel.
async fn changed<T>(channel: &mut Option<watch::Receiver<T>>) -> bool {
    match channel {
        Some(channel) => channel.changed().await.is_ok(),
        None => std::future::pending().await,
    }
}

/// Applies `want` to the status of `lock`; the result is the new resourceVersion.
async fn write(
    client: &kube::Client,
    manager: &str,
    lock: LockRef,
    want: Desired,
) -> (LockRef, Desired, Result<String, kube::Error>) {
    let key = lock.key();
    let params = PatchParams::apply(manager);
    let (params, patch) = if want.clears() {
        let clearing = Desired::clearing(&lock.meta.resource_version);
        (params, Patch::Merge(clearing))
    } else {
        // force: enforcedCount and the condition are shared with the other instances, which
        // write the same values; during a change they may briefly disagree.
        (params.force(), Patch::Apply(want.apply_config(&key)))
    };
    let written = key
        .api(client.clone())
        .patch_status(&key.name, &params, &patch)
        .await;
    let version = written.map(|object| object.metadata.resource_version.unwrap_or_default());
    (lock, want, version)
}
