//! ClusterLocks lock cluster-scoped objects (a ClusterRole, a Namespace), through the
//! cluster-scoped webhook; they do not reach namespaced objects of the same name.

use anyhow::{Result, ensure};
use serde_json::json;

use crate::suite::{CLUSTER_DENIAL, Ctx, ENFORCE_WITHIN, RUN_LABEL};

const REASON: &str = "cluster freeze";

pub fn run(ctx: &Ctx) -> Result<()> {
    let rest = ctx.rest();
    let role = ctx.cluster_name("role");
    ctx.create(
        "/apis/rbac.authorization.k8s.io/v1/clusterroles",
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
               "metadata": {"name": role, "labels": {RUN_LABEL: ctx.env.run}},
               "rules": []}),
    )?;
    ctx.cluster_lock(&role, json!({"reason": REASON}))?;
    let path = format!("/apis/rbac.authorization.k8s.io/v1/clusterroles/{role}");
    ctx.update_enforced(&path)?;
    let message = format!(
        "clusterroles.rbac.authorization.k8s.io \"{role}\" is locked by ClusterLock {role}: {REASON} (to unlock: kubectl delete clusterlock {role})"
    );
    let full = format!("{CLUSTER_DENIAL}{message}");
    ctx.k(&["label", "clusterrole", &role, "checked=yes"])
        .refused(&full)?;
    ctx.k(&["delete", "clusterrole", &role, "--dry-run=server"])
        .refused(&full)?;
    ctx.k(&["delete", "clusterrole", &role, "--wait=false"])
        .refused(&full)?;
    let reply = rest.delete(&path)?;
    reply.refused("DELETE clusterrole", &message)?;
    ensure!(reply.message() == full, "message: {}", reply.message());

    // A namespaced object of that name is not covered by the ClusterLock.
    let ns = ctx.namespace("")?;
    ctx.configmap(&ns, &role, json!({}))?;
    ctx.k(&["label", "configmap", &role, "-n", &ns, "checked=yes"])
        .allowed()?;

    // A Namespace under a ClusterLock: no label, no deletion.
    let locked_ns = ctx.namespace("ns")?;
    ctx.cluster_lock(&locked_ns, json!({"reason": REASON}))?;
    ctx.update_enforced(&format!("/api/v1/namespaces/{locked_ns}"))?;
    let ns_message = format!(
        "namespaces \"{locked_ns}\" is locked by ClusterLock {locked_ns}: {REASON} (to unlock: kubectl delete clusterlock {locked_ns})"
    );
    ctx.k(&["label", "namespace", &locked_ns, "checked=yes"])
        .refused(&ns_message)?;
    ctx.k(&["delete", "namespace", &locked_ns, "--wait=false"])
        .refused(&ns_message)?;

    // Unlock with kubectl, as the README says.
    ctx.k(&["delete", "clusterlock", &role]).allowed()?;
    ctx.released("clusterrole DELETE after unlock", ENFORCE_WITHIN, || {
        rest.probe_delete(&path)
    })?;
    ctx.k(&["delete", "clusterrole", &role]).allowed()?;
    ctx.k(&["delete", "clusterlock", &locked_ns]).allowed()?;
    Ok(())
}
