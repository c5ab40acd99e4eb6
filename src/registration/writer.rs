//! Keeps the ValidatingWebhookConfiguration narrowed to the live locks of the lock index, with
//! server-side apply (base entries and CREATE/CONNECT entries under two field managers), one
//! reconcile at a time, under the resourceVersion it read. Invariant: nothing is written before
//! both kinds were listed once; a write counts once read back.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use futures::stream::BoxStream;
use futures::{FutureExt, StreamExt};
use k8s_openapi::api::admissionregistration::v1::{
    ValidatingWebhook, ValidatingWebhookConfiguration,
};
use k8s_openapi::jiff::Timestamp;
use kube::Client;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::{WatchStreamExt, watcher};
use tokio::sync::watch;
use tokio::time::Instant;
use tracing::{debug, info, warn};

use super::conditions::{self, Clauses, ConditionsPlan, NarrowingBounds, Scope};
use super::operations::{self, OperationsPlan};
use super::{
    Format, NamespaceSelection, Registered, RegisteredScope, is_base_extra, is_current, webhooks,
};
use crate::locks::index::{self, Change, IndexSnapshot, LockIndex, Sets, WatchState};
use crate::locks::{LockKey, LockKind, LockRef};
use crate::metrics::{ConfigurationLabels, OutcomeLabels, RegistrationMetrics};
use crate::retry::{self, Backoff, LastError};

pub const FIELD_MANAGER: &str = "kube-object-lock";
/// Not [`FIELD_MANAGER`], whose applies would then remove the CREATE and CONNECT entries.
pub const OPERATIONS_FIELD_MANAGER: &str = "kube-object-lock-operations";

const FIRST_RETRY: Duration = Duration::from_millis(250);

type Entries = [ValidatingWebhook];

#[derive(Debug, Clone)]
pub struct NarrowerConfig {
    pub name: String,
    pub limits: NarrowingBounds,
}

/// The live locks, followed from the lock index; complete once both kinds have been listed.
#[derive(Default)]
struct LockView {
    sets: Sets,
    listed: (bool, bool),
}

impl LockView {
    /// True when a lock came, went or changed what it locks (not its status, which every
    /// instance's status write changes).
    fn update(&mut self, now: &IndexSnapshot) -> bool {
        let changed = now.listed != self.listed
            || index::diff(&self.sets, &now.sets).any(|change| match change {
                Change::Put(lock, before) => before.is_none_or(|b| !b.same_rule(lock)),
                Change::Gone(_) => true,
            });
        self.sets = now.sets.clone();
        self.listed = now.listed;
        changed
    }

    fn locks(&self) -> impl Iterator<Item = &LockRef> {
        self.sets.values().flat_map(|set| set.iter())
    }
}

enum Problem {
    /// The configuration changed after it was read (409): its watch brings the change.
    Stale,
    Failed(String),
}

impl From<String> for Problem {
    fn from(problem: String) -> Self {
        Problem::Failed(problem)
    }
}

/// The watch of the configuration: it only says that the configuration changed.
struct ConfigWatch {
    events:
        BoxStream<'static, Result<watcher::Event<ValidatingWebhookConfiguration>, watcher::Error>>,
    failing: bool,
    errors: LastError,
}

impl ConfigWatch {
    /// (Re)starts the watch; an error already said stays said.
    fn start(&mut self, api: &Api<ValidatingWebhookConfiguration>, name: &str) {
        let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
        self.events = watcher(api.clone(), config)
            .backoff(retry::watcher())
            .boxed();
        self.failing = false;
    }

    /// True when the configuration may have changed; each distinct error is logged once.
    fn take(
        &mut self,
        event: Result<watcher::Event<ValidatingWebhookConfiguration>, watcher::Error>,
        name: &str,
    ) -> bool {
        match event {
            // `Init` comes before each re-list, before it is tried: not a success.
            Ok(watcher::Event::Init) => false,
            Ok(_) => {
                self.errors.clear();
                self.failing = false;
                true
            }
            Err(error) => {
                self.failing = true;
                let refused = retry::watcher_refusal(&error);
                let error = retry::error_chain(&error);
                if !self.errors.is_new(&error) {
                    debug!(%error, "watching the webhook configuration failed again");
                } else if refused {
                    warn!(%error, name = %name, "watching the webhook configuration failed; retrying with backoff (the webhook's identity may not read it: registered with `manifests cluster --broad`? set registration.narrow = false)");
                } else {
                    warn!(%error, name = %name, "watching the webhook configuration failed; retrying with backoff");
                }
                false
            }
        }
    }
}

