//! Rule 10: when the webhook may not read Locks (its RBAC binding removed), `on_lookup_error =
//! deny` refuses with 503 and says the lock state could not be read.
//!
//! An established watch outlives the removal of its permission (the API server authorizes a
//! request when it starts), so a running webhook keeps a live index and goes on answering from
//! it. The webhook is restarted after the binding is removed: it can then neither list nor
//! watch, which is the state the rule is about.

use std::time::{Duration, Instant};

use anyhow::{Result, bail, ensure};
use serde_json::json;

use crate::env::WebhookMode;
use crate::suite::{Ctx, skip};
use crate::webhook;

pub fn run(ctx: &Ctx) -> Result<()> {
    if ctx.env.cfg.mode != WebhookMode::Own {
        return skip("KOL_E2E_WEBHOOK=external: the webhook's RBAC is not the suite's to change");
    }
    let ns = ctx.namespace("")?;
    let n = ns.as_str();
    ctx.configmap(&ns, "x", json!({}))?;
    let path = format!("/api/v1/namespaces/{ns}/configmaps/x");
    // Only requests a Lock could concern reach the webhook (the registration is narrowed): a
    // Warn lock sends x's writes there and still lets them through once lookups work again.
    ctx.lock(&ns, "x", json!({"mode": "Warn"}))?;
    let start = Instant::now();
    while ctx.rest().probe_update(&path)?.warnings.is_empty() {
        ensure!(
            start.elapsed() < Duration::from_secs(30),
            "the Warn lock on x never warned"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    ctx.k(&["delete", "clusterrolebinding", "kube-object-lock"])
        .check()?;
    let result = ctx.restart_webhook().and_then(|()| check(ctx, n, &path));
    // Bind it again, as the README's registration step does. Updates of the objects that
    // exist (CRDs, ClusterRole) are themselves refused while the webhook cannot read
    // ClusterLocks; the binding is a CREATE, never sent, so it goes through.
    let again = webhook::register(
        &ctx.env.cfg.server_bin,
        &ctx.env.kubectl,
        &ctx.env.files,
        &format!("{}/kube-object-lock", ctx.env.system_ns),
    );
    if let Err(e) = again {
        let first = format!("{e:#}");
        ctx.note(format!(
            "re-applying manifests cluster while lookups fail: {}",
            first.lines().next().unwrap_or_default()
        ));
    }
    ctx.k(&["get", "clusterrolebinding", "kube-object-lock"])
        .check()?;
    let took = ctx.released(
        "update once the binding is back",
        Duration::from_secs(60),
        || ctx.rest().probe_update(&path),
    )?;
    ctx.note(format!(
        "writes allowed again {:.1}s after the binding came back",
        took.as_secs_f64()
    ));
    result
}

fn check(ctx: &Ctx, n: &str, path: &str) -> Result<()> {
    let start = Instant::now();
    let reply = loop {
        let reply = ctx.rest().probe_update(path)?;
        if reply.code == 503 {
            break reply;
        }
        if start.elapsed() > Duration::from_secs(30) {
            bail!(
                "no 503 within 30s of removing the webhook's binding: {} {}",
                reply.code,
                reply.message()
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    ensure!(
        reply.message().contains("the lock state could not be read")
            && reply.message().contains("on_lookup_error=deny"),
        "503 without the README's explanation: {}",
        reply.message()
    );
    ctx.note(format!(
        "refusal: {} {}: {}",
        reply.code,
        reply.reason(),
        reply.message()
    ));
    let out = ctx.k(&["label", "configmap", "x", "-n", n, "y=1"]);
    ensure!(
        !out.ok() && out.stderr.contains("lock state could not be read"),
        "kubectl label without RBAC: {}",
        out.stderr
    );
    Ok(())
}
