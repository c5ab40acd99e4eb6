use k8s_openapi::ByteString;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, LabelSelectorRequirement};
use serde_json::{Value, json};

use super::*;
use crate::api::LockSpec;
use crate::registration::conditions::CONDITION_NAME;
use crate::registration::conditions::tests::{eval, fixture, now, spec, with};
use crate::registration::{Narrowing, broad_selector, entry_name, is_current, namespaced_selector};

/// The base entries as `manifests cluster` makes them (and the running instances narrow them).
fn base_entries() -> Vec<ValidatingWebhook> {
    use crate::cli::manifests;
    let reg = super::super::tests::example_registration();
    let config = manifests::webhook_configuration(&reg, manifests::NAME);
    super::super::starting_point(config.webhooks.as_deref().expect("entries")).expect("entries")
}

fn asking(ns: Option<&str>, name: &str, extra: Value) -> LockRef {
    let mut body = json!({"operations": ["CREATE", "CONNECT"]});
    body.as_object_mut()
        .expect("object")
        .extend(extra.as_object().cloned().unwrap_or_default());
    match ns {
        Some(ns) => LockRef::lock(ns, name, spec(body)),
        None => LockRef::cluster_lock(name, spec(body)),
    }
}

fn only(ns: Option<&str>, name: &str, operations: &[&str]) -> LockRef {
    asking(ns, name, json!({"operations": operations}))
}

/// Whether `selector` (the `kubernetes.io/metadata.name` expressions this module writes)
/// selects the namespace `ns`.
fn selects(selector: &LabelSelector, ns: &str) -> bool {
    (selector.match_expressions.iter().flatten()).all(|e| {
        let values = e.values.as_deref().unwrap_or_default();
        assert_eq!(e.key, super::super::NAMESPACE_NAME_LABEL);
        match e.operator.as_str() {
            "In" => values.iter().any(|v| v == ns),
            "NotIn" => !values.iter().any(|v| v == ns),
            "Exists" => true,
            "DoesNotExist" => false,
            other => panic!("operator {other}"),
        }
    })
}

/// The entries that send `review`, as the API server picks them: the rules (operation,
/// resource, scope), the `namespaceSelector` (namespaced requests), then every matchCondition.
fn sent_by(entries: &[ValidatingWebhook], review: &Value) -> Vec<String> {
    let request = &review["request"];
    let field = |name: &str| request[name].as_str().unwrap_or_default();
    let resource = match request["subResource"].as_str() {
        Some(sub) => format!(
            "{}/{sub}",
            request["resource"]["resource"].as_str().unwrap_or_default()
        ),
        None => request["resource"]["resource"]
            .as_str()
            .unwrap_or_default()
            .to_owned(),
    };
    let namespace = request["namespace"].as_str();
    let listed = |list: &Option<Vec<String>>, value: &str| {
        list.iter().flatten().any(|v| v == "*" || v == value)
    };
    entries
        .iter()
        .filter(|w| {
            let rules = (w.rules.iter().flatten()).any(|r| {
                listed(&r.operations, field("operation"))
                    && listed(&r.api_groups, request["resource"]["group"].as_str().unwrap_or_default())
                    && listed(&r.api_versions, request["resource"]["version"].as_str().unwrap_or_default())
                    // `*` is every resource, no subresource.
                    && (r.resources.iter().flatten())
                        .any(|x| *x == resource || (x == "*" && !resource.contains('/')))
                    && r.scope.as_deref() == Some(if namespace.is_some() { "Namespaced" } else { "Cluster" })
            });
            let selected = namespace.is_none_or(|ns| {
                selects(w.namespace_selector.as_ref().expect("selector"), ns)
            });
            rules
                && selected
                && (w.match_conditions.iter().flatten()).all(|c| eval(&c.expression, review))
        })
        .map(|w| w.name.clone())
        .collect()
}

fn create(ns: &str, name: &str) -> Value {
    with(
        "configmap-create.json",
        &[
            ("/request/namespace", json!(ns)),
            ("/request/name", json!(name)),
        ],
    )
}

fn cluster_create(name: &str) -> Value {
    with(
        "clusterrole-update.json",
        &[
            ("/request/operation", json!("CREATE")),
            ("/request/name", json!(name)),
            ("/request/oldObject", Value::Null),
        ],
    )
}

fn connect(ns: &str, pod: &str, sub: &str) -> Value {
    let mut review = with(
        "configmap-create.json",
        &[
            ("/request/namespace", json!(ns)),
            ("/request/name", json!(pod)),
            ("/request/operation", json!("CONNECT")),
            ("/request/resource/resource", json!("pods")),
            (
                "/request/object",
                json!({"kind": "PodExecOptions", "apiVersion": "v1"}),
            ),
        ],
    );
    review["request"]["subResource"] = json!(sub);
    review
}

