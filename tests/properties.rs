//! Properties of the review path on generated AdmissionReviews (every operation, resource and
//! subresource, values of the wrong type anywhere), with the locks of [`LOCKS`]: (a) `parse`
//! and `review` never panic and fail alike; (b) an answer carries the request's `uid` and
//! `apiVersion`. What is decided is the decision table's (`admission::decide` tests).

use std::sync::Arc;

use kube_object_lock::admission::Reviewer;
use kube_object_lock::admission::review;
use kube_object_lock::locks::files::FilesSource;
use kube_object_lock::settings::Settings;
use proptest::prelude::*;
use serde_json::{Map, Value, json};

/// `(namespace, name)`; an empty namespace is a ClusterLock.
const LOCKS: &[(&str, &str)] = &[
    ("demo-015226", "locked-a"),
    ("lock-demo", "web"),
    ("lock-demo", "evict-me"),
    ("prod", "prod"),
    ("prod", "app-config"),
    ("", "lock-demo-reader"),
    ("", "prod"),
    ("", "web"),
];
/// Names: locked somewhere, locked elsewhere, never locked.
const NAMES: &[&str] = &[
    "locked-a",
    "web",
    "evict-me",
    "prod",
    "app-config",
    "lock-demo-reader",
    "lock-demo",
    "demo-015226",
    "free-a",
    "kube-system",
];
const NAMESPACES: &[&str] = &["demo-015226", "lock-demo", "prod", "free-ns", "kube-system"];
const GROUPS: &[&str] = &[
    "",
    "apps",
    "objectlock.dev",
    "policy",
    "rbac.authorization.k8s.io",
    "coordination.k8s.io",
    "demo.example.com",
];
const RESOURCES: &[&str] = &[
    "pods",
    "configmaps",
    "namespaces",
    "locks",
    "clusterlocks",
    "deployments",
    "clusterroles",
    "secrets",
    "leases",
    "widgets",
];
const SUBRESOURCES: &[&str] = &[
    "",
    "status",
    "eviction",
    "scale",
    "ephemeralcontainers",
    "finalize",
    "exec",
];
/// `(group, resource, subresource)` as the API server sends them.
const RESOURCE_PATHS: &[(&str, &str, &str)] = &[
    ("", "configmaps", ""),
    ("", "secrets", ""),
    ("", "pods", ""),
    ("", "pods", "eviction"),
    ("", "pods", "status"),
    ("", "pods", "ephemeralcontainers"),
    ("apps", "deployments", ""),
    ("apps", "deployments", "scale"),
    ("apps", "deployments", "status"),
    ("", "namespaces", ""),
    ("", "namespaces", "status"),
    ("", "namespaces", "finalize"),
    ("objectlock.dev", "locks", ""),
    ("objectlock.dev", "clusterlocks", ""),
    ("rbac.authorization.k8s.io", "clusterroles", ""),
    ("coordination.k8s.io", "leases", ""),
    ("demo.example.com", "widgets", ""),
];
const OPERATIONS: &[&str] = &["CREATE", "UPDATE", "DELETE", "CONNECT"];
/// Strings that are nearly right where the webhook reads a string.
const WRONG_STRINGS: &[&str] = &[
    "PATCH",
    "create",
    "DELETECOLLECTION",
    "",
    "admission.k8s.io/v2",
    "AdmissionReviewList",
    "objectlock.dev",
    "status",
];
const API_VERSIONS: &[&str] = &["admission.k8s.io/v1", "admission.k8s.io/v1beta1"];

// ---------------------------------------------------------------------------------------------
// Generators.

/// Any JSON value, a few levels deep.
fn any_json() -> BoxedStrategy<Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<f64>().prop_map(|f| json!(f)),
        ".{0,10}".prop_map(Value::from),
    ];
    leaf.prop_recursive(3, 24, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            prop::collection::btree_map("[a-zA-Z]{0,8}", inner, 0..4)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
    .boxed()
}

