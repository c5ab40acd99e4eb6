//! Rule 8 and "Combining locks": a Namespace holding a live Enforce Lock cannot be deleted;
//! Warn and expired Locks do not block it, and then the namespace controller empties and
//! removes it through the webhook (its DELETECOLLECTION items carry no name).

use std::time::{Duration, Instant};

use anyhow::{Result, ensure};
use serde_json::json;

use crate::suite::{CLUSTER_DENIAL, Ctx, ENFORCE_WITHIN};

/// Waits until the namespace is gone (needs a controller manager).
fn gone(ctx: &Ctx, ns: &str, within: Duration) -> Result<Duration> {
    ctx.gone(&format!("/api/v1/namespaces/{ns}"), within)
}

pub fn run(ctx: &Ctx) -> Result<()> {
    let rest = ctx.rest();

    // An Enforce Lock blocks.
    let locked_ns = ctx.namespace("locked")?;
    ctx.configmap(&locked_ns, "x", json!({}))?;
    ctx.lock(&locked_ns, "x", json!({"reason": "keep"}))?;
    ctx.update_enforced(&format!("/api/v1/namespaces/{locked_ns}/configmaps/x"))?;
    let out = ctx.k(&["delete", "namespace", &locked_ns, "--wait=false"]);
    // What it must say: which namespace, that its locked objects would go, which lock.
    out.refused(&format!(
        "{CLUSTER_DENIAL}deleting namespaces \"{locked_ns}\" would delete the objects locked by"
    ))?;
    ensure!(
        out.stderr.contains("(x") || out.stderr.contains("/x"),
        "the refusal does not name the Lock x: {}",
        out.stderr.trim()
    );
    ctx.note(format!("refusal: {}", out.stderr.trim()));
    let ns_path = format!("/api/v1/namespaces/{locked_ns}");
    let reply = rest.delete(&format!("{ns_path}?dryRun=All"))?;
    reply.refused(
        "dry-run namespace DELETE",
        &format!("namespaces \"{locked_ns}\""),
    )?;
    ensure!(
        rest.get(&ns_path)?.body["status"]["phase"] == "Active",
        "the namespace is not Active after the refusal"
    );

    // Warn and expired Locks do not block; the deletion warns about the Warn lock.
    let soft_ns = ctx.namespace("soft")?;
    ctx.configmap(&soft_ns, "w", json!({}))?;
    ctx.configmap(&soft_ns, "old", json!({}))?;
    ctx.lock(
        &soft_ns,
        "old",
        json!({"expiresAt": "2020-01-01T00:00:00Z"}),
    )?;
    ctx.lock(&soft_ns, "w", json!({"mode": "Warn", "reason": "trying"}))?;
    // Seen once the Warn lock warns on its object.
    let w = format!("/api/v1/namespaces/{soft_ns}/configmaps/w");
    let start = Instant::now();
    while !rest
        .probe_update(&w)?
        .warnings
        .iter()
        .any(|x| x.contains("(mode Warn) would refuse this"))
    {
        ensure!(
            start.elapsed() < ENFORCE_WITHIN,
            "the Warn lock never warned"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    ctx.k(&["delete", "namespace", &soft_ns, "--wait=false"])
        .allowed_warning("Warn-mode Lock")?;

    // An UPDATE-only Lock would not refuse its object's DELETE.
    let update_only_ns = ctx.namespace("update-only")?;
    ctx.configmap(&update_only_ns, "u", json!({}))?;
    ctx.lock(&update_only_ns, "u", json!({"operations": ["UPDATE"]}))?;
    ctx.update_enforced(&format!("/api/v1/namespaces/{update_only_ns}/configmaps/u"))?;
    let reply = rest.delete(&format!("/api/v1/namespaces/{update_only_ns}?dryRun=All"))?;
    reply.allowed("namespace DELETE with an UPDATE-only Lock")?;

    // Unlocked, the namespace can go.
    ctx.unlock(&locked_ns, "x")?;
    ctx.released("namespace DELETE after unlock", ENFORCE_WITHIN, || {
        rest.delete(&format!("{ns_path}?dryRun=All"))
    })?;
    ctx.k(&["delete", "namespace", &locked_ns, "--wait=false"])
        .allowed()?;

    if ctx.env.kcm {
        // The namespace controller deletes the contents item by item (DELETECOLLECTION), the
        // Warn-locked ConfigMap and the Locks included, then the namespace.
        let took = gone(ctx, &soft_ns, Duration::from_secs(90))?;
        ctx.note(format!(
            "namespace with Warn and expired Locks removed by the controller in {:.1}s",
            took.as_secs_f64()
        ));
        gone(ctx, &locked_ns, Duration::from_secs(90))?;
    } else {
        ctx.note("no controller manager: namespace removal not followed");
    }
    Ok(())
}
