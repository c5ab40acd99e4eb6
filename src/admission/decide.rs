//! The admission decision, pure: request facts and the locks that apply in, a verdict out.
//! [`triage`] says which locks to read, [`labels_needed`] / [`scaled_field_needed`] what else
//! to read, [`decide`] decides (see docs/design/admission.md).

use std::borrow::Cow;
use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use k8s_openapi::jiff::Timestamp;
use kube::core::{Selector, SelectorExt};

mod crd;

pub use crd::{crd_deletion, deleted_resource, names_resource_of};

use super::changes::{self, Frozen, Objects, Write};
use super::labels::{LabelError, Labels, Target};
use super::request::{AdmissionRequest, Operation, Resource, UserInfo};
use super::subresources;
use crate::api::{self, LockKey, LockMode, LockOperation, LockSpec};
use crate::locks::{LockRef, LockSet, LookupError};
use crate::settings::OnLookupError;

/// How many Locks a namespace-deletion denial names.
const NAMED_IN_NAMESPACE_DENIAL: usize = 5;
/// The API server may cut each warning at 256 characters: we cut first, and mark it (`…`).
const MAX_WARNING_CHARS: usize = 256;

/// Why a request was allowed without reading any lock.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Exempt {
    /// CREATE of a subresource other than `pods/eviction` (binding, token): creates no lock's name.
    Create,
    /// CONNECT to anything but a pod's exec, attach, portforward or proxy: reaches no locked pod.
    Connect,
    /// A Lock or ClusterLock: unlocking is deleting the lock, so it must always work.
    LockResource,
    /// No name anywhere in the request: no lock can name it.
    Unnamed,
}

impl Exempt {
    pub fn as_str(self) -> &'static str {
        match self {
            Exempt::Create => "create",
            Exempt::Connect => "connect",
            Exempt::LockResource => "lock resource",
            Exempt::Unnamed => "no object name",
        }
    }
}

/// What must be read before deciding, borrowed from the request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Lookup<'a> {
    /// The lock set that may hold the object's lock: its namespace, or `""` for ClusterLocks.
    pub scope: &'a str,
    /// The object's name, which is the name of a lock on it.
    pub name: &'a str,
    /// For a Namespace DELETE: the namespace whose Locks would block its deletion.
    pub contents_of: Option<&'a str>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Triage<'a> {
    Allow(Exempt),
    Lookup(Lookup<'a>),
}

/// What kind of answer a verdict is, for logs and metrics.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Outcome {
    #[default]
    Allowed,
    Warned,
    Denied,
    /// The locks could not be read: decided by `on_lookup_error`.
    Error,
}

impl Outcome {
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
    pub reason: &'static str,
    pub message: String,
}

#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct Verdict {
    pub refusal: Option<Refusal>,
    pub warnings: Vec<String>,
    /// Recorded in the audit log as `<webhook name>/<key>`.
    pub audit_annotations: BTreeMap<String, String>,
    pub outcome: Outcome,
    /// The locks that refused it (for a Namespace DELETE, those the message names).
    pub locks: Vec<LockKey>,
    /// The Warn-mode locks that would have refused it.
    pub warned: Vec<LockKey>,
    /// For an UPDATE, the frozen field each refusing or warning lock names as changed.
    pub changed: Vec<(LockKey, String)>,
}

impl Verdict {
    pub fn allow() -> Self {
        Verdict::default()
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

    pub fn allowed(&self) -> bool {
        self.refusal.is_none()
    }
}

/// Step one: decide what can be decided without locks, or say what to read.
pub fn triage<'a>(req: &'a AdmissionRequest<'_>) -> Triage<'a> {
    let sub = req.subresource();
    let pods = req.resource.group.is_empty() && req.resource.resource == "pods";
    match req.operation {
        Operation::Create if sub.is_some() && !(pods && sub == Some("eviction")) => {
            return Triage::Allow(Exempt::Create);
        }
        Operation::Connect if !(pods && connect_verb(sub).is_some()) => {
            return Triage::Allow(Exempt::Connect);
        }
        _ => {}
    }
    if req.resource.group == api::GROUP
        && matches!(&*req.resource.resource, api::LOCKS | api::CLUSTER_LOCKS)
    {
        return Triage::Allow(Exempt::LockResource);
    }
    let Some(name) = req.object_name() else {
        return Triage::Allow(Exempt::Unnamed);
    };
    let contents_of =
        (req.operation == Operation::Delete && req.is_namespace() && sub.is_none()).then_some(name);
    Triage::Lookup(Lookup {
        scope: req.object_namespace().unwrap_or_default(),
        name,
        contents_of,
    })
}

/// Step one and a half: the object whose labels a selector Lock that could cover the request
/// needs and the review does not carry (the pod of an eviction, the object of a Scale).
pub fn labels_needed<'a>(
    req: &'a AdmissionRequest<'_>,
    locks: &LockSet,
    now: Timestamp,
) -> Option<Target<'a>> {
    let target = target(req)?;
    could_cover(req, locks, now, |spec| spec.selector.is_some()).then_some(target)
}

