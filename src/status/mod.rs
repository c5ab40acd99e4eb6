//! Lock status: each running instance records, in the status of every Lock and ClusterLock, that
//! it enforces it (or why it does not).
//!
//! A holder of a lock cannot see the webhook; the status is how it learns that the lock is in
//! force. Every instance writes with server-side apply under its own field manager
//! (`kube-object-lock/<instance>`), to the `status` subresource only:
//! - its own entry of `status.enforcedBy` (a list keyed by instance name, so instances never
//!   overwrite each other), with the generation it enforces and since when;
//! - `status.enforcedCount`, the number of entries, for the `ENFORCED` printer column (a
//!   printer column shows only the first match of a JSONPath, so it cannot count a list). Every
//!   instance computes it from the list as it last saw it and writes it with `force`; they agree
//!   once the list settles;
//! - the condition `Enforced` (True/Enforcing, or False with Expired, WarnMode,
//!   NotSentToWebhook or NotYetRegistered). Every instance writes the same condition, so it
//!   carries no time.
//!
//! With a self-narrowing registration ([`crate::registration::writer`]), a lock counts as
//! enforced only once the configuration that names it has been written and read back: before
//! that, the API server does not send its object's writes to the webhook at all.
//!
//! Writes happen only when the result changes (a lock appears, changes generation, expires,
//! the source turns unhealthy...), never per admission. While the lock source is unhealthy the
//! instance withdraws its entries: it cannot vouch for locks it may not see.
//!
//! The input is deliberately simple: a [`tokio::sync::watch`] channel of [`LockSnapshot`]s, the
//! locks known and whether that knowledge is current. [`view`] provides one from the admission
//! path's lock index, so a lock counts as enforced from what the admissions are decided from.

pub mod view;

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Patch, PatchParams};
use tokio::sync::watch;
use tokio::time::Instant;
use tracing::{debug, info, warn};

use crate::api::{self, Enforcer, LockCondition, LockKey, LockMode, LockSpec};
use crate::locks::{LockMeta, LockRef};
use crate::metrics::{EnforcementMetrics, OutcomeLabels};
use crate::registration::{Registered, RegisteredScope};
use crate::retry;

/// The condition type written by every instance.
pub const CONDITION: &str = "Enforced";
/// Prefix of each instance's field manager.
pub const FIELD_MANAGER_PREFIX: &str = "kube-object-lock/";
/// Writes in flight at once.
const CONCURRENT_WRITES: usize = 8;
/// Writes started by one pass at most: a first start with thousands of Locks neither holds
/// them all in memory at once nor keeps changes (a new Lock) waiting until every one is done.
const WRITES_PER_PASS: usize = 64;
/// The first wait before retrying a failed write (then doubling, see [`retry::write`]).
const FIRST_RETRY: Duration = Duration::from_secs(1);

/// One lock as the lock index last saw it.
#[derive(Clone, Debug, PartialEq)]
pub struct KnownLock {
    /// Which lock.
    pub key: LockKey,
    /// `metadata.generation`.
    pub generation: i64,
    /// The spec, or why it cannot be read (the index's parser said so: such a lock locks its
    /// object for every change, and its status says so).
    pub spec: Result<LockSpec, String>,
    /// uid, resourceVersion and status, shared with the index.
    pub meta: Arc<LockMeta>,
}

impl From<&LockRef> for KnownLock {
    fn from(lock: &LockRef) -> KnownLock {
        KnownLock {
            key: lock.key(),
            generation: lock.generation.unwrap_or(0),
            spec: match &lock.problem {
                Some(problem) => Err(problem.clone()),
                None => Ok(lock.spec.clone()),
            },
            meta: lock.meta.clone(),
        }
    }
}

/// The locks known, and whether that knowledge is current.
#[derive(Clone, Debug, Default)]
pub struct LockSnapshot {
    /// True while the source has a complete, current view (synced, watch not failing).
    pub healthy: bool,
    /// Every known lock. A persistent map: publishing a snapshot per change costs no copy, and
    /// the diff of two snapshots visits only the parts that changed.
    pub locks: imbl::OrdMap<LockKey, Arc<KnownLock>>,
}

/// Whether the webhook configuration sends a lock's requests to the webhook.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Coverage {
    /// Sent: named by the narrowed configuration, or a configuration this instance does not
    /// keep (broad by `manifests cluster --broad`, or static files).
    Sent,
    /// Sent because the configuration is broad, for this reason.
    Broad(String),
    /// Not named by the configuration yet, or no write of it confirmed yet.
    NotYet,
}