/// One of `pool`, or now and then any short string.
fn one_of(pool: &'static [&'static str]) -> BoxedStrategy<String> {
    prop_oneof![
        8 => prop::sample::select(pool).prop_map(str::to_owned),
        1 => "[a-z0-9.-]{0,12}",
    ]
    .boxed()
}

/// Extra fields the webhook does not read, with values of any shape.
fn extras() -> BoxedStrategy<Vec<(String, Value)>> {
    prop::collection::vec(
        (
            prop_oneof![
                Just("kind".to_owned()),
                Just("options".to_owned()),
                Just("requestKind".to_owned()),
                Just("requestSubResource".to_owned()),
                Just("spec".to_owned()),
                "[a-zA-Z]{1,10}",
            ],
            any_json(),
        ),
        0..3,
    )
    .boxed()
}

/// Builds an object from optional fields; `None` leaves the key out. Extras never take the
/// key of one of the fields, present or not.
fn object(fields: Vec<(&str, Option<Value>)>, extra: Vec<(String, Value)>) -> Value {
    let mut map = Map::new();
    for (key, value) in extra {
        if fields.iter().all(|(k, _)| *k != key) {
            map.insert(key, value);
        }
    }
    for (key, value) in fields {
        if let Some(value) = value {
            map.insert(key.to_owned(), value);
        }
    }
    Value::Object(map)
}

/// What is done to which object: `(operation, group, resource, subresource, name, namespace)`,
/// `namespace` being `""` for a cluster-scoped object.
type Target = (String, String, String, String, String, String);

/// Targets: independent picks, and the cases the rules single out, aimed at locked names.
fn target() -> BoxedStrategy<Target> {
    let op = || prop::sample::select(OPERATIONS).prop_map(str::to_owned);
    let independent = (
        op(),
        one_of(GROUPS),
        one_of(RESOURCES),
        one_of(SUBRESOURCES),
        one_of(NAMES),
        prop_oneof![one_of(NAMESPACES), Just(String::new())],
    )
        .boxed();
    // A locked name, in the lock's own scope, on a realistic resource.
    let at_a_lock = (
        op(),
        prop::sample::select(RESOURCE_PATHS),
        prop::sample::select(LOCKS),
    )
        .prop_map(|(op, (group, resource, sub), (namespace, name))| {
            let namespace = if group.is_empty() && resource == "namespaces" {
                name
            } else {
                namespace
            };
            (
                op,
                group.to_owned(),
                resource.to_owned(),
                sub.to_owned(),
                name.to_owned(),
                namespace.to_owned(),
            )
        })
        .boxed();
    // A Namespace deleted, holding Locks or not.
    let namespace_delete = prop::sample::select(NAMESPACES)
        .prop_map(|ns| {
            let s = |s: &str| s.to_owned();
            (s("DELETE"), s(""), s("namespaces"), s(""), s(ns), s(ns))
        })
        .boxed();
    // An eviction (a CREATE), of a locked pod or not.
    let eviction = prop_oneof![
        prop::sample::select(LOCKS).prop_map(|(ns, name)| (name.to_owned(), ns.to_owned())),
        (one_of(NAMES), one_of(NAMESPACES)),
    ]
    .prop_map(|(name, ns)| {
        let s = |s: &str| s.to_owned();
        (s("CREATE"), s(""), s("pods"), s("eviction"), name, ns)
    })
    .boxed();
    prop_oneof![
        4 => independent,
        4 => at_a_lock,
        1 => namespace_delete,
        1 => eviction,
    ]
    .boxed()
}