#[test]
fn the_names_are_no_chunk_of_a_base_entry() {
    // The base entries' chunks, as this version and the previous release (the same
    // `is_extra_entry`) tell them, never take one of these entries for their own, and back.
    for base in [CREATE_ENTRY, CLUSTER_CREATE_ENTRY, CONNECT_ENTRY] {
        for index in 0..12 {
            let name = entry_name(base, index);
            assert!(is_operation_entry(&name), "{name}");
            for theirs in [NAMESPACED_ENTRY, CLUSTER_ENTRY] {
                assert!(
                    !is_extra_entry(&name, theirs),
                    "{name} as a chunk of {theirs}"
                );
                assert_ne!(name, theirs);
                assert!(!is_operation_entry(&entry_name(theirs, index)));
            }
        }
    }
    assert_eq!(
        entry_name(CLUSTER_CREATE_ENTRY, 1),
        "cluster-create-2.objectlock.dev"
    );
    assert!(!is_extra_entry(
        "cluster-create-2.objectlock.dev",
        CREATE_ENTRY
    ));
    assert!(!is_operation_entry("other.example.com"));
}

#[test]
fn entries_per_operation() {
    struct Row {
        what: &'static str,
        locks: Vec<LockRef>,
        /// The entries, and for the namespaced ones the namespaces they select.
        entries: &'static [(&'static str, &'static [&'static str])],
        /// Requests and the entries that send them.
        sent: Vec<(Value, &'static [&'static str])>,
    }
    let rows = [
        Row {
            what: "no lock asks",
            locks: vec![
                LockRef::lock("prod", "web", LockSpec::default()),
                LockRef::cluster_lock("admin", LockSpec::default()),
                only(Some("prod"), "cache", &["DELETE"]),
            ],
            entries: &[],
            sent: vec![(create("prod", "web"), &[]), (cluster_create("admin"), &[])],
        },
        Row {
            what: "a Lock asking CREATE",
            locks: vec![
                only(Some("prod"), "web", &["CREATE", "UPDATE"]),
                LockRef::lock("prod", "cache", LockSpec::default()),
                LockRef::lock("dev", "web", LockSpec::default()),
            ],
            entries: &[(CREATE_ENTRY, &["prod"])],
            sent: vec![
                (create("prod", "web"), &[CREATE_ENTRY]),
                (create("prod", "cache"), &[]),
                (create("dev", "web"), &[]),
                (create("prod", "web2"), &[]),
                (connect("prod", "web", "exec"), &[]),
                (cluster_create("web"), &[]),
            ],
        },
        Row {
            what: "a Lock asking CONNECT",
            locks: vec![only(Some("prod"), "db-0", &["CONNECT"])],
            entries: &[(CONNECT_ENTRY, &["prod"])],
            sent: vec![
                (connect("prod", "db-0", "exec"), &[CONNECT_ENTRY]),
                (connect("prod", "db-0", "attach"), &[CONNECT_ENTRY]),
                (connect("prod", "db-0", "portforward"), &[CONNECT_ENTRY]),
                (connect("prod", "db-0", "proxy"), &[CONNECT_ENTRY]),
                // A proxy name carries a scheme and a port, as the API server reads it.
                (connect("prod", "db-0:8080", "proxy"), &[CONNECT_ENTRY]),
                (connect("prod", "http:db-0:8080", "proxy"), &[CONNECT_ENTRY]),
                (connect("prod", "https:db-0:", "proxy"), &[CONNECT_ENTRY]),
                (connect("prod", "db-1:8080", "proxy"), &[]),
                (connect("prod", "db-0:8080", "exec"), &[]),
                (connect("prod", "db-0", "log"), &[]),
                (connect("prod", "db-1", "exec"), &[]),
                (connect("dev", "db-0", "exec"), &[]),
                (create("prod", "db-0"), &[]),
            ],
        },
        Row {
            what: "a ClusterLock asking CREATE, Locks in its namespace of the same name",
            locks: vec![
                only(None, "tenant-a", &["CREATE"]),
                only(Some("tenant-a"), "quota", &["CONNECT"]),
            ],
            entries: &[(CONNECT_ENTRY, &["tenant-a"]), (CLUSTER_CREATE_ENTRY, &[])],
            sent: vec![
                (cluster_create("tenant-a"), &[CLUSTER_CREATE_ENTRY]),
                (cluster_create("tenant-b"), &[]),
                (create("tenant-a", "tenant-a"), &[]),
                (connect("tenant-a", "quota", "exec"), &[CONNECT_ENTRY]),
            ],
        },
        Row {
            what: "a selector Lock asking CREATE: its whole namespace",
            locks: vec![
                asking(
                    Some("batch"),
                    "jobs",
                    json!({"selector": {"matchLabels": {"app": "x"}}}),
                ),
                asking(Some("prod"), "web", json!({})),
            ],
            entries: &[
                (CREATE_ENTRY, &["batch", "prod"]),
                (CONNECT_ENTRY, &["batch", "prod"]),
            ],
            sent: vec![
                (create("batch", "anything"), &[CREATE_ENTRY]),
                (connect("batch", "any-pod", "exec"), &[CONNECT_ENTRY]),
                (create("prod", "web"), &[CREATE_ENTRY]),
                (create("prod", "other"), &[]),
            ],
        },
        Row {
            what: "a ClusterLock with a selector asking CREATE: every cluster-scoped CREATE",
            locks: vec![
                asking(
                    None,
                    "tiers",
                    json!({"selector": {"matchLabels": {"tier": "prod"}}}),
                ),
                only(Some("prod"), "web", &["CREATE"]),
            ],
            entries: &[(CREATE_ENTRY, &["prod"]), (CLUSTER_CREATE_ENTRY, &[])],
            sent: vec![
                (cluster_create("anything"), &[CLUSTER_CREATE_ENTRY]),
                (create("prod", "web"), &[CREATE_ENTRY]),
                (create("prod", "other"), &[]),
            ],
        },
        Row {
            what: "expired, or CONNECT of a ClusterLock: nothing to send",
            locks: vec![
                asking(
                    Some("prod"),
                    "web",
                    json!({"expiresAt": "2026-11-22T11:00:00Z"}),
                ),
                only(None, "node-1", &["CONNECT"]),
            ],
            entries: &[],
            sent: vec![
                (create("prod", "web"), &[]),
                (connect("prod", "web", "exec"), &[]),
            ],
        },
        Row {
            what: "Warn mode is sent (to warn)",
            locks: vec![asking(Some("prod"), "web", json!({"mode": "Warn"}))],
            entries: &[(CREATE_ENTRY, &["prod"]), (CONNECT_ENTRY, &["prod"])],
            sent: vec![(create("prod", "web"), &[CREATE_ENTRY])],
        },
    ];
    let base = base_entries();
    for row in rows {
        let what = row.what;
        let plan = plan(&row.locks, now(), &NarrowingBounds::default());
        let entries = webhooks(&base, &plan).expect("entries");
        let names: Vec<&str> = entries.iter().map(|w| w.name.as_str()).collect();
        let expected: Vec<&str> = row.entries.iter().map(|(name, _)| *name).collect();
        assert_eq!(names, expected, "{what}");
        for (entry, (_, namespaces)) in entries.iter().zip(row.entries) {
            let scope = if entry.name == CLUSTER_CREATE_ENTRY {
                "Cluster"
            } else {
                "Namespaced"
            };
            let rule = entry.rules.as_deref().expect("rules");
            assert_eq!(rule.len(), 1, "{what}");
            assert_eq!(rule[0].scope.as_deref(), Some(scope), "{what}");
            let template = &base[usize::from(scope == "Cluster")];
            let namespaces: Vec<String> = namespaces.iter().map(|n| (*n).to_owned()).collect();
            let selector = match scope {
                "Cluster" => template.namespace_selector.clone(),
                _ => Some(namespaced_selector(
                    template.namespace_selector.as_ref(),
                    Narrowing::To(&namespaces),
                )),
            };
            assert_eq!(entry.namespace_selector, selector, "{what}: {}", entry.name);
            // Everything else is the base entry's, the exclusions first.
            let conditions = entry.match_conditions.as_deref().expect("conditions");
            let template_conditions = template.match_conditions.as_deref().expect("conditions");
            assert_eq!(conditions.len(), template_conditions.len(), "{what}");
            assert_eq!(
                conditions[..conditions.len() - 1],
                template_conditions[..template_conditions.len() - 1],
                "{what}"
            );
            assert_eq!(
                conditions.last().map(|c| c.name.as_str()),
                Some(CONDITION_NAME)
            );
            let mut copy = entry.clone();
            (copy.name, copy.rules) = (template.name.clone(), template.rules.clone());
            (copy.namespace_selector, copy.match_conditions) = (
                template.namespace_selector.clone(),
                template.match_conditions.clone(),
            );
            assert_eq!(
                &copy, template,
                "{what}: {} copies its base entry",
                entry.name
            );
        }
        for (review, expected) in &row.sent {
            let request = &review["request"];
            let label = format!(
                "{what}: {} {}/{} {}",
                request["operation"], request["namespace"], request["name"], request["subResource"]
            );
            assert_eq!(sent_by(&entries, review), *expected, "{label}");
        }
        // Written, it is current: nothing more is written.
        let mut stored = base.clone();
        stored.extend(entries.iter().cloned());
        assert!(is_current(&stored, &entries, is_operation_entry), "{what}");
    }
}

