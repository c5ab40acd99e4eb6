//! The registration narrows itself to the locked names: `conditions` plans (pure), `webhooks`
//! turns the plan into entries, `operations` adds the CREATE and CONNECT entries, `writer` applies.
//! Invariant: entries installed by `manifests cluster` keep their URL, caBundle, rules and failure
//! policy; the operator's namespace selector requirements are carried into every entry written.

pub mod conditions;
pub mod operations;
pub mod writer;

use k8s_openapi::api::admissionregistration::v1::{
    MatchCondition, ValidatingWebhook, ValidatingWebhookConfiguration,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, LabelSelectorRequirement};

use conditions::{CONDITION_NAME, ConditionsPlan, Scope};
use kube::core::SelectorExt;
use std::collections::{BTreeMap, BTreeSet};

use crate::api::{self, LockKey, LockOperation};

pub const NAMESPACED_ENTRY: &str = "namespaced.objectlock.dev";
pub const CLUSTER_ENTRY: &str = "cluster.objectlock.dev";

/// The `index`-th entry of a kind: the base name, then `namespaced-2.objectlock.dev`, ...
pub fn entry_name(base: &str, index: usize) -> String {
    match (index, base.split_once('.')) {
        (0, _) | (_, None) => base.to_owned(),
        (i, Some((first, rest))) => format!("{first}-{}.{rest}", i + 1),
    }
}

/// Whether `name` is an [`entry_name`] of `base` past the first.
pub fn is_extra_entry(name: &str, base: &str) -> bool {
    let Some((first, rest)) = base.split_once('.') else {
        return false;
    };
    let number = (name.strip_suffix(rest))
        .and_then(|n| n.strip_suffix('.')?.strip_prefix(first)?.strip_prefix('-'));
    number.is_some_and(|n| n.parse::<usize>().is_ok_and(|n| n >= 2))
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "the webhook configuration has no entry {0:?}; apply the output of `kube-object-lock manifests cluster` first"
)]
pub struct MissingEntry(pub String);

/// Which format the instances write ([`Format`]); see docs/design/registration.md.
pub const FORMAT_ANNOTATION: &str = "objectlock.dev/registration-format";
pub const NAMESPACES_FORMAT: &str = "2";
/// Ends every expression written in [`NAMESPACES_FORMAT`], exactly as 0.1.0 writes and reads it.
pub const FORMAT_MARKER: &str = " // registration-format 2: namespaceSelector narrowed too";
pub const NAMESPACE_NAME_LABEL: &str = "kubernetes.io/metadata.name";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// The `may-be-locked` conditions only; the namespaced selector stays broad.
    Conditions,
    /// The conditions, and a `namespaceSelector` naming the namespaces of each entry's keys.
    Namespaces,
}

impl Format {
    pub fn of(config: &ValidatingWebhookConfiguration) -> Format {
        let annotations = config.metadata.annotations.as_ref();
        match annotations.and_then(|a| a.get(FORMAT_ANNOTATION)) {
            Some(format) if format == NAMESPACES_FORMAT => Format::Namespaces,
            _ => Format::Conditions,
        }
    }
}

#[cfg(test)]
pub fn broad_selector() -> LabelSelector {
    namespaced_selector(None, Narrowing::Broad)
}

/// How far a namespaced entry's `namespaceSelector` narrows the namespaces.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Narrowing<'a> {
    /// Every namespace but the excluded ones.
    Broad,
    /// The same, written unlike [`Narrowing::Broad`], which 0.1.0 takes for "not narrowed yet".
    Every,
    /// The namespaces of the entry's keys (none: no namespace at all).
    To(&'a [String]),
}

/// The exclusions, or a narrowing on the namespace's name; everything else is the operator's.
fn is_ours(requirement: &LabelSelectorRequirement) -> bool {
    requirement.key == NAMESPACE_NAME_LABEL
        && match requirement.operator.as_str() {
            "In" | "Exists" | "DoesNotExist" => true,
            "NotIn" => requirement
                .values
                .as_deref()
                .is_some_and(|v| v.iter().map(String::as_str).eq(api::EXCLUDED_NAMESPACES)),
            _ => false,
        }
}