pub struct Narrower {
    client: Client,
    config: NarrowerConfig,
    metrics: RegistrationMetrics,
    registered: watch::Sender<Registered>,
    /// The base entries of this instance's last write: a write of the same again puts back
    /// what another writer changed (counted as undone).
    last_written: Option<Vec<ValidatingWebhook>>,
    undone_said: bool,
}

impl Narrower {
    pub fn new(client: Client, config: NarrowerConfig, metrics: RegistrationMetrics) -> Self {
        let narrower = Narrower {
            client,
            config,
            metrics,
            registered: watch::Sender::new(Registered::default()),
            last_written: None,
            undone_said: false,
        };
        narrower.current().set(0);
        narrower
    }

    pub fn registered(&self) -> watch::Receiver<Registered> {
        self.registered.subscribe()
    }

    /// Keeps the configuration current from `index` until dropped.
    pub async fn run(mut self, index: Arc<LockIndex>) {
        let api: Api<ValidatingWebhookConfiguration> = Api::all(self.client.clone());
        let name = self.config.name.clone();
        let mut configs = ConfigWatch {
            events: futures::stream::pending().boxed(),
            failing: false,
            errors: LastError::default(),
        };
        configs.start(&api, &name);
        let mut locks = index.subscribe();
        locks.mark_changed();
        let mut view = LockView::default();
        let mut wake: Option<Instant> = None;
        let mut backoff = retry::write(FIRST_RETRY);
        let mut problems = LastError::default();
        let mut dirty = true;
        loop {
            let sleep = tokio::time::sleep_until(wake.unwrap_or_else(Instant::now));
            tokio::select! {
                changed = locks.changed() => {
                    if changed.is_err() {
                        warn!("the lock index is gone; the webhook configuration is no longer kept narrowed");
                        return;
                    }
                    dirty |= view.update(&locks.borrow_and_update().clone());
                    // The index heard from the API server: watch the configuration again now,
                    // not at the end of a backoff of up to half a minute.
                    if configs.failing && index.health(LockKind::Lock).state == WatchState::Live {
                        configs.start(&api, &name);
                    }
                }
                event = configs.events.next() => match event {
                    Some(event) => dirty |= configs.take(event, &name),
                    None => return,
                },
                () = sleep, if wake.is_some() => {
                    wake = None;
                    dirty = true;
                }
            }
            // Take everything already queued before writing: a burst is one write.
            if locks.has_changed().unwrap_or(false) {
                dirty |= view.update(&locks.borrow_and_update().clone());
            }
            while let Some(Some(event)) = configs.events.next().now_or_never() {
                dirty |= configs.take(event, &name);
            }
            if !dirty || view.listed != (true, true) {
                continue;
            }
            dirty = false;
            wake = match self.reconcile(&api, &view).await {
                Ok(next_expiry) => {
                    backoff.reset();
                    problems.clear();
                    // Just after the expiry, so that the plan no longer holds the lock.
                    next_expiry.map(|at| {
                        let left = at.duration_since(Timestamp::now()).unsigned_abs();
                        Instant::now() + left + Duration::from_millis(5)
                    })
                }
                Err(problem) => {
                    let retry = backoff.next().unwrap_or(retry::MAX_WRITE_WAIT);
                    match problem {
                        Problem::Stale => {
                            debug!(
                                name = %name,
                                "the webhook configuration changed since it was read; planning again from the change"
                            )
                        }
                        Problem::Failed(problem) if problems.is_new(&problem) => {
                            warn!(%problem, name = %name, retry_in = ?retry, "cannot narrow the webhook configuration");
                        }
                        Problem::Failed(_) => {}
                    }
                    Some(Instant::now() + retry)
                }
            };
        }
    }