/// Step one and a half, for a scale of a custom resource: the resource whose CRD's
/// `specReplicasPath` a lock on fields covering it needs (a Scale does not say what it writes).
pub fn scaled_field_needed<'a>(
    req: &'a AdmissionRequest<'_>,
    locks: &LockSet,
    now: Timestamp,
) -> Option<&'a Resource<'a>> {
    let custom = matches!(write(req), Some(Write::Scale { custom: true }));
    let fields = |spec: &LockSpec| spec.fields.is_some() || spec.except_fields.is_some();
    (custom && could_cover(req, locks, now, fields)).then_some(&req.resource)
}

/// Whether a lock of `locks` that is `kind` covers the request's operation and resource, has
/// not expired and does not exempt the user.
fn could_cover(
    req: &AdmissionRequest,
    locks: &LockSet,
    now: Timestamp,
    kind: impl Fn(&LockSpec) -> bool,
) -> bool {
    let operation = lock_operation(req);
    locks.iter().any(|lock| {
        let spec = &lock.spec;
        kind(spec)
            && covers_request(spec, req, operation)
            && !spec.is_expired(now)
            && exemption(spec, &req.user_info).is_none()
    })
}

/// Step two: the verdict from the locks of `lookup.scope` (and of the namespace a DELETE empties),
/// the `labels` read and the UPDATE's `objects` (none: every UPDATE is a change). The most
/// restrictive lock wins: one Enforce lock refuses, naming every Enforce lock; Warn locks warn.
pub fn decide(
    req: &AdmissionRequest,
    lookup: &Lookup<'_>,
    scope_locks: &LockSet,
    contents: Option<&LockSet>,
    read: Option<(&Labels, OnLookupError)>,
    objects: &Objects,
    now: Timestamp,
) -> Verdict {
    let read_labels = read.and_then(|(labels, _)| match labels {
        Labels::Read(labels) => Some(labels),
        Labels::Gone | Labels::Unreadable(_) => None,
    });
    let found = applicable(req, lookup.name, scope_locks, read_labels, objects, now);
    let unreadable = read.and_then(|(labels, policy)| match labels {
        Labels::Unreadable(error) => Some((error, policy)),
        Labels::Read(_) | Labels::Gone => None,
    });
    let unknown = unreadable.filter(|_| !found.unknown.is_empty());
    let mut verdict = if !found.enforcing.is_empty() {
        deny_locked(req, &describe_object(req, lookup.name), &found)
    } else if let Some((error, policy)) = unknown {
        labels_unreadable(req, lookup.name, &found.unknown, error, policy)
    } else if let Some(contents) = contents.filter(|set| !set.is_empty()) {
        namespace_deletion(req, lookup.name, contents, now)
    } else {
        Verdict::allow()
    };
    for lock in &found.warning {
        let reason = lock
            .spec
            .reason
            .as_deref()
            .map(|r| format!(": {}", api::escape(r.trim())))
            .unwrap_or_default();
        let changed = found.changed_text(lock, " ");
        verdict = verdict.warn(format!(
            "{lock}{changed} (mode Warn) would refuse this{reason}"
        ));
    }
    for (lock, how) in &found.exempted {
        verdict = verdict.warn(format!("allowed by exemption: {how} is exempt from {lock}"));
    }
    found.annotate(verdict)
}

/// The locks that cover a request, sorted by what they do to it.
#[derive(Debug, Default)]
struct Applicable<'a> {
    enforcing: Vec<&'a LockRef>,
    warning: Vec<&'a LockRef>,
    exempted: Vec<(&'a LockRef, String)>,
    expired: Vec<&'a LockRef>,
    /// Selector locks that would apply if they selected the object, whose labels are unknown.
    unknown: Vec<&'a LockRef>,
    /// For an UPDATE, what each lock above freezes that it changes.
    changed: Vec<(LockKey, Frozen)>,
    /// For an UPDATE, the locks that cover it but freeze nothing it changes.
    unchanged: Vec<&'a LockRef>,
}