/// The operator's requirements in a stored `namespaceSelector`: all but what [`is_ours`].
pub fn operator_requirements(selector: Option<&LabelSelector>) -> LabelSelector {
    let Some(selector) = selector else {
        return LabelSelector::default();
    };
    let expressions: Vec<_> = (selector.match_expressions.iter().flatten())
        .filter(|r| !is_ours(r))
        .cloned()
        .collect();
    LabelSelector {
        match_labels: selector.match_labels.clone().filter(|l| !l.is_empty()),
        match_expressions: (!expressions.is_empty()).then_some(expressions),
    }
}

/// The `namespaceSelector` of every namespaced entry: the exclusions, the operator's
/// requirements carried from `base`, and the narrowing.
pub fn namespaced_selector(
    base: Option<&LabelSelector>,
    narrowing: Narrowing<'_>,
) -> LabelSelector {
    let operator = operator_requirements(base);
    let requirement = |operator: &str, values: Option<Vec<String>>| LabelSelectorRequirement {
        key: NAMESPACE_NAME_LABEL.to_owned(),
        operator: operator.to_owned(),
        values,
    };
    let excluded = api::EXCLUDED_NAMESPACES.map(str::to_owned).to_vec();
    let mut expressions = vec![requirement("NotIn", Some(excluded))];
    expressions.extend(operator.match_expressions.into_iter().flatten());
    match narrowing {
        Narrowing::Broad => {}
        Narrowing::Every => expressions.push(requirement("Exists", None)),
        // `In` needs at least one value; every namespace has the label, so none matches.
        Narrowing::To([]) => expressions.push(requirement("DoesNotExist", None)),
        Narrowing::To(names) => expressions.push(requirement("In", Some(names.to_vec()))),
    }
    LabelSelector {
        match_labels: operator.match_labels,
        match_expressions: Some(expressions),
    }
}

/// The entries the plan asks for: copies of the base entries with their `may-be-locked`
/// condition and, namespaced, their selector replaced.
pub fn webhooks(
    current: &[ValidatingWebhook],
    plan: &ConditionsPlan,
    format: Format,
) -> Result<Vec<ValidatingWebhook>, MissingEntry> {
    let (namespaced, cluster) = (
        template(current, NAMESPACED_ENTRY)?,
        template(current, CLUSTER_ENTRY)?,
    );
    let marker = match format {
        Format::Conditions => "",
        Format::Namespaces => FORMAT_MARKER,
    };
    let exprs = |namespaced| {
        let exprs = expressions(plan, namespaced).into_iter();
        exprs.map(|e| format!("{e}{marker}")).collect()
    };
    let narrowing = |index| {
        Some(match format {
            Format::Conditions => Narrowing::Broad,
            Format::Namespaces => selected(plan, index),
        })
    };
    Ok(copies(namespaced, NAMESPACED_ENTRY, exprs(true), narrowing)
        .chain(copies(cluster, CLUSTER_ENTRY, exprs(false), |_| None))
        .collect())
}

/// The `may-be-locked` expressions; `true` rather than none when broad, as a condition another
/// field manager co-owns (`manifests cluster` applied) would survive its removal half-written.
fn expressions(plan: &ConditionsPlan, namespaced: bool) -> Vec<String> {
    match (&plan.scope, namespaced) {
        (Scope::Narrow { namespaced, .. }, true) => namespaced.clone(),
        (Scope::Narrow { cluster, .. }, false) => cluster.clone(),
        (Scope::Broad(_), _) => vec!["true".to_owned()],
    }
}

