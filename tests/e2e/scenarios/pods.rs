//! Rules 2 and 4 on a Pod: eviction (CREATE of `pods/eviction`) and ephemeral containers are
//! locked, status writes are not; `pods/resize` as registered.

use anyhow::{Result, ensure};
use serde_json::{Value, json};

use crate::suite::{Ctx, NAMESPACED_DENIAL, locked};

const REASON: &str = "batch job running";

/// A Pod that stays Pending (no scheduler), with resources so that it can be resized.
pub fn pod(name: &str, labels: Value) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "labels": labels},
        "spec": {"containers": [{
            "name": "c", "image": "registry.invalid/pause:1",
            "resources": {"requests": {"cpu": "100m", "memory": "64Mi"},
                          "limits": {"cpu": "100m", "memory": "64Mi"}}
        }]}
    })
}

/// An Eviction body; `dry_run` asks for a server-side dry run.
pub fn eviction(ns: &str, name: &str, dry_run: bool) -> Value {
    let mut body = json!({"apiVersion": "policy/v1", "kind": "Eviction",
                          "metadata": {"name": name, "namespace": ns}});
    if dry_run {
        body["deleteOptions"] = json!({"dryRun": ["All"]});
    }
    body
}

pub fn run(ctx: &Ctx) -> Result<()> {
    let ns = ctx.namespace("")?;
    let n = ns.as_str();
    let rest = ctx.rest();
    ctx.create(
        &format!("/api/v1/namespaces/{ns}/pods"),
        pod("p", json!({})),
    )?;
    ctx.lock(&ns, "p", json!({"reason": REASON}))?;
    let path = format!("/api/v1/namespaces/{ns}/pods/p");
    ctx.update_enforced(&path)?;
    let message = locked("pods", &ns, "p", Some(REASON));

    // Eviction: as kubectl drain sends it, and over REST.
    let evict = format!("{path}/eviction");
    ctx.k_in(
        &["create", "--raw", &evict, "-f", "-"],
        &eviction(&ns, "p", false).to_string(),
    )
    .refused(&format!("{NAMESPACED_DENIAL}cannot evict: {message}"))?;
    let reply = rest.post(&evict, &eviction(&ns, "p", false))?;
    reply.refused("eviction", &format!("cannot evict: {message}"))?;
    rest.post(&evict, &eviction(&ns, "p", true))?
        .refused("dry-run eviction", &message)?;

    // Ephemeral containers: kubectl debug, and the subresource over REST.
    ctx.k(&[
        "debug",
        "p",
        "-n",
        n,
        "--image=registry.invalid/debug:1",
        "-c",
        "dbg",
        "--profile=general",
    ])
    .refused(&message)?;
    rest.call(
        "PATCH",
        &format!("{path}/ephemeralcontainers"),
        "application/strategic-merge-patch+json",
        Some(&json!({"spec": {"ephemeralContainers": [
            {"name": "dbg2", "image": "registry.invalid/debug:1"}]}})),
    )?
    .refused("PATCH pods/ephemeralcontainers", &message)?;

    // Status writes pass (kubelets and controllers must keep reporting).
    ctx.k(&[
        "patch",
        "pod",
        "p",
        "-n",
        n,
        "--subresource=status",
        "--type=merge",
        "-p",
        r#"{"status":{"conditions":[{"type":"example.com/E2E","status":"True"}]}}"#,
    ])
    .allowed()?;

    // In-place resize: locked if the registration sends it.
    let resize = ctx.k(&[
        "patch",
        "pod",
        "p",
        "-n",
        n,
        "--subresource=resize",
        "-p",
        r#"{"spec":{"containers":[{"name":"c","resources":{"requests":{"cpu":"200m","memory":"64Mi"},"limits":{"cpu":"200m","memory":"64Mi"}}}]}}"#,
    ]);
    if ctx.env.resize_registered {
        resize.refused(&message)?;
    } else {
        resize.allowed()?;
        ctx.note(
            "pods/resize is not in the registration: a locked pod was resized in place (the README says every subresource but status is locked)",
        );
    }

    // Unlocked, the eviction goes through and deletes the Pending pod.
    ctx.unlock(&ns, "p")?;
    ctx.released(
        "eviction after unlock",
        crate::suite::ENFORCE_WITHIN,
        || rest.post(&evict, &eviction(&ns, "p", true)),
    )?;
    let reply = rest.post(&evict, &eviction(&ns, "p", false))?;
    ensure!(
        reply.code == 201,
        "eviction after unlock: {} {}",
        reply.code,
        reply.message()
    );
    Ok(())
}
