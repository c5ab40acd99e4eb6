//! Selector locks on evictions and scale: the webhook reads the labels of the evicted pod or the
//! scaled object from a fake API server speaking the real REST wire format (a metadata-only GET
//! through a real `kube::Client`), with the real webhook in front over real HTTPS; and what it
//! answers when that read fails (timeout, 403, 404, 500, a slow answer, no cluster at all).

mod support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use kube_object_lock::admission::OnLookupError;
use kube_object_lock::app::Source;
use kube_object_lock::locks::LockSource;
use kube_object_lock::locks::apiserver::KubeSource;
use kube_object_lock::metrics::Metrics;
use kube_object_lock::settings::Settings;
use serde_json::{Value, json};
use support::fake_apiserver::{FakeApiServer, Fault};
use support::{TestServer, fixture, sample};

const NS: &str = "prod";
/// The lookup timeout of these tests: the API server's own `?timeout=10s` leaves it as it is.
const LOOKUP_TIMEOUT: Duration = Duration::from_millis(300);

struct Setup {
    api: FakeApiServer,
    server: TestServer,
}

/// A webhook reading Locks and labels from a fake API server that holds the selector Lock
/// `prod/dbs` (`app: db`), pods `db-0` (`app: db`) and `web-0` (`app: web`), and Deployments
/// `db` (`app: db`) and `web` (`app: web`).
async fn setup(tune: impl FnOnce(&mut Settings)) -> Setup {
    support::init();
    let api = FakeApiServer::start().await;
    api.create_lock(
        NS,
        "dbs",
        json!({"selector": {"matchLabels": {"app": "db"}}, "reason": "backup"}),
    );
    for (name, app) in [("db-0", "db"), ("web-0", "web")] {
        api.add_object(
            "/api/v1/namespaces/prod/pods",
            json!({"metadata": {"name": name, "labels": {"app": app}}, "spec": {"containers": []}}),
        );
    }
    for (name, app) in [("db", "db"), ("web", "web")] {
        api.add_object(
            "/apis/apps/v1/namespaces/prod/deployments",
            json!({"metadata": {"name": name, "labels": {"app": app}}, "spec": {"replicas": 1}}),
        );
    }
    let metrics = Arc::new(Metrics::new());
    let source = KubeSource::new(
        api.client(),
        support::cache_config(),
        metrics.source.clone(),
    );
    let refresh = tokio::spawn(source.watch());
    let deadline = Instant::now() + Duration::from_secs(10);
    while !source.is_ready() {
        assert!(Instant::now() < deadline, "watch never synced");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let server = TestServer::start_full(
        support::Certs::new(),
        Source {
            source: Arc::new(source),
            refresh: Some(refresh),
            client: Some(api.client()),
        },
        metrics,
        |s| {
            s.kube.lookup_timeout = LOOKUP_TIMEOUT;
            tune(s);
        },
    )
    .await;
    Setup { api, server }
}

/// The eviction of pod `name` in `namespace`, from the captured review.
fn eviction(namespace: &str, name: &str) -> Vec<u8> {
    edited("pod-eviction-create.json", namespace, name)
}

/// The scale of Deployment `name` in `namespace`, from the captured review.
fn scale(namespace: &str, name: &str) -> Vec<u8> {
    edited("deployment-scale-update.json", namespace, name)
}

fn edited(fixture_name: &str, namespace: &str, name: &str) -> Vec<u8> {
    let mut review: Value = serde_json::from_slice(&fixture(fixture_name)).expect("fixture json");
    let request = &mut review["request"];
    request["name"] = json!(name);
    request["namespace"] = json!(namespace);
    for object in ["object", "oldObject"] {
        if request[object].is_object() {
            request[object]["metadata"]["name"] = json!(name);
            request[object]["metadata"]["namespace"] = json!(namespace);
        }
    }
    serde_json::to_vec(&review).expect("serializes")
}

impl Setup {
    async fn review(&self, body: Vec<u8>) -> Value {
        self.server.admission_response(body).await
    }

    /// GETs so far whose path contains `path`.
    fn gets(&self, path: &str) -> usize {
        let log = self.api.request_log();
        log.iter()
            .filter(|r| r.starts_with("GET ") && r.contains(path))
            .count()
    }

    /// Label reads counted with `outcome`.
    async fn label_reads(&self, outcome: &str) -> f64 {
        let series = format!("kube_object_lock_label_reads_total{{outcome=\"{outcome}\"}}");
        sample(&self.server.scrape().await, &series)
    }
}

fn message(answer: &Value) -> &str {
    answer["status"]["message"].as_str().unwrap_or("")
}

#[tokio::test]
async fn a_selector_lock_refuses_the_eviction_and_scale_of_what_it_selects() {
    let setup = setup(|_| {}).await;
    let answer = setup.review(eviction(NS, "db-0")).await;
    assert_eq!(answer["allowed"], false, "{answer}");
    assert_eq!(answer["status"]["code"], 403);
    assert_eq!(
        message(&answer),
        "cannot evict: pods \"db-0\" in namespace \"prod\" is locked by Lock prod/dbs: backup (to unlock: kubectl delete lock dbs -n prod)"
    );
    assert_eq!(setup.review(eviction(NS, "web-0")).await["allowed"], true);
    let answer = setup.review(scale(NS, "db")).await;
    assert_eq!(answer["allowed"], false, "{answer}");
    assert_eq!(
        message(&answer),
        "deployments.apps \"db\" in namespace \"prod\" is locked by Lock prod/dbs: backup (to unlock: kubectl delete lock dbs -n prod)"
    );
    assert_eq!(setup.review(scale(NS, "web")).await["allowed"], true);
    // One metadata-only GET per review, of the pod or the Deployment itself.
    assert_eq!(setup.gets("/api/v1/namespaces/prod/pods/db-0"), 1);
    assert_eq!(
        setup.gets("/apis/apps/v1/namespaces/prod/deployments/db"),
        1
    );
    assert_eq!(setup.label_reads("read").await, 4.0);
    // A label changed since is read as it is now.
    setup.api.add_object(
        "/api/v1/namespaces/prod/pods",
        json!({"metadata": {"name": "db-0", "labels": {"app": "retired"}}}),
    );
    assert_eq!(setup.review(eviction(NS, "db-0")).await["allowed"], true);
}

#[tokio::test]
async fn no_label_is_read_where_no_selector_lock_could_need_it() {
    let setup = setup(|_| {}).await;
    // Another namespace (no Lock at all), and a namespace whose Lock is named, not a selector.
    setup.api.create_lock("other", "db-0", json!({}));
    for body in [
        eviction("staging", "db-0"),
        scale("staging", "db"),
        eviction("other", "web-0"),
        // Requests carrying their object's labels: the Lock reads those.
        fixture("configmap-delete-unlocked.json"),
        fixture("configmap-update-put.json"),
    ] {
        let answer = setup.review(body).await;
        assert_eq!(answer["allowed"], true, "{answer}");
    }
    assert_eq!(setup.gets("/pods/"), 0);
    assert_eq!(setup.gets("/deployments/"), 0);
    assert_eq!(setup.label_reads("read").await, 0.0);
    // A selector Lock covering only UPDATE needs no labels for an eviction.
    setup.api.add_object(
        "/api/v1/namespaces/updates/pods",
        json!({"metadata": {"name": "db-0", "labels": {"app": "db"}}}),
    );
    setup.api.add_object(
        "/apis/apps/v1/namespaces/updates/deployments",
        json!({"metadata": {"name": "db", "labels": {"app": "db"}}}),
    );
    setup.api.create_lock(
        "updates",
        "dbs",
        json!({"selector": {"matchLabels": {"app": "db"}}, "operations": ["UPDATE"]}),
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    while setup.review(scale("updates", "db")).await["allowed"] == true {
        assert!(Instant::now() < deadline, "the Lock never arrived");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let gets = setup.gets("/pods/");
    assert_eq!(
        setup.review(eviction("updates", "db-0")).await["allowed"],
        true
    );
    assert_eq!(setup.gets("/pods/"), gets);
}

#[tokio::test]
async fn a_label_read_that_fails_follows_on_lookup_error() {
    let setup = setup(|_| {}).await;
    let pod = "cannot read the labels of pods \"db-0\" in namespace \"prod\" to apply selector Lock prod/dbs: ";
    for (fault, needle, outcome) in [
        (
            Fault::Status(403),
            "the webhook's identity may not get pods: grant it get on pods (/api/v1/namespaces/prod/pods/db-0 is forbidden: User",
            "forbidden",
        ),
        (
            Fault::Status(500),
            "the API server answered 500: Internal error occurred: fault injected by FakeApiServer",
            "api",
        ),
        (
            Fault::Delay(Duration::from_secs(5)),
            "no answer within",
            "timeout",
        ),
    ] {
        setup.api.set_object_fault(Some(fault.clone()));
        let before = setup.label_reads(outcome).await;
        let answer = setup.review(eviction(NS, "db-0")).await;
        assert_eq!(answer["allowed"], false, "{fault:?}: deny by default");
        assert_eq!(answer["status"]["code"], 503, "{fault:?}");
        let text = message(&answer);
        assert!(text.starts_with(pod), "{fault:?}: {text}");
        assert!(text.contains(needle), "{fault:?}: {text}");
        assert!(
            text.ends_with("the change is refused until they can be read (on_lookup_error=deny)"),
            "{text}"
        );
        assert!(answer["auditAnnotations"]["lookup-error"].is_string());
        assert_eq!(setup.label_reads(outcome).await, before + 1.0, "{fault:?}");
        // The same for the scale of a Deployment.
        let answer = setup.review(scale(NS, "db")).await;
        assert_eq!(answer["status"]["code"], 503, "{fault:?}");
        assert!(
            message(&answer).starts_with(
                "cannot read the labels of deployments.apps \"db\" in namespace \"prod\" to apply selector Lock prod/dbs: "
            ),
            "{answer}"
        );
        // Nothing else depends on the read.
        assert_eq!(
            setup.review(eviction("staging", "db-0")).await["allowed"],
            true
        );
        setup.api.set_object_fault(None);
        assert_eq!(
            setup.review(eviction(NS, "web-0")).await["allowed"],
            true,
            "recovers"
        );
    }
}

#[tokio::test]
async fn a_slow_answer_within_the_timeout_is_waited_for() {
    let setup = setup(|_| {}).await;
    setup
        .api
        .set_object_fault(Some(Fault::Delay(LOOKUP_TIMEOUT / 3)));
    let answer = setup.review(eviction(NS, "db-0")).await;
    assert_eq!(answer["status"]["code"], 403, "{answer}");
    assert_eq!(setup.review(eviction(NS, "web-0")).await["allowed"], true);
    assert_eq!(setup.label_reads("timeout").await, 0.0);
}

#[tokio::test]
async fn the_eviction_of_a_pod_that_is_gone_has_nothing_to_lock() {
    let setup = setup(|_| {}).await;
    let answer = setup.review(eviction(NS, "db-1")).await;
    assert_eq!(answer["allowed"], true, "{answer}");
    assert!(answer.get("warnings").is_none(), "{answer}");
    assert_eq!(setup.label_reads("not_found").await, 1.0);
    let answer = setup.review(scale(NS, "gone")).await;
    assert_eq!(answer["allowed"], true, "{answer}");
}

#[tokio::test]
async fn on_lookup_error_allow_lets_the_eviction_through_with_a_warning() {
    let setup = setup(|s| s.on_lookup_error = OnLookupError::Allow).await;
    setup.api.set_object_fault(Some(Fault::Status(403)));
    let answer = setup.review(eviction(NS, "db-0")).await;
    assert_eq!(answer["allowed"], true, "{answer}");
    let warning = answer["warnings"][0].as_str().unwrap_or("");
    assert!(
        warning.starts_with("cannot read the labels of pods \"db-0\" in namespace \"prod\" to apply selector Lock prod/dbs, allowed (on_lookup_error=allow): the webhook's identity may not get pods"),
        "{warning}"
    );
}

#[tokio::test]
async fn without_a_cluster_the_labels_cannot_be_read() {
    let (server, _dir) = TestServer::with_lock_files(
        "apiVersion: objectlock.dev/v1alpha1\nkind: Lock\nmetadata: {name: dbs, namespace: prod}\nspec:\n  selector: {matchLabels: {app: db}}\n",
    )
    .await;
    let reply = server
        .http1()
        .post_json(&server.url("/validate"), eviction(NS, "db-0"))
        .await;
    let answer = reply.json()["response"].clone();
    assert_eq!(answer["status"]["code"], 503, "{answer}");
    assert!(
        message(&answer).contains(
            "cannot read the labels of pods \"db-0\" in namespace \"prod\" to apply selector Lock prod/dbs: locks are read from files: there is no cluster to read them from"
        ),
        "{answer}"
    );
}
