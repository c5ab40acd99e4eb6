//! Properties of the review path, checked on generated AdmissionReviews: realistic shapes
//! (every operation, resource and subresource the API server sends, and some it never does),
//! names that are and are not locked, and values of the wrong type anywhere.
//!
//! The properties, for a lock source holding the locks in [`LOCKS`]:
//! - (a) `review::parse` and `Reviewer::review` never panic, and `review` fails exactly when
//!   `parse` does, with the same error;
//! - (b) a CREATE is allowed, unless it is a CREATE of the core `pods/eviction` subresource and
//!   the pod's name has a Lock in the request's namespace;
//! - (c) any request on the lock resources themselves (group `objectlock.dev`, resource `locks`
//!   or `clusterlocks`, any subresource) is allowed;
//! - (d) a request is allowed when no name it carries (`name`, `oldObject.metadata.name`,
//!   `object.metadata.name`) has a lock in its scope (the namespace, or ClusterLocks for a
//!   cluster-scoped object or a Namespace), unless it is the DELETE of a Namespace that holds
//!   Locks;
//! - (e) the response carries the request's `uid` and is in the request's `apiVersion`;
//! - (f) and, so that the ones above are not vacuous: an UPDATE or DELETE (or an eviction) of
//!   an object whose `request.name` has a lock in its scope is refused with 403, unless it is
//!   on a lock resource, or an UPDATE that changes nothing (server-maintained metadata aside;
//!   the status through `status`; only the replicas count of a scale; only the removal of
//!   finalizers of a Terminating object).

use std::sync::Arc;

use kube_object_lock::admission::Reviewer;
use kube_object_lock::admission::changes::{self, FieldPath};
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

/// The facts of a (parsed) request the properties are stated in.
struct Facts<'a> {
    operation: &'a str,
    group: &'a str,
    resource: &'a str,
    subresource: Option<&'a str>,
    /// `request.name`, non-empty.
    name: Option<&'a str>,
    /// Every non-empty name the request carries.
    names: Vec<&'a str>,
    /// The lock scope: the namespace, or `""` for ClusterLocks.
    scope: &'a str,
    terminating: bool,
}