#[test]
fn the_rules_send_create_and_connect_only() {
    let locks = [
        asking(Some("prod"), "web", json!({})),
        asking(None, "admin", json!({})),
    ];
    let entries = webhooks(
        &base_entries(),
        &plan(&locks, now(), &NarrowingBounds::default()),
    )
    .expect("e");
    let rules: Vec<&RuleWithOperations> = entries
        .iter()
        .flat_map(|w| w.rules.iter().flatten())
        .collect();
    let rule = |operation: &str, group: &str, version: &str, resources: &[&str], scope: &str| {
        let one = |s: &str| Some(vec![s.to_owned()]);
        RuleWithOperations {
            operations: one(operation),
            api_groups: one(group),
            api_versions: one(version),
            resources: Some(resources.iter().map(|r| (*r).to_owned()).collect()),
            scope: Some(scope.to_owned()),
        }
    };
    assert_eq!(
        rules,
        [
            &rule("CREATE", "*", "*", &["*"], "Namespaced"),
            &rule("CONNECT", "", "v1", &CONNECT_SUBRESOURCES, "Namespaced"),
            &rule("CREATE", "*", "*", &["*"], "Cluster"),
        ]
    );
    // The eviction is the base entry's: `*` names no subresource, so it is not sent twice.
    let eviction = fixture("pod-eviction-create.json");
    assert_eq!(eviction["request"]["operation"], "CREATE");
    assert!(sent_by(&entries, &eviction).is_empty());
    // Nor a Lock, an Event or a Lease: the base entry's exclusions hold for CREATE too.
    for (group, resource) in [
        (crate::api::GROUP, "locks"),
        ("events.k8s.io", "events"),
        ("coordination.k8s.io", "leases"),
    ] {
        let review = with(
            "configmap-create.json",
            &[
                ("/request/namespace", json!("prod")),
                ("/request/name", json!("web")),
                ("/request/resource/group", json!(group)),
                ("/request/resource/resource", json!(resource)),
            ],
        );
        assert!(sent_by(&entries, &review).is_empty(), "{resource}");
    }
}

