use super::*;
use crate::registration::{conditions, operations};
use k8s_openapi::api::admissionregistration::v1::RuleWithOperations;

fn example_ca() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/examples/example-ca.crt")
}

fn registration() -> Registration {
    Registration::new(
        DEFAULT_URL,
        &example_ca(),
        FailurePolicy::Fail,
        5,
        Identity::User(NAME.to_owned()),
    )
    .expect("valid registration")
}

#[test]
fn the_webhook_sends_what_the_decision_needs_and_nothing_it_must_not() {
    let reg = registration();
    let vwc = webhook_configuration(&reg, NAME);
    let hooks = vwc.webhooks.expect("webhooks");
    assert_eq!(hooks.len(), 2);
    let scopes: Vec<_> = hooks
        .iter()
        .map(|h| {
            h.rules.as_ref().expect("rules")[0]
                .scope
                .clone()
                .expect("scope")
        })
        .collect();
    assert_eq!(scopes, ["Namespaced", "Cluster"]);
    for hook in &hooks {
        assert!(
            hook.name.split('.').count() >= 3,
            "{} needs 3 DNS labels",
            hook.name
        );
        assert_eq!(hook.client_config.url.as_deref(), Some(DEFAULT_URL));
        assert!(
            hook.client_config.service.is_none(),
            "URL clientConfig only"
        );
        assert_eq!(
            hook.client_config.ca_bundle.as_ref().map(|b| b.0.clone()),
            Some(std::fs::read(example_ca()).expect("ca"))
        );
        assert_eq!(hook.admission_review_versions, ["v1"]);
        assert_eq!(
            hook.side_effects, "NoneOnDryRun",
            "events are not written for dry runs"
        );
        assert_eq!(hook.failure_policy.as_deref(), Some("Fail"));
        assert_eq!(hook.timeout_seconds, Some(5));
        let selector = hook
            .namespace_selector
            .as_ref()
            .expect("namespace selector");
        let excluded = &selector.match_expressions.as_ref().expect("expressions")[0];
        assert_eq!(excluded.operator, "NotIn");
        assert_eq!(
            excluded.values.as_deref(),
            Some(&["kube-system".to_owned(), "kube-node-lease".to_owned()][..])
        );
        let conditions: Vec<&str> = hook
            .match_conditions
            .iter()
            .flatten()
            .map(|c| c.expression.as_str())
            .collect();
        for needle in [
            "'objectlock.dev'",
            "'leases'",
            "'events'",
            "'system:nodes'",
            "'system:apiserver'",
        ] {
            assert!(
                conditions.iter().any(|c| c.contains(needle)),
                "no condition on {needle}"
            );
        }
        for rule in hook.rules.iter().flatten() {
            let ops = rule.operations.as_ref().expect("operations");
            let resources = rule.resources.as_ref().expect("resources");
            // Status writes are sent: what they carry besides the status counts.
            assert!(
                !resources
                    .iter()
                    .any(|r| r.ends_with("/status") && r != "*/status"),
                "status is sent for every resource alike"
            );
            assert!(!ops.iter().any(|o| o == "CONNECT" || o == "*"));
            if ops.iter().any(|o| o == "CREATE") {
                assert_eq!(resources, &["pods/eviction"], "the only CREATE is eviction");
            }
        }
    }
    let namespaced = &hooks[0].rules.as_ref().expect("rules")[0];
    assert_eq!(
        namespaced.resources.as_deref().expect("resources"),
        [
            "*",
            "*/status",
            "*/scale",
            "pods/ephemeralcontainers",
            "pods/resize"
        ]
    );
}

#[test]
fn rbac_reads_locks_writes_their_status_and_events_and_nothing_else() {
    let (role, binding) = rbac(&Identity::service_account("kol/webhook").expect("sa"));
    let rules: Vec<[String; 3]> = (role.rules.expect("rules").iter())
        .map(|r| {
            let join = |list: &Option<Vec<String>>| {
                list.iter().flatten().cloned().collect::<Vec<_>>().join(",")
            };
            [join(&r.api_groups), join(&r.resources), r.verbs.join(",")]
        })
        .collect();
    // Labels for selector locks and the field a custom resource's scale writes: get only.
    let expected = [
        ["objectlock.dev", "locks,clusterlocks", "get,list,watch"],
        [
            "objectlock.dev",
            "locks/status,clusterlocks/status",
            "patch",
        ],
        ["events.k8s.io", "events", "create,patch"],
        ["", "pods,replicationcontrollers", "get"],
        ["apps", "deployments,replicasets,statefulsets", "get"],
        ["apiextensions.k8s.io", "customresourcedefinitions", "get"],
    ];
    assert_eq!(rules, expected.map(|row| row.map(str::to_owned)));
    let subject = &binding.subjects.expect("subjects")[0];
    let subject = (
        subject.kind.as_str(),
        subject.namespace.as_deref(),
        subject.name.as_str(),
    );
    assert_eq!(subject, ("ServiceAccount", Some("kol"), "webhook"));
    assert!(Identity::service_account("no-slash").is_err());
    assert!(Identity::service_account("a/b/c").is_err());
}

