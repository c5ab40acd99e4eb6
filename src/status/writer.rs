//! The status writer: one task per instance that keeps this instance's part of every lock's
//! status in line with the lock view ([`super::view`]), with server-side apply under the
//! instance's own field manager, only when the result changes.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Patch, PatchParams};
use tokio::sync::watch;
use tokio::time::Instant;
use tracing::{debug, info, warn};

use super::enforcement::{Applied, Coverage, Desired, desired, needs_write};
use super::{FIELD_MANAGER_PREFIX, KnownLock, LockSnapshot, NamespaceLabels};
use crate::api::LockKey;
use crate::metrics::{EnforcementMetrics, OutcomeLabels};
use crate::registration::Registered;
use crate::retry::{self, LastError};

const CONCURRENT_WRITES: usize = 8;
/// Writes started by one pass at most, so that a first start with thousands of Locks does not
/// keep a new Lock waiting.
const WRITES_PER_PASS: usize = 64;
/// Then doubling ([`retry::write_delay`]).
const FIRST_RETRY: Duration = Duration::from_secs(1);

/// What a lock's enforcement depends on besides the lock: the configuration this instance
/// keeps (what it names, and the labels its `namespaceSelector` selects by); `None` without one.
#[derive(Default)]
pub struct DecisionInputs {
    pub registered: Option<watch::Receiver<Registered>>,
    pub namespaces: Option<watch::Receiver<NamespaceLabels>>,
}

#[derive(Debug)]
struct Retry {
    at: Instant,
    attempts: u32,
}

/// What the status writer remembers of one lock, dropped when the lock goes.
#[derive(Default)]
struct Book {
    applied: Option<Applied>,
    retry: Option<Retry>,
    /// The resourceVersion and health its status was last computed from.
    computed: Option<(String, bool)>,
    expires: Option<Timestamp>,
}

