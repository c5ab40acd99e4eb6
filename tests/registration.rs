//! The registration writer against the fake API server's ValidatingWebhookConfigurations
//! (server-side apply with field managers per entry, as kube-apiserver does it): the CREATE and
//! CONNECT entries under their own field manager, beside the base entries.

mod support;

use k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration;
use kube::api::{Api, Patch, PatchParams};
use kube_object_lock::api::LockKey;
use kube_object_lock::cli::manifests;
use kube_object_lock::locks::apiserver::KubeSource;
use kube_object_lock::metrics::{ConfigurationLabels, OutcomeLabels, RegistrationMetrics};
use kube_object_lock::registration::operations::{CLUSTER_CREATE_ENTRY, CREATE_ENTRY};
use kube_object_lock::registration::writer::{
    FIELD_MANAGER, Narrower, NarrowerConfig, OPERATIONS_FIELD_MANAGER,
};
use kube_object_lock::registration::{
    CLUSTER_ENTRY, NAMESPACED_ENTRY, Registered, RegisteredScope,
};
use serde_json::{Value, json};
use support::fake_apiserver::FakeApiServer;
use tokio::sync::watch;
use tokio::task::JoinHandle;

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

/// A fake API server on which the operator has applied `manifests cluster`.
async fn installed_api() -> FakeApiServer {
    support::init();
    let api = FakeApiServer::start().await;
    api.apply_webhook_configuration("kubectl", &installed(), false)
        .expect("installed");
    api
}

/// One instance's registration writer, fed by its own lock index.
struct Instance {
    registered: watch::Receiver<Registered>,
    metrics: RegistrationMetrics,
    tasks: [JoinHandle<()>; 2],
}

impl Instance {
    fn start(api: &FakeApiServer) -> Instance {
        let source = KubeSource::new(api.client(), support::cache_config());
        let config = NarrowerConfig {
            name: manifests::NAME.to_owned(),
            limits: Default::default(),
        };
        let metrics = RegistrationMetrics::default();
        let narrower = Narrower::new(api.client(), config, metrics.clone());
        let registered = narrower.registered();
        let index = source.index().clone();
        Instance {
            registered,
            metrics,
            tasks: [
                tokio::spawn(source.watch()),
                tokio::spawn(narrower.run(index)),
            ],
        }
    }
}

impl Instance {
    /// Waits until the base entries name `key`.
    async fn named(&self, key: LockKey) {
        support::until(
            "the base entries name the lock",
            || self.registered.borrow().clone(),
            |r| r.covers(&key),
        )
        .await;
    }
}

impl Drop for Instance {
    fn drop(&mut self) {
        self.tasks.iter().for_each(JoinHandle::abort);
    }
}

fn entries(api: &FakeApiServer) -> Vec<String> {
    let config = api
        .webhook_configuration(manifests::NAME)
        .unwrap_or_default();
    (config["webhooks"].as_array().into_iter().flatten())
        .map(|w| w["name"].as_str().unwrap_or_default().to_owned())
        .collect()
}

/// The managers owning the entry `name` (its `k:{"name":...}` item) in `managedFields`.
fn owners(api: &FakeApiServer, name: &str) -> Vec<String> {
    let config = api
        .webhook_configuration(manifests::NAME)
        .unwrap_or_default();
    let item = format!("k:{{\"name\":\"{name}\"}}");
    (config["metadata"]["managedFields"]
        .as_array()
        .into_iter()
        .flatten())
    .filter(|m| !m["fieldsV1"]["f:webhooks"][&item].is_null())
    .map(|m| m["manager"].as_str().unwrap_or_default().to_owned())
    .collect()
}

/// Applies of the CREATE and CONNECT entries the fake received.
fn operation_writes(api: &FakeApiServer) -> usize {
    let manager = format!("fieldManager={OPERATIONS_FIELD_MANAGER}");
    (api.request_log().iter())
        .filter(|r| r.starts_with("PATCH ") && r.contains(&manager))
        .count()
}

fn create_keys(registered: &watch::Receiver<Registered>) -> Option<RegisteredScope> {
    registered.borrow().create.clone()
}

