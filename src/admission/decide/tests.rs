//! The decision table: one row per rule, including the traps the API server sets.
#![allow(clippy::cloned_ref_to_slice_refs)] // `&[lock.clone()]` reads best in a table

use super::*;
use crate::api::LockSpec;
use crate::locks::LockRef;
use k8s_openapi::jiff::Timestamp;
use serde_json::{Value, json};

/// A request as the API server would send it; `patch` overrides fields of a DELETE of
/// ConfigMap `app-config` in `prod`.
fn request(patch: Value) -> AdmissionRequest<'static> {
    let mut base = json!({
        "uid": "u-1",
        "kind": {"group": "", "version": "v1", "kind": "ConfigMap"},
        "resource": {"group": "", "version": "v1", "resource": "configmaps"},
        "name": "app-config",
        "namespace": "prod",
        "operation": "DELETE",
        "userInfo": {"username": "alice", "groups": ["dev"]},
        "object": null,
        "oldObject": {"metadata": {"name": "app-config", "namespace": "prod"}},
    });
    let map = base.as_object_mut().expect("object");
    for (k, v) in patch.as_object().expect("patch is an object") {
        if v.is_null() && k != "object" && k != "oldObject" {
            map.remove(k);
        } else {
            map.insert(k.clone(), v.clone());
        }
    }
    AdmissionRequest::from_json(base).expect("valid request")
}

fn reason(text: &str) -> LockSpec {
    LockSpec {
        reason: Some(text.to_owned()),
        ..LockSpec::default()
    }
}

/// The decision's clock in these tests.
fn now() -> Timestamp {
    "2026-11-22T12:00:00Z".parse().expect("timestamp")
}

fn locks(list: &[LockRef]) -> LockSet {
    list.iter().cloned().collect()
}

/// Plans, looks the locks up in `namespaced` / `cluster`, decides.
fn run(
    req: &AdmissionRequest,
    namespaced: &[LockRef],
    cluster: &[LockRef],
) -> Result<Verdict, Exempt> {
    let lookup = match triage(req) {
        Triage::Allow(why) => return Err(why),
        Triage::Lookup(lookup) => lookup,
    };
    let ns_set: LockSet = namespaced
        .iter()
        .filter(|l| l.namespace.as_deref() == Some(lookup.scope))
        .cloned()
        .collect();
    let scope_set = if lookup.scope.is_empty() {
        locks(cluster)
    } else {
        ns_set
    };
    let contents: Option<LockSet> = lookup.contents_of.map(|ns| {
        namespaced
            .iter()
            .filter(|l| l.namespace.as_deref() == Some(ns))
            .cloned()
            .collect()
    });
    Ok(decide(
        req,
        &lookup,
        &scope_set,
        contents.as_ref(),
        None,
        &Objects::unknown(),
        now(),
    ))
}

/// Plans and decides an UPDATE whose objects are `old` and `new`, in the locks of `prod`.
fn run_update(req: &AdmissionRequest, namespaced: &[LockRef], old: Value, new: Value) -> Verdict {
    let Triage::Lookup(lookup) = triage(req) else {
        panic!("needs a lookup")
    };
    let objects = Objects::from_values(old, new);
    decide(
        req,
        &lookup,
        &locks(namespaced),
        None,
        None,
        &objects,
        now(),
    )
}

/// [`run`] of a namespaced object, in the locks `namespaced`.
fn decided(req: &AdmissionRequest, namespaced: &[LockRef]) -> Verdict {
    run(req, namespaced, &[]).expect("lookup")
}

fn allows(req: &AdmissionRequest, namespaced: &[LockRef]) -> bool {
    decided(req, namespaced).allowed()
}

/// The refusal's message.
fn refused(req: &AdmissionRequest, namespaced: &[LockRef]) -> String {
    decided(req, namespaced).refusal.expect("refused").message
}

fn prod_lock() -> LockRef {
    LockRef::lock("prod", "app-config", reason("VM snapshot in progress"))
}

#[test]
fn rule_1_update_and_delete_of_a_locked_object_are_denied_with_403() {
    for op in ["UPDATE", "DELETE"] {
        let req = request(json!({"operation": op, "object": {"metadata": {"name": "app-config"}}}));
        let verdict = run(&req, &[prod_lock()], &[]).expect("needs a lookup");
        let refusal = verdict.refusal.as_ref().expect("denied");
        assert_eq!(refusal.code, 403);
        assert_eq!(refusal.reason, "Forbidden");
        assert_eq!(
            refusal.message,
            "configmaps \"app-config\" in namespace \"prod\" is locked by Lock prod/app-config: VM snapshot in progress (to unlock: kubectl delete lock app-config -n prod)"
        );
        assert_eq!(verdict.outcome, Outcome::Denied);
        assert_eq!(
            verdict.audit_annotations.get("lock").map(String::as_str),
            Some("Lock prod/app-config")
        );
    }
}

#[test]
fn rule_1_a_lock_without_reason_still_locks() {
    let req = request(json!({}));
    let lock = LockRef::lock("prod", "app-config", LockSpec::default());
    assert_eq!(
        refused(&req, &[lock]),
        "configmaps \"app-config\" in namespace \"prod\" is locked by Lock prod/app-config (to unlock: kubectl delete lock app-config -n prod)"
    );
}

#[test]
fn rule_1_unlocked_objects_and_other_namespaces_are_allowed() {
    let free = request(json!({"name": "free-a"}));
    assert!(allows(&free, &[prod_lock()]));
    let other_ns = request(json!({"namespace": "staging"}));
    assert!(allows(&other_ns, &[prod_lock()]));
    // A ClusterLock of the same name does not lock a namespaced object.
    let cluster = LockRef::cluster_lock("app-config", LockSpec::default());
    assert!(
        run(&request(json!({})), &[], &[cluster])
            .expect("lookup")
            .allowed()
    );
}

#[test]
fn rule_1_cluster_scoped_objects_are_locked_by_cluster_locks() {
    let req = request(json!({
        "resource": {"group": "rbac.authorization.k8s.io", "version": "v1", "resource": "clusterroles"},
        "name": "reader", "namespace": null, "operation": "UPDATE",
    }));
    // Looked up among ClusterLocks: a Lock of the same name in a namespace does not count.
    assert_eq!(
        triage(&req),
        Triage::Lookup(Lookup {
            scope: "",
            name: "reader",
            contents_of: None
        })
    );
    let namespaced = LockRef::lock("prod", "reader", LockSpec::default());
    assert!(allows(&req, &[namespaced]));
    let verdict = run(
        &req,
        &[],
        &[LockRef::cluster_lock("reader", reason("audit"))],
    )
    .expect("lookup");
    assert_eq!(
        verdict.refusal.expect("denied").message,
        "clusterroles.rbac.authorization.k8s.io \"reader\" is locked by ClusterLock reader: audit (to unlock: kubectl delete clusterlock reader)"
    );
}

/// A CREATE of ConfigMap `name` in `prod`, with `labels`.
fn create(name: &str, labels: Value) -> AdmissionRequest<'static> {
    request(json!({
        "operation": "CREATE", "name": name, "oldObject": null,
        "object": {"metadata": {"name": name, "namespace": "prod", "labels": labels}},
    }))
}

/// A CONNECT to `subresource` of pod `name` in `prod`; its object is the options, not the pod.
fn connect(name: &str, subresource: &str) -> AdmissionRequest<'static> {
    request(json!({
        "operation": "CONNECT", "name": name, "subResource": subresource,
        "resource": {"group": "", "version": "v1", "resource": "pods"},
        "kind": {"group": "", "version": "v1", "kind": "PodExecOptions"},
        "object": {"kind": "PodExecOptions", "metadata": {}}, "oldObject": null,
    }))
}

