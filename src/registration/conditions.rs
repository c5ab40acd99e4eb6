//! The narrowed registration's plan, pure: from the live locks, the CEL `matchConditions` and
//! namespace selectors of the webhook entries. Invariant: deterministic (sorted) output, so every
//! instance computes the same; a request's keys are all in one chunk, so it is sent at most once.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::jiff::Timestamp;

use crate::admission::subresources;
use crate::api::{LockOperation, LockSpec};
use crate::locks::{LockKind, LockRef};

pub const CONDITION_NAME: &str = "may-be-locked";

/// `request.name`, or `oldObject.metadata.name` for DELETECOLLECTION items; guarded with `has`,
/// as an evaluation error would refuse the request under `failurePolicy: Fail`.
pub const NAME_EXPR: &str = "(has(request.name) && request.name != '' ? request.name : (oldObject != null && has(oldObject.metadata) && has(oldObject.metadata.name) ? oldObject.metadata.name : ''))";

/// As [`NAME_EXPR`], a proxy request's `[scheme:]NAME[:port]` split as the API server splits it
/// ([`crate::admission::subresources::proxied_name`]).
pub const CONNECT_NAME_EXPR: &str = "(has(request.subResource) && request.subResource == 'proxy' && has(request.name) ? (request.name.split(':').size() == 3 ? request.name.split(':')[1] : request.name.split(':')[0]) : (has(request.name) && request.name != '' ? request.name : (oldObject != null && has(oldObject.metadata) && has(oldObject.metadata.name) ? oldObject.metadata.name : '')))";

pub const NAMESPACE_EXPR: &str = "(has(request.namespace) ? request.namespace : '')";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NarrowingBounds {
    pub max_names: usize,
    /// Per expression (the API server allows 100,000 code points).
    pub chunk_chars: usize,
    /// Keys and selectors together: far below the 1.5 MiB an object may take in etcd.
    pub max_total_chars: usize,
}

impl Default for NarrowingBounds {
    fn default() -> Self {
        NarrowingBounds {
            max_names: 2_000,
            chunk_chars: 30_000,
            max_total_chars: 700_000,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BroadReason {
    #[error(
        "{names} live locks exceed registration.max_names ({max}), their namespaces each sent whole: every UPDATE and DELETE is sent to the webhook"
    )]
    TooManyNames { names: usize, max: usize },
    #[error(
        "the locked names and their namespaces take {chars} characters, more than {max} for one configuration: every UPDATE and DELETE is sent to the webhook"
    )]
    TooLarge { chars: usize, max: usize },
    #[error(
        "lock name {0:?} cannot be written into a CEL condition: every UPDATE and DELETE is sent to the webhook"
    )]
    UnsafeName(String),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConditionsPlan {
    /// Live locks that can lock something the webhook is sent.
    pub names: usize,
    /// The earliest `expiresAt` of a live lock: the plan changes then.
    pub next_expiry: Option<Timestamp>,
    pub scope: Scope,
    /// Per namespaced entry of [`Scope::Narrow`], the namespaces of its keys (sorted), for its
    /// `namespaceSelector`. Empty when broad.
    pub namespaces: Vec<Vec<String>>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Scope {
    /// One `may-be-locked` expression per entry; never empty (`false` when nothing is locked).
    Narrow {
        namespaced: Vec<String>,
        cluster: Vec<String>,
    },
    Broad(BroadReason),
}

/// What the conditions send besides the requests concerning a locked name (all: the resources
/// of a ClusterLock with a selector).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Clauses {
    /// UPDATE and DELETE: also the DELETE of a Namespace holding Locks or of a CRD whose objects
    /// a Lock covers.
    Changes,
    /// CREATE: the locked names only.
    Names,
    /// CONNECT: as [`Clauses::Names`], through [`CONNECT_NAME_EXPR`].
    Connect,
}

impl Clauses {
    fn name_expr(self) -> &'static str {
        match self {
            Clauses::Connect => CONNECT_NAME_EXPR,
            Clauses::Changes | Clauses::Names => NAME_EXPR,
        }
    }
}

