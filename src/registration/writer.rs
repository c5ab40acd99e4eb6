//! Keeps the ValidatingWebhookConfiguration narrowed to the live locks.
//!
//! One task per instance: it watches Locks, ClusterLocks and the configuration itself (one
//! object, by name), and whenever the entries [`super::webhooks`] computes differ from what the
//! API server holds, applies them with server-side apply (field manager `kube-object-lock`,
//! forced) and checks the answer, which is the stored object: the write is read back before it
//! counts. The content is deterministic, so several instances converge on the same
//! configuration and an instance that finds it already current writes nothing. Expired locks
//! leave the registration at their `expiresAt` (the task sleeps until the next one).
//!
//! Nothing is written before both lock watches have listed everything once: a partial view
//! would drop locked names. The lock view comes from its own watchers here, so the module does
//! not depend on how the admission path reads locks; a shared index can replace them by
//! feeding [`Narrower::run_with`] the same events.
//!
//! Needs `get`, `list`, `watch` and `patch` on `validatingwebhookconfigurations` restricted by
//! `resourceNames` to the one configuration (`manifests cluster` grants them).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use futures::{FutureExt, Stream, StreamExt};
use k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, ResourceExt};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use tokio::sync::watch;
use tracing::{debug, info, warn};

use super::conditions::{self, Limits, Plan, Scope};
use super::{is_current, webhooks};
use crate::api::{ClusterLock, Lock};
use crate::locks::LockRef;

/// The field manager of the writes.
pub const FIELD_MANAGER: &str = "kube-object-lock";

/// Longest wait before a failed write is tried again.
const MAX_RETRY: Duration = Duration::from_secs(30);

/// Metrics of the registration writer.
#[derive(Clone, Debug, Default)]
pub struct RegistrationMetrics {
    /// 1 while the written registration is narrowed, 0 while it is broad (or not written).
    pub narrowed: Gauge,
    /// Live locks in the last plan.
    pub locked_names: Gauge,
    /// Writes of the configuration, by outcome.
    pub writes: Family<OutcomeLabels, Counter>,
}

/// `outcome` label.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OutcomeLabels {
    /// `written`, `forbidden`, `missing`, `error`.
    pub outcome: &'static str,
}

impl RegistrationMetrics {
    /// Registers the metrics under `registration_*`.
    pub fn register(&self, registry: &mut prometheus_client::registry::Registry) {
        registry.register(
            "registration_narrowed",
            "1 while the webhook configuration is narrowed to the locked names, 0 while it is broad",
            self.narrowed.clone(),
        );
        registry.register(
            "registration_locked_names",
            "Live locks the webhook configuration was computed from",
            self.locked_names.clone(),
        );
        registry.register(
            "registration_writes",
            "Writes of the webhook configuration, by outcome",
            self.writes.clone(),
        );
    }
}

/// What the configuration says, once written and read back.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Registered {
    /// `None` until the first write is confirmed.
    pub scope: Option<RegisteredScope>,
}

/// Narrowed to these locks, or broad.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RegisteredScope {
    /// The locks (namespace, name; namespace `None` for ClusterLocks) it sends requests for.
    Narrow(BTreeSet<(Option<String>, String)>),
    /// Everything is sent, for this reason (the bound, or a name CEL cannot hold).
    Broad(String),
}

impl Registered {
    /// Whether requests concerning this lock reach the webhook.
    pub fn covers(&self, namespace: Option<&str>, name: &str) -> bool {
        match &self.scope {
            None => false,
            Some(RegisteredScope::Broad(_)) => true,
            Some(RegisteredScope::Narrow(keys)) => {
                keys.contains(&(namespace.map(str::to_owned), name.to_owned()))
            }
        }
    }
}

/// The writer's configuration.
#[derive(Debug, Clone)]
pub struct NarrowerConfig {
    /// Name of the ValidatingWebhookConfiguration.
    pub name: String,
    /// Bounds of the narrowed registration.
    pub limits: Limits,
}

