//! Each field of a Lock's spec, as the README's "Locking objects" describes it. Every check
//! that something is *allowed* comes after a refusal that shows the lock set is in force.

use std::time::{Duration, Instant};

use anyhow::{Result, bail, ensure};
use serde_json::json;

use super::pods::{eviction, pod};
use super::scale::deployment;
use crate::kubectl::warning_matches;
use crate::suite::{Ctx, ENFORCE_WITHIN, locked};

fn cm_path(ns: &str, name: &str) -> String {
    format!("/api/v1/namespaces/{ns}/configmaps/{name}")
}

/// `operations`: a DELETE-only lock lets the object be edited, not removed; UPDATE-only the
/// reverse.
pub fn operations(ctx: &Ctx) -> Result<()> {
    let ns = ctx.namespace("")?;
    let n = ns.as_str();
    ctx.configmap(&ns, "del-only", json!({}))?;
    ctx.configmap(&ns, "upd-only", json!({}))?;
    ctx.lock(&ns, "del-only", json!({"operations": ["DELETE"]}))?;
    ctx.lock(&ns, "upd-only", json!({"operations": ["UPDATE"]}))?;
    ctx.delete_enforced(&cm_path(n, "del-only"))?;
    ctx.update_enforced(&cm_path(n, "upd-only"))?;
    let del_msg = locked("configmaps", n, "del-only", None);
    let upd_msg = locked("configmaps", n, "upd-only", None);
    ctx.k(&["label", "configmap", "del-only", "-n", n, "edited=yes"])
        .allowed()?;
    ctx.k(&["delete", "configmap", "del-only", "-n", n, "--wait=false"])
        .refused(&del_msg)?;
    ctx.k(&["label", "configmap", "upd-only", "-n", n, "edited=yes"])
        .refused(&upd_msg)?;
    ctx.k(&["delete", "configmap", "upd-only", "-n", n])
        .allowed()?;
    Ok(())
}

/// `resources`: the Deployment "web" is locked, the ConfigMap "web" is not; subresources
/// follow their resource.
pub fn resources(ctx: &Ctx) -> Result<()> {
    let ns = ctx.namespace("")?;
    let n = ns.as_str();
    ctx.create(
        &format!("/apis/apps/v1/namespaces/{ns}/deployments"),
        deployment("web", json!({})),
    )?;
    ctx.configmap(&ns, "web", json!({}))?;
    ctx.lock(
        &ns,
        "web",
        json!({"resources": [{"apiGroups": ["apps"], "resources": ["deployments"]}]}),
    )?;
    ctx.update_enforced(&format!("/apis/apps/v1/namespaces/{ns}/deployments/web"))?;
    let message = locked("deployments.apps", n, "web", None);
    ctx.k(&["label", "deployment", "web", "-n", n, "x=1"])
        .refused(&message)?;
    ctx.k(&["scale", "deployment", "web", "-n", n, "--replicas=2"])
        .refused(&message)?;
    ctx.k(&["label", "configmap", "web", "-n", n, "x=1"])
        .allowed()?;
    ctx.k(&["delete", "configmap", "web", "-n", n]).allowed()?;
    Ok(())
}

