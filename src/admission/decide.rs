//! The admission decision: request facts and the locks that apply in, a verdict out.
//!
//! Pure and synchronous on purpose: every rule (and every trap from the API server's side, such
//! as evictions arriving as CREATE or DELETECOLLECTION items without a name) is a row in a
//! table test, without a server or a cluster. It runs in two steps so the caller knows what to
//! fetch: [`plan`] says whether locks are needed at all and which; [`decide`] reads them.

use std::collections::BTreeMap;

use super::request::{AdmissionRequest, Operation};
use crate::api;
use crate::locks::{LockSet, LookupError};

/// How many Locks a namespace-deletion denial names.
const NAMED_IN_NAMESPACE_DENIAL: usize = 5;
/// kubectl prints warnings on one line each; longer ones are cut.
const MAX_WARNING_CHARS: usize = 119;

/// Why a request was allowed without reading any lock.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Exempt {
    /// CREATE of anything but `pods/eviction`: nothing exists yet to protect.
    Create,
    /// CONNECT (exec, attach, proxy) does not change the object.
    Connect,
    /// A Lock or ClusterLock: unlocking is deleting the lock, so it must always work.
    LockResource,
    /// A `status` write: controllers and kubelets must keep reporting.
    Status,
    /// No name anywhere in the request: no lock can name it.
    Unnamed,
}

impl Exempt {
    /// A short label for logs.
    pub fn as_str(self) -> &'static str {
        match self {
            Exempt::Create => "create",
            Exempt::Connect => "connect",
            Exempt::LockResource => "lock resource",
            Exempt::Status => "status subresource",
            Exempt::Unnamed => "no object name",
        }
    }
}

/// What must be read before deciding.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Lookup {
    /// The lock set that may hold the object's lock: its namespace, or `""` for ClusterLocks.
    pub scope: String,
    /// The object's name, which is the name of a lock on it.
    pub name: String,
    /// For a Namespace DELETE: the namespace whose Locks would block its deletion.
    pub contents_of: Option<String>,
}

/// The first step's answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Plan {
    /// Decided already; no lock needs reading.
    Allow(Exempt),
    /// Read these locks, then call [`decide`].
    Lookup(Lookup),
}

/// What kind of answer a verdict is, for logs and metrics.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Allowed, nothing to say.
    Allowed,
    /// Allowed, with a warning for the user.
    Warned,
    /// Refused because of a lock.
    Denied,
    /// The locks could not be read; decided by `on_lookup_error`.
    Error,
}

impl Outcome {
    /// `allowed`, `warned`, `denied` or `error`.
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Allowed => "allowed",
            Outcome::Warned => "warned",
            Outcome::Denied => "denied",
            Outcome::Error => "error",
        }
    }
}

/// The refusal carried in the response's `status`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refusal {
    /// The HTTP code the user sees (403 for a lock; 503 when locks could not be read).
    pub code: u16,
    /// `Forbidden` or `ServiceUnavailable`.
    pub reason: &'static str,
    /// The message kubectl prints.
    pub message: String,
}

/// The decision.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Verdict {
    /// Present when the request is refused.
    pub refusal: Option<Refusal>,
    /// Shown by kubectl, one line each.
    pub warnings: Vec<String>,
    /// Recorded in the audit log as `<webhook name>/<key>`.
    pub audit_annotations: BTreeMap<String, String>,
    /// The kind of answer.
    pub outcome: Outcome,
    /// The locks that decided it, e.g. `Lock prod/app-config`, for logs.
    pub locks: Vec<String>,
}

impl Verdict {
    /// A plain allow.
    pub fn allow() -> Self {
        Verdict {
            refusal: None,
            warnings: Vec::new(),
            audit_annotations: BTreeMap::new(),
            outcome: Outcome::Allowed,
            locks: Vec::new(),
        }
    }

    fn deny(code: u16, reason: &'static str, message: String) -> Self {
        Verdict {
            refusal: Some(Refusal {
                code,
                reason,
                message,
            }),
            outcome: Outcome::Denied,
            ..Verdict::allow()
        }
    }

    fn warn(mut self, warning: String) -> Self {
        self.warnings.push(clip(warning));
        if self.outcome == Outcome::Allowed {
            self.outcome = Outcome::Warned;
        }
        self
    }

    fn annotate(mut self, key: &str, value: String) -> Self {
        self.audit_annotations.insert(key.to_owned(), value);
        self
    }

    /// True when the request may proceed.
    pub fn allowed(&self) -> bool {
        self.refusal.is_none()
    }
}

/// What to do when the locks cannot be read.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Deserialize, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum OnLookupError {
    /// Refuse the change: a lock that cannot be seen is still a lock.
    #[default]
    Deny,
    /// Let the change through with a warning: availability over protection.
    Allow,
}

