//! Lock status as one instance writes it, against the fake API server (which keeps what one
//! instance applies to the status subresource): why a lock is not enforced, withdrawal while the
//! source is unhealthy, one write per lock, a retry no longer needed dropped. Status between
//! instances (server-side apply) is checked end to end (`enforcement-visible`, `two-apiservers`,
//! `sigterm-withdraw`, `unconfirmed`, `namespace-opt-in`).

mod support;

use std::sync::Arc;
use std::time::Duration;

use kube_object_lock::locks::{LockKind, LockSet, parse};
use kube_object_lock::metrics::{EnforcementMetrics, OutcomeLabels};
use kube_object_lock::status::LockSnapshot;
use kube_object_lock::status::writer;
use serde_json::{Value, json};
use support::fake_apiserver::FakeApiServer;
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// Instance `name`'s status writer, fed by its own lock view; both stop when dropped.
struct Instance([JoinHandle<()>; 2]);

impl Instance {
    fn start(api: &FakeApiServer, name: &str) -> Instance {
        let (snapshots, feed) = support::lock_view(api.client());
        let writer = writer::run(
            api.client(),
            name.to_owned(),
            snapshots,
            None,
            None,
            EnforcementMetrics::default(),
            std::future::pending(),
        );
        Instance([tokio::spawn(writer), tokio::spawn(feed)])
    }
}

impl Drop for Instance {
    fn drop(&mut self) {
        self.0.iter().for_each(JoinHandle::abort);
    }
}

fn status_of(api: &FakeApiServer, ns: &str, name: &str) -> Value {
    (api.lock(ns, name)).map_or(Value::Null, |l| l["status"].clone())
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
            || status_of(&api, ns, name),
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
        || status_of(&api, "prod", "soon"),
        |s| instances(s) == ["cp-1"],
    )
    .await;
    let status = support::until(
        "soon expires",
        || status_of(&api, "prod", "soon"),
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
    let lock = parse::lock_ref(LockKind::Lock, &object).expect("a lock");
    LockSnapshot {
        healthy,
        sets: imbl::OrdMap::unit("prod".into(), Arc::new(LockSet::from_iter([lock]))),
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
        None,
        None,
        EnforcementMetrics::default(),
        std::future::pending(),
    ));
    let status = support::until(
        "enforced",
        || status_of(&api, "prod", "web"),
        |s| instances(s) == ["cp-1"],
    )
    .await;
    tx.send_replace(snapshot(false, status));
    let status = support::until(
        "withdrawn",
        || status_of(&api, "prod", "web"),
        |s| instances(s).is_empty(),
    )
    .await;
    assert_eq!(status["enforcedCount"], 0);
    tx.send_replace(snapshot(true, status));
    support::until(
        "back",
        || status_of(&api, "prod", "web"),
        |s| instances(s) == ["cp-1"] && s["enforcedCount"] == 1,
    )
    .await;
    writer.abort();
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
            None,
            None,
            metrics.clone(),
            std::future::pending(),
        )),
        count: polls.clone(),
    });
    let status = support::until(
        "enforced",
        || status_of(&api, "prod", "web"),
        |s| instances(s) == ["cp-1"],
    )
    .await;
    // The source turns unhealthy and the withdrawal fails: a retry is set for a second later.
    api.fail_patches(1, 500);
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
    assert_eq!(instances(&status_of(&api, "prod", "web")), ["cp-1"]);
    writer.abort();
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
        None,
        None,
        metrics.clone(),
        std::future::pending(),
    ));
    let all_enforced =
        || (0..LOCKS).all(|i| instances(&status_of(&api, &format!("ns-{i}"), "held")) == ["cp-1"]);
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
                    condition(&status_of(api_ref, "zz-last", "held")).1,
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
        || status_of(&api, "ns-7", "held"),
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