impl<'a> Applicable<'a> {
    /// Files a lock covering a request by `user` at `now`: expired, exempting, Warn or Enforce.
    fn sort(&mut self, lock: &'a LockRef, user: &UserInfo, now: Timestamp) {
        let spec = &lock.spec;
        if spec.is_expired(now) {
            self.expired.push(lock);
        } else if let Some(how) = exemption(spec, user) {
            self.exempted.push((lock, how));
        } else if spec.mode.unwrap_or_default() == LockMode::Warn {
            self.warning.push(lock);
        } else {
            self.enforcing.push(lock);
        }
    }

    /// Files a selector lock whose labels are unknown, unless expired or exempting the user.
    fn sort_unknown(&mut self, lock: &'a LockRef, user: &UserInfo, now: Timestamp) {
        if !lock.spec.is_expired(now) && exemption(&lock.spec, user).is_none() {
            self.unknown.push(lock);
        }
    }

    /// `(spec.template changed)` after `before` for a lock whose refusal names the field.
    fn changed_text(&self, lock: &LockRef, before: &str) -> String {
        let key = lock.key();
        (self.changed.iter())
            .find(|(k, frozen)| *k == key && frozen.named)
            .and_then(|(_, frozen)| frozen.path.as_deref())
            .map(|path| format!("{before}({path} changed)"))
            .unwrap_or_default()
    }

    /// The audit annotations every verdict carries about the locks that did not refuse it.
    fn annotate(&self, mut verdict: Verdict) -> Verdict {
        let counted = |key: &LockKey| verdict.locks.contains(key) || verdict.warned.contains(key);
        let changed: Vec<(LockKey, String)> = (self.changed.iter())
            .filter(|(key, _)| counted(key) || self.warning.iter().any(|l| l.key() == *key))
            .filter(|(_, frozen)| frozen.named)
            .filter_map(|(key, frozen)| Some((key.clone(), frozen.path.clone()?)))
            .collect();
        if !self.unchanged.is_empty() {
            verdict = verdict.annotate("unchanged-locks", names(&self.unchanged));
        }
        if !changed.is_empty() {
            let list = join(
                changed.iter().map(|(key, path)| format!("{key}: {path}")),
                ", ",
            );
            verdict = verdict.annotate("changed-fields", list);
            verdict.changed = changed;
        }
        if !self.warning.is_empty() {
            verdict = verdict.annotate("warn-locks", names(&self.warning));
            verdict.warned = self.warning.iter().map(|l| l.key()).collect();
        }
        if !self.exempted.is_empty() {
            let list = join(
                self.exempted.iter().map(|(l, how)| format!("{l} ({how})")),
                ", ",
            );
            verdict = verdict.annotate("exempted-by", list);
        }
        if !self.expired.is_empty() {
            verdict = verdict.annotate("expired-locks", names(&self.expired));
        }
        verdict
    }
}

/// The locks of `locks` that cover the request; selector locks select by the request's labels,
/// else by those `read` for [`labels_needed`], else go to `unknown`.
fn applicable<'a>(
    req: &AdmissionRequest,
    name: &str,
    locks: &'a LockSet,
    read: Option<&BTreeMap<String, String>>,
    objects: &Objects,
    now: Timestamp,
) -> Applicable<'a> {
    let operation = lock_operation(req);
    // Labels as they are before the change; for an eviction or a Scale, those read of the pod
    // or the scaled object, if any. An object whose labels are unknown is selected by no
    // selector, whatever it says.
    let labels = req.labels().or(read);
    let mut found = Applicable::default();
    let write = write(req);
    for lock in locks.iter() {
        let spec = &lock.spec;
        let covers_object = match &spec.selector {
            None => Some(lock.name == name),
            Some(selector) => labels.map(|labels| selects(selector, labels)),
        };
        if covers_object == Some(false) || !covers_request(spec, req, operation) {
            continue;
        }
        if let Some(write) = write {
            let frozen = changes::frozen_change(
                spec.fields.as_deref(),
                spec.except_fields.as_deref(),
                write,
                req.is_terminating(),
                objects,
            );
            match frozen {
                Some(frozen) => found.changed.push((lock.key(), frozen)),
                None => {
                    found.unchanged.push(lock);
                    continue;
                }
            }
        }
        match covers_object {
            Some(_) => found.sort(lock, &req.user_info, now),
            None => found.sort_unknown(lock, &req.user_info, now),
        }
    }
    found
}

