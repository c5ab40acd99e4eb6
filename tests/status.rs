//! Lock status written by the instances, against the fake API server's status subresource
//! (server-side apply with field managers, as kube-apiserver does it).

mod support;

use std::sync::Arc;
use std::time::Duration;

use kube_object_lock::api::LockKey;
use kube_object_lock::locks::{LockKind, parse};
use kube_object_lock::metrics::{EnforcementMetrics, OutcomeLabels};
use kube_object_lock::registration::{Registered, RegisteredScope};
use kube_object_lock::status::writer::{self, DecisionInputs};
use kube_object_lock::status::{KnownLock, LockSnapshot};
use serde_json::{Value, json};
use support::fake_apiserver::FakeApiServer;
use tokio::sync::{oneshot, watch};
use tokio::task::JoinHandle;

/// One instance: its own lock index and view of it, and its status writer.
struct Instance {
    stop: Option<oneshot::Sender<()>>,
    writer: JoinHandle<()>,
    feed: JoinHandle<()>,
}

impl Instance {
    fn start(api: &FakeApiServer, name: &str) -> Instance {
        let (snapshots, feed) = support::lock_view(api.client());
        let (stop, stopped) = oneshot::channel::<()>();
        let writer = tokio::spawn(writer::run(
            api.client(),
            name.to_owned(),
            snapshots,
            DecisionInputs::default(),
            EnforcementMetrics::default(),
            async {
                let _ = stopped.await;
            },
        ));
        Instance {
            stop: Some(stop),
            writer,
            feed: tokio::spawn(feed),
        }
    }

    /// Stops as the service does on SIGTERM: withdraws, then ends.
    async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        tokio::time::timeout(Duration::from_secs(10), &mut self.writer)
            .await
            .expect("withdrew in time")
            .expect("writer task");
        self.feed.abort();
    }
}

impl Drop for Instance {
    fn drop(&mut self) {
        self.writer.abort();
        self.feed.abort();
    }
}

fn status_of(api: &FakeApiServer, ns: Option<&str>, name: &str) -> Value {
    let lock = match ns {
        Some(ns) => api.lock(ns, name),
        None => api.cluster_lock(name),
    };
    lock.map(|l| l["status"].clone()).unwrap_or(Value::Null)
}

fn instances(status: &Value) -> Vec<String> {
    let mut names: Vec<String> = status["enforcedBy"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|e| e["instance"].as_str().unwrap_or_default().to_owned())
        .collect();
    names.sort();
    names
}

fn condition(status: &Value) -> (String, String) {
    let c = status["conditions"]
        .as_array()
        .and_then(|c| c.iter().find(|c| c["type"] == "Enforced"))
        .cloned()
        .unwrap_or(Value::Null);
    (
        c["status"].as_str().unwrap_or_default().to_owned(),
        c["reason"].as_str().unwrap_or_default().to_owned(),
    )
}

/// Status PATCH requests received for one lock.
fn status_writes(api: &FakeApiServer, path: &str) -> usize {
    api.request_log()
        .iter()
        .filter(|r| r.starts_with("PATCH ") && r.contains(path))
        .count()
}