/// A lock change as the writer needs it.
#[derive(Debug, Clone)]
pub enum LockEvent {
    /// A (re-)list of one kind starts.
    Init(Kind),
    /// A lock seen during a (re-)list.
    InitApply(LockRef),
    /// A (re-)list of one kind is complete.
    InitDone(Kind),
    /// A lock created or changed.
    Apply(LockRef),
    /// A lock deleted.
    Delete(LockRef),
}

/// Lock or ClusterLock, for the list events.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Kind {
    /// Locks.
    Lock,
    /// ClusterLocks.
    ClusterLock,
}

type Key = (Option<String>, String);

fn key(lock: &LockRef) -> Key {
    (lock.namespace.clone(), lock.name.clone())
}

/// The live view of the locks, complete once both kinds have been listed.
#[derive(Default)]
struct LockView {
    locks: BTreeMap<Key, LockRef>,
    listing: BTreeMap<Kind, BTreeMap<Key, LockRef>>,
    synced: BTreeSet<Kind>,
}

impl LockView {
    fn kind_of(lock: &LockRef) -> Kind {
        match lock.namespace {
            Some(_) => Kind::Lock,
            None => Kind::ClusterLock,
        }
    }

    fn apply(&mut self, event: LockEvent) {
        match event {
            LockEvent::Init(kind) => {
                self.listing.insert(kind, BTreeMap::new());
            }
            LockEvent::InitApply(lock) => {
                let kind = Self::kind_of(&lock);
                self.listing
                    .entry(kind)
                    .or_default()
                    .insert(key(&lock), lock);
            }
            LockEvent::InitDone(kind) => {
                let listed = self.listing.remove(&kind).unwrap_or_default();
                self.locks.retain(|_, l| Self::kind_of(l) != kind);
                self.locks.extend(listed);
                self.synced.insert(kind);
            }
            LockEvent::Apply(lock) => {
                self.locks.insert(key(&lock), lock);
            }
            LockEvent::Delete(lock) => {
                self.locks.remove(&key(&lock));
            }
        }
    }

    fn complete(&self) -> bool {
        self.synced.len() == 2
    }
}

/// Keeps the configuration narrowed.
pub struct Narrower {
    client: Client,
    config: NarrowerConfig,
    metrics: RegistrationMetrics,
    registered: watch::Sender<Registered>,
}

impl Narrower {
    /// A writer for `config.name`, counting into `metrics`.
    pub fn new(client: Client, config: NarrowerConfig, metrics: RegistrationMetrics) -> Self {
        Narrower {
            client,
            config,
            metrics,
            registered: watch::Sender::new(Registered::default()),
        }
    }

    /// What the configuration says, updated after every confirmed write.
    pub fn registered(&self) -> watch::Receiver<Registered> {
        self.registered.subscribe()
    }

    /// Watches Locks and ClusterLocks itself and keeps the configuration current, until the
    /// future is dropped.
    pub async fn run(self) {
        let locks = lock_events::<Lock>(self.client.clone(), Kind::Lock, |l| {
            LockRef::lock(&l.namespace().unwrap_or_default(), &l.name_any(), l.spec)
        });
        let cluster_locks =
            lock_events::<ClusterLock>(self.client.clone(), Kind::ClusterLock, |l| {
                LockRef::cluster_lock(&l.name_any(), l.spec.into())
            });
        self.run_with(futures::stream::select(locks, cluster_locks))
            .await;
    }

