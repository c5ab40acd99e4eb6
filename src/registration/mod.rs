//! The registration narrows itself to the locked names.
//!
//! The broad registration sends every UPDATE and DELETE in the cluster to the webhook; with
//! `failurePolicy: Fail`, a webhook that is down then refuses all of them. Narrowed, the
//! ValidatingWebhookConfiguration's `matchConditions` name the locked objects, so the API
//! server calls the webhook only for requests a lock could concern and decides everything else
//! in-process: a webhook that is down then blocks only writes to locked objects.
//!
//! [`conditions`] computes the conditions (pure); [`webhooks`] turns them into webhook entries
//! from the entries `manifests cluster` installed (their URL, caBundle, rules and failure
//! policy are kept); [`writer`] keeps the configuration up to date from a watch of the locks.

pub mod conditions;
pub mod writer;

use k8s_openapi::api::admissionregistration::v1::{MatchCondition, ValidatingWebhook};

use conditions::{CONDITION_NAME, Plan, Scope};
use std::collections::BTreeSet;

use crate::api::LockKey;

/// The entry for namespaced objects (and the first chunk of their conditions).
pub const NAMESPACED_ENTRY: &str = "namespaced.objectlock.dev";
/// The entry for cluster-scoped objects.
pub const CLUSTER_ENTRY: &str = "cluster.objectlock.dev";

/// Name of the `index`-th entry of a kind: the first keeps the base name, the others are
/// `namespaced-2.objectlock.dev`, `namespaced-3.objectlock.dev`, ...
pub fn entry_name(base: &str, index: usize) -> String {
    match (index, base.split_once('.')) {
        (0, _) | (_, None) => base.to_owned(),
        (i, Some((first, rest))) => format!("{first}-{}.{rest}", i + 1),
    }
}

/// True for the entries this module writes besides the two base ones.
pub fn is_extra_entry(name: &str, base: &str) -> bool {
    let (Some((first, rest)), Some((base_first, base_rest))) =
        (name.split_once('.'), base.split_once('.'))
    else {
        return false;
    };
    rest == base_rest
        && first
            .strip_prefix(base_first)
            .and_then(|s| s.strip_prefix('-'))
            .is_some_and(|n| n.parse::<usize>().is_ok_and(|n| n >= 2))
}

/// The configuration lacks an entry the narrowed one is made from.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "the webhook configuration has no entry {0:?}; apply the output of `kube-object-lock manifests cluster` first"
)]
pub struct MissingEntry(pub String);

/// The webhook entries the plan asks for, made from the configuration's current entries:
/// each base entry keeps everything but its `may-be-locked` condition, which is replaced
/// (`true` when broad); extra entries are copies of the base entry with their own condition.
/// Entries of other names are left out (and left alone by the writer).
pub fn webhooks(
    current: &[ValidatingWebhook],
    plan: &Plan,
) -> Result<Vec<ValidatingWebhook>, MissingEntry> {
    let template = |base: &str| {
        current
            .iter()
            .find(|w| w.name == base)
            .ok_or_else(|| MissingEntry(base.to_owned()))
    };
    let (namespaced, cluster) = (template(NAMESPACED_ENTRY)?, template(CLUSTER_ENTRY)?);
    let broad = "true".to_owned();
    let (ns_exprs, cluster_exprs) = match &plan.scope {
        Scope::Narrow {
            namespaced,
            cluster,
        } => (namespaced.iter().collect(), cluster.iter().collect()),
        // `true` rather than no condition: a condition another field manager (kubectl apply
        // --server-side of `manifests cluster`) co-owns would survive its removal half-written.
        Scope::Broad(_) => (vec![&broad], vec![&broad]),
    };
    let mut out = Vec::new();
    for (template, base, exprs) in [
        (namespaced, NAMESPACED_ENTRY, ns_exprs),
        (cluster, CLUSTER_ENTRY, cluster_exprs),
    ] {
        for (index, expr) in exprs.into_iter().enumerate() {
            let mut entry = template.clone();
            entry.name = entry_name(base, index);
            let mut conditions: Vec<MatchCondition> = entry
                .match_conditions
                .take()
                .unwrap_or_default()
                .into_iter()
                .filter(|c| c.name != CONDITION_NAME)
                .collect();
            conditions.push(MatchCondition {
                name: CONDITION_NAME.to_owned(),
                expression: expr.clone(),
            });
            entry.match_conditions = Some(conditions);
            out.push(entry);
        }
    }
    Ok(out)
}