impl Coverage {
    /// The coverage of `key` by what this instance last confirmed; `None`: it keeps no
    /// configuration.
    pub fn of(registered: Option<&Registered>, key: &LockKey) -> Coverage {
        let Some(registered) = registered else {
            return Coverage::Sent;
        };
        match &registered.scope {
            None => Coverage::NotYet,
            Some(RegisteredScope::Broad(reason)) => Coverage::Broad(reason.clone()),
            Some(RegisteredScope::Narrow(_)) if registered.covers(key) => Coverage::Sent,
            Some(RegisteredScope::Narrow(_)) => Coverage::NotYet,
        }
    }
}

/// What this instance's refusals depend on besides the lock itself: the webhook configuration
/// it keeps (when narrowed). A lock counts as enforced only once it names the lock. (The locks
/// come from the index the admissions are decided from: what the writer sees, they decide by.)
#[derive(Default)]
pub struct DecisionInputs {
    /// What the narrowed configuration names; `None` when this instance keeps none.
    pub registered: Option<watch::Receiver<Registered>>,
}

/// Why a lock is or is not enforced, as this instance sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Enforcement {
    /// Refuses changes to its object.
    Enforcing,
    /// Refuses changes to its object; the configuration is broad for this reason.
    EnforcingBroad(String),
    /// The spec does not parse; the lock's name is locked for every operation (fail closed).
    EnforcingUnparsed(String),
    /// `expiresAt` has passed.
    Expired(Timestamp),
    /// Mode Warn: changes are allowed with a warning.
    WarnMode,
    /// The namespace is left out of the webhook registration.
    NotSent(String),
    /// The narrowed configuration does not name the lock yet.
    NotYetRegistered,
}

impl Enforcement {
    /// How `lock` stands at `now`.
    pub fn of(lock: &KnownLock, now: Timestamp) -> Enforcement {
        // Nothing in the namespaces the registration leaves out reaches the webhook, nor do
        // those Namespaces themselves.
        match &lock.key.namespace {
            Some(ns) if api::is_excluded_namespace(ns) => {
                return Enforcement::NotSent(ns.clone());
            }
            None if api::is_excluded_namespace(&lock.key.name)
                && lock.spec.as_ref().is_ok_and(covers_only_namespaces) =>
            {
                return Enforcement::NotSent(lock.key.name.clone());
            }
            _ => {}
        }
        match &lock.spec {
            Err(why) => Enforcement::EnforcingUnparsed(why.clone()),
            Ok(spec) => match &spec.expires_at {
                Some(at) if at.0 <= now => Enforcement::Expired(at.0),
                _ if spec.mode == Some(LockMode::Warn) => Enforcement::WarnMode,
                _ => Enforcement::Enforcing,
            },
        }
    }

    /// How `lock` stands at `now`, given whether the configuration sends its requests.
    pub fn with_coverage(lock: &KnownLock, coverage: &Coverage, now: Timestamp) -> Enforcement {
        let enforcement = Enforcement::of(lock, now);
        if !enforcement.is_enforced() {
            return enforcement;
        }
        match (coverage, enforcement) {
            (Coverage::NotYet, _) => Enforcement::NotYetRegistered,
            (Coverage::Broad(reason), Enforcement::Enforcing) => {
                Enforcement::EnforcingBroad(reason.clone())
            }
            (_, enforcement) => enforcement,
        }
    }

    /// Whether the webhook refuses changes because of the lock.
    pub fn is_enforced(&self) -> bool {
        matches!(
            self,
            Enforcement::Enforcing
                | Enforcement::EnforcingBroad(_)
                | Enforcement::EnforcingUnparsed(_)
        )
    }