pub fn plan<'a>(
    clauses: Clauses,
    locks: impl IntoIterator<Item = &'a LockRef>,
    now: Timestamp,
    limits: &NarrowingBounds,
) -> ConditionsPlan {
    let mut names = 0usize;
    let mut next_expiry: Option<Timestamp> = None;
    // Namespace -> Some(names) for named Locks only, None once a selector Lock is seen.
    let mut namespaces: BTreeMap<&str, Option<BTreeSet<&str>>> = BTreeMap::new();
    let mut cluster_locks: BTreeSet<&str> = BTreeSet::new();
    let mut cluster_selectors: Vec<&LockSpec> = Vec::new();
    // The groups of the CustomResourceDefinitions whose deletion is sent.
    let mut crd_groups: BTreeSet<&str> = BTreeSet::new();
    let mut unsafe_name = None;
    for lock in locks {
        // A lock of nothing the webhook is sent widens nothing.
        if lock.spec.is_expired(now) || !subresources::locks_anything(&lock.spec) {
            continue;
        }
        if lock.spec.operations().contains(&LockOperation::Delete) {
            crd_groups.extend(deleted_groups(&lock.spec));
        }
        names += 1;
        let expiry = lock.spec.expires_at.as_ref().map(|t| t.0);
        next_expiry = next_expiry.into_iter().chain(expiry).min();
        let mut parts = std::iter::once(lock.name.as_str()).chain(lock.namespace.as_deref());
        if let Some(part) = parts.find(|part| !is_safe(part)) {
            unsafe_name.get_or_insert_with(|| part.to_owned());
        }
        match (lock.kind, lock.namespace.as_deref()) {
            (LockKind::ClusterLock, _) | (LockKind::Lock, None) => {
                cluster_locks.insert(&lock.name);
                if lock.spec.selector.is_some() {
                    cluster_selectors.push(&lock.spec);
                }
            }
            (LockKind::Lock, Some(ns)) => {
                let entry = namespaces
                    .entry(ns)
                    .or_insert_with(|| Some(BTreeSet::new()));
                if lock.spec.selector.is_some() {
                    *entry = None;
                } else if let Some(set) = entry {
                    set.insert(&lock.name);
                }
            }
        }
    }
    let broad = |reason| ConditionsPlan {
        names,
        next_expiry,
        scope: Scope::Broad(reason),
        namespaces: Vec::new(),
    };
    // Beyond the bound, the namespaces with the most names are sent whole, largest first.
    let mut keys = cluster_locks.len()
        + (namespaces.values())
            .map(|names| names.as_ref().map_or(1, BTreeSet::len))
            .sum::<usize>();
    let mut largest: Vec<(usize, &str)> = (namespaces.iter())
        .filter_map(|(ns, names)| Some((names.as_ref()?.len(), *ns)))
        .filter(|(n, _)| *n > 1)
        .collect();
    largest.sort_by(|a, b| b.cmp(a));
    for (n, ns) in largest {
        if keys <= limits.max_names {
            break;
        }
        namespaces.insert(ns, None);
        keys -= n - 1;
    }
    if keys > limits.max_names {
        return broad(BroadReason::TooManyNames {
            names,
            max: limits.max_names,
        });
    }
    if let Some(name) = unsafe_name {
        return broad(BroadReason::UnsafeName(name));
    }

    // Namespaced keys, in namespace order: a selector namespace is one key; otherwise one key
    // per locked name.
    let mut namespaced = Chunks::new(limits.chunk_chars);
    for (ns, content) in &namespaces {
        match content {
            None => namespaced.push(&[(0, ns.to_string())]),
            Some(set) => {
                for name in set {
                    namespaced.push(&[(1, format!("{ns}/{name}"))]);
                }
            }
        }
    }
    let namespaced_total = namespaced.total;
    // Cluster keys, in name order; a name that is both a ClusterLock and a namespace holding
    // Locks stays in one chunk, so a Namespace deletion hits one entry.
    let mut by_name: BTreeMap<&str, (bool, bool)> = BTreeMap::new();
    for name in &cluster_locks {
        by_name.entry(name).or_default().0 = true;
    }
    if clauses == Clauses::Changes {
        for ns in namespaces.keys() {
            by_name.entry(ns).or_default().1 = true;
        }
    }
    let mut cluster = Chunks::new(limits.chunk_chars);
    for (name, (locked, holds_locks)) in by_name {
        let keys: Vec<(usize, String)> = [(locked, 0), (holds_locks, 1)]
            .into_iter()
            .filter(|(on, _)| *on)
            .map(|(_, list)| (list, name.to_owned()))
            .collect();
        cluster.push(&keys);
    }
    let namespaced = namespaced.chunks;
    let selected: Vec<Vec<String>> = namespaced.iter().map(chunk_namespaces).collect();
    // The selectors count against the same bound as the keys: a namespace name is written once
    // per entry whose keys it holds.
    let selector_chars: usize = (selected.iter().flatten()).map(|ns| ns.len() + 1).sum();
    let chars = namespaced_total + cluster.total + selector_chars;
    if chars > limits.max_total_chars {
        return broad(BroadReason::TooLarge {
            chars,
            max: limits.max_total_chars,
        });
    }
    let mut cluster: Vec<String> = (cluster.chunks.iter())
        .map(|chunk| cluster_expr(chunk, clauses.name_expr()))
        .collect();
    // What is sent whatever the name, in the first entry: a selector ClusterLock's resources,
    // and (UPDATE and DELETE) the deletions of the CRDs whose objects a Lock covers.
    let crds = (clauses == Clauses::Changes).then(|| crd_expr(&crd_groups));
    let selectors = cluster_selectors.iter().map(|spec| resources_expr(spec));
    let whatever_the_name = or(selectors.chain(crds.flatten()));
    match (whatever_the_name.as_str(), cluster.first_mut()) {
        ("false", _) | (_, None) => {}
        ("true", Some(first)) => *first = "true".to_owned(),
        (expr, Some(first)) if first == "false" => *first = expr.to_owned(),
        (expr, Some(first)) => *first = format!("{expr} || {first}"),
    }
    ConditionsPlan {
        names,
        next_expiry,
        scope: Scope::Narrow {
            namespaced: (namespaced.iter())
                .map(|chunk| namespaced_expr(chunk, clauses.name_expr()))
                .collect(),
            cluster,
        },
        namespaces: selected,
    }
}