#[tokio::test]
async fn create_entries_live_under_their_own_manager_while_a_lock_asks() {
    let api = installed_api().await;
    api.create_lock("prod", "cache", json!({}));
    let instance = Instance::start(&api);
    // The base entries are written; nothing asks for CREATE or CONNECT: nothing else is.
    support::until(
        "the base entries narrowed",
        || instance.registered.borrow().clone(),
        |r| r.covers(&LockKey::lock("prod", "cache")) && r.create.is_some(),
    )
    .await;
    assert_eq!(entries(&api), [NAMESPACED_ENTRY, CLUSTER_ENTRY]);
    assert_eq!(operation_writes(&api), 0, "no write while no lock asks");
    assert_eq!(
        create_keys(&instance.registered),
        Some(RegisteredScope::Narrow(Default::default()))
    );

    // A Lock asking CREATE: its entry, under the second manager only.
    api.create_lock("prod", "web", json!({"operations": ["CREATE", "UPDATE"]}));
    let web = LockKey::lock("prod", "web");
    support::until(
        "the CREATE entry written and confirmed",
        || (entries(&api), create_keys(&instance.registered)),
        |(names, create)| {
            names.iter().any(|n| n == CREATE_ENTRY)
                && create == &Some(RegisteredScope::Narrow([web.clone()].into()))
        },
    )
    .await;
    assert!(instance.registered.borrow().covers(&web));
    assert_eq!(owners(&api, CREATE_ENTRY), [OPERATIONS_FIELD_MANAGER]);
    let base_owners = owners(&api, NAMESPACED_ENTRY);
    assert!(
        base_owners.iter().any(|o| o == FIELD_MANAGER),
        "{base_owners:?}"
    );
    assert!(!base_owners.iter().any(|o| o == OPERATIONS_FIELD_MANAGER));
    assert!(!entries(&api).iter().any(|n| n == CLUSTER_CREATE_ENTRY));

    // An apply of the base entries alone under the first manager, as an earlier version makes
    // it during a rolling upgrade, leaves the entry alone.
    let stored: ValidatingWebhookConfiguration =
        serde_json::from_value(api.webhook_configuration(manifests::NAME).expect("stored"))
            .expect("a configuration");
    let base: Vec<_> = (stored.webhooks.iter().flatten())
        .filter(|w| w.name == NAMESPACED_ENTRY || w.name == CLUSTER_ENTRY)
        .cloned()
        .collect();
    let body = json!({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingWebhookConfiguration",
        "metadata": {"name": manifests::NAME},
        "webhooks": base,
    });
    let configs: Api<ValidatingWebhookConfiguration> = Api::all(api.client());
    let written = configs
        .patch(
            manifests::NAME,
            &PatchParams::apply(FIELD_MANAGER).force(),
            &Patch::Apply(&body),
        )
        .await
        .expect("applied");
    let names: Vec<_> = (written.webhooks.iter().flatten())
        .map(|w| w.name.clone())
        .collect();
    assert!(names.iter().any(|n| n == CREATE_ENTRY), "{names:?}");

    // Nor does this version's rewrite of the base entries, for another Lock.
    let writes = operation_writes(&api);
    api.create_lock("staging", "db", json!({}));
    instance.named(LockKey::lock("staging", "db")).await;
    assert!(entries(&api).iter().any(|n| n == CREATE_ENTRY));
    assert_eq!(
        operation_writes(&api),
        writes,
        "the CREATE entry was current"
    );

    // The Lock deleted: the second manager's empty apply removes its entry, nothing else.
    assert!(api.delete_lock("prod", "web"));
    support::until(
        "the CREATE entry removed and confirmed",
        || (entries(&api), create_keys(&instance.registered)),
        |(names, create)| {
            names.len() == 2 && create == &Some(RegisteredScope::Narrow(Default::default()))
        },
    )
    .await;
    assert_eq!(entries(&api), [NAMESPACED_ENTRY, CLUSTER_ENTRY]);
    assert!(owners(&api, CREATE_ENTRY).is_empty());
    // And while nothing asks, nothing more is written for them.
    let writes = operation_writes(&api);
    api.create_lock("prod", "other", json!({}));
    instance.named(LockKey::lock("prod", "other")).await;
    assert_eq!(operation_writes(&api), writes);
}

