//! Paths around a locked object that admission sees differently: a proxy name carrying a
//! scheme and a port, the deletion of a CustomResourceDefinition (which deletes its objects
//! without admission), Locks that lock nothing the webhook is sent (they neither widen the
//! registration nor block a namespace's deletion), and control characters in a reason.

use anyhow::{Result, ensure};
use serde_json::json;

use crate::rest::Reply;
use crate::scenarios::pods::pod;
use crate::suite::Ctx;

/// A CONNECT Lock holds on `pods/NAME/proxy` whatever scheme and port the name segment carries
/// (`[scheme:]NAME[:port]`, as the API server reads it), a selector CONNECT Lock too. The
/// refusal is the lock's 403; an allowed proxy request fails later, for want of a pod address.
pub fn proxy_port(ctx: &Ctx) -> Result<()> {
    let ns = ctx.namespace("")?;
    let result = proxy_checks(ctx, &ns);
    // Nothing left asking for CONNECT, whatever happened: the scenarios that count the
    // registration's CONNECT entries run after this one.
    for name in ["db-0", "dbs"] {
        let path = crate::suite::lock_path(&ns, name);
        let reply = ctx.rest().delete(&path)?;
        ensure!(
            reply.ok() || reply.code == 404,
            "DELETE {path}: {}",
            reply.code
        );
    }
    result
}

fn proxy_checks(ctx: &Ctx, ns: &str) -> Result<()> {
    let rest = ctx.rest();
    let pods = format!("/api/v1/namespaces/{ns}/pods");
    ctx.create(&pods, pod("db-0", json!({})))?;
    ctx.create(&pods, pod("db-1", json!({"app": "db"})))?;
    ctx.create(&pods, pod("web-0", json!({"app": "web"})))?;
    let proxy = |segment: &str| -> Result<Reply> { rest.get(&format!("{pods}/{segment}/proxy/x")) };

    ctx.lock(
        ns,
        "db-0",
        json!({"operations": ["CONNECT"], "reason": "VM snapshot"}),
    )?;
    ctx.enforced("proxy to db-0", || proxy("db-0"))?;
    let named = format!(
        "cannot proxy: pods \"db-0\" in namespace \"{ns}\" is locked by Lock {ns}/db-0: VM snapshot"
    );
    for segment in ["db-0:8080", "http:db-0:8080", "https:db-0:"] {
        proxy(segment)?.refused(&format!("proxy to {segment}"), &named)?;
    }

    ctx.lock(
        ns,
        "dbs",
        json!({"operations": ["CONNECT"], "selector": {"matchLabels": {"app": "db"}}}),
    )?;
    ctx.enforced("proxy to db-1", || proxy("db-1"))?;
    let selected =
        format!("cannot proxy: pods \"db-1\" in namespace \"{ns}\" is locked by Lock {ns}/dbs");
    for segment in ["db-1:8080", "http:db-1:8080"] {
        proxy(segment)?.refused(&format!("proxy to {segment}"), &selected)?;
    }

    // Not locked: admitted, then refused by the API server itself, as the pod has no address
    // to proxy to (400 `address not allowed`, or a 5xx): never the lock's 403.
    for segment in ["web-0:8080", "http:web-0:8080"] {
        let reply = proxy(segment)?;
        ensure!(
            !reply.ok() && reply.code != 403 && !reply.message().contains("is locked by"),
            "proxy to {segment} (no lock): expected the API server's own failure, got {} {}",
            reply.code,
            reply.message()
        );
    }
    Ok(())
}

