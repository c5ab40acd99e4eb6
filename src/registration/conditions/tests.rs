use super::*;
use crate::api::LockSpec;

pub(in crate::registration) fn now() -> Timestamp {
    "2026-11-22T12:00:00Z".parse().expect("time")
}

pub(in crate::registration) fn spec(json: serde_json::Value) -> LockSpec {
    serde_json::from_value(json).expect("spec")
}

pub(in crate::registration) fn fixture(name: &str) -> serde_json::Value {
    let path = format!("{}/tests/fixtures/{name}", env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(&path).expect("fixture");
    serde_json::from_str(&text).expect("json")
}

/// Evaluates `expression` as the API server does for a matchCondition: `request` without the
/// objects, `object` and `oldObject` (null when absent).
pub(in crate::registration) fn eval(expression: &str, review: &serde_json::Value) -> bool {
    let mut request = review["request"].clone();
    let map = request.as_object_mut().expect("request object");
    let object = map.remove("object").unwrap_or(serde_json::Value::Null);
    let old_object = map.remove("oldObject").unwrap_or(serde_json::Value::Null);
    // The API server's CEL has the strings extension (`split`).
    let mut env = cel::Env::stdlib();
    env.add_extension(cel::extensions::strings)
        .expect("strings extension");
    let env = std::sync::Arc::new(env);
    let program = (env.compile(expression))
        .unwrap_or_else(|e| panic!("{expression} does not compile: {e:?}"));
    let mut context = cel::Context::with_env(env);
    for (name, value) in [
        ("request", request),
        ("object", object),
        ("oldObject", old_object),
    ] {
        context
            .add_variable(name, cel::to_value(value).expect("value"))
            .expect("variable");
    }
    match program.execute(&context) {
        Ok(cel::Value::Bool(b)) => b,
        other => panic!("{expression} gave {other:?}"),
    }
}

/// Whether some entry of the plan sends `review`, and how many do.
fn sends(plan: &ConditionsPlan, review: &serde_json::Value) -> usize {
    let Scope::Narrow {
        namespaced,
        cluster,
    } = &plan.scope
    else {
        panic!("broad: {plan:?}");
    };
    let entries = if review["request"]["namespace"].is_string()
        && review["request"]["resource"]["resource"] != "namespaces"
    {
        namespaced
    } else {
        cluster
    };
    entries.iter().filter(|e| eval(e, review)).count()
}

pub(in crate::registration) fn with(
    review: &str,
    edits: &[(&str, serde_json::Value)],
) -> serde_json::Value {
    let mut value = fixture(review);
    for (pointer, new) in edits {
        let (parent, key) = pointer.rsplit_once('/').expect("pointer");
        value.pointer_mut(parent).expect("pointer")[key] = new.clone();
    }
    value
}

fn sample_locks() -> Vec<LockRef> {
    vec![
        LockRef::lock("demo-015226", "locked-a", LockSpec::default()),
        LockRef::lock("demo-015226", "locked-sweep2", LockSpec::default()),
        LockRef::lock("lock-demo", "evict-me", LockSpec::default()),
        LockRef::lock("lock-doomed", "doomed-cm", LockSpec::default()),
        LockRef::lock(
            "selected",
            "by-label",
            spec(serde_json::json!({"selector": {"matchLabels": {"app": "web"}}})),
        ),
        LockRef::cluster_lock("lock-demo-reader", LockSpec::default()),
        LockRef::lock(
            "demo-015226",
            "free-a",
            spec(serde_json::json!({"expiresAt": "2026-11-22T11:00:00Z"})),
        ),
        LockRef::lock(
            "demo-015226",
            "later",
            spec(serde_json::json!({"expiresAt": "2026-11-22T13:00:00Z"})),
        ),
    ]
}

#[test]
fn the_plan_sends_the_requests_that_may_concern_a_live_lock_once() {
    let sample = plan(
        Clauses::Changes,
        &sample_locks(),
        now(),
        &NarrowingBounds::default(),
    );
    assert_eq!(sample.names, 7, "the expired lock is not counted");
    assert_eq!(
        sample.next_expiry,
        Some("2026-11-22T13:00:00Z".parse().expect("time"))
    );
    let expired_selector = [LockRef::lock(
        "selected",
        "by-label",
        spec(
            serde_json::json!({"selector": {"matchLabels": {"app": "web"}}, "expiresAt": "2026-11-22T11:00:00Z"}),
        ),
    )];
    let expired = plan(
        Clauses::Changes,
        &expired_selector,
        now(),
        &NarrowingBounds::default(),
    );
    let nothing = plan(Clauses::Changes, &[], now(), &NarrowingBounds::default());
    let mut with_cluster_lock = sample_locks();
    with_cluster_lock.push(LockRef::cluster_lock("lock-doomed", LockSpec::default()));
    let both = plan(
        Clauses::Changes,
        &with_cluster_lock,
        now(),
        &NarrowingBounds::default(),
    );
    let s = &sample;
    // (plan, fixture, edits `ns=… name=… old=…`, entries sending it)
    let rows: &[(&ConditionsPlan, &str, &str, usize)] = &[
        (s, "configmap-delete-locked", "", 1),
        (s, "configmap-update-put", "", 1),
        (s, "configmap-update-merge-patch", "", 1),
        (s, "configmap-delete-dryrun", "", 1),
        (s, "configmap-delete-unlocked", "", 0),
        // The same name in another namespace; a name that only contains a locked name.
        (s, "configmap-delete-locked", "ns=other", 0),
        (s, "configmap-delete-locked", "name=locked-a2", 0),
        // DELETECOLLECTION items by the old object's name (an empty name is an absent one).
        (s, "configmap-deletecollection-item", "", 1),
        (s, "namespace-deletion-item-delete", "", 1),
        (s, "configmap-deletecollection-item", "old=x", 0),
        (
            s,
            "configmap-deletecollection-item",
            "name= old=locked-sweep2",
            1,
        ),
        (s, "pod-eviction-create", "", 1),
        (s, "pod-eviction-create", "name=another-pod", 0),
        // A selector's namespace is sent whole (evictions and scales too), until it expires.
        (s, "secret-delete", "ns=selected name=by-label", 1),
        (s, "secret-delete", "ns=selected name=anything", 1),
        (s, "secret-delete", "ns=selected name=web", 1),
        (s, "pod-eviction-create", "ns=selected name=anything", 1),
        (s, "deployment-scale-update", "ns=selected name=anything", 1),
        (&expired, "secret-delete", "ns=selected", 0),
        // A namespace holding a Lock: its deletion is sent, its update (no ClusterLock) is not.
        (s, "namespace-delete", "", 1),
        (s, "namespace-update", "ns=lock-doomed name=lock-doomed", 0),
        (s, "namespace-delete", "ns=empty name=empty", 0),
        // ClusterLocks: UPDATE and DELETE of the named cluster-scoped object.
        (s, "clusterrole-delete", "", 1),
        (s, "clusterrole-update", "", 1),
        (s, "clusterrole-update", "name=edit", 0),
        // A Namespace with a ClusterLock and Locks inside is sent once, not twice.
        (&both, "namespace-delete", "", 1),
        (&nothing, "configmap-delete-locked", "", 0),
    ];
    for (plan, review, edits, expected) in rows {
        let edits: Vec<_> = (edits.split_whitespace())
            .map(|edit| match edit.split_once('=').expect("key=value") {
                ("ns", v) => ("/request/namespace", serde_json::json!(v)),
                ("name", v) => ("/request/name", serde_json::json!(v)),
                (_, v) => ("/request/oldObject/metadata/name", serde_json::json!(v)),
            })
            .collect();
        let review = with(&format!("{review}.json"), &edits);
        assert_eq!(sends(plan, &review), *expected, "{review} {edits:?}");
    }
    assert_eq!(
        nothing.scope,
        Scope::Narrow {
            namespaced: vec!["false".to_owned()],
            cluster: vec!["false".to_owned()],
        }
    );
    assert_eq!(nothing.next_expiry, None);
}

#[test]
fn deterministic_whatever_the_order() {
    let locks = sample_locks();
    let mut reversed = locks.clone();
    reversed.reverse();
    assert_eq!(
        plan(Clauses::Changes, &locks, now(), &NarrowingBounds::default()),
        plan(
            Clauses::Changes,
            &reversed,
            now(),
            &NarrowingBounds::default()
        )
    );
}

#[test]
fn beyond_max_names_a_namespace_is_sent_whole() {
    let limits = NarrowingBounds {
        max_names: 3,
        ..NarrowingBounds::default()
    };
    let locks: Vec<_> = (0..4)
        .map(|i| LockRef::lock("ns", &format!("n{i}"), LockSpec::default()))
        .collect();
    assert!(matches!(
        plan(Clauses::Changes, &locks[..3], now(), &limits).scope,
        Scope::Narrow { .. }
    ));
    let whole = plan(Clauses::Changes, &locks, now(), &limits);
    assert_eq!(whole.names, 4);
    assert_eq!(
        sends(
            &whole,
            &with(
                "configmap-delete-locked.json",
                &[("/request/namespace", serde_json::json!("ns"))]
            )
        ),
        1
    );
    let too_large = NarrowingBounds {
        max_total_chars: 20,
        ..NarrowingBounds::default()
    };
    assert!(matches!(
        plan(Clauses::Changes, &locks, now(), &too_large).scope,
        Scope::Broad(BroadReason::TooLarge { .. })
    ));
    let odd = [LockRef::lock("ns", "a'b", LockSpec::default())];
    assert!(matches!(
        plan(Clauses::Changes, &odd, now(), &NarrowingBounds::default()).scope,
        Scope::Broad(BroadReason::UnsafeName(_))
    ));
}

/// The API server's limit on one expression.
const MAX_CODE_POINTS: usize = 100_000;

#[test]
fn at_the_bound_every_expression_fits_and_each_name_hits_one_entry() {
    let limits = NarrowingBounds::default();
    // Long names: 63-character namespaces and 200-character names, the bound's worth.
    let ns = |i: usize| format!("{:a<63}", format!("ns{}-", i % 40));
    let name = |i: usize| format!("{:b<200}", format!("n{i}-"));
    let locks: Vec<_> = (0..limits.max_names)
        .map(|i| LockRef::lock(&ns(i), &name(i), LockSpec::default()))
        .collect();
    let plan = plan(Clauses::Changes, &locks, now(), &limits);
    let Scope::Narrow {
        namespaced,
        cluster,
    } = &plan.scope
    else {
        panic!("{:?}", plan.scope);
    };
    assert!(namespaced.len() > 1, "split into several entries");
    for e in namespaced.iter().chain(cluster) {
        assert!(e.chars().count() < MAX_CODE_POINTS / 2, "{}", e.len());
    }
    for i in [0, 1, 999, limits.max_names - 1] {
        let review = with(
            "configmap-delete-locked.json",
            &[
                ("/request/namespace", serde_json::json!(ns(i))),
                ("/request/name", serde_json::json!(name(i))),
            ],
        );
        assert_eq!(sends(&plan, &review), 1, "lock {i}");
    }
    let review = with(
        "configmap-delete-locked.json",
        &[("/request/namespace", serde_json::json!(ns(3)))],
    );
    assert_eq!(sends(&plan, &review), 0);
    // One more lock: the namespace with the most Locks is sent whole, the others stay named.
    let mut more = locks;
    more.push(LockRef::lock("x", "y", LockSpec::default()));
    let more = super::plan(Clauses::Changes, &more, now(), &limits);
    assert!(
        matches!(more.scope, Scope::Narrow { .. }),
        "{:?}",
        more.scope
    );
    let in_ns = |i: usize, name: &str| {
        with(
            "configmap-delete-locked.json",
            &[
                ("/request/namespace", serde_json::json!(ns(i))),
                ("/request/name", serde_json::json!(name)),
            ],
        )
    };
    let sent_whole = (0..40)
        .filter(|&i| sends(&more, &in_ns(i, "unlocked")) == 1)
        .count();
    assert_eq!(sent_whole, 1);
}

#[test]
fn each_namespaced_chunk_knows_its_namespaces() {
    // 2,000 Locks over 200 namespaces, cut into several chunks: a namespace whose keys straddle
    // two chunks is named by both, every other by one.
    let limits = NarrowingBounds {
        chunk_chars: 3_000,
        ..NarrowingBounds::default()
    };
    let locks: Vec<_> = (0..2_000)
        .map(|i| {
            LockRef::lock(
                &format!("team-{:03}", i % 200),
                &format!("name-{i:04}"),
                LockSpec::default(),
            )
        })
        .collect();
    let plan = plan(Clauses::Changes, &locks, now(), &limits);
    let Scope::Narrow { namespaced, .. } = &plan.scope else {
        panic!("{:?}", plan.scope);
    };
    assert!(namespaced.len() > 5, "{} chunks", namespaced.len());
    assert_eq!(plan.namespaces.len(), namespaced.len());
    for (expr, namespaces) in namespaced.iter().zip(&plan.namespaces) {
        assert!(!namespaces.is_empty());
        for ns in namespaces {
            assert!(expr.contains(&format!("|{ns}/")), "{ns} has no key here");
        }
    }
    let named: usize = plan.namespaces.iter().map(Vec::len).sum();
    assert!((200..200 + namespaced.len()).contains(&named), "{named}");
    // The selectors count against the bound: exactly enough for the keys is not enough.
    let keys_only = NarrowingBounds {
        max_total_chars: locks
            .iter()
            .map(|l| l.namespace.as_deref().unwrap_or("").len() + l.name.len() + 2)
            .sum::<usize>()
            + 200 * ("team-000".len() + 1),
        ..limits
    };
    assert!(matches!(
        super::plan(Clauses::Changes, &locks, now(), &keys_only).scope,
        Scope::Broad(BroadReason::TooLarge { .. })
    ));
    // Nothing namespaced: one chunk, no namespace.
    let cluster_only = [LockRef::cluster_lock("node-1", LockSpec::default())];
    assert_eq!(
        super::plan(Clauses::Changes, &cluster_only, now(), &limits).namespaces,
        [Vec::<String>::new()]
    );
    // A selector Lock's namespace is named too.
    let mut selecting = LockRef::lock("everything", "all", LockSpec::default());
    selecting.spec.selector = Some(Default::default());
    assert_eq!(
        super::plan(Clauses::Changes, &[selecting], now(), &limits).namespaces,
        [vec!["everything".to_owned()]]
    );
}

/// The sample locks and, last, a ClusterLock with a selector.
fn with_a_cluster_selector() -> Vec<LockRef> {
    let mut locks = sample_locks();
    locks.push(LockRef::cluster_lock(
        "tiers",
        spec(serde_json::json!({"selector": {"matchLabels": {"tier": "prod"}}})),
    ));
    locks
}

/// A review of `resource` (cluster-scoped) named `name`, with `operation`.
fn cluster_review(group: &str, resource: &str, name: &str, operation: &str) -> serde_json::Value {
    with(
        "configmap-delete-locked.json",
        &[
            (
                "/request/resource",
                serde_json::json!({"group": group, "version": "v1", "resource": resource}),
            ),
            ("/request/namespace", serde_json::Value::Null),
            ("/request/name", serde_json::json!(name)),
            ("/request/operation", serde_json::json!(operation)),
        ],
    )
}

#[test]
fn a_cluster_lock_with_a_selector_sends_the_cluster_scoped_resources_it_covers() {
    let namespace = |name| cluster_review("", "namespaces", name, "UPDATE");
    let role = |name| cluster_review("rbac.authorization.k8s.io", "clusterroles", name, "UPDATE");
    // Every cluster-scoped resource, nothing namespaced beyond the named keys.
    let plan = plan(
        Clauses::Changes,
        &with_a_cluster_selector(),
        now(),
        &NarrowingBounds::default(),
    );
    let Scope::Narrow { cluster, .. } = &plan.scope else {
        panic!("a ClusterLock's selector widens the cluster-scoped entries only: {plan:?}");
    };
    assert_eq!(cluster.first().map(String::as_str), Some("true"));
    assert_eq!(sends(&plan, &fixture("configmap-delete-unlocked.json")), 0);
    // Namespaces only: namespaces, whatever their name, and no ClusterRole.
    let namespaces = [LockRef::cluster_lock(
        "tiers",
        spec(
            serde_json::json!({"selector": {"matchLabels": {"tier": "prod"}},
            "resources": [{"apiGroups": [""], "resources": ["namespaces"]}]}),
        ),
    )];
    let plan = super::plan(
        Clauses::Changes,
        &namespaces,
        now(),
        &NarrowingBounds::default(),
    );
    assert_eq!(sends(&plan, &namespace("any-name")), 1);
    assert_eq!(sends(&plan, &role("any-name")), 0);
    assert_eq!(
        sends(&plan, &role("tiers")),
        1,
        "the ClusterLock's own name"
    );
    let creates = super::plan(
        Clauses::Names,
        &namespaces,
        now(),
        &NarrowingBounds::default(),
    );
    let create = |resource: &str, name| {
        let group = if resource == "namespaces" {
            ""
        } else {
            "rbac.authorization.k8s.io"
        };
        cluster_review(group, resource, name, "CREATE")
    };
    assert_eq!(sends(&creates, &create("namespaces", "any-name")), 1);
    assert_eq!(sends(&creates, &create("clusterroles", "any-name")), 0);
    // The lock kinds only: nothing it could lock is ever sent, so nothing is widened.
    let lock_kinds = [LockRef::cluster_lock(
        "locks",
        spec(serde_json::json!({"selector": {"matchLabels": {"a": "b"}},
            "resources": [{"apiGroups": ["objectlock.dev"], "resources": ["locks", "clusterlocks"]}]})),
    )];
    let plan = super::plan(
        Clauses::Changes,
        &lock_kinds,
        now(),
        &NarrowingBounds::default(),
    );
    assert_eq!(plan.names, 0);
    assert_eq!(sends(&plan, &namespace("any-name")), 0);
    assert_eq!(sends(&plan, &role("locks")), 0);
    // Expired, it no longer widens anything.
    let expired = [LockRef::cluster_lock(
        "tiers",
        spec(
            serde_json::json!({"selector": {"matchLabels": {"tier": "prod"}}, "expiresAt": "2026-11-22T11:00:00Z"}),
        ),
    )];
    let plan = super::plan(
        Clauses::Changes,
        &expired,
        now(),
        &NarrowingBounds::default(),
    );
    assert_eq!(sends(&plan, &namespace("any-name")), 0);
}

#[test]
fn locks_of_nothing_sent_are_not_counted() {
    let nothing = |name: &str, resources: serde_json::Value| {
        LockRef::lock(
            "tenant",
            name,
            spec(serde_json::json!({"resources": resources})),
        )
    };
    let locks = [
        nothing(
            "a",
            serde_json::json!([{"apiGroups": ["objectlock.dev"], "resources": ["locks"]}]),
        ),
        nothing(
            "b",
            serde_json::json!([{"apiGroups": ["*"], "resources": ["events"]}]),
        ),
        nothing(
            "c",
            serde_json::json!([{"apiGroups": ["coordination.k8s.io"], "resources": ["leases"]}]),
        ),
        nothing(
            "d",
            serde_json::json!([{"apiGroups": ["authentication.k8s.io"], "resources": ["tokenreviews"]}]),
        ),
        nothing(
            "e",
            serde_json::json!([{"apiGroups": [""], "resources": ["pods/log"]}]),
        ),
    ];
    let plan = plan(
        Clauses::Changes,
        &locks,
        now(),
        &NarrowingBounds {
            max_names: 1,
            ..NarrowingBounds::default()
        },
    );
    assert_eq!(plan.names, 0);
    assert_eq!(plan.namespaces, [Vec::<String>::new()]);
}

#[test]
fn a_namespace_beyond_the_bound_is_sent_whole_and_others_stay_narrowed() {
    let limits = NarrowingBounds {
        max_names: 5,
        ..NarrowingBounds::default()
    };
    let mut locks: Vec<_> = (0..10)
        .map(|i| LockRef::lock("crowded", &format!("n{i}"), LockSpec::default()))
        .collect();
    locks.push(LockRef::lock("quiet", "db", LockSpec::default()));
    locks.push(LockRef::cluster_lock("node-1", LockSpec::default()));
    let plan = plan(Clauses::Changes, &locks, now(), &limits);
    assert_eq!(plan.names, 12);
    let in_ns = |ns: &str, name: &str| {
        with(
            "configmap-delete-locked.json",
            &[
                ("/request/namespace", serde_json::json!(ns)),
                ("/request/name", serde_json::json!(name)),
            ],
        )
    };
    assert_eq!(sends(&plan, &in_ns("crowded", "anything")), 1);
    assert_eq!(sends(&plan, &in_ns("quiet", "db")), 1);
    assert_eq!(sends(&plan, &in_ns("quiet", "other")), 0);
    assert_eq!(sends(&plan, &in_ns("elsewhere", "n1")), 0);
    assert_eq!(
        plan.namespaces,
        [vec!["crowded".to_owned(), "quiet".to_owned()]]
    );
    // The ClusterLocks alone beyond the bound: broad.
    let cluster: Vec<_> = (0..6)
        .map(|i| LockRef::cluster_lock(&format!("c{i}"), LockSpec::default()))
        .collect();
    assert!(matches!(
        super::plan(Clauses::Changes, &cluster, now(), &limits).scope,
        Scope::Broad(BroadReason::TooManyNames { names: 6, max: 5 })
    ));
}

#[test]
fn the_deletion_of_a_crd_whose_objects_a_lock_covers_is_sent() {
    let widgets = |ns: &str, operations: serde_json::Value, resources: serde_json::Value| {
        LockRef::lock(
            ns,
            "db",
            spec(serde_json::json!({"operations": operations, "resources": resources})),
        )
    };
    let crd = |name| {
        cluster_review(
            "apiextensions.k8s.io",
            "customresourcedefinitions",
            name,
            "DELETE",
        )
    };
    let locks = [widgets(
        "team",
        serde_json::json!(["DELETE"]),
        serde_json::json!([{"apiGroups": ["example.com"], "resources": ["widgets"]}]),
    )];
    let plan = plan(Clauses::Changes, &locks, now(), &NarrowingBounds::default());
    assert_eq!(sends(&plan, &crd("widgets.example.com")), 1);
    assert_eq!(sends(&plan, &crd("widgets.other.com")), 0);
    let update = cluster_review(
        "apiextensions.k8s.io",
        "customresourcedefinitions",
        "widgets.example.com",
        "UPDATE",
    );
    assert_eq!(sends(&plan, &update), 0);
    // UPDATE-only, every group, a subresource only: not sent.
    for lock in [
        widgets(
            "team",
            serde_json::json!(["UPDATE"]),
            serde_json::json!([{"apiGroups": ["example.com"], "resources": ["widgets"]}]),
        ),
        widgets(
            "team",
            serde_json::json!(["DELETE"]),
            serde_json::json!([{"apiGroups": ["*"], "resources": ["widgets"]}]),
        ),
        widgets(
            "team",
            serde_json::json!(["DELETE"]),
            serde_json::json!([{"apiGroups": ["example.com"], "resources": ["widgets/scale"]}]),
        ),
    ] {
        let plan = super::plan(
            Clauses::Changes,
            std::slice::from_ref(&lock),
            now(),
            &NarrowingBounds::default(),
        );
        assert_eq!(sends(&plan, &crd("widgets.example.com")), 0, "{lock:?}");
    }
}

#[test]
fn names_only_for_create_and_connect() {
    let locks = with_a_cluster_selector();
    let names = super::plan(Clauses::Names, &locks, now(), &NarrowingBounds::default());
    let Scope::Narrow {
        namespaced,
        cluster,
    } = &names.scope
    else {
        panic!("a ClusterLock's selector leaves the namespaced keys narrowed: {names:?}");
    };
    // The cluster-scoped part: every object (a selector ClusterLock may select any).
    assert_eq!(cluster, &["true"]);
    // The namespaced keys are those of the base plan without the ClusterLock.
    let base = plan(
        Clauses::Changes,
        &locks[..locks.len() - 1],
        now(),
        &NarrowingBounds::default(),
    );
    let Scope::Narrow {
        namespaced: base_namespaced,
        ..
    } = &base.scope
    else {
        panic!("narrow")
    };
    assert_eq!(namespaced, base_namespaced);
    assert_eq!(names.namespaces, base.namespaces);
    // No clause for the deletion of a Namespace holding Locks.
    let names = super::plan(
        Clauses::Names,
        &sample_locks(),
        now(),
        &NarrowingBounds::default(),
    );
    assert_eq!(sends(&names, &fixture("namespace-delete.json")), 0);
    assert_eq!(
        sends(&names, &fixture("clusterrole-update.json")),
        1,
        "the ClusterLock's name"
    );
    assert_eq!(sends(&base, &fixture("namespace-delete.json")), 1);
}
