//! Micro-benchmark of the review path without I/O, per captured AdmissionReview: `ours` is what
//! the webhook does with a body once it has it (parse, plan, decide against the locks, build the
//! response, serialize it), `serde_json_value` is merely reading the same bytes into a generic
//! `serde_json::Value`: the cost of looking at the JSON at all.
//!
//! ```sh
//! cargo bench --bench decide            # every fixture, well under a minute
//! cargo bench --bench decide -- large   # criterion's filter: only matching groups
//! ```
//!
//! The lock sets are the ones the fixtures were captured for (INDEX.md): the `locked-*` objects,
//! `held-cm`, `web`, `plain-pod`, `evict-me`, `db-creds`, the contents of `lock-doomed` and the
//! ClusterLock `lock-demo-reader` are locked, so denials, warnings and namespace deletions take
//! their real paths. `large-configmap-update` is `configmap-update-put.json` with 512 KiB of
//! data in object and oldObject. `large-deployment-update` measures what a lock on fields costs:
//! reading and comparing object and oldObject of a Deployment with a ~100 KiB pod template.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use k8s_openapi::jiff::Timestamp;
use kube_object_lock::admission::Verdict;
use kube_object_lock::admission::decide::{self, Triage};
use kube_object_lock::admission::review;
use kube_object_lock::api::LockSpec;
use kube_object_lock::locks::{LockRef, LockSet};

/// Locks by namespace (`""` for ClusterLocks).
struct Locks(HashMap<String, Arc<LockSet>>);

impl Locks {
    fn new() -> Locks {
        let spec = || LockSpec {
            reason: Some("benchmark".to_owned()),
            ..LockSpec::default()
        };
        let locks = [
            ("demo-015226", "locked-a"),
            ("demo-015226", "locked-sweep2"),
            ("lock-demo", "held-cm"),
            ("lock-demo", "web"),
            ("lock-demo", "plain-pod"),
            ("lock-demo", "evict-me"),
            ("lock-demo", "db-creds"),
            ("lock-doomed", "doomed-cm"),
        ]
        .map(|(ns, name)| LockRef::lock(ns, name, spec()))
        .into_iter()
        .chain([LockRef::cluster_lock("lock-demo-reader", spec())]);
        let mut sets: HashMap<String, LockSet> = HashMap::new();
        for lock in locks {
            let key = lock.namespace.clone().unwrap_or_default();
            sets.entry(key).or_default().insert(lock);
        }
        Locks(sets.into_iter().map(|(k, v)| (k, Arc::new(v))).collect())
    }

    fn get(&self, namespace: &str) -> Arc<LockSet> {
        self.0
            .get(namespace)
            .cloned()
            .unwrap_or_else(LockSet::empty)
    }
}

/// Body in, response bytes out: what the webhook does between reading the body and writing it.
fn ours(body: &[u8], locks: &Locks, now: Timestamp) -> Vec<u8> {
    let parsed = review::parse(body).expect("fixtures parse");
    let verdict = match decide::triage(&parsed.request) {
        Triage::Allow(_) => Verdict::allow(),
        Triage::Lookup(lookup) => {
            let scope = locks.get(lookup.scope);
            let contents = lookup.contents_of.map(|ns| locks.get(ns));
            // As the review asks it of every lookup; no lock here has a selector.
            let needed = decide::labels_needed(&parsed.request, &scope, now);
            assert!(needed.is_none(), "no selector lock, no label read");
            let unknown = kube_object_lock::admission::changes::Objects::unknown();
            decide::decide(
                &parsed.request,
                &lookup,
                &scope,
                contents.as_deref(),
                None,
                &unknown,
                now,
            )
        }
    };
    serde_json::to_vec(&kube_object_lock::admission::response::respond(
        parsed, verdict,
    ))
    .expect("responses serialize")
}

fn fixtures() -> Vec<(String, Vec<u8>)> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|entry| entry.expect("directory entry").path())
        .filter(|path| path.extension().is_some_and(|e| e == "json"))
        .collect();
    files.sort();
    let mut out: Vec<(String, Vec<u8>)> = files
        .iter()
        .map(|path| {
            let name = path.file_stem().expect("a file name").to_string_lossy();
            let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            (name.into_owned(), bytes)
        })
        .collect();
    let put = out
        .iter()
        .find(|(name, _)| name == "configmap-update-put")
        .map(|(_, bytes)| String::from_utf8_lossy(bytes).into_owned())
        .expect("configmap-update-put.json is a fixture");
    out.push((
        "large-configmap-update".to_owned(),
        large(&put).into_bytes(),
    ));
    out
}

/// `configmap-update-put.json` with 512 KiB of `key = "value"` lines as the data of object and
/// oldObject (the same body as the load benchmark's large-object scenario).
fn large(put: &str) -> String {
    let mut text = String::new();
    let mut line = 0;
    while text.len() < 512 * 1024 {
        text.push_str(&format!(
            "setting.{line:06} = \"value of setting {line:06}\"\n"
        ));
        line += 1;
    }
    text.truncate(512 * 1024);
    let mut body = put.to_owned();
    for (old, value) in [("put", "new"), ("v", "old")] {
        let before = format!("\"k\": \"{old}\"");
        assert_eq!(
            body.matches(&before).count(),
            1,
            "one {before} in the fixture"
        );
        let data = serde_json::to_string(&format!("{value}\n{text}")).expect("a string serializes");
        body = body.replace(&before, &format!("\"k\": {data}"));
    }
    body
}