/// Copies of `template` named after `base`, one per expression; with `narrowing`, a namespaced
/// entry's selector (a cluster-scoped entry's filters Namespace objects: it is kept).
fn copies<'a>(
    template: &'a ValidatingWebhook,
    base: &'a str,
    expressions: Vec<String>,
    narrowing: impl Fn(usize) -> Option<Narrowing<'a>> + 'a,
) -> impl Iterator<Item = ValidatingWebhook> + 'a {
    expressions
        .into_iter()
        .enumerate()
        .map(move |(index, expr)| {
            let mut entry = template.clone();
            entry.name = entry_name(base, index);
            if let Some(narrowing) = narrowing(index) {
                let selector = template.namespace_selector.as_ref();
                entry.namespace_selector = Some(namespaced_selector(selector, narrowing));
            }
            set_condition(&mut entry, expr);
            entry
        })
}

fn template<'a>(
    current: &'a [ValidatingWebhook],
    base: &str,
) -> Result<&'a ValidatingWebhook, MissingEntry> {
    (current.iter().find(|w| w.name == base)).ok_or_else(|| MissingEntry(base.to_owned()))
}

/// Replaces the entry's `may-be-locked` condition, keeping the others in their order.
fn set_condition(entry: &mut ValidatingWebhook, expression: String) {
    let conditions = entry.match_conditions.get_or_insert_default();
    conditions.retain(|c| c.name != CONDITION_NAME);
    let name = CONDITION_NAME.to_owned();
    conditions.push(MatchCondition { name, expression });
}

fn selected(plan: &ConditionsPlan, index: usize) -> Narrowing<'_> {
    match &plan.scope {
        Scope::Broad(_) => Narrowing::Every,
        Scope::Narrow { .. } => {
            Narrowing::To(plan.namespaces.get(index).map_or(&[][..], Vec::as_slice))
        }
    }
}

/// What `manifests cluster` emits: `may-be-locked` is `false` and the selector broad, until
/// the first instance narrows both (a selector of no namespace would lapse running locks).
pub fn starting_point(
    entries: &[ValidatingWebhook],
) -> Result<Vec<ValidatingWebhook>, MissingEntry> {
    let plan = conditions::plan(
        conditions::Clauses::Changes,
        std::iter::empty(),
        k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
        &conditions::NarrowingBounds::default(),
    );
    let mut entries = webhooks(entries, &plan, Format::Namespaces)?;
    // The namespaced entry comes first.
    let selector = entries[0].namespace_selector.take();
    entries[0].namespace_selector = Some(namespaced_selector(selector.as_ref(), Narrowing::Broad));
    Ok(entries)
}

/// The RBAC rule to keep the configuration `name` narrowed: that one object, nothing wider.
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

/// An extra entry of the base entries (a chunk past the first).
pub fn is_base_extra(name: &str) -> bool {
    is_extra_entry(name, NAMESPACED_ENTRY) || is_extra_entry(name, CLUSTER_ENTRY)
}

/// Every desired entry present and equal, and no other entry `ours` names left over.
pub fn is_current(
    current: &[ValidatingWebhook],
    desired: &[ValidatingWebhook],
    ours: fn(&str) -> bool,
) -> bool {
    let left = |w: &ValidatingWebhook| ours(&w.name) && !desired.iter().any(|d| d.name == w.name);
    !current.iter().any(left) && desired.iter().all(|d| current.contains(d))
}

/// What the configuration says, once written and read back; each scope `None` until confirmed.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Registered {
    /// The base entries (UPDATE and DELETE).
    pub scope: Option<RegisteredScope>,
    pub namespaces: NamespaceSelection,
    pub create: Option<RegisteredScope>,
    pub connect: Option<RegisteredScope>,
}

/// The operator's requirements on namespaces, read from the base entries.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct NamespaceSelection {
    pub locks: LabelSelector,
    /// The cluster-scoped entry's: it filters Namespace objects only.
    pub namespaces: LabelSelector,
}

impl NamespaceSelection {
    pub fn of(entries: &[ValidatingWebhook]) -> NamespaceSelection {
        let of = |base: &str| {
            let entry = entries.iter().find(|w| w.name == base);
            operator_requirements(entry.and_then(|w| w.namespace_selector.as_ref()))
        };
        NamespaceSelection {
            locks: of(NAMESPACED_ENTRY),
            namespaces: of(CLUSTER_ENTRY),
        }
    }
}