/// The narrowed entries before any lock exists: `may-be-locked` is `false`, so nothing is sent
/// until the running webhook writes the locked names. What `manifests cluster` emits.
pub fn starting_point(
    entries: &[ValidatingWebhook],
) -> Result<Vec<ValidatingWebhook>, MissingEntry> {
    let plan = conditions::plan(
        std::iter::empty(),
        k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
        &conditions::Limits::default(),
    );
    webhooks(entries, &plan)
}

/// The RBAC rule that lets the webhook keep its configuration `name` narrowed: that one object,
/// nothing wider (`list` and `watch` are restricted by name through a field selector).
pub fn rbac_rule(name: &str) -> k8s_openapi::api::rbac::v1::PolicyRule {
    k8s_openapi::api::rbac::v1::PolicyRule {
        api_groups: Some(vec!["admissionregistration.k8s.io".to_owned()]),
        resources: Some(vec!["validatingwebhookconfigurations".to_owned()]),
        resource_names: Some(vec![name.to_owned()]),
        verbs: ["get", "list", "watch", "patch"]
            .map(str::to_owned)
            .to_vec(),
        ..Default::default()
    }
}

/// Whether the configuration's entries already say what `desired` says: every desired entry
/// present and equal, and no extra entry of ours left over.
pub fn is_current(current: &[ValidatingWebhook], desired: &[ValidatingWebhook]) -> bool {
    let stale = current.iter().any(|w| {
        (is_extra_entry(&w.name, NAMESPACED_ENTRY) || is_extra_entry(&w.name, CLUSTER_ENTRY))
            && !desired.iter().any(|d| d.name == w.name)
    });
    !stale
        && desired
            .iter()
            .all(|d| current.iter().any(|c| c.name == d.name && c == d))
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
    /// The locks it sends requests for.
    Narrow(BTreeSet<LockKey>),
    /// Everything is sent, for this reason (the bound, or a name CEL cannot hold).
    Broad(String),
}