    /// The `Enforced` condition saying so.
    pub fn condition(&self, generation: i64) -> LockCondition {
        let (status, reason, message) = match self {
            Enforcement::Enforcing => (
                "True",
                "Enforcing",
                "UPDATE and DELETE of the locked object are refused; status.enforcedBy lists the instances".to_owned(),
            ),
            Enforcement::EnforcingBroad(reason) => (
                "True",
                "Enforcing",
                format!("UPDATE and DELETE of the locked object are refused; status.enforcedBy lists the instances. The webhook configuration is broad ({reason})"),
            ),
            Enforcement::EnforcingUnparsed(why) => (
                "True",
                "Unparseable",
                format!("the spec does not parse ({why}): every operation on objects of the lock's name is refused"),
            ),
            Enforcement::Expired(at) => (
                "False",
                "Expired",
                format!("expiresAt {at} has passed; the lock no longer applies (delete it, or move expiresAt)"),
            ),
            Enforcement::WarnMode => (
                "False",
                "WarnMode",
                "mode Warn: changes are allowed with a warning, not refused".to_owned(),
            ),
            Enforcement::NotSent(ns) => (
                "False",
                "NotSentToWebhook",
                format!("namespace {ns} is left out of the webhook registration: its objects never reach the webhook"),
            ),
            Enforcement::NotYetRegistered => (
                "False",
                "NotYetRegistered",
                "the webhook configuration does not name this lock yet, so the API server does not send its object's writes to the webhook; it is rewritten within moments (if this stays, see the log for `cannot narrow the webhook configuration`)".to_owned(),
            ),
        };
        LockCondition {
            type_: CONDITION.to_owned(),
            status: status.to_owned(),
            reason: reason.to_owned(),
            message,
            observed_generation: Some(generation),
        }
    }
}

/// A spec whose resources are exactly the core group's `namespaces`.
fn covers_only_namespaces(spec: &LockSpec) -> bool {
    match spec.resources.as_deref() {
        Some([rule]) => rule.api_groups == [""] && rule.resources == ["namespaces"],
        _ => false,
    }
}

/// What this instance wants a lock's status to say.
#[derive(Clone, Debug, PartialEq)]
pub struct Desired {
    /// Its own `enforcedBy` entry, if it enforces the lock.
    pub entry: Option<Enforcer>,
    /// `enforcedCount`: the other instances' entries plus its own.
    pub count: i64,
    /// The conditions it asserts (none while unhealthy).
    pub conditions: Vec<LockCondition>,
}

impl Desired {
    /// The server-side apply configuration of the status.
    pub fn apply_config(&self, key: &LockKey) -> serde_json::Value {
        let mut metadata = serde_json::json!({ "name": key.name });
        if let Some(ns) = &key.namespace {
            metadata["namespace"] = serde_json::json!(ns);
        }
        let mut status = serde_json::json!({ "enforcedCount": self.count });
        // An empty list would claim the list itself; leave out what this instance does not own.
        if let Some(entry) = &self.entry {
            status["enforcedBy"] = serde_json::json!([entry]);
        }
        if !self.conditions.is_empty() {
            status["conditions"] = serde_json::json!(self.conditions);
        }
        serde_json::json!({
            "apiVersion": api::API_VERSION,
            "kind": key.kind().as_str(),
            "metadata": metadata,
            "status": status,
        })
    }

    /// The same, ignoring `since` (which only the first write sets).
    fn same_as(&self, other: &Desired) -> bool {
        let generation = |d: &Desired| d.entry.as_ref().map(|e| e.observed_generation);
        generation(self) == generation(other)
            && self.count == other.count
            && self.conditions == other.conditions
    }
}

/// What `instance` wants `lock`'s status to say at `now`; `healthy` is the source's health,
/// `coverage` whether the webhook configuration sends the lock's requests.
pub fn desired(
    lock: &KnownLock,
    healthy: bool,
    coverage: &Coverage,
    instance: &str,
    now: Timestamp,
) -> Desired {
    let others = lock
        .meta
        .status
        .enforced_by
        .iter()
        .filter(|e| e.instance != instance)
        .count();
    if !healthy {
        return Desired {
            entry: None,
            count: others as i64,
            conditions: vec![],
        };
    }
    let enforcement = Enforcement::with_coverage(lock, coverage, now);
    let entry = enforcement.is_enforced().then(|| {
        let since = lock
            .meta
            .status
            .enforced_by
            .iter()
            .find(|e| e.instance == instance)
            .map_or(Time(now), |e| e.since.clone());
        Enforcer {
            instance: instance.to_owned(),
            observed_generation: lock.generation,
            since,
        }
    });
    Desired {
        count: (others + usize::from(entry.is_some())) as i64,
        entry,
        conditions: vec![enforcement.condition(lock.generation)],
    }
}