#[tokio::test]
async fn a_cluster_lock_asking_create_gets_the_cluster_scoped_entry_and_connect_its_own() {
    let api = installed_api().await;
    api.create_cluster_lock("tenant-a", json!({"operations": ["CREATE"]}));
    api.create_lock("prod", "db-0", json!({"operations": ["CONNECT"]}));
    let instance = Instance::start(&api);
    let registered = support::until(
        "both written and confirmed",
        || instance.registered.borrow().clone(),
        |r| {
            r.connect
                .as_ref()
                .is_some_and(|c| c != &RegisteredScope::Narrow(Default::default()))
        },
    )
    .await;
    assert_eq!(
        registered.create,
        Some(RegisteredScope::Narrow(
            [LockKey::cluster_lock("tenant-a")].into()
        ))
    );
    let mut names = entries(&api);
    names.sort();
    assert_eq!(
        names,
        [
            CLUSTER_CREATE_ENTRY,
            CLUSTER_ENTRY,
            "connect.objectlock.dev",
            NAMESPACED_ENTRY
        ]
    );
    // One apply carried both.
    assert_eq!(operation_writes(&api), 1);
}

#[tokio::test]
async fn the_fake_applies_webhook_entries_like_a_real_api_server() {
    support::init();
    let api = FakeApiServer::start().await;
    let entry = |name: &str, ca: &str| {
        json!({"name": name, "clientConfig": {"url": "https://127.0.0.1:9/validate", "caBundle": ca},
            "rules": [{"operations": ["UPDATE"], "apiGroups": ["*"], "apiVersions": ["*"], "resources": ["*"], "scope": "*"}],
            "sideEffects": "None", "admissionReviewVersions": ["v1"],
            "matchConditions": [{"name": "may-be-locked", "expression": "false"}]})
    };
    let config = |entries: Vec<Value>| {
        json!({"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingWebhookConfiguration",
            "metadata": {"name": "exp"}, "webhooks": entries})
    };
    let names = |object: &Value| -> Vec<String> {
        (object["webhooks"].as_array().into_iter().flatten())
            .map(|w| w["name"].as_str().unwrap_or_default().to_owned())
            .collect()
    };
    // What was seen on kube-apiserver 1.36: each manager's entries stay when another manager
    // applies its own, an empty list removes only the applier's, and a different value of a
    // field another manager owns conflicts unless forced.
    api.apply_webhook_configuration("a", &config(vec![entry("base.x.dev", "QUE=")]), false)
        .expect("a");
    let both = api
        .apply_webhook_configuration("b", &config(vec![entry("create.x.dev", "QUE=")]), false)
        .expect("b");
    assert_eq!(names(&both), ["base.x.dev", "create.x.dev"]);
    let again = api
        .apply_webhook_configuration("a", &config(vec![entry("base.x.dev", "QUJD")]), false)
        .expect("a again");
    assert_eq!(names(&again), ["base.x.dev", "create.x.dev"]);
    let conflict = api
        .apply_webhook_configuration("b", &config(vec![entry("base.x.dev", "QUE=")]), false)
        .expect_err("a's caBundle");
    assert_eq!(conflict["code"], 409, "{conflict}");
    let emptied = api
        .apply_webhook_configuration("b", &config(vec![]), false)
        .expect("b empty");
    assert_eq!(names(&emptied), ["base.x.dev"]);
    let invalid = api
        .apply_webhook_configuration("b", &config(vec![json!({"name": "short.dev"})]), false)
        .expect_err("invalid");
    assert_eq!(invalid["code"], 422, "{invalid}");
    // Nothing changed: no new resourceVersion.
    let same = api
        .apply_webhook_configuration("a", &config(vec![entry("base.x.dev", "QUJD")]), false)
        .expect("same");
    assert_eq!(
        same["metadata"]["resourceVersion"],
        emptied["metadata"]["resourceVersion"]
    );
    // A resourceVersion given is a precondition: another one is a conflict, even forced.
    let at = |version: &Value, ca: &str| {
        let mut c = config(vec![entry("base.x.dev", ca)]);
        c["metadata"]["resourceVersion"] = version.clone();
        c
    };
    let stale = api
        .apply_webhook_configuration("a", &at(&both["metadata"]["resourceVersion"], "QQ=="), true)
        .expect_err("stale");
    assert_eq!(
        (&stale["code"], &stale["reason"]),
        (&json!(409), &json!("Conflict"))
    );
    let current = api
        .apply_webhook_configuration("a", &at(&same["metadata"]["resourceVersion"], "QQ=="), true)
        .expect("current");
    assert_ne!(
        current["metadata"]["resourceVersion"],
        same["metadata"]["resourceVersion"]
    );
}

