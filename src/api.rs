//! The `Lock` and `ClusterLock` custom resources: a lock locks the object of its name in its
//! namespace (or cluster-wide); the spec only adds context, so it may be empty (defaults to `{}`).
//! Doc comments on the CRD types are the CRD's descriptions (`kubectl explain lock.spec`).

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::{
    CustomResourceDefinition, JSONSchemaProps,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, Time};
use k8s_openapi::jiff::Timestamp;
use kube::core::{Message, Rule};
use kube::{CustomResource, CustomResourceExt, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

pub const GROUP: &str = "objectlock.dev";
pub const VERSION: &str = "v1alpha1";
pub const API_VERSION: &str = "objectlock.dev/v1alpha1";
pub const LOCKS: &str = "locks";
pub const CLUSTER_LOCKS: &str = "clusterlocks";

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum LockKind {
    Lock = 0,
    ClusterLock = 1,
}

impl LockKind {
    /// The kind whose locks are kept under `namespace`, where `""` holds the ClusterLocks.
    pub fn for_namespace(namespace: &str) -> LockKind {
        if namespace.is_empty() {
            LockKind::ClusterLock
        } else {
            LockKind::Lock
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            LockKind::Lock => "Lock",
            LockKind::ClusterLock => "ClusterLock",
        }
    }

    pub fn plural(self) -> &'static str {
        match self {
            LockKind::Lock => LOCKS,
            LockKind::ClusterLock => CLUSTER_LOCKS,
        }
    }

    /// For `Api<DynamicObject>`: Locks are read raw, so one spec that does not parse fails alone.
    pub fn api_resource(self) -> kube::api::ApiResource {
        match self {
            LockKind::Lock => kube::api::ApiResource::erase::<Lock>(&()),
            LockKind::ClusterLock => kube::api::ApiResource::erase::<ClusterLock>(&()),
        }
    }
}

impl std::fmt::Display for LockKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Which lock: a Lock (`namespace: Some`) or a ClusterLock (`None`), by name. The one identity
/// of a lock in the index, verdicts, status, events, the registration and the plugin.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct LockKey {
    pub namespace: Option<String>,
    pub name: String,
}

impl LockKey {
    pub fn lock(namespace: &str, name: &str) -> LockKey {
        LockKey {
            namespace: Some(namespace.to_owned()),
            name: name.to_owned(),
        }
    }

    pub fn cluster_lock(name: &str) -> LockKey {
        LockKey {
            namespace: None,
            name: name.to_owned(),
        }
    }

    pub fn kind(&self) -> LockKind {
        if self.namespace.is_some() {
            LockKind::Lock
        } else {
            LockKind::ClusterLock
        }
    }

    /// The namespace the index keeps the lock under (`""` for ClusterLocks).
    pub fn index_namespace(&self) -> &str {
        self.namespace.as_deref().unwrap_or("")
    }

    pub fn api_resource(&self) -> kube::api::ApiResource {
        self.kind().api_resource()
    }

    pub fn api(&self, client: kube::Client) -> kube::Api<kube::api::DynamicObject> {
        match &self.namespace {
            Some(ns) => kube::Api::namespaced_with(client, ns, &self.api_resource()),
            None => kube::Api::all_with(client, &self.api_resource()),
        }
    }

    pub fn unlock_command(&self) -> String {
        match &self.namespace {
            Some(ns) => format!("kubectl delete lock {} -n {ns}", self.name),
            None => format!("kubectl delete clusterlock {}", self.name),
        }
    }
}

impl std::fmt::Display for LockKey {
    /// `Lock prod/app-config` or `ClusterLock lock-demo-reader`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.namespace {
            Some(ns) => write!(f, "Lock {}/{}", escape(ns), escape(&self.name)),
            None => write!(f, "ClusterLock {}", escape(&self.name)),
        }
    }
}

/// Namespaces the registration leaves out (the control plane's own traffic never waits on the
/// webhook): a Lock in one, or a ClusterLock on one, is never enforced.
pub const EXCLUDED_NAMESPACES: [&str; 2] = ["kube-system", "kube-node-lease"];

pub fn is_excluded_namespace(namespace: &str) -> bool {
    EXCLUDED_NAMESPACES.contains(&namespace)
}

/// Text a Lock supplies, safe for a terminal or a log line: control characters and bidirectional
/// overrides are written as escapes (`\u{1b}`, `\r`).
pub fn escape(text: &str) -> std::borrow::Cow<'_, str> {
    let unsafe_char =
        |c: char| c.is_control() || matches!(c, '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}');
    if !text.chars().any(unsafe_char) {
        return std::borrow::Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        match c {
            c if unsafe_char(c) => out.extend(c.escape_default()),
            c => out.push(c),
        }
    }
    std::borrow::Cow::Owned(out)
}

