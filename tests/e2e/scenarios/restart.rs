//! The API server restarts (the local control plane's down.sh/up.sh, etcd's data kept): locks
//! from before are enforced as soon as it answers, and a Lock created right after it is ready
//! is enforced (how long that takes, and how many writes got through meanwhile, is printed).

use std::time::{Duration, Instant};

use anyhow::{Result, bail, ensure};
use serde_json::json;

use crate::suite::Ctx;

pub fn run(ctx: &Ctx) -> Result<()> {
    ctx.env.needs_local()?;
    let ns = ctx.namespace("")?;
    let rest = ctx.rest();
    for name in ["before", "after"] {
        ctx.configmap(&ns, name, json!({}))?;
    }
    ctx.lock(&ns, "before", json!({"reason": "across the restart"}))?;
    let before = format!("/api/v1/namespaces/{ns}/configmaps/before");
    let after = format!("/api/v1/namespaces/{ns}/configmaps/after");
    ctx.delete_enforced(&before)?;

    let took = ctx.env.restart_apiserver()?;
    let ready = Instant::now();

    // A Lock created as soon as the API server is ready.
    let created = loop {
        if ctx.lock(&ns, "after", json!({})).is_ok() {
            break ready.elapsed();
        }
        ensure!(
            ready.elapsed() < Duration::from_secs(10),
            "cannot create a Lock after the restart"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    let acked = Instant::now();

    // The Lock from before: never a DELETE allowed (failures are: fail closed). The new one:
    // probed until refused.
    let (mut allowed, mut failed, mut first) = (0, 0, None);
    let (mut after_allowed, mut after_failed, mut after_enforced) = (0, 0, None);
    while ready.elapsed() < Duration::from_secs(2)
        || (first.is_none() || after_enforced.is_none())
            && ready.elapsed() < Duration::from_secs(60)
    {
        match rest.probe_delete(&before) {
            Ok(r) if r.code == 403 => {
                first.get_or_insert(ready.elapsed());
            }
            Ok(r) if r.ok() => allowed += 1,
            _ => failed += 1,
        }
        if after_enforced.is_none() {
            match rest.probe_update(&after) {
                Ok(r) if r.code == 403 => after_enforced = Some(acked.elapsed()),
                Ok(r) if r.ok() => after_allowed += 1,
                _ => after_failed += 1,
            }
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    ensure!(
        allowed == 0,
        "{allowed} dry-run deletes of a locked ConfigMap were allowed after the API server restarted"
    );
    let Some(first) = first else {
        bail!(
            "the Lock from before the restart was not enforced within 60s ({failed} probes failed)"
        );
    };
    let Some(enforced) = after_enforced else {
        bail!(
            "a Lock created after the restart was not enforced within 60s ({after_allowed} writes allowed, {after_failed} failed)"
        );
    };
    ctx.figure(format!(
        "API server restart: up.sh took {:.1}s; the Lock from before refused {:.0} ms after ready (0 allowed, {failed} failed probes); a Lock created {:.0} ms after ready was enforced {:.0} ms after its creation, {} writes allowed meanwhile",
        took.as_secs_f64(),
        first.as_secs_f64() * 1000.0,
        created.as_secs_f64() * 1000.0,
        enforced.as_secs_f64() * 1000.0,
        after_allowed
    ));
    Ok(())
}
