//! The pure part of lock status: what this instance should say about a lock (enforced or why
//! not), and whether what the lock's status shows already says it. No I/O: table-tested in
//! `tests.rs`.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, Time};
use k8s_openapi::jiff::Timestamp;
use tokio::time::{Duration, Instant};

use super::{CONDITION, NamespaceLabels};
use crate::api::{
    self, Enforcer, LockCondition, LockKey, LockMode, LockOperation, LockSpec, LockStatus,
};
use crate::locks::LockRef;
use crate::registration::{self, Registered, RegisteredScope};

/// Whether the webhook configuration sends a lock's requests to the webhook.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Coverage {
    /// Named by the narrowed configuration, or by one this instance does not keep.
    Sent,
    /// Sent because the configuration is broad, for this reason.
    Broad(String),
    /// Not named (or not confirmed named) yet, or its namespace's labels not known yet.
    NotYet,
    /// In a namespace the operator's `namespaceSelector` requirements do not select.
    NotSelected {
        namespace: String,
        /// The requirements, as kubectl writes them.
        selector: String,
    },
    /// UPDATE and DELETE are sent, but the entries of these operations the lock asks for
    /// (CREATE, CONNECT) do not name it yet, or no write of them is confirmed yet.
    OperationsNotYet(Vec<LockOperation>),
    /// Everything else is sent, but these operations the lock asks for never are
    /// ([`NEVER_SENT_WHY`]).
    NeverSent(Vec<LockOperation>),
}

impl Coverage {
    /// `registered` `None`: this instance keeps no configuration. A lock counts as sent once
    /// the base entries and those of each CREATE/CONNECT it asks for name it.
    pub fn of(
        registered: Option<&Registered>,
        namespaces: &NamespaceLabels,
        lock: &LockRef,
    ) -> Coverage {
        let key = &lock.key();
        let (mut never, mut not_yet) = (Vec::new(), Vec::new());
        for &operation in lock.spec.operations() {
            if matches!(operation, LockOperation::Update | LockOperation::Delete) {
                continue;
            }
            match registered {
                _ if operation == LockOperation::Connect && key.namespace.is_none() => {
                    never.push(operation)
                }
                None => never.push(operation),
                Some(registered) if !registered.sends(operation, key) => not_yet.push(operation),
                Some(_) => {}
            }
        }
        let Some(registered) = registered else {
            return if never.is_empty() {
                Coverage::Sent
            } else {
                Coverage::NeverSent(never)
            };
        };
        let Some(scope) = &registered.scope else {
            return Coverage::NotYet;
        };
        // The namespaced entries select by the Lock's namespace; the cluster-scoped one selects
        // Namespace objects by their own labels, and no other cluster-scoped object.
        let selection = &registered.namespaces;
        let (selector, namespace) = match &key.namespace {
            Some(ns) => (&selection.locks, ns),
            None if covers_only_namespaces(&lock.spec) => (&selection.namespaces, &key.name),
            None => (&LabelSelector::default(), &key.name),
        };
        if *selector != LabelSelector::default() {
            match namespaces.labels.get(namespace) {
                _ if !namespaces.listed => return Coverage::NotYet,
                Some(labels) if !registration::selects(selector, labels) => {
                    return Coverage::NotSelected {
                        namespace: namespace.clone(),
                        selector: registration::describe(selector),
                    };
                }
                Some(_) => {}
                // A Lock's namespace exists: the watch has not shown it yet.
                None if key.namespace.is_some() => return Coverage::NotYet,
                // A ClusterLock on a Namespace that does not exist: nothing is left out.
                None => {}
            }
        }
        match scope {
            RegisteredScope::Narrow(_) if !registered.sends(LockOperation::Update, key) => {
                Coverage::NotYet
            }
            _ if !not_yet.is_empty() => Coverage::OperationsNotYet(not_yet),
            _ if !never.is_empty() => Coverage::NeverSent(never),
            RegisteredScope::Broad(reason) => Coverage::Broad(reason.clone()),
            RegisteredScope::Narrow(_) => Coverage::Sent,
        }
    }
}

/// Why CREATE or CONNECT may never be sent.
const NEVER_SENT_WHY: &str = "a registration the instances do not keep (`manifests cluster --broad`, static files) has no rule for CREATE or CONNECT, and CONNECT concerns pods, which no ClusterLock covers";