fn write(req: &AdmissionRequest) -> Option<Write> {
    if req.operation != Operation::Update {
        return None;
    }
    Some(match req.subresource() {
        Some("status") => Write::Status,
        Some("scale") => Write::Scale {
            custom: !matches!(&*req.resource.group, "" | "apps" | "extensions"),
        },
        _ => Write::Object,
    })
}

/// An eviction deletes the pod.
fn lock_operation(req: &AdmissionRequest) -> LockOperation {
    match req.operation {
        Operation::Update => LockOperation::Update,
        Operation::Create if !is_eviction(req) => LockOperation::Create,
        Operation::Connect => LockOperation::Connect,
        Operation::Create | Operation::Delete => LockOperation::Delete,
    }
}

/// What a CONNECT to a pod's subresource does, as kubectl words it; `None` for those that reach
/// no pod's containers (`proxy` carries HTTP to the pod's ports, as `port-forward` does).
fn connect_verb(subresource: Option<&str>) -> Option<&'static str> {
    match subresource? {
        "portforward" => Some("port-forward"),
        verb => ["exec", "attach", "proxy"].into_iter().find(|v| *v == verb),
    }
}

fn covers_request(spec: &LockSpec, req: &AdmissionRequest, operation: LockOperation) -> bool {
    spec.operations().contains(&operation)
        && covers_resource(
            spec,
            &req.resource.group,
            &req.resource.resource,
            req.subresource(),
        )
}

/// The object an eviction, a scale or a CONNECT acts on, whose labels its review does not carry.
fn target<'a>(req: &'a AdmissionRequest<'_>) -> Option<Target<'a>> {
    let elsewhere = is_eviction(req)
        || req.operation == Operation::Connect
        || (req.operation == Operation::Update
            && req
                .subresource()
                .and_then(|sub| subresources::changing(&req.resource.resource, sub))
                .is_some_and(|sub| !sub.carries_object));
    if !elsewhere {
        return None;
    }
    Some(Target {
        resource: &req.resource,
        namespace: req.object_namespace(),
        name: req.object_name()?,
    })
}

/// Whether a lock's `resources` cover `resource` in `group` (and its `subresource`): none
/// covers all; `*` matches any; a resource covers its subresources, `resource/sub` only one.
pub fn covers_resource(
    spec: &LockSpec,
    group: &str,
    resource: &str,
    subresource: Option<&str>,
) -> bool {
    let Some(rules) = &spec.resources else {
        return true;
    };
    let with_sub = subresource.map(|sub| format!("{resource}/{sub}"));
    rules.iter().any(|rule| {
        let group_ok = rule.api_groups.iter().any(|g| g == "*" || g == group);
        let resource_ok = rule
            .resources
            .iter()
            .any(|r| r == "*" || r == resource || with_sub.as_deref() == Some(r.as_str()));
        group_ok && resource_ok
    })
}

fn selects(selector: &LabelSelector, labels: &BTreeMap<String, String>) -> bool {
    // A selector the API would refuse (bad operator) covers nothing rather than everything.
    Selector::try_from(selector.clone()).is_ok_and(|s| !s.selects_all() && s.matches(labels))
}

/// Which exemption of `spec` the user has, worded for the warning.
fn exemption(spec: &LockSpec, user: &UserInfo) -> Option<String> {
    let exempt = spec.exempt.as_ref()?;
    if exempt.users.iter().any(|u| *u == user.username) {
        return Some(format!("user {}", api::escape(&user.username)));
    }
    if let Some(group) = user
        .groups
        .iter()
        .find(|g| exempt.groups.iter().any(|e| e == g.as_ref()))
    {
        return Some(format!("group {}", api::escape(group)));
    }
    let account = user.username.strip_prefix("system:serviceaccount:")?;
    let (namespace, name) = account.split_once(':')?;
    exempt
        .service_accounts
        .iter()
        .find(|sa| sa.split_once('/') == Some((namespace, name)))
        .map(|sa| format!("service account {sa}"))
}

fn names(locks: &[&LockRef]) -> String {
    join(locks, ", ")
}

