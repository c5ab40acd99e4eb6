//! The real server over real HTTPS, driven with AdmissionReviews captured from a real API
//! server (tests/fixtures/), over HTTP/1.1 (as the API server speaks) and HTTP/2.

mod support;

use serde_json::{Value, json};
use support::{Protocol, TestServer, fixture, lock_yaml};

/// The locks every fixture test runs against (files source).
fn locks() -> String {
    [
        lock_yaml(
            Some("demo-015226"),
            "locked-a",
            Some("VM snapshot in progress"),
        ),
        lock_yaml(Some("demo-015226"), "locked-sweep2", None),
        lock_yaml(Some("demo-015226"), "w1", Some("widget migration")),
        lock_yaml(Some("lock-demo"), "web", Some("release freeze")),
        lock_yaml(Some("lock-demo"), "plain-pod", None),
        lock_yaml(Some("lock-demo"), "evict-me", Some("batch job running")),
        lock_yaml(Some("lock-demo"), "held-cm", None),
        lock_yaml(Some("lock-demo"), "db-creds", Some("rotation pending")),
        lock_yaml(Some("lock-doomed"), "doomed-cm", None),
        lock_yaml(None, "lock-demo-reader", Some("audit")),
        lock_yaml(None, "lock-demo", Some("tenant namespace")),
    ]
    .concat()
}