impl Registered {
    /// Whether requests concerning this lock reach the webhook.
    pub fn covers(&self, key: &LockKey) -> bool {
        match &self.scope {
            None => false,
            Some(RegisteredScope::Broad(_)) => true,
            Some(RegisteredScope::Narrow(keys)) => keys.contains(key),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::LockSpec;
    use crate::locks::LockRef;
    use conditions::{BroadReason, Limits};

    fn base_entries() -> Vec<ValidatingWebhook> {
        [NAMESPACED_ENTRY, CLUSTER_ENTRY, "other.example.com"]
            .into_iter()
            .map(|name| ValidatingWebhook {
                name: name.to_owned(),
                side_effects: "None".to_owned(),
                match_conditions: Some(vec![MatchCondition {
                    name: "not-events".to_owned(),
                    expression: "request.resource.resource != 'events'".to_owned(),
                }]),
                ..ValidatingWebhook::default()
            })
            .collect()
    }

    #[test]
    fn entry_names() {
        assert_eq!(entry_name(NAMESPACED_ENTRY, 0), NAMESPACED_ENTRY);
        assert_eq!(
            entry_name(NAMESPACED_ENTRY, 1),
            "namespaced-2.objectlock.dev"
        );
        assert!(is_extra_entry(
            "namespaced-2.objectlock.dev",
            NAMESPACED_ENTRY
        ));
        assert!(!is_extra_entry(NAMESPACED_ENTRY, NAMESPACED_ENTRY));
        assert!(!is_extra_entry(
            "namespaced-x.objectlock.dev",
            NAMESPACED_ENTRY
        ));
        assert!(!is_extra_entry(
            "cluster-2.objectlock.dev",
            NAMESPACED_ENTRY
        ));
    }

    #[test]
    fn narrowed_entries_keep_the_base_and_add_the_condition() {
        let now = "2026-11-22T12:00:00Z".parse().expect("time");
        let locks: Vec<_> = (0..50)
            .map(|i| LockRef::lock("ns", &format!("name-{i:02}"), LockSpec::default()))
            .collect();
        let limits = Limits {
            chunk_chars: 200,
            ..Limits::default()
        };
        let plan = conditions::plan(&locks, now, &limits);
        let desired = webhooks(&base_entries(), &plan).expect("entries");
        let names: Vec<_> = desired.iter().map(|w| w.name.as_str()).collect();
        assert!(names.len() > 3, "{names:?}");
        assert_eq!(names[0], NAMESPACED_ENTRY);
        assert_eq!(names[1], "namespaced-2.objectlock.dev");
        assert_eq!(names.last().copied(), Some(CLUSTER_ENTRY));
        for entry in &desired {
            let conditions = entry.match_conditions.as_deref().expect("conditions");
            assert_eq!(conditions.len(), 2);
            assert_eq!(conditions[0].name, "not-events");
            assert_eq!(conditions[1].name, CONDITION_NAME);
        }
        assert!(!is_current(&base_entries(), &desired));
        // Written back, it is current; applied again (idempotent) it stays current.
        let mut written = desired.clone();
        written.push(base_entries()[2].clone());
        assert!(is_current(&written, &desired));
        assert_eq!(webhooks(&written, &plan).expect("entries"), desired);
        // Fewer locks: the extra entries are stale.
        let fewer = conditions::plan(&locks[..1], now, &limits);
        let desired_fewer = webhooks(&written, &fewer).expect("entries");
        assert_eq!(desired_fewer.len(), 2);
        assert!(!is_current(&written, &desired_fewer));
    }

    #[test]
    fn manifests_cluster_starts_narrowed_and_broad_stays_broad() {
        use crate::cli::manifests::{self, FailurePolicy, Identity, Registration};
        let ca =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/examples/example-ca.crt");
        let reg = Registration::new(
            manifests::DEFAULT_URL,
            &ca,
            FailurePolicy::Fail,
            5,
            Identity::User("kol".to_owned()),
        )
        .expect("registration");
        let broad = manifests::webhook_configuration(&reg, manifests::NAME);
        let broad_entries = broad.webhooks.as_deref().expect("entries");
        let names: Vec<_> = broad_entries.iter().map(|w| w.name.as_str()).collect();
        assert_eq!(names, [NAMESPACED_ENTRY, CLUSTER_ENTRY]);
        let start = starting_point(broad_entries).expect("entries");
        for (narrow, broad) in start.iter().zip(broad_entries) {
            let conditions = narrow.match_conditions.as_deref().expect("conditions");
            let last = conditions.last().expect("a condition");
            assert_eq!(
                (last.name.as_str(), last.expression.as_str()),
                (CONDITION_NAME, "false")
            );
            assert_eq!(
                &conditions[..conditions.len() - 1],
                broad.match_conditions.as_deref().expect("c")
            );
        }
        let narrowed = manifests::cluster(&reg).expect("yaml");
        assert!(narrowed.contains("name: may-be-locked"));
        assert!(narrowed.contains("- patch"));
        assert!(narrowed.contains("validatingwebhookconfigurations"));
        let broad = manifests::cluster_broad(&reg).expect("yaml");
        assert!(!broad.contains("may-be-locked"));
        assert!(!broad.contains("validatingwebhookconfigurations"));
        let static_yaml = manifests::static_manifest(&reg).expect("yaml");
        assert!(!static_yaml.contains("may-be-locked"));
    }

    #[test]
    fn the_rbac_rule_names_one_object() {
        let rule = rbac_rule("kube-object-lock");
        assert_eq!(
            rule.resource_names.as_deref(),
            Some(&["kube-object-lock".to_owned()][..])
        );
        assert_eq!(rule.verbs, ["get", "list", "watch", "patch"]);
        assert_eq!(
            rule.resources.as_deref(),
            Some(&["validatingwebhookconfigurations".to_owned()][..])
        );
    }

    #[test]
    fn broad_sends_everything() {
        let plan = Plan {
            names: 3,
            next_expiry: None,
            scope: Scope::Broad(BroadReason::TooManyNames { names: 3, max: 2 }),
        };
        let mut current = base_entries();
        current[0]
            .match_conditions
            .as_mut()
            .expect("conditions")
            .push(MatchCondition {
                name: CONDITION_NAME.to_owned(),
                expression: "false".to_owned(),
            });
        let desired = webhooks(&current, &plan).expect("entries");
        assert_eq!(desired.len(), 2);
        for entry in &desired {
            let conditions = entry.match_conditions.as_deref().expect("c");
            assert_eq!(conditions.len(), 2);
            assert_eq!(conditions[1].expression, "true");
        }
        assert_eq!(
            webhooks(&current[2..], &plan),
            Err(MissingEntry(NAMESPACED_ENTRY.to_owned()))
        );
    }

    #[test]
    fn covers() {
        let mut registered = Registered::default();
        assert!(!registered.covers(&LockKey::lock("a", "x")));
        registered.scope = Some(RegisteredScope::Narrow([LockKey::lock("a", "x")].into()));
        assert!(registered.covers(&LockKey::lock("a", "x")));
        assert!(!registered.covers(&LockKey::cluster_lock("x")));
        registered.scope = Some(RegisteredScope::Broad("test".to_owned()));
        assert!(registered.covers(&LockKey::cluster_lock("anything")));
    }
}