impl<'a> Facts<'a> {
    fn of(request: &'a Value) -> Facts<'a> {
        let text = |v: &'a Value| v.as_str().filter(|s| !s.is_empty());
        let group = request["resource"]["group"].as_str().unwrap_or("");
        let resource = request["resource"]["resource"].as_str().unwrap_or("");
        let is_namespace = group.is_empty() && resource == "namespaces";
        let names = [
            &request["name"],
            &request["oldObject"]["metadata"]["name"],
            &request["object"]["metadata"]["name"],
        ]
        .into_iter()
        .filter_map(text)
        .collect();
        let scope = match text(&request["namespace"]) {
            Some(ns) if !is_namespace => ns,
            _ => "",
        };
        let terminating = ["object", "oldObject"]
            .iter()
            .any(|o| !request[o]["metadata"]["deletionTimestamp"].is_null());
        Facts {
            operation: request["operation"].as_str().unwrap_or(""),
            group,
            resource,
            subresource: text(&request["subResource"]),
            name: text(&request["name"]),
            names,
            scope,
            terminating,
        }
    }

    fn locked(&self, name: &str) -> bool {
        LOCKS.contains(&(self.scope, name))
    }

    fn any_name_locked(&self) -> bool {
        self.names.iter().any(|n| self.locked(n))
    }

    fn is_lock_resource(&self) -> bool {
        self.group == "objectlock.dev" && matches!(self.resource, "locks" | "clusterlocks")
    }

    fn is_eviction(&self) -> bool {
        self.operation == "CREATE"
            && self.group.is_empty()
            && self.resource == "pods"
            && self.subresource == Some("eviction")
    }

    fn deletes_namespace_holding_locks(&self) -> bool {
        self.operation == "DELETE"
            && self.group.is_empty()
            && self.resource == "namespaces"
            && self.subresource.is_none()
            && self
                .names
                .iter()
                .any(|n| LOCKS.iter().any(|(ns, _)| ns == n))
    }
}

/// Whether an UPDATE changes something a whole-object lock freezes; unknown (objects that are
/// not both JSON objects) counts as a change.
fn update_changes(request: &Value, facts: &Facts) -> bool {
    let (old, new) = (&request["oldObject"], &request["object"]);
    if !(old.is_object() && new.is_object()) {
        return true;
    }
    let path = |p: &str| FieldPath::parse(p).expect("a valid path");
    match facts.subresource {
        Some("scale") => changes::changed(old, new, &path("spec.replicas")),
        Some("status") => changes::first_change_outside(old, new, &[path("status")]).is_some(),
        _ => {
            changes::first_change_outside(old, new, &[]).is_some()
                && !(facts.terminating && changes::only_finalizers_removed(old, new))
        }
    }
}

fn allowed(response: &Value) -> bool {
    response["response"]["allowed"]
        .as_bool()
        .unwrap_or_else(|| panic!("allowed is a bool: {response}"))
}

/// Checks (b) to (f) on an answered review.
fn check_properties(request_json: &Value, response: &Value) -> Result<(), TestCaseError> {
    let request = &request_json["request"];
    let facts = Facts::of(request);
    // (e)
    prop_assert_eq!(&response["response"]["uid"], &request["uid"]);
    prop_assert_eq!(&response["apiVersion"], &request_json["apiVersion"]);
    prop_assert_eq!(&response["kind"], "AdmissionReview");
    // (b)
    if facts.operation == "CREATE" && !(facts.is_eviction() && facts.any_name_locked()) {
        prop_assert!(allowed(response), "CREATE refused: {response}");
    }
    // (c)
    if facts.is_lock_resource() {
        prop_assert!(allowed(response), "lock resource refused: {response}");
    }
    // (d)
    if !facts.any_name_locked() && !facts.deletes_namespace_holding_locks() {
        prop_assert!(allowed(response), "refused without a lock: {response}");
    }
    // (f)
    let changes = match facts.operation {
        "DELETE" => true,
        "UPDATE" => update_changes(request, &facts),
        _ => facts.is_eviction(),
    };
    if changes && facts.name.is_some_and(|n| facts.locked(n)) && !facts.is_lock_resource() {
        prop_assert!(!allowed(response), "locked object let through: {response}");
        prop_assert_eq!(&response["response"]["status"]["code"], 403);
    }
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

    /// (a) on anything review-shaped, of any type anywhere; (b)-(f) on what parses.
    #[test]
    fn chaotic_reviews_never_panic_and_keep_the_rules(review in corrupted_review()) {
        let harness = HARNESS.with(|h| h.clone());
        let body = serde_json::to_vec(&review).expect("json");
        if let Some(response) = harness.review(&body) {
            check_properties(&review, &response)?;
        }
    }

    /// (b)-(f) on well-typed reviews, nearly all of which parse.
    #[test]
    fn well_typed_reviews_keep_the_rules(review in admission_review()) {
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

/// The generators reach every case the properties speak of, so none of them holds vacuously.
#[test]
fn generated_reviews_cover_every_property() {
    use proptest::strategy::ValueTree;
    use proptest::test_runner::TestRunner;
    let harness = Harness::new();
    let mut runner = TestRunner::deterministic();
    let mut counts = std::collections::BTreeMap::<&str, usize>::new();
    for (chaos, n) in [(false, 300), (true, 300)] {
        let strategy = if chaos {
            corrupted_review()
        } else {
            admission_review()
        };
        for _ in 0..n {
            let review = strategy.new_tree(&mut runner).expect("a value").current();
            let body = serde_json::to_vec(&review).expect("json");
            let Some(response) = harness.review(&body) else {
                *counts
                    .entry(if chaos {
                        "chaos refused"
                    } else {
                        "typed refused"
                    })
                    .or_default() += 1;
                continue;
            };
            let facts = Facts::of(&review["request"]);
            let mut seen = |key| *counts.entry(key).or_default() += 1;
            seen(if chaos {
                "chaos answered"
            } else {
                "typed answered"
            });
            seen(if allowed(&response) {
                "allowed"
            } else {
                "denied"
            });
            if facts.operation == "CREATE" {
                seen("create");
            }
            if facts.is_eviction() && facts.any_name_locked() {
                seen("eviction of a locked pod");
            }
            if facts.is_lock_resource() {
                seen("lock resource");
            }
            if !facts.any_name_locked() {
                seen("no lock");
            }
            if facts.deletes_namespace_holding_locks() {
                seen("namespace holding locks deleted");
            }
            if facts.any_name_locked() && !allowed(&response) {
                seen("locked and denied");
            }
            if facts.any_name_locked() && allowed(&response) {
                seen("locked and allowed");
            }
        }
    }
    println!("{counts:#?}");
    for key in [
        "chaos answered",
        "chaos refused",
        "typed answered",
        "create",
        "eviction of a locked pod",
        "lock resource",
        "no lock",
        "namespace holding locks deleted",
        "locked and denied",
        "locked and allowed",
    ] {
        assert!(
            counts.get(key).copied().unwrap_or(0) >= 5,
            "{key}: too rare in {counts:?}"
        );
    }
    assert_eq!(counts.get("typed refused"), None, "{counts:?}");
}