/// Whether the status as seen differs from what this instance wants, in the parts it writes:
/// its own entry, the count, and (unless it wrote them already) the conditions.
fn needs_write(
    lock: &KnownLock,
    desired: &Desired,
    instance: &str,
    applied: Option<&Applied>,
) -> bool {
    if let Some(applied) = applied
        && applied.desired.same_as(desired)
        && applied.awaiting_echo()
    {
        // Our write landed but the watch has not shown it yet: what it shows is older.
        return false;
    }
    let mine = lock
        .meta
        .status
        .enforced_by
        .iter()
        .find(|e| e.instance == instance)
        .map(|e| e.observed_generation);
    if mine != desired.entry.as_ref().map(|e| e.observed_generation) {
        return true;
    }
    if lock.meta.status.enforced_count != Some(desired.count) {
        return true;
    }
    match applied {
        // Conditions are shared: rewrite them only when ours change, so that two instances
        // that disagree (during an upgrade) do not take turns forever.
        Some(applied) => applied.desired.conditions != desired.conditions,
        None => desired
            .conditions
            .iter()
            .any(|c| !lock.meta.status.conditions.contains(c)),
    }
}

/// A write this instance made.
#[derive(Debug)]
struct Applied {
    desired: Desired,
    /// The lock's resourceVersion after the write.
    version: String,
    /// When the write was answered.
    at: Instant,
    /// Whether the watch has shown that resourceVersion: from then on, what it shows is newer.
    echoed: bool,
}

impl Applied {
    fn new(desired: Desired, version: String) -> Applied {
        Applied {
            desired,
            version,
            at: Instant::now(),
            echoed: false,
        }
    }

    /// Still waiting for the watch to show the write (for a few seconds at most: a re-list
    /// may skip that exact version).
    fn awaiting_echo(&self) -> bool {
        !self.echoed && self.at.elapsed() < ECHO_WAIT
    }
}

/// How long a write's echo is waited for before what the watch shows is trusted again.
const ECHO_WAIT: Duration = Duration::from_secs(5);

/// A failed write waiting for its retry.
#[derive(Debug)]
struct Retry {
    at: Instant,
    attempts: u32,
}

/// What the status writer remembers per lock, dropped together when the lock goes.
#[derive(Default)]
struct Books {
    /// The last status this instance wrote, and whether its echo came back.
    applied: HashMap<LockKey, Applied>,
    /// Failed writes, and when to try again.
    retries: HashMap<LockKey, Retry>,
    /// The resourceVersion and health each lock's status was last computed from.
    computed: HashMap<LockKey, (String, bool)>,
    /// Locks with an `expiresAt`, to wake up when the next one passes.
    expiring: HashMap<LockKey, Timestamp>,
}

impl Books {
    /// Forgets a lock that is gone.
    fn forget(&mut self, key: &LockKey) {
        self.applied.remove(key);
        self.retries.remove(key);
        self.computed.remove(key);
        self.expiring.remove(key);
    }