#[test]
fn rule_2_create_is_refused_by_a_lock_asking_for_it() {
    let reserve = lock(
        "app-config",
        json!({"operations": ["CREATE"], "reason": "reserved"}),
    );
    assert_eq!(
        refused(&create("app-config", json!({})), &[reserve.clone()]),
        "cannot create: configmaps \"app-config\" in namespace \"prod\" is locked by Lock prod/app-config: reserved (to unlock: kubectl delete lock app-config -n prod)"
    );
    // The default lock (UPDATE and DELETE) lets the name be created: a StatefulSet recreates
    // its pods under their old names.
    let verdict = decided(&create("app-config", json!({})), &[prod_lock()]);
    assert_eq!(verdict, Verdict::allow());
    // Another name, and a CREATE-only lock against an UPDATE or a DELETE.
    assert!(allows(&create("other", json!({})), &[reserve.clone()]));
    assert!(allows(&update(json!({})), &[reserve.clone()]));
    assert!(allows(&request(json!({})), &[reserve.clone()]));
    // generateName: no name yet, nothing a lock can name.
    let generated = request(json!({
        "operation": "CREATE", "name": null, "oldObject": null,
        "object": {"metadata": {"generateName": "app-config-", "namespace": "prod"}},
    }));
    assert_eq!(triage(&generated), Triage::Allow(Exempt::Unnamed));
    // Other subresource creates (a token request) create nothing of a lock's name.
    let token = request(json!({
        "operation": "CREATE", "subResource": "token", "name": "app-config",
        "resource": {"group": "", "version": "v1", "resource": "serviceaccounts"},
    }));
    assert_eq!(triage(&token), Triage::Allow(Exempt::Create));
    // Warn mode warns; the resources still decide.
    let warn = lock(
        "app-config",
        json!({"operations": ["CREATE"], "mode": "Warn"}),
    );
    let verdict = decided(&create("app-config", json!({})), &[warn]);
    assert!(verdict.allowed());
    assert_eq!(verdict.outcome, Outcome::Warned);
    let deployments = lock(
        "app-config",
        json!({"operations": ["CREATE"], "resources": [{"apiGroups": ["apps"], "resources": ["deployments"]}]}),
    );
    assert!(allows(&create("app-config", json!({})), &[deployments]));
}

#[test]
fn rule_2_a_selector_lock_asking_create_refuses_objects_created_with_its_labels() {
    let dbs = lock(
        "dbs",
        json!({"operations": ["CREATE"], "selector": {"matchLabels": {"app": "db"}}}),
    );
    let verdict = decided(&create("db-7", json!({"app": "db"})), &[dbs.clone()]);
    assert_eq!(verdict.locks, [LockKey::lock("prod", "dbs")]);
    assert!(allows(&create("web-7", json!({"app": "web"})), &[dbs]));
}

#[test]
fn rule_2_a_cluster_lock_asking_create_reserves_a_cluster_scoped_name() {
    let req = request(json!({
        "operation": "CREATE", "name": "team-a", "namespace": "team-a", "oldObject": null,
        "resource": {"group": "", "version": "v1", "resource": "namespaces"},
        "object": {"metadata": {"name": "team-a"}},
    }));
    let reserve = LockRef::cluster_lock("team-a", spec(json!({"operations": ["CREATE"]})));
    let verdict = run(&req, &[], &[reserve]).expect("lookup");
    assert_eq!(
        verdict.refusal.expect("denied").message,
        "cannot create: namespaces \"team-a\" is locked by ClusterLock team-a (to unlock: kubectl delete clusterlock team-a)"
    );
}

#[test]
fn rule_2_connect_to_a_pod_is_refused_by_a_lock_asking_for_it() {
    let guard = lock(
        "db-0",
        json!({"operations": ["CONNECT"], "reason": "VM snapshot"}),
    );
    for (sub, verb) in [
        ("exec", "exec"),
        ("attach", "attach"),
        ("portforward", "port-forward"),
        ("proxy", "proxy"),
    ] {
        assert_eq!(
            refused(&connect("db-0", sub), &[guard.clone()]),
            format!(
                "cannot {verb}: pods \"db-0\" in namespace \"prod\" is locked by Lock prod/db-0: VM snapshot (to unlock: kubectl delete lock db-0 -n prod)"
            )
        );
    }
    // Another pod; the default lock; a CONNECT-only lock against a DELETE.
    assert!(allows(&connect("db-1", "exec"), &[guard.clone()]));
    let default = lock("db-0", json!({}));
    assert!(allows(&connect("db-0", "exec"), &[default]));
    let delete = request(
        json!({"name": "db-0", "resource": {"group": "", "version": "v1", "resource": "pods"}}),
    );
    assert!(allows(&delete, &[guard.clone()]));
    // A lock on pods' subresources names them like RBAC: `pods` covers exec; `pods/exec` only it.
    let exec_only = lock(
        "db-0",
        json!({"operations": ["CONNECT"], "resources": [{"apiGroups": [""], "resources": ["pods/exec"]}]}),
    );
    assert!(!allows(&connect("db-0", "exec"), &[exec_only.clone()]));
    assert!(allows(&connect("db-0", "attach"), &[exec_only]));
    // A Service's or a Node's proxy reaches no locked pod.
    for resource in ["services", "nodes"] {
        let proxy = request(json!({
            "operation": "CONNECT", "name": "db-0", "subResource": "proxy",
            "resource": {"group": "", "version": "v1", "resource": resource},
        }));
        assert_eq!(triage(&proxy), Triage::Allow(Exempt::Connect), "{resource}");
    }
}

#[test]
fn rule_2_a_selector_lock_asking_connect_selects_by_the_pods_labels_read() {
    let dbs = lock(
        "dbs",
        json!({"operations": ["CONNECT"], "selector": {"matchLabels": {"app": "db"}}}),
    );
    let (target, verdict) = run_reading(
        &connect("db-0", "exec"),
        &[dbs.clone()],
        app("db"),
        OnLookupError::Deny,
    );
    assert_eq!(
        target.as_deref(),
        Some("pods \"db-0\" in namespace \"prod\"")
    );
    assert!(
        verdict
            .refusal
            .expect("denied")
            .message
            .starts_with("cannot exec: pods \"db-0\"")
    );
    let (_, verdict) = run_reading(
        &connect("web-0", "exec"),
        &[dbs.clone()],
        app("web"),
        OnLookupError::Deny,
    );
    assert_eq!(verdict, Verdict::allow());
    // A default selector lock does not make an exec read anything.
    let (target, _) = run_reading(
        &connect("db-0", "exec"),
        &[lock(
            "dbs",
            json!({"selector": {"matchLabels": {"app": "db"}}}),
        )],
        app("db"),
        OnLookupError::Deny,
    );
    assert_eq!(target, None);
}

#[test]
fn rule_2_a_proxy_name_with_a_scheme_or_a_port_is_the_pod_it_names() {
    let guard = lock("db-0", json!({"operations": ["CONNECT"]}));
    for name in ["db-0:8080", "http:db-0:8080", "https:db-0:", "db-0:metrics"] {
        let verdict = decided(&connect(name, "proxy"), &[guard.clone()]);
        assert!(
            verdict
                .refusal
                .expect(name)
                .message
                .starts_with("cannot proxy: pods \"db-0\" in namespace \"prod\" is locked"),
            "{name}"
        );
    }
    // The API server refuses these names itself (400), after admission: they name no pod.
    for name in ["ftp:db-0:21", "a:db-0:1:2", "db-1:8080"] {
        assert!(allows(&connect(name, "proxy"), &[guard.clone()]), "{name}");
    }
    // exec, attach and port-forward take the name as written.
    assert!(allows(&connect("db-0:8080", "exec"), &[guard.clone()]));
    // A selector lock reads the labels of the pod the name names.
    let dbs = lock(
        "dbs",
        json!({"operations": ["CONNECT"], "selector": {"matchLabels": {"app": "db"}}}),
    );
    let (target, verdict) = run_reading(
        &connect("http:db-0:8080", "proxy"),
        &[dbs],
        app("db"),
        OnLookupError::Deny,
    );
    assert_eq!(
        target.as_deref(),
        Some("pods \"db-0\" in namespace \"prod\"")
    );
    assert!(!verdict.allowed());
}