#[tokio::test]
async fn every_instance_records_itself_and_the_count_without_overwriting_the_others() {
    support::init();
    let api = FakeApiServer::start().await;
    api.create_lock("prod", "web", json!({"reason": "freeze"}));
    api.create_cluster_lock("prod", json!({}));
    let a = Instance::start(&api, "cp-1");
    let b = Instance::start(&api, "cp-2");

    for (ns, name) in [(Some("prod"), "web"), (None, "prod")] {
        let status = support::until(
            "both instances enforce",
            || status_of(&api, ns, name),
            |s| instances(s) == ["cp-1", "cp-2"] && s["enforcedCount"] == 2,
        )
        .await;
        assert_eq!(condition(&status), ("True".into(), "Enforcing".into()));
        for entry in status["enforcedBy"].as_array().expect("entries") {
            assert_eq!(entry["observedGeneration"], 1);
            assert!(
                entry["since"].as_str().is_some_and(|s| s.ends_with('Z')),
                "{entry}"
            );
        }
        assert_eq!(
            api.status_managers(ns, name),
            ["kube-object-lock/cp-1", "kube-object-lock/cp-2"],
            "each instance writes under its own field manager"
        );
    }
    // The spec and the generation are untouched by status writes.
    let web = api.lock("prod", "web").expect("lock");
    assert_eq!(web["metadata"]["generation"], 1);
    assert_eq!(web["spec"], json!({"reason": "freeze"}));

    // A new generation is recorded by each instance; `since` stays.
    let since = status_of(&api, Some("prod"), "web")["enforcedBy"][0]["since"].clone();
    api.create_lock("prod", "web", json!({"reason": "longer freeze"}));
    let status = support::until(
        "generation 2 seen by both",
        || status_of(&api, Some("prod"), "web"),
        |s| {
            s["enforcedBy"]
                .as_array()
                .is_some_and(|e| e.len() == 2 && e.iter().all(|e| e["observedGeneration"] == 2))
        },
    )
    .await;
    assert_eq!(status["enforcedBy"][0]["since"], since);

    // Nothing changes for prod/web: an unrelated lock costs it no write.
    let writes = status_writes(&api, "/namespaces/prod/locks/web/");
    api.create_lock("prod", "other", json!({}));
    support::until(
        "the other lock is enforced",
        || status_of(&api, Some("prod"), "other"),
        |s| s["enforcedCount"] == 2,
    )
    .await;
    assert_eq!(
        status_writes(&api, "/namespaces/prod/locks/web/"),
        writes,
        "status is written when it changes, not on every event"
    );

    // An instance that stops withdraws its entry; the other's stays, the count follows.
    b.stop().await;
    let status = support::until(
        "cp-2 withdrawn",
        || status_of(&api, Some("prod"), "web"),
        |s| instances(s) == ["cp-1"] && s["enforcedCount"] == 1,
    )
    .await;
    assert_eq!(condition(&status), ("True".into(), "Enforcing".into()));
    a.stop().await;
    let status = support::until(
        "cp-1 withdrawn",
        || status_of(&api, Some("prod"), "web"),
        |s| instances(s).is_empty(),
    )
    .await;
    assert_eq!(status["enforcedCount"], 0);
    assert!(
        status["conditions"].is_null(),
        "no instance asserts anything: {status}"
    );
}

#[tokio::test]
async fn locks_that_are_not_enforced_say_why() {
    support::init();
    let api = FakeApiServer::start().await;
    api.create_lock("prod", "warn", json!({"mode": "Warn"}));
    api.create_lock("prod", "old", json!({"expiresAt": "2020-01-01T00:00:00Z"}));
    api.create_lock("kube-system", "coredns", json!({}));
    // Expires while the instance runs: it withdraws at that moment, with no event to wake it.
    let soon = k8s_openapi::jiff::Timestamp::now() + std::time::Duration::from_secs(2);
    let soon = k8s_openapi::jiff::Timestamp::from_second(soon.as_second() + 1).expect("time");
    api.create_lock("prod", "soon", json!({"expiresAt": soon.to_string()}));
    let _a = Instance::start(&api, "cp-1");

    for (name, ns, reason) in [
        ("warn", "prod", "WarnMode"),
        ("old", "prod", "Expired"),
        ("coredns", "kube-system", "NotSentToWebhook"),
    ] {
        let status = support::until(
            reason,
            || status_of(&api, Some(ns), name),
            |s| !s["conditions"].is_null(),
        )
        .await;
        assert_eq!(
            condition(&status),
            ("False".into(), reason.into()),
            "{name}"
        );
        assert!(instances(&status).is_empty(), "{name}: {status}");
        assert_eq!(status["enforcedCount"], 0, "{name}");
    }
    support::until(
        "soon is enforced first",
        || status_of(&api, Some("prod"), "soon"),
        |s| instances(s) == ["cp-1"],
    )
    .await;
    let status = support::until(
        "soon expires",
        || status_of(&api, Some("prod"), "soon"),
        |s| condition(s).1 == "Expired",
    )
    .await;
    assert!(instances(&status).is_empty(), "{status}");
}