/// The reason and message of `lock`'s `Enforced` condition at `now`, given whether the
/// configuration sends its requests; it is enforced when the reason is `Enforcing` or
/// `Unparseable`.
fn enforcement(lock: &LockRef, coverage: &Coverage, now: Timestamp) -> (&'static str, String) {
    // Nothing in the namespaces the registration leaves out reaches the webhook, nor do those
    // Namespaces themselves.
    let namespace = match &lock.namespace {
        None if covers_only_namespaces(&lock.spec) => Some(&lock.name),
        namespace => namespace.as_ref(),
    };
    if let Some(ns) = namespace.filter(|ns| api::is_excluded_namespace(ns)) {
        return (
            "NotSentToWebhook",
            format!(
                "namespace {ns} is left out of the webhook registration: its objects never reach the webhook"
            ),
        );
    }
    // Not sent: neither a refusal nor a warning nor an unparsed spec's lock comes of it.
    if let Coverage::NotSelected {
        namespace,
        selector,
    } = coverage
    {
        return (
            "NamespaceNotSelected",
            format!(
                "namespace {namespace} is not selected by the webhook registration's namespaceSelector ({selector}): its objects never reach the webhook (label the namespace to match, or lock elsewhere)"
            ),
        );
    }
    let spec = &lock.spec;
    if lock.problem.is_none() {
        if let Some(at) = spec.expires_at.as_ref().filter(|at| at.0 <= now) {
            let at = at.0;
            return (
                "Expired",
                format!(
                    "expiresAt {at} has passed; the lock no longer applies (delete it, or move expiresAt)"
                ),
            );
        }
        if spec.mode == Some(LockMode::Warn) {
            return (
                "WarnMode",
                "mode Warn: changes are allowed with a warning, not refused".to_owned(),
            );
        }
    }
    let never: &[LockOperation] = match coverage {
        Coverage::NotYet | Coverage::OperationsNotYet(_) => return ("NotYetRegistered", "the webhook configuration does not name this lock yet, so the API server does not send its object's writes to the webhook; it is rewritten within moments (if this stays, see the log for `cannot narrow the webhook configuration`)".to_owned()),
        Coverage::NeverSent(never) => never,
        _ => &[],
    };
    let sent: Vec<LockOperation> = (spec.operations().iter())
        .filter(|op| !never.contains(op))
        .copied()
        .collect();
    if sent.is_empty() && !never.is_empty() {
        return (
            "NotSentToWebhook",
            format!("{} never reaches the webhook: {NEVER_SENT_WHY}", and(never)),
        );
    }
    let verb = if sent.len() == 1 { "is" } else { "are" };
    let mut refused = format!("{} of the locked object {verb} refused", and(&sent));
    if !never.is_empty() {
        refused.push_str(&format!(
            " ({} never reaches the webhook: {NEVER_SENT_WHY})",
            and(never)
        ));
    }
    match (&lock.problem, coverage) {
        (Some(why), _) => (
            "Unparseable",
            format!(
                "the spec does not parse ({why}), so the lock fails closed on objects of its own name: {refused}; its selector, expiry, mode and exemptions are set aside until the spec is fixed"
            ),
        ),
        (None, Coverage::Broad(reason)) => (
            "Enforcing",
            format!(
                "{refused}; status.enforcedBy lists the instances. The webhook configuration is broad ({reason})"
            ),
        ),
        (None, _) => (
            "Enforcing",
            format!("{refused}; status.enforcedBy lists the instances"),
        ),
    }
}