/// The API groups a lock covering DELETE names exactly, for an object resource (not `*`, not a
/// subresource only, nothing CEL cannot hold): deleting a CRD of one of them is sent.
fn deleted_groups(spec: &LockSpec) -> impl Iterator<Item = &str> {
    (spec.resources.iter().flatten())
        .filter(|rule| rule.resources.iter().any(|r| !r.contains('/')))
        .flat_map(|rule| rule.api_groups.iter())
        .map(String::as_str)
        .filter(|group| *group != "*" && is_safe(group))
}

/// The DELETE of a CustomResourceDefinition (named `plural.group`) of one of `groups`.
fn crd_expr(groups: &BTreeSet<&str>) -> Option<String> {
    let groups: Vec<String> = groups.iter().map(|g| g.to_string()).collect();
    let group = format!("{NAME_EXPR}.substring({NAME_EXPR}.indexOf('.') + 1)");
    contains(&groups, &group).map(|deleted| format!(
        "(request.resource.group == 'apiextensions.k8s.io' && request.resource.resource == 'customresourcedefinitions' && request.operation == 'DELETE' && {deleted})"
    ))
}

/// The requests of the resources `spec` covers, whatever the object's name: `true` for every
/// resource, or when a group or resource cannot be written into CEL.
fn resources_expr(spec: &LockSpec) -> String {
    let Some(rules) = &spec.resources else {
        return "true".to_owned();
    };
    let mut parts = Vec::new();
    for rule in rules {
        let resources: Vec<String> = (rule.resources.iter())
            .map(|r| r.split_once('/').map_or(r.as_str(), |(r, _)| r).to_owned())
            .collect();
        let check = |values: &[String], field: &str| -> Option<Option<String>> {
            if values.iter().any(|v| v == "*") {
                return Some(None);
            }
            (values.iter().all(|v| v.is_empty() || is_safe(v)))
                .then(|| Some(format!("{}.contains('|' + {field} + '|')", literal(values))))
        };
        match (
            check(&rule.api_groups, "request.resource.group"),
            check(&resources, "request.resource.resource"),
        ) {
            (Some(group), Some(resource)) => {
                let both: Vec<String> = group.into_iter().chain(resource).collect();
                match both.is_empty() {
                    true => return "true".to_owned(),
                    false => parts.push(format!("({})", both.join(" && "))),
                }
            }
            _ => return "true".to_owned(),
        }
    }
    or(parts)
}