#[test]
fn text_a_lock_supplies_is_escaped_in_refusals_and_warnings() {
    // A lock file (or a Lock older than the CRD's rule) may carry control characters.
    let ansi = "snapshot\u{1b}[2K\r\u{1b}[1Aconfigmap \"ansi\" deleted";
    let refused = decided(
        &request(json!({})),
        &[lock("app-config", json!({"reason": ansi}))],
    );
    let message = refused.refusal.expect("refused").message;
    assert!(
        message.contains(
            "Lock prod/app-config: snapshot\\u{1b}[2K\\r\\u{1b}[1Aconfigmap \"ansi\" deleted (to unlock"
        ),
        "{message}"
    );
    assert!(!message.contains('\u{1b}') && !message.contains('\r'));
    let warned = decided(
        &request(json!({})),
        &[lock("app-config", json!({"mode": "Warn", "reason": ansi}))],
    );
    assert!(
        warned
            .warnings
            .iter()
            .all(|w| !w.chars().any(char::is_control)),
        "{:?}",
        warned.warnings
    );
}

#[test]
fn rule_3_deletecollection_items_take_the_name_from_old_object() {
    let req = request(json!({"name": null, "oldObject": {"metadata": {"name": "app-config"}}}));
    assert_eq!(
        triage(&req),
        Triage::Lookup(Lookup {
            scope: "prod",
            name: "app-config",
            contents_of: None
        })
    );
    assert!(!allows(&req, &[prod_lock()]));
    let empty_name =
        request(json!({"name": "", "oldObject": {"metadata": {"name": "app-config"}}}));
    assert!(!allows(&empty_name, &[prod_lock()]));
}

#[test]
fn rule_3_a_request_naming_nothing_is_allowed_without_lookup() {
    let req = request(json!({"name": null, "oldObject": {"metadata": {}}}));
    assert_eq!(triage(&req), Triage::Allow(Exempt::Unnamed));
}

#[test]
fn rule_4_eviction_of_a_locked_pod_is_denied() {
    let req = request(json!({
        "operation": "CREATE", "subResource": "eviction", "name": "evict-me",
        "resource": {"group": "", "version": "v1", "resource": "pods"},
        "object": {"metadata": {"name": "evict-me", "namespace": "prod"}}, "oldObject": null,
    }));
    let lock = LockRef::lock("prod", "evict-me", reason("draining later"));
    let verdict = run(&req, &[lock], &[]).expect("eviction needs a lookup");
    assert_eq!(
        verdict.refusal.expect("denied").message,
        "cannot evict: pods \"evict-me\" in namespace \"prod\" is locked by Lock prod/evict-me: draining later (to unlock: kubectl delete lock evict-me -n prod)"
    );
    assert!(allows(&req, &[]));
}

#[test]
fn rule_4_only_pod_eviction_creates_are_looked_up() {
    // A CREATE of another subresource (a token request) is a plain create.
    let req = request(json!({
        "operation": "CREATE", "subResource": "token",
        "resource": {"group": "", "version": "v1", "resource": "serviceaccounts"},
    }));
    assert_eq!(triage(&req), Triage::Allow(Exempt::Create));
}

#[test]
fn rule_5_status_writes_may_change_the_status_only_other_subresources_are_locked() {
    let status = request(json!({"operation": "UPDATE", "subResource": "status",
        "resource": {"group": "", "version": "v1", "resource": "pods"}}));
    assert!(matches!(triage(&status), Triage::Lookup(_)));
    let old = json!({"metadata": {"name": "app-config", "resourceVersion": "1"},
                     "status": {"phase": "Running"}});
    let with = |f: &dyn Fn(&mut Value)| {
        let mut new = old.clone();
        new["metadata"]["resourceVersion"] = json!("2");
        f(&mut new);
        new
    };
    // (new object, the field named, or None when allowed)
    let cases = [
        (with(&|v| v["status"]["phase"] = json!("Failed")), None),
        (with(&|_| {}), None),
        (
            with(&|v| v["metadata"]["labels"] = json!({"a": "b"})),
            Some("metadata.labels"),
        ),
        (
            with(&|v| v["metadata"]["annotations"] = json!({"a": "b"})),
            Some("metadata.annotations"),
        ),
        (
            with(&|v| v["metadata"]["finalizers"] = json!(["x"])),
            Some("metadata.finalizers"),
        ),
        (
            with(&|v| v["metadata"]["ownerReferences"] = json!([{"name": "o"}])),
            Some("metadata.ownerReferences"),
        ),
    ];
    for (new, named) in cases {
        let verdict = run_update(&status, &[prod_lock()], old.clone(), new.clone());
        match named {
            None => assert_eq!(verdict.outcome, Outcome::Allowed, "{new}"),
            Some(field) => assert_eq!(
                verdict.refusal.expect("refused").message,
                format!(
                    "pods \"app-config\" in namespace \"prod\" is locked by Lock prod/app-config ({field} changed): VM snapshot in progress (to unlock: kubectl delete lock app-config -n prod)"
                ),
                "{new}"
            ),
        }
    }
    // A selector lock: relabelling a pod out of it through status is refused (labels from
    // before the change select it).
    let selected = lock(
        "freeze",
        json!({"selector": {"matchLabels": {"app": "web"}}}),
    );
    let labelled = json!({"metadata": {"name": "app-config", "labels": {"app": "web"}}});
    let relabel = request(json!({"operation": "UPDATE", "subResource": "status",
        "resource": {"group": "", "version": "v1", "resource": "pods"},
        "oldObject": labelled.clone()}));
    let away = json!({"metadata": {"name": "app-config", "labels": {"app": "gone"}}});
    assert!(!run_update(&relabel, &[selected.clone()], labelled.clone(), away).allowed());
    let reported = json!({"metadata": {"name": "app-config", "labels": {"app": "web"}},
                          "status": {"phase": "Running"}});
    assert!(run_update(&relabel, &[selected], labelled, reported).allowed());
    for sub in ["scale", "ephemeralcontainers", "resize"] {
        let req = request(json!({
            "operation": "UPDATE", "subResource": sub,
            "object": {"metadata": {}}, "oldObject": {"metadata": {}},
        }));
        assert!(!allows(&req, &[prod_lock()]), "{sub} should be locked");
    }
}

#[test]
fn rule_6_locks_themselves_are_never_locked() {
    for resource in ["locks", "clusterlocks"] {
        for op in ["UPDATE", "DELETE"] {
            let req = request(json!({
                "operation": op,
                "resource": {"group": "objectlock.dev", "version": "v1alpha1", "resource": resource},
            }));
            assert_eq!(triage(&req), Triage::Allow(Exempt::LockResource));
        }
    }
    // Same plural in another group is an ordinary resource.
    let other = request(json!({
        "resource": {"group": "example.com", "version": "v1", "resource": "locks"},
    }));
    assert!(matches!(triage(&other), Triage::Lookup(_)));
}

#[test]
fn rule_7_a_terminating_object_may_only_lose_finalizers() {
    let gone = "2026-11-22T02:00:09Z";
    let req = request(json!({
        "operation": "UPDATE",
        "object": {"metadata": {"name": "app-config", "deletionTimestamp": gone}},
        "oldObject": {"metadata": {"name": "app-config", "deletionTimestamp": gone}},
    }));
    let old = json!({"metadata": {"name": "app-config", "deletionTimestamp": gone,
                                  "finalizers": ["a", "b"], "resourceVersion": "1"},
                     "data": {"k": "v"}});
    let with = |f: &dyn Fn(&mut Value)| {
        let mut new = old.clone();
        new["metadata"]["resourceVersion"] = json!("2");
        f(&mut new);
        new
    };
    let update_only = lock(
        "app-config",
        json!({"operations": ["UPDATE"], "reason": "freeze"}),
    );
    for locks in [vec![prod_lock()], vec![update_only]] {
        // Finalizer removal: allowed, nothing to warn about.
        for new in [
            with(&|v| v["metadata"]["finalizers"] = json!(["b"])),
            with(&|v| v["metadata"]["finalizers"] = json!(null)),
        ] {
            let verdict = run_update(&req, &locks, old.clone(), new);
            assert_eq!(verdict.outcome, Outcome::Allowed);
        }
        // Anything else is refused, the field named.
        for (new, field) in [
            (with(&|v| v["data"]["k"] = json!("w")), "data"),
            (
                with(&|v| {
                    v["metadata"]["finalizers"] = json!(["a"]);
                    v["metadata"]["labels"] = json!({"x": "y"});
                }),
                "metadata.finalizers",
            ),
        ] {
            let verdict = run_update(&req, &locks, old.clone(), new);
            let message = verdict.refusal.expect("refused").message;
            assert!(message.contains(&format!("({field} changed)")), "{message}");
        }
    }
    // Without the objects the change is unknown: refused.
    assert!(!allows(&req, &[prod_lock()]));
    // Not locked: allowed.
    assert_eq!(decided(&req, &[]).outcome, Outcome::Allowed);
    // A DELETE of a terminating object is still a DELETE.
    let delete = request(json!({
        "oldObject": {"metadata": {"name": "app-config", "deletionTimestamp": gone}},
    }));
    assert!(!allows(&delete, &[prod_lock()]));
}

