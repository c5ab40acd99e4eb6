//! The Kubernetes lock source against a fake API server speaking the real REST and watch wire
//! format to a real `kube::Client`, with the real webhook in front, over real HTTPS.

mod support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use kube_object_lock::admission::OnLookupError;
use kube_object_lock::app::Source;
use kube_object_lock::locks::LockSource;
use kube_object_lock::locks::kube::{CacheConfig, KubeSource};
use kube_object_lock::metrics::Metrics;
use kube_object_lock::settings::Settings;
use serde_json::{Value, json};
use support::fake_apiserver::{FakeApiServer, Fault};
use support::{TestServer, fixture, sample};

const NS: &str = "demo-015226";

struct Setup {
    api: FakeApiServer,
    source: KubeSource,
    server: TestServer,
}

async fn setup(ttl: Duration, tune: impl FnOnce(&mut Settings)) -> Setup {
    support::init();
    let api = FakeApiServer::start().await;
    let metrics = Arc::new(Metrics::new());
    let source = KubeSource::with_metrics(
        api.client(),
        CacheConfig {
            ttl,
            max_namespaces: 1000,
        },
        metrics.source.clone(),
    );
    let refresh = tokio::spawn(source.watch());
    let server = TestServer::start_full(
        support::Certs::new(),
        Source {
            source: Arc::new(source.clone()),
            refresh: Some(refresh),
        },
        metrics,
        tune,
    )
    .await;
    Setup {
        api,
        source,
        server,
    }
}

impl Setup {
    async fn review(&self, fixture_name: &str) -> Value {
        let reply = self
            .server
            .http1()
            .post_json(
                &self.server.url("/validate?timeout=10s"),
                fixture(fixture_name),
            )
            .await;
        assert_eq!(reply.status, 200);
        reply.json()["response"].clone()
    }

    async fn allowed(&self, fixture_name: &str) -> bool {
        self.review(fixture_name).await["allowed"] == true
    }