/// `selector`: every object whose labels (before the change) match, whatever its name; the
/// Lock's own name is free; evictions and scales by the labels of the pod or the scaled object
/// (their reviews carry none: the webhook reads them).
pub fn selector(ctx: &Ctx) -> Result<()> {
    let ns = ctx.namespace("")?;
    let n = ns.as_str();
    let rest = ctx.rest();
    for (name, labels) in [
        ("a", json!({"app": "web"})),
        ("b", json!({"app": "web"})),
        ("c", json!({"app": "db"})),
        ("sel", json!({})),
    ] {
        ctx.configmap(&ns, name, labels)?;
    }
    for (name, app) in [("d", "web"), ("e", "db")] {
        ctx.create(
            &format!("/apis/apps/v1/namespaces/{ns}/deployments"),
            deployment(name, json!({"app": app})),
        )?;
    }
    for (name, app) in [("p", "web"), ("q", "db")] {
        ctx.create(
            &format!("/api/v1/namespaces/{ns}/pods"),
            pod(name, json!({"app": app})),
        )?;
    }
    ctx.lock(
        &ns,
        "sel",
        json!({"selector": {"matchLabels": {"app": "web"}}, "reason": "web freeze"}),
    )?;
    ctx.update_enforced(&cm_path(n, "a"))?;
    let message = format!(
        "configmaps \"b\" in namespace \"{ns}\" is locked by Lock {ns}/sel: web freeze (to unlock: kubectl delete lock sel -n {ns})"
    );
    ctx.k(&["annotate", "configmap", "b", "-n", n, "x=1"])
        .refused(&message)?;
    ctx.k(&["delete", "configmap", "b", "-n", n, "--wait=false"])
        .refused(&message)?;
    // Labels as they are before the change: removing the label is still refused, adding it
    // to an unselected object is not.
    ctx.k(&["label", "configmap", "a", "-n", n, "app-"])
        .refused("locked by Lock")?;
    ctx.k(&["label", "configmap", "c", "-n", n, "app=web", "--overwrite"])
        .allowed()?;
    ctx.k(&["label", "configmap", "sel", "-n", n, "x=1"])
        .allowed()?;
    ctx.k(&["label", "deployment", "d", "-n", n, "x=1"])
        .refused("locked by Lock")?;
    // Scale and eviction carry none of the object's labels; the webhook reads them, so the
    // selected Deployment's scale and the selected pod's eviction are refused...
    let locked_by = format!("is locked by Lock {ns}/sel: web freeze");
    ctx.k(&["scale", "deployment", "d", "-n", n, "--replicas=2"])
        .refused(&format!(
            "deployments.apps \"d\" in namespace \"{ns}\" {locked_by}"
        ))?;
    let evicted = format!("cannot evict: pods \"p\" in namespace \"{ns}\" {locked_by}");
    let evict = |name: &str| format!("/api/v1/namespaces/{ns}/pods/{name}/eviction");
    ctx.k_in(
        &["create", "--raw", &evict("p"), "-f", "-"],
        &eviction(&ns, "p", false).to_string(),
    )
    .refused(&evicted)?;
    rest.post(&evict("p"), &eviction(&ns, "p", false))?
        .refused("eviction of a selected pod", &evicted)?;
    rest.post(&evict("p"), &eviction(&ns, "p", true))?
        .refused("dry-run eviction of a selected pod", &evicted)?;
    // ...and the unselected ones go through (the pod is Pending: the eviction deletes it).
    ctx.k(&["scale", "deployment", "e", "-n", n, "--replicas=2"])
        .allowed()?;
    rest.post(&evict("q"), &eviction(&ns, "q", false))?
        .allowed("eviction of an unselected pod")?;

    // Only negative terms: an object without the label is selected, and so is the scale of a
    // Deployment without it, by the Deployment's labels.
    let neg = ctx.namespace("neg")?;
    ctx.configmap(&neg, "plain", json!({}))?;
    for (name, labels) in [("d", json!({})), ("db", json!({"tier": "db"}))] {
        ctx.create(
            &format!("/apis/apps/v1/namespaces/{neg}/deployments"),
            deployment(name, labels),
        )?;
    }
    ctx.lock(
        &neg,
        "not-db",
        json!({"selector": {"matchExpressions": [{"key": "tier", "operator": "NotIn", "values": ["db"]}]}}),
    )?;
    ctx.update_enforced(&cm_path(&neg, "plain"))?;
    ctx.k(&["scale", "deployment", "d", "-n", &neg, "--replicas=2"])
        .refused(&format!(
            "deployments.apps \"d\" in namespace \"{neg}\" is locked by Lock {neg}/not-db"
        ))?;
    ctx.k(&["scale", "deployment", "db", "-n", &neg, "--replicas=2"])
        .allowed()?;
    Ok(())
}