    /// Keeps the configuration current from `locks`, until the future is dropped.
    pub async fn run_with(self, locks: impl Stream<Item = LockEvent> + Send) {
        let api: Api<ValidatingWebhookConfiguration> = Api::all(self.client.clone());
        let mut configs = watcher(
            api.clone(),
            watcher::Config::default().fields(&format!("metadata.name={}", self.config.name)),
        )
        .backoff(crate::locks::watch::retry_backoff())
        .boxed();
        let mut locks = std::pin::pin!(locks);
        let mut view = LockView::default();
        let mut current: Option<ValidatingWebhookConfiguration> = None;
        let mut config_listed = false;
        let mut wake: Option<tokio::time::Instant> = None;
        let mut retry = Duration::from_millis(250);
        let mut last_problem: Option<String> = None;
        loop {
            let deadline = wake
                .unwrap_or_else(|| tokio::time::Instant::now() + Duration::from_secs(24 * 3600));
            tokio::select! {
                event = locks.next() => match event {
                    Some(event) => view.apply(event),
                    None => {
                        warn!("lock events ended; the webhook configuration is no longer kept narrowed");
                        return;
                    }
                },
                event = configs.next() => match event {
                    Some(Ok(event)) => config_event(event, &mut current, &mut config_listed),
                    Some(Err(error)) => warn!(%error, name = %self.config.name, "watching the webhook configuration failed; retrying with backoff (registered with `manifests cluster --broad`? set registration.narrow = false)"),
                    None => return,
                },
                () = tokio::time::sleep_until(deadline) => {}
            }
            // Take everything already queued before writing: a burst of lock changes becomes
            // one write.
            while let Some(Some(event)) = locks.next().now_or_never() {
                view.apply(event);
            }
            while let Some(Some(Ok(event))) = configs.next().now_or_never() {
                config_event(event, &mut current, &mut config_listed);
            }
            if !view.complete() || !config_listed {
                continue;
            }
            let now = Timestamp::now();
            let plan = conditions::plan(view.locks.values(), now, &self.config.limits);
            wake = plan.next_expiry.map(|at| {
                let left = at.duration_since(now).unsigned_abs();
                tokio::time::Instant::now() + left + Duration::from_millis(5)
            });
            match self.reconcile(&api, current.as_ref(), &plan, &view).await {
                Ok(Some(written)) => {
                    current = Some(written);
                    retry = Duration::from_millis(250);
                    last_problem = None;
                }
                Ok(None) => {
                    retry = Duration::from_millis(250);
                }
                Err(problem) => {
                    if last_problem.as_deref() != Some(problem.as_str()) {
                        warn!(%problem, name = %self.config.name, retry_in = ?retry, "cannot narrow the webhook configuration");
                    }
                    last_problem = Some(problem);
                    let again = tokio::time::Instant::now() + retry;
                    wake = Some(wake.map_or(again, |w| w.min(again)));
                    retry = (retry * 2).min(MAX_RETRY);
                }
            }
        }
    }