/// What each fixture must get: allowed, or refused with (code, message); and warnings.
struct Expect {
    fixture: &'static str,
    refusal: Option<(u16, &'static str)>,
    audit: Option<(&'static str, &'static str)>,
    warning: Option<&'static str>,
}

const fn allowed(fixture: &'static str) -> Expect {
    Expect {
        fixture,
        refusal: None,
        audit: None,
        warning: None,
    }
}

const fn denied(fixture: &'static str, message: &'static str, lock: &'static str) -> Expect {
    Expect {
        fixture,
        refusal: Some((403, message)),
        audit: Some(("lock", lock)),
        warning: None,
    }
}

fn table() -> Vec<Expect> {
    vec![
        allowed("configmap-create.json"),
        allowed("widget-create.json"),
        allowed("configmap-delete-unlocked.json"),
        // A status write of a locked object that changes only its status.
        Expect {
            fixture: "deployment-status-update.json",
            refusal: None,
            audit: Some(("unchanged-locks", "Lock lock-demo/web")),
            warning: None,
        },
        Expect {
            fixture: "pod-status-update.json",
            refusal: None,
            audit: Some(("unchanged-locks", "Lock lock-demo/plain-pod")),
            warning: None,
        },
        allowed("lease-update.json"),
        allowed("lease-update-apiserver-identity.json"),
        allowed("namespace-status-update-by-namespace-controller.json"),
        allowed("namespace-finalize-update.json"),
        denied(
            "configmap-delete-locked.json",
            r#"configmaps "locked-a" in namespace "demo-015226" is locked by Lock demo-015226/locked-a: VM snapshot in progress (to unlock: kubectl delete lock locked-a -n demo-015226)"#,
            "Lock demo-015226/locked-a",
        ),
        denied(
            "configmap-delete-dryrun.json",
            r#"configmaps "locked-a" in namespace "demo-015226" is locked by Lock demo-015226/locked-a: VM snapshot in progress (to unlock: kubectl delete lock locked-a -n demo-015226)"#,
            "Lock demo-015226/locked-a",
        ),
        denied(
            "configmap-update-put.json",
            r#"configmaps "locked-a" in namespace "demo-015226" is locked by Lock demo-015226/locked-a: VM snapshot in progress (to unlock: kubectl delete lock locked-a -n demo-015226)"#,
            "Lock demo-015226/locked-a",
        ),
        denied(
            "configmap-update-merge-patch.json",
            r#"configmaps "locked-a" in namespace "demo-015226" is locked by Lock demo-015226/locked-a: VM snapshot in progress (to unlock: kubectl delete lock locked-a -n demo-015226)"#,
            "Lock demo-015226/locked-a",
        ),
        denied(
            "configmap-update-server-side-apply.json",
            r#"configmaps "locked-a" in namespace "demo-015226" is locked by Lock demo-015226/locked-a: VM snapshot in progress (to unlock: kubectl delete lock locked-a -n demo-015226)"#,
            "Lock demo-015226/locked-a",
        ),
        denied(
            "configmap-deletecollection-item.json",
            r#"configmaps "locked-sweep2" in namespace "demo-015226" is locked by Lock demo-015226/locked-sweep2 (to unlock: kubectl delete lock locked-sweep2 -n demo-015226)"#,
            "Lock demo-015226/locked-sweep2",
        ),
        denied(
            "widget-update.json",
            r#"widgets.demo.example.com "w1" in namespace "demo-015226" is locked by Lock demo-015226/w1: widget migration (to unlock: kubectl delete lock w1 -n demo-015226)"#,
            "Lock demo-015226/w1",
        ),
        denied(
            "widget-delete.json",
            r#"widgets.demo.example.com "w1" in namespace "demo-015226" is locked by Lock demo-015226/w1: widget migration (to unlock: kubectl delete lock w1 -n demo-015226)"#,
            "Lock demo-015226/w1",
        ),
        denied(
            "deployment-update.json",
            r#"deployments.apps "web" in namespace "lock-demo" is locked by Lock lock-demo/web: release freeze (to unlock: kubectl delete lock web -n lock-demo)"#,
            "Lock lock-demo/web",
        ),
        denied(
            "deployment-scale-update.json",
            r#"deployments.apps "web" in namespace "lock-demo" is locked by Lock lock-demo/web: release freeze (to unlock: kubectl delete lock web -n lock-demo)"#,
            "Lock lock-demo/web",
        ),
        denied(
            "pod-ephemeralcontainers-update.json",
            r#"pods "plain-pod" in namespace "lock-demo" is locked by Lock lock-demo/plain-pod (to unlock: kubectl delete lock plain-pod -n lock-demo)"#,
            "Lock lock-demo/plain-pod",
        ),
        denied(
            "pod-ephemeralcontainers-update-kubectl-debug.json",
            r#"pods "plain-pod" in namespace "lock-demo" is locked by Lock lock-demo/plain-pod (to unlock: kubectl delete lock plain-pod -n lock-demo)"#,
            "Lock lock-demo/plain-pod",
        ),
        denied(
            "pod-eviction-create.json",
            r#"cannot evict: pods "evict-me" in namespace "lock-demo" is locked by Lock lock-demo/evict-me: batch job running (to unlock: kubectl delete lock evict-me -n lock-demo)"#,
            "Lock lock-demo/evict-me",
        ),
        denied(
            "configmap-delete-with-finalizer.json",
            r#"configmaps "held-cm" in namespace "lock-demo" is locked by Lock lock-demo/held-cm (to unlock: kubectl delete lock held-cm -n lock-demo)"#,
            "Lock lock-demo/held-cm",
        ),
        Expect {
            // A Terminating object may lose its finalizers, and nothing else.
            fixture: "finalizer-removal-update.json",
            refusal: None,
            audit: Some(("unchanged-locks", "Lock lock-demo/held-cm")),
            warning: None,
        },
        denied(
            "secret-delete.json",
            r#"secrets "db-creds" in namespace "lock-demo" is locked by Lock lock-demo/db-creds: rotation pending (to unlock: kubectl delete lock db-creds -n lock-demo)"#,
            "Lock lock-demo/db-creds",
        ),
        denied(
            "clusterrole-update.json",
            r#"clusterroles.rbac.authorization.k8s.io "lock-demo-reader" is locked by ClusterLock lock-demo-reader: audit (to unlock: kubectl delete clusterlock lock-demo-reader)"#,
            "ClusterLock lock-demo-reader",
        ),
        denied(
            "clusterrole-delete.json",
            r#"clusterroles.rbac.authorization.k8s.io "lock-demo-reader" is locked by ClusterLock lock-demo-reader: audit (to unlock: kubectl delete clusterlock lock-demo-reader)"#,
            "ClusterLock lock-demo-reader",
        ),
        denied(
            "namespace-update.json",
            r#"namespaces "lock-demo" is locked by ClusterLock lock-demo: tenant namespace (to unlock: kubectl delete clusterlock lock-demo)"#,
            "ClusterLock lock-demo",
        ),
        denied(
            "namespace-deletion-item-delete.json",
            r#"configmaps "doomed-cm" in namespace "lock-doomed" is locked by Lock lock-doomed/doomed-cm (to unlock: kubectl delete lock doomed-cm -n lock-doomed)"#,
            "Lock lock-doomed/doomed-cm",
        ),
        Expect {
            fixture: "namespace-delete.json",
            refusal: Some((
                403,
                r#"deleting namespaces "lock-doomed" would delete the objects locked by 1 Lock in it (doomed-cm) (to unlock: kubectl delete locks --all -n lock-doomed)"#,
            )),
            audit: Some(("namespace-locks", "Lock lock-doomed/doomed-cm")),
            warning: None,
        },
    ]
}

fn expected_response(request: &Value, expect: &Expect) -> Value {
    let uid = request["request"]["uid"].clone();
    let mut response = json!({"uid": uid, "allowed": expect.refusal.is_none()});
    response["status"] = match expect.refusal {
        Some((code, message)) => json!({
            "status": "Failure", "code": code, "reason": "Forbidden", "message": message,
        }),
        None => json!({}),
    };
    if let Some((key, value)) = expect.audit {
        response["auditAnnotations"] = json!({ key: value });
    }
    if let Some(warning) = expect.warning {
        response["warnings"] = json!([warning]);
    }
    json!({
        "apiVersion": request["apiVersion"].clone(),
        "kind": "AdmissionReview",
        "response": response,
    })
}

#[tokio::test]
async fn every_fixture_gets_its_exact_answer_over_http1_and_http2() {
    let (server, _dir) = TestServer::with_lock_files(&locks()).await;
    let url = server.url("/validate?timeout=10s");
    let table = table();
    assert_eq!(table.len(), 30, "one row per captured fixture");
    for (client, protocol) in [
        (server.http1(), Protocol::Http1),
        (server.http2(), Protocol::Http2),
    ] {
        for expect in &table {
            let body = fixture(expect.fixture);
            let request: Value = serde_json::from_slice(&body).expect("fixture is JSON");
            let reply = client.post_json(&url, body).await;
            assert_eq!(reply.status, 200, "{} over {protocol:?}", expect.fixture);
            let wanted_version = match protocol {
                Protocol::Http1 => http::Version::HTTP_11,
                Protocol::Http2 => http::Version::HTTP_2,
            };
            assert_eq!(reply.version, wanted_version);
            assert_eq!(
                reply.headers.get("content-type").map(|v| v.as_bytes()),
                Some(&b"application/json"[..])
            );
            assert_eq!(
                reply.json(),
                expected_response(&request, expect),
                "{} over {protocol:?}",
                expect.fixture
            );
        }
    }
}

#[tokio::test]
async fn v1beta1_reviews_are_answered_in_v1beta1() {
    let (server, _dir) = TestServer::with_lock_files(&locks()).await;
    let mut review: Value =
        serde_json::from_slice(&fixture("configmap-delete-locked.json")).expect("json");
    review["apiVersion"] = json!("admission.k8s.io/v1beta1");
    let reply = server
        .http1()
        .post_json(
            &server.url("/validate"),
            serde_json::to_vec(&review).expect("json"),
        )
        .await;
    let answer = reply.json();
    assert_eq!(answer["apiVersion"], "admission.k8s.io/v1beta1");
    assert_eq!(answer["response"]["allowed"], false);
    assert_eq!(answer["response"]["uid"], review["request"]["uid"]);
}

#[tokio::test]
async fn lock_files_are_reloaded_while_serving() {
    let (server, dir) = TestServer::with_lock_files("").await;
    let client = server.http1();
    let url = server.url("/validate");
    let body = fixture("configmap-delete-locked.json");
    assert_eq!(
        client.post_json(&url, body.clone()).await.json()["response"]["allowed"],
        true
    );
    std::fs::write(
        dir.path().join("new.yaml"),
        lock_yaml(Some("demo-015226"), "locked-a", None),
    )
    .expect("write");
    // The directory is polled every 2 s by default; wait for the change, bounded.
    let mut denied = false;
    for _ in 0..100 {
        if client.post_json(&url, body.clone()).await.json()["response"]["allowed"] == false {
            denied = true;
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert!(
        denied,
        "a lock written to the directory is enforced without a restart"
    );
}

#[tokio::test]
async fn health_and_readiness() {
    let (server, _dir) = TestServer::with_lock_files("").await;
    for client in [server.http1(), server.http2()] {
        let health = client.get(&server.url("/healthz")).await;
        assert_eq!((health.status, health.body.as_slice()), (200, &b"ok\n"[..]));
        let ready = client.get(&server.url("/readyz")).await;
        assert_eq!((ready.status, ready.body.as_slice()), (200, &b"ok\n"[..]));
    }
}

#[tokio::test]
async fn shutdown_drains_and_stops_accepting() {
    let (server, _dir) = TestServer::with_lock_files("").await;
    let addr = server.addr;
    let client = server.http1();
    assert_eq!(client.get(&server.url("/healthz")).await.status, 200);
    assert_eq!(
        server.stop().await,
        kube_object_lock::server::Drain::Complete
    );
    assert!(
        tokio::net::TcpStream::connect(addr).await.is_err(),
        "the listener is closed after shutdown"
    );
}

#[tokio::test]
async fn lock_files_understand_the_whole_spec() {
    let yaml = r#"
apiVersion: objectlock.dev/v1alpha1
kind: Lock
metadata: {name: trial, namespace: demo-015226}
spec:
  selector: {matchExpressions: [{key: app, operator: DoesNotExist}]}
  mode: Warn
  reason: trying a namespace-wide lock
---
apiVersion: objectlock.dev/v1alpha1
kind: Lock
metadata: {name: locked-a, namespace: demo-015226}
spec:
  operations: [DELETE]
  resources: [{apiGroups: [""], resources: [configmaps]}]
  exempt: {groups: [system:masters]}
  expiresAt: "2999-01-01T00:00:00Z"
"#;
    let (server, _dir) = TestServer::with_lock_files(yaml).await;
    let client = server.http1();
    let url = server.url("/validate");
    // The admin is in system:masters: exempt from locked-a, warned by the Warn lock.
    let answer = client
        .post_json(&url, fixture("configmap-delete-locked.json"))
        .await
        .json();
    let response = &answer["response"];
    assert_eq!(response["allowed"], true, "{answer}");
    assert_eq!(
        response["warnings"],
        json!([
            "Lock demo-015226/trial (mode Warn) would refuse this: trying a namespace-wide lock",
            "allowed by exemption: group system:masters is exempt from Lock demo-015226/locked-a"
        ])
    );
    assert_eq!(
        response["auditAnnotations"],
        json!({
            "warn-locks": "Lock demo-015226/trial",
            "exempted-by": "Lock demo-015226/locked-a (group system:masters)"
        })
    );
}