/// `exempt`: users, groups and service accounts may write anyway, with a warning.
pub fn exempt(ctx: &Ctx) -> Result<()> {
    let ns = ctx.namespace("")?;
    let n = ns.as_str();
    let run = &ctx.env.run;
    let alice = format!("kol-e2e-{run}-alice");
    let operators = format!("kol-e2e-{run}-operators");
    for sa in ["exempt-sa", "other-sa"] {
        ctx.k(&["create", "serviceaccount", sa, "-n", n]).check()?;
    }
    ctx.k(&[
        "create",
        "rolebinding",
        "edit",
        "-n",
        n,
        "--clusterrole=edit",
        &format!("--serviceaccount={n}:exempt-sa"),
        &format!("--serviceaccount={n}:other-sa"),
        &format!("--user={alice}"),
        &format!("--group={operators}"),
    ])
    .check()?;
    for name in ["by-user", "by-group", "by-sa"] {
        ctx.configmap(&ns, name, json!({}))?;
    }
    ctx.lock(&ns, "by-user", json!({"exempt": {"users": [alice]}}))?;
    ctx.lock(&ns, "by-group", json!({"exempt": {"groups": [operators]}}))?;
    ctx.lock(
        &ns,
        "by-sa",
        json!({"exempt": {"serviceAccounts": [format!("{n}/exempt-sa")]}}),
    )?;
    ctx.update_enforced(&cm_path(n, "by-sa"))?;

    let other = format!("--as=system:serviceaccount:{n}:other-sa");
    let exempt_sa = format!("--as=system:serviceaccount:{n}:exempt-sa");
    let as_alice = format!("--as={alice}");
    let as_bob = format!("--as=kol-e2e-{run}-bob");
    let in_group = format!("--as-group={operators}");
    for name in ["by-user", "by-group", "by-sa"] {
        ctx.k(&["label", "configmap", name, "-n", n, "x=1", &other])
            .refused(&locked("configmaps", n, name, None))?;
    }
    ctx.k(&["label", "configmap", "by-user", "-n", n, "x=1", &as_alice])
        .allowed_warning(&format!(
            "allowed by exemption: user {alice} is exempt from Lock {n}/by-user"
        ))?;
    ctx.k(&[
        "label",
        "configmap",
        "by-group",
        "-n",
        n,
        "x=1",
        &as_bob,
        &in_group,
    ])
    .allowed_warning(&format!(
        "allowed by exemption: group {operators} is exempt from Lock {n}/by-group"
    ))?;
    ctx.k(&["label", "configmap", "by-sa", "-n", n, "x=1", &exempt_sa])
        .allowed_warning(&format!(
            "allowed by exemption: service account {n}/exempt-sa is exempt from Lock {n}/by-sa"
        ))?;
    ctx.k(&["delete", "configmap", "by-sa", "-n", n, &exempt_sa])
        .allowed()?;
    Ok(())
}