    /// Writes the base entries, then the CREATE and CONNECT entries, where they differ from the
    /// plan; returns when the plan changes by time alone.
    async fn reconcile(
        &mut self,
        api: &Api<ValidatingWebhookConfiguration>,
        view: &LockView,
    ) -> Result<Option<Timestamp>, Problem> {
        let now = Timestamp::now();
        let limits = &self.config.limits;
        let plan = conditions::plan(Clauses::Changes, view.locks(), now, limits);
        let operations = operations::plan(view.locks(), now, limits);
        let live: BTreeSet<LockKey> = (view.locks())
            .filter(|l| !l.spec.is_expired(now))
            .map(LockRef::key)
            .collect();
        let read = api.get_opt(&self.config.name).await;
        let mut current = read.map_err(|e| retry::error_chain(&e))?.ok_or_else(|| {
            self.count("missing");
            format!(
                "no ValidatingWebhookConfiguration {:?}; apply the output of `kube-object-lock manifests cluster`",
                self.config.name
            )
        })?;
        let entries = current.webhooks.as_deref().unwrap_or_default();
        let desired = webhooks(entries, &plan, Format::of(&current)).map_err(|e| {
            self.count("missing");
            e.to_string()
        })?;
        self.metrics
            .locked_names
            .set(i64::try_from(plan.names).unwrap_or(i64::MAX));
        let why = "the configuration read back differs from what was written (another writer, or a defaulted field)";
        let written = self.write(api, FIELD_MANAGER, &current, &desired, is_base_extra, why);
        if let Some(written) = written.await? {
            self.wrote_base(&plan, &desired);
            self.last_written = Some(desired);
            // The CREATE and CONNECT entries are made from the base entries as stored (the base
            // write changes none of the fields they copy), under the resourceVersion it left.
            current = written;
        }
        let entries = current.webhooks.as_deref().unwrap_or_default();
        self.confirm(&plan, live, NamespaceSelection::of(entries));

        let desired = operations::webhooks(entries, &operations).map_err(|e| e.to_string())?;
        let why = "the CREATE and CONNECT entries read back differ from what was written (entries another field manager owns, or a defaulted field)";
        let (manager, ours) = (OPERATIONS_FIELD_MANAGER, operations::is_operation_entry);
        let written = self.write(api, manager, &current, &desired, ours, why);
        if written.await?.is_some() {
            // Entries coming or going are logged; every other write only at debug.
            let after: Vec<&str> = desired.iter().map(|w| w.name.as_str()).collect();
            let before = entries.iter().map(|w| w.name.as_str());
            let (create, connect) = (operations.create.keys.len(), operations.connect.keys.len());
            if before.filter(|name| ours(name)).eq(after.iter().copied()) {
                debug!(
                    create,
                    connect, "webhook entries for CREATE and CONNECT rewritten"
                );
            } else {
                info!(create, connect, entries = ?after, "webhook entries for CREATE and CONNECT written");
            }
        }
        self.confirm_operations(&operations);
        Ok(plan.next_expiry)
    }

    /// Logs a write of the base entries: a change of scope, or (at debug) any write.
    fn wrote_base(&mut self, plan: &ConditionsPlan, desired: &Entries) {
        if self.last_written.as_deref() == Some(desired) {
            self.metrics.undone.inc();
            if !std::mem::replace(&mut self.undone_said, true) {
                warn!(name = %self.config.name, "another writer keeps changing what this instance writes to the webhook configuration (an instance with other registration settings, or a tool re-applying `manifests cluster`); writing it back (kube_object_lock_registration_undone_total counts each time)");
            }
        }
        let (locks, entries) = (plan.names, desired.len());
        match (&plan.scope, &self.registered.borrow().scope) {
            (Scope::Narrow { .. }, Some(RegisteredScope::Narrow(_))) => {
                debug!(locks, entries, "webhook configuration rewritten")
            }
            (Scope::Narrow { .. }, _) => {
                info!(
                    locks,
                    entries, "webhook configuration narrowed to the locked names"
                )
            }
            (Scope::Broad(reason), Some(RegisteredScope::Broad(_))) => {
                debug!(%reason, "webhook configuration rewritten")
            }
            (Scope::Broad(reason), _) => warn!(%reason, "webhook configuration is broad"),
        }
    }