/// A snapshot holding Lock prod/web as stored, with `status` for its status.
fn web_snapshot(api: &FakeApiServer, healthy: bool, status: Value) -> LockSnapshot {
    let mut object = api.lock("prod", "web").expect("lock");
    object["status"] = status;
    let object: kube::api::DynamicObject = serde_json::from_value(object).expect("object");
    let lock = KnownLock::from(&parse::lock_ref(LockKind::Lock, &object).expect("a lock"));
    LockSnapshot {
        healthy,
        locks: imbl::OrdMap::unit(LockKey::lock("prod", "web"), Arc::new(lock)),
    }
}

#[tokio::test]
async fn an_unhealthy_source_withdraws_the_instance_and_a_healthy_one_returns_it() {
    support::init();
    let api = FakeApiServer::start().await;
    api.create_lock("prod", "web", json!({}));
    let snapshot = |healthy: bool, status: Value| web_snapshot(&api, healthy, status);
    let (tx, rx) = watch::channel(snapshot(true, Value::Null));
    let writer = tokio::spawn(writer::run(
        api.client(),
        "cp-1".into(),
        rx,
        DecisionInputs::default(),
        EnforcementMetrics::default(),
        std::future::pending(),
    ));
    let status = support::until(
        "enforced",
        || status_of(&api, Some("prod"), "web"),
        |s| instances(s) == ["cp-1"],
    )
    .await;
    tx.send_replace(snapshot(false, status));
    let status = support::until(
        "withdrawn",
        || status_of(&api, Some("prod"), "web"),
        |s| instances(s).is_empty(),
    )
    .await;
    assert_eq!(status["enforcedCount"], 0);
    tx.send_replace(snapshot(true, status));
    support::until(
        "back",
        || status_of(&api, Some("prod"), "web"),
        |s| instances(s) == ["cp-1"] && s["enforcedCount"] == 1,
    )
    .await;
    writer.abort();
}

#[tokio::test]
async fn the_last_instance_withdrawing_from_an_old_view_does_not_wipe_a_newer_entry() {
    support::init();
    let api = FakeApiServer::start().await;
    api.create_lock("prod", "web", json!({}));
    let start = |name: &str, snapshot: LockSnapshot, metrics: EnforcementMetrics| {
        let (tx, rx) = watch::channel(snapshot);
        let writer = tokio::spawn(writer::run(
            api.client(),
            name.to_owned(),
            rx,
            DecisionInputs::default(),
            metrics,
            std::future::pending(),
        ));
        (tx, writer)
    };
    let metrics = EnforcementMetrics::default();
    let snapshot = web_snapshot(&api, true, Value::Null);
    let (cp1, writer1) = start("cp-1", snapshot, metrics.clone());
    let seen_by_cp1 = support::until(
        "cp-1 enforcing",
        || status_of(&api, Some("prod"), "web"),
        |s| instances(s) == ["cp-1"],
    )
    .await;
    let old_view = web_snapshot(&api, false, seen_by_cp1);
    // cp-2 comes, and cp-1 goes before seeing it: from its view it is the last.
    let snapshot = web_snapshot(&api, true, Value::Null);
    let (_cp2, writer2) = start("cp-2", snapshot, EnforcementMetrics::default());
    support::until(
        "cp-2 enforcing",
        || status_of(&api, Some("prod"), "web"),
        |s| instances(s).contains(&"cp-2".to_owned()),
    )
    .await;
    writer2.abort();
    cp1.send_replace(old_view);
    let outcome = |outcome| {
        (metrics.status_writes)
            .get_or_create(&OutcomeLabels { outcome })
            .get()
    };
    let written = outcome("success");
    support::until(
        "cp-1's clearing answered",
        || (outcome("conflict"), outcome("success")),
        |(conflicts, successes)| *conflicts > 0 || *successes > written,
    )
    .await;
    assert_eq!(
        outcome("conflict"),
        1,
        "refused as computed from an old view"
    );
    let status = status_of(&api, Some("prod"), "web");
    assert!(
        instances(&status).contains(&"cp-2".to_owned()),
        "cp-2's entry wiped: {status}"
    );
    writer1.abort();
}