#[test]
fn rule_8_namespace_deletion_is_denied_while_it_holds_locks() {
    let req = request(json!({
        "resource": {"group": "", "version": "v1", "resource": "namespaces"},
        "name": "doomed", "namespace": "doomed",
        "oldObject": {"metadata": {"name": "doomed"}},
    }));
    assert_eq!(
        triage(&req),
        Triage::Lookup(Lookup {
            scope: "",
            name: "doomed",
            contents_of: Some("doomed")
        })
    );
    assert!(allows(&req, &[prod_lock()]));
    let held: Vec<LockRef> = (1..=7)
        .map(|i| LockRef::lock("doomed", &format!("cm-{i}"), LockSpec::default()))
        .collect();
    let verdict = decided(&req, &held);
    let refusal = verdict.refusal.as_ref().expect("denied");
    assert_eq!(refusal.code, 403);
    assert_eq!(
        refusal.message,
        "deleting namespaces \"doomed\" would delete the objects locked by 7 Locks in it (cm-1, cm-2, cm-3, cm-4, cm-5 and 2 more) (to unlock: kubectl delete locks --all -n doomed)"
    );
    assert_eq!(verdict.locks.len(), 5);
    let one = decided(&req, &held[..1]);
    assert!(
        one.refusal
            .expect("denied")
            .message
            .contains("locked by 1 Lock in it (cm-1)")
    );
}

#[test]
fn rule_8_a_cluster_lock_on_the_namespace_itself_wins() {
    let req = request(json!({
        "resource": {"group": "", "version": "v1", "resource": "namespaces"},
        "name": "doomed", "namespace": "doomed", "operation": "DELETE",
    }));
    let verdict = run(
        &req,
        &[],
        &[LockRef::cluster_lock("doomed", reason("tenant"))],
    )
    .expect("lookup");
    assert_eq!(
        verdict.refusal.expect("denied").message,
        "namespaces \"doomed\" is locked by ClusterLock doomed: tenant (to unlock: kubectl delete clusterlock doomed)"
    );
    // Namespace updates are plain updates: a Lock inside, even one named like the namespace,
    // does not block them (the Namespace's own scope is the ClusterLocks, whatever
    // `request.namespace` says).
    let update = request(json!({
        "resource": {"group": "", "version": "v1", "resource": "namespaces"},
        "name": "doomed", "namespace": "doomed", "operation": "UPDATE",
    }));
    let inside = LockRef::lock("doomed", "doomed", LockSpec::default());
    assert!(allows(&update, &[inside]));
}

#[test]
fn rule_9_dry_run_is_decided_the_same() {
    let req = request(json!({"dryRun": true}));
    assert!(!allows(&req, &[prod_lock()]));
}

#[test]
fn lookup_failure_follows_the_policy() {
    let req = request(json!({}));
    let Triage::Lookup(lookup) = triage(&req) else {
        panic!("needs lookup")
    };
    let error = LookupError::Timeout(std::time::Duration::from_secs(2));
    let denied = decide_unreadable(&req, &lookup, OnLookupError::Deny, &error);
    let refusal = denied.refusal.as_ref().expect("denied");
    assert_eq!(refusal.code, 503);
    assert!(refusal.message.contains("lock state could not be read"));
    assert!(refusal.message.contains("no answer within 2s"));
    assert_eq!(denied.outcome, Outcome::Error);
    let allowed = decide_unreadable(&req, &lookup, OnLookupError::Allow, &error);
    assert!(allowed.allowed());
    assert_eq!(allowed.outcome, Outcome::Error);
    assert!(allowed.warnings[0].contains("could not be read"));
    assert!(allowed.audit_annotations.contains_key("lookup-error"));
}

#[test]
fn lookup_failure_never_blocks_a_terminating_object() {
    let req = request(json!({
        "operation": "UPDATE",
        "object": {"metadata": {"deletionTimestamp": "2026-11-22T02:00:09Z"}},
    }));
    let Triage::Lookup(lookup) = triage(&req) else {
        panic!("needs lookup")
    };
    let error = LookupError::Timeout(std::time::Duration::from_secs(2));
    assert!(decide_unreadable(&req, &lookup, OnLookupError::Deny, &error).allowed());
}

#[test]
fn long_warnings_are_clipped() {
    let long = "x".repeat(400);
    let clipped = clip(long);
    assert_eq!(clipped.chars().count(), MAX_WARNING_CHARS);
    assert!(clipped.ends_with('…'));
    assert_eq!(clip("short".into()), "short");
}

// ---- Lock spec fields -------------------------------------------------------------------

fn spec(value: Value) -> LockSpec {
    serde_json::from_value(value).expect("valid spec")
}

fn lock(name: &str, value: Value) -> LockRef {
    LockRef::lock("prod", name, spec(value))
}

fn update(patch: Value) -> AdmissionRequest<'static> {
    let mut base = json!({"operation": "UPDATE", "object": {"metadata": {"name": "app-config"}}});
    for (k, v) in patch.as_object().expect("object") {
        base[k] = v.clone();
    }
    request(base)
}

fn eviction(name: &str) -> AdmissionRequest<'static> {
    request(json!({
        "operation": "CREATE", "subResource": "eviction", "name": name,
        "resource": {"group": "", "version": "v1", "resource": "pods"},
        "object": {"metadata": {"name": name}}, "oldObject": null,
    }))
}

#[test]
fn operations_delete_only_lets_updates_through_and_counts_evictions_as_deletes() {
    let delete_only = lock("app-config", json!({"operations": ["DELETE"]}));
    assert!(allows(&update(json!({})), &[delete_only.clone()]));
    assert!(!allows(&request(json!({})), &[delete_only]));
    let pod_lock = lock("evict-me", json!({"operations": ["DELETE"]}));
    assert!(!allows(&eviction("evict-me"), &[pod_lock]));
    let update_only = lock("evict-me", json!({"operations": ["UPDATE"]}));
    assert!(allows(&eviction("evict-me"), &[update_only]));
}

#[test]
fn resources_narrow_a_lock_to_some_resources_and_their_subresources() {
    let deployments = lock(
        "web",
        json!({"resources": [{"apiGroups": ["apps"], "resources": ["deployments"]}]}),
    );
    let deployment = update(
        json!({"name": "web", "resource": {"group": "apps", "version": "v1", "resource": "deployments"}}),
    );
    let scale = update(
        json!({"name": "web", "subResource": "scale", "resource": {"group": "apps", "version": "v1", "resource": "deployments"}}),
    );
    let service = update(
        json!({"name": "web", "resource": {"group": "", "version": "v1", "resource": "services"}}),
    );
    assert!(!allows(&deployment, &[deployments.clone()]));
    assert!(!allows(&scale, &[deployments.clone()]));
    assert!(allows(&service, &[deployments]), "the Service web is free");
    let scale_only = lock(
        "web",
        json!({"resources": [{"apiGroups": ["*"], "resources": ["deployments/scale"]}]}),
    );
    assert!(!allows(&scale, &[scale_only.clone()]));
    assert!(allows(&deployment, &[scale_only]));
    let core = lock(
        "web",
        json!({"resources": [{"apiGroups": [""], "resources": ["*"]}]}),
    );
    assert!(!allows(&service, &[core.clone()]));
    assert!(allows(&deployment, &[core]));
}

