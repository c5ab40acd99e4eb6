//! A Warn-mode Lock lets a write through with a warning and leaves a trace: a `WouldBlock`
//! Event (events.k8s.io/v1, type Normal) regarding the Lock, reported by the webhook, whose
//! series counts the repeats. Dry runs leave none. (`Blocked` for a refused write is checked by
//! the enforcement-visible scenario.)

use std::time::{Duration, Instant};

use anyhow::{Result, bail, ensure};
use serde_json::{Value, json};

use super::enforcement::{lock_events, wait_for};
use crate::kubectl::warning_matches;
use crate::suite::{Ctx, ENFORCE_WITHIN};

pub fn run(ctx: &Ctx) -> Result<()> {
    let ns = ctx.namespace("")?;
    let n = ns.as_str();
    let rest = ctx.rest();
    ctx.configmap(n, "rehearsed", json!({}))?;
    ctx.lock(
        n,
        "rehearsed",
        json!({"mode": "Warn", "reason": "rehearsal"}),
    )?;
    let path = format!("/api/v1/namespaces/{n}/configmaps/rehearsed");
    let warning = format!("Lock {n}/rehearsed (mode Warn) would refuse this: rehearsal");
    let start = Instant::now();
    loop {
        let reply = rest.probe_update(&path)?;
        reply.allowed("dry-run update under a Warn lock")?;
        if reply.warnings.iter().any(|w| warning_matches(w, &warning)) {
            break;
        }
        if start.elapsed() > ENFORCE_WITHIN {
            bail!("no warning `{warning}`: {:?}", reply.warnings);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let user = ctx
        .k(&[
            "auth",
            "whoami",
            "-o",
            "jsonpath={.status.userInfo.username}",
        ])
        .check()?
        .stdout
        .trim()
        .to_owned();

    // A real update through the REST API: allowed, stored, with the warning.
    let reply = rest.merge_patch(&path, &json!({"metadata": {"labels": {"tried": "1"}}}))?;
    reply.allowed("update under a Warn lock")?;
    ensure!(
        reply.warnings.iter().any(|w| warning_matches(w, &warning)),
        "update under a Warn lock without the warning `{warning}`: {:?}",
        reply.warnings
    );
    ensure!(
        reply.body["metadata"]["labels"]["tried"] == "1",
        "the update under a Warn lock was not stored: {}",
        reply.body["metadata"]
    );
    // Dry runs (the probes above, and this one) are not recorded; the real update above is, so
    // the dry runs are checked once its event is there.
    let event = wait_for(|| {
        let events = lock_events(ctx, n, "rehearsed", "WouldBlock")?;
        Ok(events.into_iter().next())
    })
    .map_err(|e| e.context("no WouldBlock event regarding the Warn-mode Lock after an update"))?;
    let lock = rest
        .get(&format!(
            "/apis/objectlock.dev/v1alpha1/namespaces/{n}/locks/rehearsed"
        ))?
        .body;
    let note = format!(
        "UPDATE of configmaps \"rehearsed\" in namespace \"{n}\" by {user} allowed with a warning (mode Warn)"
    );
    let checks = [
        ("type", event["type"] == "Normal"),
        ("action", event["action"] == "UPDATE"),
        ("note", event["note"] == note.as_str()),
        (
            "reportingController",
            event["reportingController"] == "objectlock.dev/kube-object-lock",
        ),
        (
            "reportingInstance",
            event["reportingInstance"]
                .as_str()
                .is_some_and(|i| !i.is_empty()),
        ),
        (
            "regarding",
            event["regarding"]["apiVersion"] == "objectlock.dev/v1alpha1"
                && event["regarding"]["namespace"] == n
                && event["regarding"]["uid"] == lock["metadata"]["uid"],
        ),
    ];
    let wrong: Vec<&str> = checks.iter().filter(|c| !c.1).map(|c| c.0).collect();
    ensure!(
        wrong.is_empty(),
        "the WouldBlock event has the wrong {}: {event}",
        wrong.join(", ")
    );

    // The same again through kubectl: one series, its count grows (the writer patches it at most
    // every 5 s). No dry run was counted: two updates, two occurrences, no more.
    ctx.k(&["label", "configmap", "rehearsed", "-n", n, "again=1"])
        .allowed_warning(&warning)?;
    let counted = wait_for(|| {
        let events = lock_events(ctx, n, "rehearsed", "WouldBlock")?;
        let total: i64 = events.iter().map(occurrences).sum();
        Ok((total >= 2).then_some((events.len(), total)))
    })
    .map_err(|e| e.context("the second update under the Warn lock was not counted"))?;
    ensure!(
        counted == (1, 2),
        "expected one WouldBlock series counting 2 updates, got {} event(s) counting {}",
        counted.0,
        counted.1
    );
    let blocked = lock_events(ctx, n, "rehearsed", "Blocked")?;
    ensure!(
        blocked.is_empty(),
        "a Warn-mode Lock left Blocked events: {blocked:?}"
    );
    let described = ctx.k(&["describe", "lock", "rehearsed", "-n", n]).check()?;
    ensure!(
        described.stdout.contains("WouldBlock"),
        "kubectl describe lock shows no WouldBlock event: {}",
        described.stdout
    );
    ctx.note(format!("event: {note} (x{})", counted.1));
    Ok(())
}

/// How many occurrences an Event stands for: its series count, else 1.
fn occurrences(event: &Value) -> i64 {
    event["series"]["count"].as_i64().unwrap_or(1)
}