/// A future counting how often it is polled: a task at rest is not polled at all.
struct Polls<F> {
    inner: std::pin::Pin<Box<F>>,
    count: Arc<std::sync::atomic::AtomicUsize>,
}

impl<F: Future> Future for Polls<F> {
    type Output = F::Output;
    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<F::Output> {
        self.count
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.inner.as_mut().poll(cx)
    }
}

#[tokio::test]
async fn a_retry_no_longer_needed_is_dropped_not_spun_on() {
    support::init();
    let api = FakeApiServer::start().await;
    api.create_lock("prod", "web", json!({}));
    let snapshot = |healthy: bool, status: Value| web_snapshot(&api, healthy, status);
    let (tx, rx) = watch::channel(snapshot(true, Value::Null));
    let metrics = EnforcementMetrics::default();
    let polls = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let writer = tokio::spawn(Polls {
        inner: Box::pin(writer::run(
            api.client(),
            "cp-1".into(),
            rx,
            DecisionInputs::default(),
            metrics.clone(),
            std::future::pending(),
        )),
        count: polls.clone(),
    });
    let status = support::until(
        "enforced",
        || status_of(&api, Some("prod"), "web"),
        |s| instances(s) == ["cp-1"],
    )
    .await;
    // The source turns unhealthy and the withdrawal fails: a retry is set for a second later.
    api.fail_status_patches(1, 500);
    tx.send_replace(snapshot(false, status.clone()));
    let failed = || {
        (metrics.status_writes)
            .get_or_create(&OutcomeLabels { outcome: "error" })
            .get()
    };
    support::until("the withdrawal failed", failed, |n| *n == 1).await;
    // Healthy again before the retry: the status already says what it should.
    tx.send_replace(snapshot(true, status));
    tokio::time::sleep(Duration::from_millis(1500)).await;
    // The retry has come and gone: the writer is at rest.
    let before = polls.load(std::sync::atomic::Ordering::Relaxed);
    tokio::time::sleep(Duration::from_millis(500)).await;
    let during = polls.load(std::sync::atomic::Ordering::Relaxed) - before;
    assert!(during <= 2, "the writer was polled {during} times at rest");
    assert_eq!(instances(&status_of(&api, Some("prod"), "web")), ["cp-1"]);
    writer.abort();
}

/// Instance `cp-1`'s status writer over the locks of `api`, deciding with `inputs`: the writer
/// and the feed of its lock view.
fn writer_with(
    api: &FakeApiServer,
    inputs: DecisionInputs,
    metrics: EnforcementMetrics,
) -> (JoinHandle<()>, JoinHandle<()>) {
    let (snapshots, feed) = support::lock_view(api.client());
    let writer = tokio::spawn(writer::run(
        api.client(),
        "cp-1".into(),
        snapshots,
        inputs,
        metrics,
        std::future::pending(),
    ));
    (writer, tokio::spawn(feed))
}