#[test]
fn options_are_checked() {
    let ca = example_ca();
    let user = || Identity::User(NAME.into());
    let err = Registration::new(
        "http://127.0.0.1:8443/validate",
        &ca,
        FailurePolicy::Fail,
        5,
        user(),
    )
    .expect_err("http");
    assert!(err.to_string().starts_with("--url"), "{err}");
    let err = Registration::new(DEFAULT_URL, &ca, FailurePolicy::Fail, 31, user()).expect_err("31");
    assert!(err.to_string().contains("--timeout-seconds 31"), "{err}");
    let not_pem = tempfile::NamedTempFile::new().expect("temp");
    std::fs::write(not_pem.path(), "hello").expect("write");
    let err = Registration::new(DEFAULT_URL, not_pem.path(), FailurePolicy::Fail, 5, user())
        .expect_err("no pem");
    assert!(err.to_string().contains("no CERTIFICATE block"), "{err}");
    let ignore =
        Registration::new(DEFAULT_URL, &ca, FailurePolicy::Ignore, 10, user()).expect("ok");
    let vwc = webhook_configuration(&ignore, STATIC_NAME);
    assert_eq!(vwc.metadata.name.as_deref(), Some(STATIC_NAME));
    assert_eq!(
        vwc.webhooks.expect("hooks")[0].failure_policy.as_deref(),
        Some("Ignore")
    );
}

#[test]
fn the_api_server_kubeconfig_is_keyed_by_host_and_port() {
    let dir = tempfile::tempdir().expect("tempdir");
    crate::cli::certs::generate(&crate::cli::certs::CertsRequest {
        out: dir.path().to_owned(),
        sans: vec![],
        days: 1,
        ca_days: 1,
        force: false,
        client: true,
    })
    .expect("certs");
    let cert = dir.path().join("apiserver-client.crt");
    let key = dir.path().join("apiserver-client.key");
    let files = apiserver(
        DEFAULT_URL,
        &cert,
        &key,
        Path::new("/etc/kubernetes/kol"),
        None,
    )
    .expect("files");
    let config: serde_json::Value = serde_saphyr::from_str(&files.admission_config).expect("yaml");
    let webhook = &config["plugins"][0];
    assert_eq!(webhook["name"], "ValidatingAdmissionWebhook");
    assert_eq!(
        webhook["configuration"]["kubeConfigFile"],
        "/etc/kubernetes/kol/webhook-kubeconfig.yaml"
    );
    assert!(webhook["configuration"].get("staticManifestsDir").is_none());
    let kubeconfig: serde_json::Value = serde_saphyr::from_str(&files.kubeconfig).expect("yaml");
    assert_eq!(kubeconfig["users"][0]["name"], "127.0.0.1:8443");
    let data = kubeconfig["users"][0]["user"]["client-certificate-data"]
        .as_str()
        .expect("data");
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(data)
        .expect("base64");
    assert_eq!(decoded, std::fs::read(&cert).expect("cert"));

    let no_port = apiserver(
        "https://webhook.example.com/validate",
        &cert,
        &key,
        Path::new("/d"),
        Some(Path::new("/s")),
    )
    .expect("files");
    let kubeconfig: serde_json::Value = serde_saphyr::from_str(&no_port.kubeconfig).expect("yaml");
    assert_eq!(kubeconfig["users"][0]["name"], "webhook.example.com:443");
    let config: serde_json::Value =
        serde_saphyr::from_str(&no_port.admission_config).expect("yaml");
    assert_eq!(
        config["plugins"][0]["configuration"]["staticManifestsDir"],
        "/s"
    );

    let err = apiserver(DEFAULT_URL, &key, &key, Path::new("/d"), None).expect_err("key as cert");
    assert!(err.to_string().starts_with("--client-cert"), "{err}");

    let out = tempfile::tempdir().expect("tempdir");
    let written = write_apiserver(out.path(), &files).expect("written");
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(&written[1])
        .expect("meta")
        .permissions()
        .mode()
        & 0o777;
    assert_eq!(mode, 0o600, "the kubeconfig holds a private key");
}