    /// Writes the plan if the configuration does not say it yet. `Ok(Some)` = written and read
    /// back, `Ok(None)` = already current.
    async fn reconcile(
        &self,
        api: &Api<ValidatingWebhookConfiguration>,
        current: Option<&ValidatingWebhookConfiguration>,
        plan: &Plan,
        view: &LockView,
    ) -> Result<Option<ValidatingWebhookConfiguration>, String> {
        let outcome = |outcome| {
            self.metrics
                .writes
                .get_or_create(&OutcomeLabels { outcome })
        };
        let Some(current) = current else {
            outcome("missing").inc();
            return Err(format!(
                "no ValidatingWebhookConfiguration {:?}; apply the output of `kube-object-lock manifests cluster`",
                self.config.name
            ));
        };
        let entries = current.webhooks.as_deref().unwrap_or_default();
        let desired = webhooks(entries, plan).map_err(|e| {
            outcome("missing").inc();
            e.to_string()
        })?;
        self.metrics
            .locked_names
            .set(i64::try_from(plan.names).unwrap_or(i64::MAX));
        if is_current(entries, &desired) {
            self.confirm(plan, view);
            return Ok(None);
        }
        let body = serde_json::json!({
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingWebhookConfiguration",
            "metadata": {"name": self.config.name},
            "webhooks": desired,
        });
        let params = PatchParams::apply(FIELD_MANAGER).force();
        let written = match api
            .patch(&self.config.name, &params, &Patch::Apply(&body))
            .await
        {
            Ok(written) => written,
            Err(kube::Error::Api(status)) if status.code == 403 => {
                outcome("forbidden").inc();
                return Err(format!(
                    "forbidden: {}; grant patch on this validatingwebhookconfiguration (manifests cluster does), or set registration.narrow = false",
                    status.message
                ));
            }
            Err(error) => {
                outcome("error").inc();
                return Err(error.to_string());
            }
        };
        // The answer is the stored object: it must now say what was written.
        if !is_current(written.webhooks.as_deref().unwrap_or_default(), &desired) {
            outcome("error").inc();
            return Err("the configuration read back differs from what was written (another writer, or a defaulted field)".to_owned());
        }
        outcome("written").inc();
        let entries = desired.len();
        let was_narrow = match &self.registered.borrow().scope {
            Some(RegisteredScope::Narrow(_)) => Some(true),
            Some(RegisteredScope::Broad(_)) => Some(false),
            None => None,
        };
        // A change of scope is logged; every write only at debug.
        match (&plan.scope, was_narrow) {
            (Scope::Narrow { .. }, Some(true)) => {
                debug!(
                    locks = plan.names,
                    entries, "webhook configuration rewritten"
                )
            }
            (Scope::Narrow { .. }, _) => {
                info!(
                    locks = plan.names,
                    entries, "webhook configuration narrowed to the locked names"
                )
            }
            (Scope::Broad(reason), Some(false)) => {
                debug!(%reason, "webhook configuration rewritten")
            }
            (Scope::Broad(reason), _) => warn!(%reason, "webhook configuration is broad"),
        }
        self.confirm(plan, view);
        Ok(Some(written))
    }

    /// Publishes what the configuration now says.
    fn confirm(&self, plan: &Plan, view: &LockView) {
        let scope = match &plan.scope {
            Scope::Narrow { .. } => {
                self.metrics.narrowed.set(1);
                let now = Timestamp::now();
                RegisteredScope::Narrow(
                    view.locks
                        .iter()
                        .filter(|(_, l)| !l.spec.is_expired(now))
                        .map(|(k, _)| k.clone())
                        .collect(),
                )
            }
            Scope::Broad(reason) => {
                self.metrics.narrowed.set(0);
                RegisteredScope::Broad(reason.to_string())
            }
        };
        self.registered.send_if_modified(|r| {
            let changed = r.scope.as_ref() != Some(&scope);
            r.scope = Some(scope);
            changed
        });
    }
}

fn config_event(
    event: watcher::Event<ValidatingWebhookConfiguration>,
    current: &mut Option<ValidatingWebhookConfiguration>,
    listed: &mut bool,
) {
    match event {
        watcher::Event::Apply(c) | watcher::Event::InitApply(c) => *current = Some(c),
        watcher::Event::Delete(_) => *current = None,
        // A re-list (after an API server restart, a 410): what it held is unknown until the
        // list completes, and "missing" meanwhile would be a false alarm and a backoff.
        watcher::Event::Init => {
            *current = None;
            *listed = false;
        }
        watcher::Event::InitDone => *listed = true,
    }
}