/// Locks the object with the same name in the same namespace: while this Lock exists, UPDATE
/// and DELETE of that object (or the operations spec.operations names: also CREATE and
/// CONNECT) are refused by the kube-object-lock admission webhook. Delete the Lock to unlock.
/// Every field is optional; an empty spec locks every UPDATE and DELETE of every resource with
/// the Lock's name.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[kube(
    group = "objectlock.dev",
    version = "v1alpha1",
    kind = "Lock",
    namespaced,
    shortname = "lk",
    category = "objectlocks",
    derive = "PartialEq",
    status = "LockStatus",
    doc = "Locks the namespaced object of the same name in the same namespace against UPDATE and DELETE, or the operations spec.operations names (UPDATE, DELETE, CREATE, CONNECT).",
    printcolumn = r#"{"name":"Enforced","type":"integer","jsonPath":".status.enforcedCount","description":"How many kube-object-lock instances enforce the lock (entries in status.enforcedBy); empty until one has seen it"}"#,
    printcolumn = r#"{"name":"Mode","type":"string","jsonPath":".spec.mode","description":"Enforce (refuse) or Warn (allow with a warning); empty means Enforce"}"#,
    printcolumn = r#"{"name":"Expires","type":"string","jsonPath":".spec.expiresAt","description":"When the lock stops applying (RFC 3339); empty means never"}"#,
    printcolumn = r#"{"name":"Reason","type":"string","jsonPath":".spec.reason","description":"Why the object is locked"}"#,
    printcolumn = r#"{"name":"Owner-Kind","type":"string","jsonPath":".metadata.ownerReferences[0].kind","description":"Kind of the object that owns the lock: the garbage collector deletes the lock when that object is deleted"}"#,
    printcolumn = r#"{"name":"Owner","type":"string","jsonPath":".metadata.ownerReferences[0].name","description":"Name of the object that owns the lock"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("!has(self.fields) || !has(self.exceptFields)").message("give fields or exceptFields, not both"))]
pub struct LockSpec {
    /// Why the object is locked, for whoever is refused: it is shown in the denial message,
    /// e.g. "VM snapshot in progress". One line of text: control characters (newlines, tabs,
    /// escape sequences) are refused. Optional: the lock applies with or without it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 1024))]
    #[x_kube(validation = Rule::new(r"!self.matches('[\\x00-\\x1f\\x7f-\\x9f]')").message("reason must be one line of text without control characters (newlines, tabs, escape sequences): it is shown on the terminals of refused users"))]
    pub reason: Option<String>,

    /// The operations refused: UPDATE and DELETE (the default), or any of UPDATE, DELETE,
    /// CREATE and CONNECT. A DELETE-only lock lets the object be edited but not removed;
    /// evicting a pod counts as DELETE. CREATE reserves the name (a request with generateName
    /// is never refused); CONNECT refuses exec, attach, port-forward and proxy into the pod.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1), extend("x-kubernetes-list-type" = "set"))]
    pub operations: Option<Vec<LockOperation>>,

    /// The resources the lock applies to, as in RBAC rules: e.g. apiGroups ["apps"], resources
    /// ["deployments"] locks the Deployment with the lock's name and leaves a Service of the
    /// same name alone. Default: any resource. "" is the core group, "*" matches any group or
    /// resource. Subresources (scale, ephemeralcontainers) follow their resource.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1))]
    pub resources: Option<Vec<ResourceRule>>,

    /// Lock every object in the namespace whose labels match (read from the object as it is
    /// before the change), whatever its name; the Lock's own name is then free. Without it the
    /// lock covers the object with the Lock's name. An eviction or a scale update is selected
    /// by the labels of the pod or the scaled object, which the webhook reads from the API
    /// server. Must not be empty.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("has(self.matchLabels) && size(self.matchLabels) > 0 || has(self.matchExpressions) && size(self.matchExpressions) > 0").message("an empty selector would lock every object in the namespace: give matchLabels or matchExpressions"))]
    #[x_kube(validation = Rule::new("!has(self.matchExpressions) || self.matchExpressions.all(e, e.operator in ['In', 'NotIn', 'Exists', 'DoesNotExist'])").message("matchExpressions operators are In, NotIn, Exists or DoesNotExist"))]
    #[x_kube(validation = Rule::new("!has(self.matchExpressions) || self.matchExpressions.all(e, e.operator in ['In', 'NotIn'] ? has(e.values) && size(e.values) > 0 : !has(e.values) || size(e.values) == 0)").message("matchExpressions: In and NotIn need at least one value, Exists and DoesNotExist take none"))]
    pub selector: Option<LabelSelector>,

    /// Who may change the locked object anyway, e.g. the controller that took the lock. Their
    /// changes are allowed with a warning and an audit annotation naming the exemption.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exempt: Option<Exemptions>,

    /// When the lock stops applying (RFC 3339, e.g. 2026-11-22T18:00:00Z), with no controller
    /// needed: a crashed job cannot leave its lock behind forever. The Lock object stays until
    /// deleted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "Option<String>", length(max = 64))]
    #[x_kube(validation = Rule::new(r"self.matches('^[0-9]{4}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])T([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](\\.[0-9]{1,9})?(Z|[+-]([01][0-9]|2[0-3]):[0-5][0-9])$') && timestamp(self) >= timestamp('0001-01-01T00:00:00Z')").message("expiresAt must be an RFC 3339 time, e.g. 2026-11-22T18:00:00Z or 2026-11-22T19:00:00+01:00"))]
    pub expires_at: Option<Time>,

    /// Enforce (the default) refuses the change; Warn allows it with a warning and an audit
    /// annotation, to try a new lock before it blocks anyone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<LockMode>,