#[test]
fn selector_locks_cover_matching_objects_whatever_their_name() {
    let freeze = lock(
        "freeze",
        json!({"selector": {"matchLabels": {"app": "web"}}, "reason": "release"}),
    );
    let labelled = |name: &str, labels: Value| {
        update(json!({"name": name, "oldObject": {"metadata": {"name": name, "labels": labels}}}))
    };
    assert_eq!(
        refused(
            &labelled("web-1", json!({"app": "web", "tier": "fe"})),
            &[freeze.clone()],
        ),
        "configmaps \"web-1\" in namespace \"prod\" is locked by Lock prod/freeze: release (to unlock: kubectl delete lock freeze -n prod)"
    );
    assert!(allows(
        &labelled("db-1", json!({"app": "db"})),
        &[freeze.clone()]
    ));
    // The lock's own name is free once it has a selector.
    assert!(allows(&labelled("freeze", json!({})), &[freeze.clone()]));
    // Labels are read from the object before the change: relabelling away does not escape.
    let relabel = update(json!({
        "name": "web-1",
        "object": {"metadata": {"name": "web-1", "labels": {"app": "other"}}},
        "oldObject": {"metadata": {"name": "web-1", "labels": {"app": "web"}}},
    }));
    assert!(!allows(&relabel, &[freeze.clone()]));
    // Evictions carry no pod labels: without the pod's, read apart (see
    // `selector_locks_cover_evictions_and_scale_by_the_labels_read`), nothing is selected.
    assert!(allows(&eviction("web-1"), &[freeze]));
    let expressions = lock(
        "tiered",
        json!({"selector": {"matchExpressions": [{"key": "tier", "operator": "In", "values": ["db", "cache"]}]}}),
    );
    assert!(!allows(
        &labelled("x", json!({"tier": "cache"})),
        &[expressions.clone()]
    ));
    assert!(allows(
        &labelled("y", json!({"tier": "fe"})),
        &[expressions]
    ));
}

#[test]
fn exempt_users_groups_and_service_accounts_pass_with_a_warning() {
    let held = lock(
        "app-config",
        json!({"exempt": {"users": ["alice"], "groups": ["snapshotters"], "serviceAccounts": ["velero/velero"]}}),
    );
    for (user, how) in [
        (json!({"username": "alice", "groups": []}), "user alice"),
        (
            json!({"username": "bob", "groups": ["snapshotters"]}),
            "group snapshotters",
        ),
        (
            json!({"username": "system:serviceaccount:velero:velero", "groups": []}),
            "service account velero/velero",
        ),
    ] {
        let verdict = decided(&request(json!({"userInfo": user})), &[held.clone()]);
        assert!(verdict.allowed(), "{how}");
        assert_eq!(verdict.outcome, Outcome::Warned);
        assert_eq!(
            verdict.warnings,
            [format!(
                "allowed by exemption: {how} is exempt from Lock prod/app-config"
            )]
        );
        assert_eq!(
            verdict
                .audit_annotations
                .get("exempted-by")
                .map(String::as_str),
            Some(format!("Lock prod/app-config ({how})").as_str())
        );
    }
    let others = [
        json!({"username": "carol", "groups": ["dev"]}),
        json!({"username": "system:serviceaccount:velero:other", "groups": []}),
        json!({"username": "velero/velero", "groups": []}),
    ];
    for user in others {
        assert!(!allows(
            &request(json!({"userInfo": user})),
            &[held.clone()]
        ));
    }
}

#[test]
fn expired_locks_no_longer_apply_and_say_so() {
    let expired = lock("app-config", json!({"expiresAt": "2026-11-22T11:00:00Z"}));
    let verdict = decided(&request(json!({})), &[expired]);
    assert!(verdict.allowed());
    assert_eq!(
        verdict
            .audit_annotations
            .get("expired-locks")
            .map(String::as_str),
        Some("Lock prod/app-config")
    );
    let live = lock("app-config", json!({"expiresAt": "2026-11-22T13:00:00Z"}));
    assert!(!allows(&request(json!({})), &[live]));
}

#[test]
fn warn_mode_allows_with_a_warning_and_an_annotation() {
    let trial = lock("app-config", json!({"mode": "Warn", "reason": "trying"}));
    let verdict = decided(&request(json!({})), &[trial]);
    assert!(verdict.allowed());
    assert_eq!(verdict.outcome, Outcome::Warned);
    assert_eq!(
        verdict.warnings,
        ["Lock prod/app-config (mode Warn) would refuse this: trying"]
    );
    assert_eq!(
        verdict
            .audit_annotations
            .get("warn-locks")
            .map(String::as_str),
        Some("Lock prod/app-config")
    );
}

#[test]
fn combinations_take_the_most_restrictive_and_name_every_lock() {
    // An exempt user on a Warn lock: the exemption speaks, not the warning.
    let warn_exempt = lock(
        "app-config",
        json!({"mode": "Warn", "exempt": {"users": ["alice"]}}),
    );
    let verdict = decided(&request(json!({})), &[warn_exempt]);
    assert!(verdict.allowed());
    assert!(
        verdict.warnings[0].starts_with("allowed by exemption: user alice"),
        "{:?}",
        verdict.warnings
    );
    // An expired selector lock covers nothing.
    let expired_selector = lock(
        "freeze",
        json!({"selector": {"matchLabels": {"app": "web"}}, "expiresAt": "2026-01-01T00:00:00Z"}),
    );
    let labelled = update(
        json!({"oldObject": {"metadata": {"name": "app-config", "labels": {"app": "web"}}}}),
    );
    assert!(allows(&labelled, &[expired_selector]));
    // Several locks: two enforce, one warns, one exempts the user: refused, naming the two.
    let set = [
        lock("app-config", json!({"reason": "snapshot"})),
        lock(
            "freeze",
            json!({"selector": {"matchLabels": {"app": "web"}}}),
        ),
        lock(
            "trial",
            json!({"selector": {"matchLabels": {"app": "web"}}, "mode": "Warn"}),
        ),
        lock(
            "ops",
            json!({"selector": {"matchLabels": {"app": "web"}}, "exempt": {"users": ["alice"]}}),
        ),
    ];
    let verdict = decided(&labelled, &set);
    let refusal = verdict.refusal.as_ref().expect("denied");
    assert_eq!(
        refusal.message,
        "configmaps \"app-config\" in namespace \"prod\" is locked by Lock prod/app-config: snapshot; Lock prod/freeze (to unlock: kubectl delete lock app-config freeze -n prod)"
    );
    assert_eq!(
        verdict.audit_annotations.get("lock").map(String::as_str),
        Some("Lock prod/app-config, Lock prod/freeze")
    );
    assert_eq!(verdict.warnings.len(), 2, "{:?}", verdict.warnings);
    // An UPDATE-only lock and a DELETE-only lock on one DELETE: the DELETE one refuses, alone.
    let split = [
        lock("app-config", json!({"operations": ["UPDATE"]})),
        lock(
            "freeze",
            json!({"selector": {"matchLabels": {"app": "web"}}, "operations": ["DELETE"]}),
        ),
    ];
    let delete = request(
        json!({"oldObject": {"metadata": {"name": "app-config", "labels": {"app": "web"}}}}),
    );
    let verdict = decided(&delete, &split);
    assert_eq!(verdict.locks, [LockKey::lock("prod", "freeze")]);
    // And on an UPDATE, the UPDATE one refuses, alone.
    let verdict = decided(&labelled, &split);
    assert_eq!(verdict.locks, [LockKey::lock("prod", "app-config")]);
    let both = [lock(
        "evict-me",
        json!({"operations": ["DELETE"], "mode": "Warn"}),
    )];
    let verdict = decided(&eviction("evict-me"), &both);
    assert!(verdict.allowed(), "a Warn lock on an eviction only warns");
    assert_eq!(verdict.warnings.len(), 1);
}

#[test]
fn namespace_deletion_ignores_expired_and_warn_locks() {
    let req = request(json!({
        "resource": {"group": "", "version": "v1", "resource": "namespaces"},
        "name": "doomed", "namespace": "doomed",
    }));
    let expired = LockRef::lock(
        "doomed",
        "old",
        spec(json!({"expiresAt": "2026-01-01T00:00:00Z"})),
    );
    let warn = LockRef::lock("doomed", "trial", spec(json!({"mode": "Warn"})));
    let verdict = decided(&req, &[expired.clone(), warn.clone()]);
    assert!(verdict.allowed());
    assert_eq!(verdict.warnings.len(), 1);
    let enforce = LockRef::lock("doomed", "held", LockSpec::default());
    let verdict = decided(&req, &[expired, warn, enforce]);
    assert!(
        verdict
            .refusal
            .expect("denied")
            .message
            .contains("locked by 1 Lock in it (held)")
    );
}