/// The committed files under deploy/ are what the code generates.
#[test]
fn committed_manifests_match_the_code() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let regenerate = "regenerate with: cargo run -- crd > deploy/crds.yaml && cargo run -- manifests cluster --ca-file deploy/examples/example-ca.crt > deploy/cluster.example.yaml";
    let crds = std::fs::read_to_string(root.join("deploy/crds.yaml")).expect("deploy/crds.yaml");
    assert!(
        crds == api::crds_yaml().expect("yaml"),
        "deploy/crds.yaml is stale; {regenerate}"
    );
    let cluster_yaml = std::fs::read_to_string(root.join("deploy/cluster.example.yaml"))
        .expect("deploy/cluster.example.yaml");
    assert!(
        cluster_yaml == cluster(&registration()).expect("yaml"),
        "deploy/cluster.example.yaml is stale; {regenerate}"
    );
}

/// Every subresource the API server serves (1.33–1.36, from the REST storage maps of
/// `pkg/registry`, plus custom resources), with the operations that reach admission:
/// `group resource subresource scope operations` (`-` for none). Reads (`pods/log`) never do.
const API_SERVER_SUBRESOURCES: &str = "
    - pods status ns UPDATE
    - pods ephemeralcontainers ns UPDATE
    - pods resize ns UPDATE
    - pods eviction ns CREATE
    - pods binding ns CREATE
    - pods exec ns CONNECT
    - pods attach ns CONNECT
    - pods portforward ns CONNECT
    - pods proxy ns CONNECT
    - replicationcontrollers status ns UPDATE
    - replicationcontrollers scale ns UPDATE
    - serviceaccounts token ns CREATE
    - services status ns UPDATE
    - services proxy ns CONNECT
    - persistentvolumeclaims status ns UPDATE
    - resourcequotas status ns UPDATE
    - nodes status cluster UPDATE
    - nodes proxy cluster CONNECT
    - persistentvolumes status cluster UPDATE
    - namespaces status cluster UPDATE
    - namespaces finalize cluster UPDATE
    apps deployments status ns UPDATE
    apps deployments scale ns UPDATE
    apps statefulsets status ns UPDATE
    apps statefulsets scale ns UPDATE
    apps replicasets status ns UPDATE
    apps replicasets scale ns UPDATE
    apps daemonsets status ns UPDATE
    autoscaling horizontalpodautoscalers status ns UPDATE
    batch jobs status ns UPDATE
    batch cronjobs status ns UPDATE
    policy poddisruptionbudgets status ns UPDATE
    networking.k8s.io ingresses status ns UPDATE
    resource.k8s.io resourceclaims status ns UPDATE
    certificates.k8s.io certificatesigningrequests status cluster UPDATE
    certificates.k8s.io certificatesigningrequests approval cluster UPDATE
    apiextensions.k8s.io customresourcedefinitions status cluster UPDATE
    apiregistration.k8s.io apiservices status cluster UPDATE
    storage.k8s.io volumeattachments status cluster UPDATE
    demo.example.com widgets status ns UPDATE
    demo.example.com widgets scale ns UPDATE
    demo.example.com clusterwidgets scale cluster UPDATE
    - configmaps - ns CREATE,UPDATE,DELETE
    apps deployments - ns CREATE,UPDATE,DELETE
    - namespaces - cluster CREATE,UPDATE,DELETE
    rbac.authorization.k8s.io clusterroles - cluster CREATE,UPDATE,DELETE
";

/// Whether a webhook rule matches, as the API server matches it.
fn rule_matches(
    rule: &RuleWithOperations,
    operation: &str,
    group: &str,
    resource: &str,
    subresource: &str,
    namespaced: bool,
) -> bool {
    let has = |list: &Option<Vec<String>>, value: &str| {
        list.iter().flatten().any(|v| v == "*" || v == value)
    };
    let resource_matches = rule.resources.iter().flatten().any(|r| {
        let (r_resource, r_sub) = r.split_once('/').unwrap_or((r, ""));
        let resource_ok = r_resource == "*" || r_resource == resource;
        let sub_ok = if subresource.is_empty() {
            r_sub.is_empty()
        } else {
            r_sub == "*" || r_sub == subresource
        };
        resource_ok && sub_ok
    });
    let scope_ok = match rule.scope.as_deref() {
        Some("Namespaced") => namespaced,
        Some("Cluster") => !namespaced,
        _ => true,
    };
    has(&rule.operations, operation)
        && has(&rule.api_groups, group)
        && has(&rule.api_versions, "v1")
        && resource_matches
        && scope_ok
}