    /// Applies `desired` under `manager` (forced, under the resourceVersion `current` was read
    /// at) unless `current` holds it; returns the stored configuration once written.
    async fn write(
        &self,
        api: &Api<ValidatingWebhookConfiguration>,
        manager: &str,
        current: &ValidatingWebhookConfiguration,
        desired: &Entries,
        ours: fn(&str) -> bool,
        differs: &str,
    ) -> Result<Option<ValidatingWebhookConfiguration>, Problem> {
        let holds = |c: &ValidatingWebhookConfiguration| {
            is_current(c.webhooks.as_deref().unwrap_or_default(), desired, ours)
        };
        if holds(current) {
            return Ok(None);
        }
        let name = &self.config.name;
        let body = serde_json::json!({
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingWebhookConfiguration",
            "metadata": {"name": name, "resourceVersion": current.metadata.resource_version},
            "webhooks": desired,
        });
        let params = PatchParams::apply(manager).force();
        let written = match api.patch(name, &params, &Patch::Apply(&body)).await {
            Ok(written) => written,
            Err(kube::Error::Api(status)) if status.code == 403 => {
                self.count("forbidden");
                return Err(Problem::Failed(format!(
                    "forbidden: {}; grant patch on this validatingwebhookconfiguration (manifests cluster does), or set registration.narrow = false",
                    status.message
                )));
            }
            Err(kube::Error::Api(status)) if status.code == 409 => {
                self.count("conflict");
                return Err(Problem::Stale);
            }
            Err(error) => {
                self.count("error");
                return Err(Problem::Failed(error.to_string()));
            }
        };
        // The answer is the stored object: it must now say what was written.
        if !holds(&written) {
            self.count("error");
            return Err(Problem::Failed(differs.to_owned()));
        }
        self.count("written");
        Ok(Some(written))
    }

    fn count(&self, outcome: &'static str) {
        (self.metrics.writes)
            .get_or_create(&OutcomeLabels { outcome })
            .inc();
        if !matches!(outcome, "written" | "conflict") {
            self.current().set(0);
        }
    }

    fn current(&self) -> prometheus_client::metrics::gauge::Gauge {
        let name = self.config.name.clone();
        (self.metrics.current)
            .get_or_create(&ConfigurationLabels { name })
            .clone()
    }

    fn confirm_operations(&self, plan: &OperationsPlan) {
        let (create, connect) = (plan.create.registered(), plan.connect.registered());
        self.registered.send_if_modified(|r| {
            let changed =
                r.create.as_ref() != Some(&create) || r.connect.as_ref() != Some(&connect);
            r.create = Some(create);
            r.connect = Some(connect);
            changed
        });
    }

    fn confirm(
        &self,
        plan: &ConditionsPlan,
        live: BTreeSet<LockKey>,
        namespaces: NamespaceSelection,
    ) {
        self.current().set(1);
        let narrow = matches!(plan.scope, Scope::Narrow { .. });
        self.metrics.narrowed.set(i64::from(narrow));
        let scope = match &plan.scope {
            Scope::Narrow { .. } => RegisteredScope::Narrow(live),
            Scope::Broad(reason) => RegisteredScope::Broad(reason.to_string()),
        };
        if namespaces != NamespaceSelection::default()
            && namespaces != self.registered.borrow().namespaces
        {
            info!(
                namespaced = %super::describe(&namespaces.locks),
                namespaces = %super::describe(&namespaces.namespaces),
                "locks apply only in the namespaces the registration's namespaceSelector selects"
            );
        }
        self.registered.send_if_modified(|r| {
            let changed = r.scope.as_ref() != Some(&scope) || r.namespaces != namespaces;
            r.scope = Some(scope);
            r.namespaces = namespaces;
            changed
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{LockKind, LockSpec};

    fn lock(ns: &str, name: &str) -> LockRef {
        LockRef::lock(ns, name, LockSpec::default())
    }

    #[test]
    fn only_changes_of_what_locks_count_as_changes() {
        let index = LockIndex::new(Duration::from_secs(3));
        let mut view = LockView::default();
        index.reset(LockKind::Lock, vec![lock("prod", "web")]);
        assert!(view.update(&index.snapshot()));
        assert!(view.listed != (true, true), "ClusterLocks not listed yet");
        index.reset(LockKind::ClusterLock, vec![]);
        assert!(view.update(&index.snapshot()), "listed is a change");
        assert_eq!(view.listed, (true, true));

        // A status write: the same rule again.
        let mut written = lock("prod", "web");
        written.meta = Arc::new(crate::locks::LockMeta {
            resource_version: "2".into(),
            ..Default::default()
        });
        index.apply(LockKind::Lock, written);
        assert!(!view.update(&index.snapshot()), "a status write");
        let mut changed = lock("prod", "web");
        changed.spec.reason = Some("freeze".into());
        index.apply(LockKind::Lock, changed);
        assert!(view.update(&index.snapshot()));
        index.delete(LockKind::Lock, "prod", "web");
        assert!(view.update(&index.snapshot()));
        assert!(!view.update(&index.snapshot()), "already gone");
        assert_eq!(view.locks().count(), 0);
    }
}