/// `object` / `oldObject` carrying `name` (or another, or none), Terminating or not.
fn kube_object(name: String) -> BoxedStrategy<Value> {
    let name = prop_oneof![
        4 => Just(Some(json!(name))),
        1 => one_of(NAMES).prop_map(|n| Some(json!(n))),
        1 => Just(None),
        1 => Just(Some(Value::Null)),
    ];
    let deletion = prop_oneof![
        4 => Just(None),
        1 => Just(Some(json!("2026-11-22T01:52:29Z"))),
        1 => Just(Some(Value::Null)),
    ];
    let labels = prop_oneof![Just(None), Just(Some(json!({"app": "web"})))];
    let metadata =
        (name, deletion, labels, extras()).prop_map(|(name, deletion, labels, extra)| {
            object(
                vec![
                    ("name", name),
                    ("deletionTimestamp", deletion),
                    ("labels", labels),
                ],
                extra,
            )
        });
    prop_oneof![
        1 => Just(Value::Null),
        4 => (metadata, extras())
            .prop_map(|(metadata, extra)| object(vec![("metadata", Some(metadata))], extra)),
    ]
    .boxed()
}

/// Present, absent, or null (the last two only where the webhook takes an `Option`).
fn maybe(value: Value) -> BoxedStrategy<Option<Value>> {
    prop_oneof![
        6 => Just(Some(value)),
        1 => Just(None),
        1 => Just(Some(Value::Null)),
    ]
    .boxed()
}

/// A well-typed `request`: every field the webhook reads has its type; optional ones may be
/// absent or null; `name` may be left out as in DELETECOLLECTION items.
fn request() -> BoxedStrategy<Value> {
    target()
        .prop_flat_map(|(op, group, resource, sub, name, namespace)| {
            let uid = prop_oneof![
                4 => "[a-f0-9-]{1,36}".prop_map(Value::from),
                1 => ".{1,12}".prop_map(Value::from),
            ];
            let resource = (Just(group), Just(resource), extras()).prop_map(|(g, r, extra)| {
                object(
                    vec![
                        ("group", Some(json!(g))),
                        ("version", Some(json!("v1"))),
                        ("resource", Some(json!(r))),
                    ],
                    extra,
                )
            });
            let sub = if sub.is_empty() {
                prop_oneof![Just(None), Just(Some(Value::Null)), Just(Some(json!("")))].boxed()
            } else {
                Just(Some(json!(sub))).boxed()
            };
            let request_name = prop_oneof![
                6 => Just(Some(json!(name.clone()))),
                2 => Just(None),
                1 => Just(Some(json!(""))),
                1 => Just(Some(Value::Null)),
            ];
            let namespace = if namespace.is_empty() {
                prop_oneof![Just(None), Just(Some(json!(""))), Just(Some(Value::Null))].boxed()
            } else {
                maybe(json!(namespace))
            };
            let user = (".{0,20}", prop::collection::vec(".{0,10}", 0..3), extras()).prop_map(
                |(username, groups, extra)| {
                    object(
                        vec![
                            ("username", Some(json!(username))),
                            ("groups", Some(json!(groups))),
                        ],
                        extra,
                    )
                },
            );
            (
                (uid, Just(op), resource, sub, request_name, namespace),
                (
                    user,
                    prop::option::of(kube_object(name.clone())),
                    prop::option::of(kube_object(name)),
                    prop::option::of(any::<bool>().prop_map(Value::from)),
                    extras(),
                ),
            )
        })
        .prop_map(
            |((uid, op, resource, sub, name, namespace), (user, object_, old, dry_run, extra))| {
                object(
                    vec![
                        ("uid", Some(uid)),
                        ("operation", Some(json!(op))),
                        ("resource", Some(resource)),
                        ("subResource", sub),
                        ("name", name),
                        ("namespace", namespace),
                        ("userInfo", Some(user)),
                        ("object", object_),
                        ("oldObject", old),
                        ("dryRun", dry_run),
                    ],
                    extra,
                )
            },
        )
        .boxed()
}

/// A well-typed AdmissionReview: every one of them is answerable.
fn admission_review() -> BoxedStrategy<Value> {
    (prop::sample::select(API_VERSIONS), request(), extras())
        .prop_map(|(api_version, request, extra)| {
            object(
                vec![
                    ("apiVersion", Some(json!(api_version))),
                    ("kind", Some(json!("AdmissionReview"))),
                    ("request", Some(request)),
                ],
                extra,
            )
        })
        .boxed()
}