pub(super) fn join<T: std::fmt::Display>(items: impl IntoIterator<Item = T>, sep: &str) -> String {
    items
        .into_iter()
        .map(|i| i.to_string())
        .collect::<Vec<_>>()
        .join(sep)
}

fn deny_locked(req: &AdmissionRequest, what: &str, found: &Applicable) -> Verdict {
    let locks = &found.enforcing;
    let mut message = String::new();
    match lock_operation(req) {
        _ if is_eviction(req) => message.push_str("cannot evict: "),
        LockOperation::Create => message.push_str("cannot create: "),
        LockOperation::Connect => {
            let verb = connect_verb(req.subresource()).unwrap_or("connect");
            message.push_str(&format!("cannot {verb}: "));
        }
        LockOperation::Update | LockOperation::Delete => {}
    }
    message.push_str(&format!("{what} is locked by "));
    let described: Vec<String> = locks
        .iter()
        .map(|lock| {
            let field = found.changed_text(lock, " ");
            match lock
                .spec
                .reason
                .as_deref()
                .map(str::trim)
                .filter(|r| !r.is_empty())
            {
                Some(reason) => format!("{lock}{field}: {}", api::escape(reason)),
                None => format!("{lock}{field}"),
            }
        })
        .collect();
    message.push_str(&described.join("; "));
    message.push_str(&format!(" (to unlock: {})", unlock_command(locks)));
    let mut verdict = Verdict::deny(403, "Forbidden", message);
    verdict.locks = locks.iter().map(|l| l.key()).collect();
    // A lock whose spec could not be read fails closed on its name: say why.
    for lock in locks {
        if let Some(problem) = &lock.problem {
            verdict = verdict.warn(format!(
                "{lock}: unreadable spec, fails closed until fixed: {}",
                api::escape(problem)
            ));
        }
    }
    verdict.annotate("lock", names(locks))
}

/// `kubectl delete lock a b -n ns`, one command for all the locks (they share a scope).
fn unlock_command(locks: &[&LockRef]) -> String {
    match locks {
        [one] => one.unlock_command(),
        _ => {
            let list = join(locks.iter().map(|l| &l.name), " ");
            match locks.first().and_then(|l| l.namespace.as_deref()) {
                Some(ns) => format!("kubectl delete lock {list} -n {ns}"),
                None => format!("kubectl delete clusterlock {list}"),
            }
        }
    }
}

pub fn decide_unreadable(
    req: &AdmissionRequest,
    lookup: &Lookup<'_>,
    policy: OnLookupError,
    error: &LookupError,
) -> Verdict {
    let what = describe_object(req, lookup.name);
    by_policy(
        req,
        policy,
        format!(
            "{what} may be locked, but the lock state could not be read ({error}); the change is refused until it can be (on_lookup_error=deny)"
        ),
        format!("lock state of {what} could not be read; allowed (on_lookup_error=allow)"),
        error.to_string(),
    )
}

/// What `policy` answers when something needed could not be read: a 503 or a warning. A
/// Terminating object's update and a status write pass either way (never wedge controllers).
fn by_policy(
    req: &AdmissionRequest,
    policy: OnLookupError,
    refusal: String,
    warning: String,
    annotation: String,
) -> Verdict {
    let keeps_going = req.is_terminating() || req.subresource() == Some("status");
    let mut verdict = if req.operation == Operation::Update && keeps_going {
        Verdict::allow()
    } else {
        match policy {
            OnLookupError::Deny => Verdict::deny(503, "ServiceUnavailable", refusal),
            OnLookupError::Allow => Verdict::allow().warn(warning),
        }
    };
    verdict.outcome = Outcome::Error;
    verdict.annotate("lookup-error", annotation)
}

/// The verdict when the labels that selector Locks `locks` need could not be read, and no other
/// Lock refuses: `policy` decides if one of them is in Enforce mode; Warn locks only warn.
fn labels_unreadable(
    req: &AdmissionRequest,
    name: &str,
    locks: &[&LockRef],
    error: &LabelError,
    policy: OnLookupError,
) -> Verdict {
    let what = describe_object(req, name);
    let enforcing: Vec<&LockRef> = (locks.iter())
        .filter(|l| l.spec.mode.unwrap_or_default() == LockMode::Enforce)
        .copied()
        .collect();
    let which = format!(
        "cannot read the labels of {what} to apply selector {}",
        names(if enforcing.is_empty() {
            locks
        } else {
            &enforcing
        })
    );
    // Warnings may be cut at 256 characters: what was decided comes before the error.
    if enforcing.is_empty() {
        return Verdict::allow().warn(format!("{which} (mode Warn): {error}"));
    }
    let problem = format!("{which}: {error}");
    by_policy(
        req,
        policy,
        format!("{problem}; the change is refused until they can be read (on_lookup_error=deny)"),
        format!("{which}, allowed (on_lookup_error=allow): {error}"),
        problem,
    )
}