#[test]
fn selector_locks_never_select_an_object_whose_labels_are_unknown() {
    let deployments = json!({"group": "apps", "version": "v1", "resource": "deployments"});
    let pods = json!({"group": "", "version": "v1", "resource": "pods"});
    for selector in [
        json!({"matchExpressions": [{"key": "tier", "operator": "NotIn", "values": ["db"]}]}),
        json!({"matchExpressions": [{"key": "tier", "operator": "DoesNotExist"}]}),
    ] {
        let not_db = lock("not-db", json!({"selector": selector}));
        // An object known to have no labels is selected: NotIn and DoesNotExist hold for it.
        let unlabelled = update(json!({
            "name": "web", "resource": deployments,
            "oldObject": {"metadata": {"name": "web"}},
        }));
        assert!(!allows(&unlabelled, &[not_db.clone()]), "{selector}");
        // A Scale has no labels, whatever its Deployment has: it is not selected.
        let scale = update(json!({
            "name": "web", "subResource": "scale", "resource": deployments,
            "kind": {"group": "autoscaling", "version": "v1", "kind": "Scale"},
            "object": {"metadata": {"name": "web", "namespace": "prod"}},
            "oldObject": {"metadata": {"name": "web", "namespace": "prod"}},
        }));
        let verdict = decided(&scale, &[not_db.clone()]);
        assert_eq!(verdict, Verdict::allow(), "scale, {selector}");
        // Neither is an eviction's pod (no oldObject).
        let verdict = decided(&eviction("web"), &[not_db.clone()]);
        assert_eq!(verdict, Verdict::allow(), "eviction, {selector}");
        // Nor an object whose oldObject is missing.
        let no_old = request(json!({"name": "web", "resource": deployments,
            "object": {"metadata": {"name": "web"}}, "oldObject": null}));
        assert_eq!(
            decided(&no_old, &[not_db.clone()]),
            Verdict::allow(),
            "{selector}"
        );
        // An ephemeral-containers update carries the pod itself: its labels are known.
        let debug = update(json!({
            "name": "web", "subResource": "ephemeralcontainers", "resource": pods,
            "oldObject": {"metadata": {"name": "web"}},
        }));
        assert!(!allows(&debug, &[not_db]), "{selector}");
    }
}

/// A Namespace DELETE, by `user`.
fn namespace_delete(user: Value) -> AdmissionRequest<'static> {
    request(json!({
        "resource": {"group": "", "version": "v1", "resource": "namespaces"},
        "name": "doomed", "namespace": "doomed", "userInfo": user,
        "oldObject": {"metadata": {"name": "doomed"}},
    }))
}

#[test]
fn rule_8_only_locks_that_would_refuse_deleting_their_objects_block_the_namespace() {
    let alice = json!({"username": "alice", "groups": ["dev"]});
    let in_doomed = |name: &str, value: Value| LockRef::lock("doomed", name, spec(value));
    // Each of these would let the namespace controller delete its object.
    for (why, lock) in [
        (
            "UPDATE only",
            in_doomed("a", json!({"operations": ["UPDATE"]})),
        ),
        (
            "a subresource only",
            in_doomed(
                "b",
                json!({"resources": [{"apiGroups": ["apps"], "resources": ["deployments/scale"]}]}),
            ),
        ),
        (
            "lock resources only",
            in_doomed(
                "c",
                json!({"resources": [{"apiGroups": ["objectlock.dev"], "resources": ["locks"]}]}),
            ),
        ),
        (
            "the whole lock group",
            in_doomed(
                "c2",
                json!({"resources": [{"apiGroups": ["objectlock.dev"], "resources": ["*"]}]}),
            ),
        ),
        (
            "events, leases and reviews: never sent",
            in_doomed(
                "c3",
                json!({"resources": [
                    {"apiGroups": ["*"], "resources": ["events"]},
                    {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"]},
                    {"apiGroups": ["authorization.k8s.io"], "resources": ["localsubjectaccessreviews"]},
                    {"apiGroups": [""], "resources": ["pods/status"]}]}),
            ),
        ),
        (
            "the namespace controller exempt",
            in_doomed(
                "d",
                json!({"exempt": {"serviceAccounts": ["kube-system/namespace-controller"]}}),
            ),
        ),
        (
            "kube-system service accounts exempt",
            in_doomed(
                "e",
                json!({"exempt": {"groups": ["system:serviceaccounts:kube-system"]}}),
            ),
        ),
    ] {
        let verdict = decided(&namespace_delete(alice.clone()), &[lock.clone()]);
        assert!(verdict.allowed(), "{why}: {verdict:?}");
    }
    let exempting = in_doomed(
        "d",
        json!({"exempt": {"serviceAccounts": ["kube-system/namespace-controller"]}}),
    );
    let verdict = decided(&namespace_delete(alice.clone()), &[exempting]);
    assert_eq!(
        verdict.warnings,
        [
            "Lock doomed/d exempts service account kube-system/namespace-controller: its objects go with the namespace"
        ]
    );
    assert_eq!(
        verdict
            .audit_annotations
            .get("exempted-by")
            .map(String::as_str),
        Some("Lock doomed/d (service account kube-system/namespace-controller)")
    );

    // A lock on deployments still blocks: deleting the namespace deletes every Deployment.
    let deployments = in_doomed(
        "web",
        json!({"resources": [{"apiGroups": ["apps"], "resources": ["deployments"]}], "operations": ["DELETE"]}),
    );
    assert_eq!(
        refused(&namespace_delete(alice.clone()), &[deployments]),
        "deleting namespaces \"doomed\" would delete the objects locked by 1 Lock in it (web) (to unlock: kubectl delete locks --all -n doomed)"
    );

    // Exempting the user deleting the namespace is not enough: the namespace controller deletes
    // the objects, and the lock would refuse it, leaving the namespace Terminating.
    let alice_may = in_doomed("held", json!({"exempt": {"users": ["alice"]}}));
    assert_eq!(
        refused(&namespace_delete(alice), &[alice_may.clone()]),
        "deleting namespaces \"doomed\" would delete the objects locked by 1 Lock in it (held); user alice is exempt from Lock doomed/held, but the namespace controller, which deletes the objects, is not (to unlock: kubectl delete locks --all -n doomed)"
    );
    let bob = json!({"username": "bob", "groups": []});
    let verdict = decided(&namespace_delete(bob), &[alice_may]);
    assert!(
        !verdict
            .refusal
            .expect("denied")
            .message
            .contains("is exempt"),
    );
}

/// A scale update of Deployment `name` in `prod`, as the API server sends it: a Scale, with
/// none of the Deployment's labels.
fn scale(name: &str) -> AdmissionRequest<'static> {
    update(json!({
        "name": name, "subResource": "scale",
        "resource": {"group": "apps", "version": "v1", "resource": "deployments"},
        "kind": {"group": "autoscaling", "version": "v1", "kind": "Scale"},
        "object": {"metadata": {"name": name, "namespace": "prod"}},
        "oldObject": {"metadata": {"name": name, "namespace": "prod"}},
    }))
}

/// Plans, finds whose labels are needed in the `prod` locks, and decides with `labels` when
/// some are (with `policy` for unreadable ones); `None` as the target when none are needed.
fn run_reading(
    req: &AdmissionRequest,
    namespaced: &[LockRef],
    labels: Labels,
    policy: OnLookupError,
) -> (Option<String>, Verdict) {
    let Triage::Lookup(lookup) = triage(req) else {
        panic!("needs a lookup")
    };
    let set = locks(namespaced);
    match labels_needed(req, &set, now()) {
        None => (
            None,
            decide(req, &lookup, &set, None, None, &Objects::unknown(), now()),
        ),
        Some(target) => {
            let verdict = decide(
                req,
                &lookup,
                &set,
                None,
                Some((&labels, policy)),
                &Objects::unknown(),
                now(),
            );
            (Some(target.to_string()), verdict)
        }
    }
}

