//! The webhook may list Locks but not watch them (its ClusterRole trimmed by hand, a policy
//! engine): its index cannot go live, so it lists again on every retry, and the narrowed
//! registration follows those lists. A Lock created meanwhile must hold within the bound: no
//! write to its object is allowed later than that after its creation was acknowledged.
//!
//! An established watch outlives the removal of its permission, so the webhook is restarted
//! once `watch` is gone, and again once it is back.

use std::time::{Duration, Instant};

use anyhow::{Context, Result, ensure};
use serde_json::{Value, json};

use crate::env::WebhookMode;
use crate::suite::{Ctx, skip};

/// The bound: from a Lock's acknowledged creation to the last write allowed.
const BOUND: Duration = Duration::from_secs(2);
/// Locks created this far apart, so that they fall at different points of the list cycle.
const SPACING: Duration = Duration::from_millis(700);
const LOCKS: usize = 5;

pub fn run(ctx: &Ctx) -> Result<()> {
    if ctx.env.cfg.mode != WebhookMode::Own {
        return skip("KOL_E2E_WEBHOOK=external: the webhook's RBAC is not the suite's to change");
    }
    let ns = ctx.namespace("")?;
    for i in 0..LOCKS {
        ctx.configmap(&ns, &format!("w{i}"), json!({}))?;
    }
    ctx.configmap(&ns, "before", json!({}))?;
    ctx.lock(&ns, "before", json!({}))?;
    ctx.update_enforced(&format!("/api/v1/namespaces/{ns}/configmaps/before"))?;

    let rule = locks_rule(ctx)?;
    set_verbs(ctx, rule, &["get", "list"])?;
    let result = ctx.restart_webhook().and_then(|()| measure(ctx, &ns));
    let restored =
        set_verbs(ctx, rule, &["get", "list", "watch"]).and_then(|()| ctx.restart_webhook());
    let outcome = result.and(restored);
    // With the watch back, a new Lock is enforced as usual.
    ctx.configmap(&ns, "after", json!({}))?;
    ctx.lock(&ns, "after", json!({}))?;
    ctx.update_enforced(&format!("/api/v1/namespaces/{ns}/configmaps/after"))?;
    outcome
}

/// Creates Locks while the webhook cannot watch, each probed until refused.
fn measure(ctx: &Ctx, ns: &str) -> Result<()> {
    let rest = ctx.rest();
    let before = format!("/api/v1/namespaces/{ns}/configmaps/before");
    // The Lock from before the restart: listed, so never let through.
    let start = Instant::now();
    let mut before_allowed = 0;
    let mut figures = Vec::new();
    for i in 0..LOCKS {
        while start.elapsed() < SPACING * (i as u32 + 1) {
            if rest.probe_update(&before)?.ok() {
                before_allowed += 1;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let name = format!("w{i}");
        let path = format!("/api/v1/namespaces/{ns}/configmaps/{name}");
        ctx.lock(ns, &name, json!({}))?;
        let acked = Instant::now();
        let (mut allowed, mut late) = (0, 0);
        let enforced = loop {
            let reply = rest.probe_update(&path)?;
            if reply.code == 403 {
                break acked.elapsed();
            }
            if reply.ok() {
                allowed += 1;
                if acked.elapsed() > BOUND {
                    late += 1;
                }
            }
            ensure!(
                acked.elapsed() < Duration::from_secs(30),
                "{name}: not enforced 30s after its Lock was created, with watch forbidden (last answer {} {})",
                reply.code,
                reply.message()
            );
            std::thread::sleep(Duration::from_millis(10));
        };
        ensure!(
            late == 0,
            "{name}: {late} writes allowed more than {BOUND:?} after its Lock was created, with watch forbidden"
        );
        figures.push(format!(
            "{:.0} ms ({allowed} writes allowed)",
            enforced.as_secs_f64() * 1000.0
        ));
    }
    ensure!(
        before_allowed == 0,
        "{before_allowed} updates of an object locked before the restart were allowed"
    );
    ctx.figure(format!(
        "watch forbidden (list allowed), narrowed registration: new Locks enforced after {}",
        figures.join(", ")
    ));
    Ok(())
}

/// The index of the ClusterRole rule granting the webhook access to Locks.
fn locks_rule(ctx: &Ctx) -> Result<usize> {
    let out = ctx
        .k(&["get", "clusterrole", "kube-object-lock", "-o", "json"])
        .check()?;
    let role: Value = serde_json::from_str(&out.stdout).context("clusterrole JSON")?;
    role["rules"]
        .as_array()
        .and_then(|rules| {
            rules.iter().position(|r| {
                r["resources"]
                    .as_array()
                    .is_some_and(|res| res.iter().any(|x| x == "locks"))
            })
        })
        .context("the ClusterRole kube-object-lock has no rule on locks")
}

fn set_verbs(ctx: &Ctx, rule: usize, verbs: &[&str]) -> Result<()> {
    ctx.json_patch(
        "clusterrole",
        "kube-object-lock",
        &json!([{"op": "replace", "path": format!("/rules/{rule}/verbs"), "value": verbs}]),
    )
}