    /// Who holds the lock: while set, only the holder, whoever is granted the "unlock" verb on
    /// the lock, and the garbage collector may delete the lock or change its spec, owners or
    /// finalizers. On create (or change) it must name the requester or one of the requester's
    /// groups. kubectl lock sets it to the caller.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub holder: Option<Holder>,

    /// Lock only these fields: an UPDATE is refused only when it changes one of them (added,
    /// removed or another value), e.g. ["spec.template"] or
    /// ["metadata.annotations['example.com/key']"]. Paths are written as in kubectl explain;
    /// quote map keys with dots or slashes; a list is compared whole. DELETE, CREATE and
    /// CONNECT are not affected. At most one of fields and exceptFields.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 64), inner(length(min = 1, max = 512)))]
    #[x_kube(validation = field_paths_rule("fields"))]
    pub fields: Option<Vec<String>>,

    /// Lock everything but these fields, e.g. ["metadata.annotations", "spec.replicas"]: an
    /// UPDATE that changes only them is allowed. Same paths as fields; at most one of the two.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 64), inner(length(min = 1, max = 512)))]
    #[x_kube(validation = field_paths_rule("exceptFields"))]
    pub except_fields: Option<Vec<String>>,
}

/// The CRD's check of a list of field paths; the message names the first that does not parse.
fn field_paths_rule(field: &str) -> Rule {
    let pattern = crate::fieldpath::PATTERN;
    Rule::new(format!("self.all(p, p.matches(r'{pattern}'))")).message(Message::Expression(
        format!(
            "'{field}: ' + self.filter(p, !p.matches(r'{pattern}'))[0] + ' is not a field path (write spec.template or metadata.annotations[\\'example.com/key\\'])'"
        ),
    ))
}

impl LockSpec {
    /// The operations covered (both when unset).
    pub fn operations(&self) -> &[LockOperation] {
        self.operations
            .as_deref()
            .unwrap_or(&[LockOperation::Update, LockOperation::Delete])
    }

    pub fn is_expired(&self, now: Timestamp) -> bool {
        self.expires_at.as_ref().is_some_and(|t| t.0 <= now)
    }

    /// The CRD schema's checks, for lock files: `Err` names the field.
    pub fn validate(&self) -> Result<(), String> {
        if let Some(reason) = &self.reason
            && reason.chars().count() > 1024
        {
            return Err("reason: longer than 1024 characters".into());
        }
        if let Some(reason) = &self.reason
            && reason.chars().any(char::is_control)
        {
            return Err(
                "reason: control characters (newlines, tabs, escape sequences) are not allowed"
                    .into(),
            );
        }
        if let Some(ops) = &self.operations {
            if ops.is_empty() {
                return Err("operations: give UPDATE, DELETE or both (or leave it out)".into());
            }
            // The CRD's `x-kubernetes-list-type: set`: no entry twice.
            if let Some((i, op)) = ops
                .iter()
                .enumerate()
                .find(|(i, op)| ops[..*i].contains(op))
            {
                return Err(format!("operations[{i}]: {} is given twice", op.as_str()));
            }
        }
        if let Some(rules) = &self.resources {
            if rules.is_empty() {
                return Err("resources: give at least one rule (or leave it out)".into());
            }
            for (i, rule) in rules.iter().enumerate() {
                if rule.api_groups.is_empty() || rule.resources.is_empty() {
                    return Err(format!(
                        "resources[{i}]: apiGroups and resources must not be empty"
                    ));
                }
            }
        }
        if let Some(selector) = &self.selector {
            let empty = selector.match_labels.as_ref().is_none_or(|m| m.is_empty())
                && selector
                    .match_expressions
                    .as_ref()
                    .is_none_or(|e| e.is_empty());
            if empty {
                return Err("selector: an empty selector would lock every object in the namespace: give matchLabels or matchExpressions".into());
            }
            for e in selector.match_expressions.iter().flatten() {
                let values = e.values.as_ref().map_or(0, Vec::len);
                let needs_values = matches!(e.operator.as_str(), "In" | "NotIn");
                if needs_values != (values > 0) {
                    return Err("selector.matchExpressions: In and NotIn need at least one value, Exists and DoesNotExist take none".into());
                }
            }
            kube::core::Selector::try_from(selector.clone())
                .map_err(|e| format!("selector: {e}"))?;
        }
        if self.fields.is_some() && self.except_fields.is_some() {
            return Err("fields: give fields or exceptFields, not both".into());
        }
        for (name, paths) in [
            ("fields", &self.fields),
            ("exceptFields", &self.except_fields),
        ] {
            let Some(paths) = paths else { continue };
            if paths.is_empty() || paths.len() > 64 {
                return Err(format!(
                    "{name}: give 1 to 64 field paths (or leave it out)"
                ));
            }
            for path in paths {
                crate::fieldpath::FieldPath::parse(path).map_err(|e| format!("{name}: {e}"))?;
            }
        }
        if let Some(holder) = &self.holder {
            let named = [&holder.user, &holder.group, &holder.service_account]
                .iter()
                .filter(|x| x.is_some())
                .count();
            if named != 1 {
                return Err("holder names exactly one of user, group, serviceAccount".into());
            }
        }
        if let Some(exempt) = &self.exempt {
            if exempt.users.is_empty()
                && exempt.groups.is_empty()
                && exempt.service_accounts.is_empty()
            {
                return Err("exempt needs at least one of users, groups, serviceAccounts".into());
            }
            for sa in &exempt.service_accounts {
                let valid = sa.split_once('/').is_some_and(|(ns, name)| {
                    !ns.is_empty()
                        && !name.is_empty()
                        && !name.contains('/')
                        && ns
                            .chars()
                            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
                        && name.chars().all(|c| {
                            c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '.'
                        })
                });
                if !valid {
                    return Err(format!(
                        "exempt.serviceAccounts: {sa:?} is not namespace/name"
                    ));
                }
            }
        }
        Ok(())
    }
}