#[tokio::test]
async fn an_edit_landing_before_a_write_planned_without_it_is_kept() {
    let api = installed_api().await;
    api.create_lock("prod", "web", json!({}));
    let instance = Instance::start(&api);
    instance.named(LockKey::lock("prod", "web")).await;
    // The operator limits locking to lockable namespaces, in both base entries, and the edit
    // lands just before the instance's next write, which was planned without it.
    let stored = api.webhook_configuration(manifests::NAME).expect("stored");
    let lockable = json!({"key": "lockable", "operator": "In", "values": ["true"]});
    let mut base = stored["webhooks"].as_array().expect("entries").clone();
    for entry in &mut base {
        (entry["namespaceSelector"]["matchExpressions"].as_array_mut())
            .expect("requirements")
            .push(lockable.clone());
    }
    let edit = json!({"apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingWebhookConfiguration",
        "metadata": {"name": manifests::NAME}, "webhooks": base});
    api.edit_before_next_patch("kubectl-edit", edit);
    api.create_lock("staging", "db", json!({}));
    instance.named(LockKey::lock("staging", "db")).await;
    let stored = api.webhook_configuration(manifests::NAME).expect("stored");
    for entry in stored["webhooks"].as_array().expect("entries") {
        let requirements = &entry["namespaceSelector"]["matchExpressions"];
        let kept = (requirements.as_array().into_iter().flatten()).any(|r| r == &lockable);
        assert!(kept, "{} lost the edit: {requirements}", entry["name"]);
    }
    let conflicts = (instance.metrics.writes)
        .get_or_create(&OutcomeLabels {
            outcome: "conflict",
        })
        .get();
    assert_eq!(
        conflicts, 1,
        "the write planned without the edit was refused"
    );
}

#[tokio::test]
async fn an_edit_undoing_a_write_is_put_back_and_counted() {
    let api = installed_api().await;
    api.create_lock("prod", "web", json!({}));
    let instance = Instance::start(&api);
    instance.named(LockKey::lock("prod", "web")).await;
    let written = api.webhook_configuration(manifests::NAME).expect("stored");
    // `manifests cluster` applied again: the condition back to its starting point.
    let conditions = |c: &Value| c["webhooks"][0]["matchConditions"].clone();
    let theirs = installed();
    let stored = api
        .apply_webhook_configuration("kubectl", &theirs, true)
        .expect("applied");
    assert_eq!(conditions(&stored), conditions(&theirs));
    support::until(
        "the entries written again",
        || {
            api.webhook_configuration(manifests::NAME)
                .unwrap_or_default()
        },
        |c| conditions(c) == conditions(&written),
    )
    .await;
    // Put back what another writer changed: counted for the alert on writers fighting.
    support::until(
        "the undo counted",
        || instance.metrics.undone.get(),
        |n| *n == 1,
    )
    .await;
}

/// The registration's state for alerts: 1 once a write is confirmed, 0 while writes fail, 1
/// again once one goes through.
#[tokio::test]
async fn the_current_gauge_follows_confirmed_writes_and_failures() {
    let api = installed_api().await;
    api.create_lock("prod", "web", json!({}));
    let instance = Instance::start(&api);
    let labels = ConfigurationLabels {
        name: manifests::NAME.to_owned(),
    };
    let current = || instance.metrics.current.get_or_create(&labels).get();
    assert_eq!(current(), 0, "not confirmed yet");
    instance.named(LockKey::lock("prod", "web")).await;
    assert_eq!(current(), 1);
    api.fail_webhook_applies(3, 403);
    api.create_lock("prod", "db", json!({}));
    support::until("a refused write seen", current, |c| *c == 0).await;
    instance.named(LockKey::lock("prod", "db")).await;
    assert_eq!(current(), 1);
    let refused = (instance.metrics.writes)
        .get_or_create(&OutcomeLabels {
            outcome: "forbidden",
        })
        .get();
    assert_eq!(refused, 3);
}