#[tokio::test]
async fn a_lock_counts_as_enforced_only_once_the_registration_names_it() {
    support::init();
    let api = FakeApiServer::start().await;
    api.create_lock("prod", "web", json!({}));
    // Another lock, whose status shows when a registration has been acted on.
    api.create_lock("prod", "other", json!({}));
    let (registration, registered) = watch::channel(Registered::default());
    let metrics = EnforcementMetrics::default();
    let written = {
        let counter = metrics
            .status_writes
            .get_or_create(&kube_object_lock::metrics::OutcomeLabels { outcome: "success" });
        move || counter.get()
    };
    let inputs = DecisionInputs {
        registered: Some(registered),
        namespaces: None,
    };
    let (writer, feed) = writer_with(&api, inputs, metrics.clone());
    let condition = |s: &Value| s["conditions"][0].clone();
    // No write of the configuration confirmed yet.
    let status = support::until(
        "not yet registered",
        || status_of(&api, Some("prod"), "web"),
        |s| condition(s)["reason"] == "NotYetRegistered",
    )
    .await;
    assert_eq!(condition(&status)["status"], "False", "{status}");
    assert!(instances(&status).is_empty(), "{status}");
    assert_eq!(status["enforcedCount"], 0, "{status}");
    // Narrowed to other names: still not sent. Looked at once the pass that acted on the new
    // registration has ended (the other lock enforced, its write counted with its pass's), so a
    // write of this lock from it would have landed.
    let before = support::until(
        "both locks not yet registered",
        || {
            (
                written(),
                condition(&status_of(&api, Some("prod"), "other")),
            )
        },
        |(count, other)| *count >= 2 && other["reason"] == "NotYetRegistered",
    )
    .await
    .0;
    registration.send_replace(Registered {
        scope: Some(RegisteredScope::Narrow(
            [LockKey::lock("prod", "other")].into(),
        )),
        ..Registered::default()
    });
    support::until(
        "the other lock enforced once named",
        || (written(), status_of(&api, Some("prod"), "other")),
        |(count, other)| *count > before && instances(other) == ["cp-1"],
    )
    .await;
    assert!(instances(&status_of(&api, Some("prod"), "web")).is_empty());
    // Named: enforced.
    registration.send_replace(Registered {
        scope: Some(RegisteredScope::Narrow(
            [LockKey::lock("prod", "web")].into(),
        )),
        ..Registered::default()
    });
    let status = support::until(
        "enforced once named",
        || status_of(&api, Some("prod"), "web"),
        |s| instances(s) == ["cp-1"] && condition(s)["reason"] == "Enforcing",
    )
    .await;
    assert_eq!(status["enforcedCount"], 1);
    // Broad beyond the bound: enforced, and the condition says why everything is sent.
    registration.send_replace(Registered {
        scope: Some(RegisteredScope::Broad(
            "3 live locks exceed registration.max_names (2)".to_owned(),
        )),
        ..Registered::default()
    });
    let status = support::until(
        "broad",
        || status_of(&api, Some("prod"), "web"),
        |s| {
            condition(s)["message"]
                .as_str()
                .is_some_and(|m| m.contains("broad (3 live locks exceed registration.max_names"))
        },
    )
    .await;
    assert_eq!(instances(&status), ["cp-1"]);
    writer.abort();
    feed.abort();
}