#[test]
fn chunks_and_bounds() {
    let locks: Vec<_> = (0..40)
        .map(|i| {
            only(
                Some(&format!("ns-{:02}", i / 4)),
                &format!("name-{i:02}"),
                &["CREATE"],
            )
        })
        .collect();
    let limits = NarrowingBounds {
        chunk_chars: 120,
        ..NarrowingBounds::default()
    };
    let base = base_entries();
    let entries = webhooks(&base, &plan(&locks, now(), &limits)).expect("entries");
    assert!(entries.len() > 2, "{} entries", entries.len());
    for (index, entry) in entries.iter().enumerate() {
        assert_eq!(entry.name, entry_name(CREATE_ENTRY, index));
    }
    // Every lock's CREATE is sent by exactly one entry, whose selector names its namespace.
    for lock in &locks {
        let review = create(lock.namespace.as_deref().expect("ns"), &lock.name);
        assert_eq!(sent_by(&entries, &review).len(), 1, "{lock}");
    }
    // Fewer locks: the extra chunks are stale until removed.
    let fewer = webhooks(&base, &plan(&locks[..1], now(), &limits)).expect("entries");
    assert_eq!(fewer.len(), 1);
    assert!(!is_current(&entries, &fewer, is_operation_entry));
    assert!(is_current(&fewer, &fewer, is_operation_entry));
    // Beyond the bounds: every CREATE, in every namespace but the excluded ones.
    let small = NarrowingBounds {
        max_names: 3,
        ..NarrowingBounds::default()
    };
    let broad = webhooks(&base, &plan(&locks, now(), &small)).expect("entries");
    assert_eq!(broad.len(), 1);
    assert_eq!(
        broad[0].namespace_selector,
        Some(namespaced_selector(None, Narrowing::Every))
    );
    assert_eq!(
        sent_by(&broad, &create("anywhere", "anything")),
        [CREATE_ENTRY]
    );
    assert!(sent_by(&broad, &create("kube-system", "anything")).is_empty());
    assert_ne!(broad[0].namespace_selector, Some(broad_selector()));
}