/// Values that are wrong somewhere the webhook looks, or anywhere.
fn wrong_value() -> BoxedStrategy<Value> {
    prop_oneof![
        2 => any_json(),
        1 => prop::sample::select(WRONG_STRINGS).prop_map(Value::from),
    ]
    .boxed()
}

/// A well-typed review with up to three places (any node of the document) replaced by a value
/// of any type, removed, or nulled.
fn corrupted_review() -> BoxedStrategy<Value> {
    (
        admission_review(),
        prop::collection::vec((any::<prop::sample::Index>(), 0u8..3, wrong_value()), 0..4),
    )
        .prop_map(|(mut review, edits)| {
            for (at, how, value) in edits {
                let mut paths = Vec::new();
                pointers(&review, String::new(), &mut paths);
                let path = at.get(&paths).clone();
                corrupt(&mut review, &path, how, value);
            }
            review
        })
        .boxed()
}

/// JSON pointers of every node below the root.
fn pointers(value: &Value, at: String, out: &mut Vec<String>) {
    match value {
        Value::Object(map) => {
            for (key, child) in map {
                let path = format!("{at}/{}", key.replace('~', "~0").replace('/', "~1"));
                out.push(path.clone());
                pointers(child, path, out);
            }
        }
        Value::Array(items) => {
            for (i, child) in items.iter().enumerate() {
                let path = format!("{at}/{i}");
                out.push(path.clone());
                pointers(child, path, out);
            }
        }
        _ => {}
    }
}

fn corrupt(review: &mut Value, path: &str, how: u8, value: Value) {
    if how == 0 {
        let (parent, key) = path.rsplit_once('/').expect("a pointer below the root");
        if let Some(Value::Object(map)) = review.pointer_mut(parent) {
            map.remove(&key.replace("~1", "/").replace("~0", "~"));
            return;
        }
    }
    if let Some(slot) = review.pointer_mut(path) {
        *slot = if how == 1 { Value::Null } else { value };
    }
}

// ---------------------------------------------------------------------------------------------
// The reviewer and the oracle.

/// A reviewer on a files source holding [`LOCKS`], and a runtime to drive it.
struct Harness {
    reviewer: Reviewer,
    runtime: tokio::runtime::Runtime,
    _dir: tempfile::TempDir,
}

impl Harness {
    fn new() -> Harness {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut yaml = String::new();
        for (namespace, name) in LOCKS {
            let (kind, ns) = if namespace.is_empty() {
                ("ClusterLock", String::new())
            } else {
                ("Lock", format!("\n  namespace: {namespace}"))
            };
            yaml.push_str(&format!(
                "---\napiVersion: objectlock.dev/v1alpha1\nkind: {kind}\nmetadata:\n  name: {name}{ns}\nspec:\n  reason: test\n"
            ));
        }
        std::fs::write(dir.path().join("locks.yaml"), yaml).expect("write locks");
        let (source, report) = FilesSource::open(dir.path()).expect("files source");
        assert!(report.problems.is_empty(), "{:?}", report.problems);
        assert_eq!(report.locks, LOCKS.len());
        let reviewer = Reviewer::new(Arc::new(source), Settings::default().review_policy());
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .expect("runtime");
        Harness {
            reviewer,
            runtime,
            _dir: dir,
        }
    }

    /// Reviews `body`; checks (a) on the way. `None` when it is not an answerable review.
    fn review(&self, body: &[u8]) -> Option<Value> {
        let parsed = review::parse(body);
        let answer = self.runtime.block_on(self.reviewer.review(body, None));
        match (parsed, answer) {
            (Ok(_), Ok(answer)) => Some(serde_json::to_value(&answer.review).expect("serializes")),
            (Err(p), Err(r)) => {
                assert_eq!(p, r, "parse and review fail alike");
                None
            }
            (Ok(_), Err(e)) => panic!("parsed, yet review failed: {e}"),
            (Err(e), Ok(_)) => panic!("review answered what parse refused: {e}"),
        }
    }
}