#[tokio::test]
async fn a_lock_in_an_unselected_namespace_says_so_until_the_namespace_is_relabelled() {
    use kube_object_lock::registration::NamespaceSelection;
    use kube_object_lock::status::NamespaceLabels;
    support::init();
    let api = FakeApiServer::start().await;
    api.create_lock("dev", "web", json!({}));
    api.create_lock("prod", "web", json!({}));
    let lockable = k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector {
        match_labels: Some([("lockable".to_owned(), "true".to_owned())].into()),
        match_expressions: None,
    };
    let (_registration, registered) = watch::channel(Registered {
        scope: Some(RegisteredScope::Narrow(
            [LockKey::lock("dev", "web"), LockKey::lock("prod", "web")].into(),
        )),
        namespaces: NamespaceSelection {
            locks: lockable.clone(),
            namespaces: lockable,
        },
        ..Registered::default()
    });
    let labels = |dev: &str| NamespaceLabels {
        listed: true,
        labels: [("dev", dev), ("prod", "true")]
            .into_iter()
            .map(|(ns, v)| {
                let labels = [("lockable".to_owned(), v.to_owned())].into();
                (ns.to_owned(), Arc::new(labels))
            })
            .collect(),
    };
    let (relabel, namespaces) = watch::channel(labels("false"));
    let inputs = DecisionInputs {
        registered: Some(registered),
        namespaces: Some(namespaces),
    };
    let (writer, feed) = writer_with(&api, inputs, EnforcementMetrics::default());
    let condition = |s: &Value| s["conditions"][0].clone();
    let status = support::until(
        "not selected",
        || status_of(&api, Some("dev"), "web"),
        |s| condition(s)["reason"] == "NamespaceNotSelected",
    )
    .await;
    assert!(instances(&status).is_empty(), "{status}");
    let message = condition(&status)["message"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    assert!(
        message.contains("namespace dev ") && message.contains("(lockable=true)"),
        "{message}"
    );
    support::until(
        "the selected namespace's lock enforced",
        || status_of(&api, Some("prod"), "web"),
        |s| instances(s) == ["cp-1"],
    )
    .await;
    // Relabelled, nothing else changed: the same lock is enforced.
    relabel.send_replace(labels("true"));
    support::until(
        "enforced once its namespace is selected",
        || status_of(&api, Some("dev"), "web"),
        |s| instances(s) == ["cp-1"] && condition(s)["reason"] == "Enforcing",
    )
    .await;
    writer.abort();
    feed.abort();
}

#[tokio::test]
async fn the_fake_applies_status_like_a_real_api_server() {
    support::init();
    let api = FakeApiServer::start().await;
    api.create_lock("prod", "web", json!({}));
    let client = api.client();
    let key = LockKey {
        namespace: Some("prod".into()),
        name: "web".into(),
    };
    let locks = key.api(client.clone());
    let apply = |manager: &str, force: bool, status: Value| {
        let locks = locks.clone();
        let manager = manager.to_owned();
        async move {
            let mut params = kube::api::PatchParams::apply(&manager);
            params.force = force;
            let config = json!({"apiVersion": "objectlock.dev/v1alpha1", "kind": "Lock",
                "metadata": {"name": "web", "namespace": "prod"}, "status": status});
            locks
                .patch_status("web", &params, &kube::api::Patch::Apply(config))
                .await
        }
    };
    let rv = |v: &kube::api::DynamicObject| v.metadata.resource_version.clone();
    let first = apply("a", false, json!({"enforcedCount": 1, "enforcedBy": [{"instance": "a", "observedGeneration": 1, "since": "2026-01-01T00:00:00Z"}]}))
        .await
        .expect("applied");
    // The same apply again changes nothing: no new resourceVersion.
    let again = apply("a", false, json!({"enforcedCount": 1, "enforcedBy": [{"instance": "a", "observedGeneration": 1, "since": "2026-01-01T00:00:00Z"}]}))
        .await
        .expect("applied");
    assert_eq!(rv(&first), rv(&again));
    // Another manager: its own item merges in; a different count conflicts without force.
    let conflict = apply("b", false, json!({"enforcedCount": 2, "enforcedBy": [{"instance": "b", "observedGeneration": 1, "since": "2026-01-01T00:00:00Z"}]}))
        .await
        .expect_err("conflict");
    let kube::Error::Api(s) = conflict else {
        panic!("an API error")
    };
    assert_eq!((s.code, s.reason.as_str()), (409, "Conflict"));
    assert!(
        s.message.contains("conflict with \"a\"") && s.message.contains(".status.enforcedCount"),
        "{}",
        s.message
    );
    apply("b", true, json!({"enforcedCount": 2, "enforcedBy": [{"instance": "b", "observedGeneration": 1, "since": "2026-01-01T00:00:00Z"}]}))
        .await
        .expect("forced");
    let status = status_of(&api, Some("prod"), "web");
    assert_eq!(instances(&status), ["a", "b"]);
    assert_eq!(status["enforcedCount"], 2);
    // `a` leaves its item out: it goes; the count, now b's, stays.
    apply("a", false, json!({})).await.expect("applied");
    let status = status_of(&api, Some("prod"), "web");
    assert_eq!(instances(&status), ["b"]);
    assert_eq!(status["enforcedCount"], 2);
    // Refusals as a real server words them.
    let wrong_name =
        json!({"apiVersion": "objectlock.dev/v1alpha1", "kind": "Lock", "metadata": {"name": "x"}});
    let err = locks
        .patch_status(
            "web",
            &kube::api::PatchParams::apply("a"),
            &kube::api::Patch::Apply(wrong_name),
        )
        .await
        .expect_err("name");
    assert!(
        err.to_string()
            .contains("does not match the name on the URL"),
        "{err}"
    );
    let err = locks
        .patch_status(
            "gone",
            &kube::api::PatchParams::apply("a"),
            &kube::api::Patch::Apply(json!({})),
        )
        .await
        .expect_err("missing");
    assert!(matches!(err, kube::Error::Api(s) if s.code == 404));
    // Writing the object keeps the status; the status is shown with its managers.
    api.create_lock("prod", "web", json!({"reason": "changed"}));
    let object = api.lock("prod", "web").expect("lock");
    assert_eq!(instances(&object["status"]), ["b"]);
    let managers: Vec<&str> = object["metadata"]["managedFields"]
        .as_array()
        .expect("managedFields")
        .iter()
        .map(|m| m["manager"].as_str().unwrap_or_default())
        .collect();
    assert_eq!(managers, ["b"]);
    assert!(
        object["metadata"]["managedFields"][0]["fieldsV1"]["f:status"]["f:enforcedBy"]
            .get("k:{\"instance\":\"b\"}")
            .is_some(),
        "{object}"
    );
}

#[tokio::test]
async fn each_lock_is_written_once_and_a_change_to_one_lock_writes_only_that_lock() {
    support::init();
    const LOCKS: usize = 1_000;
    let api = FakeApiServer::start().await;
    for i in 0..LOCKS {
        api.create_lock(&format!("ns-{i}"), "held", json!({}));
    }
    let (snapshots, feed) = support::lock_view(api.client());
    let feed = tokio::spawn(feed);
    let metrics = EnforcementMetrics::default();
    let written = {
        let counter = metrics
            .status_writes
            .get_or_create(&kube_object_lock::metrics::OutcomeLabels { outcome: "success" });
        move || counter.get()
    };
    let writer = tokio::spawn(writer::run(
        api.client(),
        "cp-1".into(),
        snapshots,
        DecisionInputs::default(),
        metrics.clone(),
        std::future::pending(),
    ));
    let all_enforced = || {
        (0..LOCKS)
            .all(|i| instances(&status_of(&api, Some(&format!("ns-{i}")), "held")) == ["cp-1"])
    };
    support::until("every lock enforced", all_enforced, |done| *done).await;
    // A change to a lock that sorts after every other, looked at once it has been written: the
    // watch delivers events in order and the writer takes changed locks in key order, so once its
    // write is counted (a pass's writes are counted when the pass ends), every earlier event has
    // had its pass, and any write it caused has been counted.
    let (counted, api_ref) = (&written, &api);
    let last_written = move |count: u64, reason: &'static str| {
        support::until(
            "the last lock written",
            move || {
                (
                    counted(),
                    condition(&status_of(api_ref, Some("zz-last"), "held")).1,
                )
            },
            move |(writes, why)| *writes >= count && why == reason,
        )
    };
    // Every write's echo is an event; none of them may cause a second write of its lock.
    api.create_lock("zz-last", "held", json!({}));
    last_written(LOCKS as u64 + 1, "Enforcing").await;
    assert_eq!(written(), LOCKS as u64 + 1, "one write per lock at start");

    api.create_lock("ns-7", "held", json!({"mode": "Warn"}));
    support::until(
        "the changed lock rewritten",
        || status_of(&api, Some("ns-7"), "held"),
        |s| condition(s).1 == "WarnMode",
    )
    .await;
    api.create_lock("zz-last", "held", json!({"mode": "Warn"}));
    last_written(LOCKS as u64 + 3, "WarnMode").await;
    assert_eq!(
        written(),
        LOCKS as u64 + 3,
        "only the changed locks are written"
    );
    writer.abort();
    feed.abort();
}