/// Step one: decide what can be decided without locks, or say what to read.
pub fn plan(req: &AdmissionRequest) -> Plan {
    let sub = req.subresource();
    let eviction = req.operation == Operation::Create
        && req.resource.group.is_empty()
        && req.resource.resource == "pods"
        && sub == Some("eviction");
    match req.operation {
        Operation::Create if !eviction => return Plan::Allow(Exempt::Create),
        Operation::Connect => return Plan::Allow(Exempt::Connect),
        _ => {}
    }
    if req.resource.group == api::GROUP
        && matches!(
            req.resource.resource.as_str(),
            api::LOCKS | api::CLUSTER_LOCKS
        )
    {
        return Plan::Allow(Exempt::LockResource);
    }
    if sub == Some("status") {
        return Plan::Allow(Exempt::Status);
    }
    let Some(name) = req.object_name() else {
        return Plan::Allow(Exempt::Unnamed);
    };
    let contents_of = (req.operation == Operation::Delete && req.is_namespace() && sub.is_none())
        .then(|| name.to_owned());
    Plan::Lookup(Lookup {
        scope: req.object_namespace().unwrap_or_default().to_owned(),
        name: name.to_owned(),
        contents_of,
    })
}

/// Step two: the verdict, given the lock set named by `lookup.scope` and, for a Namespace
/// DELETE, the lock set of that namespace.
pub fn decide(
    req: &AdmissionRequest,
    lookup: &Lookup,
    scope_locks: &LockSet,
    contents: Option<&LockSet>,
) -> Verdict {
    let what = describe_object(req, &lookup.name);
    if let Some(lock) = scope_locks.get(&lookup.name) {
        if req.operation == Operation::Update && req.is_terminating() {
            // Refusing this would wedge the object in Terminating: finalizer removal is an UPDATE.
            return Verdict::allow()
                .warn(format!(
                    "{} \"{}\" is being deleted: update allowed despite {lock}",
                    req.resource.qualified(),
                    lookup.name
                ))
                .annotate("terminating-object-update", lock.to_string());
        }
        let mut message = String::new();
        if is_eviction(req) {
            message.push_str("cannot evict: ");
        }
        message.push_str(&format!("{what} is locked by {lock}"));
        if let Some(reason) = lock.spec.reason.as_deref().filter(|r| !r.trim().is_empty()) {
            message.push_str(": ");
            message.push_str(reason.trim());
        }
        message.push_str(&format!(" (to unlock: {})", lock.unlock_command()));
        let mut verdict =
            Verdict::deny(403, "Forbidden", message).annotate("lock", lock.to_string());
        verdict.locks.push(lock.to_string());
        return verdict;
    }
    if let Some(contents) = contents.filter(|set| !set.is_empty()) {
        return deny_namespace_deletion(&lookup.name, contents);
    }
    Verdict::allow()
}

/// The verdict when the locks could not be read.
pub fn decide_unreadable(
    req: &AdmissionRequest,
    lookup: &Lookup,
    policy: OnLookupError,
    error: &LookupError,
) -> Verdict {
    let what = describe_object(req, &lookup.name);
    let mut verdict = if req.operation == Operation::Update && req.is_terminating() {
        // Allowed whatever the locks say; nothing to add.
        Verdict::allow()
    } else {
        match policy {
            OnLookupError::Deny => Verdict::deny(
                503,
                "ServiceUnavailable",
                format!(
                    "{what} may be locked, but the lock state could not be read ({error}); the change is refused until it can be (on_lookup_error=deny)"
                ),
            ),
            OnLookupError::Allow => Verdict::allow().warn(format!(
                "lock state of {what} could not be read; allowed (on_lookup_error=allow)"
            )),
        }
    };
    verdict.outcome = Outcome::Error;
    verdict.annotate("lookup-error", error.to_string())
}

fn deny_namespace_deletion(namespace: &str, contents: &LockSet) -> Verdict {
    let mut names: Vec<&str> = contents
        .iter()
        .take(NAMED_IN_NAMESPACE_DENIAL)
        .map(|l| l.name.as_str())
        .collect();
    let more = contents.len() - names.len();
    let listed = names.join(", ");
    let more = if more > 0 {
        format!(" and {more} more")
    } else {
        String::new()
    };
    let count = contents.len();
    let plural = if count == 1 { "Lock" } else { "Locks" };
    let message = format!(
        "namespaces \"{namespace}\" still holds {count} {plural} ({listed}{more}): deleting it would leave it stuck in Terminating at the locked objects (to unlock: kubectl delete locks --all -n {namespace})"
    );
    let mut verdict = Verdict::deny(403, "Forbidden", message);
    names.truncate(NAMED_IN_NAMESPACE_DENIAL);
    verdict.locks = names
        .iter()
        .map(|n| format!("Lock {namespace}/{n}"))
        .collect();
    let annotation = verdict.locks.join(",");
    verdict.annotate("namespace-locks", annotation)
}

fn is_eviction(req: &AdmissionRequest) -> bool {
    req.operation == Operation::Create && req.subresource() == Some("eviction")
}

/// `configmaps "app-config" in namespace "prod"`, as the API server words objects.
fn describe_object(req: &AdmissionRequest, name: &str) -> String {
    let resource = req.resource.qualified();
    match req.object_namespace() {
        Some(ns) => format!("{resource} \"{name}\" in namespace \"{ns}\""),
        None => format!("{resource} \"{name}\""),
    }
}

fn clip(mut text: String) -> String {
    if text.chars().count() > MAX_WARNING_CHARS {
        let cut = text
            .char_indices()
            .nth(MAX_WARNING_CHARS - 1)
            .map_or(text.len(), |(i, _)| i);
        text.truncate(cut);
        text.push('…');
    }
    text
}

#[cfg(test)]
mod tests;
