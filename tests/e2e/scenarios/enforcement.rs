//! Locks you can see hold, through the real API server: the webhook records in each Lock's
//! status that it enforces it (server-side apply on the status subresource), `kubectl get
//! locks` shows the ENFORCED column, a Warn-mode Lock says so in its condition, and a refused
//! write leaves a `Blocked` Event regarding the Lock (a dry run leaves none) and does not write the
//! Lock.

use std::time::{Duration, Instant};

use anyhow::{Result, bail, ensure};
use serde_json::{Value, json};

use crate::suite::Ctx;

/// Status and events are written in the background; they must show within this.
const VISIBLE_WITHIN: Duration = Duration::from_secs(30);

pub fn run(ctx: &Ctx) -> Result<()> {
    let ns = ctx.namespace("")?;
    let n = ns.as_str();
    let rest = ctx.rest();
    ctx.configmap(n, "held", json!({}))?;
    ctx.configmap(n, "tried", json!({}))?;
    ctx.lock(n, "held", json!({"reason": "visible"}))?;
    ctx.lock(n, "tried", json!({"mode": "Warn"}))?;
    let held = format!("/api/v1/namespaces/{n}/configmaps/held");
    ctx.update_enforced(&held)?;
    let dry_runs_before = lock_events(ctx, n, "held", "Blocked")?.len();

    // The status: an entry for this instance at the Lock's generation, the count, the condition.
    let lock_path = format!("/apis/objectlock.dev/v1alpha1/namespaces/{n}/locks/held");
    let status = wait_for(|| {
        let lock = rest.get(&lock_path)?.body;
        let entries = lock["status"]["enforcedBy"].as_array().cloned();
        Ok(entries
            .filter(|e| !e.is_empty())
            .map(|entries| (lock, entries)))
    })
    .map_err(|e| e.context("Lock status never named an enforcing instance"))?;
    let (lock, entries) = status;
    ensure!(
        entries[0]["observedGeneration"] == lock["metadata"]["generation"],
        "status entry for another generation: {entries:?} (Lock generation {})",
        lock["metadata"]["generation"]
    );
    ensure!(
        lock["status"]["enforcedCount"] == json!(entries.len()),
        "enforcedCount {} for {} entries",
        lock["status"]["enforcedCount"],
        entries.len()
    );
    ensure!(
        condition(&lock) == Some(("True".to_owned(), "Enforcing".to_owned())),
        "condition of an enforced Lock: {:?}",
        condition(&lock)
    );
    let table = ctx.k(&["get", "locks", "held", "-n", n]).check()?;
    let header: Vec<&str> = table
        .stdout
        .lines()
        .next()
        .unwrap_or("")
        .split_whitespace()
        .collect();
    let row: Vec<&str> = table
        .stdout
        .lines()
        .nth(1)
        .unwrap_or("")
        .split_whitespace()
        .collect();
    let column = header.iter().position(|h| *h == "ENFORCED");
    ensure!(
        column.and_then(|c| row.get(c)) == Some(&"1"),
        "kubectl get locks shows no ENFORCED 1: {}",
        table.stdout
    );

    // A Warn-mode Lock is not enforced, and says why.
    let warn_path = format!("/apis/objectlock.dev/v1alpha1/namespaces/{n}/locks/tried");
    wait_for(|| {
        let lock = rest.get(&warn_path)?.body;
        Ok((condition(&lock) == Some(("False".to_owned(), "WarnMode".to_owned()))).then_some(()))
    })
    .map_err(|e| e.context("the Warn-mode Lock's condition never said WarnMode"))?;

    // Dry runs (the probes above) are not recorded; a real refusal is.
    ensure!(
        dry_runs_before == 0,
        "dry runs left {dry_runs_before} Blocked events"
    );
    let refused = rest.delete(&held)?;
    refused.refused("DELETE of the locked ConfigMap", "is locked by Lock")?;
    let events = wait_for(|| {
        let events = lock_events(ctx, n, "held", "Blocked")?;
        Ok((!events.is_empty()).then_some(events))
    })
    .map_err(|e| e.context("no Blocked event regarding the Lock after a refused DELETE"))?;
    let note = events[0]["note"].as_str().unwrap_or_default();
    ensure!(
        note.contains("DELETE") && note.contains("held"),
        "the event does not say what was refused: {note}"
    );
    // Refusals are recorded as Events only: the Lock itself is not written again.
    let after = rest.get(&lock_path)?.body;
    ensure!(
        after["metadata"]["resourceVersion"] == lock["metadata"]["resourceVersion"],
        "a refusal wrote the Lock: resourceVersion {} before, {} after ({})",
        lock["metadata"]["resourceVersion"],
        after["metadata"]["resourceVersion"],
        after["status"]
    );
    let described = ctx.k(&["describe", "lock", "held", "-n", n]).check()?;
    ensure!(
        described.stdout.contains("Blocked"),
        "kubectl describe lock shows no Blocked event: {}",
        described.stdout
    );
    ctx.note(format!("status: {entries:?}; event: {note}"));
    Ok(())
}

/// The Lock's `Enforced` condition as (status, reason).
fn condition(lock: &Value) -> Option<(String, String)> {
    lock["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == "Enforced")
        .map(|c| {
            (
                c["status"].as_str().unwrap_or_default().to_owned(),
                c["reason"].as_str().unwrap_or_default().to_owned(),
            )
        })
}

/// The events with `reason` (`Blocked`, `WouldBlock`) regarding Lock `ns/name`.
pub(crate) fn lock_events(ctx: &Ctx, ns: &str, name: &str, reason: &str) -> Result<Vec<Value>> {
    let list = ctx
        .rest()
        .get(&format!("/apis/events.k8s.io/v1/namespaces/{ns}/events"))?;
    ensure!(
        list.ok(),
        "listing events: {} {}",
        list.code,
        list.message()
    );
    Ok(list.body["items"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .into_iter()
        .filter(|e| {
            e["reason"] == reason
                && e["regarding"]["kind"] == "Lock"
                && e["regarding"]["name"] == name
        })
        .collect())
}

/// Polls `probe` until it yields a value, at most [`VISIBLE_WITHIN`].
pub(crate) fn wait_for<T>(mut probe: impl FnMut() -> Result<Option<T>>) -> Result<T> {
    let start = Instant::now();
    loop {
        if let Some(value) = probe()? {
            return Ok(value);
        }
        if start.elapsed() > VISIBLE_WITHIN {
            bail!("not seen within {VISIBLE_WITHIN:?}");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}