fn allowed(response: &Value) -> bool {
    response["response"]["allowed"]
        .as_bool()
        .unwrap_or_else(|| panic!("allowed is a bool: {response}"))
}

/// Checks (b) on an answered review.
fn check_properties(request_json: &Value, response: &Value) -> Result<(), TestCaseError> {
    prop_assert_eq!(
        &response["response"]["uid"],
        &request_json["request"]["uid"]
    );
    prop_assert_eq!(&response["apiVersion"], &request_json["apiVersion"]);
    prop_assert_eq!(&response["kind"], "AdmissionReview");
    Ok(())
}

fn fixtures() -> Vec<Vec<u8>> {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .expect("fixtures dir")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .collect();
    files.sort();
    files
        .iter()
        .map(|p| std::fs::read(p).expect("fixture"))
        .collect()
}

// ---------------------------------------------------------------------------------------------
// The properties.

proptest! {
    // A failing case is printed, shrunk, with its seed; nothing is written next to the sources.
    #![proptest_config(ProptestConfig {
        cases: 256,
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    /// (a) on anything review-shaped, of any type anywhere; (b) on what parses.
    #[test]
    fn chaotic_reviews_never_panic(review in corrupted_review()) {
        let harness = HARNESS.with(|h| h.clone());
        let body = serde_json::to_vec(&review).expect("json");
        if let Some(response) = harness.review(&body) {
            check_properties(&review, &response)?;
        }
    }

    /// (b) on well-typed reviews, all of which are answered.
    #[test]
    fn well_typed_reviews_are_answered(review in admission_review()) {
        let harness = HARNESS.with(|h| h.clone());
        let body = serde_json::to_vec(&review).expect("json");
        // Every field has its type, so every one of them is answered.
        let response = harness.review(&body);
        prop_assert!(response.is_some(), "refused: {}", review);
        if let Some(response) = response {
            check_properties(&review, &response)?;
        }
    }

    /// (a) on captured reviews with bytes overwritten, inserted or removed.
    #[test]
    fn mutated_fixtures_never_panic(
        which in any::<prop::sample::Index>(),
        edits in prop::collection::vec((any::<prop::sample::Index>(), 0u8..3, any::<u8>()), 1..8),
    ) {
        let harness = HARNESS.with(|h| h.clone());
        let mut body = FIXTURES.with(|f| which.get(f).clone());
        for (at, kind, byte) in edits {
            let i = at.index(body.len().max(1));
            match kind {
                0 if i < body.len() => body[i] = byte,
                1 => body.insert(i.min(body.len()), byte),
                _ if i < body.len() => {
                    body.remove(i);
                }
                _ => {}
            }
        }
        harness.review(&body);
    }

    /// (a) on bytes.
    #[test]
    fn arbitrary_bytes_never_panic(body in prop::collection::vec(any::<u8>(), 0..256)) {
        let harness = HARNESS.with(|h| h.clone());
        harness.review(&body);
    }
}

thread_local! {
    static HARNESS: Arc<Harness> = Arc::new(Harness::new());
    static FIXTURES: Vec<Vec<u8>> = fixtures();
}

/// The captured reviews themselves keep the properties (and all parse).
#[test]
fn fixtures_keep_the_rules() {
    let harness = Harness::new();
    let mut denied = 0;
    for body in fixtures() {
        let request: Value = serde_json::from_slice(&body).expect("fixture JSON");
        let response = harness.review(&body).expect("every fixture parses");
        check_properties(&request, &response).unwrap_or_else(|e| panic!("{e}"));
        denied += usize::from(!allowed(&response));
    }
    // locked-a (delete, dry run, three updates), web (update, scale), evict-me (eviction),
    // lock-demo-reader (update, delete).
    assert_eq!(denied, 10);
}