/// `UPDATE`, `UPDATE and DELETE`, `CREATE, UPDATE and DELETE`.
fn and(operations: &[LockOperation]) -> String {
    let names: Vec<&str> = operations.iter().map(|op| op.as_str()).collect();
    match names.as_slice() {
        [] => "nothing".to_owned(),
        [one] => (*one).to_owned(),
        [rest @ .., last] => format!("{} and {last}", rest.join(", ")),
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
    /// The conditions it asserts (while unhealthy, those the other instances wrote).
    pub conditions: Vec<LockCondition>,
}

impl Desired {
    /// The server-side apply configuration of the status. Empty lists are left out: an empty
    /// list would claim the list itself.
    pub fn apply_config(&self, key: &LockKey) -> serde_json::Value {
        let status = LockStatus {
            enforced_by: self.entry.iter().cloned().collect(),
            enforced_count: Some(self.count),
            conditions: self.conditions.clone(),
        };
        let mut config = serde_json::json!({
            "apiVersion": api::API_VERSION,
            "kind": key.kind().as_str(),
            "metadata": {"name": key.name},
            "status": status,
        });
        if let Some(ns) = &key.namespace {
            config["metadata"]["namespace"] = ns.as_str().into();
        }
        config
    }

    /// The last instance withdraws. Cleared by a merge patch carrying the resourceVersion (an
    /// empty apply would leave other instances' conditions; a newer entry gets a 409).
    pub fn clears(&self) -> bool {
        self.entry.is_none() && self.count == 0 && self.conditions.is_empty()
    }

    /// The merge patch [`Desired::clears`] asks for, at `resource_version`.
    pub fn clearing(resource_version: &str) -> serde_json::Value {
        serde_json::json!({
            "metadata": {"resourceVersion": resource_version},
            "status": {"enforcedBy": null, "enforcedCount": 0, "conditions": null},
        })
    }
}

/// What `instance` wants `lock`'s status to say at `now`; `healthy` is the source's health,
/// `coverage` whether the webhook configuration sends the lock's requests.
pub fn desired(
    lock: &LockRef,
    healthy: bool,
    coverage: &Coverage,
    instance: &str,
    now: Timestamp,
) -> Desired {
    let enforcers = &lock.meta.status.enforced_by;
    let others = enforcers.iter().filter(|e| e.instance != instance).count();
    if !healthy {
        // Leaving the shared condition out would strip the fields server-side apply gave this
        // instance from the others' condition (refused): re-apply it; the last one clears.
        let conditions = (lock.meta.status.conditions.iter())
            .filter(|c| others > 0 && c.type_ == super::CONDITION)
            .cloned()
            .collect();
        return Desired {
            entry: None,
            count: others as i64,
            conditions,
        };
    }
    let generation = lock.generation.unwrap_or(0);
    let (reason, message) = enforcement(lock, coverage, now);
    let enforced = matches!(reason, "Enforcing" | "Unparseable");
    let entry = enforced.then(|| {
        let mine = enforcers.iter().find(|e| e.instance == instance);
        Enforcer {
            instance: instance.to_owned(),
            observed_generation: generation,
            since: mine.map_or(Time(now), |e| e.since.clone()),
        }
    });
    let condition = LockCondition {
        type_: CONDITION.to_owned(),
        status: if enforced { "True" } else { "False" }.to_owned(),
        reason: reason.to_owned(),
        message,
        observed_generation: Some(generation),
    };
    Desired {
        count: (others + usize::from(entry.is_some())) as i64,
        entry,
        conditions: vec![condition],
    }
}

/// Whether the status as seen differs from what this instance wants, in the parts it writes:
/// its own entry, the count, and (unless it wrote them already) the conditions.
pub(super) fn needs_write(
    lock: &LockRef,
    desired: &Desired,
    instance: &str,
    applied: Option<&Applied>,
) -> bool {
    let generation = |e: &Enforcer| e.observed_generation;
    // Our write of the same (`since` aside) landed but the watch has not shown it yet: what it
    // shows is older.
    if let Some(applied) = applied
        && !applied.echoed
        && applied.at.elapsed() < ECHO_WAIT
        && applied.desired.entry.as_ref().map(generation) == desired.entry.as_ref().map(generation)
        && (applied.desired.count, &applied.desired.conditions)
            == (desired.count, &desired.conditions)
    {
        return false;
    }
    let status = &lock.meta.status;
    let mine = status.enforced_by.iter().find(|e| e.instance == instance);
    if mine.map(generation) != desired.entry.as_ref().map(generation)
        || status.enforced_count != Some(desired.count)
    {
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

/// A write this instance made: what, the lock's resourceVersion after it, and when answered.
#[derive(Debug)]
pub(super) struct Applied {
    desired: Desired,
    pub(super) version: String,
    at: Instant,
    /// Whether the watch has shown that resourceVersion: from then on, what it shows is newer.
    pub(super) echoed: bool,
}

impl Applied {
    pub(super) fn new(desired: Desired, version: String) -> Applied {
        Applied {
            desired,
            version,
            at: Instant::now(),
            echoed: false,
        }
    }
}

/// How long a write's echo is waited for (a re-list may skip it) before the watch is trusted.
const ECHO_WAIT: Duration = Duration::from_secs(5);

#[cfg(test)]
mod tests;
