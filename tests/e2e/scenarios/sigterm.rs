//! An instance withdraws from lock status when it stops: the suite's webhook is stopped with
//! SIGTERM, and by the time it has exited its entry is gone from a Lock's `status.enforcedBy`
//! (`enforcedCount` 0, no `Enforced` condition saying Enforcing), so `kubectl lock` cannot
//! confirm a new lock and says no instance reports it. Started again, it is back in the status
//! and both locks hold.

use std::time::{Duration, Instant};

use anyhow::{Result, bail, ensure};
use serde_json::{Value, json};

use crate::env::WebhookMode;
use crate::suite::{Ctx, ENFORCE_WITHIN, skip};

/// How long after the exit the withdrawal may take to show (it is written before the exit; a
/// margin for a loaded machine).
const WITHDRAWN_WITHIN: Duration = Duration::from_secs(10);

pub fn run(ctx: &Ctx) -> Result<()> {
    if ctx.env.cfg.mode != WebhookMode::Own {
        return skip("KOL_E2E_WEBHOOK=external: the webhook is not the suite's to stop");
    }
    let ns = ctx.namespace("")?;
    let n = ns.as_str();
    ctx.configmap(n, "held", json!({}))?;
    ctx.configmap(n, "later", json!({}))?;
    ctx.lock(n, "held", json!({"reason": "across a stop"}))?;
    let held = format!("/api/v1/namespaces/{n}/configmaps/held");
    ctx.update_enforced(&held)?;
    let lock_path = format!("/apis/objectlock.dev/v1alpha1/namespaces/{n}/locks/held");
    let instances = poll(ENFORCE_WITHIN, || {
        let lock = ctx.rest().get(&lock_path)?.body;
        let names = instances(&lock);
        Ok((!names.is_empty()).then_some(names))
    })
    .map_err(|e| e.context("the Lock's status never named an enforcing instance"))?;
    ensure!(
        instances.len() == 1,
        "more than the suite's instance enforces the Lock: {instances:?}"
    );
    let instance = instances[0].clone();

    let stopped = ctx.with_webhook_stopped(|| {
        let start = Instant::now();
        let lock = poll(WITHDRAWN_WITHIN, || {
            let lock = ctx.rest().get(&lock_path)?.body;
            Ok((!instances_of(&lock).contains(&instance)).then_some(lock))
        })
        .map_err(|e| {
            e.context(format!(
                "after SIGTERM, instance {instance} is still in the Lock's status.enforcedBy"
            ))
        })?;
        let after = start.elapsed();
        ensure!(
            lock["status"]["enforcedCount"].as_i64().unwrap_or(0) == 0,
            "enforcedCount after the only instance withdrew: {}",
            lock["status"]
        );
        let enforcing = lock["status"]["conditions"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|c| c["type"] == "Enforced" && c["status"] == "True");
        ensure!(
            !enforcing,
            "the Enforced condition still says True after the only instance withdrew: {}",
            lock["status"]
        );
        // A lock made now cannot be confirmed: no instance reports it.
        let out = ctx.k(&["lock", "cm/later", "-n", n, "--timeout", "3s"]);
        ensure!(
            out.code() == Some(1)
                && out.stderr.contains(&format!(
                    "Lock {n}/later was created but is not in force after 3s"
                ))
                && out
                    .stderr
                    .contains("no kube-object-lock instance has reported it as enforced"),
            "`{}` with the webhook stopped: exit {:?}: {}{}",
            out.cmd,
            out.code(),
            out.stderr.trim(),
            out.stdout.trim()
        );
        Ok(after)
    });
    let after = stopped?;

    // Back: the entry returns, both locks hold.
    poll(ENFORCE_WITHIN, || {
        let lock = ctx.rest().get(&lock_path)?.body;
        Ok(instances_of(&lock).contains(&instance).then_some(()))
    })
    .map_err(|e| e.context("after the restart the instance is not back in the Lock's status"))?;
    ctx.update_enforced(&held)?;
    ctx.update_enforced(&format!("/api/v1/namespaces/{n}/configmaps/later"))?;
    ctx.note(format!(
        "instance {instance} withdrawn from status.enforcedBy by its exit (seen {:.1}s after it)",
        after.as_secs_f64()
    ));
    Ok(())
}

/// The instances in `status.enforcedBy` for the Lock's current generation.
pub(crate) fn instances(lock: &Value) -> Vec<String> {
    let generation = &lock["metadata"]["generation"];
    lock["status"]["enforcedBy"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|e| e["observedGeneration"] == *generation)
        .filter_map(|e| e["instance"].as_str().map(str::to_owned))
        .collect()
}

/// Every instance in `status.enforcedBy`, whatever generation.
pub(crate) fn instances_of(lock: &Value) -> Vec<String> {
    lock["status"]["enforcedBy"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|e| e["instance"].as_str().map(str::to_owned))
        .collect()
}

/// Polls `probe` until it yields a value, at most `within`.
pub(crate) fn poll<T>(within: Duration, mut probe: impl FnMut() -> Result<Option<T>>) -> Result<T> {
    let start = Instant::now();
    loop {
        if let Some(value) = probe()? {
            return Ok(value);
        }
        if start.elapsed() > within {
            bail!("not seen within {within:?}");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}