/// `expiresAt`: an expired lock no longer applies; a lock stops applying when it expires, by
/// itself; `kubectl get locks` shows when.
pub fn expiry(ctx: &Ctx) -> Result<()> {
    let ns = ctx.namespace("")?;
    let n = ns.as_str();
    let rest = ctx.rest();
    for name in ["old", "soon", "sentinel"] {
        ctx.configmap(&ns, name, json!({}))?;
    }
    let soon_secs = 15;
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?;
    let soon_at = now + Duration::from_secs(soon_secs);
    let soon_text = k8s_time(soon_at.as_secs())?;
    ctx.lock(&ns, "old", json!({"expiresAt": "2020-01-01T00:00:00Z"}))?;
    let created = Instant::now();
    ctx.lock(&ns, "soon", json!({"expiresAt": soon_text}))?;
    ctx.lock(&ns, "sentinel", json!({}))?;
    ctx.update_enforced(&cm_path(n, "sentinel"))?;
    ctx.k(&["label", "configmap", "old", "-n", n, "x=1"])
        .allowed()?;
    let early = created.elapsed() < Duration::from_secs(soon_secs - 5);
    if early {
        ctx.k(&["label", "configmap", "soon", "-n", n, "x=1"])
            .refused(&locked("configmaps", n, "soon", None))?;
    } else {
        ctx.note("too slow to see the 15 s lock before it expired; only its expiry is checked");
    }
    let table = ctx.k(&["get", "locks", "-n", n]).check()?.stdout;
    ensure!(
        table.contains("EXPIRES")
            && table.contains(&soon_text)
            && table.contains("2020-01-01T00:00:00Z"),
        "kubectl get locks does not show the expiry: {table}"
    );
    let took = ctx.released(
        "update after expiresAt",
        Duration::from_secs(soon_secs + 20),
        || rest.probe_update(&cm_path(n, "soon")),
    )?;
    let wall = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?;
    let late = wall.as_secs_f64() - soon_at.as_secs() as f64;
    ensure!(
        late > -1.0,
        "released {late:.1}s before its expiresAt (after {:.1}s)",
        took.as_secs_f64()
    );
    ctx.note(format!(
        "a lock expiring by itself released {late:.1}s after its expiresAt"
    ));
    Ok(())
}

/// RFC 3339 UTC time of a Unix second.
fn k8s_time(secs: u64) -> Result<String> {
    let t = k8s_openapi::jiff::Timestamp::from_second(i64::try_from(secs)?)?;
    Ok(t.strftime("%Y-%m-%dT%H:%M:%SZ").to_string())
}