fn app(value: &str) -> Labels {
    Labels::Read([("app".to_owned(), value.to_owned())].into())
}

fn dbs(extra: Value) -> LockRef {
    let mut value = json!({"selector": {"matchLabels": {"app": "db"}}, "reason": "backup"});
    for (k, v) in extra.as_object().expect("object") {
        value[k] = v.clone();
    }
    lock("dbs", value)
}

#[test]
fn labels_are_needed_only_for_evictions_and_scale_a_selector_lock_could_cover() {
    let pod = Some("pods \"db-0\" in namespace \"prod\"".to_owned());
    let deployment = Some("deployments.apps \"web\" in namespace \"prod\"".to_owned());
    let needed = |req: &AdmissionRequest, lock: LockRef| {
        let set = locks(&[lock]);
        labels_needed(req, &set, now()).map(|t| t.to_string())
    };
    let rows: Vec<(&str, AdmissionRequest, LockRef, Option<String>)> = vec![
        (
            "eviction, selector lock",
            eviction("db-0"),
            dbs(json!({})),
            pod.clone(),
        ),
        (
            "scale, selector lock",
            scale("web"),
            dbs(json!({})),
            deployment.clone(),
        ),
        // Only the operation the request is: an eviction is a DELETE, a scale an UPDATE.
        (
            "eviction, UPDATE-only lock",
            eviction("db-0"),
            dbs(json!({"operations": ["UPDATE"]})),
            None,
        ),
        (
            "scale, DELETE-only lock",
            scale("web"),
            dbs(json!({"operations": ["DELETE"]})),
            None,
        ),
        // The lock's resources must match the parent resource (or its subresource).
        (
            "eviction, pods lock",
            eviction("db-0"),
            dbs(json!({"resources": [{"apiGroups": [""], "resources": ["pods"]}]})),
            pod.clone(),
        ),
        (
            "eviction, deployments lock",
            eviction("db-0"),
            dbs(json!({"resources": [{"apiGroups": ["apps"], "resources": ["deployments"]}]})),
            None,
        ),
        (
            "scale, deployments/scale lock",
            scale("web"),
            dbs(
                json!({"resources": [{"apiGroups": ["apps"], "resources": ["deployments/scale"]}]}),
            ),
            deployment.clone(),
        ),
        (
            "scale, statefulsets lock",
            scale("web"),
            dbs(json!({"resources": [{"apiGroups": ["apps"], "resources": ["statefulsets"]}]})),
            None,
        ),
        // A lock that would not apply whatever the labels: nothing to read.
        (
            "expired",
            eviction("db-0"),
            dbs(json!({"expiresAt": "2026-01-01T00:00:00Z"})),
            None,
        ),
        (
            "user exempt",
            eviction("db-0"),
            dbs(json!({"exempt": {"users": ["alice"]}})),
            None,
        ),
        // Warn locks warn by labels too.
        (
            "Warn lock",
            eviction("db-0"),
            dbs(json!({"mode": "Warn"})),
            pod.clone(),
        ),
        // A named lock needs no labels.
        (
            "named lock",
            eviction("db-0"),
            lock("db-0", json!({})),
            None,
        ),
        // Requests that carry the object's labels, or are not sent for its labels.
        (
            "direct update",
            update(json!({"name": "db-0"})),
            dbs(json!({})),
            None,
        ),
        (
            "direct delete",
            request(json!({"name": "db-0"})),
            dbs(json!({})),
            None,
        ),
        (
            "ephemeral containers",
            update(json!({"name": "db-0", "subResource": "ephemeralcontainers",
                "resource": {"group": "", "version": "v1", "resource": "pods"}})),
            dbs(json!({})),
            None,
        ),
    ];
    for (case, req, lock, want) in rows {
        assert_eq!(needed(&req, lock), want, "{case}");
    }
    // A namespace without locks, the common case, reads nothing.
    assert_eq!(
        labels_needed(&eviction("db-0"), &LockSet::default(), now()),
        None
    );
}

#[test]
fn selector_locks_cover_evictions_and_scale_by_the_labels_read() {
    let deny = OnLookupError::Deny;
    // The selected pod's eviction is refused, as its DELETE would be.
    let (target, verdict) = run_reading(&eviction("db-0"), &[dbs(json!({}))], app("db"), deny);
    assert_eq!(
        target.as_deref(),
        Some("pods \"db-0\" in namespace \"prod\"")
    );
    let refusal = verdict.refusal.as_ref().expect("denied");
    assert_eq!((refusal.code, refusal.reason), (403, "Forbidden"));
    assert_eq!(
        refusal.message,
        "cannot evict: pods \"db-0\" in namespace \"prod\" is locked by Lock prod/dbs: backup (to unlock: kubectl delete lock dbs -n prod)"
    );
    assert_eq!(verdict.locks, [LockKey::lock("prod", "dbs")]);
    // An unselected pod's eviction is allowed.
    let (_, verdict) = run_reading(&eviction("web-0"), &[dbs(json!({}))], app("web"), deny);
    assert_eq!(verdict, Verdict::allow());
    // The selected Deployment's scale is refused.
    let (target, verdict) = run_reading(&scale("web"), &[dbs(json!({}))], app("db"), deny);
    assert_eq!(
        target.as_deref(),
        Some("deployments.apps \"web\" in namespace \"prod\"")
    );
    assert_eq!(
        verdict.refusal.expect("denied").message,
        "deployments.apps \"web\" in namespace \"prod\" is locked by Lock prod/dbs: backup (to unlock: kubectl delete lock dbs -n prod)"
    );
    let (_, verdict) = run_reading(&scale("web"), &[dbs(json!({}))], app("web"), deny);
    assert_eq!(verdict, Verdict::allow());
    // A pod gone before its labels were read leaves nothing to lock.
    let (_, verdict) = run_reading(&eviction("db-0"), &[dbs(json!({}))], Labels::Gone, deny);
    assert_eq!(verdict, Verdict::allow());
    // NotIn and DoesNotExist select an object read without labels, exactly as a direct write.
    let not_db = lock(
        "not-db",
        json!({"selector": {"matchExpressions": [{"key": "tier", "operator": "NotIn", "values": ["db"]}]}}),
    );
    let unlabelled = Labels::Read(BTreeMap::new());
    let (_, verdict) = run_reading(&eviction("x"), &[not_db.clone()], unlabelled, deny);
    assert!(!verdict.allowed());
    let (_, verdict) = run_reading(&scale("x"), &[not_db], app("x"), deny);
    assert!(!verdict.allowed(), "no tier label: NotIn holds");
    // A Warn lock warns about the selected pod's eviction.
    let (_, verdict) = run_reading(
        &eviction("db-0"),
        &[dbs(json!({"mode": "Warn"}))],
        app("db"),
        deny,
    );
    assert!(verdict.allowed());
    assert_eq!(verdict.outcome, Outcome::Warned);
    assert_eq!(verdict.warned, [LockKey::lock("prod", "dbs")]);
}