    async fn wait_ready(&self) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while !self.source.is_ready() {
            assert!(Instant::now() < deadline, "watch never synced");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Polls until the review's `allowed` becomes `want`; returns how long that took.
    async fn until_allowed_is(&self, fixture_name: &str, want: bool) -> Duration {
        let started = Instant::now();
        let deadline = started + Duration::from_secs(10);
        loop {
            if self.allowed(fixture_name).await == want {
                return started.elapsed();
            }
            assert!(
                Instant::now() < deadline,
                "{fixture_name} never became allowed={want}"
            );
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }
}

#[tokio::test]
async fn admissions_in_one_namespace_share_one_list() {
    let setup = setup(Duration::from_secs(600), |_| {}).await;
    setup
        .api
        .create_lock(NS, "locked-a", json!({"reason": "VM snapshot in progress"}));
    setup.wait_ready().await;
    // Concurrent misses for a cold namespace share one LIST.
    let client = setup.server.http1();
    let url = setup.server.url("/validate");
    let burst = (0..32).map(|i| {
        let name = if i % 2 == 0 {
            "configmap-delete-locked.json"
        } else {
            "configmap-delete-unlocked.json"
        };
        client.post_json(&url, fixture(name))
    });
    let replies = futures::future::join_all(burst).await;
    let denied = replies
        .iter()
        .filter(|r| r.json()["response"]["allowed"] == false)
        .count();
    assert_eq!(denied, 16);
    // And later ones hit the cache.
    for name in [
        "configmap-update-put.json",
        "configmap-update-merge-patch.json",
        "configmap-deletecollection-item.json",
        "widget-update.json",
        "widget-delete.json",
    ] {
        for _ in 0..20 {
            setup.review(name).await;
        }
    }
    let lists = setup.api.list_calls_for(&format!("/namespaces/{NS}/locks"));
    println!("132 admissions in namespace {NS}: {lists} LIST call(s) to the API server");
    assert_eq!(lists, 1);
    // CREATE needs no lookup at all; another namespace costs its own single LIST.
    assert!(setup.allowed("configmap-create.json").await);
    assert!(setup.allowed("deployment-update.json").await);
    assert!(setup.allowed("deployment-scale-update.json").await);
    assert_eq!(setup.api.list_calls_for("/namespaces/lock-demo/locks"), 1);
    assert_eq!(setup.source.metrics().cache_loads.get(), 2);
}

#[tokio::test]
async fn a_new_lock_is_enforced_without_waiting_for_the_ttl() {
    let setup = setup(Duration::from_secs(600), |_| {}).await;
    setup.wait_ready().await;
    assert!(
        setup.allowed("configmap-delete-locked.json").await,
        "cached as unlocked"
    );
    let lists_before = setup.api.list_calls();
    setup.api.create_lock(NS, "locked-a", json!({}));
    let took = setup
        .until_allowed_is("configmap-delete-locked.json", false)
        .await;
    println!("lock created -> enforced in {took:?} (cache TTL 600 s)");
    assert!(
        setup.api.list_calls() > lists_before,
        "the namespace was re-read"
    );

    setup.api.delete_lock(NS, "locked-a");
    let took = setup
        .until_allowed_is("configmap-delete-locked.json", true)
        .await;
    println!("lock deleted -> released in {took:?} (cache TTL 600 s)");
}

#[tokio::test]
async fn cluster_locks_and_namespace_deletion_read_through_the_cache() {
    let setup = setup(Duration::from_secs(600), |_| {}).await;
    setup.wait_ready().await;
    assert!(setup.allowed("clusterrole-update.json").await);
    setup
        .api
        .create_cluster_lock("lock-demo-reader", json!({"reason": "audit"}));
    setup
        .until_allowed_is("clusterrole-update.json", false)
        .await;
    let denial = setup.review("clusterrole-delete.json").await;
    assert_eq!(denial["status"]["code"], 403);
    assert!(
        denial["status"]["message"]
            .as_str()
            .unwrap_or("")
            .contains("ClusterLock lock-demo-reader: audit")
    );

    assert!(setup.allowed("namespace-delete.json").await);
    setup.api.create_lock("lock-doomed", "doomed-cm", json!({}));
    setup.until_allowed_is("namespace-delete.json", false).await;
    assert!(!setup.allowed("namespace-deletion-item-delete.json").await);
}

#[tokio::test]
async fn a_dropped_or_expired_watch_recovers() {
    let setup = setup(Duration::from_secs(600), |_| {}).await;
    setup.wait_ready().await;
    assert!(setup.allowed("configmap-delete-locked.json").await);
    let watches = setup.api.watch_calls();
    setup.api.drop_watches();
    setup.api.create_lock(NS, "locked-a", json!({}));
    setup
        .until_allowed_is("configmap-delete-locked.json", false)
        .await;
    assert!(
        setup.api.watch_calls() > watches,
        "the watch was re-established"
    );

    // History compacted while the watch is down: the watcher gets 410 Gone and re-lists.
    let restarts = || {
        setup
            .source
            .metrics()
            .watch_restarts
            .get_or_create(&kube_object_lock::metrics::KindLabels { kind: "Lock" })
            .get()
    };
    let errors = restarts();
    setup.api.compact();
    setup.api.drop_watches();
    setup.api.delete_lock(NS, "locked-a");
    setup
        .until_allowed_is("configmap-delete-locked.json", true)
        .await;
    let deadline = Instant::now() + Duration::from_secs(10);
    while restarts() == errors {
        assert!(Instant::now() < deadline, "the 410 was never seen");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // After the re-list, new locks are still enforced at once.
    setup.api.create_lock(NS, "locked-a", json!({}));
    setup
        .until_allowed_is("configmap-delete-locked.json", false)
        .await;
}

#[tokio::test]
async fn api_outage_gives_the_configured_decision_within_the_lookup_timeout() {
    let timeout = Duration::from_millis(300);
    let setup = setup(Duration::from_millis(50), |s| {
        s.kube.lookup_timeout = timeout
    })
    .await;
    setup.api.create_lock(NS, "locked-a", json!({}));
    setup.wait_ready().await;

    for (fault, needle, reason, outcome) in [
        (
            Fault::Delay(Duration::from_secs(5)),
            "no answer within 300ms",
            "timeout",
            None,
        ),
        (
            Fault::Status(500),
            "500 (InternalError)",
            "api",
            Some("server_error"),
        ),
        (
            Fault::Status(403),
            "grant it get, list and watch on locks and clusterlocks",
            "forbidden",
            Some("forbidden"),
        ),
    ] {
        let lookup_errors = format!(
            "kube_object_lock_lookup_errors_total{{reason=\"{reason}\",decision=\"deny\"}}"
        );
        let before = sample(&setup.server.scrape().await, &lookup_errors);
        setup.api.set_fault(fault.clone());
        tokio::time::sleep(Duration::from_millis(60)).await; // let the cached entry expire
        let started = Instant::now();
        let answer = setup.review("configmap-delete-unlocked.json").await;
        let took = started.elapsed();
        println!("{fault:?}: answered in {took:?} (lookup timeout {timeout:?})");
        assert_eq!(answer["allowed"], false, "{fault:?}: deny by default");
        assert_eq!(answer["status"]["code"], 503);
        let message = answer["status"]["message"].as_str().unwrap_or("");
        assert!(
            message.contains("lock state could not be read"),
            "{message}"
        );
        assert!(message.contains(needle), "{fault:?}: {message}");
        assert!(answer["auditAnnotations"]["lookup-error"].is_string());
        let scraped = setup.server.scrape().await;
        assert_eq!(
            sample(&scraped, &lookup_errors),
            before + 1.0,
            "{fault:?} counted"
        );
        if let Some(outcome) = outcome {
            let series = format!(
                "kube_object_lock_api_requests_total{{verb=\"list\",resource=\"locks\",outcome=\"{outcome}\"}}"
            );
            assert!(sample(&scraped, &series) >= 1.0, "{series} in\n{scraped}");
        }
        assert!(
            sample(
                &scraped,
                "kube_object_lock_admission_requests_total{operation=\"DELETE\",decision=\"error\"}"
            ) >= 1.0
        );
        // CREATE never depends on the API server.
        assert!(setup.allowed("configmap-create.json").await);
        setup.api.clear_fault();
        assert!(
            setup.allowed("configmap-delete-unlocked.json").await,
            "recovers"
        );
        assert!(
            !setup.allowed("configmap-delete-locked.json").await,
            "recovers"
        );
    }
}

#[tokio::test]
async fn metrics_count_admissions_cache_and_watch() {
    let setup = setup(Duration::from_secs(600), |_| {}).await;
    setup.api.create_lock(NS, "locked-a", json!({}));
    setup.api.create_cluster_lock("lock-demo-reader", json!({}));
    setup.wait_ready().await;
    assert!(!setup.allowed("configmap-delete-locked.json").await);
    assert!(setup.allowed("configmap-delete-unlocked.json").await);
    assert!(setup.allowed("configmap-create.json").await);
    let text = setup.server.scrape().await;
    for (series, value) in [
        (
            "kube_object_lock_admission_requests_total{operation=\"DELETE\",decision=\"denied\"}",
            1.0,
        ),
        (
            "kube_object_lock_admission_requests_total{operation=\"DELETE\",decision=\"allowed\"}",
            1.0,
        ),
        (
            "kube_object_lock_admission_requests_total{operation=\"CREATE\",decision=\"allowed\"}",
            1.0,
        ),
        ("kube_object_lock_admission_duration_seconds_count", 3.0),
        (
            "kube_object_lock_cache_requests_total{result=\"miss\"}",
            1.0,
        ),
        ("kube_object_lock_cache_requests_total{result=\"hit\"}", 1.0),
        ("kube_object_lock_cache_loads_total", 1.0),
        ("kube_object_lock_locks{scope=\"namespaced\"}", 1.0),
        ("kube_object_lock_locks{scope=\"cluster\"}", 1.0),
        (
            "kube_object_lock_api_requests_total{verb=\"list\",resource=\"locks\",outcome=\"success\"}",
            1.0,
        ),
    ] {
        assert_eq!(sample(&text, series), value, "{series} in\n{text}");
    }
    assert!(sample(&text, "kube_object_lock_watch_events_total{kind=\"Lock\"}") >= 2.0);
    assert!(
        sample(
            &text,
            "kube_object_lock_certificate_expiry_timestamp_seconds"
        ) > 1.7e9
    );
    // Invalid requests are counted apart.
    let reply = setup
        .server
        .http1()
        .post_json(&setup.server.url("/validate"), b"{}".to_vec())
        .await;
    assert_eq!(reply.status, 400);
    assert_eq!(
        sample(
            &setup.server.scrape().await,
            "kube_object_lock_invalid_requests_total"
        ),
        1.0
    );
}

#[tokio::test]
async fn on_lookup_error_allow_lets_changes_through_with_a_warning() {
    let setup = setup(Duration::from_millis(50), |s| {
        s.kube.lookup_timeout = Duration::from_millis(200);
        s.on_lookup_error = OnLookupError::Allow;
    })
    .await;
    setup.wait_ready().await;
    setup.api.stop().await;
    tokio::time::sleep(Duration::from_millis(60)).await;
    let answer = setup.review("configmap-delete-locked.json").await;
    assert_eq!(answer["allowed"], true);
    let warning = answer["warnings"][0].as_str().unwrap_or("");
    assert!(
        warning.contains("could not be read; allowed (on_lookup_error=allow)"),
        "{warning}"
    );
}

#[tokio::test]
async fn readiness_waits_for_the_first_watch_list() {
    support::init();
    let api = FakeApiServer::start().await;
    let source = KubeSource::new(
        api.client(),
        CacheConfig {
            ttl: Duration::from_secs(30),
            max_namespaces: 10,
        },
    );
    let server = TestServer::start(
        Source {
            source: Arc::new(source.clone()),
            refresh: None,
        },
        |_| {},
    )
    .await;
    let client = server.http1();
    let ready = client.get(&server.url("/readyz")).await;
    assert_eq!(ready.status, 503);
    assert!(String::from_utf8_lossy(&ready.body).contains("has not synced"));
    assert_eq!(client.get(&server.url("/healthz")).await.status, 200);
    // Lookups work before the watch syncs: they LIST.
    api.create_lock(NS, "locked-a", json!({}));
    let reply = client
        .post_json(
            &server.url("/validate"),
            fixture("configmap-delete-locked.json"),
        )
        .await;
    assert_eq!(reply.json()["response"]["allowed"], false);
    let watch = tokio::spawn(source.watch());
    let deadline = Instant::now() + Duration::from_secs(10);
    while client.get(&server.url("/readyz")).await.status != 200 {
        assert!(Instant::now() < deadline, "never ready");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    watch.abort();
}

#[tokio::test]
async fn every_spec_field_works_through_the_api_server() {
    let setup = setup(Duration::from_secs(600), |_| {}).await;
    setup.wait_ready().await;
    let fixture_name = "configmap-delete-locked.json"; // DELETE of locked-a by kubernetes-admin
    // (spec, allowed, what the answer must mention)
    let cases = [
        (
            json!({"mode": "Warn", "reason": "trial"}),
            true,
            "(mode Warn) would refuse this: trial",
        ),
        (
            json!({"exempt": {"users": ["kubernetes-admin"]}}),
            true,
            "allowed by exemption: user kubernetes-admin",
        ),
        (
            json!({"exempt": {"groups": ["system:masters"]}}),
            true,
            "group system:masters",
        ),
        (json!({"operations": ["UPDATE"]}), true, ""),
        (
            json!({"operations": ["DELETE"], "reason": "keep"}),
            false,
            "Lock demo-015226/locked-a: keep",
        ),
        (
            json!({"expiresAt": "2020-01-01T00:00:00Z"}),
            true,
            "Lock demo-015226/locked-a",
        ),
        (
            json!({"expiresAt": "2999-01-01T00:00:00Z"}),
            false,
            "is locked by",
        ),
        (
            json!({"resources": [{"apiGroups": ["apps"], "resources": ["deployments"]}]}),
            true,
            "",
        ),
        (
            json!({"resources": [{"apiGroups": [""], "resources": ["configmaps"]}]}),
            false,
            "is locked by",
        ),
    ];
    for (spec, allowed, needle) in cases {
        setup.api.create_lock(NS, "locked-a", spec.clone());
        let started = Instant::now();
        let answer = loop {
            let answer = setup.review(fixture_name).await;
            // Wait until the answer reflects this spec (the previous one may still be cached).
            let text = answer.to_string();
            if answer["allowed"] == allowed && text.contains(needle) {
                break answer;
            }
            assert!(
                started.elapsed() < Duration::from_secs(10),
                "{spec}: {answer}"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        };
        assert_eq!(answer["allowed"], allowed, "{spec}");
        setup.api.delete_lock(NS, "locked-a");
        setup.until_allowed_is(fixture_name, true).await;
    }
    // A selector lock under another name covers objects by their labels. The fixture's
    // ConfigMap has none: `app=web` does not select it, `app DoesNotExist` does.
    setup.api.create_lock(
        NS,
        "freeze",
        json!({"selector": {"matchLabels": {"app": "web"}}}),
    );
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(setup.allowed(fixture_name).await, "no labels, not selected");
    setup.api.create_lock(
        NS,
        "freeze",
        json!({"selector": {"matchExpressions": [{"key": "app", "operator": "DoesNotExist"}]}}),
    );
    setup.until_allowed_is(fixture_name, false).await;
}