/// Keeps this instance's part of every lock's status in line with `snapshots` and `inputs`
/// until `stop` completes, then withdraws it (as when the source is unhealthy) and returns.
pub async fn run(
    client: kube::Client,
    instance: String,
    mut snapshots: watch::Receiver<LockSnapshot>,
    inputs: DecisionInputs,
    metrics: EnforcementMetrics,
    stop: impl Future<Output = ()>,
) {
    let DecisionInputs {
        mut registered,
        mut namespaces,
    } = inputs;
    let keeps_registration = registered.is_some();
    let mut confirmed = Registered::default();
    let mut labels = NamespaceLabels::default();
    let mut relabelled = false;
    let mut stop = std::pin::pin!(stop);
    let mut stopping = false;
    let manager = format!("{FIELD_MANAGER_PREFIX}{instance}");
    let mut books: HashMap<LockKey, Book> = HashMap::new();
    let mut was_healthy = None;
    let mut errors = LastError::default();
    // A pass looks only at the locks in `todo`: changed since the last pass, or due (retry,
    // expiry). `true`: compute even if the lock did not change (registration, time, stopping).
    let mut todo: BTreeMap<LockKey, bool> = BTreeMap::new();
    let mut seen: imbl::OrdMap<LockKey, Arc<KnownLock>> = imbl::OrdMap::new();
    let mut due = false;
    let mut every_lock = true;
    loop {
        let mut snapshot = snapshots.borrow_and_update().clone();
        // Copied only when it changed (`every_lock`): O(locks).
        if let Some(registered) = &mut registered
            && every_lock
        {
            confirmed = registered.borrow_and_update().clone();
        }
        let mut touched = BTreeSet::new();
        if let Some(namespaces) = &mut namespaces
            && (std::mem::take(&mut relabelled) || every_lock)
        {
            let now_labels = namespaces.borrow_and_update().clone();
            if now_labels.listed != labels.listed {
                every_lock = true;
            }
            touched = (labels.labels.diff(&now_labels.labels))
                .map(|change| match change {
                    imbl::ordmap::DiffItem::Add(ns, _)
                    | imbl::ordmap::DiffItem::Update { new: (ns, _), .. }
                    | imbl::ordmap::DiffItem::Remove(ns, _) => ns.clone(),
                })
                .collect();
            labels = now_labels;
        }
        let registration = keeps_registration.then_some(&confirmed);
        if stopping {
            snapshot.healthy = false;
        }
        if was_healthy != Some(snapshot.healthy) {
            info!(%instance, healthy = snapshot.healthy, locks = snapshot.locks.len(),
                "lock status: {}", if snapshot.healthy { "marking locks enforced" } else { "lock source unhealthy; withdrawing this instance from lock status" });
            was_healthy = Some(snapshot.healthy);
            every_lock = true;
        }
        let now = Timestamp::now();
        let clock = Instant::now();
        let due_now = std::mem::take(&mut due);
        if std::mem::replace(&mut every_lock, false) {
            books.retain(|key, _| snapshot.locks.contains_key(key));
            todo = snapshot
                .locks
                .keys()
                .map(|key| (key.clone(), true))
                .collect();
        } else {
            for change in seen.diff(&snapshot.locks) {
                match change {
                    imbl::ordmap::DiffItem::Add(key, _)
                    | imbl::ordmap::DiffItem::Update { new: (key, _), .. } => {
                        todo.entry(key.clone()).or_insert(false);
                    }
                    imbl::ordmap::DiffItem::Remove(key, _) => {
                        books.remove(key);
                        todo.remove(key);
                    }
                }
            }
            if !touched.is_empty() {
                let relabelled = (snapshot.locks.keys())
                    .filter(|key| touched.contains(key.namespace.as_ref().unwrap_or(&key.name)));
                for key in relabelled {
                    todo.insert(key.clone(), true);
                }
            }
            if due_now {
                let due = books.iter().filter(|(_, book)| {
                    book.retry.as_ref().is_some_and(|r| r.at <= clock)
                        || book.expires.is_some_and(|at| at <= now)
                });
                for (key, _) in due {
                    todo.insert(key.clone(), true);
                }
            }
        }
        seen = snapshot.locks.clone();
        let mut picked = Vec::new();
        while picked.len() < WRITES_PER_PASS {
            let Some((key, force)) = todo.pop_first() else {
                break;
            };
            let Some(lock) = snapshot.locks.get(&key) else {
                continue;
            };
            let book = books.entry(key).or_default();
            if let Some(write) = &mut book.applied
                && lock.meta.resource_version == write.version
            {
                write.echoed = true;
            }
            // Not due yet: the retry's wake-up brings it back.
            if book.retry.as_ref().is_some_and(|r| r.at > clock) {
                continue;
            }
            book.expires = lock.spec.expires_at.as_ref().map(|at| at.0);
            let computed = (lock.meta.resource_version.clone(), snapshot.healthy);
            let unchanged = book.computed.as_ref() == Some(&computed);
            if unchanged && !force && book.retry.is_none() {
                continue;
            }
            book.computed = Some(computed);
            let coverage = Coverage::of(registration, &labels, lock);
            let want = desired(lock, snapshot.healthy, &coverage, &instance, now);
            if needs_write(lock, &want, &instance, book.applied.as_ref()) {
                picked.push((lock.clone(), want));
            } else {
                // What failed is no longer wanted (a withdrawal, healthy again): a retry left
                // due would wake every pass at once.
                book.retry = None;
            }
        }
        let writes: Vec<_> = picked
            .into_iter()
            .map(|(lock, want)| {
                let (client, manager) = (client.clone(), manager.clone());
                async move {
                    let result = write(client, &manager, &lock, &want).await;
                    (lock, want, result)
                }
            })
            .collect();
        let more = !todo.is_empty();
        let results: Vec<_> = futures::stream::iter(writes)
            .buffer_unordered(CONCURRENT_WRITES)
            .collect()
            .await;
        // One line per pass, not per lock: a missing permission fails every lock at once.
        let (mut failed, mut first_failure, mut refused) = (0usize, String::new(), false);
        let mut first_error = String::new();
        for (lock, want, result) in results {
            let outcome = match &result {
                Ok(_) => "success",
                Err(kube::Error::Api(s)) if s.code == 403 => "forbidden",
                Err(kube::Error::Api(s)) if s.code == 404 => "not_found",
                Err(kube::Error::Api(s)) if s.code == 409 => "conflict",
                Err(_) => "error",
            };
            metrics
                .status_writes
                .get_or_create(&OutcomeLabels { outcome })
                .inc();
            match result {
                Ok(version) => {
                    errors.clear();
                    debug!(lock = %lock.key, enforced = want.entry.is_some(), count = want.count, "lock status written");
                    let book = books.entry(lock.key.clone()).or_default();
                    book.retry = None;
                    book.applied = Some(Applied::new(want, version));
                }
                // Deleted meanwhile: the watch will drop it.
                Err(kube::Error::Api(s)) if s.code == 404 => {}
                Err(error) => {
                    let book = books.entry(lock.key.clone()).or_default();
                    let attempts = book.retry.as_ref().map_or(1, |r| r.attempts + 1);
                    let delay = retry::write_delay(FIRST_RETRY, attempts);
                    failed += 1;
                    if failed == 1 {
                        first_error = retry::error_chain(&error);
                        first_failure = format!("{}: {first_error}", lock.key);
                        refused = retry::is_refusal(&error);
                    }
                    book.retry = Some(Retry {
                        at: Instant::now() + delay,
                        attempts,
                    });
                }
            }
        }
        // Once per distinct error until a write succeeds; its repeats at debug.
        if failed > 0 {
            if !errors.is_new(&first_error) {
                debug!(failed, first = %first_failure, "cannot write lock status, again");
            } else if refused {
                warn!(failed, first = %first_failure,
                    "cannot write lock status (the webhook's identity needs patch on locks/status and clusterlocks/status); retrying with backoff");
            } else {
                warn!(failed, first = %first_failure, "cannot write lock status; retrying with backoff");
            }
        }
        let next_retry = (books.values())
            .filter_map(|b| b.retry.as_ref())
            .map(|r| r.at)
            .min();
        let next_expiry = (books.values())
            .filter_map(|b| b.expires)
            .filter(|at| *at > now)
            .min()
            .map(|at| {
                let wait = at.duration_since(Timestamp::now()).unsigned_abs();
                Instant::now() + wait + Duration::from_millis(1)
            });
        if stopping && !more {
            return;
        }
        if more {
            continue;
        }
        let wake = [next_retry, next_expiry].into_iter().flatten().min();
        tokio::select! {
            next = snapshots.changed() => if next.is_err() { return },
            alive = changed(&mut registered) => if alive {
                every_lock = true;
            } else {
                // The configuration keeper stopped: what it last confirmed stays true.
                registered = None;
            },
            alive = changed(&mut namespaces) => if alive {
                relabelled = true;
            } else {
                // The namespace watch stopped: the labels it last showed stay true.
                namespaces = None;
            },
            () = sleep_until(wake) => due = true,
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

async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// Returns the new resourceVersion.
async fn write(
    client: kube::Client,
    manager: &str,
    lock: &KnownLock,
    want: &Desired,
) -> Result<String, kube::Error> {
    let api = lock.key.api(client);
    let written = if want.clears() {
        let params = PatchParams {
            field_manager: Some(manager.to_owned()),
            ..PatchParams::default()
        };
        let patch = Patch::Merge(Desired::clearing(&lock.meta.resource_version));
        api.patch_status(&lock.key.name, &params, &patch).await?
    } else {
        // force: enforcedCount and the condition are shared with the other instances, which
        // write the same values; during a change they may briefly disagree.
        let params = PatchParams::apply(manager).force();
        let patch = Patch::Apply(want.apply_config(&lock.key));
        api.patch_status(&lock.key.name, &params, &patch).await?
    };
    Ok(written.metadata.resource_version.unwrap_or_default())
}
