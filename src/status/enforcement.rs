//! The pure part of lock status: what this instance should say about a lock (enforced or why
//! not), and whether what the lock's status shows already says it. No I/O: table-tested in
//! `tests.rs`.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, Time};
use k8s_openapi::jiff::Timestamp;
use tokio::time::{Duration, Instant};

use super::{CONDITION, NamespaceLabels};
use crate::api::{self, Enforcer, LockCondition, LockKey, LockMode, LockOperation, LockSpec};
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
    /// Everything else is sent, but these operations the lock asks for never are: the
    /// configuration is one this instance keeps no copy of (`manifests cluster --broad`,
    /// static files), which has no rules for CREATE or CONNECT; or CONNECT of a ClusterLock
    /// (only pods are connected to, and they are namespaced).
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
            RegisteredScope::Narrow(_) if !registered.covers(key) => Coverage::NotYet,
            _ if !not_yet.is_empty() => Coverage::OperationsNotYet(not_yet),
            _ if !never.is_empty() => Coverage::NeverSent(never),
            RegisteredScope::Broad(reason) => Coverage::Broad(reason.clone()),
            RegisteredScope::Narrow(_) => Coverage::Sent,
        }
    }
}

/// Why a lock is or is not enforced, as this instance sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Enforcement {
    /// Refuses changes to its object.
    Enforcing(Refused),
    /// Refuses changes to its object; the configuration is broad for this reason.
    EnforcingBroad(Refused, String),
    /// The spec does not parse (why); it fails closed on the lock's own name.
    EnforcingUnparsed(String, Refused),
    /// `expiresAt` has passed.
    Expired(Timestamp),
    /// Mode Warn: changes are allowed with a warning.
    WarnMode,
    /// The namespace is left out of the webhook registration.
    NotSent(String),
    /// The namespace is not selected by the operator's requirements in the registration.
    NamespaceNotSelected {
        namespace: String,
        /// The requirements, as kubectl writes them.
        selector: String,
    },
    /// The narrowed configuration does not name the lock yet.
    NotYetRegistered,
    /// Every operation the lock refuses is one the configuration never sends (CREATE or
    /// CONNECT, see [`Coverage::NeverSent`]).
    OperationsNotSent(Vec<LockOperation>),
}

/// The operations an enforced lock refuses, and those of them the configuration never sends.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Refused {
    /// As asked for (UPDATE and DELETE by default).
    pub operations: Vec<LockOperation>,
    /// Of those, the ones never sent to the webhook.
    pub never_sent: Vec<LockOperation>,
}

impl Refused {
    /// The same, with `never` never sent.
    fn never_sent(self, never: &[LockOperation]) -> Refused {
        Refused {
            never_sent: never.to_vec(),
            ..self
        }
    }

    /// `UPDATE and DELETE of the locked object are refused`, and what is not.
    fn describe(&self) -> String {
        let sent: Vec<LockOperation> = (self.operations.iter())
            .filter(|op| !self.never_sent.contains(op))
            .copied()
            .collect();
        let verb = if sent.len() == 1 { "is" } else { "are" };
        let mut text = format!("{} of the locked object {verb} refused", and(&sent));
        if !self.never_sent.is_empty() {
            text.push_str(&format!(
                " ({} never reaches the webhook: {})",
                and(&self.never_sent),
                NEVER_SENT_WHY
            ));
        }
        text
    }
}

/// Why CREATE or CONNECT may never be sent.
const NEVER_SENT_WHY: &str = "a registration the instances do not keep (`manifests cluster --broad`, static files) has no rule for CREATE or CONNECT, and CONNECT concerns pods, which no ClusterLock covers";

/// `UPDATE`, `UPDATE and DELETE`, `CREATE, UPDATE and DELETE`.
fn and(operations: &[LockOperation]) -> String {
    let names: Vec<&str> = operations.iter().map(|op| op.as_str()).collect();
    match names.as_slice() {
        [] => "nothing".to_owned(),
        [one] => (*one).to_owned(),
        [rest @ .., last] => format!("{} and {last}", rest.join(", ")),
    }
}

impl Enforcement {
    /// How `lock` stands at `now`.
    pub fn of(lock: &LockRef, now: Timestamp) -> Enforcement {
        // Nothing in the namespaces the registration leaves out reaches the webhook, nor do
        // those Namespaces themselves.
        match &lock.namespace {
            Some(ns) if api::is_excluded_namespace(ns) => {
                return Enforcement::NotSent(ns.clone());
            }
            None if api::is_excluded_namespace(&lock.name)
                && covers_only_namespaces(&lock.spec) =>
            {
                return Enforcement::NotSent(lock.name.clone());
            }
            _ => {}
        }
        let spec = &lock.spec;
        let refused = Refused {
            operations: spec.operations().to_vec(),
            never_sent: Vec::new(),
        };
        match (&lock.problem, &spec.expires_at) {
            (Some(why), _) => Enforcement::EnforcingUnparsed(why.clone(), refused),
            (None, Some(at)) if at.0 <= now => Enforcement::Expired(at.0),
            _ if spec.mode == Some(LockMode::Warn) => Enforcement::WarnMode,
            _ => Enforcement::Enforcing(refused),
        }
    }