    /// Keeps only the locks for which `exists` holds.
    fn keep(&mut self, exists: impl Fn(&LockKey) -> bool) {
        self.applied.retain(|key, _| exists(key));
        self.retries.retain(|key, _| exists(key));
        self.computed.retain(|key, _| exists(key));
        self.expiring.retain(|key, _| exists(key));
    }
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
    let DecisionInputs { mut registered } = inputs;
    let keeps_registration = registered.is_some();
    let mut confirmed = Registered::default();
    let mut stop = std::pin::pin!(stop);
    let mut stopping = false;
    let manager = format!("{FIELD_MANAGER_PREFIX}{instance}");
    let mut books = Books::default();
    let mut was_healthy = None;
    // A pass looks only at the locks in `todo`: those that changed since the snapshot the last
    // pass saw (a burst of status writes is a burst of passes, each over a few locks), those
    // whose retry or expiry is due. `true` = compute even if
    // nothing it was computed from changed (the registration, time or stopping may change
    // every answer).
    let mut todo: BTreeMap<LockKey, bool> = BTreeMap::new();
    let mut seen: imbl::OrdMap<LockKey, Arc<KnownLock>> = imbl::OrdMap::new();
    let mut due = false;
    let mut every_lock = true;
    loop {
        let mut snapshot = snapshots.borrow_and_update().clone();
        // (`every_lock` is set when it changed; copying it is O(locks).)
        if let Some(registered) = &mut registered
            && every_lock
        {
            confirmed = registered.borrow_and_update().clone();
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
        // Every pass consumes the wake-ups; a pass over every lock covers them.
        let due_now = std::mem::take(&mut due);
        if std::mem::replace(&mut every_lock, false) {
            books.keep(|key| snapshot.locks.contains_key(key));
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
                        books.forget(key);
                        todo.remove(key);
                    }
                }
            }
            if due_now {
                let retry_due = books.retries.iter().filter(|(_, r)| r.at <= clock);
                let expired = books.expiring.iter().filter(|(_, at)| **at <= now);
                for key in retry_due.map(|(k, _)| k).chain(expired.map(|(k, _)| k)) {
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
            if let Some(write) = books.applied.get_mut(&key)
                && lock.meta.resource_version == write.version
            {
                write.echoed = true;
            }
            // Not due yet: the retry's wake-up brings it back.
            if books.retries.get(&key).is_some_and(|r| r.at > clock) {
                continue;
            }
            match lock.spec.as_ref().ok().and_then(|s| s.expires_at.as_ref()) {
                Some(at) => books.expiring.insert(key.clone(), at.0),
                None => books.expiring.remove(&key),
            };
            let unchanged = books.computed.get(&key).is_some_and(|(version, healthy)| {
                *version == lock.meta.resource_version && *healthy == snapshot.healthy
            });
            if unchanged && !force && !books.retries.contains_key(&key) {
                continue;
            }
            books.computed.insert(
                key.clone(),
                (lock.meta.resource_version.clone(), snapshot.healthy),
            );
            let coverage = Coverage::of(registration, &key);
            let want = desired(lock, snapshot.healthy, &coverage, &instance, now);
            if needs_write(lock, &want, &instance, books.applied.get(&key)) {
                picked.push((lock.clone(), want));
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
        // More to look at than one pass takes: the next pass starts at once.
        let more = !todo.is_empty();
        let results: Vec<_> = futures::stream::iter(writes)
            .buffer_unordered(CONCURRENT_WRITES)
            .collect()
            .await;
        // One line per pass, not per lock: a missing permission fails every lock at once.
        let (mut failed, mut first_failure) = (0usize, String::new());
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
                    debug!(lock = %lock.key, enforced = want.entry.is_some(), count = want.count, "lock status written");
                    books.retries.remove(&lock.key);
                    books
                        .applied
                        .insert(lock.key.clone(), Applied::new(want, version));
                }
                // Deleted meanwhile: the watch will drop it.
                Err(kube::Error::Api(s)) if s.code == 404 => {}
                Err(error) => {
                    let attempts = books.retries.get(&lock.key).map_or(1, |r| r.attempts + 1);
                    let delay = retry::write_delay(FIRST_RETRY, attempts);
                    failed += 1;
                    if failed == 1 {
                        first_failure = format!(
                            "{}: {error} (attempt {attempts}, next in {delay:?})",
                            lock.key
                        );
                    }
                    books.retries.insert(
                        lock.key.clone(),
                        Retry {
                            at: Instant::now() + delay,
                            attempts,
                        },
                    );
                }
            }
        }
        if failed > 0 {
            warn!(failed, first = %first_failure,
                "cannot write lock status (the webhook's identity needs patch on locks/status and clusterlocks/status); retrying with backoff");
        }
        // Sleep until the snapshot changes, a retry is due, or an enforced lock expires.
        let next_retry = books.retries.values().map(|r| r.at).min();
        let next_expiry = (books.expiring.values())
            .filter(|at| **at > now)
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
            // A retry or an expiry is due.
            () = sleep_until(wake) => due = true,
            () = &mut stop => {
                info!(%instance, "stopping: withdrawing this instance from lock status");
                stopping = true;
                every_lock = true;
                books.retries.clear();
            }
        }
    }
}

/// Resolves when the channel publishes (`true`) or its sender is gone (`false`); never without
/// a channel.
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

/// Applies `want` to the lock's status; returns the new resourceVersion.
async fn write(
    client: kube::Client,
    manager: &str,
    lock: &KnownLock,
    want: &Desired,
) -> Result<String, kube::Error> {
    // force: enforcedCount and the condition are shared with the other instances, which write
    // the same values; during a change they may briefly disagree.
    let params = PatchParams::apply(manager).force();
    let written = lock
        .key
        .api(client)
        .patch_status(
            &lock.key.name,
            &params,
            &Patch::Apply(want.apply_config(&lock.key)),
        )
        .await?;
    Ok(written.metadata.resource_version.unwrap_or_default())
}

#[cfg(test)]
mod tests;