/// The namespaces of a namespaced chunk's keys: list 0 holds namespaces, list 1 `namespace/name`.
fn chunk_namespaces([selector_namespaces, names]: &[Vec<String>; 2]) -> Vec<String> {
    let from_names = names
        .iter()
        .filter_map(|k| k.split_once('/').map(|(ns, _)| ns));
    let all: BTreeSet<&str> = (selector_namespaces.iter().map(String::as_str))
        .chain(from_names)
        .collect();
    all.into_iter().map(str::to_owned).collect()
}

/// Characters that need no escaping in a single-quoted CEL string and cannot be confused with
/// the separators `|` and `/`. Lock names are DNS subdomains, namespaces DNS labels.
fn is_safe(name: &str) -> bool {
    !name.is_empty()
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b'_' | b':'))
}

/// Keys cut into chunks of at most `budget` characters, each of two key lists; at least one
/// chunk, only the first possibly empty.
struct Chunks {
    budget: usize,
    chunks: Vec<[Vec<String>; 2]>,
    size: usize,
    total: usize,
}

impl Chunks {
    fn new(budget: usize) -> Self {
        let chunks = vec![Default::default()];
        Chunks {
            budget,
            chunks,
            size: 0,
            total: 0,
        }
    }

    /// Adds keys that must stay together (each goes to list `.0`).
    fn push(&mut self, keys: &[(usize, String)]) {
        let cost: usize = keys.iter().map(|(_, k)| k.len() + 1).sum();
        if self.size > 0 && self.size + cost > self.budget {
            self.chunks.push(Default::default());
            self.size = 0;
        }
        let chunk = self.chunks.last_mut().expect("at least one chunk");
        for (list, key) in keys {
            chunk[*list].push(key.clone());
        }
        self.size += cost;
        self.total += cost;
    }
}

/// `'|a|b|'`: keys between separators, so that `'|' + key + '|'` matches whole keys only.
fn literal(keys: &[String]) -> String {
    let keys: String = keys.iter().map(|k| format!("{k}|")).collect();
    format!("'|{keys}'")
}

fn or(parts: impl IntoIterator<Item = String>) -> String {
    let parts: Vec<String> = parts.into_iter().collect();
    if parts.is_empty() {
        "false".to_owned()
    } else {
        parts.join(" || ")
    }
}

/// `'|a|b|'.contains('|' + needle + '|')`; none without keys.
fn contains(keys: &[String], needle: &str) -> Option<String> {
    (!keys.is_empty()).then(|| format!("{}.contains('|' + {needle} + '|')", literal(keys)))
}

/// Namespaced entry: list 0 = namespaces with a selector Lock, list 1 = `namespace/name`.
fn namespaced_expr([selector_namespaces, names]: &[Vec<String>; 2], name: &str) -> String {
    let key = format!("{NAMESPACE_EXPR} + '/' + {name}");
    let namespaces = contains(selector_namespaces, NAMESPACE_EXPR);
    or(namespaces.into_iter().chain(contains(names, &key)))
}

/// Cluster entry: list 0 = ClusterLock names, list 1 = namespaces holding Locks.
fn cluster_expr([cluster_locks, namespaces]: &[Vec<String>; 2], name: &str) -> String {
    let deleted = contains(namespaces, NAME_EXPR).map(|holds| format!(
        "(request.resource.group == '' && request.resource.resource == 'namespaces' && request.operation == 'DELETE' && {holds})"
    ));
    or(contains(cluster_locks, name).into_iter().chain(deleted))
}

/// Its CEL evaluation and fixtures serve the other plans' tests too.
#[cfg(test)]
pub(super) mod tests;