/// An operation a lock refuses.
#[derive(
    Serialize,
    Deserialize,
    Clone,
    Copy,
    Debug,
    PartialEq,
    Eq,
    Hash,
    PartialOrd,
    Ord,
    JsonSchema,
    clap::ValueEnum,
)]
#[serde(rename_all = "UPPERCASE")]
pub enum LockOperation {
    /// UPDATE, PATCH and apply; and writes to subresources other than status.
    #[value(name = "UPDATE", help = "Changes to the object")]
    Update,
    /// DELETE, and evictions.
    #[value(name = "DELETE", help = "Deletion of the object")]
    Delete,
    /// CREATE of an object of the lock's name: the lock reserves the name. A request with
    /// `generateName` has no name yet and is never refused.
    #[value(
        name = "CREATE",
        help = "Creation of an object of the name (the lock reserves it)"
    )]
    Create,
    /// `exec`, `attach`, `port-forward` and `proxy` into the locked pod: nothing reaches the
    /// pod through the API server.
    #[value(
        name = "CONNECT",
        help = "exec, attach, port-forward and proxy into the pod"
    )]
    Connect,
}

impl LockOperation {
    /// As written in `spec.operations`.
    pub fn as_str(self) -> &'static str {
        match self {
            LockOperation::Update => "UPDATE",
            LockOperation::Delete => "DELETE",
            LockOperation::Create => "CREATE",
            LockOperation::Connect => "CONNECT",
        }
    }
}

/// Enforce (the default) refuses the change; Warn allows it with a warning and an audit
/// annotation, to try a new lock before it blocks anyone.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, Hash, JsonSchema)]
pub enum LockMode {
    #[default]
    Enforce,
    /// Allow the change with a warning and an audit annotation.
    Warn,
}

/// Resources a lock applies to.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ResourceRule {
    /// API groups: "" for the core group (ConfigMaps, Pods...), "apps", "*" for any.
    #[schemars(length(min = 1))]
    pub api_groups: Vec<String>,
    /// Plural resource names, e.g. "deployments"; "*" for any.
    #[schemars(length(min = 1))]
    pub resources: Vec<String>,
}

/// Who may change a locked object anyway.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("has(self.users) || has(self.groups) || has(self.serviceAccounts)").message("exempt needs at least one of users, groups, serviceAccounts"))]
pub struct Exemptions {
    /// User names, e.g. "alice@example.com" or "system:serviceaccount:ns:name".
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(min = 1))]
    pub users: Vec<String>,
    /// Group names, e.g. "snapshot-operators".
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(min = 1))]
    pub groups: Vec<String>,
    /// ServiceAccounts as "namespace/name", e.g. "velero/velero".
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(
        length(min = 1),
        inner(regex(pattern = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?/[a-z0-9]([-a-z0-9.]*[a-z0-9])?$"))
    )]
    pub service_accounts: Vec<String>,
}

/// The one user, group or service account holding a lock.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("(has(self.user) ? 1 : 0) + (has(self.group) ? 1 : 0) + (has(self.serviceAccount) ? 1 : 0) == 1").message("holder names exactly one of user, group, serviceAccount"))]
pub struct Holder {
    /// A user name, as `kubectl auth whoami` shows it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    pub user: Option<String>,
    /// A group name: any member holds the lock.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    pub group: Option<String>,
    /// A ServiceAccount as "namespace/name", e.g. "backup/snapshotter".
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(
        pattern = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?/[a-z0-9]([-a-z0-9.]*[a-z0-9])?$"
    ))]
    pub service_account: Option<String>,
}

impl Holder {
    /// The holder for a requester: its ServiceAccount when the user name is one's, else the user.
    pub fn for_user(username: &str) -> Holder {
        match username
            .strip_prefix("system:serviceaccount:")
            .and_then(|rest| rest.split_once(':'))
        {
            Some((namespace, name)) => Holder {
                service_account: Some(format!("{namespace}/{name}")),
                ..Holder::default()
            },
            None => Holder {
                user: Some(username.to_owned()),
                ..Holder::default()
            },
        }
    }
}

impl std::fmt::Display for Holder {
    /// `user "alice"`, `group "ops"` or `service account "ns/name"`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match (&self.user, &self.group, &self.service_account) {
            (Some(user), _, _) => write!(f, "user {user:?}"),
            (_, Some(group), _) => write!(f, "group {group:?}"),
            (_, _, Some(sa)) => write!(f, "service account {sa:?}"),
            _ => f.write_str("nobody"),
        }
    }
}

