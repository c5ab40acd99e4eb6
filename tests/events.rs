//! Refusals recorded as Kubernetes Events, against the fake API server, where writes can be
//! counted and made to fail: one series per client retrying in a loop, a full queue and a gone
//! API server. That kube-apiserver accepts the Events, and that the webhook writes lock status,
//! is checked end to end (`warn-events`, `enforcement-visible`, `sigterm-withdraw`).

mod support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use kube_object_lock::admission::{OnLookupError, ReviewPolicy, Reviewer};
use kube_object_lock::events::{self, EventSink};
use kube_object_lock::locks::LockSource;
use kube_object_lock::locks::apiserver::KubeSource;
use kube_object_lock::metrics::{DropLabels, EnforcementMetrics, EventWriteLabels};
use serde_json::{Value, json};
use support::fake_apiserver::FakeApiServer;
use support::fixture;

const NS: &str = "demo-015226";

/// A reviewer reading locks from `api`, recording into a queue of `capacity`.
async fn reviewer(
    api: &FakeApiServer,
    capacity: usize,
    metrics: &EnforcementMetrics,
) -> (Reviewer, tokio::sync::mpsc::Receiver<events::RefusalEvent>) {
    let source = KubeSource::new(api.client(), support::cache_config(), Default::default());
    tokio::spawn(source.watch());
    let deadline = Instant::now() + Duration::from_secs(10);
    while !source.is_ready() {
        assert!(Instant::now() < deadline, "watch never synced");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let (sink, queue) = EventSink::channel(capacity, metrics.clone());
    let policy = ReviewPolicy {
        on_lookup_error: OnLookupError::Deny,
        lookup_timeout: Duration::from_secs(2),
    };
    (
        Reviewer::new(Arc::new(source), policy).with_events(sink),
        queue,
    )
}

async fn allowed(reviewer: &Reviewer, body: &[u8]) -> bool {
    let answer = reviewer.review(body, None).await.expect("a review");
    let json = serde_json::to_value(&answer.review).expect("serializes");
    json["response"]["allowed"] == true
}

fn with_dry_run(name: &str) -> Vec<u8> {
    let mut review: Value = serde_json::from_slice(&fixture(name)).expect("json");
    review["request"]["dryRun"] = json!(true);
    serde_json::to_vec(&review).expect("json")
}

/// The Event writes (`"METHOD /path"`) received by `api`.
fn event_writes(api: &FakeApiServer) -> Vec<String> {
    let log = api.request_log().into_iter();
    log.filter(|r| !r.starts_with("GET ") && r.contains(" /apis/events.k8s.io/"))
        .collect()
}

/// The uid the lock index knows for each lock.
fn snapshots(
    api: &FakeApiServer,
) -> tokio::sync::watch::Receiver<kube_object_lock::status::LockSnapshot> {
    let (rx, run) = support::lock_view(api.client());
    tokio::spawn(run);
    rx
}

#[tokio::test]
async fn a_client_retrying_in_a_loop_makes_one_series_and_at_most_two_writes() {
    support::init();
    let api = FakeApiServer::start().await;
    api.create_lock(NS, "locked-a", json!({"reason": "VM snapshot in progress"}));
    let uid = api.lock(NS, "locked-a").expect("lock")["metadata"]["uid"].clone();
    let metrics = EnforcementMetrics::default();
    let (reviewer, queue) = reviewer(&api, 1024, &metrics).await;
    let locks = snapshots(&api);
    support::until(
        "the index knows the lock",
        || locks.borrow().locks().count(),
        |n| *n == 1,
    )
    .await;
    let writer = tokio::spawn(events::run(
        api.client(),
        "cp-1".into(),
        // Far longer than the test: only the first write and the final flush happen.
        Duration::from_secs(3600),
        queue,
        locks,
        metrics.clone(),
    ));

    for _ in 0..50 {
        assert!(!allowed(&reviewer, &fixture("configmap-delete-locked.json")).await);
    }
    // Dry runs are refused the same way and leave no trace.
    for _ in 0..5 {
        assert!(!allowed(&reviewer, &with_dry_run("configmap-delete-locked.json")).await);
    }
    assert!(allowed(&reviewer, &fixture("configmap-delete-unlocked.json")).await);
    support::until("the first write", || event_writes(&api).len(), |n| *n >= 1).await;
    // Shutting down closes the queue: what is pending is written at once, then the writer ends.
    drop(reviewer);
    tokio::time::timeout(Duration::from_secs(10), writer)
        .await
        .expect("the writer finished")
        .expect("writer task");

    let writes = event_writes(&api);
    assert!((1..=2).contains(&writes.len()), "{writes:?}");
    let collection = format!("/apis/events.k8s.io/v1/namespaces/{NS}/events");
    assert!(
        writes[0].starts_with(&format!("POST {collection}")),
        "{writes:?}"
    );
    let events: kube::Api<kube::api::DynamicObject> = kube::Api::namespaced_with(
        api.client(),
        NS,
        &kube::api::ApiResource::erase::<k8s_openapi::api::events::v1::Event>(&()),
    );
    let events = serde_json::to_value(
        events
            .list(&Default::default())
            .await
            .expect("listed")
            .items,
    )
    .expect("json");
    let events = events.as_array().expect("items");
    assert_eq!(events.len(), 1, "one series: {events:#?}");
    let event = &events[0];
    let name = event["metadata"]["name"].as_str().unwrap_or_default();
    assert!(name.starts_with("locked-a."), "{event}");
    assert_eq!(event["reason"], "Blocked");
    assert_eq!(event["type"], "Warning");
    assert_eq!(event["action"], "DELETE");
    assert_eq!(
        event["reportingController"],
        "objectlock.dev/kube-object-lock"
    );
    assert_eq!(event["reportingInstance"], "cp-1");
    assert_eq!(
        event["regarding"],
        json!({"apiVersion": "objectlock.dev/v1alpha1", "kind": "Lock", "name": "locked-a",
            "namespace": NS, "uid": uid}),
        "kubectl describe finds events by kind, name, namespace and uid"
    );
    assert_eq!(
        event["note"],
        format!(
            "DELETE of configmaps \"locked-a\" in namespace \"{NS}\" by kubernetes-admin refused"
        )
    );
    assert_eq!(
        event["series"]["count"], 50,
        "every refusal counted, dry runs not"
    );
    let queued = kube_object_lock::metrics::EventLabels { reason: "Blocked" };
    assert_eq!(metrics.refusal_events.get_or_create(&queued).get(), 50);
}

#[tokio::test]
async fn answers_never_wait_for_events_and_failed_writes_are_counted_not_retried_forever() {
    support::init();
    let api = FakeApiServer::start().await;
    api.create_lock(NS, "locked-a", json!({}));
    let metrics = EnforcementMetrics::default();
    // Nobody reads this queue: every refusal beyond the first two is dropped and counted.
    let (reviewer, _unread) = reviewer(&api, 2, &metrics).await;
    for _ in 0..10 {
        assert!(!allowed(&reviewer, &fixture("configmap-delete-locked.json")).await);
    }
    let full = DropLabels {
        cause: "queue_full",
    };
    assert_eq!(metrics.refusal_events_dropped.get_or_create(&full).get(), 8);

    // An API server that is gone: three attempts, then the count is given up and counted.
    let gone = FakeApiServer::start().await;
    let client = gone.client();
    gone.stop().await;
    let (sink, queue) = EventSink::channel(16, metrics.clone());
    let writer = tokio::spawn(events::run(
        client,
        "cp-1".into(),
        Duration::from_millis(1),
        queue,
        snapshots(&api),
        metrics.clone(),
    ));
    let refusal = events::RefusalEvent {
        lock: kube_object_lock::api::LockKey {
            namespace: Some(NS.into()),
            name: "locked-a".into(),
        },
        reason: events::Reason::Blocked,
        operation: "DELETE",
        note: "DELETE refused".into(),
    };
    for _ in 0..4 {
        sink.record(refusal.clone());
    }
    drop(sink);
    tokio::time::timeout(Duration::from_secs(10), writer)
        .await
        .expect("the writer gave up in time")
        .expect("writer task");
    let failed = EventWriteLabels {
        verb: "create",
        outcome: "failure",
    };
    assert_eq!(metrics.event_writes.get_or_create(&failed).get(), 3);
    let lost = DropLabels {
        cause: "write_failed",
    };
    assert_eq!(metrics.refusal_events_dropped.get_or_create(&lost).get(), 4);
}
