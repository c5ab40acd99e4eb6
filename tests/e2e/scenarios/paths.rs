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
    let rest = ctx.rest();
    let pods = format!("/api/v1/namespaces/{ns}/pods");
    ctx.create(&pods, pod("db-0", json!({})))?;
    ctx.create(&pods, pod("db-1", json!({"app": "db"})))?;
    ctx.create(&pods, pod("web-0", json!({"app": "web"})))?;
    let proxy = |segment: &str| -> Result<Reply> { rest.get(&format!("{pods}/{segment}/proxy/x")) };

    ctx.lock(
        &ns,
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
        &ns,
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