fn review_path(c: &mut Criterion) {
    let locks = Locks::new();
    // Read once, as the server reads the clock once per review.
    let now = Timestamp::now();
    for (name, body) in fixtures() {
        // Fail here, once, rather than inside a timing loop.
        let answer = ours(&body, &locks, now);
        assert!(!answer.is_empty(), "{name}: empty answer");
        let mut group = c.benchmark_group(&name);
        group.throughput(Throughput::Bytes(body.len() as u64));
        group.bench_function("ours", |b| {
            b.iter(|| ours(std::hint::black_box(&body), &locks, now))
        });
        group.bench_function("serde_json_value", |b| {
            b.iter(|| {
                serde_json::from_slice::<serde_json::Value>(std::hint::black_box(&body))
                    .expect("fixtures are JSON")
            })
        });
        group.finish();
    }
}

/// An UPDATE of a Deployment whose pod template is ~100 KiB (400 environment variables in each
/// of 4 containers), changing only an annotation: what a field comparison costs per review.
fn deployment_update() -> Vec<u8> {
    let env: Vec<serde_json::Value> = (0..400)
        .map(|i| serde_json::json!({"name": format!("SETTING_{i:04}"), "value": format!("value of setting {i:04} for the web tier")}))
        .collect();
    let containers: Vec<serde_json::Value> = (0..4)
        .map(|i| serde_json::json!({"name": format!("c{i}"), "image": "registry.example/web:1.2.3", "env": env}))
        .collect();
    let object = |rv: &str, note: &str| {
        serde_json::json!({
            "apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "web", "namespace": "prod", "resourceVersion": rv, "generation": 4,
                         "annotations": {"example.com/note": note},
                         "managedFields": [{"manager": "kubectl", "operation": "Update"}]},
            "spec": {"replicas": 3, "selector": {"matchLabels": {"app": "web"}},
                     "template": {"metadata": {"labels": {"app": "web"}},
                                  "spec": {"containers": containers}}},
            "status": {"replicas": 3, "readyReplicas": 3}
        })
    };
    let review = serde_json::json!({
        "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {
            "uid": "b0c1", "kind": {"group": "apps", "version": "v1", "kind": "Deployment"},
            "resource": {"group": "apps", "version": "v1", "resource": "deployments"},
            "name": "web", "namespace": "prod", "operation": "UPDATE",
            "userInfo": {"username": "alice"},
            "object": object("2", "after"), "oldObject": object("1", "before"),
        }
    });
    serde_json::to_vec(&review).expect("serializes")
}

/// The decision on a locked Deployment's UPDATE: `whole_object` is the decision without reading
/// the objects (a lock on the whole object refusing it, as before locks on fields), the
/// baseline; `fields` reads object and oldObject from the body and compares `spec.template`
/// (unchanged: allowed); `unchanged_write` compares the whole object outside the annotation a
/// lock leaves free (`exceptFields`).
fn field_comparison(c: &mut Criterion) {
    use kube_object_lock::admission::changes::Objects;
    let body = deployment_update();
    let now = Timestamp::now();
    let set =
        |spec: LockSpec| -> LockSet { [LockRef::lock("prod", "web", spec)].into_iter().collect() };
    let whole = set(LockSpec::default());
    let fields = set(LockSpec {
        fields: Some(vec!["spec.template".to_owned()]),
        ..LockSpec::default()
    });
    let except = set(LockSpec {
        except_fields: Some(vec!["metadata.annotations".to_owned()]),
        ..LockSpec::default()
    });
    let decide = |locks: &LockSet, objects: bool| {
        let parsed = review::parse(&body).expect("parses");
        let Triage::Lookup(lookup) = decide::triage(&parsed.request) else {
            panic!("a locked name is looked up")
        };
        let objects = match objects {
            true => Objects::from_review(&body),
            false => Objects::unknown(),
        };
        decide::decide(&parsed.request, &lookup, locks, None, None, &objects, now)
    };
    assert!(!decide(&whole, false).allowed());
    assert!(decide(&fields, true).allowed());
    assert!(decide(&except, true).allowed());
    let mut group = c.benchmark_group("large-deployment-update");
    group.throughput(Throughput::Bytes(body.len() as u64));
    group.bench_function("whole_object", |b| b.iter(|| decide(&whole, false)));
    group.bench_function("fields", |b| b.iter(|| decide(&fields, true)));
    group.bench_function("unchanged_write", |b| b.iter(|| decide(&except, true)));
    group.finish();
}

criterion_group! {
    name = benches;
    // Short: 31 groups x 2 functions in well under a minute. The functions take microseconds,
    // so 300 ms still makes thousands of iterations; pass --measurement-time for more.
    config = Criterion::default()
        .warm_up_time(Duration::from_millis(100))
        .measurement_time(Duration::from_millis(300))
        .sample_size(10);
    targets = review_path, field_comparison
}
criterion_main!(benches);