/// A watcher on one lock kind, as [`LockEvent`]s; errors are logged and retried with backoff.
fn lock_events<K>(
    client: Client,
    kind: Kind,
    convert: fn(K) -> LockRef,
) -> impl Stream<Item = LockEvent> + Send + 'static
where
    K: kube::Resource<DynamicType = ()>
        + Clone
        + std::fmt::Debug
        + serde::de::DeserializeOwned
        + Send
        + Sync
        + 'static,
{
    let api: Api<K> = Api::all(client);
    let convert = Arc::new(convert);
    watcher(api, watcher::Config::default())
        .backoff(crate::locks::watch::retry_backoff())
        .filter_map(move |event| {
            let convert = convert.clone();
            async move {
                match event {
                    Ok(watcher::Event::Init) => Some(LockEvent::Init(kind)),
                    Ok(watcher::Event::InitApply(l)) => Some(LockEvent::InitApply(convert(l))),
                    Ok(watcher::Event::InitDone) => Some(LockEvent::InitDone(kind)),
                    Ok(watcher::Event::Apply(l)) => Some(LockEvent::Apply(convert(l))),
                    Ok(watcher::Event::Delete(l)) => Some(LockEvent::Delete(convert(l))),
                    Err(error) => {
                        debug!(?kind, %error, "lock watch for the registration failed; retrying");
                        None
                    }
                }
            }
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::LockSpec;

    #[test]
    fn the_view_is_complete_only_after_both_lists() {
        let mut view = LockView::default();
        view.apply(LockEvent::Init(Kind::Lock));
        view.apply(LockEvent::InitApply(LockRef::lock(
            "a",
            "x",
            LockSpec::default(),
        )));
        view.apply(LockEvent::InitDone(Kind::Lock));
        assert!(!view.complete());
        view.apply(LockEvent::Init(Kind::ClusterLock));
        view.apply(LockEvent::InitDone(Kind::ClusterLock));
        assert!(view.complete());
        view.apply(LockEvent::Apply(LockRef::cluster_lock(
            "c",
            LockSpec::default(),
        )));
        assert_eq!(view.locks.len(), 2);
        // A re-list of Locks replaces the Locks and keeps the ClusterLocks.
        view.apply(LockEvent::Init(Kind::Lock));
        view.apply(LockEvent::InitApply(LockRef::lock(
            "b",
            "y",
            LockSpec::default(),
        )));
        view.apply(LockEvent::InitDone(Kind::Lock));
        let keys: Vec<_> = view.locks.keys().cloned().collect();
        assert_eq!(
            keys,
            [
                (None, "c".to_owned()),
                (Some("b".to_owned()), "y".to_owned())
            ]
        );
        view.apply(LockEvent::Delete(LockRef::lock(
            "b",
            "y",
            LockSpec::default(),
        )));
        assert_eq!(view.locks.len(), 1);
    }

    #[test]
    fn a_relist_of_the_configuration_is_not_taken_for_a_missing_one() {
        let (mut current, mut listed) = (None, false);
        let config = ValidatingWebhookConfiguration::default();
        config_event(watcher::Event::Init, &mut current, &mut listed);
        config_event(
            watcher::Event::InitApply(config.clone()),
            &mut current,
            &mut listed,
        );
        config_event(watcher::Event::InitDone, &mut current, &mut listed);
        assert!(listed && current.is_some());
        config_event(watcher::Event::Init, &mut current, &mut listed);
        assert!(!listed, "not known again until the re-list completes");
        config_event(watcher::Event::InitApply(config), &mut current, &mut listed);
        config_event(watcher::Event::InitDone, &mut current, &mut listed);
        assert!(listed && current.is_some());
        config_event(
            watcher::Event::Delete(ValidatingWebhookConfiguration::default()),
            &mut current,
            &mut listed,
        );
        assert!(listed && current.is_none(), "deleted: known missing");
    }

    #[test]
    fn covers() {
        let mut registered = Registered::default();
        assert!(!registered.covers(Some("a"), "x"));
        registered.scope = Some(RegisteredScope::Narrow(
            [(Some("a".to_owned()), "x".to_owned())].into(),
        ));
        assert!(registered.covers(Some("a"), "x"));
        assert!(!registered.covers(None, "x"));
        registered.scope = Some(RegisteredScope::Broad("test".to_owned()));
        assert!(registered.covers(None, "anything"));
    }
}