/// `mode: Warn`: allowed with a warning naming the lock and its reason.
pub fn warn(ctx: &Ctx) -> Result<()> {
    let ns = ctx.namespace("")?;
    let n = ns.as_str();
    let rest = ctx.rest();
    ctx.configmap(&ns, "w", json!({}))?;
    ctx.lock(&ns, "w", json!({"mode": "Warn", "reason": "trying it"}))?;
    let warning = format!("Lock {n}/w (mode Warn) would refuse this: trying it");
    let start = Instant::now();
    loop {
        let reply = rest.probe_update(&cm_path(n, "w"))?;
        reply.allowed("dry-run update under a Warn lock")?;
        if reply.warnings.iter().any(|w| warning_matches(w, &warning)) {
            break;
        }
        if start.elapsed() > ENFORCE_WITHIN {
            bail!("no warning `{warning}`: {:?}", reply.warnings);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    ctx.k(&["label", "configmap", "w", "-n", n, "x=1"])
        .allowed_warning(&warning)?;
    ctx.k(&["delete", "configmap", "w", "-n", n])
        .allowed_warning(&warning)?;
    Ok(())
}

/// The CRD refuses a mistyped Lock with a message, and every spec the webhook could not read;
/// `kubectl explain` documents the fields.
pub fn validation(ctx: &Ctx) -> Result<()> {
    let ns = ctx.namespace("")?;
    let cases = [
        ("operations: [DELET]", "spec.operations[0]"),
        ("selector: {}", "an empty selector would lock every object"),
        ("mode: Block", "spec.mode"),
        ("expiresAt: tomorrow", "spec.expiresAt"),
        // Date-times the API server's own format check lets through and the webhook cannot
        // read: refused by the CRD's rule.
        (
            "expiresAt: \"2030-01-01T00:00:00x1Z\"",
            "spec.expiresAt: Invalid value: \"2030-01-01T00:00:00x1Z\": expiresAt must be an RFC 3339 time",
        ),
        (
            "expiresAt: \"2030-01-01T00:00:00+99:00\"",
            "spec.expiresAt: Invalid value: \"2030-01-01T00:00:00+99:00\": expiresAt must be an RFC 3339 time",
        ),
        (
            "selector: {matchExpressions: [{key: app, operator: In}]}",
            "matchExpressions: In and NotIn need at least one value, Exists and DoesNotExist take none",
        ),
        (
            "selector: {matchExpressions: [{key: app, operator: Exists, values: [x]}]}",
            "matchExpressions: In and NotIn need at least one value, Exists and DoesNotExist take none",
        ),
        (
            "selector: {matchExpressions: [{key: a, operator: Is, values: [b]}]}",
            "matchExpressions operators are In, NotIn, Exists or DoesNotExist",
        ),
        (
            "exempt: {serviceAccounts: [velero]}",
            "spec.exempt.serviceAccounts",
        ),
        (
            "resources: [{apiGroups: [apps]}]",
            "spec.resources[0].resources",
        ),
        ("reasn: typo", "unknown field \"spec.reasn\""),
    ];
    let mut failures = Vec::new();
    for (i, (spec, expected)) in cases.iter().enumerate() {
        let yaml = format!(
            "apiVersion: objectlock.dev/v1alpha1\nkind: Lock\nmetadata:\n  name: bad-{i}\n  namespace: {ns}\nspec:\n  {spec}\n"
        );
        let out = ctx.k_in(&["create", "-f", "-"], &yaml);
        if out.ok() || !out.stderr.contains(expected) {
            failures.push(format!(
                "`{spec}`: expected a refusal with `{expected}`, got: {}",
                if out.ok() {
                    "created".to_owned()
                } else {
                    out.stderr.trim().to_owned()
                }
            ));
        }
    }
    ensure!(failures.is_empty(), "{}", failures.join("\n    "));
    let explain = ctx.k(&["explain", "lock.spec"]).check()?.stdout;
    for field in [
        "operations",
        "resources",
        "selector",
        "exempt",
        "expiresAt",
        "mode",
        "reason",
    ] {
        ensure!(
            explain.contains(field),
            "kubectl explain lock.spec lacks {field}: {explain}"
        );
    }
    let explain = ctx.k(&["explain", "clusterlock.spec"]).check()?;
    ensure!(
        explain.stdout.contains("expiresAt"),
        "kubectl explain clusterlock.spec"
    );
    Ok(())
}

/// "Combining locks": the named lock and a matching selector lock both enforce; one message
/// names both, with one command removing both; a Warn lock beside them only warns.
pub fn combining(ctx: &Ctx) -> Result<()> {
    let ns = ctx.namespace("")?;
    let n = ns.as_str();
    ctx.configmap(&ns, "web", json!({"app": "web"}))?;
    ctx.lock(&ns, "web", json!({"reason": "named"}))?;
    ctx.lock(
        &ns,
        "by-label",
        json!({"selector": {"matchLabels": {"app": "web"}}, "reason": "selected"}),
    )?;
    ctx.lock(
        &ns,
        "gentle",
        json!({"selector": {"matchLabels": {"app": "web"}}, "mode": "Warn"}),
    )?;
    let enforced = ctx.update_enforced(&cm_path(n, "web"))?;
    let message = enforced.refusal.message();
    for part in [
        format!("configmaps \"web\" in namespace \"{ns}\" is locked by "),
        format!("Lock {ns}/web: named"),
        format!("Lock {ns}/by-label: selected"),
    ] {
        ensure!(message.contains(&part), "`{part}` missing from: {message}");
    }
    ensure!(
        message.contains(&format!(
            "(to unlock: kubectl delete lock by-label web -n {ns})"
        )) || message.contains(&format!(
            "(to unlock: kubectl delete lock web by-label -n {ns})"
        )),
        "no single unlock command for both: {message}"
    );
    ensure!(
        !message.contains("gentle"),
        "the Warn lock is named in the refusal: {message}"
    );
    ctx.k(&["delete", "lock", "web", "by-label", "-n", n])
        .allowed()?;
    ctx.released("update after both locks went", ENFORCE_WITHIN, || {
        ctx.rest().probe_update(&cm_path(n, "web"))
    })?;
    ctx.k(&["label", "configmap", "web", "-n", n, "x=1"])
        .allowed_warning(&format!("Lock {n}/gentle (mode Warn) would refuse this"))?;
    Ok(())
}
