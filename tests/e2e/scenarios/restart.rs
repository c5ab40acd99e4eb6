//! The API server restarts (the local control plane's down.sh/up.sh, etcd's data kept): locks
//! from before are enforced as soon as it answers, and a Lock created right after it is ready
//! is enforced within the staleness bound (how long it takes, and how many writes got through
//! meanwhile, is printed).

use std::time::{Duration, Instant};

use anyhow::{Result, ensure};
use serde_json::json;

use crate::suite::Ctx;

/// When new Locks are created after the restart, in ms after `/readyz` is ok.
const DELAYS: [u64; 4] = [0, 1000, 3000, 6000];

/// The bound. The index the decisions and the narrowed registration both follow retries
/// within a second of the API server answering (jitter included) and lists in pages, which a
/// restarted API server answers from etcd while its cache fills; the registration is rewritten
/// within moments. Past this, no write to a newly locked object may be allowed.
const BOUND: Duration = Duration::from_secs(2);

pub fn run(ctx: &Ctx) -> Result<()> {
    ctx.env.needs_local()?;
    let ns = ctx.namespace("")?;
    let rest = ctx.rest();
    ctx.configmap(&ns, "before", json!({}))?;
    for ms in DELAYS {
        ctx.configmap(&ns, &format!("after-{ms}ms"), json!({}))?;
    }
    ctx.lock(&ns, "before", json!({"reason": "across the restart"}))?;
    let before = format!("/api/v1/namespaces/{ns}/configmaps/before");
    ctx.delete_enforced(&before)?;

    let took = ctx.env.restart_apiserver()?;
    let ready = Instant::now();

    // Locks created at these times after the API server is ready (while the webhook's watch is
    // still reconnecting, and after), each on its own ConfigMap, probed until refused.
    struct Late {
        name: String,
        path: String,
        at: Duration,
        created: Option<(Duration, Instant)>,
        allowed: usize,
        allowed_late: usize,
        enforced: Option<Duration>,
    }
    let mut late: Vec<Late> = DELAYS
        .iter()
        .map(|ms| Late {
            name: format!("after-{ms}ms"),
            path: format!("/api/v1/namespaces/{ns}/configmaps/after-{ms}ms"),
            at: Duration::from_millis(*ms),
            created: None,
            allowed: 0,
            allowed_late: 0,
            enforced: None,
        })
        .collect();
    // The Lock from before: never a DELETE allowed (a failed call is fail-closed, fine).
    let (mut allowed, mut failed, mut first) = (0, 0, None);
    while first.is_none() || late.iter().any(|l| l.enforced.is_none()) {
        ensure!(
            ready.elapsed() < Duration::from_secs(60),
            "after the restart, not every lock was enforced within 60s"
        );
        match rest.probe_delete(&before) {
            Ok(r) if r.code == 403 => {
                first.get_or_insert(ready.elapsed());
            }
            Ok(r) if r.ok() => allowed += 1,
            _ => failed += 1,
        }
        for l in late.iter_mut() {
            match l.created {
                None if ready.elapsed() >= l.at && ctx.lock(&ns, &l.name, json!({})).is_ok() => {
                    l.created = Some((ready.elapsed(), Instant::now()));
                }
                Some((_, acked)) if l.enforced.is_none() => match rest.probe_update(&l.path) {
                    Ok(r) if r.code == 403 => l.enforced = Some(acked.elapsed()),
                    Ok(r) if r.ok() => {
                        l.allowed += 1;
                        if acked.elapsed() > BOUND {
                            l.allowed_late += 1;
                        }
                    }
                    _ => {}
                },
                _ => {}
            }
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    ensure!(
        allowed == 0,
        "{allowed} dry-run deletes of a locked ConfigMap were allowed after the API server restarted"
    );
    for l in &late {
        ensure!(
            l.allowed_late == 0,
            "{}: {} writes allowed more than {:?} after its Lock was created",
            l.name,
            l.allowed_late,
            BOUND
        );
    }
    let first = first.unwrap_or_default();
    let figures: Vec<String> = late
        .iter()
        .map(|l| {
            format!(
                "created {:.0} ms after ready: enforced after {:.0} ms, {} writes allowed",
                l.created.map_or(0.0, |c| c.0.as_secs_f64() * 1000.0),
                l.enforced.unwrap_or_default().as_secs_f64() * 1000.0,
                l.allowed
            )
        })
        .collect();
    ctx.figure(format!(
        "API server restart: up.sh took {:.1}s; the Lock from before refused {:.0} ms after ready (0 allowed, {failed} failed probes); new Locks: {}",
        took.as_secs_f64(),
        first.as_secs_f64() * 1000.0,
        figures.join("; ")
    ));
    Ok(())
}