/// Locks the cluster-scoped object of the same name (a Namespace, a ClusterRole, a
/// PersistentVolume, ...): while this ClusterLock exists, UPDATE and DELETE of that object (or
/// the operations spec.operations names: also CREATE and CONNECT) are refused. Delete the
/// ClusterLock to unlock.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "objectlock.dev",
    version = "v1alpha1",
    kind = "ClusterLock",
    shortname = "clk",
    category = "objectlocks",
    derive = "PartialEq",
    status = "LockStatus",
    doc = "Locks the cluster-scoped object of the same name against UPDATE and DELETE, or the operations spec.operations names (UPDATE, DELETE, CREATE, CONNECT).",
    printcolumn = r#"{"name":"Enforced","type":"integer","jsonPath":".status.enforcedCount","description":"How many kube-object-lock instances enforce the lock (entries in status.enforcedBy); empty until one has seen it"}"#,
    printcolumn = r#"{"name":"Mode","type":"string","jsonPath":".spec.mode","description":"Enforce (refuse) or Warn (allow with a warning); empty means Enforce"}"#,
    printcolumn = r#"{"name":"Expires","type":"string","jsonPath":".spec.expiresAt","description":"When the lock stops applying (RFC 3339); empty means never"}"#,
    printcolumn = r#"{"name":"Reason","type":"string","jsonPath":".spec.reason","description":"Why the object is locked"}"#,
    printcolumn = r#"{"name":"Owner-Kind","type":"string","jsonPath":".metadata.ownerReferences[0].kind","description":"Kind of the object that owns the lock: the garbage collector deletes the lock when that object is deleted"}"#,
    printcolumn = r#"{"name":"Owner","type":"string","jsonPath":".metadata.ownerReferences[0].name","description":"Name of the object that owns the lock"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
pub struct ClusterLockSpec {
    /// The same fields as a Lock's spec.
    #[serde(flatten)]
    pub lock: LockSpec,
}

impl From<ClusterLockSpec> for LockSpec {
    fn from(spec: ClusterLockSpec) -> Self {
        spec.lock
    }
}

/// What the kube-object-lock instances report about a Lock or ClusterLock.
///
/// Each instance writes only its own entry of `enforcedBy` (server-side apply, field manager
/// `kube-object-lock/<instance>`), so instances never overwrite each other. `enforcedCount` and
/// `conditions` are written by every instance with the same value, computed from what the lock
/// says and from `enforcedBy` as the instance last saw it.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct LockStatus {
    /// The instances enforcing this lock now: one entry per instance, written by that instance.
    /// An instance withdraws its entry when the lock stops applying (expired, Warn mode) or when
    /// it can no longer read the locks reliably. An instance that crashed keeps its entry until
    /// it runs again.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["instance"]))]
    pub enforced_by: Vec<Enforcer>,

    /// The number of entries in enforcedBy, for `kubectl get locks` (a printer column cannot
    /// count a list).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enforced_count: Option<i64>,

    /// Why the lock is or is not enforced: type Enforced, status True or False, with a reason
    /// (Enforcing, Expired, WarnMode, NotSentToWebhook).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<LockCondition>,
}

/// One kube-object-lock instance enforcing a lock.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Enforcer {
    /// The instance's name (setting `instance.name`, by default its host name).
    pub instance: String,
    /// The lock's metadata.generation the instance enforces.
    pub observed_generation: i64,
    /// Since when the instance enforces the lock.
    pub since: Time,
}

/// A condition of a lock. It carries no lastTransitionTime: every instance writes the same
/// condition, and a time would differ from one instance to the next.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct LockCondition {
    /// The condition's type: Enforced.
    #[serde(rename = "type")]
    pub type_: String,
    /// True, False or Unknown.
    pub status: String,
    /// Why, in one CamelCase word: Enforcing, Expired, WarnMode, NotSentToWebhook.
    pub reason: String,
    /// Why, for people.
    #[serde(default)]
    pub message: String,
    /// The lock's metadata.generation the condition was computed from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
}

pub fn crds() -> [CustomResourceDefinition; 2] {
    [
        optional_spec(Lock::crd()),
        optional_spec(ClusterLock::crd()),
    ]
}

pub fn crds_yaml() -> Result<String, serde_saphyr::ser_error::Error> {
    let mut out = String::new();
    for crd in crds() {
        out.push_str("---\n");
        out.push_str(&serde_saphyr::to_string(&crd)?);
    }
    Ok(out)
}

/// The derive makes `spec` required; a lock locks by existing, so it must not be.
fn optional_spec(mut crd: CustomResourceDefinition) -> CustomResourceDefinition {
    for version in &mut crd.spec.versions {
        let Some(root) = version
            .schema
            .as_mut()
            .and_then(|s| s.open_api_v3_schema.as_mut())
        else {
            continue;
        };
        if let Some(required) = root.required.as_mut() {
            required.retain(|field| field != "spec");
            if required.is_empty() {
                root.required = None;
            }
        }
        if let Some(spec) = root.properties.as_mut().and_then(|p| p.get_mut("spec")) {
            *spec = JSONSchemaProps {
                default: Some(
                    k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::JSON(
                        serde_json::json!({}),
                    ),
                ),
                ..spec.clone()
            };
        }
    }
    crd
}