    /// How `lock` stands at `now`, given whether the configuration sends its requests.
    pub fn with_coverage(lock: &LockRef, coverage: &Coverage, now: Timestamp) -> Enforcement {
        let enforcement = Enforcement::of(lock, now);
        // Not sent: neither a refusal nor a warning nor an unparsed spec's lock comes of it.
        if let Coverage::NotSelected {
            namespace,
            selector,
        } = coverage
            && !matches!(enforcement, Enforcement::NotSent(_))
        {
            return Enforcement::NamespaceNotSelected {
                namespace: namespace.clone(),
                selector: selector.clone(),
            };
        }
        if !enforcement.is_enforced() {
            return enforcement;
        }
        match (coverage, enforcement) {
            (Coverage::NotYet | Coverage::OperationsNotYet(_), _) => Enforcement::NotYetRegistered,
            (Coverage::Broad(reason), Enforcement::Enforcing(refused)) => {
                Enforcement::EnforcingBroad(refused, reason.clone())
            }
            (
                Coverage::NeverSent(never),
                Enforcement::Enforcing(refused) | Enforcement::EnforcingUnparsed(_, refused),
            ) if refused.operations.iter().all(|op| never.contains(op)) => {
                Enforcement::OperationsNotSent(never.clone())
            }
            (Coverage::NeverSent(never), Enforcement::Enforcing(refused)) => {
                Enforcement::Enforcing(refused.never_sent(never))
            }
            (Coverage::NeverSent(never), Enforcement::EnforcingUnparsed(why, refused)) => {
                Enforcement::EnforcingUnparsed(why, refused.never_sent(never))
            }
            (_, enforcement) => enforcement,
        }
    }

    /// Whether the webhook refuses changes because of the lock.
    pub fn is_enforced(&self) -> bool {
        matches!(
            self,
            Enforcement::Enforcing(_)
                | Enforcement::EnforcingBroad(..)
                | Enforcement::EnforcingUnparsed(..)
        )
    }

    /// The `Enforced` condition saying so.
    pub fn condition(&self, generation: i64) -> LockCondition {
        let (status, reason, message) = match self {
            Enforcement::Enforcing(refused) => (
                "True",
                "Enforcing",
                format!("{}; status.enforcedBy lists the instances", refused.describe()),
            ),
            Enforcement::EnforcingBroad(refused, reason) => (
                "True",
                "Enforcing",
                format!("{}; status.enforcedBy lists the instances. The webhook configuration is broad ({reason})", refused.describe()),
            ),
            Enforcement::EnforcingUnparsed(why, refused) => (
                "True",
                "Unparseable",
                format!("the spec does not parse ({why}), so the lock fails closed on objects of its own name: {}; its selector, expiry, mode and exemptions are set aside until the spec is fixed", refused.describe()),
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
            Enforcement::NamespaceNotSelected { namespace, selector } => (
                "False",
                "NamespaceNotSelected",
                format!("namespace {namespace} is not selected by the webhook registration's namespaceSelector ({selector}): its objects never reach the webhook (label the namespace to match, or lock elsewhere)"),
            ),
            Enforcement::OperationsNotSent(never) => (
                "False",
                "NotSentToWebhook",
                format!("{} never reaches the webhook: {NEVER_SENT_WHY}", and(never)),
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
    /// The conditions it asserts (while unhealthy, those the other instances wrote).
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
    lock: &LockRef,
    healthy: bool,
    coverage: &Coverage,
    instance: &str,
    now: Timestamp,
) -> Desired {
    let enforcers = &lock.meta.status.enforced_by;
    let others = enforcers.iter().filter(|e| e.instance != instance).count();
    if !healthy {
        // The condition is shared, but server-side apply gives each of its fields to the last
        // instance that wrote a different value: an instance that left it out while others
        // remain would strip those fields from their condition (an item with only its `type`,
        // which the API server refuses, so the withdrawal never lands). So it re-applies the
        // condition as it stands, and the last one clears the status ([`Desired::clears`]).
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
    let enforcement = Enforcement::with_coverage(lock, coverage, now);
    let entry = enforcement.is_enforced().then(|| {
        let mine = enforcers.iter().find(|e| e.instance == instance);
        Enforcer {
            instance: instance.to_owned(),
            observed_generation: lock.generation.unwrap_or(0),
            since: mine.map_or(Time(now), |e| e.since.clone()),
        }
    });
    Desired {
        count: (others + usize::from(entry.is_some())) as i64,
        entry,
        conditions: vec![enforcement.condition(lock.generation.unwrap_or(0))],
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
    if let Some(applied) = applied
        && applied.desired.same_as(desired)
        && applied.awaiting_echo()
    {
        // Our write landed but the watch has not shown it yet: what it shows is older.
        return false;
    }
    let status = &lock.meta.status;
    let mine = status.enforced_by.iter().find(|e| e.instance == instance);
    let generation = |e: &Enforcer| e.observed_generation;
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

/// A write this instance made.
#[derive(Debug)]
pub(super) struct Applied {
    desired: Desired,
    /// The lock's resourceVersion after the write.
    pub(super) version: String,
    /// When the write was answered.
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

    /// Still waiting for the watch to show the write (a few seconds: a re-list may skip it).
    fn awaiting_echo(&self) -> bool {
        !self.echoed && self.at.elapsed() < ECHO_WAIT
    }
}

/// How long a write's echo is waited for before what the watch shows is trusted again.
const ECHO_WAIT: Duration = Duration::from_secs(5);

#[cfg(test)]
mod tests;