/// The decision locks exactly what the registration sends: every subresource the decision
/// would look a lock up for is registered, and nothing else is.
#[test]
fn the_registration_sends_every_subresource_the_decision_locks() {
    use crate::admission::AdmissionRequest;
    use crate::admission::decide::{Triage, triage};
    let vwc = webhook_configuration(&registration(), NAME);
    let mut hooks = vwc.webhooks.expect("webhooks");
    // CREATE and CONNECT are sent by the entries the instances add while Locks ask for them.
    let asking = |namespace: Option<&str>| {
        let spec: crate::api::LockSpec =
            serde_json::from_value(serde_json::json!({"operations": ["CREATE", "CONNECT"]}))
                .expect("spec");
        match namespace {
            Some(ns) => crate::locks::LockRef::lock(ns, "x", spec),
            None => crate::locks::LockRef::cluster_lock("x", spec),
        }
    };
    let locks = [asking(Some("ns")), asking(None)];
    let now = k8s_openapi::jiff::Timestamp::UNIX_EPOCH;
    let asked = operations::plan(&locks, now, &conditions::NarrowingBounds::default());
    hooks.extend(operations::webhooks(&hooks, &asked).expect("entries"));
    let mut drift = Vec::new();
    for row in API_SERVER_SUBRESOURCES
        .lines()
        .filter(|l| !l.trim().is_empty())
    {
        let words: Vec<&str> = row
            .split_whitespace()
            .map(|w| if w == "-" { "" } else { w })
            .collect();
        let [group, resource, subresource, scope, operations] = words[..] else {
            panic!("{row}")
        };
        let namespaced = scope == "ns";
        for operation in operations.split(',') {
            let name = if resource == "namespaces" { "ns" } else { "x" };
            let request = AdmissionRequest::from_json(serde_json::json!({
                "uid": "u",
                "resource": {"group": group, "version": "v1", "resource": resource},
                "subResource": subresource,
                "name": name,
                "namespace": if namespaced || resource == "namespaces" { Some("ns") } else { None },
                "operation": operation,
                "userInfo": {"username": "alice"},
                "oldObject": (operation != "CREATE").then(|| serde_json::json!({"metadata": {"name": name}})),
            }))
            .expect("request");
            let locked = matches!(triage(&request), Triage::Lookup(_));
            let registered = hooks.iter().any(|hook| {
                hook.rules.iter().flatten().any(|rule| {
                    rule_matches(rule, operation, group, resource, subresource, namespaced)
                })
            });
            if locked != registered {
                drift.push(format!(
                    "{operation} {group}/{resource}/{subresource}: locked {locked}, registered {registered}"
                ));
            }
        }
    }
    assert!(
        drift.is_empty(),
        "decision and registration differ:\n{}",
        drift.join("\n")
    );
}