#[cfg(test)]
mod tests {
    use super::*;

    fn schema(crd: &CustomResourceDefinition) -> &JSONSchemaProps {
        crd.spec.versions[0]
            .schema
            .as_ref()
            .and_then(|s| s.open_api_v3_schema.as_ref())
            .expect("derived CRDs carry a schema")
    }

    #[test]
    fn text_from_a_lock_is_escaped_for_terminals() {
        for (text, shown) in [
            ("VM snapshot", "VM snapshot"),
            ("café ünïcode ✓", "café ünïcode ✓"),
            (
                "\u{1b}[2K\rconfigmap \"ansi\" deleted\u{1b}[1A",
                "\\u{1b}[2K\\rconfigmap \"ansi\" deleted\\u{1b}[1A",
            ),
            ("two\nlines\ttab", "two\\nlines\\ttab"),
            ("c1 \u{9b}31m", "c1 \\u{9b}31m"),
            ("bidi \u{202e}txt.exe", "bidi \\u{202e}txt.exe"),
            ("nul \u{0}", "nul \\u{0}"),
        ] {
            assert_eq!(escape(text), shown, "{text:?}");
        }
        assert!(matches!(escape("plain"), std::borrow::Cow::Borrowed(_)));
        let bad = LockSpec {
            reason: Some("a\u{1b}[2Kb".into()),
            ..LockSpec::default()
        };
        assert!(
            bad.validate()
                .is_err_and(|e| e.contains("control characters"))
        );
    }

    #[test]
    fn spec_is_optional_and_defaults_to_empty() {
        for crd in crds() {
            let root = schema(&crd);
            assert!(
                !root.required.iter().flatten().any(|field| field == "spec"),
                "{} requires spec",
                crd.spec.names.kind
            );
            let spec = &root.properties.as_ref().expect("properties")["spec"];
            assert_eq!(
                spec.default.as_ref().map(|d| &d.0),
                Some(&serde_json::json!({}))
            );
        }
    }

    #[test]
    fn names_scope_and_columns() {
        let [lock, cluster] = crds();
        assert_eq!(lock.metadata.name.as_deref(), Some("locks.objectlock.dev"));
        assert_eq!(lock.spec.scope, "Namespaced");
        assert_eq!(lock.spec.names.short_names, Some(vec!["lk".to_owned()]));
        assert_eq!(
            cluster.metadata.name.as_deref(),
            Some("clusterlocks.objectlock.dev")
        );
        assert_eq!(cluster.spec.scope, "Cluster");
        assert_eq!(cluster.spec.names.short_names, Some(vec!["clk".to_owned()]));
        for crd in [&lock, &cluster] {
            assert_eq!(
                crd.spec.names.categories,
                Some(vec!["objectlocks".to_owned()])
            );
            let columns: Vec<_> = crd.spec.versions[0]
                .additional_printer_columns
                .iter()
                .flatten()
                .map(|c| c.name.as_str())
                .collect();
            assert_eq!(
                columns,
                [
                    "Enforced",
                    "Mode",
                    "Expires",
                    "Reason",
                    "Owner-Kind",
                    "Owner",
                    "Age"
                ]
            );
            let paths: Vec<_> = crd.spec.versions[0]
                .additional_printer_columns
                .iter()
                .flatten()
                .filter(|c| c.name.starts_with("Owner"))
                .map(|c| c.json_path.as_str())
                .collect();
            assert_eq!(
                paths,
                [
                    ".metadata.ownerReferences[0].kind",
                    ".metadata.ownerReferences[0].name"
                ]
            );
            assert!(
                crd.spec.versions[0]
                    .subresources
                    .as_ref()
                    .is_some_and(|s| s.status.is_some()),
                "status is a subresource, so status writes need their own permission"
            );
            let status = &schema(crd).properties.as_ref().expect("properties")["status"];
            let enforced_by = &status.properties.as_ref().expect("status fields")["enforcedBy"];
            let keys = serde_json::to_value(enforced_by).expect("serializes");
            assert_eq!(keys["x-kubernetes-list-type"], "map");
            assert_eq!(
                keys["x-kubernetes-list-map-keys"],
                serde_json::json!(["instance"])
            );
        }
    }

    #[test]
    fn every_spec_field_is_described() {
        for crd in crds() {
            let spec = &schema(&crd).properties.as_ref().expect("properties")["spec"];
            let fields = spec.properties.as_ref().expect("spec has fields");
            assert!(!fields.is_empty());
            for (name, field) in fields {
                assert!(
                    field.description.as_deref().is_some_and(|d| d.len() > 20),
                    "{}: spec.{name} has no description",
                    crd.spec.names.kind
                );
            }
        }
    }

    #[test]
    fn cluster_lock_spec_reads_like_a_lock_spec() {
        let spec: ClusterLockSpec =
            serde_json::from_value(serde_json::json!({"reason": "migration"})).expect("parses");
        assert_eq!(LockSpec::from(spec).reason.as_deref(), Some("migration"));
    }