/// A Namespace DELETE is refused while a Lock in it would refuse the namespace controller's
/// DELETE of its objects (else it stays half emptied and Terminating); Warn locks only warn.
fn namespace_deletion(
    req: &AdmissionRequest,
    namespace: &str,
    contents: &LockSet,
    now: Timestamp,
) -> Verdict {
    // kube-controller-manager's namespace controller deletes the contents, with its own service
    // account (`--use-service-account-credentials`, as kubeadm runs it).
    let controller = UserInfo {
        username: "system:serviceaccount:kube-system:namespace-controller".into(),
        groups: [
            "system:serviceaccounts",
            "system:serviceaccounts:kube-system",
            "system:authenticated",
        ]
        .map(Cow::Borrowed)
        .to_vec(),
    };
    let mut found = Applicable::default();
    for lock in contents.iter() {
        let spec = &lock.spec;
        // A rule naming only subresources never sees a DELETE.
        let deletable = spec.resources.as_ref().is_none_or(|rules| {
            rules.iter().any(|rule| {
                (rule.api_groups.iter()).any(|group| {
                    (rule.resources.iter()).any(|resource| {
                        !resource.contains('/') && subresources::may_be_sent(group, resource)
                    })
                })
            })
        });
        if spec.operations().contains(&LockOperation::Delete) && deletable {
            found.sort(lock, &controller, now);
        }
    }
    let mut verdict = if found.enforcing.is_empty() {
        Verdict::allow()
    } else {
        deny_namespace_deletion(req, namespace, &found.enforcing)
    };
    if !found.warning.is_empty() {
        let n = found.warning.len();
        let plural = if n == 1 { "Lock" } else { "Locks" };
        verdict = verdict.warn(format!(
            "namespaces \"{namespace}\" holds {n} Warn-mode {plural}; deleting it deletes the objects they lock"
        ));
    }
    for (lock, how) in &found.exempted {
        verdict = verdict.warn(format!(
            "{lock} exempts {how}: its objects go with the namespace"
        ));
    }
    found.annotate(verdict)
}

fn deny_namespace_deletion(req: &AdmissionRequest, namespace: &str, locks: &[&LockRef]) -> Verdict {
    let listed: Vec<&str> = locks
        .iter()
        .take(NAMED_IN_NAMESPACE_DENIAL)
        .map(|l| l.name.as_str())
        .collect();
    let count = locks.len();
    let more = match count - listed.len() {
        0 => String::new(),
        n => format!(" and {n} more"),
    };
    let plural = if count == 1 { "Lock" } else { "Locks" };
    // An exemption of the user does not carry over to the namespace controller.
    let user = locks
        .iter()
        .find_map(|lock| exemption(&lock.spec, &req.user_info).map(|how| (lock, how)))
        .map(|(lock, how)| {
            format!(
                "; {how} is exempt from {lock}, but the namespace controller, which deletes the objects, is not"
            )
        })
        .unwrap_or_default();
    let message = format!(
        "deleting namespaces \"{namespace}\" would delete the objects locked by {count} {plural} in it ({}{more}){user} (to unlock: kubectl delete locks --all -n {namespace})",
        listed.join(", ")
    );
    let mut verdict = Verdict::deny(403, "Forbidden", message);
    verdict.locks = listed
        .iter()
        .map(|name| LockKey::lock(namespace, name))
        .collect();
    let annotation = join(&verdict.locks, ",");
    verdict.annotate("namespace-locks", annotation)
}

fn is_eviction(req: &AdmissionRequest) -> bool {
    req.operation == Operation::Create && req.subresource() == Some("eviction")
}

/// `configmaps "app-config" in namespace "prod"`, as the API server words objects.
fn describe_object(req: &AdmissionRequest, name: &str) -> String {
    let resource = req.resource.qualified();
    match req.object_namespace() {
        Some(ns) => format!("{resource} \"{}\" in namespace \"{ns}\"", api::escape(name)),
        None => format!("{resource} \"{}\"", api::escape(name)),
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
