//! Keeps the ValidatingWebhookConfiguration narrowed to the live locks of the lock index, with
//!
//! server-side apply (base entries and CREATE/CONNECT entries under two field managers). Invariant:
//! nothing is written before both kinds were listed once; a write counts once read back, and
//! carries the resourceVersion it was planned from.

use std::collections::{BTreeSet, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use futures::{FutureExt, StreamExt};
use k8s_openapi::api::admissionregistration::v1::{
    ValidatingWebhook, ValidatingWebhookConfiguration,
};
use k8s_openapi::jiff::Timestamp;
use kube::Client;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::{WatchStreamExt, watcher};
use tokio::sync::watch;
use tracing::{debug, info, warn};

use super::conditions::{self, Limits, Plan, Scope};
use super::operations::{self, OperationsPlan};
use super::{
    CONDITIONS_FORMAT, Decision, FORMAT_ANNOTATION, Format, NAMESPACES_FORMAT, NamespaceSelection,
    Registered, RegisteredScope, decide, is_current, webhooks,
};
use crate::locks::index::{Change, Follower, LockIndex, WatchState};
use crate::locks::{LockKey, LockKind, LockRef};
use crate::metrics::{ConfigurationLabels, OutcomeLabels, RegistrationMetrics};
use crate::retry::{self, Backoff, LastError};

/// The field manager of the writes of the base entries.
pub const FIELD_MANAGER: &str = "kube-object-lock";
/// The field manager of the writes of the CREATE and CONNECT entries: not the base entries'
/// ([`FIELD_MANAGER`]), whose applies would then remove them.
pub const OPERATIONS_FIELD_MANAGER: &str = "kube-object-lock-operations";

/// The first wait before a failed write is tried again (then doubling, see [`retry::write`]).
const FIRST_RETRY: Duration = Duration::from_millis(250);

/// The writer's configuration.
#[derive(Debug, Clone)]
pub struct NarrowerConfig {
    /// Name of the ValidatingWebhookConfiguration.
    pub name: String,
    /// Bounds of the narrowed registration.
    pub limits: Limits,
}

impl NarrowerConfig {
    fn labels(&self) -> ConfigurationLabels {
        ConfigurationLabels {
            name: self.name.clone(),
        }
    }
}

/// The live locks, followed from the lock index (its sets, shared, not copied): complete once
/// both kinds have been listed.
#[derive(Default)]
struct LockView {
    follower: Follower,
}

impl LockView {
    /// Takes in what changed in the index; true when the plan may change: a lock came, went
    /// or changed what it locks. Most changes do not: every status write of every instance
    /// changes a lock's status only.
    fn update(&mut self, index: &LockIndex) -> bool {
        let listed = self.follower.listed();
        let mut changed = false;
        index.catch_up(&mut self.follower, |change| {
            changed |= match change {
                Change::Put(lock, before) => before.is_none_or(|b| !b.same_rule(lock)),
                Change::Gone(_) => true,
            }
        });
        changed || listed != self.follower.listed()
    }

    fn complete(&self) -> bool {
        let listed = self.follower.listed();
        listed.0 && listed.1
    }

    fn locks(&self) -> impl Iterator<Item = &LockRef> {
        self.follower.locks()
    }
}

/// What a reconcile did: `Ok(Some)` written and read back, `Ok(None)` already current.
type Reconciled = Result<Option<ValidatingWebhookConfiguration>, Problem>;

/// Why a reconcile left the configuration as it was.
#[derive(Debug, PartialEq)]
enum Problem {
    /// The configuration changed after it was read (409): the watch brings the change, and the
    /// next plan starts from it.
    Stale,
    /// Anything else, as logged.
    Failed(String),
}

impl From<String> for Problem {
    fn from(problem: String) -> Self {
        Problem::Failed(problem)
    }
}

/// The base entries' reconcile, then the CREATE and CONNECT entries'.
type Reconciles = [Reconciled; 2];

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
        metrics.current.get_or_create(&config.labels()).set(0);
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

    /// Keeps the configuration current from what the admission path's `index` holds, until
    /// the future is dropped.
    pub async fn run(self, index: Arc<LockIndex>) {
        let api: Api<ValidatingWebhookConfiguration> = Api::all(self.client.clone());
        let watch_configs = || {
            watcher(
                api.clone(),
                watcher::Config::default().fields(&format!("metadata.name={}", self.config.name)),
            )
            .backoff(retry::watcher())
            .boxed()
        };
        let mut configs = watch_configs();
        // Whether the configuration's watch is failing (and backing off).
        let mut configs_failing = false;
        let mut locks = index.subscribe();
        // The first round reads what the index already holds.
        locks.mark_changed();
        let mut view = LockView::default();
        let mut config = ConfigView::default();
        let mut wake: Option<tokio::time::Instant> = None;
        let mut backoff = retry::write(FIRST_RETRY);
        let mut last_problem = LastError::default();
        let mut last_config_error = LastError::default();
        // Whether anything the plan or the write depends on changed since the last reconcile.
        let mut dirty = true;
        // At most one write at a time; lock changes keep being taken in while it runs, and the
        // next write carries all of them (a burst of Locks is a few writes, not one per Lock).
        let mut inflight: Option<futures::future::BoxFuture<'_, Reconciles>> = None;
        // The list of the configuration the write in flight was planned under.
        let mut planned_under = 0;
        // What changed since the last reconcile: a lock, another writer's configuration.
        let (mut locks_changed, mut config_changed) = (true, false);
        // Whether the write in flight answers another writer's change only.
        let mut answering = false;
        let mut undoing = Undoing::default();
        loop {
            let deadline = wake
                .unwrap_or_else(|| tokio::time::Instant::now() + Duration::from_secs(24 * 3600));
            tokio::select! {
                results = async { inflight.as_mut().expect("guarded").await }, if inflight.is_some() => {
                    inflight = None;
                    let mut outcome = Ok(());
                    let mut entries = None;
                    for result in results {
                        match result {
                            Ok(Some(written)) => {
                                entries = Some(Undoing::fingerprint(&written));
                                // A re-list since may have skipped its echo: what it listed
                                // is newer.
                                if planned_under == config.lists {
                                    config.wrote(written);
                                }
                            }
                            Ok(None) => {}
                            Err(Problem::Stale) => {
                                config.stale();
                                outcome = outcome.and(Err(Problem::Stale));
                            }
                            Err(problem) => outcome = outcome.and(Err(problem)),
                        }
                    }
                    match outcome {
                        Ok(()) => {
                            backoff.reset();
                            if let Some(entries) = entries {
                                last_problem.clear();
                                let now = tokio::time::Instant::now();
                                if answering && undoing.repeats(entries) {
                                    self.metrics.undone.inc();
                                }
                                if undoing.wrote(now, entries, answering) {
                                    warn!(name = %self.config.name, every = ?MAX_HOLD, "another writer keeps changing what this instance writes to the webhook configuration (an instance of another version, or with other registration settings); answering its changes at most this often, lock changes at once");
                                }
                            }
                        }
                        Err(problem) => {
                            let retry = backoff.next().unwrap_or(retry::MAX_WRITE_WAIT);
                            match problem {
                                Problem::Stale => debug!(name = %self.config.name, "the webhook configuration changed since it was read; planning again from the change"),
                                Problem::Failed(problem) => if last_problem.is_new(&problem) {
                                    warn!(%problem, name = %self.config.name, retry_in = ?retry, "cannot narrow the webhook configuration");
                                },
                            }
                            let again = tokio::time::Instant::now() + retry;
                            wake = Some(wake.map_or(again, |w| w.min(again)));
                        }
                    }
                }
                changed = locks.changed() => match changed {
                    Ok(()) => {
                        locks.borrow_and_update();
                        locks_changed |= view.update(&index);
                        // The index heard from the API server (its watches are woken as soon
                        // as it answers again): watch the configuration again now, not at the
                        // end of a backoff of up to half a minute.
                        if configs_failing && index.health(LockKind::Lock).state == WatchState::Live {
                            configs = watch_configs();
                            configs_failing = false;
                        }
                    }
                    Err(_) => {
                        warn!("the lock index is gone; the webhook configuration is no longer kept narrowed");
                        return;
                    }
                },
                event = configs.next() => match event {
                    Some(Ok(event)) => {
                        // `Init` comes before each re-list, before it is tried: not a success.
                        if !matches!(event, watcher::Event::Init) {
                            last_config_error.clear();
                            configs_failing = false;
                        }
                        config_changed |= config.apply(event);
                    }
                    // Once per distinct error, its repeats at debug.
                    Some(Err(error)) => {
                        configs_failing = true;
                        let refused = retry::watcher_refusal(&error);
                        let error = retry::error_chain(&error);
                        if !last_config_error.is_new(&error) {
                            debug!(%error, "watching the webhook configuration failed again");
                        } else if refused {
                            warn!(%error, name = %self.config.name, "watching the webhook configuration failed; retrying with backoff (the webhook's identity may not read it: registered with `manifests cluster --broad`? set registration.narrow = false)");
                        } else {
                            warn!(%error, name = %self.config.name, "watching the webhook configuration failed; retrying with backoff");
                        }
                    }
                    None => return,
                },
                // An expiry or a retry is due.
                // (Recomputed by the reconcile it triggers.)
                () = tokio::time::sleep_until(deadline) => {
                    wake = None;
                    dirty = true;
                }
            }
            // Take everything already queued before writing: a burst of lock changes becomes
            // one write.
            if locks.has_changed().unwrap_or(false) {
                locks.borrow_and_update();
                locks_changed |= view.update(&index);
            }
            while let Some(Some(Ok(event))) = configs.next().now_or_never() {
                config_changed |= config.apply(event);
            }
            dirty |= locks_changed || config_changed;
            if !dirty || inflight.is_some() || !view.complete() || !config.listed {
                continue;
            }
            let answers = config_changed && !locks_changed;
            if answers
                && let Some(until) = undoing.hold_until()
                && until > tokio::time::Instant::now()
            {
                wake = Some(wake.map_or(until, |w| w.min(until)));
                continue;
            }
            if locks_changed {
                undoing = Undoing::default();
            }
            answering = answers;
            (dirty, locks_changed, config_changed) = (false, false, false);
            let now = Timestamp::now();
            let plan = conditions::plan(view.locks(), now, &self.config.limits);
            // This reconcile supersedes a pending retry; a failure schedules the next one.
            wake = plan.next_expiry.map(|at| {
                let left = at.duration_since(now).unsigned_abs();
                tokio::time::Instant::now() + left + Duration::from_millis(5)
            });
            let (this, api) = (&self, &api);
            // What the configuration names once written: the live locks of the plan.
            let live: BTreeSet<LockKey> = (view.locks())
                .filter(|l| !l.spec.is_expired(now))
                .map(LockRef::key)
                .collect();
            let operations = operations::plan(view.locks(), now, &self.config.limits);
            let current = config.current().cloned();
            planned_under = config.lists;
            inflight = Some(Box::pin(async move {
                let base = this.reconcile(api, current.as_ref(), &plan, live).await;
                // Made from the base entries as stored (the base write changes none of the
                // fields they copy), under the resourceVersion the base write left.
                let stored = match &base {
                    Ok(Some(written)) => Some(written),
                    _ => current.as_ref(),
                };
                let operations = this.reconcile_operations(api, stored, &operations).await;
                [base, operations]
            }));
        }
    }

    /// Writes the plan if the configuration does not say it yet. `Ok(Some)` = written and read
    /// back, `Ok(None)` = already current.
    async fn reconcile(
        &self,
        api: &Api<ValidatingWebhookConfiguration>,
        current: Option<&ValidatingWebhookConfiguration>,
        plan: &Plan,
        live: BTreeSet<LockKey>,
    ) -> Reconciled {
        let Some(current) = current else {
            self.count("missing");
            return Err(Problem::Failed(format!(
                "no ValidatingWebhookConfiguration {:?}; apply the output of `kube-object-lock manifests cluster`",
                self.config.name
            )));
        };
        let entries = current.webhooks.as_deref().unwrap_or_default();
        let decision = decide(current);
        let format = match decision {
            Decision::Write(format) => format,
            Decision::FallBack => Format::Conditions,
        };
        let desired = webhooks(entries, plan, format).map_err(|e| {
            self.count("missing");
            Problem::Failed(e.to_string())
        })?;
        self.metrics
            .locked_names
            .set(i64::try_from(plan.names).unwrap_or(i64::MAX));
        if decision != Decision::FallBack && is_current(entries, &desired) {
            self.confirm(plan, live, NamespaceSelection::of(entries));
            return Ok(None);
        }
        let mut metadata = self.metadata(current);
        if decision == Decision::FallBack {
            warn!(
                name = %self.config.name,
                "an instance of an earlier version writes the webhook configuration (conditions without the format marker next to a narrowed namespaceSelector): narrowing the conditions only, with the broad namespaceSelector; once every instance runs this version, set the annotation {FORMAT_ANNOTATION}={NAMESPACES_FORMAT} again"
            );
            metadata["annotations"] = serde_json::json!({ FORMAT_ANNOTATION: CONDITIONS_FORMAT });
        }
        let written = self.apply(api, FIELD_MANAGER, metadata, &desired).await?;
        // The answer is the stored object: it must now say what was written.
        if !is_current(written.webhooks.as_deref().unwrap_or_default(), &desired) {
            self.count("error");
            return Err(Problem::Failed("the configuration read back differs from what was written (another writer, or a defaulted field)".to_owned()));
        }
        self.count("written");
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
        self.confirm(plan, live, NamespaceSelection::of(&desired));
        Ok(Some(written))
    }

    /// Writes the CREATE and CONNECT entries if the configuration does not say them yet, under
    /// [`OPERATIONS_FIELD_MANAGER`], listing only them. A configuration or a base entry missing
    /// is the base reconcile's to report.
    async fn reconcile_operations(
        &self,
        api: &Api<ValidatingWebhookConfiguration>,
        current: Option<&ValidatingWebhookConfiguration>,
        plan: &OperationsPlan,
    ) -> Reconciled {
        let Some(current) = current else {
            return Ok(None);
        };
        let entries = current.webhooks.as_deref().unwrap_or_default();
        let desired = operations::webhooks(entries, plan).map_err(|e| e.to_string())?;
        if operations::is_current(entries, &desired) {
            self.confirm_operations(plan);
            return Ok(None);
        }
        let metadata = self.metadata(current);
        let written = (self.apply(api, OPERATIONS_FIELD_MANAGER, metadata, &desired)).await?;
        if !operations::is_current(written.webhooks.as_deref().unwrap_or_default(), &desired) {
            self.count("error");
            return Err(Problem::Failed("the CREATE and CONNECT entries read back differ from what was written (entries another field manager owns, or a defaulted field)".to_owned()));
        }
        self.count("written");
        // Entries coming or going are logged; every other write only at debug.
        let names = |entries: &[ValidatingWebhook]| -> Vec<String> {
            (entries.iter())
                .filter(|w| operations::is_operation_entry(&w.name))
                .map(|w| w.name.clone())
                .collect()
        };
        let (before, after) = (names(entries), names(&desired));
        let (create, connect) = (plan.create.keys.len(), plan.connect.keys.len());
        if before == after {
            debug!(
                create,
                connect, "webhook entries for CREATE and CONNECT rewritten"
            );
        } else {
            info!(create, connect, entries = ?after, "webhook entries for CREATE and CONNECT written");
        }
        self.confirm_operations(plan);
        Ok(Some(written))
    }

    /// The metadata of a write planned from `read`: its name, and its resourceVersion as the
    /// write's precondition.
    fn metadata(&self, read: &ValidatingWebhookConfiguration) -> serde_json::Value {
        let mut metadata = serde_json::json!({"name": self.config.name});
        if let Some(version) = &read.metadata.resource_version {
            metadata["resourceVersion"] = version.as_str().into();
        }
        metadata
    }

    /// Applies `entries` (and `metadata`) as `manager`, forced; the answer is the stored object.
    async fn apply(
        &self,
        api: &Api<ValidatingWebhookConfiguration>,
        manager: &str,
        metadata: serde_json::Value,
        entries: &[ValidatingWebhook],
    ) -> Result<ValidatingWebhookConfiguration, Problem> {
        let body = serde_json::json!({
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingWebhookConfiguration",
            "metadata": metadata,
            "webhooks": entries,
        });
        let params = PatchParams::apply(manager).force();
        match (api.patch(&self.config.name, &params, &Patch::Apply(&body))).await {
            Ok(written) => Ok(written),
            Err(kube::Error::Api(status)) if status.code == 403 => {
                self.count("forbidden");
                Err(Problem::Failed(format!(
                    "forbidden: {}; grant patch on this validatingwebhookconfiguration (manifests cluster does), or set registration.narrow = false",
                    status.message
                )))
            }
            Err(kube::Error::Api(status)) if status.code == 409 => {
                self.count("conflict");
                Err(Problem::Stale)
            }
            Err(error) => {
                self.count("error");
                Err(Problem::Failed(error.to_string()))
            }
        }
    }

    /// Counts a write of the configuration by its outcome.
    fn count(&self, outcome: &'static str) {
        (self.metrics.writes)
            .get_or_create(&OutcomeLabels { outcome })
            .inc();
        if !matches!(outcome, "written" | "conflict") {
            let current = self.metrics.current.get_or_create(&self.config.labels());
            current.set(0);
        }
    }

    /// Publishes what the CREATE and CONNECT entries now say.
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

    /// Publishes what the configuration now says.
    fn confirm(&self, plan: &Plan, live: BTreeSet<LockKey>, namespaces: NamespaceSelection) {
        self.metrics
            .current
            .get_or_create(&self.config.labels())
            .set(1);
        let scope = match &plan.scope {
            Scope::Narrow { .. } => {
                self.metrics.narrowed.set(1);
                RegisteredScope::Narrow(live)
            }
            Scope::Broad(reason) => {
                self.metrics.narrowed.set(0);
                RegisteredScope::Broad(reason.to_string())
            }
        };
        if !namespaces.is_everything() && namespaces != self.registered.borrow().namespaces {
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

/// The longest an answer to another writer's change waits, once they keep undoing each other.
const MAX_HOLD: Duration = Duration::from_secs(30);

/// Rewrites answering another writer's change taken at once before they wait.
const FREE_REWRITES: u32 = 3;

/// Another writer undoing this instance's writes, each answering the other at once, forever:
/// during a rolling upgrade, an instance of another version computing other entries (or one
/// with other registration settings). Such a rewrite answers another writer's change with the
/// very entries this instance wrote last; two writers racing through a burst of Lock changes
/// write new entries each time instead. After [`FREE_REWRITES`] such rewrites, each less than
/// twice [`MAX_HOLD`] after the last, the next waits, doubling up to [`MAX_HOLD`]: a few writes
/// a minute instead of a storm that makes every API server reload its webhooks. Lock changes
/// are written at once whatever, and start the count again.
#[derive(Default)]
struct Undoing {
    rewrites: u32,
    last: Option<tokio::time::Instant>,
    /// A hash of the entries of the last write.
    entries: Option<u64>,
}

impl Undoing {
    /// What the entries of a write hash to.
    fn fingerprint(written: &ValidatingWebhookConfiguration) -> u64 {
        use std::hash::{Hash, Hasher};
        let mut hasher = std::collections::hash_map::DefaultHasher::new();
        serde_json::to_string(&written.webhooks)
            .unwrap_or_default()
            .hash(&mut hasher);
        hasher.finish()
    }

    /// A write of `entries` (a [`Undoing::fingerprint`]), `answering` another writer's change
    /// or not; true when the waits begin.
    fn wrote(&mut self, at: tokio::time::Instant, entries: u64, answering: bool) -> bool {
        let again = self.entries.replace(entries) == Some(entries);
        let quiet = self.last.is_some_and(|last| at > last + 2 * MAX_HOLD);
        if !(answering && again) || quiet {
            self.rewrites = 0;
        }
        if !(answering && again) {
            return false;
        }
        self.rewrites += 1;
        self.last = Some(at);
        self.rewrites == FREE_REWRITES
    }

    /// True when a write of `entries` puts back this instance's last write.
    fn repeats(&self, entries: u64) -> bool {
        self.entries == Some(entries)
    }

    /// Until when an answer to another writer's change waits.
    fn hold_until(&self) -> Option<tokio::time::Instant> {
        let doublings = self.rewrites.checked_sub(FREE_REWRITES)?;
        let hold = Duration::from_secs(1 << doublings.min(5)).min(MAX_HOLD);
        Some(self.last? + hold)
    }
}

/// How many resourceVersions the watch delivered are remembered, to tell whether a write's
/// echo has come already.
const REMEMBERED_VERSIONS: usize = 64;

/// The configuration as this instance last knows it.
///
/// The watch runs behind the writes: during a burst of lock changes it still delivers the
/// object as this instance wrote it two or three writes ago, and whatever others wrote before.
/// A watch delivers in the order of the writes, so until it delivers this instance's last
/// write, that write's answer is the newest version known, and every event is older: taken as
/// current, each would cause one more write, refused as planned from an old version. Another
/// writer's change (or `manifests cluster` applied again) after it counts.
#[derive(Default)]
struct ConfigView {
    /// What the watch delivered last.
    watched: Option<ValidatingWebhookConfiguration>,
    /// This instance's last write, until the watch delivers it.
    unseen: Option<ValidatingWebhookConfiguration>,
    /// resourceVersions the watch delivered, oldest first.
    delivered: VecDeque<String>,
    /// Listed once, and not re-listing now.
    listed: bool,
    /// How many times the watch started a list.
    lists: u64,
}

impl ConfigView {
    /// The newest version known.
    fn current(&self) -> Option<&ValidatingWebhookConfiguration> {
        self.unseen.as_ref().or(self.watched.as_ref())
    }

    fn version(&self) -> Option<&str> {
        self.current()?.metadata.resource_version.as_deref()
    }

    /// Applies a watch event; true when the configuration may now differ from the plan.
    fn apply(&mut self, event: watcher::Event<ValidatingWebhookConfiguration>) -> bool {
        match event {
            // A list says what is stored now, whoever wrote it, and skips the history between.
            watcher::Event::InitApply(c) => {
                self.unseen = None;
                self.deliver(c);
                true
            }
            watcher::Event::Apply(c) => {
                let before = self.version().map(str::to_owned);
                if self.unseen.as_ref().map(|u| &u.metadata.resource_version)
                    == Some(&c.metadata.resource_version)
                {
                    self.unseen = None;
                }
                self.deliver(c);
                self.version() != before.as_deref()
            }
            watcher::Event::Delete(_) => {
                self.unseen = None;
                self.watched = None;
                true
            }
            // A re-list (after an API server restart, a 410): what it held is unknown until the
            // list completes, and "missing" meanwhile would be a false alarm and a backoff.
            watcher::Event::Init => {
                self.unseen = None;
                self.watched = None;
                self.listed = false;
                self.lists += 1;
                false
            }
            watcher::Event::InitDone => {
                self.listed = true;
                true
            }
        }
    }

    fn deliver(&mut self, config: ValidatingWebhookConfiguration) {
        if let Some(version) = &config.metadata.resource_version {
            if self.delivered.len() == REMEMBERED_VERSIONS {
                self.delivered.pop_front();
            }
            self.delivered.push_back(version.clone());
        }
        self.watched = Some(config);
    }

    /// A write was refused as planned from an old version: whatever this instance wrote
    /// last, what the watch delivers is not older.
    fn stale(&mut self) {
        self.unseen = None;
    }

    /// Records this instance's own write, as the API server answered it: the newest version
    /// known, unless the watch delivered it already (with whatever came after it).
    fn wrote(&mut self, written: ValidatingWebhookConfiguration) {
        let version = written.metadata.resource_version.as_ref();
        if !version.is_some_and(|v| self.delivered.contains(v)) {
            self.unseen = Some(written);
        }
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
        index.reset(LockKind::ClusterLock, vec![]);
        assert!(view.update(&index));
        assert!(view.complete());
        // A status write: the same rule again.
        let mut written = lock("prod", "web");
        written.meta = Arc::new(crate::locks::LockMeta {
            resource_version: "2".into(),
            ..Default::default()
        });
        index.apply(LockKind::Lock, written);
        assert!(!view.update(&index), "a status write");
        let mut changed = lock("prod", "web");
        changed.spec.reason = Some("freeze".into());
        index.apply(LockKind::Lock, changed);
        assert!(view.update(&index));
        index.delete(LockKind::Lock, "prod", "web");
        assert!(view.update(&index));
        assert!(!view.update(&index), "already gone");
        assert_eq!(view.locks().count(), 0);
    }

    /// The configuration at `version`.
    fn config(version: &str) -> ValidatingWebhookConfiguration {
        let mut c = ValidatingWebhookConfiguration::default();
        c.metadata.resource_version = Some(version.to_owned());
        c
    }

    #[test]
    fn a_relist_of_the_configuration_is_not_taken_for_a_missing_one() {
        let mut view = ConfigView::default();
        assert!(!view.apply(watcher::Event::Init));
        assert!(view.apply(watcher::Event::InitApply(config("1"))));
        assert!(view.apply(watcher::Event::InitDone));
        assert!(view.listed && view.current().is_some());
        assert!(!view.apply(watcher::Event::Init));
        assert!(!view.listed, "not known again until the re-list completes");
        view.wrote(config("2"));
        view.apply(watcher::Event::Init);
        assert!(view.current().is_none());
        view.apply(watcher::Event::InitApply(config("2")));
        assert!(
            view.current().is_some(),
            "a listed write of its own is still what is stored"
        );
        view.apply(watcher::Event::InitDone);
        assert!(view.listed && view.current().is_some());
        assert!(view.apply(watcher::Event::Delete(config("1"))));
        assert!(
            view.listed && view.current().is_none(),
            "deleted: known missing"
        );
    }

    #[test]
    fn late_echoes_of_its_own_writes_are_not_taken_for_changes() {
        let mut view = ConfigView::default();
        let version = |view: &ConfigView| view.version().map(str::to_owned);
        view.apply(watcher::Event::InitApply(config("1")));
        view.apply(watcher::Event::InitDone);
        view.wrote(config("2"));
        view.wrote(config("3"));
        // The watch catches up: neither echo changes anything.
        assert!(!view.apply(watcher::Event::Apply(config("2"))));
        assert!(!view.apply(watcher::Event::Apply(config("3"))));
        assert_eq!(version(&view).as_deref(), Some("3"));
        // Someone else's write counts.
        assert!(view.apply(watcher::Event::Apply(config("4"))));
        assert_eq!(version(&view).as_deref(), Some("4"));
        // Whatever comes before the echo of its last write is older than that write's answer.
        view.wrote(config("6"));
        assert!(!view.apply(watcher::Event::Apply(config("5"))));
        assert!(!view.apply(watcher::Event::Apply(config("6"))));
        assert_eq!(version(&view).as_deref(), Some("6"));
        assert!(view.apply(watcher::Event::Apply(config("7"))));
        assert_eq!(version(&view).as_deref(), Some("7"));
        // An echo delivered before the write's answer, and another writer's change after it:
        // the answer is not newer than what the watch brought.
        assert!(view.apply(watcher::Event::Apply(config("8"))));
        assert!(view.apply(watcher::Event::Apply(config("9"))));
        view.wrote(config("8"));
        assert_eq!(version(&view).as_deref(), Some("9"));
        assert!(view.apply(watcher::Event::Apply(config("10"))));
        // A write that changed nothing answers with the version the watch already delivered.
        view.wrote(config("10"));
        assert!(view.apply(watcher::Event::Apply(config("11"))));
        assert_eq!(version(&view).as_deref(), Some("11"));
    }

    #[test]
    fn a_refused_write_leaves_the_configuration_to_the_watch() {
        let mut view = ConfigView::default();
        view.apply(watcher::Event::Init);
        view.apply(watcher::Event::InitApply(config("1")));
        view.apply(watcher::Event::InitDone);
        // A write whose echo a re-list skipped is waited for in vain...
        view.wrote(config("2"));
        view.apply(watcher::Event::Init);
        assert_eq!(view.lists, 2, "the run loop drops answers planned before");
        view.apply(watcher::Event::InitApply(config("3")));
        view.apply(watcher::Event::InitDone);
        assert_eq!(view.version(), Some("3"));
        // ... and when a write planned from its own last write is refused, the watch has the say.
        view.wrote(config("4"));
        assert!(!view.apply(watcher::Event::Apply(config("5"))));
        view.stale();
        assert_eq!(view.version(), Some("5"));
        assert!(view.apply(watcher::Event::Apply(config("6"))));
    }

    #[test]
    fn answers_to_a_writer_undoing_this_one_wait_after_a_few() {
        let mut undoing = Undoing::default();
        let at = tokio::time::Instant::now();
        // Writes of new entries, answering or not: a race through a burst of Lock changes.
        for entries in 0..10 {
            assert!(!undoing.wrote(at, entries, entries % 2 == 0));
        }
        assert_eq!(undoing.hold_until(), None);
        // The same entries again and again, each answering another writer's change.
        assert!(!undoing.wrote(at, 9, true));
        assert!(!undoing.wrote(at, 9, true));
        assert!(undoing.wrote(at, 9, true), "the waits begin");
        assert_eq!(undoing.hold_until(), Some(at + Duration::from_secs(1)));
        assert!(!undoing.wrote(at, 9, true));
        assert_eq!(undoing.hold_until(), Some(at + Duration::from_secs(2)));
        (0..40).for_each(|_| _ = undoing.wrote(at, 9, true));
        assert_eq!(undoing.hold_until(), Some(at + MAX_HOLD));
        // Quiet for long enough: the next ones are taken at once again.
        let later = at + 2 * MAX_HOLD + Duration::from_secs(1);
        assert!(!undoing.wrote(later, 9, true));
        assert_eq!(undoing.hold_until(), None);
        // A Lock change writes new entries: the count starts again.
        (0..5).for_each(|_| _ = undoing.wrote(at, 9, true));
        assert!(undoing.hold_until().is_some());
        assert!(!undoing.wrote(at, 10, false));
        assert_eq!(undoing.hold_until(), None);
    }

    #[test]
    fn the_index_feeds_the_view_once_listed_and_then_by_changed_namespace() {
        use crate::locks::index::WatchState;
        let index = LockIndex::new(Duration::from_secs(3));
        let mut view = LockView::default();
        let step = |index: &LockIndex, view: &mut LockView| view.update(index);
        // A first list that fails is not an empty list: nothing is sent.
        index.set_state(
            LockKind::ClusterLock,
            WatchState::Stale,
            Some("forbidden".into()),
        );
        assert!(!step(&index, &mut view));
        index.reset(LockKind::Lock, vec![lock("a", "x"), lock("b", "y")]);
        step(&index, &mut view);
        assert_eq!(view.locks().count(), 2);
        assert!(!view.complete(), "ClusterLocks not listed yet");
        index.reset(
            LockKind::ClusterLock,
            vec![LockRef::cluster_lock("n", LockSpec::default())],
        );
        step(&index, &mut view);
        assert!(view.complete());
        assert_eq!(view.locks().count(), 3);
        // A change in one namespace: the view follows.
        index.apply(LockKind::Lock, lock("a", "z"));
        assert!(step(&index, &mut view));
        assert_eq!(view.locks().count(), 4);
        index.delete(LockKind::Lock, "b", "y");
        assert!(step(&index, &mut view));
        assert_eq!(view.locks().count(), 3);
        // A re-list while the watch fails: what it drops, the view drops.
        index.set_state(
            LockKind::Lock,
            WatchState::Stale,
            Some("watch forbidden".into()),
        );
        index.reset(LockKind::Lock, vec![lock("a", "x"), lock("c", "w")]);
        step(&index, &mut view);
        let mut keys: Vec<_> = view.locks().map(LockRef::key).collect();
        keys.sort();
        assert_eq!(
            keys,
            [
                LockKey::cluster_lock("n"),
                LockKey::lock("a", "x"),
                LockKey::lock("c", "w"),
            ]
        );
        // Nothing changed: no change.
        assert!(!step(&index, &mut view));
    }
}