    #[test]
    fn yaml_has_both_documents() {
        let yaml = crds_yaml().expect("serializes");
        assert_eq!(yaml.matches("kind: CustomResourceDefinition").count(), 2);
        assert!(yaml.contains("name: locks.objectlock.dev"));
        assert!(yaml.contains("name: clusterlocks.objectlock.dev"));
    }

    /// The CEL rules of the generated schema, with where they apply.
    fn cel_rules(
        schema: &serde_json::Value,
        path: &[String],
        out: &mut Vec<(Vec<String>, String)>,
    ) {
        for rule in schema["x-kubernetes-validations"]
            .as_array()
            .into_iter()
            .flatten()
        {
            out.push((
                path.to_vec(),
                rule["rule"].as_str().expect("rule").to_owned(),
            ));
        }
        for (key, sub) in schema["properties"].as_object().into_iter().flatten() {
            let mut deeper = path.to_vec();
            deeper.push(key.clone());
            cel_rules(sub, &deeper, out);
        }
    }

    /// Whether every CEL rule of the CRD accepts `spec`, evaluated as the API server would.
    fn cel_accepts(spec: &serde_json::Value) -> bool {
        let crd = serde_json::to_value(&crds()[0]).expect("json");
        let schema = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"];
        let mut rules = Vec::new();
        cel_rules(schema, &[], &mut rules);
        assert_eq!(rules.len(), 10, "{rules:?}");
        rules.iter().all(|(path, rule)| {
            let Some(value) = path.iter().try_fold(spec, |v, key| v.get(key)) else {
                return true; // rules apply to fields that are present
            };
            let program = cel::Program::compile(rule).expect("the rule compiles");
            let mut context = cel::Context::default();
            context
                .add_variable("self", cel::to_value(value).expect("value"))
                .expect("variable");
            // CEL's timestamp(), as seconds: Go's RFC 3339 parser, stood in for by jiff.
            context
                .add_function("timestamp", |s: std::sync::Arc<String>| {
                    s.parse::<Timestamp>()
                        .map(|t| t.as_second())
                        .map_err(|e| cel::ExecutionError::function_error("timestamp", e))
                })
                .expect("function");
            // The API server refuses the object when a rule fails to evaluate.
            match program.execute(&context) {
                Ok(cel::Value::Bool(ok)) => ok,
                Err(_) => false,
                Ok(other) => panic!("{rule} gave {other:?}"),
            }
        })
    }

    #[test]
    fn crd_rules_and_file_validation_agree() {
        let cases = [
            (serde_json::json!({}), true),
            (
                serde_json::json!({"reason": "r", "mode": "Warn", "operations": ["DELETE"]}),
                true,
            ),
            (
                serde_json::json!({"reason": "VM snapshot: ünïcode ✓"}),
                true,
            ),
            (serde_json::json!({"reason": "a\u{1b}[2K\rb"}), false),
            (serde_json::json!({"reason": "two\nlines"}), false),
            (serde_json::json!({"reason": "tab\there"}), false),
            (serde_json::json!({"reason": "c1 \u{9b}"}), false),
            (serde_json::json!({"reason": "del \u{7f}"}), false),
            (serde_json::json!({"exempt": {"users": ["alice"]}}), true),
            (
                serde_json::json!({"exempt": {"serviceAccounts": ["velero/velero"]}}),
                true,
            ),
            (serde_json::json!({"exempt": {}}), false),
            (serde_json::json!({"holder": {"user": "alice"}}), true),
            (
                serde_json::json!({"holder": {"serviceAccount": "backup/snapshotter"}}),
                true,
            ),
            (serde_json::json!({"holder": {}}), false),
            (
                serde_json::json!({"holder": {"user": "alice", "group": "ops"}}),
                false,
            ),
            (
                serde_json::json!({"selector": {"matchLabels": {"app": "web"}}}),
                true,
            ),
            (
                serde_json::json!({"selector": {"matchExpressions": [{"key": "tier", "operator": "In", "values": ["db"]}]}}),
                true,
            ),
            (serde_json::json!({"selector": {}}), false),
            (serde_json::json!({"selector": {"matchLabels": {}}}), false),
            (
                serde_json::json!({"selector": {"matchExpressions": [{"key": "tier", "operator": "Like"}]}}),
                false,
            ),
            // In and NotIn without values: kube's Selector refuses the first, and NotIn [] would
            // select every object. Exists and DoesNotExist with values: the API server refuses.
            (
                serde_json::json!({"selector": {"matchExpressions": [{"key": "app", "operator": "In"}]}}),
                false,
            ),
            (
                serde_json::json!({"selector": {"matchExpressions": [{"key": "app", "operator": "NotIn", "values": []}]}}),
                false,
            ),
            (
                serde_json::json!({"selector": {"matchExpressions": [{"key": "app", "operator": "Exists", "values": ["x"]}]}}),
                false,
            ),
            (
                serde_json::json!({"selector": {"matchExpressions": [{"key": "app", "operator": "DoesNotExist"}]}}),
                true,
            ),
            (
                serde_json::json!({"selector": {"matchExpressions": [{"key": "app", "operator": "Exists", "values": []}]}}),
                true,
            ),
            (
                serde_json::json!({"expiresAt": "2030-01-01T00:00:00Z"}),
                true,
            ),
            (
                serde_json::json!({"expiresAt": "2030-01-01T00:00:00.123456789+05:30"}),
                true,
            ),
            (serde_json::json!({"fields": ["spec.template"]}), true),
            (
                serde_json::json!({"fields": ["metadata.annotations['example.com/key']"]}),
                true,
            ),
            (
                serde_json::json!({"exceptFields": ["metadata.annotations", "spec.replicas"]}),
                true,
            ),
            (
                serde_json::json!({"fields": ["spec"], "exceptFields": ["status"]}),
                false,
            ),
            (serde_json::json!({"fields": ["spec..template"]}), false),
            (
                serde_json::json!({"exceptFields": ["metadata.annotations[example.com]"]}),
                false,
            ),
        ];
        for (spec, valid) in cases {
            assert_eq!(cel_accepts(&spec), valid, "CEL on {spec}");
            let parsed: LockSpec = serde_json::from_value(spec.clone()).expect("parses");
            assert_eq!(
                parsed.validate().is_ok(),
                valid,
                "validate() on {spec}: {:?}",
                parsed.validate()
            );
        }
        // What the schema itself checks (no CEL), validate() checks too.
        for spec in [
            serde_json::json!({"operations": []}),
            serde_json::json!({"resources": []}),
            serde_json::json!({"resources": [{"apiGroups": [], "resources": ["x"]}]}),
            serde_json::json!({"exempt": {"serviceAccounts": ["no-namespace"]}}),
            serde_json::json!({"reason": "x".repeat(1025)}),
        ] {
            let parsed: LockSpec = serde_json::from_value(spec.clone()).expect("parses");
            assert!(parsed.validate().is_err(), "{spec}");
        }
    }