/// Whether `selector` selects a namespace labelled `labels` (an invalid one selects none).
pub fn selects(selector: &LabelSelector, labels: &BTreeMap<String, String>) -> bool {
    kube::core::Selector::try_from(selector.clone()).is_ok_and(|s| s.matches(labels))
}

/// `selector` as kubectl writes one: `lockable=true,tier notin (dev)`.
pub fn describe(selector: &LabelSelector) -> String {
    kube::core::Selector::try_from(selector.clone())
        .map_or_else(|_| format!("{selector:?}"), |s| s.to_string())
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RegisteredScope {
    Narrow(BTreeSet<LockKey>),
    /// Everything is sent, for this reason (the bound, or a name CEL cannot hold).
    Broad(String),
}

impl Registered {
    /// Whether `operation` of this lock's object reaches the webhook.
    pub fn sends(&self, operation: LockOperation, key: &LockKey) -> bool {
        let scope = match operation {
            LockOperation::Update | LockOperation::Delete => &self.scope,
            LockOperation::Create => &self.create,
            LockOperation::Connect => &self.connect,
        };
        match scope {
            Some(RegisteredScope::Broad(_)) => true,
            Some(RegisteredScope::Narrow(keys)) => keys.contains(key),
            None => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::LockSpec;
    use crate::locks::LockRef;
    use conditions::{BroadReason, NarrowingBounds};

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
        for (name, extra) in [
            ("namespaced-2.objectlock.dev", true),
            (NAMESPACED_ENTRY, false),
            ("namespaced-x.objectlock.dev", false),
            ("cluster-2.objectlock.dev", false),
            ("namespaced-1.objectlock.dev", false),
            ("namespaced-2.x.objectlock.dev", false),
            ("namespaced-2.objectlock.dev.x", false),
            ("x-namespaced-2.objectlock.dev", false),
        ] {
            assert_eq!(is_extra_entry(name, NAMESPACED_ENTRY), extra, "{name}");
        }
    }

    #[test]
    fn narrowed_entries_keep_the_base_and_add_the_condition() {
        let now = "2026-11-22T12:00:00Z".parse().expect("time");
        let locks: Vec<_> = (0..50)
            .map(|i| LockRef::lock("ns", &format!("name-{i:02}"), LockSpec::default()))
            .collect();
        let limits = NarrowingBounds {
            chunk_chars: 200,
            ..NarrowingBounds::default()
        };
        let plan = conditions::plan(conditions::Clauses::Changes, &locks, now, &limits);
        let desired = webhooks(&base_entries(), &plan, Format::Conditions).expect("entries");
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
        assert!(!is_current(&base_entries(), &desired, is_base_extra));
        // Written back, it is current; applied again (idempotent) it stays current.
        let mut written = desired.clone();
        written.push(base_entries()[2].clone());
        assert!(is_current(&written, &desired, is_base_extra));
        assert_eq!(
            webhooks(&written, &plan, Format::Conditions).expect("entries"),
            desired
        );
        // Fewer locks: the extra entries are stale.
        let fewer = conditions::plan(conditions::Clauses::Changes, &locks[..1], now, &limits);
        let desired_fewer = webhooks(&written, &fewer, Format::Conditions).expect("entries");
        assert_eq!(desired_fewer.len(), 2);
        assert!(!is_current(&written, &desired_fewer, is_base_extra));
    }

    /// The registration `manifests cluster` makes for the example CA.
    pub(super) fn example_registration() -> crate::cli::manifests::Registration {
        use crate::cli::manifests::{self, FailurePolicy, Identity, Registration};
        let ca =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/examples/example-ca.crt");
        Registration::new(
            manifests::DEFAULT_URL,
            &ca,
            FailurePolicy::Fail,
            5,
            Identity::User("kol".to_owned()),
        )
        .expect("registration")
    }

    #[test]
    fn manifests_cluster_starts_narrowed_and_broad_stays_broad() {
        use crate::cli::manifests;
        let reg = example_registration();
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
                (CONDITION_NAME, format!("false{FORMAT_MARKER}").as_str())
            );
            assert_eq!(
                &conditions[..conditions.len() - 1],
                broad.match_conditions.as_deref().expect("c")
            );
            // The selector starts broad: applied over running locks, it sends no less than
            // they need, whichever version keeps the registration.
            assert_eq!(narrow.namespace_selector, broad.namespace_selector);
        }
        assert_eq!(start[0].namespace_selector, Some(broad_selector()));
        let narrowed = manifests::cluster(&reg).expect("yaml");
        assert!(narrowed.contains("name: may-be-locked"));
        assert!(narrowed.contains(&format!("{FORMAT_ANNOTATION}: \"{NAMESPACES_FORMAT}\"")));
        assert!(narrowed.contains("- patch"));
        assert!(narrowed.contains("validatingwebhookconfigurations"));
        let broad = manifests::cluster_broad(&reg).expect("yaml");
        assert!(!broad.contains("may-be-locked"));
        assert!(!broad.contains("validatingwebhookconfigurations"));
        let static_yaml = manifests::static_manifest(&reg).expect("yaml");
        assert!(!static_yaml.contains("may-be-locked"));
    }

    #[test]
    fn broad_sends_everything() {
        let plan = ConditionsPlan {
            names: 3,
            next_expiry: None,
            scope: Scope::Broad(BroadReason::TooManyNames { names: 3, max: 2 }),
            namespaces: Vec::new(),
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
        let desired = webhooks(&current, &plan, Format::Conditions).expect("entries");
        assert_eq!(desired.len(), 2);
        for entry in &desired {
            let conditions = entry.match_conditions.as_deref().expect("c");
            assert_eq!(conditions.len(), 2);
            assert_eq!(conditions[1].expression, "true");
        }
        // Narrowing namespaces, broad still reaches every namespace but the excluded ones,
        // with a selector that says it was written in that format.
        let desired = webhooks(&current, &plan, Format::Namespaces).expect("entries");
        let selector = desired[0].namespace_selector.clone().expect("selector");
        assert_ne!(selector, broad_selector());
        assert_eq!(
            selector.match_expressions.as_deref().map(<[_]>::len),
            Some(2)
        );
        assert_eq!(selector.match_expressions.expect("e")[1].operator, "Exists");
        assert_eq!(
            webhooks(&current[2..], &plan, Format::Conditions),
            Err(MissingEntry(NAMESPACED_ENTRY.to_owned()))
        );
    }

    fn config(
        annotation: Option<&str>,
        entries: Vec<ValidatingWebhook>,
    ) -> ValidatingWebhookConfiguration {
        let mut config = ValidatingWebhookConfiguration {
            webhooks: Some(entries),
            ..Default::default()
        };
        config.metadata.annotations =
            annotation.map(|a| [(FORMAT_ANNOTATION.to_owned(), a.to_owned())].into());
        config
    }

    fn with_broad_selector(mut entries: Vec<ValidatingWebhook>) -> Vec<ValidatingWebhook> {
        for entry in &mut entries {
            entry.namespace_selector = Some(broad_selector());
        }
        entries
    }

    #[test]
    fn each_namespaced_entry_selects_the_namespaces_of_its_keys() {
        let now = "2026-11-22T12:00:00Z".parse().expect("time");
        let mut locks: Vec<_> = (0..60)
            .map(|i| {
                let ns = format!("ns-{:02}", i / 4);
                LockRef::lock(&ns, &format!("name-{i:02}"), LockSpec::default())
            })
            .collect();
        let mut selecting = LockRef::lock("everything", "all", LockSpec::default());
        selecting.spec.selector = Some(Default::default());
        locks.push(selecting);
        locks.push(LockRef::cluster_lock("node-1", LockSpec::default()));
        let limits = NarrowingBounds {
            chunk_chars: 150,
            ..NarrowingBounds::default()
        };
        let plan = conditions::plan(conditions::Clauses::Changes, &locks, now, &limits);
        let base = with_broad_selector(base_entries());
        let desired = webhooks(&base, &plan, Format::Namespaces).expect("entries");
        let namespaced: Vec<_> = desired
            .iter()
            .filter(|w| w.name == NAMESPACED_ENTRY || is_extra_entry(&w.name, NAMESPACED_ENTRY))
            .collect();
        assert!(namespaced.len() > 2, "{} entries", namespaced.len());
        let selected = |w: &ValidatingWebhook| -> Vec<String> {
            let expressions = w
                .namespace_selector
                .clone()
                .expect("selector")
                .match_expressions
                .expect("e");
            assert_eq!(
                expressions[0],
                broad_selector().match_expressions.expect("e")[0],
                "the exclusions stay"
            );
            assert_eq!(expressions[1].key, NAMESPACE_NAME_LABEL);
            assert_eq!(expressions[1].operator, "In");
            expressions[1].values.clone().expect("values")
        };
        // Every live namespaced lock: one entry names both its namespace and its key.
        for lock in locks.iter().filter(|l| l.namespace.is_some()) {
            let ns = lock.namespace.clone().expect("namespaced");
            let key = if lock.spec.selector.is_some() {
                format!("|{ns}|")
            } else {
                format!("|{ns}/{}|", lock.name)
            };
            let holders: Vec<_> = namespaced
                .iter()
                .filter(|w| {
                    let condition = &w.match_conditions.as_deref().expect("c")[1].expression;
                    condition.contains(&key)
                })
                .collect();
            assert_eq!(holders.len(), 1, "{key}");
            assert!(
                selected(holders[0]).contains(&ns),
                "{ns} not selected with {key}"
            );
        }
        // And nothing more: the namespaces named are those of the keys.
        let all: BTreeSet<String> = namespaced.iter().flat_map(|w| selected(w)).collect();
        let expected: BTreeSet<String> = locks.iter().filter_map(|l| l.namespace.clone()).collect();
        assert_eq!(all, expected);
        for w in &namespaced {
            let mut names = selected(w);
            let sorted = {
                let mut s = names.clone();
                s.sort();
                s.dedup();
                s
            };
            assert_eq!(std::mem::take(&mut names), sorted, "sorted, once each");
        }
        // The cluster entry keeps its selector; every condition carries the marker.
        let cluster = desired
            .iter()
            .find(|w| w.name == CLUSTER_ENTRY)
            .expect("cluster");
        assert_eq!(cluster.namespace_selector, base[1].namespace_selector);
        for entry in &desired {
            assert!(
                entry.match_conditions.as_deref().expect("c")[1]
                    .expression
                    .ends_with(FORMAT_MARKER)
            );
        }
        // Written back, it is current.
        assert!(is_current(
            &desired,
            &webhooks(&desired, &plan, Format::Namespaces).expect("entries"),
            is_base_extra
        ));
        // Nothing locked: the namespaced entry matches no namespace at all.
        let empty = conditions::plan(conditions::Clauses::Changes, &[], now, &limits);
        let desired = webhooks(&base, &empty, Format::Namespaces).expect("entries");
        let expressions = desired[0]
            .namespace_selector
            .clone()
            .expect("s")
            .match_expressions
            .expect("e");
        assert_eq!(expressions[1].operator, "DoesNotExist");
        assert_eq!(expressions[1].values, None);
    }

    #[test]
    fn the_format_is_read_from_the_annotation() {
        for (annotation, expected) in [
            (None, Format::Conditions),
            (Some("1"), Format::Conditions),
            (Some("3"), Format::Conditions),
            (Some(NAMESPACES_FORMAT), Format::Namespaces),
        ] {
            let config = config(annotation, base_entries());
            assert_eq!(Format::of(&config), expected, "{annotation:?}");
        }
    }

    /// The operator's requirements as `manifests cluster --namespace-selector
    /// "lockable=true,tier notin (dev)"` writes them.
    fn operator() -> LabelSelector {
        LabelSelector {
            match_labels: Some([("lockable".to_owned(), "true".to_owned())].into()),
            match_expressions: Some(vec![LabelSelectorRequirement {
                key: "tier".to_owned(),
                operator: "NotIn".to_owned(),
                values: Some(vec!["dev".to_owned()]),
            }]),
        }
    }

    /// The base entries as installed with the operator's requirements.
    fn installed_with_requirements() -> Vec<ValidatingWebhook> {
        let mut entries = base_entries();
        for entry in &mut entries[..2] {
            entry.namespace_selector =
                Some(namespaced_selector(Some(&operator()), Narrowing::Broad));
        }
        entries
    }

    /// Whether `entry`'s selector holds every requirement of the operator's.
    fn carries_requirements(entry: &ValidatingWebhook) -> bool {
        let selector = entry.namespace_selector.as_ref().expect("selector");
        let operator = operator();
        selector.match_labels == operator.match_labels
            && (operator.match_expressions.iter().flatten())
                .all(|r| selector.match_expressions.iter().flatten().any(|s| s == r))
            && operator_requirements(Some(selector)) == operator
    }

    #[test]
    fn the_operators_requirements_reach_every_entry_in_both_formats() {
        let now = "2026-11-22T12:00:00Z".parse().expect("time");
        let locks: Vec<_> = (0..40)
            .map(|i| {
                LockRef::lock(
                    &format!("ns-{:02}", i / 4),
                    &format!("name-{i:02}"),
                    LockSpec::default(),
                )
            })
            .chain([LockRef::cluster_lock("node-1", LockSpec::default())])
            .collect();
        let limits = NarrowingBounds {
            chunk_chars: 150,
            ..NarrowingBounds::default()
        };
        let plan = conditions::plan(conditions::Clauses::Changes, &locks, now, &limits);
        let installed = installed_with_requirements();
        let is_namespaced = |w: &&ValidatingWebhook| {
            w.name == NAMESPACED_ENTRY || is_extra_entry(&w.name, NAMESPACED_ENTRY)
        };
        for format in [Format::Conditions, Format::Namespaces] {
            let desired = webhooks(&installed, &plan, format).expect("entries");
            let namespaced: Vec<_> = desired.iter().filter(is_namespaced).collect();
            assert!(namespaced.len() > 2, "{format:?}: chunk entries");
            for entry in &desired {
                assert!(carries_requirements(entry), "{format:?} {}", entry.name);
            }
            for entry in &namespaced {
                let selector = entry.namespace_selector.clone().expect("selector");
                let expressions = selector.match_expressions.expect("expressions");
                assert_eq!(
                    expressions[0],
                    broad_selector().match_expressions.expect("e")[0],
                    "the exclusions stay"
                );
                let narrowing: Vec<_> = expressions
                    .iter()
                    .filter(|r| is_ours(r) && r.operator != "NotIn")
                    .collect();
                match format {
                    // As installed.
                    Format::Conditions => {
                        assert!(narrowing.is_empty());
                        assert_eq!(entry.namespace_selector, installed[0].namespace_selector);
                    }
                    Format::Namespaces => {
                        assert_eq!(narrowing.len(), 1, "{}", entry.name);
                        assert_eq!(narrowing[0].operator, "In");
                    }
                }
            }
            // The cluster-scoped entries keep the base entry's selector, requirements and all.
            for entry in desired.iter().filter(|w| !is_namespaced(w)) {
                assert_eq!(entry.namespace_selector, installed[1].namespace_selector);
            }
            // Written back, the requirements are read from the narrowed base entry again: the
            // same entries, and current.
            assert_eq!(webhooks(&desired, &plan, format).expect("entries"), desired);
            assert!(is_current(
                &desired,
                &webhooks(&desired, &plan, format).expect("e"),
                is_base_extra
            ));
            assert_eq!(
                NamespaceSelection::of(&desired),
                NamespaceSelection {
                    locks: operator(),
                    namespaces: operator(),
                }
            );
            // Nothing locked, or broad: still only where the operator lets locks apply.
            let empty = conditions::plan(conditions::Clauses::Changes, &[], now, &limits);
            let broad = ConditionsPlan {
                scope: Scope::Broad(BroadReason::TooManyNames { names: 3, max: 2 }),
                ..conditions::plan(conditions::Clauses::Changes, &[], now, &limits)
            };
            for plan in [&empty, &broad] {
                for entry in webhooks(&desired, plan, format).expect("entries") {
                    assert!(carries_requirements(&entry), "{format:?} {}", entry.name);
                }
            }
        }
        // Without requirements, what the entries say is what they said before.
        let plain = with_broad_selector(base_entries());
        assert_eq!(
            NamespaceSelection::of(&plain),
            NamespaceSelection::default()
        );
        let desired = webhooks(&plain, &plan, Format::Namespaces).expect("entries");
        let selector = desired[0].namespace_selector.clone().expect("selector");
        assert_eq!(selector.match_labels, None);
        assert_eq!(selector.match_expressions.map(|e| e.len()), Some(2));
    }

    #[test]
    fn the_starting_point_keeps_the_operators_requirements_with_the_broad_selector() {
        let installed = installed_with_requirements();
        let start = starting_point(&installed).expect("entries");
        assert_eq!(start[0].namespace_selector, installed[0].namespace_selector);
        assert_eq!(start[1].namespace_selector, installed[1].namespace_selector);
        assert!(start.iter().all(carries_requirements));
    }

    #[test]
    fn only_the_operators_requirements_are_the_operators() {
        let requirement =
            |key: &str, operator: &str, values: Option<&[&str]>| LabelSelectorRequirement {
                key: key.to_owned(),
                operator: operator.to_owned(),
                values: values.map(|v| v.iter().map(|s| (*s).to_owned()).collect()),
            };
        let name = NAMESPACE_NAME_LABEL;
        let ours = [
            requirement(name, "NotIn", Some(&api::EXCLUDED_NAMESPACES)),
            requirement(name, "In", Some(&["prod"])),
            requirement(name, "Exists", None),
            requirement(name, "DoesNotExist", None),
        ];
        let theirs = [
            requirement(name, "NotIn", Some(&["dev"])),
            requirement("lockable", "In", Some(&["true"])),
            requirement("legacy", "DoesNotExist", None),
        ];
        let stored = LabelSelector {
            match_labels: Some([("team".to_owned(), "db".to_owned())].into()),
            match_expressions: Some(ours.iter().chain(&theirs).cloned().collect()),
        };
        let operator = operator_requirements(Some(&stored));
        assert_eq!(operator.match_labels, stored.match_labels);
        assert_eq!(operator.match_expressions.as_deref(), Some(&theirs[..]));
        assert_eq!(operator_requirements(None), LabelSelector::default());
        // Matched as the API server matches; described as kubectl writes it.
        let lockable = |v: &str| BTreeMap::from([("lockable".to_owned(), v.to_owned())]);
        let selector = LabelSelector {
            match_labels: Some(lockable("true")),
            match_expressions: None,
        };
        assert!(selects(&selector, &lockable("true")));
        assert!(!selects(&selector, &lockable("false")));
        assert!(!selects(&selector, &BTreeMap::new()));
        assert_eq!(describe(&selector), "lockable=true");
        assert_eq!(
            describe(&operator),
            "team=db,kubernetes.io/metadata.name notin (dev),lockable in (true),!legacy"
        );
        let odd = LabelSelector {
            match_labels: None,
            match_expressions: Some(vec![requirement("a", "Near", None)]),
        };
        assert!(
            !selects(&odd, &BTreeMap::new()),
            "an unknown operator selects nothing"
        );
    }

    #[test]
    fn covers() {
        let mut registered = Registered::default();
        assert!(!registered.sends(LockOperation::Update, &LockKey::lock("a", "x")));
        registered.scope = Some(RegisteredScope::Narrow([LockKey::lock("a", "x")].into()));
        assert!(registered.sends(LockOperation::Update, &LockKey::lock("a", "x")));
        assert!(!registered.sends(LockOperation::Update, &LockKey::cluster_lock("x")));
        registered.scope = Some(RegisteredScope::Broad("test".to_owned()));
        assert!(registered.sends(LockOperation::Update, &LockKey::cluster_lock("anything")));
    }
}
