//! Locks and the garbage collector: a locked dependent of a deleted owner stays (its DELETE by
//! the collector is refused and recorded), an owner deleted in the foreground stays Terminating,
//! `kubectl lock` says when the object is waiting for the collector, and `kubectl unlock` prompts
//! the collector so that the object goes within seconds rather than at its next retry.

use std::time::{Duration, Instant};

use anyhow::{Result, bail, ensure};
use serde_json::json;

use super::enforcement::{lock_events, wait_for};
use super::plugin::expect;
use crate::kubectl::Out;
use crate::suite::{Ctx, skip};

/// How long the dependents stay locked after their owners went: the collector's backoff grows.
const HELD: Duration = Duration::from_secs(25);
/// The bound for an unlocked dependent the collector was prompted about.
const PROMPTED_WITHIN: Duration = Duration::from_secs(10);
/// The bound for one it was not: the backoff after [`HELD`] of refusals.
const RETRY_WITHIN: Duration = Duration::from_secs(120);

pub fn run(ctx: &Ctx) -> Result<()> {
    if !ctx.env.kcm {
        return skip("needs kube-controller-manager (the garbage collector)");
    }
    let ns = ctx.namespace("")?;
    let path = |name: &str| format!("/api/v1/namespaces/{ns}/configmaps/{name}");

    // Two dependents whose owners are deleted in the background, held meanwhile by a selector
    // lock, so that kubectl lock meets them already waiting for the collector.
    let mut owners = vec![];
    for child in ["nudged", "waiting"] {
        owners.push(owned_configmap(ctx, &ns, child, false)?);
    }
    ctx.lock(
        &ns,
        "held",
        json!({"selector": {"matchLabels": {"kept": "yes"}}, "operations": ["DELETE"]}),
    )?;
    ctx.delete_enforced(&path("nudged"))?;
    for owner in &owners {
        ctx.rest()
            .delete(&path(owner))?
            .allowed("delete the owner")?;
    }
    for (child, owner) in ["nudged", "waiting"].iter().zip(&owners) {
        let out = ctx.k(&[
            "lock",
            &format!("configmap/{child}"),
            "-n",
            &ns,
            "--operations",
            "DELETE",
        ]);
        noted(
            &out,
            &format!("is waiting for the garbage collector (its owner ConfigMap {owner} is gone)"),
        )?;
    }
    // The collector's refused DELETE is recorded regarding the lock that refused it.
    wait_for(|| {
        let events = lock_events(ctx, &ns, "held", "Blocked")?;
        let deleted = |e: &serde_json::Value| {
            e["note"]
                .as_str()
                .is_some_and(|n| n.contains("DELETE of configmaps"))
        };
        Ok(events.iter().any(deleted).then_some(()))
    })
    .map_err(|e| e.context("no Blocked event for the collector's DELETE"))?;
    ctx.unlock(&ns, "held")?;
    std::thread::sleep(HELD);
    for child in ["nudged", "waiting"] {
        ensure!(
            ctx.rest().get(&path(child))?.code == 200,
            "{child} was collected while locked"
        );
    }

    let out = ctx.k(&["unlock", "configmap/nudged", "-n", &ns]);
    noted(&out, "is waiting for the garbage collector")?;
    noted(&out, "prompted it to look again now")?;
    let nudged = Instant::now();
    let out = ctx.k(&["unlock", "configmap/waiting", "-n", &ns, "--no-nudge"]);
    noted(&out, "it goes at the collector's next retry")?;
    let waiting = Instant::now();
    let prompted = gone(ctx, &path("nudged"), nudged, PROMPTED_WITHIN)?;
    let retried = gone(ctx, &path("waiting"), waiting, RETRY_WITHIN)?;
    ctx.figure(format!(
        "dependent of a deleted owner, locked {}s: gone {:.1}s after kubectl unlock, {:.1}s with --no-nudge",
        HELD.as_secs(),
        prompted.as_secs_f64(),
        retried.as_secs_f64()
    ));

    // Foreground: the owner stays Terminating while its dependent is locked.
    let owner = owned_configmap(ctx, &ns, "blocking", true)?;
    ctx.k(&[
        "lock",
        "configmap/blocking",
        "-n",
        &ns,
        "--operations",
        "DELETE",
    ])
    .check()?;
    ctx.k(&[
        "delete",
        "configmap",
        &owner,
        "-n",
        &ns,
        "--cascade=foreground",
        "--wait=false",
    ])
    .check()?;
    std::thread::sleep(Duration::from_secs(3));
    let terminating = ctx.rest().get(&path(&owner))?;
    ensure!(
        terminating.code == 200 && terminating.body["metadata"]["deletionTimestamp"].is_string(),
        "the owner is not Terminating: {} {}",
        terminating.code,
        terminating.body["metadata"]
    );
    let out = ctx.k(&["unlock", "configmap/blocking", "-n", &ns]);
    noted(
        &out,
        &format!("its owner ConfigMap {owner} is being deleted in the foreground"),
    )?;
    let start = Instant::now();
    gone(ctx, &path("blocking"), start, PROMPTED_WITHIN)?;
    let finished = gone(ctx, &path(&owner), start, PROMPTED_WITHIN)?;
    ctx.figure(format!(
        "owner deleted in the foreground: gone {:.1}s after kubectl unlock of its dependent",
        finished.as_secs_f64()
    ));
    Ok(())
}

/// A ConfigMap `child` (labelled `kept=yes`) owned by a new ConfigMap `<child>-owner`; returns
/// the owner's name.
fn owned_configmap(ctx: &Ctx, ns: &str, child: &str, block_owner: bool) -> Result<String> {
    let owner = format!("{child}-owner");
    let created = ctx.create(
        &format!("/api/v1/namespaces/{ns}/configmaps"),
        json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": owner}}),
    )?;
    let reference = json!({"apiVersion": "v1", "kind": "ConfigMap", "name": owner,
        "uid": created["metadata"]["uid"], "blockOwnerDeletion": block_owner});
    ctx.create(
        &format!("/api/v1/namespaces/{ns}/configmaps"),
        json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": child,
               "labels": {"kept": "yes"}, "ownerReferences": [reference]}}),
    )?;
    Ok(owner)
}

/// The command succeeded and said `text` on stderr.
fn noted(out: &Out, text: &str) -> Result<()> {
    expect(
        out,
        out.ok() && out.stderr.contains(text),
        &format!("a note with: {text}"),
    )
}

/// Waits until `path` is gone, at most `within` after `since`; returns how long after `since`.
fn gone(ctx: &Ctx, path: &str, since: Instant, within: Duration) -> Result<Duration> {
    loop {
        if ctx.rest().get(path)?.code == 404 {
            return Ok(since.elapsed());
        }
        if since.elapsed() > within {
            bail!("{path} still exists {within:?} after the unlock");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}