    /// The CRD declares operations a set (`x-kubernetes-list-type: set`): the API server refuses
    /// any entry given twice, wherever it is in the list.
    #[test]
    fn operations_are_a_set() {
        let crd = serde_json::to_value(&crds()[0]).expect("json");
        let schema = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
            ["properties"]["operations"];
        assert_eq!(schema["x-kubernetes-list-type"], "set");
        let cases: &[(&[&str], bool)] = &[
            (&["UPDATE"], true),
            (&["UPDATE", "DELETE"], true),
            (&["UPDATE", "DELETE", "CREATE", "CONNECT"], true),
            (&["DELETE", "DELETE"], false),
            (&["UPDATE", "DELETE", "UPDATE"], false),
            (&["UPDATE", "DELETE", "DELETE"], false),
            (&["CREATE", "UPDATE", "DELETE", "CONNECT", "CREATE"], false),
        ];
        for (ops, valid) in cases {
            let spec: LockSpec =
                serde_json::from_value(serde_json::json!({ "operations": ops })).expect("parses");
            assert_eq!(
                spec.validate().is_ok(),
                *valid,
                "{ops:?}: {:?}",
                spec.validate()
            );
        }
    }

    #[test]
    fn the_crd_refuses_every_expiry_the_webhook_cannot_read() {
        let times = [
            ("2030-01-01T00:00:00Z", true),
            ("2030-01-01T00:00:00.5Z", true),
            ("2030-01-01T00:00:00.123456789Z", true),
            ("2030-01-01T00:00:00-08:00", true),
            ("2030-01-01T23:59:59+23:59", true),
            // The API server's own date-time check lets these through; jiff refuses them.
            ("2030-01-01T00:00:00x1Z", false),
            ("2030-01-01T00:00:00+99:00", false),
            ("2030-01-01T00:00:00.123456789123Z", false),
            ("2030-01-01T00:00:00", false),
            ("2030-01-01 00:00:00Z", false),
            ("2030-01-01T00:00:00+0100", false),
            ("2030-02-30T00:00:00Z", false),
            ("2030-01-01T24:00:00Z", false),
            ("9999-12-31T23:59:59-01:00", false),
            ("tomorrow", false),
        ];
        for (time, valid) in times {
            let spec = serde_json::json!({ "expiresAt": time });
            assert_eq!(cel_accepts(&spec), valid, "CEL on {time}");
            if valid {
                let parsed = serde_json::from_value::<LockSpec>(spec);
                assert!(parsed.is_ok(), "{time}: {parsed:?}");
            }
        }
    }

    #[test]
    fn expiry_and_operations() {
        let now: Timestamp = "2026-11-22T12:00:00Z".parse().expect("time");
        let spec: LockSpec =
            serde_json::from_value(serde_json::json!({"expiresAt": "2026-11-22T12:00:00Z"}))
                .expect("parses");
        assert!(spec.is_expired(now), "expiry is inclusive");
        assert!(!spec.is_expired("2026-11-22T11:59:59Z".parse().expect("time")));
        assert!(!LockSpec::default().is_expired(now));
        assert_eq!(
            LockSpec::default().operations(),
            [LockOperation::Update, LockOperation::Delete]
        );
        let bad = serde_json::from_value::<LockSpec>(serde_json::json!({"expiresAt": "tomorrow"}));
        assert!(bad.is_err());
        let bad = serde_json::from_value::<LockSpec>(serde_json::json!({"mode": "Audit"}));
        assert!(bad.is_err());
    }
}