#[test]
fn labels_that_cannot_be_read_follow_on_lookup_error() {
    let forbidden = Labels::Unreadable(crate::admission::labels::LabelError::Forbidden {
        resource: "pods".to_owned(),
        message: "pods \"db-0\" is forbidden".to_owned(),
    });
    let problem = "cannot read the labels of pods \"db-0\" in namespace \"prod\" to apply selector Lock prod/dbs: the webhook's identity may not get pods: grant it get on pods (pods \"db-0\" is forbidden)";
    let (_, denied) = run_reading(
        &eviction("db-0"),
        &[dbs(json!({}))],
        forbidden.clone(),
        OnLookupError::Deny,
    );
    let refusal = denied.refusal.as_ref().expect("denied");
    assert_eq!((refusal.code, refusal.reason), (503, "ServiceUnavailable"));
    assert_eq!(
        refusal.message,
        format!("{problem}; the change is refused until they can be read (on_lookup_error=deny)")
    );
    assert_eq!(denied.outcome, Outcome::Error);
    assert_eq!(
        denied
            .audit_annotations
            .get("lookup-error")
            .map(String::as_str),
        Some(problem)
    );
    let (_, allowed) = run_reading(
        &eviction("db-0"),
        &[dbs(json!({}))],
        forbidden.clone(),
        OnLookupError::Allow,
    );
    assert!(allowed.allowed());
    assert_eq!(allowed.outcome, Outcome::Error);
    assert_eq!(
        allowed.warnings,
        [problem.replacen(": ", ", allowed (on_lookup_error=allow): ", 1)]
    );
    // A named lock refuses whatever the labels: its refusal, not the lookup's.
    let both = [dbs(json!({})), lock("db-0", json!({}))];
    let (_, verdict) = run_reading(
        &eviction("db-0"),
        &both,
        forbidden.clone(),
        OnLookupError::Deny,
    );
    let refusal = verdict.refusal.expect("denied");
    assert_eq!(refusal.code, 403);
    assert!(
        refusal.message.contains("locked by Lock prod/db-0"),
        "{}",
        refusal.message
    );
    // Only Warn locks need them: a warning, never a refusal.
    let (_, verdict) = run_reading(
        &eviction("db-0"),
        &[dbs(json!({"mode": "Warn"}))],
        forbidden,
        OnLookupError::Deny,
    );
    assert!(verdict.allowed());
    assert_eq!(verdict.outcome, Outcome::Warned);
    assert!(
        verdict.warnings[0].contains("to apply selector Lock prod/dbs (mode Warn): the webhook's"),
        "{:?}",
        verdict.warnings
    );
    // Files: no cluster to read from; the policy decides, and the message says why.
    let (_, verdict) = run_reading(
        &scale("web"),
        &[dbs(json!({}))],
        Labels::Unreadable(crate::admission::labels::LabelError::NoCluster),
        OnLookupError::Deny,
    );
    assert_eq!(verdict.refusal.as_ref().map(|r| r.code), Some(503));
    assert!(
        verdict.refusal.expect("denied").message.contains(
            "cannot read the labels of deployments.apps \"web\" in namespace \"prod\" to apply selector Lock prod/dbs: locks are read from files"
        )
    );
}

// ---- Locks on fields ------------------------------------------------------------------

#[test]
fn a_lock_on_fields_refuses_only_a_change_of_them_naming_the_field() {
    let deployment = |patch: Value| {
        let mut base = json!({"operation": "UPDATE", "name": "web",
            "resource": {"group": "apps", "version": "v1", "resource": "deployments"},
            "oldObject": {"metadata": {"name": "web"}}});
        for (k, v) in patch.as_object().expect("object") {
            base[k] = v.clone();
        }
        request(base)
    };
    let old = json!({"metadata": {"name": "web", "resourceVersion": "1", "generation": 1,
                                  "annotations": {"a": "1"}},
                     "spec": {"replicas": 1, "template": {"spec": {"containers": [{"image": "v1"}]}}}});
    let with = |f: &dyn Fn(&mut Value)| {
        let mut new = old.clone();
        new["metadata"]["resourceVersion"] = json!("2");
        new["metadata"]["generation"] = json!(2);
        f(&mut new);
        new
    };
    let annotated = with(&|v| v["metadata"]["annotations"]["a"] = json!("2"));
    let labelled = with(&|v| v["metadata"]["labels"] = json!({"l": "1"}));
    let scaled = with(&|v| v["spec"]["replicas"] = json!(3));
    let image = with(&|v| v["spec"]["template"]["spec"]["containers"][0]["image"] = json!("v2"));
    let unchanged = with(&|_| {});
    let template = lock(
        "web",
        json!({"fields": ["spec.template"], "reason": "VM snapshot in progress"}),
    );
    let annotations = lock("web", json!({"exceptFields": ["metadata.annotations"]}));
    let whole = lock("web", json!({"reason": "freeze"}));
    let main = deployment(json!({}));
    // (lock, new object, the field named, or None when allowed)
    let cases = [
        (&template, &annotated, None),
        (&template, &labelled, None),
        (&template, &scaled, None),
        (&template, &unchanged, None),
        (&template, &image, Some("spec.template")),
        (&annotations, &annotated, None),
        (&annotations, &unchanged, None),
        (&annotations, &labelled, Some("metadata.labels")),
        (&annotations, &image, Some("spec")),
        // A write that changes nothing passes a whole-object lock too.
        (&whole, &unchanged, None),
    ];
    for (lock, new, named) in cases {
        let verdict = run_update(&main, &[lock.clone()], old.clone(), new.clone());
        match named {
            None => assert_eq!(verdict.outcome, Outcome::Allowed, "{:?} {new}", lock.spec),
            Some(field) => {
                let message = verdict.refusal.clone().expect("refused").message;
                assert!(
                    message.contains(&format!("is locked by Lock prod/web ({field} changed)")),
                    "{message}"
                );
                assert_eq!(
                    verdict.audit_annotations["changed-fields"],
                    format!("Lock prod/web: {field}")
                );
                assert_eq!(verdict.changed, [(lock.key(), field.to_owned())]);
            }
        }
    }
    assert_eq!(
        run_update(&main, &[template.clone()], old.clone(), image.clone())
            .refusal
            .expect("refused")
            .message,
        "deployments.apps \"web\" in namespace \"prod\" is locked by Lock prod/web (spec.template changed): VM snapshot in progress (to unlock: kubectl delete lock web -n prod)"
    );
    // A whole-object lock refuses a change without naming the field, as it always did.
    assert_eq!(
        run_update(&main, &[whole], old.clone(), scaled.clone())
            .refusal
            .expect("refused")
            .message,
        "deployments.apps \"web\" in namespace \"prod\" is locked by Lock prod/web: freeze (to unlock: kubectl delete lock web -n prod)"
    );
    // Warn names the field too.
    let warn = lock("web", json!({"fields": ["spec.template"], "mode": "Warn"}));
    let verdict = run_update(&main, &[warn.clone()], old.clone(), image.clone());
    assert_eq!(
        verdict.warnings,
        ["Lock prod/web (spec.template changed) (mode Warn) would refuse this"]
    );
    assert_eq!(
        run_update(&main, &[warn], old.clone(), annotated.clone()).outcome,
        Outcome::Allowed
    );
    // What `check` and the audit log show of an allowed UPDATE under a lock on fields.
    let allowed = run_update(&main, &[template.clone()], old.clone(), annotated.clone());
    assert_eq!(
        allowed.audit_annotations["unchanged-locks"],
        "Lock prod/web"
    );
    // A DELETE is not affected by fields.
    let delete = deployment(json!({"operation": "DELETE"}));
    assert!(!allows(&delete, &[template.clone()]));
}

#[test]
fn a_scale_changes_spec_replicas() {
    let scale = |group: &str, resource: &str| {
        request(
            json!({"operation": "UPDATE", "name": "web", "subResource": "scale",
            "resource": {"group": group, "version": "v1", "resource": resource},
            "oldObject": {"metadata": {"name": "web"}}}),
        )
    };
    let old = json!({"kind": "Scale", "metadata": {"name": "web", "resourceVersion": "1"},
                     "spec": {"replicas": 1}, "status": {"replicas": 1}});
    let mut new = old.clone();
    new["spec"]["replicas"] = json!(3);
    let deployments = scale("apps", "deployments");
    let widgets = scale("example.com", "widgets");
    // (request, lock spec, allowed)
    let cases = [
        (&deployments, json!({"fields": ["spec.template"]}), true),
        (&deployments, json!({"fields": ["spec.replicas"]}), false),
        (&deployments, json!({"fields": ["spec"]}), false),
        (
            &deployments,
            json!({"exceptFields": ["spec.replicas"]}),
            true,
        ),
        (
            &deployments,
            json!({"exceptFields": ["metadata.annotations"]}),
            false,
        ),
        (&deployments, json!({}), false),
        // Which field a custom resource scales is the CRD's: refused by every lock.
        (&widgets, json!({"fields": ["spec.template"]}), false),
    ];
    for (req, spec, allowed) in cases {
        let verdict = run_update(req, &[lock("web", spec.clone())], old.clone(), new.clone());
        assert_eq!(verdict.allowed(), allowed, "{spec}");
    }
    // A scale to the same count changes nothing.
    assert!(
        run_update(
            &widgets,
            &[lock("web", json!({}))],
            old.clone(),
            old.clone()
        )
        .allowed()
    );
}