/// A Lock that locks nothing the webhook is ever sent (the lock kinds, events, leases) does not
/// make its namespace undeletable, whoever made it.
pub fn namespace_nothing(ctx: &Ctx) -> Result<()> {
    let ns = ctx.namespace("")?;
    let rest = ctx.rest();
    ctx.lock(
        &ns,
        "all-lock-kinds",
        json!({"operations": ["DELETE"], "resources": [{"apiGroups": ["objectlock.dev"], "resources": ["*"]}]}),
    )?;
    ctx.lock(
        &ns,
        "chatter",
        json!({"operations": ["UPDATE", "DELETE"], "resources": [
            {"apiGroups": ["*"], "resources": ["events"]},
            {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"]}]}),
    )?;
    // Seen by the webhook once a later Lock is (the watch keeps the order): an UPDATE-only
    // one, which does not block the namespace's deletion either.
    ctx.configmap(&ns, "seen", json!({}))?;
    ctx.lock(&ns, "seen", json!({"operations": ["UPDATE"]}))?;
    ctx.update_enforced(&format!("/api/v1/namespaces/{ns}/configmaps/seen"))?;
    let path = format!("/api/v1/namespaces/{ns}");
    rest.delete(&format!("{path}?dryRun=All"))?
        .allowed("dry-run DELETE of a namespace whose Locks lock nothing it holds")?;
    ctx.k(&["delete", "namespace", &ns, "--wait=false"])
        .allowed()?;
    if ctx.env.kcm {
        ctx.gone(&path, std::time::Duration::from_secs(90))?;
    }
    Ok(())
}

/// The CRD refuses control characters in a reason, with a message saying why; the text a Lock
/// supplies is escaped wherever it is shown (unit-tested: a lock file may still carry them).
pub fn reason_control(ctx: &Ctx) -> Result<()> {
    let ns = ctx.namespace("")?;
    let locks = format!("/apis/objectlock.dev/v1alpha1/namespaces/{ns}/locks");
    for (name, reason) in [
        (
            "ansi",
            "snapshot\u{1b}[2K\r\u{1b}[1Aconfigmap \"ansi\" deleted",
        ),
        ("newline", "two\nlines"),
        ("c1", "csi \u{9b}31m"),
    ] {
        let reply = ctx.rest().post(
            &locks,
            &json!({"apiVersion": "objectlock.dev/v1alpha1", "kind": "Lock",
                    "metadata": {"name": name}, "spec": {"reason": reason}}),
        )?;
        ensure!(
            reply.code == 422 && reply.message().contains("without control characters"),
            "a Lock whose reason holds control characters ({name}): expected 422 naming them, got {} {}",
            reply.code,
            reply.message()
        );
    }
    // One line of any script is a reason.
    ctx.lock(&ns, "plain", json!({"reason": "VM snapshot — ünïcode ✓"}))
}

/// Nobody widens what is sent to the webhook beyond what they can lock: a selector ClusterLock
/// on the lock kinds only and Locks covering only `objectlock.dev/locks` leave an unrelated
/// write in another namespace unsent (it succeeds with the webhook stopped), and a namespace
/// beyond `registration.max_names` is sent whole, for itself, not the cluster.
pub fn tenant_widening(ctx: &Ctx) -> Result<()> {
    let tenant = ctx.namespace("tenant")?;
    let other = ctx.namespace("other")?;
    let rest = ctx.rest();
    ctx.configmap(&other, "free", json!({}))?;
    let free = format!("/api/v1/namespaces/{other}/configmaps/free");
    let selector_lock = ctx.cluster_name("lock-kinds");
    let result = widening_checks(ctx, &tenant, &free, &selector_lock);
    let path = format!("/apis/objectlock.dev/v1alpha1/clusterlocks/{selector_lock}");
    let reply = rest.delete(&path)?;
    ensure!(
        reply.ok() || reply.code == 404,
        "DELETE {path}: {}",
        reply.code
    );
    result
}

fn widening_checks(ctx: &Ctx, tenant: &str, free: &str, selector_lock: &str) -> Result<()> {
    let rest = ctx.rest();
    let lock_kinds =
        json!([{"apiGroups": ["objectlock.dev"], "resources": ["locks", "clusterlocks"]}]);
    ctx.cluster_lock(
        selector_lock,
        json!({"selector": {"matchLabels": {"any": "thing"}}, "resources": lock_kinds}),
    )?;
    for i in 0..5 {
        ctx.lock(
            tenant,
            &format!("nothing-{i}"),
            json!({"resources": [{"apiGroups": ["objectlock.dev"], "resources": ["locks"]}]}),
        )?;
    }
    // Four real Locks in the tenant's namespace; the last one enforced means the registration
    // was written from a view holding every Lock above.
    for i in 0..4 {
        ctx.configmap(tenant, &format!("held-{i}"), json!({}))?;
        ctx.lock(tenant, &format!("held-{i}"), json!({}))?;
    }
    let held = format!("/api/v1/namespaces/{tenant}/configmaps/held-3");
    ctx.update_enforced(&held)?;

    // With the webhook stopped, only what the registration sends fails.
    ctx.with_webhook_stopped(|| {
        rest.probe_update(free)?
            .allowed("an unrelated update in another namespace, the webhook stopped")?;
        let reply = rest.probe_update(&held)?;
        ensure!(
            !reply.ok() && reply.message().contains("failed calling webhook"),
            "a locked update with the webhook stopped: {} {}",
            reply.code,
            reply.message()
        );
        Ok(())
    })?;

    // A bound the tenant's Locks exceed, above one key per namespace and ClusterLock: the
    // tenant's namespace, the largest, is sent whole, the rest stays narrowed (no base entry
    // sends everything). Counted from what the cluster holds (other scenarios' Locks too).
    let (namespaces, cluster, largest) = lock_counts(ctx)?;
    let bound = namespaces + cluster + 1;
    for i in 0..(bound + 1).max(largest + 1) {
        ctx.lock(tenant, &format!("more-{i}"), json!({}))?;
    }
    // A namespace sent whole is a key of the clause on the namespace alone.
    let namespace_only =
        "'.contains('|' + (has(request.namespace) ? request.namespace : '') + '|')";
    let sent_whole = |conditions: &str| {
        (conditions.split(" || ")).any(|clause| {
            let clause = clause.split(" //").next().unwrap_or(clause);
            clause.ends_with(namespace_only) && clause.contains(&format!("|{tenant}|"))
        })
    };
    let setting = bound.to_string();
    ctx.with_webhook_settings(&[("KUBE_OBJECT_LOCK__REGISTRATION__MAX_NAMES", &setting)], || {
        let start = std::time::Instant::now();
        loop {
            let conditions = crate::scenarios::narrowing::conditions(ctx)?;
            let broad = (conditions.lines())
                .filter(|l| crate::scenarios::narrowing::is_base_entry(l))
                .any(|l| l.split(" //").next().unwrap_or(l).ends_with("may-be-locked: true"));
            if sent_whole(&conditions) && !broad {
                break;
            }
            ensure!(
                start.elapsed() < crate::suite::ENFORCE_WITHIN,
                "with registration.max_names = {bound}, the registration did not send {tenant} whole and the rest narrowed: {conditions}"
            );
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        rest.probe_update(&held)?.refused("a held ConfigMap", "is locked by")?;
        Ok(())
    })
}

/// Deleting a CustomResourceDefinition deletes its objects without admission: while a Lock
/// covering DELETE names its resource, the CRD's deletion is refused with the Locks named and
/// how to lift them; unlocked, it goes.
pub fn crd_delete(ctx: &Ctx) -> Result<()> {
    let ns = ctx.namespace("")?;
    let group = format!("{}.example.com", ctx.cluster_name("g"));
    let crd_name = format!("widgets.{group}");
    let crd_path = format!("/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{crd_name}");
    let result = crd_checks(ctx, &ns, &group, &crd_path);
    // Whatever happened, leave no CRD behind.
    let _ = ctx.rest().delete(&crate::suite::lock_path(&ns, "db"));
    let _ = ctx.rest().delete(&crd_path);
    result
}

fn crd_checks(ctx: &Ctx, ns: &str, group: &str, crd_path: &str) -> Result<()> {
    let rest = ctx.rest();
    ctx.create(
        "/apis/apiextensions.k8s.io/v1/customresourcedefinitions",
        json!({"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
               "metadata": {"name": format!("widgets.{group}")},
               "spec": {"group": group, "scope": "Namespaced",
                        "names": {"plural": "widgets", "singular": "widget", "kind": "Widget"},
                        "versions": [{"name": "v1", "served": true, "storage": true,
                                      "schema": {"openAPIV3Schema": {"type": "object",
                                                 "x-kubernetes-preserve-unknown-fields": true}}}]}}),
    )?;
    let widgets = format!("/apis/{group}/v1/namespaces/{ns}/widgets");
    let widget =
        json!({"apiVersion": format!("{group}/v1"), "kind": "Widget", "metadata": {"name": "db"}});
    // Served once established.
    let start = std::time::Instant::now();
    while !rest.post(&widgets, &widget)?.ok() {
        ensure!(
            start.elapsed() < crate::suite::ENFORCE_WITHIN,
            "the CRD was never served"
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    ctx.lock(
        ns,
        "db",
        json!({"reason": "keep", "resources": [{"apiGroups": [group], "resources": ["widgets"]}]}),
    )?;
    ctx.delete_enforced(&format!("{widgets}/db"))?;
    let refused = ctx.enforced("dry-run DELETE of the CRD", || rest.probe_delete(crd_path))?;
    let message = format!(
        "would delete every widgets.{group} object, with no admission for them, and 1 lock protects some (Lock {ns}/db) (to unlock: kubectl delete lock db -n {ns})"
    );
    refused
        .refusal
        .refused("dry-run DELETE of the CRD", &message)?;
    ctx.k(&["delete", "crd", &format!("widgets.{group}"), "--wait=false"])
        .refused(&message)?;
    ensure!(
        rest.get(&format!("{widgets}/db"))?.ok(),
        "the locked widget is gone"
    );

    ctx.unlock(ns, "db")?;
    ctx.released(
        "dry-run DELETE of the CRD after unlock",
        crate::suite::ENFORCE_WITHIN,
        || rest.probe_delete(crd_path),
    )?;
    ctx.k(&["delete", "crd", &format!("widgets.{group}"), "--wait=false"])
        .allowed()?;
    Ok(())
}

/// The namespaces holding Locks, the ClusterLocks, and the most Locks one namespace holds.
fn lock_counts(ctx: &Ctx) -> Result<(usize, usize, usize)> {
    let list = |path: &str| -> Result<Vec<serde_json::Value>> {
        let reply = ctx.rest().get(path)?;
        ensure!(reply.ok(), "GET {path}: {} {}", reply.code, reply.message());
        Ok(reply.body["items"].as_array().cloned().unwrap_or_default())
    };
    let mut per_namespace = std::collections::BTreeMap::<String, usize>::new();
    for lock in list("/apis/objectlock.dev/v1alpha1/locks")? {
        let ns = lock["metadata"]["namespace"].as_str().unwrap_or_default();
        *per_namespace.entry(ns.to_owned()).or_default() += 1;
    }
    let cluster = list("/apis/objectlock.dev/v1alpha1/clusterlocks")?.len();
    let largest = per_namespace.values().copied().max().unwrap_or(0);
    Ok((per_namespace.len(), cluster, largest))
}