#[test]
fn written_only_when_the_stored_entries_differ() {
    let base = base_entries();
    let locks = [asking(Some("prod"), "web", json!({}))];
    let desired =
        webhooks(&base, &plan(&locks, now(), &NarrowingBounds::default())).expect("entries");
    // Nothing asks, nothing stored: current, no write.
    assert!(is_current(&base, &[], is_operation_entry));
    let none = webhooks(&base, &plan(&[], now(), &NarrowingBounds::default())).expect("entries");
    assert!(none.is_empty());
    // Asked for: missing until written; stored, current; left over once nothing asks.
    assert!(!is_current(&base, &desired, is_operation_entry));
    let mut stored = base.clone();
    stored.extend(desired.iter().cloned());
    assert!(is_current(&stored, &desired, is_operation_entry));
    assert!(!is_current(&stored, &none, is_operation_entry));
    // A caBundle patched into the base entries reaches them at the next write.
    let mut rotated = stored.clone();
    for entry in rotated.iter_mut().filter(|w| !is_operation_entry(&w.name)) {
        entry.client_config.ca_bundle = Some(ByteString(b"new CA".to_vec()));
    }
    let again =
        webhooks(&rotated, &plan(&locks, now(), &NarrowingBounds::default())).expect("entries");
    assert!(!is_current(&rotated, &again, is_operation_entry));
    assert!(
        again
            .iter()
            .all(|w| w.client_config.ca_bundle == Some(ByteString(b"new CA".to_vec())))
    );
    // The base entries are needed only for what is asked.
    let cluster_only = [only(None, "admin", &["CREATE"])];
    let entries = webhooks(
        &base[1..],
        &plan(&cluster_only, now(), &NarrowingBounds::default()),
    );
    assert_eq!(entries.map(|e| e.len()), Ok(1));
    assert_eq!(
        webhooks(
            &base[1..],
            &plan(&locks, now(), &NarrowingBounds::default())
        ),
        Err(MissingEntry(NAMESPACED_ENTRY.to_owned()))
    );
    assert_eq!(
        webhooks(&[], &plan(&[], now(), &NarrowingBounds::default())),
        Ok(vec![])
    );
}

#[test]
fn registered_names_the_locks_asking() {
    let locks = [
        asking(Some("prod"), "web", json!({})),
        only(Some("prod"), "db", &["CONNECT"]),
        only(None, "admin", &["CREATE", "CONNECT"]),
        LockRef::lock("prod", "plain", LockSpec::default()),
    ];
    let plan = plan(&locks, now(), &NarrowingBounds::default());
    assert_eq!(
        plan.create.registered(),
        RegisteredScope::Narrow(
            [LockKey::lock("prod", "web"), LockKey::cluster_lock("admin")].into()
        )
    );
    assert_eq!(
        plan.connect.registered(),
        RegisteredScope::Narrow([LockKey::lock("prod", "db"), LockKey::lock("prod", "web")].into())
    );
    let small = NarrowingBounds {
        max_names: 1,
        ..NarrowingBounds::default()
    };
    let broad = super::plan(&locks, now(), &small);
    assert!(matches!(
        broad.create.registered(),
        RegisteredScope::Broad(_)
    ));
}

/// Namespaces that opt in (`manifests cluster --namespace-selector`): the operator's
/// requirements in the base entries' selectors reach the CREATE and CONNECT entries too.
#[test]
fn the_operators_namespace_requirements_reach_every_entry() {
    let lockable = LabelSelectorRequirement {
        key: "lockable".to_owned(),
        operator: "In".to_owned(),
        values: Some(vec!["true".to_owned()]),
    };
    let mut base = base_entries();
    for entry in &mut base {
        let selector = entry
            .namespace_selector
            .get_or_insert_with(Default::default);
        selector
            .match_expressions
            .get_or_insert_with(Vec::new)
            .push(lockable.clone());
    }
    let locks = [
        only(Some("prod"), "web", &["CREATE", "CONNECT"]),
        only(None, "team-a", &["CREATE"]),
    ];
    let entries =
        webhooks(&base, &plan(&locks, now(), &NarrowingBounds::default())).expect("entries");
    assert_eq!(entries.len(), 3);
    for entry in &entries {
        let expressions = (entry.namespace_selector.as_ref())
            .and_then(|s| s.match_expressions.as_ref())
            .expect("expressions");
        assert!(expressions.contains(&lockable), "{}", entry.name);
    }
}