#[test]
fn the_lock_policy_checks_every_subresource_the_decision_locks() {
    let policy = policy::policy();
    let variables = policy["spec"]["variables"].as_array().expect("variables");
    let needed = variables
        .iter()
        .find(|v| v["name"] == "needed")
        .and_then(|v| v["expression"].as_str())
        .expect("the needed variable");
    // A status write is refused only for what an UPDATE of the object would change, which
    // the UPDATE rights cover.
    for sub in subresources::CHANGING.iter().filter(|s| s.name != "status") {
        assert!(
            needed.contains(&format!("'{}']", sub.name)),
            "{} is locked but its right is not checked: {needed}",
            sub.path()
        );
    }
    // Evictions delete pods without a DELETE.
    assert!(needed.contains("['create', string(p[0]), string(p[1]), 'eviction']"));

    // The lock resources, never their status (the webhook's own writes).
    let rules = &policy["spec"]["matchConstraints"]["resourceRules"][0];
    assert_eq!(rules["apiGroups"], json!([api::GROUP]));
    assert_eq!(rules["resources"], json!([api::LOCKS, api::CLUSTER_LOCKS]));
    let may_unlock = variables.iter().find(|v| v["name"] == "mayUnlock");
    let may_unlock = may_unlock
        .and_then(|v| v["expression"].as_str())
        .expect("mayUnlock");
    assert!(may_unlock.contains(&format!("check('{}')", policy::UNLOCK_VERB)));
    assert_eq!(rules["operations"], json!(["CREATE", "UPDATE", "DELETE"]));
    assert_eq!(policy["spec"]["failurePolicy"], "Fail");

    // One authorizer check per expression, each on its own entry of `needed`.
    let validations = policy["spec"]["validations"]
        .as_array()
        .expect("validations");
    let checks: Vec<&str> = validations
        .iter()
        .filter_map(|v| v["expression"].as_str())
        .filter(|e| e.contains("authorizer"))
        .collect();
    for (i, expression) in checks.iter().enumerate().take(checks.len() - 1) {
        assert_eq!(expression.matches(".check(").count(), 1, "{expression}");
        assert!(
            expression.contains(&format!("variables.needed[{i}]")),
            "{expression}"
        );
    }
    // Every refusal is a 403 with a message of its own.
    for v in validations {
        assert_eq!(v["reason"], "Forbidden", "{v}");
        assert!(v["messageExpression"].is_string(), "{v}");
    }

    let binding = policy::binding();
    assert_eq!(binding["spec"]["policyName"], policy["metadata"]["name"]);
    assert_eq!(binding["spec"]["validationActions"], json!(["Deny"]));
}

#[test]
fn manifests_cluster_carries_the_lock_policy_and_an_unbound_unlock_role() {
    let yaml = cluster(&registration()).expect("yaml");
    assert!(yaml.contains("kind: ValidatingAdmissionPolicy\n"));
    assert!(yaml.contains("kind: ValidatingAdmissionPolicyBinding\n"));
    assert!(yaml.contains(&format!("name: {}\n", policy::UNLOCK_ROLE)));
    // The unlock role is not bound by the manifests: only the webhook's role is.
    assert_eq!(yaml.matches("kind: ClusterRoleBinding\n").count(), 1);
    let role = policy::unlock_role();
    assert_eq!(
        role["rules"][0]["verbs"],
        json!(["get", "list", "delete", policy::UNLOCK_VERB])
    );
}

#[test]
fn the_namespace_selector_reaches_every_entry() {
    use crate::registration::{NAMESPACED_ENTRY, NamespaceSelection};
    let reg = registration()
        .with_namespace_selector("lockable=true,tier notin (dev)")
        .expect("valid");
    for config in [
        webhook_configuration(&reg, NAME),
        webhook_configuration(&reg, STATIC_NAME),
    ] {
        let entries = config.webhooks.expect("entries");
        let selection = NamespaceSelection::of(&entries);
        assert_eq!(selection.locks, reg.namespaces, "the namespaced entry");
        assert_eq!(
            selection.namespaces, reg.namespaces,
            "the cluster-scoped entry"
        );
        for entry in &entries {
            let selector = entry.namespace_selector.as_ref().expect("selector");
            let excluded = &selector.match_expressions.as_ref().expect("expressions")[0];
            assert_eq!(
                (excluded.operator.as_str(), excluded.values.as_deref()),
                (
                    "NotIn",
                    Some(&["kube-system".to_owned(), "kube-node-lease".to_owned()][..])
                ),
                "the exclusions stay"
            );
        }
    }
    // Narrowed: the starting point keeps them, and the identity may watch namespaces' labels.
    let yaml = cluster(&reg).expect("yaml");
    assert_eq!(yaml.matches("lockable: \"true\"").count(), 2, "{yaml}");
    let watch_namespaces = "  resources:\n  - namespaces\n  verbs:\n  - list\n  - watch\n";
    assert!(yaml.contains(watch_namespaces), "{yaml}");
    // Broad: no instance keeps the configuration, so none reads the requirements back.
    let broad = cluster_broad(&reg).expect("yaml");
    assert_eq!(broad.matches("lockable: \"true\"").count(), 2, "{broad}");
    assert!(!broad.contains(watch_namespaces), "{broad}");
    let start = crate::registration::starting_point(
        webhook_configuration(&reg, NAME)
            .webhooks
            .as_deref()
            .expect("entries"),
    )
    .expect("entries");
    assert_eq!(start[0].name, NAMESPACED_ENTRY);
    assert_eq!(NamespaceSelection::of(&start).locks, reg.namespaces);
}
