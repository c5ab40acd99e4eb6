//! The registration writer's state for alerts, against the fake API server, where writes can be
//! made to fail. What the API server makes of the writes (server-side apply, the entries of each
//! field manager) is checked end to end (`narrowing`, `narrowing-operations`,
//! `create-and-connect`, `namespace-opt-in`).

mod support;

use kube_object_lock::api::{LockKey, LockOperation};
use kube_object_lock::cli::manifests;
use kube_object_lock::locks::apiserver::KubeSource;
use kube_object_lock::metrics::{ConfigurationLabels, OutcomeLabels, RegistrationMetrics};
use kube_object_lock::registration::writer::{Narrower, NarrowerConfig};
use serde_json::{Value, json};
use support::fake_apiserver::FakeApiServer;

/// The configuration `manifests cluster` emits (for the example CA), as the operator applies it.
fn installed() -> Value {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/cluster.example.yaml");
    let yaml = std::fs::read_to_string(path).expect("deploy/cluster.example.yaml");
    let documents: Vec<Value> = serde_saphyr::from_multiple(&yaml).expect("YAML");
    documents
        .into_iter()
        .find(|d| d["kind"] == "ValidatingWebhookConfiguration")
        .expect("a webhook configuration")
}

/// 1 once a write is confirmed, 0 while writes fail (each counted), 1 again once one goes
/// through.
#[tokio::test]
async fn the_current_gauge_follows_confirmed_writes_and_failures() {
    support::init();
    let api = FakeApiServer::start().await;
    let configurations = "/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations";
    api.add_object(configurations, installed());
    api.create_lock("prod", "web", json!({}));
    let source = KubeSource::new(api.client(), support::cache_config(), Default::default());
    let config = NarrowerConfig {
        name: manifests::NAME.to_owned(),
        limits: Default::default(),
    };
    let metrics = RegistrationMetrics::default();
    let narrower = Narrower::new(api.client(), config, metrics.clone());
    let registered = narrower.registered();
    let tasks = [
        tokio::spawn(narrower.run(source.index().clone())),
        tokio::spawn(source.watch()),
    ];
    let named = |key: LockKey| {
        let registered = registered.clone();
        async move {
            let covers = || registered.borrow().sends(LockOperation::Update, &key);
            support::until("the registration names the lock", covers, |c| *c).await;
        }
    };
    let labels = ConfigurationLabels {
        name: manifests::NAME.to_owned(),
    };
    let current = || metrics.current.get_or_create(&labels).get();
    assert_eq!(current(), 0, "not confirmed yet");
    named(LockKey::lock("prod", "web")).await;
    assert_eq!(current(), 1);
    api.fail_patches(3, 403);
    api.create_lock("prod", "db", json!({}));
    support::until("a refused write seen", current, |c| *c == 0).await;
    named(LockKey::lock("prod", "db")).await;
    assert_eq!(current(), 1);
    let forbidden = OutcomeLabels {
        outcome: "forbidden",
    };
    assert_eq!(metrics.writes.get_or_create(&forbidden).get(), 3);
    tasks.iter().for_each(tokio::task::JoinHandle::abort);
}
